//! The mirror fetch path: PID rewriting and producer-state tracking on the
//! Fetch responses a destination's mirror fetcher receives from a source.
//!
//! A `[[mirror]]` listener is a proxy listener whose filter chain, on top of
//! address rewriting, walks every Fetch response zero-copy
//! ([`crate::filter::mirror_fetch`], which calls into this module) and, per
//! partition and batch:
//!
//! 1. reads the batch header (never the records, never decompressing);
//! 2. computes the PID that leaves the proxy: `region` mode maps it into the
//!    source cluster's region (SPEC 2.1; already-mapped PIDs and -1 pass
//!    unchanged), `preserve` mode keeps it;
//! 3. feeds the batch to the destination partition's shadow producer state,
//!    which reports anomalies (metric by kind, WARN line, admin list);
//! 4. patches bytes 43..51 and the CRC in place when the PID changed (O(1):
//!    the CRC is shifted by the delta of the 8 changed bytes, so a corrupt
//!    batch stays corrupt unread; only a batch that would create durable
//!    state, a claim or a salt, is verified first, see phase 1).
//!
//! `aborted_transactions` entries get the same mapping so read_committed
//! consumers downstream still filter aborted data. A MIRROR_PID_RESET barrier
//! expires the partition's producer state. Truncated trailing batches, legacy
//! message sets, error partitions and anything unparseable pass untouched.
//!
//! Before anything changes, scans find what must be durable first: the
//! source range a partition's state has not seen since start-up (replayed),
//! collisions (two origins on one mapped PID: a salt is persisted), and
//! producers seen for the first time (their claim on the mapped PID is
//! persisted as one small type-6 record each, all of a response together). The response is held meanwhile;
//! only then is it rewritten. Large responses whose length cannot change
//! are not held: [`stream`] rewrites them as they arrive with the same
//! per-batch step, holding only the heads and the batches that wait for
//! something durable.
//!
//! The files: `planner` (the phases as functions over the producer state
//! that change nothing and return the [`Pending`] work), `batch` (the
//! in-place rewriting of one partition's batches and aborted transactions;
//! its per-batch step is shared by both paths), [`stream`] (the streamed
//! path: a walker over a response as it arrives, and its relay),
//! `adapters` (the I/O the planner's answers turn into: persisting claims
//! and salts through the [`SaltStore`] port, replays, the blocked-response
//! glue, what Metadata refreshes teach), `context` (a mirror's lookups:
//! partition handles, topic names, source identity, limits) and `error`
//! ([`MirrorError`]); the seal ([`seal_path`]), the source-side answers when
//! the source is gone ([`offline`]), [`replay`] and [`topic_lookup`] beside
//! them. The durable side of the ports lives in
//! [`crate::state_store::sync`].

pub mod dest_hw;
pub mod error;
pub mod handover;
pub mod offline;
pub mod replay;
pub mod seal_path;
mod source_truncation;
pub mod topic_lookup;

mod adapters;
mod batch;
mod context;
mod planner;
pub mod stream;
#[doc(hidden)]
pub mod stream_check;
#[cfg(test)]
mod stream_tests;
#[cfg(test)]
mod test_store;

pub(crate) use adapters::run_replays;
pub use batch::map_with_salt;
pub(crate) use batch::observe_records;
use batch::rewrite_aborted;
use batch::rewrite_partition_records;
pub use planner::rewrite_fetch_body;
pub use planner::rewrite_fetch_body_as;
pub use planner::rewrite_fetch_body_holding;
pub use planner::Pending;
pub use planner::PendingSalt;

use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::BytesMut;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

pub use error::{MirrorError, PersistError};

use crate::codec::header::response_body_offset;
use crate::codec::RequestHeader;
use crate::config::{LayoutConfig, MirrorConfig, PidMode};
use crate::filter::{BoxFuture, RewriteError, Rewritten};
use crate::handlers::{self, FetchTopic};
use crate::metrics::{Metrics, MirrorKindLabels};
use crate::pid::{self, Layout, MapOutcome};
use crate::producer_state::{
    self as ps, resolve_collision_for_topic, Anomaly, BatchObservation, ControlKind, MappingLookup,
    Origin, PartitionHandle, PartitionKey, ProducerStateRegistry, DEFAULT_MAX_SALT_CANDIDATES,
};
use crate::proxy::nodes::NodeRegistry;
use crate::records::control::{first_control_record, ControlType, ControlValue};
use crate::records::{walk, Entry};

