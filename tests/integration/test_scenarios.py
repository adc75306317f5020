"""SPEC section 4 scenarios, each without and with mirrorguard (issue 6).

Destinations are the reference destination of tests/refdest - a STAND-IN for a stock
destination broker's mirror fetcher and log (SPEC 7), following Kafka's replication-path
producer-state rules; sources, state clusters and every client are real (Tansu brokers,
librdkafka producers and consumers). "Without mirrorguard" runs must show the corruption
(they assert it); "with mirrorguard" runs must show none.
"""

from __future__ import annotations

import time

import pytest

import harness
from harness import MIRRORGUARD_BIN
from mirror_harness import (  # noqa: F401 - mirror_factory is a fixture
    MirrorSpec,
    fold,
    map_pid,
    mirror_factory,
    same_fold_pair,
)
from scenario_support import (
    HIGH,
    NONE,
    PRESERVE_AWARE,
    PRESERVE_STOCK,
    SIGN_BIT,
    ReferenceDestination,
    anomalies,
    barriers,
    dump_kinds,
    make_hop,
    read_all,
    send_each,
    values,
)
from refdest import source_end_offset

T = "t"


@pytest.fixture
def refdest_factory(tmp_path):
    made: list[ReferenceDestination] = []

    def make(name: str, **kw) -> ReferenceDestination:
        d = ReferenceDestination(tmp_path, name, **kw)
        made.append(d)
        return d

    yield make
    harness.close_clients()
    for d in made:
        d.close()


def idem(bootstrap: str):
    return harness.new_producer(bootstrap, **{"enable.idempotence": True, "linger.ms": 0,
                                              "message.timeout.ms": 15000})


def txn_producer(bootstrap: str, txn_id: str):
    p = harness.new_producer(bootstrap, **{"transactional.id": txn_id, "linger.ms": 0,
                                           "message.timeout.ms": 15000, "transaction.timeout.ms": 60000})
    p.init_transactions(15)
    return p


def txn(p, values_, commit: bool | None, topic: str = T):
    """commit=None leaves the transaction open."""
    p.begin_transaction()
    for v in values_:
        p.produce(topic, value=v, partition=0)
    assert p.flush(15) == 0
    if commit is True:
        p.commit_transaction(15)
    elif commit is False:
        p.abort_transaction(15)


# =============================================================================
# 1. Active-passive A -> B, failover, local producers on B


