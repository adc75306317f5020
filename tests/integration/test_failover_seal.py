"""Failover (issue 5): stop and seal through the fetch path, pause/resume, the admin API's
errors, restart recovery. Real Apache Kafka 4.4 source (a one-node cluster per test) and
state cluster (the session's shared node, a state topic per test), real librdkafka
producers; the destination is the STAND-IN fetcher of mirror_harness.py (SPEC 7)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

import harness
from mirror_harness import (  # noqa: F401 - mirror_factory is a fixture
    MirrorSpec,
    StandInFetcher,
    decode_barrier_value,
    decode_end_txn_value,
    direct_batches,
    fold,
    high_watermark,
    idempotent_producer,
    map_pid,
    mirror_factory,
    read_state_records,
    send,
    transactional_producer,
    txn,
)

TOPIC = "t"
MIRROR = "a-to-b"


@pytest.fixture(autouse=True)
def _unique_topic(monkeypatch):
    """Each test mirrors a topic of its own name: the state cluster is shared by the
    session, and the destination topic ids are looked up there by name."""
    monkeypatch.setattr(sys.modules[__name__], "TOPIC", harness.topic_name("t"))


def _setup(kafka_factory, kafka1, mirror_factory, partitions: int = 1, **kw):
    src = kafka_factory()
    state = kafka1
    harness.create_topics(src.bootstrap, [TOPIC], partitions=partitions)
    # the destination topic (the state broker is the destination here)
    harness.create_topics(state.bootstrap, [TOPIC], partitions=partitions)
    mg = mirror_factory(state.bootstrap, [MirrorSpec.of(MIRROR, src)], **kw)
    mg.wait_sources_known()
    return src, state, mg


def _open_transaction_on_source(src, txn_id: str = "txn-open"):
    """Committed data, then a transaction left open on the source. Returns the producer."""
    idem = idempotent_producer(src.bootstrap)
    send(idem, TOPIC, [b"idem-%d" % i for i in range(3)])
    tp = transactional_producer(src.bootstrap, txn_id)
    txn(tp, TOPIC, [b"done-%d" % i for i in range(2)], commit=True)
    tp.begin_transaction()
    for i in range(2):
        tp.produce(TOPIC, value=b"open-%d" % i, partition=0)
    assert tp.flush(20) == 0
    harness.wait_txn_markers(src.bootstrap, TOPIC, open_transactions=1)
    return idem, tp


def _seal_metric(mg, kind: str) -> float:
    return mg.metrics().sum("mirrorguard_seal_events_total", mirror=MIRROR, kind=kind)


def _check_seal(batches, cut: int, open_pid: int, open_epoch: int, source_cid: str):
    """ABORT marker(s) for the open transaction, then the barrier, at cut, cut+1."""
    assert [b.kind for b in batches] == ["abort", "barrier"], [b.kind for b in batches]
    abort, barrier = batches
    assert (abort.base_offset, barrier.base_offset) == (cut, cut + 1)
    assert abort.attributes == 0x30 and abort.is_control and abort.is_transactional
    assert abort.producer_id == open_pid and abort.producer_epoch == open_epoch
    assert abort.base_sequence == -1 and abort.last_offset == abort.base_offset
    version, _coordinator_epoch = decode_end_txn_value(abort.control_value)
    assert version == 0
    assert barrier.attributes == 0x20 and barrier.is_control and not barrier.is_transactional
    assert barrier.producer_id == -1 and barrier.producer_epoch == -1 and barrier.base_sequence == -1
    assert barrier.control_type == 7
    assert len(barrier.values) == 1 and barrier.last_offset == barrier.base_offset
    assert decode_barrier_value(barrier.control_value) == (0, source_cid)


# scripts/test.sh --quick runs the seal at Fetch v12.
@pytest.mark.parametrize("version", [pytest.param(12, marks=pytest.mark.quick), 13, 4])
def test_stop_seals_open_transaction_then_stopped(kafka_factory, kafka1, mirror_factory, version):
    src, state, mg = _setup(kafka_factory, kafka1, mirror_factory)
    idem, tp = _open_transaction_on_source(src)
    hw = high_watermark(src.bootstrap, TOPIC)
    f = StandInFetcher(TOPIC, version=version).connect(mg.mirrors[MIRROR].bootstrap)
    f.catch_up(hw)
    cut = f.leo
    assert cut == hw
    open_batches = [b for b in f.log if b.is_transactional and not b.is_control]
    open_pid, open_epoch = open_batches[-1].producer_id, open_batches[-1].producer_epoch
    src_open = [b for b in direct_batches(src.bootstrap, TOPIC) if b.is_transactional and not b.is_control][-1]
    assert open_pid == map_pid(src_open.producer_id, fold(src.cluster_id))

    status, body = mg.post("stop", MIRROR, TOPIC, [0])
    assert status == 200, body
    e = mg.partition(TOPIC, 0)
    assert e["state"] == "STOPPING" and e["cut"] is None, e
    assert "waiting for the destination fetcher" in (e["reason"] or ""), e

    # The source keeps receiving data after the stop: it must never reach the fetcher.
    send(idem, TOPIC, [b"after-stop-%d" % i for i in range(3)])
    tp.commit_transaction(20)
    assert high_watermark(src.bootstrap, TOPIC) > hw

    res, got = f.fetch_once()
    _check_seal(got, cut, open_pid, open_epoch, src.cluster_id)
    assert res.high_watermark == cut + 2 and res.last_stable_offset == cut + 2
    assert f.leo == cut + 2
    # SPEC 3.4: stamped with the partition leader epoch of the last mirrored batch
    print("leader epochs: data", [b.leader_epoch for b in f.log[:-2]], "seal", [b.leader_epoch for b in got])
    assert all(b.leader_epoch == f.log[-3].leader_epoch for b in got)
    e = mg.partition(TOPIC, 0)
    assert e["state"] == "STOPPING" and e["cut"] == cut and e["seal_batches"] == 2, e

    # fetch at cut + n: STOPPED is persisted; from then on nothing, forever
    for _ in range(3):
        res, got = f.fetch_once()
        assert got == [] and not res.records, res
    e = mg.partition(TOPIC, 0)
    assert e["state"] == "STOPPED" and e["cut"] == cut, e
    # A broker holds a Fetch that finds nothing for MaxWaitMs; so does the local answer of
    # a STOPPED partition, so that its fetcher polls at its own pace instead of spinning.
    t0 = time.monotonic()
    res, got = f.fetch_once(max_wait_ms=500)
    took = time.monotonic() - t0
    assert got == [] and not res.records and 0.45 <= took < 5, took
    assert [b.kind for b in f.log[-2:]] == ["abort", "barrier"]
    assert not any(v and v.startswith(b"after-stop") for b in f.log for v in b.values)
    assert sum(1 for b in f.log if b.kind == "barrier") == 1
    f.close()

    assert _seal_metric(mg, "abort_marker_served") == 1
    assert _seal_metric(mg, "barrier_served") == 1
    assert _seal_metric(mg, "seal_completed") == 1
    assert mg.metrics().sum("mirrorguard_partitions", state="STOPPED") == 1

    # Every transition is in __mirror_state (type 4), read with a Kafka consumer.
    states = [r for r in read_state_records(state.bootstrap, mg.state_topic) if r.type == 4 and r.key["partition"] == 0]
    codes = [r.value["state"] for r in states]
    assert codes[0] == 2 and codes[-1] == 3, codes  # STOPPING ... STOPPED
    assert states[-1].value["cut"] == cut and states[-1].value["seal_batches"] == 2
    assert states[-1].value["source_cluster_id"] == src.cluster_id and states[-1].value["mirror"] == MIRROR


def test_fetch_past_the_seal_end_fails_it_on_a_single_replica_destination(kafka_factory, kafka1, mirror_factory):
    """SPEC 3, step 5: a seal completes only when the fetcher fetches exactly at its end. A
    fetch by the fetcher past the end while the seal is not complete is an inconsistency
    (something else wrote there: a reader that took the cut, another writer): on a
    destination that never truncates (`stopped_when = "fetcher_offset"`, one replica) it
    makes the partition FAILED with the reason (before: STOPPED, with the markers and the
    barrier never appended), and a fetch at the end no longer completes it.
    (test_seal_integrity.py has the multi-replica case, where the destination's high
    watermark tells an inconsistency from a replica about to be truncated.)"""
    src, _state, mg = _setup(kafka_factory, kafka1, mirror_factory)
    _idem, _tp = _open_transaction_on_source(src)
    f = StandInFetcher(TOPIC).connect(mg.mirrors[MIRROR].bootstrap)
    f.catch_up(high_watermark(src.bootstrap, TOPIC))
    cut = f.leo
    status, body = mg.post("stop", MIRROR, TOPIC, [0])
    assert status == 200, body
    _res, got = f.fetch_once()
    assert [b.kind for b in got] == ["abort", "barrier"] and f.leo == cut + 2
    # A replica whose log ends 5 records past the seal's end.
    f.leo = cut + 2 + 5
    res, got = f.fetch_once()
    assert got == [] and not res.records, res
    harness.wait_until(lambda: mg.partition(TOPIC, 0)["state"] == "FAILED", 15,
                       what="the seal failed by the fetch past its end")
    e = mg.partition(TOPIC, 0)
    assert "fetched at %d, past the seal's end %d" % (cut + 7, cut + 2) in e["reason"], e
    assert _seal_metric(mg, "seal_failed_past_end") == 1
    # FAILED is final: the fetch at the end completes nothing.
    f.leo = cut + 2
    res, got = f.fetch_once()
    assert got == [] and not res.records, res
    assert mg.partition(TOPIC, 0)["state"] == "FAILED"
    assert _seal_metric(mg, "seal_completed") == 0
    f.close()


def test_pause_holds_data_resume_continues(kafka_factory, kafka1, mirror_factory):
    src, state, mg = _setup(kafka_factory, kafka1, mirror_factory)
    idem = idempotent_producer(src.bootstrap)
    send(idem, TOPIC, [b"one-%d" % i for i in range(3)])
    f = StandInFetcher(TOPIC).connect(mg.mirrors[MIRROR].bootstrap)
    f.catch_up(high_watermark(src.bootstrap, TOPIC))
    paused_at = f.leo

    status, body = mg.post("pause", MIRROR, TOPIC)
    assert status == 200, body
    assert mg.partition(TOPIC, 0)["state"] == "PAUSED"
    send(idem, TOPIC, [b"two-%d" % i for i in range(3)])
    for _ in range(3):
        res, got = f.fetch_once()
        assert got == [] and not res.records
    assert f.leo == paused_at

    status, body = mg.post("resume", MIRROR, TOPIC)
    assert status == 200, body
    assert mg.partition(TOPIC, 0)["state"] == "MIRRORING"
    send(idem, TOPIC, [b"three-%d" % i for i in range(2)])
    f.catch_up(high_watermark(src.bootstrap, TOPIC))
    f.close()
    direct = direct_batches(src.bootstrap, TOPIC)
    assert [(b.base_offset, b.values) for b in f.log] == [(b.base_offset, b.values) for b in direct]
    assert [v for b in f.log for v in b.values] == (
        [b"one-%d" % i for i in range(3)] + [b"two-%d" % i for i in range(3)] + [b"three-%d" % i for i in range(2)]
    )
    assert sum(1 for b in f.log if b.is_control) == 0, "pause must not seal"


def test_stop_all_leaves_out_a_source_topic_the_destination_never_created(kafka_factory, kafka1, mirror_factory):
    """A disaster `stop --all` covers the source's topics. One the destination never created
    (nothing of it mirrored, no topic id to key its record by) is left out and named in the
    answer; before, it failed the whole stop with 503 and nothing was stopped."""
    src, state, mg = _setup(kafka_factory, kafka1, mirror_factory, partitions=2)
    only_on_source = harness.topic_name("src-only")
    harness.create_topics(src.bootstrap, [only_on_source], partitions=3)
    harness.wait_until(lambda: mg.post("stop", MIRROR, only_on_source, [0])[1].get("error") != "unknown_topic",
                       30, interval=0.5, what="mirrorguard knows the new source topic")
    # Named on its own it is still refused (the operator asked for it), and changes nothing.
    status, body = mg.post("stop", MIRROR, only_on_source, [0])
    assert status == 503 and body["error"] == "transition_failed" and body["applied"] == [], body
    assert "does not exist on the destination" in body["message"], body
    assert {p["state"] for p in mg.partitions()} <= {"MIRRORING"}, mg.partitions()

    status, body = mg.post("stop", MIRROR, all_=True)
    assert status == 200, body
    assert sorted((p["topic"], p["partition"], p["state"]) for p in body["applied"]) == [
        (TOPIC, 0, "STOPPING"), (TOPIC, 1, "STOPPING")]
    assert body["skipped"] == [{"topic": only_on_source, "reason": "no_destination_topic"}], body
    assert sorted((p["topic"], p["partition"]) for p in mg.partitions() if p["state"] != "MIRRORING") == [
        (TOPIC, 0), (TOPIC, 1)]
    assert "left out of --all" in mg.log_text()


def test_api_errors_change_nothing(kafka_factory, kafka1, mirror_factory):
    src, state, mg = _setup(kafka_factory, kafka1, mirror_factory, partitions=2)
    status, body = mg.post("stop", MIRROR, TOPIC, [0])
    assert status == 200, body
    snapshot = mg.partitions()
    assert [(p["partition"], p["state"]) for p in snapshot] == [(0, "STOPPING"), (1, "MIRRORING")]
    state_records = len(read_state_records(state.bootstrap, mg.state_topic))

    cases = [
        # (what, request kwargs, expected status, expected error code)
        ("stop twice", dict(op="stop", mirror=MIRROR, topic=TOPIC, partitions=[0]), 409, "transition_not_allowed"),
        ("pause a STOPPING partition", dict(op="pause", mirror=MIRROR, topic=TOPIC, partitions=[0]), 409,
         "transition_not_allowed"),
        ("resume a STOPPING partition", dict(op="resume", mirror=MIRROR, topic=TOPIC), 409, "transition_not_allowed"),
        ("unknown partition", dict(op="stop", mirror=MIRROR, topic=TOPIC, partitions=[7]), 404, "unknown_partition"),
        ("negative partition", dict(op="stop", mirror=MIRROR, topic=TOPIC, partitions=[-1]), 404, "unknown_partition"),
        ("unknown topic", dict(op="stop", mirror=MIRROR, topic="nope"), 404, "unknown_topic"),
        ("unknown mirror", dict(op="stop", mirror="nope", topic=TOPIC), 404, "unknown_mirror"),
        ("no token", dict(op="stop", mirror=MIRROR, topic=TOPIC, token=None), 401, "missing_token"),
        ("wrong token", dict(op="stop", mirror=MIRROR, topic=TOPIC, token="wrong"), 401, "bad_token"),
    ]
    # one bad item in a request: nothing of it is applied (p1 stays MIRRORING)
    mixed = [
        ("valid p1 + unknown partition", {"mirror": MIRROR, "topics": [{"topic": TOPIC, "partitions": [1, 9]}]},
         "stop", 404, "unknown_partition"),
        ("valid p1 + unknown topic", {"mirror": MIRROR, "topics": [{"topic": TOPIC, "partitions": [1]},
                                                                   {"topic": "nope"}]}, "pause", 404, "unknown_topic"),
        ("p1 + STOPPING p0", {"mirror": MIRROR, "topics": [{"topic": TOPIC, "partitions": [1, 0]}]}, "pause", 409,
         "transition_not_allowed"),
        ("all, one STOPPING", {"mirror": MIRROR, "all": True}, "pause", 409, "transition_not_allowed"),
        ("resume a MIRRORING partition", {"mirror": MIRROR, "topics": [{"topic": TOPIC, "partitions": [1]}]},
         "resume", 409, "transition_not_allowed"),
    ]
    for what, body, op, want_status, want_code in mixed:
        status, resp = mg.request("POST", f"/v1/partitions/{op}", body)
        assert status == want_status, (what, status, resp)
        assert isinstance(resp, dict) and resp.get("error") == want_code and resp.get("message"), (what, resp)
        assert mg.partitions() == snapshot, what
    for what, kw, want_status, want_code in cases:
        op = kw.pop("op")
        status, body = mg.post(op, **kw)
        assert status == want_status, (what, status, body)
        assert isinstance(body, dict) and body.get("error") == want_code and body.get("message"), (what, body)
        assert mg.partitions() == snapshot, what

    raw_cases = [
        ("bad JSON", b"{not json", 400),
        ("wrong shape", b'{"mirror": 5}', 400),
        ("unknown field", b'{"mirror": "a-to-b", "all": true, "bogus": 1}', 400),
        ("neither topics nor all", b'{"mirror": "a-to-b"}', 400),
        ("both topics and all", b'{"mirror": "a-to-b", "all": true, "topics": [{"topic": "t"}]}', 400),
    ]
    for what, raw, want_status in raw_cases:
        status, body = mg.request("POST", "/v1/partitions/pause", raw)
        assert status == want_status, (what, status, body)
        assert isinstance(body, dict) and body.get("message"), (what, body)
        assert mg.partitions() == snapshot, what
    # the token is checked before the body is even parsed
    status, body = mg.request("POST", "/v1/partitions/stop", b"{not json", token=None)
    assert status == 401, body

    assert len(read_state_records(state.bootstrap, mg.state_topic)) == state_records, "an error must persist nothing"

    # the same through `mirrorguard ctl`
    out = subprocess.run(
        [str(harness.MIRRORGUARD_BIN), "ctl", "--admin", f"127.0.0.1:{mg.admin_port}", "--token-file",
         str(mg.token_path), "stop", "--mirror", MIRROR, "--topic", TOPIC],
        capture_output=True, text=True, timeout=20,
    )
    text = out.stdout + out.stderr
    assert out.returncode != 0 and ("409" in text or "transition_not_allowed" in text), out
    assert mg.partitions() == snapshot
    # and a successful read through `mirrorguard ctl`: exit 0, the API's JSON
    out = subprocess.run(
        [str(harness.MIRRORGUARD_BIN), "ctl", "--admin", f"127.0.0.1:{mg.admin_port}", "partitions"],
        capture_output=True, text=True, timeout=20,
    )
    assert out.returncode == 0, out
    assert json.loads(out.stdout)["partitions"] == snapshot, out


def _kill9_mid_seal(kafka_factory, kafka1, mirror_factory, appended: bool):
    """Stop with a transaction open; the fetcher fetches at the cut (the cut is taken and
    persisted, the seal served); then mirrorguard is killed with -9 before the fetcher
    fetched past the seal, and restarted. `appended`: whether the destination appended
    the sealing batches before the crash (if not, it fetches at the cut again)."""
    src, state, mg = _setup(kafka_factory, kafka1, mirror_factory)
    idem, tp = _open_transaction_on_source(src, "txn-kill")
    f = StandInFetcher(TOPIC, version=12).connect(mg.mirrors[MIRROR].bootstrap)
    f.catch_up(high_watermark(src.bootstrap, TOPIC))
    cut = f.leo
    open_b = [b for b in f.log if b.is_transactional and not b.is_control][-1]

    status, body = mg.post("stop", MIRROR, TOPIC, [0])
    assert status == 200, body
    if appended:
        _, first_seal = f.fetch_once()
    else:
        lost = StandInFetcher(TOPIC, version=12).connect(mg.mirrors[MIRROR].bootstrap)
        lost.leo, lost.last_fetched_epoch = f.leo, f.last_fetched_epoch
        _, first_seal = lost.fetch_once()
        lost.close()
    _check_seal(first_seal, cut, open_b.producer_id, open_b.producer_epoch, src.cluster_id)
    e = mg.partition(TOPIC, 0)
    assert e["state"] == "STOPPING" and e["cut"] == cut, e

    mg.kill9()
    send(idem, TOPIC, [b"while-down-%d" % i for i in range(2)])
    tp.commit_transaction(20)
    mg.start()

    e = mg.partition(TOPIC, 0)
    assert e["state"] == "STOPPING" and e["cut"] == cut and e["seal_batches"] == 2, e
    f.connect(mg.mirrors[MIRROR].bootstrap)
    _, got = f.fetch_once()
    if appended:
        assert got == [], "the seal was already appended: nothing more may come"
    else:
        _check_seal(got, cut, open_b.producer_id, open_b.producer_epoch, src.cluster_id)
        assert [(b.base_offset, b.kind, b.producer_id, b.producer_epoch, b.control_value) for b in got] == [
            (b.base_offset, b.kind, b.producer_id, b.producer_epoch, b.control_value) for b in first_seal
        ]
        # Byte for byte, timestamps and CRCs included: two destination replicas that got the
        # seal from before and after the restart hold the same bytes at each offset.
        assert [b.raw for b in got] == [b.raw for b in first_seal]
    for _ in range(3):
        res, more = f.fetch_once()
        assert more == [] and not res.records, "a second barrier or source data after the seal"
    assert f.leo == cut + 2
    assert mg.partition(TOPIC, 0)["state"] == "STOPPED"
    assert [b.kind for b in f.log[-2:]] == ["abort", "barrier"]
    assert sum(1 for b in f.log if b.kind == "barrier") == 1
    return src, state, mg, f


@pytest.mark.parametrize("appended", [False, True], ids=["seal-lost", "seal-appended"])
def test_kill9_mid_seal_restart_completes_seal_once(kafka_factory, kafka1, mirror_factory, appended):
    src, state, mg, f = _kill9_mid_seal(kafka_factory, kafka1, mirror_factory, appended)
    assert _seal_metric(mg, "seal_completed") == 1

    # STOPPED survives a restart; fetches are answered locally, never forwarded.
    mg.restart()
    assert mg.partition(TOPIC, 0)["state"] == "STOPPED"
    send(idempotent_producer(src.bootstrap), TOPIC, [b"after-restart-%d" % i for i in range(3)])
    assert high_watermark(src.bootstrap, TOPIC) > f.leo
    f.connect(mg.mirrors[MIRROR].bootstrap)
    for _ in range(3):
        res, more = f.fetch_once()
        assert more == [] and not res.records
    f.close()
    assert mg.partition(TOPIC, 0)["state"] == "STOPPED"
    assert _seal_metric(mg, "barrier_served") == 0 and _seal_metric(mg, "abort_marker_served") == 0


def test_kill9_mid_seal_restart_counts_reserved_seal(kafka_factory, kafka1, mirror_factory):
    _src, _state, mg, f = _kill9_mid_seal(kafka_factory, kafka1, mirror_factory, appended=False)
    f.close()
    served = {k: _seal_metric(mg, k) for k in ("abort_marker_served", "barrier_served", "seal_completed")}
    assert served == {"abort_marker_served": 1, "barrier_served": 1, "seal_completed": 1}, served


def _restart_while_mirroring_then_stop(kafka_factory, kafka1, mirror_factory, kill: bool):
    src, state, mg = _setup(kafka_factory, kafka1, mirror_factory)
    _idem, tp = _open_transaction_on_source(src, "txn-restart")
    f = StandInFetcher(TOPIC, version=12).connect(mg.mirrors[MIRROR].bootstrap)
    f.catch_up(high_watermark(src.bootstrap, TOPIC))
    cut = f.leo
    open_b = [b for b in f.log if b.is_transactional and not b.is_control][-1]
    if kill:
        mg.kill9()
        mg.start()
    else:
        mg.restart()  # SIGTERM, partition still MIRRORING
    mg.wait_sources_known()
    status, body = mg.post("stop", MIRROR, TOPIC, [0])
    assert status == 200, body
    f.connect(mg.mirrors[MIRROR].bootstrap)
    _, got = f.fetch_once()
    _check_seal(got, cut, open_b.producer_id, open_b.producer_epoch, src.cluster_id)
    f.close()


def test_graceful_restart_while_mirroring_then_stop_aborts_open_transaction(kafka_factory, kafka1, mirror_factory):
    _restart_while_mirroring_then_stop(kafka_factory, kafka1, mirror_factory, kill=False)


def test_kill9_before_any_snapshot_then_stop_aborts_open_transaction(kafka_factory, kafka1, mirror_factory):
    _restart_while_mirroring_then_stop(kafka_factory, kafka1, mirror_factory, kill=True)


@pytest.mark.parametrize("n_open", [0, 2])
def test_seal_has_one_abort_marker_per_open_transaction(kafka_factory, kafka1, mirror_factory, n_open):
    """0 open transactions: the barrier alone at the cut; 2 open: two ABORT markers in the
    order of the transactions' first offsets, then the barrier. Paused first, then stopped
    (PAUSED -> STOPPING is allowed). (This used `all: true`, which on a Kafka source also
    selects its internal topics: see test_all_selects_only_mirrorable_topics.)"""
    src, state, mg = _setup(kafka_factory, kafka1, mirror_factory)
    fl = fold(src.cluster_id)
    idem = idempotent_producer(src.bootstrap)
    send(idem, TOPIC, [b"idem-0"])
    producers = []
    for i in range(2):
        tp = transactional_producer(src.bootstrap, f"txn-{i}")
        txn(tp, TOPIC, [b"done-%d" % i], commit=True)
        producers.append(tp)
    for i, tp in enumerate(producers[:n_open]):
        tp.begin_transaction()
        tp.produce(TOPIC, value=b"open-%d" % i, partition=0)
        assert tp.flush(20) == 0
    harness.wait_txn_markers(src.bootstrap, TOPIC, open_transactions=n_open)
    f = StandInFetcher(TOPIC).connect(mg.mirrors[MIRROR].bootstrap)
    f.catch_up(high_watermark(src.bootstrap, TOPIC))
    cut = f.leo
    firsts = {}
    for b in f.log:
        if b.is_transactional and not b.is_control and b.values[0].startswith(b"open-"):
            firsts[b.producer_id] = (b.base_offset, b.producer_epoch)
    assert len(firsts) == n_open

    status, body = mg.post("pause", MIRROR, TOPIC)
    assert status == 200, body
    res, got = f.fetch_once()
    assert got == []
    status, body = mg.post("stop", MIRROR, TOPIC)
    assert status == 200, body
    assert [e["state"] for e in body["applied"]] == ["STOPPING"], body

    _, got = f.fetch_once()
    kinds = [b.kind for b in got]
    assert kinds == ["abort"] * n_open + ["barrier"], kinds
    assert [b.base_offset for b in got] == list(range(cut, cut + n_open + 1))
    expected = sorted(firsts.items(), key=lambda kv: (kv[1][0], kv[0]))
    assert [(b.producer_id, b.producer_epoch) for b in got[:-1]] == [(pid, ep) for pid, (_, ep) in expected]
    txn_pids = {b.producer_id for b in direct_batches(src.bootstrap, TOPIC) if b.is_transactional}
    assert len(txn_pids) == 2, txn_pids
    for b in got[:-1]:
        assert b.producer_id in {map_pid(p, fl) for p in txn_pids} and b.attributes == 0x30
    assert decode_barrier_value(got[-1].control_value) == (0, src.cluster_id)
    f.fetch_once()
    e = mg.partition(TOPIC, 0)
    assert e["state"] == "STOPPED" and e["cut"] == cut and e["seal_batches"] == n_open + 1, e
    assert _seal_metric(mg, "abort_marker_served") == n_open
    f.close()


def test_stopped_partition_spliced_out_of_multi_partition_fetches(kafka_factory, kafka1, mirror_factory):
    """t has 2 partitions; p0 is sealed and STOPPED, p1 keeps mirroring. A librdkafka
    consumer (check.crcs) reading both through the mirror listener sends fetches naming
    both partitions: the proxy forwards them and replaces p0's entry, so p1's data flows
    (also what the source got after the stop) and p0's post-stop data never shows up."""
    src, state, mg = _setup(kafka_factory, kafka1, mirror_factory, partitions=2)
    idem = idempotent_producer(src.bootstrap)
    send(idem, TOPIC, [b"p0-before-%d" % i for i in range(3)], partition=0)
    send(idem, TOPIC, [b"p1-before-%d" % i for i in range(3)], partition=1)
    f = StandInFetcher(TOPIC, partition=0).connect(mg.mirrors[MIRROR].bootstrap)
    f.catch_up(high_watermark(src.bootstrap, TOPIC, 0))
    status, body = mg.post("stop", MIRROR, TOPIC, [0])
    assert status == 200, body
    f.follow(lambda x: x.log and x.log[-1].kind == "barrier", what="barrier")
    f.fetch_once()
    f.close()
    assert mg.partition(TOPIC, 0)["state"] == "STOPPED"
    assert mg.partition(TOPIC, 1)["state"] == "MIRRORING"
    send(idem, TOPIC, [b"p0-after-%d" % i for i in range(3)], partition=0)
    send(idem, TOPIC, [b"p1-after-%d" % i for i in range(3)], partition=1)

    from confluent_kafka import TopicPartition
    import time

    c = harness.new_consumer(mg.mirrors[MIRROR].bootstrap, **{
        "group.id": "mg-splice", "enable.auto.commit": False, "fetch.wait.max.ms": 100,
        "check.crcs": True, "enable.partition.eof": False})
    c.assign([TopicPartition(TOPIC, 0, 0), TopicPartition(TOPIC, 1, 0)])
    got = {0: [], 1: []}
    deadline = time.monotonic() + 15
    while len(got[1]) < 6 and time.monotonic() < deadline:
        for m in c.consume(10, timeout=0.5):
            assert not m.error(), m.error()
            got[m.partition()].append(m.value())
    # a little longer, in case p0 data would still arrive
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        for m in c.consume(10, timeout=0.2):
            assert not m.error(), m.error()
            got[m.partition()].append(m.value())
    c.close()
    assert got[1] == [b"p1-before-%d" % i for i in range(3)] + [b"p1-after-%d" % i for i in range(3)]
    assert not any(v.startswith(b"p0-after") for v in got[0]), got[0]


