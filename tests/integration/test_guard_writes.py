"""The guard over every write (issue 29 item 3) against Apache Kafka 4.4.

mirrorguard mirrors topic T (source A: a one-node Kafka cluster of the test's own ->
destination D: the session's shared Kafka node, which also holds the test's state topic)
and runs a guard in front of D. While T-0 is MIRRORING, every write into it through the
guard is refused with a non-retriable error naming the mirror, and D is unchanged:
DeleteRecords (its log start stays), CreatePartitions (its partition count stays),
DeleteTopics by name (librdkafka) and by topic id (Java, DeleteTopics v6), and
transactions that include T-0: librdkafka's (AddPartitionsToTxn) and Kafka's Java
client's with D at transaction.version=1 (AddPartitionsToTxn) and at 2 (no
AddPartitionsToTxn from the client: its Produce reaches the guard and is refused); no
ABORT marker lands in T-0. Items of the same requests that are not mirrored go through.
Once T-0 is STOPPED, each of these is forwarded and works.
"""

from __future__ import annotations

import json
import subprocess

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import NewPartitions

import harness
from kafka_broker import JAVA, KAFKA_LIBS
from mirror_harness import (  # noqa: F401 - mirror_factory is a fixture
    MirrorSpec,
    direct_batches,
    idempotent_producer,
    mirror_factory,
    seal_partition,
    send,
)

MIRROR = "a-to-d"
SOURCE = harness.ROOT / "tests" / "integration" / "java" / "GuardWrites.java"
REFUSED = "mirrorguard_guard_refused_total"
PRODUCE_REFUSED = "mirrorguard_produce_refused_total"
REQUESTS = "mirrorguard_requests_total"


def _java(classes, dest: str, guard: str, topic: str, local: str, tag: str, tvs: str,
          delete_by_id: bool = False) -> list[dict]:
    argv = [JAVA, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            "-cp", f"{classes}:{KAFKA_LIBS}/*", "GuardWrites", dest, guard, topic, local, tag, tvs]
    if delete_by_id:
        argv.append("delete-by-id")
    r = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, f"java exited {r.returncode}: {r.stdout}\n{r.stderr[-4000:]}"
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def _watermarks(consumer, topic: str, partition: int = 0) -> tuple[int, int]:
    return consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)


def _partitions(admin, topic: str) -> int | None:
    # All topics: a Metadata request naming a deleted topic could create it again.
    t = admin.list_topics(timeout=10).topics.get(topic)
    return None if t is None or t.error is not None else len(t.partitions)


def _error(fut) -> KafkaError | None:
    try:
        fut.result(timeout=30)
        return None
    except KafkaException as e:
        return e.args[0]


def _rdkafka_txn(guard: str, txn_id: str, items: list[tuple[str, bytes]]) -> tuple[dict, str]:
    """A librdkafka transaction writing `items` (topic, value) to partition 0 of each topic:
    per topic the delivery error (None when delivered), and how it ended."""
    p = harness.new_producer(guard, **{"transactional.id": txn_id, "linger.ms": 20,
                                       "message.timeout.ms": 20000, "transaction.timeout.ms": 30000})
    p.init_transactions(20)
    p.begin_transaction()
    errors: dict = {}
    for topic, value in items:
        p.produce(topic, value=value, partition=0,
                  on_delivery=lambda err, msg: errors.__setitem__(msg.topic(), err))
    p.flush(30)
    try:
        if any(errors.get(t) for t, _ in items) or len(errors) < len(items):
            p.abort_transaction(20)
            return errors, "aborted"
        p.commit_transaction(20)
        return errors, "committed"
    except KafkaException as e:
        return errors, f"ended with {e.args[0]}"


def test_guard_refuses_every_write_into_a_mirrored_partition_until_stopped(kafka_factory, kafka1,
                                                                          mirror_factory, tmp_path):
    classes = tmp_path / "classes"
    # Compiled while the source broker starts.
    javac = subprocess.Popen(["javac", "-nowarn", "-cp", f"{KAFKA_LIBS}/*", "-d", str(classes), str(SOURCE)])
    try:
        _check(javac, classes, kafka_factory, kafka1, mirror_factory)
    finally:
        if javac.poll() is None:  # the test failed early: no process is left behind
            javac.kill()
            javac.wait()


