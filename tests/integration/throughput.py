#!/usr/bin/env python3
"""Quick produce/consume throughput ratio, mirrorguard vs direct (not part of the suite).

Starts one Tansu broker and one mirrorguard in front of it, then with librdkafka:
produces N records of SIZE bytes directly and through the proxy (each into its own
topic), and consumes each topic both directly and through the proxy. Prints MB/s
for every leg and the proxy/direct ratios. Bounded: N defaults to 200,000 x 1 KiB.

    .tools/venv/bin/python tests/integration/throughput.py [--records N] [--size B]
    MIRRORGUARD_BIN=target/release/mirrorguard .tools/venv/bin/python tests/integration/throughput.py
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

import harness  # noqa: E402


def produce_leg(bootstrap: str, topic: str, n: int, size: int, partitions: int, timeout: float) -> float:
    p = Producer(
        harness.base_conf(
            bootstrap,
            **{
                "linger.ms": 5,
                "batch.size": 1_000_000,
                "queue.buffering.max.kbytes": 262144,
                "compression.type": "none",
                "acks": 1,
                "message.timeout.ms": int(timeout * 1000),
            },
        )
    )
    value = b"x" * size
    errors = []

    def cb(err, _msg):
        if err is not None:
            errors.append(err)

    deadline = time.monotonic() + timeout
    t0 = time.monotonic()
    for i in range(n):
        while True:
            try:
                p.produce(topic, value=value, partition=i % partitions, on_delivery=cb)
                break
            except BufferError:
                p.poll(0.01)
                if time.monotonic() > deadline:
                    raise TimeoutError("produce leg timed out")
        if i % 1000 == 0:
            p.poll(0)
    left = p.flush(max(1.0, deadline - time.monotonic()))
    elapsed = time.monotonic() - t0
    p.close()
    if left or errors:
        raise RuntimeError(f"produce leg: {left} undelivered, errors {errors[:3]}")
    return n * size / elapsed / 1e6


def consume_leg(bootstrap: str, topic: str, n: int, size: int, partitions: int, timeout: float) -> float:
    c = Consumer(
        harness.base_conf(
            bootstrap,
            **{
                "group.id": "throughput",
                "enable.auto.commit": False,
                "fetch.max.bytes": 52428800,
                "max.partition.fetch.bytes": 10485760,
                "queued.max.messages.kbytes": 262144,
            },
        )
    )
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got = 0
    deadline = time.monotonic() + timeout
    t0 = time.monotonic()
    while got < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"consume leg: {got} of {n} in {timeout}s")
        for m in c.consume(num_messages=10000, timeout=0.5):
            if m.error():
                raise RuntimeError(m.error())
            got += 1
    elapsed = time.monotonic() - t0
    c.close()
    return n * size / elapsed / 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=120.0, help="per leg")
    args = ap.parse_args()
    n, size, parts = args.records, args.size, args.partitions
    if not 0 < n <= 2_000_000 or not 0 < size <= 1 << 20:
        ap.error("records must be in 1..2,000,000 and size in 1..1 MiB")

    with tempfile.TemporaryDirectory(prefix="mg-throughput-") as d:
        work = Path(d)
        broker = harness.TansuBroker(work).start()
        proxy = None
        try:
            proxy = harness.Proxy(work, [broker.bootstrap], log_level="warn").start()
            print(f"mirrorguard: {harness.MIRRORGUARD_BIN}")
            print(f"{n} records x {size} B over {parts} partitions ({n * size / 1e6:.0f} MB per leg)")
            t_direct, t_proxy = "tp-direct", "tp-proxy"
            harness.create_topics(broker.bootstrap, [t_direct, t_proxy], partitions=parts)
            res = {}
            res["produce direct"] = produce_leg(broker.bootstrap, t_direct, n, size, parts, args.timeout)
            res["produce proxy"] = produce_leg(proxy.bootstrap, t_proxy, n, size, parts, args.timeout)
            # Each consume reads a topic written the other way too, alternating the order.
            res["consume direct"] = consume_leg(broker.bootstrap, t_direct, n, size, parts, args.timeout)
            res["consume proxy"] = consume_leg(proxy.bootstrap, t_direct, n, size, parts, args.timeout)
            res["consume proxy 2"] = consume_leg(proxy.bootstrap, t_proxy, n, size, parts, args.timeout)
            res["consume direct 2"] = consume_leg(broker.bootstrap, t_proxy, n, size, parts, args.timeout)
            for k, v in res.items():
                print(f"{k:18s} {v:8.1f} MB/s")
            prod_ratio = res["produce proxy"] / res["produce direct"]
            cons_ratio = (res["consume proxy"] + res["consume proxy 2"]) / (
                res["consume direct"] + res["consume direct 2"]
            )
            print(f"ratio proxy/direct: produce {prod_ratio:.2f}, consume {cons_ratio:.2f}")
        finally:
            harness.close_clients()
            if proxy is not None:
                rc = proxy.terminate()
                if rc != 0:
                    print(f"mirrorguard exit code after SIGTERM: {rc}", file=sys.stderr)
            broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
