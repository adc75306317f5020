//! Producer-state snapshots (type 5): the periodic snapshot round, writing
//! one partition's snapshot, and restoring a snapshot read back.

use super::*;

/// The open transactions among a snapshot's producers.
pub(super) fn open_txns_of(producers: &[SnapshotProducer]) -> Vec<OpenTxn> {
    producers
        .iter()
        .filter(|p| p.txn_first_offset >= 0)
        .map(|p| OpenTxn {
            producer_id: p.producer_id,
            producer_epoch: p.producer_epoch,
            coordinator_epoch: p.coordinator_epoch,
            first_offset: p.txn_first_offset,
            origin_cluster: p.origin_cluster_id,
            original_pid: p.original_pid,
        })
        .collect()
}

/// The closings of `snap` as the snapshot record's tagged field, as many as
/// the record holds below `max_bytes` (see [`encode_closings`]).
pub(super) fn closings_tag(
    snap: &ps::PartitionSnapshot,
    max_bytes: usize,
) -> Option<Result<crate::state_store::schema::RawTaggedField, SyncError>> {
    encode_closings(snap.closings.as_ref()?, snap.producers.len(), max_bytes)
}

/// `c` as the tagged field of a snapshot record with `producers` producers:
/// the newest closings the record holds below `max_bytes`, the older ones
/// left out and reported as possibly missing (`DroppedUpto`); `None` when
/// not one fits (the record goes without: a restore then reports a cut
/// below its offset as possibly incomplete).
pub(super) fn encode_closings(
    c: &ps::ClosingsSnapshot,
    producers: usize,
    max_bytes: usize,
) -> Option<Result<crate::state_store::schema::RawTaggedField, SyncError>> {
    let base = 64usize.saturating_add(producers.saturating_mul(67));
    let room = max_bytes.saturating_sub(base) / 55;
    if base > max_bytes || (room == 0 && !c.closed.is_empty()) {
        return None;
    }
    // Closings are in marker offset order: the oldest are left out.
    let skip = c.closed.len().saturating_sub(room);
    let dropped_upto = match skip.checked_sub(1) {
        Some(i) => c.dropped_upto.max(c.closed[i].marker_offset),
        None => c.dropped_upto,
    };
    let value = crate::state_store::schema::SnapshotClosings {
        kept_from: c.kept_from,
        dropped_upto,
        closings: c.closed[skip..]
            .iter()
            .map(|t| crate::state_store::schema::SnapshotClosing {
                marker_offset: t.marker_offset,
                producer_id: t.txn.mapped_pid,
                producer_epoch: t.txn.epoch,
                first_offset: t.txn.first_offset,
                coordinator_epoch: t.coordinator_epoch,
                origin_cluster_id: t.txn.origin.source_cluster.0,
                original_pid: t.txn.origin.original_pid,
            })
            .collect(),
    };
    Some(value.encode_tag().map_err(SyncError::from))
}

/// The closings kept with a type-5 snapshot, if any (a malformed field is
/// treated as absent: the restore is then conservative).
pub(super) fn closings_from(value: &MirrorProducerSnapshotValue) -> Option<ps::ClosingsSnapshot> {
    let c = match crate::state_store::schema::SnapshotClosings::from_tags(
        &value.unknown_tagged_fields,
    ) {
        Ok(c) => c?,
        Err(e) => {
            tracing::warn!(error = %e, "transaction closings of a producer-state snapshot not read");
            return None;
        }
    };
    Some(ps::ClosingsSnapshot {
        kept_from: c.kept_from,
        dropped_upto: c.dropped_upto,
        closed: c
            .closings
            .iter()
            .map(|t| ps::ClosedTransaction {
                txn: ps::OpenTransaction {
                    mapped_pid: t.producer_id,
                    epoch: t.producer_epoch,
                    first_offset: t.first_offset,
                    origin: Origin {
                        source_cluster: ps::ClusterId(t.origin_cluster_id),
                        original_pid: t.original_pid,
                    },
                },
                coordinator_epoch: t.coordinator_epoch,
                marker_offset: t.marker_offset,
            })
            .collect(),
    })
}

