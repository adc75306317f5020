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

use std::borrow::Cow;
use std::sync::Arc;

use bytes::{BufMut, BytesMut};

use crate::codec::header::{request_body_offset, response_body_offset};
use crate::codec::RequestHeader;
use crate::handlers::{
    self, build_fetch_response, parse_fetch_request, splice_fetch_response, split_fetch_request,
    FetchPartitionResponse, FetchTopic,
};
use crate::lifecycle::seal::{decide, Decision, LocalPartition, OpenTxn};
use crate::producer_state::PartitionKey;
use crate::proxy::connection::{Plan, RequestAction, RewriteError, Rewritten};
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

/// The plan of a Fetch request on a mirror listener.
#[derive(Debug)]
pub struct FetchPlan {
    controlled: Vec<Controlled>,
    read_committed: bool,
    /// Answer with FETCH_SESSION_ID_NOT_FOUND (forces a full fetch that lists
    /// every partition with its offset).
    force_full_fetch: bool,
    session_id: i32,
}

fn err(version: i16, message: String) -> RewriteError {
    RewriteError {
        api: "Fetch",
        version,
        message,
    }
}

/// Decides what to do with a Fetch request; `None` when nothing is controlled.
pub fn plan_fetch(
    mirror: &MirrorContext,
    h: &RequestHeader,
    frame: &[u8],
) -> Result<Option<RequestAction>, RewriteError> {
    if !mirror.lifecycle.controls() {
        return Ok(None);
    }
    let hv = handlers::request_header_version(h.api_key, h.api_version)
        .ok_or_else(|| err(h.api_version, "unknown request header version".into()))?;
    let at = request_body_offset(frame, hv).map_err(|e| err(h.api_version, e.to_string()))?;
    let body = frame.get(at..).unwrap_or(&[]);
    let req =
        parse_fetch_request(h.api_version, body).map_err(|e| err(h.api_version, e.to_string()))?;
    let mut controlled = Vec::new();
    let mut total = 0;
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
            mirror.lifecycle.note_fetch(&key, p.fetch_offset);
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
    // An incremental fetch omits partitions whose position did not change;
    // a STOPPING partition without a cut needs the position, so make the
    // fetcher send a full fetch.
    let incremental = req.session_id != 0 && req.session_epoch > 0;
    let force_full_fetch = incremental
        && mirror.lifecycle.list().iter().any(|e| {
            e.mirror == mirror.name
                && e.state == State::Stopping
                && e.cut.is_none()
                && !controlled
                    .iter()
                    .any(|c| c.key.topic.as_ref() == e.topic && c.partition == e.partition)
        });
    if controlled.is_empty() && !force_full_fetch {
        return Ok(None);
    }
    let all_controlled = controlled.len() == total;
    // Controlled partitions are never asked of the source: drop them from
    // the forwarded request (their entries are added to the response).
    let replacement = if all_controlled || force_full_fetch || controlled.is_empty() {
        None
    } else {
        let is_controlled = |t: &FetchTopic<'_>, p: i32| {
            controlled
                .iter()
                .any(|c| c.topic.as_fetch_topic() == *t && c.partition == p)
        };
        split_fetch_request(h.api_version, body, &mut |t, p| !is_controlled(t, p))
            .map_err(|e| err(h.api_version, e.to_string()))?
            .map(|kept| {
                let mut f = BytesMut::with_capacity(at + kept.len());
                f.put_i32((at - 4 + kept.len()) as i32);
                f.extend_from_slice(&frame[4..at]);
                f.extend_from_slice(&kept);
                f
            })
    };
    let plan = FetchPlan {
        controlled,
        read_committed: req.isolation_level == 1,
        force_full_fetch,
        session_id: req.session_id,
    };
    let plan: Plan = Box::new(plan);
    Ok(Some(if all_controlled || force_full_fetch {
        RequestAction::Answer(plan)
    } else {
        RequestAction::Forward {
            replacement,
            plan: Some(plan),
        }
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
        let open = move || -> Vec<OpenTxn> {
            registry
                .get(&key)
                .map(|h| {
                    h.with(|s| {
                        s.open_transactions()
                            .map(|t| OpenTxn {
                                producer_id: t.mapped_pid,
                                producer_epoch: t.epoch,
                                coordinator_epoch: s
                                    .producer(t.mapped_pid)
                                    .map(|e| e.coordinator_epoch)
                                    .unwrap_or(0),
                                first_offset: t.first_offset,
                                origin_cluster: t.origin.source_cluster.0,
                                original_pid: t.origin.original_pid,
                            })
                            .collect()
                    })
                })
                .unwrap_or_default()
        };
        match decide(
            &c.key,
            &entry,
            c.fetch_offset,
            c.last_fetched_epoch,
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
    plan: &mut Plan,
) -> Result<Rewritten, RewriteError> {
    let plan = plan
        .downcast_ref::<FetchPlan>()
        .ok_or_else(|| err(h.api_version, "wrong plan type".into()))?;
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
    let hv = handlers::response_header_version(h.api_key, h.api_version)
        .ok_or_else(|| err(h.api_version, "unknown response header version".into()))?;
    let body_at = response_body_offset(&frame, hv)
        .ok_or_else(|| err(h.api_version, "response header truncated".into()))?;
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
    let new_body = splice_fetch_response(
        h.api_version,
        body,
        &mut |p| {
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
    let mut out = BytesMut::with_capacity(body_at + new_body.len());
    out.put_i32((body_at - 4 + new_body.len()) as i32);
    out.extend_from_slice(&frame[4..body_at]);
    out.extend_from_slice(&new_body);
    Ok(Rewritten::Ready(out))
}

/// Downcasts a plan to a fetch plan.
pub fn as_fetch_plan(plan: Option<&mut Plan>) -> Option<&FetchPlan> {
    plan.and_then(|p| p.downcast_ref::<FetchPlan>())
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
