#!/usr/bin/env bash
# The test suite, from a fresh clone: pinned test dependencies, formatting and lints,
# build, every Rust test, then the integration tests (real Apache Kafka 4.4 brokers,
# librdkafka, Java and franz-go clients through the mirrorguard binary; Tansu as a second
# broker with MG_BROKER=both) on several pytest-xdist workers. Exits non-zero on any failure.
#
#   scripts/test.sh                 # everything (what .ci/run runs)
#   scripts/test.sh --quick         # the inner loop: fmt, build, the Rust unit tests and one
#                                   # integration test per area (pytest -m quick)
#   PYTEST_ARGS="-k hostile" scripts/test.sh   # extra pytest arguments
#   MG_WORKERS=1 scripts/test.sh    # pytest workers (default 4; 1 runs without xdist)
#   MG_BROKER=both scripts/test.sh  # client/proxy tests on Kafka and on Tansu
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
case "${1:-}" in
  --quick) quick=1 ;;
  "") ;;
  *) echo "usage: scripts/test.sh [--quick]" >&2; exit 2 ;;
esac

start=$(date +%s)
deps_pid=""
report() {
  local rc=$?
  # A failure before the dependencies were waited for: let their install finish (its steps
  # are atomic, but an orphan would outlive the run).
  [ -n "$deps_pid" ] && wait "$deps_pid" 2>/dev/null
  echo "scripts/test.sh$([ "$quick" = 1 ] && echo " --quick"): $([ "$rc" = 0 ] && echo OK || echo "FAILED (exit $rc)") — wall time $(( $(date +%s) - start ))s"
}
trap report EXIT

step() { echo; echo "==> $* ($(( $(date +%s) - start ))s)"; }

# The test dependencies are mostly downloads (Maven Central, PyPI, the Go module proxy):
# they install in the background while cargo builds, and are waited for before the first
# step that needs them. Their output goes to a log printed when they are done.
step "install pinned test dependencies (in the background; log: target/install-test-deps.log)"
mkdir -p target
scripts/install-test-deps.sh > target/install-test-deps.log 2>&1 &
deps_pid=$!
wait_deps() {
  local rc=0
  wait "$deps_pid" || rc=$?
  step "test dependencies (exit $rc)"
  cat target/install-test-deps.log
  return "$rc"
}

step "cargo fmt --check"
cargo fmt --check

if [ "$quick" = 0 ]; then
  step "cargo clippy --all-targets -- -D warnings"
  cargo clippy --all-targets -- -D warnings
fi

step "cargo build --bins"
cargo build --bins

if [ "$quick" = 1 ]; then
  step "cargo test --lib --bins (the Rust unit tests)"
  cargo test --lib --bins
else
  step "cargo test --lib --bins --doc (the Rust unit and doc tests) and the build of every test target"
  cargo test --lib --bins
  cargo test --doc
  cargo test --no-run

  step "cargo check of the fuzz targets (fuzz/; scripts/fuzz.sh runs them)"
  # The fuzz crate is outside the workspace: without this its targets rot unseen.
  CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/fuzz-check" cargo check --locked --manifest-path fuzz/Cargo.toml --bins
fi

wait_deps

if [ "$quick" = 0 ]; then
  # Some of them start real brokers (tests/kafka_common), so they wait for the install:
  # on a fresh machine the Kafka download can outlast every build above.
  step "cargo test --tests (the Rust integration tests in tests/*.rs)"
  cargo test --test '*'
fi

if [ "$quick" = 0 ]; then
  step "cargo deny check bans licenses sources (deny.toml; advisories need the RustSec database, not reachable here)"
  .tools/bin/cargo-deny check --hide-inclusion-graph bans licenses sources
fi

step "pytest tests/integration$([ "$quick" = 1 ] && echo " -m quick")"
# The integration tests run target/debug/mirrorguard unless MIRRORGUARD_BIN says otherwise.
if [ -z "${MIRRORGUARD_BIN:-}" ] && [ -n "${CARGO_TARGET_DIR:-}" ]; then
  export MIRRORGUARD_BIN="$CARGO_TARGET_DIR/debug/mirrorguard"
fi
# Workers: each owns a port range, a temporary directory and its session brokers
# (tests/integration/suite_plugin.py). The tests mostly wait on brokers, so 4 workers keep
# 2 cores busy; the slowest tests and every leak are reported at the end.
workers="${MG_WORKERS:-4}"
xdist=()
if [ "$workers" -gt 1 ]; then
  xdist=(-n "$workers" --dist loadgroup)
fi
selection=()
if [ "$quick" = 1 ]; then
  selection=(-m quick)
fi
# Every test is bounded by pytest-timeout (tests/integration/pytest.ini); this bounds the run.
timeout --kill-after=30 2700 .tools/venv/bin/python -m pytest tests/integration -q \
  "${xdist[@]}" "${selection[@]}" ${PYTEST_ARGS:-}
