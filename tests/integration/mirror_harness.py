"""Helpers for the mirror fetch path and failover tests (issues 4 and 5).

- ``MirrorGuard``: a mirrorguard process with ``[[mirror]]`` listeners, a ``[state]``
  cluster and an admin token; restartable (same config, new process) and killable (-9).
- ``mirror_factory``: a fixture that starts them and always stops them.
- Region mapping (SPEC 2.1) computed independently of the product.
- ``StandInFetcher``: a STAND-IN for a destination broker's mirror fetcher and log (SPEC 7):
  follower-style Fetch loop (v4 by name, v12 by name with LastFetchedEpoch, v13 by topic
  id) from its log end offset through the mirror listener; every batch it appends is
  checked with kafka-python's record-batch reader (CRC-32C, record structure, control
  records) and with the ``crc32c`` package.
- ``read_state_records``: ``__mirror_state`` read with a librdkafka consumer and decoded
  per SPEC 2.2 and the documented types 4 and 5 (independent Python decoder).

Only imports from harness.py / rawkafka.py (owned by another engineer).
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import struct
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import crc32c
import pytest
from confluent_kafka import KafkaException, TopicPartition
from kafka.record.default_records import DefaultRecordBatch

import harness
import rawkafka
from harness import HOST, TANSU_NODE_ID, HarnessError, ManagedProcess, wait_until
from rawkafka import NO_TAGS, Reader, compact_array, compact_string, i8, i16, i32, i64

# --------------------------------------------------------------------------
# region mapping (SPEC 2.1), computed here without the product


def cluster_id_bytes(cid: str) -> bytes:
    """Kafka base64 (22 chars, URL-safe, unpadded) or canonical UUID text -> 16 bytes."""
    if len(cid) == 36 and cid.count("-") == 4:
        return uuid.UUID(cid).bytes
    raw = base64.urlsafe_b64decode(cid + "=" * (-len(cid) % 4))
    assert len(raw) == 16, cid
    return raw


def cluster_id_text(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def fold(cid: str | bytes) -> int:
    raw = cid if isinstance(cid, bytes) else cluster_id_bytes(cid)
    msb, lsb = struct.unpack(">QQ", raw)
    return (msb ^ lsb) & 0xFFFFFFFF


def map_pid(pid: int, fold_value: int, salt: int = 0, layout: str = "high") -> int:
    """SPEC 2.1 for 0 <= pid < 2^31 (the only PIDs Tansu and fresh Kafka test clusters
    hand out in these tests)."""
    if pid == -1:
        return -1
    assert 0 <= pid < (1 << 31), pid
    if layout == "high":
        v = (1 << 62) | ((((fold_value + salt) & 0xFFFFFFFF) & 0x7FFFFFFF) << 31) | pid
    elif layout == "sign-bit":
        v = (1 << 63) | (((fold_value + salt) & 0xFFFFFFFF) << 31) | pid
    else:
        raise ValueError(layout)
    return struct.unpack(">q", struct.pack(">Q", v))[0]


def same_fold_pair() -> tuple[str, str]:
    """Two different Kafka-style cluster ids with equal folds: B = A with one 8-byte mask
    XORed into both halves (msb ^ lsb is unchanged)."""
    a = os.urandom(16)
    mask = os.urandom(8)
    b = bytes(x ^ mask[i % 8] for i, x in enumerate(a))
    assert a != b and fold(a) == fold(b)
    return cluster_id_text(a), cluster_id_text(b)


# --------------------------------------------------------------------------
# mirrorguard with [[mirror]] listeners


@dataclass
class MirrorSpec:
    name: str
    source_bootstrap: str
    layout: str = "high"
    pid_mode: str = "region"
    source_cluster_id: str | None = None
    bootstrap_port: int = 0
    node_port_base: int = 0
    # The source's broker node ids (Tansu is always 111; Kafka test clusters use 1, 2, 3).
    node_ids: list[int] = field(default_factory=lambda: [TANSU_NODE_ID])
    # The destination cluster when it is not the state cluster (`destination_bootstrap`).
    destination_bootstrap: str | None = None
    # Extra `key = value` lines for the [[mirror]] block (e.g. upstream_request_timeout_ms).
    extra: str = ""
    # Where a seal reads the destination's high watermark (`destination_hw_bootstrap`): the
    # stand-in's simulated brokers (KafkaDest.listen().bootstrap). Given, a partition is
    # STOPPED only once the destination's high watermark passed the seal's end (mirrorguard's
    # default rule).
    destination_hw: str | None = None
    # `stopped_when`, when a test chooses it. Left None without `destination_hw`, the harness
    # writes "fetcher_offset": the test's destination is a Python fetcher (session_fetcher.py
    # and friends) that writes no log, so there is no high watermark to wait for; every test
    # whose destination holds a log (the Kafka-engine stand-in) passes `destination_hw`.
    stopped_when: str | None = None
    # Who is the destination fetcher (SPEC 3, "Who moves a seal"). "ports" (the default):
    # `bootstrap` / `node_port_of` are the fetcher ports (`fetcher_bootstrap`,
    # `fetcher_node_port_base`), so whatever a test connects there is the fetcher, and
    # `reader_bootstrap` / `reader_node_port_of` are the mirror's other ports, for readers
    # that never move a seal. "any-reader": the loopback-only opt-in, one set of ports
    # where every reader is the fetcher (only the tests about that opt-in use it).
    fetcher_identity: str = "ports"
    reader_port: int = 0
    reader_node_port_base: int = 0

    @classmethod
    def of(cls, name: str, source, **kw) -> "MirrorSpec":
        """A spec for `source` (a KafkaCluster or TansuBroker): its bootstrap and node ids."""
        return cls(name, source.bootstrap, node_ids=list(source.node_ids), **kw)

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.bootstrap_port}"

    @property
    def node_port(self) -> int:
        """The proxy port of the first source node (the only one for single-node sources)."""
        return self.node_port_base + self.node_ids[0]

    def node_port_of(self, node_id: int) -> int:
        return self.node_port_base + node_id

    @property
    def reader_bootstrap(self) -> str:
        """The mirror listener's port for readers that are not the fetcher (with fetcher
        ports; with "any-reader" the one bootstrap)."""
        return f"{HOST}:{self.reader_port or self.bootstrap_port}"

    def reader_node_port_of(self, node_id: int) -> int:
        return (self.reader_node_port_base or self.node_port_base) + node_id


class MirrorGuard:
    """mirrorguard running mirror listeners; `restart()` starts a new process on the same
    config (same ports), `kill9()` kills it without any chance to clean up."""

    # At least 32 bytes and no placeholder: mirrorguard refuses anything else.
    TOKEN = "c0ffee5eed-mirror-harness-5f3a9d1e27b4"

    def __init__(self, work_dir: Path, name: str, state_bootstrap: str, mirrors: list[MirrorSpec],
                 metadata_refresh_ms: int = 1000, log_level: str = "info,mirrorguard=debug",
                 snapshot_interval_ms: int | None = None, state_topic: str = "__mirror_state",
                 admin_read_timeout_ms: int | None = None, guard_upstream: str | None = None,
                 guard_node_ids: list[int] | None = None, extra_config: str = "",
                 production: bool = False, producer_state: str = "",
                 allow_source_cluster: bool = True, binary: Path | None = None,
                 tail_interval_ms: int | None = None):
        self.name = name
        # The mirrorguard binary to run (another release's for the mixed-version test).
        self.binary = Path(binary) if binary else harness.MIRRORGUARD_BIN
        self.state_bootstrap = state_bootstrap
        self.state_topic = state_topic
        self.work_dir = work_dir
        taken: set[int] = set()
        self.admin_port = harness.free_port(taken)
        taken.add(self.admin_port)
        for m in mirrors:
            for addr in m.source_bootstrap.split(","):
                taken.add(int(addr.rsplit(":", 1)[1]))
        for m in mirrors:
            m.bootstrap_port = harness.free_port(taken)
            taken.add(m.bootstrap_port)
            m.node_port_base = harness.free_node_port_base(taken, nodes=m.node_ids)
            taken.update(m.node_port_of(n) for n in m.node_ids)
            if m.fetcher_identity == "ports":
                m.reader_port = harness.free_port(taken)
                taken.add(m.reader_port)
                m.reader_node_port_base = harness.free_node_port_base(taken, nodes=m.node_ids)
                taken.update(m.reader_node_port_of(n) for n in m.node_ids)
        self.mirrors = {m.name: m for m in mirrors}
        # An optional produce guard ([[guard]]) in front of the destination `guard_upstream`.
        self.guard_bootstrap: str | None = None
        if guard_upstream:
            for addr in guard_upstream.split(","):
                taken.add(int(addr.rsplit(":", 1)[1]))
            guard_port = harness.free_port(taken)
            taken.add(guard_port)
            gids = guard_node_ids or [1]
            guard_base = harness.free_node_port_base(taken, nodes=gids)
            self.guard_bootstrap = f"{HOST}:{guard_port}"
        self.token_path = work_dir / f"{name}.token"
        self.token_path.write_text(self.TOKEN + "\n")
        # Readable by this user only, whatever the umask (the demo and the benchmarks run
        # outside the test session): mirrorguard refuses a token file others can read.
        self.token_path.chmod(0o600)
        self.config_path = work_dir / f"{name}.toml"
        self.log_path = work_dir / f"{name}.log"
        blocks = []
        for m in mirrors:
            extra = f'source_cluster_id = "{m.source_cluster_id}"\n' if m.source_cluster_id else ""
            if m.destination_bootstrap:
                extra += f'destination_bootstrap = [{", ".join(chr(34) + a + chr(34) for a in m.destination_bootstrap.split(","))}]\n'
            # Another release's binary (the mixed-version test) gets only the keys it knows:
            # the previous release predates the high-watermark rule and completes a seal
            # on the fetcher's offset.
            if m.destination_hw and self.binary == harness.MIRRORGUARD_BIN:
                extra += ("destination_hw_bootstrap = ["
                          + ", ".join(f'"{a}"' for a in m.destination_hw.split(",")) + "]\n"
                          + "destination_hw_poll_ms = 100\n")
            if (m.stopped_when or not m.destination_hw) and self.binary == harness.MIRRORGUARD_BIN:
                extra += f'stopped_when = "{m.stopped_when or "fetcher_offset"}"\n'
            if m.fetcher_identity == "ports":
                extra += (f'fetcher_bootstrap = "{m.bootstrap}"\n'
                          f"fetcher_node_port_base = {m.node_port_base}\n")
            elif self.binary == harness.MIRRORGUARD_BIN:
                extra += f'fetcher_identity = "{m.fetcher_identity}"\n'
            if m.extra:
                extra += m.extra.rstrip("\n") + "\n"
            blocks.append(
                f"""[[mirror]]
