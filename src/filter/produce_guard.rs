//! The produce guard: a proxy listener in front of the destination broker
//! that refuses Produce for partitions a mirror still feeds.
//!
//! A partition of a mirrored topic is writable only once it is STOPPED
//! (sealed). Produce requests naming partitions that are MIRRORING, PAUSED,
//! STOPPING or FAILED get POLICY_VIOLATION (a non-retriable error) with a
//! message naming the mirror; the other partitions of the same request are
//! forwarded untouched and the two answers are merged (the refusals travel
//! to the response as [`RequestState::Guard`]). Every other API key passes
//! through this filter untouched: the other writes into a mirrored partition
//! are refused by the next filter, [`super::write_guard`], with the same
//! [`GuardPolicy`]; the rest of the guard listener's chain rewrites
//! addresses as usual.
//!
//! The guard fails closed at start-up: until every mirror knows its source
//! topology (read from the source, or restored from `__mirror_state`, which
//! is loaded before any listener accepts), a Produce to a topic whose status
//! is unknown gets NOT_ENOUGH_REPLICAS, a retriable error, with a message
//! saying why; clients retry and are served once the status is known.
//!
//! A Produce is decided from its partition headers only: when all of them
//! are in the head of the request (every partition but the last is small)
//! and none is refused, the connection streams the request as it arrives
//! ([`partitions_in_head`], `Filter::passes_from_head`); a request with a
//! refused partition, or whose headers lie further in, is held whole and
//! split or answered as above. Held by design: what goes upstream is the
//! request without its refused partitions, so its size prefix is known only
//! once every partition header has been read, and the headers lie between
//! the records; such a request is a misdirected producer's (refused on every
//! retry), and memory for it is bounded by `max_frame_bytes`. Of a streamed request the guard checks only
//! the part up to the last partition's records length; what follows (the
//! records, trailing tagged fields) is validated by the broker alone, which
//! refuses a malformed request as it would without the guard.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::sync::Arc;

use bytes::BytesMut;

use super::{
    answer_frame, response_body_at, with_body, Filter, RequestAction, RequestState, RewriteError,
    Rewritten,
};
use crate::codec::api;
use crate::codec::header::request_body_offset;
use crate::codec::RequestHeader;
use crate::handlers::{
    self, build_produce_response, merge_produce_responses, parse_produce_request,
    split_produce_request, FetchTopic, ProducePartitionResult,
};
use crate::lifecycle::Lifecycle;
use crate::lifecycle::State;
use crate::metrics::{ListenerLabels, Metrics};
use crate::mirror::MirrorContext;
use crate::producer_state::PartitionKey;
use crate::wire::Reader;

/// Kafka's POLICY_VIOLATION: not retriable, carries a message.
pub const POLICY_VIOLATION: i16 = 44;

/// Kafka's NOT_ENOUGH_REPLICAS: retriable (clients retry without a metadata
/// refresh); answered while the guard does not know yet what is mirrored.
pub const NOT_ENOUGH_REPLICAS: i16 = 19;

/// Produce versions the guard parses (v13 names topics by id, which the
/// guard cannot match against mirrored topic names; below v3 there is no
/// transactional id). The chain's ApiVersions clamp offers no more.
const PRODUCE_VERSIONS: [(i16, RangeInclusive<i16>); 1] = [(api::PRODUCE, 3..=12)];

/// One refused partition: index, error code, message.
type Refused = (i32, i16, String);

/// Partitions refused in one request, with their error codes and messages.
#[derive(Debug)]
pub struct Refusals {
    topics: Vec<(String, Vec<Refused>)>,
}

/// What the guard refuses, shared by the Produce filter and the filter of
/// the other writes ([`super::write_guard`]): the life cycle and the
/// mirrors' topologies.
#[derive(Clone)]
pub struct GuardPolicy {
    lifecycle: Arc<Lifecycle>,
    mirrors: Vec<Arc<MirrorContext>>,
}

impl GuardPolicy {
    /// The policy over `mirrors`' topics using the shared life cycle.
    pub fn new(lifecycle: Arc<Lifecycle>, mirrors: Vec<Arc<MirrorContext>>) -> Self {
        Self { lifecycle, mirrors }
    }

