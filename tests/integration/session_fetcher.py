"""A destination fetcher that keeps KIP-227 incremental fetch sessions, the way a broker's
replica fetcher does (Kafka's FetchSessionHandler): for tests of the mirror fetch path.

- Fetch v12 (topics by name) or v13 (by id), flexible, LastFetchedEpoch per partition.
- The first request of a session is full (session id 0, epoch 0) and lists every partition;
  the response's session id opens the session; the following requests are incremental
  (epoch 1, 2, ...) and list only partitions whose fetch state (offset, epoch) changed since
  they were last sent; partitions taken out go in forgotten_topics_data.
- FETCH_SESSION_ID_NOT_FOUND (70) and INVALID_FETCH_SESSION_EPOCH (71) are counted and
  make the next request a full one (a new session), as Kafka's handler does.
- An incremental response may only carry partitions of the session (Kafka's handler checks
  this and fails the response otherwise); a full response only those asked for.
- Each partition has a log: appended batches must start at or after its log end offset
  and be monotonic (the replication path's rule); every batch is checked independently
  (mirror_harness.check_batch: CRC-32C, layout).
- `lose_next_response()` reads and drops the next response, then starts over with a full
  fetch from the same positions (what a fetcher does after a lost response).

Only the mirror listener's advertised leader (one node) is used: the test sources are
single-node clusters.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import rawkafka
from mirror_harness import HOST, CheckedBatch, check_batch, split_batches
from rawkafka import NO_TAGS, Reader, compact_array, compact_string, i8, i32, i64

FETCH_SESSION_ID_NOT_FOUND = 70
INVALID_FETCH_SESSION_EPOCH = 71
SESSION_ERRORS = (FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH)


@dataclass
class PartitionLog:
    """The destination log of one partition as the fetcher builds it."""

    leo: int = 0
    last_fetched_epoch: int = -1
    batches: list[CheckedBatch] = field(default_factory=list)
    # Every batch any response carried for the partition (with the request number),
    # appended or not: what reached the fetcher.
    received: list[tuple[int, CheckedBatch]] = field(default_factory=list)
    high_watermark: int = -1
    errors: list[int] = field(default_factory=list)
    # Batches a replication path would refuse (below the log end offset).
    violations: list[str] = field(default_factory=list)


@dataclass
class Response:
    top_error: int
    session_id: int
    # (topic, partition) -> (error, high watermark, records or None)
    partitions: dict[tuple[str, int], tuple[int, int, bytes | None]]


class SessionFetcher:
    def __init__(self, topic: str, partitions: list[int], version: int = 12, replica_id: int = -1,
                 max_wait_ms: int = 100):
        assert version in (12, 13)
        self.topic = topic
        self.version = version
        self.replica_id = replica_id
        self.max_wait_ms = max_wait_ms
        self.logs: dict[int, PartitionLog] = {p: PartitionLog() for p in partitions}
        self.session_id = 0
        self.epoch = 0  # 0: the next request is full
        # What the upstream's session holds, as this fetcher last told it: partition -> (offset, epoch)
        self.sent: dict[int, tuple[int, int]] = {}
        self.wanted = set(partitions)
        self.session_errors: list[int] = []
        self.requests = 0
        self.incremental_requests = 0
        self.conn: rawkafka.Connection | None = None
        self.topic_id: bytes | None = None
        self._lose_next = False
        self.responses: list[Response] = []

    # ------------------------------------------------------------------ connection

    def connect(self, bootstrap: str) -> "SessionFetcher":
        self.close()
        host, port = bootstrap.rsplit(":", 1)
        with rawkafka.Connection(host, int(port), timeout=5) as c:
            md = rawkafka.metadata_v1(c, [self.topic])
            leaders = {md.topics[self.topic][p] for p in self.logs}
            assert len(leaders) == 1, leaders
            lhost, lport = md.brokers[leaders.pop()]
            if self.version >= 13:
                ids, _ = rawkafka.topic_ids_v12(c, [self.topic])
                self.topic_id = ids[self.topic]
        assert lhost == HOST
        self.conn = rawkafka.Connection(lhost, lport, timeout=15)
        return self

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    # ------------------------------------------------------------------ requests

    def _topic_key(self) -> bytes:
        return self.topic_id if self.version >= 13 else compact_string(self.topic)

    def _state(self, p: int) -> tuple[int, int]:
        log = self.logs[p]
        return log.leo, log.last_fetched_epoch

    def _build(self) -> tuple[bytes, list[int], list[int]]:
        full = self.epoch == 0
        if full:
            listed = sorted(self.wanted)
            forgotten: list[int] = []
        else:
            listed = sorted(p for p in self.wanted if self.sent.get(p) != self._state(p))
            forgotten = sorted(p for p in self.sent if p not in self.wanted)
        body = (i32(self.replica_id) + i32(self.max_wait_ms) + i32(1) + i32(1 << 20) + i8(0)
                + i32(self.session_id if not full else 0) + i32(self.epoch))
        parts = []
        for p in listed:
            offset, epoch = self._state(p)
            parts.append(i32(p) + i32(-1) + i64(offset) + i32(epoch) + i64(-1) + i32(1 << 20) + NO_TAGS)
        topics = [self._topic_key() + compact_array(parts) + NO_TAGS] if parts else []
        body += compact_array(topics)
        fg = [self._topic_key() + compact_array([i32(p) for p in forgotten]) + NO_TAGS] if forgotten else []
        body += compact_array(fg) + compact_string("") + NO_TAGS
        return body, listed, forgotten

    def _parse(self, raw: bytes) -> Response:
        r = Reader(raw)
        r.i32()  # throttle
        top = r.i16()
        sid = r.i32()
        out: dict[tuple[str, int], tuple[int, int, bytes | None]] = {}
        for _ in range(r.compact_count()):
            t = r.uuid() if self.version >= 13 else r.compact_string()
            name = self.topic if (self.version >= 13 and t == self.topic_id) else t
            for _ in range(r.compact_count()):
                idx, perr, hw, _lso, _ls = r.i32(), r.i16(), r.i64(), r.i64(), r.i64()
                n = r.compact_count()
                for _ in range(max(n, 0)):
                    r.i64(), r.i64()
                    r.tagged_fields()
                r.i32()  # preferred read replica
                recs = r.compact_bytes()
                r.tagged_fields()
                key = (name, idx)
                assert key not in out, f"partition {key} twice in one response"
                out[key] = (perr, hw, recs)
            r.tagged_fields()
        r.tagged_fields()
        if r.remaining():
            raise rawkafka.ProtocolError(f"{r.remaining()} trailing bytes in a Fetch response")
        return Response(top, sid, out)

    def lose_next_response(self) -> None:
        self._lose_next = True

    def fetch_once(self) -> Response:
        """One request/response; appends what came back. Returns the parsed response."""
        assert self.conn is not None
        full = self.epoch == 0
        body, listed, forgotten = self._build()
        self.requests += 1
        self.incremental_requests += int(not full)
        raw = self.conn.request(rawkafka.API_FETCH, self.version, body, flexible=True)
        res = self._parse(raw)
        self.responses.append(res)
        if self._lose_next:
            # The response never arrived: a broker's fetcher closes the session and
            # fetches again, fully, from the positions it has.
            self._lose_next = False
            self.session_id, self.epoch, self.sent = 0, 0, {}
            return res
        if res.top_error:
            # Kafka answers a request-level error with no partition at all.
            assert not res.partitions, f"error {res.top_error} response carries {sorted(res.partitions)}"
        if res.top_error in SESSION_ERRORS:
            self.session_errors.append(res.top_error)
            self.session_id, self.epoch, self.sent = 0, 0, {}
            return res
        if res.top_error:
            raise rawkafka.ProtocolError(f"Fetch top-level error {res.top_error}")
        # What the session holds now (as this fetcher told it)
        if full:
            self.sent = {p: self._state(p) for p in listed}
        else:
            for p in forgotten:
                self.sent.pop(p, None)
            for p in listed:
                self.sent[p] = self._state(p)
        for (t, p), (err, hw, recs) in res.partitions.items():
            assert t == self.topic, t
            if full:
                assert p in listed, f"full response carries partition {p}, not asked for ({listed})"
            else:
                assert p in self.sent, f"incremental response carries partition {p}, not in the session"
            self._append(p, err, hw, recs)
        if full:
            self.session_id = res.session_id
            self.epoch = 1 if res.session_id else 0
        else:
            self.epoch += 1
        return res

    def _append(self, p: int, err: int, hw: int, recs: bytes | None) -> None:
        log = self.logs[p]
        if err:
            log.errors.append(err)
            return
        log.high_watermark = hw
        fetch_offset = log.leo
        for raw in split_batches(recs):
            b = check_batch(raw)
            log.received.append((self.requests, b))
            if b.last_offset < fetch_offset:
                continue  # the fetch landed mid-batch: already appended
            if b.base_offset < log.leo:
                # The replication path would reject it; the test reports it.
                log.violations.append(f"p{p}: batch at {b.base_offset} below the LEO {log.leo}")
                continue
            log.batches.append(b)
            log.leo = b.last_offset + 1
            log.last_fetched_epoch = b.leader_epoch
