//! The seal on the fetch path: Fetch requests that touch controlled
//! partitions (PAUSED, STOPPING, STOPPED, FAILED) and the responses they get.
//!
//! Requests are only parsed when some partition is controlled. A request
//! whose partitions are all controlled is answered by the proxy and never
//! reaches the source; otherwise it is forwarded and the controlled
//! partitions' entries in the response are replaced (or added, when an
//! incremental session left them out), so no source byte past the cut ever
//! reaches the fetcher. Decisions that must be durable first (taking the
//! cut, completing the seal) block the response until `__mirror_state`
//! acknowledges them.
//!
//! A reader that is not the destination fetcher and reads below the cut of
//! a STOPPING or STOPPED partition reads what the destination holds there:
//! that partition is forwarded to the source like a MIRRORING one (mapped,
//! never observed) and its answer is cut at the cut.

use std::borrow::Cow;
use std::sync::Arc;

use bytes::{BufMut, BytesMut};

use crate::codec::header::{request_body_offset, response_body_offset};
use crate::codec::RequestHeader;
use crate::filter::{RequestAction, RequestState, RewriteError, Rewritten};
use crate::handlers::{
    self, build_fetch_response, parse_fetch_request, rewrite_fetch_request,
    splice_fetch_response_dropping, FetchPartitionResponse, FetchTopic,
};
use crate::lifecycle::seal::{decide, serve_reader, Decision, LocalPartition, OpenTxn};
use crate::producer_state::PartitionKey;
use crate::state_store::schema::MirrorPartitionState as State;

use super::MirrorContext;

/// Kafka's FETCH_SESSION_ID_NOT_FOUND: the fetcher starts a full fetch.
const FETCH_SESSION_ID_NOT_FOUND: i16 = 70;

/// A topic reference that outlives the request frame.
#[derive(Debug, Clone, PartialEq, Eq)]
enum TopicRef {
    Name(String),
    Id([u8; 16]),
}

impl TopicRef {
    fn as_fetch_topic(&self) -> FetchTopic<'_> {
        match self {
            TopicRef::Name(n) => FetchTopic::Name(n),
            TopicRef::Id(id) => FetchTopic::Id(*id),
        }
    }
}

/// One controlled partition of a request.
#[derive(Debug, Clone)]
struct Controlled {
    topic: TopicRef,
    partition: i32,
    key: PartitionKey,
    fetch_offset: i64,
    last_fetched_epoch: i32,
    current_leader_epoch: i32,
}

/// A sealed partition a reader (not the destination fetcher) reads below
/// its cut: forwarded to the source, and the answer cut there.
#[derive(Debug, Clone)]
struct BelowCut {
    topic: TopicRef,
    partition: i32,
    /// The destination partition (for metrics and logs).
    key: PartitionKey,
    /// The cut: batches at or past it never reach the reader.
    cut: i64,
    /// The destination's log end once sealed (cut + sealing batches, or
    /// the cut while their number is unknown): the highest watermark shown.
    end: i64,
    /// (mapped PID, first offset) of the transactions the seal aborts at the
    /// cut: aborted on the destination whatever the source did past the cut,
    /// so a read_committed reader is told so.
    sealed_aborts: Vec<(i64, i64)>,
}

/// The plan of a Fetch request on a mirror listener.
#[derive(Debug)]
pub struct FetchPlan {
    controlled: Vec<Controlled>,
    /// Sealed partitions a reader reads below the cut (forwarded).
    below_cut: Vec<BelowCut>,
    read_committed: bool,
    /// Answer with FETCH_SESSION_ID_NOT_FOUND (forces a full fetch that lists
    /// every partition with its offset).
    force_full_fetch: bool,
    session_id: i32,
    session_epoch: i32,
    /// Controlled partitions the forwarded request keeps out of the upstream
    /// session (dropped from the request, or added to its forgotten topics):
    /// remembered once the upstream accepted the request.
    out_of_session: Vec<PartitionKey>,
    /// Whether the request came in on the destination fetcher's listener.
    fetcher: bool,
    /// The request's MaxWaitMs: a local answer with no records is held this
    /// long, as a broker holds a Fetch that finds nothing, so a fetcher of a
    /// sealed partition polls at its own pace instead of spinning.
    max_wait_ms: i32,
    /// Set once the local answer has waited.
    waited: bool,
}

/// The longest a local answer with no records is held (a hostile MaxWaitMs
/// cannot park a request for longer).
const MAX_LOCAL_WAIT_MS: i32 = 30_000;

