//! Writing `__mirror_state` for the mirrors and the life cycle: collision
//! salts (read back so the lowest record wins), producer claims and their
//! tombstones, partition transitions with a seal's open transactions, and
//! source topologies; the persistence ports those writes implement.

use super::*;

impl StateSync {
    /// Appends a mirror's source topology (type 8).
    pub(super) async fn write_topology(
        &self,
        mirror: String,
        topology: crate::mirror::offline::Topology,
    ) -> Result<(), SyncError> {
        use crate::mirror::offline::Topology;
        let k = Topology::encode_key(&mirror)?;
        let v = topology.encode_value(crate::lifecycle::now_ms())?;
        self.append_record(k, v).await.map(|_| ())
    }

    /// Writes one claim record per new producer (all of one Fetch response
    /// in as few batches as fit the bound of `append_many`), then records
    /// the claims in the state and as live claim records.
    pub(super) async fn persist_claim_records(
        &self,
        claims: Vec<(PartitionKey, Vec<(i64, Origin)>)>,
    ) -> Result<(), SyncError> {
        let now = crate::lifecycle::now_ms();
        let mut records = Vec::new();
        let mut ids = Vec::with_capacity(claims.len());
        for (pk, new) in &claims {
            let topic_id = self.topic_id_for(&pk.topic).await?;
            ids.push(topic_id);
            for (mapped, origin) in new {
                let k = MirrorProducerClaimKey {
                    topic_id,
                    partition: pk.partition,
                    producer_id: *mapped,
                }
                .encode();
                let v = MirrorProducerClaimValue {
                    origin_cluster_id: origin.source_cluster.0,
                    original_pid: origin.original_pid,
                    timestamp_ms: now,
                    unknown_tagged_fields: Vec::new(),
                }
                .encode()?;
                records.push((k, Some(v)));
            }
        }
        let n = records.len();
        self.append_claims(records).await?;
        self.metrics
            .state_store_ops
            .get_or_create(&KindLabels {
                listener: "__mirror_state".into(),
                kind: "claim",
            })
            .inc_by(n as u64);
        let mut claimed = self.claimed.lock().unwrap_or_else(|p| p.into_inner());
        for ((pk, new), topic_id) in claims.into_iter().zip(ids) {
            // In the state before it is a live claim record: the snapshot
            // loop tombstones claim records whose producer left the state.
            self.registry.partition(&pk).with(|s| {
                for (mapped, origin) in &new {
                    s.claim(*mapped, *origin, now);
                }
            });
            let set = claimed.entry(pk).or_default();
            set.topic_id = topic_id;
            set.pids.extend(new);
        }
        Ok(())
    }

    /// Tombstones the claim records of `pk` no longer needed: producers a
    /// snapshot just written holds (`in_snapshot`), and producers that left
    /// the state (expired, reset by a barrier, sealed). A producer claimed
    /// again meanwhile gets its claim written again after the tombstone.
    pub(super) async fn tombstone_claims(
        &self,
        pk: &PartitionKey,
        in_snapshot: &std::collections::HashSet<i64>,
    ) -> Result<usize, SyncError> {
        let handle = self.registry.get(pk);
        let (topic_id, gone): (_, Vec<(i64, Origin)>) = {
            let claimed = self.claimed.lock().unwrap_or_else(|p| p.into_inner());
            let Some(set) = claimed.get(pk) else {
                return Ok(0);
            };
            let held = |pid: i64, o: &Origin| {
                handle
                    .as_ref()
                    .is_some_and(|h| h.with(|s| s.holder_of(pid) == Some(*o)))
            };
            (
                set.topic_id,
                set.pids
                    .iter()
                    .filter(|(pid, o)| in_snapshot.contains(pid) || !held(**pid, o))
                    .map(|(p, o)| (*p, *o))
                    .collect(),
            )
        };
        if gone.is_empty() {
            return Ok(0);
        }
        let key = |pid: i64| {
            MirrorProducerClaimKey {
                topic_id,
                partition: pk.partition,
                producer_id: pid,
            }
            .encode()
        };
        self.append_claims(gone.iter().map(|(pid, _)| (key(*pid), None)).collect())
            .await?;
        self.count("claim_tombstone");
        {
            let mut claimed = self.claimed.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(set) = claimed.get_mut(pk) {
                for (pid, o) in &gone {
                    if set.pids.get(pid) == Some(o) {
                        set.pids.remove(pid);
                    }
                }
                if set.pids.is_empty() {
                    claimed.remove(pk);
                }
            }
        }
        // Re-claimed since the pass looked (written before our tombstone):
        // write the claim again so the log's last record for it is a claim.
        let again: Vec<(i64, Origin)> = match &handle {
            Some(h) => h.with(|s| {
                gone.iter()
                    .filter(|(pid, _)| !in_snapshot.contains(pid))
                    .filter_map(|(pid, _)| s.producer(*pid).map(|e| (*pid, e.origin)))
                    .collect()
            }),
            None => Vec::new(),
        };
        if !again.is_empty() {
            self.persist_claim_records(vec![(pk.clone(), again)])
                .await?;
        }
        Ok(gone.len())
    }

