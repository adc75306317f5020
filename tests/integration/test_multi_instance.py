"""One mirrorguard per destination broker (issue 17): a partition's fetcher moves between
instances when destination leadership moves, and its producer state follows it.

Apache Kafka (kafka1) is the source and holds the instances' shared ``__mirror_state``;
the destination is the stand-in of kafka_dest.py (Kafka's UnifiedLog on the replication
path). Each simulated destination broker has its own fetcher, and each fetcher goes
through its own mirrorguard instance. A leadership move is modelled as the stand-in
models it: the old leader's fetcher stops, the new leader's fetcher starts from the log
end (the same UnifiedLog).

The run moves a partition during steady mirroring and during an open transaction, opens
a transaction while the partition is served elsewhere and moves it back, kills one
instance (-9) while it serves a partition, and stops the whole mirror through the
instance that serves nothing. The destination's logs are then compared with a
single-instance run of the same source input: identical batches (timestamps aside,
which the stand-in does not report) and identical producer state.

Before the handover (serving records, type 9), an instance that got a partition back
kept serving from the shadow state it had when the partition left: a transaction opened
while another instance served it was unknown there, so the seal left it open on the
destination (no ABORT at the cut) and the logs differ from the single-instance run.
"""

from __future__ import annotations

import time

import harness
from kafka_dest import dest_hw_bootstrap, kafka_dest_factory  # noqa: F401 - fixture
from mirror_harness import (  # noqa: F401 - mirror_factory is a fixture
    MirrorSpec,
    high_watermark,
    idempotent_producer,
    mirror_factory,
    send,
    transactional_producer,
)

MIRROR = "src-to-dst"
# A tail round of __mirror_state is one second: wait this long for instances to read
# each other's serving records before a partition moves back.
TAIL = 1.5


def _hw(bootstrap: str, topic: str) -> list[int]:
    return [high_watermark(bootstrap, topic, p) for p in (0, 1)]


def _catch_up(fetchers: dict, topic: str, hws: list[int], extra: dict | None = None) -> None:
    for p, f in fetchers.items():
        f.catch_up(topic, hws[p] + (extra or {}).get(p, 0), partition=p, timeout=30)


def _log(dest, topic: str, p: int) -> tuple[list, dict]:
    """The partition's batches and producer state as the destination's engine holds them."""
    batches = [{k: v for k, v in b.items() if "timestamp" not in k} for b in dest.batches(topic, p)]
    st = dest.state(topic, p)
    for v in st["producers"].values():
        v.pop("last_timestamp", None)
    keep = ("log_end_offset", "high_watermark", "last_stable_offset", "first_unstable_offset",
            "producers", "markers", "aborted_txns")
    return batches, {k: st.get(k) for k in keep}


def _sealed(mg, topic: str, parts: list[int]) -> bool:
    return all((mg.partition(topic, p) or {}).get("state") == "STOPPED" for p in parts)


class Brokers:
    """The simulated destination brokers: which one leads which partition, one fetcher per
    broker, each through its own instance."""

    def __init__(self, dest, topic: str, via: dict[str, str]):
        self.dest, self.topic, self.via = dest, topic, via
        self.fetchers: dict[int, object] = {}
        self.n = 0

    def lead(self, assign: dict[str, list[int]]) -> dict:
        """Moves leadership: every fetcher stops, the leaders' fetchers start from the log end."""
        for f in {id(f): f for f in self.fetchers.values()}.values():
            f.stop()
        self.fetchers = {}
        for broker, parts in assign.items():
            if parts:
                self.n += 1
                f = self.dest.mirror(f"{broker}-{self.n}", self.via[broker], [(self.topic, p) for p in parts])
                for p in parts:
                    self.fetchers[p] = f
        return self.fetchers


