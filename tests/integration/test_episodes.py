"""STOPPED ends one mirroring episode, not the partition's life (SPEC 3; issue 29 item 1).

After a failover and a failback, operators protect the partition again with
`POST /v1/partitions/protect`: it goes back to MIRRORING under the named mirror, the produce
guard refuses local writes again, and a new episode starts at the destination fetcher's next
fetch, where mirrorguard's shadow producer state starts empty. The next disaster is sealed
like the first. A topic deleted and created again is a new partition. Before, STOPPED was
forever: a fetcher of a new episode was answered "caught up" with nothing, the guard let
local writes in, and the next `stop` answered 409 while the destination lacked everything
written since.

The source is Apache Kafka 4.4 (a cluster of the test's own, killed for the second
failover), the destination the Kafka-engine stand-in (kafka_dest.py: Kafka's UnifiedLog and
FetchSessionHandler), the seal completes on the destination's high watermark, and the state
cluster is the session's `kafka1`, which also lists the destination topic ids.
"""

from __future__ import annotations

import harness
from confluent_kafka.admin import AdminClient

from kafka_dest import data_batch, dest_hw_bootstrap, kafka_dest_factory, topic_id_of  # noqa: F401 - fixture
from mirror_harness import (  # noqa: F401 - mirror_factory is a fixture
    MirrorSpec,
    high_watermark,
    idempotent_producer,
    read_state_records,
    mirror_factory,
    send,
    transactional_producer,
)

MIRROR = "a-to-b"


def _state(mg, topic: str) -> str | None:
    return (mg.partition(topic) or {}).get("state")


def _tail(dest, topic: str, since: int) -> list[tuple[int, str, int]]:
    return [(b["base_offset"], b["kind"], b["producer_id"]) for b in dest.batches(topic) if b["base_offset"] >= since]


def _fetch_errors(f) -> dict:
    return f.report()["errors"]


def test_protect_again_after_failback_then_a_second_failover_with_the_source_dead(
        kafka1, kafka_factory, mirror_factory, kafka_dest_factory):  # noqa: F811
    T = harness.topic_name("episodes")
    a = kafka_factory(name="A")
    harness.create_topics(a.bootstrap, [T])
    harness.create_topics(kafka1.bootstrap, [T])  # the destination's topic id is listed there
    dest = kafka_dest_factory("B")
    spec = MirrorSpec.of(MIRROR, a, destination_hw=dest_hw_bootstrap(dest))
    mg = mirror_factory(kafka1.bootstrap, [spec], snapshot_interval_ms=300)
    mg.wait_sources_known()
    ip = idempotent_producer(a.bootstrap)
    tp1 = transactional_producer(a.bootstrap, f"t1-{T}", **{"transaction.timeout.ms": 600000})

    # Episode 0: mirrored, then failed over with a transaction open.
    send(ip, T, [b"a-%d" % i for i in range(3)])
    tp1.begin_transaction()
    tp1.produce(T, value=b"open-1", partition=0)
    assert tp1.flush(20) == 0
    cut = high_watermark(a.bootstrap, T)
    f0 = dest.mirror("f0", spec.bootstrap, [(T, 0)])
    f0.catch_up(T, cut)
    status, body = mg.post("stop", MIRROR, T, [0])
    assert status == 200, body
    harness.wait_until(lambda: _state(mg, T) == "STOPPED", 30, interval=0.1, what="episode 0 STOPPED")
    end0 = cut + 2
    assert [k for _, k, _ in _tail(dest, T, cut)] == ["ABORT", "TYPE_7"]
    f0.stop()
    tp1.abort_transaction(20)

    # Failover: local writes on B (its own producer id 0). Leader epoch 0, A's: in a real
    # failback A's log would hold these very batches; here A's own records stand in for them
    # (below), so the epochs must agree or A would answer the fetcher's LastFetchedEpoch as
    # a divergence.
    out = dest.produce(T, data_batch([b"local-0", b"local-1"], pid=0, epoch=0, seq=0), leader_epoch=0)
    assert out["error"] is None and out["stored"], out
    x = end0 + 2
    assert dest.state(T)["log_end_offset"] == x
    # Failback, modelled: A's log is brought level with B's up to x (A mirrored B's log and
    # sealed it; its own records stand in for B's here), then A takes writes again.
    while high_watermark(a.bootstrap, T) < x:
        send(ip, T, [b"filler"])
    x = high_watermark(a.bootstrap, T)
    while dest.state(T)["log_end_offset"] < x:
        dest.produce(T, data_batch([b"b-level"], pid=0, epoch=0,
                                   seq=dest.state(T)["producers"][0]["last_sequence"] + 1), leader_epoch=0)
    assert dest.state(T)["log_end_offset"] == x

    # B mirrors A again without protecting the partition first: never "caught up".
    f1 = dest.mirror("f1", spec.bootstrap, [(T, 0)])
    f1.follow(lambda: "POLICY_VIOLATION" in _fetch_errors(f1), 15, "the unprotected fetch refused")
    assert dest.state(T)["log_end_offset"] == x
    assert mg.metrics().sum("mirrorguard_seal_events_total", mirror=MIRROR, kind="fetch_refused") >= 1
    f1.stop()

    # Protect again: a new episode; a restart before its fetcher comes keeps it pending.
    status, body = mg.post("protect", MIRROR, T, [0])
    assert status == 200, body
    assert [(v["state"], v["episode"], v["episode_start"]) for v in body["applied"]] == [("MIRRORING", 1, None)]
    status, body = mg.post("protect", MIRROR, T, [0])
    assert status == 200 and body["applied"] == [] and len(body["unchanged"]) == 1, body
    mg.restart()
    view = mg.partition(T)
    assert (view["state"], view["episode"], view["episode_start"]) == ("MIRRORING", 1, None), view
    assert [(h["episode"], h["cut"], h["seal_batches"], h["state"]) for h in view["history"]] == \
        [(0, cut, 2, "STOPPED")], view

    # Episode 1: A's new writes, a transaction open at the second failover.
    tp2 = transactional_producer(a.bootstrap, f"t2-{T}", **{"transaction.timeout.ms": 600000})
    send(ip, T, [b"e1-%d" % i for i in range(2)])
    tp2.begin_transaction()
    tp2.produce(T, value=b"open-2", partition=0)
    assert tp2.flush(20) == 0
    cut1 = high_watermark(a.bootstrap, T)
    f2 = dest.mirror("f2", spec.bootstrap, [(T, 0)])
    f2.catch_up(T, cut1, timeout=30)
    view = mg.partition(T)
    assert (view["state"], view["episode_start"]) == ("MIRRORING", x), view
    values = [v for o, v in dest.values(T) if o >= x]
    assert b"e1-0" in values and b"open-2" in values, values
    open_batch = [b for b in dest.batches(T) if b["base_offset"] >= x and b.get("transactional") and
                  b["kind"] == "DATA"][-1]

    # The seal after the restart below plans from episode 1's snapshot (the source is gone,
    # nothing can be replayed): wait until one holds the open transaction. (Sealing without
    # such a snapshot is issue 29 item 5.)
    def snapshotted():
        return any(r.type == 5 and r.value and any(p["producer_id"] == open_batch["producer_id"]
                                                   and p["txn_first_offset"] >= x for p in r.value["producers"])
                   for r in read_state_records(kafka1.bootstrap, mg.state_topic))

    harness.wait_until(snapshotted, 15, interval=0.2, what="a snapshot of episode 1 with the open transaction")

    # Second failover, the source dead, mirrorguard restarted too: the seal aborts episode 1's
    # open transaction (mapped PID) and nothing of episode 0 (closed by its own seal).
    harness.abandon_client(tp2)  # its cluster dies now: its close would block
    a.stop(graceful=False)
    mg.kill9()
    mg.restart()
    status, body = mg.post("stop", MIRROR, T, [0])
    assert status == 200, body
    harness.wait_until(lambda: _state(mg, T) == "STOPPED", 40, interval=0.1, what="episode 1 STOPPED")
    view = mg.partition(T)
    assert (view["cut"], view["seal_batches"], view["episode"]) == (cut1, 2, 1), view
    tail = _tail(dest, T, cut1)
    assert [k for _, k, _ in tail] == ["ABORT", "TYPE_7"], tail
    st = dest.state(T)
    assert st["last_stable_offset"] == st["log_end_offset"] == cut1 + 2, st
    aborted_pid = tail[0][2]
    assert aborted_pid == open_batch["producer_id"], (tail, open_batch)
    assert [h["episode"] for h in view["history"]] == [0]
    f2.stop()


