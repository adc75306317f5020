"""Memory per connection against frame size (BENCHMARKS.md "Bounded memory").

Sends 50 MiB Produce requests and fetches 50 MiB Fetch responses through a
plain listener and a produce guard listener of mirrorguard, in front of a
one-node Apache Kafka 4.4 broker (tests/integration/kafka_broker.py), and
reports the mirrorguard process's peak resident memory (VmHWM in
/proc/PID/status) before and after. Each (listener, direction) pair gets a
fresh mirrorguard process, so one peak cannot hide another. Requests are
Produce v3 and Fetch v4 (tests/integration/rawkafka.py), one at a time on one
connection; every Produce must be acknowledged and every Fetch must return the
whole batch, else the run fails. The "consume" rows read the same batches with a
librdkafka consumer (confluent-kafka), which negotiates its Fetch version through
the listener's ApiVersions (Fetch v15 through mirrorguard since the clamp: v16+
responses carry KIP-951 NodeEndpoints and are held whole); the row's "fetch
version" column is the highest FetchRequest version librdkafka logged.

The "mirror" listener kind is a `[[mirror]]` listener in pid_mode region in front of
the same broker as its source (also its state cluster, a fresh state topic per run, and
its destination); its "fetch" row reads, with raw
Fetch v4 after one warm-up fetch (a mirror holds its first response whole), frames of
`mib` idempotent batches of 1 MiB each from one producer, so every batch's PID is
mapped on the way (the row checks one). Only the "fetch" direction applies to it.

    .tools/venv/bin/python bench/rss.py                   # target/debug/mirrorguard
    .tools/venv/bin/python bench/rss.py --kinds mirror --directions fetch --mib 32
    .tools/venv/bin/python bench/rss.py --binary /tmp/mg-main --mib 50 --rounds 3
    .tools/venv/bin/python bench/rss.py --directions consume --kinds plain

Bounded: one broker, at most 2 x 3 mirrorguard runs, `rounds` frames each (about a
minute with the defaults).
"""

from __future__ import annotations

import argparse
import logging
import re
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "integration"))

from kafka.record.default_records import DefaultRecordBatchBuilder  # noqa: E402

import harness  # noqa: E402
import rawkafka  # noqa: E402
from kafka_broker import KafkaCluster  # noqa: E402

HOST = "127.0.0.1"


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} missing from /proc/{pid}/status")


def batch(mib: int) -> bytes:
    """One uncompressed record batch holding one record of `mib` MiB (minus headroom)."""
    value = bytes(range(256)) * ((mib << 20) // 256 - 16)
    b = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=len(value) + 4096,
    )
    b.append(0, timestamp=None, key=None, value=value, headers=[])
    return bytes(b.build())


def start_proxy(work: Path, binary: Path, upstream: str, node_ids, kind: str) -> tuple[harness.Proxy, int]:
    """A mirrorguard with one plain listener, plus a [[guard]] listener when kind == "guard".
    Returns the proxy and the port to send to."""
    harness.MIRRORGUARD_BIN = binary
    p = harness.Proxy(work, [upstream], max_frame_bytes=128 << 20, node_ids=node_ids, log_level="info",
                      name=f"mg-{kind}-{time.monotonic_ns()}")
    port = p.ports.bootstrap
    if kind == "guard":
        taken = {p.ports.bootstrap, p.ports.admin}
        port = harness.free_port(taken)
        taken.add(port)
        base = harness.free_node_port_base(taken | set(range(p.ports.node_port_base, p.ports.node_port_base + 16)),
                                           nodes=list(node_ids))
        taken |= set(range(base, base + 16))
        reader_port = harness.free_port(taken)
        taken.add(reader_port)
        reader_base = harness.free_node_port_base(taken | set(range(p.ports.node_port_base, p.ports.node_port_base + 16)),
                                                  nodes=list(node_ids))
        with open(p.config_path, "a") as f:
            f.write(
                f"""
[[guard]]
name = "guard"
bootstrap = "{HOST}:{port}"
listen_host = "{HOST}"
advertised_host = "{HOST}"
node_port_base = {base}
upstream_bootstrap = ["{upstream}"]
"""
            )
    if kind == "mirror":
        taken = {p.ports.bootstrap, p.ports.admin}
        port = harness.free_port(taken)
        taken.add(port)
        base = harness.free_node_port_base(taken | set(range(p.ports.node_port_base, p.ports.node_port_base + 16)),
                                           nodes=list(node_ids))
        taken |= set(range(base, base + 16))
        reader_port = harness.free_port(taken)
        taken.add(reader_port)
        reader_base = harness.free_node_port_base(taken | set(range(p.ports.node_port_base, p.ports.node_port_base + 16)),
                                                  nodes=list(node_ids))
        with open(p.config_path, "a") as f:
            # Region mode needs a state cluster: the broker itself (a single-node
            # bench cluster; it is the destination too, so topic ids are known).
            f.write(
                f"""
[state]
bootstrap = ["{upstream.split(",")[0]}"]
topic = "__mirror_state_rss_{time.monotonic_ns()}"
production = false
allow_source_cluster = true

[[mirror]]
name = "mirror"
bootstrap = "{HOST}:{reader_port}"
listen_host = "{HOST}"
advertised_host = "{HOST}"
node_port_base = {reader_base}
# The rows' fetches are the destination fetcher's.
fetcher_bootstrap = "{HOST}:{port}"
fetcher_node_port_base = {base}
source_bootstrap = ["{upstream}"]
pid_mode = "region"
"""
            )
        port = base + list(node_ids)[0]
    p.start()
    return p, port


