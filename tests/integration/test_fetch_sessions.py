"""The mirror fetch path under a fetcher that keeps KIP-227 incremental fetch sessions
(session_fetcher.py, modelled on Kafka's FetchSessionHandler), with Apache Kafka as the
source (Kafka keeps fetch sessions; Tansu answers session 0 to everything).

SPEC 3: a PAUSED, STOPPING or STOPPED partition never receives source records or source
errors, listed in the request or not; the session keeps working, with at most one session
error (FETCH_SESSION_ID_NOT_FOUND / INVALID_FETCH_SESSION_EPOCH) per seal, then recovery.

The source cluster is also the state cluster here, so the destination topic (same name)
exists where mirrorguard looks its id up; each test has its own `__mirror_state` topic.
"""

from __future__ import annotations

import time

import pytest

import harness
from mirror_harness import (  # noqa: F401 - mirror_factory is a fixture
    with_state_topic,
    MirrorSpec,
    high_watermark,
    idempotent_producer,
    mirror_factory,
    send,
    transactional_producer,
)
from kafka_dest import kafka_dest_factory  # noqa: F401 - fixture
from session_fetcher import SessionFetcher

MIRROR = "src-to-dst"


def start_mirror(kafka, mirror_factory, topic: str, **kw):
    mg = mirror_factory(kafka.bootstrap, [MirrorSpec(MIRROR, kafka.bootstrap, node_ids=list(kafka.node_ids))],
                        start=False, **kw)
    text = with_state_topic(mg.config_path.read_text(), f"__mirror_state_{topic}")
    mg.config_path.write_text(text)
    mg.start()
    mg.wait_sources_known()
    return mg


def data_batches(log, after_request: int = 0):
    """Data (non-control) batches any response carried after request number `after_request`."""
    return [(n, b) for n, b in log.received if n > after_request and not b.is_control]


def follow(f: SessionFetcher, until, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not reached in {timeout}s; logs "
                               f"{ {p: (l.leo, [b.kind for b in l.batches[-4:]]) for p, l in f.logs.items()} }, "
                               f"session errors {f.session_errors}")
        f.fetch_once()


@pytest.mark.parametrize("version,flowing", [(12, True), (13, True), (13, False)],
                         ids=["v12-flowing", "v13-flowing", "v13-idle"])
