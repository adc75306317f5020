import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.FeatureMetadata;
import org.apache.kafka.clients.admin.FeatureUpdate;
import org.apache.kafka.clients.admin.FinalizedVersionRange;
import org.apache.kafka.clients.admin.UpdateFeaturesOptions;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicCollection;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Kafka's Java clients (kafka-clients 4.4) writing through the guard (test_guard_writes.py).
 *
 * <p>Arguments: DEST GUARD TOPIC LOCAL TAG TVS [delete-by-id]. For each transaction.version
 * of TVS (e.g. {@code 1,2}; set on the destination DEST directly with Admin.updateFeatures, and
 * set back to what it was at the end): a transactional producer through GUARD sends one record to LOCAL-0 and one to
 * TOPIC-0, then commits, or aborts when a send failed. With {@code delete-by-id}, TOPIC is then
 * deleted by its topic id (DeleteTopics v6) through GUARD. One JSON line per step on stdout.
 */
public final class GuardWrites {
    private GuardWrites() {}

    private static final String TV = "transaction.version";

    public static void main(String[] a) throws Exception {
        String dest = a[0], guard = a[1], topic = a[2], local = a[3], tag = a[4];
        String[] tvs = a[5].split(",");
        boolean deleteById = a.length > 6 && a[6].equals("delete-by-id");
        Properties dp = new Properties();
        dp.put("bootstrap.servers", dest);
        try (Admin direct = Admin.create(dp)) {
            short original = finalized(direct);
            System.out.println("{\"step\":\"features\",\"original_tv\":" + original + "}");
            try {
                for (String t : tvs) {
                    short tv = Short.parseShort(t);
                    setTv(direct, tv);
                    System.out.println(txn(guard, topic, local, tv, tag));
                }
            } finally {
                setTv(direct, original);
            }
            if (deleteById) {
                Uuid id = direct.describeTopics(List.of(topic)).allTopicNames().get(30, TimeUnit.SECONDS)
                    .get(topic).topicId();
                Properties gp = new Properties();
                gp.put("bootstrap.servers", guard);
                gp.put("request.timeout.ms", 10000);
                gp.put("default.api.timeout.ms", 20000);
                String outcome;
                try (Admin g = Admin.create(gp)) {
                    g.deleteTopics(TopicCollection.ofTopicIds(List.of(id))).all().get(30, TimeUnit.SECONDS);
                    outcome = "ok";
                } catch (ExecutionException e) {
                    outcome = describe(e.getCause());
                }
                System.out.println("{\"step\":\"delete-by-id\",\"topic_id\":\"" + id + "\",\"outcome\":\""
                    + esc(outcome) + "\"}");
            }
        }
    }

    private static short finalized(Admin ad) throws Exception {
        FeatureMetadata fm = ad.describeFeatures().featureMetadata().get(30, TimeUnit.SECONDS);
        FinalizedVersionRange r = fm.finalizedFeatures().get(TV);
        return r == null ? 0 : r.maxVersionLevel();
    }

    private static void setTv(Admin ad, short tv) throws Exception {
        short now = finalized(ad);
        if (now == tv) {
            return;
        }
        if (tv > now) {
            ad.updateFeatures(Map.of(TV, new FeatureUpdate(tv, FeatureUpdate.UpgradeType.UPGRADE)),
                new UpdateFeaturesOptions()).all().get(30, TimeUnit.SECONDS);
        } else {
            try {
                ad.updateFeatures(Map.of(TV, new FeatureUpdate(tv, FeatureUpdate.UpgradeType.SAFE_DOWNGRADE)),
                    new UpdateFeaturesOptions()).all().get(30, TimeUnit.SECONDS);
            } catch (ExecutionException e) {
                ad.updateFeatures(Map.of(TV, new FeatureUpdate(tv, FeatureUpdate.UpgradeType.UNSAFE_DOWNGRADE)),
                    new UpdateFeaturesOptions()).all().get(30, TimeUnit.SECONDS);
            }
        }
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
        while (finalized(ad) != tv) {
            if (System.nanoTime() > deadline) {
                throw new IllegalStateException(TV + " did not become " + tv);
            }
            Thread.sleep(100);
        }
    }

    private static String describe(Throwable t) {
        StringBuilder s = new StringBuilder(t.getClass().getSimpleName()).append(": ").append(t.getMessage());
        if (t.getCause() != null && t.getCause() != t) {
            s.append(" / ").append(t.getCause().getClass().getSimpleName()).append(": ")
                .append(t.getCause().getMessage());
        }
        return s.toString();
    }

    private static String esc(String s) {
        return s.replace("\\", "\\\\").replace("\"", "'").replace("\n", " ");
    }

    private static String outcome(Future<RecordMetadata> f) {
        try {
            return "ok@" + f.get(40, TimeUnit.SECONDS).offset();
        } catch (ExecutionException e) {
            return describe(e.getCause());
        } catch (Exception e) {
            return describe(e);
        }
    }

    private static String txn(String guard, String topic, String local, short tv, String tag) {
        Properties pp = new Properties();
        pp.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, guard);
        pp.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        pp.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        pp.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, "guard-writes-" + topic + "-" + tag + "-tv" + tv);
        pp.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, 30000);
        pp.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, 30000);
        pp.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, 10000);
        pp.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, 30000);
        pp.put(ProducerConfig.LINGER_MS_CONFIG, 20);
        StringBuilder out = new StringBuilder("{\"step\":\"txn\",\"tv\":").append(tv);
        try (KafkaProducer<byte[], byte[]> p = new KafkaProducer<>(pp)) {
            p.initTransactions();
            p.beginTransaction();
            Future<RecordMetadata> fl = p.send(new ProducerRecord<>(local, 0, null, ("java-" + tag).getBytes()));
            Future<RecordMetadata> fm = p.send(new ProducerRecord<>(topic, 0, null, ("java-" + tag).getBytes()));
            String ol = outcome(fl), om = outcome(fm);
            out.append(",\"local\":\"").append(esc(ol)).append('"');
            out.append(",\"mirrored\":\"").append(esc(om)).append('"');
            String end;
            try {
                if (ol.startsWith("ok@") && om.startsWith("ok@")) {
                    p.commitTransaction();
                    end = "committed";
                } else {
                    p.abortTransaction();
                    end = "aborted";
                }
            } catch (Exception e) {
                end = "end failed: " + describe(e);
            }
            out.append(",\"end\":\"").append(esc(end)).append('"');
        } catch (Exception e) {
            out.append(",\"error\":\"").append(esc(describe(e))).append('"');
        }
        return out.append('}').toString();
    }
}
