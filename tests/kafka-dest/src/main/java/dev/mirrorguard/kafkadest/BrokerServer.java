package dev.mirrorguard.kafkadest;

import java.io.DataInputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.message.ApiVersionsResponseData;
import org.apache.kafka.common.message.ListOffsetsRequestData;
import org.apache.kafka.common.message.ListOffsetsResponseData;
import org.apache.kafka.common.message.MetadataResponseData;
import org.apache.kafka.common.protocol.ApiKeys;
import org.apache.kafka.common.protocol.ApiMessage;
import org.apache.kafka.common.protocol.ByteBufferAccessor;
import org.apache.kafka.common.protocol.Errors;
import org.apache.kafka.common.protocol.MessageUtil;
import org.apache.kafka.common.requests.AbstractRequest;
import org.apache.kafka.common.requests.ApiVersionsResponse;
import org.apache.kafka.common.requests.ListOffsetsRequest;
import org.apache.kafka.common.requests.MetadataRequest;
import org.apache.kafka.common.requests.RequestHeader;
import org.apache.kafka.common.requests.ResponseHeader;

/**
 * One simulated destination broker's Kafka listener on a loopback port: what a client of the
 * destination cluster (mirrorguard reading the high watermark) needs of it, answered with
 * Kafka's own request and response classes. ApiVersions; Metadata (every simulated broker,
 * every open partition with its topic id, leader and replicas); ListOffsets on the partitions
 * this broker leads (LATEST under READ_UNCOMMITTED is the high watermark, under READ_COMMITTED
 * the last stable offset, EARLIEST the log start), NOT_LEADER_OR_FOLLOWER elsewhere, as a
 * broker answers.
 */
final class BrokerServer implements AutoCloseable {
    final KafkaDest dest;
    final int brokerId;
    final ServerSocket server;
    final Thread acceptor;
    final List<Socket> clients = new ArrayList<>();
    /**
     * Topic names this listener answers for another name of the stand-in (asked name -> the
     * stand-in's topic): a stand-in process that plays several destination clusters renames
     * a mirrored topic (a fetch link's source_topic), which the mirror knows by its own name.
     * Empty: every topic under its own name. With aliases the listener is a cluster of its
     * own: it lists only the aliased topics and answers for their single-replica partitions.
     */
    final Map<String, String> aliases;
    volatile boolean running = true;
    long requests;

    BrokerServer(KafkaDest dest, int brokerId, int port, Map<String, String> aliases) throws IOException {
        this.dest = dest;
        this.brokerId = brokerId;
        this.aliases = aliases;
        this.server = new ServerSocket();
        server.setReuseAddress(true);
        server.bind(new InetSocketAddress(InetAddress.getLoopbackAddress(), port));
        acceptor = new Thread(this::accept, "kafka-dest-broker-" + brokerId);
        acceptor.setDaemon(true);
        acceptor.start();
    }

    int port() {
        return server.getLocalPort();
    }

    void accept() {
        while (running) {
            try {
                Socket s = server.accept();
                synchronized (clients) {
                    clients.add(s);
                }
                Thread t = new Thread(() -> serve(s), "kafka-dest-broker-" + brokerId + "-conn");
                t.setDaemon(true);
                t.start();
            } catch (IOException e) {
                if (!running) {
                    return;
                }
            }
        }
    }

    void serve(Socket s) {
        try (s) {
            s.setTcpNoDelay(true);
            DataInputStream in = new DataInputStream(s.getInputStream());
            OutputStream out = s.getOutputStream();
            while (running) {
                int size = in.readInt();
                if (size < 8 || size > 16 << 20) {
                    return; // hostile or broken: close, as a broker does
                }
                byte[] frame = new byte[size];
                in.readFully(frame);
                ByteBuffer buf = ByteBuffer.wrap(frame);
                RequestHeader header = RequestHeader.parse(buf);
                AbstractRequest req = AbstractRequest.parseRequest(header.apiKey(), header.apiVersion(),
                        new ByteBufferAccessor(buf)).request;
                synchronized (this) {
                    requests++;
                }
                ApiMessage resp = answer(header, req);
                short hv = header.apiKey().responseHeaderVersion(header.apiVersion());
                ResponseHeader rh = new ResponseHeader(header.correlationId(), hv);
                ByteBuffer h = MessageUtil.toByteBufferAccessor(rh.data(), hv).buffer();
                ByteBuffer b = MessageUtil.toByteBufferAccessor(resp, header.apiVersion()).buffer();
                ByteBuffer all = ByteBuffer.allocate(4 + h.remaining() + b.remaining());
                all.putInt(h.remaining() + b.remaining()).put(h).put(b);
                out.write(all.array());
                out.flush();
            }
        } catch (java.io.EOFException e) {
            // the client went away
        } catch (IOException | RuntimeException e) {
            // a broken connection, or what Kafka's classes cannot parse or answer: close it
            System.err.println("kafka-dest broker " + brokerId + ": closing a connection: " + e);
        } finally {
            synchronized (clients) {
                clients.remove(s);
            }
        }
    }

    ApiMessage answer(RequestHeader header, AbstractRequest req) throws IOException {
        return switch (header.apiKey()) {
            case API_VERSIONS -> {
                ApiVersionsResponseData d = new ApiVersionsResponseData().setErrorCode((short) 0);
                for (ApiKeys k : new ApiKeys[] {ApiKeys.API_VERSIONS, ApiKeys.METADATA, ApiKeys.LIST_OFFSETS}) {
                    d.apiKeys().add(ApiVersionsResponse.toApiVersion(k));
                }
                yield d;
            }
            case METADATA -> metadata((MetadataRequest) req);
            case LIST_OFFSETS -> listOffsets((ListOffsetsRequest) req);
            default -> throw new IllegalArgumentException("unsupported " + header.apiKey());
        };
    }

