"""The reference destination's producer-state model (stand-in for a stock destination
broker; tests and demo only) against the facts of kafka-wire.md section 3 and 5."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from refdest import CLIENT, REPLICATION, PartitionFailed, ProducerStateManager, build_batch, parse_batch  # noqa: E402
from refdest.psm import OutOfOrderSequence  # noqa: E402
from refdest.wire import build_end_txn_marker  # noqa: E402


def at(raw: bytes, offset: int):
    return parse_batch(raw).with_base_offset(offset)


def data(pid, epoch, seq, n=1, txn=False, off=0):
    return at(build_batch([b"v"] * n, producer_id=pid, producer_epoch=epoch, base_sequence=seq, transactional=txn), off)


def control(pid, ctype, off):
    import struct

    raw = bytearray(build_end_txn_marker(pid, 0, True))
    # patch the control type (record key bytes) and recompute the CRC
    import crc32c

    key_at = raw.index(bytes([0, 0, 0, 1]), 61)
    raw[key_at + 2:key_at + 4] = struct.pack(">h", ctype)
    raw[17:21] = struct.pack(">I", crc32c.crc32c(bytes(raw[21:])))
    return at(bytes(raw), off)


def test_lower_epoch_on_replication_is_a_warning_and_regresses():
    psm = ProducerStateManager("t", 0)
    psm.append(data(7, 5, 0, off=0), REPLICATION)
    psm.append(data(7, 3, 0, off=3), REPLICATION)
    assert psm.warnings == ["Epoch of producer 7 at offset 3 in t-0 is 3, which is smaller than the last seen epoch 5"]
    assert psm.entry(7).producer_epoch == 3


def test_sequences_unchecked_on_replication_checked_on_client():
    psm = ProducerStateManager("t", 0)
    psm.append(data(1, 0, 0, off=0), REPLICATION)
    psm.append(data(1, 0, 10, off=1), REPLICATION)  # gap 0 -> 10 accepted silently
    assert psm.entry(1).last_seq == 10 and psm.warnings == []
    with pytest.raises(OutOfOrderSequence):
        psm.append(data(1, 0, 20, off=2), CLIENT)
    assert psm.entry(1).last_seq == 10  # unchanged after the rejection


def test_marker_closes_whatever_transaction_its_pid_has_open_and_marker_without_txn_is_accepted():
    psm = ProducerStateManager("t", 0)
    psm.append(data(5, 0, 0, txn=True, off=0), REPLICATION)
    res = psm.append(at(build_end_txn_marker(5, 0, False), 1), REPLICATION)
    assert res.completed_txn.first_offset == 0 and res.completed_txn.is_aborted
    assert psm.aborted_txns and psm.first_unstable_offset() is None
    res = psm.append(at(build_end_txn_marker(9, 0, True), 2), REPLICATION)  # no open txn
    assert res.completed_txn is None and psm.entry(9).coordinator_epoch == 0


def test_unknown_control_type_with_pid_fails_the_partition_and_pid_minus_one_is_ignored():
    psm = ProducerStateManager("t", 0)
    with pytest.raises(PartitionFailed):
        psm.append(control(3, 7, 0), REPLICATION)
    assert psm.producers == {}
    psm.append(control(-1, 7, 0), REPLICATION)  # stock: hasProducerId() false -> ignored
    assert psm.barriers_applied == []


def test_barrier_expires_state_only_when_understood_and_negative_pids_get_no_state():
    aware = ProducerStateManager("t", 0, understands_mirror_pid_reset=True)
    aware.append(data(1, 0, 0, off=0), REPLICATION)
    aware.append(data(-7, 0, 0, txn=True, off=1), REPLICATION)  # hasProducerId() is pid > -1
    assert list(aware.producers) == [1]
    aware.append(control(-1, 7, 2), REPLICATION)
    assert aware.producers == {} and aware.barriers_applied == [2]


def test_client_duplicate_is_found_among_the_last_five_batches():
    psm = ProducerStateManager("t", 0)
    for i in range(6):
        psm.append(data(1, 0, i, off=i), REPLICATION)
    assert psm.find_duplicate(data(1, 0, 0)) is None  # only 5 are cached
    dup = psm.find_duplicate(data(1, 0, 1))
    assert dup is not None and dup.first_offset == 1
    assert psm.find_duplicate(data(1, 1, 1)) is None  # another epoch is never a duplicate