    pub(super) async fn persist_entry(
        self: Arc<Self>,
        entry: Entry,
    ) -> Result<[u8; 16], SyncError> {
        let topic_id = self.topic_id_for(&entry.topic).await?;
        // The open transactions of a seal go first: a STOPPING record with a
        // cut is only ever read back with its snapshot present. Too many for
        // one type-5 record (about 3,900), they go as a chunk generation
        // (type 7), each record below MAX_SNAPSHOT_BYTES.
        let mut seal_chunks = None;
        if let Some(snapshot) = self.seal_snapshot(&entry, topic_id)? {
            match snapshot {
                SealSnapshot::Record(k, v) => {
                    self.append_record(k, v).await?;
                }
                SealSnapshot::Chunked { value, closings } => {
                    let generation = self.next_chunk_generation(crate::lifecycle::now_ms());
                    let (keys, records) = chunk_records(
                        topic_id,
                        entry.partition,
                        generation,
                        &value,
                        closings.as_ref(),
                    )?;
                    self.append_claims(records).await?;
                    self.count("seal_snapshot_chunked");
                    tracing::info!(topic = %entry.topic, partition = entry.partition,
                        cut = value.snapshot_offset, open_transactions = value.producers.len(),
                        chunks = keys.len(), generation,
                        "seal's open transactions written as a chunked snapshot");
                    seal_chunks = Some(keys);
                }
            }
        }
        let (k, v) = state_record(&entry, topic_id)?;
        let offset = self.append_record(k, v).await?;
        tracing::debug!(offset, topic = %entry.topic, partition = entry.partition,
            state = entry.state.name(), "partition state persisted");
        if let Some(keys) = seal_chunks {
            // The seal's chunks are the partition's live generation now; older
            // ones are superseded. The seal is durable already: a failure here
            // only leaves older chunks for a later snapshot to tombstone.
            let pk = PartitionKey::new([0; 16], entry.topic.as_str(), entry.partition);
            if let Err(e) = self.tombstone_old_chunks(&pk, keys).await {
                tracing::warn!(partition = %pk, error = %e,
                    "older producer-state chunks not tombstoned after the seal");
            }
        }
        Ok(topic_id)
    }

