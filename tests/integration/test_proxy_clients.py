"""Real librdkafka (confluent-kafka) clients through mirrorguard.

Each test runs against `kafka`: mirrorguard in front of the session's Apache Kafka
node (or a fresh Tansu broker with --mg-broker=tansu/both), or the broker itself with
--mg-target=direct (to validate the tests).
"""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import ConfigResource, ResourceType

import rawkafka
from harness import (
    FAST_GROUP_CONF,
    HOST,
    admin,
    new_consumer,
    new_producer,
    consume_assign,
    create_topics,
    produce,
    topic_name,
    wait_txn_markers,
    wait_until,
)

# Tansu answers Produce with acks=0 (Apache Kafka never does): a proxy that expects no
# answer must tolerate one (first versions of mirrorguard closed the client connection).
# That is why acks=0 keeps running on Tansu too with --mg-broker=both.


CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def leader_addr(target) -> tuple[str, int]:
    """Where a raw client should send Fetch for the (only) broker node as seen through `target`."""
    if target.via_proxy:
        return HOST, target.proxy.ports.node_port
    return HOST, target.broker.port


def test_create_topics_through_proxy(kafka):
    plain, compacted = topic_name("plain"), topic_name("compacted")
    create_topics(kafka.bootstrap, [plain], partitions=3)
    create_topics(kafka.bootstrap, [compacted], partitions=1, config={"cleanup.policy": "compact"})

    # The broker itself (not the proxy) has them, with the requested shape.
    direct = admin(kafka.broker.bootstrap)
    md = direct.list_topics(timeout=10)
    assert len(md.topics[plain].partitions) == 3
    assert len(md.topics[compacted].partitions) == 1
    res = ConfigResource(ResourceType.TOPIC, compacted)
    cfg = direct.describe_configs([res])[res].result(timeout=10)
    assert cfg["cleanup.policy"].value == "compact"

    # Creating an existing topic through the proxy yields the broker's error, not a hang.
    a = admin(kafka.bootstrap)
    from confluent_kafka.admin import NewTopic

    fut = a.create_topics([NewTopic(plain, 3, 1)], request_timeout=10)[plain]
    with pytest.raises(Exception) as ei:
        fut.result(timeout=15)
    assert "TOPIC_ALREADY_EXISTS" in str(ei.value) or "already exists" in str(ei.value).lower()


@pytest.mark.parametrize("codec", list(CODECS))
def test_produce_consume_compression(kafka, codec):
    topic = topic_name(f"c-{codec}")
    create_topics(kafka.bootstrap, [topic])
    n = 300
    recs = [(f"k{i}".encode(), (f"value-{i}-" + "x" * (i % 50)).encode()) for i in range(n)]
    delivered = produce(
        kafka.bootstrap,
        topic,
        recs,
        headers=[("h", b"hv")],
        **{"compression.type": codec, "linger.ms": 20, "batch.num.messages": 100},
    )
    assert [m.offset() for m in delivered] == list(range(n))

    got = consume_assign(kafka.bootstrap, topic, count=n)
    assert [(m.key(), m.value()) for m in got] == recs
    assert [m.offset() for m in got] == list(range(n))
    assert all(m.headers() == [("h", b"hv")] for m in got)

    # The stored batches really use the codec (checked on the broker, raw).
    batches, _ = rawkafka.fetch_all_batches(HOST, kafka.broker.port, topic)
    assert batches, "no batches stored"
    assert {b.compression for b in batches} == {CODECS[codec]}
    assert all(b.crc_ok() for b in batches)
    assert sum(b.record_count for b in batches) == n


@pytest.mark.quick  # scripts/test.sh --quick: the proxy
def test_idempotent_producer(kafka):
    topic = topic_name("idem")
    create_topics(kafka.bootstrap, [topic])
    n = 500
    recs = [(None, f"idem-{i}".encode()) for i in range(n)]
    p = new_producer(
        kafka.bootstrap, **{"enable.idempotence": True, "acks": "all", "linger.ms": 5, "batch.num.messages": 50}
    )
    produce(kafka.bootstrap, topic, recs[:250], producer=p)
    produce(kafka.bootstrap, topic, recs[250:], producer=p)

    got = consume_assign(kafka.bootstrap, topic, count=n)
    assert [m.value() for m in got] == [v for _, v in recs]

    batches, _ = rawkafka.fetch_all_batches(*leader_addr(kafka), topic)
    pids = {b.producer_id for b in batches}
    assert len(pids) == 1 and next(iter(pids)) >= 0, pids
    assert all(b.producer_epoch >= 0 for b in batches)
    seq = 0
    for b in batches:
        assert b.base_sequence == seq, f"batch at {b.base_offset}: base_sequence {b.base_sequence} != {seq}"
        seq += b.record_count
    assert seq == n


