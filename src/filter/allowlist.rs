//! What a `[[mirror]]` listener lets through (SPEC 5, least privilege).
//!
//! A mirror listener's upstream connections are mirrorguard's own on the
//! source: whatever it forwards, the source does as mirrorguard. So it
//! forwards only the APIs a mirror fetcher (a destination broker's replica
//! fetcher) and an `assign()`-based reader (a consumer without a group, a
//! dump tool) need, and nothing that writes or belongs to a consumer group:
//!
//! | API | why it is needed |
//! |---|---|
//! | ApiVersions (18) | version negotiation (its answer lists only this table) |
//! | Metadata (3) | leaders and topic ids; never creates a topic (`allow_auto_topic_creation` is cleared) |
//! | Fetch (1) | the data path |
//! | ListOffsets (2) | earliest/latest offsets of a reader; a fetcher's truncation |
//! | OffsetForLeaderEpoch (23) | a fetcher's and a reader's (KIP-320) truncation check |
//! | DescribeCluster (60) | cluster id and brokers (addresses rewritten) |
//! | SaslHandshake (17), SaslAuthenticate (36) | authentication where the listener terminates it (answered by mirrorguard, never forwarded) |
//!
//! ApiVersions answers list these, plus Produce and FindCoordinator, which
//! are refused all the same: librdkafka enables its message formats only
//! when it sees them ([`advertised`]).
//!
//! Everything else is answered by mirrorguard, never forwarded: in the
//! API's own response shape where mirrorguard builds it (Produce, CreateTopics,
//! DeleteTopics, DeleteRecords, CreatePartitions, AddPartitionsToTxn:
//! TOPIC_AUTHORIZATION_FAILED per item; WriteTxnMarkers and InitProducerId:
//! CLUSTER_AUTHORIZATION_FAILED; the consumer-group APIs FindCoordinator,
//! JoinGroup, SyncGroup, Heartbeat, LeaveGroup, ListGroups and
//! ConsumerGroupHeartbeat: GROUP_AUTHORIZATION_FAILED, except FindCoordinator:
//! COORDINATOR_NOT_AVAILABLE, retriable, because librdkafka looks for a
//! coordinator even for an `assign()` reader with a `group.id`; EndTxn:
//! TRANSACTIONAL_ID_AUTHORIZATION_FAILED), with a Produce of `acks=0`
//! dropped (Kafka answers none); any other API closes the connection, as a
//! Kafka broker closes one that sends an API its listener does not enable.
//! Each refusal is logged (at most a line a second) and counted in
//! `mirrorguard_mirror_refused_total{listener,api}`. ApiVersions answers
//! advertise only the table's keys (and the two above), so well-behaved
//! clients never send the rest (Kafka's Java clients report an
//! UnsupportedVersionException, librdkafka an unsupported feature).

use std::ops::RangeInclusive;

use bytes::BytesMut;
use kafka_protocol::protocol::Encodable;

use super::{Filter, RequestAction, RequestState, RewriteError, Rewritten};
use crate::codec::api::{self, error};
use crate::codec::header::request_body_offset;
use crate::codec::RequestHeader;
use crate::handlers::guarded_writes::{
    build_write_response, parse_write_request, GroupAnswer, TopicAnswer,
};
use crate::handlers::produce_build::{build_produce_response, ProducePartitionResult};
use crate::handlers::produce_request::parse_produce_request;
use crate::metrics::{ApiLabels, Metrics};
use crate::proxy::limits::LogLimiter;
use crate::wire::{Reader, WireResult, Writer};

const LIST_OFFSETS: i16 = 2;
const OFFSET_FOR_LEADER_EPOCH: i16 = 23;
const SASL_HANDSHAKE: i16 = 17;
const SASL_AUTHENTICATE: i16 = 36;
const CREATE_TOPICS: i16 = 19;
const JOIN_GROUP: i16 = 11;
const HEARTBEAT: i16 = 12;
const LEAVE_GROUP: i16 = 13;
const SYNC_GROUP: i16 = 14;
const LIST_GROUPS: i16 = 16;
const INIT_PRODUCER_ID: i16 = 22;
const END_TXN: i16 = 26;
const CONSUMER_GROUP_HEARTBEAT: i16 = 68;

