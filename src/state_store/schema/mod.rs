//! Binary schemas of the `__mirror_state` records (SPEC 2.2 and 3).
//!
//! Records follow Kafka's coordinator-record style (as `__consumer_offsets`
//! and `__transaction_state` do): the **key** is an int16 record type followed
//! by the key fields, the **value** is an int16 version followed by the value
//! fields. Keys are never flexible (compaction compares key bytes, so a key's
//! encoding must never change); values are flexible from version 0 and end
//! with a tagged-field section, so later versions can add optional fields.
//! A null value is a tombstone.
//!
//! Types 0-2 are left unused so that a record can never be mistaken for a
//! `__consumer_offsets` record of the same shape. Types 3, 4 and 5:
//!
//! **Type 3: `MirrorPidCollisionKey` v0 (not flexible)** — SPEC 2.2, exactly.
//!
//! | field | type | meaning |
//! |---|---|---|
//! | (type) | int16 = 3 | record type |
//! | TopicId | uuid | the destination topic id where the collision occurred |
//! | Partition | int32 | the partition index |
//! | SourceClusterId | string (int16 length) | the source cluster whose PID was remapped |
//! | OriginalPid | int64 | the PID on the source cluster before mapping |
//!
//! **`MirrorPidCollisionValue` v0 (flexible)**
//!
//! | field | type | meaning |
//! |---|---|---|
//! | (version) | int16 = 0 | value version |
//! | Salt | int64 | the salt added to the cluster hash |
//! | CollidingClusterId | compact string | the cluster that already held the slot |
//! | TimestampMs | int64 | wall-clock time of the resolution |
//! | (tags) | tagged fields | none defined |
//!
//! **Type 4: `MirrorPartitionStateKey` v0 (not flexible)**
//!
//! | field | type | meaning |
//! |---|---|---|
//! | (type) | int16 = 4 | record type |
//! | TopicId | uuid | destination topic id |
//! | Partition | int32 | partition index |
//!
//! **`MirrorPartitionStateValue` v0 (flexible)**
//!
//! | field | type | meaning |
//! |---|---|---|
//! | (version) | int16 = 0 | value version |
//! | Mirror | compact string | name of the `[[mirror]]` feeding the partition |
//! | TopicName | compact string | destination topic name (for humans and dump) |
//! | State | int8 | 0 MIRRORING, 1 PAUSED, 2 STOPPING, 3 STOPPED, 4 FAILED |
//! | SourceClusterId | compact string | the source cluster being mirrored |
//! | CutOffset | int64 | last mirrored offset + 1 (the cut), -1 = none yet |
//! | SealBatches | int32 | sealing batches served at the cut, -1 = not yet |
//! | Reason | compact nullable string | why (FAILED, operator note), null = none |
//! | TimestampMs | int64 | wall-clock time of the transition |
//! | (tags) | tagged fields | none defined |
//!
//! **Type 5: `MirrorProducerSnapshotKey` v0 (not flexible)**
//!
//! | field | type | meaning |
//! |---|---|---|
//! | (type) | int16 = 5 | record type |
//! | TopicId | uuid | destination topic id |
//! | Partition | int32 | partition index |
//!
//! **`MirrorProducerSnapshotValue` v0 (flexible)**
//!
//! | field | type | meaning |
//! |---|---|---|
//! | (version) | int16 = 0 | value version |
//! | SnapshotOffset | int64 | destination offset the snapshot is valid up to |
//! | Producers | compact array | one entry per producer, below |
//! | &nbsp;&nbsp;ProducerId | int64 | the (mapped) PID as the destination sees it |
//! | &nbsp;&nbsp;OriginClusterId | uuid | source cluster of the producer |
//! | &nbsp;&nbsp;OriginalPid | int64 | the PID on the source cluster |
//! | &nbsp;&nbsp;ProducerEpoch | int16 | current epoch |
//! | &nbsp;&nbsp;LastSequence | int32 | last sequence number |
//! | &nbsp;&nbsp;LastOffset | int64 | offset of the producer's last batch |
//! | &nbsp;&nbsp;CoordinatorEpoch | int32 | coordinator epoch of its last marker |
//! | &nbsp;&nbsp;TxnFirstOffset | int64 | first offset of the open transaction, -1 = none |
//! | &nbsp;&nbsp;LastTimestamp | int64 | max timestamp of its last batch |
//! | &nbsp;&nbsp;(tags) | tagged fields | none defined |
//! | (tags) | tagged fields | tag 0 = [`SnapshotClosings`] (optional) |
//!
//! **Type 6: `MirrorProducerClaimKey` v0 (not flexible)**
//!
//! | field | type | meaning |
//! |---|---|---|
//! | (type) | int16 = 6 | record type |
//! | TopicId | uuid | destination topic id |
//! | Partition | int32 | partition index |
//! | ProducerId | int64 | the (mapped) PID as the destination sees it |
//!
//! **`MirrorProducerClaimValue` v0 (flexible)**
//!
//! | field | type | meaning |
//! |---|---|---|
//! | (version) | int16 = 0 | value version |
//! | OriginClusterId | uuid | source cluster of the producer |
//! | OriginalPid | int64 | the PID on the source cluster |
//! | TimestampMs | int64 | wall-clock time of the claim |
//! | (tags) | tagged fields | none defined |
//!
//! **Type 7: `MirrorProducerSnapshotChunkKey` v0 (not flexible)**
//!
//! | field | type | meaning |
//! |---|---|---|
//! | (type) | int16 = 7 | record type |
//! | TopicId | uuid | destination topic id |
//! | Partition | int32 | partition index |
//! | Generation | int64 | the snapshot this chunk belongs to (increasing) |
//! | Chunk | int32 | chunk index, 0-based |
//!
//! **`MirrorProducerSnapshotChunkValue` v0 (flexible)**
//!
//! | field | type | meaning |
//! |---|---|---|
//! | (version) | int16 = 0 | value version |
//! | SnapshotOffset | int64 | destination offset the snapshot is valid up to |
//! | ChunkCount | int32 | number of chunks of this generation |
//! | Producers | compact array | entries as in type 5 |
//! | (tags) | tagged fields | last chunk only: tag 0 = [`SnapshotClosings`], as in type 5 |
//!
//! Decoding never panics and never allocates from an unchecked length (all
//! reads go through [`crate::wire::Reader`]). Unknown record types and value
//! versions newer than this code are *not* errors: they decode as
//! [`StateRecord::Unknown`] / [`StateRecord::NewerVersion`], so a rolling
//! upgrade that adds a record type never stops an older instance's load.

