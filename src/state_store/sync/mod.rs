//! Keeps the shadow producer state's salt tables in step with `__mirror_state`.
//!
//! At start-up every collision record is read and applied before any mirror
//! listener accepts a connection; afterwards a tail loop applies records
//! written by other mirrorguard instances, so instances that raced on one
//! collision converge on the record at the lowest offset. Persisting a new
//! salt appends its record (acks=all, idempotent) and then reads the topic up
//! to and including that record before the salt may be used, so a lower
//! record written concurrently by another instance wins everywhere.
//!
//! [`StateSync`] is the adapter between the mirrors, the life cycle and the
//! store: it implements their persistence ports ([`SaltStore`],
//! [`TransitionStore`]) and converts their types to the record schema (the
//! core never names [`crate::state_store::schema`]). By concern:
//! `load` (start-up load, catch-up, tail and the per-type apply), `topics`
//! (the destination's topic listing), `snapshots` and `chunks` (producer-state
//! snapshots, one record or a chunk generation), `persist` (salts, claims,
//! transitions, topologies) and `error` ([`SyncError`]).

use std::sync::Arc;
use std::time::Duration;

use crate::lifecycle::seal::OpenTxn;
use crate::lifecycle::{Entry, Lifecycle, State as LifecycleState, TransitionStore};
use crate::metrics::{KindLabels, Metrics};
use crate::mirror::handover::ServedBy;
use crate::mirror::{map_with_salt, MirrorContext, PendingSalt, SaltStore};
use crate::pid::{self, Layout};
use crate::producer_state::{self as ps, Origin, PartitionKey, ProducerStateRegistry, SaltRecord};
use crate::state_store::schema::{
    decode, MirrorPartitionState, MirrorPartitionStateKey, MirrorPartitionStateValue,
    MirrorPidCollisionKey, MirrorPidCollisionValue, MirrorProducerClaimKey,
    MirrorProducerClaimValue, MirrorProducerSnapshotChunkKey, MirrorProducerSnapshotChunkValue,
    MirrorProducerSnapshotKey, MirrorProducerSnapshotValue, SnapshotProducer, StateRecord,
};
use crate::state_store::{StateStore, StoredRecord};
use crate::PersistError;

mod chunks;
mod error;
mod load;
mod others;
mod persist;
mod serving;
mod snapshots;
mod topics;

use chunks::chunk_records;
use chunks::needs_chunks;
use chunks::{chunked_snapshot_due, open_txn_signature};
pub use error::SyncError;
pub use others::OTHER_TYPE5_KEPT;
use snapshots::open_txns_of;

impl From<MirrorPartitionState> for LifecycleState {
    fn from(s: MirrorPartitionState) -> Self {
        match s {
            MirrorPartitionState::Mirroring => Self::Mirroring,
            MirrorPartitionState::Paused => Self::Paused,
            MirrorPartitionState::Stopping => Self::Stopping,
            MirrorPartitionState::Stopped => Self::Stopped,
            MirrorPartitionState::Failed => Self::Failed,
            MirrorPartitionState::Other(c) => Self::Other(c),
        }
    }
}

impl From<LifecycleState> for MirrorPartitionState {
    fn from(s: LifecycleState) -> Self {
        match s {
            LifecycleState::Mirroring => Self::Mirroring,
            LifecycleState::Paused => Self::Paused,
            LifecycleState::Stopping => Self::Stopping,
            LifecycleState::Stopped => Self::Stopped,
            LifecycleState::Failed => Self::Failed,
            LifecycleState::Other(c) => Self::Other(c),
        }
    }
}

