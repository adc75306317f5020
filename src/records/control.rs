//! Control records: the key (`version:int16, type:int16`), the EndTxnMarker
//! value of COMMIT/ABORT (`version:int16, coordinatorEpoch:int32`) and the
//! `MirrorPidResetRecord` value of the barrier (SPEC 2.3: `Version` int16,
//! `SourceClusterId` compact string, tagged fields).
//!
//! Parsing follows Kafka's `ControlRecordType.parseTypeId` and
//! `EndTransactionMarker.deserialize`: short keys/values and negative
//! versions are errors, higher versions are read as version 0, unknown types
//! are reported as unknown and are never an error (consumers skip them).

use super::batch::{next_entry, Entry};
use super::record::{records, RecordError};
use crate::wire::Reader;

/// Control type id of ABORT markers.
pub const ABORT_TYPE: i16 = 0;
/// Control type id of COMMIT markers.
pub const COMMIT_TYPE: i16 = 1;
/// Control type id of mirrorguard's MIRROR_PID_RESET barrier (SPEC 2.3),
/// the only place the number is written: every builder, parser and check
/// uses this constant.
///
/// The id is NOT reserved upstream: Apache Kafka's `ControlRecordType`
/// knows 0 (ABORT), 1 (COMMIT) and 2-6 (KRaft: LEADER_CHANGE,
/// SNAPSHOT_HEADER, SNAPSHOT_FOOTER, KRAFT_VERSION, KRAFT_VOTERS), and reads
/// any other id as UNKNOWN, which consumers and a stock broker skip. A later
/// Kafka release may assign 7 to something else; a destination that
/// understands the barrier, and this constant, must then move together.
pub const MIRROR_PID_RESET_TYPE: i16 = 7;

/// The control record types mirrorguard understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlType {
    /// Transaction aborted.
    Abort,
    /// Transaction committed.
    Commit,
    /// The MIRROR_PID_RESET barrier (type 7).
    MirrorPidReset,
    /// Any other id (KRaft types 2-6 included): to be ignored.
    Unknown(i16),
}

impl ControlType {
    /// Maps a type id.
    pub fn from_id(id: i16) -> Self {
        match id {
            ABORT_TYPE => ControlType::Abort,
            COMMIT_TYPE => ControlType::Commit,
            MIRROR_PID_RESET_TYPE => ControlType::MirrorPidReset,
            other => ControlType::Unknown(other),
        }
    }

    /// The type id.
    pub fn id(self) -> i16 {
        match self {
            ControlType::Abort => ABORT_TYPE,
            ControlType::Commit => COMMIT_TYPE,
            ControlType::MirrorPidReset => MIRROR_PID_RESET_TYPE,
            ControlType::Unknown(id) => id,
        }
    }

    /// Name in the style of Kafka's `ControlRecordType` (KRaft ids get their
    /// Kafka names; anything Kafka does not know is `UNKNOWN`, like
    /// `ControlRecordType.fromTypeId`).
    pub fn name(self) -> &'static str {
        match self {
            ControlType::Abort => "ABORT",
            ControlType::Commit => "COMMIT",
            ControlType::MirrorPidReset => "MIRROR_PID_RESET",
            ControlType::Unknown(2) => "LEADER_CHANGE",
            ControlType::Unknown(3) => "SNAPSHOT_HEADER",
            ControlType::Unknown(4) => "SNAPSHOT_FOOTER",
            ControlType::Unknown(5) => "KRAFT_VERSION",
            ControlType::Unknown(6) => "KRAFT_VOTERS",
            ControlType::Unknown(_) => "UNKNOWN",
        }
    }
}

/// A parsed control record key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControlKey {
    /// Key version (values above 0 are read as 0).
    pub version: i16,
    /// The type.
    pub control_type: ControlType,
}

/// A parsed control record value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlValue<'a> {
    /// COMMIT/ABORT value.
    EndTxnMarker {
        /// Value version.
        version: i16,
        /// Coordinator epoch.
        coordinator_epoch: i32,
    },
    /// MIRROR_PID_RESET value.
    MirrorPidReset {
        /// Value version.
        version: i16,
        /// The source cluster the partition was mirroring.
        source_cluster_id: &'a str,
    },
    /// The value of a type mirrorguard does not interpret.
    Unknown,
}

/// A control record: key plus value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControlRecord<'a> {
    /// The key.
    pub key: ControlKey,
    /// The value, interpreted according to the key's type.
    pub value: ControlValue<'a>,
}