@pytest.mark.parametrize("variant", [NONE, HIGH, SIGN_BIT, PRESERVE_AWARE, PRESERVE_STOCK], ids=lambda v: v.name)
def test_s1_active_passive_failover_local_producer(broker_factory, mirror_factory, refdest_factory, variant):
    a = broker_factory()
    harness.create_topics(a.bootstrap, [T])
    send_each(idem(a.bootstrap), T, [b"a-0", b"a-1", b"a-2"])  # PID 1, seq 0, 1, 2
    tp = txn_producer(a.bootstrap, "a-txn")  # PID 2
    txn(tp, [b"c-0"], commit=True)
    txn(tp, [b"open-0"], commit=None)  # still open at the failover
    a_end = source_end_offset(a.bootstrap, T)
    assert a_end == 6  # a-0..a-2, c-0, COMMIT, open-0

    b = refdest_factory("B", understands_mirror_pid_reset=variant.aware)
    hop = make_hop(broker_factory, mirror_factory, variant, a.bootstrap, b, T, "a-to-b")
    hop.link.catch_up(a_end)
    if variant.guarded:
        view = hop.seal()
        assert view["cut"] == a_end and view["seal_batches"] == 2, view
    b.promote()
    b.serve()

    # A local producer on the promoted B: librdkafka, idempotent, 5 single-record batches.
    local = send_each(idem(b.bootstrap), T, [b"b-%d" % i for i in range(5)])
    assert all(err is None for err, _ in local), local  # every one acknowledged
    acked = [off for _, off in local]
    log = b.partition(T)
    kinds = dump_kinds(MIRRORGUARD_BIN, log.path)
    psm = b.psm(T).snapshot()
    ru = read_all(b.bootstrap, T, "read_uncommitted")
    rc = read_all(b.bootstrap, T, "read_committed")
    fa = fold(a.cluster_id)

    if variant is NONE or variant is PRESERVE_STOCK:
        # The local producer drew PID 1, which A's mirrored producer used: its first three
        # batches are "duplicates" (same epoch, same sequence range) and are acknowledged
        # with A's offsets, never stored: silent loss.
        dups = [e["duplicate_of"] for e in b.produce_log]
        assert dups[:3] == [(0, 0), (1, 1), (2, 2)] and dups[3:] == [None, None], dups
        assert acked[:3] == [0, 1, 2]
        assert b"b-0" not in values(ru) and b"b-1" not in values(ru) and b"b-2" not in values(ru)
        assert [v for o, v in ru if o in acked[:3]] == [b"a-0", b"a-1", b"a-2"]
        assert psm[1]["last_sequence"] == 4 and psm[1]["epoch"] == 0
    if variant is NONE:
        # No seal: A's open transaction hangs on B; read_committed stalls at its first offset.
        assert kinds == [(0, "data", 1), (1, "data", 1), (2, "data", 1), (3, "data", 2), (4, "commit", 2),
                         (5, "data", 2), (6, "data", 1), (7, "data", 1)], kinds
        assert psm[2]["open_txn_first_offset"] == 5
        assert log.last_stable_offset == 5
        assert values(rc) == [b"a-0", b"a-1", b"a-2", b"c-0"]
        assert values(ru) == [b"a-0", b"a-1", b"a-2", b"c-0", b"open-0", b"b-3", b"b-4"]
        return

    # ---- with mirrorguard: the seal is in the log, as `mirrorguard dump` shows it
    pid1, pid2 = (1, 2) if variant.pid_mode == "preserve" else (map_pid(1, fa, 0, variant.layout),
                                                                  map_pid(2, fa, 0, variant.layout))
    assert kinds[:8] == [(0, "data", pid1), (1, "data", pid1), (2, "data", pid1), (3, "data", pid2),
                         (4, "commit", pid2), (5, "data", pid2), (6, "abort", pid2), (7, "barrier", -1)], kinds
    assert barriers(MIRRORGUARD_BIN, log.path) == [(7, a.cluster_id)]
    assert anomalies(hop.mg) == []
    if variant is PRESERVE_STOCK:
        return  # the loss above: preserve relies on a barrier-aware destination

    # No loss: every local record is stored where it was acknowledged.
    assert [e["duplicate_of"] for e in b.produce_log] == [None] * 5
    assert acked == [8, 9, 10, 11, 12]
    assert kinds[8:] == [(8 + i, "data", 1) for i in range(5)]
    assert [(o, v) for o, v in ru if o >= 8] == [(8 + i, b"b-%d" % i) for i in range(5)]
    assert psm[1]["last_sequence"] == 4 and psm[1]["batches"][0][2] == 8
    if variant is HIGH:
        # Stock destination: mapped PIDs are tracked (EOS-safe) and disjoint from local ones.
        assert sorted(psm) == [1, pid1, pid2] and psm[pid2]["open_txn_first_offset"] is None
        assert pid1 > 0 and pid1 >> 62 == 1
        assert b"open-0" not in values(rc)  # the seal's ABORT is honoured by read_committed
    elif variant is SIGN_BIT:
        # Where sign-bit matters: a stock broker gives negative PIDs no state at all, so the
        # sealed (aborted) transaction is not filtered for read_committed consumers.
        assert pid1 < -1 and sorted(psm) == [1]
        assert b"open-0" in values(rc)
    else:  # preserve + KIP-1279 destination: the barrier expired A's producers
        assert b.psm(T).barriers_applied == [7] and sorted(psm) == [1]
        assert b"open-0" not in values(rc)
    assert values(rc) == [v for v in values(ru) if v != b"open-0" or variant is SIGN_BIT]


