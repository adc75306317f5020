"""Record batches fetched through mirrorguard are byte-identical to those fetched
directly from the broker (raw Fetch v4, no client library in between)."""

from __future__ import annotations

import pytest

import rawkafka
from harness import HOST, create_topics, new_producer, produce, topic_name, wait_txn_markers


def _fill(bootstrap: str, topic: str) -> None:
    """A partition with batches of every codec, an idempotent producer and a
    transaction that aborts and one that commits."""
    for codec in ("none", "gzip", "snappy", "lz4", "zstd"):
        produce(
            bootstrap,
            topic,
            [(f"{codec}-{i}".encode(), f"{codec}-value-{i}".encode() * 3) for i in range(40)],
            **{"compression.type": codec, "linger.ms": 10},
        )
    produce(bootstrap, topic, [(None, f"idem-{i}".encode()) for i in range(30)], **{"enable.idempotence": True})
    p = new_producer(bootstrap, **{"transactional.id": f"tx-{topic}"})
    p.init_transactions(15)
    for outcome in ("abort", "commit"):
        p.begin_transaction()
        for i in range(5):
            p.produce(topic, value=f"txn-{outcome}-{i}".encode(), partition=0)
        p.flush(15)
        (p.abort_transaction if outcome == "abort" else p.commit_transaction)(15)
    wait_txn_markers(bootstrap, topic)


