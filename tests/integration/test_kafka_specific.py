"""What only a real Apache Kafka 4.4 can show (issue 10): non-empty Fetch
``aborted_transactions`` mapped through the mirror listener, ``__mirror_state`` created
compacted on a Kafka state cluster, and multi-broker routing (three nodes, every address
a client sees is a proxy port, librdkafka follows a new leader after the old one's node
is killed). Tansu cannot run these: it never fills aborted_transactions and is always
one node (111)."""

from __future__ import annotations

import json

import pytest
from confluent_kafka.admin import ConfigResource, ConfigSource, ResourceType

import harness
import rawkafka
from harness import HOST, consume_assign, create_topics, new_producer, produce, topic_name, wait_until
from mirror_harness import (  # noqa: F401 - mirror_factory is a fixture
    MirrorSpec,
    fetch_request,
    fold,
    map_pid,
    mirror_factory,
    send,
    transactional_producer,
    txn,
    idempotent_producer,
)


def _aborted(bootstrap: str, version: int, topic: str, topic_id: bytes | None) -> tuple[list, int]:
    """(aborted_transactions, last_stable_offset) of a read_committed Fetch from offset 0,
    through the address the bootstrap's Metadata names as leader."""
    host, port = bootstrap.rsplit(":", 1)
    with rawkafka.Connection(host, int(port), timeout=5) as c:
        md = rawkafka.metadata_v1(c, [topic])
        lhost, lport = md.brokers[md.topics[topic][0]]
    with rawkafka.Connection(lhost, lport, timeout=10) as c:
        res = fetch_request(c, version, topic, topic_id, 0, 0, isolation_level=1)
    assert res.error_code == 0 and res.top_error == 0, res
    return res.aborted_transactions, res.last_stable_offset


@pytest.mark.parametrize("layout", ["high", "sign-bit"])
def test_aborted_transactions_mapped_like_the_batches(kafka_factory, kafka1, mirror_factory, layout):
    """Two transactional producers abort transactions on a Kafka source (interleaved with
    committed ones): Kafka's read_committed Fetch names them in aborted_transactions, and
    through the mirror listener every entry carries the mapped PID of its producer (the
    same mapping as the batches) with Kafka's own first offset, for Fetch v4, v12, v13."""
    src = kafka_factory()
    topic = topic_name("aborted")
    create_topics(src.bootstrap, [topic])
    create_topics(kafka1.bootstrap, [topic])  # the destination topic (kafka1 is the destination here)
    mg = mirror_factory(kafka1.bootstrap, [MirrorSpec.of("a-to-b", src, layout=layout)])
    p1 = transactional_producer(src.bootstrap, f"tx1-{topic}")
    p2 = transactional_producer(src.bootstrap, f"tx2-{topic}")
    send(idempotent_producer(src.bootstrap), topic, [b"idem-0"])
    txn(p1, topic, [b"p1-abort-%d" % i for i in range(3)], commit=False)
    txn(p2, topic, [b"p2-commit-%d" % i for i in range(2)], commit=True)
    txn(p2, topic, [b"p2-abort-%d" % i for i in range(2)], commit=False)
    txn(p1, topic, [b"p1-commit"], commit=True)
    harness.wait_txn_markers(src.bootstrap, topic)

    with rawkafka.Connection(HOST, src.port, timeout=5) as c:
        ids, _ = rawkafka.topic_ids_v12(c, [topic])
    fa = fold(src.cluster_id)
    batches, _ = rawkafka.fetch_all_batches(HOST, src.port, topic)
    txn_pids = {b.producer_id for b in batches if b.is_transactional}
    assert len(txn_pids) == 2, txn_pids
    for version in (4, 12, 13):
        direct, direct_lso = _aborted(src.bootstrap, version, topic, ids[topic])
        # Kafka's own data: one entry per aborted transaction, at its first data offset.
        assert len(direct) == 2 and {pid for pid, _ in direct} == txn_pids, direct
        firsts = {b.base_offset for b in batches if b.is_transactional and not b.is_control}
        assert {off for _, off in direct} <= firsts, (direct, firsts)
        via, via_lso = _aborted(mg.mirrors["a-to-b"].bootstrap, version, topic, ids[topic])
        assert via == [(map_pid(pid, fa, 0, layout), off) for pid, off in direct], (version, via, direct)
        assert via_lso == direct_lso

    # The read_committed view through the mirror: librdkafka drops exactly the aborted records.
    got = consume_assign(mg.mirrors["a-to-b"].bootstrap, topic, count=4,
                         **{"isolation.level": "read_committed", "check.crcs": True})
    assert [m.value() for m in got] == [b"idem-0", b"p2-commit-0", b"p2-commit-1", b"p1-commit"]