    /// The snapshot a seal's STOPPING record (with its cut) must find: its
    /// open transactions, with the closings below the cut (the seal planned
    /// again further back after a restart, or by another instance, needs the
    /// transactions they closed). One type-5 record, or a chunk generation
    /// (type 7) when too many for one (about 3,900). `None`: the entry has
    /// no seal to snapshot.
    fn seal_snapshot(
        &self,
        entry: &Entry,
        topic_id: [u8; 16],
    ) -> Result<Option<SealSnapshot>, SyncError> {
        let (LifecycleState::Stopping, Some(cut), Some(plan)) =
            (entry.state, entry.cut, &entry.seal)
        else {
            return Ok(None);
        };
        let mut value = MirrorProducerSnapshotValue {
            snapshot_offset: cut,
            producers: plan
                .open_txns
                .iter()
                .map(|t| SnapshotProducer {
                    producer_id: t.producer_id,
                    origin_cluster_id: t.origin_cluster,
                    original_pid: t.original_pid,
                    producer_epoch: t.producer_epoch,
                    last_sequence: -1,
                    last_offset: -1,
                    coordinator_epoch: t.coordinator_epoch,
                    txn_first_offset: t.first_offset,
                    last_timestamp: -1,
                })
                .collect(),
            unknown_tagged_fields: Vec::new(),
        };
        let pk = PartitionKey::new([0; 16], entry.topic.as_str(), entry.partition);
        let closings = self
            .registry
            .get(&pk)
            .and_then(|h| h.with(|s| s.closings_at_cut(cut)));
        if needs_chunks(value.producers.len()) {
            return Ok(Some(SealSnapshot::Chunked { value, closings }));
        }
        if let Some(tag) = closings
            .and_then(|c| snapshots::encode_closings(&c, value.producers.len(), MAX_SNAPSHOT_BYTES))
        {
            value.unknown_tagged_fields.push(tag?);
        }
        let key = MirrorProducerSnapshotKey {
            topic_id,
            partition: entry.partition,
        };
        Ok(Some(SealSnapshot::Record(key.encode(), value.encode()?)))
    }

    /// Persists the life-cycle records of many partitions in as few Produce
    /// requests as the 256 KiB bound allows, each seal's snapshot record
    /// just before its state record (as [`Self::persist_entry`] writes
    /// them); returns each entry's destination topic id, in order. A batch
    /// holding a seal too large for one snapshot record (chunks) goes one by
    /// one through [`Self::persist_entry`].
    pub(super) async fn persist_entries(
        self: Arc<Self>,
        entries: Vec<Entry>,
    ) -> Result<Vec<[u8; 16]>, SyncError> {
        let mut ids = Vec::with_capacity(entries.len());
        let mut records = Vec::with_capacity(entries.len());
        for e in &entries {
            let topic_id = self.topic_id_for(&e.topic).await?;
            match self.seal_snapshot(e, topic_id)? {
                Some(SealSnapshot::Chunked { .. }) => {
                    let mut ids = Vec::with_capacity(entries.len());
                    for e in entries {
                        ids.push(self.clone().persist_entry(e).await?);
                    }
                    return Ok(ids);
                }
                Some(SealSnapshot::Record(k, v)) => records.push((k, Some(v))),
                None => {}
            }
            let (k, v) = state_record(e, topic_id)?;
            ids.push(topic_id);
            records.push((k, Some(v)));
        }
        let keys: Vec<Vec<u8>> = records.iter().map(|(k, _)| k.clone()).collect();
        let offsets = self
            .store
            .append_many_at(records)
            .await
            .map_err(|e| self.append_failed(e))?;
        for (k, offset) in keys.iter().zip(&offsets) {
            self.advance(k, *offset);
        }
        self.count("append");
        tracing::debug!(records = offsets.len(), last = ?offsets.last(), "partition states persisted");
        Ok(ids)
    }

