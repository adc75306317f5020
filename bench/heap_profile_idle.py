#!/usr/bin/env python3
"""Heap profile of idle mirrored partitions (issue 31: "an idle mirrored partition costs
<= 2 KiB"). Not part of the CI suite.

For each N it mirrors N partitions of an Apache Kafka 4.4 source (ten idle idempotent
producers each, synthetic producer ids as bench/claims_scale.py writes them) through
mirrorguard to the Kafka-engine destination's fetcher until caught up, prints mirrorguard's
RSS and its producer-state gauge, and kills it (-9). Run mirrorguard under heaptrack's
preload library to get what is live at the kill, by allocation site:

    mkdir -p /tmp/ht && cat > /tmp/ht/mg.sh <<'SH'
    #!/bin/sh
    export LD_PRELOAD=/usr/lib/heaptrack/libheaptrack_preload.so DUMP_HEAPTRACK_OUTPUT=/tmp/ht/mg.$$.raw
    exec /path/to/checkout/target/release/mirrorguard "$@"
    SH
    chmod +x /tmp/ht/mg.sh && cargo build --release
    MIRRORGUARD_BIN=/tmp/ht/mg.sh .tools/venv/bin/python bench/heap_profile_idle.py 100 10000
    for f in /tmp/ht/mg.*.raw; do /usr/lib/heaptrack/libexec/heaptrack_interpret < $f > ${f%.raw}.txt
      heaptrack_print -f ${f%.raw}.txt --print-leaks 1 --print-peaks 0 --print-allocators 0 \\
          --print-temporary 0 --print-histogram 0 -n 100000 > ${f%.raw}.leaks; done
    .tools/venv/bin/python bench/heap_profile_idle.py --sites /tmp/ht/mg.<pid>.leaks

(heaptrack's "leaked" is what was live when the process was killed.) Without the wrapper it
prints the RSS figures only.
"""

from __future__ import annotations

import collections
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
sys.path.append(str(ROOT / "bench"))  # after tests/integration: its claims_scale, not bench/claims_scale.py



def sites(leaks: Path, top: int = 12) -> None:
    """Live bytes at the kill by the first frame in mirrorguard's own code."""
    size = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9}
    blocks: list[list] = []
    for line in leaks.read_text().splitlines():
        m = re.match(r"^([\d.]+)([KMG]?)B? leaked over (\d+) calls from", line)
        if m:
            blocks.append([float(m.group(1)) * size[m.group(2)], int(m.group(3)), None])
            continue
        # The first frame in a file of this checkout's src/ names the site (a dependency's
        # frames are relative paths too, such as src/metrics/histogram.rs).
        m = re.match(r"\s+at (src/[^:\s]+)(:\d+)?", line)
        if blocks and blocks[-1][2] is None and m and (ROOT / m.group(1)).is_file():
            blocks[-1][2] = m.group(1) + (m.group(2) or "")
    agg: collections.Counter = collections.Counter()
    calls: collections.Counter = collections.Counter()
    for b in blocks[1:]:  # the first block is every allocation merged
        agg[b[2] or "(no frame of ours)"] += b[0]
        calls[b[2] or "(no frame of ours)"] += b[1]
    print(f"live at the kill: {sum(agg.values()) / 1e6:.2f} MB")
    for k, v in agg.most_common(top):
        print(f"{v / 1e6:8.2f} MB {calls[k]:9d} allocations  {k}")


def main() -> None:
    if sys.argv[1:2] == ["--sites"]:
        sites(Path(sys.argv[2]))
        return
    import harness
    import kafka_dest
    from claims_scale import produce_synthetic
    from failover_scale import IDLE_PRODUCERS, MIRROR, make_topic, proc_stat
    from kafka_broker import KafkaCluster
    from kafka_dest import KafkaDest
    from mirror_harness import MirrorGuard, MirrorSpec

    ns = [int(a) for a in sys.argv[1:]] or [100, 10000]
    heap = "-Xmx2g" if max(ns) > 2000 else "-Xmx768m"
    kafka_dest.JVM_OPTS[:] = [o for o in kafka_dest.JVM_OPTS if not o.startswith("-Xmx")] + [heap]
    overrides = {"num.io.threads": "4", "num.network.threads": "2", "auto.create.topics.enable": "false"}
    with tempfile.TemporaryDirectory(prefix="heap-idle-") as tmp:
        work = Path(tmp)
        src = KafkaCluster(work / "src", nodes=1, name="src", overrides=overrides, jvm_opts=[heap]).start()
        state = KafkaCluster(work / "state", nodes=1, name="state", overrides=overrides, jvm_opts=[heap]).start()
        try:
            for n in ns:
                T = f"idle-{n}-{os.urandom(2).hex()}"
                st = f"__mirror_state_{T}"
                harness.create_topics(state.bootstrap, [st], config={"cleanup.policy": "compact"})
                make_topic(src.bootstrap, T, n, max(60.0, n / 50))
                make_topic(state.bootstrap, T, n, max(60.0, n / 50))
                dest = KafkaDest(work, f"dest-{T}").start(timeout=60)
                spec = MirrorSpec.of(MIRROR, src)
                mg = MirrorGuard(work, f"mg-{T}", state.bootstrap, [spec], state_topic=st,
                                 snapshot_interval_ms=600_000, log_level="info")
                mg.start(timeout=300)
                mg.wait_sources_known(timeout=60)
                produce_synthetic(src.bootstrap, T, IDLE_PRODUCERS * n, partitions=n)
                f = dest.mirror("f", spec.bootstrap, [(T, p) for p in range(n)], request_timeout_ms=30000,
                                max_wait_ms=500)
                harness.wait_until(lambda: len(f.report()["partitions"]) == n and all(
                    x["position"] == IDLE_PRODUCERS for x in f.report()["partitions"]), max(120.0, n / 10),
                    interval=1.0, what=f"{T}: every partition mirrored")
                time.sleep(5)  # idle: a few empty fetch rounds
                _, rss, hwm = proc_stat(mg.proc.pid)
                state_bytes = mg.metrics().sum("mirrorguard_producer_state_bytes")
                print(f"N={n} pid={mg.proc.pid} rss_mib={rss / 2**20:.1f} peak_rss_mib={hwm / 2**20:.1f} "
                      f"producer_state_bytes={state_bytes:.0f}", flush=True)
                mg.kill9()
                f.stop()
                dest.stop()
        finally:
            src.stop()
            state.stop()


if __name__ == "__main__":
    main()
