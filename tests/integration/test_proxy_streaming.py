"""Cut-through relaying (issue 14 items 2-3) against Apache Kafka 4.4: a plain listener
forwards large Produce requests and Fetch responses as they arrive, so mirrorguard's
peak memory does not grow with the frame size, and the bytes are unchanged; a client
that abandons a large request mid-frame has had part of it forwarded, and the broker
must never act on it (mirrorguard closes the upstream connection with the client's).
Raw sockets (tests/integration/rawkafka.py: Produce v3, Fetch v4) as clients, and a
librdkafka consumer, which negotiates Fetch through ApiVersions: the plain listener
offers at most Fetch v15 (v16+ responses carry KIP-951 NodeEndpoints that would be
rewritten and held whole), so its large Fetch responses stream too.
"""

from __future__ import annotations

import logging
import re
import socket
import struct
import time
from pathlib import Path

from confluent_kafka import TopicPartition
from kafka.record.default_records import DefaultRecordBatchBuilder

import harness
import rawkafka
from harness import HOST
from mirror_harness import mirror_factory  # noqa: F401 - a fixture

MIB = 1 << 20
FRAME_MIB = 24


def _vm_hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def _batch(size: int) -> bytes:
    value = bytes(range(256)) * (size // 256)
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                  producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                  batch_size=size + 4096)
    b.append(0, timestamp=None, key=None, value=value, headers=[])
    return bytes(b.build())


def _produce_body(topic: str, records: bytes, partition: int = 0) -> bytes:
    return (rawkafka.string(None) + rawkafka.i16(-1) + rawkafka.i32(30000)
            + rawkafka.array([rawkafka.string(topic)
                              + rawkafka.array([rawkafka.i32(partition) + rawkafka.i32(len(records)) + records])]))