def _producers(mg, topic: str = T) -> list[dict]:
    status, body = mg.request("GET", f"/v1/partitions/{topic}/0/producers", token=None)
    return body["producers"] if status == 200 else []


def _events(mg, mirror: str, kind: str) -> float:
    return mg.metrics().sum("mirrorguard_mirror_events_total", mirror=mirror, kind=kind)


# =============================================================================
# 2. Failback A -> B, then B -> A


@pytest.mark.parametrize("variant", [NONE, HIGH, PRESERVE_AWARE], ids=lambda v: v.name)
def test_s2_failback(broker_factory, mirror_factory, refdest_factory, variant):
    a = broker_factory()
    harness.create_topics(a.bootstrap, [T])
    send_each(idem(a.bootstrap), T, [b"a-0", b"a-1", b"a-2"])  # A's PID 1
    a_end = source_end_offset(a.bootstrap, T)

    # A -> B, failover to B, local producers on B.
    b = refdest_factory("B", understands_mirror_pid_reset=variant.aware)
    hop_ab = make_hop(broker_factory, mirror_factory, variant, a.bootstrap, b, T, "a-to-b")
    hop_ab.link.catch_up(a_end)
    if variant.guarded:
        hop_ab.seal()
    b.promote()
    b.serve()
    send_each(idem(b.bootstrap), T, [b"b1-0"])  # B's PID 1
    bt = txn_producer(b.bootstrap, "b-txn")  # B's PID 2
    txn(bt, [b"bt-0"], commit=True)
    b_end = b.partition(T).leo

    # Failback: A's log (its own data, rebuilt like log recovery: REPLICATION origin) then
    # A mirrors B from A's log end offset (the common prefix).
    a2 = refdest_factory("A-as-destination", understands_mirror_pid_reset=variant.aware, cluster_id=a.cluster_id,
                         first_local_pid=2)  # Tansu A handed out PID 1 already
    own = a2.mirror_from(a.bootstrap, T)
    own.catch_up(a_end)
    own.close()
    hop_ba = make_hop(broker_factory, mirror_factory, variant, b.bootstrap, a2, T, "b-to-a")
    assert hop_ba.link.position == a_end
    seen0 = _events(hop_ba.mg, "b-to-a", "barrier_seen") if variant.guarded else 0
    hop_ba.link.catch_up(b_end)
    if variant.guarded:
        # A received B's barrier in the data: mirrorguard expired its producer state there.
        assert _events(hop_ba.mg, "b-to-a", "barrier_seen") - seen0 >= 1
        origins = {p["origin_cluster"] for p in _producers(hop_ba.mg)}
        assert origins == {b.cluster_id}, _producers(hop_ba.mg)
        assert anomalies(hop_ba.mg) == []
        hop_ba.seal()  # A stops mirroring B: A's own barrier
    a2.promote()
    a2.serve()
    # A new local producer on A after failback: A's counter hands out PID 2.
    local = send_each(idem(a2.bootstrap), T, [b"x-0", b"x-1"])
    assert all(e is None for e, _ in local)
    log = a2.partition(T)
    ru = values(read_all(a2.bootstrap, T, "read_uncommitted"))
    bars = barriers(MIRRORGUARD_BIN, log.path)
    if variant is NONE:
        # B's local PID 1 was "a duplicate" of A's mirrored PID 1 on B (S1), and on A the new
        # producer's PID 2 meets B's transactional PID 2: x-0 is acknowledged, never stored.
        assert b"b1-0" not in ru and bars == []
        assert a2.produce_log[0]["duplicate_of"] is not None and b"x-0" not in ru and b"x-1" in ru
        assert a2.psm(T).snapshot()[2]["last_sequence"] == 1
        return
    assert [x["duplicate_of"] for x in a2.produce_log] == [None, None]
    assert ru == [b"a-0", b"a-1", b"a-2", b"b1-0", b"bt-0", b"x-0", b"x-1"]
    # Two barriers in A's log: B's (sealing A -> B, source A) and A's own (sealing B -> A, source B).
    assert bars == [(a_end, a.cluster_id), (b_end, b.cluster_id)], bars
    psm = a2.psm(T)
    if variant is PRESERVE_AWARE:
        assert psm.barriers_applied == [a_end, b_end] and sorted(psm.snapshot()) == [2]
    else:
        fb = fold(b.cluster_id)
        assert sorted(psm.snapshot()) == [1, 2, map_pid(1, fb), map_pid(2, fb)]


