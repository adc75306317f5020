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

use crate::lifecycle::seal::OpenTxn;
use crate::lifecycle::{Entry, Lifecycle, TransitionStore};
use crate::metrics::{KindLabels, Metrics};
use crate::mirror::{map_with_salt, MirrorContext, PendingSalt, SaltStore};
use crate::pid::{self, Layout};
use crate::producer_state::{self as ps, Origin, PartitionKey, ProducerStateRegistry, SaltRecord};
use crate::state_store::schema::{
    decode, MirrorPartitionState, MirrorPartitionStateKey, MirrorPartitionStateValue,
    MirrorPidCollisionKey, MirrorPidCollisionValue, MirrorProducerClaimKey,
    MirrorProducerClaimValue, MirrorProducerSnapshotChunkKey, MirrorProducerSnapshotChunkValue,
    MirrorProducerSnapshotKey, MirrorProducerSnapshotValue, SnapshotProducer, StateRecord,
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
    /// Bootstrap of the destination cluster, for its topic ids (the state
    /// cluster may be another one).
    dest_bootstrap: Vec<(String, u16)>,
    dest_topics: std::sync::RwLock<DestinationTopics>,
    lifecycle: std::sync::OnceLock<Arc<Lifecycle>>,
    /// Open transactions of seals read back (type 5), by destination topic
    /// id and partition (known even before the topic's name is).
    snapshots: std::sync::Mutex<std::collections::HashMap<SnapshotKey, Vec<OpenTxn>>>,
    /// Salt and snapshot records of topic ids the destination does not list
    /// (yet), in offset order, with whether they were read at start-up:
    /// applied when the topic appears, never dropped.
    pending: std::sync::Mutex<std::collections::HashMap<[u8; 16], Vec<KeptRecord>>>,
    /// Highest offset applied or written per record key: the tail skips
    /// records at or below it, so reading back our own older records never
    /// moves a partition's state backwards.
    applied: std::sync::Mutex<std::collections::HashMap<Vec<u8>, i64>>,
    /// True while the start-up load runs: producer-state snapshots are
    /// restored only then (later ones are this process's own, or another
    /// instance's view, which must not overwrite live state).
    loading: std::sync::atomic::AtomicBool,
    /// Next offset of the last snapshot written per partition.
    snapshotted: std::sync::Mutex<std::collections::HashMap<PartitionKey, (i64, usize)>>,
    /// Where the next bounded snapshot round starts.
    snapshot_cursor: std::sync::atomic::AtomicUsize,
    /// Live producer-claim records (type 6) per partition: mapped PID →
    /// destination topic id. Tombstoned by the snapshot loop once a
    /// snapshot holds the producer or the producer left the state.
    claimed: std::sync::Mutex<std::collections::HashMap<PartitionKey, ClaimSet>>,
    /// Claim records read by the start-up load, applied after it (a type-5
    /// snapshot later in the topic replaces a partition's state, and must
    /// not drop claims made after it was written).
    deferred_claims: std::sync::Mutex<std::collections::HashMap<MirrorProducerClaimKey, KeptClaim>>,
    /// Live chunk records (type 7) per partition, tombstoned when a newer
    /// snapshot of the partition is written.
    live_chunks: std::sync::Mutex<
        std::collections::HashMap<PartitionKey, Vec<MirrorProducerSnapshotChunkKey>>,
    >,
    /// Last chunked-snapshot generation written or read.
    chunk_generation: std::sync::atomic::AtomicI64,
    /// Wall-clock ms of the last chunked snapshot written per partition.
    chunked_at: std::sync::Mutex<std::collections::HashMap<PartitionKey, i64>>,
    /// Chunks read at start-up, assembled per partition and generation.
    loaded_chunks: std::sync::Mutex<std::collections::HashMap<SnapshotKey, ChunkGenerations>>,
    /// Offset of the type-5 snapshot restored by the start-up load, per
    /// partition: a chunked snapshot restores only if it is later.
    type5_restored_at: std::sync::Mutex<std::collections::HashMap<SnapshotKey, i64>>,
    /// Destination topics known before and missing from the latest
    /// listings, since when: dropped once missing for [`DELETION_CONFIRM`]
    /// (one broker's listing may lag a topic just created).
    missing_since: std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
    /// Tail rounds between two periodic reads of the destination's topics.
    dest_refresh_rounds: std::sync::atomic::AtomicU64,
    /// The open transactions of the chunk generation being read per
    /// partition (start-up or tail): once complete they are the partition's
    /// latest snapshot in `snapshots`, as a type-5 record would be (a seal
    /// with too many open transactions for one record is written in chunks).
    open_chunks: std::sync::Mutex<std::collections::HashMap<SnapshotKey, OpenChunks>>,
}