mod closings;
mod episodes;
mod records;
pub mod serving;

pub use closings::*;
pub use episodes::*;
pub use records::*;

use crate::wire::{Reader, WireError};

/// Record type of [`MirrorPidCollisionKey`].
pub const PID_COLLISION_TYPE: i16 = 3;
/// Record type of [`MirrorPartitionStateKey`].
pub const PARTITION_STATE_TYPE: i16 = 4;
/// Record type of [`MirrorProducerSnapshotKey`].
pub const PRODUCER_SNAPSHOT_TYPE: i16 = 5;
/// Record type of [`MirrorProducerClaimKey`].
pub const PRODUCER_CLAIM_TYPE: i16 = 6;
/// Record type of [`MirrorProducerSnapshotChunkKey`].
pub const PRODUCER_SNAPSHOT_CHUNK_TYPE: i16 = 7;
/// Highest value version this code decodes (all types).
pub const LATEST_VALUE_VERSION: i16 = 0;

/// Why a record of a known type could not be decoded or encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// A field is truncated or malformed.
    #[error("malformed __mirror_state record: {0}")]
    Wire(#[from] WireError),
    /// The key is shorter than its int16 record type.
    #[error("__mirror_state key is shorter than its record type ({0} bytes)")]
    ShortKey(usize),
    /// Bytes remain after the last field of a key or of a v0 value.
    #[error("{remaining} unexpected bytes after the {what} of record type {record_type}")]
    TrailingBytes {
        /// Record type.
        record_type: i16,
        /// "key" or "value".
        what: &'static str,
        /// Bytes left over.
        remaining: usize,
    },
    /// The value's version is negative.
    #[error("invalid value version {version} for record type {record_type}")]
    InvalidVersion {
        /// Record type.
        record_type: i16,
        /// The version read.
        version: i16,
    },
}

