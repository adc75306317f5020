//! All partitions' producer state for the process.
//!
//! Design: `RwLock<HashMap<PartitionKey, PartitionHandle>>` where each handle
//! is an `Arc<Mutex<PartitionState>>`.
//!
//! * Access is closure-style ([`PartitionHandle::with`]): the guard lives only
//!   inside a synchronous closure, so it can never be held across `.await`
//!   (the dashmap trap of `reference/crates.md`), and the closure cannot
//!   re-enter the registry map because the map lock is released before the
//!   partition lock is taken.
//! * One mutex per partition: batches of one partition are serialised
//!   (they must be, the state is order-dependent) while different partitions
//!   proceed in parallel. The Fetch path caches the handle per partition, so
//!   the steady path is one uncontended mutex lock, no map lookup.
//! * The outer map changes only when a partition is first seen, so an
//!   `RwLock` (read-mostly) is enough; measured alternatives (dashmap,
//!   sharding) are within noise on 2 cores and bring the traps above.
//! * Lock order is map → (released) → partition → (released) → anomaly log;
//!   no two of them are ever held together.
//!
//! Poisoned locks are recovered (`PoisonError::into_inner`): the state is
//! plain data that every operation leaves consistent, and this code does not
//! panic; refusing service forever after a foreign panic would be worse.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use super::anomaly::{Anomaly, AnomalyLog};
use super::partition::{
    ClosingsBudget, ObserveOutcome, PartitionSnapshot, PartitionState, SnapshotError,
    DEFAULT_CLOSINGS_RETAINED_TOTAL_MAX,
};
use super::{BatchObservation, Origin, PartitionKey, DEFAULT_PRODUCER_ID_EXPIRATION_MS};

/// Registry settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegistryConfig {
    /// Idle time after which a producer with no open transaction expires
    /// (Kafka's `producer.id.expiration.ms`, default 24 h).
    pub max_idle_ms: i64,
    /// Anomalies kept for the admin API.
    pub anomaly_log_capacity: usize,
    /// Most producers tracked over all partitions; the Fetch path refuses
    /// (fails closed) to track more.
    pub max_producers: u64,
    /// Most destination partitions tracked.
    pub max_partitions: usize,
    /// Most transaction closings retained below the destination fetchers'
    /// positions over all partitions ([`ClosingsBudget`]).
    pub max_retained_closings: usize,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        Self {
            max_idle_ms: DEFAULT_PRODUCER_ID_EXPIRATION_MS,
            anomaly_log_capacity: AnomalyLog::DEFAULT_CAPACITY,
            max_producers: DEFAULT_MAX_PRODUCERS,
            max_partitions: DEFAULT_MAX_PARTITIONS,
            max_retained_closings: DEFAULT_CLOSINGS_RETAINED_TOTAL_MAX,
        }
    }
}

/// Default [`RegistryConfig::max_producers`] (about 110 MB of state).
pub const DEFAULT_MAX_PRODUCERS: u64 = 1_000_000;
/// Default [`RegistryConfig::max_partitions`].
pub const DEFAULT_MAX_PARTITIONS: usize = 100_000;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Shared pieces every handle needs.
#[derive(Debug)]
struct Shared {
    producers: AtomicI64,
    anomalies: Mutex<AnomalyLog>,
}

/// A cheap, clonable handle to one partition's state. Cache it per
/// partition on the Fetch path.
#[derive(Clone, Debug)]
pub struct PartitionHandle {
    key: PartitionKey,
    state: Arc<Mutex<PartitionState>>,
    shared: Arc<Shared>,
    /// Set once the registry dropped this partition: a cached handle must
    /// then be looked up again (a later handle of the key is a new state).
    removed: Arc<AtomicBool>,
    /// Wall-clock ms of the last batch observed (idle partitions may be
    /// dropped once empty).
    last_observed_ms: Arc<AtomicI64>,
}

impl PartitionHandle {
    /// The partition.
    pub fn key(&self) -> &PartitionKey {
        &self.key
    }

    /// Whether the registry dropped this partition (see
    /// [`ProducerStateRegistry::remove`]).
    pub fn is_removed(&self) -> bool {
        self.removed.load(Ordering::Relaxed)
    }

