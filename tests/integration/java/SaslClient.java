import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Kafka's Java client over SASL_PLAINTEXT: an idempotent producer writes N records, a
 * consumer reads them back. Args: bootstrap topic mechanism user password n [consume]
 * ("consume": only read N records from the start). Prints one JSON line:
 * {"produced":N,"consumed":M} or {"error":"Class","message":"..."}.
 */
public final class SaslClient {
    private SaslClient() {}

    public static void main(String[] args) {
        String bootstrap = args[0], topic = args[1], mech = args[2], user = args[3], pw = args[4];
        int n = Integer.parseInt(args[5]);
        boolean consumeOnly = args.length > 6 && args[6].equals("consume");
        Properties common = new Properties();
        common.put("bootstrap.servers", bootstrap);
        common.put("security.protocol", "SASL_PLAINTEXT");
        common.put("sasl.mechanism", mech);
        String module = mech.equals("PLAIN") ? "org.apache.kafka.common.security.plain.PlainLoginModule"
            : "org.apache.kafka.common.security.scram.ScramLoginModule";
        common.put("sasl.jaas.config", module + " required username=\"" + user + "\" password=\"" + pw + "\";");
        Properties pp = new Properties();
        pp.putAll(common);
        pp.put("key.serializer", ByteArraySerializer.class.getName());
        pp.put("value.serializer", ByteArraySerializer.class.getName());
        pp.put("enable.idempotence", "true");
        pp.put("max.block.ms", "15000");
        pp.put("delivery.timeout.ms", "20000");
        pp.put("request.timeout.ms", "10000");
        Properties cp = new Properties();
        cp.putAll(common);
        cp.put("key.deserializer", ByteArrayDeserializer.class.getName());
        cp.put("value.deserializer", ByteArrayDeserializer.class.getName());
        cp.put("enable.auto.commit", "false");
        cp.put("fetch.max.wait.ms", "100");
        try (KafkaProducer<byte[], byte[]> p = new KafkaProducer<>(pp);
             KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(cp)) {
            for (int i = 0; i < (consumeOnly ? 0 : n); i++) {
                p.send(new ProducerRecord<>(topic, 0, null, ("java-" + i).getBytes())).get(20, TimeUnit.SECONDS);
            }
            TopicPartition tp = new TopicPartition(topic, 0);
            c.assign(List.of(tp));
            c.seekToBeginning(List.of(tp));
            List<String> got = new ArrayList<>();
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
            while (got.size() < n && System.nanoTime() < deadline) {
                for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) {
                    got.add(new String(r.value()));
                }
            }
            System.out.println("{\"produced\":" + (consumeOnly ? 0 : n) + ",\"consumed\":" + got.size() + "}");
        } catch (Exception e) {
            Throwable t = e;
            while (t.getCause() != null && !(t instanceof org.apache.kafka.common.KafkaException)) {
                t = t.getCause();
            }
            System.out.println("{\"error\":\"" + t.getClass().getSimpleName() + "\",\"message\":\""
                + String.valueOf(t.getMessage()).replace("\\", "\\\\").replace("\"", "'") + "\"}");
        }
        System.exit(0);
    }
}
