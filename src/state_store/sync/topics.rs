//! The destination cluster's topic listing: names and ids of destination
//! topics (records are keyed by topic id), deleted topics leaving the
//! producer state, and records kept until their topic's name is known.

use super::*;

impl StateSync {
    /// Re-reads the destination cluster's topic names and ids.
    pub(super) async fn refresh_destination_topics(&self) -> anyhow::Result<()> {
        let view = crate::proxy::refresh::fetch_cluster_view(
            &self.dest_bootstrap,
            &self.dest_connector,
            Duration::from_secs(5),
            crate::config::DEFAULT_MAX_FRAME_BYTES as usize,
        )
        .await?;
        let mut gone: Vec<(String, &'static str)> = Vec::new();
        {
            let mut t = self.dest_topics.write().unwrap_or_else(|p| p.into_inner());
            let mut missing = self.missing_since.lock().unwrap_or_else(|p| p.into_inner());
            let listed: std::collections::HashMap<&str, [u8; 16]> = view
                .topics
                .iter()
                .map(|(name, id, _)| (name.as_str(), *id))
                .collect();
            let now = std::time::Instant::now();
            for (name, old_id) in &t.by_name {
                match listed.get(name.as_str()) {
                    // Deleted and created again: the old one's state is gone.
                    Some(id) if id != old_id && *id != [0; 16] => {
                        gone.push((name.clone(), "its topic id changed"))
                    }
                    Some(_) => {}
                    None => {
                        let since = *missing.entry(name.clone()).or_insert(now);
                        if now.duration_since(since) >= DELETION_CONFIRM {
                            gone.push((name.clone(), "the destination no longer lists it"));
                        }
                    }
                }
            }
            missing.retain(|name, _| !listed.contains_key(name.as_str()));
            for (name, _) in &gone {
                missing.remove(name);
                if let Some(id) = t.by_name.remove(name) {
                    t.by_id.remove(&id);
                    self.forget_others_of(id);
                }
            }
            for (name, id, _partitions) in view.topics {
                t.by_id.insert(id, name.clone());
                t.by_name.insert(name, id);
            }
        }
        // Life-cycle entries of an earlier topic of a listed name (deleted
        // and created again: a new partition) no longer apply to it.
        if let Some(lifecycle) = self.lifecycle.get() {
            let listed: Vec<(String, [u8; 16])> = {
                let t = self.dest_topics.read().unwrap_or_else(|p| p.into_inner());
                t.by_name.iter().map(|(n, id)| (n.clone(), *id)).collect()
            };
            for (name, id) in listed {
                let dropped = lifecycle.drop_other_topic_ids(&name, id);
                if dropped.is_empty() {
                    continue;
                }
                self.count("partition_state_of_deleted_topic");
                tracing::info!(topic = %name, entries = dropped.len(),
                    "life-cycle entries of an earlier topic of this name (deleted and created again) \
                     dropped: the new topic's partitions start MIRRORING (the old records stay in \
                     __mirror_state)");
                if !gone.iter().any(|(n, _)| *n == name) {
                    gone.push((name, "its topic id changed"));
                }
            }
        }
        for (name, why) in gone {
            self.forget_destination_topic(&name, why);
        }
        self.apply_pending();
        Ok(())
    }

    /// Drops the producer state of a deleted destination topic's
    /// partitions (their life-cycle records, a seal's included, stay), so
    /// topic churn cannot exhaust `max_partitions`. Claim records of the
    /// dropped producers are tombstoned by the next snapshot round.
    pub(super) fn forget_destination_topic(&self, topic: &str, why: &str) {
        // A controlled partition (pausing, sealing, sealed) keeps its state
        // with its life-cycle record: a seal in progress needs its open
        // transactions should the topic be listed again.
        let keep = |k: &PartitionKey| self.is_controlled(k);
        let dropped = self.registry.remove_topic(topic, &keep);
        self.forget_partitions(&dropped);
        self.count("destination_topic_deleted");
        tracing::info!(topic, partitions = dropped.len(), reason = why,
            "destination topic deleted: its partitions leave the producer state              (life-cycle records stay)");
    }

    /// Whether `k` has a life-cycle entry other than MIRRORING.
    pub(super) fn is_controlled(&self, k: &PartitionKey) -> bool {
        self.lifecycle
            .get()
            .and_then(|l| l.get(k))
            .is_some_and(|e| e.state != LifecycleState::Mirroring)
    }

    /// Forgets the snapshot bookkeeping of partitions dropped from the state.
    pub(super) fn forget_partitions(&self, keys: &[PartitionKey]) {
        if keys.is_empty() {
            return;
        }
        let mut snapshotted = self.snapshotted.lock().unwrap_or_else(|p| p.into_inner());
        let mut chunked = self.chunked_at.lock().unwrap_or_else(|p| p.into_inner());
        for k in keys {
            snapshotted.remove(k);
            chunked.remove(k);
        }
        drop((snapshotted, chunked));
        self.forget_serving(keys);
    }

    /// Applies the kept records of topic ids that are known now.
    pub(super) fn apply_pending(&self) {
        let ready: Vec<([u8; 16], Vec<KeptRecord>)> = {
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            let known: Vec<[u8; 16]> = pending
                .keys()
                .filter(|id| self.destination_topic_name(id).is_some())
                .copied()
                .collect();
            known
                .into_iter()
                .filter_map(|id| pending.remove(&id).map(|v| (id, v)))
                .collect()
        };
        for (id, records) in ready {
            tracing::info!(topic_id = %ps::ClusterId(id), records = records.len(),
                "destination topic now known: applying the __mirror_state records kept for it");
            for (r, start_up) in &records {
                self.apply_record(r, *start_up);
            }
        }
    }

    /// Keeps a record of a topic id not known yet; true if it was kept.
    pub(super) fn keep_pending(&self, topic_id: [u8; 16], r: &StoredRecord, start_up: bool) {
        self.count("pending_unknown_topic");
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let list = pending.entry(topic_id).or_default();
        if list.is_empty() {
            tracing::warn!(offset = r.offset, topic_id = %ps::ClusterId(topic_id),
                "__mirror_state record for a topic id the destination does not list (yet); kept \
                 and applied when the topic appears");
        }
        // Kept for long: its own copy, not a slice of a whole response.
        list.push((r.detached(), start_up));
    }

    /// Number of records kept for topic ids not known yet.
    pub fn pending_records(&self) -> usize {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(Vec::len)
            .sum()
    }

    pub(super) fn destination_topic_id(&self, name: &str) -> Option<[u8; 16]> {
        let t = self.dest_topics.read().unwrap_or_else(|p| p.into_inner());
        t.by_name.get(name).copied()
    }

    /// The name of destination topic `id` in the last listing read (the
    /// guard maps DeleteTopics' topic ids with it).
    pub fn destination_topic_name_of(&self, id: &[u8; 16]) -> Option<String> {
        self.destination_topic_name(id)
    }

    pub(super) fn destination_topic_name(&self, id: &[u8; 16]) -> Option<String> {
        let t = self.dest_topics.read().unwrap_or_else(|p| p.into_inner());
        t.by_id.get(id).cloned()
    }

    pub(super) async fn topic_id_for(&self, topic: &str) -> Result<[u8; 16], SyncError> {
        if let Some(id) = self.destination_topic_id(topic) {
            return Ok(id);
        }
        self.refresh_destination_topics()
            .await
            .map_err(SyncError::Read)?;
        self.destination_topic_id(topic)
            .ok_or_else(|| SyncError::UnknownTopic(topic.to_string()))
    }
}
