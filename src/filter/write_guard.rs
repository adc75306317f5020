//! The guard over the writes other than Produce (SPEC 3.1, "On the produce
//! side"): on a guard listener, every request that would write records or
//! markers into a mirrored partition, or change its offsets or partition
//! count, is refused while the partition is not STOPPED, exactly as
//! [`super::produce_guard`] refuses Produce (the same [`GuardPolicy`]):
//!
//! | API | refused | the others in the request |
//! | --- | --- | --- |
//! | AddPartitionsToTxn v0-3 (and v4+ should it reach a client listener) | each mirrored partition: POLICY_VIOLATION | OPERATION_NOT_ATTEMPTED (the coordinator adds all or nothing) |
//! | WriteTxnMarkers (from a client) | each mirrored partition: POLICY_VIOLATION | OPERATION_NOT_ATTEMPTED (answered whole) |
//! | DeleteRecords | each mirrored partition: POLICY_VIOLATION | forwarded |
//! | CreatePartitions | a mirrored topic: POLICY_VIOLATION with a message | forwarded |
//! | DeleteTopics | a mirrored topic: POLICY_VIOLATION (with a message from v5) | forwarded |
//!
//! A topic counts as mirrored for CreatePartitions and DeleteTopics while
//! any partition a mirror feeds, or has a life-cycle entry for, is not
//! STOPPED. Until every mirror knows its source topology the guard fails
//! closed with a retriable error (NOT_ENOUGH_REPLICAS; for
//! AddPartitionsToTxn COORDINATOR_LOAD_IN_PROGRESS, which transactional
//! clients retry, where NOT_ENOUGH_REPLICAS would abort the transaction).
//!
//! DeleteTopics v6+ may name a topic by id only: the id is mapped to a name
//! with the destination topic listing mirrorguard keeps (`[state]`'s
//! destination listing, refreshed every `destination_refresh` period). An id
//! it cannot map is refused (POLICY_VIOLATION, a message asking for the
//! name) unless nothing is protected at all: failing closed, because an
//! unknown id may name a mirrored topic created since the last listing.
//!
//! Refusals are logged (WARN) and counted in
//! `mirrorguard_guard_refused_total{listener, api}`. Requests with nothing
//! refused, and the kept part of a split request, leave byte for byte as
//! they came (a split request is the original with the refused entries cut
//! out and its counts re-encoded); their responses are walked and the
//! refused entries added only when something was refused.

use std::ops::RangeInclusive;
use std::sync::Arc;

use bytes::BytesMut;
use kafka_protocol::error::ResponseError;

use super::produce_guard::{GuardPolicy, NOT_ENOUGH_REPLICAS};
use super::{
    answer_frame, response_body_at, with_body, Filter, RequestAction, RequestState, ResponseStream,
    RewriteError, Rewritten,
};
use crate::codec::header::request_body_offset;
use crate::codec::RequestHeader;
use crate::handlers;
use crate::handlers::guarded_writes::{
    build_write_response, encode_result_entries, is_guarded_write, merge_write_response,
    parse_write_request, split_write_request, GroupAnswer, TopicAnswer, ADD_PARTITIONS_TO_TXN,
    GUARDED_WRITE_VERSIONS,
};
use crate::metrics::{ApiLabels, Metrics};

/// Kafka's OPERATION_NOT_ATTEMPTED: the items of an all-or-nothing request
/// that were not refused themselves.
pub const OPERATION_NOT_ATTEMPTED: i16 = ResponseError::OperationNotAttempted.code();

/// Kafka's COORDINATOR_LOAD_IN_PROGRESS: retriable for transactional clients.
pub const COORDINATOR_LOAD_IN_PROGRESS: i16 =
    crate::codec::api::error::COORDINATOR_LOAD_IN_PROGRESS;

/// Maps a destination topic id to its name, when mirrorguard knows it.
pub type TopicIdNames = Arc<dyn Fn(&[u8; 16]) -> Option<String> + Send + Sync>;

/// What the guard carries from a refused write to its response.
#[derive(Debug)]
pub enum WriteRefusals {
    /// The whole response body, built at the request.
    Answer(Vec<u8>),
    /// Result entries to add to the upstream's response to the kept part.
    Merge {
        /// The encoded entries.
        entries: Vec<u8>,
        /// How many.
        count: usize,
    },
}

