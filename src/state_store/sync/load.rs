//! Reading `__mirror_state`: the start-up load (every record applied before
//! a mirror listener accepts a connection), the catch-up and the tail that
//! applies records other instances write, and the per-type apply of
//! collision salts, partition states, claims and source topologies.

use super::*;
use crate::state_store::schema::serving::PARTITION_SERVING_TYPE;
use crate::state_store::schema::EpisodeFields;
use crate::state_store::schema::PRODUCER_CLAIM_TYPE;

/// Bytes of records read and applied at a time by the start-up load.
const LOAD_PIECE_BYTES: usize = 8 << 20;

/// Hands the memory the start-up load freed back to the system: glibc's
/// allocator keeps freed memory in its arenas, and the load frees its read
/// pieces and deferred claims (hundreds of MB with 1,000,000 producers)
/// between the allocations of the state it built, where it would stay
/// resident.
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free pages to the kernel; it takes
    // the allocator's own locks and touches no memory in use.
    unsafe {
        libc::malloc_trim(0);
    }
}

impl StateSync {
    /// Reads the whole topic and applies it; returns the records applied.
    /// Run once, at start-up: a read that fails part of the way has applied
    /// what it read (and noted its keys as seen), so a failed load ends the
    /// process rather than being tried again.
    pub async fn load(&self) -> anyhow::Result<usize> {
        if let Err(e) = self.refresh_destination_topics().await {
            tracing::warn!(error = %e, "cannot read destination topic ids; collision records of \
                unknown topics are applied when their topic appears");
        }
        let mut next = self.next_offset.lock().await;
        let mut applied = 0;
        self.loading
            .store(true, std::sync::atomic::Ordering::SeqCst);
        // A piece at a time, each dropped once applied: what stays is the
        // state the records build, not the records.
        let read = self
            .store
            .read_all_each(LOAD_PIECE_BYTES, |records| {
                for r in &records {
                    applied += usize::from(self.apply(r));
                    *next = (*next).max(r.offset + 1);
                }
            })
            .await;
        self.loading
            .store(false, std::sync::atomic::Ordering::SeqCst);
        let read = read.inspect_err(|_| self.count("load_error"))?;
        self.count("load");
        let chunked = self.restore_loaded_chunks();
        let claims = self.apply_deferred_claims();
        release_freed_memory();
        tracing::info!(
            records = read,
            chunked_snapshots = chunked,
            claims,
            salts = applied,
            next_offset = *next,
            "__mirror_state loaded"
        );
        Ok(applied)
    }

    /// Reads new records until `upto` (inclusive) has been seen, or once if `None`.
    pub(super) async fn catch_up(&self, upto: Option<i64>) -> anyhow::Result<()> {
        let mut next = self.next_offset.lock().await;
        loop {
            let (records, new_next) = self.store.read_from(*next).await?;
            for r in &records {
                self.apply(r);
            }
            *next = (*next).max(new_next);
            match upto {
                Some(u) if *next <= u => tokio::time::sleep(Duration::from_millis(20)).await,
                _ => return Ok(()),
            }
        }
    }

    /// Runs forever: applies records other instances write.
    pub async fn tail(self: Arc<Self>, period: Duration) {
        let mut rounds: u64 = 0;
        loop {
            tokio::time::sleep(period).await;
            rounds += 1;
            // The destination's topics, now and then: topics created since
            // (records kept for topic ids not known yet apply) and topics
            // deleted since (their partitions leave the producer state).
            let every = self
                .dest_refresh_rounds
                .load(std::sync::atomic::Ordering::Relaxed)
                .max(1);
            if rounds % every == 0 {
                if let Err(e) = self.refresh_destination_topics().await {
                    tracing::debug!(error = %e, "destination topics not refreshed");
                }
            }
            if let Err(e) = self.catch_up(None).await {
                self.count("tail_error");
                tracing::warn!(error = %e, "reading __mirror_state failed; will retry");
            }
        }
    }

    /// Applies one stored record; true if it was a collision salt.
    pub(super) fn apply(&self, r: &StoredRecord) -> bool {
        // A claim is never noted as written (they go in through
        // `append_claims`) and the log is read in offset order, so the
        // highest offset per claim key would never skip one: kept, it cost
        // an entry per producer ever claimed (~115 MB at 1,000,000).
        let claim = r.key.get(..2) == Some(&PRODUCER_CLAIM_TYPE.to_be_bytes());
        if !claim && !self.advance(&r.key, r.offset) {
            return false;
        }
        let start_up = self.loading.load(std::sync::atomic::Ordering::SeqCst);
        self.apply_record(r, start_up)
    }

