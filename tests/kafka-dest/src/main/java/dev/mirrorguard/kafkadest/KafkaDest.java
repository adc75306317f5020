package dev.mirrorguard.kafkadest;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.OptionalLong;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.message.AbortedTxn;
import org.apache.kafka.common.record.internal.ControlRecordType;
import org.apache.kafka.common.record.internal.MemoryRecords;
import org.apache.kafka.common.record.internal.MutableRecordBatch;
import org.apache.kafka.common.record.internal.Record;
import org.apache.kafka.common.record.internal.RecordBatch;
import org.apache.kafka.common.utils.Time;
import org.apache.kafka.server.util.KafkaScheduler;
import org.apache.kafka.storage.internals.epoch.LeaderEpochFileCache;
import org.apache.kafka.storage.internals.log.AppendOrigin;
import org.apache.kafka.storage.internals.log.BatchMetadata;
import org.apache.kafka.storage.internals.log.LogAppendInfo;
import org.apache.kafka.storage.internals.log.LogConfig;
import org.apache.kafka.storage.internals.log.LogDirFailureChannel;
import org.apache.kafka.storage.internals.log.LogSegment;
import org.apache.kafka.storage.internals.log.ProducerStateEntry;
import org.apache.kafka.storage.internals.log.ProducerStateManagerConfig;
import org.apache.kafka.storage.internals.log.UnifiedLog;
import org.apache.kafka.storage.log.metrics.BrokerTopicStats;

/**
 * The reference destination of the tests: a stand-in for a destination broker whose partitions
 * are mirrored from another cluster (no released broker does that; SPEC section 7), built from
 * Kafka's own parts so that Kafka, not a model, decides what the log holds.
 *
 * <p>Each destination partition is a Kafka {@link UnifiedLog} in {@code <dir>/<topic>-<p>}.
 * Mirrored batches are appended with {@code appendAsFollower} (the REPLICATION origin), so
 * Kafka's LogValidator, ProducerStateManager, last stable offset, producer snapshots, leader
 * epoch cache and log recovery all apply. {@link Fetcher} feeds them like a broker's fetcher.
 *
 * <p>Control channel: one JSON object per line on stdin, one JSON answer per line on stdout
 * ({@code {"ok":true,...}} or {@code {"ok":false,"error":...}}). Logging goes to stderr; WARN
 * (and selected INFO) lines of Kafka's classes are also kept in memory ({@link LogCapture}) and
 * returned by the {@code logs} command.
 */
public final class KafkaDest {
    static final ObjectMapper JSON = new ObjectMapper();
    static final String CLEAN_SHUTDOWN = ".kafka_cleanshutdown";

    final File dataDir;
    final Time time = Time.SYSTEM;
    final KafkaScheduler scheduler = new KafkaScheduler(1, true, "kafka-dest-scheduler-");
    final BrokerTopicStats stats = new BrokerTopicStats(false);
    final LogDirFailureChannel failureChannel = new LogDirFailureChannel(4);
    final boolean hadCleanShutdown;
    final Map<TopicPartition, Part> parts = new ConcurrentHashMap<>();
    final Map<String, Fetcher> fetchers = new ConcurrentHashMap<>();

    /**
     * One destination partition: its leader's log and what the tests want to know about its
     * appends. With replication ({@code replicate}) each simulated broker holds its own replica
     * (a UnifiedLog of its own), the mirror fetcher appends to the leader's, and followers copy
     * the leader's log ({@link #replicateOnce}); {@code log} is always the leader's replica.
     */
    static final class Part {
        final TopicPartition tp;
        volatile UnifiedLog log;
        /** Replicas by simulated broker id (the leader's included); empty: broker 0 alone. */
        final Map<Integer, UnifiedLog> replicas = new TreeMap<>();
        /** Followers whose replication is paused (their copy lags: unreplicated records). */
        final java.util.Set<Integer> paused = new java.util.TreeSet<>();
        /** Paused followers that still copy up to an offset (exclusive). */
        final Map<Integer, Long> pausedAt = new TreeMap<>();
        /** The leading broker and its destination leader epoch (bumped at each move). */
        volatile int leader = 0;
        volatile int leaderEpoch = 0;
        /** Why the partition failed (an append threw): a broker's fetcher stops fetching it. */
        volatile String failed;
        /** Control batches appended and the transaction each one closed (Kafka's PSM before/after). */
        final List<ObjectNode> markers = new ArrayList<>();
        /** Fetch responses (or raw appends) applied with appendAsFollower. */
        long appends;
        /** Leader epoch of local (CLIENT path) writes after an in-place promotion; -1 before. */
        int localEpoch = -1;

