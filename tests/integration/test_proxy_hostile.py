"""Hostile input on raw sockets: each bad connection is closed on its own, counted in
`mirrorguard_frame_errors_total{kind}`, and a concurrent librdkafka producer on
another connection keeps working; the proxy process survives."""

from __future__ import annotations

import json
import random
import socket
import ssl
import struct
import threading
import time

import pytest

import rawkafka
from harness import HOST, consume_assign, create_topics, new_producer, produce, topic_name

FRAME_ERRORS = "mirrorguard_frame_errors_total"


def tls_client_hello() -> bytes:
    """A real TLS ClientHello as Python's ssl module sends it (starts 16 03 01)."""
    ctx = ssl.create_default_context()
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inc, out, server_hostname="broker.example")
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    hello = out.read()
    assert hello[:2] == b"\x16\x03", hello[:8].hex()
    return hello


def expect_closed(sock: socket.socket, timeout: float = 5.0) -> bytes:
    """Reads until the peer closes; fails if the connection is still open after `timeout`.
    Returns whatever the proxy sent before closing."""
    sock.settimeout(0.2)
    got = b""
    deadline = time.monotonic() + timeout
    while True:
        if time.monotonic() > deadline:
            pytest.fail(f"connection still open {timeout}s after hostile input (received {got[:64].hex()})")
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return got
        if not chunk:
            return got
        got += chunk


def send_hostile(port: int, data: bytes, close_write: bool = False) -> socket.socket:
    s = socket.create_connection((HOST, port), timeout=5)
    try:
        s.sendall(data)
    except (ConnectionResetError, BrokenPipeError):
        pass  # the proxy may close before reading everything
    if close_write:
        s.shutdown(socket.SHUT_WR)
    return s


class BackgroundProducer:
    """A librdkafka producer on its own connections, producing steadily until stopped."""

    def __init__(self, bootstrap: str, topic: str):
        self.errors: list = []
        self.delivered = 0
        self.stats: dict = {}
        self._stop = threading.Event()
        self.p = new_producer(
            bootstrap,
            **{
                "linger.ms": 0,
                "message.timeout.ms": 20000,
                "statistics.interval.ms": 100,
                "stats_cb": self._on_stats,
                "error_cb": lambda e: self.errors.append(("error_cb", e)),
            },
        )
        self.topic = topic
        self.t = threading.Thread(target=self._run, daemon=True)

    def _on_stats(self, s: str) -> None:
        self.stats = json.loads(s)

    def _cb(self, err, msg):
        if err is not None:
            self.errors.append(("delivery", err))
        else:
            self.delivered += 1

    def _run(self):
        i = 0
        while not self._stop.is_set():
            self.p.produce(self.topic, value=f"bg-{i}".encode(), partition=0, on_delivery=self._cb)
            i += 1
            self.p.poll(0.01)

    def start(self):
        self.t.start()
        return self

    def disconnects(self) -> int:
        return sum(b.get("disconnects", 0) for b in self.stats.get("brokers", {}).values())

    def stop(self) -> int:
        self._stop.set()
        self.t.join(10)
        remaining = self.p.flush(20)
        assert remaining == 0, f"{remaining} background messages undelivered"
        self.p.poll(0.3)  # one more stats callback
        return self.delivered


