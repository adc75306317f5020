"""Mirror fetch path (issue 4) against real Apache Kafka 4.4 sources and librdkafka producers.

The "destination" is the STAND-IN fetcher of mirror_harness.py (SPEC 7); the sources
(one-node Kafka clusters of each test's own, with the cluster ids it needs), the state
cluster (the session's shared Kafka node, a state topic per test) and every client are
real. Every PID is checked against the SPEC 2.1 formula computed in Python from the
source's own batches, every batch with kafka-python's reader and crc32c.
"""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

import harness
from mirror_harness import (  # noqa: F401 - mirror_factory is a fixture
    MirrorSpec,
    StandInFetcher,
    direct_batches,
    fold,
    high_watermark,
    idempotent_producer,
    map_pid,
    mirror_factory,
    read_state_records,
    same_fold_pair,
    send,
    transactional_producer,
    txn,
)

TOPIC = "t"


@pytest.fixture(autouse=True)
def _unique_topic(monkeypatch):
    """Each test mirrors a topic of its own name: the state cluster is shared by the
    session, and the destination topic ids are looked up there by name."""
    monkeypatch.setattr(sys.modules[__name__], "TOPIC", harness.topic_name("t"))


def _produce_mix(bootstrap: str, topic: str | None = None) -> None:
    """PID -1 data, idempotent data, a committed and an aborted transaction."""
    topic = topic or TOPIC
    plain = harness.new_producer(bootstrap, **{"enable.idempotence": False, "acks": "all", "linger.ms": 5})
    send(plain, topic, [b"plain-%d" % i for i in range(3)])
    idem = idempotent_producer(bootstrap)
    send(idem, topic, [b"idem-%d" % i for i in range(4)])
    tp = transactional_producer(bootstrap, f"txn-{topic}")
    txn(tp, topic, [b"commit-%d" % i for i in range(3)], commit=True)
    txn(tp, topic, [b"abort-%d" % i for i in range(2)], commit=False)
    send(idem, topic, [b"idem-late"])
    harness.wait_txn_markers(bootstrap, topic)


def _strip_pid_crc(raw: bytes) -> bytes:
    """Batch bytes without the CRC (17..21) and the producer id (43..51)."""
    return raw[:17] + raw[21:43] + raw[51:]


@pytest.mark.parametrize("layout,version", [("high", 13), ("sign-bit", 4), ("high", 12)])
def test_region_mapping_every_pid_matches_formula(kafka_factory, kafka1, mirror_factory, layout, version):
    src = kafka_factory()
    state = kafka1
    harness.create_topics(src.bootstrap, [TOPIC])
    harness.create_topics(state.bootstrap, [TOPIC])  # the destination topic (the state broker is the destination here)
    mg = mirror_factory(state.bootstrap, [MirrorSpec.of("a-to-b", src, layout=layout)])
    _produce_mix(src.bootstrap)
    direct = direct_batches(src.bootstrap, TOPIC)
    hw = high_watermark(src.bootstrap, TOPIC)
    before = mg.metrics()

    f = StandInFetcher(TOPIC, version=version).connect(mg.mirrors["a-to-b"].bootstrap)
    f.catch_up(hw)
    f.close()

    fa = fold(src.cluster_id)
    kinds = [b.kind for b in direct]
    assert kinds.count("commit") == 1 and kinds.count("abort") == 1, kinds
    assert any(b.producer_id == -1 for b in direct) and any(b.producer_id >= 0 for b in direct)
    assert len(f.log) == len(direct), (len(f.log), len(direct))
    with_pid = 0
    for got, src_b in zip(f.log, direct):
        assert (got.base_offset, got.last_offset, got.kind) == (src_b.base_offset, src_b.last_offset, src_b.kind)
        assert got.values == src_b.values
        if src_b.producer_id == -1:
            assert got.producer_id == -1, "PID -1 must pass untouched"
            assert got.raw == src_b.raw, "a PID -1 batch must pass byte for byte"
        else:
            with_pid += 1
            expect = map_pid(src_b.producer_id, fa, 0, layout)
            assert got.producer_id == expect, (got.producer_id, expect, src_b.producer_id)
            if layout == "high":
                assert got.producer_id > 0 and got.producer_id >> 62 == 1
            else:
                assert got.producer_id < -1
            # only the PID and the CRC changed
            assert _strip_pid_crc(got.raw) == _strip_pid_crc(src_b.raw)
        assert got.producer_epoch == src_b.producer_epoch and got.base_sequence == src_b.base_sequence

    # cross-check of the Python formula with the product's own CLI (not the oracle)
    out = subprocess.run(
        [str(harness.MIRRORGUARD_BIN), "map", "--source-cluster-id", src.cluster_id, "--pid", "1",
         "--layout", layout],
        capture_output=True, text=True, timeout=20, check=True,
    ).stdout.strip().splitlines()[-1]
    assert int(out) == map_pid(1, fa, 0, layout)

    after = mg.metrics()
    delta = lambda kind: (after.sum("mirrorguard_mirror_events_total", mirror="a-to-b", kind=kind)  # noqa: E731
                          - before.sum("mirrorguard_mirror_events_total", mirror="a-to-b", kind=kind))
    assert delta("batch_seen") == len(direct)
    assert delta("batch_rewritten") == with_pid
    assert delta("collision") == 0
    assert after.sum("mirrorguard_producer_state_producers") >= 2  # idempotent + transactional
    assert after.sum("mirrorguard_anomalies_total", mirror="a-to-b") == 0


