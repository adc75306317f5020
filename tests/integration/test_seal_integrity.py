"""Seal integrity (SPEC 3, step 5 and "Who moves a seal"; issue 29 item 2): a seal completes
only when the destination fetcher fetches exactly at its end (and the destination's high
watermark passed it); a fetch by the fetcher past the end while it is not complete is an
inconsistency once the destination holds records there for good (FAILED, with the reason),
and nothing at all while the destination's high watermark says a replica about to be
truncated may be asking.

The destination is the Kafka-engine stand-in (kafka_dest.py: Kafka's UnifiedLog, a fetcher
built on Kafka's FetchSessionHandler), the source Apache Kafka 4.4 (`kafka1`), and the seal
completes on the destination's high watermark, mirrorguard's default rule.

Before: with any reader counted as the fetcher (a mirror without fetcher ports), a reader
below the fetcher's position took the cut and got the seal; the real fetcher's next fetch,
past the seal's end, made the partition STOPPED although the destination never got the
ABORT markers or the barrier (6139bc3), or left it STOPPING for good (42acecf).
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
    transactional_producer,
)

MIRROR = "src-to-dst"


def _seal_metric(mg, kind: str) -> float:
    return mg.metrics().sum("mirrorguard_seal_events_total", mirror=MIRROR, kind=kind)


def _open_transaction(kafka, topic: str):
    """Three idempotent records, then a transaction left open, then one more record."""
    ip = idempotent_producer(kafka.bootstrap)
    tp = transactional_producer(kafka.bootstrap, f"txn-{topic}", **{"transaction.timeout.ms": 600000})
    send(ip, topic, [b"a-%d" % i for i in range(3)])
    tp.begin_transaction()
    tp.produce(topic, value=b"open", partition=0)
    assert tp.flush(20) == 0
    send(ip, topic, [b"b-0"])
    return ip, tp


def test_a_reader_that_took_the_cut_fails_the_seal_at_the_fetchers_next_fetch(
        kafka1, mirror_factory, kafka_dest_factory):  # noqa: F811
    """`fetcher_identity = "any-reader"` (the loopback opt-in): a reader at R, below the
    fetcher's log end X, takes the cut at R and gets the seal; the destination fetcher then
    fetches at X, past the seal's end, and the destination's high watermark (X) is past it
    too: FAILED with the reason, never STOPPED, and the produce guard keeps refusing."""
    topic = harness.topic_name("stray-cut")
    harness.create_topics(kafka1.bootstrap, [topic])
    dest = kafka_dest_factory("stray-cut")
    spec = MirrorSpec.of(MIRROR, kafka1, destination_hw=dest_hw_bootstrap(dest), fetcher_identity="any-reader")
    mg = mirror_factory(kafka1.bootstrap, [spec])
    mg.wait_sources_known()
    _ip, tp = _open_transaction(kafka1, topic)
    x = high_watermark(kafka1.bootstrap, topic)
    f = dest.mirror("fetcher", spec.bootstrap, [(topic, 0)])
    f.catch_up(topic, x)
    f.stop()
    assert dest.state(topic)["high_watermark"] == x

    status, body = mg.post("stop", MIRROR, topic, [0])
    assert status == 200, body
    # A reader (any reader is "the fetcher" here) at 2 takes the cut there.
    reader = StandInFetcher(topic).connect(spec.bootstrap)
    reader.leo = 2
    _res, got = reader.fetch_once()
    assert [b.kind for b in got] == ["barrier"], got
    view = mg.partition(topic, 0)
    assert (view["state"], view["cut"], view["seal_batches"]) == ("STOPPING", 2, 1), view
    reader.close()

    # The destination's fetcher comes back at its log end, X, past the seal's end (3).
    f2 = dest.mirror("fetcher2", spec.bootstrap, [(topic, 0)])
    harness.wait_until(lambda: mg.partition(topic, 0)["state"] != "STOPPING", 20, interval=0.1,
                       what="the seal decided")
    view = mg.partition(topic, 0)
    assert view["state"] == "FAILED", view
    assert "fetched at %d, past the seal's end 3" % x in view["reason"], view
    assert "high watermark is %d" % x in view["reason"], view
    assert _seal_metric(mg, "seal_failed_past_end") == 1
    assert _seal_metric(mg, "seal_completed") == 0
    assert mg.metrics().sum("mirrorguard_partitions", state="FAILED") == 1
    # The destination never got a seal: no barrier, nothing past X.
    batches = dest.batches(topic)
    assert all(b["base_offset"] < x for b in batches), batches
    assert dest.state(topic)["log_end_offset"] == x
    # FAILED is persisted: a restarted instance says the same.
    mg.restart()
    assert mg.partition(topic, 0)["state"] == "FAILED"
    f2.stop()
    tp.abort_transaction()


def test_a_fetch_past_the_end_from_a_replica_about_to_be_truncated_fails_nothing(
        kafka1, mirror_factory, kafka_dest_factory):  # noqa: F811
    """Three destination replicas, replication to the followers paused: the leader's fetcher
    appends the seal and fetches at its end, and the partition waits for the destination's
    high watermark. A fetch on the fetcher ports past the end (a replica whose log is about
    to be truncated, its fetch still in flight) is answered with nothing: the high watermark,
    below the end, says the destination does not hold those records for good. The seal
    completes once replication resumes."""
    topic = harness.topic_name("stale-past")
    harness.create_topics(kafka1.bootstrap, [topic])
    dest = kafka_dest_factory("stale-past").listen([1, 2, 3])
    dest.open(topic)
    assert dest.replicate(topic, [1, 2, 3])["leader"] == 1
    spec = MirrorSpec.of(MIRROR, kafka1, destination_hw=dest.bootstrap)
    mg = mirror_factory(kafka1.bootstrap, [spec])
    mg.wait_sources_known()
    _ip, tp = _open_transaction(kafka1, topic)
    x = high_watermark(kafka1.bootstrap, topic)
    f = dest.mirror("b1", spec.bootstrap, [(topic, 0)], broker=1)
    f.catch_up(topic, x)
    harness.wait_until(lambda: dest.state(topic)["high_watermark"] == x, 15, interval=0.05,
                       what="replicated up to the cut")
    for b in (2, 3):
        dest.pause_replication(topic, b)

    status, body = mg.post("stop", MIRROR, topic, [0])
    assert status == 200, body
    end = x + 2  # the ABORT of the open transaction, the barrier
    harness.wait_until(lambda: (mg.partition(topic, 0).get("destination_hw") or {}).get("high_watermark") == x,
                       20, interval=0.05, what="the seal fetched whole, the high watermark read")
    reads = _seal_metric(mg, "destination_hw_read")
    stale = StandInFetcher(topic).connect(spec.bootstrap)
    stale.leo = end + 5
    for _ in range(2):
        res, got = stale.fetch_once()
        assert got == [] and not res.records, res
    harness.wait_until(lambda: _seal_metric(mg, "destination_hw_read") >= reads + 2, 15, interval=0.05,
                       what="the high watermark read for the past-end fetch")
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        view = mg.partition(topic, 0)
        assert view["state"] == "STOPPING" and view["cut"] == x and view["seal_batches"] == 2, view
        time.sleep(0.1)
    assert _seal_metric(mg, "fetch_past_seal_end") >= 2
    assert _seal_metric(mg, "seal_failed_past_end") == 0
    stale.close()

    for b in (2, 3):
        dest.pause_replication(topic, b, paused=False)
    harness.wait_until(lambda: mg.partition(topic, 0)["state"] == "STOPPED", 30, interval=0.1,
                       what="STOPPED once replicated")
    assert dest.state(topic)["high_watermark"] == end
    assert _seal_metric(mg, "seal_completed") == 1
    f.stop()
    tp.abort_transaction()


def test_a_leadership_move_inside_the_tail_lag_never_streams_past_the_cut(
        kafka1, mirror_factory, kafka_dest_factory):  # noqa: F811
    """Two destination brokers, each with its fetcher behind its own instance (one shared
    `__mirror_state`). Broker 2 leads topic W and streams it (instance 2's responses are
    cut through). Broker 1 leads T; T is stopped through instance 1, whose fetcher takes the
    cut at X. Before instance 2 has read that from `__mirror_state` (its tail is slowed to
    60 s: the lag of a busy state cluster), T's leadership moves to broker 2, whose log ends
    at X too, and the source has records past X. Broker 2's fetcher asks for T at X through
    instance 2, which streams the response and takes T over at its first batch: the
    take-over reads the stop and the cut. No source batch past the cut may reach broker 2:
    the stream is cut off there (the connection closes), the fetcher's next fetch is answered
    with the seal, and the partition becomes STOPPED with exactly the source's records below
    X, the ABORT of the open transaction and the barrier.

    Before: instance 2 streamed T's source batches past X to broker 2 (the destination got
    source data past the cut), and the next fetch, past the seal's end, made T STOPPED
    (6139bc3) without a seal in the destination's log."""
    t, w = harness.topic_name("lag-t"), harness.topic_name("lag-w")
    harness.create_topics(kafka1.bootstrap, [t, w])
    dest = kafka_dest_factory("lag").listen([1, 2])
    for topic, leader in ((t, 1), (w, 2)):
        dest.open(topic)
        assert dest.replicate(topic, [1, 2], leader=leader)["leader"] == leader
    mg = {b: mirror_factory(kafka1.bootstrap, [MirrorSpec.of(MIRROR, kafka1, destination_hw=dest.bootstrap)],
                            snapshot_interval_ms=300, tail_interval_ms=(1000 if b == 1 else 60000))
          for b in (1, 2)}
    for m in mg.values():
        m.wait_sources_known()
    f = {b: dest.mirror(f"b{b}", mg[b].mirrors[MIRROR].bootstrap, [(t, 0), (w, 0)], broker=b) for b in (1, 2)}

    ip, tp = _open_transaction(kafka1, t)
    send(ip, w, [b"w-%d" % i for i in range(3)])
    x = high_watermark(kafka1.bootstrap, t)
    f[1].catch_up(t, x, timeout=30)
    f[2].catch_up(w, high_watermark(kafka1.bootstrap, w), timeout=30)
    harness.wait_until(lambda: dest.state(t)["replicas"]["2"]["log_end_offset"] == x, 15, interval=0.05,
                       what="broker 2 holds T up to X")
    # Instance 2 has answered a response whole with nothing to hold back: it streams the
    # large ones from now on (responses above 64 KiB are cut through).
    send(ip, w, [b"w2-%d" % i for i in range(3)])
    f[2].catch_up(w, high_watermark(kafka1.bootstrap, w), timeout=30)

    dest.pause_replication(t, 2)
    status, body = mg[1].post("stop", MIRROR, t, [0])
    assert status == 200, body
    harness.wait_until(lambda: mg[1].partition(t, 0).get("cut") == x, 15, interval=0.05,
                       what="instance 1 took the cut at X")
    assert mg[2].partition(t, 0) in (None, {}) or mg[2].partition(t, 0).get("state") in (None, "MIRRORING"), \
        mg[2].partition(t, 0)
    # Past the cut: more than the 64 KiB above which a response streams.
    send(ip, t, [b"past-%d-" % i + b"x" * 40000 for i in range(4)])
    move = dest.move_leader(t, 2)["move"]
    assert move["log_end_offset"] == x, move
    f[1].stop()

    harness.wait_until(lambda: mg[2].partition(t, 0).get("state") == "STOPPED", 40, interval=0.1,
                       what="T STOPPED through instance 2")
    view = mg[2].partition(t, 0)
    assert (view["cut"], view["seal_batches"]) == (x, 2), view
    batches = dest.batches(t)
    assert [b["kind"] for b in batches if b["base_offset"] >= x] == ["ABORT", "TYPE_7"], batches
    assert dest.state(t)["log_end_offset"] == x + 2
    assert not any(v and b"past-" in v for _, v in dest.values(t)), [o for o, _ in dest.values(t)]
    # The stream was cut off when the take-over found the stop.
    assert mg[2].metrics().sum("mirrorguard_seal_events_total", mirror=MIRROR,
                               kind="stream_cut_for_a_controlled_partition") == 1
    f[2].stop()
    tp.abort_transaction()