        Part(TopicPartition tp, UnifiedLog log) {
            this.tp = tp;
            this.log = log;
        }

        List<Integer> replicaIds() {
            return replicas.isEmpty() ? List.of(leader) : new ArrayList<>(replicas.keySet());
        }
    }

    /** The simulated brokers' Kafka listeners, by broker id. */
    final Map<Integer, BrokerServer> servers = new ConcurrentHashMap<>();
    /** Copies leaders' logs to their followers (started with the first replicated partition). */
    Thread replicator;

    KafkaDest(File dataDir) throws IOException {
        this.dataDir = dataDir;
        Files.createDirectories(dataDir.toPath());
        File marker = new File(dataDir, CLEAN_SHUTDOWN);
        hadCleanShutdown = marker.exists();
        // Like a broker: the marker exists only between a clean shutdown and the next start, so
        // a crash (SIGKILL) leaves none and the next open runs Kafka's log recovery.
        Files.deleteIfExists(marker.toPath());
        scheduler.startup();
    }

    // ------------------------------------------------------------------ partitions

    Part open(String topic, int partition, Uuid topicId) throws IOException {
        TopicPartition tp = new TopicPartition(topic, partition);
        Part existing = parts.get(tp);
        if (existing != null) {
            Optional<Uuid> have = existing.log.topicId();
            if (topicId != null && have.isPresent() && !have.get().equals(topicId)) {
                throw new IllegalArgumentException(tp + " is open with topic id " + have.get() + ", not " + topicId);
            }
            return existing;
        }
        File dir = new File(dataDir, UnifiedLog.logDirName(tp));
        Properties props = new Properties();
        LogConfig config = new LogConfig(props);
        ProducerStateManagerConfig psmConfig = new ProducerStateManagerConfig(86_400_000, false);
        // recoveryPoint 0: after a crash Kafka recovers every segment (LogLoader); after a clean
        // shutdown it trusts them, as a broker does with its recovery-point checkpoint.
        UnifiedLog log = UnifiedLog.create(dir, config, 0L, 0L, scheduler, stats, time, 900_000, psmConfig,
                600_000, failureChannel, hadCleanShutdown, Optional.ofNullable(topicId));
        if (topicId == null && log.topicId().isEmpty()) {
            // One id per topic, as a cluster gives it (Metadata lists it per topic).
            Uuid id = parts.values().stream().filter(x -> x.tp.topic().equals(topic))
                    .map(x -> x.log.topicId().orElse(null)).filter(java.util.Objects::nonNull)
                    .findFirst().orElseGet(Uuid::randomUuid);
            log.assignTopicId(id);
        }
        Part p = new Part(tp, log);
        parts.put(tp, p);
        return p;
    }

    Part part(JsonNode cmd) {
        TopicPartition tp = new TopicPartition(cmd.path("topic").asText(), cmd.path("partition").asInt(0));
        Part p = parts.get(tp);
        if (p == null) {
            throw new IllegalArgumentException(tp + " is not open");
        }
        return p;
    }

    /**
     * Appends what a fetch returned on the replication path. {@code fetchOffset} drops whole
     * batches below it (a fetch that landed inside a batch); {@code relabelTo} >= 0 rewrites the
     * base offsets (outside the CRC) to follow the destination's own offsets (a destination fed
     * from a new source whose offsets differ). Returns the append info, or null when nothing was
     * left to append.
     */
    static LogAppendInfo appendMirrored(Part p, MemoryRecords records, long fetchOffset, long relabelTo) {
        return appendMirrored(p, records, fetchOffset, relabelTo, -1);
    }

    /**
     * As above, by the mirror fetcher of simulated broker `broker` (-1: any): nothing is
     * appended (null) when that broker no longer leads the partition (leadership moved while
     * its fetch was in flight; a broker's fetcher drops such a response), or when the
     * response was fetched at another position than the leader's log end.
     */
    static LogAppendInfo appendMirrored(Part p, MemoryRecords records, long fetchOffset, long relabelTo,
                                        int broker) {
        if (broker >= 0) {
            synchronized (p) {
                if (p.leader != broker || (relabelTo < 0 && p.log.logEndOffset() != fetchOffset)) {
                    return null;
                }
                return appendMirroredLocked(p, records, fetchOffset, relabelTo);
            }
        }
        return appendMirroredLocked(p, records, fetchOffset, relabelTo);
    }