name = "{m.name}"
bootstrap = "{m.reader_bootstrap}"
listen_host = "{HOST}"
advertised_host = "{HOST}"
node_port_base = {m.reader_node_port_base or m.node_port_base}
source_bootstrap = [{", ".join(f'"{a}"' for a in m.source_bootstrap.split(","))}]
pid_mode = "{m.pid_mode}"
layout = "{m.layout}"
metadata_refresh_ms = {metadata_refresh_ms}
{extra}"""
            )
        self.config_path.write_text(
            f"""# written by tests/integration/mirror_harness.py
[admin]
listen = "{HOST}:{self.admin_port}"
token_file = "{self.token_path}"
{f"read_timeout_ms = {admin_read_timeout_ms}" if admin_read_timeout_ms else ""}

[logging]
format = "text"
level = "{log_level}"

[limits]
shutdown_grace_ms = 2000

[state]
bootstrap = ["{state_bootstrap}"]
topic = "{state_topic}"
request_timeout_ms = 10000
# Test beds are single-broker clusters, often the source itself: report, do not refuse.
production = {"true" if production else "false"}
allow_source_cluster = {"true" if allow_source_cluster else "false"}
{f"tail_interval_ms = {tail_interval_ms}" if tail_interval_ms else ""}

"""
            + ("[producer_state]\n"
               + (f"snapshot_interval_ms = {snapshot_interval_ms}\n" if snapshot_interval_ms else "")
               # Further `key = value` lines of [producer_state] (e.g. max_partitions).
               + (producer_state.rstrip("\n") + "\n" if producer_state else "")
               + "\n" if snapshot_interval_ms or producer_state else "")
            + "\n".join(blocks)
            + (f"""