/// The APIs a mirror listener forwards (or, for SASL, answers itself).
pub const MIRROR_APIS: &[i16] = &[
    api::FETCH,
    LIST_OFFSETS,
    api::METADATA,
    SASL_HANDSHAKE,
    api::API_VERSIONS,
    OFFSET_FOR_LEADER_EPOCH,
    SASL_AUTHENTICATE,
    api::DESCRIBE_CLUSTER,
];

/// Whether a mirror listener lets `api_key` through.
pub fn allowed(api_key: i16) -> bool {
    MIRROR_APIS.contains(&api_key)
}

/// What a mirror listener's ApiVersions answer lists: [`MIRROR_APIS`], and
/// Produce and FindCoordinator, which it refuses but which librdkafka
/// needs to see: it enables its message formats from ApiVersions as
/// "features" that each need several APIs (MsgVer2 = Produce v3 and Fetch
/// v4, LZ4 = FindCoordinator), and without them fails every Fetch as
/// unsupported.
pub fn advertised(api_key: i16) -> bool {
    allowed(api_key) || api_key == api::PRODUCE || api_key == api::FIND_COORDINATOR
}

/// A mirror listener's API list: refuses the rest, trims ApiVersions.
pub struct MirrorAllowlist {
    listener: String,
    metrics: std::sync::Arc<Metrics>,
    log: LogLimiter,
}

impl MirrorAllowlist {
    /// The list of `listener`, counting refusals in `metrics`.
    pub fn new(listener: &str, metrics: std::sync::Arc<Metrics>) -> Self {
        Self {
            listener: listener.to_owned(),
            metrics,
            log: LogLimiter::default(),
        }
    }
}

fn err(h: &RequestHeader, e: impl std::fmt::Display) -> RewriteError {
    RewriteError::new(h, e.to_string())
}

impl Filter for MirrorAllowlist {
    fn decodes(&self) -> &[(i16, RangeInclusive<i16>)] {
        &[]
    }

    fn handles(&self, api_key: i16, api_version: i16) -> bool {
        api_key == api::API_VERSIONS
            || (api_key == api::METADATA && api_version >= 4)
            || !allowed(api_key)
    }

    fn reads_request(&self, api_key: i16, api_version: i16) -> bool {
        api_key != api::API_VERSIONS && self.handles(api_key, api_version)
    }

    fn on_request(&self, h: &RequestHeader, frame: &[u8]) -> Result<RequestAction, RewriteError> {
        if h.api_key == api::API_VERSIONS {
            return Ok(RequestAction::forward());
        }
        if h.api_key == api::METADATA {
            return Ok(match no_auto_creation(h, frame).map_err(|e| err(h, e))? {
                Some(f) => RequestAction::Forward {
                    replacement: Some(f),
                    state: None,
                },
                None => RequestAction::forward(),
            });
        }
        let name = api::api_label(h.api_key);
        self.metrics
            .mirror_refused
            .get_or_create(&ApiLabels {
                listener: self.listener.clone(),
                api: name.to_string(),
            })
            .inc();
        if let Some(held_back) = self.log.allow() {
            tracing::warn!(listener = %self.listener, api = name, version = h.api_version,
                held_back, "request refused on a mirror listener: it forwards only what a \
                 mirror fetcher and an assign() reader need (ApiVersions, Metadata, Fetch, \
                 ListOffsets, OffsetForLeaderEpoch, DescribeCluster)");
        }
        let at = crate::handlers::request_header_version(h.api_key, h.api_version)
            .and_then(|hv| request_body_offset(frame, hv).ok());
        let body = at.and_then(|at| frame.get(at..)).unwrap_or_default();
        match refusal(h, body) {
            Ok(Some(Refusal::Drop)) => Ok(RequestAction::Drop),
            Ok(Some(Refusal::Body(b))) => Ok(RequestAction::Answer(RequestState::Refused(b))),
            Ok(None) | Err(_) => Err(err(
                h,
                "not forwarded by a mirror listener (closing the connection, as Kafka does \
                 for an API its listener does not enable)",
            )),
        }
    }

