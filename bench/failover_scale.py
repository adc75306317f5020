#!/usr/bin/env python3
"""Benchmark: a disaster failover at scale (issue 31). Not part of the CI suite
(tests/integration/test_seal_scale.py is the bounded version: 1,000 partitions, correctness).

For each N and each source condition it mirrors N partitions of an Apache Kafka 4.4 source
through mirrorguard to the Kafka-engine destination (tests/kafka-dest: Kafka's
FetchSessionHandler on one connection, every partition in each Fetch v12, a broker's 30 s
request timeout), then stops every partition at once and measures the seal:

- each partition holds ten idle idempotent producers (synthetic producer ids, one batch
  each, written as bench/claims_scale.py writes them), and a tenth of the partitions a
  transaction left open (N/100 transactional producers, each with one 10-partition
  transaction);
- conditions: the source `alive`, `killed` (SIGKILL) or `hung` (SIGSTOP, a black hole)
  when the stop comes, each `fresh` (the same mirrorguard process that mirrored) or
  `restarted` (mirrorguard killed -9 and started again first: with no snapshot round since
  the mirroring began, every partition's state must be replayed from the source, and a dead
  or hung source makes each Fetch wait out the replay deadline before the seal is planned
  from the persisted claims);
- figures per run: seconds from `POST /v1/partitions/stop {"mirror": ..., "all": true}` to
  its answer and to every partition STOPPED (the destination's high watermark past each
  seal), the fetcher's reconnects and request timeouts meanwhile, `__mirror_state` records
  and bytes (segment bytes on disk) written meanwhile, mirrorguard's CPU-seconds meanwhile,
  its RSS before the stop and its peak RSS, and the partitions whose open transaction the
  seal left open on the destination (must be 0).

Each run has a topic, a destination process, a mirrorguard process and a state topic of its
own on the same source and state clusters (deleted after it); a killed source is restarted
and a hung one resumed between runs.

    .tools/venv/bin/python bench/failover_scale.py --partitions 100 1000 10000 --release \\
        --out target/failover-scale.json
    .tools/venv/bin/python bench/failover_scale.py --binary /path/to/other/mirrorguard ...
    .tools/venv/bin/python bench/failover_scale.py --handover 1000 --release    # two instances
    .tools/venv/bin/python bench/failover_scale.py --producers-in-state 1000000 --release
    .tools/plot-venv/bin/python bench/plot_failover_scale.py target/failover-scale.json \\
        docs/failover-scale.png
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))

MIRROR = "a-to-b"
IDLE_PRODUCERS = 10  # per partition
TXN_WIDTH = 10  # partitions per open transaction
CONDITIONS = ["alive", "killed", "hung"]


def say(what: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {what}", file=sys.stderr, flush=True)


def proc_stat(pid: int) -> tuple[float, int, int]:
    """CPU-seconds (user + system), current and peak RSS in bytes of process `pid`."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    kib = lambda k: int(status[k].split()[0]) * 1024  # noqa: E731
    return cpu, kib("VmRSS"), kib("VmHWM")


def segment_bytes(cluster, topic: str) -> int:
    d = cluster.nodes[0].data_dir / f"{topic}-0"
    return sum(f.stat().st_size for f in d.glob("*.log")) if d.exists() else 0


def make_topic(bootstrap: str, topic: str, n: int, timeout: float) -> None:
    """A topic of `n` partitions. A KRaft controller refuses one operation of more than
    10,000 records (a topic record and one per partition: POLICY_VIOLATION), so a larger
    topic is created in steps of 5,000 partitions."""
    import harness
    from confluent_kafka.admin import NewPartitions

    step = 5000
    harness.create_topics(bootstrap, [topic], partitions=min(n, step), timeout=timeout)
    a = harness.admin(bootstrap)
    have = min(n, step)
    while have < n:
        have = min(n, have + step)
        for f in a.create_partitions([NewPartitions(topic, have)], operation_timeout=timeout).values():
            f.result(timeout=timeout)

    def visible() -> bool:
        t = a.list_topics(topic, timeout=10).topics.get(topic)
        return t is not None and len(t.partitions) == n and all(p.leader >= 0 for p in t.partitions.values())

    harness.wait_until(visible, timeout, interval=0.5, what=f"{topic}: {n} partitions led")