def _consume_all(bootstrap: str, topic: str, count: int, isolation: str, timeout: float = 20.0):
    msgs = harness.consume_assign(bootstrap, topic, count=count, timeout=timeout,
                                  **{"check.crcs": True, "isolation.level": isolation})
    return [(m.offset(), m.key(), m.value()) for m in msgs]


@pytest.mark.quick  # scripts/test.sh --quick: the mirror path
def test_librdkafka_consumer_through_mirror_gets_source_records(kafka_factory, kafka1, mirror_factory):
    src = kafka_factory()
    state = kafka1
    harness.create_topics(src.bootstrap, [TOPIC])
    harness.create_topics(state.bootstrap, [TOPIC])  # the destination topic (the state broker is the destination here)
    mg = mirror_factory(state.bootstrap, [MirrorSpec.of("a-to-b", src)])
    _produce_mix(src.bootstrap)
    # Kafka fills aborted_transactions: read_committed skips the 2 aborted records, both
    # directly and through the mirror (whose aborted_transactions carry mapped PIDs that
    # must match the rewritten batches, or librdkafka would deliver the aborted records).
    # (Tansu never filled it, and this test used to compare "mirror equals source" only.)
    n_all = 3 + 4 + 3 + 2 + 1
    via_mirror_bs = mg.mirrors["a-to-b"].bootstrap
    for isolation, n in (("read_uncommitted", n_all), ("read_committed", n_all - 2)):
        direct = _consume_all(src.bootstrap, TOPIC, n, isolation)
        mirrored = _consume_all(via_mirror_bs, TOPIC, n, isolation)
        assert mirrored == direct, isolation
        assert {v for _, _, v in mirrored} >= {b"idem-late", b"commit-0", b"plain-0"}
        aborted = {v for _, _, v in mirrored if v.startswith(b"abort-")}
        assert aborted == (set() if isolation == "read_committed" else {b"abort-0", b"abort-1"}), isolation
    m = mg.metrics()
    assert m.sum("mirrorguard_mirror_events_total", mirror="a-to-b", kind="batch_rewritten") > 0


