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