def test_hostile_inputs_close_only_that_connection(proxy, broker):
    topic = topic_name("hostile")
    create_topics(proxy.bootstrap, [topic])
    bg = BackgroundProducer(proxy.bootstrap, topic).start()
    try:
        # Let the producer get its connections up and deliver something first.
        deadline = time.monotonic() + 15
        while bg.delivered < 20:
            assert time.monotonic() < deadline, f"background producer delivered {bg.delivered}: {bg.errors}"
            time.sleep(0.05)

        limit = proxy.max_frame_bytes
        rng = random.Random(20240611)
        garbage = bytearray(rng.randbytes(8192))
        garbage[0] = 0x7F  # size prefix ~2 GiB: far above the limit, not negative, not TLS
        cases = [
            # (name, port, bytes, close_write, expected kind; None: any kind; "": not required)
            ("tls on bootstrap", proxy.ports.bootstrap, tls_client_hello(), False, "tls_on_plaintext"),
            ("tls on node port", proxy.ports.node_port, tls_client_hello(), False, "tls_on_plaintext"),
            ("too large", proxy.ports.bootstrap, struct.pack(">i", limit + 1) + b"\0" * 64, False, "too_large"),
            ("header too short", proxy.ports.bootstrap, struct.pack(">i", 4) + b"\0\x03\0\x01", False, "bad_header"),
            ("negative api key", proxy.ports.node_port, struct.pack(">ihhih", 10, -2, 1, 7, -1), False, "bad_header"),
            # For every API whose header version is known the whole header is checked: a client
            # id overrunning the frame closes the connection at the proxy and is counted.
            ("client id overruns frame", proxy.ports.node_port, struct.pack(">ihhih", 10, 3, 1, 7, 500), False,
             "bad_header"),
            ("garbage", proxy.ports.bootstrap, bytes(garbage), False, None),
            ("negative size", proxy.ports.node_port, b"\xff\xff\xff\xf0" + rng.randbytes(64), False, "negative_size"),
        ]
        for name, port, data, close_write, kind in cases:
            before = proxy.metrics()
            s = send_hostile(port, data, close_write)
            try:
                expect_closed(s)
            finally:
                s.close()

            def counted(before=before, kind=kind):
                if kind == "":
                    return True
                after = proxy.metrics()
                if kind is None:
                    return after.sum(FRAME_ERRORS) > before.sum(FRAME_ERRORS)
                return after.sum(FRAME_ERRORS, kind=kind) > before.sum(FRAME_ERRORS, kind=kind)

            deadline = time.monotonic() + 5
            while not counted():
                if time.monotonic() > deadline:
                    pytest.fail(
                        f"{name}: {FRAME_ERRORS}{{kind={kind}}} did not increase; frame error samples now: "
                        f"{proxy.metrics().select(FRAME_ERRORS)}"
                    )
                time.sleep(0.05)
            assert proxy.alive(), f"proxy died after {name}"

        delivered_during = bg.delivered
        time.sleep(0.3)  # a few more stats intervals with the producer still running
    finally:
        total = bg.stop()
    assert not bg.errors, f"background producer saw errors: {bg.errors[:5]}"
    assert total > delivered_during > 20
    assert bg.disconnects() == 0, f"background producer was disconnected: {bg.stats.get('brokers')}"

    # Still serving new clients.
    assert proxy.alive() and proxy.readyz() == 200
    produce(proxy.bootstrap, topic, [(None, b"after")])
    got = consume_assign(proxy.bootstrap, topic, offset=total, count=1)
    assert got[0].value() == b"after"
    m = proxy.metrics()
    assert m.sum(FRAME_ERRORS, listener="main") >= len([c for c in cases if c[4] != ""])


def test_many_hostile_connections_at_once(proxy):
    """A burst of concurrent bad connections: all closed, proxy alive, no leak of open
    connections in the gauge once they are gone."""
    base_open = proxy.metrics().sum("mirrorguard_connections_open", listener="main")
    socks = []
    try:
        for i in range(50):
            data = struct.pack(">i", proxy.max_frame_bytes + 1 + i) if i % 2 else tls_client_hello()
            socks.append(send_hostile(proxy.ports.bootstrap, data))
        for s in socks:
            expect_closed(s, timeout=10)
    finally:
        for s in socks:
            s.close()
    assert proxy.alive()
    deadline = time.monotonic() + 5
    while proxy.metrics().sum("mirrorguard_connections_open", listener="main") > base_open:
        if time.monotonic() > deadline:
            pytest.fail(
                f"connections_open stuck at {proxy.metrics().select('mirrorguard_connections_open')} "
                f"(was {base_open})"
            )
        time.sleep(0.05)


def test_client_vanishes_with_request_in_flight(proxy):
    """Clients that send a request and hang up before the answer: the proxy drops the
    late responses, stays up, and the open-connections gauge returns to its baseline."""
    topic = topic_name("vanish")
    create_topics(proxy.bootstrap, [topic])
    base_open = proxy.metrics().sum("mirrorguard_connections_open", listener="main")
    for i in range(20):
        c = rawkafka.Connection(HOST, proxy.ports.node_port if i % 2 else proxy.ports.bootstrap)
        body = (
            rawkafka.i32(-1) + rawkafka.i32(500) + rawkafka.i32(1) + rawkafka.i32(1 << 20) + rawkafka.i8(0)
            + rawkafka.array([rawkafka.string(topic) + rawkafka.array([rawkafka.i32(0) + rawkafka.i64(0) + rawkafka.i32(1 << 20)])])
        )
        header = rawkafka.i16(rawkafka.API_FETCH) + rawkafka.i16(4) + rawkafka.i32(1) + rawkafka.string("vanish")
        c.sock.sendall(rawkafka.i32(len(header + body)) + header + body)
        if i % 3 == 0:
            c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST
        c.close()
    deadline = time.monotonic() + 10
    while proxy.metrics().sum("mirrorguard_connections_open", listener="main") > base_open:
        if time.monotonic() > deadline:
            pytest.fail(f"connections_open stuck at {proxy.metrics().select('mirrorguard_connections_open')}")
        time.sleep(0.05)
    assert proxy.alive() and proxy.readyz() == 200
    produce(proxy.bootstrap, topic, [(None, b"still fine")])
    assert consume_assign(proxy.bootstrap, topic, count=1)[0].value() == b"still fine"