def test_fetched_batches_byte_identical(kafka):
    topic = topic_name("bytes")
    create_topics(kafka.broker.bootstrap, [topic])
    _fill(kafka.broker.bootstrap, topic)

    direct_batches, direct_bytes = rawkafka.fetch_all_batches(HOST, kafka.broker.port, topic)
    assert len(direct_batches) >= 8
    assert any(b.is_control for b in direct_batches)

    proxy_ports = [kafka.broker.port]
    if kafka.via_proxy:
        proxy_ports = [kafka.proxy.ports.node_port, kafka.proxy.ports.bootstrap]
    for port in proxy_ports:
        _, via_bytes = rawkafka.fetch_all_batches(HOST, port, topic)
        assert via_bytes == direct_bytes, f"records bytes differ through port {port}"

        # Single fetches at several offsets: every field of the partition response matches.
        with rawkafka.Connection(HOST, kafka.broker.port) as d, rawkafka.Connection(HOST, port) as v:
            for b in direct_batches[:: max(1, len(direct_batches) // 5)]:
                for max_bytes in (1 << 20, 300):  # a small max_bytes may end in a partial batch
                    fd = rawkafka.fetch_v4(d, topic, 0, b.base_offset, max_bytes=max_bytes)
                    fv = rawkafka.fetch_v4(v, topic, 0, b.base_offset, max_bytes=max_bytes)
                    assert fv == fd, f"offset {b.base_offset} max_bytes {max_bytes} via port {port}"
                    assert fv.records, f"no records at offset {b.base_offset}"


def test_produced_through_proxy_stored_verbatim(kafka):
    """Batches produced through the proxy are stored as the client built them: the CRC
    (computed by librdkafka) still matches and the data round-trips."""
    topic = topic_name("verbatim")
    create_topics(kafka.bootstrap, [topic])
    produce(kafka.bootstrap, topic, [(b"k", b"v" * 100) for _ in range(20)], **{"compression.type": "zstd"})
    direct_batches, direct_bytes = rawkafka.fetch_all_batches(HOST, kafka.broker.port, topic)
    assert sum(b.record_count for b in direct_batches) == 20
    assert all(b.crc_ok() for b in direct_batches)
    port = kafka.proxy.ports.node_port if kafka.via_proxy else kafka.broker.port
    _, via_bytes = rawkafka.fetch_all_batches(HOST, port, topic)
    assert via_bytes == direct_bytes


@pytest.mark.parametrize("version", [12, 13, 16, 17])
def test_flexible_fetch_byte_identical(kafka, version):
    """Flexible Fetch versions (v16+ carry KIP-951 NodeEndpoints the proxy rewrites): the
    records bytes and partition fields are identical through the proxy, and any node
    endpoint handed to the client is a proxy address."""
    topic = topic_name(f"flex{version}")
    create_topics(kafka.broker.bootstrap, [topic])
    _fill(kafka.broker.bootstrap, topic)
    port = kafka.proxy.ports.node_port if kafka.via_proxy else kafka.broker.port
    with rawkafka.Connection(HOST, kafka.broker.port) as d, rawkafka.Connection(HOST, port) as v:
        ids_d, _ = rawkafka.topic_ids_v12(d, [topic])
        ids_v, brokers_v = rawkafka.topic_ids_v12(v, [topic])
        assert ids_v == ids_d and ids_d[topic] != b"\0" * 16
        expected = (HOST, port)
        assert set(brokers_v.values()) == {expected}
        direct_batches, _ = rawkafka.fetch_all_batches(HOST, kafka.broker.port, topic)
        for b in direct_batches:
            fd = rawkafka.fetch_flex(d, version, topic, ids_d[topic], 0, b.base_offset)
            fv = rawkafka.fetch_flex(v, version, topic, ids_d[topic], 0, b.base_offset)
            assert fv.partition == fd.partition, f"v{version} offset {b.base_offset}"
            assert fv.partition.records and fv.partition.records.startswith(b.raw)
            assert (fv.log_start_offset, fv.preferred_read_replica) == (fd.log_start_offset, fd.preferred_read_replica)
            for node, host, nport in fv.node_endpoints():
                assert (host, nport) == expected, f"NodeEndpoints leaks {node}@{host}:{nport}"


def _exchange(port: int, frame: bytes) -> bytes | None:
    """Sends one raw request frame; returns the raw response frame (size
    prefix excluded), or None when the broker closes the connection instead."""
    import socket
    import struct

    with socket.create_connection((HOST, port), timeout=10) as s:
        s.sendall(struct.pack(">i", len(frame)) + frame)
        try:
            head = s.recv(4, socket.MSG_WAITALL)
            if len(head) < 4:
                return None
            size = struct.unpack(">i", head)[0]
            body = s.recv(size, socket.MSG_WAITALL)
        except ConnectionResetError:
            return None
        return body if len(body) == size else None


def test_keys_and_versions_newer_than_the_protocol_tables(kafka):
    """kafka-protocol 0.18 (the proxy's protocol tables) knows Kafka 4.1; the
    broker is 4.4. StreamsGroupDescribe (89, a hand-kept row), a key no table
    here knows (93, StreamsGroupTopologyDescriptionUpdate, and 200) and a
    Metadata version past every table all get the broker's own answer,
    byte for byte, through the proxy (or, where the broker hangs up, the
    proxy hangs up too)."""
    r = rawkafka
    flex_header = lambda key, version, corr: (  # noqa: E731 - request header v2
        r.i16(key) + r.i16(version) + r.i32(corr) + r.string("tables") + r.NO_TAGS
    )
    frames = [
        # StreamsGroupDescribe v0: group_ids ["g"], include_authorized_operations false.
        flex_header(89, 0, 1) + r.compact_array([r.compact_string("g")]) + r.i8(0) + r.NO_TAGS,
        # Key 93 v0 with an empty body, and a key that does not exist at all.
        flex_header(93, 0, 2) + r.NO_TAGS,
        flex_header(200, 0, 3) + r.NO_TAGS,
        # Metadata v14 (no broker speaks it yet): the broker answers or closes.
        flex_header(3, 14, 4) + r.compact_array([]) + r.i8(0) + r.i8(0) + r.NO_TAGS,
    ]
    ports = [kafka.broker.port]
    if kafka.via_proxy:
        ports.append(kafka.proxy.ports.node_port)
    for frame in frames:
        answers = [_exchange(port, frame) for port in ports]
        assert answers[1:] == answers[:1], (frame[:4], answers)
    # The hand-kept row is exercised: the 4.4 broker answers StreamsGroupDescribe.
    assert _exchange(ports[-1], frames[0]) is not None
