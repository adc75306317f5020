//! Who serves which partition (record type 9, `schema::serving`): the
//! serving records this instance writes when it takes a partition over,
//! and those of other instances, which make its own state of the partition
//! stale (see `mirror::handover`).

use super::*;
use crate::state_store::schema::serving::{MirrorPartitionServingKey, MirrorPartitionServingValue};

/// Serving records per Produce request of a take-over: at most ~700 bytes
/// each (names of Kafka's maximum length), so a group stays one batch well
/// below the 256 KiB append bound.
pub const SERVING_PER_APPEND: usize = 200;

impl StateSync {
    /// Names this instance in the serving records it writes.
    pub fn set_instance_id(&self, id: String) {
        let _ = self.instance_id.set(id);
    }

    fn my_id(&self) -> &str {
        self.instance_id.get().map_or("", String::as_str)
    }

    /// Whether another instance took `key` over since this one started and
    /// this one has not taken it back (its state here is stale).
    pub(super) fn stale_here(&self, key: &PartitionKey) -> bool {
        self.stale
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(key)
    }

    /// Applies a serving record: remembered for `GET /v1/partitions`; one
    /// of another instance read by the tail makes the mirrors drop the
    /// partition (their state of it is stale from now on).
    pub(super) fn apply_serving(&self, r: &StoredRecord, start_up: bool) {
        let Some(value) = r.value.as_deref() else {
            return; // tombstone: nothing to remember
        };
        let decoded = MirrorPartitionServingKey::decode(&r.key)
            .and_then(|k| MirrorPartitionServingValue::decode(value).map(|v| (k, v)));
        let (key, value) = match decoded {
            Ok((k, Some(v))) => (k, v),
            Ok((_, None)) => {
                self.count("unknown_record_version");
                return;
            }
            Err(e) => {
                tracing::warn!(offset = r.offset, error = %e, "undecodable serving record skipped");
                return;
            }
        };
        let topic = self
            .destination_topic_name(&key.topic_id)
            .unwrap_or_else(|| value.topic_name.clone());
        let pk = PartitionKey::new([0; 16], topic, key.partition);
        let mine = value.instance_id == self.my_id();
        self.serving
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                pk.clone(),
                ServedBy {
                    instance_id: value.instance_id.clone(),
                    from_offset: value.from_offset,
                    since_ms: value.timestamp_ms,
                    snapshot_offset: None,
                },
            );
        if mine || start_up {
            // At start-up the state loaded is this instance's fresh view of
            // the partition, whoever served it last.
            return;
        }
        self.stale
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(pk.clone());
        let mirrors = self.mirrors.read().unwrap_or_else(|p| p.into_inner());
        for m in mirrors.iter() {
            if m.disown_stale(&pk) {
                tracing::info!(mirror = %m.name, partition = %pk, instance = %value.instance_id,
                    from_offset = value.from_offset,
                    "another instance serves the partition now; the state here is stale until a \
                     fetch here takes it over again");
            }
        }
    }

    /// Takes partitions over from whichever instances served them: reads
    /// the state to its end once (salts, life cycle, serving records,
    /// snapshots), restores another instance's snapshot newer than this
    /// instance's state of a partition (and not past its fetcher; a type-5
    /// record or a chunk generation) and applies their live claims, then
    /// persists this instance's serving records, [`SERVING_PER_APPEND`] per
    /// Produce request. Returns each partition's previous serving record.
    pub(super) async fn take_over_partitions(
        &self,
        mirror: String,
        jobs: Vec<crate::mirror::handover::TakeOver>,
    ) -> Result<Vec<Option<ServedBy>>, SyncError> {
        self.catch_up(None).await.map_err(SyncError::Read)?;
        let now = crate::lifecycle::now_ms();
        let mut previous = Vec::with_capacity(jobs.len());
        let mut records = Vec::with_capacity(jobs.len());
        for job in &jobs {
            previous.push(self.serving_of(&job.key));
            let topic_id = self.topic_id_for(&job.key.topic).await?;
            // The replay then starts at their snapshot, not at our older
            // state (or at the log start for a partition never served).
            let (restored, claims) = self
                .restore_from_others(&job.key, topic_id, job.from_offset)
                .await?;
            tracing::debug!(partition = %job.key, restored, claims,
                "other instances' producer state applied before taking the partition over");
            let k = MirrorPartitionServingKey {
                topic_id,
                partition: job.key.partition,
            };
            let v = MirrorPartitionServingValue {
                instance_id: self.my_id().to_string(),
                mirror: mirror.clone(),
                topic_name: job.key.topic.to_string(),
                from_offset: job.from_offset,
                timestamp_ms: now,
            };
            records.push((k.encode(), Some(v.encode()?)));
        }
        for group in records.chunks(SERVING_PER_APPEND) {
            let last = self
                .store
                .append_many(group.to_vec())
                .await
                .map_err(|e| self.append_failed(e))?;
            self.count("append");
            // One batch: no other record lies between these, so the tail
            // skips any older record of these keys (another instance's,
            // written before ours) and our own.
            for (key, _) in group {
                self.advance(key, last);
            }
        }
        let mut stale = self.stale.lock().unwrap_or_else(|p| p.into_inner());
        let mut serving = self.serving.lock().unwrap_or_else(|p| p.into_inner());
        for job in jobs {
            stale.remove(&job.key);
            serving.insert(
                job.key,
                ServedBy {
                    instance_id: self.my_id().to_string(),
                    from_offset: job.from_offset,
                    since_ms: now,
                    snapshot_offset: None,
                },
            );
            self.count("take_over");
        }
        Ok(previous)
    }

    /// The latest serving record of `key`, with the offset of the latest
    /// snapshot of it written here or read from another instance.
    pub(super) fn serving_of(&self, key: &PartitionKey) -> Option<ServedBy> {
        let mut by = self
            .serving
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned()?;
        let own = self
            .snapshotted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .map(|(offset, _)| *offset);
        let other = self
            .destination_topic_id(&key.topic)
            .and_then(|id| self.others_snapshot_offset((id, key.partition)));
        by.snapshot_offset = own.max(other);
        Some(by)
    }

    /// Forgets who serves partitions that left the producer state (their
    /// destination topic was deleted), here and in the mirrors.
    pub(super) fn forget_serving(&self, keys: &[PartitionKey]) {
        let mut stale = self.stale.lock().unwrap_or_else(|p| p.into_inner());
        let mut serving = self.serving.lock().unwrap_or_else(|p| p.into_inner());
        let mirrors = self.mirrors.read().unwrap_or_else(|p| p.into_inner());
        for k in keys {
            stale.remove(k);
            serving.remove(k);
            for m in mirrors.iter() {
                m.forget_partition(k);
            }
        }
    }
}
