//! A mirror listener without its source (SPEC 3.1): the last known source
//! topology, its `__mirror_state` record, and the answers built from it.
//!
//! Every successful source Metadata refresh yields a [`Topology`] (cluster
//! id, brokers, topics with ids, partition leaders and leader epochs). When
//! it differs from the last one persisted, it is written to `__mirror_state`
//! as record type 8, keyed by mirror name; a restart reads it back, so the
//! mirror knows its topics, its source cluster id and its source nodes (their
//! proxy ports are bound at once) with the source down.
//!
//! When the source refuses, hangs or cannot be resolved, a connection goes
//! offline (see `proxy::connection`) and its requests are answered here:
//! ApiVersions (ApiVersions, Metadata and Fetch only), Metadata from the
//! topology (leaders are the source node ids, which clients reach on
//! mirrorguard's node ports), and Fetch with an empty answer for every
//! partition the source would have served, sent after the request's
//! MaxWaitMs. STOPPING and STOPPED partitions never reach this point: the
//! seal path answers them before anything is forwarded.
//!
//! (Over 600 lines only with its tests, a quarter of the file: the topology
//! record and the answers built from it are one contract, read together.)

use bytes::BytesMut;

use crate::codec::api;
use crate::codec::api::error::{UNKNOWN_TOPIC_OR_PARTITION, UNSUPPORTED_VERSION};
use crate::codec::header::{request_body_offset, response_frame};
use crate::codec::RequestHeader;
use crate::filter::{OfflineAnswer, RewriteError};
use crate::handlers::{
    self, build_fetch_response, parse_fetch_request, FetchPartitionResponse, FetchTopic,
};
use crate::wire::{Reader, WireError, WireResult, Writer};

/// Record type of the source-topology record in `__mirror_state`.
pub const SOURCE_TOPOLOGY_TYPE: i16 = 8;
/// Value version this code writes and reads.
pub const SOURCE_TOPOLOGY_VERSION: i16 = 0;

/// API versions answered offline (what the local ApiVersions offers).
const OFFLINE_VERSIONS: &[(i16, i16, i16)] = &[
    (api::FETCH, 4, 17),
    (api::METADATA, 1, 13),
    (api::API_VERSIONS, 0, 3),
];

/// One source broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broker {
    /// Node id.
    pub node_id: i32,
    /// Host as the source advertises it.
    pub host: String,
    /// Port as the source advertises it.
    pub port: i32,
}

/// One partition of a source topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionTopology {
    /// Partition index.
    pub index: i32,
    /// Leader node id.
    pub leader: i32,
    /// Leader epoch.
    pub leader_epoch: i32,
}

/// One source topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicTopology {
    /// Source topic name.
    pub name: String,
    /// Topic id (KIP-1279 keeps it across the mirror).
    pub id: [u8; 16],
    /// Whether the source flags it internal.
    pub internal: bool,
    /// Partitions in index order.
    pub partitions: Vec<PartitionTopology>,
}

/// What a mirror last knew of its source.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Topology {
    /// Source cluster id (Kafka base64 text).
    pub source_cluster_id: String,
    /// Source brokers, by node id.
    pub brokers: Vec<Broker>,
    /// Source topics, by name.
    pub topics: Vec<TopicTopology>,
}

impl Topology {
    /// Sorts brokers and topics so equal topologies compare equal.
    pub fn normalise(&mut self) {
        self.brokers.sort_by_key(|b| b.node_id);
        self.topics.sort_by(|a, b| a.name.cmp(&b.name));
        for t in &mut self.topics {
            t.partitions.sort_by_key(|p| p.index);
        }
    }

    /// The record key (type 8 + mirror name; never flexible).
    pub fn encode_key(mirror: &str) -> WireResult<Vec<u8>> {
        let mut w = Writer::new(Vec::with_capacity(4 + mirror.len()));
        w.put_i16(SOURCE_TOPOLOGY_TYPE);
        w.put_string(mirror, "MirrorSourceTopologyKey.mirror")?;
        Ok(w.into_inner())
    }

