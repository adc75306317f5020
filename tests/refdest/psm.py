"""Producer-state model of the reference destination (stand-in for a stock destination
broker; tests and demo only).

Follows Apache Kafka's ProducerStateManager / ProducerAppendInfo as documented in
/work/shared/reference/kafka-wire.md section 3 (apache/kafka trunk 1eb7644349cb). Every
rule cites the Kafka class it comes from. Two append origins are modelled:

- REPLICATION (``AppendOrigin.REPLICATION``, the mirror fetcher / follower path,
  ``UnifiedLog.appendAsFollower``): no sequence checks, no duplicate detection, lower
  epochs accepted with a WARN, markers close whatever transaction their PID has open.
- CLIENT (``AppendOrigin.CLIENT``, local Produce after promotion, ``appendAsLeader``):
  epoch fencing, sequence checks, duplicate detection against the last 5 batches.
- COORDINATOR (markers the local transaction coordinator writes after promotion).
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

from .wire import CONTROL_ABORT, CONTROL_COMMIT, CONTROL_MIRROR_PID_RESET, Batch

LOG = logging.getLogger("refdest.psm")

REPLICATION = "REPLICATION"
CLIENT = "CLIENT"
COORDINATOR = "COORDINATOR"

NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
INT_MAX = 0x7FFFFFFF
# ProducerStateEntry.NUM_BATCHES_TO_RETAIN
NUM_BATCHES_TO_RETAIN = 5


class InvalidProducerEpoch(Exception):
    """InvalidProducerEpochException (error 47) - never raised on REPLICATION."""

    code = 47


class OutOfOrderSequence(Exception):
    """OutOfOrderSequenceException (error 45) - CLIENT only."""

    code = 45


class InvalidTxnState(Exception):
    """InvalidTxnStateException (error 48) - raised in every origin."""

    code = 48


class InvalidRecord(Exception):
    """InvalidRecordException (error 87): LogValidator's CLIENT block."""

    code = 87


class PartitionFailed(Exception):
    """What AbstractFetcherThread does with an unexpected exception on the follower:
    "Unexpected error occurred while processing data for partition ..." and the partition
    is marked failed (replication of it stops)."""


@dataclass
class BatchMetadata:
    # BatchMetadata(lastSeq, lastOffset, offsetDelta, timestamp); firstSeq derived.
    last_seq: int
    last_offset: int
    offset_delta: int
    timestamp: int

    @property
    def first_seq(self) -> int:
        # BatchMetadata.firstSeq = DefaultRecordBatch.decrementSequence(lastSeq, offsetDelta)
        s = self.last_seq - self.offset_delta
        return s + (1 << 31) if s < 0 else s

    @property
    def first_offset(self) -> int:
        return self.last_offset - self.offset_delta


@dataclass
class ProducerStateEntry:
    """ProducerStateEntry: epoch, coordinatorEpoch, lastTimestamp, currentTxnFirstOffset,
    and a deque of at most 5 BatchMetadata."""

    producer_id: int
    producer_epoch: int = NO_PRODUCER_EPOCH
    coordinator_epoch: int = -1
    last_timestamp: int = -1
    current_txn_first_offset: int | None = None
    batch_metadata: deque = field(default_factory=lambda: deque(maxlen=NUM_BATCHES_TO_RETAIN))

    def is_empty(self) -> bool:
        return not self.batch_metadata

    @property
    def last_seq(self) -> int:
        return self.batch_metadata[-1].last_seq if self.batch_metadata else NO_SEQUENCE

    @property
    def first_seq(self) -> int:
        return self.batch_metadata[0].first_seq if self.batch_metadata else NO_SEQUENCE

    @property
    def last_data_offset(self) -> int:
        return self.batch_metadata[-1].last_offset if self.batch_metadata else -1

    def maybe_update_producer_epoch(self, epoch: int) -> None:
        # ProducerStateEntry.maybeUpdateProducerEpoch: ANY change, up or down, clears the
        # cached batch metadata and stores the incoming epoch (the epoch can regress).
        if self.producer_epoch != epoch:
            self.batch_metadata.clear()
            self.producer_epoch = epoch

    def add_batch(self, epoch: int, last_seq: int, last_offset: int, offset_delta: int, ts: int) -> None:
        # ProducerStateEntry.addBatch -> maybeUpdateProducerEpoch + addBatchMetadata (keeps 5)
        self.maybe_update_producer_epoch(epoch)
        self.batch_metadata.append(BatchMetadata(last_seq, last_offset, offset_delta, ts))
        self.last_timestamp = ts

    def find_duplicate_batch(self, batch: Batch) -> BatchMetadata | None:
        # ProducerStateEntry.findDuplicateBatch / batchWithSequenceRange: same epoch and the
        # exact same (firstSeq, lastSeq) among the cached batches.
        if batch.producer_epoch != self.producer_epoch:
            return None
        for m in self.batch_metadata:
            if m.first_seq == batch.base_sequence and m.last_seq == batch.last_sequence:
                return m
        return None

    def snapshot(self) -> dict:
        return {
            "producer_id": self.producer_id,
            "epoch": self.producer_epoch,
            "coordinator_epoch": self.coordinator_epoch,
            "last_sequence": self.last_seq,
            "first_sequence": self.first_seq,
            "last_offset": self.last_data_offset,
            "open_txn_first_offset": self.current_txn_first_offset,
            "batches": [(m.first_seq, m.last_seq, m.last_offset) for m in self.batch_metadata],
        }