def test_source_reassignment_a_b_a_keeps_a_pid(kafka_factory, kafka1, mirror_factory):
    """C (the stand-in) fetches t from A, then B, then A again into one destination
    partition: A's PID maps to the same value in phases 1 and 3, B's to another."""
    a = kafka_factory()
    b = kafka_factory()
    state = kafka1
    for br in (a, b):
        harness.create_topics(br.bootstrap, [TOPIC])
    harness.create_topics(state.bootstrap, [TOPIC])  # the destination topic (the state broker is the destination here)
    mg = mirror_factory(state.bootstrap, [MirrorSpec.of("from-a", a), MirrorSpec.of("from-b", b)])
    fa, fb = fold(a.cluster_id), fold(b.cluster_id)
    assert fa != fb

    pa = idempotent_producer(a.bootstrap)
    pb = idempotent_producer(b.bootstrap)
    f = StandInFetcher(TOPIC)

    send(pa, TOPIC, [b"a1-%d" % i for i in range(3)])
    f.connect(mg.mirrors["from-a"].bootstrap, rebase=True, source_offset=0)
    f.catch_up(high_watermark(a.bootstrap, TOPIC))
    a_pos = f.source_offset
    phase1 = list(f.log)

    send(pb, TOPIC, [b"b-%d" % i for i in range(3)])
    f.connect(mg.mirrors["from-b"].bootstrap, rebase=True, source_offset=0)
    f.catch_up(high_watermark(b.bootstrap, TOPIC))
    phase2 = f.log[len(phase1):]

    send(pa, TOPIC, [b"a3-%d" % i for i in range(3)])
    f.connect(mg.mirrors["from-a"].bootstrap, rebase=True, source_offset=a_pos)
    f.catch_up(high_watermark(a.bootstrap, TOPIC))
    phase3 = f.log[len(phase1) + len(phase2):]
    f.close()

    assert phase1 and phase2 and phase3
    a_src = {x.producer_id for x in direct_batches(a.bootstrap, TOPIC)}
    b_src = {x.producer_id for x in direct_batches(b.bootstrap, TOPIC)}
    assert len(a_src) == len(b_src) == 1, (a_src, b_src)  # one idempotent producer on each
    (pid_a,), (pid_b,) = a_src, b_src
    p1 = {x.producer_id for x in phase1}
    p2 = {x.producer_id for x in phase2}
    p3 = {x.producer_id for x in phase3}
    assert p1 == p3 == {map_pid(pid_a, fa)}, (p1, p3)
    assert p2 == {map_pid(pid_b, fb)}, p2
    # the stand-in log's offsets continue across the sources
    offs = [x.base_offset for x in f.log]
    assert offs == sorted(offs) and f.leo == sum(x.last_offset - x.base_offset + 1 for x in f.log)
    assert [v for x in f.log for v in x.values] == (
        [b"a1-%d" % i for i in range(3)] + [b"b-%d" % i for i in range(3)] + [b"a3-%d" % i for i in range(3)]
    )
    m = mg.metrics()
    assert m.sum("mirrorguard_mirror_events_total", kind="collision") == 0


def _collision_records(state_bootstrap: str, state_topic: str, topic_id: bytes | None = None):
    return [r for r in read_state_records(state_bootstrap, state_topic) if r.type == 3
            and (topic_id is None or r.key["topic_id"] == topic_id)]


def _topic_id(bootstrap: str, topic: str) -> bytes:
    import rawkafka

    host, port = bootstrap.rsplit(":", 1)
    with rawkafka.Connection(host, int(port), timeout=5) as c:
        ids, _ = rawkafka.topic_ids_v12(c, [topic])
    return ids[topic]


def _fetch_pids(mirror_bootstrap: str, source_bootstrap: str, topic: str | None = None) -> list[int]:
    topic = topic or TOPIC
    f = StandInFetcher(topic).connect(mirror_bootstrap)
    try:
        f.catch_up(high_watermark(source_bootstrap, topic))
    finally:
        f.close()
    return [x.producer_id for x in f.log]


def _shared_pid(a, b) -> int:
    """The one source PID that A and B both used for TOPIC: fresh Kafka clusters hand out
    the same first producer id, which is what makes a same-fold collision."""
    pa = {x.producer_id for x in direct_batches(a.bootstrap, TOPIC)}
    pb = {x.producer_id for x in direct_batches(b.bootstrap, TOPIC)}
    assert len(pa) == 1 and pa == pb, (pa, pb)
    return pa.pop()