    /// Decodes a key of type 8: the mirror name.
    pub fn decode_key(key: &[u8]) -> WireResult<String> {
        let mut r = Reader::new(key);
        let t = r.read_i16("MirrorSourceTopologyKey.type")?;
        if t != SOURCE_TOPOLOGY_TYPE {
            return Err(WireError::UnsupportedVersion {
                api: "MirrorSourceTopologyKey",
                version: t,
            });
        }
        Ok(r.read_string("MirrorSourceTopologyKey.mirror")?.to_string())
    }

    /// The record value (version 0, flexible).
    pub fn encode_value(&self, timestamp_ms: i64) -> WireResult<Vec<u8>> {
        let mut w = Writer::new(Vec::with_capacity(64 + 32 * self.topics.len()));
        w.put_i16(SOURCE_TOPOLOGY_VERSION);
        w.put_compact_string(&self.source_cluster_id, "SourceClusterId")?;
        w.put_i64(timestamp_ms);
        w.put_compact_array_len(Some(self.brokers.len()), "Brokers")?;
        for b in &self.brokers {
            w.put_i32(b.node_id);
            w.put_compact_string(&b.host, "Host")?;
            w.put_i32(b.port);
            w.put_uvarint(0);
        }
        w.put_compact_array_len(Some(self.topics.len()), "Topics")?;
        for t in &self.topics {
            w.put_compact_string(&t.name, "Name")?;
            w.put_uuid(&t.id);
            w.put_bool(t.internal);
            w.put_compact_array_len(Some(t.partitions.len()), "Partitions")?;
            for p in &t.partitions {
                w.put_i32(p.index);
                w.put_i32(p.leader);
                w.put_i32(p.leader_epoch);
                w.put_uvarint(0);
            }
            w.put_uvarint(0);
        }
        w.put_uvarint(0);
        Ok(w.into_inner())
    }

    /// Decodes a value; `Ok(None)` for a version newer than this code (the
    /// caller skips it and counts it).
    pub fn decode_value(value: &[u8]) -> WireResult<Option<(Topology, i64)>> {
        let mut r = Reader::new(value);
        let version = r.read_i16("version")?;
        if version != SOURCE_TOPOLOGY_VERSION {
            return Ok(None);
        }
        let mut t = Topology {
            source_cluster_id: r.read_compact_string("SourceClusterId")?.to_string(),
            ..Default::default()
        };
        let ts = r.read_i64("TimestampMs")?;
        let n = r.read_compact_array_len(16, "Brokers")?.unwrap_or(0);
        for _ in 0..n {
            let node_id = r.read_i32("NodeId")?;
            let host = r.read_compact_string("Host")?.to_string();
            let port = r.read_i32("Port")?;
            r.skip_tagged_fields_v(true, "broker tags")?;
            t.brokers.push(Broker {
                node_id,
                host,
                port,
            });
        }
        let n = r.read_compact_array_len(20, "Topics")?.unwrap_or(0);
        for _ in 0..n {
            let name = r.read_compact_string("Name")?.to_string();
            let id = r.read_uuid("TopicId")?;
            let internal = r.read_bool("IsInternal")?;
            let np = r.read_compact_array_len(13, "Partitions")?.unwrap_or(0);
            let mut partitions = Vec::with_capacity(np);
            for _ in 0..np {
                partitions.push(PartitionTopology {
                    index: r.read_i32("Partition")?,
                    leader: r.read_i32("Leader")?,
                    leader_epoch: r.read_i32("LeaderEpoch")?,
                });
                r.skip_tagged_fields_v(true, "partition tags")?;
            }
            r.skip_tagged_fields_v(true, "topic tags")?;
            t.topics.push(TopicTopology {
                name,
                id,
                internal,
                partitions,
            });
        }
        r.skip_tagged_fields_v(true, "tags")?;
        Ok(Some((t, ts)))
    }
}

