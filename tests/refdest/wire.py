"""Kafka wire primitives for the reference destination (stand-in for a stock destination
broker; tests and demo only). Self-contained: struct + the ``crc32c`` package."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import crc32c


class WireError(Exception):
    pass


def i8(v: int) -> bytes:
    return struct.pack(">b", v)


def i16(v: int) -> bytes:
    return struct.pack(">h", v)


def i32(v: int) -> bytes:
    return struct.pack(">i", v)


def i64(v: int) -> bytes:
    return struct.pack(">q", v)


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


def varint(v: int) -> bytes:
    return uvarint((v << 1) ^ (v >> 63) if v < 0 else v << 1)


def string(s: str | None, flexible: bool = False) -> bytes:
    if flexible:
        if s is None:
            return uvarint(0)
        b = s.encode()
        return uvarint(len(b) + 1) + b
    if s is None:
        return i16(-1)
    b = s.encode()
    return i16(len(b)) + b


def nbytes(b: bytes | None, flexible: bool = False) -> bytes:
    if flexible:
        return uvarint(0) if b is None else uvarint(len(b) + 1) + b
    return i32(-1) if b is None else i32(len(b)) + b


def array(items: list[bytes] | None, flexible: bool = False) -> bytes:
    if items is None:
        return uvarint(0) if flexible else i32(-1)
    head = uvarint(len(items) + 1) if flexible else i32(len(items))
    return head + b"".join(items)


def tags(flexible: bool) -> bytes:
    return b"\x00" if flexible else b""


class Reader:
    """Bounds-checked reader; every short read raises WireError."""

    def __init__(self, buf: bytes, pos: int = 0):
        self.buf = buf
        self.pos = pos

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise WireError(f"need {n} bytes at {self.pos}, have {len(self.buf) - self.pos}")
        b = self.buf[self.pos : self.pos + n]
        self.pos += n
        return b

    def i8(self) -> int:
        return struct.unpack(">b", self.take(1))[0]

    def i16(self) -> int:
        return struct.unpack(">h", self.take(2))[0]

    def i32(self) -> int:
        return struct.unpack(">i", self.take(4))[0]

    def i64(self) -> int:
        return struct.unpack(">q", self.take(8))[0]

    def uvarint(self) -> int:
        shift = v = 0
        while True:
            b = self.take(1)[0]
            v |= (b & 0x7F) << shift
            if not b & 0x80:
                return v
            shift += 7
            if shift > 63:
                raise WireError("varint too long")

    def varint(self) -> int:
        raw = self.uvarint()
        return (raw >> 1) ^ -(raw & 1)

    def string(self, flexible: bool = False) -> str | None:
        if flexible:
            n = self.uvarint() - 1
        else:
            n = self.i16()
        if n < 0:
            return None
        return self.take(n).decode()

    def nbytes(self, flexible: bool = False) -> bytes | None:
        n = self.uvarint() - 1 if flexible else self.i32()
        return None if n < 0 else self.take(n)

    def count(self, flexible: bool = False) -> int:
        n = self.uvarint() - 1 if flexible else self.i32()
        if n > len(self.buf) - self.pos:
            raise WireError(f"implausible array length {n}")
        return n

    def skip_tags(self, flexible: bool = True) -> None:
        if not flexible:
            return
        for _ in range(self.uvarint()):
            self.uvarint()
            self.take(self.uvarint())

    def remaining(self) -> int:
        return len(self.buf) - self.pos


# ----------------------------------------------------------------------------- batches

ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20
CONTROL_ABORT = 0
CONTROL_COMMIT = 1
CONTROL_MIRROR_PID_RESET = 7


@dataclass
class Batch:
    """One magic-2 record batch (header fields; `raw` is the whole batch)."""

    base_offset: int
    partition_leader_epoch: int
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
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def compression(self) -> int:
        return self.attributes & 0x07

    def has_producer_id(self) -> bool:
        # AbstractRecordBatch.hasProducerId(): `RecordBatch.NO_PRODUCER_ID < producerId()`,
        # i.e. pid > -1: every negative PID counts as "no producer".
        return self.producer_id > -1

    @property
    def last_sequence(self) -> int:
        # DefaultRecordBatch.lastSequence / incrementSequence (wraps at Int.MAX).
        if self.base_sequence < 0:
            return -1
        s = self.base_sequence + self.last_offset_delta
        return s - (1 << 31) if s > 0x7FFFFFFF else s

    def crc_ok(self) -> bool:
        return crc32c.crc32c(self.raw[21:]) == self.crc

    def first_record_key_value(self) -> tuple[bytes | None, bytes | None]:
        """Key and value of the first record of an uncompressed batch."""
        if self.record_count <= 0:
            return None, None
        if self.compression != 0:
            raise WireError("compressed control batch")
        r = Reader(self.raw, 61)
        r.varint()  # length
        r.i8()  # attributes
        r.varint()  # timestamp delta
        r.varint()  # offset delta
        kl = r.varint()
        key = None if kl < 0 else r.take(kl)
        vl = r.varint()
        value = None if vl < 0 else r.take(vl)
        return key, value

    def control_type(self) -> int | None:
        """ControlRecordType id of the first record (None if no records)."""
        key, _ = self.first_record_key_value()
        if key is None:
            return None
        if len(key) < 4:
            raise WireError("control key shorter than 4 bytes")
        return struct.unpack(">hh", key[:4])[1]

    def end_txn_coordinator_epoch(self) -> int:
        _, value = self.first_record_key_value()
        if value is None or len(value) < 6:
            raise WireError("EndTxnMarker value shorter than 6 bytes")
        return struct.unpack(">hi", value[:6])[1]

    def with_base_offset(self, base_offset: int, leader_epoch: int | None = None) -> "Batch":
        """baseOffset and partitionLeaderEpoch lie outside the CRC (bytes 0..20)."""
        raw = bytearray(self.raw)
        raw[0:8] = i64(base_offset)
        if leader_epoch is not None:
            raw[12:16] = i32(leader_epoch)
        return parse_batch(bytes(raw))


def parse_batch(raw: bytes) -> Batch:
    r = Reader(raw)
    base = r.i64()
    length = r.i32()
    if length + 12 != len(raw):
        raise WireError(f"batch length {length} vs {len(raw)} bytes")
    ple = r.i32()
    magic = r.i8()
    if magic != 2:
        raise WireError(f"magic {magic}")
    crc = struct.unpack(">I", r.take(4))[0]
    return Batch(base, ple, crc, r.i16(), r.i32(), r.i64(), r.i64(), r.i64(), r.i16(), r.i32(), r.i32(), raw)


def split_batches(records: bytes | None) -> list[Batch]:
    """Complete magic-2 batches of a records field; a truncated tail is dropped (as Kafka)."""
    out: list[Batch] = []
    if not records:
        return out
    pos = 0
    while len(records) - pos >= 61:
        length = struct.unpack(">i", records[pos + 8 : pos + 12])[0]
        if length < 49:
            raise WireError(f"batch length {length} at {pos}")
        end = pos + 12 + length
        if end > len(records):
            break
        out.append(parse_batch(records[pos:end]))
        pos = end
    return out


def build_batch(
    values: list[bytes],
    *,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
    control: bool = False,
    keys: list[bytes | None] | None = None,
    timestamp_ms: int = 0,
    base_offset: int = 0,
    leader_epoch: int = -1,
) -> bytes:
    """An uncompressed magic-2 batch (what a client sends), CRC-32C computed."""
    recs = b""
    for i, v in enumerate(values):
        k = keys[i] if keys else None
        body = (
            i8(0)
            + varint(0)
            + varint(i)
            + (varint(-1) if k is None else varint(len(k)) + k)
            + (varint(-1) if v is None else varint(len(v)) + v)
            + varint(0)
        )
        recs += varint(len(body)) + body
    attrs = (ATTR_TRANSACTIONAL if transactional else 0) | (ATTR_CONTROL if control else 0)
    after_crc = (
        i16(attrs)
        + i32(len(values) - 1)
        + i64(timestamp_ms)
        + i64(timestamp_ms)
        + i64(producer_id)
        + i16(producer_epoch)
        + i32(base_sequence)
        + i32(len(values))
        + recs
    )
    crc = crc32c.crc32c(after_crc)
    body = i32(leader_epoch) + i8(2) + struct.pack(">I", crc) + after_crc
    return i64(base_offset) + i32(len(body)) + body


def build_end_txn_marker(pid: int, epoch: int, commit: bool, coordinator_epoch: int = 0,
                         timestamp_ms: int = 0) -> bytes:
    """MemoryRecords.withEndTransactionMarker: attributes 0x30, seq -1, one record."""
    key = i16(0) + i16(CONTROL_COMMIT if commit else CONTROL_ABORT)
    value = i16(0) + i32(coordinator_epoch)
    body = i8(0) + varint(0) + varint(0) + varint(len(key)) + key + varint(len(value)) + value + varint(0)
    recs = varint(len(body)) + body
    after_crc = (i16(ATTR_TRANSACTIONAL | ATTR_CONTROL) + i32(0) + i64(timestamp_ms) + i64(timestamp_ms)
                 + i64(pid) + i16(epoch) + i32(-1) + i32(1) + recs)
    crc = crc32c.crc32c(after_crc)
    b = i32(-1) + i8(2) + struct.pack(">I", crc) + after_crc
    return i64(0) + i32(len(b)) + b
