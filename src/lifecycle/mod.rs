//! Mirror partition life cycle (SPEC 3): MIRRORING, PAUSED, STOPPING,
//! STOPPED, FAILED, with the transitions enforced and every transition
//! persisted in `__mirror_state` before it takes effect.
//!
//! Partitions are identified like the producer state: destination topic name
//! and partition. A partition with no entry is MIRRORING. The fetch path asks
//! [`Lifecycle::controls`] first (an atomic counter, so the common case of
//! nothing stopped costs nothing) and only then parses Fetch requests.
//!
//! The seal: when a STOPPING partition is next fetched, the fetcher's fetch
//! offset is the cut; ABORT markers for every transaction open at the cut
//! (from the shadow producer state, taken as it was at the cut) and then the
//! MIRROR_PID_RESET barrier are built at
//! consecutive offsets from the cut; the open transactions (a producer-state
//! snapshot, record type 5) and the cut (type 4) are persisted; then the
//! batches are served. Once the fetcher's offset shows all were appended
//! and (`stopped_when = "destination_hw"`, the default) the destination's
//! high watermark has passed them ([`crate::mirror::dest_hw`]), STOPPED is
//! persisted and the partition is answered locally from then on. A fetch
//! below the cut (a new destination leader that truncated) gets the seal
//! planned again at its offset ([`seal::decide`]).

pub mod seal;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::producer_state::PartitionKey;

pub use seal::{SealBatch, SealPlan, StopRule};

/// A mirrored partition's life-cycle state (SPEC 3). The state store keeps
/// it as an int8; the conversion lives in its adapter
/// ([`crate::state_store::sync`]), so this module knows nothing of the
/// record schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// Mirroring from the source.
    Mirroring,
    /// Mirroring halted, partition not writable.
    Paused,
    /// Sealing in progress.
    Stopping,
    /// Sealed; the partition is writable (terminal).
    Stopped,
    /// Failed (see the entry's reason).
    Failed,
    /// A state code written by a newer mirrorguard; kept so it round-trips.
    Other(i8),
}

impl State {
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

/// An operator request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Operation {
    /// Seal and stop.
    Stop,
    /// Hold data without sealing.
    Pause,
    /// Continue after a pause.
    Resume,
    /// Protect a STOPPED partition again: a new mirroring episode.
    Protect,
}

/// Earlier episodes kept in an entry (the oldest are dropped first).
pub const MAX_HISTORY: usize = 16;

/// One earlier mirroring episode of a partition, as it ended (kept for
/// audit: `GET /v1/partitions`, `mirrorguard dump`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Episode {
    /// Its number (0: the first).
    pub episode: i32,
    /// The mirror that fed it.
    pub mirror: String,
    /// Its source cluster.
    pub source_cluster_id: String,
    /// How it ended (STOPPED).
    #[serde(serialize_with = "ser_state")]
    pub state: State,
    /// Its cut.
    pub cut: Option<i64>,
    /// Its sealing batches.
    pub seal_batches: Option<i32>,
    /// The leader epoch its seal was stamped with.
    pub leader_epoch: Option<i32>,
    /// Where its fetcher started (`None`: the first episode, or not known).
    pub start: Option<i64>,
    /// Wall-clock ms of its last transition (the seal's completion).
    pub ended_ms: i64,
}

/// Why a transition was refused.
#[derive(Debug, Clone, thiserror::Error, Serialize)]
#[serde(tag = "error", rename_all = "snake_case")]
pub enum TransitionError {
    /// The transition is not allowed from the current state.
    #[error("{topic}-{partition}: cannot {op:?} a partition that is {state}")]
    NotAllowed {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Requested operation.
        op: Operation,
        /// Current state name.
        state: &'static str,
    },
    /// The partition is controlled by another mirror.
    #[error("{topic}-{partition} belongs to mirror {owner}, not {mirror}")]
    OtherMirror {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// The mirror that owns it.
        owner: String,
        /// The mirror named in the request.
        mirror: String,
    },
    /// The record could not be persisted; nothing changed.
    #[error("could not persist the transition: {message}")]
    NotPersisted {
        /// What the state store said.
        message: String,
    },
}

/// What the fetch path needs of a controlled partition's entry
/// ([`Lifecycle::controlled_of`]).
#[derive(Debug, Clone)]
pub struct ControlledRef {
    pub topic: String,
    pub partition: i32,
    pub state: State,
    pub cut: Option<i64>,
}

/// One partition's life-cycle entry.
#[derive(Debug, Clone, Serialize)]
pub struct Entry {
    /// Mirror that feeds (or fed) the partition.
    pub mirror: String,
    /// Destination topic.
    pub topic: String,
    /// Partition index.
    pub partition: i32,
    /// Current state.
    #[serde(serialize_with = "ser_state")]
    pub state: State,
    /// Source cluster id (base64 text).
    pub source_cluster_id: String,
    /// The cut (destination offset of the first sealing batch), once known.
    pub cut: Option<i64>,
    /// Number of sealing batches (markers + barrier), once built.
    pub seal_batches: Option<i32>,
    /// The fetcher's last fetch offset seen for this partition.
    pub fetcher_offset: Option<i64>,
    /// Wall-clock ms of that fetch.
    pub last_fetch_ms: Option<i64>,
    /// Why (FAILED), or the operator-facing status of a waiting stop.
    pub reason: Option<String>,
    /// Wall-clock ms of the last transition.
    pub since_ms: i64,
    /// The sealing batches (not serialised: bytes).
    #[serde(skip)]
    pub seal: Option<Arc<SealPlan>>,
    /// Open transactions of the seal read back from `__mirror_state` after
    /// a restart (the plan is rebuilt from them at the next fetch).
    #[serde(skip)]
    pub restored_open_txns: Option<Vec<seal::OpenTxn>>,
    /// What a seal the fetcher holds whole waits for (the destination's
    /// high watermark); kept here only, never persisted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub destination_hw: Option<HwWait>,
    /// The destination topic id the entry belongs to (all zeros: not known
    /// yet). A topic deleted and created again has a new id: a new
    /// partition, to which this entry never applies.
    #[serde(skip)]
    pub topic_id: [u8; 16],
    /// The mirroring episode (0: the first; each `protect` starts the next).
    pub episode: i32,
    /// Where this episode's destination fetcher started: its first fetch
    /// offset after `protect` (`None`: the first episode, or a protected
    /// partition whose fetcher has not fetched yet).
    pub episode_start: Option<i64>,
    /// The leader epoch the seal is stamped with (persisted with the cut,
    /// so a seal rebuilt after a restart is stamped the same below Fetch
    /// v12, where requests carry no LastFetchedEpoch).
    pub leader_epoch: Option<i32>,
    /// Earlier episodes, oldest first (at most [`MAX_HISTORY`]).
    pub history: Vec<Episode>,
}