def _single_instance(kafka1, mirror_factory, kafka_dest_factory, topic: str, hws: list[int],  # noqa: F811
                     seal: dict) -> dict:
    """The same source input mirrored by one instance and one fetcher, stopped at `hws`
    (the cuts of the multi-instance run; `seal`: sealing batches per partition)."""
    ref = kafka_dest_factory("ref")
    mg = mirror_factory(kafka1.bootstrap, [MirrorSpec.of(MIRROR, kafka1, destination_hw=dest_hw_bootstrap(ref))],
                        state_topic=f"__mirror_state_ref_{topic}")
    mg.wait_sources_known()
    f = ref.mirror("ref", mg.mirrors[MIRROR].bootstrap, [(topic, 0), (topic, 1)])
    _catch_up({0: f, 1: f}, topic, hws)
    status, body = mg.post("stop", MIRROR, topic, [0, 1])
    assert status == 200, body
    harness.wait_until(lambda: _sealed(mg, topic, [0, 1]), 30, interval=0.1, what="reference sealed")
    _catch_up({0: f, 1: f}, topic, hws, extra=seal)
    f.stop()
    return {p: _log(ref, topic, p) for p in (0, 1)}


def test_partitions_follow_leadership_moves_between_instances(kafka1, kafka_dest_factory,  # noqa: F811
                                                             mirror_factory):
    topic = harness.topic_name("multi")
    harness.create_topics(kafka1.bootstrap, [topic], partitions=2)
    dest = kafka_dest_factory("multi")
    spec = lambda: [MirrorSpec.of(MIRROR, kafka1, destination_hw=dest_hw_bootstrap(dest))]  # noqa: E731
    mg_a = mirror_factory(kafka1.bootstrap, spec(), snapshot_interval_ms=300)
    mg_b = mirror_factory(kafka1.bootstrap, spec(), snapshot_interval_ms=300)
    for mg in (mg_a, mg_b):
        mg.wait_sources_known()
    ip = idempotent_producer(kafka1.bootstrap)
    tp = transactional_producer(kafka1.bootstrap, f"txn-{topic}", **{"transaction.timeout.ms": 600000})
    tp2 = transactional_producer(kafka1.bootstrap, f"txn2-{topic}", **{"transaction.timeout.ms": 600000})

    via = {"a": mg_a.mirrors[MIRROR].bootstrap, "b": mg_b.mirrors[MIRROR].bootstrap}
    brokers = Brokers(dest, topic, via)

    # Steady mirroring: partition 0 behind A, 1 behind B; a transaction opens on both.
    send(ip, topic, [b"p0-%d" % i for i in range(4)], partition=0)
    send(ip, topic, [b"p1-%d" % i for i in range(4)], partition=1)
    tp.begin_transaction()
    tp.produce(topic, value=b"t1-0", partition=0)
    tp.produce(topic, value=b"t1-1", partition=1)
    assert tp.flush(20) == 0
    fs = brokers.lead({"a": [0], "b": [1]})
    _catch_up(fs, topic, _hw(kafka1.bootstrap, topic))

    # Partition 0 moves to B while the transaction is open; it commits there, and two
    # transactions open on partition 0 while B serves it, one of a producer A never saw.
    fs = brokers.lead({"b": [0, 1]})
    send(ip, topic, [b"p0-b-%d" % i for i in range(3)], partition=0)
    tp.commit_transaction(20)
    tp.begin_transaction()
    tp.produce(topic, value=b"t2-0", partition=0)
    assert tp.flush(20) == 0
    tp2.begin_transaction()
    tp2.produce(topic, value=b"t3-0", partition=0)
    assert tp2.flush(20) == 0
    send(ip, topic, [b"p1-b-%d" % i for i in range(2)], partition=1)
    _catch_up(fs, topic, _hw(kafka1.bootstrap, topic))

    # Partition 0 moves back to A, which served it before: its state there is stale. No
    # pause: A may not have read B's serving record yet (the fetcher's gap makes it read
    # the state before mapping anything).
    fs = brokers.lead({"a": [0], "b": [1]})
    send(ip, topic, [b"p0-a-%d" % i for i in range(2)], partition=0)
    send(ip, topic, [b"p1-b2-%d" % i for i in range(2)], partition=1)
    _catch_up(fs, topic, _hw(kafka1.bootstrap, topic))
    time.sleep(TAIL)

    # B is killed while it serves partition 1; its leadership moves to A's broker.
    mg_b.kill9()
    fs = brokers.lead({"a": [0, 1]})
    send(ip, topic, [b"p1-a-%d" % i for i in range(2)], partition=1)
    _catch_up(fs, topic, _hw(kafka1.bootstrap, topic))
    mg_b.start()
    mg_b.wait_sources_known()
    time.sleep(TAIL)

    # The whole mirror is stopped through B, which serves nothing: A seals both
    # partitions (transactions 2 and 3 are still open on partition 0: two ABORTs, then the
    # barrier).
    hws = _hw(kafka1.bootstrap, topic)
    status, body = mg_b.post("stop", MIRROR, topic, [0, 1])
    assert status == 200, body
    harness.wait_until(lambda: _sealed(mg_a, topic, [0, 1]), 30, interval=0.1, what="A sealed both partitions")
    _catch_up(fs, topic, hws, extra={0: 3, 1: 1})
    brokers.lead({})
    multi = {p: _log(dest, topic, p) for p in (0, 1)}

    # The same input through one instance and one fetcher.
    single = _single_instance(kafka1, mirror_factory, kafka_dest_factory, topic, hws, {0: 3, 1: 1})
    for p in (0, 1):
        assert multi[p][0] == single[p][0], (p, multi[p][0], single[p][0])
        assert multi[p][1] == single[p][1], (p, multi[p][1], single[p][1])
    # The seal of partition 0 aborted transactions 2 and 3, opened while B served it.
    st = multi[0][1]
    assert [m["type"] for m in st["markers"]][-3:] == ["ABORT", "ABORT", "TYPE_7"], st["markers"]
    assert st["last_stable_offset"] == st["log_end_offset"], st
    # Any instance shows who serves what.
    for mg, here in ((mg_a, True), (mg_b, False)):
        views = {v["partition"]: v for v in mg.get("/v1/partitions")["partitions"] if v["topic"] == topic}
        assert set(views) == {0, 1}, views
        for v in views.values():
            assert v["served_here"] is here and v["served_by"], (mg.name, v)
            assert 0 < v["snapshot_offset"] <= hws[v["partition"]], (mg.name, v)
        assert views[0]["served_by"] == views[1]["served_by"], views
    # The moves as metrics: A took partition 0 over (twice) and 1, and dropped 0 as stale
    # once when B took it; B, restarted, serves nothing (a restart drops nothing as stale).
    for mg, take_overs, stale, served in ((mg_a, 3, 1, 2), (mg_b, 0, 0, 0)):
        m = mg.metrics()
        got = {kind: m.select("mirrorguard_mirror_events_total", mirror=MIRROR, kind=kind)
               for kind in ("take_over", "stale_dropped")}
        got["served"] = m.select("mirrorguard_partitions_served", mirror=MIRROR)
        assert all(len(v) == 1 for v in got.values()), (mg.name, got)
        assert [got[k][0][1] for k in ("take_over", "stale_dropped", "served")] == \
            [take_overs, stale, served], (mg.name, got)
    tp.abort_transaction(20)
    tp2.abort_transaction(20)


