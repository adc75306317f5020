#!/usr/bin/env python3
"""mirrorguard failover demo (SPEC section 4, scenario 1) on Kafka's own engine.

Active-passive A -> B, then failover to B and a local producer on B - once without
mirrorguard and once with it (region mapping, the seal, no loss). Prints the mapping
applied, the seal, the producer state Kafka's engine holds, Kafka's kafka-dump-log next to
`mirrorguard dump` of B's log, and the metrics that moved.

A, B and the state cluster are Apache Kafka 4.4 brokers written and read by librdkafka.
While B mirrors, its partition is the REFERENCE DESTINATION of tests/kafka-dest (Kafka's
UnifiedLog fed by appendAsFollower through a broker-like fetcher: no released broker
mirrors across clusters); at the failover its partition directory is handed to broker B,
which serves the local producer and consumers. Everything runs on 127.0.0.1 free ports;
everything started here is stopped on exit.

Run with the project venv:  .tools/venv/bin/python scripts/demo_failover.py
"""

from __future__ import annotations

import logging
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))

import harness  # noqa: E402
from kafka_broker import KafkaCluster  # noqa: E402
from kafka_dest import KafkaDest, kafka_dump_log, prepare_promotion, promote  # noqa: E402
from mirror_harness import MirrorGuard  # noqa: E402
from scenario_support import (  # noqa: E402
    HIGH,
    end_offset,
    idem,
    kinds,
    mirror_spec,
    read_all,
    segments,
    send_each,
    txn_producer,
    values,
)

BIN = harness.MIRRORGUARD_BIN
TOPIC = "orders"
logging.basicConfig(level=logging.CRITICAL)


def say(title: str) -> None:
    print(f"\n\033[1m== {title}\033[0m", flush=True)


def mg_cli(*args: str) -> str:
    return subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=30, check=True).stdout


def cluster(work: Path, name: str, started: list) -> KafkaCluster:
    while True:
        cid = harness.cluster_id()
        if not cid.startswith("-"):  # kafka-storage would read it as an option
            break
    c = KafkaCluster(work, nodes=1, cluster_id=cid, name=name)
    started.append(c)
    return c.start()


def fill_source(a) -> int:
    """A: an idempotent producer (PID 0) and a transactional one (PID 1) left open."""
    send_each(idem(a.bootstrap), TOPIC, [b"order-1", b"order-2", b"order-3"])
    tp = txn_producer(a.bootstrap, "payments")
    tp.begin_transaction()
    tp.produce(TOPIC, value=b"payment-in-flight", partition=0)
    tp.flush(15)
    return end_offset(a.bootstrap, TOPIC)


def show_state(dest: KafkaDest) -> None:
    st = dest.state(TOPIC)
    print(f"  Kafka's engine on B: log end {st['log_end_offset']}, high watermark {st['high_watermark']}, "
          f"last stable offset {st['last_stable_offset']}")
    for pid, e in st["producers"].items():
        print(f"    producer {pid}: epoch {e['epoch']}, last sequence {e['last_sequence']}, "
              f"open transaction at {e['open_txn_first_offset']}")


def local_producer(b) -> None:
    acked = send_each(idem(b.bootstrap), TOPIC, [b"local-%d" % i for i in range(5)])
    stored = values(read_all(b.bootstrap, TOPIC, "read_uncommitted"))
    for i, (err, off) in enumerate(acked):
        if err is not None:
            print(f"  local-{i}: REFUSED by broker B: {err.name()} ({'fatal: the producer is dead' if err.fatal() else ''})")
            continue
        fate = "stored" if b"local-%d" % i in stored else "NOT STORED"
        print(f"  local-{i}: acknowledged at offset {off} -> {fate}")
    rc = values(read_all(b.bootstrap, TOPIC, "read_committed"))
    print("  read_committed consumer on B gets:", [v.decode() for v in rc])


def show_dumps(b) -> None:
    pdir = b.nodes[0].data_dir / f"{TOPIC}-0"
    for seg in segments(pdir):
        say(f"Kafka's kafka-dump-log of {seg.name} on broker B")
        for x in kafka_dump_log(seg):
            print("  " + " ".join(f"{k}: {x[k]}" for k in ("baseOffset", "lastOffset", "producerId", "producerEpoch",
                                                           "baseSequence", "isTransactional", "isControl",
                                                           "partitionLeaderEpoch", "crc", "isvalid")))
        say(f"`mirrorguard dump --deep-iteration` of the same segment")
        print(subprocess.run([str(BIN), "dump", "--deep-iteration", str(seg)], capture_output=True, text=True,
                             timeout=30, check=True).stdout.rstrip())


def metrics_samples(mg) -> dict[str, float]:
    out = {}
    for name, labels, v in harness.parse_prometheus(harness.http_get(mg.admin_url + "/metrics")[1]):
        if name.startswith("mirrorguard_") and not name.endswith("_bucket"):
            out[name + "{" + ",".join(f'{k}="{x}"' for k, x in sorted(labels.items())) + "}"] = v
    return out