    static LogAppendInfo appendMirroredLocked(Part p, MemoryRecords records, long fetchOffset, long relabelTo) {
        List<MutableRecordBatch> keep = new ArrayList<>();
        int size = 0;
        for (MutableRecordBatch b : records.batches()) {
            if (b.lastOffset() < fetchOffset) {
                continue;
            }
            keep.add(b);
            size += b.sizeInBytes();
        }
        if (keep.isEmpty()) {
            return null;
        }
        ByteBuffer buf = ByteBuffer.allocate(size);
        for (MutableRecordBatch b : keep) {
            b.writeTo(buf);
        }
        buf.flip();
        MemoryRecords toAppend = MemoryRecords.readableRecords(buf);
        synchronized (p) {
            if (relabelTo >= 0) {
                long next = p.log.logEndOffset();
                for (MutableRecordBatch b : toAppend.batches()) {
                    b.setLastOffset(next + (b.lastOffset() - b.baseOffset()));
                    next = b.lastOffset() + 1;
                }
            }
            return appendFollower(p, toAppend);
        }
    }

    /**
     * appendAsFollower with the highest partition leader epoch of the batches: Kafka 4.4 skips,
     * with only an INFO line, batches whose epoch is above the one passed in, so this passes at
     * least the highest and checks that the log end offset moved.
     */
    static LogAppendInfo appendFollower(Part p, MemoryRecords records) {
        synchronized (p) {
            int maxEpoch = 0;
            List<MutableRecordBatch> batches = new ArrayList<>();
            for (MutableRecordBatch b : records.batches()) {
                maxEpoch = Math.max(maxEpoch, b.partitionLeaderEpoch());
                batches.add(b);
            }
            long before = p.log.logEndOffset();
            LogAppendInfo first = null;
            // One appendAsFollower per batch: Kafka's producer state is updated batch by batch
            // either way, and this lets the report say which transaction each marker closed
            // (the PID's open transaction just before the marker's own append).
            for (MutableRecordBatch b : batches) {
                OptionalLong open = OptionalLong.empty();
                if (b.isControlBatch() && b.producerId() >= 0) {
                    ProducerStateEntry e = p.log.producerStateManager().activeProducers().get(b.producerId());
                    open = e == null ? OptionalLong.empty() : e.currentTxnFirstOffset();
                }
                ByteBuffer one = ByteBuffer.allocate(b.sizeInBytes());
                b.writeTo(one);
                one.flip();
                long leo = p.log.logEndOffset();
                LogAppendInfo info;
                try {
                    info = p.log.appendAsFollower(MemoryRecords.readableRecords(one), maxEpoch);
                } catch (RuntimeException ex) {
                    p.failed = ex.getClass().getSimpleName() + ": " + ex.getMessage();
                    throw ex;
                }
                if (p.log.logEndOffset() <= leo) {
                    p.failed = "appendAsFollower did not advance the log end offset (" + leo + ")";
                    throw new IllegalStateException(p.failed);
                }
                if (first == null) {
                    first = info;
                }
                if (b.isControlBatch()) {
                    ObjectNode m = JSON.createObjectNode();
                    m.put("offset", b.baseOffset());
                    m.put("producer_id", b.producerId());
                    m.put("producer_epoch", b.producerEpoch());
                    m.put("type", controlType(b));
                    if (open.isPresent()) {
                        m.put("closed_txn_first_offset", open.getAsLong());
                    } else {
                        m.putNull("closed_txn_first_offset");
                    }
                    p.markers.add(m);
                }
            }
            long after = p.log.logEndOffset();
            if (!batches.isEmpty() && after <= before) {
                p.failed = "appendAsFollower did not advance the log end offset (" + before + ")";
                throw new IllegalStateException(p.failed);
            }
            p.appends++;
            try {
                if (p.replicas.size() <= 1) {
                    // The destination partition is its only replica: its high watermark follows
                    // the log end, so the last stable offset is decided by open transactions alone.
                    p.log.updateHighWatermark(after);
                } else {
                    maybeIncrementLeaderHw(p);
                }
            } catch (IOException ex) {
                throw new RuntimeException(ex);
            }
            return first;
        }
    }

    // ------------------------------------------------------------------ replication

    /**
     * Kafka's Partition.maybeIncrementLeaderHW: the leader's high watermark is the smallest log
     * end offset of the in-sync replicas (every replica here: a paused follower stays in sync
     * for as long as a test runs, well within replica.lag.time.max.ms), moved forward only, by
     * UnifiedLog.maybeIncrementHighWatermark.
     */
    static void maybeIncrementLeaderHw(Part p) throws IOException {
        synchronized (p) {
            long min = Long.MAX_VALUE;
            for (UnifiedLog r : p.replicas.values()) {
                min = Math.min(min, r.logEndOffset());
            }
            p.log.maybeIncrementHighWatermark(new org.apache.kafka.storage.internals.log.LogOffsetMetadata(min));
        }
    }

