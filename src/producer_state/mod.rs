//! Producer state of mirrored destination partitions (issue 4, SPEC 1-2).
//!
//! The destination broker's ProducerStateManager (PSM) checks almost nothing
//! on the replication path (`reference/kafka-wire.md` section 3): sequence
//! gaps, duplicates, lower epochs and markers of a foreign producer are all
//! accepted silently. This module keeps a shadow of that PSM for every
//! destination partition that mirrorguard feeds, annotated with the *origin*
//! (source cluster, original PID) of each mapped PID, so that the proxy can
//!
//! * report every batch that would silently corrupt the destination's state
//!   ([`Anomaly`]),
//! * detect two origins landing on one mapped PID and choose a deterministic,
//!   persistable salt for the newcomer ([`resolve_collision`], [`SaltTable`]),
//! * list the transactions still open when a partition is sealed
//!   ([`PartitionState::open_transactions`]), and
//! * expire everything when a MIRROR_PID_RESET barrier passes.
//!
//! Everything here is pure and synchronous: no I/O, no async, no clock reads
//! (the caller passes wall-clock milliseconds), so the same code serves the
//! live Fetch path, start-up replay and tests.
//!
//! # Per-batch flow (for the Fetch path)
//!
//! ```text
//! handle = registry.partition(key)                       // once per partition, cached
//! handle.with(|p| p.lookup_mapping(&origin, &|salt| map(pid, salt)))
//!   Ready { mapped_pid }        -> rewrite the batch with mapped_pid
//!   Collision { holder, .. }    -> region mode: resolve_collision(), persist the
//!                                  salt record, wait for the ack, SaltTable::apply(),
//!                                  then look up again; preserve mode: report only
//! handle.observe(&origin, &batch_with_mapped_pid, now_ms, &mut scratch)
//!   -> scratch holds the anomalies (metric by kind(), WARN with Display);
//!      they are also recorded in the registry's AnomalyLog
//! ```
//!
//! # Cost
//!
//! `observe` is one hash-map lookup plus a handful of comparisons and never
//! allocates on the steady path (anomalies go into a caller-owned, reused
//! `Vec`). Salt lookups short-circuit when a partition has no salt records,
//! which is the normal case.

mod anomaly;
mod collision;
mod hash;
mod partition;
mod registry;
mod salt;

pub use anomaly::{Anomaly, AnomalyDetail, AnomalyKind, AnomalyLog, AnomalyRecord};
pub use collision::{resolve_collision, resolve_collision_for_topic, MappingLookup};
pub use partition::{
    ClosedTransaction, ClosingsBudget, ClosingsRetention, ClosingsSnapshot, ObserveOutcome,
    OpenAtCut, OpenTransaction, PartitionSnapshot, PartitionState, ProducerEntry,
    ProducerSnapshotEntry, SnapshotError, TransactionAtCut, DEFAULT_CLOSINGS_RETAINED_MAX,
    DEFAULT_CLOSINGS_RETAINED_OFFSETS, DEFAULT_CLOSINGS_RETAINED_TOTAL_MAX,
    MAX_CLOSED_TRANSACTIONS, MAX_UNSEEN_RANGE_ABORTS, PARTITION_SNAPSHOT_VERSION,
};
pub use registry::{
    PartitionHandle, ProducerStateRegistry, RegistryConfig, DEFAULT_MAX_PARTITIONS,
    DEFAULT_MAX_PRODUCERS,
};
pub use salt::{
    collision_seed, salt_candidates, CollisionError, SaltApply, SaltChoice, SaltRecord, SaltTable,
    DEFAULT_MAX_SALT_CANDIDATES,
};

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Kafka's default `producer.id.expiration.ms` (24 h): a producer with no
/// open transaction and no batch for this long is dropped from the state.
pub const DEFAULT_PRODUCER_ID_EXPIRATION_MS: i64 = 86_400_000;

/// A 16-byte Kafka UUID (cluster id or topic id).
///
/// Displayed and serialised the way Kafka prints ids: URL-safe base64 without
/// padding (22 characters). Deserialisation also accepts canonical UUID text.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ClusterId(pub [u8; 16]);