def _txn_producer(bootstrap: str, txn_id: str) -> Producer:
    p = new_producer(bootstrap, **{"transactional.id": txn_id, "transaction.timeout.ms": 30000})
    p.init_transactions(15)
    return p


def _control_batches(batches):
    return [(b.producer_id, b.control_type()) for b in batches if b.is_control]


def test_transactional_commit(kafka):
    topic = topic_name("txc")
    create_topics(kafka.bootstrap, [topic])
    p = _txn_producer(kafka.bootstrap, f"txn-{topic}")
    p.begin_transaction()
    for i in range(20):
        p.produce(topic, value=f"committed-{i}".encode(), partition=0)
    p.commit_transaction(15)
    wait_txn_markers(kafka.broker.bootstrap, topic)

    got = consume_assign(kafka.bootstrap, topic, count=20, **{"isolation.level": "read_committed"})
    assert [m.value() for m in got] == [f"committed-{i}".encode() for i in range(20)]

    batches, _ = rawkafka.fetch_all_batches(*leader_addr(kafka), topic)
    data = [b for b in batches if not b.is_control]
    assert data and all(b.is_transactional for b in data)
    pid = data[0].producer_id
    assert pid >= 0
    assert _control_batches(batches) == [(pid, rawkafka.CONTROL_COMMIT)]
    marker = batches[-1]
    assert marker.is_control and marker.is_transactional  # attributes 0x30


def test_transactional_abort(kafka):
    """The ABORT marker for the aborted transaction and the COMMIT marker for the
    committed one are in the log as seen through the proxy, and the committed records
    arrive. On Apache Kafka read_committed from offset 0 skips the aborted records
    (aborted_transactions filled); Tansu never fills it, so there only the committed
    tail is checked (test-broker.md)."""
    topic = topic_name("txa")
    create_topics(kafka.bootstrap, [topic])
    p = _txn_producer(kafka.bootstrap, f"txn-{topic}")
    p.begin_transaction()
    for i in range(10):
        p.produce(topic, value=f"aborted-{i}".encode(), partition=0)
    p.flush(15)
    p.abort_transaction(15)
    p.begin_transaction()
    for i in range(10):
        p.produce(topic, value=f"committed-{i}".encode(), partition=0)
    p.commit_transaction(15)
    wait_txn_markers(kafka.broker.bootstrap, topic)

    batches, _ = rawkafka.fetch_all_batches(*leader_addr(kafka), topic)
    assert all(b.crc_ok() for b in batches)
    pid = batches[0].producer_id
    assert pid >= 0
    assert _control_batches(batches) == [(pid, rawkafka.CONTROL_ABORT), (pid, rawkafka.CONTROL_COMMIT)]
    kinds = ["abort" if b.is_control and b.control_type() == 0 else "commit" if b.is_control else "data" for b in batches]
    first_abort = kinds.index("abort")
    assert set(kinds[:first_abort]) == {"data"} and kinds[-1] == "commit"
    assert all(b.is_transactional for b in batches)

    # read_uncommitted sees all 20 data records; the committed ones arrive in order.
    # (librdkafka's default is read_committed: against Tansu, which never fills
    # aborted_transactions, that default used to show the aborted records too.)
    got = consume_assign(kafka.bootstrap, topic, count=20, **{"isolation.level": "read_uncommitted"})
    values = [m.value() for m in got]
    assert values == [f"aborted-{i}".encode() for i in range(10)] + [f"committed-{i}".encode() for i in range(10)]
    # The commit marker follows the committed data: the LSO/high watermark covers them.
    committed_read = consume_assign(
        kafka.bootstrap, topic, offset=got[10].offset(), count=10, **{"isolation.level": "read_committed"}
    )
    assert [m.value() for m in committed_read] == [f"committed-{i}".encode() for i in range(10)]
    if kafka.on_kafka:
        from_start = consume_assign(kafka.bootstrap, topic, count=10, **{"isolation.level": "read_committed"})
        assert [m.value() for m in from_start] == [f"committed-{i}".encode() for i in range(10)]
        # Kafka's own answer, through the proxy: the aborted transaction starts at 0.
        with rawkafka.Connection(*leader_addr(kafka)) as c:
            res = rawkafka.fetch_v4(c, topic, 0, 0, isolation_level=1)
        assert res.aborted_transactions == [(pid, 0)], res


def _group_consumer(target, group: str) -> Consumer:
    # FAST_GROUP_CONF works around Tansu's slow JoinGroup with a 2 s session timeout,
    # which Apache Kafka refuses (group.min.session.timeout.ms is 6 s): Kafka joins
    # quickly anyway (group.initial.rebalance.delay.ms=0 on the test brokers).
    group_conf = {"partition.assignment.strategy": "range"} if target.on_kafka else FAST_GROUP_CONF
    return new_consumer(
        target.bootstrap,
        **{
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
            **group_conf,
        },
    )