[[guard]]
name = "guard"
bootstrap = "{self.guard_bootstrap}"
listen_host = "{HOST}"
advertised_host = "{HOST}"
node_port_base = {guard_base}
upstream_bootstrap = [{", ".join(f'"{a}"' for a in guard_upstream.split(","))}]
metadata_refresh_ms = {metadata_refresh_ms}
""" if guard_upstream else "")
            + ("\n" + extra_config if extra_config else "")
        )
        self.proc: ManagedProcess | None = None
        self.generation = 0
        self.killed = False  # last process ended with SIGKILL on purpose

    # ---------------------------------------------------------------- process

    @property
    def admin_url(self) -> str:
        return f"http://{HOST}:{self.admin_port}"

    def start(self, timeout: float = 20.0, wait_ready: bool = True) -> "MirrorGuard":
        if not self.binary.exists():
            raise HarnessError(f"{self.binary} missing (cargo build --bins)")
        env = dict(os.environ)
        env.setdefault("RUST_BACKTRACE", "1")
        env.setdefault("NO_COLOR", "1")
        self.generation += 1
        self.killed = False
        self.proc = ManagedProcess(
            f"{self.name}.{self.generation}",
            [self.binary, "run", "--config", self.config_path],
            self.log_path,
            env=env,
        )

        def ready():
            if not self.proc.alive():
                raise HarnessError(f"mirrorguard exited with {self.proc.proc.returncode}:\n{self.proc.log_text()}")
            return harness.http_get(self.admin_url + "/readyz", timeout=1.0)[0] == 200

        if not wait_ready:
            wait_until(lambda: self.proc.alive() and harness.http_get(self.admin_url + "/healthz", timeout=1.0)[0] == 200,
                       timeout, what=f"{self.name} /healthz == 200")
            return self
        try:
            wait_until(ready, timeout, what=f"{self.name} /readyz == 200")
        except TimeoutError as e:
            raise HarnessError(f"{e}\n{self.proc.log_text()}") from e
        return self

    def wait_sources_known(self, timeout: float = 15.0) -> None:
        """Waits until every mirror has learned its source id and topics (the admin API
        answers 503 source_unknown before)."""
        def known():
            parts = self.partitions()
            return all(any(p["mirror"] == m for p in parts) for m in self.mirrors)

        wait_until(known, timeout, interval=0.1, what="mirror sources identified")

    def kill9(self) -> None:
        assert self.proc is not None and self.proc.alive()
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(5)
        self.proc.stop(signal.SIGKILL, timeout=1)
        self.killed = True

    def terminate(self) -> int | None:
        if self.proc is None:
            return None
        if not self.proc.alive():
            rc = self.proc.proc.returncode
            self.proc.stop(signal.SIGKILL, timeout=1)
            return rc
        return self.proc.stop(signal.SIGTERM, timeout=5.0)

    def restart(self, timeout: float = 20.0) -> "MirrorGuard":
        if self.proc is not None and self.proc.alive():
            rc = self.terminate()
            assert rc == 0, f"{self.name} exit code {rc} after SIGTERM"
        return self.start(timeout)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    # ---------------------------------------------------------------- admin API

    def request(self, method: str, path: str, body: bytes | str | dict | None = None,
                token: str | None = "default", timeout: float = 15.0,
                headers: dict[str, str] | None = None) -> tuple[int, object]:
        """Returns (status, parsed JSON or the raw text)."""
        if isinstance(body, dict):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        req = urllib.request.Request(self.admin_url + path, data=body, method=method)
        if body is not None:
            req.add_header("Content-Type", "application/json")
        if token == "default":
            token = self.TOKEN
        if token is not None:
            req.add_header("Authorization", f"Bearer {token}")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, text = r.status, r.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode(errors="replace")
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def get(self, path: str) -> object:
        # With the token: the reads that show producer ids need it.
        status, body = self.request("GET", path)
        if status != 200:
            raise HarnessError(f"GET {path}: {status} {body}")
        return body

    def partitions(self) -> list[dict]:
        return self.get("/v1/partitions")["partitions"]

    def partition(self, topic: str, p: int = 0) -> dict | None:
        for e in self.partitions():
            if e["topic"] == topic and e["partition"] == p:
                return e
        return None

    def post(self, op: str, mirror: str, topic: str | None = None, partitions: list[int] | None = None,
             all_: bool = False, **kw) -> tuple[int, object]:
        body: dict = {"mirror": mirror}
        if all_:
            body["all"] = True
        else:
            sel: dict = {"topic": topic}
            if partitions is not None:
                sel["partitions"] = partitions
            body["topics"] = [sel]
        return self.request("POST", f"/v1/partitions/{op}", body, **kw)

    def metrics(self) -> harness.Metrics:
        status, text = harness.http_get(self.admin_url + "/metrics", timeout=5.0)
        if status != 200:
            raise HarnessError(f"/metrics {status}")
        return harness.Metrics(harness.parse_prometheus(text))


@pytest.fixture
def mirror_factory(tmp_path, request):
    """Makes MirrorGuard instances (not started). At teardown each one still running gets
    SIGTERM and must exit 0; no log may show a panic. Killed ones (-9) are not checked.

    When the state cluster is the session's shared Kafka node (``kafka1``), every
    instance of one test shares a state topic of that test's own (``mg.state_topic``)
    unless told otherwise, so tests never see each other's records; on a cluster of the
    test's own the state topic keeps its default name, ``__mirror_state``."""
    made: list[MirrorGuard] = []
    test_state_topic = f"__mirror_state_{os.urandom(4).hex()}"
    shared_state = request.getfixturevalue("kafka1").bootstrap if "kafka1" in request.fixturenames else None

    def make(state_bootstrap: str, mirrors: list[MirrorSpec], start: bool = True, **kw) -> MirrorGuard:
        if state_bootstrap == shared_state:
            kw.setdefault("state_topic", test_state_topic)
        mg = MirrorGuard(tmp_path, f"mg{len(made)}", state_bootstrap, mirrors, **kw)
        made.append(mg)
        try:  # conftest.py's failure report shows the logs it knows of
            from conftest import _register_log

            _register_log(request, mg.name, mg.log_path)
        except ImportError:
            pass
        return mg.start() if start else mg

    yield make
    harness.close_clients()
    problems = []
    for mg in made:
        if mg.proc is None:
            continue
        was_alive = mg.proc.alive()
        rc = mg.terminate()
        if was_alive and rc != 0:
            problems.append(f"{mg.name}: exit code {rc} after SIGTERM")
        if "panicked" in mg.log_text():
            problems.append(f"{mg.name}: panic in log")
    if problems:
        pytest.fail("; ".join(problems), pytrace=False)