impl ClusterId {
    /// Parses Kafka's base64 form or canonical UUID text
    /// (`xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`).
    pub fn parse(text: &str) -> Option<Self> {
        parse_uuid16(text).map(Self)
    }
}

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&URL_SAFE_NO_PAD.encode(self.0))
    }
}

impl fmt::Debug for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClusterId({self})")
    }
}

impl Serialize for ClusterId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        uuid16::serialize(&self.0, s)
    }
}

impl<'de> Deserialize<'de> for ClusterId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        uuid16::deserialize(d).map(Self)
    }
}

fn parse_uuid16(text: &str) -> Option<[u8; 16]> {
    let mut out = [0u8; 16];
    if text.len() == 22 {
        // decode_slice needs room for the decoder's worst case, so go via a
        // small stack buffer rather than a Vec.
        let mut buf = [0u8; 18];
        let n = URL_SAFE_NO_PAD.decode_slice(text, &mut buf).ok()?;
        if n != 16 {
            return None;
        }
        out.copy_from_slice(buf.get(..16)?);
        return Some(out);
    }
    // Canonical text only: 8-4-4-4-12 hex digits.
    let dashes_ok = text.len() == 36
        && text
            .bytes()
            .enumerate()
            .all(|(i, b)| (b == b'-') == matches!(i, 8 | 13 | 18 | 23));
    if !dashes_ok {
        return None;
    }
    let hex: Vec<u8> = text.bytes().filter(|b| *b != b'-').collect();
    for (i, pair) in hex.chunks_exact(2).enumerate() {
        let hi = (pair[0] as char).to_digit(16)?;
        let lo = (pair[1] as char).to_digit(16)?;
        *out.get_mut(i)? = (hi * 16 + lo) as u8;
    }
    Some(out)
}

/// serde helpers for 16-byte ids as Kafka base64 text.
mod uuid16 {
    use super::*;

    pub(super) fn serialize<S: Serializer>(id: &[u8; 16], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&URL_SAFE_NO_PAD.encode(id))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 16], D::Error> {
        let text = String::deserialize(d)?;
        parse_uuid16(&text)
            .ok_or_else(|| serde::de::Error::custom(format!("not a 16-byte Kafka id: {text:?}")))
    }
}

/// serde for `Arc<str>` without enabling serde's `rc` feature crate-wide.
mod arc_str {
    use super::*;

    pub(super) fn serialize<S: Serializer>(v: &Arc<str>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(v)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Arc<str>, D::Error> {
        String::deserialize(d).map(Arc::from)
    }
}

/// Where a mapped PID comes from: the source cluster and the PID as that
/// cluster allocated it.
///
/// `Copy` and 24 bytes, so it can be stored per producer and compared on
/// every batch for free.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
pub struct Origin {
    /// The source cluster's id.
    pub source_cluster: ClusterId,
    /// The PID on the source cluster, before mapping.
    pub original_pid: i64,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.source_cluster, self.original_pid)
    }
}

/// Identifies one destination partition.
///
/// Several mirrors feeding one destination partition must share its state,
/// so identity is the destination topic id and partition; the name is kept
/// for display. When the topic id is unknown (all zeros, e.g. fetches by
/// name only) the name takes part in equality instead.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PartitionKey {
    /// Destination topic id (all zeros when unknown).
    #[serde(with = "uuid16")]
    pub topic_id: [u8; 16],
    /// Destination topic name, for display.
    #[serde(with = "arc_str")]
    pub topic: Arc<str>,
    /// Partition index.
    pub partition: i32,
}

impl PartitionKey {
    /// Builds a key.
    pub fn new(topic_id: [u8; 16], topic: impl Into<Arc<str>>, partition: i32) -> Self {
        Self {
            topic_id,
            topic: topic.into(),
            partition,
        }
    }

    fn has_topic_id(&self) -> bool {
        self.topic_id != [0u8; 16]
    }
}

impl PartialEq for PartitionKey {
    fn eq(&self, other: &Self) -> bool {
        self.topic_id == other.topic_id
            && self.partition == other.partition
            && (self.has_topic_id() || self.topic == other.topic)
    }
}

