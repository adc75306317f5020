#!/usr/bin/env bash
# End-to-end benchmark (BENCHMARKS.md): builds mirrorguard and the load
# generator / synthetic upstream fixture in release mode, installs the test
# dependencies if missing (Tansu, Apache Kafka 4.4, confluent-kafka), then runs
# bench/e2e.py. Bounded: about 12 minutes with the defaults (3 scenarios x 5
# rounds x 2 legs x 3 s per path), 2 more with --scaling.
#   scripts/bench.sh                  # synthetic, Tansu and Kafka scenarios
#   scripts/bench.sh --scaling        # plus partitions/producers/connections sweeps
#   scripts/bench.sh --seconds 2 --repeat 5 --skip-tansu
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .tools/bin/tansu ] && [ -x .tools/venv/bin/python ] && [ -f .tools/kafka/libs/kafka-server-4.4.0.jar ] \
    || scripts/install-test-deps.sh
cargo build --release --bin mirrorguard --example fetchbench
exec .tools/venv/bin/python bench/e2e.py "$@"