# --------------------------------------------------------------------------
# Fetch v12 (by name) / v13 (by id) with LastFetchedEpoch, for the stand-in fetcher


@dataclass
class FetchResult:
    error_code: int
    high_watermark: int
    last_stable_offset: int
    aborted_transactions: list[tuple[int, int]] | None
    records: bytes | None
    top_error: int = 0
    # (epoch, end offset) of a DivergingEpoch (Fetch v12+, partition tag 0): the
    # source's log diverges from the fetcher's at that offset.
    diverging: tuple[int, int] | None = None


def fetch_request(conn: rawkafka.Connection, version: int, topic: str, topic_id: bytes | None, partition: int,
                  offset: int, last_fetched_epoch: int = -1, replica_id: int = -1, isolation_level: int = 0,
                  max_wait_ms: int = 100, max_bytes: int = 1 << 20) -> FetchResult:
    if version == 4:
        body = (i32(replica_id) + i32(max_wait_ms) + i32(1) + i32(max_bytes) + i8(isolation_level)
                + rawkafka.array([rawkafka.string(topic) + rawkafka.array([i32(partition) + i64(offset) + i32(max_bytes)])]))
        r = Reader(conn.request(rawkafka.API_FETCH, 4, body))
        r.i32()
        found = None
        for _ in range(r.count()):
            name = r.string()
            for _ in range(r.count()):
                idx, err, hw, lso = r.i32(), r.i16(), r.i64(), r.i64()
                n = r.count()
                aborted = None if n == -1 else [(r.i64(), r.i64()) for _ in range(n)]
                recs = r.nbytes()
                if name == topic and idx == partition:
                    found = FetchResult(err, hw, lso, aborted, recs)
        if r.remaining():
            raise rawkafka.ProtocolError("trailing bytes in Fetch v4 response")
        if found is None:
            raise rawkafka.ProtocolError(f"{topic}-{partition} missing from the Fetch v4 response")
        return found
    if version not in (12, 13):
        raise ValueError(version)
    by_id = version >= 13
    key = topic_id if by_id else compact_string(topic)
    assert key is not None
    body = i32(replica_id) + i32(max_wait_ms) + i32(1) + i32(max_bytes) + i8(isolation_level)
    body += i32(0) + i32(-1)  # no fetch session
    part = (i32(partition) + i32(-1) + i64(offset) + i32(last_fetched_epoch) + i64(-1) + i32(max_bytes) + NO_TAGS)
    body += compact_array([key + compact_array([part]) + NO_TAGS])
    body += compact_array([]) + compact_string("") + NO_TAGS
    r = Reader(conn.request(rawkafka.API_FETCH, version, body, flexible=True))
    r.i32()
    top_err = r.i16()
    r.i32()
    found = None
    for _ in range(r.compact_count()):
        t = r.uuid() if by_id else r.compact_string()
        for _ in range(r.compact_count()):
            idx, perr, hw, lso, _ls = r.i32(), r.i16(), r.i64(), r.i64(), r.i64()
            n = r.compact_count()
            aborted = None
            if n >= 0:
                aborted = []
                for _ in range(n):
                    aborted.append((r.i64(), r.i64()))
                    r.tagged_fields()
            r.i32()  # preferred read replica
            recs = r.compact_bytes()
            tags = r.tagged_fields()
            diverging = None
            if 0 in tags:
                d = Reader(tags[0])
                diverging = (d.i32(), d.i64())
            if t == (topic_id if by_id else topic) and idx == partition:
                found = FetchResult(perr, hw, lso, aborted, recs, top_err, diverging)
        r.tagged_fields()
    r.tagged_fields()
    if r.remaining():
        raise rawkafka.ProtocolError(f"trailing bytes in Fetch v{version} response")
    if found is None:
        if top_err:
            return FetchResult(0, -1, -1, None, None, top_err)
        raise rawkafka.ProtocolError(f"{topic}-{partition} missing from the Fetch v{version} response")
    return found


