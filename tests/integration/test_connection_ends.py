"""Connection ends are reported by their real side and cause (issue 18): a client that
hangs up cleanly, resets, or stops in the middle of a request is not malformed input
(no `mirrorguard_frame_errors_total`, no WARN blaming the upstream); an upstream that
dies is reported as the upstream's doing. Apache Kafka upstreams, raw sockets as clients.
"""

from __future__ import annotations

import socket
import struct
import time

import harness
import rawkafka
from harness import HOST

ENDS = "mirrorguard_connection_ends_total"
FRAME_ERRORS = "mirrorguard_frame_errors_total"


def _wait_count(proxy, side: str, cause: str, before: float, timeout: float = 5.0) -> float:
    deadline = time.monotonic() + timeout
    while True:
        now = proxy.metrics().sum(ENDS, side=side, cause=cause)
        if now > before:
            return now
        if time.monotonic() > deadline:
            raise AssertionError(f"{ENDS}{{side={side},cause={cause}}} stayed at {now}: "
                                 f"{proxy.metrics().select(ENDS)}")
        time.sleep(0.05)


def test_client_side_ends_are_not_frame_errors(kafka1, proxy_factory):
    proxy = proxy_factory([kafka1.bootstrap], node_ids=kafka1.node_ids)
    port = proxy.ports.node_port
    m0 = proxy.metrics()
    frame_errors_before = m0.sum(FRAME_ERRORS)

    # 1. Clean close after a complete request/response.
    with rawkafka.Connection(HOST, port, timeout=5) as c:
        rawkafka.api_versions(c)
    _wait_count(proxy, "client", "closed", m0.sum(ENDS, side="client", cause="closed"))

    # 2. Hang-up in the middle of a request (a client whose own timeout fired).
    s = socket.create_connection((HOST, port), timeout=5)
    s.sendall(struct.pack(">i", 100) + b"\0\x12\0\x00\0\0\0\x07")  # 12 of 104 bytes
    time.sleep(0.1)
    s.close()
    _wait_count(proxy, "client", "mid_request", m0.sum(ENDS, side="client", cause="mid_request"))

    # 3. Reset (RST instead of FIN: SO_LINGER with a zero timeout).
    s = socket.create_connection((HOST, port), timeout=5)
    time.sleep(0.1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
    _wait_count(proxy, "client", "reset", m0.sum(ENDS, side="client", cause="reset"))

    assert proxy.metrics().sum(FRAME_ERRORS) == frame_errors_before, proxy.metrics().select(FRAME_ERRORS)
    log = proxy.proc.log_text()
    assert "upstream side ended" not in log, "a client's end was blamed on the upstream"
    assert "client closed in the middle of sending a request" in log

    # 4. A real protocol violation still counts as one.
    s = socket.create_connection((HOST, port), timeout=5)
    s.sendall(b"\xff\xff\xff\xf0" + b"\0" * 16)
    try:
        assert s.recv(16) == b""
    except ConnectionResetError:
        pass
    s.close()
    harness.wait_until(lambda: proxy.metrics().sum(FRAME_ERRORS, kind="negative_size") == 1, 5,
                       what="negative_size counted")
    _wait_count(proxy, "client", "protocol", m0.sum(ENDS, side="client", cause="protocol"))


def test_upstream_death_is_the_upstreams(kafka_factory, proxy_factory):
    src = kafka_factory(nodes=1, name="dying")
    proxy = proxy_factory([src.bootstrap], node_ids=src.node_ids)
    before = proxy.metrics().sum(ENDS, side="upstream")
    c = rawkafka.Connection(HOST, proxy.ports.node_port, timeout=5)
    try:
        rawkafka.api_versions(c)
        src.nodes[0].kill()
        try:
            rawkafka.api_versions(c)
        except (OSError, rawkafka.ProtocolError):
            pass
    finally:
        c.close()
    _wait_count(proxy, "upstream", "closed", before)
    assert proxy.metrics().sum(ENDS, side="client", cause="reset") == 0