    fn on_response(
        &self,
        h: &RequestHeader,
        _state: Option<&mut RequestState>,
        frame: BytesMut,
    ) -> Result<Rewritten, RewriteError> {
        if h.api_key != api::API_VERSIONS {
            return Ok(Rewritten::Ready(frame));
        }
        // ApiVersions responses always have header v0.
        let body_at = 8;
        let body = frame.get(body_at..).ok_or_else(|| err(h, "truncated"))?;
        Ok(Rewritten::Ready(
            match keep_api_versions(h.api_version, body, advertised).map_err(|e| err(h, e))? {
                Some(b) => super::with_body(&frame, body_at, &b),
                None => frame,
            },
        ))
    }

    fn answer(
        &self,
        h: &RequestHeader,
        state: &mut RequestState,
    ) -> Result<Rewritten, RewriteError> {
        let RequestState::Refused(body) = state else {
            return Err(err(h, "no refusal to answer"));
        };
        Ok(Rewritten::Ready(super::answer_frame(h, body)?))
    }
}

/// How a refused request is answered.
enum Refusal {
    /// With this response body.
    Body(Vec<u8>),
    /// Not at all (Produce with acks=0).
    Drop,
}

/// The response body refusing `h` (`None`: no shape mirrorguard builds).
fn refusal(h: &RequestHeader, body: &[u8]) -> WireResult<Option<Refusal>> {
    let v = h.api_version;
    let denied = "not allowed through a mirror listener (it speaks for mirrorguard on the source)";
    Ok(Some(Refusal::Body(match h.api_key {
        api::PRODUCE => {
            let req = parse_produce_request(v, body)?;
            if req.acks == 0 {
                return Ok(Some(Refusal::Drop));
            }
            let topics: Vec<_> = req
                .topics
                .iter()
                .map(|t| {
                    let parts = t
                        .partitions
                        .iter()
                        .map(|p| {
                            ProducePartitionResult::refused(
                                p.index,
                                error::TOPIC_AUTHORIZATION_FAILED,
                                Some(denied),
                            )
                        })
                        .collect();
                    (t.topic, parts)
                })
                .collect();
            build_produce_response(v, &topics, 0)?
        }
        k if crate::handlers::guarded_writes::is_guarded_write(k) => {
            let req = parse_write_request(k, v, body)?;
            let code = if k == api::WRITE_TXN_MARKERS {
                error::CLUSTER_AUTHORIZATION_FAILED
            } else {
                error::TOPIC_AUTHORIZATION_FAILED
            };
            let groups: Vec<GroupAnswer> = req
                .groups
                .iter()
                .map(|g| GroupAnswer {
                    transactional_id: g.transactional_id.map(str::to_string),
                    producer_id: g.producer_id,
                    topics: g
                        .topics
                        .iter()
                        .map(|t| TopicAnswer {
                            name: t.name.map(str::to_string),
                            id: t.id,
                            error_code: code,
                            message: Some(denied.to_string()),
                            partitions: t
                                .partitions
                                .iter()
                                .flatten()
                                .map(|(p, _)| (*p, code))
                                .collect(),
                        })
                        .collect(),
                })
                .collect();
            build_write_response(k, v, &groups)?
        }
        CREATE_TOPICS => create_topics_refusal(v, body, denied)?,
        _ => match top_level_refusal(h, body) {
            Some(b) => b,
            None => return Ok(None),
        },
    })))
}