@dataclass
class CompletedTxn:
    # CompletedTxn(producerId, firstOffset, lastOffset, isAborted)
    producer_id: int
    first_offset: int
    last_offset: int
    is_aborted: bool


@dataclass
class AppendResult:
    """What an append did: `duplicate_of` is set when CLIENT duplicate detection matched
    (nothing is appended; the ORIGINAL offsets are acknowledged)."""

    duplicate_of: tuple[int, int] | None = None
    completed_txn: CompletedTxn | None = None
    warnings: list[str] = field(default_factory=list)
    barrier: bool = False


def _in_sequence(last_seq: int, next_seq: int) -> bool:
    # ProducerAppendInfo.inSequence
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT_MAX)


class ProducerStateManager:
    """One partition's producer state (ProducerStateManager), fed batch by batch."""

    def __init__(self, topic: str, partition: int, understands_mirror_pid_reset: bool = False):
        self.tp = f"{topic}-{partition}"
        self.understands_mirror_pid_reset = understands_mirror_pid_reset
        self.producers: dict[int, ProducerStateEntry] = {}
        # ProducerStateManager.ongoingTxns: firstOffset -> pid
        self.ongoing_txns: dict[int, int] = {}
        self.aborted_txns: list[CompletedTxn] = []  # the .txnindex (TransactionIndex) content
        self.completed_txns: list[CompletedTxn] = []
        self.warnings: list[str] = []  # every WARN / INFO line the real broker would log
        self.barriers_applied: list[int] = []

    # ------------------------------------------------------------------ views

    def entry(self, pid: int) -> ProducerStateEntry | None:
        return self.producers.get(pid)

    def snapshot(self) -> dict[int, dict]:
        return {pid: e.snapshot() for pid, e in sorted(self.producers.items())}

    def first_unstable_offset(self) -> int | None:
        # ProducerStateManager.firstUnstableOffset (ongoing; HW == LEO here so nothing
        # stays "unreplicated").
        return min(self.ongoing_txns) if self.ongoing_txns else None

    def expire_all(self, offset: int) -> int:
        """KIP-1279 MIRROR_PID_RESET: every producer entry expires (open transactions
        included; the sealing ABORT markers closed them just before)."""
        n = len(self.producers)
        self.producers.clear()
        self.ongoing_txns.clear()
        self.barriers_applied.append(offset)
        return n

    def remove_expired_producers(self, now_ms: int, expiration_ms: int = 86_400_000) -> list[int]:
        """ProducerStateManager.removeExpiredProducers (run every
        producer.id.expiration.check.interval.ms = 10 min): drops every PID with NO ongoing
        transaction whose lastTimestamp (the batch CreateTime) is producer.id.expiration.ms
        (24 h) old. Ongoing transactions never expire."""
        gone = [pid for pid, e in self.producers.items()
                if e.current_txn_first_offset is None and now_ms - e.last_timestamp >= expiration_ms]
        for pid in gone:
            del self.producers[pid]
        return gone

    # ------------------------------------------------------------------ append

    def _warn(self, text: str) -> None:
        self.warnings.append(text)
        LOG.warning("[stand-in %s] %s", self.tp, text)

    def _check_producer_epoch(self, entry: ProducerStateEntry, epoch: int, offset: int, origin: str,
                              result: AppendResult) -> None:
        # ProducerAppendInfo.checkProducerEpoch: a lower epoch throws for CLIENT and
        # COORDINATOR; for REPLICATION it is logged at WARN and ACCEPTED.
        if epoch < entry.producer_epoch:
            msg = (f"Epoch of producer {entry.producer_id} at offset {offset} in {self.tp} is {epoch}, "
                   f"which is smaller than the last seen epoch {entry.producer_epoch}")
            if origin == REPLICATION:
                self._warn(msg)
                result.warnings.append(msg)
            else:
                raise InvalidProducerEpoch(msg)

    def _check_sequence(self, entry: ProducerStateEntry, epoch: int, first_seq: int, offset: int) -> None:
        # ProducerAppendInfo.checkSequence (CLIENT only; no verification guard modelled).
        if epoch != entry.producer_epoch:
            if first_seq != 0 and entry.producer_epoch != NO_PRODUCER_EPOCH:
                raise OutOfOrderSequence(
                    f"Invalid sequence number for new epoch of producer {entry.producer_id}at offset {offset} "
                    f"in partition {self.tp}: {epoch} (request epoch), {first_seq} (seq. number), "
                    f"{entry.producer_epoch} (current producer epoch)")
            return
        current_last_seq = entry.last_seq if not entry.is_empty() else NO_SEQUENCE
        # "If there is no current producer epoch ... accept writes with any sequence number"
        if not (entry.producer_epoch == NO_PRODUCER_EPOCH or _in_sequence(current_last_seq, first_seq)):
            raise OutOfOrderSequence(
                f"Out of order sequence number for producer {entry.producer_id} at offset {offset} in "
                f"partition {self.tp}: {first_seq} (incoming seq. number), {current_last_seq} "
                f"(current end sequence number)")

    def validate_client(self, batch: Batch) -> None:
        """LogValidator.validateBatch, CLIENT block (before offsets are assigned)."""
        if batch.is_control:
            raise InvalidRecord(f"Clients are not allowed to write control records in topic partition {self.tp}")
        if batch.has_producer_id() and batch.base_sequence < 0:
            raise InvalidRecord(f"Invalid sequence number {batch.base_sequence} in record batch with producerId "
                                f"{batch.producer_id} in topic partition {self.tp}")

    def find_duplicate(self, batch: Batch) -> BatchMetadata | None:
        """UnifiedLog.analyzeAndValidateProducerState, CLIENT only: a duplicate is not appended
        and is acknowledged with the ORIGINAL offsets."""
        if not batch.has_producer_id():
            return None
        e = self.producers.get(batch.producer_id)
        return e.find_duplicate_batch(batch) if e else None

    def append(self, batch: Batch, origin: str) -> AppendResult:
        """Feeds one batch (offsets already assigned) to the producer state.

        Raises (without changing state) what Kafka raises for that origin; on REPLICATION a
        raise means the partition fails (see PartitionFailed)."""
        result = AppendResult()
        if batch.is_control and batch.record_count > 0:
            try:
                ctype = batch.control_type()
            except Exception as e:  # noqa: BLE001 - InvalidRecordException in Kafka
                if batch.has_producer_id():
                    raise PartitionFailed(f"corrupt control record at offset {batch.base_offset}: {e}") from e
                return result
            if ctype == CONTROL_MIRROR_PID_RESET and self.understands_mirror_pid_reset:
                # KIP-1279 broker: the barrier expires all producer state of the partition.
                self.expire_all(batch.base_offset)
                result.barrier = True
                return result
        # UnifiedLog.analyzeAndValidateProducerState / updateProducers /
        # LogSegment.updateProducerState: only batches with hasProducerId() (pid > -1) reach
        # the PSM. A stock broker therefore never looks at a PID -1 barrier (it ignores it),
        # and sign-bit (negative) PIDs get no producer state at all.
        if not batch.has_producer_id():
            return result
        pid = batch.producer_id
        current = self.producers.get(pid)
        entry = ProducerStateEntry(pid) if current is None else current
        # Work on a copy (ProducerAppendInfo.updatedEntry), commit only on success.
        upd = ProducerStateEntry(pid, entry.producer_epoch, entry.coordinator_epoch, entry.last_timestamp,
                                 entry.current_txn_first_offset, deque(entry.batch_metadata,
                                                                       maxlen=NUM_BATCHES_TO_RETAIN))
        if batch.is_control:
            if batch.record_count == 0:
                # ProducerAppendInfo.append: an empty control batch (log cleaner) is ignored.
                return result
            ctype = batch.control_type()
            if ctype not in (CONTROL_ABORT, CONTROL_COMMIT):
                # EndTransactionMarker.deserialize -> IllegalArgumentException "Invalid control record
                # type for end transaction marker" in every origin; on a follower it reaches
                # AbstractFetcherThread, which marks the partition failed.
                raise PartitionFailed(
                    f"Unexpected error occurred while processing data for partition {self.tp} at offset "
                    f"{batch.base_offset}: java.lang.IllegalArgumentException: Invalid control record type "
                    f"for end transaction markerUNKNOWN")
            # ProducerAppendInfo.appendEndTxnMarker
            self._check_producer_epoch(upd, batch.producer_epoch, batch.base_offset, origin, result)
            coord_epoch = batch.end_txn_coordinator_epoch()
            if upd.coordinator_epoch > coord_epoch:
                if origin == REPLICATION:
                    msg = (f"Detected invalid coordinator epoch for producerId {pid} at offset {batch.base_offset} "
                           f"in partition {self.tp}: {coord_epoch} is older than previously known coordinator "
                           f"epoch {upd.coordinator_epoch}")
                    self.warnings.append(msg)  # logged at INFO by Kafka
                else:
                    raise InvalidProducerEpoch("TransactionCoordinatorFencedException")
            upd.maybe_update_producer_epoch(batch.producer_epoch)
            # Transactions are keyed by PID only: the marker completes WHATEVER transaction
            # this PID has open, whoever opened it; with none open it is simply accepted.
            if upd.current_txn_first_offset is not None:
                result.completed_txn = CompletedTxn(pid, upd.current_txn_first_offset, batch.base_offset,
                                                    ctype == CONTROL_ABORT)
            upd.coordinator_epoch = coord_epoch
            upd.last_timestamp = batch.max_timestamp
            upd.current_txn_first_offset = None
        else:
            # ProducerAppendInfo.appendDataBatch
            self._check_producer_epoch(upd, batch.producer_epoch, batch.base_offset, origin, result)
            if origin == CLIENT:
                self._check_sequence(upd, batch.producer_epoch, batch.base_sequence, batch.base_offset)
            # ProducerAppendInfo.updateCurrentTxnFirstOffset
            if batch.is_transactional:
                if upd.current_txn_first_offset is None:
                    upd.current_txn_first_offset = batch.base_offset
            elif upd.current_txn_first_offset is not None:
                # InvalidTxnStateException in every origin (a follower fails the partition).
                msg = (f"Expected transactional write from producer {pid} at offset {batch.base_offset} in "
                       f"partition {self.tp}")
                if origin == REPLICATION:
                    raise PartitionFailed(f"Unexpected error occurred while processing data for partition "
                                          f"{self.tp}: InvalidTxnStateException: {msg}")
                raise InvalidTxnState(msg)
            upd.add_batch(batch.producer_epoch, batch.last_sequence, batch.last_offset, batch.last_offset_delta,
                          batch.max_timestamp)
        # ProducerStateManager.update / completeTxn
        self.producers[pid] = upd
        if current is not None and current.current_txn_first_offset is not None:
            self.ongoing_txns.pop(current.current_txn_first_offset, None)
        if upd.current_txn_first_offset is not None:
            self.ongoing_txns[upd.current_txn_first_offset] = pid
        if result.completed_txn is not None:
            self.completed_txns.append(result.completed_txn)
            if result.completed_txn.is_aborted:
                # LogSegment.updateTxnIndex: only aborts go to the .txnindex
                self.aborted_txns.append(result.completed_txn)
        return result
