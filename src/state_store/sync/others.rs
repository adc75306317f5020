//! What other instances wrote of a partition's producer state, for a
//! take-over (`mirror::handover`): where their snapshots are (type 5
//! records and type 7 chunk generations, by offset only) and their live
//! producer claims (type 6).
//!
//! A take-over restores the newest of those snapshots that is newer than
//! this instance's state and not past the fetcher's offset, re-reading its
//! records from `__mirror_state` then (one bounded read of known offsets),
//! and applies the live claims after it, as the start-up load does with
//! its own records: the partition's state is then what a single instance
//! would hold, up to the replay of the source range it has not seen.
//! Keeping offsets instead of the snapshots themselves bounds the memory to
//! a few dozen bytes per partition and generation chunk (a type-5 snapshot
//! may be 256 KiB, a chunk generation several MB).

use super::*;

/// Type-5 snapshots remembered per partition (their offsets): a take-over
/// whose fetcher is below the latest one falls back to an older one.
pub const OTHER_TYPE5_KEPT: usize = 4;

/// Where another instance's snapshots of one partition are, and its live
/// claims.
#[derive(Default, Debug)]
pub(super) struct OthersState {
    /// (record offset, snapshot offset) of the latest type-5 records, oldest
    /// first, at most [`OTHER_TYPE5_KEPT`].
    type5: std::collections::VecDeque<(i64, i64)>,
    /// Chunk generations not tombstoned: generation → its chunks' offsets.
    generations: std::collections::BTreeMap<i64, OtherGeneration>,
    /// Live claims (not tombstoned): mapped PID → origin.
    claims: std::collections::HashMap<i64, Origin>,
}

/// One chunk generation another instance wrote (offsets only).
#[derive(Default, Debug)]
struct OtherGeneration {
    snapshot_offset: i64,
    count: i32,
    /// Chunk index → record offset.
    chunks: std::collections::BTreeMap<i32, i64>,
    /// False once a chunk disagreed on the snapshot offset or count.
    consistent: bool,
}

impl OtherGeneration {
    fn complete(&self) -> bool {
        self.consistent
            && usize::try_from(self.count).ok() == Some(self.chunks.len())
            && (0..self.count).all(|i| self.chunks.contains_key(&i))
    }
}

/// A snapshot to restore on a take-over: its snapshot offset and the
/// record offsets holding it (one type-5 record, or every chunk in chunk
/// order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SnapshotLocation {
    pub snapshot_offset: i64,
    pub records: Vec<i64>,
    pub chunked: bool,
}

impl OthersState {
    /// Estimated bytes held (for the figure in docs/mirror_state.md).
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.type5.capacity() * 16
            + self
                .generations
                .values()
                .map(|g| 64 + g.chunks.len() * 40)
                .sum::<usize>()
            + self.claims.capacity() * (8 + std::mem::size_of::<Origin>() + 1)
    }

    fn note_type5(&mut self, record_offset: i64, snapshot_offset: i64) {
        if self.type5.len() >= OTHER_TYPE5_KEPT {
            self.type5.pop_front();
        }
        self.type5.push_back((record_offset, snapshot_offset));
    }

    fn note_chunk(
        &mut self,
        key: &MirrorProducerSnapshotChunkKey,
        r: &StoredRecord,
        value: Option<&MirrorProducerSnapshotChunkValue>,
    ) {
        match value {
            Some(v) => {
                let g = self
                    .generations
                    .entry(key.generation)
                    .or_insert_with(|| OtherGeneration {
                        snapshot_offset: v.snapshot_offset,
                        count: v.chunk_count,
                        chunks: Default::default(),
                        consistent: true,
                    });
                if g.snapshot_offset != v.snapshot_offset || g.count != v.chunk_count {
                    g.consistent = false;
                }
                g.chunks.insert(key.chunk, r.offset);
            }
            None => {
                if let Some(g) = self.generations.get_mut(&key.generation) {
                    g.chunks.remove(&key.chunk);
                    if g.chunks.is_empty() {
                        self.generations.remove(&key.generation);
                    }
                }
            }
        }
    }

    /// The snapshots a take-over may restore, best first: newer than
    /// `next` (this instance's state) and not past `fetch_offset`, the
    /// highest snapshot offset first (the record written last on a tie).
    pub fn candidates(&self, next: i64, fetch_offset: i64) -> Vec<SnapshotLocation> {
        self.locations(|s| s > next && s <= fetch_offset)
    }

    /// The snapshots past `fetch_offset` (taken after responses the
    /// destination never appended), newest first: the producers they hold
    /// are held here too on a take-over, as by a single instance.
    pub fn past(&self, fetch_offset: i64) -> Vec<SnapshotLocation> {
        self.locations(|s| s > fetch_offset)
    }

    /// Every snapshot known whose snapshot offset passes `keep`, highest
    /// snapshot offset first (the record written last on a tie).
    fn locations(&self, keep: impl Fn(i64) -> bool) -> Vec<SnapshotLocation> {
        let mut out: Vec<(i64, i64, SnapshotLocation)> = Vec::new();
        for &(record, snapshot_offset) in &self.type5 {
            out.push((
                snapshot_offset,
                record,
                SnapshotLocation {
                    snapshot_offset,
                    records: vec![record],
                    chunked: false,
                },
            ));
        }
        for g in self.generations.values().filter(|g| g.complete()) {
            let records: Vec<i64> = g.chunks.values().copied().collect();
            let last = records.iter().copied().max().unwrap_or(-1);
            out.push((
                g.snapshot_offset,
                last,
                SnapshotLocation {
                    snapshot_offset: g.snapshot_offset,
                    records,
                    chunked: true,
                },
            ));
        }
        out.retain(|(s, _, _)| keep(*s));
        out.sort_by_key(|c| std::cmp::Reverse((c.0, c.1)));
        out.into_iter().map(|(_, _, l)| l).collect()
    }

    /// The chunk keys of every generation known (live in the topic).
    fn chunk_keys(&self, key: SnapshotKey) -> Vec<MirrorProducerSnapshotChunkKey> {
        super::chunks::keys_of(
            key,
            self.generations
                .iter()
                .flat_map(|(generation, g)| g.chunks.keys().map(move |c| (*generation, *c))),
        )
    }

    /// The newest snapshot offset known (type 5 or a complete generation).
    pub fn latest_snapshot_offset(&self) -> Option<i64> {
        let t5 = self.type5.back().map(|(_, s)| *s);
        let chunked = self
            .generations
            .values()
            .rev()
            .find(|g| g.complete())
            .map(|g| g.snapshot_offset);
        t5.max(chunked)
    }
}