    /// Applies one record already admitted by [`advance`](Self::advance);
    /// `start_up` says whether it was read by the start-up load.
    pub(super) fn apply_record(&self, r: &StoredRecord, start_up: bool) -> bool {
        if r.key.get(..2) == Some(&crate::mirror::offline::SOURCE_TOPOLOGY_TYPE.to_be_bytes()) {
            self.apply_topology(r);
            return false;
        }
        if r.key.get(..2) == Some(&PARTITION_SERVING_TYPE.to_be_bytes()) {
            self.apply_serving(r, start_up);
            return false;
        }
        let Ok(rec) = decode(&r.key, r.value.as_deref()) else {
            tracing::warn!(
                offset = r.offset,
                "undecodable __mirror_state record skipped"
            );
            return false;
        };
        let (key, value) = match rec {
            StateRecord::PidCollision {
                key,
                value: Some(value),
            } => (key, value),
            StateRecord::PartitionState {
                key,
                value: Some(value),
            } => {
                self.apply_partition_state(r.offset, key, value);
                return false;
            }
            StateRecord::ProducerSnapshot {
                key,
                value: Some(value),
            } => {
                self.apply_snapshot(r, key, value, start_up);
                return false;
            }
            StateRecord::ProducerClaim { key, value } => {
                self.apply_claim(r, key, value, start_up);
                return false;
            }
            StateRecord::ProducerSnapshotChunk { key, value } => {
                self.apply_chunk(r, key, value, start_up);
                return false;
            }
            StateRecord::NewerVersion { version, .. } => {
                // A newer release's value: skipped and counted, never fatal.
                self.count("unknown_record_version");
                tracing::debug!(
                    offset = r.offset,
                    version,
                    "__mirror_state value of a newer version skipped"
                );
                return false;
            }
            StateRecord::Unknown { record_type } => {
                // A newer release's record: skipped and counted, never fatal.
                self.count("unknown_record_type");
                tracing::debug!(
                    offset = r.offset,
                    record_type,
                    "unknown __mirror_state record type skipped"
                );
                return false;
            }
            _ => return false,
        };
        let Ok(cluster) = pid::ClusterId::parse(&key.source_cluster_id) else {
            tracing::warn!(offset = r.offset, id = %key.source_cluster_id,
                "collision record with an unparseable cluster id skipped");
            return false;
        };
        let colliding = pid::ClusterId::parse(&value.colliding_cluster_id)
            .map(|c| c.0)
            .unwrap_or([0; 16]);
        let (layout, fold) = self.layout_for(&cluster);
        let origin = Origin {
            source_cluster: ps::ClusterId(cluster.0),
            original_pid: key.original_pid,
        };
        let record = SaltRecord {
            origin,
            salt: value.salt,
            mapped_pid: map_with_salt(key.original_pid, fold, value.salt, layout),
            colliding_cluster: ps::ClusterId(colliding),
            timestamp_ms: value.timestamp_ms,
            record_offset: r.offset,
        };
        let Some(topic) = self.destination_topic_name(&key.topic_id) else {
            self.keep_pending(key.topic_id, r, start_up);
            return false;
        };
        let partition = PartitionKey::new([0; 16], topic, key.partition);
        let outcome = self
            .registry
            .partition(&partition)
            .with(|s| s.salts_mut().apply(record));
        tracing::debug!(offset = r.offset, %partition, ?outcome, "collision salt applied");
        true
    }

    /// Applies a source-topology record (type 8) to its mirror.
    pub(super) fn apply_topology(&self, r: &StoredRecord) {
        use crate::mirror::offline::Topology;
        let Some(value) = r.value.as_deref() else {
            return; // tombstone: nothing to restore
        };
        let decoded = Topology::decode_key(&r.key)
            .and_then(|m| Topology::decode_value(value).map(|v| (m, v)));
        let (mirror, topology) = match decoded {
            Ok((m, Some((t, _ts)))) => (m, t),
            Ok((_, None)) => {
                self.count("unknown_record_version");
                return;
            }
            Err(e) => {
                tracing::warn!(offset = r.offset, error = %e, "undecodable source-topology record skipped");
                return;
            }
        };
        let mirrors = self.mirrors.read().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = mirrors.iter().find(|m| m.name == mirror) {
            m.restore_topology(topology);
        }
    }

