#!/usr/bin/env python3
"""mirrorguard failover demo (SPEC section 4, scenario 1) on embedded defaults.

Active-passive A -> B, then failover to B and a local producer on B - once without
mirrorguard (the local producer's first batches are acknowledged and never stored) and
once with it (region mapping, the seal, no loss). Prints the mapping applied, the seal,
`mirrorguard dump` of B's log and the metrics that moved.

A is a real Tansu broker written by real librdkafka producers; B is the REFERENCE
DESTINATION of tests/refdest, a stand-in for a stock destination broker's mirror fetcher
and log (tests and demo only: no mirroring broker can be installed here). Everything runs on
127.0.0.1 free ports; everything started here is stopped on exit.

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
sys.path.insert(0, str(ROOT / "tests"))

import harness  # noqa: E402
from mirror_harness import MirrorGuard, MirrorSpec  # noqa: E402
from refdest import ReferenceDestination, source_end_offset  # noqa: E402
from scenario_support import dump_kinds, dump_text, read_all, send_each, values  # noqa: E402

BIN = harness.MIRRORGUARD_BIN
TOPIC = "orders"
logging.basicConfig(level=logging.ERROR)


def say(title: str) -> None:
    print(f"\n\033[1m== {title}\033[0m", flush=True)


def mg_cli(*args: str) -> str:
    return subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=30, check=True).stdout


def fill_source(a) -> int:
    """A: an idempotent producer (PID 1) and a transactional one (PID 2) left open."""
    send_each(harness.new_producer(a.bootstrap, **{"enable.idempotence": True, "linger.ms": 0}), TOPIC,
              [b"order-1", b"order-2", b"order-3"])
    tp = harness.new_producer(a.bootstrap, **{"transactional.id": "payments", "linger.ms": 0})
    tp.init_transactions(15)
    tp.begin_transaction()
    tp.produce(TOPIC, value=b"payment-in-flight", partition=0)
    tp.flush(15)
    return source_end_offset(a.bootstrap, TOPIC)


def local_producer(b) -> list[tuple[object, int]]:
    p = harness.new_producer(b.bootstrap, **{"enable.idempotence": True, "linger.ms": 0})
    return send_each(p, TOPIC, [b"local-%d" % i for i in range(5)])


def show_local(b, acked) -> None:
    stored = values(read_all(b.bootstrap, TOPIC, "read_uncommitted"))
    for i, ((err, off), entry) in enumerate(zip(acked, b.produce_log)):
        v = b"local-%d" % i
        fate = "STORED" if v in stored else "NOT STORED (acknowledged as a duplicate of offset %d)" % off
        print(f"  local-{i}: acknowledged err={err} offset={off} -> {fate}")
    print("  read_committed consumer on B gets:", [v.decode() for v in values(read_all(b.bootstrap, TOPIC,
                                                                                        "read_committed"))])


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
    started = []
    dests = []
    try:
        # ------------------------------------------------------------ without mirrorguard
        say("Without mirrorguard: A (Tansu) -> B (reference destination, stock rules)")
        a = harness.TansuBroker(work, name="A").start()
        started.append(a)
        harness.create_topics(a.bootstrap, [TOPIC])
        end = fill_source(a)
        b = ReferenceDestination(work, "B-unguarded")
        dests.append(b)
        b.mirror_from(a.bootstrap, TOPIC).catch_up(end)
        print(f"B mirrored offsets 0..{end - 1} of A; B's producer state: PIDs {sorted(b.psm(TOPIC).snapshot())}")
        b.promote()
        b.serve()
        print("failover: B promoted; a local idempotent producer on B draws PID 1 from B's counter")
        show_local(b, local_producer(b))
        harness.close_clients()
        b.close()
        a.stop()
        started.remove(a)

        # ------------------------------------------------------------ with mirrorguard
        say("With mirrorguard: A (Tansu) -> mirrorguard [[mirror]] (region, high) -> B")
        a = harness.TansuBroker(work, name="A2").start()
        state = harness.TansuBroker(work, name="state").start()
        started += [a, state]
        harness.create_topics(a.bootstrap, [TOPIC])
        harness.create_topics(state.bootstrap, [TOPIC])  # __mirror_state lives here
        mg = MirrorGuard(work, "mirrorguard", state.bootstrap, [MirrorSpec("a-to-b", a.bootstrap)],
                         log_level="info")
        mg.start()
        started.append(mg)
        mg.wait_sources_known()
        before = metrics_samples(mg)
        end = fill_source(a)
        b = ReferenceDestination(work, "B")
        dests.append(b)
        link = b.mirror_from(mg.mirrors["a-to-b"].bootstrap, TOPIC)
        link.catch_up(end)

        say("The mapping applied (source PID -> mapped PID, decoded by `mirrorguard map --decode`)")
        seen = {}
        for x in b.partition(TOPIC).batches:
            if x.producer_id != -1:
                seen.setdefault(x.producer_id, x)
        src_pids = {}
        with harness.rawkafka.Connection("127.0.0.1", a.port) as conn:
            for x in harness.rawkafka.parse_batches(harness.rawkafka.fetch_v4(conn, TOPIC, 0, 0).records):
                src_pids.setdefault(x.base_offset, x.producer_id)
        for pid, x in seen.items():
            dec = " ".join(mg_cli("map", "--decode", str(pid)).split())
            print(f"  offset {x.base_offset}: source PID {src_pids.get(x.base_offset)} -> {pid}  ({dec})")

        say("Failover: POST /v1/partitions/stop, the destination fetcher takes the seal")
        status, body = mg.post("stop", "a-to-b", TOPIC)
        print(f"  POST /v1/partitions/stop -> {status}: state {body['applied'][0]['state']}")
        link.follow(lambda _l: mg.partition(TOPIC)["state"] == "STOPPED", 15, "STOPPED")
        view = mg.partition(TOPIC)
        print(f"  partition {TOPIC}-0: {view['state']}, cut {view['cut']}, {view['seal_batches']} sealing batches")
        for off, kind, pid in dump_kinds(BIN, b.segment(TOPIC)):
            if off >= view["cut"]:
                what = "ABORT marker for the open transaction" if kind == "abort" else "MIRROR_PID_RESET barrier"
                print(f"  offset {off}: {what} (producerId {pid})")
        b.promote()
        b.serve()
        print("  B promoted; a local idempotent producer on B draws PID 1 from B's counter")
        show_local(b, local_producer(b))

        say(f"`mirrorguard dump --deep-iteration` of B's log ({b.segment(TOPIC)})")
        print(dump_text(BIN, b.segment(TOPIC)).rstrip())

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
        for d in dests:
            d.close()
        for p in reversed(started):
            if isinstance(p, MirrorGuard):
                p.terminate()
            else:
                p.stop()


if __name__ == "__main__":
    sys.exit(main())