def test_stopped_partition_left_out_of_incremental_requests_gets_no_source_data(
        kafka1, mirror_factory, version, flowing):
    """flowing: p0 and p1 get data just before the stop, so the fetcher lists both in its
    next incremental request (the cut is taken from it); idle: p0 is left out of the
    requests when the stop comes (the cut needs one full fetch: one session error)."""
    topic = harness.topic_name("sess")
    harness.create_topics(kafka1.bootstrap, [topic], partitions=2)
    mg = start_mirror(kafka1, mirror_factory, topic)
    prod = idempotent_producer(kafka1.bootstrap)
    for p in (0, 1):
        send(prod, topic, [b"before-%d-%d" % (p, i) for i in range(5)], partition=p)
    hw = {p: high_watermark(kafka1.bootstrap, topic, p) for p in (0, 1)}

    f = SessionFetcher(topic, [0, 1], version=version).connect(mg.mirrors[MIRROR].bootstrap)
    follow(f, lambda: all(f.logs[p].leo >= hw[p] for p in (0, 1)), "caught up")
    # A few idle incremental rounds: the session lists nothing now (offsets unchanged).
    for _ in range(3):
        f.fetch_once()
    assert f.session_id != 0 and f.epoch > 1, "the source keeps a fetch session"
    assert f.session_errors == []
    # Both partitions are flowing when the stop comes: their fetch states differ from the
    # ones the source's session holds, so the fetcher lists both in the next incremental
    # request (which must still reach the source for p1).
    if flowing:
        for p in (0, 1):
            send(prod, topic, [b"flowing-%d" % p], partition=p)
        hw = {p: high_watermark(kafka1.bootstrap, topic, p) for p in (0, 1)}
        follow(f, lambda: all(f.logs[p].leo >= hw[p] for p in (0, 1)), "both flowing")

    status, body = mg.post("stop", MIRROR, topic, [0])
    assert status == 200, body
    stop_at = f.requests
    cut = f.logs[0].leo

    # The source keeps receiving data on both partitions while p0 is sealed and after.
    for round_ in range(6):
        for p in (0, 1):
            send(prod, topic, [b"after-%d-%d-%d" % (round_, p, i) for i in range(3)], partition=p)
        for _ in range(4):
            f.fetch_once()
    hw1 = high_watermark(kafka1.bootstrap, topic, 1)
    follow(f, lambda: f.logs[1].leo >= hw1 and (mg.partition(topic, 0) or {}).get("state") == "STOPPED",
           "p1 caught up and p0 STOPPED")
    for _ in range(5):  # idle incremental rounds after the seal
        send(prod, topic, [b"late-0"], partition=0)
        f.fetch_once()
    # A lost response: the fetcher starts a new full session from its positions.
    f.lose_next_response()
    f.fetch_once()
    for _ in range(4):
        send(prod, topic, [b"late-1"], partition=0)
        f.fetch_once()

    leaked = data_batches(f.logs[0], stop_at)
    print(f"requests {f.requests} (incremental {f.incremental_requests}), session errors {f.session_errors}, "
          f"p0 data batches after the stop: {len(leaked)} in "
          f"{len({n for n, _ in leaked})} responses, first offsets {[b.base_offset for _, b in leaked[:5]]}")
    assert leaked == [], "source records reached a STOPPING/STOPPED partition"
    assert f.logs[0].violations == [] and f.logs[1].violations == []
    assert f.logs[0].errors == [], f"source errors reached p0: {f.logs[0].errors}"
    # The seal: the barrier at the cut (no open transaction), nothing after it.
    kinds = [b.kind for b in f.logs[0].batches]
    assert kinds[-1] == "barrier" and f.logs[0].batches[-1].base_offset == cut, (kinds[-3:], cut)
    assert f.logs[0].leo == cut + 1
    # p1 mirrored everything, in order, with the session alive.
    assert f.logs[1].leo == hw1
    values1 = [v for b in f.logs[1].batches for v in b.values]
    assert len(values1) == 5 + int(flowing) + 6 * 3
    assert [v for b in f.logs[0].batches if not b.is_control for v in b.values] == \
        [b"before-0-%d" % i for i in range(5)] + [b"flowing-0"] * int(flowing)
    assert len(f.session_errors) <= 1, f.session_errors
    assert f.session_id != 0 and f.epoch > 1, "the session recovered"
    # p0 left the source's session: the source never sent it again (nothing to drop).
    strays = mg.metrics().sum("mirrorguard_seal_events_total", mirror=MIRROR, kind="stray_partition_dropped")
    assert strays == 0, f"the source kept sending p0 ({strays} entries dropped)"


def test_pause_and_resume_in_an_incremental_session(kafka1, mirror_factory):
    topic = harness.topic_name("sess-pause")
    harness.create_topics(kafka1.bootstrap, [topic], partitions=2)
    mg = start_mirror(kafka1, mirror_factory, topic)
    prod = idempotent_producer(kafka1.bootstrap)
    for p in (0, 1):
        send(prod, topic, [b"a-%d-%d" % (p, i) for i in range(3)], partition=p)
    hw = {p: high_watermark(kafka1.bootstrap, topic, p) for p in (0, 1)}
    f = SessionFetcher(topic, [0, 1], version=13).connect(mg.mirrors[MIRROR].bootstrap)
    follow(f, lambda: all(f.logs[p].leo >= hw[p] for p in (0, 1)), "caught up")
    f.fetch_once()

    status, body = mg.post("pause", MIRROR, topic, [0])
    assert status == 200, body
    paused_at = f.requests
    for round_ in range(4):
        for p in (0, 1):
            send(prod, topic, [b"paused-%d-%d" % (round_, p)], partition=p)
        for _ in range(3):
            f.fetch_once()
    assert data_batches(f.logs[0], paused_at) == [], "a PAUSED partition received source records"
    assert f.logs[0].errors == []
    errors_while_paused = len(f.session_errors)

    status, body = mg.post("resume", MIRROR, topic, [0])
    assert status == 200, body
    hw = {p: high_watermark(kafka1.bootstrap, topic, p) for p in (0, 1)}
    follow(f, lambda: all(f.logs[p].leo >= hw[p] for p in (0, 1)), "both partitions caught up after resume")
    print(f"session errors {f.session_errors} (while paused {errors_while_paused})")
    # At most one session error to put the resumed partition back into the session.
    assert len(f.session_errors) <= 1, f.session_errors
    values0 = [v for b in f.logs[0].batches for v in b.values]
    assert values0 == [b"a-0-%d" % i for i in range(3)] + [b"paused-%d-0" % r for r in range(4)]


