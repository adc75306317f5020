"""Three destination brokers, three mirrorguards (issue 17): partitions move around a ring
of instances, each of which has stale state of them when they come back.

Apache Kafka (kafka1) is the source and holds the shared ``__mirror_state``; the
destination is the stand-in of kafka_dest.py with one fetcher per simulated broker ('a',
'b', 'c'), each through its own instance (A, B, C). A leadership move stops the old
leader's fetcher and starts the new one's from the log end. Partition 0 goes A -> B -> C
-> A (moved during an open transaction, a second one opening on the way, and once with a
response lost by the old leader: the producer it brought was claimed by B, never appended,
and is fetched again through C), partition 1
goes B -> C -> A -> B (a transaction opens once it is back on B); A is then killed (-9)
while it serves partition 0, which moves to C again; the whole mirror is stopped through
A, restarted and serving nothing. The destination's logs and producer state must equal a
single instance's run of the same input (test_multi_instance._single_instance).
"""

from __future__ import annotations

import time

import harness
from kafka_dest import dest_hw_bootstrap, kafka_dest_factory  # noqa: F401 - fixture
from mirror_harness import (  # noqa: F401 - mirror_factory is a fixture
    MirrorSpec,
    idempotent_producer,
    mirror_factory,
    send,
    transactional_producer,
)
from test_multi_instance import MIRROR, TAIL, Brokers, _catch_up, _hw, _log, _sealed, _single_instance