    /**
     * One replication round of a partition: each follower that is not paused fetches from its
     * log end on the leader's log (UnifiedLog.read up to the log end, as a follower fetch
     * reads) and appends with appendAsFollower; its high watermark follows the leader's, as
     * the follower fetch response carries it; then the leader's high watermark moves.
     */
    static boolean replicateOnce(Part p) throws IOException {
        boolean moved = false;
        synchronized (p) {
            UnifiedLog leader = p.log;
            for (Map.Entry<Integer, UnifiedLog> e : p.replicas.entrySet()) {
                UnifiedLog f = e.getValue();
                long limit = leader.logEndOffset();
                if (p.paused.contains(e.getKey())) {
                    limit = Math.min(limit, p.pausedAt.getOrDefault(e.getKey(), -1L));
                }
                if (e.getKey() == p.leader) {
                    continue;
                }
                long from = f.logEndOffset();
                if (from < limit) {
                    org.apache.kafka.storage.internals.log.FetchDataInfo info = leader.read(from, 1 << 20,
                            org.apache.kafka.server.storage.log.FetchIsolation.LOG_END, true);
                    org.apache.kafka.common.record.internal.Records r = info.records;
                    if (r.sizeInBytes() > 0) {
                        ByteBuffer buf = ByteBuffer.allocate(r.sizeInBytes());
                        if (r instanceof org.apache.kafka.common.record.internal.FileRecords fr) {
                            fr.readInto(buf, 0); // reads the slice and flips the buffer
                        } else {
                            buf.put(((MemoryRecords) r).buffer().duplicate());
                            buf.flip();
                        }
                        MemoryRecords all = MemoryRecords.readableRecords(buf);
                        // Whole batches below the limit only (a partly paused follower).
                        int size = 0;
                        int maxEpoch = 0;
                        for (MutableRecordBatch b : all.batches()) {
                            if (b.lastOffset() >= limit) {
                                break;
                            }
                            size += b.sizeInBytes();
                            maxEpoch = Math.max(maxEpoch, b.partitionLeaderEpoch());
                        }
                        if (size > 0) {
                            ByteBuffer part = all.buffer().duplicate();
                            part.limit(part.position() + size);
                            f.appendAsFollower(MemoryRecords.readableRecords(part.slice()), maxEpoch);
                            moved = true;
                        }
                    }
                }
                f.updateHighWatermark(Math.min(leader.highWatermark(), f.logEndOffset()));
            }
            maybeIncrementLeaderHw(p);
        }
        return moved;
    }

    void startReplicator() {
        if (replicator != null) {
            return;
        }
        replicator = new Thread(() -> {
            while (!Thread.currentThread().isInterrupted()) {
                for (Part p : parts.values()) {
                    if (p.replicas.size() > 1) {
                        try {
                            replicateOnce(p);
                        } catch (Throwable e) {
                            p.failed = "replication: " + e;
                        }
                    }
                }
                try {
                    Thread.sleep(20);
                } catch (InterruptedException e) {
                    return;
                }
            }
        }, "kafka-dest-replicator");
        replicator.setDaemon(true);
        replicator.start();
    }

    /** Opens a replica of `p` on each broker of `ids` (broker 0's is the existing log). */
    void replicate(Part p, List<Integer> ids) throws IOException {
        synchronized (p) {
            if (p.replicas.isEmpty()) {
                // The partition's existing log (<dir>/<topic>-<p>) is the first broker's replica,
                // and that broker leads.
                int first = ids.isEmpty() ? p.leader : ids.get(0);
                p.replicas.put(first, p.log);
                p.leader = first;
            }
            for (int id : ids) {
                if (p.replicas.containsKey(id)) {
                    continue;
                }
                File dir = new File(new File(dataDir, "broker-" + id), UnifiedLog.logDirName(p.tp));
                Files.createDirectories(dir.getParentFile().toPath());
                UnifiedLog log = UnifiedLog.create(dir, new LogConfig(new Properties()), 0L, 0L, scheduler, stats,
                        time, 900_000, new ProducerStateManagerConfig(86_400_000, false), 600_000, failureChannel,
                        hadCleanShutdown, p.log.topicId());
                p.replicas.put(id, log);
            }
        }
        startReplicator();
    }

