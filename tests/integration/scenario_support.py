"""Support for the SPEC section 4 scenarios (tests/integration/test_scenarios.py and
scripts/demo_failover.py): variants, hops through mirrorguard or directly, the seal,
promotion to a real broker, dumps (Kafka's kafka-dump-log and ``mirrorguard dump``) and
librdkafka reads.

Sources, state clusters and promoted destinations are Apache Kafka 4.4 brokers; the
destination while it mirrors is the reference destination of kafka_dest.py (Kafka's own
UnifiedLog on the replication path, a broker-like fetcher), a stand-in because no released
broker mirrors across clusters (SPEC section 7).
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException, TopicPartition

import harness
from kafka_dest import KafkaDest, MirrorFetcher, dest_hw_bootstrap, kafka_dump_log  # noqa: F401
from mirror_harness import MirrorSpec


@dataclass(frozen=True)
class Variant:
    """How a hop is made: without mirrorguard ("none"), or through a [[mirror]] listener
    with a PID mode and layout."""

    name: str
    pid_mode: str | None  # None: no mirrorguard
    layout: str = "high"

    @property
    def guarded(self) -> bool:
        return self.pid_mode is not None


NONE = Variant("none", None)
HIGH = Variant("region-high", "region", "high")
SIGN_BIT = Variant("region-sign-bit", "region", "sign-bit")
PRESERVE_STOCK = Variant("preserve-stock", "preserve", "high")


@dataclass
class Hop:
    """One mirrored partition: source -> (mirrorguard) -> reference destination."""

    fetcher: MirrorFetcher
    dest: KafkaDest
    mg: object | None  # mirror_harness.MirrorGuard
    mirror: str | None
    topic: str
    partition: int = 0

    def catch_up(self, offset: int, timeout: float = 20.0) -> dict:
        return self.fetcher.catch_up(self.topic, offset, self.partition, timeout)

    def seal(self, timeout: float = 20.0) -> dict:
        """SPEC 6 runbook steps 1-2: POST /v1/partitions/stop; the destination fetcher's own
        fetches take the cut and append the sealing batches until STOPPED."""
        assert self.mg is not None
        status, body = self.mg.post("stop", self.mirror, self.topic)
        assert status == 200, (status, body)
        harness.wait_until(lambda: self.mg.partition(self.topic)["state"] == "STOPPED", timeout, interval=0.05,
                           what=f"{self.mirror} {self.topic} STOPPED")
        view = self.mg.partition(self.topic)
        self.catch_up(view["cut"] + view["seal_batches"], timeout)
        return view

    def stop(self) -> dict:
        """The destination stops mirroring (its fetcher is removed)."""
        return self.fetcher.stop()


def mirror_spec(name: str, source, variant: Variant, dest: KafkaDest | None = None) -> MirrorSpec:
    """The mirror's spec; with `dest` (the stand-in destination holding the log), a seal
    completes once the stand-in's high watermark passed its end (mirrorguard's default)."""
    return MirrorSpec(name, source.bootstrap, layout=variant.layout, pid_mode=variant.pid_mode or "region",
                      node_ids=list(source.node_ids),
                      destination_hw=None if dest is None else dest_hw_bootstrap(dest))



def start_mirrorguard(mirror_factory, state_bootstrap: str, specs: list[MirrorSpec], topics: list[str], **kw):
    # The state broker is also the destination cluster here (`destination_bootstrap`
    # defaults to `[state].bootstrap`): the destination topics are created there, and the
    # stand-in destination's logs carry their topic ids (kafka_dest.promote checks it).
    md = harness.admin(state_bootstrap).list_topics(timeout=10)
    missing = [t for t in topics if t not in md.topics]
    if missing:
        harness.create_topics(state_bootstrap, missing)
    return mirror_factory(state_bootstrap, specs, **kw)


def make_hop(mirror_factory, variant: Variant, source, dest: KafkaDest, topic: str, name: str, *,
             state_bootstrap: str | None = None, mg=None, partition: int = 0, guard_upstream: str | None = None,
             **opts) -> Hop:
    """A fetcher on `dest` for topic-partition, straight from `source` or through a
    mirror listener named `name` (a new mirrorguard unless `mg` is given)."""
    part = {"topic": topic, "partition": partition, **{k: opts.pop(k) for k in list(opts)
                                                         if k in ("rebase", "source_offset", "source_topic")}}
    source_topic = part.get("source_topic", topic)
    if not variant.guarded:
        return Hop(dest.mirror(name, source.bootstrap, [part], **opts), dest, None, None, topic, partition)
    if mg is None:
        assert state_bootstrap is not None
        spec = mirror_spec(name, source, variant, dest)
        if source_topic != topic:
            # The stand-in plays this hop's destination cluster under another topic name
            # than the mirror's own: a listener of its own answers for it by that name.
            spec.destination_hw = dest.listen_as({source_topic: topic})
        mg = start_mirrorguard(mirror_factory, state_bootstrap, [spec], [source_topic],
                               **({"guard_upstream": guard_upstream} if guard_upstream else {}))
        mg.wait_sources_known()
    return Hop(dest.mirror(name, mg.mirrors[name].bootstrap, [part], **opts), dest, mg, name, topic, partition)


# ----------------------------------------------------------------------------- dumps


def segments(partition_dir: Path) -> list[Path]:
    return sorted(partition_dir.glob("*.log"))


def mg_dump(mirrorguard_bin, segs: list[Path]) -> list[dict]:
    out = subprocess.run([str(mirrorguard_bin), "dump", "--json", "--deep-iteration", *map(str, segs)],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return [b for b in (json.loads(line) for line in out.splitlines() if line.startswith("{"))
            if b.get("type") == "batch"]


def kinds(mirrorguard_bin, partition_dir: Path) -> list[tuple[int, str, int]]:
    """(baseOffset, data|commit|abort|barrier, producerId) per batch, from `mirrorguard dump`
    of every segment of the partition."""
    out = []
    for b in mg_dump(mirrorguard_bin, segments(partition_dir)):
        assert b["isValid"], b
        kind = "data"
        if b["isControl"]:
            kind = {"ABORT": "abort", "COMMIT": "commit", "MIRROR_PID_RESET": "barrier"}.get(
                b["control"]["type"], str(b["control"]["type"]))
        out.append((b["baseOffset"], kind, b["producerId"]))
    return out


def barriers(mirrorguard_bin, partition_dir: Path) -> list[tuple[int, str]]:
    """(offset, sourceClusterId) of every MIRROR_PID_RESET in the partition."""
    return [(b["baseOffset"], b["control"]["sourceClusterId"]) for b in mg_dump(mirrorguard_bin, segments(partition_dir))
            if b["isControl"] and b["control"]["type"] == "MIRROR_PID_RESET"]


DUMP_FIELDS = [("baseOffset", int), ("lastOffset", int), ("producerId", int), ("producerEpoch", int),
               ("baseSequence", int), ("partitionLeaderEpoch", int), ("position", int), ("size", int),
               ("crc", int), ("count", int)]


def dumps_agree(mirrorguard_bin, partition_dir: Path) -> int:
    """Kafka's kafka-dump-log and `mirrorguard dump` of every segment agree on every batch
    (offsets, producer fields, leader epoch, position, size, CRC, flags, validity).
    Returns the number of batches compared."""
    n = 0
    for seg in segments(partition_dir):
        theirs = kafka_dump_log(seg)
        ours = mg_dump(mirrorguard_bin, [seg])
        assert len(theirs) == len(ours), (seg, len(theirs), len(ours))
        for k, m in zip(theirs, ours):
            for field, conv in DUMP_FIELDS:
                assert conv(k[field]) == m[field], (seg, field, k, m)
            assert (k["isTransactional"] == "true") == m["isTransactional"], (k, m)
            assert (k["isControl"] == "true") == m["isControl"], (k, m)
            assert k["isvalid"] == "true" and m["isValid"], (k, m)
            n += 1
    return n


# ----------------------------------------------------------------------------- clients


def idem(bootstrap: str, **conf):
    """An idempotent librdkafka producer; its client-level errors (a fatal one included)
    are kept in ``.errors`` instead of being raised from flush()."""
    errors: list = []
    p = harness.new_producer(bootstrap, **{"enable.idempotence": True, "linger.ms": 0,
                                           "message.timeout.ms": 15000, "error_cb": lambda e: errors.append(e), **conf})
    return _WithErrors(p, errors)


class _WithErrors:
    def __init__(self, p, errors):
        self._p = p
        self.errors = errors

    def __getattr__(self, name):
        return getattr(self._p, name)


def txn_producer(bootstrap: str, txn_id: str):
    p = harness.new_producer(bootstrap, **{"transactional.id": txn_id, "linger.ms": 0,
                                           "message.timeout.ms": 15000, "transaction.timeout.ms": 60000})
    p.init_transactions(20)
    return p


def txn(p, topic: str, values_: list[bytes], commit: bool | None):
    """commit=None leaves the transaction open."""
    p.begin_transaction()
    for v in values_:
        p.produce(topic, value=v, partition=0)
    assert p.flush(15) == 0
    if commit is True:
        p.commit_transaction(15)
    elif commit is False:
        p.abort_transaction(15)


def send_each(producer, topic: str, values_: list[bytes], partition: int = 0, timeout: float = 15.0):
    """One record per batch (flush after each). Returns [(error or None, offset)] per
    record; a fatal producer error ends the list early with that error."""
    out = []
    for v in values_:
        res = []

        def cb(err, msg, res=res):
            res.append((err, msg.offset() if err is None else -1))

        try:
            producer.produce(topic, value=v, partition=partition, on_delivery=cb)
            left = producer.flush(timeout)
        except (KafkaException, SystemError) as e:
            # A fatal producer error is raised out of flush() (chained when it surfaced in a
            # callback): the producer is dead.
            while not isinstance(e, KafkaException) and (e.__cause__ or e.__context__) is not None:
                e = e.__cause__ or e.__context__
            assert isinstance(e, KafkaException), e
            out.append((e.args[0], -1))
            return out
        assert left == 0 and res, f"{v!r} not delivered in {timeout}s"
        out.append(res[0])
        if res[0][0] is not None and res[0][0].fatal():
            return out
    return out


def end_offset(bootstrap: str, topic: str, partition: int = 0) -> int:
    """The high watermark (a consumer's ListOffsets LATEST)."""
    c = harness.new_consumer(bootstrap, **{"group.id": "scenario-probe", "enable.auto.commit": False,
                                           "isolation.level": "read_uncommitted"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1]
    finally:
        c.close()


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


def node_warnings(cluster, needle: str) -> list[str]:
    """WARN lines of a Kafka cluster's node logs that contain `needle`."""
    out = []
    for n in cluster.nodes:
        try:
            text = n.log_path.read_text(errors="replace")
        except OSError:
            continue
        out += [line for line in text.splitlines() if " WARN " in line and needle in line]
    return out