/// Life-cycle state of a mirrored partition (SPEC 3), stored as int8.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MirrorPartitionState {
    /// 0: mirroring from the source.
    Mirroring,
    /// 1: mirroring halted, partition not writable.
    Paused,
    /// 2: sealing in progress.
    Stopping,
    /// 3: sealed; the partition is writable (terminal).
    Stopped,
    /// 4: failed (see the record's reason).
    Failed,
    /// A state code written by a newer mirrorguard; kept so it round-trips.
    Other(i8),
}

impl MirrorPartitionState {
    /// The int8 stored on the wire.
    pub fn code(self) -> i8 {
        match self {
            Self::Mirroring => 0,
            Self::Paused => 1,
            Self::Stopping => 2,
            Self::Stopped => 3,
            Self::Failed => 4,
            Self::Other(c) => c,
        }
    }

    /// The state for a stored int8.
    pub fn from_code(c: i8) -> Self {
        match c {
            0 => Self::Mirroring,
            1 => Self::Paused,
            2 => Self::Stopping,
            3 => Self::Stopped,
            4 => Self::Failed,
            c => Self::Other(c),
        }
    }

    /// Upper-case name as operators see it (`UNKNOWN` for [`Self::Other`]).
    pub fn name(self) -> &'static str {
        match self {
            Self::Mirroring => "MIRRORING",
            Self::Paused => "PAUSED",
            Self::Stopping => "STOPPING",
            Self::Stopped => "STOPPED",
            Self::Failed => "FAILED",
            Self::Other(_) => "UNKNOWN",
        }
    }
}

/// The key of any known record type.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StateKey {
    /// Type 3.
    PidCollision(MirrorPidCollisionKey),
    /// Type 4.
    PartitionState(MirrorPartitionStateKey),
    /// Type 5.
    ProducerSnapshot(MirrorProducerSnapshotKey),
    /// Type 6.
    ProducerClaim(MirrorProducerClaimKey),
    /// Type 7.
    ProducerSnapshotChunk(MirrorProducerSnapshotChunkKey),
}

/// An encoded record: key bytes and value bytes (`None` = tombstone).
pub type EncodedRecord = (Vec<u8>, Option<Vec<u8>>);

/// A decoded `__mirror_state` record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateRecord {
    /// Type 3; `value` `None` is a tombstone.
    PidCollision {
        /// The key.
        key: MirrorPidCollisionKey,
        /// The value, `None` for a tombstone.
        value: Option<MirrorPidCollisionValue>,
    },
    /// Type 4; `value` `None` is a tombstone.
    PartitionState {
        /// The key.
        key: MirrorPartitionStateKey,
        /// The value, `None` for a tombstone.
        value: Option<MirrorPartitionStateValue>,
    },
    /// Type 5; `value` `None` is a tombstone.
    ProducerSnapshot {
        /// The key.
        key: MirrorProducerSnapshotKey,
        /// The value, `None` for a tombstone.
        value: Option<MirrorProducerSnapshotValue>,
    },
    /// Type 6; `value` `None` is a tombstone.
    ProducerClaim {
        /// The key.
        key: MirrorProducerClaimKey,
        /// The value, `None` for a tombstone.
        value: Option<MirrorProducerClaimValue>,
    },
    /// Type 7; `value` `None` is a tombstone.
    ProducerSnapshotChunk {
        /// The key.
        key: MirrorProducerSnapshotChunkKey,
        /// The value, `None` for a tombstone.
        value: Option<MirrorProducerSnapshotChunkValue>,
    },
    /// A known key whose value has a version newer than this code: the value
    /// is opaque (written by a newer mirrorguard). Callers keep whatever they
    /// knew for the key rather than fail.
    NewerVersion {
        /// The decoded key.
        key: StateKey,
        /// The value's version.
        version: i16,
    },
    /// A record type this code does not know: skipped, never an error.
    Unknown {
        /// The record type (first int16 of the key).
        record_type: i16,
    },
}