# --------------------------------------------------------------------------
# independent batch checks


@dataclass
class CheckedBatch:
    base_offset: int
    last_offset: int
    leader_epoch: int
    attributes: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    is_control: bool
    is_transactional: bool
    control_type: int | None  # 0 abort, 1 commit, 7 MIRROR_PID_RESET ... (control batches)
    control_value: bytes | None
    values: list[bytes | None]
    raw: bytes = field(repr=False)

    @property
    def kind(self) -> str:
        if not self.is_control:
            return "data"
        return {0: "abort", 1: "commit", 7: "barrier"}.get(self.control_type, f"control{self.control_type}")


def check_batch(raw: bytes) -> CheckedBatch:
    """Validates one complete magic-2 batch with kafka-python (CRC and full record
    decode) and with the crc32c package; raises AssertionError if anything is off."""
    assert len(raw) >= 61 and raw[16] == 2, "not a magic-2 batch"
    stored = struct.unpack(">I", raw[17:21])[0]
    assert crc32c.crc32c(raw[21:]) == stored, "crc32c package: CRC mismatch"
    b = DefaultRecordBatch(raw)
    assert b.validate_crc(), "kafka-python: CRC mismatch"
    recs = list(b)  # decodes (and decompresses) every record; raises on corruption
    assert len(recs) == b.records_count
    ctype = cvalue = None
    if b.is_control_batch:
        assert len(recs) >= 1
        ctype = recs[0].type
        cvalue = recs[0].value
    return CheckedBatch(
        base_offset=b.base_offset,
        last_offset=b.last_offset,
        leader_epoch=b.leader_epoch,
        attributes=b.attributes,
        producer_id=b.producer_id,
        producer_epoch=b.producer_epoch,
        base_sequence=b.base_sequence,
        is_control=b.is_control_batch,
        is_transactional=b.is_transactional,
        control_type=ctype,
        control_value=cvalue,
        values=[None if b.is_control_batch else r.value for r in recs],
        raw=bytes(raw),
    )


