//! Builders for the batches mirrorguard writes itself, byte-exact to
//! Kafka's `MemoryRecordsBuilder` layout: transaction markers (as
//! `MemoryRecords.withEndTransactionMarker`) and the MIRROR_PID_RESET barrier
//! (SPEC 2.3). A general [`build_batch`] covers data batches for tests and
//! the golden vectors of wire reference section 8.

use super::batch::{ATTR_CONTROL, ATTR_TRANSACTIONAL};
use super::control::{ABORT_TYPE, COMMIT_TYPE, MIRROR_PID_RESET_TYPE};
use super::{ATTRIBUTES_OFFSET, CRC_OFFSET, LOG_OVERHEAD};
use crate::wire::Writer;

/// Header fields of a batch to build (everything the caller chooses; lengths,
/// counts and the CRC are derived).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchSpec {
    /// baseOffset.
    pub base_offset: i64,
    /// partitionLeaderEpoch.
    pub partition_leader_epoch: i32,
    /// attributes.
    pub attributes: i16,
    /// baseTimestamp.
    pub base_timestamp: i64,
    /// maxTimestamp.
    pub max_timestamp: i64,
    /// producerId.
    pub producer_id: i64,
    /// producerEpoch.
    pub producer_epoch: i16,
    /// baseSequence.
    pub base_sequence: i32,
}

impl Default for BatchSpec {
    /// A producer-less, uncompressed batch at offset 0 with timestamps 0 and
    /// leader epoch -1 (what a client sends).
    fn default() -> Self {
        BatchSpec {
            base_offset: 0,
            partition_leader_epoch: -1,
            attributes: 0,
            base_timestamp: 0,
            max_timestamp: 0,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
        }
    }
}

/// One record to build.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecordSpec<'a> {
    /// Timestamp relative to baseTimestamp.
    pub timestamp_delta: i64,
    /// Offset relative to baseOffset.
    pub offset_delta: i32,
    /// Key, `None` for null.
    pub key: Option<&'a [u8]>,
    /// Value, `None` for null.
    pub value: Option<&'a [u8]>,
    /// Headers as (key, value).
    pub headers: &'a [(&'a [u8], Option<&'a [u8]>)],
}

fn put_varint(out: &mut Vec<u8>, v: i32) {
    Writer::new(out).put_varint(v);
}

fn put_bytes(out: &mut Vec<u8>, b: Option<&[u8]>) {
    match b {
        // Record fields above i32::MAX bytes cannot exist in a batch whose
        // length is an i32; saturate rather than wrap.
        Some(b) => {
            put_varint(out, i32::try_from(b.len()).unwrap_or(i32::MAX));
            out.extend_from_slice(b);
        }
        None => put_varint(out, -1),
    }
}

