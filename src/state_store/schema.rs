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
//! | (tags) | tagged fields | none defined |
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
//! | (tags) | tagged fields | none defined |
//!
//! Decoding never panics and never allocates from an unchecked length (all
//! reads go through [`crate::wire::Reader`]). Unknown record types and value
//! versions newer than this code are *not* errors: they decode as
//! [`StateRecord::Unknown`] / [`StateRecord::NewerVersion`], so a rolling
//! upgrade that adds a record type never stops an older instance's load.
//!
//! (Over 600 lines on purpose: every record type's key and value codec of
//! the durable contract side by side, so their version rules are read
//! together; a fifth of the file is its tests.)

use crate::wire::{Reader, WireError, Writer};

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

/// A tagged field kept verbatim: `(tag, payload)`. Values decoded here keep
/// unknown tagged fields so that re-encoding preserves what a newer writer
/// added.
pub type RawTaggedField = (u32, Vec<u8>);

/// Key of a resolved PID collision (type 3, SPEC 2.2).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MirrorPidCollisionKey {
    /// Destination topic id where the collision occurred.
    pub topic_id: [u8; 16],
    /// Partition index.
    pub partition: i32,
    /// The source cluster whose PID was remapped (its id text).
    pub source_cluster_id: String,
    /// The PID on the source cluster before mapping.
    pub original_pid: i64,
}

/// Value of a resolved PID collision (v0, flexible, SPEC 2.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorPidCollisionValue {
    /// The salt added to the cluster hash.
    pub salt: i64,
    /// The cluster that already held the slot.
    pub colliding_cluster_id: String,
    /// Wall-clock time of the resolution (ms since the epoch).
    pub timestamp_ms: i64,
    /// Tagged fields not known to this version, kept verbatim.
    pub unknown_tagged_fields: Vec<RawTaggedField>,
}

/// Key of a partition's life-cycle state (type 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MirrorPartitionStateKey {
    /// Destination topic id.
    pub topic_id: [u8; 16],
    /// Partition index.
    pub partition: i32,
}

/// Value of a partition's life-cycle state (v0, flexible).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorPartitionStateValue {
    /// Name of the mirror feeding the partition.
    pub mirror: String,
    /// Destination topic name.
    pub topic_name: String,
    /// The state.
    pub state: MirrorPartitionState,
    /// The source cluster being mirrored.
    pub source_cluster_id: String,
    /// The cut (last mirrored offset + 1); -1 = none yet.
    pub cut_offset: i64,
    /// Number of sealing batches served at the cut; -1 = not yet.
    pub seal_batches: i32,
    /// Why (FAILED reason, operator note); `None` = none.
    pub reason: Option<String>,
    /// Wall-clock time of the transition (ms since the epoch).
    pub timestamp_ms: i64,
    /// Tagged fields not known to this version, kept verbatim.
    pub unknown_tagged_fields: Vec<RawTaggedField>,
}

/// Key of a partition's producer-state snapshot (type 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MirrorProducerSnapshotKey {
    /// Destination topic id.
    pub topic_id: [u8; 16],
    /// Partition index.
    pub partition: i32,
}

/// One producer of a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotProducer {
    /// The (mapped) PID as the destination sees it.
    pub producer_id: i64,
    /// Source cluster of the producer.
    pub origin_cluster_id: [u8; 16],
    /// The PID on the source cluster.
    pub original_pid: i64,
    /// Current epoch.
    pub producer_epoch: i16,
    /// Last sequence number.
    pub last_sequence: i32,
    /// Offset of the producer's last batch.
    pub last_offset: i64,
    /// Coordinator epoch of its last marker.
    pub coordinator_epoch: i32,
    /// First offset of the open transaction; -1 = none.
    pub txn_first_offset: i64,
    /// Max timestamp of its last batch.
    pub last_timestamp: i64,
}

/// Value of a partition's producer-state snapshot (v0, flexible).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorProducerSnapshotValue {
    /// Destination offset the snapshot is valid up to.
    pub snapshot_offset: i64,
    /// The producers.
    pub producers: Vec<SnapshotProducer>,
    /// Tagged fields not known to this version, kept verbatim.
    pub unknown_tagged_fields: Vec<RawTaggedField>,
}

