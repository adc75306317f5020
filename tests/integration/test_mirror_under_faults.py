"""Mirroring through network faults between mirrorguard and the source (issue 32's fault
proxy, SPEC 8): an Apache Kafka 4.4 source behind a Toxiproxy proxy (it advertises the
proxy's port to mirrorguard, and keeps a direct listener for the producer and the harness),
mirrored by the Kafka-engine destination's fetcher through mirrorguard, while the proxy
resets every connection, adds latency, and black-holes the traffic past mirrorguard's
upstream request timeout. Records keep arriving on the source meanwhile.

Whatever the faults, the destination log must be the source log: every record at its
source offset, none lost, none twice, in order; mirrorguard stays up, tells the operator
(upstream errors in its metrics), and the fetcher recovers on its own once the fault ends.
With transactions committed and aborted across the faults, every marker lands at its source
offset too, and the destination holds no transaction open (last stable offset = log end) and
exactly the source's aborted transactions.
"""

from __future__ import annotations

import time

import harness
import rawkafka
from kafka_dest import kafka_dest_factory  # noqa: F401 - fixture
from mirror_harness import (  # noqa: F401 - mirror_factory is a fixture
    MirrorSpec,
    high_watermark,
    idempotent_producer,
    mirror_factory,
    send,
    transactional_producer,
)

MIRROR = "a-to-b"
PARTITIONS = 2


def _topology(fault_proxy, kafka_factory, kafka_dest_factory, mirror_factory, name: str):
    """A one-node source behind a fault proxy, a topic of PARTITIONS, the Kafka-engine
    destination and one mirrorguard reaching the source through the proxy (state on the
    source's direct listener)."""
    broker_port = harness.free_port()
    px = fault_proxy.proxy("source-1", upstream_port=broker_port)
    a = kafka_factory(name="A", port=broker_port, behind_proxy={1: px.port})
    T = harness.topic_name(name)
    harness.create_topics(a.bootstrap, [T], partitions=PARTITIONS)
    dest = kafka_dest_factory("B")
    # Through the proxy; a request the black hole swallows is given up after 2 s.
    spec = MirrorSpec(MIRROR, px.address, node_ids=[1], extra="upstream_request_timeout_ms = 2000")
    mg = mirror_factory(a.bootstrap, [spec])
    mg.wait_sources_known()
    return px, a, T, dest, spec, mg


def test_resets_latency_and_a_black_hole_lose_and_repeat_nothing(fault_proxy, kafka_factory, kafka_dest_factory,
                                                                  mirror_factory):  # noqa: F811
    px, a, T, dest, spec, mg = _topology(fault_proxy, kafka_factory, kafka_dest_factory, mirror_factory, "faults")

    producer = idempotent_producer(a.bootstrap)  # the direct listener: no faults on this path
    sent: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}

    def write(round_: str, n: int = 25) -> None:
        for p in range(PARTITIONS):
            values = [b"%s-%d-%d" % (round_.encode(), p, i) for i in range(n)]
            send(producer, T, values, partition=p)
            sent[p] += values

    f = dest.mirror("f", spec.bootstrap, [(T, p) for p in range(PARTITIONS)], request_timeout_ms=10000,
                    max_wait_ms=200)

    def caught_up(timeout: float = 30.0) -> None:
        for p in range(PARTITIONS):
            f.catch_up(T, len(sent[p]), partition=p, timeout=timeout)

    write("before")
    caught_up()
    errors_before = mg.metrics().sum("mirrorguard_upstream_errors_total")

    # Every connection to the source reset as soon as data moves, new ones too.
    with px.toxic("reset_peer", timeout=0):
        write("reset")
        time.sleep(2)
    caught_up()
    # Slow but working: 300 +/- 100 ms each way.
    with px.toxic("latency", latency=300, jitter=100):
        write("latency")
        caught_up()
    # A black hole in both directions, longer than the upstream request timeout.
    with px.toxic("timeout", timeout=0), px.toxic("timeout", stream="upstream", timeout=0):
        write("black-hole")
        time.sleep(4)
    caught_up()
    write("after")
    caught_up()

    for p in range(PARTITIONS):
        assert high_watermark(a.bootstrap, T, p) == len(sent[p])
        got = dest.values(T, p)
        assert [o for o, _ in got] == list(range(len(sent[p]))), (p, [o for o, _ in got])
        assert [v for _, v in got] == sent[p], p
    assert mg.proc.alive(), "mirrorguard exited"
    errors = mg.metrics().sum("mirrorguard_upstream_errors_total") - errors_before
    rep = f.report()
    print(f"records per partition {len(sent[0])}; mirrorguard upstream errors {errors}; fetcher connects "
          f"{rep['connects']}, timeouts {rep['timeouts']}, errors {rep['errors']}")
    assert errors > 0, "the faults never reached mirrorguard's upstream side"
    assert "panicked" not in mg.log_text()
    f.stop()


