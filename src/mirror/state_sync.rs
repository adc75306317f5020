//! Keeps the shadow producer state's salt tables in step with `__mirror_state`.
//!
//! At start-up every collision record is read and applied before any mirror
//! listener accepts a connection; afterwards a tail loop applies records
//! written by other mirrorguard instances, so instances that raced on one
//! collision converge on the record at the lowest offset. Persisting a new
//! salt appends its record (acks=all, idempotent) and then reads the topic up
//! to and including that record before the salt may be used, so a lower
//! record written concurrently by another instance wins everywhere.

use std::sync::Arc;
use std::time::Duration;

use crate::metrics::{KindLabels, Metrics};
use crate::mirror::{map_with_salt, MirrorContext, PendingSalt, SaltStore};
use crate::pid::{self, Layout};
use crate::producer_state::{self as ps, Origin, PartitionKey, ProducerStateRegistry, SaltRecord};
use crate::state_store::schema::{
    decode, MirrorPidCollisionKey, MirrorPidCollisionValue, StateRecord,
};
use crate::state_store::{StateStore, StoredRecord};

/// The `__mirror_state` side of the mirrors.
pub struct StateSync {
    store: Arc<StateStore>,
    registry: Arc<ProducerStateRegistry>,
    mirrors: std::sync::RwLock<Vec<Arc<MirrorContext>>>,
    /// Next offset to read; the async mutex also serialises catch-ups.
    next_offset: tokio::sync::Mutex<i64>,
    metrics: Arc<Metrics>,
    me: std::sync::Weak<StateSync>,
    /// Bootstrap of the state (= destination) cluster, for its topic ids.
    state_bootstrap: Vec<(String, u16)>,
    dest_topics: std::sync::RwLock<DestinationTopics>,
}

/// Destination topic names and ids (collision records name topics by id,
/// the producer state by destination name).
#[derive(Default)]
struct DestinationTopics {
    by_name: std::collections::HashMap<String, [u8; 16]>,
    by_id: std::collections::HashMap<[u8; 16], String>,
}