/// Key of one producer's claim on a mapped PID in a partition (type 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MirrorProducerClaimKey {
    /// Destination topic id.
    pub topic_id: [u8; 16],
    /// Partition index.
    pub partition: i32,
    /// The (mapped) PID as the destination sees it.
    pub producer_id: i64,
}

/// Value of a producer claim (v0, flexible).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorProducerClaimValue {
    /// Source cluster of the producer.
    pub origin_cluster_id: [u8; 16],
    /// The PID on the source cluster.
    pub original_pid: i64,
    /// Wall-clock time of the claim (ms since the epoch).
    pub timestamp_ms: i64,
    /// Tagged fields not known to this version, kept verbatim.
    pub unknown_tagged_fields: Vec<RawTaggedField>,
}

/// Key of one chunk of a partition's chunked producer-state snapshot (type 7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MirrorProducerSnapshotChunkKey {
    /// Destination topic id.
    pub topic_id: [u8; 16],
    /// Partition index.
    pub partition: i32,
    /// The snapshot this chunk belongs to (increasing per partition).
    pub generation: i64,
    /// Chunk index, 0-based.
    pub chunk: i32,
}

/// Value of a snapshot chunk (v0, flexible).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorProducerSnapshotChunkValue {
    /// Destination offset the snapshot is valid up to.
    pub snapshot_offset: i64,
    /// Number of chunks of this generation.
    pub chunk_count: i32,
    /// The producers of this chunk.
    pub producers: Vec<SnapshotProducer>,
    /// Tagged fields not known to this version, kept verbatim.
    pub unknown_tagged_fields: Vec<RawTaggedField>,
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

/// Reads a value's trailing tagged-field section, keeping each field.
fn read_tags(r: &mut Reader<'_>, field: &'static str) -> Result<Vec<RawTaggedField>, SchemaError> {
    let section = r.read_tagged_fields(field)?;
    // The section was validated against the bytes present, so this
    // allocation is bounded by the input.
    Ok(section.iter().map(|f| (f.tag, f.data.to_vec())).collect())
}

/// Writes a tagged-field section from kept fields (ascending tag order, as
/// the protocol requires).
fn write_tags(
    w: &mut Writer<Vec<u8>>,
    tags: &[RawTaggedField],
    field: &'static str,
) -> Result<(), SchemaError> {
    let mut sorted: Vec<(u32, &[u8])> = tags.iter().map(|(t, d)| (*t, d.as_slice())).collect();
    sorted.sort_by_key(|(t, _)| *t);
    w.put_tagged_fields(&sorted, field)?;
    Ok(())
}

impl MirrorPidCollisionKey {
    fn read_fields(r: &mut Reader<'_>) -> Result<Self, SchemaError> {
        Ok(Self {
            topic_id: r.read_uuid("MirrorPidCollisionKey.TopicId")?,
            partition: r.read_i32("MirrorPidCollisionKey.Partition")?,
            source_cluster_id: r
                .read_string("MirrorPidCollisionKey.SourceClusterId")?
                .to_owned(),
            original_pid: r.read_i64("MirrorPidCollisionKey.OriginalPid")?,
        })
    }

    /// Encodes the key (type 3). Fails only for a source cluster id longer
    /// than 32767 bytes.
    pub fn encode(&self) -> Result<Vec<u8>, SchemaError> {
        let mut w = Writer::new(Vec::with_capacity(32 + self.source_cluster_id.len()));
        w.put_i16(PID_COLLISION_TYPE);
        w.put_uuid(&self.topic_id);
        w.put_i32(self.partition);
        w.put_string(
            &self.source_cluster_id,
            "MirrorPidCollisionKey.SourceClusterId",
        )?;
        w.put_i64(self.original_pid);
        Ok(w.into_inner())
    }
}

