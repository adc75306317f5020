package mgtest;

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Kafka's own Java clients driven by the integration tests (test_java_go_clients.py).
 *
 * <p>{@code txn}: a transactional producer aborts one transaction and commits one; a
 * read_committed consumer (assign, so it fetches with KIP-227 incremental fetch sessions
 * across its polls) reads them, then a second committed transaction is produced while
 * the consumer keeps polling, so later records arrive through an established session.
 * {@code produce-one}: one record with a plain producer (no retries), reporting the error,
 * for the produce guard. One JSON line on stdout summarises what the clients saw.
 * {@code --config FILE}: client properties (e.g. {@code security.protocol=SSL} and its
 * PEM trust and key stores) added to every producer and consumer.
 */
public final class KafkaClientCheck {
    private KafkaClientCheck() {}

    /** Extra client properties from {@code --config} (empty without it). */
    private static final Properties EXTRA = new Properties();

    public static void main(String[] args) throws Exception {
        Map<String, String> a = new HashMap<>();
        for (int i = 0; i + 1 < args.length; i += 2) {
            a.put(args[i].replaceFirst("^--", ""), args[i + 1]);
        }
        if (a.containsKey("config")) {
            try (java.io.Reader r = java.nio.file.Files.newBufferedReader(java.nio.file.Path.of(a.get("config")))) {
                EXTRA.load(r);
            }
        }
        String bootstrap = a.get("bootstrap");
        String topic = a.get("topic");
        String mode = a.getOrDefault("mode", "txn");
        int n = Integer.parseInt(a.getOrDefault("n", "10"));
        int partition = Integer.parseInt(a.getOrDefault("partition", "0"));
        if (bootstrap == null || topic == null) {
            System.err.println("usage: --bootstrap HOST:PORT --topic T [--mode txn|produce-one] [--n N]");
            System.exit(2);
        }
        StringBuilder out = new StringBuilder("{\"mode\":\"").append(mode).append('"');
        int rc = 0;
        if (mode.equals("txn")) {
            rc = txn(bootstrap, topic, partition, n, out);
        } else if (mode.equals("produce-one")) {
            produceOne(bootstrap, topic, partition, out);
        } else {
            System.err.println("unknown mode " + mode);
            System.exit(2);
        }
        System.out.println(out.append('}'));
        System.exit(rc);
    }

    private static Properties producerProps(String bootstrap) {
        Properties p = new Properties();
        p.putAll(EXTRA);
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, 30000);
        p.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, 10000);
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, 30000);
        return p;
    }

    private static void sendAll(KafkaProducer<byte[], byte[]> p, String topic, int partition, String prefix, int n,
                                List<Long> offsets) throws Exception {
        List<java.util.concurrent.Future<RecordMetadata>> fs = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            fs.add(p.send(new ProducerRecord<>(topic, partition, null, (prefix + "-" + i).getBytes())));
        }
        p.flush();
        for (java.util.concurrent.Future<RecordMetadata> f : fs) {
            offsets.add(f.get(30, TimeUnit.SECONDS).offset());
        }
    }

    private static int txn(String bootstrap, String topic, int partition, int n, StringBuilder out) throws Exception {
        Properties pp = producerProps(bootstrap);
        pp.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, "java-" + topic);
        pp.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, 30000);
        Properties cp = new Properties();
        cp.putAll(EXTRA);
        cp.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        cp.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        cp.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        cp.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        cp.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
        cp.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, 100);
        cp.put(ConsumerConfig.CHECK_CRCS_CONFIG, true);
        List<Long> offsets = new ArrayList<>();
        List<String> consumed = new ArrayList<>();
        List<Long> consumedOffsets = new ArrayList<>();
        long polls = 0;
        try (KafkaProducer<byte[], byte[]> p = new KafkaProducer<>(pp);
             KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(cp)) {
            p.initTransactions();
            p.beginTransaction();
            sendAll(p, topic, partition, "java-aborted", n, offsets);
            p.abortTransaction();
            p.beginTransaction();
            sendAll(p, topic, partition, "java-committed", n, offsets);
            p.commitTransaction();

            TopicPartition tp = new TopicPartition(topic, partition);
            c.assign(List.of(tp));
            c.seekToBeginning(List.of(tp));
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(40);
            boolean lateSent = false;
            while (consumed.size() < 2 * n && System.nanoTime() < deadline) {
                for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) {
                    consumed.add(new String(r.value()));
                    consumedOffsets.add(r.offset());
                }
                polls++;
                if (!lateSent && consumed.size() >= n) {
                    // More data while the consumer's fetch session is established.
                    p.beginTransaction();
                    sendAll(p, topic, partition, "java-late", n, offsets);
                    p.commitTransaction();
                    lateSent = true;
                }
            }
            out.append(",\"position\":").append(c.position(tp));
        }
        out.append(",\"polls\":").append(polls);
        out.append(",\"produced_offsets\":").append(offsets);
        out.append(",\"consumed_offsets\":").append(consumedOffsets);
        out.append(",\"consumed\":[");
        for (int i = 0; i < consumed.size(); i++) {
            out.append(i == 0 ? "" : ",").append('"').append(consumed.get(i)).append('"');
        }
        out.append(']');
        return consumed.size() == 2 * n ? 0 : 1;
    }

    private static void produceOne(String bootstrap, String topic, int partition, StringBuilder out) {
        Properties pp = producerProps(bootstrap);
        pp.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, false);
        pp.put(ProducerConfig.RETRIES_CONFIG, 0);
        pp.put(ProducerConfig.ACKS_CONFIG, "all");
        try (KafkaProducer<byte[], byte[]> p = new KafkaProducer<>(pp)) {
            RecordMetadata md = p.send(new ProducerRecord<>(topic, partition, null, "java-one".getBytes()))
                .get(30, TimeUnit.SECONDS);
            out.append(",\"offset\":").append(md.offset());
        } catch (ExecutionException e) {
            Throwable c = e.getCause();
            out.append(",\"error\":\"").append(c.getClass().getSimpleName()).append('"');
            out.append(",\"message\":\"").append(String.valueOf(c.getMessage()).replace("\\", "\\\\")
                .replace("\"", "'")).append('"');
        } catch (Exception e) {
            out.append(",\"error\":\"").append(e.getClass().getSimpleName()).append('"');
        }
    }
}
