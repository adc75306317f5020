"""SIGTERM drains in-flight requests and exits 0 within the grace period."""

from __future__ import annotations

import signal
import threading
import time

from confluent_kafka import TopicPartition

import rawkafka
from harness import HOST, create_topics, new_consumer, new_producer, produce, topic_name


def test_sigterm_with_requests_in_flight(broker, proxy_factory):
    grace_ms = 4000
    proxy = proxy_factory([broker.bootstrap], shutdown_grace_ms=grace_ms, node_ids=broker.node_ids)
    topic = topic_name("term")
    parked = topic_name("parked")
    create_topics(proxy.bootstrap, [topic, parked])
    produce(proxy.bootstrap, topic, [(None, b"seed")])

    # A producer sending continuously and a consumer long-polling, both through the proxy.
    stop = threading.Event()
    acked = []
    failed = []
    p = new_producer(proxy.bootstrap, **{"linger.ms": 0, "message.timeout.ms": 5000, "retries": 0})

    def run_producer():
        i = 0
        while not stop.is_set():
            try:
                p.produce(
                    topic,
                    value=f"m{i}".encode(),
                    partition=0,
                    on_delivery=lambda err, msg: (failed if err else acked).append(err or msg.offset()),
                )
            except BufferError:
                pass
            i += 1
            p.poll(0.005)

    c = new_consumer(proxy.bootstrap, **{"group.id": "term", "fetch.wait.max.ms": 2000, "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])

    def run_consumer():
        while not stop.is_set():
            c.poll(0.1)

    threads = [threading.Thread(target=run_producer, daemon=True), threading.Thread(target=run_consumer, daemon=True)]
    for t in threads:
        t.start()
    # An idle raw connection that never sends a request must not hold shutdown up.
    idle = rawkafka.Connection(HOST, proxy.ports.bootstrap)
    # A raw long-poll Fetch at the end of the log: the broker holds it for max_wait.
    lp = rawkafka.Connection(HOST, proxy.ports.node_port, timeout=grace_ms / 1000 + 5)
    try:
        deadline = time.monotonic() + 15
        while len(acked) < 50:
            assert time.monotonic() < deadline, f"only {len(acked)} acked before SIGTERM; failures {failed[:3]}"
            time.sleep(0.02)

        result = {}

        def long_poll():
            # The empty topic has nothing to return: the broker holds the Fetch for max_wait.
            try:
                result["fetch"] = rawkafka.fetch_v4(lp, parked, 0, 0, max_wait_ms=1500)
            except Exception as e:  # noqa: BLE001
                result["error"] = e

        lpt = threading.Thread(target=long_poll, daemon=True)
        lpt.start()
        time.sleep(0.2)  # let the Fetch reach the broker (nothing to poll for: it is parked there)

        t0 = time.monotonic()
        proxy.proc.send_signal(signal.SIGTERM)
        # While it drains, it must not claim to be ready.
        ready_during_drain = []
        rc = None
        while time.monotonic() - t0 < grace_ms / 1000 + 3:
            rc = proxy.proc.wait(0.05)
            if rc is not None:
                break
            if proxy.readyz() == 200:
                ready_during_drain.append(round(time.monotonic() - t0, 3))
        elapsed = time.monotonic() - t0
        proxy.exit_code = rc
        lpt.join(5)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        idle.close()
        lp.close()
        c.close()
        p.purge()  # the proxy is gone: what is still queued will not be delivered
        p.flush(1)

    print(f"exit {rc} {elapsed:.2f}s after SIGTERM")
    assert rc == 0, f"exit code {rc} (None: still running {grace_ms / 1000 + 3}s after SIGTERM)"
    assert elapsed < grace_ms / 1000 + 1, f"took {elapsed:.1f}s to exit, grace is {grace_ms / 1000}s"
    assert not ready_during_drain, f"/readyz answered 200 after SIGTERM at {ready_during_drain} s"
    # The request that was in flight at SIGTERM was answered (drained), not cut off.
    assert "fetch" in result, f"in-flight Fetch not answered before exit: {result.get('error')!r}"
    assert result["fetch"].error_code == 0 and not result["fetch"].records, result["fetch"]
    assert len(acked) >= 50
