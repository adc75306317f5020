// A Kafka Java consumer (kafka-clients: KIP-227 incremental fetch sessions)
// reading topics through a mirror listener, for tests/integration/test_new_topic.py.
// Arguments: <bootstrap> <stop-file> <topic>...; a topic that does not exist yet
// is looked for again every half second and assigned (from its beginning) once
// it does, so the consumer's fetch session gains it while it keeps fetching the
// others. Prints "<topic> <partition> <offset> <value>" per record, flushed,
// until the stop file exists.
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Properties;
import java.util.Set;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public class NewTopicConsumer {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        Path stop = Path.of(args[1]);
        Set<String> waiting = new LinkedHashSet<>();
        for (int i = 2; i < args.length; i++) {
            waiting.add(args[i]);
        }
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("key.deserializer", ByteArrayDeserializer.class.getName());
        p.put("value.deserializer", ByteArrayDeserializer.class.getName());
        p.put("enable.auto.commit", "false");
        p.put("auto.offset.reset", "earliest");
        // The new topic is created by the test, never by a metadata request.
        p.put("allow.auto.create.topics", "false");
        p.put("fetch.max.wait.ms", "100");
        p.put("client.id", "new-topic-consumer");
        try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(p)) {
            List<TopicPartition> assigned = new ArrayList<>();
            long lastLook = 0;
            while (!Files.exists(stop)) {
                if (!waiting.isEmpty() && System.currentTimeMillis() - lastLook > 500) {
                    lastLook = System.currentTimeMillis();
                    for (String topic : new ArrayList<>(waiting)) {
                        List<PartitionInfo> parts;
                        try {
                            parts = c.partitionsFor(topic, Duration.ofMillis(300));
                        } catch (Exception e) {
                            continue;
                        }
                        if (parts == null || parts.isEmpty()) {
                            continue;
                        }
                        for (PartitionInfo i : parts) {
                            assigned.add(new TopicPartition(topic, i.partition()));
                        }
                        waiting.remove(topic);
                        c.assign(assigned);
                        System.out.println("assigned " + topic);
                    }
                }
                if (assigned.isEmpty()) {
                    Thread.sleep(100);
                    continue;
                }
                for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) {
                    System.out.println(r.topic() + " " + r.partition() + " " + r.offset() + " "
                            + new String(r.value()));
                }
                System.out.flush();
            }
        }
    }
}
