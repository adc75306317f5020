"""The reference destination, built from Kafka's own parts (tests/kafka-dest, Java 17).

No released broker mirrors across clusters (SPEC section 7), so the destination of the
mirror tests is a stand-in: a Java process that holds destination partitions as Kafka 4.4
``UnifiedLog``s (mirrored batches go through ``appendAsFollower``, the REPLICATION origin, so
Kafka's LogValidator, ProducerStateManager, last stable offset, snapshots and recovery
decide) and feeds them with a fetcher that behaves like a broker's: multi-partition Fetch
with incremental fetch sessions (Kafka's ``FetchSessionHandler``), one request in flight,
re-fetch after a lost response, restart from the log end.

Use::

    dest = KafkaDest(tmp_path, "B").start()          # or the kafka_dest_factory fixture
    f = dest.mirror("a-to-b", bootstrap, [("t", 0), ("t", 1)])
    f.catch_up("t", 6)                               # fetch position of t-0 reaches 6
    f.report()["session_id"], f.report()["errors"]   # fetch session, error counts
    f.drop_next()                                    # lose the next response on purpose
    dest.state("t")                                  # LEO, HW, LSO, producers, markers, epochs
    dest.batches("t")                                # what the log holds, batch by batch
    dest.warnings()                                  # Kafka's WARN lines
    f.stop(); dest.close_log("t")                    # hand the directory to a broker
    dest.kill(); dest.start()                        # crash, then Kafka's log recovery

Replication and truncation between simulated brokers (each its own UnifiedLog replica)::

    dest.listen([1, 2, 3])                           # a Kafka listener per broker: ApiVersions,
    dest.bootstrap                                   # Metadata, ListOffsets (the HW) on loopback
    dest.open("t", 0); dest.replicate("t", [1, 2, 3], leader=1)
    f = dest.mirror("b1", via_a, [("t", 0)], broker=1)   # the leader's fetcher
    dest.pause_replication("t", 2)                   # broker 2's copy lags: unreplicated records
    dest.move_leader("t", 2)                         # 2 leads; 1 and 3 truncate to it

Built by scripts/install-test-deps.sh into .tools/kafka-dest; runs on .tools/kafka/libs.
"""

from __future__ import annotations

import base64
import json
import os
import select
import signal
import struct
import subprocess
import time
from pathlib import Path

import crc32c
import pytest

import harness
from harness import HarnessError
from rawkafka import MIRROR_PID_RESET_TYPE, uvarint

ROOT = harness.ROOT
JAR = Path(os.environ.get("KAFKA_DEST_JAR", ROOT / ".tools" / "kafka-dest" / "build" / "kafka-dest.jar"))
LIBS = ROOT / ".tools" / "kafka" / "libs"
LOG4J = ROOT / "tests" / "kafka-dest" / "log4j2.properties"
JVM_OPTS = ["-Xms64m", "-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xss512k",
            "-Djava.awt.headless=true"]


class KafkaDestError(HarnessError):
    """The Java side answered ok=false (the message is Kafka's exception)."""


def available() -> bool:
    return JAR.exists() and (LIBS / "kafka-storage-4.4.0.jar").exists()