    /**
     * A leadership move (Kafka's Partition.makeLeader / makeFollower): `to` becomes the leader
     * with a new destination leader epoch; every other replica truncates to the new leader the
     * way a follower does on its first fetch from it: the leader answers the end offset of the
     * follower's latest leader epoch (UnifiedLog.endOffsetForEpoch, from its leader epoch
     * cache), the follower truncates to that (UnifiedLog.truncateTo) when it holds more, and
     * asks again with its new latest epoch until it agrees. Records only the old leader had
     * are lost. The new leader keeps its high watermark; it moves once the others caught up.
     *
     * <p>Unlike Partition.makeLeader, no destination leader epoch is written into the new
     * leader's epoch cache: a mirrored log carries the source's partition leader epochs (its
     * fetcher appends source batches with appendAsFollower, and the seal is stamped with the
     * last fetched one), and a destination epoch above them would make Kafka's cache drop the
     * source epochs that follow. The destination epoch is reported in Metadata and
     * ListOffsets only.
     */
    ObjectNode moveLeader(Part p, int to) throws IOException {
        ObjectNode out = JSON.createObjectNode();
        synchronized (p) {
            UnifiedLog nl = p.replicas.get(to);
            if (nl == null) {
                throw new IllegalArgumentException(p.tp + " has no replica on broker " + to);
            }
            p.leader = to;
            p.leaderEpoch++;
            p.log = nl;
            ObjectNode trunc = out.putObject("truncated");
            for (Map.Entry<Integer, UnifiedLog> e : p.replicas.entrySet()) {
                if (e.getKey() == to) {
                    continue;
                }
                UnifiedLog f = e.getValue();
                long before = f.logEndOffset();
                for (int round = 0; round < 100; round++) {
                    Optional<Integer> epoch = f.latestEpoch();
                    long target;
                    if (epoch.isEmpty()) {
                        target = Math.min(f.logEndOffset(), nl.logEndOffset());
                    } else {
                        Optional<org.apache.kafka.server.common.OffsetAndEpoch> end = nl.endOffsetForEpoch(epoch.get());
                        target = end.isEmpty() ? 0 : Math.min(f.logEndOffset(), end.get().offset());
                    }
                    if (target >= f.logEndOffset()) {
                        break;
                    }
                    f.truncateTo(target);
                }
                f.updateHighWatermark(Math.min(f.highWatermark(), f.logEndOffset()));
                trunc.put(Integer.toString(e.getKey()), before - f.logEndOffset());
            }
            out.put("leader", to).put("leader_epoch", p.leaderEpoch).put("log_end_offset", nl.logEndOffset())
                    .put("high_watermark", nl.highWatermark());
        }
        return out;
    }

    static String controlType(RecordBatch b) {
        for (Record r : b) {
            ByteBuffer key = r.key();
            if (key == null || key.remaining() < 4) {
                return "INVALID";
            }
            short type = key.getShort(key.position() + 2);
            ControlRecordType t = ControlRecordType.fromTypeId(type);
            return t == ControlRecordType.UNKNOWN ? "TYPE_" + type : t.name();
        }
        return "EMPTY";
    }

    // ------------------------------------------------------------------ reports

