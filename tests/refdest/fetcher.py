"""The mirror fetcher of the reference destination (stand-in for a stock destination
broker's mirror fetcher; tests and demo only).

Fetches like a follower: replica_id >= 0 (so the source reads up to its log end), from
the destination log end offset, Fetch v12 by topic name with LastFetchedEpoch (the
partition leader epoch of the last appended batch, which mirrorguard's seal stamps on its
batches) or v4. It talks to whatever address it is given: the source directly or a
mirrorguard ``[[mirror]]`` listener. Every returned batch is appended as it is (baseOffset
as served) through the replication path of ``PartitionLog.append_replicated``.
"""

from __future__ import annotations

import socket
import struct
import time

from .psm import PartitionFailed
from .wire import Reader, WireError, array, i8, i16, i32, i64, split_batches, string, tags, uvarint

API_FETCH = 1
API_METADATA = 3


class Conn:
    """One blocking client connection (request header v1/v2, response header v0/v1)."""

    def __init__(self, host: str, port: int, timeout: float = 10.0, client_id: str = "refdest-fetcher"):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.settimeout(timeout)
        self.client_id = client_id
        self.corr = 0

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def _recv(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            c = self.sock.recv(n - len(buf))
            if not c:
                raise WireError("connection closed")
            buf += c
        return bytes(buf)

    def request(self, api: int, version: int, body: bytes, flexible: bool) -> Reader:
        self.corr += 1
        header = i16(api) + i16(version) + i32(self.corr) + string(self.client_id) + tags(flexible)
        frame = header + body
        self.sock.sendall(i32(len(frame)) + frame)
        size = struct.unpack(">i", self._recv(4))[0]
        resp = self._recv(size)
        r = Reader(resp)
        if r.i32() != self.corr:
            raise WireError("correlation id mismatch")
        r.skip_tags(flexible)
        return r


def metadata_leader(conn: Conn, topic: str, partition: int) -> tuple[str, int]:
    """Metadata v1 for one topic: the leader's (host, port) as advertised."""
    r = conn.request(API_METADATA, 1, array([string(topic)]), False)
    brokers = {}
    for _ in range(r.count()):
        node, host, port = r.i32(), r.string(), r.i32()
        r.string()
        brokers[node] = (host, port)
    r.i32()
    for _ in range(r.count()):
        err, name, _ = r.i16(), r.string(), r.i8()
        for _ in range(r.count()):
            perr, idx, leader = r.i16(), r.i32(), r.i32()
            for _ in range(r.count()):
                r.i32()
            for _ in range(r.count()):
                r.i32()
            if name == topic and idx == partition:
                if err or perr or leader not in brokers:
                    raise WireError(f"no leader for {topic}-{partition} (errors {err}/{perr})")
                return brokers[leader]
    raise WireError(f"{topic} missing from Metadata")


def fetch(conn: Conn, version: int, topic: str, partition: int, offset: int, last_fetched_epoch: int,
          replica_id: int, max_wait_ms: int = 100, max_bytes: int = 1 << 20,
          isolation_level: int = 0) -> tuple[int, int, bytes | None]:
    """One Fetch for one partition: (error code, high watermark, records)."""
    flex = version >= 12
    body = i32(replica_id) + i32(max_wait_ms) + i32(1) + i32(max_bytes) + i8(isolation_level)
    if version >= 7:
        body += i32(0) + i32(-1)  # no fetch session
    part = i32(partition)
    if version >= 9:
        part += i32(-1)  # current leader epoch: unknown
    part += i64(offset)
    if version >= 12:
        part += i32(last_fetched_epoch)
    if version >= 5:
        part += i64(-1)  # log start offset (follower's)
    part += i32(max_bytes) + tags(flex)
    body += array([string(topic, flex) + array([part], flex) + tags(flex)], flex)
    if version >= 7:
        body += array([], flex)  # forgotten topics
    if version >= 11:
        body += string("", flex)  # rack
    body += tags(flex)
    r = conn.request(API_FETCH, version, body, flex)
    r.i32()  # throttle
    if version >= 7:
        top = r.i16()
        r.i32()
        if top:
            return top, -1, None
    found = None
    for _ in range(r.count(flex)):
        name = r.string(flex)
        for _ in range(r.count(flex)):
            idx, err, hw, _lso = r.i32(), r.i16(), r.i64(), r.i64()
            if version >= 5:
                r.i64()
            for _ in range(max(r.count(flex), 0)):
                r.i64(), r.i64()
                r.skip_tags(flex)
            if version >= 11:
                r.i32()
            recs = r.nbytes(flex)
            r.skip_tags(flex)
            if name == topic and idx == partition:
                found = (err, hw, recs)
        r.skip_tags(flex)
    r.skip_tags(flex)
    if found is None:
        raise WireError(f"{topic}-{partition} missing from Fetch v{version} response")
    return found


class MirrorLink:
    """One mirrored partition: source address -> destination partition log.

    ``rebase``: the source's offsets differ from the destination's (a destination fed from a
    NEW source, as in source reassignment with Tansu sources): the link keeps its own source
    position and appends batches at the destination's offsets (baseOffset relabelled,
    outside the CRC)."""

    def __init__(self, dest, bootstrap: str, topic: str, partition: int = 0, *, version: int = 12,
                 replica_id: int | None = None, rebase: bool = False, source_offset: int = 0,
                 source_topic: str | None = None):
        self.dest = dest
        self.log = dest.partition(topic, partition)
        self.bootstrap = bootstrap
        self.source_topic = source_topic or topic
        self.partition = partition
        self.version = version
        self.replica_id = dest.broker_id if replica_id is None else replica_id
        self.rebase = rebase
        self.source_offset = source_offset
        self.last_fetched_epoch = -1
        self.conn: Conn | None = None
        self.fetches = 0
        self.appended = 0
        self.stopped = False

    def _connect(self) -> Conn:
        if self.conn is None:
            host, port = self.bootstrap.rsplit(":", 1)
            boot = Conn(host, int(port), timeout=5)
            try:
                lhost, lport = metadata_leader(boot, self.source_topic, self.partition)
            finally:
                boot.close()
            self.conn = Conn(lhost, lport, timeout=10)
        return self.conn

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    @property
    def position(self) -> int:
        """The fetch offset of the next Fetch (the destination LEO unless rebased)."""
        return self.source_offset if self.rebase else self.log.leo

    def fetch_once(self, max_wait_ms: int = 100) -> int:
        """One Fetch; appends what came back; returns the number of batches appended.
        Raises PartitionFailed when the replication path failed the partition."""
        if self.log.failed:
            raise PartitionFailed(self.log.failed)
        conn = self._connect()
        offset = self.position
        try:
            err, _hw, recs = fetch(conn, self.version, self.source_topic, self.partition, offset,
                                   self.last_fetched_epoch, self.replica_id, max_wait_ms)
        except (OSError, WireError):
            self.close()
            raise
        self.fetches += 1
        if err:
            raise WireError(f"Fetch error {err} for {self.source_topic}-{self.partition} at {offset}")
        n = 0
        with self.dest.cond:
            for b in split_batches(recs):
                if b.last_offset < offset:
                    continue  # fetch landed mid-batch
                if self.rebase:
                    self.source_offset = b.last_offset + 1
                    b = b.with_base_offset(self.log.leo)
                self.log.append_replicated(b)
                self.last_fetched_epoch = b.partition_leader_epoch
                n += 1
        self.appended += n
        return n

    def follow(self, until, timeout: float = 15.0, what: str = "condition") -> None:
        """Fetches until ``until(link)`` holds (deadline-bounded)."""
        deadline = time.monotonic() + timeout
        while not until(self):
            if time.monotonic() > deadline:
                raise TimeoutError(f"stand-in fetcher: {what} not reached in {timeout}s "
                                   f"(position {self.position}, log {self.log.offset_of_kind()})")
            self.fetch_once()

    def catch_up(self, source_end: int, timeout: float = 15.0) -> None:
        self.follow(lambda l: l.position >= source_end, timeout, f"position {source_end}")


def source_end_offset(bootstrap: str, topic: str, partition: int = 0) -> int:
    """The source's high watermark (Fetch v4 as a consumer, 1 byte)."""
    host, port = bootstrap.rsplit(":", 1)
    c = Conn(host, int(port), timeout=5, client_id="refdest-probe")
    try:
        lhost, lport = metadata_leader(c, topic, partition)
    finally:
        c.close()
    c = Conn(lhost, lport, timeout=5, client_id="refdest-probe")
    try:
        err, hw, _ = fetch(c, 4, topic, partition, 0, -1, -1, max_wait_ms=100, max_bytes=1)
        if err:
            raise WireError(f"Fetch error {err}")
        return hw
    finally:
        c.close()
