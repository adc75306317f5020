"""A disaster failover at scale (issue 31, SPEC 3): every partition of a mirror stopped at once.

One destination fetcher (the Kafka-engine stand-in: Kafka's FetchSessionHandler on one
connection, every partition listed in each Fetch v12, a broker's 30 s request timeout)
mirrors 1,000 partitions of an Apache Kafka 4.4 source: an idempotent record in each, and a
tenth of them inside transactions left open (10 transactional producers, each with one
10-partition transaction). `POST /v1/partitions/stop {"all": true}` then seals all of them.

Each partition must end with one ABORT per open transaction and the barrier (last stable
offset = log end), and mirrorguard must not close the fetcher's connection on the way. Before,
the seal path decided one partition per blocked round and gave up after 16 rounds, closing
the connection: every 16 partitions needing a cut cost the fetcher its connection (and, on a
broker, its back-off). This asserts correctness, not time.

`restarted-source-hung`: the disaster case. mirrorguard is killed (-9) before any snapshot
and started again, the source hangs (SIGSTOP), then every partition is stopped: each needs a
replay of what its state has not seen, and none can run. The replays of one fetch run side
by side under one deadline (the mirror's upstream request timeout, 3 s here), then each partition
is sealed from its persisted claims: one ABORT per producer that may have begun a transaction
(the idempotent producer's and each open transaction's), and the barrier. Before, each
partition waited out its own replay timeout in turn (1,000 x 3 s here, 10 s by default).
"""

from __future__ import annotations

import time

import pytest

import harness
from claims_scale import wait_every_partition_led
from kafka_dest import dest_hw_bootstrap, kafka_dest_factory  # noqa: F401 - fixture
from mirror_harness import (  # noqa: F401 - mirror_factory is a fixture
    MirrorSpec,
    idempotent_producer,
    mirror_factory,
    transactional_producer,
)

MIRROR = "a-to-b"
PARTITIONS = 1_000
TXN_PRODUCERS = 10
TXN_WIDTH = 10  # partitions per open transaction: a tenth of the partitions in all