impl StateSync {
    pub(super) fn apply_snapshot(
        &self,
        r: &StoredRecord,
        key: MirrorProducerSnapshotKey,
        value: MirrorProducerSnapshotValue,
        start_up: bool,
    ) {
        let open = open_txns_of(&value.producers);
        // The seal's open transactions are known by topic id: a restored
        // STOPPING partition finds them even before its topic's name.
        self.snapshots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((key.topic_id, key.partition), open);
        if !start_up {
            // Another instance's view (ours are skipped by the tail): where
            // it is, for a take-over of the partition by this instance.
            self.note_other_snapshot((key.topic_id, key.partition), r, value.snapshot_offset);
            return;
        }
        if self.loading.load(std::sync::atomic::Ordering::SeqCst) {
            self.type5_restored_at
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert((key.topic_id, key.partition), r.offset);
        }
        let Some(topic) = self.destination_topic_name(&key.topic_id) else {
            self.keep_pending(key.topic_id, r, start_up);
            return;
        };
        let pk = PartitionKey::new([0; 16], topic, key.partition);
        // Applied after start-up (its topic appeared later): only into a
        // partition whose live state has seen nothing yet.
        let fresh = self.loading.load(std::sync::atomic::Ordering::SeqCst)
            || self
                .registry
                .get(&pk)
                .is_none_or(|h| h.with(|s| s.producer_count() == 0 && s.next_offset() == 0));
        if fresh {
            self.restore_producers(&pk, &value);
        } else {
            tracing::warn!(partition = %pk, "producer-state snapshot of a topic that appeared after \
                start-up not restored: the partition already has live state");
        }
    }

