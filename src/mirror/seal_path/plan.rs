//! Planning a Fetch request that touches controlled partitions: which
//! partitions are answered locally, which are forwarded, and the durable
//! decisions (taking the cut, completing the seal) that must come first.

use super::jobs::{Effect, PersistJob, SealJobs};
use super::*;

/// Decides what to do with a Fetch request; `None` when nothing is controlled.
///
/// Fetch sessions (KIP-227): a request that carries a session (epoch >= 0)
/// is always forwarded, even when every partition it lists is answered
/// locally, so the upstream sees every session epoch. Controlled partitions
/// are dropped from it, and in an incremental request every controlled
/// partition not yet known to be out of the session is added to
/// `forgotten_topics_data`: the upstream then never returns source records
/// or errors for them, listed or not. Whatever the upstream still returns
/// for a controlled partition the fetcher did not list is dropped from the
/// response (see [`drop_strays`]).
pub fn plan_fetch(
    mirror: &MirrorContext,
    h: &RequestHeader,
    frame: &[u8],
    fetcher: bool,
) -> Result<Option<RequestAction>, RewriteError> {
    if !mirror.lifecycle.controls() && !mirror.sessions.any() {
        mirror.sessions.forget_holds();
        return Ok(None);
    }
    let hv = handlers::request_header_version(h.api_key, h.api_version)
        .ok_or_else(|| err(h.api_version, "unknown request header version".into()))?;
    let at = request_body_offset(frame, hv).map_err(|e| err(h.api_version, e.to_string()))?;
    let body = frame.get(at..).unwrap_or(&[]);
    let req =
        parse_fetch_request(h.api_version, body).map_err(|e| err(h.api_version, e.to_string()))?;
    let mut controlled = Vec::new();
    let mut below_cut: Vec<BelowCut> = Vec::new();
    let mut below_cut_keys: Vec<PartitionKey> = Vec::new();
    let mut total = 0;
    // A listed partition whose seal is (about to be) served: the upstream
    // must not hold the answer for MaxWaitMs.
    let mut serving = false;
    // The fetcher's session request: what its session holds from now on
    // (a full request) or holds as well (an incremental one).
    let session_listing = fetcher && h.api_version >= 7 && req.session_epoch >= 0;
    let mut listed: Vec<PartitionKey> = Vec::new();
    for t in &req.topics {
        for p in &t.partitions {
            total += 1;
            let key = mirror.partition_key(&t.topic, p.partition);
            if session_listing {
                listed.push(key.clone());
            }
            let Some(entry) = mirror.lifecycle.get(&key) else {
                continue;
            };
            // Another mirror's partition is refused (a partition is fed by
            // one mirror at a time); a protected partition's episode starts at
            // the fetcher's fetch; otherwise MIRRORING is forwarded.
            let other_mirror = entry.mirror != mirror.name;
            if !other_mirror
                && entry.state == State::Mirroring
                && !(fetcher && entry.start_pending())
            {
                continue;
            }
            if other_mirror || entry.start_pending() {
                serving = true;
                controlled.push(Controlled::listed(&t.topic, p, key));
                continue;
            }
            // A reader below the cut of a sealed (or sealing) partition reads
            // what the destination holds there: the source's records up to
            // the cut, from the source.
            if let (false, State::Stopping | State::Stopped, Some(cut)) =
                (fetcher, entry.state, entry.cut)
            {
                if p.fetch_offset < cut {
                    below_cut.push(BelowCut {
                        topic: TopicRef::of(&t.topic),
                        partition: p.partition,
                        key: key.clone(),
                        cut,
                        end: cut + i64::from(entry.seal_batches.unwrap_or(0).max(0)),
                        sealed_aborts: entry
                            .seal
                            .as_ref()
                            .map(|plan| plan.open_txns.as_slice())
                            .or(entry.restored_open_txns.as_deref())
                            .unwrap_or(&[])
                            .iter()
                            .map(|t| (t.producer_id, t.first_offset))
                            .collect(),
                    });
                    below_cut_keys.push(key);
                    continue;
                }
            }
            if entry.state == State::Stopping && fetcher {
                serving |= match (entry.cut, entry.seal_batches) {
                    (None, _) => true,
                    (Some(cut), n) => p.fetch_offset < cut + i64::from(n.unwrap_or(1)),
                };
            }
            if fetcher {
                mirror.lifecycle.note_fetch(&key, p.fetch_offset);
            }
            controlled.push(Controlled::listed(&t.topic, p, key));
        }
    }
    let has_session = h.api_version >= 7 && req.session_epoch >= 0;
    let incremental = has_session && req.session_id != 0 && req.session_epoch > 0;
    let is_listed = |k: &PartitionKey| controlled.iter().any(|c| c.key == *k);
    // Controlled partitions of this mirror that an incremental request left
    // out: they stay in the upstream session unless forgotten.
    let mut forget: Vec<(TopicRef, Vec<i32>)> = Vec::new();
    let mut forgotten_keys: Vec<PartitionKey> = Vec::new();
    let mut force_full_fetch = false;
    // Whether the upstream session leaves out sealed partitions of this
    // fetcher: it may then hold nothing to wait on.
    let mut session_has_out = false;
    if incremental {
        mirror.sessions.add_held(req.session_id, &listed);
        let (known_out, evicted) = mirror.sessions.out_of(req.session_id);
        session_has_out = !known_out.is_empty();
        // A session whose memory was evicted may hold partitions it was told
        // to forget: a full fetch lists what the fetcher holds again.
        force_full_fetch |= evicted;
        // A partition forgotten earlier that mirrors again (resumed): the
        // fetcher still counts it in its session and would never list it
        // again; a full fetch puts it back.
        let resumed = known_out.iter().any(|k| {
            mirror
                .lifecycle
                .get(k)
                .is_none_or(|e| e.state == State::Mirroring)
        });
        for e in mirror.lifecycle.controlled_of(&mirror.name).iter() {
            let key = mirror.key_for(&e.topic, e.partition);
            // A STOPPING partition without a cut needs the fetcher's
            // position, which an incremental request that leaves it out does
            // not carry: make the fetcher send a full fetch, if its session
            // may hold the partition (one session error per session; the
            // full request that follows says what the new one holds).
            if fetcher
                && e.state == State::Stopping
                && e.cut.is_none()
                && !is_listed(&key)
                && mirror.sessions.may_hold(req.session_id, &key)
            {
                force_full_fetch = true;
            }
            // Listed or not, it leaves the upstream session: a listed one is
            // dropped from the request, which alone would leave it in the
            // session at its old position. A reader's partition read below
            // its cut is asked of the source: it stays.
            if known_out.contains(&key) || below_cut_keys.contains(&key) {
                continue;
            }
            let Some(topic) = source_topic_ref(mirror, &key, h.api_version) else {
                continue;
            };
            match forget.iter_mut().find(|(t, _)| *t == topic) {
                Some((_, v)) => v.push(e.partition),
                None => forget.push((topic, vec![e.partition])),
            }
            forgotten_keys.push(key);
        }
        if resumed {
            force_full_fetch = true;
        }
    }
    if force_full_fetch {
        mirror.sessions.reset_session(req.session_id);
        mirror.seal_metrics.session_resets.inc();
        let plan = RequestState::Seal(FetchPlan {
            controlled,
            below_cut,
            read_committed: req.isolation_level == 1,
            force_full_fetch: true,
            session_id: req.session_id,
            session_epoch: req.session_epoch,
            out_of_session: Vec::new(),
            listed: None,
            fetcher,
            max_wait_ms: req.max_wait_ms,
            waited: false,
            hold_until: None,
        });
        return Ok(Some(RequestAction::Answer(plan)));
    }
    // A fetcher's new session is planned anyway: its response names the
    // session, which then holds what the request listed.
    let new_session = session_listing && req.session_epoch == 0 && mirror.lifecycle.controls();
    if controlled.is_empty()
        && forget.is_empty()
        && below_cut.is_empty()
        && !session_has_out
        && !new_session
    {
        return Ok(None);
    }
    let hold_until = (!serving && req.max_wait_ms > 0 && req.min_bytes > 0).then(|| {
        let ms = req.max_wait_ms.min(MAX_LOCAL_WAIT_MS) as u64;
        std::time::Instant::now() + std::time::Duration::from_millis(ms)
    });
    let all_controlled = controlled.len() == total;
    let mut out_of_session: Vec<PartitionKey> = controlled.iter().map(|c| c.key.clone()).collect();
    out_of_session.extend(forgotten_keys);
    let plan = FetchPlan {
        controlled,
        below_cut,
        read_committed: req.isolation_level == 1,
        force_full_fetch: false,
        session_id: req.session_id,
        session_epoch: req.session_epoch,
        out_of_session,
        listed: (session_listing && req.session_epoch == 0).then_some(listed),
        fetcher,
        max_wait_ms: req.max_wait_ms,
        waited: false,
        hold_until,
    };
    // Without a session nothing upstream needs to see the request.
    if all_controlled && !has_session {
        return Ok(Some(RequestAction::Answer(RequestState::Seal(plan))));
    }
    // Controlled partitions are never asked of the source: drop them from
    // the forwarded request (their entries are added to the response).
    let forget_refs: Vec<(FetchTopic<'_>, Vec<i32>)> = forget
        .iter()
        .map(|(t, ps)| (t.as_fetch_topic(), ps.clone()))
        .collect();
    let kept = rewrite_fetch_request(
        h.api_version,
        body,
        &mut |t, p| {
            !plan
                .controlled
                .iter()
                .any(|c| c.topic.as_fetch_topic() == *t && c.partition == p)
        },
        &forget_refs,
        serving.then_some(0),
    )
    .map_err(|e| err(h.api_version, e.to_string()))?;
    let replacement = (kept.as_slice() != body).then(|| {
        let mut f = BytesMut::with_capacity(at + kept.len());
        f.put_i32((at - 4 + kept.len()) as i32);
        f.extend_from_slice(&frame[4..at]);
        f.extend_from_slice(&kept);
        f
    });
    Ok(Some(RequestAction::Forward {
        replacement,
        state: Some(RequestState::Seal(plan)),
    }))
}

/// Runs the decisions of every controlled partition; returns the answers, or
/// one wait for all the durable work they need first (take-overs, replays,
/// persists: see [`jobs`](super::jobs)), after which the fetch is decided
/// again (`version`, the request's Fetch version, is named in its errors).
pub(super) fn decide_all(
    mirror: &Arc<MirrorContext>,
    plan: &FetchPlan,
    version: i16,
) -> Result<Vec<LocalPartition>, Rewritten> {
    // Take-overs go in a round of their own: they read `__mirror_state` to
    // its end, and what they read (another instance's newer step) is what
    // the other partitions' decisions must be made on.
    let take_overs = take_overs_needed(mirror, plan);
    if !take_overs.is_empty() {
        let jobs = SealJobs {
            take_overs,
            ..SealJobs::default()
        };
        return Err(jobs.into_wait(mirror.clone(), version));
    }
    let mut answers = Vec::with_capacity(plan.controlled.len());
    let mut effects = Vec::new();
    let mut jobs = SealJobs::default();
    // One job per partition per round (Kafka never lists a partition twice
    // in a Fetch; a request that does gets its repeats decided next round).
    let mut with_job = std::collections::HashSet::new();
    for c in &plan.controlled {
        if with_job.contains(&c.key) {
            answers.push(LocalPartition::empty_at(c.fetch_offset));
            continue;
        }
        let Some(entry) = mirror.lifecycle.get(&c.key) else {
            // Resumed meanwhile: serve nothing this time.
            answers.push(LocalPartition::empty_at(c.fetch_offset));
            continue;
        };
        if entry.mirror != mirror.name {
            effects.push(Effect::Refuse {
                key: c.key.clone(),
                why: format!(
                    "the partition belongs to mirror '{}' ({}, episode {}), not to '{}': a \
                     partition is fed by one mirror at a time; once STOPPED, \
                     `POST /v1/partitions/protect` naming '{}' hands it over",
                    entry.mirror,
                    entry.state.name(),
                    entry.episode,
                    mirror.name,
                    mirror.name
                ),
            });
            answers.push(LocalPartition::refused_at(
                c.fetch_offset,
                crate::lifecycle::seal::POLICY_VIOLATION,
            ));
            continue;
        }
        if !plan.fetcher {
            answers.push(serve_reader(&entry, c.fetch_offset));
            continue;
        }
        // Taking the cut here when another instance served the partition
        // (or nobody here did yet): take it over first, as the fetch path
        // does, so its producer state is brought up to date below.
        // A fetch below the cut plans the seal again there: the same.
        // Under the destination rule, serving a seal another instance
        // planned (a leadership move mid-seal, a restart) takes the
        // partition over too: only the instance serving the current
        // fetcher completes the seal (`dest_hw`), so it is completed once.
        let takes_cut = takes_cut(&entry, c);
        if fetch_takes_over(mirror, &entry, c) {
            // Taken over since `take_overs_needed` looked (another instance's
            // serving record read meanwhile): next round.
            with_job.insert(c.key.clone());
            jobs.take_overs.push(crate::mirror::handover::TakeOver {
                key: c.key.clone(),
                from_offset: c.fetch_offset,
            });
            continue;
        }
        // Taking the cut needs the open transactions: after a restart the
        // producer state may lag the fetcher; replay the source first.
        if takes_cut && !mirror.is_warm(&c.key) {
            let next = mirror.registry.partition(&c.key).with(|s| s.next_offset());
            match mirror.source_topic(&c.key.topic) {
                Some(source_topic) if next < c.fetch_offset => {
                    with_job.insert(c.key.clone());
                    jobs.replays.push(crate::mirror::replay::ReplayJob {
                        key: c.key.clone(),
                        source_topic,
                        partition: c.partition,
                        from: next,
                        upto: c.fetch_offset,
                    });
                    continue;
                }
                _ => mirror.mark_warm(&c.key),
            }
        }
        let registry = mirror.registry.clone();
        let key = c.key.clone();
        let cut = c.fetch_offset;
        let closed_past_cut = mirror.seal_metrics.closed_past_cut.clone();
        let incomplete = mirror.seal_metrics.open_at_cut_incomplete.clone();
        let unseen_range_aborts = mirror.seal_metrics.unseen_range_aborts.clone();
        let retention = mirror.closings_retention;
        // The transactions open AT THE CUT: the shadow state may be ahead of
        // it (a response the fetcher lost was walked), so a transaction
        // closed past the cut is still open there, and one opened past it
        // is not.
        let open = move || -> Vec<OpenTxn> {
            registry
                .get(&key)
                .map(|h| {
                    h.with(|s| {
                        // The cut is the fetcher's fetch offset: it appended
                        // everything below it.
                        s.note_fetcher_position(cut, retention);
                        let at = s.open_at(cut);
                        if s.next_offset() > cut {
                            tracing::warn!(partition = %key, cut, state_offset = s.next_offset(),
                                closed_past_cut = at.closed_past_cut,
                                "producer state is ahead of the cut (a response the fetcher did not append): \
                                 open transactions are taken as they are at the cut");
                        }
                        closed_past_cut.inc_by(at.closed_past_cut as u64);
                        if at.unseen_range_candidates > 0 {
                            let sent = at
                                .unseen_range_candidates
                                .min(crate::producer_state::MAX_UNSEEN_RANGE_ABORTS);
                            unseen_range_aborts.inc_by(sent as u64);
                            tracing::warn!(partition = %key, cut, state_offset = s.next_offset(),
                                producers = at.unseen_range_candidates, aborted = sent,
                                "the producer state never saw the offsets below the cut from its \
                                 snapshot on (the source could not be replayed): every producer \
                                 that may have begun a transaction there (the transactional \
                                 producers it knows, those claimed since) gets an ABORT marker");
                        }
                        if at.unseen_range_truncated {
                            incomplete.inc();
                            tracing::warn!(partition = %key, cut,
                                bound = crate::producer_state::MAX_UNSEEN_RANGE_ABORTS,
                                producers = at.unseen_range_candidates,
                                "more producers may have begun a transaction in the unseen range \
                                 than one seal aborts: those past the bound get no ABORT marker \
                                 (`ctl abort-open` closes them after promotion)");
                        } else if at.incomplete {
                            incomplete.inc();
                            tracing::warn!(partition = %key, cut,
                                bound = crate::producer_state::MAX_CLOSED_TRANSACTIONS,
                                retained_offsets = retention.offsets, retained_max = retention.max,
                                "transaction closings past the cut may be unknown (dropped at their bound, \
                                 lost with a restart, or pruned below the fetcher's position before \
                                 the destination truncated further back): \
                                 transactions they closed get no ABORT marker in this seal \
                                 (`ctl abort-open` closes them after promotion)");
                        }
                        at.transactions
                            .into_iter()
                            .map(|t| OpenTxn {
                                producer_id: t.txn.mapped_pid,
                                producer_epoch: t.txn.epoch,
                                coordinator_epoch: t.coordinator_epoch,
                                first_offset: t.txn.first_offset,
                                origin_cluster: t.txn.origin.source_cluster.0,
                                original_pid: t.txn.origin.original_pid,
                            })
                            .collect()
                    })
                })
                .unwrap_or_default()
        };
        // Without LastFetchedEpoch (Fetch < v12) the seal is stamped with
        // the epoch of the last batch forwarded to the fetcher.
        let last_fetched_epoch = if c.last_fetched_epoch >= 0 {
            c.last_fetched_epoch
        } else {
            mirror
                .registry
                .get(&c.key)
                .map(|h| h.with(|s| s.last_leader_epoch()))
                .unwrap_or(-1)
        };
        // Under the destination rule the fetch path never completes a seal
        // itself: the gate does, once the high watermark passed its end.
        let rule = match mirror.destination_hw() {
            Some(_) => StopRule::DestinationHw(None),
            None => StopRule::FetcherOffset,
        };
        match decide(
            &c.key,
            &entry,
            c.fetch_offset,
            last_fetched_epoch,
            c.current_leader_epoch,
            &open,
            rule,
        ) {
            Decision::AwaitHw { answer, end } => {
                effects.push(Effect::Watch {
                    key: c.key.clone(),
                    end,
                });
                answers.push(answer)
            }
            Decision::Refuse { answer, why } => {
                effects.push(Effect::Refuse {
                    key: c.key.clone(),
                    why,
                });
                answers.push(answer)
            }
            Decision::PastEnd { answer, end } => {
                effects.push(Effect::PastEnd {
                    key: c.key.clone(),
                    end,
                    fetch_offset: c.fetch_offset,
                });
                answers.push(answer)
            }
            Decision::Answer(a) => {
                effects.push(Effect::Served {
                    aborts: a.aborts_served,
                    barriers: a.barriers_served,
                });
                answers.push(a)
            }
            Decision::Persist(next) => {
                let starts_episode = entry.start_pending() && next.episode_start.is_some();
                let fails = next.state == State::Failed;
                let fails_past_end = fails
                    && entry
                        .cut
                        .zip(entry.seal_batches)
                        .is_some_and(|(cut, n)| c.fetch_offset > cut + i64::from(n));
                if fails_past_end {
                    mirror.seal_metrics.fetches_past_end.inc();
                }
                if next.state == State::Stopping
                    && entry.cut.is_some_and(|cut| c.fetch_offset < cut)
                {
                    mirror.seal_metrics.replanned_below_cut.inc();
                }
                with_job.insert(c.key.clone());
                jobs.persists.push(PersistJob {
                    key: c.key.clone(),
                    entry,
                    next,
                    starts_episode,
                    fails,
                    fails_past_end,
                });
            }
        }
    }
    if !jobs.is_empty() {
        return Err(jobs.into_wait(mirror.clone(), version));
    }
    for effect in effects {
        effect.apply(mirror);
    }
    Ok(answers)
}

/// The partitions of a fetcher's request that must be taken over before
/// they are decided (the same test as in [`decide_all`]).
fn take_overs_needed(
    mirror: &MirrorContext,
    plan: &FetchPlan,
) -> Vec<crate::mirror::handover::TakeOver> {
    if !plan.fetcher || !mirror.salts.shared() {
        return Vec::new();
    }
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for c in &plan.controlled {
        let Some(entry) = mirror.lifecycle.get(&c.key) else {
            continue;
        };
        if entry.mirror != mirror.name || !seen.insert(c.key.clone()) {
            continue;
        }
        if fetch_takes_over(mirror, &entry, c) {
            out.push(crate::mirror::handover::TakeOver {
                key: c.key.clone(),
                from_offset: c.fetch_offset,
            });
        }
    }
    out
}

/// Whether this fetch takes the cut of a STOPPING partition (none taken
/// yet, or a fetch below it: the seal is planned again there).
fn takes_cut(entry: &crate::lifecycle::Entry, c: &Controlled) -> bool {
    entry.state == State::Stopping && entry.cut.is_none_or(|cut| c.fetch_offset < cut)
}

/// Whether the fetcher's fetch of `c` must take the partition over before
/// it is decided: it takes the cut, or (under the destination rule) serves
/// a seal, of a partition this instance does not serve.
fn fetch_takes_over(
    mirror: &MirrorContext,
    entry: &crate::lifecycle::Entry,
    c: &Controlled,
) -> bool {
    (takes_cut(entry, c) || mirror.destination_hw().is_some())
        && seal_needs_take_over(entry, mirror.is_owned(&c.key), mirror.salts.shared())
}

/// Whether the destination fetcher's fetch of a controlled partition must
/// take it over before it is answered: a STOPPING partition (its cut taken
/// here, the seal planned again, or a seal served or awaited) this instance
/// does not serve, when instances share `__mirror_state`.
pub(crate) fn seal_needs_take_over(
    entry: &crate::lifecycle::Entry,
    owned: bool,
    shared: bool,
) -> bool {
    entry.state == State::Stopping && !owned && shared
}

/// What follows a persisted episode start: the partition's shadow
/// producer state starts empty at the fetcher's offset (nothing below it
/// is this episode's: the barrier ended the one before), and nothing is
/// replayed; this instance serves it.
pub(super) fn start_episode(
    mirror: &MirrorContext,
    key: &PartitionKey,
    entry: &crate::lifecycle::Entry,
) {
    let Some(start) = entry.episode_start else {
        return;
    };
    mirror
        .registry
        .partition(key)
        .with(|s| s.start_episode_at(start));
    mirror.mark_warm(key);
    mirror.seal_metrics.episodes_started.inc();
    tracing::info!(mirror = %mirror.name, partition = %key, episode = entry.episode, start,
        "new mirroring episode started: the shadow producer state starts empty at the fetcher's offset");
}

/// Counts a refused fetch of a controlled partition and says why, once per
/// partition (the fetcher retries after its back-off).
pub(super) fn refuse(mirror: &MirrorContext, key: &PartitionKey, why: String) {
    mirror.seal_metrics.fetches_refused.inc();
    let first = mirror
        .seal_metrics
        .refused_warned
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key.clone());
    if first {
        tracing::warn!(mirror = %mirror.name, partition = %key, "fetch refused: {why}");
    } else {
        tracing::debug!(mirror = %mirror.name, partition = %key, "fetch refused: {why}");
    }
}

/// What follows a persisted STOPPED: the destination appended the ABORT
/// markers and the barrier, so its producer state is expired, and so is
/// ours (open transactions included, which idle expiry never drops).
pub(crate) fn after_stopped(mirror: &MirrorContext, key: &PartitionKey) {
    if let Some(h) = mirror.registry.get(key) {
        h.with(|s| {
            s.reset();
            s.forget_closed();
        });
    }
    mirror.seal_metrics.completed.inc();
}
