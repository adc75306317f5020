"""A mirror fetcher's throughput under a flood of anonymous connections (issue 30).

A one-node Apache Kafka 4.4 broker (tests/integration/kafka_broker.py) is the source,
the state cluster and the destination of a mirrorguard `[[mirror]]` listener on
loopback (region mode, no client authentication). A topic gets `mib` MiB of idempotent
1 MiB batches. The "fetcher" reads the whole partition through the mirror listener
with raw Fetch v12 requests of 1 MiB (tests/integration/mirror_harness.py's
`fetch_request`, one request in flight, as a broker's fetcher), from offset 0 to the
end, `passes` times per round: once quiet, once while a flood runs. The flood sends
waves of `connections` anonymous connections from 127.0.0.0/8 addresses (so a
per-address cap does not hide the budget), each announcing a 100 MiB frame and sending
`body_kib` KiB of it, a new wave as soon as the last one is sent, for the whole round.
Reported per round: the fetcher's MB/s, mirrorguard's RSS (VmRSS at the end, VmHWM
peak since start), the flood's waves and connections, the flood connections closed by
mirrorguard while sending, and `mirrorguard_budget_refused_total`.

    .tools/venv/bin/python bench/flood.py                        # target/debug/mirrorguard
    .tools/venv/bin/python bench/flood.py --binary target/release/mirrorguard --mib 64
    .tools/venv/bin/python bench/flood.py --binary /tmp/mg-main   # a build from before issue 30

Bounded: one broker, one mirrorguard, two rounds of at most `--seconds` each (about a
minute with the defaults). Mind `ulimit -n`: the flood holds `connections` sockets.
"""

from __future__ import annotations

import argparse
import logging
import socket
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "integration"))

import harness  # noqa: E402
import rawkafka  # noqa: E402
from kafka_broker import KafkaCluster  # noqa: E402
from mirror_harness import MirrorGuard, MirrorSpec, fetch_request  # noqa: E402

HOST = "127.0.0.1"
MIB = 1024 * 1024


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def fill(bootstrap: str, topic: str, mib: int) -> None:
    p = harness.new_producer(bootstrap, **{"enable.idempotence": True, "linger.ms": 50,
                                           "batch.size": MIB, "message.max.bytes": 2 * MIB,
                                           "compression.type": "none"})
    value = b"v" * (64 * 1024 - 64)
    for i in range(mib * 16):
        p.produce(topic, value=value, key=b"%d" % i, partition=0)
        if i % 64 == 0:
            p.poll(0)
    assert p.flush(60) == 0


def read_all(bootstrap: str, topic: str, end: int, deadline: float) -> tuple[int, float]:
    """Reads `topic`-0 from 0 to `end` through the mirror: (bytes, seconds)."""
    host, port = bootstrap.rsplit(":", 1)
    with rawkafka.Connection(host, int(port), timeout=10) as c:
        md = rawkafka.metadata_v1(c, [topic])
        lhost, lport = md.brokers[md.topics[topic][0]]
    conn = rawkafka.Connection(lhost, lport, timeout=30)
    offset, got, t0 = 0, 0, time.monotonic()
    try:
        while offset < end and time.monotonic() < deadline:
            r = fetch_request(conn, 12, topic, None, 0, offset, max_wait_ms=100, max_bytes=MIB)
            recs = r.records or b""
            got += len(recs)
            pos = 0
            while pos + 61 <= len(recs):
                base = struct.unpack_from(">q", recs, pos)[0]
                length = struct.unpack_from(">i", recs, pos + 8)[0]
                if pos + 12 + length > len(recs):
                    break
                last_delta = struct.unpack_from(">i", recs, pos + 23)[0]
                offset = base + last_delta + 1
                pos += 12 + length
    finally:
        conn.close()
    return got, time.monotonic() - t0