    pub(super) async fn persist_all(
        self: Arc<Self>,
        salts: Vec<PendingSalt>,
    ) -> Result<(), SyncError> {
        let mut last = -1;
        let mut written = Vec::with_capacity(salts.len());
        for p in &salts {
            let topic_id = match self.destination_topic_id(&p.partition.topic) {
                Some(id) => id,
                None => {
                    self.refresh_destination_topics()
                        .await
                        .map_err(SyncError::Read)?;
                    self.destination_topic_id(&p.partition.topic)
                        .ok_or_else(|| SyncError::NoTopicForSalt(p.partition.topic.to_string()))?
                }
            };
            let key = MirrorPidCollisionKey {
                topic_id,
                partition: p.partition.partition,
                source_cluster_id: p.origin.source_cluster.to_string(),
                original_pid: p.origin.original_pid,
            };
            let value = MirrorPidCollisionValue {
                salt: p.choice.salt,
                colliding_cluster_id: p.choice.holder.source_cluster.to_string(),
                timestamp_ms: p.timestamp_ms,
                unknown_tagged_fields: Vec::new(),
            };
            let key = key.encode()?;
            let value = value.encode()?;
            let key_copy = key.clone();
            // Not `append_record`: the catch-up below must read this record
            // back and apply whichever record for the key is lowest.
            let offset = self
                .store
                .append(key_copy, Some(value))
                .await
                .map_err(|e| {
                    self.count("append_error");
                    SyncError::Store(e)
                })?;
            self.count("append");
            tracing::info!(partition = %p.partition, origin = %p.origin, salt = p.choice.salt,
                mapped_pid = p.choice.mapped_pid, offset, "collision salt persisted to __mirror_state");
            last = last.max(offset);
            written.push((p.partition.clone(), p.origin, key, offset, p.choice.salt));
        }
        self.catch_up(Some(last)).await.map_err(SyncError::Read)?;
        // Compaction keeps the LAST record of a key while readers take the
        // LOWEST: when another instance's record with a different salt won,
        // write the winner again so compaction cannot leave the loser behind.
        for (partition, origin, key, offset, our_salt) in written {
            let winner = self
                .registry
                .partition(&partition)
                .with(|s| s.salts().record_for(&origin).copied());
            let Some(w) = winner else { continue };
            // Ours won, or the racer chose the same salt: either record may stay.
            if w.record_offset == offset || w.salt == our_salt {
                continue;
            }
            let value = MirrorPidCollisionValue {
                salt: w.salt,
                colliding_cluster_id: w.colliding_cluster.to_string(),
                timestamp_ms: w.timestamp_ms,
                unknown_tagged_fields: Vec::new(),
            }
            .encode()?;
            tracing::info!(%partition, %origin, winner_offset = w.record_offset, ours = offset,
                salt = w.salt, "another instance's salt record won; re-asserting it so compaction keeps it");
            self.store.append(key, Some(value)).await.map_err(|e| {
                self.count("append_error");
                SyncError::Store(e)
            })?;
            self.count("append");
        }
        Ok(())
    }
}

impl SaltStore for StateSync {
    fn durable(&self) -> bool {
        true
    }

    fn persist_claims(
        &self,
        claims: Vec<(PartitionKey, Vec<(i64, Origin)>)>,
    ) -> crate::BoxFuture<'static, Result<(), PersistError>> {
        let me = self.me.upgrade();
        Box::pin(async move {
            let me = me.ok_or(SyncError::ShuttingDown)?;
            Ok(me.persist_claim_records(claims).await?)
        })
    }

    fn topic_id(&self, topic: &str) -> Option<[u8; 16]> {
        self.destination_topic_id(topic)
    }

    fn shared(&self) -> bool {
        true
    }

    fn take_over(
        &self,
        mirror: &str,
        jobs: Vec<crate::mirror::handover::TakeOver>,
    ) -> crate::BoxFuture<
        'static,
        Result<Vec<Option<crate::mirror::handover::ServedBy>>, PersistError>,
    > {
        let me = self.me.upgrade();
        let mirror = mirror.to_string();
        Box::pin(async move {
            let me = me.ok_or(SyncError::ShuttingDown)?;
            Ok(me.take_over_partitions(mirror, jobs).await?)
        })
    }

    fn read_state(&self) -> crate::BoxFuture<'static, Result<(), PersistError>> {
        let me = self.me.upgrade();
        Box::pin(async move {
            let me = me.ok_or(SyncError::ShuttingDown)?;
            me.catch_up(None).await.map_err(SyncError::Read)?;
            Ok(())
        })
    }

    fn served_by(&self, key: &PartitionKey) -> Option<crate::mirror::handover::ServedBy> {
        self.serving_of(key)
    }

    fn instance_id(&self) -> Option<String> {
        self.instance_id.get().cloned()
    }

    fn persist_topology(
        &self,
        mirror: &str,
        topology: crate::mirror::offline::Topology,
    ) -> crate::BoxFuture<'static, Result<(), PersistError>> {
        let me = self.me.upgrade();
        let mirror = mirror.to_string();
        Box::pin(async move {
            let me = me.ok_or(SyncError::ShuttingDown)?;
            Ok(me.write_topology(mirror, topology).await?)
        })
    }

    fn refresh_topic_ids(&self) -> crate::BoxFuture<'static, Result<(), PersistError>> {
        let me = self.me.upgrade();
        Box::pin(async move {
            let me = me.ok_or(SyncError::ShuttingDown)?;
            me.refresh_destination_topics()
                .await
                .map_err(SyncError::Read)?;
            Ok(())
        })
    }

    fn persist(
        &self,
        salts: Vec<PendingSalt>,
    ) -> crate::BoxFuture<'static, Result<(), PersistError>> {
        let me = self.me.upgrade();
        Box::pin(async move {
            match me {
                Some(me) => Ok(me.persist_all(salts).await?),
                None => Err(SyncError::ShuttingDown.into()),
            }
        })
    }
}