def pid_batch(size: int, pid: int, seq: int) -> bytes:
    """One idempotent batch of one record of about `size` bytes from producer `pid`."""
    value = bytes(range(256)) * (size // 256)
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                  producer_id=pid, producer_epoch=0, base_sequence=seq,
                                  batch_size=size + 4096)
    b.append(0, timestamp=None, key=None, value=value, headers=[])
    return bytes(b.build())


def mirror_fetch(port: int, topic: str, rounds: int, mib: int) -> None:
    """Fetches `rounds` frames of `mib` 1 MiB batches through a mirror listener, and
    checks that PIDs were mapped."""
    with rawkafka.Connection(HOST, port, timeout=60) as c:
        for i in range(rounds):
            f = rawkafka.fetch_v4(c, topic, 0, i * mib, max_bytes=mib << 20)
            assert f.error_code == 0 and f.records and len(f.records) >= (mib - 1) << 20, (
                f"fetch through mirror: error {f.error_code}, {len(f.records or b'')} bytes")
            (pid,) = struct.unpack_from(">q", f.records, 43)
            assert pid != 7777, "PID not mapped by the region-mode mirror listener"


def consume(port: int, topic: str, rounds: int, mib: int) -> int:
    """Reads `rounds` records of about `mib` MiB from partition 0 with librdkafka
    through `port`; returns the highest FetchRequest version it sent."""
    from confluent_kafka import Consumer, TopicPartition

    lines: list[str] = []

    class Lines(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    log = logging.getLogger(f"rss-rdkafka-{port}")
    log.setLevel(logging.DEBUG)
    log.propagate = False
    log.addHandler(Lines())
    c = Consumer({"bootstrap.servers": f"{HOST}:{port}", "group.id": f"rss-{port}",
                  "enable.auto.commit": False, "debug": "protocol", "logger": log,
                  "broker.address.family": "v4", "fetch.max.bytes": (mib + 4) << 20,
                  "max.partition.fetch.bytes": (mib + 4) << 20,
                  "receive.message.max.bytes": (mib + 8) << 20, "fetch.wait.max.ms": 100})
    got = 0
    deadline = time.monotonic() + 120
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        while got < rounds and time.monotonic() < deadline:
            m = c.poll(1)
            if m is None:
                continue
            assert not m.error(), m.error()
            assert len(m.value()) >= (mib - 1) << 20, f"record of {len(m.value())} bytes"
            got += 1
    finally:
        c.close()
    assert got == rounds, f"librdkafka consumed {got} of {rounds} records"
    versions = [int(v) for line in lines for v in re.findall(r"Sent FetchRequest \(v(\d+)", line)]
    assert versions, "no FetchRequest in librdkafka's protocol log"
    return max(versions)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", type=Path, default=ROOT / "target" / "debug" / "mirrorguard")
    ap.add_argument("--mib", type=int, default=50, help="size of each frame")
    ap.add_argument("--rounds", type=int, default=3, help="frames per (listener, direction)")
    ap.add_argument("--kinds", default="plain,guard", help="listeners, comma-separated")
    ap.add_argument("--directions", default="produce,fetch,consume",
                    help="produce, fetch (raw Fetch v4), consume (librdkafka), comma-separated")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="mg-rss-"))
    cluster = KafkaCluster(
        work / "kafka",
        nodes=1,
        overrides={
            "message.max.bytes": str((args.mib + 8) << 20),
            "socket.request.max.bytes": str(256 << 20),
        },
    )
    rows = []
    try:
        cluster.start()
        topic = harness.topic_name("rss")
        harness.create_topics(cluster.bootstrap, [topic])
        records = batch(args.mib)
        host, kport = cluster.bootstrap.split(",")[0].rsplit(":", 1)
        # The data the Fetch legs read, produced directly.
        with rawkafka.Connection(host, int(kport), timeout=60) as c:
            for _ in range(args.rounds):
                err, _ = rawkafka.produce_v3(c, topic, 0, records, acks=-1, timeout_ms=30000)
                assert err == 0, f"direct produce failed: error {err}"
        mirror_topic = harness.topic_name("rss-mirror")
        if "mirror" in args.kinds.split(","):
            harness.create_topics(cluster.bootstrap, [mirror_topic])
            with rawkafka.Connection(host, int(kport), timeout=60) as c:
                for seq in range(args.rounds * args.mib + 1):
                    err, _ = rawkafka.produce_v3(c, mirror_topic, 0, pid_batch((1 << 20) - 8192, 7777, seq),
                                                 acks=-1, timeout_ms=30000)
                    assert err == 0, f"direct produce failed: error {err}"
        for kind in args.kinds.split(","):
            for direction in args.directions.split(","):
                if kind == "mirror" and direction != "fetch":
                    continue
                p, port = start_proxy(work, args.binary, cluster.bootstrap, cluster.node_ids, kind)
                try:
                    pid = p.proc.pid
                    if kind == "mirror":
                        # A mirror holds its first response whole (one 1 MiB batch here).
                        with rawkafka.Connection(HOST, port, timeout=60) as c:
                            rawkafka.fetch_v4(c, mirror_topic, 0, 0, max_bytes=64 << 10)
                    before = status_kib(pid, "VmHWM")
                    started = time.monotonic()
                    version = "v3" if direction == "produce" else "v4"
                    if kind == "mirror":
                        mirror_fetch(port, mirror_topic, args.rounds, args.mib)
                    elif direction == "consume":
                        version = f"v{consume(port, topic, args.rounds, args.mib)}"
                    else:
                        with rawkafka.Connection(HOST, port, timeout=60) as c:
                            for i in range(args.rounds):
                                if direction == "produce":
                                    err, _ = rawkafka.produce_v3(c, topic, 0, records, acks=-1, timeout_ms=30000)
                                    assert err == 0, f"produce through {kind}: error {err}"
                                else:
                                    f = rawkafka.fetch_v4(c, topic, 0, i, max_bytes=(args.mib + 4) << 20)
                                    assert f.error_code == 0 and f.records and len(f.records) >= len(records), (
                                        f"fetch through {kind}: error {f.error_code}, "
                                        f"{len(f.records or b'')} bytes")
                    elapsed = time.monotonic() - started
                    after = status_kib(pid, "VmHWM")
                    rows.append((kind, direction, version, before, after, elapsed))
                finally:
                    p.terminate()
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"binary: {args.binary}; {args.rounds} x {args.mib} MiB frames per row; raw rows on one connection")
    print(f"{'listener':<8} {'direction':<9} {'version':>7} {'VmHWM before':>13} {'VmHWM after':>12} "
          f"{'growth':>9} {'seconds':>8}")
    for kind, direction, version, before, after, elapsed in rows:
        print(f"{kind:<8} {direction:<9} {version:>7} {before / 1024:>10.1f} MiB {after / 1024:>9.1f} MiB "
              f"{(after - before) / 1024:>6.1f} MiB {elapsed:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