/// CreateTopics v2-7 (Kafka 4's versions): every topic
/// TOPIC_AUTHORIZATION_FAILED.
fn create_topics_refusal(version: i16, body: &[u8], message: &str) -> WireResult<Vec<u8>> {
    if !(2..=7).contains(&version) {
        return Err(crate::wire::WireError::UnsupportedVersion {
            api: "CreateTopics",
            version,
        });
    }
    let flexible = version >= 5;
    let mut r = Reader::new(body);
    let n = r.read_array_len_v(flexible, 12, "topics")?;
    let mut names = Vec::new();
    for _ in 0..n {
        names.push(r.read_string_v(flexible, "name")?);
        r.read_i32("num_partitions")?;
        r.read_i16("replication_factor")?;
        let assignments = r.read_array_len_v(flexible, 5, "assignments")?;
        for _ in 0..assignments {
            r.read_i32("partition_index")?;
            let brokers = r.read_array_len_v(flexible, 4, "broker_ids")?;
            r.skip(brokers * 4, "broker_ids")?;
            r.skip_tagged_fields_v(flexible, "assignment tags")?;
        }
        let configs = r.read_array_len_v(flexible, 2, "configs")?;
        for _ in 0..configs {
            r.read_string_v(flexible, "config name")?;
            r.read_nullable_string_v(flexible, "config value")?;
            r.skip_tagged_fields_v(flexible, "config tags")?;
        }
        r.skip_tagged_fields_v(flexible, "topic tags")?;
    }
    let mut out = Vec::new();
    let mut w = Writer::new(&mut out);
    if version >= 2 {
        w.put_i32(0); // throttle_time_ms
    }
    w.put_array_len_v(flexible, Some(names.len()), "topics")?;
    for name in names {
        w.put_string_v(flexible, name, "name")?;
        if version >= 7 {
            w.put_uuid(&[0; 16]);
        }
        w.put_i16(error::TOPIC_AUTHORIZATION_FAILED);
        if version >= 1 {
            w.put_nullable_string_v(flexible, Some(message), "error_message")?;
        }
        if version >= 5 {
            w.put_i32(-1); // num_partitions
            w.put_i16(-1); // replication_factor
            w.put_array_len_v(flexible, None, "configs")?; // null
            w.put_uvarint(0);
        }
    }
    if flexible {
        w.put_uvarint(0);
    }
    Ok(out)
}

/// The APIs whose refusal is one top-level error code (encoded with the
/// `kafka-protocol` response types: building, never decoding).
fn top_level_refusal(h: &RequestHeader, body: &[u8]) -> Option<Vec<u8>> {
    use kafka_protocol::messages as m;
    let v = h.api_version;
    let group = error::GROUP_AUTHORIZATION_FAILED;
    // No coordinator here (retriable): librdkafka, which looks for its
    // group's coordinator even when the consumer only assign()s, keeps
    // fetching instead of failing the reader.
    let no_coordinator = error::COORDINATOR_NOT_AVAILABLE;
    let message = "a mirror listener has no group coordinator: read with assign() and no commits";
    let mut buf = BytesMut::new();
    macro_rules! encode {
        ($ty:ty, $code:expr) => {{
            let resp = <$ty>::default().with_error_code($code);
            resp.encode(&mut buf, v).ok()?;
        }};
    }
    match h.api_key {
        api::FIND_COORDINATOR if v <= 3 => {
            let resp = m::FindCoordinatorResponse::default()
                .with_error_code(no_coordinator)
                .with_error_message((v >= 1).then(|| message.to_string().into()))
                .with_node_id((-1).into())
                .with_port(-1);
            resp.encode(&mut buf, v).ok()?;
        }
        api::FIND_COORDINATOR => {
            let keys = coordinator_keys(v, body).ok()?;
            let resp = m::FindCoordinatorResponse::default().with_coordinators(
                keys.into_iter()
                    .map(|k| {
                        m::find_coordinator_response::Coordinator::default()
                            .with_key(k.into())
                            .with_node_id((-1).into())
                            .with_port(-1)
                            .with_error_code(no_coordinator)
                            .with_error_message(Some(message.to_string().into()))
                    })
                    .collect(),
            );
            resp.encode(&mut buf, v).ok()?;
        }
        JOIN_GROUP => encode!(m::JoinGroupResponse, group),
        SYNC_GROUP => encode!(m::SyncGroupResponse, group),
        HEARTBEAT => encode!(m::HeartbeatResponse, group),
        LEAVE_GROUP => encode!(m::LeaveGroupResponse, group),
        LIST_GROUPS => encode!(m::ListGroupsResponse, group),
        CONSUMER_GROUP_HEARTBEAT => encode!(m::ConsumerGroupHeartbeatResponse, group),
        INIT_PRODUCER_ID => {
            let resp = m::InitProducerIdResponse::default()
                .with_error_code(error::CLUSTER_AUTHORIZATION_FAILED)
                .with_producer_id((-1).into())
                .with_producer_epoch(-1);
            resp.encode(&mut buf, v).ok()?;
        }
        END_TXN => encode!(
            m::EndTxnResponse,
            error::TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        ),
        _ => return None,
    }
    Some(buf.to_vec())
}