    /// Runs `f` with exclusive access to the state. Keep `f` short and
    /// synchronous; it cannot hold the guard beyond its return.
    pub fn with<R>(&self, f: impl FnOnce(&mut PartitionState) -> R) -> R {
        let mut state = lock(&self.state);
        let before = state.producer_count();
        let result = f(&mut state);
        let after = state.producer_count();
        drop(state);
        if after != before {
            // usize → i64 cannot overflow for any realistic table size.
            let delta = after as i64 - before as i64;
            self.shared.producers.fetch_add(delta, Ordering::Relaxed);
        }
        result
    }

    /// [`PartitionState::observe`], then records any anomalies in the
    /// registry's [`AnomalyLog`] (stamped `now_ms`). The anomalies stay in
    /// `sink` for the caller's metric and WARN line; clear it between calls.
    pub fn observe(
        &self,
        origin: &Origin,
        batch: &BatchObservation,
        now_ms: i64,
        sink: &mut Vec<Anomaly>,
    ) -> ObserveOutcome {
        let start = sink.len();
        self.last_observed_ms.store(now_ms, Ordering::Relaxed);
        let outcome = self.with(|s| s.observe(origin, batch, now_ms, sink));
        if let Some(new) = sink.get(start..) {
            if !new.is_empty() {
                let mut log = lock(&self.shared.anomalies);
                for a in new {
                    log.record(now_ms, a.clone());
                }
            }
        }
        outcome
    }
}

/// Producer state of every destination partition this process feeds.
#[derive(Debug)]
pub struct ProducerStateRegistry {
    partitions: RwLock<HashMap<PartitionKey, PartitionHandle>>,
    shared: Arc<Shared>,
    /// Shared by every state this registry holds.
    closings: Arc<ClosingsBudget>,
    config: RegistryConfig,
}

impl Default for ProducerStateRegistry {
    fn default() -> Self {
        Self::new(RegistryConfig::default())
    }
}