impl Entry {
    /// A protected partition whose new episode has not started: its
    /// fetcher's next fetch starts it (the shadow producer state starts
    /// empty there).
    pub fn start_pending(&self) -> bool {
        self.state == State::Mirroring && self.episode > 0 && self.episode_start.is_none()
    }

    /// Whether the fetch path must look at this entry (anything but a
    /// MIRRORING episode under way).
    pub fn is_controlled(&self) -> bool {
        self.state != State::Mirroring || self.start_pending()
    }

    /// The seal's end (cut + sealing batches), once both are known.
    pub fn seal_end(&self) -> Option<i64> {
        self.cut
            .zip(self.seal_batches)
            .map(|(c, n)| c + i64::from(n))
    }

    /// The lowest offset the current episode's producer state can be at:
    /// its start, else the end of the episode before (`None`: the first
    /// episode). A snapshot below it belongs to an earlier episode.
    pub fn episode_floor(&self) -> Option<i64> {
        if self.episode == 0 {
            return None;
        }
        self.episode_start.or_else(|| {
            self.history
                .last()
                .and_then(|h| h.cut.zip(h.seal_batches).map(|(c, n)| c + i64::from(n)))
        })
    }

    /// A new entry (MIRRORING, first episode) of `mirror` for a partition.
    pub fn new(mirror: &str, source_cluster_id: &str, topic: &str, partition: i32) -> Self {
        Self {
            mirror: mirror.to_string(),
            topic: topic.to_string(),
            partition,
            state: State::Mirroring,
            source_cluster_id: source_cluster_id.to_string(),
            cut: None,
            seal_batches: None,
            fetcher_offset: None,
            last_fetch_ms: None,
            reason: None,
            since_ms: now_ms(),
            seal: None,
            restored_open_txns: None,
            destination_hw: None,
            topic_id: [0; 16],
            episode: 0,
            episode_start: None,
            leader_epoch: None,
            history: Vec::new(),
        }
    }

    /// This entry's episode as it ended, for the history.
    pub fn as_episode(&self) -> Episode {
        Episode {
            episode: self.episode,
            mirror: self.mirror.clone(),
            source_cluster_id: self.source_cluster_id.clone(),
            state: self.state,
            cut: self.cut,
            seal_batches: self.seal_batches,
            leader_epoch: self.leader_epoch,
            start: self.episode_start,
            ended_ms: self.since_ms,
        }
    }

    /// The next episode of a STOPPED entry: MIRRORING for `mirror` from
    /// `source_cluster_id`, its start pending, this one in the history.
    pub fn next_episode(&self, mirror: &str, source_cluster_id: &str) -> Self {
        let mut history = self.history.clone();
        history.push(self.as_episode());
        if history.len() > MAX_HISTORY {
            history.drain(..history.len() - MAX_HISTORY);
        }
        Self {
            mirror: mirror.to_string(),
            state: State::Mirroring,
            source_cluster_id: source_cluster_id.to_string(),
            reason: Some(
                "protected again: a new episode starts at the destination fetcher's next fetch"
                    .into(),
            ),
            since_ms: now_ms(),
            episode: self.episode + 1,
            history,
            ..Self::new(mirror, source_cluster_id, &self.topic, self.partition)
        }
        .with_topic_id(self.topic_id)
    }

    fn with_topic_id(mut self, id: [u8; 16]) -> Self {
        self.topic_id = id;
        self
    }
}

/// A seal waiting for the destination's high watermark to pass its end
/// (`[[mirror]] stopped_when = "destination_hw"`), as the admin API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HwWait {
    /// The seal's end: the high watermark the partition waits for.
    pub seal_end: i64,
    /// The destination's high watermark last read (`None`: not read yet).
    pub high_watermark: Option<i64>,
    /// The destination broker that answered it (its leader for the partition).
    pub leader: Option<String>,
    /// Wall-clock ms of the last successful read.
    pub checked_ms: Option<i64>,
    /// Why the last read failed (the destination unreachable, no leader).
    pub error: Option<String>,
    /// Wall-clock ms since when the seal waits.
    pub waiting_since_ms: i64,
}

fn ser_state<S: serde::Serializer>(s: &State, ser: S) -> Result<S::Ok, S::Error> {
    ser.serialize_str(s.name())
}

/// Where transitions are persisted (the `__mirror_state` topic).
pub trait TransitionStore: Send + Sync {
    /// Persists the state records (type 4) of many entries and, for a seal's
    /// STOPPING record with its cut, the open-transaction snapshot first
    /// (type 5, or type-7 chunks), in as few appends as fit; resolves once
    /// all are acknowledged, with each entry's destination topic id in order.
    fn persist_many(
        &self,
        entries: Vec<Entry>,
    ) -> crate::BoxFuture<'static, Result<Vec<[u8; 16]>, crate::PersistError>>;

