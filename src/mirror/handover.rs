//! Handover between mirrorguard instances (one instance per destination
//! broker): a destination partition's fetcher moves to another broker when
//! its leadership moves, and so to another instance.
//!
//! An instance *owns* a partition from the moment its serving record (type
//! 9 in `__mirror_state`, written through [`SaltStore::take_over`]) is
//! durable until it reads another instance's serving record for it. Before
//! it forwards a batch of a partition it does not own, the planner makes it
//! take the partition over: read `__mirror_state` to its end (salts, life
//! cycle, serving records), restore the other instances' newest
//! producer-state snapshot not past the fetcher (a type-5 record or a chunk
//! generation, re-read by offset) and apply their live claims, persist the
//! serving record, then replay the source range its shadow state has not
//! seen (phase 0, as after a restart). An instance that reads another
//! instance's serving record for a partition it owned drops it from its
//! owned and warm sets, so a later fetch there takes it over again instead
//! of serving from stale state. A partition that comes back before the tail
//! (one round a second) has read the other instance's record is caught by
//! its gap: a fetcher past the state's next offset makes the instance read
//! `__mirror_state` again and replay the gap before mapping anything
//! ([`recheck`]).

use super::*;

/// Which instance last started serving a partition (its type-9 record).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ServedBy {
    /// The instance (`[state] instance_id`).
    pub instance_id: String,
    /// The fetcher's offset when it started serving.
    pub from_offset: i64,
    /// Wall-clock ms when it started serving.
    pub since_ms: i64,
    /// The offset of the partition's latest producer-state snapshot known
    /// here (whoever wrote it): its progress as `__mirror_state` shows it,
    /// at most one snapshot interval behind.
    pub snapshot_offset: Option<i64>,
}

/// A partition this instance must take over before serving it: the
/// destination partition and the fetcher's offset (its first batch's).
#[derive(Debug, Clone)]
pub struct TakeOver {
    /// Destination partition.
    pub key: PartitionKey,
    /// The first offset of the response's records for it.
    pub from_offset: i64,
}

impl MirrorContext {
    /// Whether this instance owns `key` (its serving record is the latest).
    pub(crate) fn is_owned(&self, key: &PartitionKey) -> bool {
        self.owned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(key)
    }

    /// Marks `key` served here. Called once per partition and take-over,
    /// never per batch, so the gauge is set here under the set's lock.
    pub(crate) fn mark_owned(&self, key: &PartitionKey) {
        let mut owned = self.owned.lock().unwrap_or_else(|p| p.into_inner());
        owned.insert(key.clone());
        self.metrics.served.set(owned.len() as i64);
    }

    /// Another instance serves `key` now: this instance's shadow state of
    /// it stops being complete (it is neither owned nor warm), so its next
    /// batch of it here waits for a take-over first. True if it was owned.
    pub fn disown(&self, key: &PartitionKey) -> bool {
        self.warm
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
        let mut owned = self.owned.lock().unwrap_or_else(|p| p.into_inner());
        let was = owned.remove(key);
        self.metrics.served.set(owned.len() as i64);
        was
    }

    /// [`Self::disown`] because another instance's serving record for
    /// `key` was read; counted as `stale_dropped` if it was served here.
    pub fn disown_stale(&self, key: &PartitionKey) -> bool {
        let was = self.disown(key);
        if was {
            self.metrics.stale_dropped.inc();
        }
        was
    }

    /// Forgets `key` (its destination topic was deleted): a partition of a
    /// topic created again under that name is taken over afresh.
    pub fn forget_partition(&self, key: &PartitionKey) {
        self.disown(key);
        self.gap_checked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    /// Whether `__mirror_state` was read again for `key`'s gap at `first`.
    pub(crate) fn gap_checked(&self, key: &PartitionKey, first: i64) -> bool {
        self.gap_checked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            == Some(&first)
    }

    /// Who last started serving `key`, as `__mirror_state` says.
    pub fn served_by(&self, key: &PartitionKey) -> Option<ServedBy> {
        self.salts.served_by(key)
    }

    /// This instance's id in `__mirror_state`, if it keeps state there.
    pub fn instance_id(&self) -> Option<String> {
        self.salts.instance_id()
    }
}

/// Takes the partitions over (one serving record each, after reading
/// `__mirror_state` to its end), then marks them owned and not warm: the
/// planner's phase 0 replays what their shadow state has not seen.
pub async fn take_over(mirror: Arc<MirrorContext>, jobs: Vec<TakeOver>) -> Result<(), MirrorError> {
    let previous = mirror.salts.take_over(&mirror.name, jobs.clone()).await?;
    for (job, previous) in jobs.into_iter().zip(previous) {
        tracing::info!(mirror = %mirror.name, partition = %job.key, from_offset = job.from_offset,
            previous = ?previous.map(|p| p.instance_id),
            "serving the partition here: producer state brought up to date before forwarding");
        mirror
            .warm
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&job.key);
        mirror.mark_owned(&job.key);
        mirror.metrics.take_overs.inc();
    }
    Ok(())
}

/// Reads `__mirror_state` to its end for partitions whose fetcher is past
/// their state (another instance's serving record read now drops them, and
/// the planner then takes them over); each gap is checked once. A partition
/// still served here has the gap replayed all the same: an instance of an
/// older release writes no serving record, and a gap in the source (a
/// compacted topic) costs one source read.
pub async fn recheck(mirror: Arc<MirrorContext>, jobs: Vec<TakeOver>) -> Result<(), MirrorError> {
    mirror.salts.read_state().await?;
    let mut checked = mirror.gap_checked.lock().unwrap_or_else(|p| p.into_inner());
    let mut warm = mirror.warm.lock().unwrap_or_else(|p| p.into_inner());
    for job in jobs {
        warm.remove(&job.key);
        checked.insert(job.key, job.from_offset);
    }
    Ok(())
}
