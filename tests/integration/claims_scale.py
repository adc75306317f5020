"""Many producers in one partition, mirrored through mirrorguard (issue 13 item 5).

A raw idempotent producer writes one batch (baseSequence 0, epoch 0) for each of N
synthetic producer ids into one partition of an Apache Kafka source. Kafka does not
check that an idempotent, non-transactional producer id was handed out by
InitProducerId: a new producer id with sequence 0 is accepted as a new producer
(checked below: every batch must come back NONE). A stand-in fetcher then mirrors the
partition through a mirror listener; every producer is new to mirrorguard, so each
needs its claim made durable in ``__mirror_state`` before its batch leaves.

Used by tests/integration/test_claims_scale.py (N = 20,000, past the old ~15,000
limit of one snapshot record) and by bench/claims_scale.py (N = 100,000).
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass, field

import harness
import rawkafka
from mirror_harness import StandInFetcher, high_watermark, read_state_records
from rawkafka import array, i16, i32, string
from kafka_dest import data_batch

PID_BASE = 1_000_000


def wait_every_partition_led(bootstrap: str, topic: str, partitions: int, timeout: float,
                             interval: float = 0.2) -> None:
    """Until partitions 0..`partitions` of `topic` each answer a Fetch without an error:
    right after CreateTopics a broker may not lead a partition yet (NOT_LEADER_OR_FOLLOWER),
    and one creating thousands of logs does so one by one. Writes nothing."""
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    unled = set(range(partitions))

    def led() -> bool:
        with rawkafka.Connection(host, int(port), timeout=5) as c:
            for p in sorted(unled):
                if rawkafka.fetch_v4(c, topic, p, 0, max_wait_ms=0).error_code == 0:
                    unled.discard(p)
        return not unled

    harness.wait_until(led, timeout, interval=interval, what=f"every partition of {topic} led on {bootstrap}")


def produce_synthetic(bootstrap: str, topic: str, n: int, pid_base: int = PID_BASE, window: int = 500,
                      partitions: int = 1) -> float:
    """Writes one idempotent batch per synthetic producer id (Produce v3, acks=1,
    pipelined `window` deep on one connection), producer i into partition i % `partitions`.
    Returns the seconds it took; raises if any batch is refused."""
    host, port = bootstrap.rsplit(":", 1)
    wait_every_partition_led(bootstrap, topic, min(n, partitions), 30 + partitions / 100, interval=0.1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t0 = time.monotonic()
    buf = b""

    def read_one() -> None:
        nonlocal buf
        while len(buf) < 4 or len(buf) < 4 + struct.unpack(">i", buf[:4])[0]:
            chunk = sock.recv(1 << 20)
            if not chunk:
                raise rawkafka.ProtocolError("source closed the connection")
            buf += chunk
        size = struct.unpack(">i", buf[:4])[0]
        frame, buf = buf[4:4 + size], buf[4 + size:]
        r = rawkafka.Reader(frame)
        r.i32()  # correlation id
        for _ in range(r.count()):
            r.string()
            for _ in range(r.count()):
                _idx, err, _base, _ts = r.i32(), r.i16(), r.i64(), r.i64()
                if err != 0:
                    raise rawkafka.ProtocolError(f"synthetic producer batch refused: error {err}")

    in_flight = 0
    for i in range(n):
        batch = data_batch([b"v"], pid=pid_base + i, epoch=0, seq=0, ts=int(time.time() * 1000))
        body = string(None) + i16(1) + i32(30000) + array([string(topic) + array([i32(i % partitions) + i32(len(batch)) + batch])])
        frame = i16(0) + i16(3) + i32(i) + string("claims-scale") + body
        sock.sendall(i32(len(frame)) + frame)
        in_flight += 1
        if in_flight >= window:
            read_one()
            in_flight -= 1
    while in_flight:
        read_one()
        in_flight -= 1
    sock.close()
    return time.monotonic() - t0


@dataclass
class StateTraffic:
    records: int = 0
    bytes: int = 0  # key + value bytes
    by_type: dict = field(default_factory=dict)
    tombstones: int = 0
    largest_value: int = 0


def state_traffic(state_bootstrap: str, topic: str) -> StateTraffic:
    """Counts what __mirror_state holds now (before compaction: everything written)."""
    out = StateTraffic()
    for r in read_state_records(state_bootstrap, topic, timeout=120):
        out.records += 1
        out.by_type[r.type] = out.by_type.get(r.type, 0) + 1
        if r.value is None:
            out.tombstones += 1
    out.bytes = _raw_bytes(state_bootstrap, topic)
    return out


def _raw_bytes(state_bootstrap: str, topic: str) -> int:
    """Sum of key and value sizes of every record, with a plain consumer."""
    from confluent_kafka import TopicPartition

    hw = high_watermark(state_bootstrap, topic)
    c = harness.new_consumer(state_bootstrap, **{"group.id": "claims-scale-bytes", "enable.auto.commit": False,
                                                "enable.partition.eof": False})
    total = 0
    seen = -1
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 120
        while seen < hw - 1 and time.monotonic() < deadline:
            for m in c.consume(num_messages=1000, timeout=0.5):
                if m.error():
                    continue
                total += len(m.key() or b"") + len(m.value() or b"")
                seen = m.offset()
    finally:
        c.close()
    return total


def mirror_all(mg, topic: str, source_bootstrap: str, mirror: str = "m", timeout: float = 300) -> tuple[StandInFetcher, float]:
    """Mirrors the whole partition through the mirror listener; returns the fetcher
    and the seconds it took."""
    f = StandInFetcher(topic)
    f.connect(mg.mirrors[mirror].bootstrap, rebase=True)
    t0 = time.monotonic()
    f.catch_up(high_watermark(source_bootstrap, topic), timeout=timeout)
    return f, time.monotonic() - t0


def producers_tracked(mg) -> float:
    return mg.metrics().sum("mirrorguard_producer_state_producers")
