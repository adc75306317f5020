package dev.mirrorguard.kafkadest;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.DataInputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.net.SocketTimeoutException;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.TreeMap;
import org.apache.kafka.clients.FetchSessionHandler;
import org.apache.kafka.common.IsolationLevel;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.message.ApiVersionsResponseData;
import org.apache.kafka.common.message.FetchResponseData;
import org.apache.kafka.common.protocol.ApiKeys;
import org.apache.kafka.common.protocol.Errors;
import org.apache.kafka.common.record.internal.MemoryRecords;
import org.apache.kafka.common.record.internal.MutableRecordBatch;
import org.apache.kafka.common.record.internal.Records;
import org.apache.kafka.common.requests.AbstractRequest;
import org.apache.kafka.common.requests.AbstractResponse;
import org.apache.kafka.common.requests.ApiVersionsRequest;
import org.apache.kafka.common.requests.ApiVersionsResponse;
import org.apache.kafka.common.requests.FetchMetadata;
import org.apache.kafka.common.requests.FetchRequest;
import org.apache.kafka.common.requests.FetchResponse;
import org.apache.kafka.common.requests.MetadataRequest;
import org.apache.kafka.common.requests.MetadataResponse;
import org.apache.kafka.common.requests.RequestHeader;
import org.apache.kafka.common.utils.internals.LogContext;

/**
 * A fetcher that behaves like a broker's replica fetcher thread, pointed at another cluster (or
 * at a mirrorguard {@code [[mirror]]} listener in front of it).
 *
 * <ul>
 *   <li>Multi-partition Fetch with incremental fetch sessions (KIP-227) kept by Kafka's own
 *       {@link FetchSessionHandler}; one {@link FetchSessionHandler} and one connection per
 *       source leader node, like a broker's fetcher per source broker.</li>
 *   <li>One request in flight: the thread sends, waits for the answer (or the request timeout),
 *       appends, then sends the next.</li>
 *   <li>A lost answer (timeout, closed connection, or one dropped on purpose with
 *       {@code drop_next}) goes through {@code FetchSessionHandler.handleError}, the connection is
 *       closed, and the next request re-fetches from the log end offset with a new session, as
 *       {@code NetworkClient} and {@code AbstractFetcherThread} do.</li>
 *   <li>The fetch offset is the destination log end offset (a new fetcher after a crash starts
 *       from there), LastFetchedEpoch the latest epoch of the log's leader epoch cache.</li>
 * </ul>
 *
 * <p>The replica id defaults to -1 (a consumer): a Kafka source answers a follower fetch from a
 * broker that is not in the partition's replica set with NOT_LEADER_OR_FOLLOWER.
 *
 * <p>TLS, as a broker's fetcher on an SSL listener: {@code tls_ca} (PEM CA bundle; hostname
 * verification on), optionally {@code tls_cert} + {@code tls_key} (PEM chain and unencrypted
 * PKCS#8 RSA key) for mutual TLS.
 */
final class Fetcher {
    final KafkaDest dest;
    final String name;
    final String bootstrap;
    final int replicaId;
    final boolean sessions;
    final boolean sendLastFetchedEpoch;
    final int maxWaitMs;
    final int requestTimeoutMs;
    final int maxBytes;
    final short maxFetchVersion;
    /** The simulated broker this fetcher runs on (-1: any); it appends only where it leads. */
    final int broker;
    /** TLS towards the source (null: plaintext). */
    final javax.net.ssl.SSLContext tls;
    final List<Link> links = new ArrayList<>();
    final Thread thread;
    volatile boolean running = true;

    // statistics, guarded by `this`
    long requests;
    long fullRequests;
    long incrementalRequests;
    long responses;
    long dropped;
    long timeouts;
    long connects;
    long ioErrors;
    long sessionErrors;
    long metadataRefreshes;
    long batchesAppended;
    final Map<String, Long> errors = new TreeMap<>();
    String lastError;
    int lastSessionId = FetchMetadata.INVALID_SESSION_ID;
    int lastEpoch = FetchMetadata.INITIAL_EPOCH;
    int lastRequestPartitions;
    int lastForgotten;
    short lastVersion = -1;
    int dropCount;
    String dropMode = "drop";