    /// Those of `topics` the destination cluster has no topic of (its
    /// listing read again first if one is not known): a record cannot be
    /// keyed by them. A store that keys nothing by destination topic knows
    /// every name.
    fn missing_destination_topics(
        &self,
        _topics: Vec<String>,
    ) -> crate::BoxFuture<'static, Result<Vec<String>, crate::PersistError>> {
        Box::pin(async { Ok(Vec::new()) })
    }
}

/// Entries [`Lifecycle::request_many`] persists per batch. A life-cycle
/// record is a few hundred bytes, up to ~1.5 KiB with a full episode
/// history: 128 of them stay within one Produce request (the state store's
/// 256 KiB bound), so a batch is acknowledged, or not, as a whole.
const REQUEST_BATCH: usize = 128;

/// All controlled partitions.
pub struct Lifecycle {
    entries: Mutex<HashMap<PartitionKey, Entry>>,
    /// Entries the fetch path must look at ([`Entry::is_controlled`]): zero
    /// means it skips everything.
    controlled: AtomicUsize,
    /// Bumped (under the `entries` lock) by every change that can add,
    /// remove or move an entry between states.
    generation: AtomicU64,
    /// [`Lifecycle::controlled_of`]'s lists, built at the first read after a
    /// change: an incremental fetch clones an `Arc` instead of scanning
    /// every entry under the lock (110 us at 10,000 entries).
    controlled_lists: Mutex<ControlledLists>,
    store: Mutex<Option<Arc<dyn TransitionStore>>>,
    /// Partitions whose next transition is being persisted. A transition
    /// reserves its partitions here (waiting while another holds one), is
    /// checked, persisted and installed, then releases them: transitions of
    /// one partition go one after the other, so a persisted record and the
    /// in-memory state never disagree, while no lock is held across the
    /// append and other partitions' transitions go on meanwhile.
    in_flight: Mutex<HashSet<PartitionKey>>,
    /// Woken whenever partitions are released from `in_flight`.
    released: tokio::sync::Notify,
    metrics: Arc<crate::metrics::Metrics>,
}

/// The controlled partitions of each mirror as of one `generation`.
#[derive(Default)]
struct ControlledLists {
    generation: Option<u64>,
    by_mirror: HashMap<String, Arc<[ControlledRef]>>,
    none: Arc<[ControlledRef]>,
}

/// Partitions reserved by one transition step; released on drop.
struct Reserved<'a> {
    lifecycle: &'a Lifecycle,
    keys: Vec<PartitionKey>,
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        let mut in_flight = lock(&self.lifecycle.in_flight);
        for key in &self.keys {
            in_flight.remove(key);
        }
        drop(in_flight);
        self.lifecycle.released.notify_waiters();
    }
}