impl StateSync {
    fn with_others<T>(&self, key: SnapshotKey, f: impl FnOnce(&mut OthersState) -> T) -> T {
        let mut all = self.others.lock().unwrap_or_else(|p| p.into_inner());
        f(all.entry(key).or_default())
    }

    /// Notes another instance's type-5 snapshot (read by the tail).
    pub(super) fn note_other_snapshot(
        &self,
        key: SnapshotKey,
        r: &StoredRecord,
        snapshot_offset: i64,
    ) {
        self.with_others(key, |o| o.note_type5(r.offset, snapshot_offset));
    }

    /// Notes another instance's chunk or chunk tombstone (read by the tail).
    pub(super) fn note_other_chunk(
        &self,
        key: &MirrorProducerSnapshotChunkKey,
        r: &StoredRecord,
        value: Option<&MirrorProducerSnapshotChunkValue>,
    ) {
        self.with_others((key.topic_id, key.partition), |o| {
            o.note_chunk(key, r, value)
        });
    }

    /// Notes another instance's claim or claim tombstone (read by the tail).
    pub(super) fn note_other_claim(
        &self,
        key: &MirrorProducerClaimKey,
        value: Option<&MirrorProducerClaimValue>,
    ) {
        self.with_others((key.topic_id, key.partition), |o| match value {
            Some(v) => {
                o.claims.insert(
                    key.producer_id,
                    Origin {
                        source_cluster: ps::ClusterId(v.origin_cluster_id),
                        original_pid: v.original_pid,
                    },
                );
            }
            None => {
                o.claims.remove(&key.producer_id);
            }
        });
    }

    /// The newest snapshot offset other instances wrote for `key`.
    pub(super) fn others_snapshot_offset(&self, key: SnapshotKey) -> Option<i64> {
        self.others
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .and_then(OthersState::latest_snapshot_offset)
    }

    /// Bytes held for other instances' records (all partitions).
    pub fn others_memory_bytes(&self) -> usize {
        self.others
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(OthersState::memory_bytes)
            .sum()
    }