/// The `__mirror_state` side of the mirrors.
pub struct StateSync {
    store: Arc<StateStore>,
    registry: Arc<ProducerStateRegistry>,
    mirrors: std::sync::RwLock<Vec<Arc<MirrorContext>>>,
    /// Next offset to read; the async mutex also serialises catch-ups.
    next_offset: tokio::sync::Mutex<i64>,
    metrics: Arc<Metrics>,
    me: std::sync::Weak<StateSync>,
    /// Bootstrap of the destination cluster, for its topic ids (the state
    /// cluster may be another one).
    dest_bootstrap: Vec<(String, u16)>,
    dest_connector: crate::kafka_client::TransportConnector,
    dest_topics: std::sync::RwLock<DestinationTopics>,
    lifecycle: std::sync::OnceLock<Arc<Lifecycle>>,
    /// Open transactions of seals read back (type 5), by destination topic
    /// id and partition (known even before the topic's name is).
    snapshots: std::sync::Mutex<std::collections::HashMap<SnapshotKey, Vec<OpenTxn>>>,
    /// Salt and snapshot records of topic ids the destination does not list
    /// (yet), in offset order, with whether they were read at start-up:
    /// applied when the topic appears, never dropped.
    pending: std::sync::Mutex<std::collections::HashMap<[u8; 16], Vec<KeptRecord>>>,
    /// Highest offset applied or written per record key: the tail skips
    /// records at or below it, so reading back our own older records never
    /// moves a partition's state backwards.
    applied: std::sync::Mutex<std::collections::HashMap<Vec<u8>, i64>>,
    /// True while the start-up load runs: producer-state snapshots are
    /// restored only then (later ones are this process's own, or another
    /// instance's view, which must not overwrite live state).
    loading: std::sync::atomic::AtomicBool,
    /// Next offset of the last snapshot written per partition.
    snapshotted: std::sync::Mutex<std::collections::HashMap<PartitionKey, (i64, usize)>>,
    /// Where the next bounded snapshot round starts.
    snapshot_cursor: std::sync::atomic::AtomicUsize,
    /// Live producer-claim records (type 6) per partition: mapped PID →
    /// destination topic id. Tombstoned by the snapshot loop once a
    /// snapshot holds the producer or the producer left the state.
    claimed: std::sync::Mutex<std::collections::HashMap<PartitionKey, ClaimSet>>,
    /// Claim records read by the start-up load, applied after it (a type-5
    /// snapshot later in the topic replaces a partition's state, and must
    /// not drop claims made after it was written).
    deferred_claims: std::sync::Mutex<std::collections::HashMap<MirrorProducerClaimKey, KeptClaim>>,
    /// Live chunk records (type 7) per partition, tombstoned when a newer
    /// snapshot of the partition is written.
    live_chunks: std::sync::Mutex<
        std::collections::HashMap<PartitionKey, Vec<MirrorProducerSnapshotChunkKey>>,
    >,
    /// Last chunked-snapshot generation written or read.
    chunk_generation: std::sync::atomic::AtomicI64,
    /// Wall-clock ms of the last chunked snapshot written per partition,
    /// and the signature of the transactions open in it
    /// ([`chunks::open_txn_signature`]).
    chunked_at: std::sync::Mutex<std::collections::HashMap<PartitionKey, (i64, u64)>>,
    /// Chunks read at start-up, assembled per partition and generation.
    loaded_chunks: std::sync::Mutex<std::collections::HashMap<SnapshotKey, ChunkGenerations>>,
    /// Offset of the type-5 snapshot restored by the start-up load, per
    /// partition: a chunked snapshot restores only if it is later.
    type5_restored_at: std::sync::Mutex<std::collections::HashMap<SnapshotKey, i64>>,
    /// Destination topics known before and missing from the latest
    /// listings, since when: dropped once missing for [`DELETION_CONFIRM`]
    /// (one broker's listing may lag a topic just created).
    missing_since: std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
    /// Tail rounds between two periodic reads of the destination's topics.
    dest_refresh_rounds: std::sync::atomic::AtomicU64,
    /// The open transactions of the chunk generation being read per
    /// partition (start-up or tail): once complete they are the partition's
    /// latest snapshot in `snapshots`, as a type-5 record would be (a seal
    /// with too many open transactions for one record is written in chunks).
    open_chunks: std::sync::Mutex<std::collections::HashMap<SnapshotKey, OpenChunks>>,
    /// This instance's id in serving records (type 9).
    instance_id: std::sync::OnceLock<String>,
    /// The latest serving record (type 9) per partition.
    serving: std::sync::Mutex<std::collections::HashMap<PartitionKey, ServedBy>>,
    /// Partitions another instance took over since this one started (read
    /// by the tail) and this one has not taken back: their state here is
    /// stale, so they are not snapshotted from here.
    stale: std::sync::Mutex<std::collections::HashSet<PartitionKey>>,
    /// Where other instances' snapshots of each partition are (offsets
    /// only) and their live claims, read by the tail: a take-over restores
    /// from them (`others`).
    others: std::sync::Mutex<std::collections::HashMap<SnapshotKey, others::OthersState>>,
}