/// Wall-clock milliseconds.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl Lifecycle {
    /// An empty life cycle (everything MIRRORING).
    pub fn new(metrics: Arc<crate::metrics::Metrics>) -> Arc<Self> {
        Arc::new(Self {
            entries: Mutex::new(HashMap::new()),
            controlled: AtomicUsize::new(0),
            generation: AtomicU64::new(0),
            controlled_lists: Mutex::new(ControlledLists::default()),
            store: Mutex::new(None),
            in_flight: Mutex::new(HashSet::new()),
            released: tokio::sync::Notify::new(),
            metrics,
        })
    }

    /// Sets where transitions are persisted.
    pub fn set_store(&self, store: Arc<dyn TransitionStore>) {
        *lock(&self.store) = Some(store);
    }

    /// Whether any partition is not MIRRORING (the fetch path's fast check).
    pub fn controls(&self) -> bool {
        self.controlled.load(Ordering::Relaxed) > 0
    }

    /// The entry of a partition, if it has one.
    pub fn get(&self, key: &PartitionKey) -> Option<Entry> {
        lock(&self.entries).get(key).cloned()
    }

    /// Every entry, sorted by topic and partition.
    pub fn list(&self) -> Vec<Entry> {
        let mut v: Vec<Entry> = lock(&self.entries).values().cloned().collect();
        v.sort_by(|a, b| (a.topic.as_str(), a.partition).cmp(&(b.topic.as_str(), b.partition)));
        v
    }

    /// The controlled (not MIRRORING) partitions of `mirror`: topic,
    /// partition, state and cut, in no particular order. For the fetch
    /// path, which asks on every incremental fetch: a shared list, rebuilt
    /// only after the life cycle changed (benches/lifecycle.rs).
    pub fn controlled_of(&self, mirror: &str) -> Arc<[ControlledRef]> {
        {
            let lists = lock(&self.controlled_lists);
            if lists.generation == Some(self.generation.load(Ordering::Acquire)) {
                return lists.by_mirror.get(mirror).unwrap_or(&lists.none).clone();
            }
        }
        // Lock order: `entries`, then `controlled_lists` (never the reverse).
        let entries = lock(&self.entries);
        let generation = self.generation.load(Ordering::Acquire);
        let mut by_mirror: HashMap<String, Vec<ControlledRef>> = HashMap::new();
        for e in entries.values().filter(|e| e.state != State::Mirroring) {
            by_mirror
                .entry(e.mirror.clone())
                .or_default()
                .push(ControlledRef {
                    topic: e.topic.clone(),
                    partition: e.partition,
                    state: e.state,
                    cut: e.cut,
                });
        }
        let mut lists = lock(&self.controlled_lists);
        lists.generation = Some(generation);
        lists.by_mirror = by_mirror.into_iter().map(|(m, v)| (m, v.into())).collect();
        lists.by_mirror.get(mirror).unwrap_or(&lists.none).clone()
    }

    fn recount(&self, entries: &HashMap<PartitionKey, Entry>) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        let n = entries.values().filter(|e| e.is_controlled()).count();
        self.controlled.store(n, Ordering::Relaxed);
        let mut per_state: HashMap<&'static str, i64> = HashMap::new();
        for s in ["MIRRORING", "PAUSED", "STOPPING", "STOPPED", "FAILED"] {
            per_state.insert(s, 0);
        }
        for e in entries.values() {
            *per_state.entry(e.state.name()).or_default() += 1;
        }
        for (state, count) in per_state {
            self.metrics
                .partitions_by_state
                .get_or_create(&crate::metrics::StateLabels { state })
                .set(count);
        }
    }

    /// Applies a record read from `__mirror_state` (start-up or another
    /// instance): the entry as persisted, seal rebuilt by the caller.
    pub fn restore(&self, key: PartitionKey, entry: Entry) {
        let mut entries = lock(&self.entries);
        entries.insert(key, entry);
        self.recount(&entries);
    }

    /// Applies an operator request to one partition: checks the transition,
    /// persists it, then makes it effective. `source_cluster_id` is the
    /// mirror's source (for the record).
    pub async fn request(
        &self,
        key: &PartitionKey,
        mirror: &str,
        source_cluster_id: &str,
        op: Operation,
    ) -> Result<Entry, TransitionError> {
        let (mut done, failed) = self
            .request_many(std::slice::from_ref(key), mirror, source_cluster_id, op)
            .await;
        match (failed, done.pop()) {
            (Some(e), _) => Err(e),
            (None, Some(entry)) => Ok(entry),
            (None, None) => Err(TransitionError::NotPersisted {
                message: "nothing was persisted".into(),
            }),
        }
    }

    /// Those of `topics` that have no topic on the destination cluster (a
    /// source topic the destination never created): `stop --all` leaves
    /// them out, as nothing of them was mirrored and no record of them can
    /// be keyed.
    pub async fn missing_destination_topics(
        &self,
        topics: Vec<String>,
    ) -> Result<Vec<String>, TransitionError> {
        self.store()?
            .missing_destination_topics(topics)
            .await
            .map_err(not_persisted)
    }

    /// Applies an operator request to many partitions (`stop --all`): each
    /// transition is checked in order and persisted in batches of
    /// [`REQUEST_BATCH`] (one append each, where one record each took a
    /// round trip to the state cluster), and made effective once its batch
    /// is acknowledged. Returns the entries made effective and, if one
    /// failed (its check, or its batch not persisted), why: the partitions
    /// before it are changed, it and those after it are not.
    pub async fn request_many(
        &self,
        keys: &[PartitionKey],
        mirror: &str,
        source_cluster_id: &str,
        op: Operation,
    ) -> (Vec<Entry>, Option<TransitionError>) {
        let mut done = Vec::with_capacity(keys.len());
        for batch in keys.chunks(REQUEST_BATCH) {
            let _reserved = self.reserve(batch.iter()).await;
            let mut next = Vec::with_capacity(batch.len());
            let mut failed = None;
            for key in batch {
                match Self::next_entry(self.get(key).as_ref(), key, mirror, source_cluster_id, op) {
                    Ok(entry) => next.push(entry),
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            let keys = batch.iter().take(next.len());
            match self
                .persist_and_install(keys.zip(next).collect(), |key, before, entry| {
                    tracing::info!(mirror, topic = %key.topic, partition = key.partition,
                        from = before.map_or(State::Mirroring, |e| e.state).name(),
                        to = entry.state.name(), "partition state transition");
                })
                .await
            {
                Ok(installed) => done.extend(installed),
                Err(e) => return (done, Some(e)),
            }
            if failed.is_some() {
                return (done, failed);
            }
        }
        (done, None)
    }

    /// The entry `op` makes of a partition whose entry is `current`, if the
    /// transition is allowed (nothing is changed).
    fn next_entry(
        current: Option<&Entry>,
        key: &PartitionKey,
        mirror: &str,
        source_cluster_id: &str,
        op: Operation,
    ) -> Result<Entry, TransitionError> {
        Self::check_transition(key, current, mirror, op)?;
        let mut entry = match (current, op) {
            (Some(e), Operation::Protect) => e.next_episode(mirror, source_cluster_id),
            (Some(e), _) => e.clone(),
            (None, _) => Entry::new(mirror, source_cluster_id, &key.topic, key.partition),
        };
        let next = match op {
            Operation::Stop => State::Stopping,
            Operation::Pause => State::Paused,
            Operation::Resume | Operation::Protect => State::Mirroring,
        };
        entry.mirror = mirror.to_string();
        entry.state = next;
        entry.since_ms = now_ms();
        entry.reason = match (next, op) {
            (State::Stopping, _) => {
                Some("waiting for the destination fetcher's next fetch to take the cut".into())
            }
            (_, Operation::Protect) => entry.reason.take(),
            _ => None,
        };
        Ok(entry)
    }

    /// Whether `op` may be applied to a partition whose entry is `current`
    /// through `mirror` (nothing is changed).
    pub fn check_transition(
        key: &PartitionKey,
        current: Option<&Entry>,
        mirror: &str,
        op: Operation,
    ) -> Result<(), TransitionError> {
        let state = current.map(|e| e.state).unwrap_or(State::Mirroring);
        if let Some(e) = current {
            // A partition is fed by one mirror at a time: another mirror may
            // only protect it once its episode is over (STOPPED).
            let episode_over = e.state == State::Stopped && op == Operation::Protect;
            if e.mirror != mirror && e.is_controlled() && !episode_over {
                return Err(TransitionError::OtherMirror {
                    topic: key.topic.to_string(),
                    partition: key.partition,
                    owner: e.mirror.clone(),
                    mirror: mirror.to_string(),
                });
            }
        }
        let allowed = matches!(
            (state, op),
            (State::Mirroring | State::Paused, Operation::Stop)
                | (State::Mirroring, Operation::Pause)
                | (State::Paused, Operation::Resume)
                | (State::Stopped, Operation::Protect)
        );
        if !allowed {
            return Err(TransitionError::NotAllowed {
                topic: key.topic.to_string(),
                partition: key.partition,
                op,
                state: state.name(),
            });
        }
        Ok(())
    }

    /// Where transitions are persisted; none configured is an error.
    fn store(&self) -> Result<Arc<dyn TransitionStore>, TransitionError> {
        lock(&self.store)
            .clone()
            .ok_or_else(|| TransitionError::NotPersisted {
                message: "no [state] cluster is configured; transitions cannot be made durable"
                    .into(),
            })
    }

    /// Reserves `keys` for one transition step (see `in_flight`), waiting
    /// while another step holds any of them; released when the returned
    /// guard is dropped (also when the step is cancelled).
    async fn reserve<'k>(
        &self,
        keys: impl Iterator<Item = &'k PartitionKey> + Clone,
    ) -> Reserved<'_> {
        loop {
            // Registered before the check, so a release after it wakes us.
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            {
                let mut in_flight = lock(&self.in_flight);
                if !keys.clone().any(|k| in_flight.contains(k)) {
                    let keys: Vec<PartitionKey> = keys.cloned().collect();
                    in_flight.extend(keys.iter().cloned());
                    return Reserved {
                        lifecycle: self,
                        keys,
                    };
                }
            }
            released.await;
        }
    }

    /// Persists a batch of entries in one [`TransitionStore::persist_many`]
    /// and installs them once acknowledged (nothing is installed if it
    /// fails); `log` says what changed, given the entry it replaced.
    /// Returns the entries installed.
    async fn persist_and_install(
        &self,
        batch: Vec<(&PartitionKey, Entry)>,
        log: impl Fn(&PartitionKey, Option<&Entry>, &Entry),
    ) -> Result<Vec<Entry>, TransitionError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let ids = self
            .store()?
            .persist_many(batch.iter().map(|(_, e)| e.clone()).collect())
            .await
            .map_err(not_persisted)?;
        let mut entries = lock(&self.entries);
        let mut installed = Vec::with_capacity(batch.len());
        for ((key, mut entry), id) in batch.into_iter().zip(ids) {
            entry.topic_id = id;
            log(key, entries.get(key), &entry);
            entries.insert(key.clone(), entry.clone());
            installed.push(entry);
        }
        self.recount(&entries);
        Ok(installed)
    }

    /// [`commit`](Self::commit) for many partitions (the seal decisions of
    /// one fetch, the completions of one high-watermark round): each is
    /// checked as `commit` checks it, the rest persisted [`REQUEST_BATCH`]
    /// per append and installed once acknowledged. Returns, for the items
    /// handled, whether each was persisted (false: the step was there
    /// already, or the entry moved on), and why the rest were not, if a
    /// batch failed (those before it are in effect).
    pub async fn commit_many(
        &self,
        items: Vec<(PartitionKey, Entry)>,
    ) -> (Vec<bool>, Option<TransitionError>) {
        let mut applied = Vec::with_capacity(items.len());
        for batch in items.chunks(REQUEST_BATCH) {
            let _reserved = self.reserve(batch.iter().map(|(key, _)| key)).await;
            let needed: Vec<bool> = batch
                .iter()
                .map(|(key, entry)| Self::commit_needed(self.get(key).as_ref(), entry))
                .collect();
            let to_persist = batch
                .iter()
                .zip(&needed)
                .filter(|(_, needed)| **needed)
                .map(|((key, entry), _)| (key, entry.clone()))
                .collect();
            let persisted = self
                .persist_and_install(to_persist, |key, _, entry| {
                    tracing::info!(mirror = %entry.mirror, topic = %key.topic,
                        partition = key.partition, state = entry.state.name(),
                        cut = ?entry.cut, seal_batches = ?entry.seal_batches,
                        "partition seal progress persisted");
                })
                .await;
            if let Err(e) = persisted {
                return (applied, Some(e));
            }
            applied.extend(needed);
        }
        (applied, None)
    }

    /// Whether `entry` is a step to persist over `current`: not when it was
    /// decided on another episode's entry (a protect meanwhile), when the
    /// same step is there already (another connection committed it), or
    /// once the partition is STOPPED.
    fn commit_needed(current: Option<&Entry>, entry: &Entry) -> bool {
        let Some(cur) = current else {
            return true;
        };
        let same_step = cur.state == entry.state
            && cur.cut == entry.cut
            && cur.seal_batches == entry.seal_batches
            && cur.episode_start == entry.episode_start;
        cur.episode == entry.episode && !same_step && cur.state != State::Stopped
    }

    /// Records a seal decision or completion made on the fetch path:
    /// persists `entry` then installs it, unless another connection
    /// committed the same step meanwhile (see [`commit_many`](Self::commit_many)).
    pub async fn commit(&self, key: &PartitionKey, entry: Entry) -> Result<(), TransitionError> {
        let (_, failed) = self.commit_many(vec![(key.clone(), entry)]).await;
        failed.map_or(Ok(()), Err)
    }

    /// The destination topic `topic` has the id `current` now: entries of
    /// an earlier topic of that name (deleted, then created again) no
    /// longer apply to it and are dropped (their records stay in
    /// `__mirror_state` under the old id, for audit). Returns them.
    pub fn drop_other_topic_ids(&self, topic: &str, current: [u8; 16]) -> Vec<Entry> {
        let mut entries = lock(&self.entries);
        let stale: Vec<PartitionKey> = entries
            .iter()
            .filter(|(_, e)| e.topic == topic && e.topic_id != [0; 16] && e.topic_id != current)
            .map(|(k, _)| k.clone())
            .collect();
        let dropped: Vec<Entry> = stale.iter().filter_map(|k| entries.remove(k)).collect();
        if !dropped.is_empty() {
            self.recount(&entries);
        }
        dropped
    }

    /// Sets (or clears) what the partition's seal waits for; nothing is
    /// persisted. Only a STOPPING entry with that seal end is touched.
    pub fn note_hw_wait(&self, key: &PartitionKey, wait: Option<HwWait>) {
        if let Some(e) = lock(&self.entries).get_mut(key) {
            let end = e.cut.zip(e.seal_batches).map(|(c, n)| c + i64::from(n));
            match &wait {
                Some(w) if e.state == State::Stopping && end == Some(w.seal_end) => {
                    e.destination_hw = wait
                }
                Some(_) => {}
                None => e.destination_hw = None,
            }
        }
    }

    /// Notes the fetcher's offset (progress for the admin API).
    pub fn note_fetch(&self, key: &PartitionKey, fetch_offset: i64) {
        if let Some(e) = lock(&self.entries).get_mut(key) {
            e.fetcher_offset = Some(fetch_offset);
            e.last_fetch_ms = Some(now_ms());
        }
    }
}