def delete_topics(cluster, names: list[str]) -> None:
    import harness

    bootstrap = cluster.bootstrap
    a = harness.admin(bootstrap)
    for f in a.delete_topics(names, operation_timeout=60).values():
        try:
            f.result(timeout=60)
        except Exception as e:  # noqa: BLE001 - a topic never made is fine
            print(f"  (delete {names}: {e})", file=sys.stderr)
    # Gone from Metadata before the next run's mirrorguard starts: `stop --all` covers every
    # topic of the source, and a deleted topic's partitions have no destination topic id.
    import rawkafka

    host, port = bootstrap.split(",")[0].rsplit(":", 1)

    def gone() -> bool:
        with rawkafka.Connection(host, int(port), timeout=10) as c:
            return not set(names) & set(rawkafka.metadata_v1(c, None).topics)

    harness.wait_until(gone, 300, interval=0.5, what=f"{names} deleted")
    data = cluster.nodes[0].data_dir
    harness.wait_until(lambda: not any(p.name.endswith("-delete") for p in data.iterdir()), 300, interval=1.0,
                       what=f"{names}: files removed")


def run_one(work: Path, src, state, n: int, condition: str, restarted: bool, binary: Path | None,
            run_timeout: float) -> dict:
    import harness
    from claims_scale import produce_synthetic
    from kafka_dest import KafkaDest, dest_hw_bootstrap
    from mirror_harness import MirrorGuard, MirrorSpec, high_watermark, transactional_producer

    tag = f"{n}-{condition}-{'restarted' if restarted else 'fresh'}"
    T = f"fo-{tag}-{os.urandom(2).hex()}"
    out: dict = {"partitions": n, "condition": condition, "restarted": restarted}
    create_s = max(60.0, n / 50)
    t0 = time.monotonic()
    # The run's state topic before the large topics: a broker creating 10,000 partition logs
    # answers a new topic's Metadata late, past mirrorguard's start-up budget for it.
    harness.create_topics(state.bootstrap, [f"__mirror_state_{T}"], config={"cleanup.policy": "compact"})
    make_topic(src.bootstrap, T, n, create_s)
    make_topic(state.bootstrap, T, n, create_s)
    out["create_topics_s"] = round(time.monotonic() - t0, 1)
    dest = KafkaDest(work, f"dest-{tag}").start(timeout=60)
    say(f"{tag}: topics made")
    mg = None
    tps = []
    resume = None
    try:
        spec = MirrorSpec.of(MIRROR, src, destination_hw=dest_hw_bootstrap(dest))
        # No snapshot round: after a restart only the claims are persisted, so every
        # partition needs a replay of the source (the worst case for a dead source).
        mg = MirrorGuard(work, f"mg-{tag}", state.bootstrap, [spec], state_topic=f"__mirror_state_{T}",
                         snapshot_interval_ms=600_000, log_level="info", binary=binary)
        mg.start(timeout=120)
        mg.wait_sources_known(timeout=60)
        say(f"{tag}: mirrorguard up")
        out["produce_s"] = round(produce_synthetic(src.bootstrap, T, IDLE_PRODUCERS * n, partitions=n), 1)
        open_in: dict[int, int] = {}
        for i in range(max(1, n // 100)):
            tp = transactional_producer(src.bootstrap, f"t{i}-{T}", **{"transaction.timeout.ms": 900_000})
            tp.begin_transaction()
            for j in range(TXN_WIDTH):
                p = ((i * TXN_WIDTH + j) * 10) % n
                tp.produce(T, value=b"open-%d" % i, partition=p)
                open_in[p] = open_in.get(p, 0) + 1
            assert tp.flush(60) == 0
            tps.append(tp)
        out["open_transaction_partitions"] = len(open_in)
        f = dest.mirror("f", spec.bootstrap, [(T, p) for p in range(n)], request_timeout_ms=30000,
                        max_wait_ms=500)
        t0 = time.monotonic()

        def caught_up() -> bool:
            parts = f.report()["partitions"]
            return len(parts) == n and all(
                x["position"] == x["source_high_watermark"] == IDLE_PRODUCERS + open_in.get(x["partition"], 0)
                for x in parts)

        harness.wait_until(caught_up, max(120.0, n / 10), interval=1.0, what=f"{T}: every partition mirrored")
        out["mirror_s"] = round(time.monotonic() - t0, 1)
        say(f"{tag}: mirrored")
        node = src.nodes[0]
        if restarted:
            mg.kill9()
        if condition == "killed":
            node.kill()
            resume = lambda: node.restart(timeout=max(60.0, n / 50))  # noqa: E731 - log recovery of n partitions
        elif condition == "hung":
            node.pause()
            resume = node.resume
        if condition != "alive":
            for tp in tps:
                harness.abandon_client(tp)
            tps = []
        if restarted:
            t0 = time.monotonic()
            mg.start(timeout=300)
            out["restart_to_ready_s"] = round(time.monotonic() - t0, 1)
            seen = f.report()["responses"]
            harness.wait_until(lambda: f.report()["responses"] > seen, 120, interval=0.5,
                               what="the fetcher answered again after the restart")
        before = f.report()
        say(f"{tag}: stopping every partition")
        cpu0, rss0, _ = proc_stat(mg.proc.pid)
        st_records0 = high_watermark(state.bootstrap, mg.state_topic)
        st_bytes0 = segment_bytes(state, mg.state_topic)

        t0 = time.monotonic()
        status, body = mg.post("stop", MIRROR, all_=True, timeout=120.0)
        out["stop_answered_s"] = round(time.monotonic() - t0, 2)
        assert status == 200, body
        stopped = 0
        while time.monotonic() - t0 < run_timeout:
            mine = [e for e in mg.partitions() if e["topic"] == T]
            stopped = sum(e["state"] == "STOPPED" for e in mine)
            if stopped == n:
                break
            time.sleep(0.25)
        out["all_stopped_s"] = round(time.monotonic() - t0, 2) if stopped == n else None
        out["stopped"] = stopped
        cpu1, _, hwm = proc_stat(mg.proc.pid)
        after = f.report()
        out["fetcher_reconnects"] = after["connects"] - before["connects"]
        out["fetcher_timeouts"] = after["timeouts"] - before["timeouts"]
        out["state_records"] = high_watermark(state.bootstrap, mg.state_topic) - st_records0
        out["state_bytes"] = segment_bytes(state, mg.state_topic) - st_bytes0
        out["cpu_s"] = round(cpu1 - cpu0, 2)
        out["rss_before_stop_mib"] = round(rss0 / 2**20, 1)
        out["peak_rss_mib"] = round(hwm / 2**20, 1)
        # The seal's point: no transaction left open on the destination.
        still_open = [p for p in open_in if (lambda st: st["last_stable_offset"] < st["log_end_offset"])(dest.state(T, p))]
        out["open_transactions_left"] = len(still_open)
        f.stop()
    finally:
        if mg is not None:
            mg.terminate()
        dest.stop()
        if resume is not None:
            resume()
            src.wait_brokers(1, 120)
        for tp in tps:
            harness.abandon_client(tp)
        try:
            delete_topics(src, [T])
            delete_topics(state, [T, f"__mirror_state_{T}"])
        except Exception as e:  # noqa: BLE001 - the figures stand; the next run may be disturbed
            say(f"{tag}: clean-up failed: {e}")
    return out


def restart_with_producers(work: Path, src, state, total: int, partitions: int, binary: Path | None) -> dict:
    """Issue 31: restart-to-ready and RSS with `total` producers in state (`partitions`
    partitions, one synthetic producer per batch), first with only their claims persisted
    (no snapshot round), then after a snapshot round superseded them (chunked snapshots)."""
    import harness
    from claims_scale import produce_synthetic
    from kafka_dest import KafkaDest
    from mirror_harness import MirrorGuard, MirrorSpec

    T = f"ps-{total}-{os.urandom(2).hex()}"
    st_topic = f"__mirror_state_{T}"
    out: dict = {"producers": total, "partitions": partitions}
    harness.create_topics(state.bootstrap, [st_topic], config={"cleanup.policy": "compact"})
    make_topic(src.bootstrap, T, partitions, 120)
    make_topic(state.bootstrap, T, partitions, 120)
    dest = KafkaDest(work, f"dest-{T}").start(timeout=60)
    mg = None
    try:
        spec = MirrorSpec.of(MIRROR, src)
        mg = MirrorGuard(work, f"mg-{T}", state.bootstrap, [spec], state_topic=st_topic,
                         snapshot_interval_ms=600_000, log_level="info", binary=binary)
        mg.start(timeout=120)
        mg.wait_sources_known(timeout=60)
        out["produce_s"] = round(produce_synthetic(src.bootstrap, T, total, partitions=partitions), 1)
        say(f"{T}: {total} producers written")
        f = dest.mirror("f", spec.bootstrap, [(T, p) for p in range(partitions)], request_timeout_ms=30000,
                        max_wait_ms=500)
        t0 = time.monotonic()
        per = total // partitions
        harness.wait_until(lambda: all(x["position"] == per for x in f.report()["partitions"]), 1800,
                           interval=1.0, what=f"{T}: every producer mirrored")
        out["mirror_s"] = round(time.monotonic() - t0, 1)
        f.stop()
        _, rss, hwm = proc_stat(mg.proc.pid)
        out["mirrored"] = {"rss_mib": round(rss / 2**20, 1), "peak_rss_mib": round(hwm / 2**20, 1),
                           "producer_state_mib": round(mg.metrics().sum("mirrorguard_producer_state_bytes") / 2**20, 1)}
        say(f"{T}: mirrored; restarting")

        def restart(label: str) -> None:
            mg.kill9()
            t0 = time.monotonic()
            mg.start(timeout=600)
            ready = round(time.monotonic() - t0, 1)
            _, rss, hwm = proc_stat(mg.proc.pid)
            loaded = [line for line in mg.log_text().splitlines() if "__mirror_state loaded" in line][-1]
            out[label] = {"restart_to_ready_s": ready, "rss_mib": round(rss / 2**20, 1),
                          "peak_rss_mib": round(hwm / 2**20, 1),
                          "producers_tracked": mg.metrics().sum("mirrorguard_producer_state_producers"),
                          # The producer state's own account of its tables: the rest of the
                          # RSS is everything else.
                          "producer_state_mib": round(mg.metrics().sum("mirrorguard_producer_state_bytes") / 2**20, 1),
                          "startup_read": loaded.split("loaded", 1)[1].strip()[:200]}
            say(f"{T}: {label}: {out[label]}")

        restart("restart_with_claims")
        mg.kill9()
        # Another instance on the same state topic with a snapshot round every 2 s: chunked
        # snapshots supersede the claims.
        mg = MirrorGuard(work, f"mg2-{T}", state.bootstrap, [MirrorSpec.of(MIRROR, src)], state_topic=st_topic,
                         snapshot_interval_ms=2000, log_level="info", binary=binary)
        mg.start(timeout=600)
        time.sleep(30)
        restart("restart_with_snapshots")
    finally:
        if mg is not None:
            mg.terminate()
        dest.stop()
    return out


def handover(work: Path, src, state, n: int, kill_first: bool, binary: Path | None) -> dict:
    """Issue 31: handover time of `n` partitions when destination leadership moves from one
    mirrorguard instance to another. Both instances share the state topic; the fetcher of
    the broker that led every partition fetches through instance A until caught up (ten idle
    producers per partition, A's snapshot round done), then stops (its broker lost
    leadership; with `kill_first` A is also killed -9, the broker's host gone), and the new
    leader's fetcher fetches every partition through instance B. B takes a partition over
    when it first has a batch of it to forward (reads the state, restores A's snapshot,
    persists its serving record): measured as the seconds from writing one more batch to
    every partition until the new fetcher holds them all, against the same step through A
    before the move, then until B serves all n and A has let all n go (it drops its stale
    state once it reads B's serving records)."""
    import harness
    from claims_scale import PID_BASE, produce_synthetic
    from kafka_dest import KafkaDest
    from mirror_harness import MirrorGuard, MirrorSpec, high_watermark

    tag = f"handover-{n}-{'a-killed' if kill_first else 'a-alive'}"
    T = f"ho-{n}-{os.urandom(2).hex()}"
    st_topic = f"__mirror_state_{T}"
    out: dict = {"handover_partitions": n, "a_killed": kill_first}
    harness.create_topics(state.bootstrap, [st_topic], config={"cleanup.policy": "compact"})
    make_topic(src.bootstrap, T, n, max(60.0, n / 50))
    make_topic(state.bootstrap, T, n, max(60.0, n / 50))
    dest = KafkaDest(work, f"dest-{tag}").start(timeout=60)
    mgs: list = []
    try:
        for name in ("a", "b"):
            mg = MirrorGuard(work, f"mg{name}-{tag}", state.bootstrap, [MirrorSpec.of(MIRROR, src)],
                             state_topic=st_topic, snapshot_interval_ms=2000, log_level="info", binary=binary)
            mg.start(timeout=120)
            mg.wait_sources_known(timeout=60)
            mgs.append(mg)
        mg_a, mg_b = mgs
        out["produce_s"] = round(produce_synthetic(src.bootstrap, T, IDLE_PRODUCERS * n, partitions=n), 1)
        served = lambda mg: mg.metrics().sum("mirrorguard_partitions_served", mirror=MIRROR)  # noqa: E731

        def at(f, offset: int) -> bool:
            parts = f.report()["partitions"]
            return len(parts) == n and all(x["position"] == x["source_high_watermark"] == offset for x in parts)

        def one_more_batch_each(f, offset: int, what: str) -> float:
            """Seconds from writing one more batch to every partition (a new producer each:
            producer ids past those written so far) until the fetcher `f` holds them all."""
            t0 = time.monotonic()
            produce_synthetic(src.bootstrap, T, n, partitions=n, pid_base=PID_BASE + (offset - 1) * n)
            harness.wait_until(lambda: at(f, offset), 300, interval=0.05, what=what)
            return round(time.monotonic() - t0, 2)

        fa = dest.mirror("fa", mg_a.mirrors[MIRROR].bootstrap, [(T, p) for p in range(n)],
                         request_timeout_ms=30000, max_wait_ms=500)
        harness.wait_until(lambda: at(fa, IDLE_PRODUCERS), max(120.0, n / 10), interval=0.5,
                           what=f"{T}: mirrored through A")
        harness.wait_until(lambda: served(mg_a) == n, 60, interval=0.5, what="A serves every partition")
        # The same step with no move: what a batch per partition costs to write and mirror.
        out["batch_each_through_a_s"] = one_more_batch_each(fa, IDLE_PRODUCERS + 1, "a batch each through A")
        # A's snapshot round (every 2 s) after the last batch: B restores it instead of
        # replaying each partition from the source.
        time.sleep(6)
        fa.stop()
        if kill_first:
            mg_a.kill9()
        records0 = high_watermark(state.bootstrap, st_topic)
        cpu0, _, _ = proc_stat(mg_b.proc.pid)
        say(f"{tag}: leadership moves to B")
        t0 = time.monotonic()
        fb = dest.mirror("fb", mg_b.mirrors[MIRROR].bootstrap, [(T, p) for p in range(n)],
                         request_timeout_ms=30000, max_wait_ms=500)
        harness.wait_until(lambda: at(fb, IDLE_PRODUCERS + 1), 300, interval=0.05,
                           what=f"{T}: the new leader's fetcher answered through B")
        out["fetcher_answered_through_b_s"] = round(time.monotonic() - t0, 2)
        # B takes a partition over when it has a batch of it to forward: the handover proper.
        t0 = time.monotonic()
        out["batch_each_through_b_s"] = one_more_batch_each(fb, IDLE_PRODUCERS + 2, "a batch each through B")
        harness.wait_until(lambda: served(mg_b) == n, 60, interval=0.05, what="B serves every partition")
        out["b_serves_all_s"] = round(time.monotonic() - t0, 2)
        if not kill_first:
            harness.wait_until(lambda: served(mg_a) == 0, 120, interval=0.1, what="A lets every partition go")
            out["a_lets_go_s"] = round(time.monotonic() - t0, 2)
        cpu1, rss, hwm = proc_stat(mg_b.proc.pid)
        rep = fb.report()
        out["fetcher_reconnects"] = rep["connects"] - 1
        out["fetcher_timeouts"] = rep["timeouts"]
        out["fetcher_errors"] = rep["errors"]
        out["state_records"] = high_watermark(state.bootstrap, st_topic) - records0
        out["b_cpu_s"] = round(cpu1 - cpu0, 2)
        out["b_rss_mib"] = round(rss / 2**20, 1)
        out["b_peak_rss_mib"] = round(hwm / 2**20, 1)
        out["take_overs"] = mg_b.metrics().sum("mirrorguard_mirror_events_total", mirror=MIRROR, kind="take_over")
        fb.stop()
    finally:
        for mg in mgs:
            mg.terminate()
        dest.stop()
    try:
        delete_topics(src, [T])
        delete_topics(state, [T, st_topic])
    except Exception as e:  # noqa: BLE001 - the figures stand
        say(f"{tag}: clean-up failed: {e}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--partitions", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--conditions", nargs="+", default=CONDITIONS, choices=CONDITIONS)
    ap.add_argument("--restarted", choices=["both", "fresh", "restarted"], default="both")
    ap.add_argument("--release", action="store_true", help="use target/release/mirrorguard")
    ap.add_argument("--binary", type=Path, help="another mirrorguard binary (a 'before' build)")
    ap.add_argument("--run-timeout", type=float, default=300.0,
                    help="seconds to wait for every partition STOPPED before reporting how many are")
    ap.add_argument("--work", type=Path, help="keep the clusters' and processes' files here (default: a temporary directory)")
    ap.add_argument("--producers-in-state", type=int, metavar="N",
                    help="instead: restart-to-ready and RSS with N producers in state (--producer-partitions)")
    ap.add_argument("--producer-partitions", type=int, default=100)
    ap.add_argument("--handover", type=int, metavar="N",
                    help="instead: handover time of N partitions between two instances (A alive, then A killed)")
    ap.add_argument("--out", type=Path, help="append each run's figures (JSON lines) to this file")
    args = ap.parse_args()
    if args.release:
        os.environ["MIRRORGUARD_BIN"] = str(ROOT / "target" / "release" / "mirrorguard")
    import harness  # noqa: E402 - after MIRRORGUARD_BIN
    import kafka_dest
    from kafka_broker import KafkaCluster

    biggest = max(args.partitions)
    heap = "-Xmx2g" if biggest > 2000 else "-Xmx768m"
    kafka_dest.JVM_OPTS[:] = [o for o in kafka_dest.JVM_OPTS if not o.startswith("-Xmx")] + [heap]
    binary = args.binary or Path(os.environ.get("MIRRORGUARD_BIN", harness.MIRRORGUARD_BIN))
    restarts = {"both": [False, True], "fresh": [False], "restarted": [True]}[args.restarted]
    label = os.environ.get("BENCH_LABEL", str(binary))
    with tempfile.TemporaryDirectory(prefix="failover-scale-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        # No auto-created topics: a transactional producer abandoned with its source killed
        # recreates its deleted topic when the source comes back, and that topic (with no
        # destination topic) would be part of the next run's `stop --all`.
        # A deleted topic's files are removed at once (default: a minute later), so two runs'
        # topics never hold open files together (20,000 per process here).
        overrides = {"num.io.threads": "4", "num.network.threads": "2", "auto.create.topics.enable": "false",
                     "file.delete.delay.ms": "0"}
        src = KafkaCluster(work / "src", nodes=1, name="src", overrides=overrides, jvm_opts=[heap]).start()
        state = KafkaCluster(work / "state", nodes=1, name="state", overrides=overrides, jvm_opts=[heap]).start()
        try:
            # The transaction coordinators of both clusters loaded before the first large
            # topic: mirrorguard's first InitProducerId on the state cluster must not wait
            # behind a broker creating 20,000 partition logs (COORDINATOR_LOAD_IN_PROGRESS).
            from mirror_harness import transactional_producer

            for cluster in (src, state):
                harness.abandon_client(transactional_producer(cluster.bootstrap, f"warm-{os.urandom(2).hex()}"))
            def emit(r: dict) -> None:
                r["binary"] = label
                line = json.dumps(r)
                print(line, flush=True)
                if args.out:
                    with open(args.out, "a") as fh:
                        fh.write(line + "\n")

            if args.handover:
                for kill_first in (False, True):
                    emit(handover(work, src, state, args.handover, kill_first, binary))
                return
            if args.producers_in_state:
                emit(restart_with_producers(work, src, state, args.producers_in_state, args.producer_partitions, binary))
                return
            for n in args.partitions:
                for condition in args.conditions:
                    for restarted in restarts:
                        t0 = time.monotonic()
                        r = run_one(work, src, state, n, condition, restarted, binary, args.run_timeout)
                        r["run_timeout"] = args.run_timeout
                        r["run_s"] = round(time.monotonic() - t0, 1)
                        emit(r)
        finally:
            src.stop()
            state.stop()


if __name__ == "__main__":
    main()
