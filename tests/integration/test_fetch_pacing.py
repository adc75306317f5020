"""A destination fetcher against a STOPPED partition is paced like one against a broker
with nothing to return: every Fetch that carries no records is held for its MaxWaitMs
(at most 30 s), so the number of Fetch requests reaching mirrorguard per second stays
about 1000 / MaxWaitMs, whatever the answer path (a request of the stopped partition
alone, with a mirroring partition beside it, from an incremental session, or with the
source gone). A single fetch from the log end, past it or below the cut that finds
nothing is held as long. A hot loop here once sent ~1,500-3,300 Fetch requests a second:
the fetcher's session request, its sealed partition dropped, asked the source for
nothing, and Kafka answers such a fetch at once.

Apache Kafka is the source; the destination fetcher is the Kafka-engine stand-in of
kafka_dest.py (Kafka's FetchSessionHandler and fetch request builder).
"""

from __future__ import annotations

import time

import harness
from kafka_dest import dest_hw_bootstrap, kafka_dest_factory  # noqa: F401 - fixture
from mirror_harness import (  # noqa: F401 - mirror_factory is a fixture
    MirrorSpec,
    StandInFetcher,
    high_watermark,
    idempotent_producer,
    mirror_factory,
    send,
)

MIRROR = "src-to-dst"
MAX_WAIT_MS = 500
WINDOW_S = 4.0
# 1000 / MaxWaitMs requests a second, with room for the fetcher's own reconnects.
MAX_RATE = 2 * 1000 / MAX_WAIT_MS + 1


def fetch_rate(mg, window: float = WINDOW_S) -> float:
    def count() -> float:
        return mg.metrics().sum("mirrorguard_requests_total", api="Fetch")
    a = count()
    t0 = time.monotonic()
    time.sleep(window)
    b = count()
    rate = (b - a) / (time.monotonic() - t0)
    print(f"Fetch requests per second over {window:.0f} s: {rate:.1f}")
    return rate


def stop_and_wait(mg, topic, partition=0):
    status, body = mg.post("stop", MIRROR, topic, [partition])
    assert status == 200, body
    harness.wait_until(lambda: mg.partition(topic, partition)["state"] == "STOPPED", 20, interval=0.05,
                       what="partition STOPPED")
    view = mg.partition(topic, partition)
    return view["cut"] + view["seal_batches"]


def _setup(src, mirror_factory, kafka_dest_factory, topics, state=None, extra="", **opts):  # noqa: F811
    harness.create_topics(src.bootstrap, topics)
    if state is not None:
        # The destination side (the state cluster) knows the topic too.
        harness.create_topics(state.bootstrap, topics)
    for t in topics:
        send(idempotent_producer(src.bootstrap), t, [b"d-0", b"d-1"])
    dest = kafka_dest_factory("pace")
    mg = mirror_factory((state or src).bootstrap,
                        [MirrorSpec.of(MIRROR, src, extra=extra, destination_hw=dest_hw_bootstrap(dest))])
    mg.wait_sources_known()
    f = dest.mirror(MIRROR, mg.mirrors[MIRROR].bootstrap, [(t, 0) for t in topics], max_wait_ms=MAX_WAIT_MS,
                    request_timeout_ms=30000, **opts)
    for t in topics:
        f.catch_up(t, high_watermark(src.bootstrap, t))
    return mg, dest, f


def test_stopped_partition_alone_is_paced(kafka1, kafka_dest_factory, mirror_factory):  # noqa: F811
    topic = harness.topic_name("pace1")
    mg, dest, f = _setup(kafka1, mirror_factory, kafka_dest_factory, [topic])
    base = fetch_rate(mg, 2.0)
    f.catch_up(topic, stop_and_wait(mg, topic))
    rate = fetch_rate(mg)
    r = f.report()
    assert rate <= MAX_RATE, f"{rate:.1f} Fetch/s against a STOPPED partition (mirroring: {base:.1f}/s): {r}"
    f.stop()


def test_stopped_beside_mirroring_partition_is_paced(kafka1, kafka_dest_factory, mirror_factory):  # noqa: F811
    stopped = harness.topic_name("pace2s")
    live = harness.topic_name("pace2m")
    mg, dest, f = _setup(kafka1, mirror_factory, kafka_dest_factory, [stopped, live])
    f.catch_up(stopped, stop_and_wait(mg, stopped))
    rate = fetch_rate(mg)
    r = f.report()
    assert rate <= MAX_RATE, f"{rate:.1f} Fetch/s, one partition STOPPED, one mirroring: {r}"
    f.stop()


def test_stopped_partition_without_sessions_is_paced(kafka1, kafka_dest_factory, mirror_factory):  # noqa: F811
    topic = harness.topic_name("pace3")
    mg, dest, f = _setup(kafka1, mirror_factory, kafka_dest_factory, [topic], sessions=False)
    f.catch_up(topic, stop_and_wait(mg, topic))
    rate = fetch_rate(mg)
    r = f.report()
    assert rate <= MAX_RATE, f"{rate:.1f} Fetch/s against a STOPPED partition, no sessions: {r}"
    f.stop()


def test_stopped_partition_with_source_killed_is_paced(kafka1, kafka_factory, kafka_dest_factory,  # noqa: F811
                                                       mirror_factory):
    src = kafka_factory(nodes=1)
    topic = harness.topic_name("pace4")
    mg, dest, f = _setup(src, mirror_factory, kafka_dest_factory, [topic], state=kafka1,
                         extra="upstream_request_timeout_ms = 2000")
    f.catch_up(topic, stop_and_wait(mg, topic))
    src.nodes[0].kill()
    time.sleep(1.0)
    rate = fetch_rate(mg)
    r = f.report()
    assert rate <= MAX_RATE, f"{rate:.1f} Fetch/s against a STOPPED partition, source killed: {r}"
    f.stop()


def test_fetch_past_and_below_the_cut_of_a_stopped_partition(kafka1, kafka_dest_factory,  # noqa: F811
                                                             mirror_factory):
    """Single fetches of a STOPPED partition from other offsets: one that finds nothing is
    held for its MaxWaitMs; one answered with records or an error may come at once (a
    broker answers errors at once; the fetcher then backs off)."""
    topic = harness.topic_name("pace5")
    mg, dest, f = _setup(kafka1, mirror_factory, kafka_dest_factory, [topic])
    end = stop_and_wait(mg, topic)
    f.catch_up(topic, end)
    f.stop()
    raw = StandInFetcher(topic).connect(mg.mirrors[MIRROR].bootstrap)
    seen = {}
    for name, offset in (("at_end", end), ("past_end", end + 5), ("below_cut", 0)):
        raw.leo = offset
        t0 = time.monotonic()
        try:
            res, got = raw.fetch_once(max_wait_ms=MAX_WAIT_MS)
        except harness.HarnessError:  # an error answer: its response is kept
            res, got = raw.responses[-1], []
        took = time.monotonic() - t0
        seen[name] = (res.top_error, res.error_code, len(got), round(took, 2))
        if res.top_error == 0 and res.error_code == 0 and not got:
            assert took >= MAX_WAIT_MS / 1000 * 0.8, f"{name}: an empty answer after {took:.2f} s: {seen}"
    print(f"fetches of a STOPPED partition (top error, partition error, batches, seconds): {seen}")
    # Past the seal of an ended episode: refused (POLICY_VIOLATION), never "caught up".
    assert seen["past_end"][:2] == (0, 44), seen
    raw.close()
