"""Disaster failover (issue 12) and a state cluster apart from the destination (issue 13
item 6), on real Apache Kafka clusters: sources, state cluster and destination.

The destination's mirror fetcher is the stand-in of mirror_harness.py (SPEC 7) unless a
test says otherwise; every cluster, producer and consumer is real.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from confluent_kafka import TopicPartition

import harness
import rawkafka
from mirror_harness import (  # noqa: F401 - mirror_factory is a fixture
    MirrorSpec,
    StandInFetcher,
    direct_batches,
    fold,
    high_watermark,
    idempotent_producer,
    map_pid,
    mirror_factory,
    read_state_records,
    send,
)
from harness import wait_until
from kafka_dest import kafka_dest_factory  # noqa: F401 - fixture


def _topic_ids(bootstrap: str, topics: list[str]) -> dict[str, bytes]:
    host, port = bootstrap.rsplit(":", 1)
    with rawkafka.Connection(host, int(port), timeout=5) as c:
        ids, _ = rawkafka.topic_ids_v12(c, topics)
    return ids


def _topic_names(bootstrap: str) -> set[str]:
    md = harness.admin(bootstrap).list_topics(timeout=10)
    return set(md.topics)


def test_state_cluster_apart_from_destination(kafka_factory, mirror_factory):
    """State and destination on different Kafka clusters, no dummy topic on the state
    cluster: producer claims are recorded under the destination's topic id."""
    src = kafka_factory(name="src")
    state = kafka_factory(name="state")
    dest = kafka_factory(name="dest")
    topic = harness.topic_name("sep")
    harness.create_topics(src.bootstrap, [topic])
    harness.create_topics(dest.bootstrap, [topic])
    mg = mirror_factory(state.bootstrap, [MirrorSpec("a-to-b", src.bootstrap, node_ids=src.node_ids,
                                                     destination_bootstrap=dest.bootstrap)])
    p = idempotent_producer(src.bootstrap)
    send(p, topic, [b"v%d" % i for i in range(5)])
    hw = high_watermark(src.bootstrap, topic)

    f = StandInFetcher(topic, version=13).connect(mg.mirrors["a-to-b"].bootstrap)
    f.catch_up(hw)
    f.close()

    pids = {b.producer_id for b in f.log}
    src_pids = {b.producer_id for b in direct_batches(src.bootstrap, topic)}
    assert len(pids) == 1 and len(src_pids) == 1
    mapped = pids.pop()
    assert mapped == map_pid(src_pids.pop(), fold(src.cluster_id)), "region mapping"
    assert topic not in _topic_names(state.bootstrap), "the test must not create the topic on the state cluster"
    dest_id = _topic_ids(dest.bootstrap, [topic])[topic]
    claims = [r for r in read_state_records(state.bootstrap, mg.state_topic) if r.type == 6]  # producer claims
    assert claims, "no producer claim recorded"
    assert all(r.key["topic_id"] == dest_id for r in claims), "claims must be keyed by the destination topic id"
    assert any(r.key["producer_id"] == mapped for r in claims)
    assert "does not exist on the" not in mg.log_text()


# --------------------------------------------------------------------------
# issue 12: the source is gone


FAST = "upstream_request_timeout_ms = 2000"


def _mirrored_source(kafka_factory, kafka1, partitions: int = 1):
    """A private source cluster (the test kills or hangs it) and a topic on it and on
    the destination (kafka1, which also holds __mirror_state)."""
    src = kafka_factory(name="src")
    topic = harness.topic_name("dis")
    harness.create_topics(src.bootstrap, [topic], partitions=partitions)
    harness.create_topics(kafka1.bootstrap, [topic], partitions=partitions)
    return src, topic


_CHILD = r"""
import sys
from confluent_kafka import Producer
bootstrap, topic, partition = sys.argv[1], sys.argv[2], int(sys.argv[3])
p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"txn-{topic}-{partition}",
              "linger.ms": 5, "transaction.timeout.ms": 120000, "message.timeout.ms": 20000})
p.init_transactions(20)
p.begin_transaction()
for i in range(3):
    p.produce(topic, value=b"c-%d" % i, partition=partition)
p.commit_transaction(20)
p.begin_transaction()
for i in range(2):
    p.produce(topic, value=b"open-%d" % i, partition=partition)
assert p.flush(20) == 0
print("open", flush=True)
sys.stdin.read()  # until killed
"""


