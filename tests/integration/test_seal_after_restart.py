"""A disaster seal after a restart, the source gone (SPEC 3; issue 29 item 5).

"Pause, restart, source dies (killed, or hung: SIGSTOP), stop": the transaction opened before the pause must still get
its ABORT marker, though mirrorguard cannot replay the source to learn what its destination
fetcher appended since the last snapshot. A graceful restart writes the PAUSED partition's
snapshot on the way out (periodic and shutdown snapshots skipped PAUSED partitions before);
after a kill -9 no snapshot holds the transaction, so the seal aborts every producer that may
have begun one in the range the state never saw: the transactional producers it knows and the
producers claimed since its snapshot (a claim is durable before a new producer's first batch
is forwarded). Before: the seal was a lone barrier, the transaction stayed open on the
destination (its last stable offset pinned below its log end for good), and no alert fired.

The source is Apache Kafka 4.4 (a cluster of the test's own, killed), the destination the
Kafka-engine stand-in (kafka_dest.py: Kafka's UnifiedLog replication path), the seal completes
on the destination's high watermark, and the state cluster is the session's `kafka1`.
"""

from __future__ import annotations

import pytest

import harness
from kafka_dest import dest_hw_bootstrap, kafka_dest_factory  # noqa: F401 - fixture
from mirror_harness import (  # noqa: F401 - mirror_factory is a fixture
    MirrorSpec,
    high_watermark,
    idempotent_producer,
    mirror_factory,
    send,
    transactional_producer,
)

MIRROR = "a-to-b"


@pytest.mark.parametrize("restart,source_end", [("graceful", "killed"), ("kill9", "killed"), ("kill9", "hung")])
def test_pause_restart_source_dies_stop_aborts_the_transaction_open_since_before_the_pause(
        restart, source_end, kafka1, kafka_factory, mirror_factory, kafka_dest_factory):  # noqa: F811
    T = harness.topic_name(f"unseen-{restart}-{source_end}")
    a = kafka_factory(name="A")
    harness.create_topics(a.bootstrap, [T])
    harness.create_topics(kafka1.bootstrap, [T])  # the destination's topic id is listed there
    dest = kafka_dest_factory("B")
    # A hung source answers nothing: the replay before the cut gives up after the mirror's
    # upstream request timeout (30 s by default), then the seal is planned without it.
    spec = MirrorSpec.of(MIRROR, a, destination_hw=dest_hw_bootstrap(dest),
                         extra="upstream_request_timeout_ms = 3000" if source_end == "hung" else "")
    # No periodic snapshot within the test: only a shutdown snapshot or the claims remain.
    mg = mirror_factory(kafka1.bootstrap, [spec], snapshot_interval_ms=600000)
    mg.wait_sources_known()
    ip = idempotent_producer(a.bootstrap)
    tp = transactional_producer(a.bootstrap, f"t-{T}", **{"transaction.timeout.ms": 600000})
    send(ip, T, [b"a-%d" % i for i in range(3)])
    tp.begin_transaction()
    tp.produce(T, value=b"open", partition=0)
    assert tp.flush(20) == 0
    send(ip, T, [b"b-0"])
    hw = high_watermark(a.bootstrap, T)
    f = dest.mirror("f", spec.bootstrap, [(T, 0)])
    f.catch_up(T, hw)
    open_batch = [b for b in dest.batches(T) if b.get("transactional") and b["kind"] == "DATA"][-1]
    assert dest.state(T)["last_stable_offset"] == open_batch["base_offset"]

    status, body = mg.post("pause", MIRROR, T, [0])
    assert status == 200, body
    if restart == "graceful":
        mg.restart()
    else:
        mg.kill9()
        mg.start()
    # The transactional producer's cluster is about to die: its close would block.
    harness.abandon_client(tp)
    if source_end == "hung":
        a.pause()
    else:
        a.stop(graceful=False)

    status, body = mg.post("stop", MIRROR, T, [0])
    assert status == 200, body
    harness.wait_until(lambda: (mg.partition(T) or {}).get("state") == "STOPPED", 40, interval=0.1,
                       what="STOPPED")
    view = mg.partition(T)
    tail = [(b["base_offset"], b["kind"], b["producer_id"]) for b in dest.batches(T) if b["base_offset"] >= hw]
    st = dest.state(T)
    aborted = [pid for _, kind, pid in tail if kind == "ABORT"]
    unseen = mg.metrics().sum("mirrorguard_seal_events_total", mirror=MIRROR, kind="unseen_range_abort")
    incomplete = mg.metrics().sum("mirrorguard_seal_events_total", mirror=MIRROR, kind="open_at_cut_incomplete")
    print(f"{restart}, source {source_end}: cut {view['cut']}, seal {[k for _, k, _ in tail]}, aborted {aborted}, "
          f"open transaction's producer {open_batch['producer_id']}, unseen-range aborts {unseen}, "
          f"destination LSO {st['last_stable_offset']} LEO {st['log_end_offset']}")
    assert view["cut"] == hw, view
    assert [k for _, k, _ in tail][-1] == "TYPE_7", tail
    assert open_batch["producer_id"] in aborted, (tail, open_batch)
    assert st["last_stable_offset"] == st["log_end_offset"] == hw + len(tail), st
    assert incomplete == 0
    if restart == "graceful":
        # The shutdown snapshot held the PAUSED partition: exactly its open transaction.
        assert aborted == [open_batch["producer_id"]] and unseen == 0, (tail, unseen)
    else:
        # Only claims: both producers may have begun a transaction; the idempotent one's
        # marker is harmless on the replication path (the destination took it above).
        assert len(aborted) == 2 and unseen == 2, (tail, unseen)
    f.stop()
