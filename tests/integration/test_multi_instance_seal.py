"""A seal across a destination leadership move (issue 17, item 2): STOPPED only once the
destination's high watermark has passed the seal's end, and a new leader that truncated
below the cut gets the seal planned again at its own offset.

The destination is the stand-in of kafka_dest.py with three simulated brokers (1, 2, 3),
each holding its own Kafka UnifiedLog replica of the partition; followers copy the leader's
log (pausable, to leave records unreplicated), the leader's high watermark is the smallest
replica log end, and a leadership move truncates the others to the new leader through
Kafka's leader epoch cache. Each broker runs a mirror fetcher behind its own mirrorguard
instance (the fetcher only fetches while its broker leads), and every instance reads the
high watermark from the stand-in's listeners (ListOffsets). The source is Apache Kafka with
idempotent and transactional producers.

Each scenario is compared with a single-instance run of the same source input (one
mirrorguard, one single-replica destination) stopped at the same cut: identical batches
(the stand-in reports no timestamps) and identical producer state, as Kafka's engine
reports them.

Before this, a partition went STOPPED as soon as its fetcher had fetched past the seal's
end: in scenario (a) the leader that held the seal lost it with its leadership, the
partition was STOPPED all the same, and the new leader's fetcher (below the cut) failed the
partition; its log never got a seal.
"""

from __future__ import annotations

import time

import harness
from kafka_dest import kafka_dest_factory  # noqa: F401 - fixture
from mirror_harness import (  # noqa: F401 - mirror_factory is a fixture
    MirrorSpec,
    high_watermark,
    idempotent_producer,
    mirror_factory,
    send,
    transactional_producer,
)

MIRROR = "src-to-dst"
BROKERS = (1, 2, 3)


def _log(dest, topic: str) -> tuple[list, dict]:
    """The leader's batches and producer state as Kafka's engine holds them (`markers` is the
    stand-in's append history, which keeps what a truncation removed: left out; Kafka's
    aborted-transaction index says what the markers closed)."""
    batches = [{k: v for k, v in b.items() if "timestamp" not in k} for b in dest.batches(topic)]
    st = dest.state(topic)
    for v in st["producers"].values():
        v.pop("last_timestamp", None)
    keep = ("log_end_offset", "high_watermark", "last_stable_offset", "first_unstable_offset",
            "producers", "aborted_txns")
    return batches, {k: st.get(k) for k in keep}


def _state(mg, topic: str) -> str | None:
    return (mg.partition(topic) or {}).get("state")


