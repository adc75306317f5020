"""Failovers during a seal across destination leadership moves (issue 17), beyond the
scenarios of test_multi_instance_seal.py, on the same bed: the stand-in of kafka_dest.py
with three simulated brokers (Kafka UnifiedLog replicas, fetchers built on Kafka's
FetchSessionHandler), one mirrorguard instance per broker, mirrorguard's default rule
(STOPPED once the destination's high watermark, read with ListOffsets on the stand-in's
listeners, has passed the seal's end). The source is a one-node Apache Kafka cluster of
each test; the instances share a ``__mirror_state`` on kafka1.

(a) The source is stopped (controlled shutdown) and started again while a seal crosses a
    leadership move: the new leader's instance serves the rest of the persisted seal, the
    restarted source's later records never reach the destination, and the seal completes
    once, on that instance.
(b) A serving instance is killed (-9) and restarted in the middle of a seal planned again
    below the cut (the new leader truncated below it), with the source dead: the restarted
    instance serves the same re-planned seal, none other, STOPPED after the high watermark.
(c) A take-over with the source dead restores the other instance's chunked producer-state
    snapshot (type 7, thousands of producers) and seals exactly: every transaction open at
    the cut gets its ABORT, also one begun after the partition was first snapshotted in
    chunks.

Each run's destination log is compared with a single-instance run of the same source input
(test_multi_instance_seal.Reference), sealing batches' timestamps aside.
"""

from __future__ import annotations

import os
import signal

import pytest

import harness
from claims_scale import produce_synthetic
from kafka_dest import kafka_dest_factory  # noqa: F401 - fixture
from mirror_harness import (  # noqa: F401 - mirror_factory is a fixture
    high_watermark,
    idempotent_producer,
    mirror_factory,
    read_state_records,
    send,
    transactional_producer,
)
from test_multi_instance_seal import (BROKERS, MIRROR, Bed, Reference, _events, _log, _state,
                                      seal_above_a_lagging_broker)

pytestmark = pytest.mark.timeout(120)


def _seal_records(mg, topic: str) -> list[dict]:
    """The partition's life-cycle records (type 4) in ``__mirror_state``, oldest first."""
    return [r.value for r in read_state_records(mg.state_bootstrap, mg.state_topic, timeout=30)
            if r.type == 4 and r.value and r.value["topic"] == topic]


def _finish(bed: Bed, end: int) -> tuple[list, dict]:
    for b in BROKERS:
        bed.wait_replicated(b, end)
        bed.fetcher[b].stop()
    return _log(bed.dest, bed.topic)