def _poll_n(c: Consumer, n: int, timeout: float) -> list:
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"group consumer got {len(out)} of {n} in {timeout}s")
        for m in c.consume(num_messages=n - len(out), timeout=0.5):
            assert m.error() is None, m.error()
            out.append(m)
    return out


def test_consumer_group_commit_and_resume(kafka):
    topic = topic_name("grp")
    group = f"g-{topic}"
    create_topics(kafka.bootstrap, [topic])
    produce(kafka.bootstrap, topic, [(None, f"m{i}".encode()) for i in range(30)])

    c1 = _group_consumer(kafka, group)
    try:
        c1.subscribe([topic])
        first = _poll_n(c1, 12, timeout=30)
        assert [m.offset() for m in first] == list(range(12))
        c1.commit(offsets=[TopicPartition(topic, 0, 12)], asynchronous=False)
        committed = c1.committed([TopicPartition(topic, 0)], timeout=10)
        assert committed[0].offset == 12
    finally:
        c1.close()

    c2 = _group_consumer(kafka, group)
    try:
        c2.subscribe([topic])
        rest = _poll_n(c2, 18, timeout=30)
        assert [m.offset() for m in rest] == list(range(12, 30))
        assert [m.value() for m in rest] == [f"m{i}".encode() for i in range(12, 30)]
    finally:
        c2.close()

    if kafka.via_proxy:
        # The group traffic went through the proxy (the coordinator address was rewritten),
        # not straight to the broker.
        m = kafka.proxy.metrics()
        for api in ("FindCoordinator", "JoinGroup", "SyncGroup", "OffsetCommit", "OffsetFetch"):
            assert m.sum("mirrorguard_requests_total", api=api) > 0, f"no {api} request seen by the proxy"


def test_metadata_lists_only_proxy_addresses(kafka):
    topic = topic_name("md")
    create_topics(kafka.bootstrap, [topic], partitions=2)
    md = admin(kafka.bootstrap).list_topics(timeout=10)
    expected_port = kafka.proxy.ports.node_port if kafka.via_proxy else kafka.broker.port
    (node_id,) = kafka.broker.node_ids  # Tansu is always 111; the Kafka test node is 1
    assert md.brokers, "no brokers in Metadata"
    for b in md.brokers.values():
        assert (b.id, b.host, b.port) == (node_id, HOST, expected_port)
        if kafka.via_proxy:
            assert b.port != kafka.broker.port
    assert {p.leader for p in md.topics[topic].partitions.values()} == {node_id}

    # Same with a raw Metadata v1 and FindCoordinator v0-v2, on both proxy ports.
    ports = [int(kafka.bootstrap.rsplit(":", 1)[1])]
    if kafka.via_proxy:
        ports.append(kafka.proxy.ports.node_port)
    for port in ports:
        with rawkafka.Connection(HOST, port) as c:
            raw = rawkafka.metadata_v1(c, [topic])
            assert raw.brokers == {node_id: (HOST, expected_port)}
            _, flex_brokers = rawkafka.topic_ids_v12(c, [topic])
            assert flex_brokers == {node_id: (HOST, expected_port)}
            lo, hi = rawkafka.api_versions(c)[rawkafka.API_FIND_COORDINATOR]
            assert hi >= 4, f"FindCoordinator only up to v{hi}"
            for v in range(lo, hi + 1):
                for key_type, key in ((0, f"grp-{topic}"), (1, f"txn-{topic}")):
                    if key_type and v == 0:
                        continue
                    err, node, host, cport = rawkafka.find_coordinator(c, key, version=v, key_type=key_type)
                    assert err == 0, f"FindCoordinator v{v} key_type {key_type}: error {err}"
                    assert (node, host, cport) == (node_id, HOST, expected_port), f"FindCoordinator v{v}"

    # DescribeCluster (AdminClient.describe_cluster) hands out proxy addresses only, too.
    desc = admin(kafka.bootstrap).describe_cluster(request_timeout=10).result(timeout=15)
    assert [(n.id, n.host, n.port) for n in desc.nodes] == [(node_id, HOST, expected_port)]
    assert desc.controller is None or (desc.controller.host, desc.controller.port) == (HOST, expected_port)


def test_api_versions_through_proxy(kafka):
    with rawkafka.Connection(HOST, kafka.broker.port) as c:
        direct = rawkafka.api_versions(c)
    with rawkafka.Connection(HOST, int(kafka.bootstrap.rsplit(":", 1)[1])) as c:
        seen = rawkafka.api_versions(c)
    # Same keys; the proxy may only lower the max version of keys it decodes, and
    # never offers SaslHandshake v0 (raw SASL tokens, not frames, follow it).
    assert set(seen) == set(direct)
    for key, (lo, hi) in seen.items():
        dlo, dhi = direct[key]
        want_lo = max(dlo, 1) if key == 17 else dlo
        assert lo == want_lo and lo <= hi <= dhi, f"api {key}: {lo}-{hi} vs upstream {dlo}-{dhi}"


