// A Kafka Java consumer (kafka-clients, which keeps KIP-227 incremental fetch
// sessions) reading every partition of a topic through a mirror listener, for
// tests/integration/test_fetch_sessions_java.py. Prints one line per record:
// "<partition> <offset> <value>", and "poll <n>" after each poll, flushed, until
// the file named by the third argument exists.
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public class SessionConsumer {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String topic = args[1];
        Path stop = Path.of(args[2]);
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("key.deserializer", ByteArrayDeserializer.class.getName());
        p.put("value.deserializer", ByteArrayDeserializer.class.getName());
        p.put("enable.auto.commit", "false");
        p.put("fetch.max.wait.ms", "100");
        p.put("client.id", "session-consumer");
        try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(p)) {
            List<TopicPartition> tps = new ArrayList<>();
            for (PartitionInfo i : c.partitionsFor(topic, Duration.ofSeconds(20))) {
                tps.add(new TopicPartition(topic, i.partition()));
            }
            c.assign(tps);
            c.seekToBeginning(tps);
            long polls = 0;
            while (!Files.exists(stop)) {
                for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) {
                    System.out.println(r.partition() + " " + r.offset() + " " + new String(r.value()));
                }
                System.out.println("poll " + (++polls));
                System.out.flush();
            }
        }
    }
}