impl Eq for PartitionKey {}

impl Hash for PartitionKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Must agree with `eq`: the name only matters without a topic id.
        self.topic_id.hash(state);
        self.partition.hash(state);
        if !self.has_topic_id() {
            self.topic.hash(state);
        }
    }
}

impl fmt::Display for PartitionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition)
    }
}

/// The control record type of a control batch, as far as producer state
/// cares.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum ControlKind {
    /// Transaction COMMIT marker (control type 1).
    Commit {
        /// The marker's coordinator epoch.
        coordinator_epoch: i32,
    },
    /// Transaction ABORT marker (control type 0).
    Abort {
        /// The marker's coordinator epoch.
        coordinator_epoch: i32,
    },
    /// MIRROR_PID_RESET barrier (control type 7, SPEC 2.3).
    MirrorPidReset,
    /// Any other control type (KRaft records, future types).
    Unknown(i16),
}

/// What producer state needs to know about one record batch, as it will
/// leave the proxy (PID already mapped).
///
/// Deliberately decoupled from the record-batch walker: the Fetch path fills
/// this from the batch header (and the first control record's key/value).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct BatchObservation {
    /// First offset of the batch.
    pub base_offset: i64,
    /// Last offset of the batch (base offset + last offset delta).
    pub last_offset: i64,
    /// The PID as it leaves the proxy (mapped), -1 for none.
    pub producer_id: i64,
    /// Producer epoch.
    pub producer_epoch: i16,
    /// Base sequence, -1 for none.
    pub base_sequence: i32,
    /// Last sequence (base sequence + last offset delta, wrapped at
    /// `i32::MAX` to 0), -1 for none.
    pub last_sequence: i32,
    /// Transactional attribute bit.
    pub is_transactional: bool,
    /// `Some` for control batches: the type of the first control record
    /// (Kafka only consults the first one).
    pub control: Option<ControlKind>,
    /// The batch's max timestamp.
    pub max_timestamp: i64,
}

impl BatchObservation {
    /// A data batch of `count` records starting at `base_offset` and
    /// `base_sequence` (sequence arithmetic wraps like Kafka's). Convenience
    /// for callers and tests.
    pub fn data(
        producer_id: i64,
        producer_epoch: i16,
        base_offset: i64,
        base_sequence: i32,
        count: i32,
        is_transactional: bool,
    ) -> Self {
        let delta = count.max(1) - 1;
        Self {
            base_offset,
            last_offset: base_offset.saturating_add(i64::from(delta)),
            producer_id,
            producer_epoch,
            base_sequence,
            last_sequence: if base_sequence < 0 {
                base_sequence
            } else {
                partition::add_sequence(base_sequence, delta)
            },
            is_transactional,
            control: None,
            max_timestamp: 0,
        }
    }

    /// A transaction marker (COMMIT or ABORT) at `offset`.
    pub fn marker(
        producer_id: i64,
        producer_epoch: i16,
        offset: i64,
        commit: bool,
        coordinator_epoch: i32,
    ) -> Self {
        Self {
            base_offset: offset,
            last_offset: offset,
            producer_id,
            producer_epoch,
            base_sequence: -1,
            last_sequence: -1,
            is_transactional: true,
            control: Some(if commit {
                ControlKind::Commit { coordinator_epoch }
            } else {
                ControlKind::Abort { coordinator_epoch }
            }),
            max_timestamp: 0,
        }
    }

    /// A MIRROR_PID_RESET barrier at `offset` (PID -1, as SPEC 2.3 requires).
    pub fn barrier(offset: i64) -> Self {
        Self {
            base_offset: offset,
            last_offset: offset,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
            last_sequence: -1,
            is_transactional: false,
            control: Some(ControlKind::MirrorPidReset),
            max_timestamp: 0,
        }
    }

    /// Sets the max timestamp (builder style).
    pub fn with_timestamp(mut self, max_timestamp: i64) -> Self {
        self.max_timestamp = max_timestamp;
        self
    }
}