    List<NodeSession> nodes;

    /** One mirrored partition: source topic-partition -> destination partition. */
    static final class Link {
        final KafkaDest.Part part;
        final TopicPartition source;
        final boolean rebase;
        volatile long sourceOffset;
        Uuid topicId = Uuid.ZERO_UUID;
        volatile long sourceHighWatermark = -1;
        volatile long sourceLastStableOffset = -1;
        volatile int leader = -1;

        Link(KafkaDest.Part part, TopicPartition source, boolean rebase, long sourceOffset) {
            this.part = part;
            this.source = source;
            this.rebase = rebase;
            this.sourceOffset = sourceOffset;
        }

        long position() {
            return rebase ? sourceOffset : part.log.logEndOffset();
        }
    }

    /** The links led by one source node, with that node's connection and fetch session. */
    final class NodeSession {
        final Node node;
        final List<Link> links = new ArrayList<>();
        final Map<TopicPartition, Link> bySource = new HashMap<>();
        final FetchSessionHandler handler;
        Conn conn;
        short fetchVersion;

        NodeSession(Node node) {
            this.node = node;
            this.handler = new FetchSessionHandler(new LogContext("[kafka-dest fetcher " + name + " node "
                    + node.id() + "] "), node.id());
        }

        void close() {
            if (conn != null) {
                conn.close();
                conn = null;
            }
        }
    }

    Fetcher(KafkaDest dest, String name, JsonNode cmd) throws IOException {
        this.dest = dest;
        this.name = name;
        this.bootstrap = cmd.path("bootstrap").asText();
        this.replicaId = cmd.path("replica_id").asInt(-1);
        this.sessions = cmd.path("sessions").asBoolean(true);
        this.sendLastFetchedEpoch = cmd.path("last_fetched_epoch").asBoolean(true);
        this.maxWaitMs = cmd.path("max_wait_ms").asInt(100);
        this.requestTimeoutMs = cmd.path("request_timeout_ms").asInt(5000);
        this.maxBytes = cmd.path("max_bytes").asInt(1 << 20);
        this.maxFetchVersion = (short) cmd.path("max_fetch_version").asInt(ApiKeys.FETCH.latestVersion());
        this.broker = cmd.path("broker").asInt(-1);
        this.tls = cmd.hasNonNull("tls_ca")
            ? tlsContext(cmd.path("tls_ca").asText(), cmd.path("tls_cert").asText(null), cmd.path("tls_key").asText(null))
            : null;
        for (JsonNode p : cmd.path("partitions")) {
            String topic = p.path("topic").asText();
            int partition = p.path("partition").asInt(0);
            String id = p.path("topic_id").asText(null);
            KafkaDest.Part part = dest.open(topic, partition, id == null ? null : Uuid.fromString(id));
            TopicPartition source = new TopicPartition(p.path("source_topic").asText(topic), partition);
            links.add(new Link(part, source, p.path("rebase").asBoolean(false), p.path("source_offset").asLong(0)));
        }
        if (links.isEmpty()) {
            throw new IllegalArgumentException("mirror: no partitions");
        }
        thread = new Thread(this::run, "kafka-dest-fetcher-" + name);
        thread.setDaemon(true);
    }

    void start() {
        thread.start();
    }

    void shutdown() throws InterruptedException {
        running = false;
        thread.join(requestTimeoutMs + maxWaitMs + 5000L);
        if (nodes != null) {
            nodes.forEach(NodeSession::close);
        }
    }

    boolean feeds(TopicPartition tp) {
        return running && links.stream().anyMatch(l -> l.part.tp.equals(tp));
    }

    Long position(TopicPartition tp) {
        for (Link l : links) {
            if (l.part.tp.equals(tp)) {
                return l.position();
            }
        }
        return null;
    }