def split_batches(records: bytes | None) -> list[bytes]:
    """Complete batches of a records field (a truncated tail is dropped, as Kafka does)."""
    return [b.raw for b in rawkafka.parse_batches(records)]


def decode_barrier_value(value: bytes) -> tuple[int, str]:
    """MirrorPidResetRecord v0: int16 version, compact string SourceClusterId, tags."""
    r = Reader(value)
    version = r.i16()
    sid = r.compact_string()
    tags = r.tagged_fields()
    assert not tags and r.remaining() == 0, "barrier value: unexpected trailing data"
    return version, sid


def decode_end_txn_value(value: bytes) -> tuple[int, int]:
    r = Reader(value)
    return r.i16(), r.i32()


# --------------------------------------------------------------------------
# the stand-in destination fetcher


class StandInFetcher:
    """STAND-IN for a stock destination broker's mirror fetcher and its log (SPEC 7).

    Fetches one partition through a mirror listener from its log end offset (LEO),
    appends what it gets like the replication path does (offsets must be >= LEO and
    increase), and checks every batch independently (``check_batch``). Several mirror
    listeners can feed it in turn (``connect``) while its offsets continue: Tansu topics
    are per broker, so the upstream offsets then differ from the stand-in log's, exactly
    like a destination log fed from a new source; in that mode ``rebase=True`` keeps the
    source offset separately and relabels appended batches with the stand-in's offsets.
    """

    def __init__(self, topic: str, partition: int = 0, version: int = 12, replica_id: int = -1):
        self.topic = topic
        self.partition = partition
        self.version = version
        self.replica_id = replica_id
        self.log: list[CheckedBatch] = []
        self.leo = 0
        self.last_fetched_epoch = -1
        self.conn: rawkafka.Connection | None = None
        self.topic_id: bytes | None = None
        self.source_offset: int | None = None  # rebase mode: the upstream position
        self.responses: list[FetchResult] = []
        self.truncations: list[tuple[int, int]] = []  # DivergingEpoch answers followed

    def connect(self, bootstrap: str, rebase: bool = False, source_offset: int = 0) -> "StandInFetcher":
        """Bootstraps at a mirror listener (Metadata) and connects to the partition leader
        as advertised by it."""
        self.close()
        host, port = bootstrap.rsplit(":", 1)
        with rawkafka.Connection(host, int(port), timeout=5) as c:
            md = rawkafka.metadata_v1(c, [self.topic])
            leader = md.topics[self.topic][self.partition]
            lhost, lport = md.brokers[leader]
            if self.version >= 13:
                ids, _ = rawkafka.topic_ids_v12(c, [self.topic])
                self.topic_id = ids[self.topic]
        assert lhost == HOST
        self.conn = rawkafka.Connection(lhost, lport, timeout=10)
        self.source_offset = source_offset if rebase else None
        return self

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def fetch_once(self, isolation_level: int = 0, max_wait_ms: int = 100) -> tuple[FetchResult, list[CheckedBatch]]:
        assert self.conn is not None
        offset = self.leo if self.source_offset is None else self.source_offset
        res = fetch_request(self.conn, self.version, self.topic, self.topic_id, self.partition, offset,
                            last_fetched_epoch=self.last_fetched_epoch, replica_id=self.replica_id,
                            isolation_level=isolation_level, max_wait_ms=max_wait_ms)
        self.responses.append(res)
        if res.top_error or res.error_code:
            raise HarnessError(f"fetch error top={res.top_error} partition={res.error_code}")
        if res.diverging is not None and self.source_offset is None:
            # Kafka's fetcher truncates its log to the leader's end offset for
            # its last fetched epoch and fetches from there.
            end = res.diverging[1]
            self.log = [b for b in self.log if b.base_offset < end]
            self.leo = min(self.leo, end)
            self.last_fetched_epoch = self.log[-1].leader_epoch if self.log else -1
            self.truncations.append(res.diverging)
            return res, []
        appended = []
        for raw in split_batches(res.records):
            b = check_batch(raw)
            if self.source_offset is None:
                # replication-path rule: offsets monotonic and >= LEO
                assert b.base_offset >= self.leo, f"batch at {b.base_offset} below the LEO {self.leo}"
                if b.last_offset < offset:
                    continue  # a batch the fetcher already has (fetch landed mid-batch)
            else:
                if b.last_offset < offset:
                    continue
                self.source_offset = b.last_offset + 1
                delta = b.last_offset - b.base_offset
                b.base_offset, b.last_offset = self.leo, self.leo + delta
            self.log.append(b)
            appended.append(b)
            self.leo = b.last_offset + 1
            self.last_fetched_epoch = b.leader_epoch
        return res, appended

    def follow(self, until, timeout: float = 15.0, what: str = "stand-in fetcher condition") -> None:
        """Fetches until `until(self)` holds."""
        deadline = time.monotonic() + timeout
        while not until(self):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not reached in {timeout}s; LEO {self.leo}, log {[b.kind for b in self.log]}")
            self.fetch_once()

    def catch_up(self, high_watermark_target: int, timeout: float = 15.0) -> None:
        """Fetches until its position reaches `high_watermark_target` (upstream offsets)."""
        pos = lambda f: (f.leo if f.source_offset is None else f.source_offset)  # noqa: E731
        self.follow(lambda f: pos(f) >= high_watermark_target, timeout, f"position {high_watermark_target}")


