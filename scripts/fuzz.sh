#!/usr/bin/env bash
# Runs the cargo-fuzz targets of fuzz/ (libFuzzer, nightly toolchain), each for
# a bounded time, and prints one line per target: runs, coverage, corpus size.
# A crash stops the script with libFuzzer's report and the reproducer under
# fuzz/artifacts/<target>/ (`cargo +nightly fuzz run <target> <file>` replays it).
#
#   scripts/fuzz.sh                    # every target, 60 s each
#   scripts/fuzz.sh 300 frame_stream   # one target, 5 minutes
#
# Installs cargo-fuzz (pinned) under .tools/cargo-fuzz on first use. Corpora
# are kept in fuzz/corpus/<target> (not committed) so later runs start from them.
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO_FUZZ_VERSION=0.13.2
secs=${1:-60}
shift || true
if ! rustup toolchain list | grep -q '^nightly'; then
  echo "scripts/fuzz.sh: needs a nightly toolchain (rustup toolchain install nightly)" >&2
  exit 2
fi
if [ ! -x .tools/cargo-fuzz/bin/cargo-fuzz ]; then
  cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked --root .tools/cargo-fuzz
fi
export PATH="$PWD/.tools/cargo-fuzz/bin:$PATH"
if [ $# -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <(cargo +nightly fuzz list)
fi
mkdir -p target/fuzz-logs
for t in "${targets[@]}"; do
  log="target/fuzz-logs/$t.log"
  # -rss_limit_mb: a decoder that allocates from a wire length fails here.
  if ! cargo +nightly fuzz run "$t" -- -max_total_time="$secs" -rss_limit_mb=1024 -timeout=10 \
      > "$log" 2>&1; then
    tail -60 "$log"
    echo "scripts/fuzz.sh: $t FAILED (log: $log)" >&2
    exit 1
  fi
  done_line=$(grep -E '^Done [0-9]+ runs' "$log" | tail -1)
  stats=$(grep -E '#[0-9]+\s+(DONE|pulse|NEW|REDUCE)' "$log" | tail -1 | grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+/[0-9]+[a-zA-Z]*' || true)
  echo "$t: ${done_line:-no summary} ${stats}"
done