def test_a_topic_deleted_and_created_again_is_a_new_partition(kafka1, mirror_factory, kafka_dest_factory):  # noqa: F811
    """A STOPPED partition's topic is deleted on the destination and created again (a new
    topic id): its life-cycle entry does not apply to the new topic, which is MIRRORING and
    can be stopped; the old record stays in __mirror_state."""
    T = harness.topic_name("recreated")
    harness.create_topics(kafka1.bootstrap, [T])  # source and destination listing: kafka1
    dest = kafka_dest_factory("recreated")
    spec = MirrorSpec.of(MIRROR, kafka1, destination_hw=dest_hw_bootstrap(dest))
    mg = mirror_factory(kafka1.bootstrap, [spec])
    mg.wait_sources_known()
    ip = idempotent_producer(kafka1.bootstrap)
    send(ip, T, [b"x-%d" % i for i in range(2)])
    f = dest.mirror("f", spec.bootstrap, [(T, 0)])
    f.catch_up(T, 2)
    assert mg.post("stop", MIRROR, T, [0])[0] == 200
    harness.wait_until(lambda: _state(mg, T) == "STOPPED", 30, interval=0.1, what="STOPPED")
    f.stop()

    old_id = topic_id_of(kafka1.bootstrap, T)
    admin = AdminClient({"bootstrap.servers": kafka1.bootstrap})
    admin.delete_topics([T])[T].result(30)
    harness.wait_until(lambda: T not in admin.list_topics(timeout=5).topics, 30, interval=0.2,
                       what="topic deleted")
    harness.create_topics(kafka1.bootstrap, [T])
    assert topic_id_of(kafka1.bootstrap, T) != old_id
    harness.wait_until(lambda: _state(mg, T) in (None, "MIRRORING"), 30, interval=0.2,
                       what="the new topic is MIRRORING")
    assert mg.metrics().sum("mirrorguard_state_store_ops_total", kind="partition_state_of_deleted_topic") >= 1
    status, body = mg.post("stop", MIRROR, T, [0])
    assert status == 200, body
    assert body["applied"][0]["state"] == "STOPPING" and body["applied"][0]["episode"] == 0, body
