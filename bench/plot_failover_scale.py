#!/usr/bin/env python3
"""Plots bench/failover_scale.py's figures: seconds from the stop to every partition
STOPPED against the number of partitions, log-log, one line per source condition (fresh
and after a restart), one panel per binary (before / after).

    .tools/plot-venv/bin/python bench/plot_failover_scale.py target/failover-scale.json \\
        docs/failover-scale.png

(.tools/plot-venv: `python3 -m venv .tools/plot-venv && .tools/plot-venv/bin/pip install
matplotlib==3.10.7`; only this script needs it.)

A run that did not reach all STOPPED within its time-out is drawn at that time-out with
an open marker.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> None:
    src, dst = sys.argv[1], sys.argv[2]
    runs = [r for r in (json.loads(line) for line in open(src) if line.strip()) if "condition" in r]
    binaries = list(dict.fromkeys(r["binary"] for r in runs))
    fig, axes = plt.subplots(1, len(binaries), figsize=(6 * len(binaries), 4.5), squeeze=False, sharey=True)
    for ax, binary in zip(axes[0], binaries):
        lines: dict[str, list] = defaultdict(list)
        for r in runs:
            if r["binary"] == binary:
                key = f"{r['condition']}{', after restart' if r['restarted'] else ''}"
                lines[key].append(r)
        for key, rs in sorted(lines.items()):
            rs.sort(key=lambda r: r["partitions"])
            xs = [r["partitions"] for r in rs]
            ys = [r["all_stopped_s"] if r["all_stopped_s"] is not None else r.get("run_timeout", 300) for r in rs]
            style = "--" if "restart" in key else "-"
            (line,) = ax.plot(xs, ys, style, marker="o", label=key)
            for r, y in zip(rs, ys):
                if r["all_stopped_s"] is None:
                    ax.plot([r["partitions"]], [y], marker="o", mfc="white", color=line.get_color(), ms=9)
        ax.set_xscale("log")
        ax.set_yscale("log")
        timed_out = [r for r in runs if r["binary"] == binary and r["all_stopped_s"] is None]
        ax.set_title(binary + (f"\n(open markers: {len(timed_out)} runs not all STOPPED within their time-out)"
                               if timed_out else ""), fontsize=10)
        ax.set_xlabel("partitions stopped at once")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("seconds from stop to all STOPPED")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main()