    /// A producer claim (type 6). Only claims read at start-up change the
    /// state (later ones are this process's own or another instance's, as
    /// with snapshots); the load defers them until every snapshot is in.
    pub(super) fn apply_claim(
        &self,
        r: &StoredRecord,
        key: MirrorProducerClaimKey,
        value: Option<MirrorProducerClaimValue>,
        start_up: bool,
    ) {
        if !start_up {
            // Another instance's claim (ours come back too: claims are not
            // skipped by the tail; a live claim of ours is in `claimed`):
            // applied when this instance takes the partition over.
            let ours = self
                .destination_topic_name(&key.topic_id)
                .is_some_and(|topic| {
                    let pk = PartitionKey::new([0; 16], topic, key.partition);
                    self.claimed
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get(&pk)
                        .is_some_and(|c| c.pids.contains_key(&key.producer_id))
                });
            if !ours || value.is_none() {
                self.note_other_claim(&key, value.as_ref());
            }
            return;
        }
        if self.loading.load(std::sync::atomic::Ordering::SeqCst) {
            let mut d = self
                .deferred_claims
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            match value {
                // Not the record: a slice of a whole fetch response, which
                // it would keep alive until the load ends.
                Some(v) => d.insert(key, (v, r.offset, r.timestamp)),
                None => d.remove(&key),
            };
            return;
        }
        let Some(value) = value else { return };
        match self.destination_topic_name(&key.topic_id) {
            Some(topic) => self.claim_own(topic, &key, &value),
            None => self.keep_pending(key.topic_id, r, start_up),
        }
    }

    /// One of this instance's own claims, read at start-up, of `topic`: in
    /// the producer state (unless the PID is held already) and known as live.
    fn claim_own(
        &self,
        topic: String,
        key: &MirrorProducerClaimKey,
        value: &MirrorProducerClaimValue,
    ) {
        let pk = PartitionKey::new([0; 16], topic, key.partition);
        let origin = Origin {
            source_cluster: ps::ClusterId(value.origin_cluster_id),
            original_pid: value.original_pid,
        };
        let now = crate::lifecycle::now_ms();
        self.registry.partition(&pk).with(|s| {
            if s.holder_of(key.producer_id).is_none() {
                s.claim(key.producer_id, origin, now);
            }
        });
        let mut claimed = self.claimed.lock().unwrap_or_else(|p| p.into_inner());
        let set = claimed.entry(pk).or_default();
        set.topic_id = key.topic_id;
        set.pids.insert(key.producer_id, origin);
    }

