//! Snapshots too large for one record: generations of type-7 chunks,
//! written whole before older generations are tombstoned, and restored
//! only from a complete generation.

use super::*;

/// Whether a snapshot of `producers` producers exceeds one type-5 record
/// ([`MAX_SNAPSHOT_BYTES`]) and is written in type-7 chunks instead.
pub(super) fn needs_chunks(producers: usize) -> bool {
    16 + producers.saturating_mul(67) > MAX_SNAPSHOT_BYTES
}

/// A signature of the transactions open in `snap` (mapped PID, epoch,
/// first offset of each): a chunked snapshot is written again when it
/// changes, since a take-over with the source gone seals from it.
pub(super) fn open_txn_signature(snap: &ps::PartitionSnapshot) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for p in &snap.producers {
        if let Some(first) = p.transaction_first_offset {
            (p.mapped_pid, p.epoch, first).hash(&mut h);
        }
    }
    h.finish()
}

/// Whether a partition snapshotted in chunks is written in chunks again
/// now: when the claims it supersedes are at least a tenth of its
/// producers (`has_claims`), when its open transactions changed since the
/// last chunked snapshot (a take-over with the source gone seals from the
/// snapshot: a transaction begun or closed since must be in it), or when
/// that one is older than [`CHUNKED_SNAPSHOT_MIN_AGE_MS`] (or there is
/// none). `last`: (wall-clock ms, transaction signature) of the last one.
pub(super) fn chunked_snapshot_due(
    has_claims: bool,
    last: Option<(i64, u64)>,
    now: i64,
    txns: u64,
) -> bool {
    match last {
        None => true,
        Some((at, sig)) => {
            has_claims || sig != txns || now.saturating_sub(at) >= CHUNKED_SNAPSHOT_MIN_AGE_MS
        }
    }
}

/// Bytes a chunk record has beyond what [`snapshots::encode_closings`]
/// counts for a type-5 record of the same producers (its `ChunkCount`, and
/// a margin): the closings on the last chunk are trimmed to the room left.
pub(super) const CHUNK_EXTRA_BYTES: usize = 16;

/// The type-7 records of one chunk generation of a snapshot
/// ([`CHUNK_PRODUCERS`] producers per record). `closings` go with the last
/// chunk, as the tagged field a type-5 record carries them in, trimmed to
/// what that record holds below [`MAX_SNAPSHOT_BYTES`]: a restore assembles
/// the generation with the last chunk's tags (see [`assemble_chunks`]), and
/// a reader that does not know the tag skips it.
pub(super) fn chunk_records(
    topic_id: [u8; 16],
    partition: i32,
    generation: i64,
    value: &MirrorProducerSnapshotValue,
    closings: Option<&ps::ClosingsSnapshot>,
) -> Result<ChunkRecords, SyncError> {
    let chunks: Vec<&[SnapshotProducer]> = value.producers.chunks(CHUNK_PRODUCERS).collect();
    let count = i32::try_from(chunks.len()).map_err(|_| SyncError::TooManyChunks)?;
    let mut keys = Vec::with_capacity(chunks.len());
    let mut records = Vec::with_capacity(chunks.len());
    for (chunk, producers) in (0..count).zip(&chunks) {
        let key = MirrorProducerSnapshotChunkKey {
            topic_id,
            partition,
            generation,
            chunk,
        };
        let mut tags = Vec::new();
        if chunk == count - 1 {
            let room = MAX_SNAPSHOT_BYTES - CHUNK_EXTRA_BYTES;
            if let Some(tag) =
                closings.and_then(|c| snapshots::encode_closings(c, producers.len(), room))
            {
                tags.push(tag?);
            }
        }
        let v = MirrorProducerSnapshotChunkValue {
            snapshot_offset: value.snapshot_offset,
            chunk_count: count,
            producers: producers.to_vec(),
            unknown_tagged_fields: tags,
        }
        .encode()?;
        records.push((key.encode(), Some(v)));
        keys.push(key);
    }
    Ok((keys, records))
}

/// One snapshot value from a complete generation's chunks (any order): the
/// producers in chunk order, and the tags of the last chunk, where the
/// closings are (see [`chunk_records`]).
pub(super) fn assemble_chunks<'a>(
    snapshot_offset: i64,
    chunks: impl IntoIterator<Item = (i32, &'a MirrorProducerSnapshotChunkValue)>,
) -> MirrorProducerSnapshotValue {
    let mut chunks: Vec<(i32, &MirrorProducerSnapshotChunkValue)> = chunks.into_iter().collect();
    chunks.sort_unstable_by_key(|(i, _)| *i);
    MirrorProducerSnapshotValue {
        snapshot_offset,
        producers: chunks
            .iter()
            .flat_map(|(_, v)| v.producers.iter().copied())
            .collect(),
        unknown_tagged_fields: chunks
            .last()
            .map(|(_, v)| v.unknown_tagged_fields.clone())
            .unwrap_or_default(),
    }
}