impl MirrorPidCollisionValue {
    fn read_fields(r: &mut Reader<'_>) -> Result<Self, SchemaError> {
        Ok(Self {
            salt: r.read_i64("MirrorPidCollisionValue.Salt")?,
            colliding_cluster_id: r
                .read_compact_string("MirrorPidCollisionValue.CollidingClusterId")?
                .to_owned(),
            timestamp_ms: r.read_i64("MirrorPidCollisionValue.TimestampMs")?,
            unknown_tagged_fields: read_tags(r, "MirrorPidCollisionValue._tagged_fields")?,
        })
    }

    /// Encodes the value (version 0).
    pub fn encode(&self) -> Result<Vec<u8>, SchemaError> {
        let mut w = Writer::new(Vec::with_capacity(24 + self.colliding_cluster_id.len()));
        w.put_i16(0);
        w.put_i64(self.salt);
        w.put_compact_string(
            &self.colliding_cluster_id,
            "MirrorPidCollisionValue.CollidingClusterId",
        )?;
        w.put_i64(self.timestamp_ms);
        write_tags(
            &mut w,
            &self.unknown_tagged_fields,
            "MirrorPidCollisionValue._tagged_fields",
        )?;
        Ok(w.into_inner())
    }
}

/// Encodes `type, TopicId, Partition` (the shared layout of types 4 and 5).
fn encode_topic_partition_key(record_type: i16, topic_id: &[u8; 16], partition: i32) -> Vec<u8> {
    let mut w = Writer::new(Vec::with_capacity(22));
    w.put_i16(record_type);
    w.put_uuid(topic_id);
    w.put_i32(partition);
    w.into_inner()
}

impl MirrorPartitionStateKey {
    /// Encodes the key (type 4).
    pub fn encode(&self) -> Vec<u8> {
        encode_topic_partition_key(PARTITION_STATE_TYPE, &self.topic_id, self.partition)
    }
}

impl MirrorPartitionStateValue {
    fn read_fields(r: &mut Reader<'_>) -> Result<Self, SchemaError> {
        Ok(Self {
            mirror: r
                .read_compact_string("MirrorPartitionStateValue.Mirror")?
                .to_owned(),
            topic_name: r
                .read_compact_string("MirrorPartitionStateValue.TopicName")?
                .to_owned(),
            state: MirrorPartitionState::from_code(r.read_i8("MirrorPartitionStateValue.State")?),
            source_cluster_id: r
                .read_compact_string("MirrorPartitionStateValue.SourceClusterId")?
                .to_owned(),
            cut_offset: r.read_i64("MirrorPartitionStateValue.CutOffset")?,
            seal_batches: r.read_i32("MirrorPartitionStateValue.SealBatches")?,
            reason: r
                .read_compact_nullable_string("MirrorPartitionStateValue.Reason")?
                .map(str::to_owned),
            timestamp_ms: r.read_i64("MirrorPartitionStateValue.TimestampMs")?,
            unknown_tagged_fields: read_tags(r, "MirrorPartitionStateValue._tagged_fields")?,
        })
    }

    /// Encodes the value (version 0).
    pub fn encode(&self) -> Result<Vec<u8>, SchemaError> {
        let mut w = Writer::new(Vec::with_capacity(64));
        w.put_i16(0);
        w.put_compact_string(&self.mirror, "MirrorPartitionStateValue.Mirror")?;
        w.put_compact_string(&self.topic_name, "MirrorPartitionStateValue.TopicName")?;
        w.put_i8(self.state.code());
        w.put_compact_string(
            &self.source_cluster_id,
            "MirrorPartitionStateValue.SourceClusterId",
        )?;
        w.put_i64(self.cut_offset);
        w.put_i32(self.seal_batches);
        w.put_compact_nullable_string(self.reason.as_deref(), "MirrorPartitionStateValue.Reason")?;
        w.put_i64(self.timestamp_ms);
        write_tags(
            &mut w,
            &self.unknown_tagged_fields,
            "MirrorPartitionStateValue._tagged_fields",
        )?;
        Ok(w.into_inner())
    }
}

impl MirrorProducerSnapshotKey {
    /// Encodes the key (type 5).
    pub fn encode(&self) -> Vec<u8> {
        encode_topic_partition_key(PRODUCER_SNAPSHOT_TYPE, &self.topic_id, self.partition)
    }
}