impl TransitionStore for StateSync {
    fn missing_destination_topics(
        &self,
        topics: Vec<String>,
    ) -> crate::BoxFuture<'static, Result<Vec<String>, PersistError>> {
        let me = self.me.upgrade();
        Box::pin(async move {
            let Some(me) = me else {
                return Err(SyncError::ShuttingDown.into());
            };
            let unknown = |me: &StateSync| -> Vec<String> {
                topics
                    .iter()
                    .filter(|t| me.destination_topic_id(t).is_none())
                    .cloned()
                    .collect()
            };
            if unknown(&me).is_empty() {
                return Ok(Vec::new());
            }
            me.refresh_destination_topics()
                .await
                .map_err(SyncError::Read)?;
            Ok(unknown(&me))
        })
    }

    fn persist_many(
        &self,
        entries: Vec<Entry>,
    ) -> crate::BoxFuture<'static, Result<Vec<[u8; 16]>, PersistError>> {
        let me = self.me.upgrade();
        Box::pin(async move {
            match me {
                Some(me) => Ok(me.persist_entries(entries).await?),
                None => Err(SyncError::ShuttingDown.into()),
            }
        })
    }
}

/// A seal's snapshot of its open transactions, as written.
enum SealSnapshot {
    /// One type-5 record: (key, value) encoded.
    Record(Vec<u8>, Vec<u8>),
    /// Too many producers for one record: written as a chunk generation.
    Chunked {
        value: MirrorProducerSnapshotValue,
        closings: Option<ps::ClosingsSnapshot>,
    },
}

/// The life-cycle record (type 4) of `entry`, keyed by its destination
/// topic id: (key, value) encoded.
fn state_record(entry: &Entry, topic_id: [u8; 16]) -> Result<(Vec<u8>, Vec<u8>), SyncError> {
    let key = MirrorPartitionStateKey {
        topic_id,
        partition: entry.partition,
    };
    let value = MirrorPartitionStateValue {
        mirror: entry.mirror.clone(),
        topic_name: entry.topic.clone(),
        state: entry.state.into(),
        source_cluster_id: entry.source_cluster_id.clone(),
        cut_offset: entry.cut.unwrap_or(-1),
        seal_batches: entry.seal_batches.unwrap_or(-1),
        reason: entry.reason.clone(),
        timestamp_ms: entry.since_ms,
        unknown_tagged_fields: episode_fields(entry).encode_tags()?,
    };
    Ok((key.encode(), value.encode()?))
}

/// The episode fields of `entry`'s life-cycle record.
pub(super) fn episode_fields(entry: &Entry) -> crate::state_store::schema::EpisodeFields {
    crate::state_store::schema::EpisodeFields {
        episode: entry.episode,
        start: entry.episode_start,
        leader_epoch: entry.leader_epoch,
        history: entry
            .history
            .iter()
            .map(|h| crate::state_store::schema::EpisodeRecord {
                episode: h.episode,
                mirror: h.mirror.clone(),
                source_cluster_id: h.source_cluster_id.clone(),
                state: h.state.into(),
                cut_offset: h.cut.unwrap_or(-1),
                seal_batches: h.seal_batches.unwrap_or(-1),
                leader_epoch: h.leader_epoch.unwrap_or(-1),
                start_offset: h.start.unwrap_or(-1),
                ended_ms: h.ended_ms,
            })
            .collect(),
    }
}