class KafkaDest:
    """One reference destination process (several partitions, several fetchers)."""

    def __init__(self, work_dir: Path, name: str = "dest"):
        self.name = name
        self.dir = Path(work_dir) / f"kafka-dest-{name}"
        self.data_dir = self.dir / "data"
        self.log_path = Path(work_dir) / f"kafka-dest-{name}.log"
        self.proc: subprocess.Popen | None = None
        self._log = None
        self.clean_start: bool | None = None
        # Simulated broker id -> its Kafka listener's port (listen()).
        self.ports: dict[int, int] = {}
        # Broker ids of listeners that answer for renamed topics (listen(aliases=...)).
        self.aliased: dict[int, dict[str, str]] = {}

    # ------------------------------------------------------------ process

    def start(self, timeout: float = 30.0) -> "KafkaDest":
        if not available():
            raise HarnessError(f"{JAR} missing: run scripts/install-test-deps.sh")
        self.dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        argv = ["java", *JVM_OPTS, f"-Dlog4j2.configurationFile={LOG4J}", "-cp", f"{JAR}:{LIBS}/*",
                "dev.mirrorguard.kafkadest.KafkaDest", "--dir", str(self.data_dir)]
        self._log.write(f"$ {' '.join(argv)}\n".encode())
        self._log.flush()
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     start_new_session=True)
        ready = self._read(timeout)
        if not ready.get("ready"):
            raise HarnessError(f"kafka-dest {self.name} did not start: {ready}")
        self.clean_start = ready["clean_start"]
        if self.ports:
            # A restart: the simulated brokers listen on the ports they had.
            self.listen(sorted(self.ports))
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _read(self, timeout: float) -> dict:
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        buf = b""
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"kafka-dest {self.name}: no answer in {timeout}s\n{self.log_text()[-4000:]}")
            r, _, _ = select.select([fd], [], [], left)
            if not r:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise HarnessError(f"kafka-dest {self.name} exited ({self.proc.poll()}):\n{self.log_text()[-4000:]}")
            buf += chunk
        return json.loads(buf)

    def call(self, cmd: str, timeout: float = 30.0, **args) -> dict:
        """One command; raises KafkaDestError when the Java side answered ok=false."""
        if not self.alive():
            raise HarnessError(f"kafka-dest {self.name} is not running")
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({"cmd": cmd, **args}) + "\n").encode())
        self.proc.stdin.flush()
        out = self._read(timeout)
        if not out.get("ok"):
            raise KafkaDestError(f"{cmd}: {out.get('error')}")
        return out

    def stop(self, timeout: float = 20.0) -> None:
        """Clean shutdown: fetchers stopped, logs flushed and closed (producer snapshots
        written), the clean-shutdown marker left for the next start."""
        if self.alive():
            try:
                self.call("shutdown", timeout=timeout)
            except (HarnessError, TimeoutError, OSError):
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close_files()

    def kill(self) -> None:
        """SIGKILL (a crash): the next start runs Kafka's log recovery."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)
        self._close_files()

    def _close_files(self) -> None:
        if self.proc is not None:
            for f in (self.proc.stdin, self.proc.stdout):
                try:
                    if f:
                        f.close()
                except OSError:
                    pass
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    # ------------------------------------------------------------ brokers

    def listen(self, brokers: list[int] | None = None) -> "KafkaDest":
        """Starts a Kafka listener (loopback) per simulated broker id: ApiVersions, Metadata
        (brokers, open partitions with topic ids, leaders, replicas) and ListOffsets (LATEST
        READ_UNCOMMITTED is the high watermark) with Kafka's own request/response classes.
        Ports are kept across a restart of the process."""
        ids = brokers or [0]
        for i in ids:
            out = self.call("listen", brokers=[i], ports=[self.ports.get(i, 0)], aliases=self.aliased.get(i, {}))
            self.ports.update({int(k): v for k, v in out["ports"].items()})
        return self

    def listen_as(self, aliases: dict[str, str]) -> str:
        """A listener of its own (a destination cluster of its own) that answers for the
        stand-in's topics under other names ({name asked: stand-in topic}): a stand-in that
        plays several destination clusters renames a mirrored topic (source_topic), which
        mirrorguard knows by the mirror's own destination name. Returns its bootstrap."""
        broker = 1000 + len(self.aliased)
        self.aliased[broker] = dict(aliases)
        self.listen([broker])
        return f"{harness.HOST}:{self.ports[broker]}"

    @property
    def bootstrap(self) -> str:
        """The simulated brokers' listeners, for a client of the destination."""
        plain = sorted((i, p) for i, p in self.ports.items() if i not in self.aliased)
        assert plain, "listen() first"
        return ",".join(f"{harness.HOST}:{p}" for _, p in plain)

    def replicate(self, topic: str, brokers: list[int], partition: int = 0, leader: int | None = None) -> dict:
        """Gives topic-partition a replica (a UnifiedLog of its own) on each of `brokers`
        (the existing log is broker 0's, or the leader's); followers copy the leader's log
        every 20 ms and the leader's high watermark is the smallest log end of them all.
        `leader`: move the leadership there first (before any record)."""
        st = self.call("replicate", topic=topic, partition=partition, replicas=brokers)["state"]
        if leader is not None and st["leader"] != leader:
            st = self.move_leader(topic, leader, partition)["state"]
        return st

    def pause_replication(self, topic: str, broker: int, partition: int = 0, paused: bool = True,
                          upto: int | None = None) -> dict:
        """Stops (or resumes) copying the leader's log to `broker`'s replica; with `upto`,
        it still copies whole batches below that offset."""
        return self.call("pause_replication", topic=topic, partition=partition, broker=broker,
                         paused=paused, upto=upto)["state"]

    def move_leader(self, topic: str, leader: int, partition: int = 0) -> dict:
        """Leadership moves to `leader`: the others truncate to its log (Kafka's leader
        epoch cache decides where). Returns {move: {truncated: {broker: records lost}, ...},
        state}."""
        return self.call("move_leader", topic=topic, partition=partition, leader=leader)

    # ------------------------------------------------------------ partitions

    def open(self, topic: str, partition: int = 0, topic_id: str | None = None) -> dict:
        """Opens (or creates) the UnifiedLog of topic-partition; `topic_id` is Kafka's base64
        Uuid text (a promoted broker must own it: create the topic there first)."""
        args = {"topic": topic, "partition": partition}
        if topic_id:
            args["topic_id"] = topic_id
        return self.call("open", **args)["state"]

    def partitions(self) -> list[dict]:
        return self.call("list")["partitions"]

    def state(self, topic: str, partition: int = 0) -> dict:
        """log_end_offset, high_watermark, last_stable_offset, first_unstable_offset,
        producers {pid: {epoch, last_sequence, open_txn_first_offset, batches
        [[firstSeq, lastSeq, firstOffset, lastOffset]]}}, markers [{offset, producer_id,
        type, closed_txn_first_offset}], aborted_txns, leader_epochs [[epoch, start]],
        segments, failed."""
        st = self.call("state", topic=topic, partition=partition)["state"]
        st["producers"] = {int(k): v for k, v in st["producers"].items()}
        return st

    def batches(self, topic: str, partition: int = 0, values: bool = True) -> list[dict]:
        out = self.call("batches", topic=topic, partition=partition, values=values)["batches"]
        for b in out:
            if "values" in b:
                b["values"] = [None if v is None else base64.b64decode(v) for v in b["values"]]
        return out

    def values(self, topic: str, partition: int = 0) -> list[tuple[int, bytes]]:
        """(offset, value) of every data record in the log (read_uncommitted view)."""
        out = []
        for b in self.batches(topic, partition):
            for i, v in enumerate(b.get("values", [])):
                out.append((b["base_offset"] + i, v))
        return out

    def append(self, topic: str, raw: bytes, partition: int = 0) -> dict:
        """appendAsFollower of raw batches (REPLICATION origin); the answer's `state` is as
        state() returns it."""
        out = self.call("append", topic=topic, partition=partition, records=base64.b64encode(raw).decode())
        out["state"]["producers"] = {int(k): v for k, v in out["state"]["producers"].items()}
        return out

    def produce(self, topic: str, raw: bytes, partition: int = 0, leader_epoch: int | None = None) -> dict:
        """appendAsLeader(CLIENT) of a local producer's batch on the stand-in's own log (an
        in-place promotion). Returns {error: exception name or None, message, first_offset,
        last_offset, stored (False for a duplicate: acknowledged, nothing written), state}."""
        args = {"topic": topic, "partition": partition, "records": base64.b64encode(raw).decode()}
        if leader_epoch is not None:
            args["leader_epoch"] = leader_epoch
        out = self.call("produce", **args)
        if "state" in out:
            out["state"]["producers"] = {int(k): v for k, v in out["state"]["producers"].items()}
        return out

    def expire_producers(self, topic: str, now_ms: int, partition: int = 0) -> dict:
        """UnifiedLog.removeExpiredProducers(now_ms): what a broker's periodic check does."""
        st = self.call("expire_producers", topic=topic, partition=partition, now_ms=now_ms)["state"]
        st["producers"] = {int(k): v for k, v in st["producers"].items()}
        return st

    def close_log(self, topic: str, partition: int = 0) -> dict:
        """Flushes and closes the log (producer snapshot at the log end); the directory can
        then be handed to a broker."""
        return self.call("close_log", topic=topic, partition=partition)["state"]

    def partition_dir(self, topic: str, partition: int = 0) -> Path:
        return self.data_dir / f"{topic}-{partition}"

    def segment(self, topic: str, partition: int = 0) -> Path:
        return self.partition_dir(topic, partition) / "00000000000000000000.log"

    def logs(self, since: int = 0) -> list[dict]:
        return self.call("logs", since=since)["lines"]

    def warnings(self) -> list[str]:
        """Kafka's WARN and ERROR lines since the process started."""
        return [x["message"] for x in self.logs() if x["level"] in ("WARN", "ERROR")]

    # ------------------------------------------------------------ fetchers

    def mirror(self, name: str, bootstrap: str, partitions: list, **opts) -> "MirrorFetcher":
        """Starts a fetcher thread. `partitions`: (topic, partition) tuples or dicts with
        topic, partition, source_topic, rebase, source_offset, topic_id. Options:
        replica_id (-1), sessions (True), max_wait_ms (100), request_timeout_ms (5000),
        max_bytes, max_fetch_version, last_fetched_epoch (True), broker (the simulated broker
        it runs on: it appends only to partitions that broker leads; default: any)."""
        parts = []
        for p in partitions:
            if isinstance(p, tuple):
                p = {"topic": p[0], "partition": p[1]}
            elif isinstance(p, str):
                p = {"topic": p, "partition": 0}
            parts.append(p)
        self.call("mirror", name=name, bootstrap=bootstrap, partitions=parts, **opts)
        return MirrorFetcher(self, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def dest_hw_bootstrap(dest: KafkaDest) -> str:
    """The stand-in's Kafka listener (started on first use): where mirrorguard reads the
    destination's high watermark (MirrorSpec.destination_hw)."""
    if not any(i not in dest.aliased for i in dest.ports):
        dest.listen()
    return dest.bootstrap


class MirrorFetcher:
    """Handle of one fetcher thread in a KafkaDest."""

    def __init__(self, dest: KafkaDest, name: str):
        self.dest = dest
        self.name = name

    def report(self) -> dict:
        """requests, full_requests, incremental_requests, responses, dropped, timeouts,
        connects, session_errors, errors {ERROR_NAME: n}, session_id, session_epoch,
        fetch_version, partitions [{topic, partition, position, source_high_watermark,
        failed, ...}], running."""
        return self.dest.call("fetcher", name=self.name)["fetcher"]

    def position(self, topic: str, partition: int = 0) -> int:
        for p in self.report()["partitions"]:
            if p["topic"] == topic and p["partition"] == partition:
                return p["position"]
        raise KeyError((topic, partition))

    def catch_up(self, topic: str, offset: int, partition: int = 0, timeout: float = 15.0) -> dict:
        """Waits until the fetch position of topic-partition reaches `offset` (the LEO, or
        the source offset for a rebased link); raises with the report otherwise."""
        out = self.dest.call("wait", name=self.name, topic=topic, partition=partition, offset=offset,
                             timeout_ms=int(timeout * 1000), timeout=timeout + 10)
        if not out["reached"]:
            raise TimeoutError(f"fetcher {self.name}: {topic}-{partition} did not reach {offset} in {timeout}s: "
                               f"{out['fetcher']}")
        return out["fetcher"]

    def follow(self, until, timeout: float = 15.0, what: str = "condition") -> None:
        """Waits (the fetcher runs on its own) until `until()` holds."""
        harness.wait_until(until, timeout, interval=0.05, what=f"fetcher {self.name}: {what}")

    def drop_next(self, count: int = 1, mode: str = "drop") -> dict:
        """Loses the next `count` responses: 'drop' reads and discards them, 'timeout' waits
        out the request timeout without reading; either way the connection is closed and
        FetchSessionHandler.handleError runs, so the next request is a full re-fetch.
        'lose_leadership' loses the next response that carries records and stops the
        fetcher (a broker that lost the partition's leadership with the response in hand;
        start another fetcher to take over from the log end)."""
        return self.dest.call("drop_next", name=self.name, count=count, mode=mode)["fetcher"]

    def stop(self) -> dict:
        return self.dest.call("stop_fetcher", name=self.name)["fetcher"]


@pytest.fixture
def kafka_dest_factory(tmp_path, request):
    """Starts KafkaDest processes; all are stopped at teardown (their logs are shown on a
    failure)."""
    made: list[KafkaDest] = []

    def make(name: str = "dest", start: bool = True) -> KafkaDest:
        d = KafkaDest(tmp_path, name)
        made.append(d)
        try:
            from conftest import _register_log

            _register_log(request, f"kafka-dest-{name}", d.log_path)
        except ImportError:
            pass
        return d.start() if start else d

    yield make
    harness.close_clients()
    for d in made:
        d.stop()


# --------------------------------------------------------------------------
# raw batches for engine-level checks (what a client or a coordinator would write)


def _varint(v: int) -> bytes:
    return uvarint((v << 1) ^ (v >> 63))


def _record(i: int, key: bytes | None, value: bytes | None) -> bytes:
    body = (b"\x00" + _varint(0) + _varint(i)
            + (_varint(-1) if key is None else _varint(len(key)) + key)
            + (_varint(-1) if value is None else _varint(len(value)) + value) + _varint(0))
    return _varint(len(body)) + body


def _batch(records: bytes, count: int, attrs: int, pid: int, epoch: int, seq: int, base_offset: int,
           leader_epoch: int, ts: int) -> bytes:
    after_crc = (struct.pack(">hiqqqhii", attrs, count - 1, ts, ts, pid, epoch, seq, count) + records)
    crc = crc32c.crc32c(after_crc)
    body = struct.pack(">ibI", leader_epoch, 2, crc) + after_crc
    return struct.pack(">qi", base_offset, len(body)) + body


def data_batch(values: list[bytes], pid: int = -1, epoch: int = -1, seq: int = -1, transactional: bool = False,
               base_offset: int = 0, leader_epoch: int = 0, ts: int | None = None) -> bytes:
    """An uncompressed magic-2 data batch, CRC-32C computed."""
    recs = b"".join(_record(i, None, v) for i, v in enumerate(values))
    ts = int(time.time() * 1000) if ts is None else ts
    return _batch(recs, len(values), 0x10 if transactional else 0, pid, epoch, seq, base_offset, leader_epoch, ts)


def control_batch(pid: int, epoch: int, ctype: int, base_offset: int = 0, leader_epoch: int = 0,
                  coordinator_epoch: int = 0, value: bytes | None = None, ts: int | None = None) -> bytes:
    """A control batch (attributes transactional|control): ctype 0 ABORT, 1 COMMIT, others raw."""
    key = struct.pack(">hh", 0, ctype)
    if value is None:
        value = struct.pack(">hi", 0, coordinator_epoch)
    ts = int(time.time() * 1000) if ts is None else ts
    return _batch(_record(0, key, value), 1, 0x30, pid, epoch, -1, base_offset, leader_epoch, ts)


def barrier_batch(source_cluster_id: str, base_offset: int = 0, leader_epoch: int = 0,
                  ts: int | None = None) -> bytes:
    """A MIRROR_PID_RESET barrier (SPEC 2.3): control only (not transactional), PID,
    epoch and sequence -1, one record with key (0, 7) and value version 0 + compact
    SourceClusterId + no tags."""
    key = struct.pack(">hh", 0, MIRROR_PID_RESET_TYPE)
    cid = source_cluster_id.encode()
    value = struct.pack(">h", 0) + uvarint(len(cid) + 1) + cid + uvarint(0)
    ts = int(time.time() * 1000) if ts is None else ts
    return _batch(_record(0, key, value), 1, 0x20, -1, -1, -1, base_offset, leader_epoch, ts)


# --------------------------------------------------------------------------
# promotion: the stand-in's log handed to a real Kafka 4.4 broker


def topic_id_of(bootstrap: str, topic: str) -> str:
    """The topic id a Kafka cluster gave `topic` (Kafka's base64 text)."""
    import rawkafka
    from mirror_harness import cluster_id_text

    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    with rawkafka.Connection(host, int(port), timeout=5) as c:
        ids, _ = rawkafka.topic_ids_v12(c, [topic])
    return cluster_id_text(ids[topic])


def prepare_promotion(cluster, topic: str, partitions: int = 1) -> str:
    """Creates `topic` on the broker that will take the log over and returns its topic id:
    CreateTopics cannot choose an id, and a log whose partition.metadata names another id
    is renamed ``-stray`` and deleted at start-up, so the stand-in's log must be built
    with this one (``KafkaDest.open(topic, topic_id=...)``)."""
    harness.create_topics(cluster.bootstrap, [topic], partitions=partitions)
    return topic_id_of(cluster.bootstrap, topic)


def promote(dest: KafkaDest, cluster, topic: str, partition: int = 0, timeout: float = 60.0,
            snapshots: bool = True, recover: bool = False) -> dict:
    """Failover: the stand-in's partition directory becomes the broker's.

    The log is closed (flushed, producer snapshot at the log end), the single-node broker
    is stopped (controlled shutdown), its own (empty) partition directory is replaced by
    the stand-in's segments, indexes, producer snapshots, leader-epoch checkpoint and
    partition.metadata, and the broker starts again: its LogManager loads the log (clean
    shutdown: no recovery) and the partition becomes writable under the broker's own leader
    epoch. Returns the stand-in's last state of the partition.

    `snapshots`: copy the producer snapshots (a broker restart: producer state comes back
    from the snapshot at the log end, which keeps only each producer's last batch);
    `recover`: start the broker as after a crash, so Kafka rebuilds producer state from the
    segments (the state the stand-in held in memory; what an in-place promotion keeps).

    Kafka logs a WARN when the broker's leader epoch is below the source epochs the log
    carries (LeaderEpochFileCache); the caller can read it in the node's log."""
    import shutil

    assert len(cluster.nodes) == 1, "promotion is done on single-node destination clusters"
    st = dest.close_log(topic, partition)
    node = cluster.nodes[0]
    node.stop()
    target = node.data_dir / f"{topic}-{partition}"
    assert target.is_dir(), f"{target}: the topic must be created on the broker first (prepare_promotion)"
    meta = (target / "partition.metadata").read_text()
    mine = (dest.partition_dir(topic, partition) / "partition.metadata").read_text()
    assert meta == mine, f"topic ids differ: broker {meta!r}, stand-in {mine!r}"
    for f in target.iterdir():
        f.unlink()
    for f in dest.partition_dir(topic, partition).iterdir():
        if f.suffix == ".snapshot" and not snapshots:
            continue
        shutil.copy2(f, target / f.name)
    if recover:
        # As after a crash of the broker: no clean-shutdown marker, so LogLoader recovers the
        # segments above the recovery point and rebuilds producer state from the batches
        # (up to five batches per producer, as the stand-in held them in memory).
        (node.data_dir / ".kafka_cleanshutdown").unlink(missing_ok=True)
    node.restart(timeout)
    cluster.wait_brokers(1, timeout)

    def writable():
        import rawkafka

        with rawkafka.Connection(harness.HOST, node.port, timeout=2) as c:
            md = rawkafka.metadata_v1(c, [topic])
        return md.topics.get(topic, {}).get(partition, -1) == node.node_id

    harness.wait_until(writable, timeout, interval=0.2, what=f"{topic}-{partition} led by the promoted broker")
    return st


def kafka_dump_log(segment: Path, deep: bool = False) -> list[dict]:
    """Kafka's own kafka-dump-log (org.apache.kafka.tools.DumpLogSegments) of one segment:
    one dict per batch (its ``key: value`` pairs), with ``records`` when `deep`."""
    import re

    import kafka_broker

    argv = ["java", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            f"-Dlog4j2.configurationFile={kafka_broker.LOG4J_CONFIG}", "-cp", kafka_broker.classpath(),
            "org.apache.kafka.tools.DumpLogSegments", "--files", str(segment)]
    if deep:
        argv.append("--deep-iteration")
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True).stdout
    batches: list[dict] = []
    pair = re.compile(r"(\w+): (\S+)")
    for line in out.splitlines():
        if line.startswith("baseOffset:"):
            batches.append({k: v for k, v in pair.findall(line)} | {"records": []})
        elif line.startswith("| offset:") and batches:
            batches[-1]["records"].append({k: v for k, v in pair.findall(line)})
    return batches