    MetadataResponseData metadata(MetadataRequest req) {
        MetadataResponseData d = new MetadataResponseData();
        d.setClusterId("kafka-dest-" + dest.dataDir.getName());
        d.setControllerId(brokerId);
        for (BrokerServer b : dest.servers.values()) {
            if (b.aliases.isEmpty() == aliases.isEmpty() && (aliases.isEmpty() || b == this)) {
                d.brokers().add(new MetadataResponseData.MetadataResponseBroker()
                        .setNodeId(b.brokerId).setHost("127.0.0.1").setPort(b.port()));
            }
        }
        Map<String, List<KafkaDest.Part>> byTopic = new TreeMap<>();
        for (KafkaDest.Part p : dest.parts.values()) {
            if (aliases.isEmpty()) {
                byTopic.computeIfAbsent(p.tp.topic(), t -> new ArrayList<>()).add(p);
            } else {
                for (Map.Entry<String, String> a : aliases.entrySet()) {
                    if (a.getValue().equals(p.tp.topic())) {
                        byTopic.computeIfAbsent(a.getKey(), t -> new ArrayList<>()).add(p);
                    }
                }
            }
        }
        List<String> wanted = req.data().topics() == null ? null
                : req.data().topics().stream().map(t -> t.name()).toList();
        for (Map.Entry<String, List<KafkaDest.Part>> e : byTopic.entrySet()) {
            if (wanted != null && !wanted.contains(e.getKey())) {
                continue;
            }
            MetadataResponseData.MetadataResponseTopic t = new MetadataResponseData.MetadataResponseTopic()
                    .setName(e.getKey()).setErrorCode((short) 0);
            for (KafkaDest.Part p : e.getValue()) {
                t.setTopicId(p.log.topicId().orElse(Uuid.ZERO_UUID));
                List<Integer> replicas = aliases.isEmpty() ? new ArrayList<>(p.replicaIds()) : List.of(brokerId);
                t.partitions().add(new MetadataResponseData.MetadataResponsePartition()
                        .setPartitionIndex(p.tp.partition()).setErrorCode((short) 0)
                        .setLeaderId(aliases.isEmpty() ? p.leader : brokerId).setLeaderEpoch(p.leaderEpoch)
                        .setReplicaNodes(replicas).setIsrNodes(replicas));
            }
            d.topics().add(t);
        }
        if (wanted != null) {
            for (String name : wanted) {
                if (!byTopic.containsKey(name)) {
                    d.topics().add(new MetadataResponseData.MetadataResponseTopic().setName(name)
                            .setErrorCode(Errors.UNKNOWN_TOPIC_OR_PARTITION.code()));
                }
            }
        }
        return d;
    }

    ListOffsetsResponseData listOffsets(ListOffsetsRequest req) throws IOException {
        ListOffsetsResponseData d = new ListOffsetsResponseData();
        for (ListOffsetsRequestData.ListOffsetsTopic t : req.data().topics()) {
            ListOffsetsResponseData.ListOffsetsTopicResponse tr =
                    new ListOffsetsResponseData.ListOffsetsTopicResponse().setName(t.name());
            for (ListOffsetsRequestData.ListOffsetsPartition p : t.partitions()) {
                ListOffsetsResponseData.ListOffsetsPartitionResponse pr =
                        new ListOffsetsResponseData.ListOffsetsPartitionResponse()
                                .setPartitionIndex(p.partitionIndex()).setTimestamp(-1L).setOffset(-1L);
                String name = aliases.isEmpty() ? t.name() : aliases.get(t.name());
                KafkaDest.Part part = name == null ? null : dest.parts.get(new TopicPartition(name, p.partitionIndex()));
                if (part == null) {
                    pr.setErrorCode(Errors.UNKNOWN_TOPIC_OR_PARTITION.code());
                } else if (aliases.isEmpty() ? part.leader != brokerId : part.replicas.size() > 1) {
                    pr.setErrorCode(Errors.NOT_LEADER_OR_FOLLOWER.code());
                } else {
                    synchronized (part) {
                        long ts = p.timestamp();
                        long offset;
                        if (ts == ListOffsetsRequest.LATEST_TIMESTAMP) {
                            offset = req.data().isolationLevel() == 1 ? part.log.lastStableOffset() : part.log.highWatermark();
                        } else if (ts == ListOffsetsRequest.EARLIEST_TIMESTAMP) {
                            offset = part.log.logStartOffset();
                        } else {
                            offset = -1;
                            pr.setErrorCode(Errors.UNSUPPORTED_VERSION.code());
                        }
                        pr.setOffset(offset);
                        if (req.version() >= 4) {
                            pr.setLeaderEpoch(part.leaderEpoch);
                        }
                    }
                }
                tr.partitions().add(pr);
            }
            d.topics().add(tr);
        }
        return d;
    }

    @Override
    public void close() {
        running = false;
        try {
            server.close();
        } catch (IOException ignored) {
            // closing
        }
        synchronized (clients) {
            for (Socket s : clients) {
                try {
                    s.close();
                } catch (IOException ignored) {
                    // closing
                }
            }
        }
    }
}