impl StateSync {
    /// A sync over an opened store.
    pub fn new(
        store: Arc<StateStore>,
        registry: Arc<ProducerStateRegistry>,
        metrics: Arc<Metrics>,
        state_bootstrap: Vec<(String, u16)>,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| Self {
            store,
            registry,
            mirrors: Default::default(),
            next_offset: tokio::sync::Mutex::new(0),
            metrics,
            me: me.clone(),
            state_bootstrap,
            dest_topics: Default::default(),
        })
    }

    /// Registers a mirror (its layout is used to compute salted PIDs).
    pub fn add_mirror(&self, m: Arc<MirrorContext>) {
        self.mirrors
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(m);
    }

    fn count(&self, kind: &'static str) {
        self.metrics
            .state_store_ops
            .get_or_create(&KindLabels {
                listener: "__mirror_state".into(),
                kind,
            })
            .inc();
    }

    /// Re-reads the destination cluster's topic names and ids.
    async fn refresh_destination_topics(&self) -> anyhow::Result<()> {
        let view = crate::proxy::refresh::fetch_cluster_view(
            &self.state_bootstrap,
            Duration::from_secs(5),
            crate::config::DEFAULT_MAX_FRAME_BYTES as usize,
        )
        .await?;
        let mut t = self.dest_topics.write().unwrap_or_else(|p| p.into_inner());
        for (name, id) in view.topics {
            t.by_id.insert(id, name.clone());
            t.by_name.insert(name, id);
        }
        Ok(())
    }

    fn destination_topic_id(&self, name: &str) -> Option<[u8; 16]> {
        let t = self.dest_topics.read().unwrap_or_else(|p| p.into_inner());
        t.by_name.get(name).copied()
    }

    fn destination_topic_name(&self, id: &[u8; 16]) -> Option<String> {
        let t = self.dest_topics.read().unwrap_or_else(|p| p.into_inner());
        t.by_id.get(id).cloned()
    }

    /// Reads the whole topic and applies it; returns the records applied.
    pub async fn load(&self) -> anyhow::Result<usize> {
        if let Err(e) = self.refresh_destination_topics().await {
            tracing::warn!(error = %e, "cannot read destination topic ids; collision records of \
                unknown topics are applied when their topic appears");
        }
        let mut next = self.next_offset.lock().await;
        let records = self
            .store
            .read_all()
            .await
            .inspect_err(|_| self.count("load_error"))?;
        self.count("load");
        let mut applied = 0;
        for r in &records {
            applied += usize::from(self.apply(r));
            *next = (*next).max(r.offset + 1);
        }
        tracing::info!(
            records = records.len(),
            salts = applied,
            next_offset = *next,
            "__mirror_state loaded"
        );
        Ok(applied)
    }

    /// Reads new records until `upto` (inclusive) has been seen, or once if `None`.
    async fn catch_up(&self, upto: Option<i64>) -> anyhow::Result<()> {
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
        loop {
            tokio::time::sleep(period).await;
            if let Err(e) = self.catch_up(None).await {
                self.count("tail_error");
                tracing::warn!(error = %e, "reading __mirror_state failed; will retry");
            }
        }
    }

    fn layout_for(&self, cluster: &pid::ClusterId) -> (Layout, u32) {
        let mirrors = self.mirrors.read().unwrap_or_else(|p| p.into_inner());
        let layout = mirrors
            .iter()
            .find(|m| m.source().map(|s| s.id == *cluster).unwrap_or(false))
            .or_else(|| mirrors.first())
            .map(|m| m.layout)
            .unwrap_or(Layout::High);
        (layout, pid::fold(cluster))
    }

    /// Applies one stored record; true if it was a collision salt.
    fn apply(&self, r: &StoredRecord) -> bool {
        let Ok(rec) = decode(&r.key, r.value.as_deref()) else {
            tracing::warn!(
                offset = r.offset,
                "undecodable __mirror_state record skipped"
            );
            return false;
        };
        let StateRecord::PidCollision {
            key,
            value: Some(value),
        } = rec
        else {
            return false;
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
            tracing::warn!(offset = r.offset, topic_id = %ps::ClusterId(key.topic_id),
                "collision record for a topic id the destination does not list; skipped");
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

    async fn persist_all(self: Arc<Self>, salts: Vec<PendingSalt>) -> Result<(), String> {
        let mut last = -1;
        for p in &salts {
            let topic_id = match self.destination_topic_id(&p.partition.topic) {
                Some(id) => id,
                None => {
                    self.refresh_destination_topics()
                        .await
                        .map_err(|e| e.to_string())?;
                    self.destination_topic_id(&p.partition.topic)
                        .ok_or_else(|| {
                            format!(
                                "destination topic {:?} does not exist on the state cluster yet; \
                             a collision salt for it cannot be recorded",
                                p.partition.topic
                            )
                        })?
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
            let key = key.encode().map_err(|e| e.to_string())?;
            let value = value.encode().map_err(|e| e.to_string())?;
            let offset = self.store.append(key, Some(value)).await.map_err(|e| {
                self.count("append_error");
                e.to_string()
            })?;
            self.count("append");
            tracing::info!(partition = %p.partition, origin = %p.origin, salt = p.choice.salt,
                mapped_pid = p.choice.mapped_pid, offset, "collision salt persisted to __mirror_state");
            last = last.max(offset);
        }
        self.catch_up(Some(last)).await.map_err(|e| e.to_string())
    }
}

impl SaltStore for StateSync {
    fn persist(
        &self,
        salts: Vec<PendingSalt>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>> {
        let me = self.me.upgrade();
        Box::pin(async move {
            match me {
                Some(me) => me.persist_all(salts).await,
                None => Err("state store is shutting down".into()),
            }
        })
    }
}
