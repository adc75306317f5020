"""SPEC section 4 scenarios, each without and with mirrorguard, on Kafka's own engine.

Sources are Apache Kafka 4.4 clusters (fresh per test, so their PIDs start at 0 like the
destination's); the destination mirrors into the reference destination of kafka_dest.py
(Kafka's UnifiedLog, appendAsFollower, a broker-like fetcher with fetch sessions) and is
promoted by handing its partition directory to a real Kafka 4.4 broker, which then serves
local librdkafka producers and read_committed consumers. The [state] cluster is the
session's shared Kafka node. "Without mirrorguard" runs assert the corruption as Kafka's
engine produces it; "with mirrorguard" runs assert none of it (region layouts; preserve
mode on a stock engine is shown not to be clean). docs/scenarios.md tabulates the results.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError

import harness
from harness import MIRRORGUARD_BIN
from kafka_dest import kafka_dest_factory, prepare_promotion, promote  # noqa: F401 - fixture
from mirror_harness import fold, map_pid, mirror_factory, read_state_records, same_fold_pair  # noqa: F401
from scenario_support import (
    HIGH,
    NONE,
    PRESERVE_STOCK,
    SIGN_BIT,
    anomalies,
    barriers,
    dumps_agree,
    end_offset,
    idem,
    kinds,
    make_hop,
    mirror_spec,
    read_all,
    send_each,
    start_mirrorguard,
    txn,
    txn_producer,
    values,
)
from kafka_dest import data_batch


def cid() -> str:
    """A cluster id kafka-storage accepts as an argument (not starting with '-')."""
    while True:
        c = harness.cluster_id()
        if not c.startswith("-"):
            return c


def fatal_code(result) -> int | None:
    err = result[0]
    if err is None:
        return None
    assert err.fatal(), err
    return err.code()


# =============================================================================
# 1. Active-passive A -> B, failover, local producers on B


@pytest.mark.parametrize("variant", [NONE, HIGH, SIGN_BIT, PRESERVE_STOCK], ids=lambda v: v.name)
def test_s1_active_passive_failover_local_producer(kafka1, kafka_factory, kafka_dest_factory, mirror_factory,
                                                   variant):
    T = harness.topic_name("s1")
    a = kafka_factory(cluster_id=cid(), name="A")
    b = kafka_factory(cluster_id=cid(), name="B")
    harness.create_topics(a.bootstrap, [T])
    send_each(idem(a.bootstrap), T, [b"a-0", b"a-1", b"a-2"])  # A's PID 0, seq 0..2 @0..2
    tp = txn_producer(a.bootstrap, "a-txn")  # A's PID 1
    txn(tp, T, [b"c-0"], commit=True)  # @3, COMMIT @4
    txn(tp, T, [b"open-0"], commit=None)  # @5, still open at the failover
    # Markers are written after commit_transaction returns: wait for A's log end.
    harness.wait_until(lambda: end_offset(a.bootstrap, T) == 6, 15, interval=0.1, what="A's end offset 6")

    topic_id = prepare_promotion(b, T)
    dest = kafka_dest_factory("B")
    dest.open(T, topic_id=topic_id)
    # With mirrorguard, B's local producers go through its produce guard (in front of B).
    hop = make_hop(mirror_factory, variant, a, dest, T, "a-to-b", state_bootstrap=kafka1.bootstrap,
                   guard_upstream=b.bootstrap)
    hop.catch_up(6)
    fa = fold(a.cluster_id)
    pid0, pid1 = (0, 1) if variant.pid_mode in (None, "preserve") else (
        map_pid(0, fa, 0, variant.layout), map_pid(1, fa, 0, variant.layout))
    if variant.guarded:
        view = hop.seal()
        assert view["cut"] == 6 and view["seal_batches"] == 2, view
    hop.stop()
    st = dest.state(T)
    assert st["log_end_offset"] == (8 if variant.guarded else 6)

    if variant in (NONE, PRESERVE_STOCK):
        # In place (the stand-in's own log, Kafka's CLIENT path): B's first local producer
        # draws PID 0, A's mirrored producer's. Its batches seq 0, 1, 2 are "duplicates" of
        # A's: acknowledged with A's offsets, nothing written.
        for seq in range(3):
            r = dest.produce(T, data_batch([b"b-%d" % seq], pid=0, epoch=0, seq=seq))
            assert (r["error"], r["stored"], r["first_offset"]) == (None, False, seq), r
        assert dest.state(T)["log_end_offset"] == st["log_end_offset"]

    promote(dest, b, T)
    # Local producers: straight to B without mirrorguard, through the guard with it (STOPPED:
    # the guard forwards; refused before the seal, see test_produce_guard.py).
    local_bootstrap = hop.mg.guard_bootstrap if variant.guarded else b.bootstrap
    local = send_each(idem(local_bootstrap), T, [b"b-%d" % i for i in range(5)])
    if variant.guarded:
        refused = hop.mg.metrics().sum("mirrorguard_produce_refused_total")
        produced = hop.mg.metrics().sum("mirrorguard_requests_total", listener="guard", api="Produce")
        assert refused == 0 and produced >= 1, (refused, produced)
    ru = read_all(b.bootstrap, T, "read_uncommitted")
    rc = read_all(b.bootstrap, T, "read_committed")
    k = kinds(MIRRORGUARD_BIN, b.nodes[0].data_dir / f"{T}-0")
    assert dumps_agree(MIRRORGUARD_BIN, b.nodes[0].data_dir / f"{T}-0") == len(k)

    if variant in (NONE, PRESERVE_STOCK):
        # On the broker the state came back from the producer snapshot (last batch only):
        # B's PID 0 at seq 0 after A's seq 2 is out of order, a fatal error for the local
        # producer: it cannot write at all.
        assert len(local) == 1 and fatal_code(local[0]) == KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, local
        assert not [v for v in values(ru) if v.startswith(b"b-")]
    if variant is NONE:
        assert st["producers"][1]["open_txn_first_offset"] == 5 and st["last_stable_offset"] == 5
        assert k == [(0, "data", 0), (1, "data", 0), (2, "data", 0), (3, "data", 1), (4, "commit", 1),
                     (5, "data", 1)], k
        # No seal: A's open transaction hangs on B; read_committed stops at its first offset.
        assert values(rc) == [b"a-0", b"a-1", b"a-2", b"c-0"]
        assert values(ru) == [b"a-0", b"a-1", b"a-2", b"c-0", b"open-0"]
        return

    # ---- with mirrorguard: the seal is in the log
    assert k[:8] == [(0, "data", pid0), (1, "data", pid0), (2, "data", pid0), (3, "data", pid1),
                     (4, "commit", pid1), (5, "data", pid1), (6, "abort", pid1), (7, "barrier", -1)], k
    assert barriers(MIRRORGUARD_BIN, b.nodes[0].data_dir / f"{T}-0") == [(7, a.cluster_id)]
    assert anomalies(hop.mg) == []
    if variant is PRESERVE_STOCK:
        # The stock engine ignored the barrier (PID -1 control batch): A's PID 0 is still
        # tracked, so the local producer collides (above). The ABORT did close A's txn.
        assert sorted(st["producers"]) == [0, 1] and st["last_stable_offset"] == 8
        assert values(rc) == [b"a-0", b"a-1", b"a-2", b"c-0"]
        return

    # No loss: every local record is stored where it was acknowledged.
    assert [e for e, _ in local] == [None] * 5 and [o for _, o in local] == [8, 9, 10, 11, 12], local
    assert k[8:] == [(8 + i, "data", 0) for i in range(5)]
    assert [(o, v) for o, v in ru if o >= 8] == [(8 + i, b"b-%d" % i) for i in range(5)]
    if variant is HIGH:
        # Mapped PIDs are tracked (EOS-safe) and disjoint from the broker's own.
        assert sorted(st["producers"]) == sorted([pid0, pid1]) and pid0 >> 62 == 1
        assert st["producers"][pid1]["open_txn_first_offset"] is None and st["last_stable_offset"] == 8
        assert values(rc) == [b"a-0", b"a-1", b"a-2", b"c-0"] + [b"b-%d" % i for i in range(5)]
    else:
        # sign-bit: a stock engine keeps no state for negative PIDs, so the sealed (aborted)
        # transaction is not filtered for read_committed consumers.
        assert pid0 < -1 and st["producers"] == {} and st["aborted_txns"] == []
        assert values(rc) == [b"a-0", b"a-1", b"a-2", b"c-0", b"open-0"] + [b"b-%d" % i for i in range(5)]


def _local_in_place(dest, topic: str, pid: int, seqs: list[int], epoch: int = 0) -> list[dict]:
    """A local producer's single-record batches on the destination's own log, CLIENT path
    (an in-place promotion): [{error, stored, first_offset}] per batch."""
    return [dest.produce(topic, data_batch([b"local-%d" % s], pid=pid, epoch=epoch, seq=s)) for s in seqs]


# =============================================================================
# 3. Fan-out A -> B and A -> C (one stand-in process hosts both destinations' partitions)


@pytest.mark.parametrize("variant", [NONE, HIGH], ids=lambda v: v.name)
def test_s3_fan_out(kafka1, kafka_factory, kafka_dest_factory, mirror_factory, variant):
    T = harness.topic_name("s3")
    TB, TC = f"b.{T}", f"c.{T}"  # B's and C's copies of A's T
    a = kafka_factory(cluster_id=cid(), name="A")
    harness.create_topics(a.bootstrap, [T])
    send_each(idem(a.bootstrap), T, [b"a-0", b"a-1", b"a-2"])  # PID 0
    tp = txn_producer(a.bootstrap, "a-txn")  # PID 1
    txn(tp, T, [b"open-0"], commit=None)  # @3, open
    dest = kafka_dest_factory("BC")
    hop_b = make_hop(mirror_factory, variant, a, dest, TB, "a-to-b", state_bootstrap=kafka1.bootstrap, source_topic=T)
    # C's mirrorguard keeps its state on A's cluster: on the shared state node both would
    # find T under one topic id (issue 13 item 6) and C's would inherit B's seal.
    hop_c = make_hop(mirror_factory, variant, a, dest, TC, "a-to-c", state_bootstrap=a.bootstrap, source_topic=T)
    hop_b.catch_up(4)
    hop_c.catch_up(4)
    if variant.guarded:
        hop_b.mirror, hop_c.mirror = "a-to-b", "a-to-c"
        assert _seal(hop_b, T)["cut"] == 4
        assert hop_c.mg.partition(T)["state"] == "MIRRORING"
    hop_b.stop()
    # A goes on; C keeps mirroring: A commits, writes more, then C fails over too.
    tp.commit_transaction(15)
    send_each(idem(a.bootstrap), T, [b"a-3"])  # PID 2
    harness.wait_until(lambda: end_offset(a.bootstrap, T) == 6, 15, interval=0.1, what="A's end offset 6")
    hop_c.catch_up(6)
    if variant.guarded:
        assert _seal(hop_c, T)["cut"] == 6
    hop_c.stop()
    # Local producers on both: B's and C's first PID is 0, A's idempotent producer's.
    local = {t: _local_in_place(dest, t, 0, [0, 1, 2, 3]) for t in (TB, TC)}
    sb, sc = dest.state(TB), dest.state(TC)
    if variant is NONE:
        for t in (TB, TC):  # both acknowledge the first three with A's offsets, store nothing
            assert [(r["stored"], r["first_offset"]) for r in local[t][:3]] == [(False, 0), (False, 1), (False, 2)]
            assert local[t][3]["stored"] and local[t][3]["error"] is None
        assert sb["last_stable_offset"] == 3 and sb["producers"][1]["open_txn_first_offset"] == 3  # hangs on B
        assert sc["last_stable_offset"] == sc["log_end_offset"]
        return
    # Independent seals at each destination's own cut; independent producer state.
    kb, kc = kinds(MIRRORGUARD_BIN, dest.partition_dir(TB)), kinds(MIRRORGUARD_BIN, dest.partition_dir(TC))
    assert [x for _, x, _ in kb[3:6]] == ["data", "abort", "barrier"] and kb[5][0] == 5
    assert [x for _, x, _ in kc[3:7]] == ["data", "commit", "data", "barrier"] and kc[6][0] == 6
    assert barriers(MIRRORGUARD_BIN, dest.partition_dir(TB)) == [(5, a.cluster_id)]
    assert barriers(MIRRORGUARD_BIN, dest.partition_dir(TC)) == [(6, a.cluster_id)]
    for t, first in ((TB, 6), (TC, 7)):
        assert [(r["error"], r["stored"], r["first_offset"]) for r in local[t]] == [
            (None, True, first + i) for i in range(4)], local[t]
    assert sb["last_stable_offset"] == sb["log_end_offset"] == 10
    assert sc["last_stable_offset"] == sc["log_end_offset"] == 11
    assert [a_["type"] for a_ in sb["markers"]] == ["ABORT", "TYPE_7"]
    assert sb["markers"][0]["closed_txn_first_offset"] == 3
    assert anomalies(hop_b.mg) == [] and anomalies(hop_c.mg) == []


def _seal(hop, source_topic: str, timeout: float = 20.0) -> dict:
    """Seal of a hop whose destination topic differs from the source topic."""
    status, body = hop.mg.post("stop", hop.mirror, source_topic)
    assert status == 200, (status, body)
    harness.wait_until(lambda: hop.mg.partition(source_topic)["state"] == "STOPPED", timeout, interval=0.05,
                       what=f"{hop.mirror} {source_topic} STOPPED")
    view = hop.mg.partition(source_topic)
    hop.catch_up(view["cut"] + view["seal_batches"], timeout)
    return view


# =============================================================================
# 4. Fan-in: A -> C and B -> C, different topics; the same topic fed by both in turn


@pytest.mark.parametrize("variant", [NONE, HIGH], ids=lambda v: v.name)
def test_s4_fan_in_different_topics(kafka1, kafka_factory, kafka_dest_factory, mirror_factory, variant):
    ta, tb = harness.topic_name("ta"), harness.topic_name("tb")
    a, b = kafka_factory(cluster_id=cid(), name="A"), kafka_factory(cluster_id=cid(), name="B")
    harness.create_topics(a.bootstrap, [ta])
    harness.create_topics(b.bootstrap, [tb])
    send_each(idem(a.bootstrap), ta, [b"a-0", b"a-1"])  # PID 0 on A
    pb = idem(b.bootstrap)
    send_each(pb, tb, [b"b-0", b"b-1"])  # PID 0 on B
    c = kafka_dest_factory("C")
    mg = None
    if variant.guarded:
        mg = start_mirrorguard(mirror_factory, kafka1.bootstrap, [mirror_spec("from-a", a, variant, c),
                                                                 mirror_spec("from-b", b, variant, c)], [ta, tb])
        mg.wait_sources_known()
        fa = c.mirror("from-a", mg.mirrors["from-a"].bootstrap, [(ta, 0)])
        fb = c.mirror("from-b", mg.mirrors["from-b"].bootstrap, [(tb, 0)])
    else:
        fa, fb = c.mirror("from-a", a.bootstrap, [(ta, 0)]), c.mirror("from-b", b.bootstrap, [(tb, 0)])
    fa.catch_up(ta, 2)
    fb.catch_up(tb, 2)
    # Per-partition producer state: the same raw PID in two partitions does not meet.
    sa, sb = c.state(ta)["producers"], c.state(tb)["producers"]
    assert len(sa) == len(sb) == 1 and next(iter(sa.values()))["last_sequence"] == 1
    if not variant.guarded:
        assert set(sa) == set(sb) == {0}  # harmless while the partitions stay apart
        return
    assert set(sa) == {map_pid(0, fold(a.cluster_id))} and set(sb) == {map_pid(0, fold(b.cluster_id))}
    # Stop only ta: the barrier lands in ta-0 only; tb keeps mirroring.
    st, _ = mg.post("stop", "from-a", ta)
    assert st == 200
    harness.wait_until(lambda: mg.partition(ta)["state"] == "STOPPED", 20, interval=0.05, what="ta STOPPED")
    fa.catch_up(ta, 3)
    send_each(pb, tb, [b"b-2"])
    fb.catch_up(tb, 3)
    assert mg.partition(tb)["state"] == "MIRRORING"
    assert barriers(MIRRORGUARD_BIN, c.partition_dir(ta)) == [(2, a.cluster_id)]
    assert barriers(MIRRORGUARD_BIN, c.partition_dir(tb)) == []
    assert c.state(tb)["producers"][map_pid(0, fold(b.cluster_id))]["last_sequence"] == 2
    assert anomalies(mg) == []


def _in_turn(c, addr, topic: str, turns: list[tuple[str, int, int]]) -> None:
    """C mirrors `topic` from one source after the other (a new fetcher each time, offsets
    relabelled: the sources' offsets differ from C's): (source, from offset, to offset)."""
    for i, (src, start, end) in enumerate(turns):
        f = c.mirror(f"turn-{i}", addr[src], [{"topic": topic, "partition": 0, "rebase": True,
                                               "source_offset": start}])
        f.catch_up(topic, end)
        f.stop()


@pytest.mark.parametrize("variant", [NONE, HIGH], ids=lambda v: v.name)
def test_s4_fan_in_same_topic_source_reassignment(kafka1, kafka_factory, kafka_dest_factory, mirror_factory,
                                                   variant):
    T = harness.topic_name("s4")
    a, b = kafka_factory(cluster_id=cid(), name="A"), kafka_factory(cluster_id=cid(), name="B")
    for br in (a, b):
        harness.create_topics(br.bootstrap, [T])
    pa, pb = idem(a.bootstrap), idem(b.bootstrap)
    c = kafka_dest_factory("C")
    if variant.guarded:
        mg = start_mirrorguard(mirror_factory, kafka1.bootstrap, [mirror_spec("from-a", a, variant, c),
                                                                 mirror_spec("from-b", b, variant, c)], [T])
        addr = {"a": mg.mirrors["from-a"].bootstrap, "b": mg.mirrors["from-b"].bootstrap}
    else:
        addr = {"a": a.bootstrap, "b": b.bootstrap}
    c.open(T)
    # C mirrors T from A, then from B, then from A again.
    send_each(pa, T, [b"a-0", b"a-1", b"a-2"])
    _in_turn(c, addr, T, [("a", 0, 3)])
    send_each(pb, T, [b"b-0", b"b-1"])
    _in_turn(c, addr, T, [("b", 0, 2)])
    send_each(pa, T, [b"a-3"])
    _in_turn(c, addr, T, [("a", 3, 4)])
    st = c.state(T)
    assert st["log_end_offset"] == 6 and st["failed"] is None
    pids = [x["producer_id"] for x in c.batches(T)]
    if not variant.guarded:
        # One producer-state entry for two producers: B's sequence 0 after A's 2 (same
        # epoch) and A's 3 after B's 1 were accepted without a word.
        assert pids == [0] * 6 and list(st["producers"]) == [0]
        # [firstSeq, lastSeq, firstOffset, lastOffset] of the last 5 batches: A1 A2 B0 B1 A3
        assert st["producers"][0]["batches"] == [[1, 1, 1, 1], [2, 2, 2, 2], [0, 0, 3, 3], [1, 1, 4, 4],
                                                 [3, 3, 5, 5]]
        assert not [w for w in c.warnings() if "producer 0" in w]
        return
    fa, fb = map_pid(0, fold(a.cluster_id)), map_pid(0, fold(b.cluster_id))
    assert pids == [fa, fa, fa, fb, fb, fa]
    snap = st["producers"]
    assert sorted(snap) == sorted([fa, fb])
    assert [x[:2] for x in snap[fa]["batches"]] == [[0, 0], [1, 1], [2, 2], [3, 3]]
    assert [x[:2] for x in snap[fb]["batches"]] == [[0, 0], [1, 1]]
    assert c.warnings() == [] and anomalies(mg) == []


# =============================================================================
# 6. Same-region collision: two source clusters with the same fold, PID 0 active in both


@pytest.mark.parametrize("variant", [NONE, HIGH, SIGN_BIT], ids=lambda v: v.name)
def test_s6_same_region_collision_salt_survives_restart(kafka1, kafka_factory, kafka_dest_factory, mirror_factory,
                                                         variant):
    T = harness.topic_name("s6")
    cid_a, cid_b = same_fold_pair()
    while cid_a.startswith("-") or cid_b.startswith("-"):
        cid_a, cid_b = same_fold_pair()
    a, b = kafka_factory(cluster_id=cid_a, name="A"), kafka_factory(cluster_id=cid_b, name="B")
    for br in (a, b):
        harness.create_topics(br.bootstrap, [T])
    pa, pb = idem(a.bootstrap), idem(b.bootstrap)
    send_each(pa, T, [b"a-0", b"a-1"])
    send_each(pb, T, [b"b-0", b"b-1"])
    c = kafka_dest_factory("C")
    c.open(T)
    mg = None
    if variant.guarded:
        mg = start_mirrorguard(mirror_factory, kafka1.bootstrap, [mirror_spec("from-a", a, variant, c),
                                                                 mirror_spec("from-b", b, variant, c)], [T])
        addr = {n: mg.mirrors[f"from-{n}"].bootstrap for n in "ab"}
    else:
        addr = {"a": a.bootstrap, "b": b.bootstrap}
    _in_turn(c, addr, T, [("a", 0, 2), ("b", 0, 2)])
    pids = [x["producer_id"] for x in c.batches(T)]
    if not variant.guarded:
        assert pids == [0, 0, 0, 0]
        st = c.state(T)
        assert [x[:2] for x in st["producers"][0]["batches"]] == [[0, 0], [1, 1], [0, 0], [1, 1]]
        assert not [w for w in c.warnings() if "producer 0" in w]
        return
    fl = fold(cid_a)
    assert fold(cid_b) == fl
    plain = map_pid(0, fl, 0, variant.layout)
    assert pids[:2] == [plain, plain] and pids[2] == pids[3] != plain
    salted = pids[2]
    # (the shared state node holds other tests' topics too: only this topic's collisions)
    cols = [x for x in mg.get("/v1/collisions")["collisions"] if x["topic"] == T]
    assert len(cols) == 1 and cols[0]["source_cluster"] == cid_b and cols[0]["mapped_pid"] == salted, (
        cid_a, cid_b, plain, salted, cols)
    salt = cols[0]["salt"]
    assert salted == map_pid(0, fl, salt, variant.layout)
    recs = [r for r in read_state_records(kafka1.bootstrap, mg.state_topic) if r.type == 3 and r.key["source_cluster_id"] == cid_b]
    assert len(recs) == 1 and recs[0].value["salt"] == salt
    # Restart mirrorguard: the salt comes back from __mirror_state and is applied again.
    mg.restart()
    send_each(pb, T, [b"b-2"])
    send_each(pa, T, [b"a-2"])
    _in_turn(c, addr, T, [("b", 2, 3), ("a", 2, 3)])
    assert [x["producer_id"] for x in c.batches(T)][4:] == [salted, plain]
    assert len([r for r in read_state_records(kafka1.bootstrap, mg.state_topic)
                if r.type == 3 and r.key["source_cluster_id"] == cid_b]) == 1
    st = c.state(T)
    if variant is HIGH:
        assert sorted(st["producers"]) == sorted([plain, salted])
        assert st["producers"][salted]["last_sequence"] == 2 and st["producers"][plain]["last_sequence"] == 2
    else:
        assert st["producers"] == {}  # sign-bit PIDs are negative: a stock engine keeps no state
    assert c.warnings() == [] and anomalies(mg) == []


# =============================================================================
# 5. Chain A -> B -> C, failover at B, new local producers on B with A's PIDs


def _txn_result(p, topic: str, values_: list[bytes]) -> str:
    """Runs one committed transaction; returns "committed" or the error's name."""
    from confluent_kafka import KafkaException as KE

    try:
        txn(p, topic, values_, commit=True)
        return "committed"
    except KE as e:
        return e.args[0].name()
    except AssertionError:
        return "not-delivered"