/// The identity of a mirror's source cluster.
#[derive(Debug, Clone)]
pub struct SourceIdentity {
    /// The id as 16 bytes.
    pub id: pid::ClusterId,
    /// Its 32-bit fold (SPEC 2.1).
    pub fold: u32,
    /// Kafka's base64 text form (used in barriers and logs).
    pub text: String,
}

impl SourceIdentity {
    /// Parses a Kafka base64 id or UUID text.
    pub fn parse(text: &str) -> Result<Self, pid::ClusterIdError> {
        let id = pid::ClusterId::parse(text)?;
        Ok(Self {
            fold: pid::fold(&id),
            text: id.to_base64(),
            id,
        })
    }

    /// The producer-state origin of `pid` written by this source cluster.
    fn origin(&self, pid: i64) -> Origin {
        Origin {
            source_cluster: ps::ClusterId(self.id.0),
            original_pid: pid,
        }
    }
}

/// Where collision salts are made durable (the `__mirror_state` topic).
pub trait SaltStore: Send + Sync {
    /// Whether producer claims are made durable (a `[state]` cluster). A
    /// store that says so must implement
    /// [`persist_claims`](Self::persist_claims).
    fn durable(&self) -> bool {
        false
    }
    /// Persists the claims of new producers (mapped PID → origin, per
    /// partition), one small record each (type 6), all of one Fetch
    /// response together, and returns once the state cluster acknowledged
    /// them.
    fn persist_claims(
        &self,
        _claims: Vec<(PartitionKey, Vec<(i64, Origin)>)>,
    ) -> crate::BoxFuture<'static, Result<(), PersistError>> {
        Box::pin(async { Err("this store keeps no producer claims".into()) })
    }
    /// The destination topic id of `topic`, if known (it seeds the salt
    /// sequence and keys the record).
    fn topic_id(&self, topic: &str) -> Option<[u8; 16]>;
    /// Re-reads the destination's topic ids.
    fn refresh_topic_ids(&self) -> crate::BoxFuture<'static, Result<(), PersistError>>;
    /// Persists `salts`, waits for the acknowledgement, and applies the
    /// winning record of each key (lowest offset) to the registry.
    fn persist(
        &self,
        salts: Vec<PendingSalt>,
    ) -> crate::BoxFuture<'static, Result<(), PersistError>>;
    /// Whether other instances may serve the same partitions (the store is
    /// a `__mirror_state` they share): partitions are then taken over
    /// ([`take_over`](Self::take_over)) before this instance serves them.
    fn shared(&self) -> bool {
        false
    }
    /// Makes this instance the one serving each partition of `jobs` from
    /// its fetcher's offset (one serving record each, type 9, after one read
    /// of the state to its end and restoring newer snapshots other instances
    /// wrote). Returns who served each before, as the state said.
    fn take_over(
        &self,
        _mirror: &str,
        jobs: Vec<handover::TakeOver>,
    ) -> crate::BoxFuture<'static, Result<Vec<Option<handover::ServedBy>>, PersistError>> {
        let n = jobs.len();
        Box::pin(async move { Ok(vec![None; n]) })
    }
    /// Reads `__mirror_state` up to its end now (what the tail does every
    /// second): another instance's serving record read this way makes the
    /// mirrors drop the partition.
    fn read_state(&self) -> crate::BoxFuture<'static, Result<(), PersistError>> {
        Box::pin(async { Ok(()) })
    }
    /// Who last started serving `key` (its latest serving record).
    fn served_by(&self, _key: &PartitionKey) -> Option<handover::ServedBy> {
        None
    }
    /// This instance's id in `__mirror_state`.
    fn instance_id(&self) -> Option<String> {
        None
    }
    /// Persists a mirror's source topology (record type 8).
    fn persist_topology(
        &self,
        _mirror: &str,
        _topology: offline::Topology,
    ) -> crate::BoxFuture<'static, Result<(), PersistError>> {
        Box::pin(async { Err("this store keeps no source topology".into()) })
    }
}

