"""The partition log of the reference destination (stand-in for a stock destination
broker; tests and demo only): batches kept in memory and appended to a Kafka-format
segment file ``<dir>/<topic>-<partition>/00000000000000000000.log`` (wire reference
section 6: batches concatenated exactly as on the wire) that ``mirrorguard dump`` reads.
"""

from __future__ import annotations

import threading
from pathlib import Path

from .psm import (
    CLIENT,
    COORDINATOR,
    REPLICATION,
    AppendResult,
    PartitionFailed,
    ProducerStateManager,
)
from .wire import Batch, WireError, build_end_txn_marker, parse_batch


class OffsetOutOfOrder(Exception):
    """UnifiedLog.appendAsFollower: OffsetsOutOfOrderException / UnexpectedAppendOffsetException."""


class PartitionLog:
    def __init__(self, directory: Path, topic: str, partition: int, understands_mirror_pid_reset: bool,
                 cond: threading.Condition):
        self.topic = topic
        self.partition = partition
        self.dir = directory / f"{topic}-{partition}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "00000000000000000000.log"
        self.path.write_bytes(b"")
        self.batches: list[Batch] = []
        self.leo = 0
        self.psm = ProducerStateManager(topic, partition, understands_mirror_pid_reset)
        self.failed: str | None = None
        self.cond = cond  # the destination's lock; notified on every append

    @property
    def tp(self) -> str:
        return f"{self.topic}-{self.partition}"

    # ------------------------------------------------------------------ reads

    @property
    def high_watermark(self) -> int:
        return self.leo  # one replica: HW == LEO

    @property
    def last_stable_offset(self) -> int:
        # UnifiedLog.lastStableOffset = min(firstUnstableOffset, HW)
        fu = self.psm.first_unstable_offset()
        return self.high_watermark if fu is None else min(fu, self.high_watermark)

    def read(self, offset: int, max_bytes: int, upper: int) -> bytes:
        """Batches whose last offset >= offset and base offset < upper; at least one whole
        batch even beyond max_bytes (KIP-74)."""
        out = []
        size = 0
        for b in self.batches:
            if b.last_offset < offset or b.base_offset >= upper:
                continue
            if out and size + len(b.raw) > max_bytes:
                break
            out.append(b.raw)
            size += len(b.raw)
        return b"".join(out)

    def aborted_transactions(self, offset: int, upper: int) -> list[tuple[int, int]]:
        """UnifiedLog.collectAbortedTransactions: .txnindex entries overlapping [offset, upper)."""
        return [(t.producer_id, t.first_offset) for t in self.psm.aborted_txns
                if t.last_offset >= offset and t.first_offset < upper]

    def offset_of_kind(self) -> list[tuple[int, str, int]]:
        """(base offset, kind, pid) of every batch: data / commit / abort / barrier / control<N>."""
        out = []
        for b in self.batches:
            if not b.is_control:
                out.append((b.base_offset, "data", b.producer_id))
            else:
                t = b.control_type()
                out.append((b.base_offset, {0: "abort", 1: "commit", 7: "barrier"}.get(t, f"control{t}"),
                            b.producer_id))
        return out

    # ------------------------------------------------------------------ writes

    def _write(self, b: Batch) -> None:
        with open(self.path, "ab") as f:
            f.write(b.raw)
        self.batches.append(b)
        self.leo = b.last_offset + 1
        self.cond.notify_all()

    def append_replicated(self, b: Batch) -> AppendResult:
        """UnifiedLog.appendAsFollower (origin REPLICATION): CRC, offsets >= LEO and
        monotonic, then the producer-state rules; nothing else (no LogValidator)."""
        if self.failed:
            raise PartitionFailed(self.failed)
        if b.base_offset < self.leo:
            raise OffsetOutOfOrder(f"{self.tp}: batch at {b.base_offset} below the log end offset {self.leo}")
        if not b.crc_ok():
            raise WireError(f"{self.tp}: Record is corrupt at offset {b.base_offset}")
        try:
            res = self.psm.append(b, REPLICATION)
        except PartitionFailed as e:
            self.failed = str(e)
            raise
        self._write(b)
        return res

    def append_client(self, raw: bytes, leader_epoch: int) -> tuple[int, AppendResult]:
        """UnifiedLog.appendAsLeader (origin CLIENT). Returns (base offset acknowledged,
        result); a duplicate returns its ORIGINAL base offset and appends nothing."""
        b = parse_batch(raw)
        if not b.crc_ok():
            raise WireError("Record is corrupt")
        self.psm.validate_client(b)
        dup = self.psm.find_duplicate(b)
        if dup is not None:
            return dup.first_offset, AppendResult(duplicate_of=(dup.first_offset, dup.last_offset))
        placed = b.with_base_offset(self.leo, leader_epoch)
        res = self.psm.append(placed, CLIENT)  # raises 45/47/48 without changing state
        self._write(placed)
        return placed.base_offset, res

    def append_marker(self, pid: int, epoch: int, commit: bool, coordinator_epoch: int, leader_epoch: int,
                      timestamp_ms: int) -> AppendResult:
        """KafkaApis.handleWriteTxnMarkersRequest -> appendAsLeader (origin COORDINATOR)."""
        b = parse_batch(build_end_txn_marker(pid, epoch, commit, coordinator_epoch, timestamp_ms))
        placed = b.with_base_offset(self.leo, leader_epoch)
        res = self.psm.append(placed, COORDINATOR)
        self._write(placed)
        return res