def test_same_fold_collision_salt_persisted_and_survives_restart(kafka_factory, kafka1, mirror_factory):
    cid_a, cid_b = same_fold_pair()
    a = kafka_factory(cluster_id=cid_a)
    b = kafka_factory(cluster_id=cid_b)
    state = kafka1
    for br in (a, b):
        harness.create_topics(br.bootstrap, [TOPIC])
    harness.create_topics(state.bootstrap, [TOPIC])  # the destination topic (the state broker is the destination here)
    fl = fold(cid_a)
    assert fold(cid_b) == fl and cid_a != cid_b
    send(idempotent_producer(a.bootstrap), TOPIC, [b"a-%d" % i for i in range(3)])
    send(idempotent_producer(b.bootstrap), TOPIC, [b"b-%d" % i for i in range(3)])
    pid = _shared_pid(a, b)

    mg = mirror_factory(state.bootstrap, [MirrorSpec.of("from-a", a), MirrorSpec.of("from-b", b)])
    before = mg.metrics()
    pids_a = _fetch_pids(mg.mirrors["from-a"].bootstrap, a.bootstrap)
    assert set(pids_a) == {map_pid(pid, fl)}
    pids_b = _fetch_pids(mg.mirrors["from-b"].bootstrap, b.bootstrap)
    assert len(set(pids_b)) == 1
    salted = pids_b[0]
    assert salted != map_pid(pid, fl), "the second origin must not share the first origin's PID"

    recs = _collision_records(state.bootstrap, mg.state_topic)
    assert len(recs) == 1, recs
    r = recs[0]
    assert r.key["topic_id"] == _topic_id(state.bootstrap, TOPIC)
    assert r.key["partition"] == 0 and r.key["original_pid"] == pid
    assert r.key["source_cluster_id"] == cid_b
    assert r.value["version"] == 0 and r.value["colliding_cluster_id"] == cid_a
    salt = r.value["salt"]
    assert salt != 0 and salted == map_pid(pid, fl, salt), (salted, salt)

    cols = mg.get("/v1/collisions")["collisions"]
    assert len(cols) == 1 and cols[0]["salt"] == salt and cols[0]["mapped_pid"] == salted
    assert cols[0]["topic"] == TOPIC and cols[0]["original_pid"] == pid
    after = mg.metrics()
    assert (after.sum("mirrorguard_mirror_events_total", mirror="from-b", kind="collision")
            - before.sum("mirrorguard_mirror_events_total", mirror="from-b", kind="collision")) >= 1

    # A new process on the same config: the salt comes back from __mirror_state.
    mg.restart()
    assert _fetch_pids(mg.mirrors["from-b"].bootstrap, b.bootstrap) == pids_b
    assert _fetch_pids(mg.mirrors["from-a"].bootstrap, a.bootstrap) == pids_a
    assert len(_collision_records(state.bootstrap, mg.state_topic)) == 1, "no second salt after the restart"
    assert mg.get("/v1/collisions")["collisions"][0]["salt"] == salt


