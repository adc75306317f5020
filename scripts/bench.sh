#!/usr/bin/env bash
# End-to-end benchmark (BENCHMARKS.md): builds mirrorguard and the load
# generator / synthetic upstream fixture in release mode, installs the test
# dependencies if missing (Tansu, confluent-kafka), then runs bench/e2e.py.
# Bounded: about 2 minutes with the defaults, about 4 with --scaling.
#   scripts/bench.sh                  # Tansu + synthetic scenarios
#   scripts/bench.sh --scaling        # plus partitions/producers/connections sweeps
#   scripts/bench.sh --seconds 3 --repeat 3
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .tools/bin/tansu ] && [ -x .tools/venv/bin/python ] || scripts/install-test-deps.sh
cargo build --release --bin mirrorguard --example fetchbench
exec .tools/venv/bin/python bench/e2e.py "$@"