/// Builds an uncompressed v2 batch with the given records.
pub fn build_batch(spec: &BatchSpec, records: &[RecordSpec<'_>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    out.extend_from_slice(&spec.base_offset.to_be_bytes());
    out.extend_from_slice(&[0; 4]); // batchLength, patched below
    out.extend_from_slice(&spec.partition_leader_epoch.to_be_bytes());
    out.push(2);
    out.extend_from_slice(&[0; 4]); // crc, patched below
    out.extend_from_slice(&spec.attributes.to_be_bytes());
    let last_offset_delta = records.last().map_or(0, |r| r.offset_delta);
    out.extend_from_slice(&last_offset_delta.to_be_bytes());
    out.extend_from_slice(&spec.base_timestamp.to_be_bytes());
    out.extend_from_slice(&spec.max_timestamp.to_be_bytes());
    out.extend_from_slice(&spec.producer_id.to_be_bytes());
    out.extend_from_slice(&spec.producer_epoch.to_be_bytes());
    out.extend_from_slice(&spec.base_sequence.to_be_bytes());
    let count = i32::try_from(records.len()).unwrap_or(i32::MAX);
    out.extend_from_slice(&count.to_be_bytes());

    let mut body = Vec::with_capacity(32);
    for r in records {
        body.clear();
        body.push(0); // record attributes: unused, always 0
        Writer::new(&mut body).put_varlong(r.timestamp_delta);
        put_varint(&mut body, r.offset_delta);
        put_bytes(&mut body, r.key);
        put_bytes(&mut body, r.value);
        put_varint(
            &mut body,
            i32::try_from(r.headers.len()).unwrap_or(i32::MAX),
        );
        for (k, v) in r.headers {
            put_bytes(&mut body, Some(k));
            put_bytes(&mut body, *v);
        }
        put_varint(&mut out, i32::try_from(body.len()).unwrap_or(i32::MAX));
        out.extend_from_slice(&body);
    }

    let batch_length = i32::try_from(out.len() - LOG_OVERHEAD).unwrap_or(i32::MAX);
    out[8..12].copy_from_slice(&batch_length.to_be_bytes());
    let crc = crc32c::crc32c(&out[ATTRIBUTES_OFFSET..]);
    out[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_be_bytes());
    out
}

/// Builds a one-record control batch whose record has `key`/`value` and the
/// batch timestamp (offset delta 0, timestamp delta 0, no headers).
fn build_control(spec: BatchSpec, key: &[u8], value: &[u8]) -> Vec<u8> {
    build_batch(
        &spec,
        &[RecordSpec {
            key: Some(key),
            value: Some(value),
            ..RecordSpec::default()
        }],
    )
}

fn control_key(type_id: i16) -> [u8; 4] {
    let t = type_id.to_be_bytes();
    [0, 0, t[0], t[1]] // version 0, type
}

/// Encodes a `MirrorPidResetRecord` value, version 0: Version int16,
/// SourceClusterId compact string, empty tagged fields.
pub fn mirror_pid_reset_value(source_cluster_id: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(source_cluster_id.len() + 4);
    v.extend_from_slice(&0i16.to_be_bytes());
    Writer::new(&mut v).put_uvarlong(source_cluster_id.len() as u64 + 1);
    v.extend_from_slice(source_cluster_id.as_bytes());
    Writer::new(&mut v).put_uvarint(0);
    v
}

/// Builds the MIRROR_PID_RESET barrier (SPEC 2.3): control-only attributes,
/// no producer (-1/-1/-1), one record with key (0, 7) and a
/// `MirrorPidResetRecord` value.
pub fn build_mirror_pid_reset(
    source_cluster_id: &str,
    base_offset: i64,
    partition_leader_epoch: i32,
    timestamp_ms: i64,
) -> Vec<u8> {
    let spec = BatchSpec {
        base_offset,
        partition_leader_epoch,
        attributes: ATTR_CONTROL,
        base_timestamp: timestamp_ms,
        max_timestamp: timestamp_ms,
        ..BatchSpec::default()
    };
    build_control(
        spec,
        &control_key(MIRROR_PID_RESET_TYPE),
        &mirror_pid_reset_value(source_cluster_id),
    )
}

/// Builds a transaction marker batch exactly as
/// `MemoryRecords.withEndTransactionMarker` does (attributes 0x30, base
/// sequence -1, timestamp in both header fields and the record).
pub fn build_end_txn_marker(
    commit: bool,
    producer_id: i64,
    producer_epoch: i16,
    coordinator_epoch: i32,
    timestamp_ms: i64,
    base_offset: i64,
    partition_leader_epoch: i32,
) -> Vec<u8> {
    let spec = BatchSpec {
        base_offset,
        partition_leader_epoch,
        attributes: ATTR_TRANSACTIONAL | ATTR_CONTROL,
        base_timestamp: timestamp_ms,
        max_timestamp: timestamp_ms,
        producer_id,
        producer_epoch,
        base_sequence: -1,
    };
    let mut value = [0u8; 6]; // version 0, then coordinator epoch
    value[2..].copy_from_slice(&coordinator_epoch.to_be_bytes());
    let type_id = if commit { COMMIT_TYPE } else { ABORT_TYPE };
    build_control(spec, &control_key(type_id), &value)
}

/// Builds an ABORT marker batch.
pub fn build_abort_marker(
    producer_id: i64,
    producer_epoch: i16,
    coordinator_epoch: i32,
    timestamp_ms: i64,
    base_offset: i64,
    partition_leader_epoch: i32,
) -> Vec<u8> {
    build_end_txn_marker(
        false,
        producer_id,
        producer_epoch,
        coordinator_epoch,
        timestamp_ms,
        base_offset,
        partition_leader_epoch,
    )
}

/// Builds a COMMIT marker batch (tests and the reference destination).
pub fn build_commit_marker(
    producer_id: i64,
    producer_epoch: i16,
    coordinator_epoch: i32,
    timestamp_ms: i64,
    base_offset: i64,
    partition_leader_epoch: i32,
) -> Vec<u8> {
    build_end_txn_marker(
        true,
        producer_id,
        producer_epoch,
        coordinator_epoch,
        timestamp_ms,
        base_offset,
        partition_leader_epoch,
    )
}

/// Builds a control batch of arbitrary type with the given value, shaped like
/// a marker when `producer_id >= 0` and like the barrier otherwise (tests of
/// unknown types, e.g. the type-7-with-PID vector).
pub fn build_control_batch(
    type_id: i16,
    value: &[u8],
    producer_id: i64,
    producer_epoch: i16,
    timestamp_ms: i64,
    base_offset: i64,
    partition_leader_epoch: i32,
) -> Vec<u8> {
    let attributes = if producer_id >= 0 {
        ATTR_TRANSACTIONAL | ATTR_CONTROL
    } else {
        ATTR_CONTROL
    };
    let spec = BatchSpec {
        base_offset,
        partition_leader_epoch,
        attributes,
        base_timestamp: timestamp_ms,
        max_timestamp: timestamp_ms,
        producer_id,
        producer_epoch,
        base_sequence: -1,
    };
    build_control(spec, &control_key(type_id), value)
}