class Flood:
    """Waves of `n` connections from 127.0.0.0/8, each announcing 100 MiB and sending
    `body` bytes of it, until stopped (each wave's sockets stay open until the next)."""

    def __init__(self, port: int, n: int, body: int, seconds: float):
        self.port, self.n, self.body, self.seconds = port, n, body, seconds
        self.opened = 0
        self.closed_by_peer = 0
        self.waves = 0
        self.sent = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def wave(self, deadline: float) -> list[socket.socket]:
        socks = []
        for i in range(self.n):
            if self.stop.is_set() or time.monotonic() > deadline:
                break
            s = socket.socket()
            s.bind((f"127.{1 + i // 60000}.{(i // 250) % 240 + 1}.{i % 250 + 2}", 0))
            s.settimeout(1.0)
            try:
                s.connect((HOST, self.port))
                s.sendall(struct.pack(">i", 100 * MIB))
            except OSError:
                s.close()
                continue
            s.setblocking(False)
            socks.append(s)
        self.opened += len(socks)
        piece = b"\x00\x01\x00\x0c" + b"\x00" * (64 * 1024 - 4)
        left = {id(s): self.body for s in socks}
        while left and not self.stop.is_set() and time.monotonic() < deadline:
            for s in socks:
                k = left.get(id(s))
                if not k:
                    continue
                try:
                    m = s.send(piece[:min(k, len(piece))])
                    self.sent += m
                    left[id(s)] = k - m
                except BlockingIOError:
                    continue
                except OSError:
                    self.closed_by_peer += 1
                    left.pop(id(s), None)
            time.sleep(0.005)
        return socks

    def run(self):
        deadline = time.monotonic() + self.seconds
        held: list[socket.socket] = []
        while not self.stop.is_set() and time.monotonic() < deadline:
            socks = self.wave(deadline)
            for s in held:
                s.close()
            held = socks
            self.waves += 1
        for s in held:
            s.close()

    def close(self):
        self.stop.set()
        self.thread.join(30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", default=str(harness.MIRRORGUARD_BIN))
    ap.add_argument("--mib", type=int, default=32, help="MiB in the mirrored partition")
    ap.add_argument("--connections", type=int, default=1000)
    ap.add_argument("--body-kib", type=int, default=384)
    ap.add_argument("--passes", type=int, default=64, help="reads of the whole partition per round")
    ap.add_argument("--seconds", type=float, default=60.0, help="bound of each round")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    harness.MIRRORGUARD_BIN = Path(args.binary)
    work = Path(tempfile.mkdtemp(prefix="mg-flood-"))
    kafka = KafkaCluster(work / "kafka", name="flood-src",
                         overrides={"message.max.bytes": 2 * MIB, "replica.fetch.max.bytes": 2 * MIB})
    kafka.start()
    mg = None
    try:
        topic = "flood"
        harness.create_topics(kafka.bootstrap, [topic])
        fill(kafka.bootstrap, topic, args.mib)
        with rawkafka.Connection(HOST, kafka.port) as c:
            end = fetch_request(c, 12, topic, None, 0, 0, max_wait_ms=10, max_bytes=1).high_watermark
        spec = MirrorSpec.of("flood", kafka)
        mg = MirrorGuard(work, "mg", kafka.bootstrap, [spec], binary=Path(args.binary),
                         log_level="warn", state_topic="__mirror_state_flood")
        mg.start(timeout=30)
        mg.wait_sources_known()
        print(f"binary {args.binary}; {args.mib} MiB in {end} records; flood: {args.connections} connections "
              f"x {args.body_kib} KiB of an announced 100 MiB frame", flush=True)
        print(f"{'round':<8} {'MB/s':>7} {'bytes':>11} {'s':>6} {'RSS MB':>7} {'peak MB':>8} "
              f"{'waves':>6} {'flood conns':>11} {'closed by mg':>12} {'refused':>8}", flush=True)
        for name in ("quiet", "flood"):
            flood = None
            if name == "flood":
                flood = Flood(spec.bootstrap_port, args.connections, args.body_kib * 1024, args.seconds)
                flood.thread.start()
                time.sleep(3.0)
            got, secs = 0, 0.0
            deadline = time.monotonic() + args.seconds
            for _ in range(args.passes):
                g, t = read_all(spec.bootstrap, topic, end, deadline)
                got, secs = got + g, secs + t
            rss, hwm = status_kib(mg.proc.pid, "VmRSS"), status_kib(mg.proc.pid, "VmHWM")
            if flood:
                flood.close()
            refused = mg.metrics().sum("mirrorguard_budget_refused_total")
            print(f"{name:<8} {got / secs / 1e6:7.1f} {got:11d} {secs:6.1f} {rss // 1024:7d} {hwm // 1024:8d} "
                  f"{flood.waves if flood else 0:6d} {flood.opened if flood else 0:11d} "
                  f"{flood.closed_by_peer if flood else 0:12d} {int(refused):8d}", flush=True)
    finally:
        harness.close_clients()
        if mg is not None:
            mg.terminate()
        kafka.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