/// The keys of every chunk of `gens` (a partition's generations).
pub(super) fn chunk_keys(
    key: SnapshotKey,
    gens: &ChunkGenerations,
) -> Vec<MirrorProducerSnapshotChunkKey> {
    keys_of(
        key,
        gens.iter()
            .flat_map(|(generation, chunks)| chunks.keys().map(move |c| (*generation, *c))),
    )
}

/// The record keys of a partition's chunks, given as (generation, chunk).
pub(super) fn keys_of(
    key: SnapshotKey,
    chunks: impl Iterator<Item = (i64, i32)>,
) -> Vec<MirrorProducerSnapshotChunkKey> {
    chunks
        .map(|(generation, chunk)| MirrorProducerSnapshotChunkKey {
            topic_id: key.0,
            partition: key.1,
            generation,
            chunk,
        })
        .collect()
}

impl StateSync {
    /// A chunk of a chunked snapshot (type 7). Only chunks read at start-up
    /// count (as for type 5); the load assembles them and restores the
    /// latest complete generation at its end.
    pub(super) fn apply_chunk(
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
            // Another instance's generation (or our own, read back: chunks
            // are not skipped by the tail): where it is, for a take-over.
            self.note_other_chunk(&key, r, value.as_ref());
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
                        .insert(key.chunk, (v, r.detached()));
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
    pub(super) fn note_open_chunk(
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
    pub(super) fn restore_loaded_chunks(&self) -> usize {
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
    pub(super) fn restore_chunks(&self, key: SnapshotKey, at_load: bool) -> bool {
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
        let snapshot_offset = chosen.values().next().map_or(0, |(v, _)| v.snapshot_offset);
        let value = assemble_chunks(snapshot_offset, chosen.iter().map(|(i, (v, _))| (*i, v)));
        self.restore_producers(&pk, &value)
    }

    /// Writes a snapshot too large for one record as a new generation of
    /// chunks (type 7, [`CHUNK_PRODUCERS`] producers each, every record
    /// below [`MAX_SNAPSHOT_BYTES`]), then tombstones the partition's older
    /// generations. A crash in between leaves the older generation whole
    /// and the newer one incomplete: start-up restores the latest complete
    /// one, and claims are tombstoned only after this returns.
    pub(super) async fn write_chunked_snapshot(
        &self,
        topic_id: [u8; 16],
        snap: &ps::PartitionSnapshot,
        value: MirrorProducerSnapshotValue,
    ) -> Result<bool, SyncError> {
        let now = crate::lifecycle::now_ms();
        let generation = self.next_chunk_generation(now);
        let (keys, records) = chunk_records(
            topic_id,
            snap.key.partition,
            generation,
            &value,
            snap.closings.as_ref(),
        )?;
        let count = keys.len();
        self.append_claims(records).await?;
        self.count("snapshot_chunked");
        self.chunked_at
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(snap.key.clone(), (now, open_txn_signature(snap)));
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
    pub(super) fn next_chunk_generation(&self, now: i64) -> i64 {
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
    pub(super) async fn tombstone_old_chunks(
        &self,
        pk: &PartitionKey,
        current: Vec<MirrorProducerSnapshotChunkKey>,
    ) -> Result<(), SyncError> {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A partition of `n` producers; those in `open` have a transaction
    /// open at the given first offset.
    fn snapshot(n: i64, open: &[(i64, i64)]) -> ps::PartitionSnapshot {
        ps::PartitionSnapshot {
            version: ps::PARTITION_SNAPSHOT_VERSION,
            key: PartitionKey::new([1; 16], "t", 0),
            next_offset: n + 10,
            producers: (0..n)
                .map(|pid| ps::ProducerSnapshotEntry {
                    mapped_pid: pid,
                    origin: Origin {
                        source_cluster: ps::ClusterId([2; 16]),
                        original_pid: pid,
                    },
                    epoch: 0,
                    last_sequence: 0,
                    last_offset: pid,
                    last_timestamp: 0,
                    last_seen_ms: 0,
                    coordinator_epoch: -1,
                    transaction_first_offset: open
                        .iter()
                        .find(|(p, _)| *p == pid)
                        .map(|(_, first)| *first),
                })
                .collect(),
            salts: Vec::new(),
            closings: None,
        }
    }

    #[test]
    fn a_chunked_snapshot_is_written_again_when_its_open_transactions_change() {
        let n = 4_000;
        assert!(needs_chunks(n as usize));
        let written = open_txn_signature(&snapshot(n, &[(3, 100)]));
        let now = 1_000_000;
        let last = Some((now - 1_000, written));
        // Same open transactions, no claims to supersede, written a second
        // ago: not again (a busy partition is not rewritten every round).
        assert!(!chunked_snapshot_due(false, last, now, written));
        // A transaction begun since by a producer already in the snapshot,
        // one closed since, one begun again at another offset: written
        // again, whatever the claims and the age.
        for open in [vec![(3, 100), (7, 4_010)], vec![], vec![(3, 4_020)]] {
            let sig = open_txn_signature(&snapshot(n, &open));
            assert_ne!(sig, written, "{open:?}");
            assert!(chunked_snapshot_due(false, last, now, sig), "{open:?}");
        }
        // Idempotent producers moving on change nothing.
        let mut moved = snapshot(n, &[(3, 100)]);
        moved.producers[5].last_sequence = 9;
        moved.next_offset += 1;
        assert_eq!(open_txn_signature(&moved), written);
        // The other reasons still hold.
        assert!(chunked_snapshot_due(true, last, now, written));
        assert!(chunked_snapshot_due(
            false,
            Some((now - CHUNKED_SNAPSHOT_MIN_AGE_MS, written)),
            now,
            written
        ));
        assert!(chunked_snapshot_due(false, None, now, written));
    }

    /// `n` closings of one producer, markers at 10, 20, ...
    fn closings(n: i64) -> ps::ClosingsSnapshot {
        ps::ClosingsSnapshot {
            kept_from: 0,
            dropped_upto: -1,
            closed: (1..=n)
                .map(|i| ps::ClosedTransaction {
                    txn: ps::OpenTransaction {
                        mapped_pid: 7,
                        epoch: 0,
                        first_offset: i * 10 - 5,
                        origin: Origin {
                            source_cluster: ps::ClusterId([1; 16]),
                            original_pid: 7,
                        },
                    },
                    coordinator_epoch: 0,
                    marker_offset: i * 10,
                })
                .collect(),
        }
    }

    /// The chunks of `producers` producers with `c`, decoded back: every
    /// record within [`MAX_SNAPSHOT_BYTES`], tags on the last chunk only.
    fn written(
        producers: usize,
        c: &ps::ClosingsSnapshot,
    ) -> Vec<(i32, MirrorProducerSnapshotChunkValue)> {
        let value = MirrorProducerSnapshotValue {
            snapshot_offset: 1_000,
            producers: vec![
                SnapshotProducer {
                    producer_id: 7,
                    origin_cluster_id: [1; 16],
                    original_pid: 7,
                    producer_epoch: 0,
                    last_sequence: 0,
                    last_offset: 0,
                    coordinator_epoch: -1,
                    txn_first_offset: -1,
                    last_timestamp: 0,
                };
                producers
            ],
            unknown_tagged_fields: Vec::new(),
        };
        let (keys, records) = chunk_records([1; 16], 0, 5, &value, Some(c)).unwrap();
        let last = keys.len() as i32 - 1;
        keys.iter()
            .zip(records)
            .map(|(k, (key, v))| {
                let v = v.unwrap();
                assert!(
                    key.len() + v.len() <= MAX_SNAPSHOT_BYTES,
                    "{} bytes",
                    v.len()
                );
                let StateRecord::ProducerSnapshotChunk { value: Some(v), .. } =
                    crate::state_store::schema::decode(&key, Some(&v)).unwrap()
                else {
                    panic!("not a chunk")
                };
                assert_eq!(v.unknown_tagged_fields.is_empty(), k.chunk != last);
                (k.chunk, v)
            })
            .collect()
    }

    /// A chunk generation carries the closings on its last chunk; the
    /// generation assembled in any order gives them back as a type-5
    /// record's tag does, and a reader that ignores the tag still reads
    /// every producer.
    #[test]
    fn a_chunk_generation_carries_the_closings_on_its_last_chunk() {
        let c = closings(10);
        let mut chunks = written(4_500, &c);
        assert_eq!(chunks.len(), 2);
        chunks.reverse();
        let value = assemble_chunks(1_000, chunks.iter().map(|(i, v)| (*i, v)));
        assert_eq!(value.producers.len(), 4_500);
        assert_eq!(snapshots::closings_from(&value), Some(c));
        let ignoring = MirrorProducerSnapshotValue {
            unknown_tagged_fields: Vec::new(),
            ..value
        };
        assert_eq!(ignoring.producers.len(), 4_500);
        assert_eq!(snapshots::closings_from(&ignoring), None);
    }

    /// Too many closings for the last chunk's room: the newest are kept,
    /// the older ones reported as possibly missing, the record in bounds.
    #[test]
    fn closings_on_a_full_last_chunk_are_trimmed_to_its_room() {
        let c = closings(3_000);
        let chunks = written(6_000, &c);
        assert_eq!(chunks.len(), 2);
        let value = assemble_chunks(1_000, chunks.iter().map(|(i, v)| (*i, v)));
        let back = snapshots::closings_from(&value).unwrap();
        assert!(!back.closed.is_empty() && back.closed.len() < 3_000);
        assert_eq!(back.closed.last(), c.closed.last());
        let first_kept = back.closed[0].marker_offset;
        assert_eq!(back.dropped_upto, first_kept - 10);
    }
}
