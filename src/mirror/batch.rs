//! The batch rewriting: one partition's record batches walked zero-copy,
//! their PIDs mapped (salted where a collision was resolved) and observed
//! by the shadow producer state, bytes 43..51 and the CRC-32C patched in
//! place, MIRROR_PID_RESET barriers passed, and `aborted_transactions`
//! entries mapped like their batches.

use super::*;

/// Maps like [`pid::map_pid`], stepping the salt on the one reserved value
/// (a sign-bit mapping equal to -1) so every instance computes the same PID.
pub fn map_with_salt(pid: i64, fold: u32, salt: i64, layout: Layout) -> i64 {
    let mut s = salt;
    loop {
        match pid::map_pid(pid, fold, s, layout) {
            MapOutcome::ReservedValue => s = s.wrapping_add(1),
            other => return other.pid(pid).unwrap_or(pid),
        }
    }
}

/// Whether `mirror` maps source PID `pid` into its region: region mode, and
/// a PID not already in a region (a PID mapped upstream passes as it is).
pub(super) fn region_maps(mirror: &MirrorContext, pid: i64) -> bool {
    mirror.mode == PidMode::Region && !pid::is_mapped(pid)
}

/// Observes (and maps, in place) the batches of one partition's records;
/// used by the fetch path and by replays.
pub(crate) fn observe_records(
    mirror: &MirrorContext,
    source: &SourceIdentity,
    handle: &PartitionHandle,
    records: &mut [u8],
    now: i64,
    sink: &mut Vec<Anomaly>,
) {
    // A replay forwards nothing: a collision met here is resolved by phase 1
    // when the fetcher's response carries the batch.
    let _ = rewrite_partition_records(mirror, source, handle, records, now, sink, false, true, &[]);
}

#[allow(clippy::too_many_arguments)]
pub(super) fn rewrite_partition_records(
    mirror: &MirrorContext,
    source: &SourceIdentity,
    handle: &PartitionHandle,
    records: &mut [u8],
    now: i64,
    sink: &mut Vec<Anomaly>,
    forwarding: bool,
    observe: bool,
    corrupt: &[usize],
) -> Result<(), MirrorError> {
    let step = BatchStep {
        mirror,
        source,
        handle,
        now,
        forwarding,
        observe,
    };
    let mut walk = PartitionWalk::default();
    let mut pos = 0;
    let result = loop {
        if pos >= records.len() {
            break Ok(());
        }
        let header = match walk_at(records, pos) {
            Some(Ok(Entry::V2(h))) => h,
            // A legacy (v0/v1) entry is forwarded untouched, but the v2
            // batches after it (a down-converted prefix, an old segment
            // followed by new ones) are still mapped and tracked.
            Some(Ok(Entry::Legacy { range, .. })) if range.end > 0 => {
                pos += range.end;
                continue;
            }
            Some(Ok(_)) | None => break Ok(()), // truncated tail: untouched
            Some(Err(e)) => {
                step.corrupt_entry(pos, &e);
                break Ok(());
            }
        };
        let start = pos;
        let end = pos + header.range.end;
        pos = end;
        let batch = &mut records[start..end];
        if let Err(e) = step.batch(&mut walk, &header, batch, sink, corrupt.contains(&start)) {
            break Err(e);
        }
    };
    step.finish(&walk);
    result
}

/// The first entry of `records[pos..]`.
fn walk_at(records: &[u8], pos: usize) -> Option<Result<Entry, crate::records::BatchError>> {
    records.get(pos..).and_then(|r| walk(r).next())
}

/// What one partition's walk carries from one batch to the next.
#[derive(Default)]
pub(super) struct PartitionWalk {
    /// Leader epoch of the last batch processed (`None`: none yet).
    last_epoch: Option<i32>,
}

/// The per-batch step of the fetch path, shared by the store-and-forward
/// walk ([`rewrite_partition_records`]) and the streamed one
/// ([`super::stream`]): one v2 batch observed and its PID patched in place.
pub(super) struct BatchStep<'a> {
    pub(super) mirror: &'a MirrorContext,
    pub(super) source: &'a SourceIdentity,
    pub(super) handle: &'a PartitionHandle,
    pub(super) now: i64,
    /// Whether the batch is forwarded (a replay forwards nothing).
    pub(super) forwarding: bool,
    /// Whether the shadow producer state follows it (the fetcher's).
    pub(super) observe: bool,
}

/// What [`BatchStep::batch`] did to the partition's producer state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BatchEffect {
    /// The batch was observed (or passed) as usual.
    Observed,
    /// A MIRROR_PID_RESET barrier expired the partition's producer state:
    /// producers seen before it are new again after it.
    StateReset,
}

