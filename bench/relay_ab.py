"""Relay through a plain listener and a region-mode mirror listener, two
mirrorguard builds side by side (BENCHMARKS.md "Cut-through relay").

Against the synthetic upstream fixture (examples/fetchbench.rs `upstream`,
8 partitions x 64 x 16 KiB batches: 8 MiB Fetch v12 responses; its batches
carry producer ids, 16 per partition, and new offsets every response), runs
the fetchbench load generator on the paths in interleaved rounds (the order
rotates every round): `direct` (the fixture), `base` and `new` (a plain
`[[listener]]` of the binary given by --base, the same of --new) and, with
`--modes region` (the default runs both), `base-region` and `new-region`
(a `[[mirror]]` listener in pid_mode region, its claims in a one-node Kafka
4.4 started for the run, a state topic per instance: every batch's PID is
mapped, observed and patched, which a warm-up fetch checks). Reports per
path the median over the rounds of: throughput at saturation (one
connection, one fetch in flight), relayed bytes per mirrorguard CPU-second,
and p50/p99 request latency at half of the direct path's saturated request
rate, with the latency each proxy adds over direct in the same round.

`--floor` adds the floor relay (`fetchbench relay`: bytes copied both ways
with read/write through a 256 KiB buffer, nothing parsed; `--floor splice`
adds its splice(2) variant too): what any TCP relay costs on this machine,
the bound mirrorguard is compared with. `--pin` runs the fixture, the load generator and the state broker on CPU 0 and each relay
(mirrorguard, the floor relay) on CPU 1: the relay has a core of its own, as a sidecar on
another host than the source has, instead of competing with both ends for two cores (direct
then also runs on CPU 0 alone). `--link-mbps M` paces the fixture's
responses to M MB/s per connection (a source across a network link instead
of in memory next to the fetcher).

    cargo build --release --bin mirrorguard --example fetchbench
    .tools/venv/bin/python bench/relay_ab.py --base /tmp/mg-base-release \\
        --new target/release/mirrorguard --rounds 5 --seconds 3
    # the region-mode mirror listener only:
    .tools/venv/bin/python bench/relay_ab.py --base ... --new ... --modes region

Bounded: rounds x (1 + 2 x modes) paths x 2 legs x `seconds`.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import e2e  # noqa: E402  (fetchbench runner, process helpers, CPU accounting)
import harness  # noqa: E402  (e2e puts tests/integration on the path)
from kafka_broker import KafkaCluster  # noqa: E402
from e2e import HOST, Ports, Procs, leg, mirrorguard_config, port_open, ready_url, rotate  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, required=True)
    ap.add_argument("--new", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--batches", type=int, default=64, help="16 KiB batches per partition in each response")
    ap.add_argument("--modes", default="plain,region", help="listeners through which to relay: plain, region")
    ap.add_argument("--floor", nargs="?", const="rw", default="",
                    help="add the floor relay: 'rw' (read/write), 'splice' (both variants)")
    ap.add_argument("--link-mbps", type=float, default=0.0, help="pace the fixture to this many MB/s per connection")
    ap.add_argument("--pin", action="store_true",
                    help="the ends (fixture, load generator, state broker) on CPU 0, each relay on CPU 1")
    args = ap.parse_args()
    ends, relays = ("0", "1") if args.pin else ("", "")
    e2e.CLIENT_CPUS = ends

    def on(cpus: str, argv: list) -> list:
        # Started pinned, so a tokio runtime sizes its workers to the CPUs it has.
        return ["taskset", "-c", cpus, *argv] if cpus else argv

    work = Path(tempfile.mkdtemp(prefix="mg-relay-ab-"))
    procs = Procs(work)
    stops: list = []
    ports = Ports()
    try:
        fx = ports.one()
        fixture = procs.start("fixture", on(ends, [e2e.FB_BIN, "upstream", "--listen", f"{HOST}:{fx}", "--topic", "synth",
                                          "--partitions", str(args.partitions), "--batch-bytes", "16384",
                                          "--batches", str(args.batches), "--producers", "16",
                                          "--link-mbps", str(args.link_mbps)]),
                              ready=lambda: port_open(fx))
        paths = [("direct", f"{HOST}:{fx}")]
        watch = {"fixture": fixture.pid}
        floors = {"rw": [("floor", [])], "splice": [("floor", []), ("floor-splice", ["--splice"])]}
        for name, extra in floors.get(args.floor, []):
            port = ports.one()
            p = procs.start(name, on(relays, [e2e.FB_BIN, "relay", "--listen", f"{HOST}:{port}", "--upstream",
                                                f"{HOST}:{fx}", *extra]), ready=lambda port=port: port_open(port))
            watch[name] = p.pid
            paths.append((name, f"{HOST}:{port}"))
        modes = args.modes.split(",")
        state = None
        if "region" in modes:
            # Region mode keeps producer claims in a state cluster: a one-node Kafka
            # 4.4 (also the destination: it lists the topic whose id keys them).
            cluster = KafkaCluster(work / "kafka", nodes=1)
            cluster.start()
            stops.append(cluster.stop)
            for node in cluster.nodes:
                if ends:
                    e2e.pin(node.proc.pid, ends)
            state = cluster.bootstrap.split(",")[0]
            harness.create_topics(state, ["synth"], partitions=args.partitions)
        for mode in modes:
            for name, binary in (("base", args.base), ("new", args.new)):
                name = name if mode == "plain" else f"{name}-{mode}"
                admin, port = ports.one(), ports.one()
                cfg = work / f"{name}.toml"
                target = {"name": mode, "port": port, "base": ports.base(0), "upstream": f"{HOST}:{fx}"}
                if mode == "plain":
                    mirrorguard_config(cfg, admin, None, [target], [])
                else:
                    mirrorguard_config(cfg, admin, state, [],
                                       [dict(target, mode="region", cid="MkU3OEVBNTcwNTJENDM2Qg")])
                    # A state topic per instance: sharing one, they would take the
                    # partitions over from each other every round.
                    text = cfg.read_text().replace("[state]\n", f'[state]\ntopic = "__mirror_state_{name}"\n', 1)
                    cfg.write_text(text)
                p = procs.start(name, on(relays, [binary, "run", "--config", cfg]),
                                ready=ready_url(f"http://{HOST}:{admin}/readyz"))
                watch[name] = p.pid
                paths.append((name, f"{HOST}:{port}"))
        for name, addr in paths:  # warm-up, and a CRC (and mapping) check of every path
            r = e2e.run_fetch(addr, "synth", args.partitions, 1.0, verify=True)
            if r["crc_errors"]:
                raise RuntimeError(f"{name}: {r['crc_errors']} CRC errors")
            if name.endswith("-region") and r["mapped_batches"] != r["batches"]:
                raise RuntimeError(f"{name}: only {r['mapped_batches']}/{r['batches']} batches mapped")
        sat: dict[str, list[dict]] = {n: [] for n, _ in paths}
        for i in range(args.rounds):
            for name, addr in rotate(paths, i):
                sat[name].append(leg(name, addr, "synth", args.partitions, args.seconds, watch))
        direct_rps = statistics.median(r["requests"] / r["elapsed_s"] for r in sat["direct"])
        rate = max(1.0, 0.5 * direct_rps)
        half: dict[str, list[dict]] = {n: [] for n, _ in paths}
        for i in range(args.rounds):
            for name, addr in rotate(paths, i):
                half[name].append(leg(name, addr, "synth", args.partitions, args.seconds, watch, rate=rate))
    finally:
        procs.stop_all()
        for stop in stops:
            stop()

    med = statistics.median
    d_mb = med(r["mb_per_s"] for r in sat["direct"])
    link = f", paced to {args.link_mbps:,.0f} MB/s" if args.link_mbps else ", memory speed"
    if args.pin:
        link += ", ends pinned to CPU 0 and each relay to CPU 1"
    print(f"synthetic upstream{link}, {args.partitions} partitions x {args.batches} x 16 KiB "
          f"({args.partitions * args.batches * 16 // 1024} MiB responses), 1 connection, "
          f"median of {args.rounds} interleaved rounds of {args.seconds:.0f} s")
    print("\n| path | MB/s | % of direct | GB relayed per relay CPU-s | p50 us at half rate | "
          "p99 us at half rate | added p50 us | added p99 us |")
    print("|---|---|---|---|---|---|---|---|")
    for name, _ in paths:
        mb = med(r["mb_per_s"] for r in sat[name])
        if name == "direct":
            per_core = "-"
        else:
            per_core = f"{med(r['frame_bytes'] / max(r['cpu_s'][name], 1e-9) / 1e9 for r in sat[name]):.2f}"
        p50 = med(r["lat_us"]["p50"] for r in half[name])
        p99 = med(r["lat_us"]["p99"] for r in half[name])
        # Added latency: per round against that round's direct leg, then the median.
        a50 = med(r["lat_us"]["p50"] - dr["lat_us"]["p50"] for r, dr in zip(half[name], half["direct"]))
        a99 = med(r["lat_us"]["p99"] - dr["lat_us"]["p99"] for r, dr in zip(half[name], half["direct"]))
        print(f"| {name} | {mb:,.0f} | {100 * mb / d_mb:.0f}% | {per_core} | {p50:,.0f} | {p99:,.0f} | "
              f"{a50:+,.0f} | {a99:+,.0f} |")
    print(f"\nhalf rate: {rate:.0f} requests/s per connection")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