def test_session_error_from_the_source_passes_without_local_partitions(kafka1, mirror_factory):
    """A session error from the source (here: a fetcher that lost track of its epoch) is a
    request-level answer: the sealed partition's entry is not added to it, the fetcher
    starts a new session and the seal is served then."""
    topic = harness.topic_name("sess-err")
    harness.create_topics(kafka1.bootstrap, [topic], partitions=2)
    mg = start_mirror(kafka1, mirror_factory, topic)
    prod = idempotent_producer(kafka1.bootstrap)
    for p in (0, 1):
        send(prod, topic, [b"x-%d" % p], partition=p)
    f = SessionFetcher(topic, [0, 1], version=13).connect(mg.mirrors[MIRROR].bootstrap)
    follow(f, lambda: all(f.logs[p].leo >= 1 for p in (0, 1)), "caught up")
    for p in (0, 1):
        send(prod, topic, [b"y-%d" % p], partition=p)
    follow(f, lambda: all(f.logs[p].leo >= 2 for p in (0, 1)), "both flowing")
    status, body = mg.post("stop", MIRROR, topic, [0])
    assert status == 200, body
    stop_at = f.requests
    f.epoch += 7  # the source answers INVALID_FETCH_SESSION_EPOCH
    res = f.fetch_once()
    assert res.top_error == 71 and f.session_errors == [71], (res.top_error, f.session_errors)
    follow(f, lambda: (mg.partition(topic, 0) or {}).get("state") == "STOPPED", "p0 STOPPED")
    assert [b.kind for b in f.logs[0].batches][-1] == "barrier"
    assert data_batches(f.logs[0], stop_at) == []


def _session_resets(mg) -> float:
    return mg.metrics().sum("mirrorguard_seal_events_total", mirror=MIRROR, kind="fetch_session_reset")


def _run_requests(f, n: int, what: str) -> dict:
    """Lets fetcher `f` (the Kafka-engine stand-in's, running on its own) send `n` more requests."""
    start = f.report()["requests"]
    f.follow(lambda: f.report()["requests"] >= start + n, 30, what)
    return f.report()