    ObjectNode state(Part p) {
        ObjectNode o = JSON.createObjectNode();
        synchronized (p) {
            UnifiedLog log = p.log;
            o.put("topic", p.tp.topic());
            o.put("partition", p.tp.partition());
            o.put("topic_id", log.topicId().map(Uuid::toString).orElse(null));
            o.put("dir", log.dir().getAbsolutePath());
            o.put("log_start_offset", log.logStartOffset());
            o.put("log_end_offset", log.logEndOffset());
            o.put("high_watermark", log.highWatermark());
            o.put("last_stable_offset", log.lastStableOffset());
            Optional<Long> fu = log.firstUnstableOffset();
            if (fu.isPresent()) {
                o.put("first_unstable_offset", fu.get());
            } else {
                o.putNull("first_unstable_offset");
            }
            o.put("failed", p.failed);
            o.put("appends", p.appends);
            o.put("leader", p.leader);
            o.put("leader_epoch_dest", p.leaderEpoch);
            ObjectNode reps = o.putObject("replicas");
            for (Map.Entry<Integer, UnifiedLog> e : p.replicas.entrySet()) {
                reps.putObject(Integer.toString(e.getKey()))
                        .put("log_end_offset", e.getValue().logEndOffset())
                        .put("high_watermark", e.getValue().highWatermark())
                        .put("paused", p.paused.contains(e.getKey()));
            }
            ObjectNode producers = o.putObject("producers");
            for (Map.Entry<Long, ProducerStateEntry> e :
                    new TreeMap<>(log.producerStateManager().activeProducers()).entrySet()) {
                ProducerStateEntry s = e.getValue();
                ObjectNode q = producers.putObject(Long.toString(e.getKey()));
                q.put("producer_id", s.producerId());
                q.put("epoch", s.producerEpoch());
                q.put("coordinator_epoch", s.coordinatorEpoch());
                q.put("last_timestamp", s.lastTimestamp());
                if (s.currentTxnFirstOffset().isPresent()) {
                    q.put("open_txn_first_offset", s.currentTxnFirstOffset().getAsLong());
                } else {
                    q.putNull("open_txn_first_offset");
                }
                ArrayNode batches = q.putArray("batches");
                int lastSeq = -1;
                for (BatchMetadata bm : s.batchMetadata()) {
                    ArrayNode a = batches.addArray();
                    a.add(bm.firstSeq()).add(bm.lastSeq()).add(bm.firstOffset()).add(bm.lastOffset());
                    lastSeq = bm.lastSeq();
                }
                q.put("last_sequence", lastSeq);
            }
            ArrayNode aborted = o.putArray("aborted_txns");
            for (AbortedTxn t : log.collectAbortedTransactions(0, log.logEndOffset())) {
                aborted.addObject().put("producer_id", t.producerId()).put("first_offset", t.firstOffset());
            }
            ArrayNode markers = o.putArray("markers");
            p.markers.forEach(markers::add);
            ArrayNode epochs = o.putArray("leader_epochs");
            LeaderEpochFileCache cache = log.leaderEpochCache();
            cache.epochEntries().forEach(e -> epochs.addArray().add(e.epoch()).add(e.startOffset()));
            ArrayNode segs = o.putArray("segments");
            for (LogSegment s : log.logSegments()) {
                segs.add(s.log().file().getAbsolutePath());
            }
            OptionalLong snap = log.latestProducerSnapshotOffset();
            if (snap.isPresent()) {
                o.put("latest_snapshot_offset", snap.getAsLong());
            } else {
                o.putNull("latest_snapshot_offset");
            }
        }
        return o;
    }

    ArrayNode batches(Part p, boolean withValues) {
        ArrayNode out = JSON.createArrayNode();
        synchronized (p) {
            for (LogSegment s : p.log.logSegments()) {
                for (RecordBatch b : s.log().batches()) {
                    ObjectNode o = out.addObject();
                    o.put("base_offset", b.baseOffset());
                    o.put("last_offset", b.lastOffset());
                    o.put("partition_leader_epoch", b.partitionLeaderEpoch());
                    o.put("producer_id", b.producerId());
                    o.put("producer_epoch", b.producerEpoch());
                    o.put("base_sequence", b.baseSequence());
                    o.put("transactional", b.isTransactional());
                    o.put("control", b.isControlBatch());
                    o.put("crc_valid", b.isValid());
                    o.put("kind", b.isControlBatch() ? controlType(b) : "DATA");
                    if (withValues && !b.isControlBatch()) {
                        ArrayNode vals = o.putArray("values");
                        for (Record r : b) {
                            if (r.value() == null) {
                                vals.addNull();
                            } else {
                                byte[] v = new byte[r.value().remaining()];
                                r.value().duplicate().get(v);
                                vals.add(Base64.getEncoder().encodeToString(v));
                            }
                        }
                    }
                }
            }
        }
        return out;
    }

    // ------------------------------------------------------------------ commands