def seal_partition(mg: "MirrorGuard", mirror: str, source_bootstrap: str, topic: str, partition: int = 0) -> None:
    """Mirrors `topic`-`partition` with a stand-in fetcher through `mirror`'s listener up to
    the source's high watermark, stops it (``POST stop``), and fetches until the partition
    is STOPPED (its sealing batches end with the barrier)."""
    f = StandInFetcher(topic, partition=partition)
    f.connect(mg.mirrors[mirror].bootstrap)
    f.catch_up(high_watermark(source_bootstrap, topic, partition))
    status, body = mg.post("stop", mirror, topic, [partition])
    assert status == 200, body
    f.follow(lambda s: (mg.partition(topic, partition) or {}).get("state") == "STOPPED", timeout=15,
             what=f"{topic}-{partition} STOPPED")
    assert [b.kind for b in f.log][-1] == "barrier"
    f.close()


# --------------------------------------------------------------------------
# producers


def idempotent_producer(bootstrap: str, **conf):
    return harness.new_producer(bootstrap, **{"enable.idempotence": True, "linger.ms": 5,
                                               "message.timeout.ms": 20000, **conf})


def transactional_producer(bootstrap: str, txn_id: str, **conf):
    p = harness.new_producer(bootstrap, **{"transactional.id": txn_id, "linger.ms": 5,
                                            "message.timeout.ms": 20000, "transaction.timeout.ms": 60000, **conf})
    p.init_transactions(20)
    return p


def send(p, topic: str, values: list[bytes], partition: int = 0) -> None:
    errors = []

    def cb(err, msg):
        if err is not None:
            errors.append(err)

    for v in values:
        p.produce(topic, value=v, key=v[:4], partition=partition, on_delivery=cb)
    left = p.flush(20)
    if errors:
        raise KafkaException(errors[0])
    assert left == 0, f"{left} undelivered"


def txn(p, topic: str, values: list[bytes], commit: bool, partition: int = 0) -> None:
    p.begin_transaction()
    for v in values:
        p.produce(topic, value=v, key=v[:4], partition=partition)
    p.flush(20)
    if commit:
        p.commit_transaction(20)
    else:
        p.abort_transaction(20)


def high_watermark(bootstrap: str, topic: str, partition: int = 0) -> int:
    host, port = bootstrap.rsplit(":", 1)
    with rawkafka.Connection(host, int(port), timeout=5) as c:
        return rawkafka.fetch_v4(c, topic, partition, 0, max_bytes=1).high_watermark


def direct_batches(bootstrap: str, topic: str, partition: int = 0) -> list[CheckedBatch]:
    host, port = bootstrap.rsplit(":", 1)
    batches, _ = rawkafka.fetch_all_batches(host, int(port), topic, partition)
    return [check_batch(b.raw) for b in batches]


# --------------------------------------------------------------------------
# __mirror_state (read with librdkafka, decoded here)


@dataclass
class StateRecord:
    offset: int
    type: int
    key: dict
    value: dict | None