impl ProducerStateRegistry {
    /// An empty registry.
    pub fn new(config: RegistryConfig) -> Self {
        Self {
            partitions: RwLock::new(HashMap::new()),
            shared: Arc::new(Shared {
                producers: AtomicI64::new(0),
                anomalies: Mutex::new(AnomalyLog::new(config.anomaly_log_capacity)),
            }),
            closings: Arc::new(ClosingsBudget::new(config.max_retained_closings)),
            config,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &RegistryConfig {
        &self.config
    }

    /// The handle of `key`, creating empty state on first use.
    pub fn partition(&self, key: &PartitionKey) -> PartitionHandle {
        if let Some(h) = self
            .partitions
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
        {
            return h.clone();
        }
        let mut map = self
            .partitions
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        map.entry(key.clone())
            .or_insert_with(|| self.new_handle(PartitionState::new(key.clone())))
            .clone()
    }

    /// The handle of `key` if it exists.
    pub fn get(&self, key: &PartitionKey) -> Option<PartitionHandle> {
        self.partitions
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .cloned()
    }

    /// Runs `f` on `key`'s state (created if missing). For one-off access;
    /// the batch path should cache [`Self::partition`]'s handle.
    pub fn with_partition<R>(
        &self,
        key: &PartitionKey,
        f: impl FnOnce(&mut PartitionState) -> R,
    ) -> R {
        self.partition(key).with(f)
    }

    fn new_handle(&self, mut state: PartitionState) -> PartitionHandle {
        state.share_closings_budget(Arc::clone(&self.closings));
        PartitionHandle {
            key: state.key().clone(),
            state: Arc::new(Mutex::new(state)),
            shared: Arc::clone(&self.shared),
            removed: Arc::new(AtomicBool::new(false)),
            last_observed_ms: Arc::new(AtomicI64::new(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as i64),
            )),
        }
    }

    /// Drops `key`'s state (its producers leave the totals); handles still
    /// held elsewhere see [`PartitionHandle::is_removed`]. Returns whether
    /// it was there.
    pub fn remove(&self, key: &PartitionKey) -> bool {
        let removed = self
            .partitions
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
        let Some(h) = removed else {
            return false;
        };
        h.removed.store(true, Ordering::Relaxed);
        // Empties the state through the handle so the producer total follows.
        h.with(|s| s.reset());
        true
    }

    /// Drops every partition of destination topic `topic` for which `keep`
    /// is false; returns the keys dropped.
    pub fn remove_topic(
        &self,
        topic: &str,
        keep: &dyn Fn(&PartitionKey) -> bool,
    ) -> Vec<PartitionKey> {
        let keys: Vec<PartitionKey> = self
            .partition_keys()
            .into_iter()
            .filter(|k| &*k.topic == topic && !keep(k))
            .collect();
        keys.into_iter().filter(|k| self.remove(k)).collect()
    }

    /// Drops partitions that track nothing (no producer, no salt) and saw
    /// no batch for `max_idle_ms`, unless `keep` says otherwise: a topic
    /// deleted on the source only stops feeding its partitions, whose
    /// producers expire as the destination expires them, and then the empty
    /// partitions leave too, so churn cannot exhaust `max_partitions`.
    /// Returns the keys dropped.
    pub fn remove_idle_empty(
        &self,
        now_ms: i64,
        max_idle_ms: i64,
        keep: &dyn Fn(&PartitionKey) -> bool,
    ) -> Vec<PartitionKey> {
        let idle: Vec<PartitionKey> = self
            .handles()
            .into_iter()
            .filter(|h| {
                now_ms.saturating_sub(h.last_observed_ms.load(Ordering::Relaxed)) >= max_idle_ms
                    && h.with(|s| s.producer_count() == 0 && s.salts().is_empty())
                    && !keep(h.key())
            })
            .map(|h| h.key().clone())
            .collect();
        idle.into_iter().filter(|k| self.remove(k)).collect()
    }

    fn handles(&self) -> Vec<PartitionHandle> {
        self.partitions
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }

    /// Number of partitions with state.
    pub fn partition_count(&self) -> usize {
        self.partitions
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Keys of every partition with state.
    pub fn partition_keys(&self) -> Vec<PartitionKey> {
        self.partitions
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect()
    }

    /// Producers tracked over all partitions (for the size metric).
    pub fn total_producers(&self) -> u64 {
        self.shared.producers.load(Ordering::Relaxed).max(0) as u64
    }

    /// The process-wide budget of closings retained below the fetchers'
    /// positions (for its metrics).
    pub fn closings_budget(&self) -> &ClosingsBudget {
        &self.closings
    }

    /// Estimated bytes of all partitions' state (locks each briefly).
    pub fn memory_bytes(&self) -> usize {
        self.handles()
            .iter()
            .map(|h| h.with(|s| s.memory_bytes()))
            .sum()
    }

    /// Expires idle producers everywhere (with the configured idle time);
    /// returns how many were dropped. Call periodically.
    pub fn expire_idle(&self, now_ms: i64) -> usize {
        let max_idle = self.config.max_idle_ms;
        self.handles()
            .iter()
            .map(|h| h.with(|s| s.expire_idle(now_ms, max_idle)))
            .sum()
    }

    /// Records anomalies produced outside [`PartitionHandle::observe`].
    pub fn record_anomalies(&self, now_ms: i64, anomalies: &[Anomaly]) {
        if anomalies.is_empty() {
            return;
        }
        let mut log = lock(&self.shared.anomalies);
        for a in anomalies {
            log.record(now_ms, a.clone());
        }
    }

    /// A copy of the anomaly log (admin API; serialises with serde).
    pub fn anomaly_log(&self) -> AnomalyLog {
        lock(&self.shared.anomalies).clone()
    }

    /// Snapshots of every partition, ordered by topic, partition.
    pub fn snapshot(&self) -> Vec<PartitionSnapshot> {
        let mut out: Vec<PartitionSnapshot> = self
            .handles()
            .iter()
            .map(|h| h.with(|s| s.snapshot()))
            .collect();
        out.sort_by(|a, b| {
            (&a.key.topic, a.key.partition, a.key.topic_id).cmp(&(
                &b.key.topic,
                b.key.partition,
                b.key.topic_id,
            ))
        });
        out
    }

    /// Replaces (or creates) a partition's state from a snapshot.
    pub fn restore(&self, snapshot: &PartitionSnapshot) -> Result<(), SnapshotError> {
        let mut restored = PartitionState::restore(snapshot)?;
        // Counted before it replaces the old state (which leaves the count
        // when dropped): the budget may briefly hold both.
        restored.share_closings_budget(Arc::clone(&self.closings));
        let handle = self.partition(&snapshot.key);
        handle.with(move |s| *s = restored);
        Ok(())
    }
}

#[cfg(test)]
mod removal_tests {
    use super::*;
    use crate::producer_state::ClusterId;

    fn key(topic: &str, p: i32) -> PartitionKey {
        PartitionKey::new([0; 16], topic, p)
    }

    fn observe(h: &PartitionHandle, pid: i64, now: i64) {
        let origin = Origin {
            source_cluster: ClusterId([1; 16]),
            original_pid: pid,
        };
        let mut sink = Vec::new();
        h.observe(
            &origin,
            &BatchObservation::data(pid, 0, 0, 0, 1, false),
            now,
            &mut sink,
        );
    }

    #[test]
    fn a_removed_topic_leaves_counts_and_handles_say_so() {
        let r = ProducerStateRegistry::default();
        let a0 = r.partition(&key("a", 0));
        let a1 = r.partition(&key("a", 1));
        let b0 = r.partition(&key("b", 0));
        observe(&a0, 5, 1_000);
        observe(&b0, 6, 1_000);
        assert_eq!((r.partition_count(), r.total_producers()), (3, 2));
        let kept = key("a", 1);
        let dropped = r.remove_topic("a", &|k| *k == kept);
        assert_eq!(dropped, vec![key("a", 0)]);
        assert!(a0.is_removed() && !a1.is_removed() && !b0.is_removed());
        assert_eq!((r.partition_count(), r.total_producers()), (2, 1));
        // A later handle of the key is a new, empty state.
        let again = r.partition(&key("a", 0));
        assert!(!again.is_removed());
        assert_eq!(again.with(|s| s.producer_count()), 0);
    }

    #[test]
    fn only_empty_idle_partitions_leave() {
        let r = ProducerStateRegistry::default();
        let busy = r.partition(&key("t", 0));
        let empty = r.partition(&key("t", 1));
        let guarded = r.partition(&key("t", 2));
        observe(&busy, 5, 0);
        let now = i64::MAX / 2;
        let guarded_key = guarded.key().clone();
        let dropped = r.remove_idle_empty(now, 1_000, &|k| *k == guarded_key);
        assert_eq!(dropped, vec![key("t", 1)]);
        assert!(empty.is_removed() && !busy.is_removed() && !guarded.is_removed());
        // Once its producer expired, the busy one goes too.
        r.expire_idle(now);
        assert_eq!(r.remove_idle_empty(now, 1_000, &|_| false).len(), 2);
        assert_eq!(r.partition_count(), 0);
    }

    #[test]
    fn closings_retained_are_counted_across_restores_and_removals() {
        use crate::producer_state::ClosingsRetention;
        let r = ProducerStateRegistry::new(RegistryConfig {
            max_retained_closings: 2,
            ..RegistryConfig::default()
        });
        let h = r.partition(&key("t", 0));
        let origin = Origin {
            source_cluster: ClusterId([1; 16]),
            original_pid: 1,
        };
        let mut sink = Vec::new();
        for i in 0..3 {
            h.observe(
                &origin,
                &BatchObservation::data(9 + i, 0, 2 * i, 0, 1, true),
                0,
                &mut sink,
            );
            h.observe(
                &origin,
                &BatchObservation::marker(9 + i, 0, 2 * i + 1, true, 0),
                0,
                &mut sink,
            );
        }
        h.with(|s| s.note_fetcher_position(6, ClosingsRetention::default()));
        let budget = r.closings_budget();
        assert_eq!((budget.retained(), budget.dropped()), (2, 1));
        // A restore replaces the state: the old one leaves the count.
        let snap = h.with(|s| s.snapshot());
        r.restore(&snap).unwrap();
        assert_eq!(budget.retained(), 0);
        h.with(|s| s.note_fetcher_position(6, ClosingsRetention::default()));
        assert_eq!((budget.retained(), budget.dropped()), (2, 1));
        // A removed partition leaves it once its last handle is gone.
        assert!(r.remove(&key("t", 0)));
        drop(h);
        assert_eq!(r.closings_budget().retained(), 0);
    }
}