    /// Applies the claims the start-up load deferred; returns how many.
    pub(super) fn apply_deferred_claims(&self) -> usize {
        // Taken, not drained: a map that held 1,000,000 claims keeps its
        // table (~350 MB) when emptied.
        let claims = std::mem::take(
            &mut *self
                .deferred_claims
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        let n = claims.len();
        for (key, (value, offset, timestamp)) in claims {
            if let Some(topic) = self.destination_topic_name(&key.topic_id) {
                self.claim_own(topic, &key, &value);
                continue;
            }
            // A topic not known yet: the record made again, kept until it
            // appears (the key and a v0 value with its tagged fields
            // encode as they were read).
            let record = StateRecord::ProducerClaim {
                key,
                value: Some(value),
            };
            if let Some(Ok((k, v))) = record.encode() {
                let r = StoredRecord {
                    offset,
                    timestamp,
                    key: k.into(),
                    value: v.map(Into::into),
                };
                self.keep_pending(key.topic_id, &r, true);
            }
        }
        n
    }

    pub(super) fn apply_partition_state(
        &self,
        offset: i64,
        key: MirrorPartitionStateKey,
        v: MirrorPartitionStateValue,
    ) {
        let Some(lifecycle) = self.lifecycle.get() else {
            return;
        };
        let topic = match self.destination_topic_name(&key.topic_id) {
            Some(t) => t,
            None => {
                // A topic of that name with another id is a new topic (the
                // record's was deleted and the name created again): the
                // record never applies to it, and stays for audit. A name the
                // listing does not know (not read yet: a destination down at
                // start-up) is applied by name and checked once it is read.
                if self
                    .destination_topic_id(&v.topic_name)
                    .is_some_and(|id| id != key.topic_id)
                {
                    self.count("partition_state_of_deleted_topic");
                    tracing::info!(offset, topic = %v.topic_name, partition = key.partition,
                        "life-cycle record of an earlier topic of that name (deleted and created \
                         again, a new topic id): not applied to the current topic");
                    return;
                }
                v.topic_name.clone()
            }
        };
        let pk = PartitionKey::new([0; 16], topic.clone(), key.partition);
        let fields = match EpisodeFields::from_tags(&v.unknown_tagged_fields) {
            Ok(f) => f,
            Err(e) => {
                self.count("undecodable_episode_fields");
                tracing::warn!(offset, topic = %topic, partition = key.partition, error = %e,
                    "life-cycle record with undecodable episode fields: read as the first episode");
                EpisodeFields::default()
            }
        };
        // Our own records come back through the tail: keep the live entry
        // (it has the built seal) when it already says the same thing.
        if let Some(cur) = lifecycle.get(&pk) {
            if cur.state == LifecycleState::from(v.state)
                && cur.cut == (v.cut_offset >= 0).then_some(v.cut_offset)
                && cur.episode == fields.episode
                && cur.episode_start == fields.start
            {
                return;
            }
        }
        // The seal's open transactions (its type-5 record or chunk
        // generation, written before the STOPPING record) stay the latest
        // snapshot of a sealing or sealed partition: periodic snapshots skip
        // partitions that are not MIRRORING. A STOPPED partition needs them
        // too: a read_committed reader below the cut must be told that the
        // seal aborted them.
        let restored_open_txns = (matches!(
            v.state,
            MirrorPartitionState::Stopping | MirrorPartitionState::Stopped
        ) && v.cut_offset >= 0)
            .then(|| {
                self.snapshots
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&(key.topic_id, key.partition))
                    .cloned()
            })
            .flatten();
        if v.state == MirrorPartitionState::Stopped
            && v.seal_batches >= 0
            && restored_open_txns.as_ref().map_or(0, Vec::len) + 1 != v.seal_batches as usize
        {
            // One ABORT per open transaction plus the barrier: anything else
            // means the seal's snapshot is missing, and a read_committed
            // reader below the cut may be told too few aborts.
            self.count("sealed_open_txns_mismatch");
            tracing::warn!(topic = %topic, partition = key.partition, seal_batches = v.seal_batches,
                restored = restored_open_txns.as_ref().map_or(0, Vec::len),
                "the seal's open-transaction snapshot does not match the sealed partition; readers below the cut may miss its aborts");
        }
        if v.state == MirrorPartitionState::Stopped {
            // Sealed: the destination expired its producer state at the
            // barrier; a snapshot restored before must not keep open
            // transactions alive here forever.
            if let Some(h) = self.registry.get(&pk) {
                h.with(|s| s.reset());
            }
        }
        tracing::info!(offset, topic = %topic, partition = key.partition, state = v.state.name(),
            cut = v.cut_offset, seal_batches = v.seal_batches, episode = fields.episode,
            episode_start = ?fields.start, "partition state restored from __mirror_state");
        let entry = Entry {
            mirror: v.mirror,
            topic,
            partition: key.partition,
            state: v.state.into(),
            source_cluster_id: v.source_cluster_id,
            cut: (v.cut_offset >= 0).then_some(v.cut_offset),
            seal_batches: (v.seal_batches >= 0).then_some(v.seal_batches),
            fetcher_offset: None,
            last_fetch_ms: None,
            reason: v.reason,
            since_ms: v.timestamp_ms,
            seal: None,
            restored_open_txns,
            destination_hw: None,
            topic_id: key.topic_id,
            episode: fields.episode,
            episode_start: fields.start,
            leader_epoch: fields.leader_epoch,
            history: fields
                .history
                .into_iter()
                .map(|h| crate::lifecycle::Episode {
                    episode: h.episode,
                    mirror: h.mirror,
                    source_cluster_id: h.source_cluster_id,
                    state: h.state.into(),
                    cut: (h.cut_offset >= 0).then_some(h.cut_offset),
                    seal_batches: (h.seal_batches >= 0).then_some(h.seal_batches),
                    leader_epoch: (h.leader_epoch >= 0).then_some(h.leader_epoch),
                    start: (h.start_offset >= 0).then_some(h.start_offset),
                    ended_ms: h.ended_ms,
                })
                .collect(),
        };
        // A later episode: producer state restored from an earlier one (a
        // snapshot below the episode's floor, applied before this record) is
        // not this episode's; it starts empty where the episode starts.
        if let (LifecycleState::Mirroring, Some(floor)) = (entry.state, entry.episode_floor()) {
            let handle = self.registry.partition(&pk);
            let stale = handle.with(|s| {
                s.next_offset() < floor || (entry.start_pending() && s.producer_count() > 0)
            });
            if stale {
                handle.with(|s| s.start_episode_at(floor));
                tracing::info!(partition = %pk, episode = entry.episode, floor,
                    "producer state of an earlier episode dropped: this episode starts empty");
            }
        }
        lifecycle.restore(pk, entry);
    }

    /// The lowest offset a snapshot of `pk`'s current episode can be at
    /// (`None`: the first episode): a snapshot below it belongs to an
    /// earlier episode and is not restored.
    pub(super) fn episode_floor(&self, pk: &PartitionKey) -> Option<i64> {
        self.lifecycle
            .get()
            .and_then(|l| l.get(pk))
            .and_then(|e| e.episode_floor())
    }
}