/// Why a control record could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    /// Key shorter than 4 bytes (Kafka's message).
    #[error("invalid value size found for end control record key. Must have at least 4 bytes, but found only {0}")]
    ShortKey(usize),
    /// Null key.
    #[error("control record has a null key")]
    NullKey,
    /// Negative key or value version.
    #[error("invalid negative version {0} in control record")]
    NegativeVersion(i16),
    /// EndTxnMarker value shorter than 6 bytes.
    #[error("invalid size found for end transaction marker value. Must have at least 6 bytes, but found only {0}")]
    ShortEndTxnValue(usize),
    /// Malformed MirrorPidResetRecord value.
    #[error("malformed MirrorPidResetRecord value: {0}")]
    BadMirrorPidReset(&'static str),
    /// The batch is not a complete control batch.
    #[error("not a complete v2 control batch")]
    NotControlBatch,
    /// The control batch has no record (the log cleaner can leave these).
    #[error("control batch has no records")]
    Empty,
    /// The records could not be read.
    #[error(transparent)]
    Record(#[from] RecordError),
}

/// Parses a control record key.
pub fn parse_key(key: &[u8]) -> Result<ControlKey, ControlError> {
    let mut c = Reader::new(key);
    let (Ok(version), Ok(id)) = (
        c.read_i16("ControlRecordKey.version"),
        c.read_i16("ControlRecordKey.type"),
    ) else {
        return Err(ControlError::ShortKey(key.len()));
    };
    if version < 0 {
        return Err(ControlError::NegativeVersion(version));
    }
    Ok(ControlKey {
        version,
        control_type: ControlType::from_id(id),
    })
}

/// Parses an EndTxnMarker value: `(version, coordinator_epoch)`.
pub fn parse_end_txn_marker(value: &[u8]) -> Result<(i16, i32), ControlError> {
    let mut c = Reader::new(value);
    let (Ok(version), Ok(epoch)) = (
        c.read_i16("EndTxnMarker.version"),
        c.read_i32("EndTxnMarker.coordinatorEpoch"),
    ) else {
        return Err(ControlError::ShortEndTxnValue(value.len()));
    };
    if version < 0 {
        return Err(ControlError::NegativeVersion(version));
    }
    Ok((version, epoch))
}

/// Parses a `MirrorPidResetRecord` value: `(version, source_cluster_id)`.
///
/// Version 0 must be consumed exactly; a higher version is read as version 0
/// and may carry more fields after ours (flexible-version evolution).
pub fn parse_mirror_pid_reset(value: &[u8]) -> Result<(i16, &str), ControlError> {
    let bad = ControlError::BadMirrorPidReset;
    let mut c = Reader::new(value);
    let version = c
        .read_i16("MirrorPidResetRecord.version")
        .map_err(|_| bad("truncated version"))?;
    if version < 0 {
        return Err(ControlError::NegativeVersion(version));
    }
    let len_plus_one = c
        .read_uvarint_lenient("MirrorPidResetRecord.SourceClusterId")
        .map_err(|_| bad("bad SourceClusterId length"))?;
    let len = len_plus_one
        .checked_sub(1)
        .ok_or(bad("null SourceClusterId"))?;
    let len = usize::try_from(len).map_err(|_| bad("bad SourceClusterId length"))?;
    let raw = c
        .take(len, "MirrorPidResetRecord.SourceClusterId")
        .map_err(|_| bad("SourceClusterId extends past the value"))?;
    let id = std::str::from_utf8(raw).map_err(|_| bad("SourceClusterId is not UTF-8"))?;
    if version == 0 {
        c.skip_tagged_fields_lenient("MirrorPidResetRecord._tagged_fields")
            .map_err(|_| bad("bad tagged fields"))?;
        if c.remaining() != 0 {
            return Err(bad("trailing bytes"));
        }
    }
    Ok((version, id))
}

/// Parses a control record from its key and value bytes.
pub fn parse_record<'a>(
    key: Option<&[u8]>,
    value: Option<&'a [u8]>,
) -> Result<ControlRecord<'a>, ControlError> {
    let key = parse_key(key.ok_or(ControlError::NullKey)?)?;
    let value = match key.control_type {
        ControlType::Abort | ControlType::Commit => {
            let (version, coordinator_epoch) = parse_end_txn_marker(value.unwrap_or_default())?;
            ControlValue::EndTxnMarker {
                version,
                coordinator_epoch,
            }
        }
        ControlType::MirrorPidReset => {
            let (version, source_cluster_id) = parse_mirror_pid_reset(value.unwrap_or_default())?;
            ControlValue::MirrorPidReset {
                version,
                source_cluster_id,
            }
        }
        ControlType::Unknown(_) => ControlValue::Unknown,
    };
    Ok(ControlRecord { key, value })
}

/// The control type of the first record of a control batch, read from its
/// key alone: tells a barrier whose value does not parse from other
/// damaged control batches. `None` when the batch or key is unreadable.
pub fn first_control_type(batch: &[u8]) -> Option<ControlType> {
    let header = match next_entry(batch, 0) {
        Some(Ok(Entry::V2(h))) if h.is_control() => h,
        _ => return None,
    };
    let bytes = batch.get(header.range.clone())?;
    let rec = records(&header, bytes).ok()?.next()?.ok()?;
    parse_key(rec.key?).ok().map(|k| k.control_type)
}

/// Reads the first record of a control batch (the only one Kafka consults)
/// and parses it. `batch` starts at the batch's baseOffset. Allocates
/// nothing; the returned cluster id borrows from `batch`.
pub fn first_control_record(batch: &[u8]) -> Result<ControlRecord<'_>, ControlError> {
    let header = match next_entry(batch, 0) {
        Some(Ok(Entry::V2(h))) if h.is_control() => h,
        _ => return Err(ControlError::NotControlBatch),
    };
    let bytes = batch
        .get(header.range.clone())
        .ok_or(ControlError::NotControlBatch)?;
    let mut it = records(&header, bytes)?;
    let rec = it.next().ok_or(ControlError::Empty)??;
    parse_record(rec.key, rec.value)
}