def test_large_frames_stream_with_flat_memory(kafka1, proxy_factory):
    topic = harness.topic_name("stream-big")
    harness.create_topics(kafka1.bootstrap, [topic], config={"max.message.bytes": str(40 * MIB)})
    proxy = proxy_factory([kafka1.bootstrap], node_ids=kafka1.node_ids)
    port = proxy.ports.node_port
    records = _batch(FRAME_MIB * MIB)
    pid = proxy.proc.pid
    before = _vm_hwm_kib(pid)
    with rawkafka.Connection(HOST, port, timeout=60) as c:
        err, base = rawkafka.produce_v3(c, topic, 0, records, acks=-1, timeout_ms=30000)
        assert err == 0, f"produce through the proxy: error {err}"
        via_proxy = rawkafka.fetch_v4(c, topic, 0, base, max_bytes=32 * MIB)
    host, kport = kafka1.bootstrap.split(",")[0].rsplit(":", 1)
    with rawkafka.Connection(host, int(kport), timeout=60) as c:
        direct = rawkafka.fetch_v4(c, topic, 0, base, max_bytes=32 * MIB)
    grown = (_vm_hwm_kib(pid) - before) / 1024
    assert via_proxy.error_code == 0 and direct.error_code == 0
    assert len(direct.records) >= len(records)
    # The same bytes as a direct fetch (the broker assigned the offsets).
    assert via_proxy.records == direct.records
    # Held whole, one 24 MiB request and one 24 MiB response would add >= 24 MiB.
    assert grown < 8, f"peak RSS grew by {grown:.1f} MiB relaying {FRAME_MIB} MiB frames"
    # Streamed bytes are counted like held ones.
    m = proxy.metrics()
    sent = m.sum("mirrorguard_bytes_total", api="Produce", direction="client_to_upstream")
    got = m.sum("mirrorguard_bytes_total", api="Fetch", direction="upstream_to_client")
    assert sent >= len(records) and got >= len(records), (sent, got)


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_librdkafka_consumer_fetches_stream(kafka1, proxy_factory):
    """A librdkafka consumer through a plain listener negotiates Fetch <= v15, and its
    24 MiB Fetch responses cut through: the proxy's peak RSS does not grow with them."""
    topic = harness.topic_name("stream-rdk")
    harness.create_topics(kafka1.bootstrap, [topic], config={"max.message.bytes": str(40 * MIB)})
    records = _batch(FRAME_MIB * MIB)
    host, kport = kafka1.bootstrap.split(",")[0].rsplit(":", 1)
    with rawkafka.Connection(host, int(kport), timeout=60) as c:
        for _ in range(2):
            err, _ = rawkafka.produce_v3(c, topic, 0, records, acks=-1, timeout_ms=30000)
            assert err == 0, f"direct produce: error {err}"
    proxy = proxy_factory([kafka1.bootstrap], node_ids=kafka1.node_ids)
    pid = proxy.proc.pid
    before = _vm_hwm_kib(pid)
    log = logging.getLogger(f"rdkafka-{topic}")
    log.setLevel(logging.DEBUG)
    log.propagate = False
    lines = _Lines()
    log.addHandler(lines)
    consumer = harness.new_consumer(
        proxy.bootstrap, **{"group.id": topic, "enable.auto.commit": False, "debug": "protocol",
                            "logger": log, "fetch.max.bytes": 32 * MIB,
                            "max.partition.fetch.bytes": 32 * MIB, "receive.message.max.bytes": 40 * MIB,
                            "fetch.wait.max.ms": 100})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got = 0
    deadline = time.monotonic() + 60
    try:
        while got < 2 and time.monotonic() < deadline:
            m = consumer.poll(1)
            if m is None:
                continue
            assert not m.error(), m.error()
            # The record as produced (the value _batch wrote), byte for byte.
            assert m.value() == bytes(range(256)) * (FRAME_MIB * MIB // 256), f"record {got} differs"
            got += 1
    finally:
        consumer.close()
    assert got == 2, f"consumed {got} of 2 records of {FRAME_MIB} MiB"
    versions = {int(v) for line in lines.lines for v in re.findall(r"Sent FetchRequest \(v(\d+)", line)}
    assert versions, "no FetchRequest in librdkafka's protocol debug log"
    assert max(versions) <= 15, f"librdkafka negotiated Fetch {sorted(versions)} through the plain listener"
    grown = (_vm_hwm_kib(pid) - before) / 1024
    # Held whole, one 24 MiB Fetch response would add >= 24 MiB.
    assert grown < 8, f"peak RSS grew by {grown:.1f} MiB relaying {FRAME_MIB} MiB Fetch responses"


def test_abandoned_streamed_request_is_never_acted_on(kafka1, proxy_factory):
    topic = harness.topic_name("stream-abandon")
    harness.create_topics(kafka1.bootstrap, [topic], config={"max.message.bytes": str(16 * MIB)})
    proxy = proxy_factory([kafka1.bootstrap], node_ids=kafka1.node_ids)
    port = proxy.ports.node_port
    records = _batch(4 * MIB)
    header = (rawkafka.i16(rawkafka.API_PRODUCE) + rawkafka.i16(3) + rawkafka.i32(1)
              + rawkafka.string("abandoner"))
    frame = header + _produce_body(topic, records)
    ends = "mirrorguard_connection_ends_total"
    mid_before = proxy.metrics().sum(ends, side="client", cause="mid_request")
    s = socket.create_connection((HOST, port), timeout=10)
    # All but the last 1000 bytes: far more than one streamed piece has left.
    s.sendall(struct.pack(">i", len(frame)) + frame[:-1000])
    time.sleep(0.5)
    s.close()
    harness.wait_until(
        lambda: proxy.metrics().sum(ends, side="client", cause="mid_request") > mid_before,
        10, what="the abandoned request is counted as mid_request")
    # A complete Produce after it lands at offset 0: nothing of the partial one was appended.
    with rawkafka.Connection(HOST, port, timeout=30) as c:
        err, base = rawkafka.produce_v3(c, topic, 0, _batch(1024), acks=-1)
    assert (err, base) == (0, 0), f"the abandoned request was acted on: next produce at {base} (error {err})"
    assert proxy.alive()


def _guard_produce(bootstrap: str, topic: str, partition: int, records: bytes) -> tuple[int, str | None]:
    """Produce v8 through the guard's node port of the partition's leader: (error_code, message)."""
    host, port = bootstrap.rsplit(":", 1)
    with rawkafka.Connection(host, int(port), timeout=10) as c:
        md = rawkafka.metadata_v1(c, [topic])
        lhost, lport = md.brokers[md.topics[topic][partition]]
    with rawkafka.Connection(lhost, lport, timeout=30) as c:
        resp = c.request(0, 8, _produce_body(topic, records, partition))
    r = rawkafka.Reader(resp)
    found = None
    for _ in range(r.count()):
        name = r.string()
        for _ in range(r.count()):
            idx, err = r.i32(), r.i16()
            r.i64(), r.i64(), r.i64()
            for _ in range(r.count()):
                r.i32()
                r.string()
            msg = r.string()
            if name == topic and idx == partition:
                found = (err, msg)
    assert found is not None, "partition missing from the ProduceResponse"
    return found


def test_guard_streams_allowed_and_refuses_mirrored_large_produce(kafka_factory, kafka1, mirror_factory,
                                                                   monkeypatch):
    """A Produce far larger than one streamed piece: to a mirrored partition it is still
    refused (held whole and answered), to an unmirrored topic it streams and is appended."""
    import test_produce_guard as guard_tests

    monkeypatch.setattr(guard_tests, "TOPIC", harness.topic_name("guarded-big"))
    monkeypatch.setattr(guard_tests, "LOCAL", harness.topic_name("local-big"))
    _src, dest, mg, guard = guard_tests._setup(kafka_factory, kafka1, mirror_factory)
    records = _batch(512 * 1024)
    err, msg = _guard_produce(guard, guard_tests.TOPIC, 0, records)
    assert err == guard_tests.POLICY_VIOLATION and guard_tests.MIRROR in (msg or ""), (err, msg)
    err, msg = _guard_produce(guard, guard_tests.LOCAL, 0, records)
    assert err == 0, (err, msg)
    host, kport = dest.bootstrap.split(",")[0].rsplit(":", 1)
    with rawkafka.Connection(host, int(kport), timeout=30) as c:
        f = rawkafka.fetch_v4(c, guard_tests.LOCAL, 0, 0, max_bytes=4 * MIB)
    assert f.error_code == 0 and f.high_watermark == 1 and len(f.records) >= len(records)


def _pid_batch(size: int, pid: int, seq: int) -> bytes:
    """One idempotent batch of one record of about `size` bytes from producer `pid`."""
    value = bytes(range(256)) * (size // 256)
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                  producer_id=pid, producer_epoch=0, base_sequence=seq,
                                  batch_size=size + 4096)
    b.append(0, timestamp=None, key=None, value=value, headers=[])
    return bytes(b.build())


def _split_batches(records: bytes) -> list[bytes]:
    out, at = [], 0
    while at + 12 <= len(records):
        (length,) = struct.unpack_from(">i", records, at + 8)
        end = at + 12 + length
        if end > len(records):
            break  # a truncated trailing batch
        out.append(records[at:end])
        at = end
    return out


def test_mirror_listener_streams_large_region_fetches(kafka_factory, kafka1, mirror_factory):
    """A mirror listener (region mode, claims durable in a state cluster) relays Fetch
    responses of 24 batches of 1 MiB each from a Kafka 4.4 source as they arrive (a new
    producer's first batch waits for its claim there): every
    batch leaves with its PID mapped by the SPEC 2.1 formula and a valid CRC-32C, every
    other byte as the source sent it, and the proxy's peak RSS does not grow with the
    response (held whole, each response would add >= 24 MiB)."""
    import crc32c
    from mirror_harness import MirrorSpec, fold, map_pid

    src = kafka_factory()
    topic = harness.topic_name("stream-mirror")
    harness.create_topics(src.bootstrap, [topic], config={"max.message.bytes": str(8 * MIB)})
    harness.create_topics(kafka1.bootstrap, [topic])  # the destination topic (its id keys claims)
    pid = 4242
    host, kport = src.bootstrap.split(",")[0].rsplit(":", 1)
    with rawkafka.Connection(host, int(kport), timeout=60) as c:
        # A second producer starts halfway: its claim is made durable while streaming.
        for i in range(2 * FRAME_MIB):
            batch = _pid_batch(MIB - 8192, pid + i // FRAME_MIB, i % FRAME_MIB)
            err, _ = rawkafka.produce_v3(c, topic, 0, batch, acks=-1, timeout_ms=30000)
            assert err == 0, f"direct produce: error {err}"
    mg = mirror_factory(kafka1.bootstrap, [MirrorSpec.of("big", src)])
    spec = mg.mirrors["big"]
    proc = mg.proc.pid
    before = _vm_hwm_kib(proc)
    via, direct = [], []
    with rawkafka.Connection(HOST, spec.node_port, timeout=60) as c:
        # The mirror holds its first response (its topic ids are then known) ...
        first = rawkafka.fetch_v4(c, topic, 0, 0, max_bytes=64 * 1024)
        assert first.error_code == 0, first.error_code
        # ... and streams the large ones after it.
        offset = 0
        while offset < 2 * FRAME_MIB:
            f = rawkafka.fetch_v4(c, topic, 0, offset, max_bytes=FRAME_MIB * MIB)
            assert f.error_code == 0 and f.records, f.error_code
            got = _split_batches(f.records)
            via.extend(got)
            offset += len(got)
    with rawkafka.Connection(host, int(kport), timeout=60) as c:
        offset = 0
        while offset < 2 * FRAME_MIB:
            f = rawkafka.fetch_v4(c, topic, 0, offset, max_bytes=FRAME_MIB * MIB)
            got = _split_batches(f.records)
            direct.extend(got)
            offset += len(got)
    grown = (_vm_hwm_kib(proc) - before) / 1024
    assert len(via) == len(direct) == 2 * FRAME_MIB
    for i, (v, d) in enumerate(zip(via, direct)):
        mapped = map_pid(pid + i // FRAME_MIB, fold(src.cluster_id))
        assert struct.unpack_from(">q", v, 43)[0] == mapped, f"batch {i}: PID not mapped"
        assert v[:17] + v[21:43] + v[51:] == d[:17] + d[21:43] + d[51:], f"batch {i} differs"
        assert struct.unpack_from(">I", v, 17)[0] == crc32c.crc32c(v[21:]), f"batch {i}: bad CRC"
    assert grown < 8, f"peak RSS grew by {grown:.1f} MiB relaying {FRAME_MIB} MiB region-mode Fetch responses"
    m = mg.metrics()
    assert m.sum("mirrorguard_rewrite_errors_total") == 0
    assert m.sum("mirrorguard_mirror_events_total", mirror="big", kind="response_streamed") >= 2
