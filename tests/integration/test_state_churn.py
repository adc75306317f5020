"""Producer state is bounded under topic churn (issue 18 item 4), against real Apache
Kafka: partitions of destination topics that were deleted leave the producer state (found
by the periodic destination topic listing), so 100 topics created, mirrored and deleted
never exhaust a lowered `max_partitions`; a topic deleted on the source only keeps its
state until its producers expire (as the destination expires them), then leaves too.
"""

from __future__ import annotations

import time

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

import harness
from mirror_harness import MirrorSpec, idempotent_producer, mirror_factory, send  # noqa: F401

PARTITIONS = "mirrorguard_producer_state_partitions"
OPS = "mirrorguard_state_store_ops_total"
EVENTS = "mirrorguard_mirror_events_total"
ROUNDS, PER_ROUND = 10, 10


def _delete(bootstrap: str, names: list[str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.delete_topics(names, operation_timeout=15).values():
        f.result(30)


def _consume_through(mirror_bootstrap: str, topics: list[str], timeout: float = 30.0) -> dict[str, bytes]:
    """One record of each topic, read through the mirror listener (one consumer)."""
    c = harness.new_consumer(mirror_bootstrap, **{"group.id": "churn", "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(t, 0, 0) for t in topics])
        got: dict[str, bytes] = {}
        deadline = time.monotonic() + timeout
        while len(got) < len(topics):
            if time.monotonic() > deadline:
                raise TimeoutError(f"read {len(got)} of {len(topics)} topics through the mirror")
            for m in c.consume(num_messages=len(topics), timeout=0.5):
                if m.error() is None:
                    got[m.topic()] = m.value()
        return got
    finally:
        c.close()


def test_deleted_topics_leave_the_producer_state(kafka_factory, kafka1, mirror_factory):
    src = kafka_factory(name="churn-src")
    mg = mirror_factory(kafka1.bootstrap, [MirrorSpec.of("m", src)], snapshot_interval_ms=1000,
                        producer_state=f"max_partitions = {PER_ROUND + 5}")
    prod = idempotent_producer(src.bootstrap)
    started = time.monotonic()
    for r in range(ROUNDS):
        names = [harness.topic_name(f"churn{r}") for _ in range(PER_ROUND)]
        harness.create_topics(src.bootstrap, names)
        harness.create_topics(kafka1.bootstrap, names)
        for t in names:
            send(prod, t, [t.encode()])
        got = _consume_through(mg.mirrors["m"].bootstrap, names)
        assert got == {t: t.encode() for t in names}
        # The partitions enter the producer state once the destination's topic listing
        # (every metadata_refresh_ms) names their topics: on a busy machine that can come
        # after the consumer has its records.
        harness.wait_until(lambda: mg.metrics().sum(PARTITIONS) >= PER_ROUND, 30,
                           what=f"round {r}: the mirrored partitions in the producer state")
        _delete(kafka1.bootstrap, names)
        _delete(src.bootstrap, names)
        harness.wait_until(lambda: mg.metrics().sum(PARTITIONS) == 0, 30,
                           what=f"round {r}: deleted topics' partitions left the producer state")
    elapsed = time.monotonic() - started
    m = mg.metrics()
    assert m.sum(EVENTS, kind="state_limit") == 0
    assert m.sum(OPS, kind="destination_topic_deleted") >= ROUNDS * PER_ROUND
    assert "destination topic deleted" in mg.log_text()
    print(f"{ROUNDS * PER_ROUND} topics created, mirrored and deleted in {elapsed:.1f}s")

    # Mirroring goes on: a topic of its own still flows, its PID mapped.
    last = harness.topic_name("after")
    harness.create_topics(src.bootstrap, [last])
    harness.create_topics(kafka1.bootstrap, [last])
    send(prod, last, [b"still"])
    assert _consume_through(mg.mirrors["m"].bootstrap, [last]) == {last: b"still"}


def test_topic_deleted_on_the_source_only_keeps_its_state_until_it_expires(kafka_factory, kafka1,
                                                                           mirror_factory):
    idle_ms = 6000
    src = kafka_factory(name="srcdel-src")
    mg = mirror_factory(kafka1.bootstrap, [MirrorSpec.of("m", src)], snapshot_interval_ms=1000,
                        producer_state=f"max_idle_ms = {idle_ms}")
    topic = harness.topic_name("srcdel")
    harness.create_topics(src.bootstrap, [topic])
    harness.create_topics(kafka1.bootstrap, [topic])
    send(idempotent_producer(src.bootstrap), topic, [b"x"])
    assert _consume_through(mg.mirrors["m"].bootstrap, [topic]) == {topic: b"x"}
    fed = time.monotonic()
    assert mg.metrics().sum(PARTITIONS) == 1
    _delete(src.bootstrap, [topic])
    # Several destination listings later (one a second) the partition is still tracked:
    # the destination still has the topic and the producer, which has not expired yet.
    time.sleep(3)
    assert time.monotonic() - fed < idle_ms / 1000, "too slow to tell"
    assert mg.metrics().sum(PARTITIONS) == 1
    assert mg.metrics().sum(OPS, kind="destination_topic_deleted") == 0
    # Once the producer expired (max_idle_ms, Kafka's producer.id.expiration.ms) it goes.
    harness.wait_until(lambda: mg.metrics().sum(PARTITIONS) == 0, idle_ms / 1000 + 15,
                       what="idle empty partition left the producer state")
    # The partition leaves the gauge just before the line is logged.
    harness.wait_until(lambda: "idle partitions with no producer left" in mg.log_text(), 10,
                       what="the partition's removal logged")


def test_paused_partition_keeps_its_state_when_its_destination_topic_goes(kafka_factory, kafka1,
                                                                          mirror_factory):
    """A controlled partition (here PAUSED) keeps its producer state and its life-cycle
    record when the destination stops listing its topic; an uncontrolled one leaves."""
    src = kafka_factory(name="paused-src")
    mg = mirror_factory(kafka1.bootstrap, [MirrorSpec.of("m", src)], snapshot_interval_ms=1000)
    paused, plain = harness.topic_name("paused"), harness.topic_name("plain")
    harness.create_topics(src.bootstrap, [paused, plain])
    harness.create_topics(kafka1.bootstrap, [paused, plain])
    prod = idempotent_producer(src.bootstrap)
    send(prod, paused, [b"p"])
    send(prod, plain, [b"q"])
    assert _consume_through(mg.mirrors["m"].bootstrap, [paused, plain]) == {paused: b"p", plain: b"q"}
    assert mg.metrics().sum(PARTITIONS) == 2
    harness.wait_until(lambda: mg.partition(paused, 0) is not None, 15, what="partition listed")
    status, body = mg.post("pause", "m", paused, [0])
    assert status == 200, body
    _delete(kafka1.bootstrap, [paused, plain])
    harness.wait_until(lambda: mg.metrics().sum(OPS, kind="destination_topic_deleted") >= 2, 20,
                       what="both deletions seen")
    assert mg.metrics().sum(PARTITIONS) == 1, "the paused partition's state must stay, the other go"
    e = mg.partition(paused, 0)
    assert e is not None and e["state"] == "PAUSED", e