def test_partitions_move_around_three_instances(kafka1, kafka_dest_factory, mirror_factory):  # noqa: F811
    topic = harness.topic_name("three")
    harness.create_topics(kafka1.bootstrap, [topic], partitions=2)
    dest = kafka_dest_factory("three")
    # The destination holds a log (Kafka's engine): seals complete on its high watermark.
    spec = lambda: [MirrorSpec.of(MIRROR, kafka1, destination_hw=dest_hw_bootstrap(dest))]  # noqa: E731
    mg = {name: mirror_factory(kafka1.bootstrap, spec(), snapshot_interval_ms=300) for name in "abc"}
    for m in mg.values():
        m.wait_sources_known()
    ip = idempotent_producer(kafka1.bootstrap)
    tp = transactional_producer(kafka1.bootstrap, f"txn-{topic}", **{"transaction.timeout.ms": 600000})
    tp2 = transactional_producer(kafka1.bootstrap, f"txn2-{topic}", **{"transaction.timeout.ms": 600000})
    brokers = Brokers(dest, topic, {name: m.mirrors[MIRROR].bootstrap for name, m in mg.items()})

    def mirror_all() -> None:
        _catch_up(brokers.fetchers, topic, _hw(kafka1.bootstrap, topic))
        time.sleep(TAIL)  # every instance has read the others' serving records

    # Steady mirroring: 0 on A, 1 on B; a transaction opens on both partitions.
    brokers.lead({"a": [0], "b": [1]})
    send(ip, topic, [b"p0-%d" % i for i in range(4)], partition=0)
    send(ip, topic, [b"p1-%d" % i for i in range(4)], partition=1)
    tp.begin_transaction()
    tp.produce(topic, value=b"t1-0", partition=0)
    tp.produce(topic, value=b"t1-1", partition=1)
    assert tp.flush(20) == 0
    mirror_all()

    # 0: A -> B with the transaction open; 1: B -> C. The transaction commits on B and C;
    # a second producer's transaction opens on partition 0 (B).
    brokers.lead({"b": [0], "c": [1]})
    send(ip, topic, [b"p0-b-%d" % i for i in range(2)], partition=0)
    tp.commit_transaction(20)
    tp2.begin_transaction()
    tp2.produce(topic, value=b"t2-0", partition=0)
    assert tp2.flush(20) == 0
    send(ip, topic, [b"p1-c-%d" % i for i in range(2)], partition=1)
    mirror_all()

    # 0: B -> C with transaction 2 open, and B's broker loses leadership with a response
    # in hand that brings a new producer: B claimed it, the destination never appended
    # it, and C fetches those offsets again (C applies B's claim first). 1: C -> A.
    b0 = brokers.fetchers[0]
    b0.drop_next(1, mode="lose_leadership")
    ip2 = idempotent_producer(kafka1.bootstrap)
    send(ip2, topic, [b"p0-new-producer-%d" % i for i in range(2)], partition=0)
    b0.follow(lambda: not b0.report()["running"], what="lost leadership with a response in hand")
    lost_at = dest.state(topic, 0)["log_end_offset"]
    assert lost_at < _hw(kafka1.bootstrap, topic)[0]
    brokers.lead({"c": [0], "a": [1]})
    send(ip, topic, [b"p0-c-%d" % i for i in range(2)], partition=0)
    send(ip, topic, [b"p1-a-%d" % i for i in range(2)], partition=1)
    mirror_all()

    # 0: C -> A and 1: A -> B, back where they started: the state there is stale (A last
    # saw partition 0 before the commit and transaction 2, B partition 1 before A and C).
    # A transaction opens on partition 1.
    brokers.lead({"a": [0], "b": [1]})
    send(ip, topic, [b"p0-a-%d" % i for i in range(2)], partition=0)
    tp.begin_transaction()
    tp.produce(topic, value=b"t3-1", partition=1)
    assert tp.flush(20) == 0
    mirror_all()

    # A is killed while it serves partition 0; its leadership moves to C (stale again).
    mg["a"].kill9()
    brokers.lead({"c": [0], "b": [1]})
    send(ip, topic, [b"p0-c2-%d" % i for i in range(2)], partition=0)
    send(ip, topic, [b"p1-b-%d" % i for i in range(2)], partition=1)
    mirror_all()
    mg["a"].start()
    mg["a"].wait_sources_known()

    # The whole mirror is stopped through A, which serves nothing now: C seals partition 0
    # (transaction 2 open: ABORT, barrier), B partition 1 (transaction 3 open: same).
    hws = _hw(kafka1.bootstrap, topic)
    status, body = mg["a"].post("stop", MIRROR, topic, [0, 1])
    assert status == 200, body
    seal = {0: 2, 1: 2}
    _catch_up(brokers.fetchers, topic, hws, extra=seal)
    harness.wait_until(lambda: _sealed(mg["c"], topic, [0]) and _sealed(mg["b"], topic, [1]), 30,
                       interval=0.1, what="C and B sealed their partitions")
    brokers.lead({})
    multi = {p: _log(dest, topic, p) for p in (0, 1)}
    for p in (0, 1):
        st = multi[p][1]
        assert [m["type"] for m in st["markers"]][-2:] == ["ABORT", "TYPE_7"], (p, st["markers"])
        assert st["last_stable_offset"] == st["log_end_offset"], (p, st)

    # C applied the claim B wrote for the new producer past C's fetch offset.
    claims = mg["c"].metrics().select("mirrorguard_state_store_ops_total", kind="take_over_claim")
    assert claims and claims[0][1] >= 1, claims
    # Who took what over, and dropped what as stale (A restarted: its counters are new).
    expect = {"b": (3, 2, 1), "c": (3, 2, 1), "a": (0, 0, 0)}
    for name, (take_overs, stale, served) in expect.items():
        m = mg[name].metrics()
        got = [m.select("mirrorguard_mirror_events_total", mirror=MIRROR, kind=kind)[0][1]
               for kind in ("take_over", "stale_dropped")]
        got.append(m.select("mirrorguard_partitions_served", mirror=MIRROR)[0][1])
        assert got == [take_overs, stale, served], (name, got)
    views = {v["partition"]: v for v in mg["a"].get("/v1/partitions")["partitions"] if v["topic"] == topic}
    assert views[0]["served_by"] != views[1]["served_by"] and not views[0]["served_here"], views

    single = _single_instance(kafka1, mirror_factory, kafka_dest_factory, topic, hws, seal)
    for p in (0, 1):
        assert multi[p][0] == single[p][0], (p, multi[p][0], single[p][0])
        assert multi[p][1] == single[p][1], (p, multi[p][1], single[p][1])
    tp.abort_transaction(20)
    tp2.abort_transaction(20)
