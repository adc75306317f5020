"""Where a relay's CPU goes: one mirrorguard listener (`plain`, or `region` with its claims
in a one-node Kafka 4.4) in front of the memory-speed synthetic upstream (8 MiB Fetch
responses), a saturated 5 s fetch through it, and `perf record` of the mirrorguard process
meanwhile (needs perf and the rights to attach). Prints the throughput and bytes relayed per
mirrorguard CPU-second; the profile is left in OUT_DIR/<mode>.data for `perf report`, e.g.
the split between the kernel and mirrorguard's own code:

    cargo build --release --bin mirrorguard --example fetchbench
    .tools/venv/bin/python bench/profile_relay.py target/release/mirrorguard region /tmp/prof
    perf report -i /tmp/prof/region.data --no-children --sort dso --stdio -g none

perf's unwinding slows the relay (the throughput printed is not a benchmark figure; the
shares in the profile are what it is for).
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import e2e  # noqa: E402  (fetchbench runner, process helpers)
import harness  # noqa: E402  (e2e puts tests/integration on the path)
from kafka_broker import KafkaCluster  # noqa: E402
from e2e import HOST, Ports, Procs, mirrorguard_config, port_open, ready_url  # noqa: E402


def main() -> int:
    binary, mode, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    if mode not in ("plain", "region"):
        raise SystemExit("mode: plain or region")
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="mg-profile-"))
    procs, ports = Procs(work), Ports()
    cluster = None
    try:
        fx = ports.one()
        procs.start("fixture", [e2e.FB_BIN, "upstream", "--listen", f"{HOST}:{fx}", "--topic", "synth",
                                "--partitions", "8", "--batch-bytes", "16384", "--batches", "64",
                                "--producers", "16"], ready=lambda: port_open(fx))
        admin, port = ports.one(), ports.one()
        cfg = work / "mg.toml"
        target = dict(name=mode, port=port, base=ports.base(0), upstream=f"{HOST}:{fx}")
        if mode == "region":
            cluster = KafkaCluster(work / "kafka", nodes=1)
            cluster.start()
            state = cluster.bootstrap.split(",")[0]
            harness.create_topics(state, ["synth"], partitions=8)
            mirrorguard_config(cfg, admin, state, [], [dict(target, mode="region", cid="MkU3OEVBNTcwNTJENDM2Qg")])
        else:
            mirrorguard_config(cfg, admin, None, [target], [])
        mg = procs.start("mirrorguard", [binary, "run", "--config", cfg],
                         ready=ready_url(f"http://{HOST}:{admin}/readyz"))
        e2e.run_fetch(f"{HOST}:{port}", "synth", 8, 1.0, verify=True)  # warm-up, claims
        perf = subprocess.Popen(["perf", "record", "-F", "2000", "-g", "--call-graph", "dwarf,16384",
                                 "-p", str(mg.pid), "-o", str(out / f"{mode}.data"), "--", "sleep", "6"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        before = e2e.cpu_seconds(mg.pid)
        r = e2e.run_fetch(f"{HOST}:{port}", "synth", 8, 5.0)
        cpu = e2e.cpu_seconds(mg.pid) - before
        perf.wait()
        print(f"{mode}: {r['mb_per_s']:,.0f} MB/s under perf, {r['frame_bytes'] / max(cpu, 1e-9) / 1e9:.2f} GB "
              f"per mirrorguard CPU-s; profile in {out / (mode + '.data')}")
    finally:
        procs.stop_all()
        if cluster is not None:
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