impl BatchStep<'_> {
    /// Counts and logs a corrupt entry at `position` of the partition's
    /// records (the rest of the partition passes untouched).
    pub(super) fn corrupt_entry(&self, position: usize, e: &crate::records::BatchError) {
        self.mirror.metrics.corrupt.inc();
        tracing::warn!(mirror = %self.mirror.name, partition = %self.handle.key(), position, error = %e,
            "corrupt record batch in a Fetch response; forwarding the rest of the partition untouched");
    }

    /// Whether the sampled verification of the next batch is due (the
    /// streamed walk then holds that batch whole; see `crc_verify_every`).
    pub(super) fn sample_due(&self) -> bool {
        let every = self.mirror.metrics.crc_verify_every;
        every > 0 && self.mirror.metrics.batches.get() % every == 0
    }

    /// Observes one v2 batch and maps its PID in place. `batch` starts at
    /// the batch's first byte and holds its header at least; it holds the
    /// whole batch when it is a control batch (its first record is read)
    /// and wherever the caller has it (the sampled check reads it only
    /// then). `corrupt`: the batch was verified (it would have created
    /// durable state) and its CRC-32C does not match.
    pub(super) fn batch(
        &self,
        walk: &mut PartitionWalk,
        header: &crate::records::BatchHeader,
        batch: &mut [u8],
        sink: &mut Vec<Anomaly>,
        corrupt: bool,
    ) -> Result<BatchEffect, MirrorError> {
        let (mirror, source, handle, now) = (self.mirror, self.source, self.handle, self.now);
        let (observe, forwarding) = (self.observe, self.forwarding);
        let whole = batch.len() >= header.size();
        if observe && forwarding && walk.last_epoch.is_none() {
            // The destination fetcher asked for an offset within this first
            // batch: it appended everything below it.
            let retention = mirror.closings_retention;
            handle.with(|s| s.note_fetcher_position(header.base_offset, retention));
        }
        walk.last_epoch = Some(header.partition_leader_epoch);
        let seen = mirror.metrics.batches.inc();
        if corrupt {
            // Phase 1 verified it (it would have started a producer or needed
            // a salt) and its CRC-32C does not match: it creates no state and
            // leaves byte for byte as it came, still corrupt, for the
            // destination to reject.
            mirror.metrics.corrupt.inc();
            tracing::warn!(mirror = %mirror.name, partition = %handle.key(), offset = header.base_offset,
                producer_id = header.producer_id,
                "record batch with a bad CRC-32C would start a producer; forwarded as it came, no claim, no state");
            return Ok(BatchEffect::Observed);
        }
        // Optional sampled verification (off by default): the rewrite below
        // keeps a corrupt batch corrupt without reading it, so this is only
        // a count for the operator; the destination verifies every batch.
        let every = mirror.metrics.crc_verify_every;
        if every > 0 && seen % every == 0 && whole && !crate::records::verify_crc(batch) {
            mirror.metrics.corrupt.inc();
            tracing::warn!(mirror = %mirror.name, partition = %handle.key(), offset = header.base_offset,
                "record batch with a bad CRC-32C (sampled check); forwarded still corrupt");
        }
        let control = if header.is_control() {
            match first_control_record(batch) {
                Ok(rec) => Some(match (rec.key.control_type, rec.value) {
                    (
                        ControlType::Commit,
                        ControlValue::EndTxnMarker {
                            coordinator_epoch, ..
                        },
                    ) => ControlKind::Commit { coordinator_epoch },
                    (
                        ControlType::Abort,
                        ControlValue::EndTxnMarker {
                            coordinator_epoch, ..
                        },
                    ) => ControlKind::Abort { coordinator_epoch },
                    (ControlType::MirrorPidReset, value) => {
                        let from = match value {
                            ControlValue::MirrorPidReset {
                                source_cluster_id, ..
                            } => source_cluster_id,
                            _ => "?",
                        };
                        return Ok(barrier_effect(
                            observe && pass_barrier(mirror, handle, header, from, now, sink),
                        ));
                    }
                    (other, _) => ControlKind::Unknown(other.id()),
                }),
                Err(e) => {
                    if crate::records::control::first_control_type(batch)
                        == Some(ControlType::MirrorPidReset)
                    {
                        // The key says MIRROR_PID_RESET but the value does not
                        // parse: the destination's log still holds a barrier,
                        // so its producer state is expired all the same.
                        mirror.metrics.corrupt.inc();
                        tracing::warn!(mirror = %mirror.name, partition = %handle.key(),
                            offset = header.base_offset, error = %e,
                            "MIRROR_PID_RESET barrier with an unparseable value: expiring producer state anyway");
                        return Ok(barrier_effect(
                            observe && pass_barrier(mirror, handle, header, "?", now, sink),
                        ));
                    }
                    Some(ControlKind::Unknown(-1))
                }
            }
        } else {
            None
        };
        let pid = header.producer_id;
        if pid == -1 {
            return Ok(BatchEffect::Observed);
        }
        let origin = source.origin(pid);
        let mapped = if region_maps(mirror, pid) {
            if pid > 0x7fff_ffff {
                mirror.metrics.oversized.inc();
            }
            let map = |salt: i64| mirror.map(source, pid, salt);
            match handle.with(|s| s.lookup_mapping(&origin, &map)) {
                MappingLookup::Ready { mapped_pid, .. } => mapped_pid,
                // Phase 1 resolved every collision; a new one can only come
                // from a concurrent connection. Its PID must not leave unsalted:
                // fail this response (the fetcher fetches again, and phase 1
                // then persists a salt first).
                MappingLookup::Collision { mapped_pid, .. } if forwarding => {
                    mirror.metrics.collisions.inc();
                    return Err(MirrorError::CollisionWhileForwarding {
                        key: handle.key().clone(),
                        origin,
                        mapped_pid,
                    });
                }
                MappingLookup::Collision { mapped_pid, .. } => mapped_pid,
            }
        } else {
            pid
        };
        let obs = BatchObservation {
            base_offset: header.base_offset,
            last_offset: header.last_offset(),
            producer_id: mapped,
            producer_epoch: header.producer_epoch,
            base_sequence: header.base_sequence,
            last_sequence: header.last_sequence(),
            is_transactional: header.is_transactional(),
            control,
            max_timestamp: header.max_timestamp,
        };
        sink.clear();
        if observe {
            handle.observe(&origin, &obs, now, sink);
        }
        for a in sink.iter() {
            mirror
                .metrics
                .anomalies
                .get_or_create(&MirrorKindLabels {
                    mirror: mirror.metrics.mirror.clone(),
                    kind: a.kind().as_str(),
                })
                .inc();
            tracing::warn!(mirror = %mirror.name, kind = a.kind().as_str(), "{a}");
        }
        if mapped != pid
            && crate::records::rewrite_producer_id_in_head(batch, header.size(), mapped)
                == crate::records::RewriteOutcome::Rewritten
        {
            mirror.metrics.rewritten.inc();
        }
        Ok(BatchEffect::Observed)
    }

    /// Ends a partition's walk: the fetcher's leader epoch is noted from
    /// its last batch.
    pub(super) fn finish(&self, walk: &PartitionWalk) {
        if let (true, Some(epoch)) = (self.observe && self.forwarding, walk.last_epoch) {
            self.handle.with(|s| s.note_leader_epoch(epoch));
        }
    }
}

