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
    hop = make_hop(mirror_factory, variant, a, dest, T, "a-to-b", state_bootstrap=kafka1.bootstrap)
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
    local = send_each(idem(b.bootstrap), T, [b"b-%d" % i for i in range(5)])
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