def test_source_restarted_during_a_seal_across_a_leadership_move(kafka1, kafka_factory,  # noqa: F811
                                                                 kafka_dest_factory, mirror_factory):
    """(a) Stop requested, the leader's instance appends the seal (ABORT, barrier); broker 2
    copied the ABORT only. The source stops (SIGTERM), leadership moves to broker 2 (its
    instance serves the barrier from the persisted seal), the source starts again and gets
    new records: the partition stays STOPPING while the high watermark is below the seal's
    end, no record past the cut is served, and it goes STOPPED once, on broker 2's instance."""
    source = kafka_factory(name="src")
    bed = Bed(source, kafka1.bootstrap, kafka_dest_factory, mirror_factory, "fo-restart")
    T = bed.topic
    cut, _tp = bed.mirror_an_open_transaction(source)
    ref = Reference(source, kafka1.bootstrap, kafka_dest_factory, mirror_factory, T)
    ref.mirror_to(cut)
    bed.wait_replicated(2, cut)
    bed.dest.pause_replication(T, 2, upto=cut + 1)
    bed.wait_replicated(3, cut)
    bed.dest.pause_replication(T, 3)

    bed.stop(through=3)
    end = cut + 2  # one ABORT (the open transaction) and the barrier
    bed.wait_leader_end(end)
    bed.wait_replicated(2, cut + 1)
    bed.assert_waits(leader=1, end=end)

    harness.close_clients()
    source.nodes[0].stop()
    # Brokers 1 and 3 copy nothing of the new leader: its high watermark stays below the end.
    bed.dest.pause_replication(T, 1)
    move = bed.dest.move_leader(T, 2)["move"]
    assert move["log_end_offset"] == cut + 1 and move["truncated"] == {"1": 1, "3": 0}, move
    bed.wait_leader_end(end)  # broker 2's instance served the barrier of the persisted seal
    bed.assert_waits(leader=2, end=end)

    source.nodes[0].restart()
    source.wait_brokers(1)
    later = idempotent_producer(source.bootstrap)
    send(later, T, [b"late-%d" % i for i in range(3)])
    assert high_watermark(source.bootstrap, T) >= cut + 3  # (and maybe the ABORT of the closed client)
    # Every instance can reach the source again; the one serving the partition still
    # answers its fetcher with the seal alone and waits for the high watermark.
    bed.assert_waits(leader=2, end=end, seconds=2.0)
    assert bed.dest.state(T)["log_end_offset"] == end
    # Broker 2's instance is held (SIGSTOP) while the high watermark passes the end, so that
    # broker 1's instance, which holds the whole seal too, reads it first whatever the timing
    # of the two polls: it must leave the completion to broker 2's (seen in CI: when broker 2's
    # completed first, broker 1's read STOPPED before its own poll and the path went untested).
    os.killpg(bed.mg[2].proc.pid, signal.SIGSTOP)
    try:
        for b in (1, 3):
            bed.dest.pause_replication(T, b, paused=False)
        harness.wait_until(lambda: "another instance serves the partition now: it completes the seal"
                           in bed.mg[1].log_text(), 30, interval=0.1,
                           what="broker 1's instance read the high watermark past the end")
        assert _state(bed.mg[1], T) == "STOPPING"
    finally:
        os.killpg(bed.mg[2].proc.pid, signal.SIGCONT)
    bed.stopped_on()
    view = bed.mg[2].partition(T)
    assert (view["state"], view["cut"], view["seal_batches"]) == ("STOPPED", cut, 2), view
    multi = _finish(bed, end)
    assert [b["kind"] for b in multi[0][-2:]] == ["ABORT", "TYPE_7"], multi[0]
    assert multi[1]["high_watermark"] == multi[1]["log_end_offset"] == end, multi[1]
    # Completed once, by broker 2's instance, which took the partition over to serve the
    # barrier. Broker 1's held the whole seal too and read the same high watermark (on the
    # current leader): it leaves the completion to the instance serving the partition
    # (before, both persisted STOPPED, each counting seal_completed).
    assert [_events(bed.mg[b], "seal_completed") for b in BROKERS] == [0, 1, 0]
    assert view["served_here"], view
    assert sum(_events(bed.mg[b], "seal_replanned_below_cut") for b in BROKERS) == 0
    for mg in bed.mg.values():
        harness.wait_until(lambda mg=mg: _state(mg, T) == "STOPPED", 15, interval=0.1,
                           what=f"{mg.name} read the seal")
        assert mg.partition(T)["cut"] == cut
    assert multi == ref.seal(cut)