/// Metric handles of one mirror, looked up once.
pub struct MirrorMetrics {
    batches: Counter,
    rewritten: Counter,
    aborted_rewritten: Counter,
    barriers: Counter,
    collisions: Counter,
    oversized: Counter,
    corrupt: Counter,
    state_limit: Counter,
    /// Partitions answered with no records while their destination topic
    /// id is looked up.
    held: Counter,
    /// Partitions taken over (`handover::take_over`).
    take_overs: Counter,
    /// Owned partitions dropped because another instance serves them now.
    stale_dropped: Counter,
    /// Fetch responses relayed as they arrived ([`stream`]).
    streamed: Counter,
    /// Streamed responses whose waits added up to [`stream::SLOW_WAITS`].
    pub(crate) held_long: Counter,
    /// Partitions whose state started over after the source truncated its
    /// log below it ([`source_truncation`]).
    source_truncations: Counter,
    /// Partitions owned here (`mirrorguard_partitions_served`).
    served: Gauge,
    anomalies: Family<MirrorKindLabels, Counter>,
    mirror: String,
    /// Verify the CRC-32C of one batch in this many (0: never; see
    /// `MirrorConfig::crc_verify_every`).
    crc_verify_every: u64,
}

impl MirrorMetrics {
    fn new(metrics: &Metrics, mirror: &str, crc_verify_every: u64) -> Self {
        let m = |kind: &'static str| {
            metrics
                .mirror_events
                .get_or_create(&MirrorKindLabels {
                    mirror: mirror.to_string(),
                    kind,
                })
                .clone()
        };
        Self {
            batches: m("batch_seen"),
            rewritten: m("batch_rewritten"),
            aborted_rewritten: m("aborted_txn_rewritten"),
            barriers: m("barrier_seen"),
            collisions: m("collision"),
            oversized: m("oversized_source_pid"),
            corrupt: m("corrupt_records"),
            state_limit: m("state_limit"),
            held: m("held_unknown_topic"),
            take_overs: m("take_over"),
            stale_dropped: m("stale_dropped"),
            streamed: m("response_streamed"),
            held_long: m("response_held_long"),
            source_truncations: m("source_truncated"),
            served: metrics
                .partitions_served
                .get_or_create(&crate::metrics::MirrorLabels {
                    mirror: mirror.to_string(),
                })
                .clone(),
            anomalies: metrics.anomalies.clone(),
            mirror: mirror.to_string(),
            crc_verify_every,
        }
    }
}

