#!/usr/bin/env bash
# The whole test suite, from a fresh clone: pinned test dependencies, formatting and
# lints, build, every Rust test, then the integration tests (real Tansu brokers and
# librdkafka clients through the mirrorguard binary). Exits non-zero on any failure.
#
#   scripts/test.sh                 # everything
#   PYTEST_ARGS="-k hostile" scripts/test.sh   # extra pytest arguments
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

step "pytest tests/integration"
# The integration tests run target/debug/mirrorguard unless MIRRORGUARD_BIN says otherwise.
if [ -z "${MIRRORGUARD_BIN:-}" ] && [ -n "${CARGO_TARGET_DIR:-}" ]; then
  export MIRRORGUARD_BIN="$CARGO_TARGET_DIR/debug/mirrorguard"
fi
# Every test is bounded by pytest-timeout (tests/integration/pytest.ini); this bounds the run.
# shellcheck disable=SC2086
timeout --kill-after=30 900 .tools/venv/bin/python -m pytest tests/integration -q ${PYTEST_ARGS:-}
