"""The produce guard (issue 5) against real Apache Kafka 4.4 brokers and librdkafka.

mirrorguard runs a mirror listener (source A: a one-node Kafka cluster of the test's
own -> destination D: the session's shared Kafka node, which also holds the test's
state topic) and a produce guard in front of D. Produce to a mirrored partition is refused with POLICY_VIOLATION (a
non-retriable error) whose message names the mirror, while other partitions of the
same request go through; once the partition is sealed (STOPPED) the guard forwards
it untouched. The destination fetcher is the stand-in of mirror_harness.
"""

from __future__ import annotations

import sys

import pytest

from confluent_kafka import KafkaError
from kafka.record.default_records import DefaultRecordBatchBuilder

import harness
import rawkafka
from mirror_harness import (  # noqa: F401 - mirror_factory is a fixture
    HOST,
    MirrorSpec,
    high_watermark,
    idempotent_producer,
    mirror_factory,
    seal_partition,
    send,
)

TOPIC = "guarded"
LOCAL = "local-only"
MIRROR = "a-to-d"
POLICY_VIOLATION = 44


@pytest.fixture(autouse=True)
def _unique_topics(monkeypatch):
    """The destination is shared by the session: each test guards topics of its own."""
    monkeypatch.setattr(sys.modules[__name__], "TOPIC", harness.topic_name("guarded"))
    monkeypatch.setattr(sys.modules[__name__], "LOCAL", harness.topic_name("local-only"))


def _with_guard(mg, upstream: str, node_ids: list[int]):
    """Adds a [[guard]] listener in front of `upstream` to a not-yet-started MirrorGuard."""
    taken = {mg.admin_port} | {m.bootstrap_port for m in mg.mirrors.values()}
    mg.guard_port = harness.free_port(taken)
    taken.add(mg.guard_port)
    base = harness.free_node_port_base(taken, nodes=node_ids)
    with open(mg.config_path, "a") as f:
        f.write(
            f"""
[[guard]]
name = "dest-guard"
bootstrap = "{HOST}:{mg.guard_port}"
listen_host = "{HOST}"
advertised_host = "{HOST}"
node_port_base = {base}
upstream_bootstrap = ["{upstream}"]
"""
        )
    return f"{HOST}:{mg.guard_port}"


def _setup(kafka_factory, kafka1, mirror_factory):
    src = kafka_factory()
    dest = kafka1  # the destination, which also holds the state topic
    harness.create_topics(src.bootstrap, [TOPIC], partitions=2)
    harness.create_topics(dest.bootstrap, [TOPIC], partitions=2)
    harness.create_topics(dest.bootstrap, [LOCAL])
    mg = mirror_factory(dest.bootstrap, [MirrorSpec.of(MIRROR, src)], start=False)
    guard = _with_guard(mg, dest.bootstrap, dest.node_ids)
    mg.start()
    mg.wait_sources_known()
    return src, dest, mg, guard


def _produce(bootstrap: str, items: list[tuple[str, int, bytes]]) -> list[tuple[str, int, KafkaError | None]]:
    """One librdkafka producer, no retries: (topic, partition, error) per record."""
    results = []
    p = harness.new_producer(bootstrap, **{"enable.idempotence": False, "retries": 0, "linger.ms": 50,
                                           "message.timeout.ms": 10000})
    for topic, partition, value in items:
        p.produce(topic, value=value, partition=partition,
                  on_delivery=lambda err, msg: results.append((msg.topic(), msg.partition(), err)))
    assert p.flush(15) == 0
    return sorted(results, key=lambda r: (r[0], r[1]))


def _raw_produce_v8(bootstrap: str, topic: str, partition: int) -> tuple[int, str | None]:
    """A raw ProduceRequest v8 (the first version with error_message); returns the
    partition's (error_code, error_message) from the response."""
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                  producer_id=-1, producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    b.append(0, timestamp=None, key=None, value=b"raw", headers=[])
    records = bytes(b.build())
    body = (rawkafka.i16(-1) + rawkafka.i16(-1) + rawkafka.i32(5000)
            + rawkafka.array([rawkafka.string(topic)
                              + rawkafka.array([rawkafka.i32(partition) + rawkafka.i32(len(records)) + records])]))
    host, port = bootstrap.rsplit(":", 1)
    with rawkafka.Connection(host, int(port), timeout=10) as c:
        md = rawkafka.metadata_v1(c, [topic])
        lhost, lport = md.brokers[md.topics[topic][partition]]
    with rawkafka.Connection(lhost, lport, timeout=10) as c:
        resp = c.request(0, 8, body)
    r = rawkafka.Reader(resp)
    found = None
    for _ in range(r.count()):
        name = r.string()
        for _ in range(r.count()):
            idx, err = r.i32(), r.i16()
            r.i64(), r.i64(), r.i64()  # base offset, log append time, log start offset
            for _ in range(r.count()):  # record errors
                r.i32()
                r.string()
            msg = r.string()
            if name == topic and idx == partition:
                found = (err, msg)
    r.i32()  # throttle
    assert found is not None, "partition missing from the ProduceResponse"
    return found


