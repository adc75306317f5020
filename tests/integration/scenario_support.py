"""Support for the SPEC section 4 scenarios (tests/integration/test_scenarios.py and
scripts/demo_failover.py): variants, hops through mirrorguard or directly, the seal,
``mirrorguard dump`` parsing and librdkafka reads of a destination.

The destination is the reference destination of tests/refdest (stand-in for a stock
destination broker; tests and demo only). Sources, the state clusters and every client are
real (Tansu, librdkafka).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ (the refdest package)

import harness  # noqa: E402
from mirror_harness import MirrorSpec  # noqa: E402
from refdest import MirrorLink, ReferenceDestination  # noqa: E402,F401


@dataclass(frozen=True)
class Variant:
    """How a hop is made: without mirrorguard ("none"), or through a [[mirror]] listener
    with a PID mode; `aware` = the destination understands MIRROR_PID_RESET (KIP-1279)."""

    name: str
    pid_mode: str | None  # None: no mirrorguard
    layout: str = "high"
    aware: bool = False

    @property
    def guarded(self) -> bool:
        return self.pid_mode is not None


NONE = Variant("none", None)
HIGH = Variant("region-high", "region", "high")
SIGN_BIT = Variant("region-sign-bit", "region", "sign-bit")
PRESERVE_AWARE = Variant("preserve-aware", "preserve", "high", aware=True)
PRESERVE_STOCK = Variant("preserve-stock", "preserve", "high", aware=False)


@dataclass
class Hop:
    """One mirrored partition: source -> (mirrorguard) -> reference destination."""

    link: MirrorLink
    mg: object | None  # mirror_harness.MirrorGuard
    mirror: str | None
    topic: str
    state_bootstrap: str | None

    def seal(self, timeout: float = 15.0) -> dict:
        """SPEC 6 runbook step 1-2: POST /v1/partitions/stop, then the destination fetcher's
        own fetches take the cut and append the sealing batches until STOPPED."""
        assert self.mg is not None
        status, body = self.mg.post("stop", self.mirror, self.topic)
        assert status == 200, (status, body)
        self.link.follow(lambda _l: self.mg.partition(self.topic)["state"] == "STOPPED", timeout,
                         f"{self.mirror} {self.topic} STOPPED")
        return self.mg.partition(self.topic)


def make_hop(broker_factory, mirror_factory, variant: Variant, source_bootstrap: str, dest: ReferenceDestination,
             topic: str, name: str, *, source_cluster_id: str | None = None, state_bootstrap: str | None = None,
             mg=None, **link_kw) -> Hop:
    if not variant.guarded:
        return Hop(dest.mirror_from(source_bootstrap, topic, **link_kw), None, None, topic, None)
    if mg is None:
        if state_bootstrap is None:
            state = broker_factory()
            state_bootstrap = state.bootstrap
        # The destination topic must exist on the [state] cluster (salts, life cycle).
        harness.create_topics(state_bootstrap, [topic])
        mg = mirror_factory(state_bootstrap, [MirrorSpec(name, source_bootstrap, layout=variant.layout,
                                                         pid_mode=variant.pid_mode,
                                                         source_cluster_id=source_cluster_id)])
        mg.wait_sources_known()
    link = dest.mirror_from(mg.mirrors[name].bootstrap, topic, **link_kw)
    return Hop(link, mg, name, topic, state_bootstrap)


# ----------------------------------------------------------------------------- dump


def dump_json(mirrorguard_bin, segment: Path) -> list[dict]:
    out = subprocess.run([str(mirrorguard_bin), "dump", "--json", "--deep-iteration", str(segment)],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def dump_text(mirrorguard_bin, segment: Path) -> str:
    return subprocess.run([str(mirrorguard_bin), "dump", "--deep-iteration", str(segment)],
                          capture_output=True, text=True, timeout=30, check=True).stdout


def dump_kinds(mirrorguard_bin, segment: Path) -> list[tuple[int, str, int]]:
    """(baseOffset, data|commit|abort|barrier, producerId) per batch, from `mirrorguard dump`."""
    out = []
    for b in dump_json(mirrorguard_bin, segment):
        if b.get("type") != "batch":
            continue
        assert b["isValid"], b
        kind = "data"
        if b["isControl"]:
            kind = {"ABORT": "abort", "COMMIT": "commit", "MIRROR_PID_RESET": "barrier"}.get(
                b["control"]["type"], b["control"]["type"])
        out.append((b["baseOffset"], kind, b["producerId"]))
    return out


def barriers(mirrorguard_bin, segment: Path) -> list[tuple[int, str]]:
    """(offset, sourceClusterId) of every MIRROR_PID_RESET in the segment."""
    return [(b["baseOffset"], b["control"]["sourceClusterId"]) for b in dump_json(mirrorguard_bin, segment)
            if b.get("type") == "batch" and b["isControl"] and b["control"]["type"] == "MIRROR_PID_RESET"]


# ----------------------------------------------------------------------------- clients


def send_each(producer, topic: str, values: list[bytes], partition: int = 0, timeout: float = 15.0):
    """One record per batch (flush after each). Returns [(error, offset)] per record."""
    out = []
    for v in values:
        res = []
        producer.produce(topic, value=v, partition=partition, on_delivery=lambda e, m: res.append((e, m.offset())))
        left = producer.flush(timeout)
        assert left == 0 and res, f"{v!r} not delivered in {timeout}s"
        out.append(res[0])
    return out


def read_all(bootstrap: str, topic: str, isolation: str, partition: int = 0, timeout: float = 15.0,
             group: str = "scenario-reader") -> list[tuple[int, bytes]]:
    """Everything a librdkafka consumer (check.crcs=true) gets from offset 0 until
    end-of-partition (high watermark, or the last stable offset for read_committed)."""
    c = harness.new_consumer(bootstrap, **{"group.id": group, "enable.auto.commit": False,
                                           "enable.partition.eof": True, "fetch.wait.max.ms": 50,
                                           "check.crcs": True, "isolation.level": isolation})
    try:
        c.assign([TopicPartition(topic, partition, 0)])
        out = []
        deadline = time.monotonic() + timeout
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no end of partition {topic}-{partition} within {timeout}s (got {out})")
            for m in c.consume(num_messages=100, timeout=0.3):
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        return out
                    raise KafkaException(m.error())
                out.append((m.offset(), m.value()))
    finally:
        c.close()


def values(records) -> list[bytes]:
    return [v for _, v in records]


def anomalies(mg) -> list[dict]:
    return mg.get("/v1/anomalies")["anomalies"]