def _check(javac, classes, kafka_factory, kafka1, mirror_factory) -> None:
    src, dest = kafka_factory(), kafka1
    topic, local, scratch = (harness.topic_name(p) for p in ("gw-mirrored", "gw-local", "gw-scratch"))
    harness.create_topics(src.bootstrap, [topic])
    harness.create_topics(dest.bootstrap, [topic, local, scratch])
    # The destination's mirrored partition holds three records (written directly, as the
    # replication path would have), so a moved log start or a marker shows.
    send(idempotent_producer(dest.bootstrap), topic, [b"d-%d" % i for i in range(3)])
    send(idempotent_producer(dest.bootstrap), local, [b"l-%d" % i for i in range(3)])
    send(idempotent_producer(src.bootstrap), topic, [b"m-%d" % i for i in range(2)])
    mg = mirror_factory(dest.bootstrap, [MirrorSpec.of(MIRROR, src)], guard_upstream=dest.bootstrap,
                        guard_node_ids=dest.node_ids)
    mg.wait_sources_known()
    guard = mg.guard_bootstrap
    admin = harness.admin(guard)
    direct = harness.admin(dest.bootstrap)
    wm = harness.new_consumer(dest.bootstrap, **{"group.id": "gw-" + topic})

    def unchanged(what: str) -> None:
        assert _watermarks(wm, topic) == (0, 3), f"{what}: the mirrored partition changed"
        assert all(b.kind == "data" for b in direct_batches(dest.bootstrap, topic)), what
        assert _partitions(direct, topic) == 1, what

    # DeleteRecords: the mirrored partition refused, the local one in the same request deleted.
    res = admin.delete_records([TopicPartition(topic, 0, 2), TopicPartition(local, 0, 1)])
    errs = {tp.topic: _error(f) for tp, f in res.items()}
    assert errs[local] is None, errs
    assert errs[topic] is not None and errs[topic].code() == KafkaError.POLICY_VIOLATION, errs
    assert not errs[topic].retriable()
    assert _watermarks(wm, local)[0] == 1
    unchanged("DeleteRecords")

    # CreatePartitions: refused for the mirrored topic with a message naming the mirror.
    res = admin.create_partitions([NewPartitions(topic, 2), NewPartitions(local, 2)])
    errs = {t: _error(f) for t, f in res.items()}
    assert errs[local] is None, errs
    assert errs[topic].code() == KafkaError.POLICY_VIOLATION, errs
    assert f"mirror '{MIRROR}'" in errs[topic].str() and "MIRRORING" in errs[topic].str(), errs[topic].str()
    harness.wait_until(lambda: _partitions(direct, local) == 2, 10, what="local topic grown")
    unchanged("CreatePartitions")

    # DeleteTopics by name: the mirrored topic refused, the other one deleted.
    res = admin.delete_topics([topic, scratch])
    errs = {t: _error(f) for t, f in res.items()}
    assert errs[scratch] is None, errs
    # (librdkafka's DeleteTopics v1 has no message field: the Java run below checks the message.)
    assert errs[topic].code() == KafkaError.POLICY_VIOLATION, errs
    harness.wait_until(lambda: _partitions(direct, scratch) is None, 10, what="scratch topic deleted")
    unchanged("DeleteTopics")

    # librdkafka's transaction: AddPartitionsToTxn refused, aborted, no marker in the mirrored partition.
    m0 = mg.metrics()
    errors, end = _rdkafka_txn(guard, "gw-rdkafka-" + topic, [(local, b"x"), (topic, b"y")])
    assert errors.get(topic) is not None, (errors, end)
    m1 = mg.metrics()
    assert m1.sum(REFUSED, listener="guard", api="AddPartitionsToTxn") > \
        m0.sum(REFUSED, listener="guard", api="AddPartitionsToTxn")
    unchanged(f"librdkafka transaction ({end}, {errors})")

    # Kafka's Java client at transaction.version=1: AddPartitionsToTxn reaches the guard.
    assert javac.wait(timeout=120) == 0, "javac failed"
    out = _java(classes, dest.bootstrap, guard, topic, local, "before", "1")
    txn1 = [o for o in out if o["step"] == "txn"]
    assert [o["tv"] for o in txn1] == [1], out
    assert not txn1[0]["mirrored"].startswith("ok@"), out
    m2 = mg.metrics()
    assert m2.sum(REFUSED, listener="guard", api="AddPartitionsToTxn") > \
        m1.sum(REFUSED, listener="guard", api="AddPartitionsToTxn"), out
    assert m2.sum(PRODUCE_REFUSED, listener="guard") == m1.sum(PRODUCE_REFUSED, listener="guard"), out
    unchanged(f"Java transaction at TV1 {txn1}")

    # At transaction.version=2 the client sends no AddPartitionsToTxn: its Produce reaches the
    # guard and is refused; then DeleteTopics v6 by topic id is refused too.
    out = _java(classes, dest.bootstrap, guard, topic, local, "before", "2", delete_by_id=True)
    txn2 = [o for o in out if o["step"] == "txn"]
    assert [o["tv"] for o in txn2] == [2], out
    assert f"mirror '{MIRROR}'" in txn2[0]["mirrored"], out
    m3 = mg.metrics()
    assert m3.sum(REQUESTS, listener="guard", api="AddPartitionsToTxn") == \
        m2.sum(REQUESTS, listener="guard", api="AddPartitionsToTxn"), out
    assert m3.sum(PRODUCE_REFUSED, listener="guard") > m2.sum(PRODUCE_REFUSED, listener="guard"), out
    by_id = [o for o in out if o["step"] == "delete-by-id"][0]
    assert "PolicyViolationException" in by_id["outcome"] and f"mirror '{MIRROR}'" in by_id["outcome"], by_id
    unchanged(f"Java transaction at TV2 {txn2}, DeleteTopics by id")

    # Stopped: every write is forwarded and works.
    seal_partition(mg, MIRROR, src.bootstrap, topic, 0)
    res = admin.delete_records([TopicPartition(topic, 0, 2)])
    assert [_error(f) for f in res.values()] == [None]
    assert _watermarks(wm, topic)[0] == 2
    errors, end = _rdkafka_txn(guard, "gw-rdkafka-after-" + topic, [(topic, b"after")])
    assert (errors.get(topic), end) == (None, "committed"), (errors, end)
    res = admin.create_partitions([NewPartitions(topic, 2)])
    assert [_error(f) for f in res.values()] == [None]
    harness.wait_until(lambda: _partitions(direct, topic) == 2, 10, what="mirrored topic grown")
    out = _java(classes, dest.bootstrap, guard, topic, local, "after", "1,2", delete_by_id=True)
    txns = [o for o in out if o["step"] == "txn"]
    assert [(o["tv"], o["end"]) for o in txns] == [(1, "committed"), (2, "committed")], out
    assert all(o["mirrored"].startswith("ok@") for o in txns), out
    assert [o["outcome"] for o in out if o["step"] == "delete-by-id"] == ["ok"], out
    harness.wait_until(lambda: _partitions(direct, topic) is None, 10, what="mirrored topic deleted")