    /// The error code and message refusing a write into
    /// `topic`-`partition`, or `None` when it may be written: its
    /// life-cycle entry is STOPPED, or no mirror feeds it.
    pub fn refusal_code(&self, topic: &str, partition: i32) -> Option<(i16, String)> {
        let key = PartitionKey::new([0; 16], topic, partition);
        if let Some(e) = self.lifecycle.get(&key) {
            return (e.state != State::Stopped).then(|| {
                (
                    POLICY_VIOLATION,
                    format!(
                        "{topic}-{partition} is mirrored by mirror '{}' and is {}; it becomes \
                         writable once the mirror is stopped and the partition is STOPPED",
                        e.mirror,
                        e.state.name()
                    ),
                )
            });
        }
        if let Some(m) = self.unknown_mirror() {
            // Fail closed: the topic may be mirrored by a mirror that has
            // not read its source yet.
            return Some((NOT_ENOUGH_REPLICAS, Self::unknown_message(&m)));
        }
        self.mirrors
            .iter()
            .find(|m| m.destination_topics().iter().any(|(t, _)| t == topic))
            .map(|m| {
                (
                    POLICY_VIOLATION,
                    format!(
                        "{topic}-{partition} is mirrored by mirror '{}' and is MIRRORING; it \
                         becomes writable once the mirror is stopped and the partition is STOPPED",
                        m.name
                    ),
                )
            })
    }

    /// The name of a mirror that does not know its source topology yet.
    fn unknown_mirror(&self) -> Option<String> {
        self.mirrors
            .iter()
            .find(|m| m.topology().is_none())
            .map(|m| m.name.clone())
    }

    fn unknown_message(mirror: &str) -> String {
        format!(
            "mirrorguard does not know yet which partitions mirror '{mirror}' feeds (its source \
             has not been read and no topology is persisted); retry"
        )
    }

    /// The error code and message refusing a change to the whole of `topic`
    /// (its partition count, its deletion), or `None` when every partition
    /// of it may be written: each partition a mirror feeds or has a
    /// life-cycle entry for must be STOPPED.
    pub fn topic_refusal(&self, topic: &str) -> Option<(i16, String)> {
        let entries: Vec<_> = self
            .lifecycle
            .list()
            .into_iter()
            .filter(|e| e.topic == topic)
            .collect();
        if let Some(e) = entries.iter().find(|e| e.state != State::Stopped) {
            return Some((
                POLICY_VIOLATION,
                format!(
                    "topic {topic} is mirrored by mirror '{}' ({topic}-{} is {}); it can be \
                     changed once the mirror is stopped and every partition of it is STOPPED",
                    e.mirror,
                    e.partition,
                    e.state.name()
                ),
            ));
        }
        if let Some(m) = self.unknown_mirror() {
            return Some((NOT_ENOUGH_REPLICAS, Self::unknown_message(&m)));
        }
        for m in &self.mirrors {
            let Some((_, n)) = m.destination_topics().into_iter().find(|(t, _)| t == topic) else {
                continue;
            };
            // Partitions without an entry are MIRRORING.
            if let Some(p) = (0..n).find(|p| !entries.iter().any(|e| e.partition == *p)) {
                return Some((
                    POLICY_VIOLATION,
                    format!(
                        "topic {topic} is mirrored by mirror '{}' ({topic}-{p} is MIRRORING); it \
                         can be changed once the mirror is stopped and every partition of it is \
                         STOPPED",
                        m.name
                    ),
                ));
            }
        }
        None
    }

    /// Why a topic named only by an id the guard cannot map to a name is
    /// refused, or `None` when nothing is protected at all (no mirror feeds
    /// a topic, none is unknown, no life-cycle entry is short of STOPPED).
    pub fn unmapped_id_refusal(&self, id: &str) -> Option<(i16, String)> {
        let protects = self.unknown_mirror().is_some()
            || self
                .lifecycle
                .list()
                .iter()
                .any(|e| e.state != State::Stopped)
            || self
                .mirrors
                .iter()
                .any(|m| !m.destination_topics().is_empty());
        protects.then(|| {
            (
                POLICY_VIOLATION,
                format!(
                    "mirrorguard cannot tell which topic the topic id {id} names (it is not in the \
                     destination topic listing mirrorguard holds), so it cannot tell whether a \
                     mirror feeds it; name the topic by its name instead"
                ),
            )
        })
    }
}

/// The produce guard filter.
pub struct ProduceGuard {
    listener: String,
    policy: GuardPolicy,
    metrics: Arc<Metrics>,
}