# =============================================================================
# 3. Fan-out A -> B and A -> C


@pytest.mark.parametrize("variant", [NONE, HIGH], ids=lambda v: v.name)
def test_s3_fan_out(broker_factory, mirror_factory, refdest_factory, variant):
    a = broker_factory()
    harness.create_topics(a.bootstrap, [T])
    send_each(idem(a.bootstrap), T, [b"a-0", b"a-1", b"a-2"])
    tp = txn_producer(a.bootstrap, "a-txn")
    txn(tp, [b"open-0"], commit=None)  # offset 3, open
    b = refdest_factory("B")
    c = refdest_factory("C")
    hop_b = make_hop(broker_factory, mirror_factory, variant, a.bootstrap, b, T, "a-to-b")
    hop_c = make_hop(broker_factory, mirror_factory, variant, a.bootstrap, c, T, "a-to-c")
    hop_b.link.catch_up(4)
    hop_c.link.catch_up(4)
    # Fail over B only.
    if variant.guarded:
        assert hop_b.seal()["cut"] == 4
        assert hop_c.mg.partition(T)["state"] == "MIRRORING"
    b.promote()
    # A goes on; C keeps mirroring: A commits, writes more, then C fails over too.
    tp.commit_transaction(15)
    send_each(idem(a.bootstrap), T, [b"a-3"])
    hop_c.link.catch_up(6)
    if variant.guarded:
        assert hop_c.seal()["cut"] == 6
    c.promote()
    for d in (b, c):
        d.serve()
        send_each(idem(d.bootstrap), T, [b"local-0", b"local-1", b"local-2", b"local-3"])
    kb, kc = dump_kinds(MIRRORGUARD_BIN, b.segment(T)), dump_kinds(MIRRORGUARD_BIN, c.segment(T))
    rc_b = values(read_all(b.bootstrap, T, "read_committed"))
    rc_c = values(read_all(c.bootstrap, T, "read_committed"))
    if variant is NONE:
        for d in (b, c):  # both lose the local producer's first three batches
            assert [x["duplicate_of"] is not None for x in d.produce_log] == [True, True, True, False]
        assert rc_b == [b"a-0", b"a-1", b"a-2"]  # B: A's transaction hangs forever
        assert b"open-0" in rc_c and b"local-0" not in rc_c
        return
    # Independent barriers at each destination's own cut; independent producer state.
    assert [k for _, k, _ in kb[3:6]] == ["data", "abort", "barrier"] and kb[5][0] == 5
    assert [k for _, k, _ in kc[3:7]] == ["data", "commit", "data", "barrier"] and kc[6][0] == 6
    assert barriers(MIRRORGUARD_BIN, b.segment(T)) == [(5, a.cluster_id)]
    assert barriers(MIRRORGUARD_BIN, c.segment(T)) == [(6, a.cluster_id)]
    assert rc_b == [b"a-0", b"a-1", b"a-2"] + [b"local-%d" % i for i in range(4)]
    assert rc_c == [b"a-0", b"a-1", b"a-2", b"open-0", b"a-3"] + [b"local-%d" % i for i in range(4)]
    for d in (b, c):
        assert [x["duplicate_of"] for x in d.produce_log] == [None] * 4
    assert anomalies(hop_b.mg) == [] and anomalies(hop_c.mg) == []
    assert hop_b.mg.partition(T)["cut"] == 4 and hop_c.mg.partition(T)["cut"] == 6