def test_seal_follows_the_partition_across_a_move(kafka1, kafka_dest_factory, mirror_factory):  # noqa: F811
    """A stop requested while a partition moves completes once, on the instance serving the
    fetcher: partition 0 is stopped (through A) while no fetcher serves it, and B's fetcher
    takes the cut; partition 1's cut is taken by A, whose fetcher loses leadership with the
    seal in hand, and B serves the same, persisted seal to the new leader's fetcher."""
    topic = harness.topic_name("mseal")
    harness.create_topics(kafka1.bootstrap, [topic], partitions=2)
    dest = kafka_dest_factory("mseal")
    spec = lambda: [MirrorSpec.of(MIRROR, kafka1, destination_hw=dest_hw_bootstrap(dest))]  # noqa: E731
    mg_a = mirror_factory(kafka1.bootstrap, spec(), snapshot_interval_ms=300)
    mg_b = mirror_factory(kafka1.bootstrap, spec(), snapshot_interval_ms=300)
    for mg in (mg_a, mg_b):
        mg.wait_sources_known()
    ip = idempotent_producer(kafka1.bootstrap)
    tps = [transactional_producer(kafka1.bootstrap, f"txn{p}-{topic}", **{"transaction.timeout.ms": 600000})
           for p in (0, 1)]
    for p in (0, 1):
        send(ip, topic, [b"p%d-%d" % (p, i) for i in range(3)], partition=p)
        tps[p].begin_transaction()
        tps[p].produce(topic, value=b"open-%d" % p, partition=p)
        assert tps[p].flush(20) == 0
    hws = _hw(kafka1.bootstrap, topic)
    via_a, via_b = mg_a.mirrors[MIRROR].bootstrap, mg_b.mirrors[MIRROR].bootstrap
    fa = {p: dest.mirror(f"a-{p}", via_a, [(topic, p)]) for p in (0, 1)}
    _catch_up(fa, topic, hws)

    # Partition 0: stopped (through A) while no fetcher serves it; B's fetcher takes the cut.
    fa[0].stop()
    status, body = mg_a.post("stop", MIRROR, topic, [0])
    assert status == 200, body
    harness.wait_until(lambda: (mg_b.partition(topic, 0) or {}).get("state") == "STOPPING", 15,
                       interval=0.1, what="B read the stop")
    fb0 = dest.mirror("b-0", via_b, [(topic, 0)])
    harness.wait_until(lambda: _sealed(mg_b, topic, [0]), 30, interval=0.1, what="B sealed partition 0")
    fb0.catch_up(topic, hws[0] + 2, partition=0, timeout=30)

    # Partition 1: stopped through B; A takes the cut, its fetcher loses leadership with the
    # seal in hand, and the new leader's fetcher goes through B.
    fa[1].drop_next(1, mode="lose_leadership")
    status, body = mg_b.post("stop", MIRROR, topic, [1])
    assert status == 200, body
    harness.wait_until(lambda: not fa[1].report()["running"], 15, interval=0.1,
                       what="A's fetcher lost the seal's response")
    view = mg_a.partition(topic, 1)
    assert view["state"] == "STOPPING" and view["cut"] == hws[1] and view["seal_batches"] == 2, view
    fa[1].stop()
    assert dest.state(topic, 1)["log_end_offset"] == hws[1], "the seal was not appended by A's fetcher"
    fb1 = dest.mirror("b-1", via_b, [(topic, 1)])
    harness.wait_until(lambda: _sealed(mg_b, topic, [1]), 30, interval=0.1, what="B completed the seal")
    fb1.catch_up(topic, hws[1] + 2, partition=1, timeout=30)
    fb0.stop()
    fb1.stop()
    multi = {p: _log(dest, topic, p) for p in (0, 1)}
    harness.wait_until(lambda: _sealed(mg_a, topic, [0, 1]), 15, interval=0.1, what="A read both seals")

    single = _single_instance(kafka1, mirror_factory, kafka_dest_factory, topic, hws, {0: 2, 1: 2})
    for p in (0, 1):
        assert multi[p] == single[p], (p, multi[p], single[p])
        st = multi[p][1]
        assert [m["type"] for m in st["markers"]] == ["ABORT", "TYPE_7"], st["markers"]
    for tp in tps:
        tp.abort_transaction(20)