/// Decodes a record from its key and value (`None` = tombstone).
///
/// Returns `Err` only for a malformed record of a known type at a known
/// version; unknown types and newer versions are not errors.
pub fn decode(key: &[u8], value: Option<&[u8]>) -> Result<StateRecord, SchemaError> {
    decode_inner(key, value, false)
}

/// As [`decode`], for display (`mirrorguard dump`): a value whose version is
/// newer than this code is read as its version-0 prefix (later versions only
/// append fields) instead of coming back as [`StateRecord::NewerVersion`];
/// the version itself is the value's first int16.
pub fn decode_for_display(key: &[u8], value: Option<&[u8]>) -> Result<StateRecord, SchemaError> {
    decode_inner(key, value, true)
}

fn decode_inner(
    key: &[u8],
    value: Option<&[u8]>,
    newer_as_v0: bool,
) -> Result<StateRecord, SchemaError> {
    let mut kr = Reader::new(key);
    let record_type = kr
        .read_i16("MirrorStateKey.type")
        .map_err(|_| SchemaError::ShortKey(key.len()))?;
    let skey = match record_type {
        PID_COLLISION_TYPE => StateKey::PidCollision(MirrorPidCollisionKey::read_fields(&mut kr)?),
        PARTITION_STATE_TYPE => StateKey::PartitionState(MirrorPartitionStateKey {
            topic_id: kr.read_uuid("MirrorPartitionStateKey.TopicId")?,
            partition: kr.read_i32("MirrorPartitionStateKey.Partition")?,
        }),
        PRODUCER_SNAPSHOT_TYPE => StateKey::ProducerSnapshot(MirrorProducerSnapshotKey {
            topic_id: kr.read_uuid("MirrorProducerSnapshotKey.TopicId")?,
            partition: kr.read_i32("MirrorProducerSnapshotKey.Partition")?,
        }),
        PRODUCER_CLAIM_TYPE => StateKey::ProducerClaim(MirrorProducerClaimKey {
            topic_id: kr.read_uuid("MirrorProducerClaimKey.TopicId")?,
            partition: kr.read_i32("MirrorProducerClaimKey.Partition")?,
            producer_id: kr.read_i64("MirrorProducerClaimKey.ProducerId")?,
        }),
        PRODUCER_SNAPSHOT_CHUNK_TYPE => {
            StateKey::ProducerSnapshotChunk(MirrorProducerSnapshotChunkKey {
                topic_id: kr.read_uuid("MirrorProducerSnapshotChunkKey.TopicId")?,
                partition: kr.read_i32("MirrorProducerSnapshotChunkKey.Partition")?,
                generation: kr.read_i64("MirrorProducerSnapshotChunkKey.Generation")?,
                chunk: kr.read_i32("MirrorProducerSnapshotChunkKey.Chunk")?,
            })
        }
        _ => return Ok(StateRecord::Unknown { record_type }),
    };
    // A key is an identity for compaction: extra bytes would make two
    // "equal" keys different, so they are refused rather than ignored.
    if !kr.is_empty() {
        return Err(SchemaError::TrailingBytes {
            record_type,
            what: "key",
            remaining: kr.remaining(),
        });
    }
    let Some(value) = value else {
        return Ok(match skey {
            StateKey::PidCollision(key) => StateRecord::PidCollision { key, value: None },
            StateKey::PartitionState(key) => StateRecord::PartitionState { key, value: None },
            StateKey::ProducerSnapshot(key) => StateRecord::ProducerSnapshot { key, value: None },
            StateKey::ProducerClaim(key) => StateRecord::ProducerClaim { key, value: None },
            StateKey::ProducerSnapshotChunk(key) => {
                StateRecord::ProducerSnapshotChunk { key, value: None }
            }
        });
    };
    let mut vr = Reader::new(value);
    let version = vr.read_i16("MirrorStateValue.version")?;
    if version < 0 {
        return Err(SchemaError::InvalidVersion {
            record_type,
            version,
        });
    }
    if version > LATEST_VALUE_VERSION && !newer_as_v0 {
        return Ok(StateRecord::NewerVersion { key: skey, version });
    }
    let rec = match skey {
        StateKey::PidCollision(key) => StateRecord::PidCollision {
            key,
            value: Some(MirrorPidCollisionValue::read_fields(&mut vr)?),
        },
        StateKey::PartitionState(key) => StateRecord::PartitionState {
            key,
            value: Some(MirrorPartitionStateValue::read_fields(&mut vr)?),
        },
        StateKey::ProducerSnapshot(key) => StateRecord::ProducerSnapshot {
            key,
            value: Some(MirrorProducerSnapshotValue::read_fields(&mut vr)?),
        },
        StateKey::ProducerClaim(key) => StateRecord::ProducerClaim {
            key,
            value: Some(MirrorProducerClaimValue::read_fields(&mut vr)?),
        },
        StateKey::ProducerSnapshotChunk(key) => StateRecord::ProducerSnapshotChunk {
            key,
            value: Some(MirrorProducerSnapshotChunkValue::read_fields(&mut vr)?),
        },
    };
    // Version 0 must be consumed exactly (later versions may append fields,
    // but those are NewerVersion above, or read as their v0 prefix).
    if version <= LATEST_VALUE_VERSION && !vr.is_empty() {
        return Err(SchemaError::TrailingBytes {
            record_type,
            what: "value",
            remaining: vr.remaining(),
        });
    }
    Ok(rec)
}