def test_two_instances_racing_on_one_collision_converge(kafka_factory, kafka1, mirror_factory):
    cid_a, cid_b = same_fold_pair()
    a = kafka_factory(cluster_id=cid_a)
    b = kafka_factory(cluster_id=cid_b)
    state = kafka1
    for br in (a, b):
        harness.create_topics(br.bootstrap, [TOPIC])
    harness.create_topics(state.bootstrap, [TOPIC])  # the destination topic (the state broker is the destination here)
    fl = fold(cid_a)
    send(idempotent_producer(a.bootstrap), TOPIC, [b"a-%d" % i for i in range(2)])
    send(idempotent_producer(b.bootstrap), TOPIC, [b"b-%d" % i for i in range(2)])
    pid = _shared_pid(a, b)
    specs = lambda: [MirrorSpec.of("from-a", a), MirrorSpec.of("from-b", b)]  # noqa: E731
    mg1 = mirror_factory(state.bootstrap, specs())
    mg2 = mirror_factory(state.bootstrap, specs())
    for mg in (mg1, mg2):
        assert set(_fetch_pids(mg.mirrors["from-a"].bootstrap, a.bootstrap)) == {map_pid(pid, fl)}

    results: dict[str, list[int]] = {}
    errors: list[BaseException] = []
    go = threading.Barrier(2)

    def race(mg):
        try:
            go.wait(5)
            results[mg.name] = _fetch_pids(mg.mirrors["from-b"].bootstrap, b.bootstrap)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=race, args=(mg,)) for mg in (mg1, mg2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    # Deterministic salt candidates: both instances already agree on the first try.
    assert len(set(results[mg1.name])) == 1 and results[mg1.name] == results[mg2.name], results
    recs = _collision_records(state.bootstrap, mg1.state_topic)
    assert 1 <= len(recs) <= 2, recs
    winner = min(recs, key=lambda r: r.offset)
    expect = map_pid(pid, fl, winner.value["salt"])
    assert expect != map_pid(pid, fl)

    # Both instances converge on the lowest-offset record (they tail __mirror_state).
    def converged():
        return all(set(_fetch_pids(mg.mirrors["from-b"].bootstrap, b.bootstrap)) == {expect} for mg in (mg1, mg2))

    harness.wait_until(converged, 15, interval=0.3, what="both instances on the winning salt")
    for mg in (mg1, mg2):
        cols = mg.get("/v1/collisions")["collisions"]
        assert [c["salt"] for c in cols] == [winner.value["salt"]], cols




def _restart_then_second_origin(kafka_factory, kafka1, mirror_factory, kill: bool, snapshot_interval_ms=None):
    """A's PID 1 is mirrored into t-0; mirrorguard restarts; then B (same fold, PID 1)
    feeds the same destination partition. Returns (mapped PID of A, mapped PIDs of B)."""
    cid_a, cid_b = same_fold_pair()
    a = kafka_factory(cluster_id=cid_a)
    b = kafka_factory(cluster_id=cid_b)
    state = kafka1
    for br in (a, b):
        harness.create_topics(br.bootstrap, [TOPIC])
    harness.create_topics(state.bootstrap, [TOPIC])  # the destination topic (the state broker is the destination here)
    fl = fold(cid_a)
    send(idempotent_producer(a.bootstrap), TOPIC, [b"a-%d" % i for i in range(3)])
    send(idempotent_producer(b.bootstrap), TOPIC, [b"b-%d" % i for i in range(3)])
    pid = _shared_pid(a, b)
    mg = mirror_factory(state.bootstrap, [MirrorSpec.of("from-a", a), MirrorSpec.of("from-b", b)],
                        snapshot_interval_ms=snapshot_interval_ms)
    f = StandInFetcher(TOPIC)
    f.connect(mg.mirrors["from-a"].bootstrap, rebase=True)
    f.catch_up(high_watermark(a.bootstrap, TOPIC))
    assert {x.producer_id for x in f.log} == {map_pid(pid, fl)}
    n_a = len(f.log)
    if snapshot_interval_ms:
        # wait for a producer-state snapshot (type 5) of t-0 that holds A's producer
        def snapshotted():
            return any(r.type == 5 and r.value and any(p["producer_id"] == map_pid(pid, fl)
                                                       for p in r.value["producers"])
                       for r in read_state_records(state.bootstrap, mg.state_topic))

        harness.wait_until(snapshotted, 10, interval=0.2, what="a type-5 snapshot holding A's producer")
    if kill:
        mg.kill9()
        mg.start()
    else:
        mg.restart()
    f.connect(mg.mirrors["from-b"].bootstrap, rebase=True)
    f.catch_up(high_watermark(b.bootstrap, TOPIC))
    f.close()
    return map_pid(pid, fl), {x.producer_id for x in f.log[n_a:]}


def test_collision_detected_after_kill9_from_snapshot(kafka_factory, kafka1, mirror_factory):
    """Producer-state snapshots (type 5, every 200 ms here) restore the partition's
    producers at start-up: after kill -9, B's PID 1 still gets a salt."""
    a_pid, b_pids = _restart_then_second_origin(kafka_factory, kafka1, mirror_factory, kill=True, snapshot_interval_ms=200)
    assert len(b_pids) == 1 and b_pids != {a_pid}, (a_pid, b_pids)


def test_collision_still_detected_after_graceful_restart(kafka_factory, kafka1, mirror_factory):
    """Default snapshot interval; SIGTERM right after mirroring (final snapshot at shutdown)."""
    a_pid, b_pids = _restart_then_second_origin(kafka_factory, kafka1, mirror_factory, kill=False)
    assert len(b_pids) == 1
    assert b_pids != {a_pid}, "after a restart B's PID 1 was mapped onto A's PID (collision missed)"


def test_collision_still_detected_after_kill9_before_any_snapshot(kafka_factory, kafka1, mirror_factory):
    """Default snapshot interval (10 s); kill -9 right after mirroring A. A's first batch
    could only leave mirrorguard after its claim (a type-6 claim record of A's mapped PID)
    was acknowledged by __mirror_state, so B's PID 1 still gets a salt after the restart."""
    a_pid, b_pids = _restart_then_second_origin(kafka_factory, kafka1, mirror_factory, kill=True)
    assert len(b_pids) == 1
    assert b_pids != {a_pid}, "after kill -9 B's PID 1 was mapped onto A's PID (collision missed)"