def test_kill9_while_mirroring_then_stop_aborts_open_transaction_from_snapshot(kafka_factory, kafka1, mirror_factory):
    """A snapshot (type 5, every 200 ms here) holds the open transaction; kill -9; restart;
    stop: the seal still carries its ABORT marker."""
    src, state, mg = _setup(kafka_factory, kafka1, mirror_factory, snapshot_interval_ms=200)
    _idem, tp = _open_transaction_on_source(src, "txn-snap")
    f = StandInFetcher(TOPIC, version=12).connect(mg.mirrors[MIRROR].bootstrap)
    f.catch_up(high_watermark(src.bootstrap, TOPIC))
    cut = f.leo
    open_b = [b for b in f.log if b.is_transactional and not b.is_control][-1]

    def snapshotted():
        return any(r.type == 5 and r.value and any(p["producer_id"] == open_b.producer_id
                                                   and p["txn_first_offset"] >= 0 for p in r.value["producers"])
                   for r in read_state_records(state.bootstrap, mg.state_topic))

    harness.wait_until(snapshotted, 10, interval=0.2, what="a snapshot with the open transaction")
    mg.kill9()
    mg.start()
    mg.wait_sources_known()
    status, body = mg.post("stop", MIRROR, TOPIC, [0])
    assert status == 200, body
    f.connect(mg.mirrors[MIRROR].bootstrap)
    _, got = f.fetch_once()
    _check_seal(got, cut, open_b.producer_id, open_b.producer_epoch, src.cluster_id)
    f.fetch_once()
    assert mg.partition(TOPIC, 0)["state"] == "STOPPED"


def test_all_selects_only_mirrorable_topics(kafka_factory, kafka1, mirror_factory):
    src, state, mg = _setup(kafka_factory, kafka1, mirror_factory)
    tp = transactional_producer(src.bootstrap, "txn-internal")  # creates __transaction_state
    txn(tp, TOPIC, [b"done"], commit=True)
    harness.wait_until(lambda: any(t.startswith("__") for t in harness.admin(src.bootstrap).list_topics(
        timeout=5).topics), 10, what="__transaction_state on the source")
    mg.restart()  # learns the source's topics again
    mg.wait_sources_known()
    listed = {p["topic"] for p in mg.partitions()}
    assert listed == {TOPIC}, listed
    status, body = mg.post("pause", MIRROR, all_=True)
    assert status == 200, body
    assert [(e["topic"], e["state"]) for e in body["applied"]] == [(TOPIC, "PAUSED")], body
