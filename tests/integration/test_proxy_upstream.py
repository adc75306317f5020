"""Upstream failures: broker restart on the same port, connect refused at start-up, a
stalled broker. Each test owns its broker (`own_broker`: a one-node Apache Kafka
cluster, or Tansu with --mg-broker=tansu/both)."""

from __future__ import annotations

import time

import pytest
from harness import HOST, TANSU_NODE_ID, consume_assign, create_topics, free_port, new_producer, produce, topic_name, wait_until

UPSTREAM_ERRORS = "mirrorguard_upstream_errors_total"


def test_broker_restart_same_port(own_broker, proxy_factory):
    b1 = own_broker()
    proxy = proxy_factory([b1.bootstrap], node_ids=b1.node_ids)
    topic = topic_name("restart")
    create_topics(proxy.bootstrap, [topic])

    events = []
    p = new_producer(proxy.bootstrap, **{"message.timeout.ms": 60000, "linger.ms": 0, "error_cb": events.append})
    produce(proxy.bootstrap, topic, [(None, f"before-{i}".encode()) for i in range(5)], producer=p)
    errors_before = proxy.metrics().sum(UPSTREAM_ERRORS)

    if b1.kind == "kafka":
        b1.nodes[0].kill()  # SIGKILL: no controlled shutdown
        assert not b1.nodes[0].alive()
    else:
        b1.stop()
        assert not b1.proc.alive()

    # During the outage nothing may be acknowledged.
    outcome = []
    p.produce(topic, value=b"during", partition=0, on_delivery=lambda err, msg: outcome.append(err))
    t_end = time.monotonic() + 2.0
    while time.monotonic() < t_end:
        p.poll(0.1)
    assert not [e for e in outcome if e is None], "a message was acknowledged while the broker was down"
    assert proxy.alive()

    if b1.kind == "kafka":
        # The same node again on the same port and data: the topic is still there.
        b1.nodes[0].restart()
    else:
        # A new Tansu on the same port (memory storage: the topic has to be created again).
        b2 = own_broker(port=b1.port, cid=b1.cluster_id)
        create_topics(b2.bootstrap, [topic])

    delivered = produce(proxy.bootstrap, topic, [(None, f"after-{i}".encode()) for i in range(5)], producer=p, timeout=45)
    assert len(delivered) == 5
    assert p.flush(30) == 0
    # The message produced during the outage was either delivered after recovery or
    # failed with an error; it was never acknowledged before.
    during_delivered = 1 if outcome[-1:] == [None] else 0
    offset = 5 if b1.kind == "kafka" else 0  # Kafka kept the records from before the kill
    values = [m.value() for m in consume_assign(proxy.bootstrap, topic, offset=offset, count=5 + during_delivered)]
    assert values[-5:] == [f"after-{i}".encode() for i in range(5)]
    if b1.kind == "kafka":
        before = consume_assign(proxy.bootstrap, topic, count=5)
        assert [m.value() for m in before] == [f"before-{i}".encode() for i in range(5)]

    wait_until(lambda: proxy.metrics().sum(UPSTREAM_ERRORS) > errors_before, 10, what=f"{UPSTREAM_ERRORS} increased")
    assert proxy.readyz() == 200
    # The client was told: mirrorguard drops client connections when their upstream goes
    # away, which librdkafka reports (_TRANSPORT / _ALL_BROKERS_DOWN) and retries.
    assert events, "the client saw no disconnect or error while its broker was down"


def test_connect_refused_at_startup(own_broker, broker_kind, proxy_factory):
    """The proxy starts with its upstream down: it stays up, is not ready, counts the
    failures, and becomes ready and serves clients once the broker appears."""
    port = free_port()
    node_ids = [1] if broker_kind == "kafka" else [TANSU_NODE_ID]
    proxy = proxy_factory([f"{HOST}:{port}"], wait_ready=False, node_ids=node_ids)
    t_end = time.monotonic() + 1.5
    while time.monotonic() < t_end:
        assert proxy.alive(), "proxy exited while its upstream was down"
        assert proxy.readyz() != 200, "/readyz is 200 with no reachable upstream"
        time.sleep(0.1)

    b = own_broker(port=port)
    assert b.node_ids == node_ids
    try:
        proxy.wait_ready(30)
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"proxy did not become ready after the upstream came up: {e}")
    assert proxy.metrics().sum(UPSTREAM_ERRORS) > 0, "connect refused was not counted"

    topic = topic_name("late")
    create_topics(proxy.bootstrap, [topic])
    produce(proxy.bootstrap, topic, [(None, b"hello")])
    assert consume_assign(proxy.bootstrap, topic, count=1)[0].value() == b"hello"


def test_stalled_broker_then_recovers(own_broker, proxy_factory):
    """A broker that stops answering (SIGSTOP) and comes back: nothing is acknowledged
    while it is stalled, the admin endpoints stay responsive, and afterwards every
    message arrives exactly once and in order (idempotent producer)."""
    broker = own_broker()
    proxy = proxy_factory([broker.bootstrap], node_ids=broker.node_ids)
    topic = topic_name("stall")
    create_topics(proxy.bootstrap, [topic])
    p = new_producer(proxy.bootstrap, **{"enable.idempotence": True, "message.timeout.ms": 60000, "linger.ms": 0})
    produce(proxy.bootstrap, topic, [(None, f"m{i}".encode()) for i in range(10)], producer=p)

    acked = []
    broker.pause()
    try:
        for i in range(10, 20):
            p.produce(topic, value=f"m{i}".encode(), partition=0, on_delivery=lambda err, msg: acked.append(err))
        t_end = time.monotonic() + 2.0
        while time.monotonic() < t_end:
            p.poll(0.1)
        assert not [e for e in acked if e is None], "acknowledged while the broker was stalled"
        t0 = time.monotonic()
        m = proxy.metrics()  # the admin listener does not depend on the upstream
        assert time.monotonic() - t0 < 2.0
        assert m.sum("mirrorguard_requests_total", api="Produce") > 0
        assert proxy.alive()
    finally:
        broker.resume()
    assert p.flush(45) == 0
    assert acked == [None] * 10, f"delivery results after recovery: {acked}"
    got = consume_assign(proxy.bootstrap, topic, count=20)
    assert [m.value() for m in got] == [f"m{i}".encode() for i in range(20)]
