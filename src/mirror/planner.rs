//! The planner: the phases of a Fetch response rewrite as functions over
//! the producer state that change nothing and return what must be durable
//! or observed first ([`Pending`]): phase 0 finds the partitions and the
//! source ranges to replay, phase 1 the collisions (salts to persist) and
//! the new producers (claims to persist), and only when nothing is pending
//! phase 2 hands each partition to the batch rewriting ([`super::batch`]).

use super::batch::region_maps;
use super::*;

/// A salt chosen for a collision, waiting to be persisted.
#[derive(Debug, Clone)]
pub struct PendingSalt {
    /// Destination partition.
    pub partition: PartitionKey,
    /// The remapped origin.
    pub origin: Origin,
    /// The choice (salt, mapped PID, holder).
    pub choice: ps::SaltChoice,
    /// Wall-clock ms of the resolution.
    pub timestamp_ms: i64,
}

/// What a Fetch response waits for before it may be rewritten.
#[derive(Debug)]
pub enum Pending {
    /// Collision salts to persist.
    Salts(Vec<PendingSalt>),
    /// The destination topic ids (to seed and key a salt).
    TopicIds,
    /// Source ranges to observe first (producer state after a restart).
    Replay(Vec<replay::ReplayJob>),
    /// Producers seen for the first time in a partition: their claims
    /// (mapped PID → origin) are made durable before their batches leave.
    Claims(Vec<(PartitionHandle, Vec<(i64, Origin)>)>),
    /// Partitions this instance does not serve yet (or another instance
    /// served since): taken over before anything of them is forwarded
    /// ([`super::handover`]).
    TakeOver(Vec<handover::TakeOver>),
    /// Partitions this instance serves whose fetcher is past their state
    /// (a gap): `__mirror_state` is read again first, in case another
    /// instance served them within the last tail round.
    Recheck(Vec<handover::TakeOver>),
}

/// The offset of the first entry of a partition's records, if any.
fn first_offset(body: &[u8], records: std::ops::Range<usize>) -> Option<i64> {
    body.get(records).and_then(|r| match walk(r).next() {
        Some(Ok(Entry::V2(h))) => Some(h.base_offset),
        // A legacy entry starts with its offset too.
        Some(Ok(Entry::Legacy { range, .. })) => r
            .get(range.start..range.start + 8)
            .and_then(|b| b.try_into().ok())
            .map(i64::from_be_bytes),
        _ => None,
    })
}

/// One partition of a Fetch response, as the rewriter needs it.
pub(super) struct PartitionSlice {
    pub(super) key: PartitionKey,
    pub(super) handle: PartitionHandle,
    pub(super) records: std::ops::Range<usize>,
    /// Body offsets of the ProducerId of each aborted-transaction entry
    /// (empty, and unallocated, unless the fetch was read_committed).
    pub(super) aborted: Vec<usize>,
}

