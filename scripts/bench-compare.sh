#!/usr/bin/env bash
# Interleaved before/after benchmark of two git revisions (BENCHMARKS.md,
# "Architecture refactor: before/after").
#
# On a shared, loaded machine two benchmark runs made minutes apart differ by
# more than the changes we want to see, so this script never runs one revision
# after the other: it builds both, then measures every criterion benchmark id
# of both revisions back to back (one short criterion run each, seconds
# apart), in rounds; the order (before, after or after, before) alternates
# from one benchmark to the next and from one round to the next, so a drift
# of the load favours neither. It reports per benchmark the median over the
# rounds of criterion's median, and the ratio after/before. The load average
# is recorded with every run.
#
#   scripts/bench-compare.sh [options] BEFORE AFTER
#     -r N        rounds (default 5)
#     -b "A B"    criterion benches (default: frame records producer_state fetch_rewrite)
#     -f REGEX    only the benchmark ids matching REGEX (grep -E; default: all)
#     -t "ARGS"   criterion timing (default: --warm-up-time 0.3 --measurement-time 1)
#     -e "ARGS"   also run bench/e2e.py of each revision with its release
#                 binaries, interleaved the same way, with ARGS (for example
#                 "--skip-tansu --seconds 3 --repeat 1")
#     -p PATCH    apply PATCH (git apply) to both worktrees before building:
#                 a harness fix newer than both revisions, for example
#     -o NAME     name of the results (default runs: runs.tsv, runs-summary.md)
#     -k          keep the worktrees and their target directories
#
# Each revision gets a detached worktree under $BENCH_COMPARE_DIR (default
# /tmp/mirrorguard-bench-compare) with its own target directory (release
# benches, and with -e the release mirrorguard and fetchbench), removed at the
# end unless -k (they take about 2 GB each). Results: $BENCH_COMPARE_DIR/runs.tsv
# (one line per round, revision and benchmark; -o names it) and the summary
# table printed at the end (also in runs-summary.md).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)

ROUNDS=5
BENCHES="frame records producer_state fetch_rewrite"
FILTER=""
TIMING="--warm-up-time 0.3 --measurement-time 1"
E2E=""
PATCH=""
NAME=runs
KEEP=0
while getopts "r:b:f:t:e:p:o:k" opt; do
    case $opt in
        r) ROUNDS=$OPTARG ;;
        b) BENCHES=$OPTARG ;;
        f) FILTER=$OPTARG ;;
        t) TIMING=$OPTARG ;;
        e) E2E=$OPTARG ;;
        p) PATCH=$(readlink -f "$OPTARG") ;;
        o) NAME=$OPTARG ;;
        k) KEEP=1 ;;
        *) sed -n 2,28p "$0" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -eq 2 ] || { sed -n 2,28p "$0" >&2; exit 2; }
REV_BEFORE=$(git rev-parse --short "$1^{commit}")
REV_AFTER=$(git rev-parse --short "$2^{commit}")
WORK=${BENCH_COMPARE_DIR:-/tmp/mirrorguard-bench-compare}
mkdir -p "$WORK"
RUNS=$WORK/$NAME.tsv

cleanup() {
    if [ "$KEEP" = 0 ]; then
        for side in before after; do
            [ -d "$WORK/$side" ] && git worktree remove --force "$WORK/$side" || true
        done
    fi
}
trap cleanup EXIT

# Worktree and build of one side (reused when it is already at that revision).
prepare() {
    local side=$1 rev=$2 dir=$WORK/$1
    if [ -d "$dir" ] && [ "$(git -C "$dir" rev-parse --short HEAD)" = "$rev" ]; then
        echo "== $side: reusing $dir ($rev)"
    else
        [ -d "$dir" ] && git worktree remove --force "$dir"
        git worktree add --detach "$dir" "$rev" >/dev/null
    fi
    # Applied once (a reused worktree may have it already).
    if [ -n "$PATCH" ] && git -C "$dir" apply --check "$PATCH" 2>/dev/null; then
        git -C "$dir" apply "$PATCH"
        echo "== $side: applied $PATCH"
    fi
    # The shared test dependencies (Tansu, the python venv) for the e2e run.
    [ -e "$dir/.tools" ] || [ ! -e "$REPO/.tools" ] || ln -s "$(readlink -f "$REPO/.tools")" "$dir/.tools"
    local args=()
    for b in $BENCHES; do args+=(--bench "$b"); done
    if [ -n "$BENCHES" ]; then
        echo "== $side: building benches of $rev"
        # The bench executables, one per line: "<bench> <path>".
        (cd "$dir" && CARGO_TARGET_DIR="$dir/target" cargo bench --no-run "${args[@]}" 2>&1) |
            sed -n 's|.*Executable benches/\([a-z_]*\)\.rs (\(.*\))|\1 '"$dir"'/\2|p' >"$WORK/$side.bins"
        cat "$WORK/$side.bins"
    fi
    if [ -n "$E2E" ]; then
        (cd "$dir" && CARGO_TARGET_DIR="$dir/target" cargo build --release --bin mirrorguard --example fetchbench 2>&1 | tail -1)
    fi
}