/// Everything one mirror listener shares across its connections.
pub struct MirrorContext {
    /// Mirror name.
    pub name: String,
    /// PID mode.
    pub mode: PidMode,
    /// Region layout.
    pub layout: Layout,
    source: OnceLock<SourceIdentity>,
    /// Producer state of every destination partition (shared by mirrors).
    pub registry: Arc<ProducerStateRegistry>,
    salts: Arc<dyn SaltStore>,
    metrics: MirrorMetrics,
    topics: std::sync::RwLock<TopicNames>,
    handles: std::sync::RwLock<HandleCache>,
    topic_prefix: String,
    /// Destination partitions whose producer state is known to be complete
    /// up to what the fetcher asks for (after a replay if needed).
    warm: std::sync::Mutex<std::collections::HashSet<PartitionKey>>,
    /// Destination partitions this instance serves (its serving record is
    /// the latest; see [`handover`]).
    owned: std::sync::Mutex<std::collections::HashSet<PartitionKey>>,
    /// Per owned partition, the last fetch offset past its state's next
    /// offset (a gap) for which `__mirror_state` was read again.
    gap_checked: std::sync::Mutex<std::collections::HashMap<PartitionKey, i64>>,
    /// Source bootstrap servers (replays try the known nodes, then these).
    source_bootstrap: Vec<(String, u16)>,
    /// The listener's source nodes (set when the listener is built).
    nodes: OnceLock<Arc<NodeRegistry>>,
    /// How replays and topic lookups reach the source (TCP or TLS; set
    /// with the listener, plain until then).
    source_connector: OnceLock<crate::kafka_client::TransportConnector>,
    /// Partition life cycle (shared by all mirrors).
    pub lifecycle: Arc<crate::lifecycle::Lifecycle>,
    seal_metrics: SealMetrics,
    /// How long the source may take per request before the connection is
    /// answered locally.
    pub request_timeout: std::time::Duration,
    /// The last known source topology (live or restored) and the last one
    /// persisted.
    topology: std::sync::RwLock<Option<offline::Topology>>,
    persisted_topology: Arc<std::sync::Mutex<Option<offline::Topology>>>,
    /// Whether `topology` came from the source itself (not restored).
    topology_live: std::sync::atomic::AtomicBool,
    /// Controlled partitions taken out of upstream fetch sessions (KIP-227).
    sessions: seal_path::SessionMemory,
    /// Destination topic ids looked up for held partitions.
    lookups: Arc<topic_lookup::TopicIdLookups>,
    /// mirrorguard's own SASL identity toward the source (set at start-up).
    source_identity: std::sync::OnceLock<crate::sasl::Identity>,
    /// The destination high watermark gate of seals (`stopped_when =
    /// "destination_hw"`); unset: a seal completes on the fetcher's offset.
    dest_hw: OnceLock<Arc<dest_hw::DestinationHw>>,
    /// Transaction closings kept below the destination fetcher's position
    /// (`[[mirror]] closings_retained_*`).
    pub(crate) closings_retention: crate::producer_state::ClosingsRetention,
    /// Whether Fetch responses are held whole rather than streamed: at
    /// start-up, and after a streamed one met a partition only a held one
    /// can answer (see [`stream`]), until a held one needs no such answer.
    pub(crate) stream_hold: std::sync::atomic::AtomicBool,
}

/// A Fetch topic reference that outlives the frame it was read from (the
/// seal path keeps the controlled partitions of a request; the streamed walk
/// reuses one name buffer across the topics of a response).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TopicRef {
    Name(String),
    Id([u8; 16]),
}

impl TopicRef {
    /// The owned form of a request's topic reference.
    pub(crate) fn of(topic: &crate::handlers::FetchTopic<'_>) -> Self {
        match *topic {
            crate::handlers::FetchTopic::Name(n) => TopicRef::Name(n.to_string()),
            crate::handlers::FetchTopic::Id(id) => TopicRef::Id(id),
        }
    }

    pub(crate) fn as_fetch_topic(&self) -> crate::handlers::FetchTopic<'_> {
        match self {
            TopicRef::Name(n) => crate::handlers::FetchTopic::Name(n),
            TopicRef::Id(id) => crate::handlers::FetchTopic::Id(*id),
        }
    }
}