fn not_persisted(e: crate::PersistError) -> TransitionError {
    TransitionError::NotPersisted {
        message: e.to_string(),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lifecycle() -> Arc<Lifecycle> {
        let l = Lifecycle::new(crate::metrics::Metrics::new());
        l.set_store(Arc::new(Batches {
            sizes: Default::default(),
            fail_batch: None,
        }));
        l
    }

    fn stopped(l: &Lifecycle, key: &PartitionKey) {
        let mut e = l.get(key).unwrap();
        e.state = State::Stopped;
        e.cut = Some(10);
        e.seal_batches = Some(2);
        e.leader_epoch = Some(3);
        l.restore(key.clone(), e);
    }

    #[tokio::test]
    async fn protect_starts_a_new_episode_only_from_stopped_and_keeps_the_old_one() {
        let l = lifecycle();
        let key = PartitionKey::new([0; 16], "t", 0);
        // Nothing to protect while mirroring.
        let err = l.request(&key, "m", "A", Operation::Protect).await;
        assert!(
            matches!(err, Err(TransitionError::NotAllowed { .. })),
            "{err:?}"
        );
        let e = l.request(&key, "m", "A", Operation::Stop).await.unwrap();
        assert_eq!(
            (e.state, e.topic_id, e.episode),
            (State::Stopping, [7; 16], 0)
        );
        let err = l.request(&key, "m", "A", Operation::Protect).await;
        assert!(
            matches!(err, Err(TransitionError::NotAllowed { .. })),
            "{err:?}"
        );
        stopped(&l, &key);
        // STOPPED is not forever: a new episode, the old one in the history.
        let e = l.request(&key, "m", "A", Operation::Protect).await.unwrap();
        assert_eq!(
            (e.state, e.episode, e.episode_start),
            (State::Mirroring, 1, None)
        );
        assert!(e.start_pending() && e.is_controlled() && l.controls());
        assert_eq!((e.cut, e.seal_batches, e.leader_epoch), (None, None, None));
        assert_eq!(e.history.len(), 1);
        let old = &e.history[0];
        assert_eq!(
            (old.episode, old.cut, old.seal_batches, old.leader_epoch),
            (0, Some(10), Some(2), Some(3))
        );
        assert_eq!(old.state, State::Stopped);
        // Below the floor (the old seal's end) nothing of it is this episode's.
        assert_eq!(e.episode_floor(), Some(12));
        // Once started it is an ordinary MIRRORING episode, stoppable again.
        let mut started = e.clone();
        started.episode_start = Some(15);
        l.commit(&key, started).await.unwrap();
        assert!(!l.get(&key).unwrap().is_controlled() && !l.controls());
        assert_eq!(l.get(&key).unwrap().episode_floor(), Some(15));
        let e = l.request(&key, "m", "A", Operation::Stop).await.unwrap();
        assert_eq!(
            (e.state, e.episode, e.history.len()),
            (State::Stopping, 1, 1)
        );
    }

    #[tokio::test]
    async fn another_mirror_takes_a_partition_over_only_once_its_episode_ended() {
        let l = lifecycle();
        let key = PartitionKey::new([0; 16], "t", 0);
        l.request(&key, "x", "A", Operation::Pause).await.unwrap();
        for op in [Operation::Stop, Operation::Protect, Operation::Pause] {
            let err = l.request(&key, "y", "B", op).await;
            assert!(
                matches!(err, Err(TransitionError::OtherMirror { .. })),
                "{op:?}: {err:?}"
            );
        }
        l.request(&key, "x", "A", Operation::Stop).await.unwrap();
        let err = l.request(&key, "y", "B", Operation::Protect).await;
        assert!(
            matches!(err, Err(TransitionError::OtherMirror { .. })),
            "{err:?}"
        );
        stopped(&l, &key);
        let e = l.request(&key, "y", "B", Operation::Protect).await.unwrap();
        assert_eq!(
            (e.mirror.as_str(), e.source_cluster_id.as_str(), e.episode),
            ("y", "B", 1)
        );
        assert_eq!(e.history[0].mirror, "x");
    }

    #[tokio::test]
    async fn entries_of_an_earlier_topic_of_the_same_name_are_dropped() {
        let l = lifecycle();
        let key = PartitionKey::new([0; 16], "t", 0);
        l.request(&key, "m", "A", Operation::Stop).await.unwrap();
        assert!(l.drop_other_topic_ids("t", [7; 16]).is_empty());
        assert_eq!(l.drop_other_topic_ids("t", [8; 16]).len(), 1);
        assert!(l.get(&key).is_none() && !l.controls());
    }

    #[test]
    fn the_fetch_paths_list_follows_every_change() {
        let l = Lifecycle::new(crate::metrics::Metrics::new());
        let key = |p: i32| PartitionKey::new([7; 16], "t", p);
        let stopping = |mirror: &str, p: i32| Entry {
            state: State::Stopping,
            cut: Some(5),
            ..Entry::new(mirror, "c", "t", p)
        };
        assert!(l.controlled_of("m").is_empty());
        l.restore(key(0), stopping("m", 0));
        l.restore(key(1), stopping("other", 1));
        let first = l.controlled_of("m");
        assert_eq!(first.len(), 1);
        assert_eq!((first[0].partition, first[0].cut), (0, Some(5)));
        // Unchanged: the same list, not a copy.
        assert!(Arc::ptr_eq(&first, &l.controlled_of("m")));
        l.restore(
            key(2),
            Entry {
                cut: Some(9),
                ..stopping("m", 2)
            },
        );
        let mut parts: Vec<i32> = l.controlled_of("m").iter().map(|c| c.partition).collect();
        parts.sort();
        assert_eq!(parts, [0, 2]);
        l.restore(key(0), Entry::new("m", "c", "t", 0));
        assert_eq!(l.controlled_of("m").len(), 1);
        assert_eq!(l.controlled_of("other").len(), 1);
        l.restore(key(2), Entry::new("m", "c", "t", 2));
        assert!(l.controlled_of("m").is_empty());
    }

    /// A store that acknowledges every record (keyed by a fixed topic id),
    /// records the size of each batch it is given and refuses the batch
    /// numbered `fail_batch` (from 0).
    struct Batches {
        sizes: Arc<Mutex<Vec<usize>>>,
        fail_batch: Option<usize>,
    }

    impl TransitionStore for Batches {
        fn persist_many(
            &self,
            entries: Vec<Entry>,
        ) -> crate::BoxFuture<'static, Result<Vec<[u8; 16]>, crate::PersistError>> {
            let mut sizes = lock(&self.sizes);
            let fails = self.fail_batch == Some(sizes.len());
            sizes.push(entries.len());
            Box::pin(async move {
                if fails {
                    return Err("state cluster unreachable".into());
                }
                Ok(vec![[7; 16]; entries.len()])
            })
        }
    }

    #[tokio::test]
    async fn a_request_for_many_partitions_is_persisted_in_batches_and_stops_at_the_first_failure()
    {
        let keys: Vec<PartitionKey> = (0..1_200)
            .map(|p| PartitionKey::new([0; 16], "t", p))
            .collect();
        let with = |fail_batch| {
            let sizes = Arc::new(Mutex::new(Vec::new()));
            let l = Lifecycle::new(crate::metrics::Metrics::new());
            l.set_store(Arc::new(Batches {
                sizes: sizes.clone(),
                fail_batch,
            }));
            (l, sizes)
        };
        // 1,200 partitions: ten appends, not 1,200.
        let (l, sizes) = with(None);
        let (done, failed) = l.request_many(&keys, "m", "A", Operation::Stop).await;
        assert!(failed.is_none());
        assert_eq!(done.len(), 1_200);
        assert_eq!(lock(&sizes).len(), 10);
        assert_eq!(lock(&sizes)[9], 1_200 - 9 * REQUEST_BATCH);
        assert!(keys
            .iter()
            .all(|k| l.get(k).unwrap().state == State::Stopping));
        // The second batch not persisted: the first is in effect, nothing after.
        let (l, sizes) = with(Some(1));
        let (done, failed) = l.request_many(&keys, "m", "A", Operation::Stop).await;
        assert!(matches!(failed, Some(TransitionError::NotPersisted { .. })));
        assert_eq!((done.len(), lock(&sizes).len()), (REQUEST_BATCH, 2));
        assert_eq!(
            l.get(&keys[REQUEST_BATCH - 1]).unwrap().state,
            State::Stopping
        );
        assert!(l.get(&keys[REQUEST_BATCH]).is_none());
        // A transition not allowed in the middle: those before it persisted
        // and in effect (as one by one), it and those after untouched.
        let (l, sizes) = with(None);
        l.restore(keys[700].clone(), Entry::new("other", "B", "t", 700));
        let mut e = l.get(&keys[700]).unwrap();
        e.state = State::Paused;
        l.restore(keys[700].clone(), e);
        let (done, failed) = l.request_many(&keys, "m", "A", Operation::Stop).await;
        assert!(matches!(failed, Some(TransitionError::OtherMirror { .. })));
        // 700 = 5 full batches and 60 of the sixth.
        assert_eq!((done.len(), lock(&sizes).len()), (700, 6));
        assert_eq!(lock(&sizes)[5], 700 - 5 * REQUEST_BATCH);
        assert_eq!(l.get(&keys[699]).unwrap().state, State::Stopping);
        assert_eq!(l.get(&keys[700]).unwrap().state, State::Paused);
        assert!(l.get(&keys[701]).is_none());
    }

    #[tokio::test]
    async fn commits_of_many_partitions_skip_the_steps_already_there_and_go_in_batches() {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let l = Lifecycle::new(crate::metrics::Metrics::new());
        l.set_store(Arc::new(Batches {
            sizes: sizes.clone(),
            fail_batch: None,
        }));
        let keys: Vec<PartitionKey> = (0..300)
            .map(|p| PartitionKey::new([0; 16], "t", p))
            .collect();
        for k in &keys {
            let mut e = Entry::new("m", "A", "t", k.partition);
            e.state = State::Stopping;
            l.restore(k.clone(), e);
        }
        let with_cut = |k: &PartitionKey| {
            let mut e = l.get(k).unwrap();
            e.cut = Some(5);
            e.seal_batches = Some(2);
            e
        };
        // Partition 0 has its cut already (another connection committed it),
        // partition 1 is STOPPED, partition 2's entry was decided on an
        // episode that ended: those three are not written again.
        l.restore(keys[0].clone(), with_cut(&keys[0]));
        let items: Vec<(PartitionKey, Entry)> =
            keys.iter().map(|k| (k.clone(), with_cut(k))).collect();
        let mut stopped = l.get(&keys[1]).unwrap();
        stopped.state = State::Stopped;
        l.restore(keys[1].clone(), stopped);
        let mut next_episode = l.get(&keys[2]).unwrap();
        next_episode.episode = 1;
        l.restore(keys[2].clone(), next_episode);
        let (applied, failed) = l.commit_many(items).await;
        assert!(failed.is_none());
        assert_eq!(&applied[..4], &[false, false, false, true]);
        assert_eq!(applied.iter().filter(|a| **a).count(), 297);
        // 300 items in batches of REQUEST_BATCH, the three skipped left out.
        assert_eq!(
            *lock(&sizes),
            vec![REQUEST_BATCH - 3, REQUEST_BATCH, 300 - 2 * REQUEST_BATCH]
        );
        assert_eq!(l.get(&keys[299]).unwrap().cut, Some(5));
        assert_eq!(l.get(&keys[1]).unwrap().state, State::Stopped);
        assert_eq!(l.get(&keys[2]).unwrap().cut, None);
    }
}