def test_transactions_across_the_faults_land_with_their_markers(fault_proxy, kafka_factory, kafka_dest_factory,
                                                                mirror_factory):  # noqa: F811
    px, a, T, dest, spec, mg = _topology(fault_proxy, kafka_factory, kafka_dest_factory, mirror_factory, "txfaults")
    tp = transactional_producer(a.bootstrap, f"tx-{T}")  # direct listener
    errors_before = mg.metrics().sum("mirrorguard_upstream_errors_total")
    aborted = {p: 0 for p in range(PARTITIONS)}
    n_txn = 0

    def transactions(count: int) -> None:
        """`count` transactions over every partition, committed and aborted in turn."""
        nonlocal n_txn
        for _ in range(count):
            tp.begin_transaction()
            for p in range(PARTITIONS):
                for i in range(3):
                    tp.produce(T, value=b"t%d-%d-%d" % (n_txn, p, i), partition=p)
            # Written before the abort too, so each aborted transaction has data in each
            # partition (an abort purges what is unsent).
            assert tp.flush(20) == 0
            if n_txn % 2:
                tp.abort_transaction(20)
                for p in range(PARTITIONS):
                    aborted[p] += 1
            else:
                tp.commit_transaction(20)
            n_txn += 1

    f = dest.mirror("f", spec.bootstrap, [(T, p) for p in range(PARTITIONS)], request_timeout_ms=10000,
                    max_wait_ms=200)

    def caught_up() -> None:
        for p in range(PARTITIONS):
            f.catch_up(T, high_watermark(a.bootstrap, T, p), partition=p, timeout=30)

    transactions(4)
    caught_up()
    with px.toxic("reset_peer", timeout=0):
        transactions(4)
        time.sleep(1)
    with px.toxic("latency", latency=200, jitter=50):
        transactions(4)
        caught_up()
    with px.toxic("timeout", timeout=0), px.toxic("timeout", stream="upstream", timeout=0):
        transactions(4)
        time.sleep(3)
    transactions(2)
    caught_up()

    host, port = a.bootstrap.rsplit(":", 1)
    kinds = {0: "ABORT", 1: "COMMIT"}
    for p in range(PARTITIONS):
        src, _ = rawkafka.fetch_all_batches(host, int(port), T, p)
        want = [(b.base_offset, kinds[b.control_type()] if b.is_control else "DATA", b.record_count) for b in src]
        got = [(b["base_offset"], b["kind"], b["last_offset"] - b["base_offset"] + 1)
               for b in dest.batches(T, p, values=False)]
        assert got == want, (p, got, want)
        src_values = [(b.base_offset, b.record_count) for b in src if not b.is_control]
        assert sum(c for _, c in src_values) == 3 * n_txn
        st = dest.state(T, p)
        assert st["last_stable_offset"] == st["log_end_offset"] == high_watermark(a.bootstrap, T, p), st
        assert len(st["aborted_txns"]) == aborted[p], st["aborted_txns"]
    assert mg.proc.alive(), "mirrorguard exited"
    assert "panicked" not in mg.log_text()
    assert mg.metrics().sum("mirrorguard_upstream_errors_total") > errors_before, \
        "the faults never reached mirrorguard's upstream side"
    f.stop()