/// Smallest encoded producer entry: 8+16+8+2+4+8+4+8+8 fixed bytes plus an
/// empty tagged-field section. Bounds the array count before any allocation.
const MIN_PRODUCER_ENTRY: usize = 67;

fn read_producers(r: &mut Reader<'_>) -> Result<Vec<SnapshotProducer>, SchemaError> {
    {
        let n = r.read_array_len_v(
            true,
            MIN_PRODUCER_ENTRY,
            "MirrorProducerSnapshotValue.Producers",
        )?;
        // `n` was checked against the bytes present (each entry needs at
        // least MIN_PRODUCER_ENTRY bytes), so this reservation is bounded.
        let mut producers = Vec::with_capacity(n);
        for _ in 0..n {
            producers.push(SnapshotProducer {
                producer_id: r.read_i64("SnapshotProducer.ProducerId")?,
                origin_cluster_id: r.read_uuid("SnapshotProducer.OriginClusterId")?,
                original_pid: r.read_i64("SnapshotProducer.OriginalPid")?,
                producer_epoch: r.read_i16("SnapshotProducer.ProducerEpoch")?,
                last_sequence: r.read_i32("SnapshotProducer.LastSequence")?,
                last_offset: r.read_i64("SnapshotProducer.LastOffset")?,
                coordinator_epoch: r.read_i32("SnapshotProducer.CoordinatorEpoch")?,
                txn_first_offset: r.read_i64("SnapshotProducer.TxnFirstOffset")?,
                last_timestamp: r.read_i64("SnapshotProducer.LastTimestamp")?,
            });
            // Entry-level tags: none defined in v0; skipped (a newer writer
            // adding one would bump the value version).
            r.read_tagged_fields("SnapshotProducer._tagged_fields")?;
        }
        Ok(producers)
    }
}

fn write_producers(
    w: &mut Writer<Vec<u8>>,
    producers: &[SnapshotProducer],
) -> Result<(), SchemaError> {
    w.put_compact_array_len(
        Some(producers.len()),
        "MirrorProducerSnapshotValue.Producers",
    )?;
    for p in producers {
        w.put_i64(p.producer_id);
        w.put_uuid(&p.origin_cluster_id);
        w.put_i64(p.original_pid);
        w.put_i16(p.producer_epoch);
        w.put_i32(p.last_sequence);
        w.put_i64(p.last_offset);
        w.put_i32(p.coordinator_epoch);
        w.put_i64(p.txn_first_offset);
        w.put_i64(p.last_timestamp);
        w.put_uvarint(0);
    }
    Ok(())
}

/// Tag of [`SnapshotClosings`] in a `MirrorProducerSnapshotValue` (v0):
/// an optional tagged field, so an instance that does not know it skips it.
pub const SNAPSHOT_CLOSINGS_TAG: u32 = 0;

/// The transaction closings a partition's producer state remembers past the
/// destination fetcher's position, kept with a type-5 snapshot (tagged field
/// [`SNAPSHOT_CLOSINGS_TAG`]): a snapshot taken ahead of the fetcher makes
/// the markers below its offset replays after a restart, so the closings
/// they made are restored from here, not observed again.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SnapshotClosings {
    /// The fetcher position the closings are kept from.
    pub fetcher_position: i64,
    /// Highest offset below which closings may be missing (-1: none).
    pub dropped_upto: i64,
    /// The closings, in marker offset order.
    pub closings: Vec<SnapshotClosing>,
}

/// One transaction closing in [`SnapshotClosings`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotClosing {
    /// Offset of the closing marker.
    pub marker_offset: i64,
    /// The (mapped) PID.
    pub producer_id: i64,
    /// The producer epoch of the transaction's batches.
    pub producer_epoch: i16,
    /// The transaction's first offset.
    pub first_offset: i64,
    /// The coordinator epoch before the marker.
    pub coordinator_epoch: i32,
    /// Source cluster of the producer.
    pub origin_cluster_id: [u8; 16],
    /// The PID on the source cluster.
    pub original_pid: i64,
}