/// Controlled partitions known to be out of an upstream fetch session, by
/// session id (KIP-227). A partition forgotten in a session is not sent to
/// forget again; a forgotten partition that is MIRRORING again (resumed)
/// makes the fetcher start a new full session, since the fetcher still
/// counts it in its session and would otherwise never ask for it again.
#[derive(Default)]
pub struct SessionMemory {
    out: std::sync::Mutex<std::collections::HashMap<i32, std::collections::HashSet<PartitionKey>>>,
    /// Number of sessions remembered (the fetch path's fast check).
    tracked: std::sync::atomic::AtomicUsize,
}

/// Sessions remembered per mirror; beyond it the memory starts over (the
/// cost is forgotten topics sent again, which a broker ignores).
const MAX_SESSIONS: usize = 4096;

impl SessionMemory {
    fn lock(
        &self,
    ) -> std::sync::MutexGuard<
        '_,
        std::collections::HashMap<i32, std::collections::HashSet<PartitionKey>>,
    > {
        self.out.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn any(&self) -> bool {
        self.tracked.load(std::sync::atomic::Ordering::Relaxed) > 0
    }

    fn out_of(&self, session_id: i32) -> std::collections::HashSet<PartitionKey> {
        self.lock().get(&session_id).cloned().unwrap_or_default()
    }

    fn note(&self, session_id: i32, keys: &[PartitionKey], fresh: bool) {
        let mut m = self.lock();
        if m.len() >= MAX_SESSIONS && !m.contains_key(&session_id) {
            m.clear();
        }
        let set = m.entry(session_id).or_default();
        if fresh {
            set.clear();
        }
        set.extend(keys.iter().cloned());
        if set.is_empty() {
            m.remove(&session_id);
        }
        self.tracked
            .store(m.len(), std::sync::atomic::Ordering::Relaxed);
    }

    fn forget_session(&self, session_id: i32) {
        let mut m = self.lock();
        m.remove(&session_id);
        self.tracked
            .store(m.len(), std::sync::atomic::Ordering::Relaxed);
    }
}

fn err(version: i16, message: String) -> RewriteError {
    RewriteError {
        api: "Fetch",
        version,
        message,
    }
}

/// The source topic of a destination partition as a Fetch request at
/// `version` names it (a name before v13, the id from v13).
fn source_topic_ref(mirror: &MirrorContext, key: &PartitionKey, version: i16) -> Option<TopicRef> {
    let name = mirror.source_topic(&key.topic)?;
    if version < 13 {
        return Some(TopicRef::Name(name));
    }
    let t = mirror.topics.read().unwrap_or_else(|p| p.into_inner());
    t.by_id
        .iter()
        .find(|(_, n)| ***n == *name)
        .map(|(id, _)| TopicRef::Id(*id))
}

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
    for t in &req.topics {
        for p in &t.partitions {
            total += 1;
            let key = mirror.partition_key(&t.topic, p.partition);
            let Some(entry) = mirror.lifecycle.get(&key) else {
                continue;
            };
            if entry.state == State::Mirroring {
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
                        topic: match t.topic {
                            FetchTopic::Name(n) => TopicRef::Name(n.to_string()),
                            FetchTopic::Id(id) => TopicRef::Id(id),
                        },
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
            controlled.push(Controlled {
                topic: match t.topic {
                    FetchTopic::Name(n) => TopicRef::Name(n.to_string()),
                    FetchTopic::Id(id) => TopicRef::Id(id),
                },
                partition: p.partition,
                key,
                fetch_offset: p.fetch_offset,
                last_fetched_epoch: p.last_fetched_epoch,
                current_leader_epoch: p.current_leader_epoch,
            });
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
    if incremental {
        let known_out = mirror.sessions.out_of(req.session_id);
        // A partition forgotten earlier that mirrors again (resumed): the
        // fetcher still counts it in its session and would never list it
        // again; a full fetch puts it back.
        let resumed = known_out.iter().any(|k| {
            mirror
                .lifecycle
                .get(k)
                .is_none_or(|e| e.state == State::Mirroring)
        });
        for e in mirror.lifecycle.list() {
            if e.mirror != mirror.name || e.state == State::Mirroring {
                continue;
            }
            let key = mirror.key_for(&e.topic, e.partition);
            // A STOPPING partition without a cut needs the fetcher's
            // position, which an incremental request that leaves it out does
            // not carry: make the fetcher send a full fetch (one session
            // error per seal).
            if fetcher && e.state == State::Stopping && e.cut.is_none() && !is_listed(&key) {
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
        mirror.sessions.forget_session(req.session_id);
        mirror.seal_metrics.session_resets.inc();
        let plan = RequestState::Seal(FetchPlan {
            controlled,
            below_cut,
            read_committed: req.isolation_level == 1,
            force_full_fetch: true,
            session_id: req.session_id,
            session_epoch: req.session_epoch,
            out_of_session: Vec::new(),
            fetcher,
            max_wait_ms: req.max_wait_ms,
            waited: false,
        });
        return Ok(Some(RequestAction::Answer(plan)));
    }
    if controlled.is_empty() && forget.is_empty() && below_cut.is_empty() {
        return Ok(None);
    }
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
        fetcher,
        max_wait_ms: req.max_wait_ms,
        waited: false,
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
/// a wait for the first decision that must be persisted.
fn decide_all(
    mirror: &Arc<MirrorContext>,
    plan: &FetchPlan,
) -> Result<Vec<LocalPartition>, Rewritten> {
    let mut answers = Vec::with_capacity(plan.controlled.len());
    for c in &plan.controlled {
        let Some(entry) = mirror.lifecycle.get(&c.key) else {
            // Resumed meanwhile: serve nothing this time.
            answers.push(LocalPartition::empty_at(c.fetch_offset));
            continue;
        };
        if !plan.fetcher {
            answers.push(serve_reader(&entry, c.fetch_offset));
            continue;
        }
        // Taking the cut needs the open transactions: after a restart the
        // producer state may lag the fetcher; replay the source first.
        if entry.state == State::Stopping && entry.cut.is_none() && !mirror.is_warm(&c.key) {
            let next = mirror.registry.partition(&c.key).with(|s| s.next_offset());
            match mirror.source_topic(&c.key.topic) {
                Some(source_topic) if next < c.fetch_offset => {
                    let job = super::replay::ReplayJob {
                        key: c.key.clone(),
                        source_topic,
                        partition: c.partition,
                        from: next,
                        upto: c.fetch_offset,
                    };
                    let (mirror, servers) = (mirror.clone(), mirror.replay_servers());
                    let max_frame = crate::config::DEFAULT_MAX_FRAME_BYTES as usize;
                    let key = c.key.clone();
                    return Err(Rewritten::Blocked {
                        frame: None,
                        wait: Box::pin(async move {
                            // The seal never needs the source (SPEC 3.1): when
                            // the replay cannot run, the cut is taken from the
                            // persisted producer state alone.
                            let limit = mirror.request_timeout;
                            let replay =
                                super::run_replays(mirror.clone(), servers, vec![job], max_frame);
                            let failed = match tokio::time::timeout(limit, replay).await {
                                Ok(Ok(())) => None,
                                Ok(Err(m)) => Some(m),
                                Err(_) => Some(format!("no answer within {limit:?}")),
                            };
                            if let Some(why) = failed {
                                tracing::warn!(partition = %key, error = %why,
                                    "source unreachable: sealing from the persisted producer state \
                                     (transactions begun after the last snapshot get no ABORT \
                                     marker; `ctl abort-open` closes them after promotion)");
                                mirror.mark_warm(&key);
                            }
                            Ok(())
                        }),
                    });
                }
                _ => mirror.mark_warm(&c.key),
            }
        }
        let registry = mirror.registry.clone();
        let key = c.key.clone();
        let cut = c.fetch_offset;
        let closed_past_cut = mirror.seal_metrics.closed_past_cut.clone();
        let incomplete = mirror.seal_metrics.open_at_cut_incomplete.clone();
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
                        s.note_fetcher_position(cut);
                        let at = s.open_at(cut);
                        if s.next_offset() > cut {
                            tracing::warn!(partition = %key, cut, state_offset = s.next_offset(),
                                closed_past_cut = at.closed_past_cut,
                                "producer state is ahead of the cut (a response the fetcher did not append): \
                                 open transactions are taken as they are at the cut");
                        }
                        closed_past_cut.inc_by(at.closed_past_cut as u64);
                        if at.incomplete {
                            incomplete.inc();
                            tracing::warn!(partition = %key, cut,
                                bound = crate::producer_state::MAX_CLOSED_TRANSACTIONS,
                                "transaction closings past the cut may be unknown (dropped at their bound, \
                                 or lost with a restart or a fetcher position that moved back): \
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
        match decide(
            &c.key,
            &entry,
            c.fetch_offset,
            last_fetched_epoch,
            c.current_leader_epoch,
            &open,
        ) {
            Decision::Answer(a) => {
                mirror
                    .seal_metrics
                    .aborts
                    .inc_by(u64::from(a.aborts_served));
                mirror
                    .seal_metrics
                    .barriers
                    .inc_by(u64::from(a.barriers_served));
                answers.push(a)
            }
            Decision::Persist(next) => {
                let lifecycle = mirror.lifecycle.clone();
                let registry = mirror.registry.clone();
                let key = c.key.clone();
                let completed = mirror.seal_metrics.completed.clone();
                let becomes_stopped = next.state == State::Stopped;
                let version = 0;
                return Err(Rewritten::Blocked {
                    frame: None,
                    wait: Box::pin(async move {
                        lifecycle
                            .commit(&key, *next)
                            .await
                            .map_err(|e| err(version, e.to_string()))?;
                        if becomes_stopped {
                            // The destination appended the ABORT markers and
                            // the barrier: its producer state is expired, so
                            // is ours (open transactions included, which idle
                            // expiry never drops).
                            if let Some(h) = registry.get(&key) {
                                h.with(|s| {
                                    s.reset();
                                    s.forget_closed();
                                });
                            }
                            completed.inc();
                            tracing::info!(partition = %key, "seal complete: partition STOPPED; its fetches are answered locally from now on");
                        }
                        Ok(())
                    }),
                });
            }
        }
    }
    Ok(answers)
}

fn partition_response(
    c: &Controlled,
    a: &LocalPartition,
    read_committed: bool,
    log_start: i64,
) -> FetchPartitionResponse<'static> {
    let mut r = FetchPartitionResponse::new(c.partition);
    r.high_watermark = a.high_watermark;
    r.last_stable_offset = a.last_stable_offset;
    r.log_start_offset = log_start;
    r.aborted_transactions = read_committed.then(Vec::new);
    r.records = Some(Cow::Owned(a.records.clone()));
    r
}

fn frame_with_body(h: &RequestHeader, header_version: i16, body: &[u8]) -> BytesMut {
    crate::codec::header::response_frame(h.correlation_id, header_version, body)
}

/// Builds the local answer of a Fetch request whose partitions are all controlled.
pub fn answer_fetch(
    mirror: &Arc<MirrorContext>,
    h: &RequestHeader,
    plan: &mut FetchPlan,
) -> Result<Rewritten, RewriteError> {
    let hv = handlers::response_header_version(h.api_key, h.api_version)
        .ok_or_else(|| err(h.api_version, "unknown response header version".into()))?;
    if plan.force_full_fetch {
        let body = build_fetch_response(h.api_version, 0, FETCH_SESSION_ID_NOT_FOUND, 0, &[])
            .map_err(|e| err(h.api_version, e.to_string()))?;
        return Ok(Rewritten::Ready(frame_with_body(h, hv, &body)));
    }
    let answers = match decide_all(mirror, plan) {
        Ok(a) => a,
        Err(wait) => return Ok(wait),
    };
    // Nothing to return: hold the answer for MaxWaitMs, as a broker does, then
    // decide again (a seal may have become servable meanwhile).
    if !plan.waited && plan.max_wait_ms > 0 && answers.iter().all(|a| a.records.is_empty()) {
        plan.waited = true;
        let wait = std::time::Duration::from_millis(plan.max_wait_ms.min(MAX_LOCAL_WAIT_MS) as u64);
        return Ok(Rewritten::Blocked {
            frame: None,
            wait: Box::pin(async move {
                tokio::time::sleep(wait).await;
                Ok(())
            }),
        });
    }
    let mut topics: Vec<(FetchTopic<'_>, Vec<FetchPartitionResponse<'_>>)> = Vec::new();
    for (c, a) in plan.controlled.iter().zip(&answers) {
        let entry = partition_response(c, a, plan.read_committed, 0);
        match topics
            .iter_mut()
            .find(|(t, _)| *t == c.topic.as_fetch_topic())
        {
            Some((_, v)) => v.push(entry),
            None => topics.push((c.topic.as_fetch_topic(), vec![entry])),
        }
    }
    // Session id 0: the proxy keeps no session for answers it makes itself.
    let _ = plan.session_id;
    let body = build_fetch_response(h.api_version, 0, 0, 0, &topics)
        .map_err(|e| err(h.api_version, e.to_string()))?;
    Ok(Rewritten::Ready(frame_with_body(h, hv, &body)))
}

/// Replaces (or adds) the controlled partitions in an upstream Fetch
/// response, after the usual PID rewriting of the others.
pub fn splice_controlled(
    mirror: &Arc<MirrorContext>,
    h: &RequestHeader,
    plan: &FetchPlan,
    frame: BytesMut,
) -> Result<Rewritten, RewriteError> {
    let hv = handlers::response_header_version(h.api_key, h.api_version)
        .ok_or_else(|| err(h.api_version, "unknown response header version".into()))?;
    let body_at = response_body_offset(&frame, hv)
        .ok_or_else(|| err(h.api_version, "response header truncated".into()))?;
    // A top-level error (a session error from the source) applies to the
    // whole request: the fetcher ignores every partition of it, so nothing
    // is decided or added; it starts over and fetches again.
    if h.api_version >= 7 {
        if let Some(code) = frame.get(body_at + 4..body_at + 6) {
            if code != [0, 0] {
                return Ok(Rewritten::Ready(frame));
            }
        }
    }
    let answers = match decide_all(mirror, plan) {
        Ok(a) => a,
        Err(Rewritten::Blocked { wait, .. }) => {
            return Ok(Rewritten::Blocked {
                frame: Some(frame),
                wait,
            })
        }
        Err(ready) => return Ok(ready),
    };
    let body = &frame[body_at..];
    // Which controlled partitions the upstream returned (the others are added).
    let mut seen = vec![false; plan.controlled.len()];
    handlers::walk_fetch_response(h.api_version, body, &mut |p| {
        if let Some(i) = plan
            .controlled
            .iter()
            .position(|c| c.topic.as_fetch_topic() == p.topic && c.partition == p.partition_index)
        {
            seen[i] = true;
        }
    })
    .map_err(|e| err(h.api_version, e.to_string()))?;
    let mut add: Vec<(FetchTopic<'_>, Vec<FetchPartitionResponse<'_>>)> = Vec::new();
    for (i, c) in plan.controlled.iter().enumerate() {
        if seen[i] {
            continue;
        }
        let entry = partition_response(c, &answers[i], plan.read_committed, 0);
        match add.iter_mut().find(|(t, _)| *t == c.topic.as_fetch_topic()) {
            Some((_, v)) => v.push(entry),
            None => add.push((c.topic.as_fetch_topic(), vec![entry])),
        }
    }
    let new_body =
        splice_fetch_response_dropping(
            h.api_version,
            body,
            &mut |p| {
                let stray = is_stray(mirror, Some(plan), &p.topic, p.partition_index);
                if stray {
                    mirror.seal_metrics.strays.inc();
                }
                stray
            },
            &mut |p| {
                if let Some(b) = plan.below_cut.iter().find(|b| {
                    b.topic.as_fetch_topic() == p.topic && b.partition == p.partition_index
                }) {
                    if below_cut_straddles(body, p, b.cut) {
                        note_straddle(mirror, b);
                    }
                    return Some(below_cut_response(body, p, b, plan.read_committed));
                }
                let i = plan.controlled.iter().position(|c| {
                    c.topic.as_fetch_topic() == p.topic && c.partition == p.partition_index
                })?;
                Some(partition_response(
                    &plan.controlled[i],
                    &answers[i],
                    plan.read_committed,
                    p.log_start_offset.max(0),
                ))
            },
            &add,
        )
        .map_err(|e| err(h.api_version, e.to_string()))?;
    note_session(mirror, h, plan, body);
    let mut out = BytesMut::with_capacity(body_at + new_body.len());
    out.put_i32((body_at - 4 + new_body.len()) as i32);
    out.extend_from_slice(&frame[4..body_at]);
    out.extend_from_slice(&new_body);
    Ok(Rewritten::Ready(out))
}

/// A reader's entry for a sealed partition read below its cut: the source's
/// answer without the batches at or past the cut (a batch that crosses it
/// included), its aborted transactions below the cut, and watermarks no
/// higher than the destination's sealed log end.
fn below_cut_response<'b>(
    body: &'b [u8],
    p: &handlers::FetchPartition<'b>,
    b: &BelowCut,
    read_committed: bool,
) -> FetchPartitionResponse<'b> {
    let mut r = FetchPartitionResponse::new(p.partition_index);
    r.error_code = p.error_code;
    r.high_watermark = p.high_watermark.min(b.end);
    r.last_stable_offset = p.last_stable_offset.min(b.end);
    r.log_start_offset = p.log_start_offset;
    r.aborted_transactions = match (&p.aborted_transactions, read_committed) {
        (None, false) => None,
        (source, _) => {
            let mut v: Vec<handlers::AbortedTransaction> = source
                .iter()
                .flat_map(|a| a.iter())
                .filter(|t| t.first_offset < b.cut)
                .map(|t| handlers::AbortedTransaction {
                    producer_id: t.producer_id,
                    first_offset: t.first_offset,
                })
                .collect();
            // The seal's ABORT markers at the cut end these on the
            // destination, even those the source committed past the cut.
            for &(producer_id, first_offset) in &b.sealed_aborts {
                if !v
                    .iter()
                    .any(|t| t.producer_id == producer_id && t.first_offset == first_offset)
                {
                    v.push(handlers::AbortedTransaction {
                        producer_id,
                        first_offset,
                    });
                }
            }
            Some(v)
        }
    };
    r.records = p
        .records
        .clone()
        .map(|range| Cow::Borrowed(records_below(body.get(range).unwrap_or(&[]), b.cut)));
    r
}

/// The entries of `records` wholly below `cut` (a batch that crosses it
/// excluded; a truncated tail or a corrupt batch ends them).
fn records_below(records: &[u8], cut: i64) -> &[u8] {
    // Entry ranges are positions in `records`: keep up to the end of the
    // last entry wholly below the cut.
    let mut keep = 0;
    for entry in crate::records::walk(records) {
        let (last, end) = match entry {
            Ok(crate::records::Entry::V2(h)) => (h.last_offset(), h.range.end),
            Ok(crate::records::Entry::Legacy { range, .. }) => {
                // A legacy entry starts with its (last) offset.
                let offset = records
                    .get(range.start..range.start + 8)
                    .and_then(|o| o.try_into().ok())
                    .map_or(i64::MAX, i64::from_be_bytes);
                (offset, range.end)
            }
            _ => break,
        };
        if last >= cut {
            break;
        }
        keep = end;
    }
    records.get(..keep).unwrap_or(&[])
}

/// Whether the first batch of a below-cut entry is whole and crosses the
/// cut: the reader's offset lies in it, the answer holds no records and
/// the high watermark is past its offset, so a consumer fetches the same
/// offset again forever. The destination never holds such a batch (its
/// fetcher took the cut at a batch boundary of what it appended), so the
/// source's log there differs from what was mirrored (rewritten or
/// compacted since); no answer is right for it, and no error code means
/// that to a consumer (OFFSET_OUT_OF_RANGE would make it reset its
/// position). It is counted and logged so an operator sees the stuck
/// reader.
fn below_cut_straddles(body: &[u8], p: &handlers::FetchPartition<'_>, cut: i64) -> bool {
    let Some(records) = p.records.clone().and_then(|r| body.get(r)) else {
        return false;
    };
    matches!(
        crate::records::walk(records).next(),
        Some(Ok(crate::records::Entry::V2(h))) if h.base_offset < cut && h.last_offset() >= cut
    )
}

/// Counts a below-cut answer stuck on a batch crossing the cut; warns once
/// per partition.
fn note_straddle(mirror: &MirrorContext, b: &BelowCut) {
    let m = &mirror.seal_metrics;
    m.below_cut_straddles.inc();
    let first = m
        .below_cut_straddle_warned
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(b.key.clone());
    if first {
        tracing::warn!(mirror = %mirror.name, partition = %b.key, cut = b.cut,
            "a reader below the cut is stuck: the source's batch at its offset crosses the cut, \
             which the destination never holds (the source's log changed since it was mirrored); \
             it gets no records there (logged once per partition)");
    }
}

/// Drops from a reader's upstream Fetch response the batches of its
/// below-cut partitions at or past the cut, before they are mapped: the
/// destination never holds them, so their producers must not be claimed,
/// persisted, salted or counted against `max_producers`. Everything else
/// is left as the upstream sent it (the seal's filter finishes the entry:
/// watermarks and the seal's aborts). The frame is returned unchanged when
/// there is nothing to drop.
pub fn trim_below_cut(
    h: &RequestHeader,
    plan: Option<&FetchPlan>,
    frame: BytesMut,
) -> Result<BytesMut, RewriteError> {
    let Some(plan) = plan.filter(|p| !p.below_cut.is_empty()) else {
        return Ok(frame);
    };
    let hv = handlers::response_header_version(h.api_key, h.api_version)
        .ok_or_else(|| err(h.api_version, "unknown response header version".into()))?;
    let body_at = response_body_offset(&frame, hv)
        .ok_or_else(|| err(h.api_version, "response header truncated".into()))?;
    let body = &frame[body_at..];
    let cut_of = |p: &handlers::FetchPartition<'_>| {
        plan.below_cut
            .iter()
            .find(|b| b.topic.as_fetch_topic() == p.topic && b.partition == p.partition_index)
            .map(|b| b.cut)
    };
    let mut past_cut = false;
    handlers::walk_fetch_response(h.api_version, body, &mut |p| {
        if let (Some(cut), Some(range)) = (cut_of(p), p.records.clone()) {
            let records = body.get(range).unwrap_or(&[]);
            past_cut |= records_below(records, cut).len() < records.len();
        }
    })
    .map_err(|e| err(h.api_version, e.to_string()))?;
    if !past_cut {
        return Ok(frame);
    }
    let new_body = splice_fetch_response_dropping(
        h.api_version,
        body,
        &mut |_| false,
        &mut |p| {
            let cut = cut_of(p)?;
            let mut r = FetchPartitionResponse::new(p.partition_index);
            r.error_code = p.error_code;
            r.high_watermark = p.high_watermark;
            r.last_stable_offset = p.last_stable_offset;
            r.log_start_offset = p.log_start_offset;
            r.preferred_read_replica = p.preferred_read_replica;
            r.aborted_transactions = p.aborted_transactions.as_ref().map(|a| {
                a.iter()
                    .map(|t| handlers::AbortedTransaction {
                        producer_id: t.producer_id,
                        first_offset: t.first_offset,
                    })
                    .collect()
            });
            r.records = p
                .records
                .clone()
                .map(|range| Cow::Borrowed(records_below(body.get(range).unwrap_or(&[]), cut)));
            Some(r)
        },
        &[],
    )
    .map_err(|e| err(h.api_version, e.to_string()))?;
    let mut out = BytesMut::with_capacity(body_at + new_body.len());
    out.put_i32((body_at - 4 + new_body.len()) as i32);
    out.extend_from_slice(&frame[4..body_at]);
    out.extend_from_slice(&new_body);
    Ok(out)
}

/// Once the upstream accepted a session request, remembers which controlled
/// partitions are out of that session now.
fn note_session(mirror: &MirrorContext, h: &RequestHeader, plan: &FetchPlan, body: &[u8]) {
    if h.api_version < 7 || plan.session_epoch < 0 {
        return;
    }
    let (Some(code), Some(id)) = (body.get(4..6), body.get(6..10)) else {
        return;
    };
    let code = i16::from_be_bytes([code[0], code[1]]);
    let id = i32::from_be_bytes([id[0], id[1], id[2], id[3]]);
    if code != 0 || id == 0 {
        return;
    }
    if plan.session_epoch == 0 {
        // A new session: it holds none of the partitions dropped from the
        // full request.
        mirror.sessions.note(id, &plan.out_of_session, true);
    } else if id == plan.session_id {
        mirror.sessions.note(id, &plan.out_of_session, false);
    }
}

/// Whether an upstream response partition belongs to a controlled partition
/// the request did not list (an incremental session kept it): it must not
/// reach the fetcher (no source records, no source errors).
pub fn is_stray(
    mirror: &MirrorContext,
    plan: Option<&FetchPlan>,
    topic: &FetchTopic<'_>,
    partition: i32,
) -> bool {
    if !mirror.lifecycle.controls()
        || is_controlled(plan, topic, partition)
        || is_below_cut(plan, topic, partition)
    {
        return false;
    }
    let key = mirror.partition_key(topic, partition);
    mirror
        .lifecycle
        .get(&key)
        .is_some_and(|e| e.state != State::Mirroring)
}

/// Drops stray controlled partitions (see [`is_stray`]) from a response
/// whose request had no plan; the frame is returned untouched when there
/// are none (the common case).
pub fn drop_strays(
    mirror: &MirrorContext,
    h: &RequestHeader,
    frame: BytesMut,
) -> Result<BytesMut, RewriteError> {
    if !mirror.lifecycle.controls() {
        return Ok(frame);
    }
    let hv = handlers::response_header_version(h.api_key, h.api_version)
        .ok_or_else(|| err(h.api_version, "unknown response header version".into()))?;
    let body_at = response_body_offset(&frame, hv)
        .ok_or_else(|| err(h.api_version, "response header truncated".into()))?;
    let body = &frame[body_at..];
    let mut any = false;
    handlers::walk_fetch_response(h.api_version, body, &mut |p| {
        any |= is_stray(mirror, None, &p.topic, p.partition_index);
    })
    .map_err(|e| err(h.api_version, e.to_string()))?;
    if !any {
        return Ok(frame);
    }
    let new_body = splice_fetch_response_dropping(
        h.api_version,
        body,
        &mut |p| {
            let stray = is_stray(mirror, None, &p.topic, p.partition_index);
            if stray {
                mirror.seal_metrics.strays.inc();
            }
            stray
        },
        &mut |_| None,
        &[],
    )
    .map_err(|e| err(h.api_version, e.to_string()))?;
    let mut out = BytesMut::with_capacity(body_at + new_body.len());
    out.put_i32((body_at - 4 + new_body.len()) as i32);
    out.extend_from_slice(&frame[4..body_at]);
    out.extend_from_slice(&new_body);
    Ok(out)
}

/// Whether a response partition is a reader's read below the cut of a
/// sealed partition (forwarded, mapped like any other, then cut).
fn is_below_cut(plan: Option<&FetchPlan>, topic: &FetchTopic<'_>, partition: i32) -> bool {
    plan.is_some_and(|p| {
        p.below_cut
            .iter()
            .any(|b| b.topic.as_fetch_topic() == *topic && b.partition == partition)
    })
}

/// Whether a response partition is controlled by the plan (its records are
/// replaced, so the PID rewriting skips it).
pub fn is_controlled(plan: Option<&FetchPlan>, topic: &FetchTopic<'_>, partition: i32) -> bool {
    plan.map(|p| {
        p.controlled
            .iter()
            .any(|c| c.topic.as_fetch_topic() == *topic && c.partition == partition)
    })
    .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::builder::{build_batch, BatchSpec, RecordSpec};

    /// A data batch of `n` records at `base`.
    fn batch(base: i64, n: i32) -> Vec<u8> {
        let records: Vec<RecordSpec<'_>> = (0..n)
            .map(|i| RecordSpec {
                offset_delta: i,
                value: Some(b"v"),
                ..RecordSpec::default()
            })
            .collect();
        build_batch(
            &BatchSpec {
                base_offset: base,
                ..BatchSpec::default()
            },
            &records,
        )
    }

    /// The below-cut entry built from an upstream answer holding `records`.
    fn cut_at(records: &[u8], cut: i64, aborted: Vec<(i64, i64)>) -> (Vec<u8>, i64, i64, usize) {
        let mut p = FetchPartitionResponse::new(0);
        p.high_watermark = 100;
        p.last_stable_offset = 90;
        p.log_start_offset = 0;
        p.aborted_transactions = Some(
            aborted
                .iter()
                .map(
                    |&(producer_id, first_offset)| handlers::AbortedTransaction {
                        producer_id,
                        first_offset,
                    },
                )
                .collect(),
        );
        p.records = Some(Cow::Borrowed(records));
        let body = build_fetch_response(12, 0, 0, 0, &[(FetchTopic::Name("t"), vec![p])]).unwrap();
        let mut parts = Vec::new();
        handlers::walk_fetch_response(12, &body, &mut |p| parts.push(p.clone())).unwrap();
        let b = BelowCut {
            topic: TopicRef::Name("t".into()),
            partition: 0,
            key: PartitionKey::new([0; 16], "t", 0),
            cut,
            end: cut + 2,
            sealed_aborts: vec![(7, 3)],
        };
        let r = below_cut_response(&body, &parts[0], &b, true);
        (
            r.records.unwrap().into_owned(),
            r.high_watermark,
            r.last_stable_offset,
            r.aborted_transactions.unwrap().len(),
        )
    }

    #[test]
    fn a_below_cut_answer_ends_before_the_cut() {
        let (a, b, c) = (batch(0, 3), batch(3, 2), batch(5, 4));
        let all = [a.clone(), b.clone(), c.clone()].concat();
        // Cut at a batch boundary: the batches below it, nothing else.
        let (records, hw, lso, aborted) = cut_at(&all, 5, vec![(1, 0), (2, 6)]);
        assert_eq!(records, [a.clone(), b.clone()].concat());
        assert_eq!((hw, lso), (7, 7));
        // (1, 0) is below the cut, (2, 6) past it; the seal's (7, 3) added.
        assert_eq!(aborted, 2);
        // A batch crossing the cut is dropped with everything after it.
        let (records, ..) = cut_at(&all, 4, vec![]);
        assert_eq!(records, a);
        // A reader whose offset lies in a batch crossing the cut gets
        // nothing: that is detected (counted, warned once).
        let straddles = |records: &[u8], cut| {
            let mut p = FetchPartitionResponse::new(0);
            p.records = Some(Cow::Borrowed(records));
            let body =
                build_fetch_response(12, 0, 0, 0, &[(FetchTopic::Name("t"), vec![p])]).unwrap();
            let mut parts = Vec::new();
            handlers::walk_fetch_response(12, &body, &mut |p| parts.push(p.clone())).unwrap();
            below_cut_straddles(&body, &parts[0], cut)
        };
        assert!(straddles(&[b.clone(), c.clone()].concat(), 4));
        assert!(!straddles(&all, 4), "the first batch is below the cut");
        assert!(
            !straddles(&[b.clone(), c.clone()].concat(), 5),
            "a batch boundary"
        );
        assert!(!straddles(&b[..b.len() - 3], 4), "a truncated batch");
        // A truncated tail below the cut is left out too.
        let partial = [a.clone(), b[..b.len() - 3].to_vec()].concat();
        let (records, ..) = cut_at(&partial, 9, vec![]);
        assert_eq!(records, a);
        // Nothing below the cut: no records.
        let (records, ..) = cut_at(&all, 0, vec![]);
        assert!(records.is_empty());
    }
}