impl StateRecord {
    /// Encodes the record as `(key, value)` (`None` value = tombstone).
    ///
    /// `None` for [`StateRecord::NewerVersion`] and [`StateRecord::Unknown`],
    /// which hold no encodable value.
    pub fn encode(&self) -> Option<Result<EncodedRecord, SchemaError>> {
        fn pair(
            k: Result<Vec<u8>, SchemaError>,
            v: Option<Result<Vec<u8>, SchemaError>>,
        ) -> Result<EncodedRecord, SchemaError> {
            Ok((k?, v.transpose()?))
        }
        Some(match self {
            StateRecord::PidCollision { key, value } => {
                pair(key.encode(), value.as_ref().map(|v| v.encode()))
            }
            StateRecord::PartitionState { key, value } => {
                pair(Ok(key.encode()), value.as_ref().map(|v| v.encode()))
            }
            StateRecord::ProducerSnapshot { key, value } => {
                pair(Ok(key.encode()), value.as_ref().map(|v| v.encode()))
            }
            StateRecord::ProducerClaim { key, value } => {
                pair(Ok(key.encode()), value.as_ref().map(|v| v.encode()))
            }
            StateRecord::ProducerSnapshotChunk { key, value } => {
                pair(Ok(key.encode()), value.as_ref().map(|v| v.encode()))
            }
            StateRecord::NewerVersion { .. } | StateRecord::Unknown { .. } => return None,
        })
    }

    /// The decoded key of a known record type.
    pub fn key(&self) -> Option<StateKey> {
        match self {
            StateRecord::PidCollision { key, .. } => Some(StateKey::PidCollision(key.clone())),
            StateRecord::PartitionState { key, .. } => Some(StateKey::PartitionState(*key)),
            StateRecord::ProducerSnapshot { key, .. } => Some(StateKey::ProducerSnapshot(*key)),
            StateRecord::ProducerClaim { key, .. } => Some(StateKey::ProducerClaim(*key)),
            StateRecord::ProducerSnapshotChunk { key, .. } => {
                Some(StateKey::ProducerSnapshotChunk(*key))
            }
            StateRecord::NewerVersion { key, .. } => Some(key.clone()),
            StateRecord::Unknown { .. } => None,
        }
    }
}

impl StateKey {
    /// Encodes the key bytes.
    pub fn encode(&self) -> Result<Vec<u8>, SchemaError> {
        match self {
            StateKey::PidCollision(k) => k.encode(),
            StateKey::PartitionState(k) => Ok(k.encode()),
            StateKey::ProducerSnapshot(k) => Ok(k.encode()),
            StateKey::ProducerClaim(k) => Ok(k.encode()),
            StateKey::ProducerSnapshotChunk(k) => Ok(k.encode()),
        }
    }
}

#[cfg(test)]
mod tests;
