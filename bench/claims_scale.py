#!/usr/bin/env python3
"""Benchmark: N producers (default 100,000) in one partition of an Apache Kafka 4.4
source, mirrored through mirrorguard (issue 13 item 5). Not part of the CI suite
(tests/integration/test_claims_scale.py runs the same with 20,000).

It starts two one-node Kafka clusters (source, and state = destination topic ids), a
raw idempotent producer writes one batch per synthetic producer id (see
tests/integration/claims_scale.py for why Kafka accepts them), a stand-in fetcher
mirrors the partition through mirrorguard, and it reports: mirroring time,
__mirror_state records and bytes written, then (after a snapshot round, which
tombstones superseded claims) kill -9, restart, and the start-up read (records,
claims, seconds to ready).

    .tools/venv/bin/python bench/claims_scale.py --producers 100000 [--release]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))


def compact(bootstrap: str, topic: str) -> dict:
    """Bench only: lets Kafka's log cleaner compact `topic` now (tombstones dropped at
    once), then counts what is left."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    from claims_scale import state_traffic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in
               {"segment.ms": "500", "min.cleanable.dirty.ratio": "0", "delete.retention.ms": "0",
                "min.compaction.lag.ms": "0"}.items()]
    for f in admin.incremental_alter_configs([ConfigResource(ConfigResource.Type.TOPIC, topic,
                                                             incremental_configs=entries)]).values():
        f.result(timeout=30)
    time.sleep(1)
    # Records of an unknown type (mirrorguard skips and counts them) roll the segment.
    p = Producer({"bootstrap.servers": bootstrap})
    for i in range(3):
        p.produce(topic, key=b"\x7f\x00roll%d" % i, value=b"\x00\x00", partition=0)
        p.flush(10)
        time.sleep(1)
    # Kafka drops a tombstone in a cleaning pass after the one that compacted it:
    # keep rolling segments until the claim tombstones are gone (or 150 s).
    t0 = time.monotonic()
    i = 3
    while True:
        t = state_traffic(bootstrap, topic)
        if t.by_type.get(6, 0) == 0 or time.monotonic() - t0 > 150:
            break
        for _ in range(3):
            p.produce(topic, key=b"\x7f\x00roll%d" % i, value=b"\x00\x00", partition=0)
            p.flush(10)
            i += 1
            time.sleep(1)
        time.sleep(10)
    return {"records": t.records, "key_value_bytes": t.bytes, "by_type": t.by_type, "tombstones": t.tombstones}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--producers", type=int, default=100_000)
    ap.add_argument("--release", action="store_true", help="use target/release/mirrorguard")
    ap.add_argument("--compact", action="store_true",
                    help="before the restart, make Kafka compact the state topic (bench-only topic settings: "
                         "segment.ms=500, min.cleanable.dirty.ratio=0, delete.retention.ms=0) so the start-up "
                         "read shows what a compacted topic holds")
    args = ap.parse_args()
    if args.release:
        os.environ["MIRRORGUARD_BIN"] = str(ROOT / "target" / "release" / "mirrorguard")

    import harness  # noqa: E402 - after MIRRORGUARD_BIN
    from claims_scale import mirror_all, produce_synthetic, producers_tracked, state_traffic
    from kafka_broker import KafkaCluster
    from mirror_harness import MirrorGuard, MirrorSpec, high_watermark

    n = args.producers
    out: dict = {"producers": n, "binary": os.environ.get("MIRRORGUARD_BIN", "target/debug/mirrorguard")}
    with tempfile.TemporaryDirectory(prefix="claims-bench-") as tmp:
        work = Path(tmp)
        src = KafkaCluster(work / "src", nodes=1).start()
        state = KafkaCluster(work / "state", nodes=1).start()
        mg = None
        try:
            topic = "claims-bench"
            harness.create_topics(src.bootstrap, [topic])
            harness.create_topics(state.bootstrap, [topic])
            out["produce_s"] = round(produce_synthetic(src.bootstrap, topic, n), 1)
            assert high_watermark(src.bootstrap, topic) == n
            # Phase 1: mirroring with no snapshot round (10 min interval): claims only.
            mg = MirrorGuard(work, "mg1", state.bootstrap, [MirrorSpec.of("m", src)],
                             log_level="info", snapshot_interval_ms=600_000)
            mg.start(timeout=60)
            f, secs = mirror_all(mg, topic, src.bootstrap, timeout=1200)
            out["mirror_s"] = round(secs, 1)
            out["mirrored_producers"] = len({b.producer_id for b in f.log})
            f.close()
            t = state_traffic(state.bootstrap, mg.state_topic)
            out["state_after_mirroring"] = {"records": t.records, "key_value_bytes": t.bytes,
                                            "by_type": t.by_type, "tombstones": t.tombstones}
            mg.kill9()
            t0 = time.monotonic()
            mg.start(timeout=300)
            out["restart_with_claims_to_ready_s"] = round(time.monotonic() - t0, 1)
            out["startup_read_claims"] = re.findall(r"__mirror_state loaded.*", mg.log_text())[-1].split("loaded", 1)[1].strip()
            out["producers_tracked_after_restart_with_claims"] = producers_tracked(mg)
            mg.kill9()
            # Phase 2: another instance on the same state topic, snapshot round every 2 s:
            # a chunked snapshot supersedes the claims, which are tombstoned.
            mg = MirrorGuard(work, "mg2", state.bootstrap, [MirrorSpec.of("m", src)],
                             log_level="info", snapshot_interval_ms=2000)
            mg.start(timeout=300)
            time.sleep(15)
            t = state_traffic(state.bootstrap, mg.state_topic)
            out["state_after_snapshot_round"] = {"records": t.records, "key_value_bytes": t.bytes,
                                                 "by_type": t.by_type, "tombstones": t.tombstones}
            if args.compact:
                out["state_after_compaction"] = compact(state.bootstrap, mg.state_topic)
            mg.kill9()
            t0 = time.monotonic()
            mg.start(timeout=300)
            out["restart_to_ready_s"] = round(time.monotonic() - t0, 1)
            loaded = re.findall(r"__mirror_state loaded.*", mg.log_text())[-1]
            out["startup_read"] = loaded.split("loaded", 1)[1].strip()
            out["producers_tracked_after_restart"] = producers_tracked(mg)
        finally:
            if mg is not None:
                mg.terminate()
            src.stop()
            state.stop()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