/// Seal metric handles of one mirror.
struct SealMetrics {
    aborts: Counter,
    barriers: Counter,
    completed: Counter,
    /// FETCH_SESSION_ID_NOT_FOUND answers that make a fetcher send a full
    /// fetch (a seal needs the position of a partition an incremental
    /// request left out, or a resumed partition must re-enter the session).
    session_resets: Counter,
    /// Upstream entries of controlled partitions the request did not list,
    /// dropped from responses (a session that still held them).
    strays: Counter,
    /// Transactions aborted by a seal though the shadow state saw them
    /// closed past the cut (a marker the fetcher did not append).
    closed_past_cut: Counter,
    /// Seals whose open transactions may be incomplete (closings past the
    /// fetcher's position dropped at their bound).
    open_at_cut_incomplete: Counter,
    /// ABORT markers for producers that may have begun a transaction in a
    /// range below the cut the shadow state never saw (a restart whose
    /// replay could not reach the source).
    unseen_range_aborts: Counter,
    /// Reader fetches below a cut answered with no records because the
    /// source's batch at the reader's offset crosses the cut (the reader
    /// cannot move on; see `seal_path::below_cut_straddles`).
    below_cut_straddles: Counter,
    /// Partitions already warned about for `below_cut_straddles`.
    below_cut_straddle_warned: std::sync::Mutex<std::collections::HashSet<PartitionKey>>,
    /// Seals planned again below their cut (a destination leader that lost
    /// unreplicated records fetched there).
    replanned_below_cut: Counter,
    /// Fetches past a seal's end (never completing it).
    fetches_past_end: Counter,
    /// Seals FAILED because the destination holds records past their end.
    failed_past_end: Counter,
    /// Protected partitions whose new episode started.
    episodes_started: Counter,
    /// Fetches of controlled partitions answered with an error (an ended
    /// episode fetched again without `protect`, another mirror's partition).
    fetches_refused: Counter,
    /// Partitions already warned about for `fetches_refused`.
    refused_warned: std::sync::Mutex<std::collections::HashSet<PartitionKey>>,
    /// Streamed responses cut off because a partition in them became
    /// controlled (read from `__mirror_state` by a take-over) midway.
    stream_controlled_midway: Counter,
    /// Destination high watermarks read for seals that wait on them.
    hw_reads: Counter,
    /// Failed reads of a destination high watermark.
    hw_read_errors: Counter,
    /// Seals waiting for the destination's high watermark.
    hw_waiting: Gauge,
}

impl SealMetrics {
    fn new(metrics: &Metrics, mirror: &str) -> Self {
        let m = |kind: &'static str| {
            metrics
                .seal_events
                .get_or_create(&MirrorKindLabels {
                    mirror: mirror.to_string(),
                    kind,
                })
                .clone()
        };
        Self {
            aborts: m("abort_marker_served"),
            barriers: m("barrier_served"),
            completed: m("seal_completed"),
            session_resets: m("fetch_session_reset"),
            strays: m("stray_partition_dropped"),
            closed_past_cut: m("txn_closed_past_cut_aborted"),
            open_at_cut_incomplete: m("open_at_cut_incomplete"),
            unseen_range_aborts: m("unseen_range_abort"),
            below_cut_straddles: m("below_cut_batch_straddles_cut"),
            below_cut_straddle_warned: Default::default(),
            replanned_below_cut: m("seal_replanned_below_cut"),
            fetches_past_end: m("fetch_past_seal_end"),
            failed_past_end: m("seal_failed_past_end"),
            stream_controlled_midway: m("stream_cut_for_a_controlled_partition"),
            episodes_started: m("episode_started"),
            fetches_refused: m("fetch_refused"),
            refused_warned: Default::default(),
            hw_reads: m("destination_hw_read"),
            hw_read_errors: m("destination_hw_read_error"),
            hw_waiting: metrics
                .seals_awaiting_destination_hw
                .get_or_create(&crate::metrics::MirrorLabels {
                    mirror: mirror.to_string(),
                })
                .clone(),
        }
    }
}

/// Partition handles by source topic (name or resolved id) and partition
/// index, so the steady Fetch path finds a partition's state without
/// formatting its destination key and hashing it in the registry (a handle
/// the registry removed says so, and is then looked up again).
#[derive(Default)]
struct HandleCache {
    by_name: std::collections::HashMap<Box<str>, Vec<Option<PartitionHandle>>>,
    by_id: std::collections::HashMap<[u8; 16], Vec<Option<PartitionHandle>>>,
}

/// Partition indexes at or above this are looked up without the cache (a
/// hostile upstream must not make the cache allocate per index).
const MAX_CACHED_PARTITION: usize = 1 << 16;

/// Source topic names and ids, learned from Metadata (KIP-1279 keeps topic
/// ids across the mirror, so they identify destination partitions too).
#[derive(Default)]
struct TopicNames {
    by_id: std::collections::HashMap<[u8; 16], Arc<str>>,
    /// Source topic name → partition count.
    partitions: std::collections::BTreeMap<String, i32>,
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