def _open_transaction(bootstrap: str, topic: str, partition: int = 0) -> subprocess.Popen:
    """A committed transaction, then one left open (flushed, never ended), by a producer
    process the caller kills (SIGKILL: a client of a dead cluster is never closed here,
    which would block)."""
    child = subprocess.Popen([sys.executable, "-c", _CHILD, bootstrap, topic, str(partition)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = child.stdout.readline()
    assert line.strip() == "open", f"transactional producer failed: {line!r}"
    _children.append(child)
    return child


_children: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _kill_children():
    yield
    while _children:
        c = _children.pop()
        c.kill()
        c.wait(5)


def _wait_topology(state_bootstrap: str, mirror: str, topic: str, state_topic: str, timeout: float = 15.0) -> dict:
    found: dict = {}

    def persisted():
        for r in read_state_records(state_bootstrap, topic=state_topic):
            if r.type == 8 and r.key["mirror"] == mirror and r.value:
                if any(t["name"] == topic for t in r.value["topics"]):
                    found["v"] = r.value
        return "v" in found

    wait_until(persisted, timeout, interval=0.3, what="source topology persisted")
    return found["v"]


def _seal(f: StandInFetcher, mg, topic: str, partition: int = 0, timeout: float = 20.0) -> list:
    """Fetches until the barrier is in the stand-in's log and the partition is STOPPED."""
    f.follow(lambda s: any(b.kind == "barrier" for b in s.log), timeout, "barrier appended")
    f.follow(lambda s: (mg.partition(topic, partition) or {}).get("state") == "STOPPED", timeout, "STOPPED")
    return f.log


@pytest.mark.quick  # scripts/test.sh --quick: the disaster seal
def test_source_killed_with_open_txn_then_stop(kafka_factory, kafka1, mirror_factory):
    src, topic = _mirrored_source(kafka_factory, kafka1)
    spec = MirrorSpec("a-to-b", src.bootstrap, node_ids=src.node_ids, extra=FAST)
    mg = mirror_factory(kafka1.bootstrap, [spec])
    _open_transaction(src.bootstrap, topic)
    hw = high_watermark(src.bootstrap, topic)  # read_uncommitted: the open batch included
    f = StandInFetcher(topic, version=13).connect(spec.bootstrap)
    f.catch_up(hw)
    open_pid = [b for b in f.log if b.kind == "data"][-1].producer_id
    _wait_topology(kafka1.bootstrap, "a-to-b", topic, mg.state_topic)

    src.nodes[0].kill()
    # The connection of the fetcher stays: a long poll for a MIRRORING partition gets an
    # empty answer after its MaxWaitMs instead of a closed connection.
    t0 = time.monotonic()
    res, got = f.fetch_once(max_wait_ms=500)
    took = time.monotonic() - t0
    assert got == [] and res.error_code == 0 and res.top_error == 0
    assert 0.4 <= took < 5.0, took
    # A new connection (bootstrap Metadata, then the node port) is served locally too.
    f.connect(spec.bootstrap)
    res, got = f.fetch_once(max_wait_ms=200)
    assert got == [] and res.error_code == 0

    status, body = mg.post("stop", "a-to-b", topic, [0])
    assert status == 200, body
    log = _seal(f, mg, topic)
    tail = [b for b in log if b.kind in ("abort", "barrier")]
    assert [b.kind for b in tail] == ["abort", "barrier"], [b.kind for b in log]
    assert tail[0].producer_id == open_pid, "the ABORT closes the open mirrored transaction"
    assert tail[0].base_offset == hw and tail[1].base_offset == hw + 1
    assert mg.metrics().sum("mirrorguard_upstream_errors_total", kind="offline") >= 1
    f.close()
    assert "panicked" not in mg.log_text()


def test_restart_with_source_dead_then_stop_second_partition(kafka_factory, kafka1, mirror_factory):
    src, topic = _mirrored_source(kafka_factory, kafka1, partitions=2)
    spec = MirrorSpec("a-to-b", src.bootstrap, node_ids=src.node_ids, extra=FAST)
    mg = mirror_factory(kafka1.bootstrap, [spec], snapshot_interval_ms=500)
    _open_transaction(src.bootstrap, topic, partition=1)
    p = idempotent_producer(src.bootstrap)
    send(p, topic, [b"p0-%d" % i for i in range(3)], partition=0)
    harness._clients.remove(p)  # closed now, while its cluster is alive
    p.close()
    fetchers = []
    for part in (0, 1):
        f = StandInFetcher(topic, partition=part, version=12).connect(spec.bootstrap)
        f.catch_up(high_watermark(src.bootstrap, topic, part))
        fetchers.append(f)
    open_pid = [b for b in fetchers[1].log if b.kind == "data"][-1].producer_id
    _wait_topology(kafka1.bootstrap, "a-to-b", topic, mg.state_topic)
    time.sleep(1.5)  # a periodic producer-state snapshot (500 ms) has the open transaction

    src.nodes[0].kill()
    status, body = mg.post("stop", "a-to-b", topic, [0])
    assert status == 200, body
    _seal(fetchers[0], mg, topic, 0)

    mg.restart()  # the source is still dead: ready from the persisted topology
    for f in fetchers:
        f.close()
    status, body = mg.post("stop", "a-to-b", topic, [1])
    assert status == 200, body
    f1 = fetchers[1]
    f1.connect(spec.bootstrap)  # bootstrap Metadata and the node port, answered locally
    log = _seal(f1, mg, topic, 1)
    tail = [b for b in log if b.kind in ("abort", "barrier")]
    assert [b.kind for b in tail] == ["abort", "barrier"], [b.kind for b in log]
    assert tail[0].producer_id == open_pid
    assert (mg.partition(topic, 0) or {}).get("state") == "STOPPED"
    f1.close()


def test_restart_with_source_unresolvable_then_stop(kafka_factory, kafka1, mirror_factory):
    """The source's name stops resolving (a deleted DNS record, a dead region's resolver):
    after a restart mirrorguard is ready from the persisted topology, serves the fetcher
    locally and seals from persisted state."""
    src, topic = _mirrored_source(kafka_factory, kafka1)
    spec = MirrorSpec("a-to-b", src.bootstrap, node_ids=src.node_ids, extra=FAST)
    mg = mirror_factory(kafka1.bootstrap, [spec], snapshot_interval_ms=500)
    _open_transaction(src.bootstrap, topic)
    hw = high_watermark(src.bootstrap, topic)
    f = StandInFetcher(topic, version=13).connect(spec.bootstrap)
    f.catch_up(hw)
    open_pid = [b for b in f.log if b.kind == "data"][-1].producer_id
    _wait_topology(kafka1.bootstrap, "a-to-b", topic, mg.state_topic)
    time.sleep(1.5)  # a periodic producer-state snapshot (500 ms) has the open transaction

    assert mg.terminate() == 0
    f.close()
    unresolvable = f"no-such-source.invalid:{src.port}"
    text = mg.config_path.read_text()
    assert f'"{src.bootstrap}"' in text
    mg.config_path.write_text(text.replace(f'"{src.bootstrap}"', f'"{unresolvable}"'))
    mg.start()  # ready from the persisted topology
    f.connect(spec.bootstrap)  # bootstrap Metadata and the node port, answered locally
    t0 = time.monotonic()
    res, got = f.fetch_once(max_wait_ms=300)
    assert got == [] and res.error_code == 0 and res.top_error == 0 and time.monotonic() - t0 < 5
    status, body = mg.post("stop", "a-to-b", topic, [0])
    assert status == 200, body
    log = _seal(f, mg, topic)
    tail = [b for b in log if b.kind in ("abort", "barrier")]
    assert [b.kind for b in tail] == ["abort", "barrier"], [b.kind for b in log]
    assert tail[0].producer_id == open_pid and tail[0].base_offset == hw
    f.close()


def test_source_hanging_then_stop(kafka_factory, kafka1, mirror_factory):
    src, topic = _mirrored_source(kafka_factory, kafka1)
    spec = MirrorSpec("a-to-b", src.bootstrap, node_ids=src.node_ids, extra=FAST)
    mg = mirror_factory(kafka1.bootstrap, [spec])
    _open_transaction(src.bootstrap, topic)
    hw = high_watermark(src.bootstrap, topic)
    f = StandInFetcher(topic, version=13).connect(spec.bootstrap)
    f.catch_up(hw)
    _wait_topology(kafka1.bootstrap, "a-to-b", topic, mg.state_topic)
    src.nodes[0].pause()
    try:
        # The source accepts TCP but never answers: the fetch is answered after its
        # MaxWaitMs plus the upstream request timeout (2 s), well before the stand-in's
        # 10 s socket timeout.
        t0 = time.monotonic()
        res, got = f.fetch_once(max_wait_ms=300)
        took = time.monotonic() - t0
        assert got == [] and res.error_code == 0
        assert 2.0 <= took < 6.0, took
        status, body = mg.post("stop", "a-to-b", topic, [0])
        assert status == 200, body
        log = _seal(f, mg, topic)
        assert [b.kind for b in log if b.kind in ("abort", "barrier")] == ["abort", "barrier"]
    finally:
        src.nodes[0].resume()
    f.close()


# --------------------------------------------------------------------------
# abort-open: the destination fetcher is gone


def _varint(v: int) -> bytes:
    return rawkafka.uvarint((v << 1) ^ (v >> 63))


def _txn_batch(pid: int, epoch: int, values: list[bytes], attrs: int = 0x10, seq: int = 0) -> bytes:
    """A transactional record batch v2 (what a mirror fetcher appends for a mirrored
    producer), CRC-32C computed."""
    recs = b""
    for i, v in enumerate(values):
        body = b"\x00" + _varint(0) + _varint(i) + _varint(-1) + _varint(len(v)) + v + _varint(0)
        recs += _varint(len(body)) + body
    ts = int(time.time() * 1000)
    after_crc = (rawkafka.i16(attrs) + rawkafka.i32(len(values) - 1) + rawkafka.i64(ts) + rawkafka.i64(ts)
                 + rawkafka.i64(pid) + rawkafka.i16(epoch) + rawkafka.i32(seq) + rawkafka.i32(len(values)) + recs)
    import crc32c
    head = rawkafka.i32(-1) + rawkafka.i8(2) + crc32c.crc32c(after_crc).to_bytes(4, "big")
    return rawkafka.i64(0) + rawkafka.i32(len(head) + len(after_crc)) + head + after_crc


def _produce_txn_batch(bootstrap: str, topic: str, partition: int, batch: bytes, txn_id: str | None) -> tuple[int, int]:
    """Produce v3 carrying a transactional id (the broker checks it for transactional
    batches); returns (error, base offset)."""
    host, port = bootstrap.rsplit(":", 1)
    body = (rawkafka.string(txn_id) + rawkafka.i16(-1) + rawkafka.i32(10000)
            + rawkafka.array([rawkafka.string(topic) + rawkafka.array([rawkafka.i32(partition) + rawkafka.i32(len(batch)) + batch])]))
    with rawkafka.Connection(host, int(port), timeout=10) as c:
        r = rawkafka.Reader(c.request(0, 3, body))
        out = None
        for _ in range(r.count()):
            r.string()
            for _ in range(r.count()):
                idx, err, base, _t = r.i32(), r.i16(), r.i64(), r.i64()
                if idx == partition:
                    out = (err, base)
        assert out is not None
        return out


def _lso(bootstrap: str, topic: str, partition: int = 0) -> int:
    host, port = bootstrap.rsplit(":", 1)
    with rawkafka.Connection(host, int(port), timeout=5) as c:
        return rawkafka.fetch_v4(c, topic, partition, 0, max_bytes=1, isolation_level=1).last_stable_offset


def test_abort_open_when_destination_fetcher_is_gone(kafka_factory, kafka1, mirror_factory):
    # Destination without KIP-890 partition verification, so a mirrored producer's
    # transactional batch can be written by Produce (stand-in for the replication path).
    dest = kafka_factory(name="dest", overrides={"transaction.partition.verification.enable": "false"})
    topic = harness.topic_name("abort")
    harness.create_topics(kafka1.bootstrap, [topic], partitions=2)
    harness.create_topics(dest.bootstrap, [topic], partitions=2)
    spec = MirrorSpec("a-to-b", kafka1.bootstrap, node_ids=kafka1.node_ids, destination_bootstrap=dest.bootstrap)
    pres = MirrorSpec("pres", kafka1.bootstrap, node_ids=kafka1.node_ids, pid_mode="preserve",
                      destination_bootstrap=dest.bootstrap)
    taken: set[int] = {kafka1.port, dest.port}
    gport = harness.free_port(taken)
    taken.add(gport)
    gbase = harness.free_node_port_base(taken, nodes=dest.node_ids)
    guard = (f'[[guard]]\nname = "g"\nbootstrap = "127.0.0.1:{gport}"\nadvertised_host = "127.0.0.1"\n'
             f'node_port_base = {gbase}\nupstream_bootstrap = ["{dest.bootstrap}"]\n')
    mg = mirror_factory(kafka1.bootstrap, [spec, pres], extra_config=guard)
    # (both mirrors list the same topics: GET /v1/partitions shows one of them per partition)
    wait_until(lambda: mg.partition(topic, 0) is not None, 15, interval=0.2, what="topic known")
    status, body = mg.post("abort-open", "pres", topic, [0])
    assert status == 409 and body["error"] == "preserve_mode", body
    mapped = map_pid(7, fold(kafka1.cluster_id))
    got: list = []

    def written():
        # NOT_LEADER_OR_FOLLOWER right after the topic is created: not written, retried.
        got[:] = [_produce_txn_batch(dest.bootstrap, topic, 0, _txn_batch(mapped, 0, [b"m-0", b"m-1"]),
                                     "mirrored-src")]
        return got[0][0] not in (5, 6)

    wait_until(written, 15, interval=0.3, what="mirrored transactional batch written")
    assert got[0] == (0, 0), got
    # A local open transaction in partition 1: not ours, never touched.
    local = _open_transaction(dest.bootstrap, topic, partition=1)
    assert local.poll() is None
    # Committed-visible data after the mirrored transaction.
    plain = harness.new_producer(dest.bootstrap, **{"enable.idempotence": False, "acks": "all"})
    send(plain, topic, [b"after-%d" % i for i in range(3)], partition=0)
    assert _lso(dest.bootstrap, topic) == 0, "the open mirrored transaction holds the LSO"

    status, body = mg.post("abort-open", "a-to-b", topic, [0])
    assert status == 409 and body["error"] == "still_mirroring", body
    status, body = mg.post("stop", "a-to-b", topic, [0, 1])
    assert status == 200, body
    status, body = mg.post("abort-open", "a-to-b", topic, [0, 1])
    assert status == 200, body
    reps = {r["partition"]: r for r in body["partitions"]}
    assert [t["producer_id"] for t in reps[0]["aborted"]] == [mapped]
    assert reps[0]["aborted"][0]["first_offset"] == 0
    assert reps[1]["aborted"] == [] and len(reps[1]["not_mirrored"]) == 1
    assert reps[1]["not_mirrored"][0]["producer_id"] < (1 << 62), "a destination-allocated PID"
    hw = high_watermark(dest.bootstrap, topic)
    assert _lso(dest.bootstrap, topic) == hw == 6, "the ABORT marker (offset 5) released the LSO"
    # A read_committed consumer gets past the aborted mirrored transaction.
    c = harness.new_consumer(dest.bootstrap, **{"group.id": topic, "isolation.level": "read_committed",
                                                "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, 0, 0)])
    got = []
    deadline = time.monotonic() + 15
    while len(got) < 3 and time.monotonic() < deadline:
        for m in c.consume(10, 0.5):
            if not m.error():
                got.append(m.value())
    assert got == [b"after-0", b"after-1", b"after-2"], got
    # Idempotent; recorded as STOPPED.
    status, body = mg.post("abort-open", "a-to-b", topic, [0])
    assert status == 200 and body["partitions"][0]["aborted"] == [], body
    p0 = mg.partition(topic, 0)
    assert p0["state"] == "STOPPED" and "abort-open" in (p0["reason"] or ""), p0
    recs = [r for r in read_state_records(kafka1.bootstrap, mg.state_topic) if r.type == 4 and r.value
            and r.value["topic"] == topic and r.value["state"] == 3]
    assert recs, "STOPPED after abort-open recorded in __mirror_state"
    assert mg.metrics().sum("mirrorguard_seal_events_total", kind="abort_open_marker_written") == 1
    # After promotion a new local transactional producer (PID from the destination's
    # allocator, far below the mapped region) writes through the produce guard (the
    # partition is STOPPED) without touching the mirrored PID.
    tp = harness.new_producer(f"127.0.0.1:{gport}", **{"transactional.id": f"local-{topic}"})
    tp.init_transactions(20)
    tp.begin_transaction()
    tp.produce(topic, value=b"local", partition=0)
    tp.commit_transaction(20)
    # Kafka writes the COMMIT marker asynchronously after commit_transaction returns.
    wait_until(lambda: direct_batches(dest.bootstrap, topic)[-1].kind == "commit", 15, interval=0.2,
               what="COMMIT marker of the local transaction")
    direct = direct_batches(dest.bootstrap, topic)
    local_pids = {b.producer_id for b in direct if b.kind == "data" and b.producer_id not in (-1, mapped)}
    assert local_pids and all(0 <= p < (1 << 62) for p in local_pids), local_pids
    assert [b.kind for b in direct][-2:] == ["data", "commit"]


# --------------------------------------------------------------------------
# the produce guard fails closed; stop --all skips internal topics


def test_guard_fails_closed_until_mirrored_partitions_known(kafka_factory, kafka1, mirror_factory):
    src = kafka_factory(name="src")
    topic = harness.topic_name("gm")  # mirrored
    internal = "__mg_" + os.urandom(3).hex()  # an internal-looking source topic
    other = harness.topic_name("gl")  # local to the destination only
    harness.create_topics(src.bootstrap, [topic, internal])
    harness.create_topics(kafka1.bootstrap, [topic, other])
    src.nodes[0].kill()
    name = "gd" + os.urandom(3).hex()  # no topology of this mirror is persisted anywhere
    taken: set[int] = {kafka1.port, src.port}
    gport = harness.free_port(taken)
    taken.add(gport)
    gbase = harness.free_node_port_base(taken, nodes=kafka1.node_ids)
    guard = (f'[[guard]]\nname = "g"\nbootstrap = "127.0.0.1:{gport}"\nadvertised_host = "127.0.0.1"\n'
             f'node_port_base = {gbase}\nupstream_bootstrap = ["{kafka1.bootstrap}"]\n')
    mg = mirror_factory(kafka1.bootstrap, [MirrorSpec(name, src.bootstrap, node_ids=src.node_ids, extra=FAST)],
                        start=False, extra_config=guard)
    mg.start(wait_ready=False)
    plain = lambda: _txn_batch(-1, -1, [b"x"], attrs=0, seq=-1)  # noqa: E731
    via_guard = f"127.0.0.1:{gport}"

    # Source dead, nothing persisted: whether `other` is mirrored is unknown.
    err, _ = _produce_txn_batch(via_guard, other, 0, plain(), None)
    assert err == 19, f"NOT_ENOUGH_REPLICAS (retriable) expected, got {err}"
    err, _ = _produce_txn_batch(via_guard, topic, 0, plain(), None)
    assert err == 19, err

    src.nodes[0].restart()
    wait_until(lambda: _produce_txn_batch(via_guard, other, 0, plain(), None)[0] == 0, 30, interval=0.5,
               what="guard forwards once the source topology is known")
    err, _ = _produce_txn_batch(via_guard, topic, 0, plain(), None)
    assert err == 44, f"POLICY_VIOLATION for a MIRRORING partition, got {err}"

    status, body = mg.post("stop", name, all_=True)
    assert status == 200, body
    stopped = {p["topic"] for p in body["applied"]}
    assert topic in stopped and internal not in stopped, stopped


# --------------------------------------------------------------------------
# abort-open on the reference destination (Kafka's engine) promoted to a real broker


def test_abort_open_after_fetcher_gone_on_promoted_kafka_engine_destination(kafka_factory, kafka1, mirror_factory,
                                                                            kafka_dest_factory):
    """The mirrored transaction reaches the destination the way a mirror fetcher writes it
    (Kafka's UnifiedLog, appendAsFollower, through mirrorguard), the fetcher stops before any
    seal, the log is handed to a real Kafka broker, and `abort-open` closes the transaction
    there: the LSO reaches the log end and read_committed consumers get past it.

    The mirror runs on mirrorguard's default rule (`stopped_when = "destination_hw"`, the
    high watermark read on `destination_bootstrap`, here broker B): no seal is ever served,
    so the partition stays STOPPING until abort-open records it STOPPED."""
    from kafka_dest import prepare_promotion, promote
    from scenario_support import end_offset, idem, read_all, send_each, txn, txn_producer, values

    a = kafka_factory(name="A")
    b = kafka_factory(name="B")
    topic = harness.topic_name("abort-engine")
    harness.create_topics(a.bootstrap, [topic])
    send_each(idem(a.bootstrap), topic, [b"a-0", b"a-1"])  # @0, @1
    tp = txn_producer(a.bootstrap, f"open-{topic}")
    txn(tp, topic, [b"c-0"], commit=True)  # @2, COMMIT @3
    txn(tp, topic, [b"open-0"], commit=None)  # @4, open when the fetcher goes away
    wait_until(lambda: end_offset(a.bootstrap, topic) == 5, 15, interval=0.1, what="A's end offset 5")

    topic_id = prepare_promotion(b, topic)
    dest = kafka_dest_factory("B")
    dest.open(topic, topic_id=topic_id)
    spec = MirrorSpec("a-to-b", a.bootstrap, node_ids=a.node_ids, destination_bootstrap=b.bootstrap,
                      stopped_when="destination_hw")
    mg = mirror_factory(kafka1.bootstrap, [spec])
    mg.wait_sources_known()
    f = dest.mirror("a-to-b", mg.mirrors["a-to-b"].bootstrap, [(topic, 0)])
    f.catch_up(topic, 5)
    f.stop()  # the destination's fetcher is gone before any seal
    open_pid = map_pid(direct_batches(a.bootstrap, topic)[-1].producer_id, fold(a.cluster_id))
    st = dest.state(topic)
    assert st["producers"][open_pid]["open_txn_first_offset"] == 4 and st["last_stable_offset"] == 4, st

    status, body = mg.post("stop", "a-to-b", topic, [0])
    assert status == 200, body
    promote(dest, b, topic)
    assert _lso(b.bootstrap, topic) == 4, "the open mirrored transaction holds the promoted broker's LSO"
    view = mg.partition(topic, 0)
    assert view["state"] == "STOPPING" and view.get("cut") is None, view  # no fetcher took a cut

    status, body = mg.post("abort-open", "a-to-b", topic, [0])
    assert status == 200, body
    aborted = body["partitions"][0]["aborted"]
    assert [t["producer_id"] for t in aborted] == [open_pid] and aborted[0]["first_offset"] == 4, body
    wait_until(lambda: _lso(b.bootstrap, topic) == high_watermark(b.bootstrap, topic) == 6, 15, interval=0.2,
               what="LSO past the ABORT marker")
    kinds = [x.kind for x in direct_batches(b.bootstrap, topic)]
    assert kinds == ["data", "data", "data", "commit", "data", "abort"], kinds
    assert values(read_all(b.bootstrap, topic, "read_committed")) == [b"a-0", b"a-1", b"c-0"]
    wait_until(lambda: mg.partition(topic, 0)["state"] == "STOPPED", 15, interval=0.1,
               what="abort-open recorded the partition STOPPED")
    # Idempotent.
    status, body = mg.post("abort-open", "a-to-b", topic, [0])
    assert status == 200 and body["partitions"][0]["aborted"] == [], body