    ObjectNode handle(JsonNode cmd) throws Exception {
        String op = cmd.path("cmd").asText();
        ObjectNode out = JSON.createObjectNode();
        switch (op) {
            case "ping" -> out.put("clean_start", hadCleanShutdown).put("dir", dataDir.getAbsolutePath());
            case "open" -> {
                String id = cmd.path("topic_id").asText(null);
                Part p = open(cmd.path("topic").asText(), cmd.path("partition").asInt(0),
                        id == null ? null : Uuid.fromString(id));
                out.set("state", state(p));
            }
            case "list" -> {
                ArrayNode a = out.putArray("partitions");
                mapByName().values().forEach(p -> a.add(state(p)));
            }
            case "state" -> out.set("state", state(part(cmd)));
            case "batches" -> out.set("batches", batches(part(cmd), cmd.path("values").asBoolean(true)));
            case "append" -> {
                Part p = part(cmd);
                byte[] raw = Base64.getDecoder().decode(cmd.path("records").asText());
                LogAppendInfo info = appendFollower(p, MemoryRecords.readableRecords(ByteBuffer.wrap(raw)));
                out.put("first_offset", info.firstOffset()).put("last_offset", info.lastOffset());
                out.set("state", state(p));
            }
            case "produce" -> {
                // A local producer's batch on the CLIENT path of the same log (an in-place
                // promotion, as a KIP-1279 destination would do it): Kafka's LogValidator assigns
                // offsets and its ProducerStateManager checks epochs, sequences and duplicates.
                Part p = part(cmd);
                byte[] raw = Base64.getDecoder().decode(cmd.path("records").asText());
                synchronized (p) {
                    // The promoted partition's own leader epoch: one above what the log holds,
                    // chosen at the first local write and kept.
                    if (p.localEpoch < 0) {
                        p.localEpoch = p.log.latestEpoch().orElse(-1) + 1;
                    }
                    int epoch = cmd.has("leader_epoch") ? cmd.path("leader_epoch").asInt() : p.localEpoch;
                    long before = p.log.logEndOffset();
                    LogAppendInfo info;
                    try {
                        info = p.log.appendAsLeader(MemoryRecords.readableRecords(ByteBuffer.wrap(raw)), epoch,
                                AppendOrigin.CLIENT);
                        p.log.updateHighWatermark(p.log.logEndOffset());
                    } catch (org.apache.kafka.common.KafkaException e) {
                        out.put("error", e.getClass().getSimpleName());
                        out.put("message", e.getMessage());
                        out.put("ok", true);
                        return out;
                    }
                    out.putNull("error");
                    out.put("first_offset", info.firstOffset()).put("last_offset", info.lastOffset());
                    out.put("leader_epoch", epoch);
                    // A duplicate (same producer, epoch and sequence range as a cached batch) is
                    // answered with the cached batch's offsets and nothing is written.
                    out.put("stored", p.log.logEndOffset() > before);
                }
                out.set("state", state(p));
            }
            case "expire_producers" -> {
                Part p = part(cmd);
                synchronized (p) {
                    p.log.removeExpiredProducers(cmd.path("now_ms").asLong(time.milliseconds()));
                }
                out.set("state", state(p));
            }
            case "snapshot" -> {
                Part p = part(cmd);
                synchronized (p) {
                    p.log.flush(false);
                    p.log.takeProducerSnapshot();
                }
                out.set("state", state(p));
            }
            case "close_log" -> {
                Part p = part(cmd);
                for (Fetcher f : fetchers.values()) {
                    if (f.feeds(p.tp)) {
                        throw new IllegalStateException(p.tp + " is still fed by fetcher " + f.name);
                    }
                }
                ObjectNode st;
                synchronized (p) {
                    p.log.flush(false);
                    st = state(p);
                    // close() writes the producer snapshot at the log end, as a broker's shutdown does.
                    p.log.close();
                }
                parts.remove(p.tp);
                out.set("state", st);
            }
            case "mirror" -> {
                String name = cmd.path("name").asText();
                if (fetchers.containsKey(name)) {
                    throw new IllegalArgumentException("fetcher " + name + " exists");
                }
                Fetcher f = new Fetcher(this, name, cmd);
                fetchers.put(name, f);
                f.start();
                out.set("fetcher", f.report());
            }
            case "fetcher" -> out.set("fetcher", fetcher(cmd).report());
            case "stop_fetcher" -> {
                Fetcher f = fetcher(cmd);
                f.shutdown();
                fetchers.remove(f.name);
                out.set("fetcher", f.report());
            }
            case "drop_next" -> {
                Fetcher f = fetcher(cmd);
                f.dropNext(cmd.path("count").asInt(1), cmd.path("mode").asText("drop"));
                out.set("fetcher", f.report());
            }
            case "wait" -> {
                // Waits until the fetcher's position for the partition reaches `offset`, or the
                // partition failed, or the timeout passed; answers either way (ok=true) with
                // `reached` and the fetcher's report.
                Fetcher f = fetcher(cmd);
                TopicPartition tp = new TopicPartition(cmd.path("topic").asText(), cmd.path("partition").asInt(0));
                long target = cmd.path("offset").asLong();
                long deadline = System.currentTimeMillis() + cmd.path("timeout_ms").asLong(15_000);
                boolean reached = false;
                while (System.currentTimeMillis() < deadline) {
                    Long pos = f.position(tp);
                    Part p = parts.get(tp);
                    if (pos != null && pos >= target) {
                        reached = true;
                        break;
                    }
                    if (p != null && p.failed != null) {
                        break;
                    }
                    Thread.sleep(20);
                }
                out.put("reached", reached);
                out.set("fetcher", f.report());
            }
            case "listen" -> {
                // One Kafka listener per simulated broker id (ports: 0 = any free one).
                ObjectNode ports = out.putObject("ports");
                JsonNode ids = cmd.path("brokers");
                for (int i = 0; i < ids.size(); i++) {
                    int id = ids.get(i).asInt();
                    int port = cmd.path("ports").path(i).asInt(0);
                    BrokerServer b = servers.get(id);
                    if (b == null) {
                        Map<String, String> aliases = new TreeMap<>();
                        cmd.path("aliases").fields().forEachRemaining(a -> aliases.put(a.getKey(), a.getValue().asText()));
                        b = new BrokerServer(this, id, port, aliases);
                        servers.put(id, b);
                    }
                    ports.put(Integer.toString(id), b.port());
                }
            }
            case "replicate" -> {
                Part p = part(cmd);
                List<Integer> ids = new ArrayList<>();
                cmd.path("replicas").forEach(n -> ids.add(n.asInt()));
                replicate(p, ids);
                out.set("state", state(p));
            }
            case "pause_replication" -> {
                Part p = part(cmd);
                synchronized (p) {
                    int b = cmd.path("broker").asInt();
                    p.pausedAt.remove(b);
                    if (cmd.path("paused").asBoolean(true)) {
                        p.paused.add(b);
                        if (cmd.hasNonNull("upto")) {
                            // Copies up to this offset, then lags: a follower that has part of
                            // the leader's records.
                            p.pausedAt.put(b, cmd.path("upto").asLong());
                        }
                    } else {
                        p.paused.remove(b);
                    }
                }
                out.set("state", state(p));
            }
            case "move_leader" -> {
                Part p = part(cmd);
                out.set("move", moveLeader(p, cmd.path("leader").asInt()));
                out.set("state", state(p));
            }
            case "logs" -> {
                int since = cmd.path("since").asInt(0);
                out.set("lines", LogCapture.since(since));
                out.put("next", LogCapture.size());
            }
            case "shutdown" -> {
                shutdown();
                out.put("bye", true);
            }
            default -> throw new IllegalArgumentException("unknown cmd " + op);
        }
        out.put("ok", true);
        return out;
    }