/// FindCoordinator v4+: the keys asked for.
fn coordinator_keys(version: i16, body: &[u8]) -> WireResult<Vec<String>> {
    let flexible = version >= 3;
    let mut r = Reader::new(body);
    r.read_i8("key_type")?;
    let n = r.read_array_len_v(flexible, 1, "coordinator_keys")?;
    let mut keys = Vec::new();
    for _ in 0..n {
        keys.push(r.read_string_v(flexible, "coordinator_key")?.to_string());
    }
    Ok(keys)
}

/// A Metadata v4+ request frame with `allow_auto_topic_creation` cleared
/// (`None`: already clear): a reader must not create topics on the source
/// as mirrorguard.
fn no_auto_creation(h: &RequestHeader, frame: &[u8]) -> WireResult<Option<BytesMut>> {
    let v = h.api_version;
    let flexible = api::is_flexible(api::METADATA, v);
    let hv = crate::handlers::request_header_version(api::METADATA, v).unwrap_or(1);
    let at = request_body_offset(frame, hv).map_err(|_| crate::wire::WireError::Truncated {
        field: "Metadata header",
        needed: 0,
        offset: 0,
        available: 0,
    })?;
    let mut r = Reader::new(&frame[at..]);
    let n = r.read_nullable_array_len_v(flexible, 1, "topics")?;
    if let Some(n) = n {
        for _ in 0..n {
            if v >= 10 {
                r.read_uuid("topic_id")?;
            }
            r.read_nullable_string_v(flexible, "name")?;
            r.skip_tagged_fields_v(flexible, "topic tags")?;
        }
    }
    let flag = at + r.position();
    match frame.get(flag) {
        Some(0) => Ok(None),
        Some(_) => {
            let mut f = BytesMut::from(frame);
            f[flag] = 0;
            Ok(Some(f))
        }
        None => Err(crate::wire::WireError::Truncated {
            field: "allow_auto_topic_creation",
            needed: 1,
            offset: flag,
            available: 0,
        }),
    }
}