    synchronized void dropNext(int count, String mode) {
        if (!mode.equals("drop") && !mode.equals("timeout") && !mode.equals("lose_leadership")) {
            throw new IllegalArgumentException("mode must be drop, timeout or lose_leadership");
        }
        dropCount += count;
        dropMode = mode;
    }

    synchronized void count(String error) {
        errors.merge(error, 1L, Long::sum);
    }

    synchronized ObjectNode report() {
        ObjectNode o = KafkaDest.JSON.createObjectNode();
        o.put("name", name);
        o.put("bootstrap", bootstrap);
        o.put("running", running && thread.isAlive());
        o.put("replica_id", replicaId);
        o.put("sessions", sessions);
        o.put("requests", requests);
        o.put("full_requests", fullRequests);
        o.put("incremental_requests", incrementalRequests);
        o.put("responses", responses);
        o.put("dropped", dropped);
        o.put("timeouts", timeouts);
        o.put("connects", connects);
        o.put("io_errors", ioErrors);
        o.put("session_errors", sessionErrors);
        o.put("metadata_refreshes", metadataRefreshes);
        o.put("batches_appended", batchesAppended);
        o.put("pending_drops", dropCount);
        ObjectNode e = o.putObject("errors");
        errors.forEach(e::put);
        o.put("last_error", lastError);
        o.put("session_id", lastSessionId);
        o.put("session_epoch", lastEpoch);
        o.put("last_request_partitions", lastRequestPartitions);
        o.put("last_forgotten", lastForgotten);
        o.put("fetch_version", lastVersion);
        ArrayNode ps = o.putArray("partitions");
        for (Link l : links) {
            ObjectNode p = ps.addObject();
            p.put("topic", l.part.tp.topic());
            p.put("partition", l.part.tp.partition());
            p.put("source_topic", l.source.topic());
            p.put("source_topic_id", l.topicId.toString());
            p.put("position", l.position());
            p.put("rebase", l.rebase);
            p.put("source_high_watermark", l.sourceHighWatermark);
            p.put("source_last_stable_offset", l.sourceLastStableOffset);
            p.put("leader", l.leader);
            p.put("failed", l.part.failed);
        }
        return o;
    }

    // ------------------------------------------------------------------ the loop

    void run() {
        while (running) {
            try {
                if (nodes == null) {
                    discover();
                }
                boolean any = false;
                for (NodeSession ns : nodes) {
                    if (!running) {
                        break;
                    }
                    any |= fetchOnce(ns);
                }
                if (!any) {
                    Thread.sleep(maxWaitMs);
                }
            } catch (InterruptedException e) {
                return;
            } catch (Exception e) {
                synchronized (this) {
                    ioErrors++;
                    lastError = e.getClass().getSimpleName() + ": " + e.getMessage();
                }
                closeAll(e);
                sleepQuietly(200);
            }
        }
        closeAll(new IOException("fetcher stopped"));
    }

    void closeAll(Exception cause) {
        if (nodes != null) {
            for (NodeSession ns : nodes) {
                ns.handler.handleError(cause);
                ns.close();
            }
        }
        nodes = null;
    }

    /** Whether any partition of `resp` carries record bytes. */
    static boolean carriesRecords(FetchResponse resp) {
        for (var t : resp.data().responses()) {
            for (var p : t.partitions()) {
                if (p.records() != null && p.records().sizeInBytes() > 0) {
                    return true;
                }
            }
        }
        return false;
    }