    Map<String, Part> mapByName() {
        Map<String, Part> m = new TreeMap<>();
        parts.forEach((tp, p) -> m.put(tp.toString(), p));
        return m;
    }

    Fetcher fetcher(JsonNode cmd) {
        Fetcher f = fetchers.get(cmd.path("name").asText());
        if (f == null) {
            throw new IllegalArgumentException("no fetcher " + cmd.path("name").asText());
        }
        return f;
    }

    void shutdown() throws Exception {
        for (Fetcher f : fetchers.values()) {
            f.shutdown();
        }
        fetchers.clear();
        servers.values().forEach(BrokerServer::close);
        servers.clear();
        if (replicator != null) {
            replicator.interrupt();
            replicator.join(5000);
        }
        for (Part p : parts.values()) {
            synchronized (p) {
                if (p.replicas.isEmpty()) {
                    p.log.flush(false);
                    p.log.close();
                }
                for (UnifiedLog r : p.replicas.values()) {
                    r.flush(false);
                    r.close();
                }
            }
        }
        parts.clear();
        scheduler.shutdown();
        Files.writeString(new File(dataDir, CLEAN_SHUTDOWN).toPath(), "");
    }

    public static void main(String[] args) throws Exception {
        String dir = null;
        for (int i = 0; i < args.length; i++) {
            if (args[i].equals("--dir") && i + 1 < args.length) {
                dir = args[++i];
            }
        }
        if (dir == null) {
            System.err.println("usage: KafkaDest --dir <data dir>");
            System.exit(2);
        }
        // stdout is the control channel: nothing else may write to it.
        PrintStream control = new PrintStream(new java.io.FileOutputStream(java.io.FileDescriptor.out), true,
                StandardCharsets.UTF_8);
        System.setOut(System.err);
        LogCapture.install();
        KafkaDest dest = new KafkaDest(new File(dir));
        control.println(JSON.writeValueAsString(JSON.createObjectNode().put("ok", true).put("ready", true)
                .put("clean_start", dest.hadCleanShutdown)));
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isBlank()) {
                continue;
            }
            ObjectNode answer;
            JsonNode cmd = null;
            try {
                cmd = JSON.readTree(line);
                answer = dest.handle(cmd);
            } catch (Exception | AssertionError e) {
                answer = JSON.createObjectNode();
                answer.put("ok", false);
                answer.put("error", e.getClass().getSimpleName() + ": " + e.getMessage());
            }
            control.println(JSON.writeValueAsString(answer));
            if (cmd != null && "shutdown".equals(cmd.path("cmd").asText()) && answer.path("ok").asBoolean()) {
                System.exit(0);
            }
        }
        // stdin closed without a shutdown command: the controlling test is gone; no clean marker.
        System.exit(1);
    }
}