# =============================================================================
# 4. Fan-in: A -> C and B -> C, different topics; the same topic fed by both in turn


@pytest.mark.parametrize("variant", [NONE, HIGH], ids=lambda v: v.name)
def test_s4_fan_in_different_topics(broker_factory, mirror_factory, refdest_factory, variant):
    a, b = broker_factory(), broker_factory()
    harness.create_topics(a.bootstrap, ["ta"])
    harness.create_topics(b.bootstrap, ["tb"])
    send_each(idem(a.bootstrap), "ta", [b"a-0", b"a-1"])  # PID 1 on A
    pb = idem(b.bootstrap)
    send_each(pb, "tb", [b"b-0", b"b-1"])  # PID 1 on B
    c = refdest_factory("C")
    mg = None
    if variant.guarded:
        state = broker_factory()
        harness.create_topics(state.bootstrap, ["ta", "tb"])
        mg = mirror_factory(state.bootstrap, [MirrorSpec("from-a", a.bootstrap), MirrorSpec("from-b", b.bootstrap)])
        mg.wait_sources_known()
        la = c.mirror_from(mg.mirrors["from-a"].bootstrap, "ta")
        lb = c.mirror_from(mg.mirrors["from-b"].bootstrap, "tb")
    else:
        la, lb = c.mirror_from(a.bootstrap, "ta"), c.mirror_from(b.bootstrap, "tb")
    la.catch_up(2)
    lb.catch_up(2)
    # Per-partition producer state: the same raw PID in two partitions does not meet.
    sa, sb = c.psm("ta").snapshot(), c.psm("tb").snapshot()
    assert len(sa) == len(sb) == 1 and sa[next(iter(sa))]["last_sequence"] == 1
    if not variant.guarded:
        assert set(sa) == set(sb) == {1}  # harmless while the partitions stay apart
        return
    assert set(sa) == {map_pid(1, fold(a.cluster_id))} and set(sb) == {map_pid(1, fold(b.cluster_id))}
    # Stop only ta: the barrier lands in ta-0 only; tb keeps mirroring.
    st, _ = mg.post("stop", "from-a", "ta")
    assert st == 200
    la.follow(lambda _l: mg.partition("ta")["state"] == "STOPPED", 15, "ta STOPPED")
    send_each(pb, "tb", [b"b-2"])
    lb.catch_up(3)
    assert mg.partition("tb")["state"] == "MIRRORING"
    assert barriers(MIRRORGUARD_BIN, c.segment("ta")) == [(2, a.cluster_id)]
    assert barriers(MIRRORGUARD_BIN, c.segment("tb")) == []
    assert c.psm("tb").snapshot()[map_pid(1, fold(b.cluster_id))]["last_sequence"] == 2
    assert anomalies(mg) == []