/// An ApiVersions response body at `version` with only the keys `keep`
/// accepts (`None`: nothing to remove).
pub fn keep_api_versions(
    version: i16,
    body: &[u8],
    keep: impl Fn(i16) -> bool,
) -> WireResult<Option<Vec<u8>>> {
    let flexible = version >= 3;
    let mut r = Reader::new(body);
    let code = r.read_i16("error_code")?;
    let n = r.read_array_len_v(flexible, 6, "api_keys")?;
    let mut entries = Vec::new();
    let mut dropped = false;
    for _ in 0..n {
        let start = r.position();
        let key = r.read_i16("api_key")?;
        r.read_i16("min_version")?;
        r.read_i16("max_version")?;
        r.skip_tagged_fields_v(flexible, "api_keys tags")?;
        if keep(key) {
            entries.push(&body[start..r.position()]);
        } else {
            dropped = true;
        }
    }
    if !dropped {
        return Ok(None);
    }
    let rest = &body[r.position()..];
    let mut out = Vec::with_capacity(body.len());
    let mut w = Writer::new(&mut out);
    w.put_i16(code);
    w.put_array_len_v(flexible, Some(entries.len()), "api_keys")?;
    for e in entries {
        w.put_raw(e);
    }
    w.put_raw(rest);
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::protocol::Decodable;

    fn header(api_key: i16, api_version: i16) -> RequestHeader {
        RequestHeader {
            api_key,
            api_version,
            correlation_id: 5,
        }
    }

    fn frame(h: &RequestHeader, body: &[u8]) -> Vec<u8> {
        crate::kafka_client::request_frame(h.api_key, h.api_version, h.correlation_id, "t", |w| {
            w.put_raw(body);
            Ok(())
        })
        .unwrap()
        .to_vec()
    }

    fn filter() -> MirrorAllowlist {
        MirrorAllowlist::new("m", Metrics::new())
    }

    fn refused_body(f: &MirrorAllowlist, h: &RequestHeader, body: &[u8]) -> Vec<u8> {
        match f.on_request(h, &frame(h, body)).unwrap() {
            RequestAction::Answer(RequestState::Refused(b)) => b,
            _ => panic!("not refused"),
        }
    }

    #[test]
    fn the_list_passes_and_writes_are_refused_in_their_own_shape() {
        let f = filter();
        for k in MIRROR_APIS {
            assert!(!f.handles(*k, 0) || *k == api::API_VERSIONS, "{k}");
        }
        let h = header(api::API_VERSIONS, 3);
        assert!(matches!(
            f.on_request(&h, &frame(&h, &[])).unwrap(),
            RequestAction::Forward {
                replacement: None,
                state: None
            }
        ));
        // Produce v8: one topic, one partition, refused per partition.
        let mut body = Vec::new();
        let mut w = Writer::new(&mut body);
        w.put_i16(-1); // transactional id: null
        w.put_i16(-1);
        w.put_i32(1000);
        w.put_i32(1);
        w.put_string("t", "").unwrap();
        w.put_i32(1);
        w.put_i32(3);
        w.put_i32(-1); // records: null
        let h = header(api::PRODUCE, 8);
        let out = refused_body(&f, &h, &body);
        let resp = kafka_protocol::messages::ProduceResponse::decode(&mut &out[..], 8).unwrap();
        let p = &resp.responses[0].partition_responses[0];
        assert_eq!(
            (p.index, p.error_code),
            (3, error::TOPIC_AUTHORIZATION_FAILED)
        );
        // acks=0: no answer at all.
        body[2..4].copy_from_slice(&0i16.to_be_bytes());
        assert!(matches!(
            f.on_request(&h, &frame(&h, &body)).unwrap(),
            RequestAction::Drop
        ));
        // CreateTopics at every version Kafka 4 speaks.
        for v in 2..=7i16 {
            let flexible = v >= 5;
            let mut body = Vec::new();
            let mut w = Writer::new(&mut body);
            w.put_array_len_v(flexible, Some(1), "").unwrap();
            w.put_string_v(flexible, "new", "").unwrap();
            w.put_i32(1);
            w.put_i16(1);
            w.put_array_len_v(flexible, Some(0), "").unwrap();
            w.put_array_len_v(flexible, Some(1), "").unwrap();
            w.put_string_v(flexible, "k", "").unwrap();
            w.put_nullable_string_v(flexible, None, "").unwrap();
            if flexible {
                w.put_uvarint(0);
                w.put_uvarint(0);
            }
            w.put_i32(1000);
            if v >= 1 {
                w.put_bool(false);
            }
            if flexible {
                w.put_uvarint(0);
            }
            let out = refused_body(&f, &header(CREATE_TOPICS, v), &body);
            let resp =
                kafka_protocol::messages::CreateTopicsResponse::decode(&mut &out[..], v).unwrap();
            assert_eq!(resp.topics.len(), 1, "v{v}");
            assert_eq!(resp.topics[0].name.0.as_str(), "new");
            assert_eq!(resp.topics[0].error_code, error::TOPIC_AUTHORIZATION_FAILED);
        }
        // Group APIs: GROUP_AUTHORIZATION_FAILED; FindCoordinator v4 per key.
        let out = refused_body(&f, &header(JOIN_GROUP, 5), &[0; 40]);
        let resp = kafka_protocol::messages::JoinGroupResponse::decode(&mut &out[..], 5).unwrap();
        assert_eq!(resp.error_code, error::GROUP_AUTHORIZATION_FAILED);
        let out = refused_body(&f, &header(api::FIND_COORDINATOR, 4), &[0, 2, 2, b'g', 0]);
        let resp =
            kafka_protocol::messages::FindCoordinatorResponse::decode(&mut &out[..], 4).unwrap();
        assert_eq!(resp.coordinators.len(), 1);
        assert_eq!(
            resp.coordinators[0].error_code,
            error::COORDINATOR_NOT_AVAILABLE
        );
        // An API with no shape here, or garbage: the connection closes.
        assert!(f
            .on_request(&header(44, 0), &frame(&header(44, 0), &[]))
            .is_err());
        assert!(f
            .on_request(
                &header(api::PRODUCE, 8),
                &frame(&header(api::PRODUCE, 8), &[1])
            )
            .is_err());
        let text = f.metrics.encode();
        assert!(
            text.contains("mirrorguard_mirror_refused_total{listener=\"m\",api=\"Produce\"} 3"),
            "{text}"
        );
    }

    #[test]
    fn metadata_never_creates_topics_and_api_versions_lists_only_the_table() {
        let f = filter();
        for v in [4i16, 8, 9, 12] {
            let flexible = v >= 9;
            let mut body = Vec::new();
            let mut w = Writer::new(&mut body);
            w.put_array_len_v(flexible, Some(1), "").unwrap();
            if v >= 10 {
                w.put_uuid(&[0; 16]);
            }
            w.put_nullable_string_v(flexible, Some("x"), "").unwrap();
            if flexible {
                w.put_uvarint(0);
            }
            w.put_bool(true);
            let h = header(api::METADATA, v);
            let fr = frame(&h, &body);
            let RequestAction::Forward {
                replacement: Some(out),
                ..
            } = f.on_request(&h, &fr).unwrap()
            else {
                panic!("v{v}: not rewritten")
            };
            assert_eq!(out.len(), fr.len());
            let diff: Vec<usize> = (0..fr.len()).filter(|i| out[*i] != fr[*i]).collect();
            assert_eq!(diff.len(), 1, "v{v}");
            assert_eq!(out[diff[0]], 0);
        }
        for v in [0i16, 3] {
            let flexible = v >= 3;
            let mut b = Vec::new();
            let mut w = Writer::new(&mut b);
            w.put_i16(0);
            w.put_array_len_v(flexible, Some(3), "").unwrap();
            for k in [0i16, 1, 19] {
                w.put_i16(k);
                w.put_i16(0);
                w.put_i16(9);
                if flexible {
                    w.put_uvarint(0);
                }
            }
            if v >= 1 {
                w.put_i32(0);
            }
            if flexible {
                w.put_uvarint(0);
            }
            let kept = keep_api_versions(v, &b, advertised).unwrap().unwrap();
            let resp =
                kafka_protocol::messages::ApiVersionsResponse::decode(&mut &kept[..], v).unwrap();
            let keys: Vec<i16> = resp.api_keys.iter().map(|k| k.api_key).collect();
            assert_eq!(keys, vec![0, 1], "v{v}");
        }
    }
}