/// The open transactions of one chunk generation being read back.
#[derive(Default)]
struct OpenChunks {
    generation: i64,
    snapshot_offset: i64,
    count: i32,
    /// Set once the generation was complete and handed to `snapshots`.
    done: bool,
    chunks: std::collections::BTreeMap<i32, Vec<OpenTxn>>,
}

/// The open transactions among a snapshot's producers.
fn open_txns_of(producers: &[SnapshotProducer]) -> Vec<OpenTxn> {
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

/// Whether a snapshot of `producers` producers exceeds one type-5 record
/// ([`MAX_SNAPSHOT_BYTES`]) and is written in type-7 chunks instead.
fn needs_chunks(producers: usize) -> bool {
    16 + producers.saturating_mul(67) > MAX_SNAPSHOT_BYTES
}

/// The type-7 records of one chunk generation of a snapshot
/// ([`CHUNK_PRODUCERS`] producers per record).
fn chunk_records(
    topic_id: [u8; 16],
    partition: i32,
    generation: i64,
    value: &MirrorProducerSnapshotValue,
) -> Result<ChunkRecords, String> {
    let chunks: Vec<&[SnapshotProducer]> = value.producers.chunks(CHUNK_PRODUCERS).collect();
    let count = i32::try_from(chunks.len()).map_err(|_| "too many snapshot chunks")?;
    let mut keys = Vec::with_capacity(chunks.len());
    let mut records = Vec::with_capacity(chunks.len());
    for (chunk, producers) in (0..count).zip(&chunks) {
        let key = MirrorProducerSnapshotChunkKey {
            topic_id,
            partition,
            generation,
            chunk,
        };
        let v = MirrorProducerSnapshotChunkValue {
            snapshot_offset: value.snapshot_offset,
            chunk_count: count,
            producers: producers.to_vec(),
            unknown_tagged_fields: Vec::new(),
        }
        .encode()
        .map_err(|e| e.to_string())?;
        records.push((key.encode(), Some(v)));
        keys.push(key);
    }
    Ok((keys, records))
}

/// Chunk keys and their (key, value) records.
type ChunkRecords = (
    Vec<MirrorProducerSnapshotChunkKey>,
    Vec<(Vec<u8>, Option<Vec<u8>>)>,
);

/// How long a destination topic must be missing from the destination's
/// listings before its partitions leave the producer state.
pub const DELETION_CONFIRM: Duration = Duration::from_secs(1);

/// The chunks of one generation read back: (snapshot offset, chunk count)
/// as each chunk says, and chunk index → (its value, its record).
type ChunkGeneration =
    std::collections::HashMap<i32, (MirrorProducerSnapshotChunkValue, StoredRecord)>;

/// Chunk generations of one partition, by generation.
type ChunkGenerations = std::collections::BTreeMap<i64, ChunkGeneration>;

/// The keys of every chunk of `gens` (a partition's generations).
fn chunk_keys(key: SnapshotKey, gens: &ChunkGenerations) -> Vec<MirrorProducerSnapshotChunkKey> {
    gens.iter()
        .flat_map(|(generation, chunks)| {
            chunks
                .keys()
                .map(move |chunk| MirrorProducerSnapshotChunkKey {
                    topic_id: key.0,
                    partition: key.1,
                    generation: *generation,
                    chunk: *chunk,
                })
        })
        .collect()
}

/// A partition snapshotted in chunks is snapshotted again without new
/// claims to supersede only after this long (5 minutes).
pub const CHUNKED_SNAPSHOT_MIN_AGE_MS: i64 = 300_000;

/// Producers per chunk of a chunked snapshot (type 7): 3,000 entries of 67
/// bytes are ~196 KiB, below [`MAX_SNAPSHOT_BYTES`].
pub const CHUNK_PRODUCERS: usize = 3_000;

/// Mapped PIDs with a live claim record in one partition, and the
/// partition's destination topic id.
#[derive(Default)]
struct ClaimSet {
    topic_id: [u8; 16],
    pids: std::collections::HashMap<i64, Origin>,
}

/// A claim read at start-up: its value and the record (kept if its topic
/// id is not known yet).
type KeptClaim = (MirrorProducerClaimValue, StoredRecord);

/// Largest type-5 snapshot value written (bytes). Far below Kafka's default
/// `message.max.bytes` (1 MiB): a partition with more producers (about
/// 3,900) is snapshotted in chunks (type 7) instead.
pub const MAX_SNAPSHOT_BYTES: usize = 256 * 1024;

/// The closings of `snap` as the snapshot record's tagged field, when the
/// record stays below `max_bytes` with them (else the record goes without:
/// a restore then reports a cut below its offset as possibly incomplete).
fn closings_tag(
    snap: &ps::PartitionSnapshot,
    max_bytes: usize,
) -> Option<Result<crate::state_store::schema::RawTaggedField, String>> {
    let c = snap.closings.as_ref()?;
    let size = 64usize
        .saturating_add(snap.producers.len().saturating_mul(67))
        .saturating_add(c.closed.len().saturating_mul(55));
    if size > max_bytes {
        return None;
    }
    let value = crate::state_store::schema::SnapshotClosings {
        fetcher_position: c.fetcher_position,
        dropped_upto: c.dropped_upto,
        closings: c
            .closed
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
    Some(value.encode_tag().map_err(|e| e.to_string()))
}

/// The closings kept with a type-5 snapshot, if any (a malformed field is
/// treated as absent: the restore is then conservative).
fn closings_from(value: &MirrorProducerSnapshotValue) -> Option<ps::ClosingsSnapshot> {
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
        fetcher_position: c.fetcher_position,
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

/// A destination topic id and partition.
type SnapshotKey = ([u8; 16], i32);

/// A record kept until its topic id is known, and whether it was read at
/// start-up.
type KeptRecord = (StoredRecord, bool);

/// Snapshots appended per periodic round (the shutdown snapshot writes all).
const MAX_SNAPSHOTS_PER_ROUND: usize = 256;

/// Destination topic names and ids (collision records name topics by id,
/// the producer state by destination name).
#[derive(Default)]
struct DestinationTopics {
    by_name: std::collections::HashMap<String, [u8; 16]>,
    by_id: std::collections::HashMap<[u8; 16], String>,
}

impl StateSync {
    /// A sync over an opened store; `dest_bootstrap` is the destination
    /// cluster (where topic ids are read).
    pub fn new(
        store: Arc<StateStore>,
        registry: Arc<ProducerStateRegistry>,
        metrics: Arc<Metrics>,
        dest_bootstrap: Vec<(String, u16)>,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| Self {
            store,
            registry,
            mirrors: Default::default(),
            next_offset: tokio::sync::Mutex::new(0),
            metrics,
            me: me.clone(),
            dest_bootstrap,
            dest_topics: Default::default(),
            lifecycle: Default::default(),
            snapshots: Default::default(),
            pending: Default::default(),
            applied: Default::default(),
            loading: std::sync::atomic::AtomicBool::new(false),
            snapshotted: Default::default(),
            snapshot_cursor: Default::default(),
            claimed: Default::default(),
            deferred_claims: Default::default(),
            live_chunks: Default::default(),
            chunk_generation: std::sync::atomic::AtomicI64::new(0),
            chunked_at: Default::default(),
            loaded_chunks: Default::default(),
            type5_restored_at: Default::default(),
            open_chunks: Default::default(),
            missing_since: Default::default(),
            dest_refresh_rounds: std::sync::atomic::AtomicU64::new(10),
        })
    }

    /// Reads the destination's topics every `period` (rounded to tail
    /// rounds of one second; at least one): deleted destination topics are
    /// found that way.
    pub fn set_destination_refresh(&self, period: Duration) {
        self.dest_refresh_rounds.store(
            period.as_secs().max(1),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Routes partition-state records (types 4 and 5) to `lifecycle`.
    pub fn set_lifecycle(&self, lifecycle: Arc<Lifecycle>) {
        let _ = self.lifecycle.set(lifecycle);
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
            &self.dest_bootstrap,
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
                }
            }
            for (name, id, _partitions) in view.topics {
                t.by_id.insert(id, name.clone());
                t.by_name.insert(name, id);
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
    fn forget_destination_topic(&self, topic: &str, why: &str) {
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
    fn is_controlled(&self, k: &PartitionKey) -> bool {
        self.lifecycle
            .get()
            .and_then(|l| l.get(k))
            .is_some_and(|e| e.state != MirrorPartitionState::Mirroring)
    }

    /// Forgets the snapshot bookkeeping of partitions dropped from the state.
    fn forget_partitions(&self, keys: &[PartitionKey]) {
        if keys.is_empty() {
            return;
        }
        let mut snapshotted = self.snapshotted.lock().unwrap_or_else(|p| p.into_inner());
        let mut chunked = self.chunked_at.lock().unwrap_or_else(|p| p.into_inner());
        for k in keys {
            snapshotted.remove(k);
            chunked.remove(k);
        }
    }

    /// Applies the kept records of topic ids that are known now.
    fn apply_pending(&self) {
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
    fn keep_pending(&self, topic_id: [u8; 16], r: &StoredRecord, start_up: bool) {
        self.count("pending_unknown_topic");
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let list = pending.entry(topic_id).or_default();
        if list.is_empty() {
            tracing::warn!(offset = r.offset, topic_id = %ps::ClusterId(topic_id),
                "__mirror_state record for a topic id the destination does not list (yet); kept \
                 and applied when the topic appears");
        }
        list.push((r.clone(), start_up));
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
        self.loading
            .store(true, std::sync::atomic::Ordering::SeqCst);
        for r in &records {
            applied += usize::from(self.apply(r));
            *next = (*next).max(r.offset + 1);
        }
        self.loading
            .store(false, std::sync::atomic::Ordering::SeqCst);
        let chunked = self.restore_loaded_chunks();
        let claims = self.apply_deferred_claims();
        tracing::info!(
            records = records.len(),
            chunked_snapshots = chunked,
            claims,
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

    /// Appends one record (acks=all), notes its offset so the tail does not
    /// re-apply it, and counts it.
    async fn append_record(&self, key: Vec<u8>, value: Vec<u8>) -> Result<i64, String> {
        let offset = self
            .store
            .append(key.clone(), Some(value))
            .await
            .map_err(|e| self.append_failed(&e))?;
        self.advance(&key, offset);
        self.count("append");
        Ok(offset)
    }

    /// Notes that the record for `key` at `offset` is known (applied or ours);
    /// false if a later record for the key was already seen.
    fn advance(&self, key: &[u8], offset: i64) -> bool {
        let mut applied = self.applied.lock().unwrap_or_else(|p| p.into_inner());
        match applied.get(key) {
            Some(&seen) if seen >= offset => false,
            _ => {
                applied.insert(key.to_vec(), offset);
                true
            }
        }
    }

    /// Applies one stored record; true if it was a collision salt.
    fn apply(&self, r: &StoredRecord) -> bool {
        if !self.advance(&r.key, r.offset) {
            return false;
        }
        let start_up = self.loading.load(std::sync::atomic::Ordering::SeqCst);
        self.apply_record(r, start_up)
    }

    /// Applies one record already admitted by [`advance`](Self::advance);
    /// `start_up` says whether it was read by the start-up load.
    fn apply_record(&self, r: &StoredRecord, start_up: bool) -> bool {
        if r.key.get(..2) == Some(&crate::mirror::offline::SOURCE_TOPOLOGY_TYPE.to_be_bytes()) {
            self.apply_topology(r);
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
    fn apply_topology(&self, r: &StoredRecord) {
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

    /// Appends a mirror's source topology (type 8).
    async fn write_topology(
        &self,
        mirror: String,
        topology: crate::mirror::offline::Topology,
    ) -> Result<(), String> {
        use crate::mirror::offline::Topology;
        let k = Topology::encode_key(&mirror).map_err(|e| e.to_string())?;
        let v = topology
            .encode_value(crate::lifecycle::now_ms())
            .map_err(|e| e.to_string())?;
        self.append_record(k, v).await.map(|_| ())
    }

    fn apply_snapshot(
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

    /// A chunk of a chunked snapshot (type 7). Only chunks read at start-up
    /// count (as for type 5); the load assembles them and restores the
    /// latest complete generation at its end.
    fn apply_chunk(
        &self,
        r: &StoredRecord,
        key: MirrorProducerSnapshotChunkKey,
        value: Option<MirrorProducerSnapshotChunkValue>,
        start_up: bool,
    ) {
        if let Some(v) = &value {
            self.note_open_chunk(&key, v);
        }
        if !start_up {
            return;
        }
        self.chunk_generation
            .fetch_max(key.generation, std::sync::atomic::Ordering::Relaxed);
        {
            let mut loaded = self.loaded_chunks.lock().unwrap_or_else(|p| p.into_inner());
            let gens = loaded.entry((key.topic_id, key.partition)).or_default();
            match value {
                Some(v) => {
                    gens.entry(key.generation)
                        .or_default()
                        .insert(key.chunk, (v, r.clone()));
                }
                None => {
                    if let Some(g) = gens.get_mut(&key.generation) {
                        g.remove(&key.chunk);
                        if g.is_empty() {
                            gens.remove(&key.generation);
                        }
                    }
                }
            }
        }
        if !self.loading.load(std::sync::atomic::Ordering::SeqCst) {
            // Kept while its topic was unknown: restore once complete.
            self.restore_chunks((key.topic_id, key.partition), false);
        }
    }

    /// Collects the open transactions of a chunk (start-up or tail); once
    /// its generation is complete they become the partition's latest
    /// snapshot in `snapshots` (where a restored seal finds them), as a
    /// type-5 record read at that point would.
    fn note_open_chunk(
        &self,
        key: &MirrorProducerSnapshotChunkKey,
        v: &MirrorProducerSnapshotChunkValue,
    ) {
        let sk = (key.topic_id, key.partition);
        let mut all = self.open_chunks.lock().unwrap_or_else(|p| p.into_inner());
        let cur = all.entry(sk).or_default();
        if key.generation < cur.generation {
            return; // an older generation: superseded
        }
        if key.generation > cur.generation || cur.chunks.is_empty() && !cur.done {
            *cur = OpenChunks {
                generation: key.generation,
                snapshot_offset: v.snapshot_offset,
                count: v.chunk_count,
                done: false,
                chunks: Default::default(),
            };
        }
        if cur.done || v.snapshot_offset != cur.snapshot_offset || v.chunk_count != cur.count {
            return;
        }
        cur.chunks.insert(key.chunk, open_txns_of(&v.producers));
        let whole = usize::try_from(cur.count).ok() == Some(cur.chunks.len())
            && (0..cur.count).all(|i| cur.chunks.contains_key(&i));
        if whole {
            let open: Vec<OpenTxn> = std::mem::take(&mut cur.chunks)
                .into_values()
                .flatten()
                .collect();
            cur.done = true;
            self.snapshots
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(sk, open);
        }
    }

    /// Restores every partition whose chunks the start-up load read;
    /// returns how many were restored.
    fn restore_loaded_chunks(&self) -> usize {
        let keys: Vec<SnapshotKey> = self
            .loaded_chunks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .copied()
            .collect();
        keys.into_iter()
            .filter(|k| self.restore_chunks(*k, true))
            .count()
    }

    /// Restores the latest complete chunk generation of one partition (all
    /// chunks `0..ChunkCount` present, one snapshot offset), unless a type-5
    /// snapshot later in the topic was restored. A generation whose topic is
    /// not known yet is kept (its records) until the topic appears. True if
    /// the partition was restored. `at_load`: the end of the start-up load
    /// (otherwise only a partition that has seen nothing is restored).
    fn restore_chunks(&self, key: SnapshotKey, at_load: bool) -> bool {
        let (gens, complete) = {
            let mut loaded = self.loaded_chunks.lock().unwrap_or_else(|p| p.into_inner());
            let Some(gens) = loaded.get(&key) else {
                return false;
            };
            let complete = gens.iter().rev().find_map(|(generation, chunks)| {
                let first = chunks.values().next()?;
                let (offset, count) = (first.0.snapshot_offset, first.0.chunk_count);
                let whole = usize::try_from(count).ok() == Some(chunks.len())
                    && (0..count).all(|i| {
                        chunks.get(&i).is_some_and(|(v, _)| {
                            v.snapshot_offset == offset && v.chunk_count == count
                        })
                    });
                whole.then_some(*generation)
            });
            let Some(generation) = complete else {
                // Only incomplete generations (a crash while writing the
                // first): known as live so the next snapshot tombstones them.
                if at_load {
                    if let Some(topic) = self.destination_topic_name(&key.0) {
                        let pk = PartitionKey::new([0; 16], topic, key.1);
                        let keys = chunk_keys(key, gens);
                        loaded.remove(&key);
                        self.live_chunks
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(pk, keys);
                    }
                }
                return false;
            };
            let Some(gens) = loaded.remove(&key) else {
                return false;
            };
            (gens, generation)
        };
        let chosen = &gens[&complete];
        let last_record = chosen.values().map(|(_, r)| r.offset).max().unwrap_or(-1);
        let Some(topic) = self.destination_topic_name(&key.0) else {
            for (_, r) in chosen.values() {
                self.keep_pending(key.0, r, true);
            }
            return false;
        };
        let pk = PartitionKey::new([0; 16], topic, key.1);
        // Every generation read is live: tombstoned by the next snapshot.
        self.live_chunks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(pk.clone(), chunk_keys(key, &gens));
        let later_type5 = self
            .type5_restored_at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .is_some_and(|o| *o > last_record);
        if later_type5 {
            return false;
        }
        let fresh = at_load
            || self
                .registry
                .get(&pk)
                .is_none_or(|h| h.with(|s| s.producer_count() == 0 && s.next_offset() == 0));
        if !fresh {
            tracing::warn!(partition = %pk, "chunked producer-state snapshot of a topic that \
                appeared after start-up not restored: the partition already has live state");
            return false;
        }
        let mut chunks: Vec<(i32, &MirrorProducerSnapshotChunkValue)> =
            chosen.iter().map(|(i, (v, _))| (*i, v)).collect();
        chunks.sort_unstable_by_key(|(i, _)| *i);
        let value = MirrorProducerSnapshotValue {
            snapshot_offset: chunks.first().map_or(0, |(_, v)| v.snapshot_offset),
            producers: chunks
                .iter()
                .flat_map(|(_, v)| v.producers.iter().copied())
                .collect(),
            unknown_tagged_fields: Vec::new(),
        };
        self.restore_producers(&pk, &value);
        true
    }

    /// A producer claim (type 6). Only claims read at start-up change the
    /// state (later ones are this process's own or another instance's, as
    /// with snapshots); the load defers them until every snapshot is in.
    fn apply_claim(
        &self,
        r: &StoredRecord,
        key: MirrorProducerClaimKey,
        value: Option<MirrorProducerClaimValue>,
        start_up: bool,
    ) {
        if !start_up {
            return;
        }
        if self.loading.load(std::sync::atomic::Ordering::SeqCst) {
            let mut d = self
                .deferred_claims
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            match value {
                Some(v) => d.insert(key, (v, r.clone())),
                None => d.remove(&key),
            };
            return;
        }
        let Some(value) = value else { return };
        let Some(topic) = self.destination_topic_name(&key.topic_id) else {
            self.keep_pending(key.topic_id, r, start_up);
            return;
        };
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
    fn apply_deferred_claims(&self) -> usize {
        let claims: Vec<(MirrorProducerClaimKey, KeptClaim)> = self
            .deferred_claims
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .collect();
        let n = claims.len();
        for (key, (value, r)) in claims {
            self.apply_claim(&r, key, Some(value), true);
        }
        n
    }

    /// Writes one claim record per new producer (all of one Fetch response
    /// in as few batches as fit the bound of `append_many`), then records
    /// the claims in the state and as live claim records.
    async fn persist_claim_records(
        &self,
        claims: Vec<(PartitionKey, Vec<(i64, Origin)>)>,
    ) -> Result<(), String> {
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
                .encode()
                .map_err(|e| e.to_string())?;
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

    /// Appends claim records or tombstones; a refusal as too large is
    /// reported in Kafka's terms (ERROR line, `kind="message_too_large"`).
    async fn append_claims(&self, records: Vec<(Vec<u8>, Option<Vec<u8>>)>) -> Result<(), String> {
        match self.store.append_many(records).await {
            Ok(_) => {
                self.count("append");
                Ok(())
            }
            Err(e) => Err(self.append_failed(&e)),
        }
    }

    /// Counts a failed append; a refusal as too large is reported in
    /// Kafka's terms (ERROR line, `kind="message_too_large"`).
    fn append_failed(&self, e: &crate::state_store::StateStoreError) -> String {
        self.count("append_error");
        if e.is_too_large() {
            self.count("message_too_large");
            tracing::error!(error = %e, "the state cluster refuses a single __mirror_state \
                record as too large (MESSAGE_TOO_LARGE / RECORD_LIST_TOO_LARGE): raise the \
                topic's max.message.bytes or the broker's message.max.bytes");
        }
        e.to_string()
    }

    /// Tombstones the claim records of `pk` no longer needed: producers a
    /// snapshot just written holds (`in_snapshot`), and producers that left
    /// the state (expired, reset by a barrier, sealed). A producer claimed
    /// again meanwhile gets its claim written again after the tombstone.
    async fn tombstone_claims(
        &self,
        pk: &PartitionKey,
        in_snapshot: &std::collections::HashSet<i64>,
    ) -> Result<usize, String> {
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

    /// Restores a partition's shadow producer state from a snapshot read at
    /// start-up, keeping the salts already applied.
    fn restore_producers(&self, pk: &PartitionKey, value: &MirrorProducerSnapshotValue) {
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
        match self.registry.restore(&snapshot) {
            Ok(()) => tracing::info!(partition = %pk, producers = snapshot.producers.len(),
                upto = value.snapshot_offset, "producer state restored from __mirror_state"),
            Err(e) => {
                tracing::warn!(partition = %pk, error = %e, "producer-state snapshot not restored")
            }
        }
        self.snapshotted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                pk.clone(),
                (value.snapshot_offset, snapshot.producers.len()),
            );
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
    async fn snapshot_round(&self, limit: usize) -> anyhow::Result<usize> {
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
            if let Some(lc) = self.lifecycle.get() {
                // A sealing or sealed partition keeps the seal's snapshot.
                if lc
                    .get(&key)
                    .is_some_and(|e| e.state != MirrorPartitionState::Mirroring)
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
    async fn write_snapshot(
        &self,
        topic_id: [u8; 16],
        snap: &ps::PartitionSnapshot,
    ) -> Result<bool, String> {
        // A chunked snapshot rewrites every producer of the partition: write
        // one only when it supersedes claim records of at least a tenth of
        // the partition's producers (a trickle of new producers then costs
        // at most ~10x their own claims in snapshot bytes), or when the last
        // one is older than CHUNKED_SNAPSHOT_MIN_AGE_MS, so a busy partition
        // of 100,000 producers does not rewrite ~7 MB every round.
        let chunked = needs_chunks(snap.producers.len());
        if chunked {
            let has_claims = self
                .claimed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&snap.key)
                .is_some_and(|c| c.pids.len().saturating_mul(10) >= snap.producers.len());
            let now = crate::lifecycle::now_ms();
            let recent = self
                .chunked_at
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&snap.key)
                .is_some_and(|t| now.saturating_sub(*t) < CHUNKED_SNAPSHOT_MIN_AGE_MS);
            if !has_claims && recent {
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
        let v = value.encode().map_err(|e| e.to_string())?;
        self.append_record(k, v).await?;
        self.snapshotted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(snap.key.clone(), (snap.next_offset, snap.producers.len()));
        self.tombstone_old_chunks(&snap.key, Vec::new()).await?;
        Ok(true)
    }

    /// Writes a snapshot too large for one record as a new generation of
    /// chunks (type 7, [`CHUNK_PRODUCERS`] producers each, every record
    /// below [`MAX_SNAPSHOT_BYTES`]), then tombstones the partition's older
    /// generations. A crash in between leaves the older generation whole
    /// and the newer one incomplete: start-up restores the latest complete
    /// one, and claims are tombstoned only after this returns.
    async fn write_chunked_snapshot(
        &self,
        topic_id: [u8; 16],
        snap: &ps::PartitionSnapshot,
        value: MirrorProducerSnapshotValue,
    ) -> Result<bool, String> {
        let now = crate::lifecycle::now_ms();
        let generation = self.next_chunk_generation(now);
        let (keys, records) = chunk_records(topic_id, snap.key.partition, generation, &value)?;
        let count = keys.len();
        self.append_claims(records).await?;
        self.count("snapshot_chunked");
        self.chunked_at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(snap.key.clone(), now);
        tracing::debug!(partition = %snap.key, producers = value.producers.len(), chunks = count,
            generation, "chunked producer-state snapshot written");
        self.snapshotted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(snap.key.clone(), (snap.next_offset, snap.producers.len()));
        self.tombstone_old_chunks(&snap.key, keys).await?;
        Ok(true)
    }

    /// A new chunk generation: wall-clock ms, or the last one + 1.
    fn next_chunk_generation(&self, now: i64) -> i64 {
        self.chunk_generation
            .fetch_update(
                std::sync::atomic::Ordering::Relaxed,
                std::sync::atomic::Ordering::Relaxed,
                |last| Some(now.max(last.saturating_add(1))),
            )
            .map_or(now, |last| now.max(last.saturating_add(1)))
    }

    /// Makes `current` the partition's live chunks and tombstones the ones
    /// it replaces (a newer snapshot, chunked or not, supersedes them).
    async fn tombstone_old_chunks(
        &self,
        pk: &PartitionKey,
        current: Vec<MirrorProducerSnapshotChunkKey>,
    ) -> Result<(), String> {
        let old = {
            let mut live = self.live_chunks.lock().unwrap_or_else(|p| p.into_inner());
            if current.is_empty() {
                live.remove(pk)
            } else {
                live.insert(pk.clone(), current)
            }
        };
        let Some(old) = old.filter(|o| !o.is_empty()) else {
            return Ok(());
        };
        self.append_claims(old.iter().map(|k| (k.encode(), None)).collect())
            .await?;
        self.count("snapshot_chunk_tombstone");
        Ok(())
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

    fn apply_partition_state(
        &self,
        offset: i64,
        key: MirrorPartitionStateKey,
        v: MirrorPartitionStateValue,
    ) {
        let Some(lifecycle) = self.lifecycle.get() else {
            return;
        };
        let topic = self
            .destination_topic_name(&key.topic_id)
            .unwrap_or(v.topic_name.clone());
        let pk = PartitionKey::new([0; 16], topic.clone(), key.partition);
        // Our own records come back through the tail: keep the live entry
        // (it has the built seal) when it already says the same thing.
        if let Some(cur) = lifecycle.get(&pk) {
            if cur.state == v.state && cur.cut == (v.cut_offset >= 0).then_some(v.cut_offset) {
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
            cut = v.cut_offset, seal_batches = v.seal_batches, "partition state restored from __mirror_state");
        lifecycle.restore(
            pk,
            Entry {
                mirror: v.mirror,
                topic,
                partition: key.partition,
                state: v.state,
                source_cluster_id: v.source_cluster_id,
                cut: (v.cut_offset >= 0).then_some(v.cut_offset),
                seal_batches: (v.seal_batches >= 0).then_some(v.seal_batches),
                fetcher_offset: None,
                last_fetch_ms: None,
                reason: v.reason,
                since_ms: v.timestamp_ms,
                seal: None,
                restored_open_txns,
            },
        );
    }

    async fn topic_id_for(&self, topic: &str) -> Result<[u8; 16], String> {
        if let Some(id) = self.destination_topic_id(topic) {
            return Ok(id);
        }
        self.refresh_destination_topics()
            .await
            .map_err(|e| e.to_string())?;
        self.destination_topic_id(topic).ok_or_else(|| {
            format!("destination topic {topic:?} does not exist on the destination cluster; its state cannot be recorded")
        })
    }

    async fn persist_entry(self: Arc<Self>, entry: Entry) -> Result<(), String> {
        let topic_id = self.topic_id_for(&entry.topic).await?;
        // The open transactions of a seal go first: a STOPPING record with a
        // cut is only ever read back with its snapshot present. Too many for
        // one type-5 record (about 3,900), they go as a chunk generation
        // (type 7), each record below MAX_SNAPSHOT_BYTES.
        let mut seal_chunks = None;
        if let (MirrorPartitionState::Stopping, Some(cut), Some(plan)) =
            (entry.state, entry.cut, &entry.seal)
        {
            let value = MirrorProducerSnapshotValue {
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
            if needs_chunks(value.producers.len()) {
                let generation = self.next_chunk_generation(crate::lifecycle::now_ms());
                let (keys, records) = chunk_records(topic_id, entry.partition, generation, &value)?;
                self.append_claims(records).await?;
                self.count("seal_snapshot_chunked");
                tracing::info!(topic = %entry.topic, partition = entry.partition, cut,
                    open_transactions = value.producers.len(), chunks = keys.len(), generation,
                    "seal's open transactions written as a chunked snapshot");
                seal_chunks = Some(keys);
            } else {
                let key = MirrorProducerSnapshotKey {
                    topic_id,
                    partition: entry.partition,
                };
                let v = value.encode().map_err(|e| e.to_string())?;
                let k = key.encode();
                self.append_record(k, v).await?;
            }
        }
        let key = MirrorPartitionStateKey {
            topic_id,
            partition: entry.partition,
        };
        let value = MirrorPartitionStateValue {
            mirror: entry.mirror.clone(),
            topic_name: entry.topic.clone(),
            state: entry.state,
            source_cluster_id: entry.source_cluster_id.clone(),
            cut_offset: entry.cut.unwrap_or(-1),
            seal_batches: entry.seal_batches.unwrap_or(-1),
            reason: entry.reason.clone(),
            timestamp_ms: entry.since_ms,
            unknown_tagged_fields: Vec::new(),
        };
        let v = value.encode().map_err(|e| e.to_string())?;
        let k = key.encode();
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
        Ok(())
    }

    async fn persist_all(self: Arc<Self>, salts: Vec<PendingSalt>) -> Result<(), String> {
        let mut last = -1;
        let mut written = Vec::with_capacity(salts.len());
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
                                "destination topic {:?} does not exist on the destination cluster yet; \
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
            let key_copy = key.clone();
            // Not `append_record`: the catch-up below must read this record
            // back and apply whichever record for the key is lowest.
            let offset = self
                .store
                .append(key_copy, Some(value))
                .await
                .map_err(|e| {
                    self.count("append_error");
                    e.to_string()
                })?;
            self.count("append");
            tracing::info!(partition = %p.partition, origin = %p.origin, salt = p.choice.salt,
                mapped_pid = p.choice.mapped_pid, offset, "collision salt persisted to __mirror_state");
            last = last.max(offset);
            written.push((p.partition.clone(), p.origin, key, offset, p.choice.salt));
        }
        self.catch_up(Some(last)).await.map_err(|e| e.to_string())?;
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
            .encode()
            .map_err(|e| e.to_string())?;
            tracing::info!(%partition, %origin, winner_offset = w.record_offset, ours = offset,
                salt = w.salt, "another instance's salt record won; re-asserting it so compaction keeps it");
            self.store.append(key, Some(value)).await.map_err(|e| {
                self.count("append_error");
                e.to_string()
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
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>> {
        let me = self.me.upgrade();
        Box::pin(async move {
            let me = me.ok_or("state store is shutting down")?;
            me.persist_claim_records(claims).await
        })
    }

    fn topic_id(&self, topic: &str) -> Option<[u8; 16]> {
        self.destination_topic_id(topic)
    }

    fn persist_topology(
        &self,
        mirror: &str,
        topology: crate::mirror::offline::Topology,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>> {
        let me = self.me.upgrade();
        let mirror = mirror.to_string();
        Box::pin(async move {
            let me = me.ok_or("state store is shutting down")?;
            me.write_topology(mirror, topology).await
        })
    }

    fn refresh_topic_ids(
        &self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>> {
        let me = self.me.upgrade();
        Box::pin(async move {
            let me = me.ok_or("state store is shutting down")?;
            me.refresh_destination_topics()
                .await
                .map_err(|e| e.to_string())?;
            Ok(())
        })
    }

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

impl TransitionStore for StateSync {
    fn persist(
        &self,
        entry: Entry,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>> {
        let me = self.me.upgrade();
        Box::pin(async move {
            match me {
                Some(me) => me.persist_entry(entry).await,
                None => Err("state store is shutting down".into()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            fetcher_position: 40,
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
}