impl ProduceGuard {
    /// A guard for `mirrors`' topics using the shared life cycle.
    pub fn new(
        listener: &str,
        lifecycle: Arc<Lifecycle>,
        mirrors: Vec<Arc<MirrorContext>>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            listener: listener.to_string(),
            policy: GuardPolicy::new(lifecycle, mirrors),
            metrics,
        }
    }

    /// Why `topic`-`partition` may not be written, or `None` if it may.
    pub fn refusal(&self, topic: &str, partition: i32) -> Option<String> {
        self.refusal_code(topic, partition).map(|(_, m)| m)
    }

    /// The error code and message refusing `topic`-`partition`, or `None`.
    pub fn refusal_code(&self, topic: &str, partition: i32) -> Option<(i16, String)> {
        self.policy.refusal_code(topic, partition)
    }

    fn err(h: &RequestHeader, message: String) -> RewriteError {
        RewriteError::new(h, message)
    }
}

/// The `(topic, partition)` pairs of a Produce request (v3 to v12) read from
/// the head of its body, when the only bytes beyond `head` belong to the
/// records of its last partition (and the tagged fields after them): the
/// guard can then decide before the records arrive. `body_len` is the whole
/// body's length. `None`: not decidable from the head (or malformed; the
/// whole-frame parser then reports it). Nothing is allocated from a wire
/// count: a count is bounded by the head's bytes.
pub fn partitions_in_head(version: i16, head: &[u8], body_len: usize) -> Option<Vec<(&str, i32)>> {
    if !PRODUCE_VERSIONS[0].1.contains(&version) {
        return None;
    }
    let flexible = api::is_flexible(api::PRODUCE, version);
    let mut r = Reader::new(head);
    r.read_nullable_string_v(flexible, "ProduceRequest.transactional_id")
        .ok()?;
    r.read_i16("ProduceRequest.acks").ok()?;
    r.read_i32("ProduceRequest.timeout_ms").ok()?;
    let n_topics = r
        .read_array_len_v(flexible, 1, "ProduceRequest.topic_data")
        .ok()?;
    let mut out = Vec::new();
    for t in 0..n_topics {
        let name = r
            .read_string_v(flexible, "ProduceRequest.topic_data.name")
            .ok()?;
        let n_parts = r
            .read_array_len_v(flexible, 1, "ProduceRequest.topic_data.partition_data")
            .ok()?;
        for p in 0..n_parts {
            let index = r.read_i32("ProduceRequest.partition_data.index").ok()?;
            let len = if flexible {
                i64::from(
                    r.read_uvarint("ProduceRequest.partition_data.records")
                        .ok()?,
                ) - 1
            } else {
                i64::from(r.read_i32("ProduceRequest.partition_data.records").ok()?)
            };
            out.push((name, index));
            let len = usize::try_from(len.max(0)).ok()?;
            if t + 1 == n_topics && p + 1 == n_parts {
                // The last records: they must end inside the body.
                return (r.position().checked_add(len)? <= body_len).then_some(out);
            }
            r.skip(len, "ProduceRequest.partition_data.records").ok()?;
            r.skip_tagged_fields_v(flexible, "ProduceRequest.partition_data._tagged_fields")
                .ok()?;
        }
        r.skip_tagged_fields_v(flexible, "ProduceRequest.topic_data._tagged_fields")
            .ok()?;
    }
    Some(out)
}

fn results(refusals: &Refusals) -> Vec<(FetchTopic<'_>, Vec<ProducePartitionResult<'_>>)> {
    refusals
        .topics
        .iter()
        .map(|(t, parts)| {
            (
                FetchTopic::Name(t.as_str()),
                parts
                    .iter()
                    .map(|(p, code, msg)| ProducePartitionResult {
                        index: *p,
                        error_code: *code,
                        base_offset: -1,
                        log_append_time_ms: -1,
                        log_start_offset: -1,
                        error_message: Some(msg.as_str()),
                    })
                    .collect(),
            )
        })
        .collect()
}

impl Filter for ProduceGuard {
    fn decodes(&self) -> &[(i16, RangeInclusive<i16>)] {
        &PRODUCE_VERSIONS
    }

    fn handles(&self, api_key: i16, _api_version: i16) -> bool {
        api_key == api::PRODUCE
    }

    /// A Produce whose partition headers all sit in its head and none of
    /// whose partitions is refused streams; any refusal is decided on the
    /// whole frame (the request is split or answered).
    fn decides_from_head(&self, api_key: i16, _api_version: i16) -> bool {
        api_key == api::PRODUCE
    }