/// Smallest encoded closing: 8+8+2+8+4+16+8 bytes and an empty tag section.
const MIN_CLOSING_ENTRY: usize = 55;

impl SnapshotClosings {
    /// Encodes the closings as a tagged field of a snapshot value.
    pub fn encode_tag(&self) -> Result<RawTaggedField, SchemaError> {
        let mut w = Writer::new(Vec::with_capacity(
            20 + self.closings.len().saturating_mul(MIN_CLOSING_ENTRY),
        ));
        w.put_i64(self.fetcher_position);
        w.put_i64(self.dropped_upto);
        w.put_compact_array_len(Some(self.closings.len()), "SnapshotClosings.Closings")?;
        for c in &self.closings {
            w.put_i64(c.marker_offset);
            w.put_i64(c.producer_id);
            w.put_i16(c.producer_epoch);
            w.put_i64(c.first_offset);
            w.put_i32(c.coordinator_epoch);
            w.put_uuid(&c.origin_cluster_id);
            w.put_i64(c.original_pid);
            w.put_uvarint(0);
        }
        w.put_uvarint(0);
        Ok((SNAPSHOT_CLOSINGS_TAG, w.into_inner()))
    }

    /// The closings among a snapshot value's tagged fields (`None` when the
    /// writer kept none).
    pub fn from_tags(tags: &[RawTaggedField]) -> Result<Option<Self>, SchemaError> {
        let Some((_, data)) = tags.iter().find(|(t, _)| *t == SNAPSHOT_CLOSINGS_TAG) else {
            return Ok(None);
        };
        let mut r = Reader::new(data);
        let fetcher_position = r.read_i64("SnapshotClosings.FetcherPosition")?;
        let dropped_upto = r.read_i64("SnapshotClosings.DroppedUpto")?;
        let n = r.read_array_len_v(true, MIN_CLOSING_ENTRY, "SnapshotClosings.Closings")?;
        // Bounded: `n` was checked against the bytes present.
        let mut closings = Vec::with_capacity(n);
        for _ in 0..n {
            closings.push(SnapshotClosing {
                marker_offset: r.read_i64("SnapshotClosing.MarkerOffset")?,
                producer_id: r.read_i64("SnapshotClosing.ProducerId")?,
                producer_epoch: r.read_i16("SnapshotClosing.ProducerEpoch")?,
                first_offset: r.read_i64("SnapshotClosing.FirstOffset")?,
                coordinator_epoch: r.read_i32("SnapshotClosing.CoordinatorEpoch")?,
                origin_cluster_id: r.read_uuid("SnapshotClosing.OriginClusterId")?,
                original_pid: r.read_i64("SnapshotClosing.OriginalPid")?,
            });
            r.read_tagged_fields("SnapshotClosing._tagged_fields")?;
        }
        r.read_tagged_fields("SnapshotClosings._tagged_fields")?;
        Ok(Some(Self {
            fetcher_position,
            dropped_upto,
            closings,
        }))
    }
}

impl MirrorProducerSnapshotValue {
    fn read_fields(r: &mut Reader<'_>) -> Result<Self, SchemaError> {
        let snapshot_offset = r.read_i64("MirrorProducerSnapshotValue.SnapshotOffset")?;
        let producers = read_producers(r)?;
        Ok(Self {
            snapshot_offset,
            producers,
            unknown_tagged_fields: read_tags(r, "MirrorProducerSnapshotValue._tagged_fields")?,
        })
    }

    /// Encodes the value (version 0).
    pub fn encode(&self) -> Result<Vec<u8>, SchemaError> {
        let mut w = Writer::new(Vec::with_capacity(
            12 + self.producers.len().saturating_mul(MIN_PRODUCER_ENTRY),
        ));
        w.put_i16(0);
        w.put_i64(self.snapshot_offset);
        write_producers(&mut w, &self.producers)?;
        write_tags(
            &mut w,
            &self.unknown_tagged_fields,
            "MirrorProducerSnapshotValue._tagged_fields",
        )?;
        Ok(w.into_inner())
    }
}