/// A MIRROR_PID_RESET barrier passes: expires the partition's producer
/// state through [`PartitionState::observe`](ps::PartitionState::observe),
/// whose replay guard makes a re-fetch of a barrier already seen (a lost
/// response, a reader starting at 0, a replay) change nothing: producers
/// seen after the barrier keep their state. Returns whether the state was
/// expired.
pub(super) fn pass_barrier(
    mirror: &MirrorContext,
    handle: &PartitionHandle,
    header: &crate::records::BatchHeader,
    from: &str,
    now: i64,
    sink: &mut Vec<Anomaly>,
) -> bool {
    let obs = BatchObservation {
        base_offset: header.base_offset,
        last_offset: header.last_offset(),
        producer_id: header.producer_id,
        producer_epoch: header.producer_epoch,
        base_sequence: header.base_sequence,
        last_sequence: header.last_sequence(),
        is_transactional: header.is_transactional(),
        control: Some(ControlKind::MirrorPidReset),
        max_timestamp: header.max_timestamp,
    };
    let before = handle.with(|s| s.producer_count());
    sink.clear();
    let outcome = handle.observe(
        &Origin {
            source_cluster: ps::ClusterId([0; 16]),
            original_pid: -1,
        },
        &obs,
        now,
        sink,
    );
    if outcome == ps::ObserveOutcome::Reset {
        mirror.metrics.barriers.inc();
        tracing::info!(mirror = %mirror.name, partition = %handle.key(),
            offset = header.base_offset, barrier_source = from, expired = before,
            "MIRROR_PID_RESET barrier passed: producer state expired");
        true
    } else {
        tracing::debug!(mirror = %mirror.name, partition = %handle.key(),
            offset = header.base_offset, ?outcome,
            "MIRROR_PID_RESET barrier re-fetched: producer state already past it, left alone");
        false
    }
}

fn barrier_effect(reset: bool) -> BatchEffect {
    if reset {
        BatchEffect::StateReset
    } else {
        BatchEffect::Observed
    }
}

/// Rewrites the PIDs of `aborted_transactions` with the mapping the batches
/// got; `aborted` are the body offsets of their ProducerId fields.
pub(super) fn rewrite_aborted(
    mirror: &MirrorContext,
    source: &SourceIdentity,
    handle: &PartitionHandle,
    body: &mut [u8],
    aborted: &[usize],
) {
    for &at in aborted {
        let Some(dst) = body.get_mut(at..at + 8) else {
            continue;
        };
        let mut pid_bytes = [0u8; 8];
        pid_bytes.copy_from_slice(dst);
        let pid = i64::from_be_bytes(pid_bytes);
        if pid == -1 || pid::is_mapped(pid) {
            continue;
        }
        let origin = source.origin(pid);
        let salt = handle.with(|s| s.salts().salt_for(&origin).unwrap_or(0));
        let mapped = mirror.map(source, pid, salt);
        dst.copy_from_slice(&mapped.to_be_bytes());
        mirror.metrics.aborted_rewritten.inc();
    }
}