def test_session_resets_only_for_sessions_that_may_hold_the_partition(
        kafka1, mirror_factory, kafka_dest_factory):  # noqa: F811
    """Issue 29 item 4. Two fetcher sessions of the Kafka-engine destination (Kafka's
    FetchSessionHandler): f0 holds p0, f1 holds p1, both begun while nothing was controlled,
    so mirrorguard did not watch them start. A stop of p3, which nobody fetches, resets each
    of them once (they may hold p3), and never again: their new sessions are seen from their
    start. p0 is then stopped while nobody fetches it (f0's destination leader went away), so
    it waits for its cut: f1's session, which never held p0, is never reset, however long the
    wait; neither after a restart of mirrorguard (the fetcher's new session starts with a full
    request). Before: every incremental request of every fetcher session got
    FETCH_SESSION_ID_NOT_FOUND until someone took the cut."""
    topic = harness.topic_name("sess-two")
    harness.create_topics(kafka1.bootstrap, [topic], partitions=5)
    mg = start_mirror(kafka1, mirror_factory, topic)
    spec_bootstrap = mg.mirrors[MIRROR].bootstrap
    prod = idempotent_producer(kafka1.bootstrap)
    for p in range(5):
        send(prod, topic, [b"a-%d" % p], partition=p)
    dest = kafka_dest_factory("B")
    f0 = dest.mirror("f0", spec_bootstrap, [(topic, 0)])
    f1 = dest.mirror("f1", spec_bootstrap, [(topic, 1)])
    f0.catch_up(topic, high_watermark(kafka1.bootstrap, topic, 0), partition=0)
    f1.catch_up(topic, high_watermark(kafka1.bootstrap, topic, 1), partition=1)
    _run_requests(f1, 3, "incremental requests")

    # Sessions mirrorguard did not see start: each is reset once.
    resets_before = _session_resets(mg)
    errors_before = [f.report()["session_errors"] for f in (f0, f1)]
    status, body = mg.post("stop", MIRROR, topic, [3])
    assert status == 200, body
    _run_requests(f0, 20, "f0: 20 requests while p3 waits for its cut")
    _run_requests(f1, 20, "f1: 20 requests while p3 waits for its cut")
    errors = [f.report()["session_errors"] - before for f, before in zip((f0, f1), errors_before)]
    resets = _session_resets(mg) - resets_before
    print(f"p3 waiting for its cut, sessions begun unseen: session errors f0/f1 {errors}, "
          f"mirrorguard session resets {resets}")
    assert errors == [1, 1] and resets == 2, (errors, resets)
    assert (mg.partition(topic, 3) or {}).get("state") == "STOPPING"
    f0.stop()  # p0's destination leader is gone: nobody fetches p0

    resets_before = _session_resets(mg)
    errors_before = f1.report()["session_errors"]
    status, body = mg.post("stop", MIRROR, topic, [0])
    assert status == 200, body
    for i in range(5):
        send(prod, topic, [b"b-%d" % i], partition=1)
    f1.catch_up(topic, high_watermark(kafka1.bootstrap, topic, 1), partition=1)
    report = _run_requests(f1, 40, "40 requests while p0 waits for its cut")
    resets = _session_resets(mg) - resets_before
    print(f"p0 waiting for its cut: f1 sent 40 more requests, session errors "
          f"{report['session_errors'] - errors_before}, mirrorguard session resets {resets}")
    assert report["session_errors"] == errors_before, report
    assert resets == 0
    view = mg.partition(topic, 0)
    assert (view["state"], view["cut"]) == ("STOPPING", None), view

    # p0's fetcher comes back (a new leader on the destination): its full request carries
    # the position, the cut is taken and the seal served.
    f0b = dest.mirror("f0b", spec_bootstrap, [(topic, 0)])
    harness.wait_until(lambda: (mg.partition(topic, 0) or {}).get("state") == "STOPPED", 30, interval=0.1,
                       what="p0 STOPPED")
    f0b.stop()

    # A restart forgets every session, but f1's next session starts with a full request
    # (the connection ended), so a stop of p4, which nobody fetches, does not reset it.
    mg.restart()
    mg.wait_sources_known()
    _run_requests(f1, 3, "f1 fetching through the restarted mirrorguard")
    errors_before = f1.report()["session_errors"]
    resets_before = _session_resets(mg)
    status, body = mg.post("stop", MIRROR, topic, [4])
    assert status == 200, body
    report = _run_requests(f1, 40, "40 requests while p4 waits for its cut")
    resets = _session_resets(mg) - resets_before
    print(f"after a restart, p4 waiting for its cut: f1 session errors "
          f"{report['session_errors'] - errors_before}, mirrorguard session resets {resets}")
    assert report["session_errors"] == errors_before, report
    assert resets == 0
    assert (mg.partition(topic, 4) or {}).get("state") == "STOPPING"
    hw1 = high_watermark(kafka1.bootstrap, topic, 1)
    send(prod, topic, [b"c"], partition=1)
    f1.catch_up(topic, hw1 + 1, partition=1)
    f1.stop()