impl MirrorProducerClaimKey {
    /// Encodes the key (type 6): 30 bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut k = encode_topic_partition_key(PRODUCER_CLAIM_TYPE, &self.topic_id, self.partition);
        k.extend_from_slice(&self.producer_id.to_be_bytes());
        k
    }
}

impl MirrorProducerClaimValue {
    fn read_fields(r: &mut Reader<'_>) -> Result<Self, SchemaError> {
        Ok(Self {
            origin_cluster_id: r.read_uuid("MirrorProducerClaimValue.OriginClusterId")?,
            original_pid: r.read_i64("MirrorProducerClaimValue.OriginalPid")?,
            timestamp_ms: r.read_i64("MirrorProducerClaimValue.TimestampMs")?,
            unknown_tagged_fields: read_tags(r, "MirrorProducerClaimValue._tagged_fields")?,
        })
    }

    /// Encodes the value (version 0): 35 bytes without tagged fields.
    pub fn encode(&self) -> Result<Vec<u8>, SchemaError> {
        let mut w = Writer::new(Vec::with_capacity(35));
        w.put_i16(0);
        w.put_uuid(&self.origin_cluster_id);
        w.put_i64(self.original_pid);
        w.put_i64(self.timestamp_ms);
        write_tags(
            &mut w,
            &self.unknown_tagged_fields,
            "MirrorProducerClaimValue._tagged_fields",
        )?;
        Ok(w.into_inner())
    }
}

impl MirrorProducerSnapshotChunkKey {
    /// Encodes the key (type 7): 34 bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut k = encode_topic_partition_key(
            PRODUCER_SNAPSHOT_CHUNK_TYPE,
            &self.topic_id,
            self.partition,
        );
        k.extend_from_slice(&self.generation.to_be_bytes());
        k.extend_from_slice(&self.chunk.to_be_bytes());
        k
    }
}

impl MirrorProducerSnapshotChunkValue {
    fn read_fields(r: &mut Reader<'_>) -> Result<Self, SchemaError> {
        let snapshot_offset = r.read_i64("MirrorProducerSnapshotChunkValue.SnapshotOffset")?;
        let chunk_count = r.read_i32("MirrorProducerSnapshotChunkValue.ChunkCount")?;
        let producers = read_producers(r)?;
        Ok(Self {
            snapshot_offset,
            chunk_count,
            producers,
            unknown_tagged_fields: read_tags(r, "MirrorProducerSnapshotChunkValue._tagged_fields")?,
        })
    }