/// The guard over AddPartitionsToTxn, WriteTxnMarkers, DeleteRecords,
/// CreatePartitions and DeleteTopics.
pub struct WriteGuard {
    listener: String,
    policy: GuardPolicy,
    metrics: Arc<Metrics>,
    topic_ids: Option<TopicIdNames>,
}

/// One decision: `None` (not refused) or the code and message.
type Verdict = Option<(i16, String)>;

impl WriteGuard {
    /// The guard of listener `listener` deciding with `policy`; DeleteTopics
    /// by id maps ids with `topic_ids` (`None`: every id is unknown).
    pub fn new(
        listener: &str,
        policy: GuardPolicy,
        metrics: Arc<Metrics>,
        topic_ids: Option<TopicIdNames>,
    ) -> Self {
        Self {
            listener: listener.to_string(),
            policy,
            metrics,
            topic_ids,
        }
    }

    fn err(h: &RequestHeader, message: impl Into<String>) -> RewriteError {
        RewriteError::new(h, message)
    }

    /// The decision about a topic-level item (CreatePartitions, DeleteTopics).
    fn topic_decision(&self, name: Option<&str>, id: Option<[u8; 16]>) -> Verdict {
        if let Some(n) = name {
            if let Some(d) = self.policy.topic_refusal(n) {
                return Some(d);
            }
        }
        let id = id?;
        match self.topic_ids.as_ref().and_then(|f| (**f)(&id)) {
            Some(n) => self.policy.topic_refusal(&n),
            None => self
                .policy
                .unmapped_id_refusal(&crate::pid::ClusterId(id).to_string()),
        }
    }
}

fn api_name(api_key: i16) -> &'static str {
    crate::codec::api::api_name(api_key).unwrap_or("unknown")
}

impl Filter for WriteGuard {
    fn decodes(&self) -> &[(i16, RangeInclusive<i16>)] {
        &GUARDED_WRITE_VERSIONS
    }

    fn handles(&self, api_key: i16, _api_version: i16) -> bool {
        is_guarded_write(api_key)
    }

    fn response_stream(&self, _h: &RequestHeader, state: Option<&RequestState>) -> ResponseStream {
        match state {
            Some(RequestState::GuardWrite(_)) => ResponseStream::Hold,
            _ => ResponseStream::Untouched,
        }
    }