def test_mirror_state_topic_created_compacted_on_kafka(kafka_factory, kafka1, mirror_factory):
    """mirrorguard creates its state topic on a Kafka state cluster: one partition,
    cleanup.policy=compact (DescribeConfigs), and its records are readable there."""
    src = kafka_factory()
    state_topic = f"__mirror_state_{topic_name('c').split('-')[1]}"
    a = harness.admin(kafka1.bootstrap)
    assert state_topic not in a.list_topics(timeout=10).topics
    mirror_factory(kafka1.bootstrap, [MirrorSpec.of("a-to-b", src)], state_topic=state_topic)  # ready = state read
    wait_until(lambda: state_topic in a.list_topics(timeout=5).topics, 15, what="state topic created")
    md = a.list_topics(state_topic, timeout=10).topics[state_topic]
    assert len(md.partitions) == 1
    res = ConfigResource(ResourceType.TOPIC, state_topic)
    cfg = a.describe_configs([res])[res].result(timeout=10)
    assert cfg["cleanup.policy"].value == "compact", cfg["cleanup.policy"]
    # Set on the topic by mirrorguard, not inherited from a broker default.
    assert cfg["cleanup.policy"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value


def _proxy_addresses(proxy, node_ids) -> dict[int, tuple[str, int]]:
    return {n: (HOST, proxy.ports.node_port_of(n)) for n in node_ids}


def test_three_brokers_every_address_is_a_proxy_port(kafka3, proxy_factory):
    """Metadata (librdkafka and raw v1/v12), FindCoordinator (group and transaction keys,
    every version) and DescribeCluster through mirrorguard in front of three Kafka nodes
    name only proxy ports, one per node; clients reach every partition leader."""
    proxy = proxy_factory([kafka3.bootstrap], node_ids=kafka3.node_ids)
    expected = _proxy_addresses(proxy, kafka3.node_ids)
    broker_ports = {n.port for n in kafka3.nodes}
    topic = topic_name("routing")
    create_topics(proxy.bootstrap, [topic], partitions=6, replication_factor=3)

    # The broker that answers may learn of the new topic a moment after the controller.
    admin = harness.admin(proxy.bootstrap)
    def known():
        t = admin.list_topics(timeout=10).topics.get(topic)
        return t is not None and len(t.partitions) == 6 and all(p.leader >= 0 for p in t.partitions.values())

    harness.wait_until(known, 30, interval=0.2, what="the new topic's leaders in the metadata")
    md = admin.list_topics(timeout=10)
    assert {b.id: (b.host, b.port) for b in md.brokers.values()} == expected
    leaders = {p.leader for p in md.topics[topic].partitions.values()}
    assert leaders <= set(kafka3.node_ids) and len(leaders) >= 2, leaders  # spread over nodes

    for port in [proxy.ports.bootstrap, *(p for _, p in expected.values())]:
        with rawkafka.Connection(HOST, port) as c:
            raw = rawkafka.metadata_v1(c, [topic])
            assert raw.brokers == expected
            _, flex = rawkafka.topic_ids_v12(c, [topic])
            assert flex == expected
            lo, hi = rawkafka.api_versions(c)[rawkafka.API_FIND_COORDINATOR]
            for v in range(lo, hi + 1):
                for key_type, key in ((0, f"grp-{topic}"), (1, f"txn-{topic}")):
                    if key_type and v == 0:
                        continue
                    err, node, host, cport = rawkafka.find_coordinator(c, key, version=v, key_type=key_type)
                    if err == 15:  # COORDINATOR_NOT_AVAILABLE while the internal topic is created
                        continue
                    assert err == 0, (v, key_type, err)
                    assert (host, cport) == expected[node] and cport not in broker_ports, (v, node, host, cport)

    desc = harness.admin(proxy.bootstrap).describe_cluster(request_timeout=10).result(timeout=15)
    assert {n.id: (n.host, n.port) for n in desc.nodes} == expected
    assert desc.controller is None or (desc.controller.host, desc.controller.port) == expected[desc.controller.id]

    # Every partition (leaders on every node) through the proxy, both ways.
    for p in range(6):
        produce(proxy.bootstrap, topic, [(None, b"p%d-%d" % (p, i)) for i in range(5)], partition=p,
                **{"enable.idempotence": True, "acks": "all"})
        got = consume_assign(proxy.bootstrap, topic, partition=p, count=5)
        assert [m.value() for m in got] == [b"p%d-%d" % (p, i) for i in range(5)]
    m = proxy.metrics()
    assert m.sum("mirrorguard_requests_total", api="Produce") >= 6


def test_leader_killed_librdkafka_follows_new_leader_through_proxy(kafka_factory, proxy_factory):
    """A three-node cluster of this test's own; a replicated topic (RF 3) whose leader's
    node is killed (SIGKILL) while an idempotent librdkafka producer writes through
    mirrorguard: the producer learns the new leader through the proxy's Metadata (a proxy
    port), every record is delivered exactly once and in order, and the consumer reads
    them all through the proxy."""
    cluster = kafka_factory(nodes=3, overrides={"min.insync.replicas": 2})
    proxy = proxy_factory([cluster.bootstrap], node_ids=cluster.node_ids, metadata_refresh_ms=1000)
    expected = _proxy_addresses(proxy, cluster.node_ids)
    topic = topic_name("failover")
    create_topics(proxy.bootstrap, [topic], replication_factor=3)
    stats: list[dict] = []
    p = new_producer(proxy.bootstrap, **{"enable.idempotence": True, "acks": "all", "linger.ms": 5,
                                         "message.timeout.ms": 60000, "statistics.interval.ms": 200,
                                         "stats_cb": lambda s: stats.append(json.loads(s))})
    produce(proxy.bootstrap, topic, [(None, b"before-%d" % i) for i in range(20)], producer=p)
    old_leader = cluster.leader_of(topic)

    cluster.node(old_leader).kill()
    # Produce while the leader moves: records wait in librdkafka and go to the new leader.
    delivered = produce(proxy.bootstrap, topic, [(None, b"after-%d" % i) for i in range(20)], producer=p,
                        timeout=60)
    new_leader = cluster.leader_of(topic)
    assert new_leader != old_leader and new_leader in cluster.node_ids
    assert [m.offset() for m in delivered] == list(range(20, 40))

    # What the client was told about the new leader came through the proxy.
    with rawkafka.Connection(HOST, proxy.ports.bootstrap) as c:
        md = rawkafka.metadata_v1(c, [topic])
    assert md.topics[topic][0] == new_leader
    assert md.brokers[new_leader] == expected[new_leader]
    assert all(addr == expected[n] for n, addr in md.brokers.items())

    def producer_on_new_leader():
        p.poll(0.2)
        if not stats:
            return False
        tp = stats[-1]["topics"][topic]["partitions"]["0"]
        return tp["leader"] == new_leader
    wait_until(producer_on_new_leader, 15, what="librdkafka's leader for the partition is the new one")
    brokers = stats[-1]["brokers"]
    names = {b["nodeid"]: b["name"] for b in brokers.values() if b["nodeid"] >= 0}
    assert names[new_leader].endswith(f"{HOST}:{expected[new_leader][1]}/{new_leader}"), names

    got = consume_assign(proxy.bootstrap, topic, count=40, **{"isolation.level": "read_committed"})
    assert [m.value() for m in got] == [b"before-%d" % i for i in range(20)] + [b"after-%d" % i for i in range(20)]
    assert proxy.alive()