@pytest.mark.parametrize("when", ["unserved", "unreplicated"])
def test_instance_killed_in_a_replanned_seal_with_the_source_dead(kafka1, kafka_factory, kafka_dest_factory,  # noqa: F811
                                                                  mirror_factory, when):
    """(b) Broker 2 holds records up to `low` only (below the cut), the stop seals at the cut
    on broker 1, the source is killed, and leadership moves to broker 2: its instance
    plans the seal again at `low` and persists it. Then that instance is killed (-9) and
    restarted, either before its fetcher appended the re-planned seal (`unserved`: the
    response is lost with the leadership, a new fetcher takes over) or after (`unreplicated`:
    appended by the leader, the high watermark below its end). The restarted instance serves
    that same seal; no other seal is planned; STOPPED only after the high watermark passed."""
    source = kafka_factory(name="src")
    bed = Bed(source, kafka1.bootstrap, kafka_dest_factory, mirror_factory, f"fo-replan-{when}")
    T = bed.topic
    _tp, low, cut, ref = seal_above_a_lagging_broker(bed, source, kafka1.bootstrap, kafka_dest_factory,
                                                     mirror_factory)
    end = cut + 2
    bed.assert_waits(leader=1, end=end)
    # The source dies with the seal at the cut held by broker 1 only (the clients go first:
    # closing the transactional one may abort its transaction on the source, past the cut,
    # where nothing is served any more).
    harness.close_clients()
    source.nodes[0].kill()

    # Brokers 1 and 3 copy nothing of the new leader after the move.
    bed.dest.pause_replication(T, 1)
    if when == "unserved":
        bed.fetcher[2].drop_next(1, mode="lose_leadership")
    move = bed.dest.move_leader(T, 2)["move"]
    assert move["log_end_offset"] == low and move["truncated"] == {"1": end - low, "3": cut - low}, move
    new_end = low + 2  # the open transaction's ABORT and the barrier, at broker 2's log end
    harness.wait_until(lambda: (bed.mg[2].partition(T) or {}).get("cut") == low, 30, interval=0.05,
                       what="the seal planned again at broker 2's log end")
    assert _events(bed.mg[2], "seal_replanned_below_cut") == 1
    if when == "unserved":
        bed.fetcher[2].follow(lambda: not bed.fetcher[2].report()["running"], 15, "the response lost")
        assert bed.dest.state(T)["log_end_offset"] == low, "the re-planned seal was not appended"
    else:
        bed.wait_leader_end(new_end)
        bed.assert_waits(leader=2, end=new_end)

    bed.mg[2].kill9()
    bed.mg[2].start(timeout=60)
    if when == "unserved":
        # The broker's next fetcher starts from the log end, below the re-planned seal.
        bed.fetcher[2] = bed.dest.mirror("b2-again", bed.mg[2].mirrors[MIRROR].bootstrap, [(T, 0)], broker=2)
        bed.wait_leader_end(new_end)
    harness.wait_until(lambda: (bed.mg[2].partition(T).get("destination_hw") or {})
                       .get("high_watermark") is not None, 30, interval=0.1, what="high watermark read again")
    bed.assert_waits(leader=2, end=new_end, seconds=1.5)
    view = bed.mg[2].partition(T)
    assert (view["state"], view["cut"], view["seal_batches"]) == ("STOPPING", low, 2), view
    assert bed.dest.state(T)["log_end_offset"] == new_end
    for b in (1, 3):
        bed.dest.pause_replication(T, b, paused=False)
    view = bed.stopped_on()
    assert (view["cut"], view["seal_batches"]) == (low, 2), view
    multi = _finish(bed, new_end)
    assert [b["kind"] for b in multi[0][-2:]] == ["ABORT", "TYPE_7"], multi[0]
    assert multi[1]["high_watermark"] == new_end, multi[1]
    # The restarted instance planned nothing: it served the persisted seal. Two seals were
    # ever planned (the cut, then broker 2's log end); the partition went STOPPED at `low`.
    assert _events(bed.mg[2], "seal_replanned_below_cut") == 0
    assert _events(bed.mg[2], "seal_completed") == 1
    seals = [r for r in _seal_records(bed.mg[1], T) if r["cut"] >= 0]
    assert sorted({(r["cut"], r["seal_batches"]) for r in seals}) == [(low, 2), (cut, 2)], seals
    assert seals[-1]["cut"] == low, seals
    assert [r["cut"] for r in seals].index(low) > max(i for i, r in enumerate(seals) if r["cut"] == cut), seals
    assert multi == ref.seal(low)


N_PRODUCERS = 4_500  # more than one type-5 record holds (about 3,900): two type-7 chunks
N_OPEN = 3