def test_request_metrics_move(kafka):
    if not kafka.via_proxy:
        pytest.skip("metrics are the proxy's")
    topic = topic_name("met")
    create_topics(kafka.bootstrap, [topic])
    before = kafka.proxy.metrics()
    produce(kafka.bootstrap, topic, [(None, b"x" * 1000) for _ in range(50)])
    consume_assign(kafka.bootstrap, topic, count=50)

    # A response's bytes may be counted just after the client has them: poll briefly.
    def check():
        after = kafka.proxy.metrics()

        def delta(name, **lb):
            return after.sum(name, **lb) - before.sum(name, **lb)

        missing = [
            api
            for api in ("Produce", "Fetch", "Metadata")
            if delta("mirrorguard_requests_total", listener="main", api=api) <= 0
        ]
        if delta("mirrorguard_bytes_total", api="Produce", direction="client_to_upstream") < 50 * 1000:
            missing.append("Produce bytes client_to_upstream")
        if delta("mirrorguard_bytes_total", api="Fetch", direction="upstream_to_client") < 50 * 1000:
            missing.append("Fetch bytes upstream_to_client")
        if delta("mirrorguard_request_duration_seconds_count", listener="main", api="Produce") <= 0:
            missing.append("Produce latency")
        check.missing = missing
        return after if not missing else None

    try:
        after = wait_until(check, 5, what="metrics moved")
    except TimeoutError:
        pytest.fail(f"metrics did not move: {check.missing}")
    assert after.select("mirrorguard_connections_open", listener="main"), "no mirrorguard_connections_open"


def test_produce_acks0_keeps_correlation(kafka):
    """Produce with acks=0 gets no response: the proxy must not wait for one, and the
    responses to the requests that follow on the same connection stay in order."""
    topic = topic_name("acks0")
    create_topics(kafka.bootstrap, [topic])
    produce(kafka.bootstrap, topic, [(None, b"template")])
    template, _ = rawkafka.fetch_all_batches(HOST, kafka.broker.port, topic)
    batch = template[0].raw
    with rawkafka.Connection(*leader_addr(kafka)) as c:
        for _ in range(5):
            assert rawkafka.produce_v3(c, topic, 0, batch, acks=0) is None
        # Both of these check the correlation id of what comes back.
        assert rawkafka.API_FETCH in rawkafka.api_versions(c)
        err, base = rawkafka.produce_v3(c, topic, 0, batch, acks=1)
        assert (err, base) == (0, 6)
        # Tansu answers acks=0 (Kafka never does); a proxy may pass those answers on or drop them.
        print(f"{kafka.name}/{kafka.broker.kind}: {c.skipped_unsolicited} answers to acks=0 requests")
        if kafka.on_kafka:
            assert c.skipped_unsolicited == 0, "Apache Kafka never answers acks=0: the proxy made one up"
    got = consume_assign(kafka.bootstrap, topic, count=7)
    assert [m.value() for m in got] == [b"template"] * 7


def test_librdkafka_acks0_producer(kafka):
    """librdkafka with acks=0, then requests that expect a response on the same
    connection; the connection must not be dropped."""
    topic = topic_name("rdacks0")
    create_topics(kafka.bootstrap, [topic])
    events = []
    p = new_producer(
        kafka.bootstrap,
        **{"acks": 0, "linger.ms": 0, "statistics.interval.ms": 100, "stats_cb": events.append},
    )
    for round_ in range(3):
        produce(kafka.bootstrap, topic, [(None, f"a0-{round_}-{i}".encode()) for i in range(20)], producer=p)
        assert topic in p.list_topics(topic, timeout=10).topics
    p.poll(0.3)
    got = consume_assign(kafka.bootstrap, topic, count=60)
    assert [m.value() for m in got] == [f"a0-{r}-{i}".encode() for r in range(3) for i in range(20)]
    brokers = json.loads(events[-1])["brokers"] if events else {}
    disconnects = {name: b.get("disconnects", 0) for name, b in brokers.items()}
    assert not any(disconnects.values()), f"acks=0 producer was disconnected: {disconnects}"


def test_tansu_only_acks0_answers_tolerated(broker_factory, proxy_factory):
    """TANSU-ONLY, kept on purpose whatever --mg-broker says: Tansu answers Produce with
    acks=0, which Apache Kafka never does, so only Tansu can show that a proxy which
    expects no answer copes with one (first versions closed the client connection)."""
    from conftest import Target

    b = broker_factory()
    p = proxy_factory([b.bootstrap], node_ids=b.node_ids)
    test_produce_acks0_keeps_correlation(Target("proxy", p.bootstrap, b, p))