    fn passes_from_head(&self, h: &RequestHeader, head: &[u8], total: usize) -> bool {
        let Some(hv) = handlers::request_header_version(h.api_key, h.api_version) else {
            return false;
        };
        let Ok(at) = request_body_offset(head, hv) else {
            return false;
        };
        let (Some(body), Some(body_len)) = (head.get(at..), total.checked_sub(at)) else {
            return false;
        };
        match partitions_in_head(h.api_version, body, body_len) {
            Some(pairs) => pairs
                .iter()
                .all(|(t, p)| self.refusal_code(t, *p).is_none()),
            None => false,
        }
    }

    fn on_request(&self, h: &RequestHeader, frame: &[u8]) -> Result<RequestAction, RewriteError> {
        let forward = RequestAction::forward();
        if !PRODUCE_VERSIONS[0].1.contains(&h.api_version) {
            // Clients only use what the clamped ApiVersions offered.
            return Err(Self::err(
                h,
                format!(
                    "Produce v{} is not accepted by the produce guard",
                    h.api_version
                ),
            ));
        }
        let hv = handlers::request_header_version(h.api_key, h.api_version)
            .ok_or_else(|| Self::err(h, "unknown request header version".into()))?;
        let at = request_body_offset(frame, hv).map_err(|e| Self::err(h, e.to_string()))?;
        let body = frame.get(at..).unwrap_or(&[]);
        let req =
            parse_produce_request(h.api_version, body).map_err(|e| Self::err(h, e.to_string()))?;
        let mut refused: BTreeMap<String, Vec<Refused>> = BTreeMap::new();
        let mut total = 0;
        for t in &req.topics {
            let FetchTopic::Name(name) = t.topic else {
                continue;
            };
            for p in &t.partitions {
                total += 1;
                if let Some((code, msg)) = self.refusal_code(name, p.index) {
                    refused
                        .entry(name.to_string())
                        .or_default()
                        .push((p.index, code, msg));
                }
            }
        }
        if refused.is_empty() {
            return Ok(forward);
        }
        let count: usize = refused.values().map(Vec::len).sum();
        self.metrics
            .produce_refused
            .get_or_create(&ListenerLabels {
                listener: self.listener.clone(),
            })
            .inc_by(count as u64);
        for (t, parts) in &refused {
            for (p, _, msg) in parts {
                tracing::warn!(listener = %self.listener, topic = %t, partition = p,
                    transactional_id = ?req.transactional_id, "produce refused: {msg}");
            }
        }
        let acks_zero = req.acks == 0;
        let refusals = Refusals {
            topics: refused.into_iter().collect(),
        };
        if count == total {
            return Ok(if acks_zero {
                RequestAction::Drop
            } else {
                RequestAction::Answer(RequestState::Guard(refusals))
            });
        }
        let is_refused = |topic: &FetchTopic<'_>, partition: i32| match topic {
            FetchTopic::Name(n) => refusals
                .topics
                .iter()
                .any(|(t, ps)| t == n && ps.iter().any(|(p, _, _)| *p == partition)),
            FetchTopic::Id(_) => false,
        };
        let kept = split_produce_request(h.api_version, body, &mut |t, p| !is_refused(t, p))
            .map_err(|e| Self::err(h, e.to_string()))?
            .ok_or_else(|| Self::err(h, "split kept everything".into()))?;
        Ok(RequestAction::Forward {
            replacement: Some(with_body(frame, at, &kept)),
            state: if acks_zero {
                None
            } else {
                Some(RequestState::Guard(refusals))
            },
        })
    }

    fn on_response(
        &self,
        h: &RequestHeader,
        state: Option<&mut RequestState>,
        frame: BytesMut,
    ) -> Result<Rewritten, RewriteError> {
        let Some(RequestState::Guard(refusals)) = state else {
            return Ok(Rewritten::Ready(frame));
        };
        let body_at = response_body_at(h, &frame)?;
        let merged = merge_produce_responses(h.api_version, &frame[body_at..], &results(refusals))
            .map_err(|e| Self::err(h, e.to_string()))?;
        // The upstream's response header (correlation id, tagged fields) is
        // kept as it came.
        Ok(Rewritten::Ready(with_body(&frame, body_at, &merged)))
    }

    fn answer(
        &self,
        h: &RequestHeader,
        state: &mut RequestState,
    ) -> Result<Rewritten, RewriteError> {
        let RequestState::Guard(refusals) = state else {
            return Err(Self::err(h, "the guard answers only its refusals".into()));
        };
        let body = build_produce_response(h.api_version, &results(refusals), 0)
            .map_err(|e| Self::err(h, e.to_string()))?;
        Ok(Rewritten::Ready(answer_frame(h, &body)?))
    }
}
