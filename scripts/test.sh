#!/usr/bin/env bash
# The whole test suite, from a fresh clone: pinned test dependencies, formatting and
# lints, build, every Rust test, then the integration tests (real Apache Kafka 4.4
# brokers, librdkafka, Java and franz-go clients through the mirrorguard binary; Tansu
# as a second broker with MG_BROKER=both). Exits non-zero on any failure.
#
#   scripts/test.sh                 # everything
#   PYTEST_ARGS="-k hostile" scripts/test.sh   # extra pytest arguments
#   MG_BROKER=both scripts/test.sh  # client/proxy tests on Kafka and on Tansu
set -euo pipefail
cd "$(dirname "$0")/.."

start=$(date +%s)
report() {
  local rc=$?
  echo "scripts/test.sh: $([ "$rc" = 0 ] && echo OK || echo "FAILED (exit $rc)") — wall time $(( $(date +%s) - start ))s"
}
trap report EXIT

step() { echo; echo "==> $* ($(( $(date +%s) - start ))s)"; }

step "install pinned test dependencies"
scripts/install-test-deps.sh

step "cargo fmt --check"
cargo fmt --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings

step "cargo build --bins"
cargo build --bins

step "cargo test"
cargo test

step "cargo check of the fuzz targets (fuzz/; scripts/fuzz.sh runs them)"
# The fuzz crate is outside the workspace: without this its targets rot unseen.
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/fuzz-check" cargo check --locked --manifest-path fuzz/Cargo.toml --bins

step "pytest tests/integration"
# The integration tests run target/debug/mirrorguard unless MIRRORGUARD_BIN says otherwise.
if [ -z "${MIRRORGUARD_BIN:-}" ] && [ -n "${CARGO_TARGET_DIR:-}" ]; then
  export MIRRORGUARD_BIN="$CARGO_TARGET_DIR/debug/mirrorguard"
fi
# Every test is bounded by pytest-timeout (tests/integration/pytest.ini); this bounds the run.
# On 2 busy cores with Apache Kafka brokers the suite has taken 15 to 23 min (231 tests); the
# cap leaves room for that with the cargo steps and stays well inside CI's 90 min.
timeout --kill-after=30 2700 .tools/venv/bin/python -m pytest tests/integration -q ${PYTEST_ARGS:-}
