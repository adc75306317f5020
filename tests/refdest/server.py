"""A tiny Kafka broker on 127.0.0.1 serving the reference destination's log (stand-in
for a stock destination broker; tests and demo only), so that the next hop (chain,
failback) and real librdkafka consumers and producers can use it.

APIs: ApiVersions 0-3, Metadata 1-12, Fetch 4-12 (follower fetches read to the log end;
consumers to the high watermark, read_committed to the last stable offset with
aborted_transactions from the log's ABORT markers), ListOffsets 1-5, FindCoordinator 0-3,
and after promotion Produce 3-8, InitProducerId 0-1, AddPartitionsToTxn 0-2, EndTxn 0-2.
No fetch sessions (session id 0), no security.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time

from .wire import Reader, WireError, array, i8, i16, i32, i64, nbytes, string, tags, uvarint

LOG = logging.getLogger("refdest.server")
HOST = "127.0.0.1"

PRODUCE, FETCH, LIST_OFFSETS, METADATA, FIND_COORDINATOR, API_VERSIONS = 0, 1, 2, 3, 10, 18
INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN, END_TXN = 22, 24, 26
VERSIONS = {
    PRODUCE: (3, 8), FETCH: (4, 12), LIST_OFFSETS: (1, 5), METADATA: (1, 12), FIND_COORDINATOR: (0, 3),
    API_VERSIONS: (0, 3), INIT_PRODUCER_ID: (0, 1), ADD_PARTITIONS_TO_TXN: (0, 2), END_TXN: (0, 2),
}
FLEX_FROM = {PRODUCE: 9, FETCH: 12, LIST_OFFSETS: 6, METADATA: 9, FIND_COORDINATOR: 3, API_VERSIONS: 3,
             INIT_PRODUCER_ID: 2, ADD_PARTITIONS_TO_TXN: 3, END_TXN: 3}
MAX_WAIT_CAP_S = 0.5


class KafkaServer:
    def __init__(self, dest):
        self.dest = dest
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((HOST, 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.threads: list[threading.Thread] = []
        self.running = False
        self.requests: dict[int, int] = {}
        self.lock = threading.Lock()

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def start(self) -> "KafkaServer":
        self.running = True
        t = threading.Thread(target=self._accept, name=f"refdest-{self.dest.name}-accept", daemon=True)
        t.start()
        self.threads.append(t)
        return self

    def stop(self) -> None:
        self.running = False
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        with self.lock:
            conns = list(self.conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()
        with self.dest.cond:
            self.dest.cond.notify_all()
        for t in self.threads:
            t.join(5)

    # ------------------------------------------------------------------ plumbing

    def _accept(self) -> None:
        while self.running:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.conns.append(c)
            t = threading.Thread(target=self._serve, args=(c,), daemon=True)
            t.start()
            self.threads.append(t)

    def _recv(self, c: socket.socket, n: int) -> bytes | None:
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = c.recv(n - len(buf))
            except OSError:
                return None
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)

    def _serve(self, c: socket.socket) -> None:
        try:
            while self.running:
                head = self._recv(c, 4)
                if head is None:
                    return
                size = struct.unpack(">i", head)[0]
                if size < 8 or size > 100 << 20:
                    return
                frame = self._recv(c, size)
                if frame is None:
                    return
                r = Reader(frame)
                api, version, corr = r.i16(), r.i16(), r.i32()
                r.string()  # client id
                lo_hi = VERSIONS.get(api)
                flex = lo_hi is not None and version >= FLEX_FROM[api]
                if flex:
                    r.skip_tags()
                with self.lock:
                    self.requests[api] = self.requests.get(api, 0) + 1
                if api == API_VERSIONS:
                    body = self._api_versions(version)
                    resp_flex = False  # ApiVersions responses always use header v0
                elif lo_hi is None or not lo_hi[0] <= version <= lo_hi[1]:
                    LOG.warning("stand-in: unsupported api %s v%s", api, version)
                    return
                else:
                    body = getattr(self, f"_api_{api}")(r, version, flex)
                    resp_flex = flex
                    if body is None:  # Produce acks=0
                        continue
                out = i32(corr) + (b"\x00" if resp_flex else b"") + body
                c.sendall(i32(len(out)) + out)
        except (OSError, WireError) as e:
            LOG.info("stand-in server connection closed: %s", e)
        finally:
            try:
                c.close()
            except OSError:
                pass
            with self.lock:
                if c in self.conns:
                    self.conns.remove(c)

    # ------------------------------------------------------------------ ApiVersions

    def _api_versions(self, version: int) -> bytes:
        if version > 3:
            version = 0
            err = 35
        else:
            err = 0
        flex = version >= 3
        keys = [i16(k) + i16(lo) + i16(hi) + tags(flex) for k, (lo, hi) in sorted(VERSIONS.items())]
        out = i16(err) + array(keys, flex)
        if version >= 1:
            out += i32(0)
        return out + tags(flex)

    # ------------------------------------------------------------------ Metadata (3)

    def _api_3(self, r: Reader, v: int, flex: bool) -> bytes:
        n = r.count(flex)
        wanted = None
        if n >= 0:
            wanted = []
            for _ in range(n):
                if v >= 10:
                    r.take(16)
                wanted.append(r.string(flex))
                r.skip_tags(flex)
        d = self.dest
        with d.cond:
            topics: dict[str, list[int]] = {}
            for (t, p) in d.partitions:
                topics.setdefault(t, []).append(p)
        names = sorted(topics) if wanted is None else wanted
        out = i32(0) if v >= 3 else b""
        out += array([i32(d.broker_id) + string(HOST, flex) + i32(self.port) + string(None, flex) + tags(flex)], flex)
        if v >= 2:
            out += string(d.cluster_id, flex)
        out += i32(d.broker_id)
        tops = []
        for name in names:
            parts = sorted(topics.get(name, []))
            t = i16(0 if parts else 3) + string(name, flex)
            if v >= 10:
                t += d.topic_ids.get(name, b"\x00" * 16)
            t += i8(0)
            plist = []
            for p in parts:
                e = i16(0) + i32(p) + i32(d.broker_id)
                if v >= 7:
                    e += i32(d.leader_epoch)
                e += array([i32(d.broker_id)], flex) + array([i32(d.broker_id)], flex)
                if v >= 5:
                    e += array([], flex)
                plist.append(e + tags(flex))
            t += array(plist, flex)
            if v >= 8:
                t += i32(-2147483648)
            tops.append(t + tags(flex))
        out += array(tops, flex)
        if 8 <= v <= 10:
            out += i32(-2147483648)
        return out + tags(flex)

    # ------------------------------------------------------------------ Fetch (1)

    def _api_1(self, r: Reader, v: int, flex: bool) -> bytes:
        replica_id, max_wait, _min_bytes, max_bytes, isolation = r.i32(), r.i32(), r.i32(), r.i32(), r.i8()
        if v >= 7:
            r.i32(), r.i32()
        req = []
        for _ in range(r.count(flex)):
            name = r.string(flex)
            parts = []
            for _ in range(r.count(flex)):
                p = r.i32()
                if v >= 9:
                    r.i32()
                off = r.i64()
                if v >= 12:
                    r.i32()
                if v >= 5:
                    r.i64()
                pmax = r.i32()
                r.skip_tags(flex)
                parts.append((p, off, pmax))
            r.skip_tags(flex)
            req.append((name, parts))
        d = self.dest
        follower = replica_id >= 0

        def build():
            topics = []
            any_data = False
            for name, parts in req:
                plist = []
                for p, off, pmax in parts:
                    log = d.partitions.get((name, p))
                    if log is None:
                        plist.append((p, 3, -1, -1, None, None))
                        continue
                    hw = log.high_watermark
                    lso = log.last_stable_offset
                    if off > log.leo or off < 0:
                        plist.append((p, 1, hw, lso, None, None))  # OFFSET_OUT_OF_RANGE
                        continue
                    upper = log.leo if follower else (lso if isolation == 1 else hw)
                    recs = log.read(off, min(pmax, max_bytes), upper)
                    aborted = log.aborted_transactions(off, upper) if (isolation == 1 and not follower) else None
                    any_data = any_data or bool(recs)
                    plist.append((p, 0, hw, lso, aborted, recs))
                topics.append((name, plist))
            return topics, any_data

        deadline = time.monotonic() + min(max_wait / 1000.0, MAX_WAIT_CAP_S)
        with d.cond:
            topics, any_data = build()
            while not any_data and self.running:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                d.cond.wait(left)
                topics, any_data = build()
        out = i32(0)
        if v >= 7:
            out += i16(0) + i32(0)
        tl = []
        for name, plist in topics:
            ps = []
            for p, err, hw, lso, aborted, recs in plist:
                e = i32(p) + i16(err) + i64(hw) + i64(lso)
                if v >= 5:
                    e += i64(0)
                e += array(None if aborted is None else [i64(pid) + i64(first) + tags(flex) for pid, first in aborted],
                           flex)
                if v >= 11:
                    e += i32(-1)
                e += nbytes(recs if recs is not None else (b"" if err == 0 else None), flex)
                ps.append(e + tags(flex))
            tl.append(string(name, flex) + array(ps, flex) + tags(flex))
        return out + array(tl, flex) + tags(flex)

    # ------------------------------------------------------------------ ListOffsets (2)

    def _api_2(self, r: Reader, v: int, flex: bool) -> bytes:
        r.i32()
        isolation = r.i8() if v >= 2 else 0
        d = self.dest
        tl = []
        for _ in range(r.count()):
            name = r.string()
            ps = []
            for _ in range(r.count()):
                p = r.i32()
                if v >= 4:
                    r.i32()
                ts = r.i64()
                log = d.partitions.get((name, p))
                if log is None:
                    e = i32(p) + i16(3) + i64(-1) + i64(-1)
                else:
                    off = 0 if ts == -2 else (log.last_stable_offset if isolation == 1 else log.high_watermark)
                    e = i32(p) + i16(0) + i64(-1) + i64(off)
                if v >= 4:
                    e += i32(d.leader_epoch)
                ps.append(e)
            tl.append(string(name) + array(ps))
        return (i32(0) if v >= 2 else b"") + array(tl)

    # ------------------------------------------------------------------ FindCoordinator (10)

    def _api_10(self, r: Reader, v: int, flex: bool) -> bytes:
        r.string(flex)
        d = self.dest
        if v == 0:
            return i16(0) + i32(d.broker_id) + string(HOST) + i32(self.port)
        return (i32(0) + i16(0) + string(None, flex) + i32(d.broker_id) + string(HOST, flex) + i32(self.port)
                + tags(flex))

    # ------------------------------------------------------------------ InitProducerId (22)

    def _api_22(self, r: Reader, v: int, flex: bool) -> bytes:
        txn_id = r.string()
        r.i32()
        try:
            pid, epoch = self.dest.init_producer_id(txn_id)
            err = 0
        except Exception as e:  # noqa: BLE001 - NOT_LEADER_OR_FOLLOWER before promotion
            pid, epoch, err = -1, -1, getattr(e, "code", 6)
        return i32(0) + i16(err) + i64(pid) + i16(epoch)

    # ------------------------------------------------------------------ AddPartitionsToTxn (24)

    def _api_24(self, r: Reader, v: int, flex: bool) -> bytes:
        txn_id, pid, epoch = r.string(), r.i64(), r.i16()
        req = []
        for _ in range(r.count()):
            name = r.string()
            req.append((name, [r.i32() for _ in range(r.count())]))
        err = self.dest.add_partitions_to_txn(txn_id, pid, epoch, [(n, p) for n, ps in req for p in ps])
        return i32(0) + array([string(n) + array([i32(p) + i16(err) for p in ps]) for n, ps in req])

    # ------------------------------------------------------------------ EndTxn (26)

    def _api_26(self, r: Reader, v: int, flex: bool) -> bytes:
        txn_id, pid, epoch, commit = r.string(), r.i64(), r.i16(), r.i8()
        return i32(0) + i16(self.dest.end_txn(txn_id, pid, epoch, bool(commit)))

    # ------------------------------------------------------------------ Produce (0)

    def _api_0(self, r: Reader, v: int, flex: bool) -> bytes | None:
        r.string()  # transactional id
        acks = r.i16()
        r.i32()
        results = []
        for _ in range(r.count()):
            name = r.string()
            ps = []
            for _ in range(r.count()):
                p = r.i32()
                records = r.nbytes() or b""
                err, base = self.dest.produce(name, p, records)
                ps.append((p, err, base))
            results.append((name, ps))
        if acks == 0:
            return None
        tl = []
        for name, ps in results:
            pl = []
            for p, err, base in ps:
                e = i32(p) + i16(err) + i64(base) + i64(-1)
                if v >= 5:
                    e += i64(0)
                if v >= 8:
                    e += array([]) + string(None)
                pl.append(e)
            tl.append(string(name) + array(pl))
        return array(tl) + i32(0)
