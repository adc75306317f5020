"""Latency tail probe of a region-mode mirror listener against the synthetic upstream paced
to 1,250 MB/s (BENCHMARKS.md, "Relay floor, read size and a paced link"): a one-node Kafka 4.4
for the state, the fixture, one mirrorguard; then direct and region legs of 8 s at 73
requests/s, alternating twice, with their latency percentiles and the mirror's event and
state-store counters that moved during the legs. An optional second argument is appended to
the config (e.g. a `[producer_state]` table), to test a suspect.

    cargo build --release --bin mirrorguard --example fetchbench
    .tools/venv/bin/python bench/region_tail.py target/release/mirrorguard
    .tools/venv/bin/python bench/region_tail.py target/release/mirrorguard \
        '[producer_state]\nsnapshot_interval_ms = 3600000'
"""
from __future__ import annotations

import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import e2e  # noqa: E402  (fetchbench runner, process helpers)
import harness  # noqa: E402  (e2e puts tests/integration on the path)
from kafka_broker import KafkaCluster  # noqa: E402
from e2e import HOST, Ports, Procs, mirrorguard_config, port_open, ready_url  # noqa: E402


def counters(admin: int) -> dict[str, float]:
    """The mirror event and state-store counters of the instance's /metrics."""
    text = urllib.request.urlopen(f"http://{HOST}:{admin}/metrics").read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and ("events" in line or "state_store_ops" in line):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def main() -> int:
    binary = sys.argv[1]
    work = Path(tempfile.mkdtemp(prefix="mg-region-tail-"))
    procs, ports = Procs(work), Ports()
    cluster = KafkaCluster(work / "kafka", nodes=1)
    cluster.start()
    try:
        state = cluster.bootstrap.split(",")[0]
        harness.create_topics(state, ["synth"], partitions=8)
        fx = ports.one()
        procs.start("fixture", [e2e.FB_BIN, "upstream", "--listen", f"{HOST}:{fx}", "--topic", "synth",
                                "--partitions", "8", "--batch-bytes", "16384", "--batches", "64",
                                "--producers", "16", "--link-mbps", "1250"], ready=lambda: port_open(fx))
        admin, port = ports.one(), ports.one()
        cfg = work / "mg.toml"
        mirrorguard_config(cfg, admin, state, [], [dict(name="region", port=port, base=ports.base(0),
                                                         upstream=f"{HOST}:{fx}", mode="region",
                                                         cid="MkU3OEVBNTcwNTJENDM2Qg")])
        if len(sys.argv) > 2:
            cfg.write_text(cfg.read_text() + sys.argv[2].replace("\\n", "\n") + "\n")
        procs.start("mirrorguard", [binary, "run", "--config", cfg], ready=ready_url(f"http://{HOST}:{admin}/readyz"))
        e2e.run_fetch(f"{HOST}:{port}", "synth", 8, 1.0, verify=True)  # warm-up, claims
        before = counters(admin)
        for name, addr in [("direct", f"{HOST}:{fx}"), ("region", f"{HOST}:{port}")] * 2:
            r = e2e.run_fetch(addr, "synth", 8, 8.0, rate=73)
            print(name, r["requests"], "requests, latency us:", r["lat_us"])
        after = counters(admin)
        for k in sorted(after):
            if after[k] != before.get(k, 0):
                print(k, before.get(k, 0), "->", after[k])
    finally:
        procs.stop_all()
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
