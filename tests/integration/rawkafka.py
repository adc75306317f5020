"""A tiny raw Kafka client for byte-level checks (no dependency on librdkafka).

Only what the tests need: ApiVersions v0, Metadata v1, FindCoordinator v0-v2,
Fetch v4 request encoders and response decoders, the size-prefixed framing, and
a record-batch (magic 2) header parser. Every read is bounds-checked: a short or
inconsistent response raises ``ProtocolError`` rather than returning garbage.
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass, field

import crc32c

API_FETCH = 1
# mirrorguard's MIRROR_PID_RESET control type (src/records/control.rs
# MIRROR_PID_RESET_TYPE; not reserved by Apache Kafka, whose ControlRecordType
# reads it as UNKNOWN).
MIRROR_PID_RESET_TYPE = 7
API_METADATA = 3
API_FIND_COORDINATOR = 10
API_API_VERSIONS = 18

MAX_RESPONSE_BYTES = 64 * 1024 * 1024


class ProtocolError(Exception):
    pass


# --------------------------------------------------------------------------
# primitive encoders / a bounds-checked reader


def i8(v: int) -> bytes:
    return struct.pack(">b", v)


def i16(v: int) -> bytes:
    return struct.pack(">h", v)


def i32(v: int) -> bytes:
    return struct.pack(">i", v)


def i64(v: int) -> bytes:
    return struct.pack(">q", v)


def string(s: str | None) -> bytes:
    if s is None:
        return i16(-1)
    b = s.encode()
    return i16(len(b)) + b


def array(items: list[bytes]) -> bytes:
    return i32(len(items)) + b"".join(items)


def uvarint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def compact_string(s: str | None) -> bytes:
    if s is None:
        return uvarint(0)
    b = s.encode()
    return uvarint(len(b) + 1) + b


def compact_array(items: list[bytes]) -> bytes:
    return uvarint(len(items) + 1) + b"".join(items)


NO_TAGS = uvarint(0)


class Reader:
    def __init__(self, buf: bytes, pos: int = 0, end: int | None = None):
        self.buf = buf
        self.pos = pos
        self.end = len(buf) if end is None else end

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > self.end:
            raise ProtocolError(f"need {n} bytes at {self.pos}, have {self.end - self.pos}")
        b = self.buf[self.pos : self.pos + n]
        self.pos += n
        return b

    def i8(self) -> int:
        return struct.unpack(">b", self.take(1))[0]

    def i16(self) -> int:
        return struct.unpack(">h", self.take(2))[0]

    def i32(self) -> int:
        return struct.unpack(">i", self.take(4))[0]

    def u32(self) -> int:
        return struct.unpack(">I", self.take(4))[0]

    def i64(self) -> int:
        return struct.unpack(">q", self.take(8))[0]

    def string(self) -> str | None:
        n = self.i16()
        if n == -1:
            return None
        return self.take(n).decode()

    def nbytes(self) -> bytes | None:
        n = self.i32()
        if n == -1:
            return None
        return self.take(n)

    def count(self) -> int:
        n = self.i32()
        if n < -1 or n > self.end - self.pos:
            raise ProtocolError(f"implausible array length {n}")
        return n

    def varint(self) -> int:
        shift = 0
        raw = 0
        while True:
            b = self.take(1)[0]
            raw |= (b & 0x7F) << shift
            if not b & 0x80:
                break
            shift += 7
            if shift > 63:
                raise ProtocolError("varint too long")
        return (raw >> 1) ^ -(raw & 1)

    def uvarint(self) -> int:
        shift = 0
        v = 0
        while True:
            b = self.take(1)[0]
            v |= (b & 0x7F) << shift
            if not b & 0x80:
                return v
            shift += 7
            if shift > 63:
                raise ProtocolError("uvarint too long")

    def compact_count(self) -> int:
        """Length of a compact array: -1 for null."""
        n = self.uvarint() - 1
        if n > self.end - self.pos:
            raise ProtocolError(f"implausible compact length {n}")
        return n

    def compact_string(self) -> str | None:
        n = self.compact_count()
        return None if n < 0 else self.take(n).decode()

    def compact_bytes(self) -> bytes | None:
        n = self.compact_count()
        return None if n < 0 else self.take(n)

    def uuid(self) -> bytes:
        return self.take(16)

    def tagged_fields(self) -> dict[int, bytes]:
        out = {}
        for _ in range(self.uvarint()):
            tag = self.uvarint()
            out[tag] = self.take(self.uvarint())
        return out

    def remaining(self) -> int:
        return self.end - self.pos


# --------------------------------------------------------------------------
# connection and framing


class Connection:
    """One blocking TCP connection speaking request header v1 / response header v0."""

    def __init__(self, host: str, port: int, timeout: float = 10.0, client_id: str = "rawkafka"):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.settimeout(timeout)
        self.client_id = client_id
        self.corr = 0
        # Correlation ids of requests sent without expecting a response (Produce acks=0).
        # Tansu answers them anyway (Kafka does not); such answers are skipped and counted.
        self.unanswered: set[int] = set()
        self.skipped_unsolicited = 0

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _recv_exact(self, n: int) -> bytes:
        chunks = []
        got = 0
        while got < n:
            c = self.sock.recv(min(n - got, 1 << 20))
            if not c:
                raise ProtocolError(f"connection closed after {got} of {n} bytes")
            chunks.append(c)
            got += len(c)
        return b"".join(chunks)

    def request(self, api_key: int, api_version: int, body: bytes, flexible: bool = False) -> bytes:
        """Sends one request and returns the response body after the response header.
        flexible=False: request header v1, response header v0; True: v2 and v1."""
        self.corr += 1
        corr = self.corr
        header = i16(api_key) + i16(api_version) + i32(corr) + string(self.client_id)
        if flexible:
            header += NO_TAGS
        frame = header + body
        self.sock.sendall(i32(len(frame)) + frame)
        while True:
            size = struct.unpack(">i", self._recv_exact(4))[0]
            if size < 4 or size > MAX_RESPONSE_BYTES:
                raise ProtocolError(f"bad response size {size}")
            resp = self._recv_exact(size)
            got_corr = struct.unpack(">i", resp[:4])[0]
            if got_corr in self.unanswered:
                self.unanswered.discard(got_corr)
                self.skipped_unsolicited += 1
                continue
            break
        if got_corr != corr:
            raise ProtocolError(f"correlation id {got_corr} != {corr}")
        if flexible:
            r = Reader(resp, 4)
            r.tagged_fields()
            return resp[r.pos :]
        return resp[4:]


# --------------------------------------------------------------------------
# Produce v3 (acks=0 has no response at all)

API_PRODUCE = 0


def produce_v3(conn: Connection, topic: str, partition: int, records: bytes, acks: int = -1, timeout_ms: int = 10000):
    """Sends one Produce v3. With acks=0 nothing comes back and None is returned;
    otherwise (error_code, base_offset)."""
    body = (
        string(None)
        + i16(acks)
        + i32(timeout_ms)
        + array([string(topic) + array([i32(partition) + i32(len(records)) + records])])
    )
    if acks == 0:
        conn.corr += 1
        header = i16(API_PRODUCE) + i16(3) + i32(conn.corr) + string(conn.client_id)
        frame = header + body
        conn.sock.sendall(i32(len(frame)) + frame)
        conn.unanswered.add(conn.corr)
        return None
    r = Reader(conn.request(API_PRODUCE, 3, body))
    out = None
    for _ in range(r.count()):
        name = r.string()
        for _ in range(r.count()):
            idx, err, base, _append_time = r.i32(), r.i16(), r.i64(), r.i64()
            if name == topic and idx == partition:
                out = (err, base)
    r.i32()  # throttle
    if out is None:
        raise ProtocolError("partition missing from Produce response")
    return out


# --------------------------------------------------------------------------
# ApiVersions v0


def api_versions(conn: Connection) -> dict[int, tuple[int, int]]:
    r = Reader(conn.request(API_API_VERSIONS, 0, b""))
    err = r.i16()
    if err != 0:
        raise ProtocolError(f"ApiVersions error {err}")
    out = {}
    for _ in range(r.count()):
        key, lo, hi = r.i16(), r.i16(), r.i16()
        out[key] = (lo, hi)
    return out


# --------------------------------------------------------------------------
# Metadata v1


@dataclass
class MetadataV1:
    brokers: dict[int, tuple[str, int]]
    controller_id: int
    topics: dict[str, dict[int, int]]  # topic -> partition -> leader


def metadata_v1(conn: Connection, topics: list[str] | None = None) -> MetadataV1:
    body = i32(-1) if topics is None else array([string(t) for t in topics])
    r = Reader(conn.request(API_METADATA, 1, body))
    brokers = {}
    for _ in range(r.count()):
        node, host, port, _rack = r.i32(), r.string(), r.i32(), r.string()
        brokers[node] = (host, port)
    controller = r.i32()
    topics_out: dict[str, dict[int, int]] = {}
    for _ in range(r.count()):
        _err, name, _internal = r.i16(), r.string(), r.i8()
        parts = {}
        for _ in range(r.count()):
            _perr, idx, leader = r.i16(), r.i32(), r.i32()
            for _ in range(r.count()):  # replicas
                r.i32()
            for _ in range(r.count()):  # isr
                r.i32()
            parts[idx] = leader
        topics_out[name] = parts
    return MetadataV1(brokers, controller, topics_out)


# --------------------------------------------------------------------------
# FindCoordinator v0-v2 (non-flexible)


def find_coordinator(conn: Connection, key: str, version: int = 2, key_type: int = 0):
    """Returns (error_code, node_id, host, port). v0-v2 classic, v3 flexible single key,
    v4+ batched (one key asked, its entry returned)."""
    if version == 3:
        body = compact_string(key) + i8(key_type) + NO_TAGS
        r = Reader(conn.request(API_FIND_COORDINATOR, 3, body, flexible=True))
        r.i32()  # throttle
        err = r.i16()
        r.compact_string()  # error message
        out = (err, r.i32(), r.compact_string(), r.i32())
        r.tagged_fields()
        return out
    if version >= 4:
        body = i8(key_type) + compact_array([compact_string(key)]) + NO_TAGS
        r = Reader(conn.request(API_FIND_COORDINATOR, version, body, flexible=True))
        r.i32()  # throttle
        found = None
        for _ in range(r.compact_count()):
            k, node, host, port, err = r.compact_string(), r.i32(), r.compact_string(), r.i32(), r.i16()
            r.compact_string()  # error message
            r.tagged_fields()
            if k == key:
                found = (err, node, host, port)
        r.tagged_fields()
        if found is None:
            raise ProtocolError(f"key {key!r} missing from FindCoordinator v{version} response")
        return found
    if version not in (0, 1, 2):
        raise ValueError(f"FindCoordinator v{version}")
    body = string(key) + (i8(key_type) if version >= 1 else b"")
    r = Reader(conn.request(API_FIND_COORDINATOR, version, body))
    if version >= 1:
        r.i32()  # throttle
    err = r.i16()
    if version >= 1:
        r.string()  # error message
    return err, r.i32(), r.string(), r.i32()


# --------------------------------------------------------------------------
# Fetch v4


@dataclass
class FetchPartition:
    partition: int
    error_code: int
    high_watermark: int
    last_stable_offset: int
    aborted_transactions: list[tuple[int, int]] | None
    records: bytes | None


def fetch_v4(
    conn: Connection,
    topic: str,
    partition: int,
    offset: int,
    max_bytes: int = 1 << 20,
    max_wait_ms: int = 100,
    isolation_level: int = 0,
) -> FetchPartition:
    body = (
        i32(-1)  # replica id
        + i32(max_wait_ms)
        + i32(1)  # min bytes
        + i32(max_bytes)
        + i8(isolation_level)
        + array([string(topic) + array([i32(partition) + i64(offset) + i32(max_bytes)])])
    )
    r = Reader(conn.request(API_FETCH, 4, body))
    r.i32()  # throttle
    found = None
    for _ in range(r.count()):
        name = r.string()
        for _ in range(r.count()):
            idx, err, hw, lso = r.i32(), r.i16(), r.i64(), r.i64()
            n = r.count()
            aborted = None if n == -1 else [(r.i64(), r.i64()) for _ in range(n)]
            recs = r.nbytes()
            if name == topic and idx == partition:
                found = FetchPartition(idx, err, hw, lso, aborted, recs)
    if r.remaining():
        raise ProtocolError(f"{r.remaining()} trailing bytes in Fetch v4 response")
    if found is None:
        raise ProtocolError(f"{topic}-{partition} missing from Fetch response")
    return found


# --------------------------------------------------------------------------
# Metadata v12 (flexible, topic ids) and Fetch v12-v17 (flexible; topic ids from v13)


def topic_ids_v12(conn: Connection, topics: list[str]) -> tuple[dict[str, bytes], dict[int, tuple[str, int]]]:
    """Metadata v12: returns ({topic: topic_id}, {node: (host, port)})."""
    body = (
        compact_array([b"\0" * 16 + compact_string(t) + NO_TAGS for t in topics])
        + i8(0)  # allow auto topic creation
        + i8(0)  # include topic authorized operations
        + NO_TAGS
    )
    r = Reader(conn.request(API_METADATA, 12, body, flexible=True))
    r.i32()  # throttle
    brokers = {}
    for _ in range(r.compact_count()):
        node, host, port, _rack = r.i32(), r.compact_string(), r.i32(), r.compact_string()
        r.tagged_fields()
        brokers[node] = (host, port)
    r.compact_string()  # cluster id
    r.i32()  # controller
    ids = {}
    for _ in range(r.compact_count()):
        _err, name, tid, _internal = r.i16(), r.compact_string(), r.uuid(), r.i8()
        for _ in range(r.compact_count()):
            r.i16(), r.i32(), r.i32(), r.i32()
            for _ in range(3):  # replicas, isr, offline
                for _ in range(r.compact_count()):
                    r.i32()
            r.tagged_fields()
        r.i32()  # authorized operations
        r.tagged_fields()
        ids[name] = tid
    r.tagged_fields()
    return ids, brokers


@dataclass
class FlexFetch:
    partition: FetchPartition
    log_start_offset: int
    preferred_read_replica: int
    partition_tags: dict[int, bytes]
    response_tags: dict[int, bytes]

    def node_endpoints(self) -> list[tuple[int, str, int]]:
        """The KIP-951 NodeEndpoints (response tag 0) as (node, host, port)."""
        raw = self.response_tags.get(0)
        if raw is None:
            return []
        r = Reader(raw)
        out = []
        for _ in range(r.compact_count()):
            node, host, port, _rack = r.i32(), r.compact_string(), r.i32(), r.compact_string()
            r.tagged_fields()
            out.append((node, host, port))
        return out


def fetch_flex(
    conn: Connection,
    version: int,
    topic: str,
    topic_id: bytes,
    partition: int,
    offset: int,
    max_bytes: int = 1 << 20,
    max_wait_ms: int = 100,
) -> FlexFetch:
    if not 12 <= version <= 17:
        raise ValueError("Fetch v12-v17 only")
    by_id = version >= 13
    key = topic_id if by_id else compact_string(topic)
    body = (i32(-1) if version <= 14 else b"") + i32(max_wait_ms) + i32(1) + i32(max_bytes) + i8(0)
    body += i32(0) + i32(-1)  # session id, session epoch (-1: no session)
    part = i32(partition) + i32(-1) + i64(offset) + i32(-1) + i64(-1) + i32(max_bytes) + NO_TAGS
    body += compact_array([key + compact_array([part]) + NO_TAGS])
    body += compact_array([])  # forgotten topics
    body += compact_string("")  # rack id
    body += NO_TAGS
    r = Reader(conn.request(API_FETCH, version, body, flexible=True))
    r.i32()  # throttle
    err = r.i16()
    if err != 0:
        raise ProtocolError(f"Fetch v{version} top-level error {err}")
    r.i32()  # session id
    found = None
    for _ in range(r.compact_count()):
        t = r.uuid() if by_id else r.compact_string()
        for _ in range(r.compact_count()):
            idx, perr, hw, lso, lso_start = r.i32(), r.i16(), r.i64(), r.i64(), r.i64()
            n = r.compact_count()
            aborted = None
            if n >= 0:
                aborted = []
                for _ in range(n):
                    aborted.append((r.i64(), r.i64()))
                    r.tagged_fields()
            prr = r.i32()
            recs = r.compact_bytes()
            ptags = r.tagged_fields()
            if t == (topic_id if by_id else topic) and idx == partition:
                found = (FetchPartition(idx, perr, hw, lso, aborted, recs), lso_start, prr, ptags)
        r.tagged_fields()
    rtags = r.tagged_fields()
    if r.remaining():
        raise ProtocolError(f"{r.remaining()} trailing bytes in Fetch v{version} response")
    if found is None:
        raise ProtocolError(f"{topic}-{partition} missing from Fetch v{version} response")
    return FlexFetch(found[0], found[1], found[2], found[3], rtags)


# --------------------------------------------------------------------------
# record batches (magic 2)

ATTR_COMPRESSION_MASK = 0x07
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20

CONTROL_ABORT = 0
CONTROL_COMMIT = 1


@dataclass
class Batch:
    base_offset: int
    length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    raw: bytes = field(repr=False)

    @property
    def compression(self) -> int:
        return self.attributes & ATTR_COMPRESSION_MASK

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    def crc_ok(self) -> bool:
        # CRC-32C covers everything from the attributes to the end of the batch.
        return crc32c.crc32c(self.raw[21:]) == self.crc

    def control_type(self) -> int:
        """The control record type (0 abort, 1 commit, ...) of an uncompressed control batch."""
        if not self.is_control or self.compression != 0:
            raise ProtocolError("not an uncompressed control batch")
        r = Reader(self.raw, 61)
        r.varint()  # record length
        r.i8()  # attributes
        r.varint()  # timestamp delta
        r.varint()  # offset delta
        klen = r.varint()
        key = Reader(r.take(klen))
        _version = key.i16()
        return key.i16()


def parse_batches(records: bytes | None) -> list[Batch]:
    """Splits a records field into complete magic-2 batches (a trailing partial batch is dropped,
    as Kafka allows a fetch response to end with one)."""
    out: list[Batch] = []
    if not records:
        return out
    pos = 0
    while len(records) - pos >= 61:
        r = Reader(records, pos)
        base_offset = r.i64()
        length = r.i32()
        if length < 49:
            raise ProtocolError(f"batch length {length} at {pos}")
        end = pos + 12 + length
        if end > len(records):
            break
        ple = r.i32()
        magic = r.i8()
        if magic != 2:
            raise ProtocolError(f"magic {magic} at {pos}")
        crc = r.u32()
        attrs = r.i16()
        lod = r.i32()
        bts = r.i64()
        mts = r.i64()
        pid = r.i64()
        pep = r.i16()
        bseq = r.i32()
        cnt = r.i32()
        out.append(
            Batch(base_offset, length, ple, magic, crc, attrs, lod, bts, mts, pid, pep, bseq, cnt, records[pos:end])
        )
        pos = end
    return out


def fetch_all_batches(
    host: str, port: int, topic: str, partition: int = 0, deadline_s: float = 10.0
) -> tuple[list[Batch], bytes]:
    """Fetches a partition from offset 0 to its high watermark (Fetch v4) and returns
    (batches, the concatenated complete-batch bytes)."""
    deadline = time.monotonic() + deadline_s
    batches: list[Batch] = []
    with Connection(host, port) as conn:
        offset = 0
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"fetching {topic}-{partition} did not finish in {deadline_s}s")
            fp = fetch_v4(conn, topic, partition, offset)
            if fp.error_code != 0:
                raise ProtocolError(f"fetch error {fp.error_code}")
            got = parse_batches(fp.records)
            if not got:
                if offset >= fp.high_watermark:
                    break
                continue
            batches.extend(got)
            offset = got[-1].base_offset + got[-1].last_offset_delta + 1
            if offset >= fp.high_watermark:
                break
    return batches, b"".join(b.raw for b in batches)