fn err(h: &RequestHeader, message: String) -> RewriteError {
    RewriteError {
        api: api::api_name(h.api_key).unwrap_or("unknown"),
        version: h.api_version,
        message,
    }
}

/// The request body of `frame` (after the header).
fn request_body<'a>(h: &RequestHeader, frame: &'a [u8]) -> Result<&'a [u8], RewriteError> {
    let hv = handlers::request_header_version(h.api_key, h.api_version)
        .ok_or_else(|| err(h, "unknown request header version".into()))?;
    let at = request_body_offset(frame, hv).map_err(|e| err(h, e.to_string()))?;
    Ok(frame.get(at..).unwrap_or(&[]))
}

/// MaxWaitMs of a Fetch request (cheap: a fixed position), if readable.
pub fn fetch_max_wait_ms(h: &RequestHeader, frame: &[u8]) -> Option<i32> {
    let body = request_body(h, frame).ok()?;
    // v15+ moved ReplicaId into a tagged field: MaxWaitMs comes first.
    let at = if h.api_version >= 15 { 0 } else { 4 };
    let b = body.get(at..at + 4)?;
    Some(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

/// Whether [`answer`] answers requests of `api_key` (the rest close an
/// offline connection). Connections keep only these requests whole.
pub fn answers(api_key: i16) -> bool {
    matches!(api_key, api::API_VERSIONS | api::METADATA | api::FETCH)
}

/// The answer to `frame` built without the source, or `None` for an API
/// that cannot be answered locally (exactly those [`answers`] refuses).
/// `max_wait_cap` bounds how long a Fetch answer is held.
pub fn answer(
    h: &RequestHeader,
    frame: &[u8],
    topology: &Topology,
    brokers: &[Broker],
    max_wait_cap: std::time::Duration,
) -> Option<Result<OfflineAnswer, RewriteError>> {
    let now = std::time::Duration::ZERO;
    if !answers(h.api_key) {
        return None;
    }
    let built = match h.api_key {
        api::API_VERSIONS => api_versions(h).map(|f| (f, now)),
        api::METADATA => metadata(h, frame, topology, brokers).map(|f| (f, now)),
        api::FETCH => fetch(h, frame, max_wait_cap),
        _ => return None,
    };
    Some(built.map(|(frame, not_before)| OfflineAnswer { frame, not_before }))
}

fn api_versions(h: &RequestHeader) -> Result<BytesMut, RewriteError> {
    api_versions_response(h, OFFLINE_VERSIONS)
}

/// An ApiVersions response answering `h` that advertises `table`
/// (`(api_key, min, max)`); versions above 3 are answered in v0 with
/// UNSUPPORTED_VERSION and the table, as Kafka does, and the client asks
/// again at v0-3.
pub fn api_versions_response(
    h: &RequestHeader,
    table: &[(i16, i16, i16)],
) -> Result<BytesMut, RewriteError> {
    // Versions we do not know are answered in v0 with UNSUPPORTED_VERSION
    // and our list, as Kafka does.
    let (v, error) = if (0..=3).contains(&h.api_version) {
        (h.api_version, 0)
    } else {
        (0, UNSUPPORTED_VERSION)
    };
    let flexible = api::is_flexible(api::API_VERSIONS, v);
    let mut w = Writer::new(Vec::with_capacity(64));
    w.put_i16(error);
    w.put_array_len_v(flexible, Some(table.len()), "api_keys")
        .map_err(|e| err(h, e.to_string()))?;
    for (key, min, max) in table {
        w.put_i16(*key);
        w.put_i16(*min);
        w.put_i16(*max);
        if flexible {
            w.put_uvarint(0);
        }
    }
    if v >= 1 {
        w.put_i32(0); // throttle_time_ms
    }
    if flexible {
        w.put_uvarint(0);
    }
    // ApiVersions responses always use header v0.
    Ok(response_frame(h.correlation_id, 0, &w.into_inner()))
}

/// Topics a Metadata request names: `None` = all.
enum Wanted {
    All,
    Some(Vec<(Option<String>, [u8; 16])>),
}

fn parse_metadata_topics(version: i16, body: &[u8]) -> WireResult<Wanted> {
    let flexible = api::is_flexible(api::METADATA, version);
    let mut r = Reader::new(body);
    let n = if flexible {
        r.read_compact_array_len(17, "topics")?
    } else {
        r.read_array_len(2, "topics")?
    };
    let Some(n) = n else {
        return Ok(Wanted::All);
    };
    // v0 with an empty array also meant "all"; we never answer v0.
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let id = if version >= 10 {
            r.read_uuid("topic_id")?
        } else {
            [0; 16]
        };
        let name = if version >= 10 {
            r.read_compact_nullable_string("name")?
        } else {
            Some(r.read_string_v(flexible, "name")?)
        };
        r.skip_tagged_fields_v(flexible, "topic tags")?;
        out.push((name.map(str::to_string), id));
    }
    Ok(Wanted::Some(out))
}

fn metadata(
    h: &RequestHeader,
    frame: &[u8],
    topology: &Topology,
    brokers: &[Broker],
) -> Result<BytesMut, RewriteError> {
    let v = h.api_version;
    if !(1..=13).contains(&v) {
        return Err(err(h, format!("Metadata v{v} cannot be answered locally")));
    }
    let body = request_body(h, frame)?;
    let wanted = parse_metadata_topics(v, body).map_err(|e| err(h, e.to_string()))?;
    let flexible = api::is_flexible(api::METADATA, v);
    let e = |x: WireError| err(h, x.to_string());
    let mut w = Writer::new(Vec::with_capacity(256));
    if v >= 3 {
        w.put_i32(0); // throttle_time_ms
    }
    w.put_array_len_v(flexible, Some(brokers.len()), "brokers")
        .map_err(e)?;
    for b in brokers {
        w.put_i32(b.node_id);
        w.put_string_v(flexible, &b.host, "host").map_err(e)?;
        w.put_i32(b.port);
        w.put_nullable_string_v(flexible, None, "rack").map_err(e)?;
        if flexible {
            w.put_uvarint(0);
        }
    }
    if v >= 2 {
        w.put_nullable_string_v(flexible, Some(&topology.source_cluster_id), "cluster_id")
            .map_err(e)?;
    }
    // No controller is reachable: -1, as Kafka answers when it knows none.
    w.put_i32(-1);
    let mut entries: Vec<(Option<&TopicTopology>, Option<String>, [u8; 16])> = Vec::new();
    match &wanted {
        Wanted::All => {
            for t in &topology.topics {
                entries.push((Some(t), Some(t.name.clone()), t.id));
            }
        }
        Wanted::Some(list) => {
            for (name, id) in list {
                let found = topology.topics.iter().find(|t| match name {
                    Some(n) => &t.name == n,
                    None => t.id == *id,
                });
                entries.push((found, name.clone(), *id));
            }
        }
    }
    let fallback_leader = brokers.first().map(|b| b.node_id).unwrap_or(-1);
    w.put_array_len_v(flexible, Some(entries.len()), "topics")
        .map_err(e)?;
    for (found, name, id) in &entries {
        w.put_i16(if found.is_some() {
            0
        } else {
            UNKNOWN_TOPIC_OR_PARTITION
        });
        let name = found.map(|t| t.name.as_str()).or(name.as_deref());
        if v >= 12 {
            w.put_nullable_string_v(true, name, "name").map_err(e)?;
        } else {
            w.put_string_v(flexible, name.unwrap_or(""), "name")
                .map_err(e)?;
        }
        if v >= 10 {
            w.put_uuid(&found.map(|t| t.id).unwrap_or(*id));
        }
        w.put_bool(found.is_some_and(|t| t.internal));
        let parts: &[PartitionTopology] = found.map(|t| t.partitions.as_slice()).unwrap_or(&[]);
        w.put_array_len_v(flexible, Some(parts.len()), "partitions")
            .map_err(e)?;
        for p in parts {
            let leader = if brokers.iter().any(|b| b.node_id == p.leader) {
                p.leader
            } else {
                fallback_leader
            };
            w.put_i16(0);
            w.put_i32(p.index);
            w.put_i32(leader);
            if v >= 7 {
                w.put_i32(p.leader_epoch);
            }
            for field in ["replica_nodes", "isr_nodes"] {
                w.put_array_len_v(flexible, Some(1), field).map_err(e)?;
                w.put_i32(leader);
            }
            if v >= 5 {
                w.put_array_len_v(flexible, Some(0), "offline_replicas")
                    .map_err(e)?;
            }
            if flexible {
                w.put_uvarint(0);
            }
        }
        if v >= 8 {
            w.put_i32(i32::MIN); // topic_authorized_operations: not requested
        }
        if flexible {
            w.put_uvarint(0);
        }
    }
    if (8..=10).contains(&v) {
        w.put_i32(i32::MIN); // cluster_authorized_operations
    }
    if v >= 13 {
        w.put_i16(0); // error_code
    }
    if flexible {
        w.put_uvarint(0);
    }
    let hv = if flexible { 1 } else { 0 };
    Ok(response_frame(h.correlation_id, hv, &w.into_inner()))
}

fn fetch(
    h: &RequestHeader,
    frame: &[u8],
    max_wait_cap: std::time::Duration,
) -> Result<(BytesMut, std::time::Duration), RewriteError> {
    let body = request_body(h, frame)?;
    let req = parse_fetch_request(h.api_version, body).map_err(|e| err(h, e.to_string()))?;
    let read_committed = req.isolation_level == 1;
    let mut topics: Vec<(FetchTopic<'_>, Vec<FetchPartitionResponse<'_>>)> = Vec::new();
    for t in &req.topics {
        let parts = t
            .partitions
            .iter()
            .map(|p| {
                // Nothing new: the watermarks where the fetcher stands.
                let mut r = FetchPartitionResponse::new(p.partition);
                r.high_watermark = p.fetch_offset;
                r.last_stable_offset = p.fetch_offset;
                r.aborted_transactions = read_committed.then(Vec::new);
                r.records = Some(std::borrow::Cow::Borrowed(&[]));
                r
            })
            .collect();
        topics.push((t.topic, parts));
    }
    // Session id 0: the source's session is gone with the source.
    let body =
        build_fetch_response(h.api_version, 0, 0, 0, &topics).map_err(|e| err(h, e.to_string()))?;
    let hv = handlers::response_header_version(h.api_key, h.api_version)
        .ok_or_else(|| err(h, "unknown response header version".into()))?;
    let wait = std::time::Duration::from_millis(u64::try_from(req.max_wait_ms).unwrap_or(0))
        .min(max_wait_cap);
    Ok((response_frame(h.correlation_id, hv, &body), wait))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Topology {
        let mut t = Topology {
            source_cluster_id: "MkU3OEVBNTcwNTJENDM2Qg".into(),
            brokers: vec![
                Broker {
                    node_id: 2,
                    host: "b".into(),
                    port: 9093,
                },
                Broker {
                    node_id: 1,
                    host: "a".into(),
                    port: 9092,
                },
            ],
            topics: vec![TopicTopology {
                name: "t".into(),
                id: [7; 16],
                internal: false,
                partitions: vec![
                    PartitionTopology {
                        index: 1,
                        leader: 2,
                        leader_epoch: 4,
                    },
                    PartitionTopology {
                        index: 0,
                        leader: 1,
                        leader_epoch: 3,
                    },
                ],
            }],
        };
        t.normalise();
        t
    }

    #[test]
    fn topology_record_round_trips() {
        let t = sample();
        let v = t.encode_value(42).unwrap();
        assert_eq!(Topology::decode_value(&v).unwrap(), Some((t.clone(), 42)));
        let k = Topology::encode_key("a-to-b").unwrap();
        assert_eq!(&k[..2], &[0, 8]);
        assert_eq!(Topology::decode_key(&k).unwrap(), "a-to-b");
        // A newer version is skipped, not an error.
        let mut newer = v.clone();
        newer[1] = 1;
        assert_eq!(Topology::decode_value(&newer).unwrap(), None);
        // Truncations never panic.
        for n in 0..v.len() {
            let _ = Topology::decode_value(&v[..n]);
        }
    }

    fn request(api_key: i16, version: i16, body: &[u8]) -> (RequestHeader, Vec<u8>) {
        let hv = handlers::request_header_version(api_key, version).unwrap();
        let mut f = Vec::new();
        let mut inner = Vec::new();
        inner.extend_from_slice(&api_key.to_be_bytes());
        inner.extend_from_slice(&version.to_be_bytes());
        inner.extend_from_slice(&9i32.to_be_bytes());
        inner.extend_from_slice(&(-1i16).to_be_bytes()); // null client id
        if hv >= 2 {
            inner.push(0);
        }
        inner.extend_from_slice(body);
        f.extend_from_slice(&(inner.len() as i32).to_be_bytes());
        f.extend_from_slice(&inner);
        (RequestHeader::parse(&f).unwrap(), f)
    }

    #[test]
    fn metadata_answers_every_version_from_the_topology() {
        let t = sample();
        for v in 1..=13i16 {
            let flexible = v >= 9;
            let body: Vec<u8> = if flexible {
                let mut b = vec![0u8]; // null topics = all
                b.extend_from_slice(&[0, 0]);
                if v < 11 {
                    b.push(0);
                }
                b.push(0);
                b
            } else {
                let mut b = (-1i32).to_be_bytes().to_vec();
                if v >= 4 {
                    b.push(0);
                }
                if v >= 8 {
                    b.extend_from_slice(&[0, 0]);
                }
                b
            };
            let (h, f) = request(api::METADATA, v, &body);
            let a = answer(&h, &f, &t, &t.brokers, std::time::Duration::from_secs(1))
                .unwrap()
                .unwrap();
            let hv = if flexible { 1 } else { 0 };
            let at = crate::codec::header::response_body_offset(&a.frame, hv).unwrap();
            let mut seen = Vec::new();
            crate::handlers::rewrite_metadata_response(v, &a.frame[at..], &mut |id, host, port| {
                seen.push((id, host.to_string(), port));
                None
            })
            .unwrap_or_else(|e| panic!("v{v}: {e}"));
            assert_eq!(seen.len(), 2, "v{v}");
            if v >= 10 {
                let view = crate::proxy::refresh::parse_cluster_view(v.min(12), &a.frame[at..]);
                if v == 12 {
                    let view = view.unwrap();
                    assert_eq!(view.topics[0].0, "t");
                    assert_eq!(view.topics[0].1, [7; 16]);
                    assert_eq!(view.topics[0].2, 2);
                }
            }
        }
    }

    #[test]
    fn api_versions_offers_what_offline_answers() {
        for v in 0..=4i16 {
            let body: &[u8] = if v >= 3 { &[0, 0, 0] } else { &[] };
            let (h, f) = request(api::API_VERSIONS, v, body);
            let a = answer(&h, &f, &Topology::default(), &[], Default::default())
                .unwrap()
                .unwrap();
            let err_code = i16::from_be_bytes([a.frame[8], a.frame[9]]);
            assert_eq!(
                err_code,
                if v <= 3 { 0 } else { UNSUPPORTED_VERSION },
                "v{v}"
            );
        }
    }

    #[test]
    fn unknown_apis_are_not_answered() {
        let (h, f) = request(api::PRODUCE, 3, &[]);
        assert!(answer(&h, &f, &Topology::default(), &[], Default::default()).is_none());
    }
}
