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
//! only then is it rewritten.

pub mod offline;
pub mod replay;
pub mod seal_path;
pub mod state_sync;
pub mod topic_lookup;

use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::BytesMut;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

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
    pub fn parse(text: &str) -> Result<Self, String> {
        let id = pid::ClusterId::parse(text).map_err(|e| e.to_string())?;
        Ok(Self {
            fold: pid::fold(&id),
            text: id.to_base64(),
            id,
        })
    }

    fn origin_cluster(&self) -> ps::ClusterId {
        ps::ClusterId(self.id.0)
    }
}

/// A salt chosen for a collision, waiting to be persisted.
#[derive(Debug, Clone)]
pub struct PendingSalt {
    /// Destination partition.
    pub partition: PartitionKey,
    /// The remapped origin.
    pub origin: Origin,
    /// The choice (salt, mapped PID, holder).
    pub choice: ps::SaltChoice,
    /// Wall-clock ms of the resolution.
    pub timestamp_ms: i64,
}

/// What a Fetch response waits for before it may be rewritten.
#[derive(Debug)]
pub enum Pending {
    /// Collision salts to persist.
    Salts(Vec<PendingSalt>),
    /// The destination topic ids (to seed and key a salt).
    TopicIds,
    /// Source ranges to observe first (producer state after a restart).
    Replay(Vec<replay::ReplayJob>),
    /// Producers seen for the first time in a partition: their claims
    /// (mapped PID → origin) are made durable before their batches leave.
    Claims(Vec<(PartitionHandle, Vec<(i64, Origin)>)>),
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
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>> {
        Box::pin(async { Err("this store keeps no producer claims".to_string()) })
    }
    /// The destination topic id of `topic`, if known (it seeds the salt
    /// sequence and keys the record).
    fn topic_id(&self, topic: &str) -> Option<[u8; 16]>;
    /// Re-reads the destination's topic ids.
    fn refresh_topic_ids(
        &self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>>;
    /// Persists `salts`, waits for the acknowledgement, and applies the
    /// winning record of each key (lowest offset) to the registry.
    fn persist(
        &self,
        salts: Vec<PendingSalt>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>>;
    /// Persists a mirror's source topology (record type 8).
    fn persist_topology(
        &self,
        _mirror: &str,
        _topology: offline::Topology,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>> {
        Box::pin(async { Err("this store keeps no source topology".to_string()) })
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
    /// Source bootstrap servers (replays try the known nodes, then these).
    source_bootstrap: Vec<(String, u16)>,
    /// The listener's source nodes (set when the listener is built).
    nodes: OnceLock<Arc<NodeRegistry>>,
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
    /// Reader fetches below a cut answered with no records because the
    /// source's batch at the reader's offset crosses the cut (the reader
    /// cannot move on; see `seal_path::below_cut_straddles`).
    below_cut_straddles: Counter,
    /// Partitions already warned about for `below_cut_straddles`.
    below_cut_straddle_warned: std::sync::Mutex<std::collections::HashSet<PartitionKey>>,
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
            below_cut_straddles: m("below_cut_batch_straddles_cut"),
            below_cut_straddle_warned: Default::default(),
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

impl crate::proxy::refresh::RefreshHook for MirrorContext {
    fn on_refresh(&self, view: &crate::proxy::refresh::ClusterView) -> Result<(), String> {
        if self.source().is_none() {
            let text = view.cluster_id.as_deref().ok_or_else(|| {
                format!(
                    "mirror {}: the source sent no cluster id; set source_cluster_id",
                    self.name
                )
            })?;
            let id = SourceIdentity::parse(text).map_err(|e| {
                format!(
                    "mirror {}: the source's cluster id {text:?} is neither Kafka base64 nor UUID \
                     text ({e}); set source_cluster_id explicitly (e.g. a UUIDv5 of the name)",
                    self.name
                )
            })?;
            self.set_source(id)?;
        }
        {
            let mut t = self.topics.write().unwrap_or_else(|p| p.into_inner());
            for (name, id, partitions) in &view.topics {
                if *id != [0; 16] {
                    t.by_id.insert(*id, Arc::from(name.as_str()));
                }
                t.partitions.insert(name.clone(), *partitions);
            }
        }
        self.note_topology(view);
        Ok(())
    }
}

impl MirrorContext {
    /// Keeps the topology of a refresh and persists it when it changed (a
    /// restart with the source down serves and seals from it).
    fn note_topology(&self, view: &crate::proxy::refresh::ClusterView) {
        let (Some(source), false) = (self.source(), view.brokers.is_empty()) else {
            return;
        };
        let mut topology = offline::Topology {
            source_cluster_id: source.text.clone(),
            brokers: view.brokers.clone(),
            topics: view.topic_details.clone(),
        };
        topology.normalise();
        self.topology_live
            .store(true, std::sync::atomic::Ordering::SeqCst);
        *self.topology.write().unwrap_or_else(|p| p.into_inner()) = Some(topology.clone());
        if !self.salts.durable() || tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        {
            let mut last = self
                .persisted_topology
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if last.as_ref() == Some(&topology) {
                return;
            }
            // Claimed before the write: a failed write clears it (retried
            // at the next refresh).
            *last = Some(topology.clone());
        }
        let fut = self.salts.persist_topology(&self.name, topology);
        let name = self.name.clone();
        let me = self.persisted_topology.clone();
        tokio::spawn(async move {
            match fut.await {
                Ok(()) => tracing::debug!(mirror = %name, "source topology persisted"),
                Err(e) => {
                    tracing::warn!(mirror = %name, error = %e, "source topology not persisted; will retry");
                    *me.lock().unwrap_or_else(|p| p.into_inner()) = None;
                }
            }
        });
    }

    /// Applies a topology read back from `__mirror_state` (start-up or
    /// another instance): topics, ids, the source id when not known yet.
    /// A live refresh overrides it.
    pub fn restore_topology(&self, topology: offline::Topology) {
        if self.source().is_none() {
            match SourceIdentity::parse(&topology.source_cluster_id) {
                Ok(id) => {
                    let _ = self.set_source(id);
                }
                Err(e) => tracing::warn!(mirror = %self.name, error = %e,
                    "persisted source topology has an unparseable cluster id"),
            }
        } else if self.source().map(|s| s.text.as_str()) != Some(&topology.source_cluster_id) {
            tracing::warn!(mirror = %self.name, persisted = %topology.source_cluster_id,
                "persisted source topology is of another source cluster; ignored");
            return;
        }
        {
            let mut t = self.topics.write().unwrap_or_else(|p| p.into_inner());
            for topic in &topology.topics {
                if topic.id != [0; 16] {
                    t.by_id
                        .entry(topic.id)
                        .or_insert_with(|| Arc::from(topic.name.as_str()));
                }
                if !self.topology_live.load(std::sync::atomic::Ordering::SeqCst) {
                    t.partitions
                        .insert(topic.name.clone(), topic.partitions.len() as i32);
                }
            }
        }
        tracing::info!(mirror = %self.name, topics = topology.topics.len(),
            brokers = topology.brokers.len(), "source topology restored from __mirror_state");
        // The latest record wins, unless the source itself was read since.
        if !self.topology_live.load(std::sync::atomic::Ordering::SeqCst) {
            *self.topology.write().unwrap_or_else(|p| p.into_inner()) = Some(topology.clone());
        }
        *self
            .persisted_topology
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(topology);
    }

    /// The last known source topology.
    pub fn topology(&self) -> Option<offline::Topology> {
        self.topology
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Source brokers to advertise offline: the listener's live view, else
    /// the persisted topology's.
    pub(crate) fn offline_brokers(&self) -> Vec<offline::Broker> {
        let live: Vec<offline::Broker> = self
            .nodes
            .get()
            .map(|n| n.snapshot())
            .unwrap_or_default()
            .into_iter()
            .map(|(node_id, a)| offline::Broker {
                node_id,
                host: a.host,
                port: i32::from(a.port),
            })
            .collect();
        if !live.is_empty() {
            return live;
        }
        self.topology().map(|t| t.brokers).unwrap_or_default()
    }
}

impl MirrorContext {
    /// The producer-state handle of [`partition_key`](Self::partition_key)
    /// (cached per source topic and partition).
    /// Fails (the caller fails the response closed) when a new partition
    /// would exceed `producer_state.max_partitions`.
    pub fn partition_handle(
        &self,
        topic: &FetchTopic<'_>,
        partition: i32,
    ) -> Result<PartitionHandle, String> {
        let index = usize::try_from(partition)
            .ok()
            .filter(|&i| i < MAX_CACHED_PARTITION);
        if let Some(i) = index {
            let c = self.handles.read().unwrap_or_else(|p| p.into_inner());
            let slots = match topic {
                FetchTopic::Name(name) => c.by_name.get(*name),
                FetchTopic::Id(id) => c.by_id.get(id),
            };
            if let Some(h) = slots.and_then(|v| v.get(i)).and_then(Option::as_ref) {
                // A partition the registry dropped (its destination topic
                // was deleted, or it sat empty and idle) is looked up again.
                if !h.is_removed() {
                    return Ok(h.clone());
                }
            }
        }
        // An id is cached only once its name is known (ids are never
        // forgotten): before that its key is a placeholder that changes.
        let resolved = match topic {
            FetchTopic::Name(_) => true,
            FetchTopic::Id(id) => self
                .topics
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .by_id
                .contains_key(id),
        };
        let key = self.partition_key(topic, partition);
        let handle = match self.registry.get(&key) {
            Some(h) => h,
            None if self.registry.partition_count() >= self.registry.config().max_partitions => {
                return Err(format!(
                    "producer-state limit reached: {} partitions tracked \
                     (producer_state.max_partitions); refusing to track {key} rather than \
                     mirror it without producer state",
                    self.registry.partition_count()
                ));
            }
            None => self.registry.partition(&key),
        };
        if let (Some(i), true) = (index, resolved) {
            let mut c = self.handles.write().unwrap_or_else(|p| p.into_inner());
            let slots = match topic {
                FetchTopic::Name(name) => c.by_name.entry(Box::from(*name)).or_default(),
                FetchTopic::Id(id) => c.by_id.entry(*id).or_default(),
            };
            if slots.len() <= i {
                slots.resize(i + 1, None);
            }
            slots[i] = Some(handle.clone());
        }
        Ok(handle)
    }

    /// Whether the source's Metadata named the source topic id `id`.
    pub(crate) fn names_source_id(&self, id: &[u8; 16]) -> bool {
        self.topics
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .by_id
            .contains_key(id)
    }

    /// The destination partition a Fetch response partition feeds: keyed by
    /// destination topic *name* (the source name, unless renamed) and
    /// partition, so mirrors from different sources into one destination
    /// partition share its state. The destination topic id is looked up on
    /// the state cluster when a record needs it.
    pub fn partition_key(&self, topic: &FetchTopic<'_>, partition: i32) -> PartitionKey {
        match topic {
            FetchTopic::Name(name) => {
                PartitionKey::new([0; 16], self.destination_topic(name), partition)
            }
            FetchTopic::Id(id) => {
                let t = self.topics.read().unwrap_or_else(|p| p.into_inner());
                let name = match t.by_id.get(id) {
                    Some(n) => self.destination_topic(n),
                    // Not in the source's Metadata yet: keep it apart by id.
                    None => Arc::from(format!("topic-id:{}", ps::ClusterId(*id))),
                };
                PartitionKey::new([0; 16], name, partition)
            }
        }
    }

    /// Destination topics fed by this mirror with their partition counts
    /// (from the source's last Metadata). A source's internal topics (names
    /// starting with `__`: `__consumer_offsets`, `__transaction_state`, ...)
    /// are never mirrored partitions: the destination has its own.
    pub fn destination_topics(&self) -> Vec<(String, i32)> {
        let t = self.topics.read().unwrap_or_else(|p| p.into_inner());
        t.partitions
            .iter()
            .filter(|(name, _)| !name.starts_with("__"))
            .map(|(name, n)| (format!("{}{}", self.topic_prefix, name), *n))
            .collect()
    }

    /// The destination partition key of a destination topic name.
    pub fn key_for(&self, destination_topic: &str, partition: i32) -> PartitionKey {
        PartitionKey::new([0; 16], destination_topic, partition)
    }

    /// The source topic of a destination topic name, when it is one of ours.
    pub(crate) fn source_topic(&self, destination_topic: &str) -> Option<String> {
        if destination_topic.starts_with("topic-id:") {
            return None;
        }
        destination_topic
            .strip_prefix(&self.topic_prefix)
            .map(str::to_string)
    }

    /// Where replays read the source: the known source nodes, then the
    /// bootstrap servers.
    pub(crate) fn replay_servers(&self) -> Vec<(String, u16)> {
        self.nodes
            .get()
            .map(|n| n.snapshot())
            .unwrap_or_default()
            .into_iter()
            .map(|(_, a)| (a.host, a.port))
            .chain(self.source_bootstrap.iter().cloned())
            .collect()
    }

    pub(crate) fn is_warm(&self, key: &PartitionKey) -> bool {
        self.warm
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(key)
    }

    /// Counts and logs a producer-state limit hit; returns the message.
    fn state_limit(&self, message: String) -> String {
        self.metrics.state_limit.inc();
        tracing::error!(mirror = %self.name, "{message}");
        message
    }

    pub(crate) fn mark_warm(&self, key: &PartitionKey) {
        self.warm
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.clone());
    }

    fn destination_topic(&self, source_topic: &str) -> Arc<str> {
        Arc::from(format!("{}{}", self.topic_prefix, source_topic))
    }

    /// A mirror from its configuration; the source id is set if configured.
    pub fn new(
        cfg: &MirrorConfig,
        registry: Arc<ProducerStateRegistry>,
        salts: Arc<dyn SaltStore>,
        lifecycle: Arc<crate::lifecycle::Lifecycle>,
        metrics: &Metrics,
    ) -> Result<Arc<Self>, String> {
        let ctx = Self {
            name: cfg.name.clone(),
            mode: cfg.pid_mode,
            layout: match cfg.layout {
                LayoutConfig::High => Layout::High,
                LayoutConfig::SignBit => Layout::SignBit,
            },
            source: OnceLock::new(),
            registry,
            salts,
            metrics: MirrorMetrics::new(metrics, &cfg.name, cfg.crc_verify_every),
            topics: Default::default(),
            handles: Default::default(),
            topic_prefix: cfg.destination_topic_prefix.clone(),
            warm: Default::default(),
            nodes: OnceLock::new(),
            source_bootstrap: cfg
                .source_bootstrap
                .iter()
                .filter_map(|a| crate::config::split_host_port(a).ok())
                .collect(),
            lifecycle,
            seal_metrics: SealMetrics::new(metrics, &cfg.name),
            request_timeout: std::time::Duration::from_millis(cfg.upstream_request_timeout_ms),
            topology: Default::default(),
            persisted_topology: Default::default(),
            topology_live: Default::default(),
            sessions: Default::default(),
            lookups: Default::default(),
        };
        if let Some(text) = &cfg.source_cluster_id {
            ctx.set_source(SourceIdentity::parse(text)?)?;
        }
        Ok(Arc::new(ctx))
    }

    /// The source identity, once known.
    pub fn source(&self) -> Option<&SourceIdentity> {
        self.source.get()
    }

    /// Sets the source identity (configured or learned). A different id than
    /// the one already set is refused: PIDs would change region mid-stream.
    pub fn set_source(&self, id: SourceIdentity) -> Result<(), String> {
        match self.source.get() {
            Some(cur) if cur.id != id.id => Err(format!(
                "mirror {}: source cluster id changed from {} to {}; refusing to remap PIDs \
                 into a different region (set source_cluster_id explicitly if this is intended)",
                self.name, cur.text, id.text
            )),
            Some(_) => Ok(()),
            None => {
                tracing::info!(mirror = %self.name, source_cluster_id = %id.text, fold = id.fold,
                    mode = ?self.mode, layout = self.layout.name(), "mirror source identified");
                let _ = self.source.set(id);
                Ok(())
            }
        }
    }

    /// The PID that leaves the proxy for `pid` with `salt`.
    fn map(&self, source: &SourceIdentity, pid: i64, salt: i64) -> i64 {
        map_with_salt(pid, source.fold, salt, self.layout)
    }
}

/// Maps like [`pid::map_pid`], stepping the salt on the one reserved value
/// (a sign-bit mapping equal to -1) so every instance computes the same PID.
pub fn map_with_salt(pid: i64, fold: u32, salt: i64, layout: Layout) -> i64 {
    let mut s = salt;
    loop {
        match pid::map_pid(pid, fold, s, layout) {
            MapOutcome::ReservedValue => s = s.wrapping_add(1),
            other => return other.pid(pid).unwrap_or(pid),
        }
    }
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// One partition of a Fetch response, as the rewriter needs it.
struct PartitionSlice {
    key: PartitionKey,
    handle: PartitionHandle,
    records: std::ops::Range<usize>,
    /// Body offsets of the ProducerId of each aborted-transaction entry
    /// (empty, and unallocated, unless the fetch was read_committed).
    aborted: Vec<usize>,
}

impl MirrorContext {
    /// Gives the mirror its listener's source nodes (advertised in offline
    /// answers); the first listener built for the mirror sets them.
    pub fn set_nodes(&self, nodes: Arc<NodeRegistry>) {
        let _ = self.nodes.set(nodes);
    }

    /// Maps (and, for the fetcher, observes) the PIDs of a Fetch response
    /// frame in place, leaving the partitions `skip` names alone. Returns
    /// what the response must wait for first, if anything (then nothing has
    /// been changed and the frame is rewritten again once it completes).
    pub(crate) fn rewrite_fetch_frame(
        self: &Arc<Self>,
        h: &RequestHeader,
        mut frame: BytesMut,
        skip: &dyn Fn(&FetchTopic<'_>, i32) -> bool,
        fetcher: bool,
    ) -> Result<Rewritten, RewriteError> {
        let err = |message: String| RewriteError {
            api: "Fetch",
            version: h.api_version,
            message,
        };
        let header_version = handlers::response_header_version(h.api_key, h.api_version)
            .ok_or_else(|| err("unknown response header version".into()))?;
        let body_at = response_body_offset(&frame, header_version)
            .ok_or_else(|| err("response header truncated".into()))?;
        let body = &mut frame[body_at..];
        let mut held = Vec::new();
        let pending =
            rewrite_fetch_body_holding(self, h.api_version, body, skip, fetcher, Some(&mut held))
                .map_err(err)?;
        let Some(pending) = pending else {
            if held.is_empty() {
                return Ok(Rewritten::Ready(frame));
            }
            // Everything else is rewritten: answer the held partitions with
            // no records and look their topic ids up.
            return topic_lookup::hold_partitions(self, h, body_at, frame, &held);
        };
        let salts = self.salts.clone();
        let mirror = self.clone();
        let servers = self.replay_servers();
        let max_frame = crate::config::DEFAULT_MAX_FRAME_BYTES as usize;
        let version = h.api_version;
        let wait: BoxFuture<'static, Result<(), RewriteError>> = Box::pin(async move {
            let what = match &pending {
                Pending::Salts(_) => "collision salt not persisted",
                Pending::TopicIds => "destination topic ids not read",
                Pending::Replay(_) => "source range not replayed",
                Pending::Claims(_) => "producer claims not persisted",
            };
            let done = match pending {
                Pending::Salts(p) => salts.persist(p).await,
                Pending::TopicIds => salts.refresh_topic_ids().await,
                Pending::Replay(jobs) => run_replays(mirror, servers, jobs, max_frame).await,
                Pending::Claims(claims) => persist_claims(salts, claims).await,
            };
            done.map_err(|message| RewriteError {
                api: "Fetch",
                version,
                message: format!("{what}: {message}"),
            })
        });
        Ok(Rewritten::Blocked {
            frame: Some(frame),
            wait,
        })
    }
}

/// Rewrites the records and aborted transactions of a Fetch response body in
/// place. Returns the salts that must be persisted first, if any (then
/// nothing has been changed).
pub fn rewrite_fetch_body(
    mirror: &MirrorContext,
    version: i16,
    body: &mut [u8],
    skip: &dyn Fn(&FetchTopic<'_>, i32) -> bool,
) -> Result<Option<Pending>, String> {
    rewrite_fetch_body_as(mirror, version, body, skip, true)
}

/// [`rewrite_fetch_body`] for the destination fetcher (`fetcher`) or for
/// another reader: a reader's responses are mapped with the same salts and
/// claims, but never observed (its position says nothing about the
/// destination's log, so the shadow producer state must not follow it),
/// and never replayed for.
pub fn rewrite_fetch_body_as(
    mirror: &MirrorContext,
    version: i16,
    body: &mut [u8],
    skip: &dyn Fn(&FetchTopic<'_>, i32) -> bool,
    fetcher: bool,
) -> Result<Option<Pending>, String> {
    rewrite_fetch_body_holding(mirror, version, body, skip, fetcher, None)
}

/// [`rewrite_fetch_body_as`] that holds partitions whose destination topic
/// id is not known yet, when `held` is given: their records (which cannot
/// be claimed nor salted without the id) are neither observed nor changed,
/// their keys are pushed to `held` (the caller answers them with no
/// records), and every other partition is rewritten as usual.
pub fn rewrite_fetch_body_holding(
    mirror: &MirrorContext,
    version: i16,
    body: &mut [u8],
    skip: &dyn Fn(&FetchTopic<'_>, i32) -> bool,
    fetcher: bool,
    mut held: Option<&mut Vec<PartitionKey>>,
) -> Result<Option<Pending>, String> {
    // Without a durable store no record needs the id (preserve mode only).
    let holding = held.is_some() && mirror.salts.durable();
    let Some(source) = mirror.source() else {
        return Err(format!(
            "mirror {}: the source cluster id is not known yet (not learned from the source's \
             Metadata and not configured)",
            mirror.name
        ));
    };
    let mut slices: Vec<PartitionSlice> = Vec::new();
    let mut limit: Option<String> = None;
    handlers::walk_fetch_response(version, body, &mut |p| {
        if p.error_code != 0 || skip(&p.topic, p.partition_index) {
            return; // error partitions are left alone; controlled ones are replaced
        }
        let aborted: Vec<usize> = match &p.aborted_transactions {
            Some(a) if !a.is_empty() => a.iter().map(|t| t.producer_id_offset).collect(),
            _ => Vec::new(),
        };
        let records = p.records.clone().unwrap_or(0..0);
        if records.is_empty() && aborted.is_empty() {
            return;
        }
        if let (true, FetchTopic::Id(id)) = (holding, &p.topic) {
            // A source topic id the source's Metadata has not named yet: its
            // destination topic is not known either, and a state keyed by a
            // placeholder would be orphaned once it is.
            if !mirror.names_source_id(id) {
                if let Some(held) = held.as_deref_mut() {
                    held.push(mirror.partition_key(&p.topic, p.partition_index));
                }
                return;
            }
        }
        let handle = match mirror.partition_handle(&p.topic, p.partition_index) {
            Ok(h) => h,
            Err(e) => {
                limit.get_or_insert(e);
                return;
            }
        };
        if holding && mirror.salts.topic_id(&handle.key().topic).is_none() {
            if let Some(held) = held.as_deref_mut() {
                held.push(handle.key().clone());
            }
            return;
        }
        slices.push(PartitionSlice {
            key: handle.key().clone(),
            handle,
            records,
            aborted,
        });
    })
    .map_err(|e| e.to_string())?;
    if let Some(e) = limit {
        return Err(mirror.state_limit(e));
    }

    let now = now_ms();
    let handles: Vec<PartitionHandle> = slices.iter().map(|s| s.handle.clone()).collect();

    // Phase 0: a partition seen for the first time since start-up must have
    // its producer state complete up to where the fetcher is before any of
    // its batches is mapped: replay the source range the state has not seen.
    let mut replays = Vec::new();
    for (slice, handle) in slices.iter().zip(&handles) {
        if !fetcher || mirror.is_warm(&slice.key) {
            continue;
        }
        let first = body
            .get(slice.records.clone())
            .and_then(|r| match walk(r).next() {
                Some(Ok(Entry::V2(h))) => Some(h.base_offset),
                // A legacy entry starts with its offset too.
                Some(Ok(Entry::Legacy { range, .. })) => r
                    .get(range.start..range.start + 8)
                    .and_then(|b| b.try_into().ok())
                    .map(i64::from_be_bytes),
                _ => None,
            });
        let Some(first) = first else { continue };
        let next = handle.with(|s| s.next_offset());
        match mirror.source_topic(&slice.key.topic) {
            Some(source_topic) if next < first => replays.push(replay::ReplayJob {
                key: slice.key.clone(),
                source_topic,
                partition: slice.key.partition,
                from: next,
                upto: first,
            }),
            _ => mirror.mark_warm(&slice.key),
        }
    }
    if !replays.is_empty() {
        return Ok(Some(Pending::Replay(replays)));
    }

    // Phase 1: one scan of each partition, under its lock, changing nothing:
    // collisions (two origins on one mapped PID, region mode) need a salt
    // persisted, and producers seen for the first time have their claim on
    // the mapped PID made durable, before any of their batches leaves (so a
    // crash cannot make a later collision with them go unseen). Only the
    // batches that would create such state have their CRC verified; those
    // that arrived corrupt create none (listed per slice for phase 2).
    let mut pending: Vec<PendingSalt> = Vec::new();
    let mut claims: Vec<(PartitionHandle, Vec<(i64, Origin)>)> = Vec::new();
    let mut corrupt: Vec<(usize, Vec<usize>)> = Vec::new();
    let mut new_total = 0u64;
    for (i, (slice, handle)) in slices.iter().zip(&handles).enumerate() {
        let Some(records) = body.get(slice.records.clone()) else {
            continue;
        };
        let scan = handle.with(|state| scan_partition(mirror, source, state, records));
        if !scan.corrupt.is_empty() {
            corrupt.push((i, scan.corrupt));
        }
        for origin in scan.colliding {
            // The salt sequence is seeded by the destination topic id.
            let Some(topic_id) = mirror.salts.topic_id(&slice.key.topic) else {
                return Ok(Some(Pending::TopicIds));
            };
            let pid = origin.original_pid;
            let map = |salt: i64| mirror.map(source, pid, salt);
            // Resolve against the state as it will be once the earlier
            // batches of this response are observed (their claims included).
            let earlier: Vec<(i64, Origin)> = scan
                .claims
                .iter()
                .filter(|(_, o)| *o != origin)
                .copied()
                .collect();
            let choice = handle.with(|state| {
                let with_claims;
                let state = if earlier.is_empty() {
                    &*state
                } else {
                    let mut s = state.clone_for_lookup();
                    for (mapped, o) in &earlier {
                        s.claim(*mapped, *o, now);
                    }
                    with_claims = s;
                    &with_claims
                };
                match state.lookup_mapping(&origin, &map) {
                    MappingLookup::Ready { .. } => None,
                    MappingLookup::Collision { .. } => Some(resolve_collision_for_topic(
                        state,
                        &topic_id,
                        &origin,
                        &map,
                        DEFAULT_MAX_SALT_CANDIDATES,
                    )),
                }
            });
            match choice {
                None => {}
                Some(Ok(choice)) => {
                    mirror.metrics.collisions.inc();
                    tracing::warn!(mirror = %mirror.name, partition = %slice.key, %origin,
                        holder = %choice.holder, salt = choice.salt, mapped_pid = choice.mapped_pid,
                        "PID collision: two origins map to one PID; persisting a salt before forwarding");
                    pending.push(PendingSalt {
                        partition: slice.key.clone(),
                        origin,
                        choice,
                        timestamp_ms: now,
                    });
                }
                Some(Err(e)) => return Err(format!("cannot resolve PID collision: {e}")),
            }
        }
        if !scan.claims.is_empty() {
            new_total += scan.claims.len() as u64;
            claims.push((handle.clone(), scan.claims));
        }
    }
    if !pending.is_empty() {
        return Ok(Some(Pending::Salts(pending)));
    }
    let max = mirror.registry.config().max_producers;
    if new_total > 0 && mirror.registry.total_producers() + new_total > max {
        return Err(mirror.state_limit(format!(
            "producer-state limit reached: {} producers tracked, {new_total} new \
             (producer_state.max_producers = {max}); refusing to forward batches of \
             producers it cannot track",
            mirror.registry.total_producers()
        )));
    }
    if !claims.is_empty() && mirror.salts.durable() {
        return Ok(Some(Pending::Claims(claims)));
    }

    // Phase 2: observe and rewrite.
    let mut sink: Vec<Anomaly> = Vec::new();
    for (i, (slice, handle)) in slices.iter().zip(&handles).enumerate() {
        let slice_corrupt = corrupt
            .iter()
            .find(|(j, _)| *j == i)
            .map_or(&[][..], |(_, c)| c.as_slice());
        if let Some(records) = body.get_mut(slice.records.clone()) {
            rewrite_partition_records(
                mirror,
                source,
                handle,
                records,
                now,
                &mut sink,
                true,
                fetcher,
                slice_corrupt,
            )?;
        }
        if !slice.aborted.is_empty() && mirror.mode == PidMode::Region {
            rewrite_aborted(mirror, source, handle, body, slice);
        }
    }
    Ok(None)
}

/// What one scan of a partition's batches found (see phase 1).
#[derive(Default)]
struct Scan {
    /// Origins whose mapped PID another origin holds (region mode).
    colliding: Vec<Origin>,
    /// (mapped PID, origin) pairs no one holds yet.
    claims: Vec<(i64, Origin)>,
    /// Index of `claims` by mapped PID (a response may start thousands of
    /// producers: a linear search per batch would be quadratic).
    claimed: std::collections::HashMap<i64, Origin>,
    /// Start positions (within the partition's records, in order) of the
    /// batches that would have created durable state (a claim, a salt) but
    /// whose CRC-32C does not verify: they create none and leave as they
    /// came (phase 2).
    corrupt: Vec<usize>,
}

/// Whether the batch `h` of `records` may create durable state: its CRC-32C
/// verifies (one full pass, only for batches that would start a producer or
/// need a salt). A corrupt one is listed in `scan.corrupt` instead.
fn verified(records: &[u8], h: &crate::records::BatchHeader, scan: &mut Scan) -> bool {
    let ok = records
        .get(h.range.clone())
        .is_some_and(crate::records::verify_crc);
    if !ok {
        scan.corrupt.push(h.range.start);
    }
    ok
}

/// Scans `records` against `state`. Allocates only when it finds something
/// (new producers and collisions are rare). Reads batch headers only, except
/// that a batch that would create durable state (a new producer's claim, a
/// collision's salt) is verified first: a corrupted header (a flipped PID)
/// must never write a claim or a salt.
fn scan_partition(
    mirror: &MirrorContext,
    source: &SourceIdentity,
    state: &ps::PartitionState,
    records: &[u8],
) -> Scan {
    let mut scan = Scan::default();
    for entry in walk(records) {
        let h = match entry {
            Ok(Entry::V2(h)) => h,
            Ok(Entry::Legacy { .. }) => continue, // v2 batches after it still count
            _ => break,
        };
        let pid = h.producer_id;
        if pid == -1 {
            continue;
        }
        let origin = Origin {
            source_cluster: source.origin_cluster(),
            original_pid: pid,
        };
        let mapped = if mirror.mode == PidMode::Region && !pid::is_mapped(pid) {
            match state.lookup_mapping(&origin, &|salt| mirror.map(source, pid, salt)) {
                MappingLookup::Ready { mapped_pid, .. } => mapped_pid,
                MappingLookup::Collision { .. } => {
                    if !scan.colliding.contains(&origin) && verified(records, &h, &mut scan) {
                        scan.colliding.push(origin);
                    }
                    continue;
                }
            }
        } else {
            pid
        };
        // Markers do not start producers; data batches do. A batch below
        // what the state has seen (a re-fetch) starts nothing again: its
        // producer may be gone for a reason (a barrier after it).
        if !h.is_control()
            && h.last_offset() >= state.next_offset()
            && state.holder_of(mapped).is_none()
        {
            match scan.claimed.get(&mapped) {
                None => {
                    if verified(records, &h, &mut scan) {
                        scan.claimed.insert(mapped, origin);
                        scan.claims.push((mapped, origin));
                    }
                }
                // Two origins on one PID within this response (an already
                // mapped PID that a source PID maps onto): a collision too.
                Some(first) if *first != origin => {
                    if !scan.colliding.contains(&origin) && verified(records, &h, &mut scan) {
                        scan.colliding.push(origin);
                    }
                }
                Some(_) => {}
            }
        }
    }
    scan
}

/// Makes claims durable (one type-6 record per new producer, all of the
/// response in as few Produce requests as fit), then records them in the
/// shadow producer state. The cost is one ~75-byte record per producer,
/// whatever the partition already holds.
async fn persist_claims(
    salts: Arc<dyn SaltStore>,
    claims: Vec<(PartitionHandle, Vec<(i64, Origin)>)>,
) -> Result<(), String> {
    let now = now_ms();
    let records = claims
        .iter()
        .map(|(handle, new)| (handle.key().clone(), new.clone()))
        .collect();
    salts.persist_claims(records).await?;
    for (handle, new) in claims {
        handle.with(|s| {
            for (mapped, origin) in &new {
                s.claim(*mapped, *origin, now);
            }
        });
    }
    Ok(())
}

/// Observes (and maps, in place) the batches of one partition's records;
/// used by the fetch path and by replays.
pub(crate) fn observe_records(
    mirror: &MirrorContext,
    source: &SourceIdentity,
    handle: &PartitionHandle,
    records: &mut [u8],
    now: i64,
    sink: &mut Vec<Anomaly>,
) {
    // A replay forwards nothing: a collision met here is resolved by phase 1
    // when the fetcher's response carries the batch.
    let _ = rewrite_partition_records(mirror, source, handle, records, now, sink, false, true, &[]);
}

/// Runs the replays a response waits for, then marks the partitions warm.
pub(crate) async fn run_replays(
    mirror: Arc<MirrorContext>,
    servers: Vec<(String, u16)>,
    jobs: Vec<replay::ReplayJob>,
    max_frame: usize,
) -> Result<(), String> {
    let source = mirror
        .source()
        .cloned()
        .ok_or("source cluster not identified")?;
    for job in jobs {
        tracing::info!(mirror = %mirror.name, partition = %job.key, from = job.from, upto = job.upto,
            "first fetch since start-up: replaying the source range the producer state has not seen");
        let key = job.key.clone();
        replay::replay(
            mirror.clone(),
            source.clone(),
            servers.clone(),
            job,
            max_frame,
        )
        .await?;
        mirror.mark_warm(&key);
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn rewrite_partition_records(
    mirror: &MirrorContext,
    source: &SourceIdentity,
    handle: &PartitionHandle,
    records: &mut [u8],
    now: i64,
    sink: &mut Vec<Anomaly>,
    forwarding: bool,
    observe: bool,
    corrupt: &[usize],
) -> Result<(), String> {
    // Collect headers first: the walk borrows the buffer immutably.
    let mut pos = 0;
    let mut last_epoch = None;
    let result = loop {
        if pos >= records.len() {
            break Ok(());
        }
        let header = match walk(&records[pos..]).next() {
            Some(Ok(Entry::V2(h))) => h,
            // A legacy (v0/v1) entry is forwarded untouched, but the v2
            // batches after it (a down-converted prefix, an old segment
            // followed by new ones) are still mapped and tracked.
            Some(Ok(Entry::Legacy { range, .. })) if range.end > 0 => {
                pos += range.end;
                continue;
            }
            Some(Ok(_)) | None => break Ok(()), // truncated tail: untouched
            Some(Err(e)) => {
                mirror.metrics.corrupt.inc();
                tracing::warn!(mirror = %mirror.name, partition = %handle.key(), position = pos, error = %e,
                    "corrupt record batch in a Fetch response; forwarding the rest of the partition untouched");
                break Ok(());
            }
        };
        let start = pos;
        let end = pos + header.range.end;
        pos = end;
        if observe && forwarding && last_epoch.is_none() {
            // The destination fetcher asked for an offset within this first
            // batch: it appended everything below it.
            handle.with(|s| s.note_fetcher_position(header.base_offset));
        }
        last_epoch = Some(header.partition_leader_epoch);
        let seen = mirror.metrics.batches.inc();
        let batch = &mut records[start..end];
        if corrupt.contains(&start) {
            // Phase 1 verified it (it would have started a producer or needed
            // a salt) and its CRC-32C does not match: it creates no state and
            // leaves byte for byte as it came, still corrupt, for the
            // destination to reject.
            mirror.metrics.corrupt.inc();
            tracing::warn!(mirror = %mirror.name, partition = %handle.key(), offset = header.base_offset,
                producer_id = header.producer_id,
                "record batch with a bad CRC-32C would start a producer; forwarded as it came, no claim, no state");
            continue;
        }
        // Optional sampled verification (off by default): the rewrite below
        // keeps a corrupt batch corrupt without reading it, so this is only
        // a count for the operator; the destination verifies every batch.
        let every = mirror.metrics.crc_verify_every;
        if every > 0 && seen % every == 0 && !crate::records::verify_crc(batch) {
            mirror.metrics.corrupt.inc();
            tracing::warn!(mirror = %mirror.name, partition = %handle.key(), offset = header.base_offset,
                "record batch with a bad CRC-32C (sampled check); forwarded still corrupt");
        }
        let control = if header.is_control() {
            match first_control_record(batch) {
                Ok(rec) => Some(match (rec.key.control_type, rec.value) {
                    (
                        ControlType::Commit,
                        ControlValue::EndTxnMarker {
                            coordinator_epoch, ..
                        },
                    ) => ControlKind::Commit { coordinator_epoch },
                    (
                        ControlType::Abort,
                        ControlValue::EndTxnMarker {
                            coordinator_epoch, ..
                        },
                    ) => ControlKind::Abort { coordinator_epoch },
                    (ControlType::MirrorPidReset, value) => {
                        let from = match value {
                            ControlValue::MirrorPidReset {
                                source_cluster_id, ..
                            } => source_cluster_id,
                            _ => "?",
                        };
                        if observe {
                            pass_barrier(mirror, handle, &header, from, now, sink);
                        }
                        continue;
                    }
                    (other, _) => ControlKind::Unknown(other.id()),
                }),
                Err(e) => {
                    if crate::records::control::first_control_type(batch)
                        == Some(ControlType::MirrorPidReset)
                    {
                        // The key says MIRROR_PID_RESET but the value does not
                        // parse: the destination's log still holds a barrier,
                        // so its producer state is expired all the same.
                        mirror.metrics.corrupt.inc();
                        tracing::warn!(mirror = %mirror.name, partition = %handle.key(),
                            offset = header.base_offset, error = %e,
                            "MIRROR_PID_RESET barrier with an unparseable value: expiring producer state anyway");
                        if observe {
                            pass_barrier(mirror, handle, &header, "?", now, sink);
                        }
                        continue;
                    }
                    Some(ControlKind::Unknown(-1))
                }
            }
        } else {
            None
        };
        let pid = header.producer_id;
        if pid == -1 {
            continue;
        }
        let origin = Origin {
            source_cluster: source.origin_cluster(),
            original_pid: pid,
        };
        let mapped = if mirror.mode == PidMode::Region && !pid::is_mapped(pid) {
            if pid > 0x7fff_ffff {
                mirror.metrics.oversized.inc();
            }
            let map = |salt: i64| mirror.map(source, pid, salt);
            match handle.with(|s| s.lookup_mapping(&origin, &map)) {
                MappingLookup::Ready { mapped_pid, .. } => mapped_pid,
                // Phase 1 resolved every collision; a new one can only come
                // from a concurrent connection. Its PID must not leave unsalted:
                // fail this response (the fetcher fetches again, and phase 1
                // then persists a salt first).
                MappingLookup::Collision { mapped_pid, .. } if forwarding => {
                    mirror.metrics.collisions.inc();
                    break Err(format!(
                        "PID collision appeared while forwarding {}: origin {origin} would \
                         leave as {mapped_pid}, which another origin holds; response dropped, \
                         the next fetch persists a salt first",
                        handle.key()
                    ));
                }
                MappingLookup::Collision { mapped_pid, .. } => mapped_pid,
            }
        } else {
            pid
        };
        let obs = BatchObservation {
            base_offset: header.base_offset,
            last_offset: header.last_offset(),
            producer_id: mapped,
            producer_epoch: header.producer_epoch,
            base_sequence: header.base_sequence,
            last_sequence: header.last_sequence(),
            is_transactional: header.is_transactional(),
            control,
            max_timestamp: header.max_timestamp,
        };
        sink.clear();
        if observe {
            handle.observe(&origin, &obs, now, sink);
        }
        for a in sink.iter() {
            mirror
                .metrics
                .anomalies
                .get_or_create(&MirrorKindLabels {
                    mirror: mirror.metrics.mirror.clone(),
                    kind: a.kind().as_str(),
                })
                .inc();
            tracing::warn!(mirror = %mirror.name, kind = a.kind().as_str(), "{a}");
        }
        if mapped != pid && crate::records::rewrite_producer_id(batch, mapped) {
            mirror.metrics.rewritten.inc();
        }
    };
    if let (true, Some(epoch)) = (observe && forwarding, last_epoch) {
        handle.with(|s| s.note_leader_epoch(epoch));
    }
    result
}

/// A MIRROR_PID_RESET barrier passes: expires the partition's producer
/// state through [`PartitionState::observe`](ps::PartitionState::observe),
/// whose replay guard makes a re-fetch of a barrier already seen (a lost
/// response, a reader starting at 0, a replay) change nothing: producers
/// seen after the barrier keep their state.
fn pass_barrier(
    mirror: &MirrorContext,
    handle: &PartitionHandle,
    header: &crate::records::BatchHeader,
    from: &str,
    now: i64,
    sink: &mut Vec<Anomaly>,
) {
    let obs = BatchObservation {
        base_offset: header.base_offset,
        last_offset: header.last_offset(),
        producer_id: header.producer_id,
        producer_epoch: header.producer_epoch,
        base_sequence: header.base_sequence,
        last_sequence: header.last_sequence(),
        is_transactional: header.is_transactional(),
        control: Some(ControlKind::MirrorPidReset),
        max_timestamp: header.max_timestamp,
    };
    let before = handle.with(|s| s.producer_count());
    sink.clear();
    let outcome = handle.observe(
        &Origin {
            source_cluster: ps::ClusterId([0; 16]),
            original_pid: -1,
        },
        &obs,
        now,
        sink,
    );
    if outcome == ps::ObserveOutcome::Reset {
        mirror.metrics.barriers.inc();
        tracing::info!(mirror = %mirror.name, partition = %handle.key(),
            offset = header.base_offset, barrier_source = from, expired = before,
            "MIRROR_PID_RESET barrier passed: producer state expired");
    } else {
        tracing::debug!(mirror = %mirror.name, partition = %handle.key(),
            offset = header.base_offset, ?outcome,
            "MIRROR_PID_RESET barrier re-fetched: producer state already past it, left alone");
    }
}

/// Rewrites the PIDs of `aborted_transactions` with the mapping the batches got.
fn rewrite_aborted(
    mirror: &MirrorContext,
    source: &SourceIdentity,
    handle: &PartitionHandle,
    body: &mut [u8],
    slice: &PartitionSlice,
) {
    for &at in &slice.aborted {
        let Some(dst) = body.get_mut(at..at + 8) else {
            continue;
        };
        let mut pid_bytes = [0u8; 8];
        pid_bytes.copy_from_slice(dst);
        let pid = i64::from_be_bytes(pid_bytes);
        if pid == -1 || pid::is_mapped(pid) {
            continue;
        }
        let origin = Origin {
            source_cluster: source.origin_cluster(),
            original_pid: pid,
        };
        let salt = handle.with(|s| s.salts().salt_for(&origin).unwrap_or(0));
        let mapped = mirror.map(source, pid, salt);
        dst.copy_from_slice(&mapped.to_be_bytes());
        mirror.metrics.aborted_rewritten.inc();
    }
}

#[cfg(test)]
mod handle_cache_tests {
    use super::*;
    use crate::proxy::refresh::{ClusterView, RefreshHook};

    struct NoSalts;

    impl SaltStore for NoSalts {
        fn durable(&self) -> bool {
            false
        }
        fn persist_claims(
            &self,
            _claims: Vec<(PartitionKey, Vec<(i64, Origin)>)>,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>>
        {
            Box::pin(async { Ok(()) })
        }
        fn topic_id(&self, _topic: &str) -> Option<[u8; 16]> {
            None
        }
        fn refresh_topic_ids(
            &self,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>>
        {
            Box::pin(async { Ok(()) })
        }
        fn persist(
            &self,
            _salts: Vec<PendingSalt>,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>>
        {
            Box::pin(async { Ok(()) })
        }
    }

    fn ctx(prefix: &str) -> Arc<MirrorContext> {
        let cfg: MirrorConfig = toml::from_str(&format!(
            "name = \"m\"\nbootstrap = \"127.0.0.1:1\"\nadvertised_host = \"h\"\n\
             node_port_base = 2\nsource_bootstrap = [\"127.0.0.1:3\"]\n\
             source_cluster_id = \"MkU3OEVBNTcwNTJENDM2Qg\"\ndestination_topic_prefix = \"{prefix}\"\n"
        ))
        .unwrap();
        let metrics = Metrics::new();
        MirrorContext::new(
            &cfg,
            Arc::new(ProducerStateRegistry::default()),
            Arc::new(NoSalts),
            crate::lifecycle::Lifecycle::new(metrics.clone()),
            &metrics,
        )
        .unwrap()
    }

    fn producers(h: &PartitionHandle) -> usize {
        h.with(|s| s.producer_count())
    }

    fn observe_one(h: &PartitionHandle, pid: i64) {
        let origin = Origin {
            source_cluster: ps::ClusterId([1; 16]),
            original_pid: pid,
        };
        let mut sink = Vec::new();
        h.observe(
            &origin,
            &BatchObservation::data(pid, 0, pid * 10, 0, 1, false),
            0,
            &mut sink,
        );
    }

    #[test]
    fn cached_handle_is_the_registry_handle_of_the_key() {
        let m = ctx("dst.");
        let a = m.partition_handle(&FetchTopic::Name("t"), 3).unwrap();
        assert_eq!(a.key(), &m.partition_key(&FetchTopic::Name("t"), 3));
        assert_eq!(&*a.key().topic, "dst.t");
        let b = m.partition_handle(&FetchTopic::Name("t"), 3).unwrap();
        observe_one(&a, 5);
        assert_eq!(producers(&b), 1, "same state through the cache");
        let r = m.registry.get(a.key()).unwrap();
        assert_eq!(producers(&r), 1, "same state as the registry's");
        // other partitions and topics are distinct
        assert_eq!(
            producers(&m.partition_handle(&FetchTopic::Name("t"), 4).unwrap()),
            0
        );
        assert_eq!(
            producers(&m.partition_handle(&FetchTopic::Name("u"), 3).unwrap()),
            0
        );
        // out-of-range indexes bypass the cache but still resolve
        let big = m
            .partition_handle(&FetchTopic::Name("t"), i32::MAX)
            .unwrap();
        assert_eq!(big.key().partition, i32::MAX);
        let neg = m.partition_handle(&FetchTopic::Name("t"), -1).unwrap();
        assert_eq!(neg.key().partition, -1);
    }

    #[test]
    fn topic_id_is_cached_only_once_its_name_is_known() {
        let m = ctx("");
        let id = [9u8; 16];
        let early = m.partition_handle(&FetchTopic::Id(id), 0).unwrap();
        assert!(early.key().topic.starts_with("topic-id:"));
        m.on_refresh(&ClusterView {
            cluster_id: None,
            topics: vec![("named".into(), id, 1)],
            ..Default::default()
        })
        .unwrap();
        let late = m.partition_handle(&FetchTopic::Id(id), 0).unwrap();
        assert_eq!(&*late.key().topic, "named");
        let by_name = m.partition_handle(&FetchTopic::Name("named"), 0).unwrap();
        observe_one(&late, 7);
        assert_eq!(producers(&by_name), 1);
        assert_eq!(
            producers(&m.partition_handle(&FetchTopic::Id(id), 0).unwrap()),
            1
        );
    }
}