@pytest.mark.parametrize("variant", [NONE, HIGH], ids=lambda v: v.name)
def test_s4_fan_in_same_topic_source_reassignment(broker_factory, mirror_factory, refdest_factory, variant):
    a, b = broker_factory(), broker_factory()
    for br in (a, b):
        harness.create_topics(br.bootstrap, [T])
    pa, pb = idem(a.bootstrap), idem(b.bootstrap)
    c = refdest_factory("C")
    mg = None
    if variant.guarded:
        state = broker_factory()
        harness.create_topics(state.bootstrap, [T])
        mg = mirror_factory(state.bootstrap, [MirrorSpec("from-a", a.bootstrap), MirrorSpec("from-b", b.bootstrap)])
        # (no wait_sources_known: both mirrors feed the one destination partition t-0)
        addr = {"a": mg.mirrors["from-a"].bootstrap, "b": mg.mirrors["from-b"].bootstrap}
    else:
        addr = {"a": a.bootstrap, "b": b.bootstrap}
    # C mirrors t from A, then from B, then from A again (offsets relabelled: new source).
    send_each(pa, T, [b"a-0", b"a-1", b"a-2"])
    l1 = c.mirror_from(addr["a"], T, rebase=True)
    l1.catch_up(3)
    l1.close()
    send_each(pb, T, [b"b-0", b"b-1"])
    l2 = c.mirror_from(addr["b"], T, rebase=True)
    l2.catch_up(2)
    l2.close()
    send_each(pa, T, [b"a-3"])
    l3 = c.mirror_from(addr["a"], T, rebase=True, source_offset=3)
    l3.catch_up(4)
    l3.close()
    psm = c.psm(T)
    assert [b.producer_id for b in c.partition(T).batches][:3] == [
        1 if not variant.guarded else map_pid(1, fold(a.cluster_id))] * 3
    if not variant.guarded:
        # One PSM entry for two producers: B's sequence 0 after A's 2 (same epoch) and A's 3
        # after B's 1 were accepted without a word; the entry holds both producers' batches.
        snap = psm.snapshot()
        assert list(snap) == [1] and psm.warnings == []
        # (firstSeq, lastSeq, lastOffset) of the last 5 batches: A 1, A 2, B 0, B 1, A 3
        assert snap[1]["batches"] == [(1, 1, 1), (2, 2, 2), (0, 0, 3), (1, 1, 4), (3, 3, 5)]
        return
    fa, fb = map_pid(1, fold(a.cluster_id)), map_pid(1, fold(b.cluster_id))
    snap = psm.snapshot()
    assert sorted(snap) == sorted([fa, fb])
    assert [x[:2] for x in snap[fa]["batches"]] == [(0, 0), (1, 1), (2, 2), (3, 3)]
    assert [x[:2] for x in snap[fb]["batches"]] == [(0, 0), (1, 1)]
    assert psm.warnings == [] and anomalies(mg) == []


# =============================================================================
# 5. Chain A -> B -> C, failover at B, new local producers on B with A's PIDs

DAY_MS = 86_400_000