def _decode_state(key: bytes, value: bytes | None) -> tuple[int, dict, dict | None]:
    k = Reader(key)
    rtype = k.i16()
    if rtype not in (3, 4, 5, 6, 7, 8):
        return rtype, {}, None  # a type this reader does not know (mirrorguard skips it too)
    kd: dict = {}
    vd: dict | None = None
    if rtype == 3:
        kd = {"topic_id": k.uuid(), "partition": k.i32(), "source_cluster_id": k.string(), "original_pid": k.i64()}
        if value is not None:
            v = Reader(value)
            vd = {"version": v.i16(), "salt": v.i64(), "colliding_cluster_id": v.compact_string(),
                  "timestamp_ms": v.i64()}
            v.tagged_fields()
            assert v.remaining() == 0
    elif rtype in (4, 5):
        kd = {"topic_id": k.uuid(), "partition": k.i32()}
        if value is not None and rtype == 4:
            v = Reader(value)
            vd = {"version": v.i16(), "mirror": v.compact_string(), "topic": v.compact_string(),
                  "state": v.i8(), "source_cluster_id": v.compact_string(), "cut": v.i64(),
                  "seal_batches": v.i32(), "reason": v.compact_string(), "timestamp_ms": v.i64()}
            v.tagged_fields()
            assert v.remaining() == 0
        elif value is not None:
            v = Reader(value)
            vd = {"version": v.i16(), "snapshot_offset": v.i64(), "producers": []}
            for _ in range(v.compact_count()):
                vd["producers"].append({"producer_id": v.i64(), "origin": v.uuid(), "original_pid": v.i64(),
                                        "epoch": v.i16(), "last_sequence": v.i32(), "last_offset": v.i64(),
                                        "coordinator_epoch": v.i32(), "txn_first_offset": v.i64(),
                                        "last_timestamp": v.i64()})
                v.tagged_fields()
            v.tagged_fields()
            assert v.remaining() == 0
    elif rtype == 8:  # source topology, keyed by mirror name
        kd = {"mirror": k.string()}
        if value is not None:
            v = Reader(value)
            vd = {"version": v.i16(), "source_cluster_id": v.compact_string(), "timestamp_ms": v.i64(),
                  "brokers": [], "topics": []}
            for _ in range(v.compact_count()):
                vd["brokers"].append({"node_id": v.i32(), "host": v.compact_string(), "port": v.i32()})
                v.tagged_fields()
            for _ in range(v.compact_count()):
                t = {"name": v.compact_string(), "id": v.uuid(), "internal": v.i8() != 0, "partitions": []}
                for _ in range(v.compact_count()):
                    t["partitions"].append({"partition": v.i32(), "leader": v.i32(), "leader_epoch": v.i32()})
                    v.tagged_fields()
                v.tagged_fields()
                vd["topics"].append(t)
            v.tagged_fields()
            assert v.remaining() == 0
    elif rtype == 7:
        kd = {"topic_id": k.uuid(), "partition": k.i32(), "generation": k.i64(), "chunk": k.i32()}
        if value is not None:
            v = Reader(value)
            vd = {"version": v.i16(), "snapshot_offset": v.i64(), "chunk_count": v.i32(), "producers": []}
            for _ in range(v.compact_count()):
                vd["producers"].append({"producer_id": v.i64(), "origin": v.uuid(), "original_pid": v.i64(),
                                        "epoch": v.i16(), "last_sequence": v.i32(), "last_offset": v.i64(),
                                        "coordinator_epoch": v.i32(), "txn_first_offset": v.i64(),
                                        "last_timestamp": v.i64()})
                v.tagged_fields()
            v.tagged_fields()
            assert v.remaining() == 0
    elif rtype == 6:
        kd = {"topic_id": k.uuid(), "partition": k.i32(), "producer_id": k.i64()}
        if value is not None:
            v = Reader(value)
            vd = {"version": v.i16(), "origin": v.uuid(), "original_pid": v.i64(), "timestamp_ms": v.i64()}
            v.tagged_fields()
            assert v.remaining() == 0
    else:
        return rtype, {"raw": key}, ({"raw": value} if value is not None else None)
    assert k.remaining() == 0, f"type {rtype}: trailing key bytes"
    return rtype, kd, vd


def read_state_records(state_bootstrap: str, topic: str = "__mirror_state", timeout: float = 15.0) -> list[StateRecord]:
    """Everything in __mirror_state partition 0 up to its high watermark."""
    hw = high_watermark(state_bootstrap, topic)
    out: list[StateRecord] = []
    if hw == 0:
        return out
    c = harness.new_consumer(state_bootstrap, **{"group.id": "mg-state-reader", "enable.auto.commit": False,
                                                "enable.partition.eof": False, "fetch.wait.max.ms": 100,
                                                "check.crcs": True})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + timeout
        while True:
            if out and out[-1].offset >= hw - 1:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"read {len(out)} __mirror_state records, high watermark {hw}")
            for m in c.consume(num_messages=100, timeout=0.5):
                if m.error():
                    raise KafkaException(m.error())
                rtype, kd, vd = _decode_state(m.key(), m.value())
                out.append(StateRecord(m.offset(), rtype, kd, vd))
    finally:
        c.close()
    return out


# --------------------------------------------------------------------------
# the salt candidate contract (src/producer_state/salt.rs module doc), written again here


def collision_seed(topic_id: bytes, partition: int, source_cluster: bytes, original_pid: int) -> int:
    """FNV-1a 64 over topic_id (16) || partition (i32 BE) || source cluster id (16) || pid (i64 BE)."""
    h = 0xCBF29CE484222325
    for b in topic_id + struct.pack(">i", partition) + source_cluster + struct.pack(">q", original_pid):
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def salt_candidates(seed: int, n: int) -> list[int]:
    """splitmix64 outputs masked to 31 bits, zeros skipped."""
    out = []
    state = seed
    m = 0xFFFFFFFFFFFFFFFF
    while len(out) < n:
        state = (state + 0x9E3779B97F4A7C15) & m
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
        z ^= z >> 31
        if z & 0x7FFFFFFF:
            out.append(z & 0x7FFFFFFF)
    return out


def with_state_topic(config_text: str, topic: str) -> str:
    """A MirrorGuard config text with its [state] topic replaced by `topic` (the harness
    always writes one `topic = ...` line, in [state])."""
    out, n = re.subn(r'^topic = "[^"]*"$', f'topic = "{topic}"', config_text, count=1, flags=re.M)
    if n != 1:
        raise HarnessError("no [state] topic line in the config")
    return out