@pytest.mark.parametrize("variant", [NONE, HIGH], ids=lambda v: v.name)
def test_s5_chain_failover_at_b(kafka1, kafka_factory, kafka_dest_factory, mirror_factory, variant):
    T = harness.topic_name("s5")
    a = kafka_factory(cluster_id=cid(), name="A")
    b = kafka_factory(cluster_id=cid(), name="B")
    harness.create_topics(a.bootstrap, [T])
    send_each(idem(a.bootstrap), T, [b"a-0", b"a-1", b"a-2"])  # A PID 0, seq 0..2 @0..2
    t2 = txn_producer(a.bootstrap, "a-t2")  # A PID 1
    txn(t2, T, [b"a-open"], commit=None)  # @3, still open at the failover
    first = txn_producer(a.bootstrap, "a-t3")  # A PID 2 ...
    first.close()
    t3 = txn_producer(a.bootstrap, "a-t3")  # ... re-initialised: PID 2, a higher epoch
    txn(t3, T, [b"a-t3"], commit=True)  # @4, COMMIT @5
    harness.wait_until(lambda: end_offset(a.bootstrap, T) == 6, 15, interval=0.1, what="A's end offset 6")

    topic_id = prepare_promotion(b, T)
    dest = kafka_dest_factory("BC")
    dest.open(T, topic_id=topic_id)
    hop_ab = make_hop(mirror_factory, variant, a, dest, T, "a-to-b", state_bootstrap=kafka1.bootstrap)
    hop_ab.catch_up(6)
    a_epoch = dest.state(T)["producers"][2 if not variant.guarded else map_pid(2, fold(a.cluster_id))]["epoch"]
    assert a_epoch >= 1
    if variant.guarded:
        hop_ab.seal()
    hop_ab.stop()
    promote(dest, b, T)
    # New local producers on B: PIDs 0, 1, 2 from B's own allocator, epoch 0.
    l0 = send_each(idem(b.bootstrap), T, [b"b0-0", b"b0-1"])
    r1 = _txn_result(txn_producer(b.bootstrap, "b-t1"), T, [b"b1-0"])
    r2 = _txn_result(txn_producer(b.bootstrap, "b-t2"), T, [b"b2-0"])
    b_end = end_offset(b.bootstrap, T)
    rc_b = values(read_all(b.bootstrap, T, "read_committed"))

    # C mirrors B (the promoted broker), through its own mirrorguard when guarded. That
    # mirrorguard keeps its state on A's cluster: on the shared state node T's life cycle
    # (keyed by the topic id found there, issue 13 item 6) is already STOPPED by B's seal.
    C = f"c.{T}"
    hop_bc = make_hop(mirror_factory, variant, b, dest, C, "b-to-c", state_bootstrap=a.bootstrap, source_topic=T)
    hop_bc.catch_up(b_end)
    st = dest.state(C)
    assert st["log_end_offset"] == b_end and st["failed"] is None
    pr = st["producers"]
    cb = [(m["offset"], m["type"], m["producer_id"], m["closed_txn_first_offset"]) for m in st["markers"]]

    if variant is NONE:
        # On B: PID 0 (idempotent) is fatally out of order; PID 1's data is a "duplicate" of
        # A's open batch (acknowledged at offset 3, never stored) and its COMMIT closes A's
        # transaction; PID 2 at epoch 0 is fenced by A's higher epoch.
        assert fatal_code(l0[0]) == KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER and len(l0) == 1, l0
        assert (r1, r2) == ("committed", "_FENCED"), (r1, r2)
        assert b_end == 7 and rc_b == [b"a-0", b"a-1", b"a-2", b"a-open", b"a-t3"]
        # At C, Kafka's engine records B's COMMIT (PID 1, offset 6) closing A's transaction
        # opened at offset 3: A's never-committed record is committed down the chain.
        assert cb == [(5, "COMMIT", 2, 4), (6, "COMMIT", 1, 3)], cb
        assert sorted(pr) == [0, 1, 2] and pr[2]["epoch"] == a_epoch and st["last_stable_offset"] == 7
        return

    # With mirrorguard: B's local producers all write; nothing of A's is closed by B.
    assert [e for e, _ in l0] == [None, None] and (r1, r2) == ("committed", "committed"), (l0, r1, r2)
    assert rc_b == [b"a-0", b"a-1", b"a-2", b"a-t3", b"b0-0", b"b0-1", b"b1-0", b"b2-0"], rc_b
    fa, fb = fold(a.cluster_id), fold(b.cluster_id)
    assert sorted(pr) == sorted([map_pid(p, fa) for p in (0, 1, 2)] + [map_pid(p, fb) for p in (0, 1, 2)]), pr
    assert pr[map_pid(0, fa)]["last_sequence"] == 2 and pr[map_pid(2, fa)]["epoch"] == a_epoch
    assert pr[map_pid(0, fb)]["last_sequence"] == 1
    assert (6, "ABORT", map_pid(1, fa), 3) in cb  # the seal's ABORT closed A's open txn
    assert [c for c in cb if c[2] == map_pid(1, fb)][0][3] is not None  # B's own COMMIT closed B's own txn
    assert barriers(MIRRORGUARD_BIN, dest.partition_dir(C)) == [(7, a.cluster_id)]  # B's seal, as is
    assert st["last_stable_offset"] == b_end and dest.warnings() == []
    assert anomalies(hop_ab.mg) == [] and anomalies(hop_bc.mg) == []