/// The open transactions of one chunk generation being read back.
#[derive(Default)]
struct OpenChunks {
    generation: i64,
    snapshot_offset: i64,
    count: i32,
    /// Set once the generation was complete and handed to `snapshots`.
    done: bool,
    chunks: std::collections::BTreeMap<i32, Vec<OpenTxn>>,
}

/// Chunk keys and their (key, value) records.
type ChunkRecords = (
    Vec<MirrorProducerSnapshotChunkKey>,
    Vec<(Vec<u8>, Option<Vec<u8>>)>,
);

/// How long a destination topic must be missing from the destination's
/// listings before its partitions leave the producer state.
pub const DELETION_CONFIRM: Duration = Duration::from_secs(1);

/// The chunks of one generation read back: (snapshot offset, chunk count)
/// as each chunk says, and chunk index → (its value, its record).
type ChunkGeneration =
    std::collections::HashMap<i32, (MirrorProducerSnapshotChunkValue, StoredRecord)>;

/// Chunk generations of one partition, by generation.
type ChunkGenerations = std::collections::BTreeMap<i64, ChunkGeneration>;

/// A partition snapshotted in chunks is snapshotted again without new
/// claims to supersede only after this long (5 minutes).
pub const CHUNKED_SNAPSHOT_MIN_AGE_MS: i64 = 300_000;

/// Producers per chunk of a chunked snapshot (type 7): 3,000 entries of 67
/// bytes are ~196 KiB, below [`MAX_SNAPSHOT_BYTES`].
pub const CHUNK_PRODUCERS: usize = 3_000;

/// Mapped PIDs with a live claim record in one partition, and the
/// partition's destination topic id.
#[derive(Default)]
struct ClaimSet {
    topic_id: [u8; 16],
    pids: std::collections::HashMap<i64, Origin>,
}

/// A claim read at start-up: its value and its record's offset and
/// timestamp (the record is made again if its topic id is not known yet).
type KeptClaim = (MirrorProducerClaimValue, i64, i64);

/// Largest type-5 snapshot value written (bytes). Far below Kafka's default
/// `message.max.bytes` (1 MiB): a partition with more producers (about
/// 3,900) is snapshotted in chunks (type 7) instead.
pub const MAX_SNAPSHOT_BYTES: usize = 256 * 1024;

/// A destination topic id and partition.
type SnapshotKey = ([u8; 16], i32);

/// A record kept until its topic id is known, and whether it was read at
/// start-up.
type KeptRecord = (StoredRecord, bool);

/// Snapshots appended per periodic round (the shutdown snapshot writes all).
const MAX_SNAPSHOTS_PER_ROUND: usize = 256;

/// Destination topic names and ids (collision records name topics by id,
/// the producer state by destination name).
#[derive(Default)]
struct DestinationTopics {
    by_name: std::collections::HashMap<String, [u8; 16]>,
    by_id: std::collections::HashMap<[u8; 16], String>,
}