# One short criterion run of one benchmark id on one side, appending its
# median to the results.
run_bench() {
    local round=$1 side=$2 bench=$3 id=$4 dir=$WORK/$2 load bin
    load=$(cut -d' ' -f1 /proc/loadavg)
    bin=$(awk -v b="$bench" '$1 == b { print $2 }' "$WORK/$side.bins")
    rm -rf "$dir/target/criterion"
    # shellcheck disable=SC2086 # TIMING is a list of criterion arguments
    (cd "$dir" && CARGO_TARGET_DIR="$dir/target" "$bin" --bench --exact "$id" $TIMING </dev/null >"$WORK/last-$side.log" 2>&1)
    python3 - "$dir/target/criterion" "$round" "$side" "$load" >>"$RUNS" <<'EOF'
import json, pathlib, sys
root, rnd, side, load = sys.argv[1:]
for est in sorted(pathlib.Path(root).glob("**/new/estimates.json")):
    meta = json.loads((est.parent / "benchmark.json").read_text())
    median = json.loads(est.read_text())["median"]["point_estimate"]
    print(f"{rnd}\t{side}\t{meta['full_id']}\t{median:.1f}\t{load}")
EOF
}

# One e2e run on one side: the synthetic / Tansu medians it writes as JSON.
run_e2e() {
    local round=$1 side=$2 dir=$WORK/$2 load
    load=$(cut -d' ' -f1 /proc/loadavg)
    # shellcheck disable=SC2086 # E2E is a list of e2e.py arguments
    if ! (cd "$dir" && .tools/venv/bin/python bench/e2e.py $E2E --json "$WORK/e2e-$side-$round.json" >"$WORK/last-$side-e2e.log" 2>&1); then
        # One failed run is reported and left out; the rounds go on.
        echo "== e2e of $side failed in round $round: $WORK/last-$side-e2e.log" >&2
        cp "$WORK/last-$side-e2e.log" "$WORK/failed-$side-e2e-$round.log"
        return 0
    fi
    python3 - "$WORK/e2e-$side-$round.json" "$round" "$side" "$load" >>"$RUNS" <<'EOF'
import json, sys
path, rnd, side, load = sys.argv[1:]
data = json.load(open(path))
# Per path: throughput, latency and mirrorguard's CPU per MB/s.
KEEP = ("mb_per_s", "p50_us", "p99_us", "mg_millicores_per_mbps")
for scenario in ("synthetic", "tansu_saturation"):
    for p, o in data.get(scenario, {}).items():
        for k in KEEP:
            if o.get(k) is not None:
                print(f"{rnd}\t{side}\te2e:{scenario}/{p}/{k}\t{o[k]}\t{load}")
EOF
}

prepare before "$REV_BEFORE"
prepare after "$REV_AFTER"
printf 'round\tside\tbenchmark\tvalue\tload1\n' >"$RUNS"
# The benchmark ids (those of the after side; a bench missing on one side is
# reported with one side only).
: >"$WORK/ids"
for bench in $BENCHES; do
    bin=$(awk -v b="$bench" '$1 == b { print $2 }' "$WORK/after.bins")
    "$bin" --bench --list 2>/dev/null | sed -n 's/: benchmark$//p' | grep -E "${FILTER:-.}" |
        sed "s/^/$bench\t/" >>"$WORK/ids" || true
done
echo "== $(wc -l <"$WORK/ids") benchmark ids x 2 revisions x $ROUNDS rounds"
n=0
for round in $(seq 1 "$ROUNDS"); do
    while IFS=$'\t' read -r bench id; do
        n=$((n + 1))
        if [ $(((n + round) % 2)) = 0 ]; then order="before after"; else order="after before"; fi
        for side in $order; do
            run_bench "$round" "$side" "$bench" "$id"
        done
    done <"$WORK/ids"
    echo "== round $round/$ROUNDS done (load $(cut -d' ' -f1-3 /proc/loadavg))"
    if [ -n "$E2E" ]; then
        if [ $((round % 2)) = 1 ]; then order="before after"; else order="after before"; fi
        for side in $order; do
            echo "== round $round/$ROUNDS $side e2e"
            run_e2e "$round" "$side"
        done
    fi
done

python3 - "$RUNS" "$REV_BEFORE" "$REV_AFTER" <<'EOF' | tee "$WORK/$NAME-summary.md"
import csv, statistics, sys
from collections import defaultdict
path, rb, ra = sys.argv[1:]
vals = defaultdict(lambda: {"before": [], "after": []})
loads = []
for row in csv.DictReader(open(path), delimiter="\t"):
    vals[row["benchmark"]][row["side"]].append(float(row["value"]))
    loads.append(float(row["load1"]))
print(f"before = {rb}, after = {ra}; load average (1 min) during the runs: "
      f"min {min(loads):.2f}, median {statistics.median(loads):.2f}, max {max(loads):.2f}")
print()
print("| benchmark | before median | after median | after/before | rounds |")
print("|---|---:|---:|---:|---:|")
def fmt(name, v):
    if name.startswith("e2e:"):
        return f"{v:.3g}"
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if v >= scale:
            return f"{v / scale:.3g} {unit}"
    return f"{v:.3g} ns"
for name, d in vals.items():
    if not d["before"] or not d["after"]:
        print(f"| {name} | {'-' if not d['before'] else fmt(name, statistics.median(d['before']))} "
              f"| {'-' if not d['after'] else fmt(name, statistics.median(d['after']))} | (one side only) | |")
        continue
    b, a = statistics.median(d["before"]), statistics.median(d["after"])
    ratio = a / b if b else float("nan")
    print(f"| {name} | {fmt(name, b)} | {fmt(name, a)} | {ratio:.3f} | {len(d['before'])}+{len(d['after'])} |")
EOF
