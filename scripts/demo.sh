#!/usr/bin/env bash
# mirrorguard demo on embedded defaults: an Apache Kafka 4.4 broker (KRaft, one node,
# started by tests/integration/kafka_broker.py) and mirrorguard in front of it, both on
# free loopback ports; a librdkafka producer and consumer talk to the broker only through
# mirrorguard; then the metrics that moved are shown. Without java it falls back to a
# Tansu broker and says so. Everything started here is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY="$ROOT/.tools/venv/bin/python"
WORK=$(mktemp -d -t mirrorguard-demo.XXXXXX)
PIDS=()

cleanup() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

# wait_for SECONDS DESCRIPTION COMMAND...: polls COMMAND until it succeeds or time runs out.
wait_for() {
  local deadline=$(( $(date +%s) + $1 )) what=$2; shift 2
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then echo "timed out waiting for $what" >&2; return 1; fi
    sleep 0.1
  done
}

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

say "Installing the pinned test dependencies and building mirrorguard"
scripts/install-test-deps.sh
cargo build --bins --quiet
MIRRORGUARD_BIN=${MIRRORGUARD_BIN:-$ROOT/target/debug/mirrorguard}

if command -v java >/dev/null && [ -f .tools/kafka/libs/kafka_2.13-4.4.0.jar ]; then
  say "Starting an Apache Kafka 4.4 broker (the upstream Kafka cluster: KRaft, one node)"
  "$PY" tests/integration/kafka_broker.py --nodes 1 --dir "$WORK/kafka" >"$WORK/kafka.out" 2>&1 &
  PIDS+=($!)
  if ! wait_for 120 "the Kafka broker" grep -q '^bootstrap=' "$WORK/kafka.out"; then
    cat "$WORK/kafka.out" >&2; exit 1
  fi
  BROKER_PORT=$(sed -n 's/^bootstrap=127.0.0.1:\([0-9]*\) .*/\1/p' "$WORK/kafka.out")
  CLUSTER_ID=$(sed -n 's/.* cluster_id=\([^ ]*\) .*/\1/p' "$WORK/kafka.out")
  NODE_ID=1
else
  say "java or Apache Kafka not installed: FALLING BACK to a Tansu broker (users run Apache Kafka)"
  BROKER_PORT=$(free_port)
  CLUSTER_ID=$("$PY" -c 'import base64,os; print(base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("="))')
  .tools/bin/tansu broker --cluster-id="$CLUSTER_ID" \
    --listener-url "tcp://127.0.0.1:$BROKER_PORT" --advertised-listener-url "tcp://127.0.0.1:$BROKER_PORT" \
    --storage-engine memory://tansu/ >"$WORK/tansu.log" 2>&1 &
  PIDS+=($!)
  wait_for 10 "the broker" bash -c "exec 3<>/dev/tcp/127.0.0.1/$BROKER_PORT"
  NODE_ID=111
fi
echo "broker: 127.0.0.1:$BROKER_PORT (node $NODE_ID), cluster id $CLUSTER_ID"

say "Starting mirrorguard in front of it"
BOOTSTRAP_PORT=$(free_port)
ADMIN_PORT=$(free_port)
NODE_PORT=$(free_port)   # the proxy port for broker node $NODE_ID
NODE_PORT_BASE=$(( NODE_PORT - NODE_ID ))
cat >"$WORK/proxy.toml" <<TOML
[admin]
listen = "127.0.0.1:$ADMIN_PORT"

[logging]
format = "text"
level = "info"

[[listener]]
name = "main"
bootstrap = "127.0.0.1:$BOOTSTRAP_PORT"
listen_host = "127.0.0.1"
advertised_host = "127.0.0.1"
node_port_base = $NODE_PORT_BASE
upstream_bootstrap = ["127.0.0.1:$BROKER_PORT"]
TOML
"$MIRRORGUARD_BIN" run --config "$WORK/proxy.toml" >"$WORK/mirrorguard.log" 2>&1 &
PIDS+=($!)
if ! wait_for 20 "mirrorguard /readyz" curl -fsS "http://127.0.0.1:$ADMIN_PORT/readyz"; then
  cat "$WORK/mirrorguard.log" >&2; exit 1
fi
cat "$WORK/proxy.toml"
echo "mirrorguard: clients bootstrap at 127.0.0.1:$BOOTSTRAP_PORT, node $NODE_ID is served at 127.0.0.1:$NODE_PORT"
echo "admin: http://127.0.0.1:$ADMIN_PORT/{healthz,readyz,metrics}"
curl -fsS "http://127.0.0.1:$ADMIN_PORT/metrics" >"$WORK/metrics.before"

say "Producing and consuming through mirrorguard with librdkafka"
"$PY" - "127.0.0.1:$BOOTSTRAP_PORT" <<'PY'
import sys
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

bootstrap = sys.argv[1]
admin = AdminClient({"bootstrap.servers": bootstrap})
admin.create_topics([NewTopic("demo", num_partitions=1, replication_factor=1)])["demo"].result(15)
md = admin.list_topics(timeout=10)
print("brokers as the client sees them:", [f"{b.id}@{b.host}:{b.port}" for b in md.brokers.values()])

p = Producer({"bootstrap.servers": bootstrap, "compression.type": "zstd", "enable.idempotence": True})
for i in range(5):
    p.produce("demo", key=f"k{i}".encode(), value=f"hello mirrorguard #{i}".encode(), partition=0)
assert p.flush(15) == 0, "undelivered messages"
print("produced 5 records (zstd, idempotent)")

c = Consumer({"bootstrap.servers": bootstrap, "group.id": "demo", "enable.auto.commit": False})
c.assign([TopicPartition("demo", 0, 0)])
got = []
while len(got) < 5:
    msgs = c.consume(5 - len(got), timeout=10)
    if not msgs:
        sys.exit("no records consumed within 10 s")
    for m in msgs:
        if m.error():
            sys.exit(f"consumer error: {m.error()}")
        got.append(m)
c.close()
for m in got:
    print(f"  offset {m.offset()}: {m.key().decode()} = {m.value().decode()}")
PY

say "Metrics that moved (GET /metrics)"
curl -fsS "http://127.0.0.1:$ADMIN_PORT/metrics" >"$WORK/metrics.after"
# Print the samples whose value changed, mirrorguard_* only, without histogram buckets.
"$PY" - "$WORK/metrics.before" "$WORK/metrics.after" <<'PY'
import sys

def samples(path):
    out = {}
    for line in open(path):
        if line.startswith("mirrorguard_") and "_bucket{" not in line:
            key, _, value = line.rstrip("\n").rpartition(" ")
            out[key] = value
    return out

before, after = samples(sys.argv[1]), samples(sys.argv[2])
moved = sorted(k for k, v in after.items() if before.get(k) != v)
# Requests per API, then the bytes and latency of the data path, then everything else.
def rank(k):
    if k.startswith("mirrorguard_requests_total"):
        return 0
    if 'api="Produce"' in k or 'api="Fetch"' in k:
        return 1
    return 2
shown = [k for k in sorted(moved, key=rank) if rank(k) < 2 or "connections" in k or "errors" in k]
print("\n".join(f"{k} {after[k]}" for k in shown) if shown else "(no metric moved?)")
PY

say "Failover demo: SPEC scenario 1 without and with mirrorguard (B is the reference destination stand-in)"
MIRRORGUARD_BIN="$MIRRORGUARD_BIN" "$PY" scripts/demo_failover.py

say "Done: stopping mirrorguard and the broker"