impl StateSync {
    /// A sync over an opened store; `dest_bootstrap` is the destination
    /// cluster (where topic ids are read), reached with `dest_connector`.
    pub fn new(
        store: Arc<StateStore>,
        registry: Arc<ProducerStateRegistry>,
        metrics: Arc<Metrics>,
        dest_bootstrap: Vec<(String, u16)>,
        dest_connector: crate::kafka_client::TransportConnector,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| Self {
            store,
            registry,
            mirrors: Default::default(),
            next_offset: tokio::sync::Mutex::new(0),
            metrics,
            me: me.clone(),
            dest_bootstrap,
            dest_connector,
            dest_topics: Default::default(),
            lifecycle: Default::default(),
            snapshots: Default::default(),
            pending: Default::default(),
            applied: Default::default(),
            loading: std::sync::atomic::AtomicBool::new(false),
            snapshotted: Default::default(),
            snapshot_cursor: Default::default(),
            claimed: Default::default(),
            deferred_claims: Default::default(),
            live_chunks: Default::default(),
            chunk_generation: std::sync::atomic::AtomicI64::new(0),
            chunked_at: Default::default(),
            loaded_chunks: Default::default(),
            type5_restored_at: Default::default(),
            open_chunks: Default::default(),
            instance_id: Default::default(),
            serving: Default::default(),
            stale: Default::default(),
            others: Default::default(),
            missing_since: Default::default(),
            dest_refresh_rounds: std::sync::atomic::AtomicU64::new(10),
        })
    }

    /// Reads the destination's topics every `period` (rounded to tail
    /// rounds of one second; at least one): deleted destination topics are
    /// found that way.
    pub fn set_destination_refresh(&self, period: Duration, tail: Duration) {
        let rounds = (period.as_millis() / tail.as_millis().max(1)).max(1);
        self.dest_refresh_rounds.store(
            u64::try_from(rounds).unwrap_or(u64::MAX),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Routes partition-state records (types 4 and 5) to `lifecycle`.
    pub fn set_lifecycle(&self, lifecycle: Arc<Lifecycle>) {
        let _ = self.lifecycle.set(lifecycle);
    }

    /// Registers a mirror (its layout is used to compute salted PIDs).
    pub fn add_mirror(&self, m: Arc<MirrorContext>) {
        self.mirrors
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(m);
    }

    fn count(&self, kind: &'static str) {
        self.metrics
            .state_store_ops
            .get_or_create(&KindLabels {
                listener: "__mirror_state".into(),
                kind,
            })
            .inc();
    }

    fn layout_for(&self, cluster: &pid::ClusterId) -> (Layout, u32) {
        let mirrors = self.mirrors.read().unwrap_or_else(|p| p.into_inner());
        let layout = mirrors
            .iter()
            .find(|m| m.source().map(|s| s.id == *cluster).unwrap_or(false))
            .or_else(|| mirrors.first())
            .map(|m| m.layout)
            .unwrap_or(Layout::High);
        (layout, pid::fold(cluster))
    }

    /// Appends one record (acks=all), notes its offset so the tail does not
    /// re-apply it, and counts it.
    async fn append_record(&self, key: Vec<u8>, value: Vec<u8>) -> Result<i64, SyncError> {
        let offset = self
            .store
            .append(key.clone(), Some(value))
            .await
            .map_err(|e| self.append_failed(e))?;
        self.advance(&key, offset);
        self.count("append");
        Ok(offset)
    }

    /// Record keys whose highest offset is kept (what the tail skips by):
    /// one per salt, life-cycle, snapshot and serving record key, none per
    /// claim. For the memory account and its test.
    pub fn record_keys_tracked(&self) -> usize {
        self.applied.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Notes that the record for `key` at `offset` is known (applied or ours);
    /// false if a later record for the key was already seen.
    fn advance(&self, key: &[u8], offset: i64) -> bool {
        let mut applied = self.applied.lock().unwrap_or_else(|p| p.into_inner());
        match applied.get(key) {
            Some(&seen) if seen >= offset => false,
            _ => {
                applied.insert(key.to_vec(), offset);
                true
            }
        }
    }

    /// Appends claim records or tombstones; a refusal as too large is
    /// reported in Kafka's terms (ERROR line, `kind="message_too_large"`).
    async fn append_claims(
        &self,
        records: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    ) -> Result<(), SyncError> {
        match self.store.append_many(records).await {
            Ok(_) => {
                self.count("append");
                Ok(())
            }
            Err(e) => Err(self.append_failed(e)),
        }
    }

    /// Counts a failed append; a refusal as too large is reported in
    /// Kafka's terms (ERROR line, `kind="message_too_large"`).
    fn append_failed(&self, e: crate::state_store::StateStoreError) -> SyncError {
        self.count("append_error");
        if e.is_too_large() {
            self.count("message_too_large");
            tracing::error!(error = %e, "the state cluster refuses a single __mirror_state \
                record as too large (MESSAGE_TOO_LARGE / RECORD_LIST_TOO_LARGE): raise the \
                topic's max.message.bytes or the broker's message.max.bytes");
        }
        SyncError::Store(e)
    }
}