/// Rewrites the records and aborted transactions of a Fetch response body in
/// place. Returns the salts that must be persisted first, if any (then
/// nothing has been changed).
pub fn rewrite_fetch_body(
    mirror: &MirrorContext,
    version: i16,
    body: &mut [u8],
    skip: &dyn Fn(&FetchTopic<'_>, i32) -> bool,
) -> Result<Option<Pending>, MirrorError> {
    rewrite_fetch_body_as(mirror, version, body, skip, true)
}

/// [`rewrite_fetch_body`] for the destination fetcher (`fetcher`) or for
/// another reader: a reader's responses are mapped with the same salts and
/// claims, but never observed (its position says nothing about the
/// destination's log, so the shadow producer state must not follow it),
/// and never replayed for.
pub fn rewrite_fetch_body_as(
    mirror: &MirrorContext,
    version: i16,
    body: &mut [u8],
    skip: &dyn Fn(&FetchTopic<'_>, i32) -> bool,
    fetcher: bool,
) -> Result<Option<Pending>, MirrorError> {
    rewrite_fetch_body_holding(mirror, version, body, skip, fetcher, None)
}

/// [`rewrite_fetch_body_as`] that holds partitions whose destination topic
/// id is not known yet, when `held` is given: their records (which cannot
/// be claimed nor salted without the id) are neither observed nor changed,
/// their keys are pushed to `held` (the caller answers them with no
/// records), and every other partition is rewritten as usual.
pub fn rewrite_fetch_body_holding(
    mirror: &MirrorContext,
    version: i16,
    body: &mut [u8],
    skip: &dyn Fn(&FetchTopic<'_>, i32) -> bool,
    fetcher: bool,
    mut held: Option<&mut Vec<PartitionKey>>,
) -> Result<Option<Pending>, MirrorError> {
    // Without a durable store no record needs the id (preserve mode only).
    let holding = held.is_some() && mirror.salts.durable();
    let Some(source) = mirror.source() else {
        return Err(MirrorError::SourceUnknown {
            mirror: mirror.name.clone(),
        });
    };
    let mut slices: Vec<PartitionSlice> = Vec::new();
    let mut limit: Option<MirrorError> = None;
    handlers::walk_fetch_response(version, body, &mut |p| {
        if p.error_code != 0 || skip(&p.topic, p.partition_index) {
            return; // error partitions are left alone; controlled ones are replaced
        }
        if fetcher {
            if let Some((epoch, end_offset)) = p.diverging_epoch() {
                mirror.source_truncated(&p.topic, p.partition_index, epoch, end_offset);
            }
        }
        let aborted: Vec<usize> = match &p.aborted_transactions {
            Some(a) if !a.is_empty() => a.iter().map(|t| t.producer_id_offset).collect(),
            _ => Vec::new(),
        };
        let records = p.records.clone().unwrap_or(0..0);
        if records.is_empty() && aborted.is_empty() {
            return;
        }
        if let (true, FetchTopic::Id(id)) = (holding, &p.topic) {
            // A source topic id the source's Metadata has not named yet: its
            // destination topic is not known either, and a state keyed by a
            // placeholder would be orphaned once it is.
            if !mirror.names_source_id(id) {
                if let Some(held) = held.as_deref_mut() {
                    held.push(mirror.partition_key(&p.topic, p.partition_index));
                }
                return;
            }
        }
        let handle = match mirror.partition_handle(&p.topic, p.partition_index) {
            Ok(h) => h,
            Err(e) => {
                limit.get_or_insert(e);
                return;
            }
        };
        if holding && mirror.salts.topic_id(&handle.key().topic).is_none() {
            if let Some(held) = held.as_deref_mut() {
                held.push(handle.key().clone());
            }
            return;
        }
        slices.push(PartitionSlice {
            key: handle.key().clone(),
            handle,
            records,
            aborted,
        });
    })?;
    if let Some(e) = limit {
        return Err(mirror.state_limit(e));
    }

    let now = now_ms();

    // Phase 0: a partition this instance does not serve yet (its first
    // fetch here, or another instance served it since) is taken over first:
    // the state is read to its end and the serving record persisted.
    if fetcher {
        let mut take_overs = Vec::new();
        let mut rechecks = Vec::new();
        for slice in &slices {
            let Some(first) = first_offset(body, slice.records.clone()) else {
                continue;
            };
            match ownership(mirror, &slice.key, &slice.handle, first) {
                Ownership::Ready => {}
                Ownership::TakeOver(t) => take_overs.push(t),
                Ownership::Recheck(t) => rechecks.push(t),
            }
        }
        if !take_overs.is_empty() {
            return Ok(Some(Pending::TakeOver(take_overs)));
        }
        if !rechecks.is_empty() {
            return Ok(Some(Pending::Recheck(rechecks)));
        }
    }
    // Then a partition seen for the first time since start-up (or since it
    // was taken over) must have its producer state complete up to where the
    // fetcher is before any of its batches is mapped: replay the source
    // range the state has not seen.
    let mut replays = Vec::new();
    for slice in &slices {
        if !fetcher || mirror.is_warm(&slice.key) {
            continue;
        }
        let Some(first) = first_offset(body, slice.records.clone()) else {
            continue;
        };
        replays.extend(replay_job(mirror, &slice.key, &slice.handle, first));
    }
    if !replays.is_empty() {
        return Ok(Some(Pending::Replay(replays)));
    }

    // Phase 1: one scan of each partition, under its lock, changing nothing:
    // collisions (two origins on one mapped PID, region mode) need a salt
    // persisted, and producers seen for the first time have their claim on
    // the mapped PID made durable, before any of their batches leaves (so a
    // crash cannot make a later collision with them go unseen). Only the
    // batches that would create such state have their CRC verified; those
    // that arrived corrupt create none (listed per slice for phase 2).
    let mut pending: Vec<PendingSalt> = Vec::new();
    let mut claims: Vec<(PartitionHandle, Vec<(i64, Origin)>)> = Vec::new();
    let mut corrupt: Vec<(usize, Vec<usize>)> = Vec::new();
    let mut new_total = 0u64;
    for (i, slice) in slices.iter().enumerate() {
        let handle = &slice.handle;
        let Some(records) = body.get(slice.records.clone()) else {
            continue;
        };
        let scan = handle.with(|state| scan_partition(mirror, source, state, records));
        if !scan.corrupt.is_empty() {
            corrupt.push((i, scan.corrupt));
        }
        for origin in scan.colliding {
            // Resolve against the state as it will be once the earlier
            // batches of this response are observed (their claims included).
            let earlier: Vec<(i64, Origin)> = scan
                .claims
                .iter()
                .filter(|(_, o)| *o != origin)
                .copied()
                .collect();
            match salt_for(mirror, source, handle, origin, &earlier, now)? {
                SaltNeed::None => {}
                SaltNeed::TopicIds => return Ok(Some(Pending::TopicIds)),
                SaltNeed::Salt(salt) => pending.push(salt),
            }
        }
        if !scan.claims.is_empty() {
            new_total += scan.claims.len() as u64;
            claims.push((handle.clone(), scan.claims));
        }
    }
    if !pending.is_empty() {
        return Ok(Some(Pending::Salts(pending)));
    }
    let max = mirror.registry.config().max_producers;
    if new_total > 0 && mirror.registry.total_producers() + new_total > max {
        return Err(mirror.state_limit(MirrorError::ProducerLimit {
            tracked: mirror.registry.total_producers(),
            new: new_total,
            max,
        }));
    }
    if !claims.is_empty() && mirror.salts.durable() {
        return Ok(Some(Pending::Claims(claims)));
    }

    // Phase 2: observe and rewrite.
    let mut sink: Vec<Anomaly> = Vec::new();
    for (i, slice) in slices.iter().enumerate() {
        let handle = &slice.handle;
        let slice_corrupt = corrupt
            .iter()
            .find(|(j, _)| *j == i)
            .map_or(&[][..], |(_, c)| c.as_slice());
        if let Some(records) = body.get_mut(slice.records.clone()) {
            rewrite_partition_records(
                mirror,
                source,
                handle,
                records,
                now,
                &mut sink,
                true,
                fetcher,
                slice_corrupt,
            )?;
        }
        if !slice.aborted.is_empty() && mirror.mode == PidMode::Region {
            rewrite_aborted(mirror, source, handle, body, &slice.aborted);
        }
    }
    Ok(None)
}

/// Phase 0 for one partition of the fetcher's response whose first entry
/// is at offset `first`.
pub(super) enum Ownership {
    /// Served here, nothing to read first.
    Ready,
    /// Not served here yet (or served elsewhere since): take it over.
    TakeOver(handover::TakeOver),
    /// Served here but the fetcher is past its state (a gap): read
    /// `__mirror_state` again first.
    Recheck(handover::TakeOver),
}

/// Whether the fetcher's partition `key`, first entry at `first`, must be
/// taken over (or its state read again) before anything of it is forwarded.
/// Marks it owned when there is no shared state to hand over from.
pub(super) fn ownership(
    mirror: &MirrorContext,
    key: &PartitionKey,
    handle: &PartitionHandle,
    first: i64,
) -> Ownership {
    let owned = mirror.is_owned(key);
    if owned && !mirror.salts.shared() {
        return Ownership::Ready;
    }
    if owned {
        // A fetcher ahead of the state it was served from here: the
        // partition may have been served elsewhere in between (a move away
        // and back within one tail round), or the source has a gap
        // (compaction). Reading the state settles it.
        if mirror.is_warm(key)
            && first > handle.with(|s| s.next_offset())
            && !mirror.gap_checked(key, first)
        {
            return Ownership::Recheck(handover::TakeOver {
                key: key.clone(),
                from_offset: first,
            });
        }
        return Ownership::Ready;
    }
    if mirror.salts.shared() {
        return Ownership::TakeOver(handover::TakeOver {
            key: key.clone(),
            from_offset: first,
        });
    }
    // No shared state: no other instance to hand over from.
    mirror.mark_owned(key);
    Ownership::Ready
}

/// The source range the fetcher's partition `key` (not warm yet, first
/// entry at `first`) must replay into its state before any of its batches
/// is mapped, if any; marks it warm when there is none.
pub(super) fn replay_job(
    mirror: &MirrorContext,
    key: &PartitionKey,
    handle: &PartitionHandle,
    first: i64,
) -> Option<replay::ReplayJob> {
    let next = handle.with(|s| s.next_offset());
    match mirror.source_topic(&key.topic) {
        Some(source_topic) if next < first => Some(replay::ReplayJob {
            key: key.clone(),
            source_topic,
            partition: key.partition,
            from: next,
            upto: first,
        }),
        _ => {
            if next < first {
                // Nothing to replay from: what lies between is not observed.
                handle.with(|s| s.closings_unknown_below(first));
            }
            mirror.mark_warm(key);
            None
        }
    }
}

/// What a colliding origin needs before its batches leave.
pub(super) enum SaltNeed {
    /// No collision any more (resolved meanwhile).
    None,
    /// The destination topic id, which seeds the salt sequence.
    TopicIds,
    /// This salt persisted.
    Salt(PendingSalt),
}

/// Resolves the collision of `origin` in `handle`'s partition against its
/// state with the claims `earlier` added (batches of the same response
/// before it, not observed yet); counts and logs a resolved one.
pub(super) fn salt_for(
    mirror: &MirrorContext,
    source: &SourceIdentity,
    handle: &PartitionHandle,
    origin: Origin,
    earlier: &[(i64, Origin)],
    now: i64,
) -> Result<SaltNeed, MirrorError> {
    let key = handle.key();
    // The salt sequence is seeded by the destination topic id.
    let Some(topic_id) = mirror.salts.topic_id(&key.topic) else {
        return Ok(SaltNeed::TopicIds);
    };
    let pid = origin.original_pid;
    let map = |salt: i64| mirror.map(source, pid, salt);
    let choice = handle.with(|state| {
        let with_claims;
        let state = if earlier.is_empty() {
            &*state
        } else {
            let mut s = state.clone_for_lookup();
            for (mapped, o) in earlier {
                s.claim(*mapped, *o, now);
            }
            with_claims = s;
            &with_claims
        };
        match state.lookup_mapping(&origin, &map) {
            MappingLookup::Ready { .. } => None,
            MappingLookup::Collision { .. } => Some(resolve_collision_for_topic(
                state,
                &topic_id,
                &origin,
                &map,
                DEFAULT_MAX_SALT_CANDIDATES,
            )),
        }
    });
    match choice {
        None => Ok(SaltNeed::None),
        Some(Ok(choice)) => {
            mirror.metrics.collisions.inc();
            tracing::warn!(mirror = %mirror.name, partition = %key, %origin,
                holder = %choice.holder, salt = choice.salt, mapped_pid = choice.mapped_pid,
                "PID collision: two origins map to one PID; persisting a salt before forwarding");
            Ok(SaltNeed::Salt(PendingSalt {
                partition: key.clone(),
                origin,
                choice,
                timestamp_ms: now,
            }))
        }
        Some(Err(e)) => Err(MirrorError::Collision(e)),
    }
}

/// What one scan of a partition's batches found (see phase 1).
#[derive(Default)]
pub(super) struct Scan {
    /// Origins whose mapped PID another origin holds (region mode).
    pub(super) colliding: Vec<Origin>,
    /// (mapped PID, origin) pairs no one holds yet.
    pub(super) claims: Vec<(i64, Origin)>,
    /// Index of `claims` by mapped PID (a response may start thousands of
    /// producers: a linear search per batch would be quadratic).
    pub(super) claimed: std::collections::HashMap<i64, Origin>,
    /// Start positions (within the partition's records, in order) of the
    /// batches that would have created durable state (a claim, a salt) but
    /// whose CRC-32C does not verify: they create none and leave as they
    /// came (phase 2).
    pub(super) corrupt: Vec<usize>,
}

/// What one batch would create before it may leave (header only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BatchNeed {
    /// Nothing durable.
    Nothing,
    /// Its origin collides with another on the mapped PID: a salt.
    Salt(Origin),
    /// Its producer is new to the partition: a claim on the mapped PID.
    Claim(i64, Origin),
}

/// What batch `h` would need against `state`, from its header alone.
pub(super) fn batch_need(
    mirror: &MirrorContext,
    source: &SourceIdentity,
    state: &ps::PartitionState,
    h: &crate::records::BatchHeader,
) -> BatchNeed {
    let pid = h.producer_id;
    if pid == -1 {
        return BatchNeed::Nothing;
    }
    let origin = source.origin(pid);
    let mapped = if region_maps(mirror, pid) {
        match state.lookup_mapping(&origin, &|salt| mirror.map(source, pid, salt)) {
            MappingLookup::Ready { mapped_pid, .. } => mapped_pid,
            MappingLookup::Collision { .. } => return BatchNeed::Salt(origin),
        }
    } else {
        pid
    };
    // Markers do not start producers; data batches do. A batch below what
    // the state has seen (a re-fetch) starts nothing again: its producer may
    // be gone for a reason (a barrier after it).
    if !h.is_control()
        && h.last_offset() >= state.next_offset()
        && state.holder_of(mapped).is_none()
    {
        return BatchNeed::Claim(mapped, origin);
    }
    BatchNeed::Nothing
}

/// Whether the batch `h` of `records` may create durable state: its CRC-32C
/// verifies (one full pass, only for batches that would start a producer or
/// need a salt). A corrupt one is listed in `scan.corrupt` instead.
pub(super) fn verified(records: &[u8], h: &crate::records::BatchHeader, scan: &mut Scan) -> bool {
    let ok = records
        .get(h.range.clone())
        .is_some_and(crate::records::verify_crc);
    if !ok {
        scan.corrupt.push(h.range.start);
    }
    ok
}

/// Scans `records` against `state`. Allocates only when it finds something
/// (new producers and collisions are rare). Reads batch headers only, except
/// that a batch that would create durable state (a new producer's claim, a
/// collision's salt) is verified first: a corrupted header (a flipped PID)
/// must never write a claim or a salt.
pub(super) fn scan_partition(
    mirror: &MirrorContext,
    source: &SourceIdentity,
    state: &ps::PartitionState,
    records: &[u8],
) -> Scan {
    scan_partition_from(mirror, source, state, records, Scan::default(), false)
}

/// [`scan_partition`] continuing `scan` (the streamed walk seeds it with the
/// claims found earlier in the same partition of the response). With
/// `to_barrier` the scan ends at a MIRROR_PID_RESET barrier: the producers
/// it expires are new after it, so nothing past it is decided against the
/// state from before it (the streamed walk; the held path looks ahead).
pub(super) fn scan_partition_from(
    mirror: &MirrorContext,
    source: &SourceIdentity,
    state: &ps::PartitionState,
    records: &[u8],
    mut scan: Scan,
    to_barrier: bool,
) -> Scan {
    for entry in walk(records) {
        let h = match entry {
            Ok(Entry::V2(h)) => h,
            Ok(Entry::Legacy { .. }) => continue, // v2 batches after it still count
            _ => break,
        };
        let batch = records.get(h.range.clone()).unwrap_or_default();
        if to_barrier
            && h.is_control()
            && crate::records::control::first_control_type(batch)
                == Some(crate::records::control::ControlType::MirrorPidReset)
        {
            break;
        }
        match batch_need(mirror, source, state, &h) {
            BatchNeed::Nothing => {}
            BatchNeed::Salt(origin) => {
                if !scan.colliding.contains(&origin) && verified(records, &h, &mut scan) {
                    scan.colliding.push(origin);
                }
            }
            BatchNeed::Claim(mapped, origin) => match scan.claimed.get(&mapped) {
                None => {
                    if verified(records, &h, &mut scan) {
                        scan.claimed.insert(mapped, origin);
                        scan.claims.push((mapped, origin));
                    }
                }
                // Two origins on one PID within this response (an already
                // mapped PID that a source PID maps onto): a collision too.
                Some(first) if *first != origin => {
                    if !scan.colliding.contains(&origin) && verified(records, &h, &mut scan) {
                        scan.colliding.push(origin);
                    }
                }
                Some(_) => {}
            },
        }
    }
    scan
}