    /// Forgets what other instances wrote of a deleted topic's partitions.
    pub(super) fn forget_others_of(&self, topic_id: [u8; 16]) {
        self.others
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(id, _), _| *id != topic_id);
    }

    /// Brings `pk`'s state up to what other instances wrote before this
    /// instance serves it from `fetch_offset`: restores their newest
    /// snapshot newer than the state here and not past the fetcher (a
    /// type-5 record or a complete chunk generation, re-read from
    /// `__mirror_state`), then applies their live claims, and the producers
    /// of their newest snapshot past the fetcher, that the state does not
    /// hold (as claims: mapped PID and origin). Returns whether a snapshot
    /// was restored and how many claims were applied.
    pub(super) async fn restore_from_others(
        &self,
        pk: &PartitionKey,
        topic_id: [u8; 16],
        fetch_offset: i64,
    ) -> Result<(bool, usize), SyncError> {
        let key = (topic_id, pk.partition);
        let next = self.registry.partition(pk).with(|s| s.next_offset());
        let candidates = self
            .others
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .map(|o| o.candidates(next, fetch_offset))
            .unwrap_or_default();
        let mut restored = false;
        // A seal planned again below its cut (a new destination leader that
        // truncated): the newest snapshot past the fetcher whose closings
        // reach down to it gives the transactions open there exactly, with
        // no source to replay (failover usually finds it dead). One at the
        // fetch offset is as good.
        let replanning = self
            .lifecycle
            .get()
            .and_then(|l| l.get(pk))
            .is_some_and(|e| {
                e.state == LifecycleState::Stopping && e.cut.is_some_and(|c| fetch_offset < c)
            });
        if replanning
            && candidates
                .first()
                .is_none_or(|c| c.snapshot_offset < fetch_offset)
        {
            restored = self
                .restore_covering_past(pk, key, next, fetch_offset)
                .await?;
        }
        for loc in candidates.into_iter().filter(|_| !restored) {
            if let Some(value) = self.reread_snapshot(key, &loc).await? {
                if !self.restore_producers(pk, &value) {
                    // Refused (logged and counted): an older candidate may
                    // still give the state.
                    continue;
                }
                if loc.chunked {
                    self.count("take_over_chunked_restore");
                } else {
                    self.count("take_over_restore");
                }
                restored = true;
                break;
            }
            // Compacted away since (a newer record of the key exists): the
            // next candidate.
        }
        let (claims, chunk_keys, past) = {
            let all = self.others.lock().unwrap_or_else(|p| p.into_inner());
            match all.get(&key) {
                Some(o) => (
                    o.claims.iter().map(|(p, o)| (*p, *o)).collect::<Vec<_>>(),
                    o.chunk_keys(key),
                    o.past(fetch_offset),
                ),
                None => (Vec::new(), Vec::new(), Vec::new()),
            }
        };
        // A snapshot past the fetcher holds producers of responses the
        // destination never appended; its writer tombstoned their claims
        // once it was written. A single instance still holds them when the
        // fetcher asks for those offsets again: so are they here.
        let mut held_past = Vec::new();
        for loc in past {
            if let Some(value) = self.reread_snapshot(key, &loc).await? {
                held_past = value
                    .producers
                    .iter()
                    .filter(|p| p.producer_id != -1)
                    .map(|p| {
                        (
                            p.producer_id,
                            Origin {
                                source_cluster: ps::ClusterId(p.origin_cluster_id),
                                original_pid: p.original_pid,
                            },
                        )
                    })
                    .collect();
                break;
            }
        }
        if !chunk_keys.is_empty() {
            // Their generations are live: the next snapshot written here
            // supersedes and tombstones them, as with our own.
            let mut live = self.live_chunks.lock().unwrap_or_else(|p| p.into_inner());
            let mine = live.entry(pk.clone()).or_default();
            for k in chunk_keys {
                if !mine.contains(&k) {
                    mine.push(k);
                }
            }
        }
        let now = crate::lifecycle::now_ms();
        let applied = self.registry.partition(pk).with(|s| {
            let mut n = 0;
            for (pid, origin) in claims.iter().chain(&held_past) {
                if s.holder_of(*pid).is_none() && s.claim(*pid, *origin, now) {
                    n += 1;
                }
            }
            n
        });
        if applied > 0 {
            self.metrics
                .state_store_ops
                .get_or_create(&KindLabels {
                    listener: "__mirror_state".into(),
                    kind: "take_over_claim",
                })
                .inc_by(applied as u64);
        }
        if !claims.is_empty() {
            // Live claim records of the partition: tombstoned here once a
            // snapshot written here holds them (or their producer left).
            let mut claimed = self.claimed.lock().unwrap_or_else(|p| p.into_inner());
            let set = claimed.entry(pk.clone()).or_default();
            set.topic_id = topic_id;
            set.pids.extend(claims);
        }
        Ok((restored, applied))
    }

    /// Restores the newest snapshot of another instance past `fetch_offset`
    /// (and newer than `next`, the state here) whose transaction closings
    /// reach down to `fetch_offset` (see [`Self::restore_from_others`]);
    /// returns whether one was.
    async fn restore_covering_past(
        &self,
        pk: &PartitionKey,
        key: SnapshotKey,
        next: i64,
        fetch_offset: i64,
    ) -> Result<bool, SyncError> {
        let past = self
            .others
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .map(|o| o.past(fetch_offset))
            .unwrap_or_default();
        for loc in past {
            if loc.snapshot_offset <= next {
                continue;
            }
            let Some(value) = self.reread_snapshot(key, &loc).await? else {
                continue;
            };
            let covers = snapshots::closings_from(&value)
                .is_some_and(|c| c.kept_from.max(c.dropped_upto.saturating_add(1)) <= fetch_offset);
            if covers && self.restore_producers(pk, &value) {
                self.count(if loc.chunked {
                    "take_over_chunked_restore"
                } else {
                    "take_over_restore"
                });
                tracing::info!(partition = %pk, snapshot_offset = loc.snapshot_offset, fetch_offset,
                    "seal planned again below its cut: restored a snapshot past the fetcher whose \
                     transaction closings reach down to it");
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Re-reads one snapshot's records; `None` if any is gone or changed
    /// (compacted, or not the record the index named).
    async fn reread_snapshot(
        &self,
        key: SnapshotKey,
        loc: &SnapshotLocation,
    ) -> Result<Option<MirrorProducerSnapshotValue>, SyncError> {
        let (Some(first), Some(last)) = (
            loc.records.iter().copied().min(),
            loc.records.iter().copied().max(),
        ) else {
            return Ok(None);
        };
        let wanted: std::collections::HashSet<i64> = loc.records.iter().copied().collect();
        let records = self
            .store
            .read_range(first, last + 1)
            .await
            .map_err(SyncError::Store)?;
        self.count("take_over_reread");
        let mut found: std::collections::BTreeMap<i32, MirrorProducerSnapshotChunkValue> =
            Default::default();
        for r in records.iter().filter(|r| wanted.contains(&r.offset)) {
            match decode(&r.key, r.value.as_deref()) {
                Ok(StateRecord::ProducerSnapshot {
                    key: k,
                    value: Some(v),
                }) if !loc.chunked && (k.topic_id, k.partition) == key => {
                    return Ok(Some(v));
                }
                Ok(StateRecord::ProducerSnapshotChunk {
                    key: k,
                    value: Some(v),
                }) if loc.chunked
                    && (k.topic_id, k.partition) == key
                    && v.snapshot_offset == loc.snapshot_offset =>
                {
                    found.insert(k.chunk, v);
                }
                _ => {}
            }
        }
        if !loc.chunked || found.len() != loc.records.len() {
            return Ok(None);
        }
        Ok(Some(chunks::assemble_chunks(
            loc.snapshot_offset,
            found.iter().map(|(i, v)| (*i, v)),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(generation: i64, chunk: i32) -> MirrorProducerSnapshotChunkKey {
        MirrorProducerSnapshotChunkKey {
            topic_id: [1; 16],
            partition: 0,
            generation,
            chunk,
        }
    }

    fn rec(offset: i64) -> StoredRecord {
        StoredRecord {
            offset,
            timestamp: 0,
            key: Default::default(),
            value: None,
        }
    }

    fn value(snapshot_offset: i64, count: i32) -> MirrorProducerSnapshotChunkValue {
        MirrorProducerSnapshotChunkValue {
            snapshot_offset,
            chunk_count: count,
            producers: Vec::new(),
            unknown_tagged_fields: Vec::new(),
        }
    }

    /// The newest snapshot not past the fetcher and newer than the state
    /// wins; an incomplete or tombstoned generation never does.
    #[test]
    fn candidates_prefer_the_newest_snapshot_below_the_fetcher() {
        let mut o = OthersState::default();
        o.note_type5(10, 100);
        o.note_type5(20, 300);
        o.note_chunk(&chunk(7, 0), &rec(30), Some(&value(200, 2)));
        assert_eq!(o.candidates(0, 1_000)[0].snapshot_offset, 300);
        // Generation 7 is incomplete: only the type-5 records qualify.
        assert!(o.candidates(0, 250).iter().all(|c| !c.chunked));
        o.note_chunk(&chunk(7, 1), &rec(31), Some(&value(200, 2)));
        let best = &o.candidates(0, 250)[0];
        assert_eq!((best.snapshot_offset, best.chunked), (200, true));
        assert_eq!(best.records, vec![30, 31]);
        // Not newer than the state here: nothing.
        assert!(o.candidates(300, 1_000).is_empty());
        assert_eq!(o.latest_snapshot_offset(), Some(300));
        // A tombstoned chunk makes the generation incomplete.
        o.note_chunk(&chunk(7, 1), &rec(40), None);
        assert!(o.candidates(0, 250).iter().all(|c| !c.chunked));
        for i in 0..10 {
            o.note_type5(50 + i, 400 + i);
        }
        assert_eq!(o.type5.len(), OTHER_TYPE5_KEPT);
        // Bounded: offsets only, whatever the snapshots' sizes.
        assert!(o.memory_bytes() < 1_024, "{}", o.memory_bytes());
        // The older type-5 records are forgotten, the newest kept.
        assert_eq!(o.latest_snapshot_offset(), Some(409));
        assert!(o.candidates(0, 405).is_empty(), "400-405 are forgotten");
        assert_eq!(o.candidates(0, 407)[0].snapshot_offset, 407);
    }
}