@pytest.mark.parametrize("variant", [NONE, HIGH, PRESERVE_AWARE], ids=lambda v: v.name)
def test_s5_chain_failover_at_b(broker_factory, mirror_factory, refdest_factory, variant):
    a = broker_factory()
    harness.create_topics(a.bootstrap, [T])
    send_each(idem(a.bootstrap), T, [b"a-0", b"a-1", b"a-2"])  # A PID 1, epoch 0, seq 0..2 @0..2
    t2 = txn_producer(a.bootstrap, "a-t2")  # A PID 2, epoch 0
    txn(t2, [b"a-open"], commit=None)  # @3, still open at the failover
    first = txn_producer(a.bootstrap, "a-t3")  # A PID 3, epoch 0 ...
    first.close()
    t3 = txn_producer(a.bootstrap, "a-t3")  # ... re-initialised: PID 3, epoch 1
    txn(t3, [b"a-t3"], commit=True)  # @4, COMMIT @5
    a_end = source_end_offset(a.bootstrap, T)
    assert a_end == 6

    b = refdest_factory("B", understands_mirror_pid_reset=variant.aware)
    c = refdest_factory("C", understands_mirror_pid_reset=variant.aware)
    hop_ab = make_hop(broker_factory, mirror_factory, variant, a.bootstrap, b, T, "a-to-b")
    hop_ab.link.catch_up(a_end)
    b.serve()
    hop_bc = make_hop(broker_factory, mirror_factory, variant, b.bootstrap, c, T, "b-to-c")
    hop_bc.link.catch_up(a_end)
    assert [x.producer_epoch for x in b.partition(T).batches if x.base_offset == 4] == [1]

    # Failover at B; B's periodic producer-id expiration runs a day later
    # (ProducerStateManager.removeExpiredProducers: idle PIDs without an open transaction).
    if variant.guarded:
        hop_ab.seal()
    b.promote()
    b.psm(T).remove_expired_producers(int(time.time() * 1000) + DAY_MS + 3_600_000)
    # New local producers on B: PIDs 1, 2, 3 from B's own counter, epoch 0.
    l1 = send_each(idem(b.bootstrap), T, [b"b1-0", b"b1-1"])
    l2p = txn_producer(b.bootstrap, "b-t2")
    txn(l2p, [b"b2-0"], commit=True)
    l3p = txn_producer(b.bootstrap, "b-t3")
    txn(l3p, [b"b3-0"], commit=True)
    assert all(e is None for e, _ in l1)
    b_end = b.partition(T).leo
    hop_bc.link.catch_up(b_end)
    assert c.partition(T).leo == b_end and c.partition(T).failed is None
    psm = c.psm(T)
    snap = psm.snapshot()
    rc = values(read_all(c.bootstrap if c.server else c.serve().bootstrap, T, "read_committed"))

    if variant is NONE:
        # 1. same epoch, wrong sequence: B's PID 1 seq 0 after A's seq 2, accepted silently;
        #    the entry "regressed" to B's sequences.
        assert snap[1]["epoch"] == 0 and snap[1]["last_sequence"] == 1
        assert [x[:2] for x in snap[1]["batches"]] == [(0, 0), (1, 1), (2, 2), (0, 0), (1, 1)]
        # 2. lower epoch: B's PID 3 epoch 0 after A's epoch 1: accepted with the WARN only,
        #    the stored epoch goes back from 1 to 0.
        b3_off = next(x.base_offset for x in c.partition(T).batches
                      if x.producer_id == 3 and not x.is_control and x.base_offset > a_end)
        assert psm.warnings == [f"Epoch of producer 3 at offset {b3_off} in t-0 is 0, which is smaller than "
                                f"the last seen epoch 1"]
        assert snap[3]["epoch"] == 0
        # 3. B's PID 2 COMMIT closed A's open transaction (B's own data was a "duplicate" of
        #    A's batch on B and was never stored): A's never-committed record is now committed.
        closed = [t for t in psm.completed_txns if t.producer_id == 2]
        assert len(closed) == 1 and closed[0].first_offset == 3 and not closed[0].is_aborted
        assert b"a-open" in rc and b"b2-0" not in rc
        assert b.produce_log[2]["duplicate_of"] == (3, 3)
        return

    # With mirrorguard: none of the three.
    assert psm.warnings == [] and anomalies(hop_ab.mg) == [] and anomalies(hop_bc.mg) == []
    assert b"a-open" not in rc and {b"b2-0", b"b3-0", b"b1-0", b"b1-1"} <= set(rc)
    assert [x.is_aborted for x in psm.completed_txns if x.first_offset == 3] == [True]
    bars = barriers(MIRRORGUARD_BIN, c.segment(T))
    assert bars == [(7, a.cluster_id)], bars  # B's seal travelled down the chain as is
    assert dump_kinds(MIRRORGUARD_BIN, c.segment(T))[6][1] == "abort"
    if variant is HIGH:
        fa, fb = fold(a.cluster_id), fold(b.cluster_id)
        assert _events(hop_bc.mg, "b-to-c", "barrier_seen") >= 1
        assert sorted(snap) == sorted([map_pid(p, fa) for p in (1, 2, 3)] + [map_pid(p, fb) for p in (1, 2, 3)])
        assert snap[map_pid(1, fa)]["last_sequence"] == 2 and snap[map_pid(3, fa)]["epoch"] == 1
        assert snap[map_pid(1, fb)]["last_sequence"] == 1 and snap[map_pid(3, fb)]["epoch"] == 0
    else:  # preserve + KIP-1279 destinations: the barrier expired A's producers at B and C
        assert psm.barriers_applied == [7] and sorted(snap) == [1, 2, 3]
        assert snap[1]["batches"][0][2] > 7 and snap[3]["epoch"] == 0