class Bed:
    """Three simulated destination brokers, each with its fetcher behind its own instance."""

    def __init__(self, source, state_bootstrap: str, kafka_dest_factory, mirror_factory, name: str,  # noqa: F811
                 **fetcher_opts):
        self.topic = harness.topic_name(name)
        harness.create_topics(source.bootstrap, [self.topic])
        if state_bootstrap != source.bootstrap:
            # The destination cluster's topic listing is read where __mirror_state lives
            # (destination_bootstrap defaults to [state].bootstrap): the topic exists there.
            harness.create_topics(state_bootstrap, [self.topic])
        self.dest = kafka_dest_factory(name).listen(list(BROKERS))
        self.dest.open(self.topic)
        st = self.dest.replicate(self.topic, list(BROKERS))
        assert st["leader"] == 1, st
        spec = lambda: [MirrorSpec.of(MIRROR, source, destination_hw=self.dest.bootstrap)]  # noqa: E731
        self.mg = {b: mirror_factory(state_bootstrap, spec(), snapshot_interval_ms=300) for b in BROKERS}
        for mg in self.mg.values():
            mg.wait_sources_known()
        self.fetcher = {b: self.dest.mirror(f"b{b}", self.mg[b].mirrors[MIRROR].bootstrap, [(self.topic, 0)],
                                            broker=b, **fetcher_opts) for b in BROKERS}

    def mirror_an_open_transaction(self, source) -> tuple[int, object]:
        """Two idempotent records, a transaction left open, one more record; broker 1's
        fetcher mirrors them all. Returns the cut (the source's high watermark) and the
        transactional producer."""
        ip = idempotent_producer(source.bootstrap)
        tp = transactional_producer(source.bootstrap, f"txn-{self.topic}", **{"transaction.timeout.ms": 600000})
        send(ip, self.topic, [b"a-%d" % i for i in range(2)])
        tp.begin_transaction()
        tp.produce(self.topic, value=b"open", partition=0)
        assert tp.flush(20) == 0
        send(ip, self.topic, [b"b-0"])
        cut = high_watermark(source.bootstrap, self.topic)
        self.fetcher[1].catch_up(self.topic, cut, timeout=30)
        return cut, tp

    def replicas(self) -> dict[int, dict]:
        return {int(k): v for k, v in self.dest.state(self.topic)["replicas"].items()}

    def wait_replicated(self, broker: int, offset: int) -> None:
        harness.wait_until(lambda: self.replicas()[broker]["log_end_offset"] == offset, 15, interval=0.05,
                           what=f"broker {broker} holds up to {offset}")

    def wait_leader_end(self, offset: int) -> None:
        harness.wait_until(lambda: self.dest.state(self.topic)["log_end_offset"] == offset, 30, interval=0.05,
                           what=f"the leader's log ends at {offset}")

    def stop(self, through: int) -> None:
        status, body = self.mg[through].post("stop", MIRROR, self.topic, [0])
        assert status == 200, body

    def assert_waits(self, leader: int, end: int, seconds: float = 1.0) -> None:
        """The leader's instance holds the seal fetched whole and waits for the destination's
        high watermark (below `end`): no instance says STOPPED, for several polls."""
        harness.wait_until(lambda: (self.mg[leader].partition(self.topic).get("destination_hw") or {})
                           .get("high_watermark") is not None, 15, interval=0.05, what="high watermark read")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for mg in self.mg.values():
                assert _state(mg, self.topic) != "STOPPED", (mg.name, mg.partition(self.topic))
            view = self.mg[leader].partition(self.topic)
            w = view["destination_hw"]
            assert w["seal_end"] == end and w["high_watermark"] < end and w["error"] is None, view
            assert self.dest.state(self.topic)["high_watermark"] < end
            time.sleep(0.1)

    def stopped_on(self) -> dict:
        harness.wait_until(lambda: any(_state(mg, self.topic) == "STOPPED" for mg in self.mg.values()), 30,
                           interval=0.1, what="STOPPED")
        return next(mg.partition(self.topic) for mg in self.mg.values() if _state(mg, self.topic) == "STOPPED")


class Reference:
    """The single-instance run: one mirrorguard, one single-replica destination."""

    def __init__(self, source, state_bootstrap: str, kafka_dest_factory, mirror_factory, topic: str):  # noqa: F811
        self.topic = topic
        self.dest = kafka_dest_factory(f"ref-{topic}").listen([0])
        self.mg = mirror_factory(state_bootstrap, [MirrorSpec.of(MIRROR, source, destination_hw=self.dest.bootstrap)],
                                 state_topic=f"__mirror_state_ref_{topic}")
        self.mg.wait_sources_known()
        self.n = 0

    def mirror_to(self, offset: int) -> None:
        """A fetcher mirrors up to `offset` (the source holds nothing more) and stops."""
        self.n += 1
        f = self.dest.mirror(f"ref{self.n}", self.mg.mirrors[MIRROR].bootstrap, [(self.topic, 0)])
        f.catch_up(self.topic, offset, timeout=30)
        f.stop()

    def seal(self, cut: int) -> tuple[list, dict]:
        """Stops the mirror with the fetcher at `cut` (it was stopped there) and returns the
        sealed log."""
        status, body = self.mg.post("stop", MIRROR, self.topic, [0])
        assert status == 200, body
        assert self.dest.state(self.topic)["log_end_offset"] == cut
        self.n += 1
        f = self.dest.mirror(f"ref{self.n}", self.mg.mirrors[MIRROR].bootstrap, [(self.topic, 0)])
        harness.wait_until(lambda: _state(self.mg, self.topic) == "STOPPED", 30, interval=0.1,
                           what="reference STOPPED")
        view = self.mg.partition(self.topic)
        assert view["cut"] == cut, view
        f.catch_up(self.topic, cut + view["seal_batches"], timeout=30)
        f.stop()
        return _log(self.dest, self.topic)


def _events(mg, kind: str) -> float:
    """A seal event counter of the mirror's instance."""
    return mg.metrics().counter("mirrorguard_seal_events_total", mirror=MIRROR, kind=kind)


