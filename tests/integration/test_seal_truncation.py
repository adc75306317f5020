"""A seal planned again below the cut aborts a transaction whose COMMIT marker the destination
lost (issue 17, "seal across a move").

Transaction T begins on the source below the new leader's future log end `low` and commits
at `low`; the destination leader (broker 1) appends the commit marker and more records, but
its followers copy nothing past `low`. The operator stops the partition at the cut (the
source's end), the source is SIGKILLed (failover usually happens with the source dead), the
leader appends the seal (only the barrier: T is closed at the cut) and leadership moves to
broker 2, which truncates everyone to `low`: T's marker is gone from the destination. The
fetch from `low` gets the seal planned again there, and T is open there: the new seal must
ABORT it, or T stays open on the destination forever (last stable offset stuck, read_committed
consumers blocked).

Three ways the new leader's fetch reaches mirrorguard:
- `same`: through the instance that planned the first seal (the closing is remembered in
  memory, below the fetcher's position it had passed);
- `other`: through another instance, which takes the partition over from `__mirror_state`;
- `restarted`: through the first instance after a kill -9 and a restart between the seal and
  the move (its state comes from `__mirror_state`).

Each ends with the log a single instance writes when stopped at `low` (the Reference of
test_multi_instance_seal.py).

Before the fix the closing was forgotten once the fetcher's position passed the marker: the
re-planned seal held the barrier only ("transaction closings past the cut may be unknown",
`open_at_cut_incomplete`), T's transaction stayed open on the destination.
"""

from __future__ import annotations

import pytest

import harness
from kafka_dest import kafka_dest_factory  # noqa: F401 - fixture
from mirror_harness import (  # noqa: F401 - mirror_factory is a fixture
    high_watermark,
    idempotent_producer,
    mirror_factory,
    send,
    transactional_producer,
)
from test_multi_instance_seal import BROKERS, MIRROR, Bed, Reference, _events, _log, _state