@pytest.mark.parametrize("case", ["source-alive", "restarted-source-hung"])
def test_stop_all_of_a_thousand_partitions_seals_each_without_dropping_the_fetcher(
        case, kafka_factory, mirror_factory, kafka_dest_factory):  # noqa: F811
    T = harness.topic_name("scale")
    disaster = case == "restarted-source-hung"
    a = kafka_factory(name="A")
    harness.create_topics(a.bootstrap, [T], partitions=PARTITIONS, timeout=60)
    # The state cluster (where the destination's topic is listed too): the source itself
    # while it lives, a cluster of its own when the source is to hang; the session's shared
    # broker is spared a 1,000-partition topic.
    state = a
    if disaster:
        state = kafka_factory(name="S")
        harness.create_topics(state.bootstrap, [T], partitions=PARTITIONS, timeout=60)
    for cluster in {a.bootstrap: a, state.bootstrap: state}.values():
        # Each partition's log exists and is served before mirrorguard's state topic is
        # created: a broker creates 1,000 logs one by one, and the state topic would wait
        # behind them past mirrorguard's start-up budget on a busy machine.
        wait_every_partition_led(cluster.bootstrap, T, PARTITIONS, 60)
    dest = kafka_dest_factory("B")
    # A hung source's requests give up after 3 s (10 s by default): the fetch waits out one
    # such deadline for all its replays, where each partition waited out its own before.
    spec = MirrorSpec.of(MIRROR, a, destination_hw=dest_hw_bootstrap(dest),
                         extra="upstream_request_timeout_ms = 3000" if disaster else "")
    # In the disaster no snapshot is written: after the kill only the claims remain.
    mg = mirror_factory(state.bootstrap, [spec], snapshot_interval_ms=600000 if disaster else 10000)
    mg.wait_sources_known()

    ip = idempotent_producer(a.bootstrap)
    for p in range(PARTITIONS):
        ip.produce(T, value=b"r-%d" % p, partition=p)
    assert ip.flush(60) == 0
    open_in: dict[int, int] = {}  # partition -> transactions open in it
    tps = []
    for i in range(TXN_PRODUCERS):
        tp = transactional_producer(a.bootstrap, f"t{i}-{T}", **{"transaction.timeout.ms": 600000})
        tp.begin_transaction()
        for j in range(TXN_WIDTH):
            p = (i * TXN_WIDTH + j) * (PARTITIONS // (TXN_PRODUCERS * TXN_WIDTH))
            tp.produce(T, value=b"open-%d" % i, partition=p)
            open_in[p] = open_in.get(p, 0) + 1
        assert tp.flush(30) == 0
        tps.append(tp)
    assert len(open_in) == TXN_PRODUCERS * TXN_WIDTH

    f = dest.mirror("f", spec.bootstrap, [(T, p) for p in range(PARTITIONS)], request_timeout_ms=30000,
                    max_wait_ms=500)

    def caught_up() -> bool:
        parts = f.report()["partitions"]
        return len(parts) == PARTITIONS and all(
            x["position"] == x["source_high_watermark"] == 1 + open_in.get(x["partition"], 0) for x in parts)

    f.follow(caught_up, timeout=60, what="every partition mirrored")
    cut = {x["partition"]: x["position"] for x in f.report()["partitions"]}
    if disaster:
        mg.kill9()
        a.pause()
        # Only now: closing a transactional producer aborts its transaction, and on a live
        # source that ABORT marker would be mirrored below the cut (the close never returns
        # on a hung one).
        for tp in tps:
            harness.abandon_client(tp)
        mg.start()
        # The fetcher reconnects to the new process and is answered (locally, once the hung
        # source's request times out) before the stop.
        seen = f.report()
        f.follow(lambda: f.report()["responses"] > seen["responses"], timeout=60,
                 what="answered again after the restart")
    before = f.report()

    t0 = time.monotonic()
    status, body = mg.post("stop", MIRROR, all_=True, timeout=60.0)
    stop_answered = time.monotonic() - t0
    assert status == 200, body

    def all_stopped() -> bool:
        mine = [e for e in mg.partitions() if e["topic"] == T]
        return len(mine) == PARTITIONS and all(e["state"] == "STOPPED" for e in mine)

    harness.wait_until(all_stopped, 60, interval=0.5, what=f"all {PARTITIONS} partitions STOPPED")
    all_stopped_after = time.monotonic() - t0
    after = f.report()
    views = {e["partition"]: e for e in mg.partitions() if e["topic"] == T}
    wrong = []
    for p in range(PARTITIONS):
        batches = dest.batches(T, p, values=False)
        # The producers that may have begun a transaction: the open transactions' (their
        # batches are the transactional ones) and, with only claims to go on, every one.
        writers = {b["producer_id"] for b in batches if b["kind"] == "DATA"}
        open_pids = {b["producer_id"] for b in batches if b["kind"] == "DATA" and b.get("transactional")}
        n_aborts = len(writers) if disaster else len(open_pids)
        tail = [(b["kind"], b["producer_id"]) for b in batches if b["base_offset"] >= cut[p]]
        st = dest.state(T, p)
        v = views[p]
        if ([k for k, _ in tail] != ["ABORT"] * n_aborts + ["TYPE_7"] or len(open_pids) != open_in.get(p, 0)
                or not open_pids <= {pid for k, pid in tail if k == "ABORT"}
                or v["cut"] != cut[p] or v["seal_batches"] != n_aborts + 1
                or st["last_stable_offset"] != st["log_end_offset"] or st["log_end_offset"] != cut[p] + n_aborts + 1):
            wrong.append((p, tail, v.get("cut"), v.get("seal_batches"), st))
    m = mg.metrics()
    ends: dict[str, float] = {}
    for lb, v in m.select("mirrorguard_connection_ends_total"):
        if v:
            k = f"{lb.get('side')}/{lb.get('cause')}"
            ends[k] = ends.get(k, 0) + v
    print(f"{case}: {PARTITIONS} partitions ({len(open_in)} with an open transaction): fetcher connects "
          f"{before['connects']} -> {after['connects']}, timeouts {after['timeouts']}, "
          f"errors {after['errors']}; mirrorguard connection ends {ends}; wrongly sealed {len(wrong)}; "
          f"stop answered in {stop_answered:.1f} s, all STOPPED after {all_stopped_after:.1f} s")
    assert not wrong, wrong[:5]
    assert after["connects"] == before["connects"], "mirrorguard closed the fetcher's connection"
    assert after["timeouts"] == before["timeouts"], "a fetch was not answered within 30 s"
    if not disaster:
        for tp in tps:
            harness.abandon_client(tp)
    f.stop()