def seal_above_a_lagging_broker(bed: "Bed", source, state_bootstrap: str, kafka_dest_factory,  # noqa: F811
                                mirror_factory) -> tuple[object, int, int, "Reference"]:
    """The start of the below-the-cut scenarios: three idempotent records and a transaction
    left open, mirrored and replicated by all three brokers (up to `low`); then broker 2
    stops copying, three more records reach brokers 1 and 3 (up to the cut), broker 3 stops
    copying too, and instance 3 stops the partition: its seal (the transaction's ABORT and
    the barrier) is appended by the leader, broker 1, alone. Returns the transactional
    producer, `low`, the cut and the single-instance reference, mirrored up to `low` (where
    the new leader's log will end)."""
    T = bed.topic
    ip = idempotent_producer(source.bootstrap)
    tp = transactional_producer(source.bootstrap, f"txn-{T}", **{"transaction.timeout.ms": 600000})
    send(ip, T, [b"a-%d" % i for i in range(3)])
    tp.begin_transaction()
    tp.produce(T, value=b"open-0", partition=0)
    assert tp.flush(20) == 0
    low = high_watermark(source.bootstrap, T)
    bed.fetcher[1].catch_up(T, low, timeout=30)
    for b in (2, 3):
        bed.wait_replicated(b, low)
    ref = Reference(source, state_bootstrap, kafka_dest_factory, mirror_factory, T)
    ref.mirror_to(low)

    bed.dest.pause_replication(T, 2)
    send(ip, T, [b"b-%d" % i for i in range(3)])
    cut = high_watermark(source.bootstrap, T)
    bed.fetcher[1].catch_up(T, cut, timeout=30)
    bed.wait_replicated(3, cut)
    bed.dest.pause_replication(T, 3)
    bed.stop(through=3)
    bed.wait_leader_end(cut + 2)
    return tp, low, cut, ref


def test_new_leader_below_the_cut_gets_the_seal_again(kafka1, kafka_dest_factory, mirror_factory):  # noqa: F811
    """(a) The seal is served by the leader's instance and appended by the leader only; the
    new leader lacks records below the cut too; it gets the seal planned again from its own
    offset through its own instance, and the partition is STOPPED only once the high
    watermark passed that seal's end."""
    bed = Bed(kafka1, kafka1.bootstrap, kafka_dest_factory, mirror_factory, "seal-below")
    T = bed.topic
    tp, low, cut, ref = seal_above_a_lagging_broker(bed, kafka1, kafka1.bootstrap, kafka_dest_factory,
                                                    mirror_factory)
    end = cut + 2  # one ABORT (the open transaction) and the barrier
    view = bed.mg[1].partition(T)
    assert (view["state"], view["cut"], view["seal_batches"]) == ("STOPPING", cut, 2), view
    bed.assert_waits(leader=1, end=end)

    # Leadership moves to broker 2: brokers 1 and 3 truncate to its log end, below the cut.
    move = bed.dest.move_leader(T, 2)["move"]
    assert move["log_end_offset"] == low and move["truncated"] == {"1": end - low, "3": cut - low}, move
    for b in (2, 3):
        bed.dest.pause_replication(T, b, paused=False)
    view = bed.stopped_on()
    assert (view["cut"], view["seal_batches"]) == (low, 2), view
    bed.wait_leader_end(low + 2)
    for b in BROKERS:
        bed.wait_replicated(b, low + 2)
    for b in BROKERS:
        bed.fetcher[b].stop()
    multi = _log(bed.dest, T)
    assert multi[1]["high_watermark"] == low + 2, multi[1]
    assert [b["kind"] for b in multi[0][-2:]] == ["ABORT", "TYPE_7"], multi[0]
    m = bed.mg[2].metrics()
    assert m.select("mirrorguard_seal_events_total", mirror=MIRROR, kind="seal_replanned_below_cut")[0][1] == 1
    # Every instance learns the seal as it was completed.
    for mg in bed.mg.values():
        harness.wait_until(lambda mg=mg: _state(mg, T) == "STOPPED" and mg.partition(T)["cut"] == low, 15,
                           interval=0.1, what=f"{mg.name} read the seal")
    assert multi == ref.seal(low)
    tp.abort_transaction(20)