# =============================================================================
# 2. Failback A -> B, then B -> A


@pytest.mark.parametrize("variant", [NONE, HIGH], ids=lambda v: v.name)
def test_s2_failback(kafka1, kafka_factory, kafka_dest_factory, mirror_factory, variant):
    T = harness.topic_name("s2")
    AT = f"a.{T}"  # A's partition as a mirror destination again (the stand-in)
    a = kafka_factory(cluster_id=cid(), name="A")
    b = kafka_factory(cluster_id=cid(), name="B")
    harness.create_topics(a.bootstrap, [T])
    send_each(idem(a.bootstrap), T, [b"a-0", b"a-1", b"a-2"])  # A's PID 0
    a_end = 3

    # A -> B, failover to B (a real broker), local producers on B.
    topic_id = prepare_promotion(b, T)
    dest = kafka_dest_factory("AB")
    dest.open(T, topic_id=topic_id)
    hop_ab = make_hop(mirror_factory, variant, a, dest, T, "a-to-b", state_bootstrap=kafka1.bootstrap)
    hop_ab.catch_up(a_end)
    if variant.guarded:
        hop_ab.seal()
    hop_ab.stop()
    promote(dest, b, T)
    lb = send_each(idem(b.bootstrap), T, [b"b1-0"])  # B's PID 0
    bt = txn_producer(b.bootstrap, "b-txn")  # B's PID 1
    txn(bt, T, [b"bt-0"], commit=True)
    b_end = 7 if variant.guarded else 5  # (NONE: b1-0 was refused, see below)
    harness.wait_until(lambda: end_offset(b.bootstrap, T) == b_end, 15, interval=0.1, what="B's COMMIT written")

    # Failback: A's own log (its data, as the replication path rebuilds it) mirrors B from
    # A's log end offset (the common prefix). Its mirrorguard keeps state on A's cluster
    # (T on the shared state node is STOPPED by B's seal: issue 13 item 6).
    own = dest.mirror("a-own", a.bootstrap, [{"topic": AT, "partition": 0, "source_topic": T}])
    own.catch_up(AT, a_end)
    own.stop()
    hop_ba = make_hop(mirror_factory, variant, b, dest, AT, "b-to-a", state_bootstrap=a.bootstrap, source_topic=T)
    hop_ba.catch_up(b_end)
    if variant.guarded:
        hop_ba.mirror = "b-to-a"
        _seal(hop_ba, T)
    hop_ba.stop()
    st = dest.state(AT)
    # A new local producer on A after the failback, in place: A's allocator handed out PID 0
    # before, so its next idempotent producer is PID 1 (Kafka allocates PID blocks per
    # broker; a restarted A would draw a new block from 1000 instead).
    local = _local_in_place(dest, AT, 1, [0, 1])
    pr = st["producers"]
    if variant is NONE:
        # On B, B's PID 0 met A's PID 0 (S1): fatally out of order, b1-0 never written.
        assert len(lb) == 1 and fatal_code(lb[0]) == KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, lb
        assert b_end == 5 and barriers(MIRRORGUARD_BIN, dest.partition_dir(AT)) == []
        # On A, its new PID 1 meets B's transactional PID 1: x-0 (seq 0) is a "duplicate" of
        # B's bt-0, acknowledged with offset 3 and never stored; x-1 is stored after it.
        assert sorted(pr) == [0, 1] and pr[1]["batches"] == [[0, 0, 3, 3]]
        assert [(r["error"], r["stored"], r["first_offset"]) for r in local] == [(None, False, 3), (None, True, 5)]
        return
    assert lb == [(None, 4)] and b_end == 7
    assert [(r["error"], r["stored"], r["first_offset"]) for r in local] == [(None, True, 8), (None, True, 9)]
    # Two barriers in A's log: B's (sealing A -> B, source A) and A's own (sealing B -> A).
    assert barriers(MIRRORGUARD_BIN, dest.partition_dir(AT)) == [(3, a.cluster_id), (7, b.cluster_id)]
    fb = fold(b.cluster_id)
    assert sorted(pr) == sorted([0, map_pid(0, fb), map_pid(1, fb)]), pr  # A's own PID 0 stays raw
    assert st["last_stable_offset"] == 8 and dest.warnings() == []
    assert anomalies(hop_ab.mg) == [] and anomalies(hop_ba.mg) == []