# =============================================================================
# 6. Same-region collision: two source clusters with the same fold, PID 1 active in both


@pytest.mark.parametrize("variant", [NONE, HIGH, SIGN_BIT], ids=lambda v: v.name)
def test_s6_same_region_collision_salt_survives_restart(broker_factory, mirror_factory, refdest_factory, variant):
    cid_a, cid_b = same_fold_pair()
    a, b = broker_factory(cid=cid_a), broker_factory(cid=cid_b)
    for br in (a, b):
        harness.create_topics(br.bootstrap, [T])
    pa, pb = idem(a.bootstrap), idem(b.bootstrap)
    send_each(pa, T, [b"a-0", b"a-1"])
    send_each(pb, T, [b"b-0", b"b-1"])
    c = refdest_factory("C")
    mg = state = None
    if variant.guarded:
        state = broker_factory()
        harness.create_topics(state.bootstrap, [T])
        mg = mirror_factory(state.bootstrap, [MirrorSpec("from-a", a.bootstrap, layout=variant.layout),
                                              MirrorSpec("from-b", b.bootstrap, layout=variant.layout)])
        addr = lambda n: mg.mirrors[f"from-{n}"].bootstrap  # noqa: E731
    else:
        addr = {"a": a.bootstrap, "b": b.bootstrap}.get
    la = c.mirror_from(addr("a"), T, rebase=True)
    la.catch_up(2)
    la.close()
    lb = c.mirror_from(addr("b"), T, rebase=True)
    lb.catch_up(2)
    lb.close()
    pids = [x.producer_id for x in c.partition(T).batches]
    if not variant.guarded:
        assert pids == [1, 1, 1, 1]
        snap = c.psm(T).snapshot()
        assert [x[:2] for x in snap[1]["batches"]] == [(0, 0), (1, 1), (0, 0), (1, 1)] and c.psm(T).warnings == []
        return
    fl = fold(cid_a)
    assert fold(cid_b) == fl
    plain = map_pid(1, fl, 0, variant.layout)
    assert pids[:2] == [plain, plain] and pids[2] == pids[3] != plain
    salted = pids[2]
    cols = mg.get("/v1/collisions")["collisions"]
    assert len(cols) == 1 and cols[0]["source_cluster"] == cid_b and cols[0]["mapped_pid"] == salted
    salt = cols[0]["salt"]
    assert salted == map_pid(1, fl, salt, variant.layout)
    from mirror_harness import read_state_records

    recs = [r for r in read_state_records(state.bootstrap) if r.type == 3]
    assert len(recs) == 1 and recs[0].value["salt"] == salt and recs[0].key["source_cluster_id"] == cid_b
    # Restart mirrorguard: the salt comes back from __mirror_state and is applied again.
    mg.restart()
    send_each(pb, T, [b"b-2"])
    lb2 = c.mirror_from(addr("b"), T, rebase=True, source_offset=2)
    lb2.catch_up(3)
    lb2.close()
    send_each(pa, T, [b"a-2"])
    la2 = c.mirror_from(addr("a"), T, rebase=True, source_offset=2)
    la2.catch_up(3)
    la2.close()
    assert [x.producer_id for x in c.partition(T).batches][4:] == [salted, plain]
    assert len([r for r in read_state_records(state.bootstrap) if r.type == 3]) == 1
    snap = c.psm(T).snapshot()
    if variant is HIGH:
        assert sorted(snap) == sorted([plain, salted])
        assert snap[salted]["last_sequence"] == 2 and snap[plain]["last_sequence"] == 2
    else:
        assert snap == {}  # sign-bit PIDs are negative: a stock broker keeps no state for them
    assert c.psm(T).warnings == [] and anomalies(mg) == []