@pytest.mark.parametrize("via", ["same", "other", "restarted"])
def test_replanned_seal_aborts_a_transaction_whose_commit_marker_was_lost(
        via, kafka1, kafka_factory, kafka_dest_factory, mirror_factory):  # noqa: F811
    source = kafka_factory(name="src")
    bed = Bed(source, kafka1.bootstrap, kafka_dest_factory, mirror_factory, f"seal-trunc-{via}")
    T = bed.topic
    # Broker 1's fetcher starts once the source holds everything: it fetches past T's
    # marker at once, so no producer-state snapshot is ever taken with T open (the seal
    # planned again must learn T from the closing, nothing else).
    bed.fetcher[1].stop()
    if via != "other":
        # Every broker's fetcher goes through instance 1.
        for b in (2, 3):
            bed.fetcher[b].stop()
            bed.fetcher[b] = bed.dest.mirror(f"b{b}-via-1", bed.mg[1].mirrors[MIRROR].bootstrap, [(T, 0)],
                                             broker=b)
    serving_after_move = 2 if via == "other" else 1

    ip = idempotent_producer(source.bootstrap)
    tp = transactional_producer(source.bootstrap, f"txn-{T}", **{"transaction.timeout.ms": 600000})
    send(ip, T, [b"a-0", b"a-1"])
    tp.begin_transaction()
    tp.produce(T, value=b"t-0", partition=0)
    assert tp.flush(20) == 0
    low = high_watermark(source.bootstrap, T)
    first = low - 1  # T's first offset
    # The single-instance run of the same input, stopped where the new leader's log will end.
    ref = Reference(source, kafka1.bootstrap, kafka_dest_factory, mirror_factory, T)
    ref.mirror_to(low)

    # T commits at `low`; the leader appends the marker and more, its followers only what
    # lies below `low`.
    tp.commit_transaction(20)
    # The coordinator writes the marker after EndTxn returns: wait for it.
    harness.wait_until(lambda: high_watermark(source.bootstrap, T) == low + 1, 15, interval=0.05,
                       what="the commit marker written")
    send(ip, T, [b"b-0", b"b-1"])
    cut = high_watermark(source.bootstrap, T)
    for b in (2, 3):
        bed.dest.pause_replication(T, b, upto=low)
    bed.fetcher[1] = bed.dest.mirror("b1-late", bed.mg[1].mirrors[MIRROR].bootstrap, [(T, 0)], broker=1)
    bed.fetcher[1].catch_up(T, cut, timeout=30)
    for b in (2, 3):
        bed.wait_replicated(b, low)
    leader_log = bed.dest.batches(T)
    pid = next(b["producer_id"] for b in leader_log if b["base_offset"] == first)
    marker = next(b for b in leader_log if b["base_offset"] == low)
    assert (marker["kind"], marker["producer_id"]) == ("COMMIT", pid), leader_log
    harness.close_clients()
    source.nodes[0].kill()

    bed.stop(through=3)
    end = cut + 1  # the barrier only: T is closed at the cut
    bed.wait_leader_end(end)
    assert [b["kind"] for b in bed.dest.batches(T) if b["base_offset"] >= cut] == ["TYPE_7"]
    bed.assert_waits(leader=1, end=end)
    if via == "restarted":
        bed.mg[1].kill9()
        bed.mg[1].start(timeout=60)
        harness.wait_until(lambda: _state(bed.mg[1], T) == "STOPPING", 30, interval=0.1,
                           what="the restarted instance read its seal")

    # Broker 2 leads: 1 and 3 truncate to its log end, T's marker is gone.
    move = bed.dest.move_leader(T, 2)["move"]
    assert move["log_end_offset"] == low and move["truncated"] == {"1": end - low, "3": 0}, move
    bed.dest.pause_replication(T, 2, paused=False)
    harness.wait_until(lambda: bed.mg[serving_after_move].partition(T).get("cut") == low, 30, interval=0.05,
                       what="the seal planned again at the new leader's log end")
    view = bed.mg[serving_after_move].partition(T)
    # T's ABORT and the barrier (before the fix: the barrier only, T left open).
    assert view["seal_batches"] == 2, (view, _events(bed.mg[serving_after_move], "open_at_cut_incomplete"))
    new_end = low + 2
    bed.wait_leader_end(new_end)
    st = bed.dest.state(T)
    assert st["producers"][pid]["open_txn_first_offset"] in (None, -1), st["producers"]
    # Broker 3 still copies nothing: the high watermark stays below the new seal's end and
    # the partition stays STOPPING.
    harness.wait_until(lambda: (bed.mg[serving_after_move].partition(T).get("destination_hw") or {})
                       .get("seal_end") == new_end, 15, interval=0.05, what="the new seal watched")
    bed.assert_waits(leader=serving_after_move, end=new_end)
    view = bed.mg[serving_after_move].partition(T)
    assert (view["state"], view["cut"], view["seal_batches"]) == ("STOPPING", low, 2), view
    bed.dest.pause_replication(T, 3, paused=False)
    view = bed.stopped_on()
    assert (view["cut"], view["seal_batches"]) == (low, 2), view
    for b in BROKERS:
        bed.wait_replicated(b, new_end)
        bed.fetcher[b].stop()

    multi = _log(bed.dest, T)
    abort, barrier = multi[0][-2:]
    assert (abort["kind"], abort["base_offset"], abort["producer_id"]) == ("ABORT", low, pid), multi[0]
    assert (barrier["kind"], barrier["base_offset"]) == ("TYPE_7", low + 1), multi[0]
    s = multi[1]
    assert s["log_end_offset"] == s["high_watermark"] == s["last_stable_offset"] == new_end, s
    assert s["first_unstable_offset"] in (None, -1), s
    m = bed.mg[serving_after_move]
    assert _events(m, "seal_replanned_below_cut") == 1
    assert _events(m, "open_at_cut_incomplete") == 0
    assert "transaction closings past the cut may be unknown" not in m.log_text()
    if via == "other":
        # No snapshot at or below the fetch offset: the take-over restored the seal's own
        # (past the fetcher), whose closings reach down to it.
        assert "restored a snapshot past the fetcher whose transaction closings reach down" in m.log_text()
    assert multi == ref.seal(low)