def test_move_between_the_cut_and_the_last_sealing_batch(kafka1, kafka_dest_factory, mirror_factory):  # noqa: F811
    """(b) The followers copied the first sealing batch only; after the move the new
    leader's instance serves the rest of the same, persisted seal."""
    bed = Bed(kafka1, kafka1.bootstrap, kafka_dest_factory, mirror_factory, "seal-mid")
    T = bed.topic
    ip = idempotent_producer(kafka1.bootstrap)
    tps = [transactional_producer(kafka1.bootstrap, f"txn{i}-{T}", **{"transaction.timeout.ms": 600000})
           for i in range(2)]
    send(ip, T, [b"a-%d" % i for i in range(2)])
    for i, tp in enumerate(tps):
        tp.begin_transaction()
        tp.produce(T, value=b"open-%d" % i, partition=0)
        assert tp.flush(20) == 0
    send(ip, T, [b"b-%d" % i for i in range(2)])
    cut = high_watermark(kafka1.bootstrap, T)
    bed.fetcher[1].catch_up(T, cut, timeout=30)
    for b in (2, 3):
        bed.wait_replicated(b, cut)
        bed.dest.pause_replication(T, b, upto=cut + 1)
    bed.stop(through=2)
    end = cut + 3  # two ABORTs and the barrier
    bed.wait_leader_end(end)
    for b in (2, 3):
        bed.wait_replicated(b, cut + 1)
    bed.assert_waits(leader=1, end=end)

    move = bed.dest.move_leader(T, 2)["move"]
    assert move["log_end_offset"] == cut + 1 and move["truncated"] == {"1": 2, "3": 0}, move
    for b in (2, 3):
        bed.dest.pause_replication(T, b, paused=False)
    view = bed.stopped_on()
    assert (view["cut"], view["seal_batches"]) == (cut, 3), view
    for b in BROKERS:
        bed.wait_replicated(b, end)
        bed.fetcher[b].stop()
    multi = _log(bed.dest, T)
    assert [b["kind"] for b in multi[0][-3:]] == ["ABORT", "ABORT", "TYPE_7"], multi[0]
    assert multi[1]["high_watermark"] == end and multi[1]["last_stable_offset"] == end, multi[1]

    ref = Reference(kafka1, kafka1.bootstrap, kafka_dest_factory, mirror_factory, T)
    ref.mirror_to(cut)
    assert multi == ref.seal(cut)
    for tp in tps:
        tp.abort_transaction(20)


def test_move_during_a_seal_with_the_source_killed(kafka1, kafka_factory, kafka_dest_factory,  # noqa: F811
                                                   mirror_factory):
    """(c) The source is SIGKILLed, the stop seals from the persisted producer state, and
    leadership moves while the seal is unreplicated: the new leader's instance serves the
    same seal (its log ends at the cut), STOPPED once the high watermark passed it."""
    source = kafka_factory(name="src")
    bed = Bed(source, kafka1.bootstrap, kafka_dest_factory, mirror_factory, "seal-kill")
    T = bed.topic
    cut, tp = bed.mirror_an_open_transaction(source)
    ref = Reference(source, kafka1.bootstrap, kafka_dest_factory, mirror_factory, T)
    ref.mirror_to(cut)
    for b in (2, 3):
        bed.wait_replicated(b, cut)
        bed.dest.pause_replication(T, b)
    # The producers go first (their clients would retry against a dead broker).
    harness.close_clients()
    source.nodes[0].kill()

    bed.stop(through=3)
    end = cut + 2
    bed.wait_leader_end(end)
    bed.assert_waits(leader=1, end=end)
    move = bed.dest.move_leader(T, 2)["move"]
    assert move["log_end_offset"] == cut and move["truncated"] == {"1": 2, "3": 0}, move
    for b in (2, 3):
        bed.dest.pause_replication(T, b, paused=False)
    view = bed.stopped_on()
    assert (view["cut"], view["seal_batches"]) == (cut, 2), view
    for b in BROKERS:
        bed.wait_replicated(b, end)
        bed.fetcher[b].stop()
    multi = _log(bed.dest, T)
    assert [b["kind"] for b in multi[0][-2:]] == ["ABORT", "TYPE_7"], multi[0]
    assert multi == ref.seal(cut)