@pytest.mark.parametrize("later", ["none", "txn_after_chunks"])
def test_take_over_restores_a_chunked_snapshot_with_the_source_killed(kafka1, kafka_factory,  # noqa: F811
                                                                     kafka_dest_factory, mirror_factory, later):
    """(c) Broker 1's instance mirrors three open transactions and 4,500 idempotent producers
    and snapshots the partition in chunks (type 7). The source is SIGKILLed, then leadership
    moves to broker 2 (a full copy, at the cut): its instance takes the partition over from
    the chunks (no source to replay from) and the stop seals there with one ABORT per open
    transaction and the barrier, as a single instance does.

    `txn_after_chunks`: once the partition is snapshotted in chunks, one of the transactional
    producers commits and begins another transaction (no new producer, so no claim): the
    instance writes its chunks again, since a take-over with the source gone seals from them
    (before, a chunked snapshot was rewritten only for new producers or after 5 minutes: the
    take-over sealed from the older chunks, with no ABORT for the new transaction)."""
    source = kafka_factory(name="src")
    bed = Bed(source, kafka1.bootstrap, kafka_dest_factory, mirror_factory, "fo-chunks")
    T = bed.topic
    # Broker 1's fetcher starts once the source holds everything. A chunked snapshot is
    # written again only when the claims it supersedes are a tenth of the producers or the
    # open transactions changed (state_store/sync/chunks.rs): a snapshot round that runs
    # while the fetcher is in the last tenth of the idempotent producers would otherwise
    # leave the chunks short of the cut for good. The transactions begin last, so the
    # partition's final batch changes its open transactions and the snapshot at the cut is
    # always due.
    bed.fetcher[1].stop()
    tps = [transactional_producer(source.bootstrap, f"txn{i}-{T}", **{"transaction.timeout.ms": 600000})
           for i in range(N_OPEN)]
    produce_synthetic(source.bootstrap, T, N_PRODUCERS)
    send(idempotent_producer(source.bootstrap), T, [b"tail-%d" % i for i in range(2)])
    for i, tp in enumerate(tps):
        tp.begin_transaction()
        tp.produce(T, value=b"open-%d" % i, partition=0)
        assert tp.flush(20) == 0
    cut = high_watermark(source.bootstrap, T)
    assert cut == N_OPEN + N_PRODUCERS + 2
    bed.fetcher[1] = bed.dest.mirror("b1-all", bed.mg[1].mirrors[MIRROR].bootstrap, [(T, 0)], broker=1)
    bed.fetcher[1].catch_up(T, cut, timeout=60)
    for b in (2, 3):
        bed.wait_replicated(b, cut)
    ref = Reference(source, kafka1.bootstrap, kafka_dest_factory, mirror_factory, T)
    ref.mirror_to(cut)

    def chunked_at_cut() -> bool:
        rs = [r for r in read_state_records(kafka1.bootstrap, bed.mg[1].state_topic, timeout=30)
              if r.type == 7 and r.value and r.value["snapshot_offset"] == cut]
        by_gen: dict[int, list] = {}
        for r in rs:
            by_gen.setdefault(r.key["generation"], []).append(r.value)
        return any(len(v) == v[0]["chunk_count"] > 1
                   and sum(len(c["producers"]) for c in v) == N_PRODUCERS + N_OPEN + 1 for v in by_gen.values())

    harness.wait_until(chunked_at_cut, 30, interval=0.5, what="a chunked snapshot of the partition at the cut")
    if later == "txn_after_chunks":
        tps[0].commit_transaction(20)
        tps[0].begin_transaction()
        tps[0].produce(T, value=b"open-again", partition=0)
        assert tps[0].flush(20) == 0
        cut = high_watermark(source.bootstrap, T)
        assert cut == N_OPEN + N_PRODUCERS + 2 + 2  # the COMMIT marker and the new record
        bed.fetcher[1].catch_up(T, cut, timeout=30)
        for b in (2, 3):
            bed.wait_replicated(b, cut)
        ref.mirror_to(cut)
        harness.wait_until(chunked_at_cut, 30, interval=0.5,
                           what="the chunks written again with the new transaction")
    # Broker 1's fetcher stops at the cut before the clients go: closing a transactional
    # client aborts its transaction on the source, past the cut (the transactions stay open
    # in what the destination holds).
    bed.fetcher[1].stop()
    harness.close_clients()
    source.nodes[0].kill()

    bed.dest.move_leader(T, 2)
    bed.fetcher[1] = bed.dest.mirror("b1-follower", bed.mg[1].mirrors[MIRROR].bootstrap, [(T, 0)], broker=1)
    bed.stop(through=3)
    end = cut + N_OPEN + 1
    bed.stopped_on()
    view = bed.mg[2].partition(T)
    assert (view["state"], view["cut"], view["seal_batches"]) == ("STOPPED", cut, N_OPEN + 1), view
    assert view["served_here"], view
    assert bed.dest.state(T)["high_watermark"] == end
    multi = _finish(bed, end)
    assert [b["kind"] for b in multi[0][-N_OPEN - 1:]] == ["ABORT"] * N_OPEN + ["TYPE_7"], multi[0][-5:]
    assert multi[1]["last_stable_offset"] == end and multi[1]["first_unstable_offset"] is None, multi[1]
    assert _events(bed.mg[2], "open_at_cut_incomplete") == 0
    # Broker 2's instance restored broker 1's chunks (every producer, up to the cut).
    assert f"producer state restored from __mirror_state partition={T}-0 producers={N_PRODUCERS + N_OPEN + 1} " \
           f"upto={cut}" in bed.mg[2].log_text()
    assert multi == ref.seal(cut)