    /// Restores a partition's shadow producer state from a snapshot read at
    /// start-up, keeping the salts already applied; returns whether the
    /// registry took it (a refused one leaves the state as it was).
    pub(super) fn restore_producers(
        &self,
        pk: &PartitionKey,
        value: &MirrorProducerSnapshotValue,
    ) -> bool {
        if let Some(floor) = self
            .episode_floor(pk)
            .filter(|f| value.snapshot_offset < *f)
        {
            // An earlier episode's state: this episode started empty.
            tracing::debug!(partition = %pk, snapshot_offset = value.snapshot_offset, floor,
                "producer-state snapshot of an earlier episode not restored");
            return false;
        }
        let now = crate::lifecycle::now_ms();
        let handle = self.registry.partition(pk);
        let salts: Vec<SaltRecord> = handle.with(|s| s.salts().records().collect());
        let snapshot = ps::PartitionSnapshot {
            version: ps::PARTITION_SNAPSHOT_VERSION,
            key: pk.clone(),
            next_offset: value.snapshot_offset,
            producers: value
                .producers
                .iter()
                .filter(|p| p.producer_id != -1)
                .map(|p| ps::ProducerSnapshotEntry {
                    mapped_pid: p.producer_id,
                    origin: Origin {
                        source_cluster: ps::ClusterId(p.origin_cluster_id),
                        original_pid: p.original_pid,
                    },
                    epoch: p.producer_epoch,
                    last_sequence: p.last_sequence,
                    last_offset: p.last_offset,
                    last_timestamp: p.last_timestamp,
                    last_seen_ms: now,
                    coordinator_epoch: p.coordinator_epoch,
                    transaction_first_offset: (p.txn_first_offset >= 0)
                        .then_some(p.txn_first_offset),
                })
                .collect(),
            salts,
            closings: closings_from(value),
        };
        if let Err(e) = self.registry.restore(&snapshot) {
            // A record no mirrorguard writes (a newer version, a corrupt
            // entry): the state stays as it was, and a take-over tries the
            // next candidate.
            tracing::warn!(partition = %pk, snapshot_offset = value.snapshot_offset, error = %e,
                "producer-state snapshot not restored");
            self.count("snapshot_restore_refused");
            return false;
        }
        tracing::info!(partition = %pk, producers = snapshot.producers.len(),
            upto = value.snapshot_offset, "producer state restored from __mirror_state");
        self.snapshotted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                pk.clone(),
                (value.snapshot_offset, snapshot.producers.len()),
            );
        true
    }

    /// Writes a producer-state snapshot (type 5) of every MIRRORING partition
    /// whose state moved since its last snapshot; returns how many.
    pub async fn snapshot_once(&self) -> anyhow::Result<usize> {
        self.snapshot_round(usize::MAX).await
    }

    /// Writes at most `limit` snapshots, continuing where the previous round
    /// stopped: with many partitions the appends are spread over rounds, so
    /// salt and life-cycle records (which wait on the fetch path and the
    /// admin API) never queue behind thousands of snapshots.
    pub(super) async fn snapshot_round(&self, limit: usize) -> anyhow::Result<usize> {
        let mut written = 0;
        let mut refreshed = false;
        let mut keys = self.registry.partition_keys();
        keys.sort_by(|a, b| (a.topic.as_ref(), a.partition).cmp(&(b.topic.as_ref(), b.partition)));
        let start = self
            .snapshot_cursor
            .load(std::sync::atomic::Ordering::Relaxed)
            % keys.len().max(1);
        keys.rotate_left(start);
        let mut visited = 0;
        for key in keys {
            if written >= limit {
                break;
            }
            visited += 1;
            if self.stale_here(&key) {
                // Another instance took it over: its snapshots are newer.
                continue;
            }
            if let Some(lc) = self.lifecycle.get() {
                // A partition with a seal keeps the seal's snapshot. A PAUSED
                // one, or one STOPPING and waiting for its cut, is written:
                // a seal after a restart without the source plans from it.
                if lc
                    .get(&key)
                    .is_some_and(|e| keeps_seal_snapshot(e.state, e.cut))
                {
                    continue;
                }
            }
            let Some(handle) = self.registry.get(&key) else {
                continue;
            };
            let snap = handle.with(|s| s.snapshot());
            let mark = (snap.next_offset, snap.producers.len());
            if self
                .snapshotted
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&key)
                == Some(&mark)
            {
                continue;
            }
            let topic_id = match self.destination_topic_id(&key.topic) {
                Some(id) => id,
                None if !refreshed => {
                    // A topic created since the last look: refresh once per round.
                    refreshed = true;
                    if let Err(e) = self.refresh_destination_topics().await {
                        tracing::debug!(error = %e, "destination topics not refreshed");
                    }
                    match self.destination_topic_id(&key.topic) {
                        Some(id) => id,
                        None => continue,
                    }
                }
                None => continue,
            };
            if self
                .write_snapshot(topic_id, &snap)
                .await
                .map_err(anyhow::Error::msg)?
            {
                written += 1;
                // The snapshot holds these producers: their claim records
                // are superseded.
                let held: std::collections::HashSet<i64> =
                    snap.producers.iter().map(|p| p.mapped_pid).collect();
                self.tombstone_claims(&key, &held)
                    .await
                    .map_err(anyhow::Error::msg)?;
            }
        }
        self.snapshot_cursor
            .fetch_add(visited, std::sync::atomic::Ordering::Relaxed);
        // Claims of producers that left the state (expired, reset by a
        // barrier, sealed) are no longer needed anywhere.
        let with_claims: Vec<PartitionKey> = self
            .claimed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect();
        let none = std::collections::HashSet::new();
        for pk in with_claims {
            self.tombstone_claims(&pk, &none)
                .await
                .map_err(anyhow::Error::msg)?;
        }
        Ok(written)
    }

    /// Appends one partition's producer-state snapshot and notes it: one
    /// type-5 record, or chunks (type 7) when that record would exceed
    /// [`MAX_SNAPSHOT_BYTES`]. True when written.
    pub(super) async fn write_snapshot(
        &self,
        topic_id: [u8; 16],
        snap: &ps::PartitionSnapshot,
    ) -> Result<bool, SyncError> {
        // A chunked snapshot rewrites every producer of the partition: write
        // one only when it supersedes claim records of at least a tenth of
        // the partition's producers (a trickle of new producers then costs
        // at most ~10x their own claims in snapshot bytes), when the
        // partition's open transactions changed (another instance taking it
        // over with the source gone seals from this snapshot), or when the
        // last one is older than CHUNKED_SNAPSHOT_MIN_AGE_MS, so a busy
        // partition of 100,000 idempotent producers does not rewrite ~7 MB
        // every round.
        let chunked = needs_chunks(snap.producers.len());
        if chunked {
            let has_claims = self
                .claimed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&snap.key)
                .is_some_and(|c| c.pids.len().saturating_mul(10) >= snap.producers.len());
            let last = self
                .chunked_at
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&snap.key)
                .copied();
            let now = crate::lifecycle::now_ms();
            if !chunked_snapshot_due(has_claims, last, now, open_txn_signature(snap)) {
                return Ok(false);
            }
        }
        let value = MirrorProducerSnapshotValue {
            snapshot_offset: snap.next_offset,
            producers: snap
                .producers
                .iter()
                .map(|p| SnapshotProducer {
                    producer_id: p.mapped_pid,
                    origin_cluster_id: p.origin.source_cluster.0,
                    original_pid: p.origin.original_pid,
                    producer_epoch: p.epoch,
                    last_sequence: p.last_sequence,
                    last_offset: p.last_offset,
                    coordinator_epoch: p.coordinator_epoch,
                    txn_first_offset: p.transaction_first_offset.unwrap_or(-1),
                    last_timestamp: p.last_timestamp,
                })
                .collect(),
            unknown_tagged_fields: Vec::new(),
        };
        let k = MirrorProducerSnapshotKey {
            topic_id,
            partition: snap.key.partition,
        }
        .encode();
        if chunked {
            return self.write_chunked_snapshot(topic_id, snap, value).await;
        }
        let mut value = value;
        if let Some(tag) = closings_tag(snap, MAX_SNAPSHOT_BYTES) {
            value.unknown_tagged_fields.push(tag?);
        }
        let v = value.encode()?;
        self.append_record(k, v).await?;
        self.snapshotted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(snap.key.clone(), (snap.next_offset, snap.producers.len()));
        self.tombstone_old_chunks(&snap.key, Vec::new()).await?;
        Ok(true)
    }

    /// Runs forever: periodic producer-state snapshots and idle expiry.
    pub async fn snapshot_loop(self: Arc<Self>, period: Duration) {
        loop {
            tokio::time::sleep(period).await;
            let now = crate::lifecycle::now_ms();
            let expired = self.registry.expire_idle(now);
            if expired > 0 {
                tracing::info!(
                    expired,
                    "idle producers expired from the shadow producer state"
                );
            }
            // Partitions left with nothing to track (a topic deleted on the
            // source only, once its producers expired as the destination
            // expires them) leave too; controlled ones keep their state.
            let keep = |k: &PartitionKey| self.is_controlled(k);
            let idle = self.registry.config().max_idle_ms;
            let dropped = self.registry.remove_idle_empty(now, idle, &keep);
            if !dropped.is_empty() {
                self.forget_partitions(&dropped);
                tracing::info!(
                    partitions = dropped.len(),
                    "idle partitions with no producer left the shadow producer state"
                );
            }
            if let Err(e) = self.snapshot_round(MAX_SNAPSHOTS_PER_ROUND).await {
                self.count("snapshot_error");
                tracing::warn!(error = %e, "producer-state snapshot to __mirror_state failed; will retry");
            }
        }
    }
}