def main() -> int:
    if not BIN.exists():
        print(f"{BIN} missing: cargo build --bins", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="mirrorguard-failover-demo."))
    started: list = []
    try:
        # ------------------------------------------------------------ without mirrorguard
        say("Without mirrorguard: A (Kafka) -> B (Kafka's engine, stock rules)")
        a, b = cluster(work, "A", started), cluster(work, "B", started)
        harness.create_topics(a.bootstrap, [TOPIC])
        end = fill_source(a)
        dest = KafkaDest(work, "B-unguarded").start()
        started.append(dest)
        dest.open(TOPIC, topic_id=prepare_promotion(b, TOPIC))
        f = dest.mirror("a-to-b", a.bootstrap, [(TOPIC, 0)])
        f.catch_up(TOPIC, end)
        f.stop()
        print(f"B mirrored offsets 0..{end - 1} of A")
        show_state(dest)
        promote(dest, b, TOPIC)
        print("failover: B's log handed to broker B; a local idempotent producer on B draws PID 0 from B's allocator")
        local_producer(b)
        harness.close_clients()
        for x in (dest, a, b):
            x.stop()
            started.remove(x)

        # ------------------------------------------------------------ with mirrorguard
        say("With mirrorguard: A (Kafka) -> mirrorguard [[mirror]] (region, high) -> B")
        a, b, state = cluster(work, "A2", started), cluster(work, "B2", started), cluster(work, "state", started)
        harness.create_topics(a.bootstrap, [TOPIC])
        harness.create_topics(state.bootstrap, [TOPIC])  # __mirror_state lives here (and the topic id: issue 13 item 6)
        mg = MirrorGuard(work, "mirrorguard", state.bootstrap, [mirror_spec("a-to-b", a, HIGH)], log_level="info")
        mg.start()
        started.append(mg)
        mg.wait_sources_known()
        before = metrics_samples(mg)
        end = fill_source(a)
        dest = KafkaDest(work, "B").start()
        started.append(dest)
        dest.open(TOPIC, topic_id=prepare_promotion(b, TOPIC))
        f = dest.mirror("a-to-b", mg.mirrors["a-to-b"].bootstrap, [(TOPIC, 0)])
        f.catch_up(TOPIC, end)
        r = f.report()
        print(f"  B's fetcher: fetch session {r['session_id']} epoch {r['session_epoch']}, "
              f"{r['full_requests']} full and {r['incremental_requests']} incremental Fetch v{r['fetch_version']}")

        say("The mapping applied (source PID -> mapped PID, decoded by `mirrorguard map --decode`)")
        seen = {}
        for x in dest.batches(TOPIC, values=False):
            if x["producer_id"] != -1:
                seen.setdefault(x["producer_id"], x["base_offset"])
        src = {x.base_offset: x.producer_id for x in __import__("mirror_harness").direct_batches(a.bootstrap, TOPIC)}
        for pid, off in seen.items():
            dec = " ".join(mg_cli("map", "--decode", str(pid)).split())
            print(f"  offset {off}: source PID {src.get(off)} -> {pid}  ({dec})")

        say("Failover: POST /v1/partitions/stop, the destination fetcher takes the seal")
        status, body = mg.post("stop", "a-to-b", TOPIC)
        print(f"  POST /v1/partitions/stop -> {status}: state {body['applied'][0]['state']}")
        harness.wait_until(lambda: mg.partition(TOPIC)["state"] == "STOPPED", 20, what="STOPPED")
        view = mg.partition(TOPIC)
        f.catch_up(TOPIC, view["cut"] + view["seal_batches"])
        f.stop()
        print(f"  partition {TOPIC}-0: {view['state']}, cut {view['cut']}, {view['seal_batches']} sealing batches")
        show_state(dest)
        promote(dest, b, TOPIC)
        for off, kind, pid in kinds(BIN, b.nodes[0].data_dir / f"{TOPIC}-0"):
            if off >= view["cut"]:
                what = "ABORT marker for the open transaction" if kind == "abort" else "MIRROR_PID_RESET barrier"
                print(f"  offset {off}: {what} (producerId {pid})")
        print("  B's log handed to broker B; a local idempotent producer on B draws PID 0 from B's allocator")
        local_producer(b)
        show_dumps(b)

        say("Anomalies (GET /v1/anomalies)")
        print(" ", mg.get("/v1/anomalies"))

        say("Metrics that moved (GET /metrics)")
        after = metrics_samples(mg)
        for k in sorted(after):
            if after[k] != before.get(k, 0) and ("mirror" in k or "partition" in k or "anomal" in k
                                               or "seal" in k or "barrier" in k or "state" in k):
                print(f"  {k} {before.get(k, 0):g} -> {after[k]:g}")
        return 0
    finally:
        harness.close_clients()
        for p in reversed(started):
            if isinstance(p, MirrorGuard):
                p.terminate()
            else:
                p.stop()


if __name__ == "__main__":
    sys.exit(main())