def test_unreadable_destination_keeps_the_partition_stopping(kafka1, kafka_dest_factory,  # noqa: F811
                                                              mirror_factory):
    """The destination's high watermark cannot be read (nothing listens where it is read):
    the fetcher holds the whole seal, yet the partition stays STOPPING, says why, counts the
    failed reads and keeps serving the seal; it never goes STOPPED on a guess."""
    topic = harness.topic_name("seal-unread")
    harness.create_topics(kafka1.bootstrap, [topic])
    dead = f"{harness.HOST}:{harness.free_port(set())}"
    mg = mirror_factory(kafka1.bootstrap, [MirrorSpec.of(MIRROR, kafka1, destination_hw=dead)])
    mg.wait_sources_known()
    ip = idempotent_producer(kafka1.bootstrap)
    send(ip, topic, [b"v-%d" % i for i in range(3)])
    cut = high_watermark(kafka1.bootstrap, topic)
    dest = kafka_dest_factory("unread")
    f = dest.mirror("f", mg.mirrors[MIRROR].bootstrap, [(topic, 0)])
    f.catch_up(topic, cut, timeout=30)
    status, body = mg.post("stop", MIRROR, topic, [0])
    assert status == 200, body
    f.catch_up(topic, cut + 1, timeout=30)  # the barrier (no open transaction)

    def failing():
        w = (mg.partition(topic) or {}).get("destination_hw") or {}
        return w.get("error") is not None

    harness.wait_until(failing, 15, interval=0.1, what="the failed read shown")
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        view = mg.partition(topic)
        assert view["state"] == "STOPPING", view
        w = view["destination_hw"]
        assert w["seal_end"] == cut + 1 and w["high_watermark"] is None and dead in w["error"], w
        time.sleep(0.2)
    m = mg.metrics()
    assert m.select("mirrorguard_seal_events_total", mirror=MIRROR, kind="destination_hw_read_error")[0][1] > 0
    assert m.select("mirrorguard_seals_awaiting_destination_hw", mirror=MIRROR)[0][1] == 1
    assert "cannot read the destination's high watermark" in mg.log_text()
    f.stop()
    assert dest.state(topic)["log_end_offset"] == cut + 1


def test_seal_waiting_for_the_high_watermark_survives_a_restart_with_the_source_hung(
        kafka1, kafka_factory, kafka_dest_factory, mirror_factory):  # noqa: F811
    """(e) The seal is appended by the leader but not replicated (the high watermark stays
    below its end), the source hangs (SIGSTOP) and the leader's instance is killed (-9) and
    restarted: the restarted instance reads its persisted seal, serves the fetcher that
    re-fetches with a new session, stays STOPPING while the high watermark is below the seal's
    end, and goes STOPPED once replication resumes; the log equals a single instance's."""
    source = kafka_factory(name="src")
    # Kafka's replica fetcher waits replica.socket.timeout.ms (30 s) for an answer; the
    # restarted instance's first fetch to the hung source is answered locally after
    # upstream_request_timeout_ms (10 s).
    bed = Bed(source, kafka1.bootstrap, kafka_dest_factory, mirror_factory, "seal-restart",
              request_timeout_ms=30000)
    T = bed.topic
    cut, tp = bed.mirror_an_open_transaction(source)
    for b in (2, 3):
        bed.wait_replicated(b, cut)
        bed.dest.pause_replication(T, b)
    bed.stop(through=2)
    end = cut + 2  # one ABORT (the open transaction) and the barrier
    bed.wait_leader_end(end)
    bed.assert_waits(leader=1, end=end)

    connects = bed.fetcher[1].report()["connects"]
    source.nodes[0].pause()
    try:
        bed.mg[1].kill9()
        bed.mg[1].start(timeout=60)
        # The fetcher reconnects and re-fetches from its log end (a new fetch session):
        # the restarted instance waits for the high watermark again, seal persisted.
        t0 = time.monotonic()
        harness.wait_until(lambda: (bed.mg[1].partition(T).get("destination_hw") or {})
                           .get("high_watermark") is not None, 40, interval=0.1, what="high watermark read again")
        waited = time.monotonic() - t0
        bed.assert_waits(leader=1, end=end, seconds=1.5)
        view = bed.mg[1].partition(T)
        assert (view["state"], view["cut"], view["seal_batches"]) == ("STOPPING", cut, 2), view
        assert bed.dest.state(T)["log_end_offset"] == end  # nothing but the seal was appended
        for b in (2, 3):
            bed.dest.pause_replication(T, b, paused=False)
        view = bed.stopped_on()
        assert (view["cut"], view["seal_batches"]) == (cut, 2), view
        assert bed.fetcher[1].report()["connects"] > connects, "the fetcher reconnected to the new process"
        assert waited < 30, f"the restarted instance answered the fetcher only after {waited:.1f} s"
    finally:
        source.nodes[0].resume()
    for b in BROKERS:
        bed.wait_replicated(b, end)
        bed.fetcher[b].stop()
    multi = _log(bed.dest, T)
    assert [b["kind"] for b in multi[0][-2:]] == ["ABORT", "TYPE_7"], multi[0]
    assert multi[1]["high_watermark"] == end, multi[1]
    ref = Reference(source, kafka1.bootstrap, kafka_dest_factory, mirror_factory, T)
    ref.mirror_to(cut)
    assert multi == ref.seal(cut)
    tp.abort_transaction(20)