def _seal(mg, src, partition: int) -> None:
    """Mirrors `partition` with the stand-in fetcher, stops it, and fetches until STOPPED."""
    seal_partition(mg, MIRROR, src.bootstrap, TOPIC, partition)


@pytest.mark.quick  # scripts/test.sh --quick: the produce guard
def test_guard_refuses_mirrored_partitions_then_forwards_once_stopped(kafka_factory, kafka1, mirror_factory):
    src, dest, mg, guard = _setup(kafka_factory, kafka1, mirror_factory)
    send(idempotent_producer(src.bootstrap), TOPIC, [b"m-%d" % i for i in range(3)], partition=0)

    # Both partitions of the mirrored topic are refused; the local topic in the same
    # requests goes through.
    res = _produce(guard, [(TOPIC, 0, b"x"), (TOPIC, 1, b"y"), (LOCAL, 0, b"z")])
    errors = {(t, p): (e.code() if e else None) for t, p, e in res}
    assert errors == {(TOPIC, 0): KafkaError.POLICY_VIOLATION, (TOPIC, 1): KafkaError.POLICY_VIOLATION,
                      (LOCAL, 0): None}, errors
    assert all(not e.retriable() for t, _, e in res if t == TOPIC)
    assert high_watermark(dest.bootstrap, TOPIC, 0) == 0, "a refused record reached the destination"
    assert high_watermark(dest.bootstrap, LOCAL, 0) == 1

    code, message = _raw_produce_v8(guard, TOPIC, 0)
    assert code == POLICY_VIOLATION
    assert message and f"mirror '{MIRROR}'" in message and "MIRRORING" in message, message
    assert mg.metrics().sum("mirrorguard_produce_refused_total", listener="dest-guard") >= 3

    # Seal partition 0: it becomes writable, partition 1 stays refused.
    _seal(mg, src, 0)
    res = _produce(guard, [(TOPIC, 0, b"after-0"), (TOPIC, 1, b"after-1")])
    errors = {(t, p): (e.code() if e else None) for t, p, e in res}
    assert errors == {(TOPIC, 0): None, (TOPIC, 1): KafkaError.POLICY_VIOLATION}, errors
    assert high_watermark(dest.bootstrap, TOPIC, 0) == 1
    code, message = _raw_produce_v8(guard, TOPIC, 1)
    assert code == POLICY_VIOLATION and "MIRRORING" in message, message
    code, message = _raw_produce_v8(guard, TOPIC, 0)
    assert (code, message) == (0, None)

    # Other API keys pass through the guard: metadata lists only guard addresses.
    md = harness.admin(guard).list_topics(timeout=10)
    assert {b.port for b in md.brokers.values()} != {int(dest.bootstrap.rsplit(":", 1)[1])}


def test_guard_refused_partition_state_survives_restart(kafka_factory, kafka1, mirror_factory):
    src, dest, mg, guard = _setup(kafka_factory, kafka1, mirror_factory)
    send(idempotent_producer(src.bootstrap), TOPIC, [b"m"], partition=0)
    _seal(mg, src, 0)
    mg.restart()
    mg.wait_sources_known()
    res = _produce(guard, [(TOPIC, 0, b"after-restart"), (TOPIC, 1, b"still-mirrored")])
    errors = {(t, p): (e.code() if e else None) for t, p, e in res}
    assert errors == {(TOPIC, 0): None, (TOPIC, 1): KafkaError.POLICY_VIOLATION}, errors


def test_guard_acks0_refused_records_are_dropped(kafka_factory, kafka1, mirror_factory):
    src, dest, mg, guard = _setup(kafka_factory, kafka1, mirror_factory)
    p = harness.new_producer(guard, **{"acks": 0, "enable.idempotence": False, "linger.ms": 10})
    for i in range(5):
        p.produce(TOPIC, value=b"a0-%d" % i, partition=0)
        p.produce(LOCAL, value=b"l0-%d" % i, partition=0)
    assert p.flush(15) == 0
    harness.wait_until(lambda: high_watermark(dest.bootstrap, LOCAL, 0) == 5, 10, what="local records stored")
    assert high_watermark(dest.bootstrap, TOPIC, 0) == 0
    # The connection survived: a normal request on a new producer still works.
    res = _produce(guard, [(LOCAL, 0, b"after")])
    assert res[0][2] is None