    /// Encodes the value (version 0).
    pub fn encode(&self) -> Result<Vec<u8>, SchemaError> {
        let mut w = Writer::new(Vec::with_capacity(
            16 + self.producers.len().saturating_mul(MIN_PRODUCER_ENTRY),
        ));
        w.put_i16(0);
        w.put_i64(self.snapshot_offset);
        w.put_i32(self.chunk_count);
        write_producers(&mut w, &self.producers)?;
        write_tags(
            &mut w,
            &self.unknown_tagged_fields,
            "MirrorProducerSnapshotChunkValue._tagged_fields",
        )?;
        Ok(w.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tid() -> [u8; 16] {
        let mut t = [0u8; 16];
        for (i, b) in t.iter_mut().enumerate() {
            *b = i as u8 + 1;
        }
        t
    }

    /// The type-3 record of SPEC 2.2, checked byte for byte against bytes
    /// written out by hand from the SPEC tables.
    #[test]
    fn collision_record_matches_hand_computed_bytes() {
        let key = MirrorPidCollisionKey {
            topic_id: tid(),
            partition: 7,
            source_cluster_id: "abc".into(),
            original_pid: 5,
        };
        let value = MirrorPidCollisionValue {
            salt: 1,
            colliding_cluster_id: "xy".into(),
            timestamp_ms: 0x0102_0304_0506_0708,
            unknown_tagged_fields: vec![],
        };
        #[rustfmt::skip]
        let want_key: &[u8] = &[
            0x00, 0x03,                                     // record type 3
            1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, // TopicId
            0x00, 0x00, 0x00, 0x07,                         // Partition 7
            0x00, 0x03, b'a', b'b', b'c',                   // SourceClusterId: int16 len 3
            0, 0, 0, 0, 0, 0, 0, 5,                         // OriginalPid 5
        ];
        #[rustfmt::skip]
        let want_value: &[u8] = &[
            0x00, 0x00,                                     // version 0
            0, 0, 0, 0, 0, 0, 0, 1,                         // Salt 1
            0x03, b'x', b'y',                               // CollidingClusterId: uvarint len+1 = 3
            1, 2, 3, 4, 5, 6, 7, 8,                         // TimestampMs
            0x00,                                           // no tagged fields
        ];
        assert_eq!(key.encode().unwrap(), want_key);
        assert_eq!(value.encode().unwrap(), want_value);
        assert_eq!(
            decode(want_key, Some(want_value)).unwrap(),
            StateRecord::PidCollision {
                key,
                value: Some(value)
            }
        );
    }

    #[test]
    fn tombstones_unknown_and_newer() {
        let k = MirrorPartitionStateKey {
            topic_id: tid(),
            partition: 1,
        };
        assert_eq!(
            decode(&k.encode(), None).unwrap(),
            StateRecord::PartitionState {
                key: k,
                value: None
            }
        );
        assert_eq!(
            decode(&[0, 9, 1, 2, 3], Some(b"zz")).unwrap(),
            StateRecord::Unknown { record_type: 9 }
        );
        assert_eq!(
            decode(&k.encode(), Some(&[0, 1, 0xff])).unwrap(),
            StateRecord::NewerVersion {
                key: StateKey::PartitionState(k),
                version: 1
            }
        );
        assert!(matches!(decode(&[0], None), Err(SchemaError::ShortKey(1))));
        assert!(decode(&k.encode(), Some(&[0xff, 0xff])).is_err());
        let mut long = k.encode();
        long.push(0);
        assert!(matches!(
            decode(&long, None),
            Err(SchemaError::TrailingBytes { what: "key", .. })
        ));
    }

    #[test]
    fn unknown_tags_round_trip() {
        let k = MirrorPartitionStateKey {
            topic_id: tid(),
            partition: 3,
        };
        let v = MirrorPartitionStateValue {
            mirror: "m1".into(),
            topic_name: "orders".into(),
            state: MirrorPartitionState::Other(9),
            source_cluster_id: "MkU3OEVBNTcwNTJENDM2Qg".into(),
            cut_offset: -1,
            seal_batches: -1,
            reason: None,
            timestamp_ms: 12,
            unknown_tagged_fields: vec![(2, vec![1, 2]), (7, vec![])],
        };
        let bytes = v.encode().unwrap();
        assert_eq!(
            decode(&k.encode(), Some(&bytes)).unwrap(),
            StateRecord::PartitionState {
                key: k,
                value: Some(v)
            }
        );
    }

    #[test]
    fn claim_record_round_trips_and_is_small() {
        let key = MirrorProducerClaimKey {
            topic_id: tid(),
            partition: 7,
            producer_id: 0x1234_5678,
        };
        let value = MirrorProducerClaimValue {
            origin_cluster_id: [9; 16],
            original_pid: 42,
            timestamp_ms: 1_700_000_000_000,
            unknown_tagged_fields: Vec::new(),
        };
        let rec = StateRecord::ProducerClaim {
            key,
            value: Some(value.clone()),
        };
        let (k, v) = rec.encode().unwrap().unwrap();
        assert_eq!(k.len(), 30);
        assert_eq!(v.as_ref().unwrap().len(), 35);
        assert_eq!(&k[..2], &[0, 6]);
        assert_eq!(decode(&k, v.as_deref()).unwrap(), rec);
        assert_eq!(
            decode(&k, None).unwrap(),
            StateRecord::ProducerClaim { key, value: None }
        );
        // Truncated or over-long records of a known type are errors, never panics.
        assert!(decode(&k[..29], v.as_deref()).is_err());
        assert!(decode(&k, Some(&v.as_ref().unwrap()[..20])).is_err());
        let mut newer = v.unwrap();
        newer[1] = 1;
        assert!(matches!(
            decode(&k, Some(&newer)).unwrap(),
            StateRecord::NewerVersion { version: 1, .. }
        ));
    }

    /// The closings ride in tagged field 0 of a v0 snapshot value: a reader
    /// that does not know them decodes the producers as before and keeps
    /// the field opaque; one that does gets them back.
    #[test]
    fn snapshot_closings_are_an_optional_tagged_field() {
        let closings = SnapshotClosings {
            fetcher_position: 40,
            dropped_upto: -1,
            closings: vec![SnapshotClosing {
                marker_offset: 44,
                producer_id: 5,
                producer_epoch: 2,
                first_offset: 12,
                coordinator_epoch: 3,
                origin_cluster_id: [9; 16],
                original_pid: 6,
            }],
        };
        let tag = closings.encode_tag().unwrap();
        assert_eq!(tag.0, SNAPSHOT_CLOSINGS_TAG);
        assert_eq!(tag.1.len(), 8 + 8 + 1 + MIN_CLOSING_ENTRY + 1);
        let value = MirrorProducerSnapshotValue {
            snapshot_offset: 45,
            producers: vec![SnapshotProducer {
                producer_id: 5,
                origin_cluster_id: [9; 16],
                original_pid: 6,
                producer_epoch: 2,
                last_sequence: 0,
                last_offset: 43,
                coordinator_epoch: 4,
                txn_first_offset: -1,
                last_timestamp: 7,
            }],
            unknown_tagged_fields: vec![tag],
        };
        let k = MirrorProducerSnapshotKey {
            topic_id: tid(),
            partition: 0,
        }
        .encode();
        let v = value.encode().unwrap();
        let StateRecord::ProducerSnapshot {
            value: Some(back), ..
        } = decode(&k, Some(&v)).unwrap()
        else {
            panic!("a type-5 record");
        };
        assert_eq!(back, value);
        assert_eq!(
            SnapshotClosings::from_tags(&back.unknown_tagged_fields).unwrap(),
            Some(closings)
        );
        assert_eq!(SnapshotClosings::from_tags(&[]).unwrap(), None);
        // Hostile bytes: an error, never a panic or a huge allocation.
        let bad = vec![(SNAPSHOT_CLOSINGS_TAG, vec![0u8; 17])];
        assert!(SnapshotClosings::from_tags(&bad).is_err());
        let mut huge = vec![0u8; 16];
        huge.extend_from_slice(&[0xff, 0xff, 0xff, 0x0f]);
        assert!(SnapshotClosings::from_tags(&[(SNAPSHOT_CLOSINGS_TAG, huge)]).is_err());
    }

    #[test]
    fn snapshot_chunk_round_trips() {
        let key = MirrorProducerSnapshotChunkKey {
            topic_id: tid(),
            partition: 3,
            generation: 1_700_000_000_000,
            chunk: 2,
        };
        let p = SnapshotProducer {
            producer_id: 5,
            origin_cluster_id: [1; 16],
            original_pid: 6,
            producer_epoch: 0,
            last_sequence: 9,
            last_offset: 100,
            coordinator_epoch: -1,
            txn_first_offset: -1,
            last_timestamp: 7,
        };
        let rec = StateRecord::ProducerSnapshotChunk {
            key,
            value: Some(MirrorProducerSnapshotChunkValue {
                snapshot_offset: 101,
                chunk_count: 4,
                producers: vec![p; 3],
                unknown_tagged_fields: Vec::new(),
            }),
        };
        let (k, v) = rec.encode().unwrap().unwrap();
        assert_eq!(k.len(), 34);
        assert_eq!(
            v.as_ref().unwrap().len(),
            2 + 8 + 4 + 1 + 3 * MIN_PRODUCER_ENTRY + 1
        );
        assert_eq!(decode(&k, v.as_deref()).unwrap(), rec);
        assert!(decode(&k[..33], v.as_deref()).is_err());
    }
}