    static void sleepQuietly(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    /** Metadata through the bootstrap address: topic ids and leaders; one session per leader. */
    void discover() throws IOException {
        synchronized (this) {
            metadataRefreshes++;
        }
        String[] hp = bootstrap.split(",")[0].split(":");
        Map<Integer, NodeSession> byNode = new LinkedHashMap<>();
        try (Conn c = new Conn(hp[0], Integer.parseInt(hp[1]), requestTimeoutMs, "kafka-dest-" + name, tls)) {
            Map<Short, ApiVersionsResponseData.ApiVersion> versions = c.apiVersions();
            short mv = (short) Math.min(12, versions.get(ApiKeys.METADATA.id).maxVersion());
            List<String> topics = links.stream().map(l -> l.source.topic()).distinct().toList();
            MetadataResponse md = (MetadataResponse) c.roundTrip(
                    new MetadataRequest.Builder(topics, false).build(mv));
            Map<Integer, Node> brokers = md.brokersById();
            Map<TopicPartition, MetadataResponse.PartitionMetadata> pm = new HashMap<>();
            Map<String, Uuid> ids = new HashMap<>();
            for (MetadataResponse.TopicMetadata t : md.topicMetadata()) {
                if (t.error() != Errors.NONE) {
                    count("METADATA_" + t.error().name());
                    continue;
                }
                ids.put(t.topic(), t.topicId() == null ? Uuid.ZERO_UUID : t.topicId());
                for (MetadataResponse.PartitionMetadata p : t.partitionMetadata()) {
                    pm.put(p.topicPartition, p);
                }
            }
            for (Link l : links) {
                MetadataResponse.PartitionMetadata p = pm.get(l.source);
                if (p == null || p.leaderId.isEmpty() || !brokers.containsKey(p.leaderId.get())) {
                    throw new IOException("no leader for " + l.source + " at " + bootstrap);
                }
                l.topicId = ids.getOrDefault(l.source.topic(), Uuid.ZERO_UUID);
                l.leader = p.leaderId.get();
                NodeSession ns = byNode.computeIfAbsent(l.leader, id -> new NodeSession(brokers.get(id)));
                ns.links.add(l);
                ns.bySource.put(l.source, l);
            }
        }
        nodes = new ArrayList<>(byNode.values());
    }

    /** One Fetch to one node; returns false when it had nothing to fetch. */
    boolean fetchOnce(NodeSession ns) throws IOException, InterruptedException {
        FetchSessionHandler.Builder b = ns.handler.newBuilder();
        int added = 0;
        for (Link l : ns.links) {
            if (broker >= 0 && l.part.leader != broker) {
                continue; // this broker does not lead the partition: its mirror fetcher leaves it
            }
            if (l.part.failed != null) {
                continue; // a failed partition is taken out of the fetcher, as a broker does
            }
            Optional<Integer> lastFetched = Optional.empty();
            if (sendLastFetchedEpoch && !l.rebase) {
                lastFetched = l.part.log.latestEpoch();
            }
            b.add(l.source, new FetchRequest.PartitionData(l.topicId, l.position(), -1L, maxBytes,
                    Optional.empty(), lastFetched));
            added++;
        }
        if (added == 0) {
            return false;
        }
        FetchSessionHandler.FetchRequestData d = b.build();
        if (ns.conn == null) {
            ns.conn = new Conn(ns.node.host(), ns.node.port(), requestTimeoutMs + maxWaitMs, "kafka-dest-" + name, tls);
            synchronized (this) {
                connects++;
            }
            Map<Short, ApiVersionsResponseData.ApiVersion> versions = ns.conn.apiVersions();
            ApiVersionsResponseData.ApiVersion fv = versions.get(ApiKeys.FETCH.id);
            if (fv == null) {
                throw new IOException(ns.node + " does not support Fetch");
            }
            ns.fetchVersion = (short) Math.min(maxFetchVersion, fv.maxVersion());
        }
        short v = ns.fetchVersion;
        if (!d.canUseTopicIds()) {
            v = (short) Math.min(v, 12);
        }
        FetchMetadata md = sessions ? d.metadata() : FetchMetadata.LEGACY;
        Map<TopicPartition, FetchRequest.PartitionData> toSend = sessions ? d.toSend() : d.sessionPartitions();
        FetchRequest.Builder rb = replicaId >= 0
                ? FetchRequest.Builder.forReplica(v, replicaId, -1L, maxWaitMs, 1, toSend)
                : FetchRequest.Builder.forConsumer(v, maxWaitMs, 1, toSend);
        rb.isolationLevel(IsolationLevel.READ_UNCOMMITTED).setMaxBytes(maxBytes).metadata(md);
        if (sessions) {
            rb.removed(d.toForget()).replaced(d.toReplace());
        }
        FetchRequest req = rb.build(v);
        String dropping = null;
        synchronized (this) {
            requests++;
            if (md.isFull()) {
                fullRequests++;
            } else {
                incrementalRequests++;
            }
            lastSessionId = md.sessionId();
            lastEpoch = md.epoch();
            lastRequestPartitions = toSend.size();
            lastForgotten = sessions ? d.toForget().size() : 0;
            lastVersion = v;
            if (dropCount > 0 && dropMode.equals("timeout")) {
                dropCount--;
                dropping = dropMode;
            }
        }
        FetchResponse resp;
        try {
            RequestHeader header = ns.conn.send(req);
            if ("timeout".equals(dropping)) {
                // The answer never arrives in time: wait out the request timeout, then give up on
                // the connection as NetworkClient does.
                Thread.sleep(requestTimeoutMs);
                throw new SocketTimeoutException("request timed out (on purpose)");
            }
            ByteBuffer raw = ns.conn.receive();
            // 'drop' loses the next response that arrives (the one in flight when it was asked).
            synchronized (this) {
                if (dropCount > 0 && dropMode.equals("drop")) {
                    dropCount--;
                    dropping = dropMode;
                }
            }
            if ("drop".equals(dropping)) {
                synchronized (this) {
                    dropped++;
                }
                throw new IOException("response dropped on purpose");
            }
            resp = (FetchResponse) AbstractResponse.parseResponse(raw, header);
            // 'lose_leadership': the next response that carries records is never appended and
            // the fetcher stops, as a broker that lost the partition's leadership with the
            // response in hand (another broker's fetcher takes over from the log end).
            boolean lose = false;
            synchronized (this) {
                if (dropCount > 0 && dropMode.equals("lose_leadership") && carriesRecords(resp)) {
                    dropCount--;
                    dropped++;
                    running = false;
                    lose = true;
                    lastError = "leadership lost with a response in hand (on purpose)";
                }
            }
            if (lose) {
                ns.handler.handleError(new IOException("leadership lost"));
                ns.close();
                return true;
            }
        } catch (IOException e) {
            synchronized (this) {
                if (e instanceof SocketTimeoutException) {
                    timeouts++;
                } else if (!"drop".equals(dropping)) {
                    ioErrors++;
                }
                lastError = e.getClass().getSimpleName() + ": " + e.getMessage();
            }
            ns.handler.handleError(e);
            ns.close();
            // The broker's replica.fetch.backoff.ms: no hot reconnect loop against a peer that
            // keeps closing the connection.
            Thread.sleep(100);
            return true;
        }
        synchronized (this) {
            responses++;
        }
        if (!ns.handler.handleResponse(resp, v)) {
            Errors e = resp.error();
            count(e.name());
            synchronized (this) {
                if (e == Errors.FETCH_SESSION_ID_NOT_FOUND || e == Errors.INVALID_FETCH_SESSION_EPOCH) {
                    sessionErrors++;
                }
                lastError = "session: " + e.name();
            }
            if (e != Errors.FETCH_SESSION_ID_NOT_FOUND && e != Errors.INVALID_FETCH_SESSION_EPOCH) {
                Thread.sleep(100);
            }
            return true;
        }
        if (resp.error() != Errors.NONE) {
            count(resp.error().name());
            Thread.sleep(100);
            return true;
        }
        boolean refresh = false;
        // A partition answered with an error: AbstractFetcherThread delays it by
        // replica.fetch.backoff.ms (delayPartitions) rather than asking again at once, since
        // a broker answers partition errors without waiting MaxWaitMs.
        boolean partitionError = false;
        Map<TopicPartition, FetchResponseData.PartitionData> data =
                resp.responseData(ns.handler.sessionTopicNames(), v);
        for (Map.Entry<TopicPartition, FetchResponseData.PartitionData> e : data.entrySet()) {
            Link l = ns.bySource.get(e.getKey());
            FetchResponseData.PartitionData pd = e.getValue();
            if (l == null) {
                count("UNREQUESTED_PARTITION");
                continue;
            }
            Errors pe = Errors.forCode(pd.errorCode());
            l.sourceHighWatermark = pd.highWatermark();
            l.sourceLastStableOffset = pd.lastStableOffset();
            if (pe != Errors.NONE) {
                count(pe.name());
                partitionError = true;
                switch (pe) {
                    case NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_TOPIC_ID, FENCED_LEADER_EPOCH,
                         UNKNOWN_LEADER_EPOCH, INCONSISTENT_TOPIC_ID, LEADER_NOT_AVAILABLE -> refresh = true;
                    default -> { }
                }
                continue;
            }
            if (FetchResponse.isDivergingEpoch(pd)) {
                count("DIVERGING_EPOCH");
                l.part.failed = "diverging epoch at the source: " + FetchResponse.divergingEpoch(pd).get();
                continue;
            }
            Records recs = FetchResponse.recordsOrFail(pd);
            if (recs.sizeInBytes() == 0) {
                continue;
            }
            MemoryRecords mr = (MemoryRecords) recs;
            long pos = l.position();
            long sourceNext = -1;
            int n = 0;
            for (MutableRecordBatch batch : mr.batches()) {
                if (batch.lastOffset() >= pos) {
                    sourceNext = batch.lastOffset() + 1;
                    n++;
                }
            }
            if (n == 0) {
                continue;
            }
            try {
                if (KafkaDest.appendMirrored(l.part, mr, pos, l.rebase ? 1 : -1, broker) == null
                        && broker >= 0 && l.part.leader != broker) {
                    count("NOT_LEADER_AT_APPEND");
                    continue;
                }
                if (l.rebase) {
                    l.sourceOffset = sourceNext;
                }
                synchronized (this) {
                    batchesAppended += n;
                }
            } catch (RuntimeException ex) {
                count("APPEND_FAILED");
                synchronized (this) {
                    lastError = "append " + l.part.tp + ": " + ex;
                }
            }
        }
        if (refresh) {
            synchronized (this) {
                lastError = "partition errors: refreshing metadata";
            }
            closeAll(new IOException("metadata refresh"));
            Thread.sleep(100);
        } else if (partitionError) {
            Thread.sleep(100);
        }
        return true;
    }

    // ------------------------------------------------------------------ TLS

    /** A TLS client context trusting the PEM CA bundle, with a client certificate if given. */
    static javax.net.ssl.SSLContext tlsContext(String caPem, String certPem, String keyPem) throws IOException {
        try {
            java.security.cert.CertificateFactory cf = java.security.cert.CertificateFactory.getInstance("X.509");
            java.security.KeyStore trust = java.security.KeyStore.getInstance(java.security.KeyStore.getDefaultType());
            trust.load(null, null);
            int i = 0;
            try (java.io.InputStream in = java.nio.file.Files.newInputStream(java.nio.file.Path.of(caPem))) {
                for (java.security.cert.Certificate c : cf.generateCertificates(in)) {
                    trust.setCertificateEntry("ca" + i++, c);
                }
            }
            javax.net.ssl.TrustManagerFactory tmf =
                javax.net.ssl.TrustManagerFactory.getInstance(javax.net.ssl.TrustManagerFactory.getDefaultAlgorithm());
            tmf.init(trust);
            javax.net.ssl.KeyManager[] keys = null;
            if (certPem != null && keyPem != null) {
                String pem = java.nio.file.Files.readString(java.nio.file.Path.of(keyPem));
                String b64 = pem.replaceAll("-----[A-Z ]+-----", "").replaceAll("\\s", "");
                java.security.PrivateKey key = java.security.KeyFactory.getInstance("RSA")
                    .generatePrivate(new java.security.spec.PKCS8EncodedKeySpec(java.util.Base64.getDecoder().decode(b64)));
                java.security.cert.Certificate[] chain;
                try (java.io.InputStream in = java.nio.file.Files.newInputStream(java.nio.file.Path.of(certPem))) {
                    chain = cf.generateCertificates(in).toArray(new java.security.cert.Certificate[0]);
                }
                java.security.KeyStore ks = java.security.KeyStore.getInstance(java.security.KeyStore.getDefaultType());
                ks.load(null, null);
                ks.setKeyEntry("client", key, new char[0], chain);
                javax.net.ssl.KeyManagerFactory kmf =
                    javax.net.ssl.KeyManagerFactory.getInstance(javax.net.ssl.KeyManagerFactory.getDefaultAlgorithm());
                kmf.init(ks, new char[0]);
                keys = kmf.getKeyManagers();
            }
            javax.net.ssl.SSLContext ctx = javax.net.ssl.SSLContext.getInstance("TLS");
            ctx.init(keys, tmf.getTrustManagers(), null);
            return ctx;
        } catch (java.security.GeneralSecurityException e) {
            throw new IOException("TLS setup: " + e, e);
        }
    }

    // ------------------------------------------------------------------ a plain socket client

    /** One blocking connection; requests are serialized by Kafka's own request classes. */
    static final class Conn implements AutoCloseable {
        final Socket socket;
        final DataInputStream in;
        final OutputStream out;
        final String clientId;
        int correlation;

        Conn(String host, int port, int timeoutMs, String clientId, javax.net.ssl.SSLContext tls) throws IOException {
            Socket tcp = new Socket();
            tcp.connect(new InetSocketAddress(host, port), Math.max(1000, timeoutMs));
            tcp.setSoTimeout(timeoutMs);
            tcp.setTcpNoDelay(true);
            if (tls != null) {
                javax.net.ssl.SSLSocket s = (javax.net.ssl.SSLSocket) tls.getSocketFactory().createSocket(tcp, host, port, true);
                javax.net.ssl.SSLParameters params = s.getSSLParameters();
                params.setEndpointIdentificationAlgorithm("HTTPS"); // the broker's certificate must name `host`
                s.setSSLParameters(params);
                s.startHandshake();
                socket = s;
            } else {
                socket = tcp;
            }
            in = new DataInputStream(socket.getInputStream());
            out = socket.getOutputStream();
            this.clientId = clientId;
        }

        RequestHeader send(AbstractRequest req) throws IOException {
            RequestHeader header = new RequestHeader(req.apiKey(), req.version(), clientId, ++correlation);
            ByteBuffer body = req.serializeWithHeader(header);
            byte[] frame = new byte[4 + body.remaining()];
            ByteBuffer.wrap(frame).putInt(body.remaining()).put(body);
            out.write(frame);
            out.flush();
            return header;
        }

        ByteBuffer receive() throws IOException {
            int size = in.readInt();
            if (size < 4 || size > 256 << 20) {
                throw new IOException("bad response size " + size);
            }
            byte[] buf = new byte[size];
            in.readFully(buf);
            return ByteBuffer.wrap(buf);
        }

        AbstractResponse roundTrip(AbstractRequest req) throws IOException {
            RequestHeader h = send(req);
            ByteBuffer raw = receive();
            int corr = raw.getInt(0);
            if (corr != h.correlationId()) {
                throw new IOException("correlation id " + corr + " != " + h.correlationId());
            }
            return AbstractResponse.parseResponse(raw, h);
        }

        Map<Short, ApiVersionsResponseData.ApiVersion> apiVersions() throws IOException {
            ApiVersionsResponse r = (ApiVersionsResponse) roundTrip(new ApiVersionsRequest.Builder().build((short) 3));
            if (r.data().errorCode() != 0) {
                throw new IOException("ApiVersions error " + Errors.forCode(r.data().errorCode()));
            }
            Map<Short, ApiVersionsResponseData.ApiVersion> m = new HashMap<>();
            for (ApiVersionsResponseData.ApiVersion a : r.data().apiKeys()) {
                m.put(a.apiKey(), a);
            }
            return m;
        }

        @Override
        public void close() {
            try {
                socket.close();
            } catch (IOException ignored) {
                // closing a socket that is already broken
            }
        }
    }
}