/// Whether a partition's snapshot record is its seal's (written with the
/// STOPPING record that took the cut): periodic and shutdown snapshots never
/// overwrite it.
fn keeps_seal_snapshot(state: LifecycleState, cut: Option<i64>) -> bool {
    match state {
        LifecycleState::Mirroring | LifecycleState::Paused => false,
        LifecycleState::Stopping => cut.is_some(),
        // A state of a newer version: leave its records alone.
        LifecycleState::Stopped | LifecycleState::Failed | LifecycleState::Other(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Periodic and shutdown snapshots cover every partition without a seal
    /// (a seal after a restart without the source plans from them) and never
    /// overwrite a seal's.
    #[test]
    fn partitions_without_a_seal_are_snapshotted_and_a_seals_snapshot_is_kept() {
        use LifecycleState::*;
        for (state, cut, kept) in [
            (Mirroring, None, false),
            (Paused, None, false),
            (Stopping, None, false),
            (Stopping, Some(7), true),
            (Stopped, Some(7), true),
            (Failed, None, true),
            (Other(9), None, true),
        ] {
            assert_eq!(keeps_seal_snapshot(state, cut), kept, "{state:?} {cut:?}");
        }
    }

    /// A partition's closings go out with its type-5 snapshot and come back
    /// on restore; too large a record goes without them.
    #[test]
    fn closings_round_trip_through_the_snapshot_record() {
        let txn = ps::ClosedTransaction {
            txn: ps::OpenTransaction {
                mapped_pid: 5,
                epoch: 2,
                first_offset: 12,
                origin: Origin {
                    source_cluster: ps::ClusterId([9; 16]),
                    original_pid: 6,
                },
            },
            coordinator_epoch: 3,
            marker_offset: 44,
        };
        let closings = ps::ClosingsSnapshot {
            kept_from: 40,
            dropped_upto: -1,
            closed: vec![txn],
        };
        let snap = ps::PartitionSnapshot {
            version: ps::PARTITION_SNAPSHOT_VERSION,
            key: PartitionKey::new([1; 16], "t", 0),
            next_offset: 45,
            producers: Vec::new(),
            salts: Vec::new(),
            closings: Some(closings.clone()),
        };
        let tag = closings_tag(&snap, MAX_SNAPSHOT_BYTES).unwrap().unwrap();
        let value = MirrorProducerSnapshotValue {
            snapshot_offset: 45,
            producers: Vec::new(),
            unknown_tagged_fields: vec![tag],
        };
        assert_eq!(closings_from(&value), Some(closings));
        assert!(closings_tag(&snap, 100).is_none());
        let plain = MirrorProducerSnapshotValue {
            unknown_tagged_fields: Vec::new(),
            ..value
        };
        assert_eq!(closings_from(&plain), None);
    }

    /// Too many closings for the record: the newest go, the older ones are
    /// reported as possibly missing rather than the whole tag dropped.
    #[test]
    fn closings_are_trimmed_to_the_record_size() {
        let closed: Vec<ps::ClosedTransaction> = (0..3)
            .map(|i| ps::ClosedTransaction {
                txn: ps::OpenTransaction {
                    mapped_pid: 5 + i,
                    epoch: 0,
                    first_offset: 10 * i,
                    origin: Origin {
                        source_cluster: ps::ClusterId([9; 16]),
                        original_pid: i,
                    },
                },
                coordinator_epoch: 0,
                marker_offset: 10 * i + 5,
            })
            .collect();
        let c = ps::ClosingsSnapshot {
            kept_from: 0,
            dropped_upto: -1,
            closed: closed.clone(),
        };
        let value = |tag| MirrorProducerSnapshotValue {
            snapshot_offset: 30,
            producers: Vec::new(),
            unknown_tagged_fields: vec![tag],
        };
        // Room for two (and one producer).
        let tag = encode_closings(&c, 1, 64 + 67 + 2 * 55).unwrap().unwrap();
        let back = closings_from(&value(tag)).unwrap();
        assert_eq!((back.dropped_upto, back.closed), (5, closed[1..].to_vec()));
        // Room for all: unchanged.
        let tag = encode_closings(&c, 1, MAX_SNAPSHOT_BYTES).unwrap().unwrap();
        assert_eq!(closings_from(&value(tag)), Some(c.clone()));
        // Room for none: no tag.
        assert!(encode_closings(&c, 1, 64 + 67 + 54).is_none());
    }
}