    fn on_request(&self, h: &RequestHeader, frame: &[u8]) -> Result<RequestAction, RewriteError> {
        let api = api_name(h.api_key);
        let hv = handlers::request_header_version(h.api_key, h.api_version)
            .ok_or_else(|| Self::err(h, "unknown request header version"))?;
        let at = request_body_offset(frame, hv).map_err(|e| Self::err(h, e.to_string()))?;
        let body = frame.get(at..).unwrap_or(&[]);
        // A version outside what is parsed (the clamped ApiVersions offers
        // none) or a malformed body closes the connection, as the broker
        // does with a request it cannot read.
        let req = parse_write_request(h.api_key, h.api_version, body)
            .map_err(|e| Self::err(h, format!("{api} refused by the guard: {e}")))?;
        let retriable = |code: i16| {
            if h.api_key == ADD_PARTITIONS_TO_TXN && code == NOT_ENOUGH_REPLICAS {
                COORDINATOR_LOAD_IN_PROGRESS
            } else {
                code
            }
        };
        // Per group, per topic: one decision per partition, or one for the
        // topic. Bounded by the parsed entries.
        let mut decisions: Vec<Vec<Vec<Verdict>>> = Vec::new();
        let mut refused = 0usize;
        let mut total = 0usize;
        for g in &req.groups {
            let mut gd = Vec::new();
            for t in &g.topics {
                let td: Vec<Verdict> = match &t.partitions {
                    Some(parts) => parts
                        .iter()
                        .map(|(p, _)| {
                            t.name
                                .and_then(|n| self.policy.refusal_code(n, *p))
                                .map(|(c, m)| (retriable(c), m))
                        })
                        .collect(),
                    None => vec![self.topic_decision(t.name, t.id)],
                };
                total += td.len();
                refused += td.iter().filter(|d| d.is_some()).count();
                gd.push(td);
            }
            decisions.push(gd);
        }
        if refused == 0 {
            return Ok(RequestAction::forward());
        }
        self.metrics
            .guard_refused
            .get_or_create(&ApiLabels {
                listener: self.listener.clone(),
                api: api.to_string(),
            })
            .inc_by(refused as u64);
        for (g, gd) in req.groups.iter().zip(&decisions) {
            for (t, td) in g.topics.iter().zip(gd) {
                let id = t.id.map(|i| crate::pid::ClusterId(i).to_string());
                for (i, d) in td.iter().enumerate() {
                    let Some((_, msg)) = d else { continue };
                    let partition = t
                        .partitions
                        .as_ref()
                        .and_then(|ps| ps.get(i))
                        .map(|(p, _)| *p);
                    tracing::warn!(listener = %self.listener, api, topic = ?t.name, topic_id = ?id,
                        partition = ?partition, transactional_id = ?g.transactional_id,
                        "{api} refused: {msg}");
                }
            }
        }
        // The answers: refused items with their errors; the others (of an
        // all-or-nothing request) OPERATION_NOT_ATTEMPTED.
        let answer = |only_refused: bool| -> Vec<GroupAnswer> {
            req.groups
                .iter()
                .zip(&decisions)
                .map(|(g, gd)| GroupAnswer {
                    transactional_id: g.transactional_id.map(str::to_string),
                    producer_id: g.producer_id,
                    topics: g
                        .topics
                        .iter()
                        .zip(gd)
                        .filter(|(_, td)| !only_refused || td.iter().any(Option::is_some))
                        .map(|(t, td)| {
                            let code = |d: &Verdict| {
                                d.as_ref().map_or(OPERATION_NOT_ATTEMPTED, |(c, _)| *c)
                            };
                            let first = td.first().and_then(|d| d.as_ref());
                            TopicAnswer {
                                name: t.name.map(str::to_string),
                                id: t.id,
                                error_code: td.first().map_or(OPERATION_NOT_ATTEMPTED, code),
                                message: first.map(|(_, m)| m.clone()),
                                partitions: match &t.partitions {
                                    Some(ps) => ps
                                        .iter()
                                        .zip(td)
                                        .filter(|(_, d)| !only_refused || d.is_some())
                                        .map(|((p, _), d)| (*p, code(d)))
                                        .collect(),
                                    None => Vec::new(),
                                },
                            }
                        })
                        .collect(),
                })
                .collect()
        };
        if !req.splittable() || refused == total {
            let body = build_write_response(h.api_key, h.api_version, &answer(false))
                .map_err(|e| Self::err(h, e.to_string()))?;
            return Ok(RequestAction::Answer(RequestState::GuardWrite(
                WriteRefusals::Answer(body),
            )));
        }
        let keep: Vec<Vec<bool>> = decisions
            .first()
            .map(|gd| {
                gd.iter()
                    .map(|td| td.iter().map(Option::is_none).collect())
                    .collect()
            })
            .unwrap_or_default();
        let kept = split_write_request(&req, body, &keep)
            .map_err(|e| Self::err(h, e.to_string()))?
            .ok_or_else(|| Self::err(h, "split kept everything"))?;
        let refused_topics: Vec<TopicAnswer> =
            answer(true).into_iter().flat_map(|g| g.topics).collect();
        let (entries, count) = encode_result_entries(h.api_key, h.api_version, &refused_topics)
            .map_err(|e| Self::err(h, e.to_string()))?;
        Ok(RequestAction::Forward {
            replacement: Some(with_body(frame, at, &kept)),
            state: Some(RequestState::GuardWrite(WriteRefusals::Merge {
                entries,
                count,
            })),
        })
    }

    fn on_response(
        &self,
        h: &RequestHeader,
        state: Option<&mut RequestState>,
        frame: BytesMut,
    ) -> Result<Rewritten, RewriteError> {
        let Some(RequestState::GuardWrite(WriteRefusals::Merge { entries, count })) = state else {
            return Ok(Rewritten::Ready(frame));
        };
        let body_at = response_body_at(h, &frame)?;
        let merged =
            merge_write_response(h.api_key, h.api_version, &frame[body_at..], entries, *count)
                .map_err(|e| Self::err(h, e.to_string()))?;
        Ok(Rewritten::Ready(with_body(&frame, body_at, &merged)))
    }

    fn answer(
        &self,
        h: &RequestHeader,
        state: &mut RequestState,
    ) -> Result<Rewritten, RewriteError> {
        let RequestState::GuardWrite(WriteRefusals::Answer(body)) = state else {
            return Err(Self::err(h, "the write guard answers only its refusals"));
        };
        Ok(Rewritten::Ready(answer_frame(h, body)?))
    }
}