#[cfg(test)]
mod concurrency_tests {
    use super::*;

    /// A store that holds every batch with partition 0 in it until a permit
    /// is released, acknowledges the others at once, and records each
    /// persisted entry's partition and state in the order acknowledged.
    struct GateOnZero {
        gate: Arc<tokio::sync::Semaphore>,
        persisted: Persisted,
    }

    impl TransitionStore for GateOnZero {
        fn persist_many(
            &self,
            entries: Vec<Entry>,
        ) -> crate::BoxFuture<'static, Result<Vec<[u8; 16]>, crate::PersistError>> {
            let gate = self.gate.clone();
            let persisted = self.persisted.clone();
            Box::pin(async move {
                if entries.iter().any(|e| e.partition == 0) {
                    gate.acquire().await.expect("gate open").forget();
                }
                lock(&persisted).extend(entries.iter().map(|e| (e.partition, e.state)));
                Ok(vec![[7; 16]; entries.len()])
            })
        }
    }

    /// What [`GateOnZero`] persisted: partition and state, in order.
    type Persisted = Arc<Mutex<Vec<(i32, State)>>>;

    fn gated() -> (Arc<Lifecycle>, Arc<tokio::sync::Semaphore>, Persisted) {
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let persisted = Arc::new(Mutex::new(Vec::new()));
        let l = Lifecycle::new(crate::metrics::Metrics::new());
        l.set_store(Arc::new(GateOnZero {
            gate: gate.clone(),
            persisted: persisted.clone(),
        }));
        (l, gate, persisted)
    }

    fn key(p: i32) -> PartitionKey {
        PartitionKey::new([0; 16], "t", p)
    }

    /// `op` on partition `p`, run on its own task.
    fn spawn_request(
        l: &Arc<Lifecycle>,
        p: i32,
        op: Operation,
    ) -> tokio::task::JoinHandle<Result<Entry, TransitionError>> {
        let l = l.clone();
        tokio::spawn(async move { l.request(&key(p), "m", "A", op).await })
    }

    /// A slow append to the state cluster (a `stop --all` of thousands of
    /// partitions, a state cluster in trouble) must not hold every other
    /// partition's transition behind it.
    #[tokio::test]
    async fn a_persist_in_flight_does_not_hold_other_partitions_transitions() {
        let (l, gate, persisted) = gated();
        let slow = spawn_request(&l, 0, Operation::Stop);
        tokio::task::yield_now().await;
        let other = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            l.request(&key(1), "m", "A", Operation::Stop),
        )
        .await
        .expect("partition 1's stop waited for partition 0's persist");
        assert_eq!(other.unwrap().state, State::Stopping);
        let commit = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            l.commit(&key(1), {
                let mut e = l.get(&key(1)).unwrap();
                e.cut = Some(3);
                e
            }),
        )
        .await
        .expect("partition 1's seal step waited for partition 0's persist");
        assert!(commit.is_ok());
        // Partition 0 is not in effect before its record is acknowledged.
        assert!(l.get(&key(0)).is_none());
        gate.add_permits(1);
        assert_eq!(slow.await.unwrap().unwrap().state, State::Stopping);
        assert_eq!(
            *lock(&persisted),
            vec![
                (1, State::Stopping),
                (1, State::Stopping),
                (0, State::Stopping)
            ]
        );
    }

    /// Two requests for one partition still go one after the other: the
    /// second is checked against what the first made effective, and its
    /// record is written after the first's.
    #[tokio::test]
    async fn requests_for_one_partition_are_checked_and_persisted_in_order() {
        let (l, gate, persisted) = gated();
        let pause = spawn_request(&l, 0, Operation::Pause);
        tokio::task::yield_now().await;
        let stop = spawn_request(&l, 0, Operation::Stop);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(lock(&persisted).is_empty());
        assert!(!stop.is_finished());
        gate.add_permits(2);
        assert_eq!(pause.await.unwrap().unwrap().state, State::Paused);
        assert_eq!(stop.await.unwrap().unwrap().state, State::Stopping);
        assert_eq!(
            *lock(&persisted),
            vec![(0, State::Paused), (0, State::Stopping)]
        );
        assert_eq!(l.get(&key(0)).unwrap().state, State::Stopping);
    }
}
