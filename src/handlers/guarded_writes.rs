//! The writes other than Produce that the produce guard refuses for a
//! mirrored partition (SPEC 3.1, "On the produce side"): AddPartitionsToTxn
//! (24), WriteTxnMarkers (27), DeleteRecords (21), CreatePartitions (37)
//! and DeleteTopics (20). Requests are parsed (hostile client input: every
//! length checked by [`Reader`], no capacity reserved from a wire count),
//! split where the API lets the broker decide each item on its own, and the
//! guard's answers encoded in each API's response.
//!
//! Request layouts (flexible versions add tagged fields to every struct):
//!
//! - AddPartitionsToTxn v0-3 (flexible v3+): `transactional_id, producer_id:
//!   i64, producer_epoch: i16, topics: [name, partitions: [i32]]`; v4+
//!   (broker-to-broker, batched): `transactions: [transactional_id,
//!   producer_id, producer_epoch, verify_only: bool, topics: [..]]`.
//! - WriteTxnMarkers v0-2 (flexible v1+): `markers: [producer_id,
//!   producer_epoch, transaction_result: bool, topics: [name,
//!   partition_indexes: [i32]], coordinator_epoch: i32,
//!   transaction_version: i8 (v2+)]`.
//! - DeleteRecords v0-2 (flexible v2+): `topics: [name, partitions:
//!   [partition_index: i32, offset: i64]], timeout_ms`.
//! - CreatePartitions v0-3 (flexible v2+): `topics: [name, count: i32,
//!   assignments: nullable [broker_ids: [i32]]], timeout_ms, validate_only`.
//! - DeleteTopics v0-6 (flexible v4+): `topic_names: [string]` (v0-5) or
//!   `topics: [name: nullable string, topic_id: uuid]` (v6+), `timeout_ms`.
//!
//! Splittable (each item is decided by the broker on its own): DeleteRecords
//! (per partition), CreatePartitions and DeleteTopics (per topic). The other
//! two are answered whole: AddPartitionsToTxn is atomic on the coordinator
//! (one failing partition fails the request, the others get
//! OPERATION_NOT_ATTEMPTED), and a client's WriteTxnMarkers is an
//! operator's repair (`Admin.abortTransaction` sends one partition per
//! request; its handler expects one marker result per request, which a
//! split answer could not keep).
//!
//! (Over 600 lines on purpose: five APIs' request parsers, one splitter and
//! their answers share one item model; the tests are in
//! `tests/handlers_guarded_writes.rs`.)

use std::ops::{Range, RangeInclusive};

use super::check_version;
use crate::codec::api;
use crate::wire::{Reader, Splicer, WireError, WireResult, Writer};

/// DeleteTopics.
pub const DELETE_TOPICS: i16 = api::DELETE_TOPICS;
/// DeleteRecords.
pub const DELETE_RECORDS: i16 = api::DELETE_RECORDS;
/// AddPartitionsToTxn.
pub const ADD_PARTITIONS_TO_TXN: i16 = api::ADD_PARTITIONS_TO_TXN;
/// WriteTxnMarkers.
pub const WRITE_TXN_MARKERS: i16 = api::WRITE_TXN_MARKERS;
/// CreatePartitions.
pub const CREATE_PARTITIONS: i16 = api::CREATE_PARTITIONS;

/// The versions parsed here, per API key (every version Kafka 4.4 speaks).
pub const GUARDED_WRITE_VERSIONS: [(i16, RangeInclusive<i16>); 5] = [
    (DELETE_TOPICS, 0..=6),
    (DELETE_RECORDS, 0..=2),
    (ADD_PARTITIONS_TO_TXN, 0..=5),
    (WRITE_TXN_MARKERS, 0..=2),
    (CREATE_PARTITIONS, 0..=3),
];

/// Whether `api_key` is one of the writes parsed here.
pub fn is_guarded_write(api_key: i16) -> bool {
    GUARDED_WRITE_VERSIONS.iter().any(|(k, _)| *k == api_key)
}

fn versions(api_key: i16) -> WireResult<RangeInclusive<i16>> {
    GUARDED_WRITE_VERSIONS
        .iter()
        .find(|(k, _)| *k == api_key)
        .map(|(_, r)| r.clone())
        .ok_or(WireError::UnsupportedVersion {
            api: "guarded write",
            version: -1,
        })
}

fn name_of(api_key: i16) -> &'static str {
    api::api_name(api_key).unwrap_or("guarded write")
}

/// One topic entry of a write request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteTopic<'a> {
    /// The topic's name (`None` only for a DeleteTopics v6+ entry naming
    /// its topic by id).
    pub name: Option<&'a str>,
    /// The topic id of a DeleteTopics v6+ entry (`None` when all zeros).
    pub id: Option<[u8; 16]>,
    /// Byte range of the whole entry within the body.
    pub span: Range<usize>,
    /// The partitions named, with each entry's byte range (`None` for the
    /// topic-level APIs: CreatePartitions, DeleteTopics).
    pub partitions: Option<Vec<(i32, Range<usize>)>>,
    /// Byte range of the partition count prefix (empty when topic-level).
    pub partitions_count: Range<usize>,
}

/// One group of topics: the whole request, a transaction of a batched
/// AddPartitionsToTxn (v4+), or a marker of a WriteTxnMarkers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteGroup<'a> {
    /// AddPartitionsToTxn's transactional id.
    pub transactional_id: Option<&'a str>,
    /// AddPartitionsToTxn's or WriteTxnMarkers' producer id (-1 otherwise).
    pub producer_id: i64,
    /// Topics, in wire order.
    pub topics: Vec<WriteTopic<'a>>,
    /// Byte range of the topics count prefix.
    pub topics_count: Range<usize>,
}

/// What [`parse_write_request`] learned about a request body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteRequest<'a> {
    /// API key.
    pub api_key: i16,
    /// Version.
    pub version: i16,
    /// Groups, in wire order (one for the APIs without an outer array).
    pub groups: Vec<WriteGroup<'a>>,
    /// Offset just after the last field parsed.
    pub end: usize,
}

impl WriteRequest<'_> {
    /// Whether the broker decides each item of this request on its own (the
    /// guard then forwards the items it does not refuse).
    pub fn splittable(&self) -> bool {
        matches!(
            self.api_key,
            DELETE_RECORDS | CREATE_PARTITIONS | DELETE_TOPICS
        )
    }
}

/// An INT32 array entry and its byte range.
type Indexed = (i32, Range<usize>);

fn read_i32_array(
    r: &mut Reader<'_>,
    flexible: bool,
    field: &'static str,
) -> WireResult<(Range<usize>, Vec<Indexed>)> {
    let start = r.position();
    let n = r.read_array_len_v(flexible, 4, field)?;
    let count = start..r.position();
    // Grows by parsed entries only, never from the wire count.
    let mut out = Vec::new();
    for _ in 0..n {
        let at = r.position();
        out.push((r.read_i32(field)?, at..r.position()));
    }
    Ok((count, out))
}

/// `name, partitions: [i32]` (AddPartitionsToTxn, WriteTxnMarkers topics).
fn read_index_topics<'a>(
    r: &mut Reader<'a>,
    flexible: bool,
    field: &'static str,
) -> WireResult<(Range<usize>, Vec<WriteTopic<'a>>)> {
    let start = r.position();
    // Smallest topic: name (1) + partitions count (1).
    let n = r.read_array_len_v(flexible, 2, field)?;
    let count = start..r.position();
    let mut topics = Vec::new();
    for _ in 0..n {
        let tstart = r.position();
        let name = r.read_string_v(flexible, field)?;
        let (partitions_count, parts) = read_i32_array(r, flexible, field)?;
        r.skip_tagged_fields_v(flexible, field)?;
        topics.push(WriteTopic {
            name: Some(name),
            id: None,
            span: tstart..r.position(),
            partitions: Some(parts),
            partitions_count,
        });
    }
    Ok((count, topics))
}

/// Parses a write request body (the bytes after the request header) of
/// `api_key` at `version`, checking every length. Trailing bytes after the
/// last field are not an error (`end` says where parsing stopped).
pub fn parse_write_request(
    api_key: i16,
    version: i16,
    body: &[u8],
) -> WireResult<WriteRequest<'_>> {
    let api = name_of(api_key);
    check_version(api, version, versions(api_key)?)?;
    let flexible = api::is_flexible(api_key, version);
    let mut r = Reader::new(body);
    let mut groups = Vec::new();
    match api_key {
        ADD_PARTITIONS_TO_TXN if version <= 3 => {
            let field = "AddPartitionsToTxnRequest";
            let transactional_id = r.read_string_v(flexible, field)?;
            let producer_id = r.read_i64(field)?;
            r.read_i16(field)?;
            let (topics_count, topics) = read_index_topics(&mut r, flexible, field)?;
            groups.push(WriteGroup {
                transactional_id: Some(transactional_id),
                producer_id,
                topics,
                topics_count,
            });
        }
        ADD_PARTITIONS_TO_TXN => {
            let field = "AddPartitionsToTxnRequest.transactions";
            // Smallest: id (1) + pid (8) + epoch (2) + verify (1) + topics (1).
            let n = r.read_array_len_v(flexible, 13, field)?;
            for _ in 0..n {
                let transactional_id = r.read_string_v(flexible, field)?;
                let producer_id = r.read_i64(field)?;
                r.read_i16(field)?;
                r.read_bool(field)?;
                let (topics_count, topics) = read_index_topics(&mut r, flexible, field)?;
                r.skip_tagged_fields_v(flexible, field)?;
                groups.push(WriteGroup {
                    transactional_id: Some(transactional_id),
                    producer_id,
                    topics,
                    topics_count,
                });
            }
        }
        WRITE_TXN_MARKERS => {
            let field = "WriteTxnMarkersRequest.markers";
            // Smallest: pid (8) + epoch (2) + result (1) + topics (1) + epoch (4).
            let n = r.read_array_len_v(flexible, 16, field)?;
            for _ in 0..n {
                let producer_id = r.read_i64(field)?;
                r.read_i16(field)?;
                r.read_bool(field)?;
                let (topics_count, topics) = read_index_topics(&mut r, flexible, field)?;
                r.read_i32(field)?;
                if version >= 2 {
                    r.read_i8(field)?;
                }
                r.skip_tagged_fields_v(flexible, field)?;
                groups.push(WriteGroup {
                    transactional_id: None,
                    producer_id,
                    topics,
                    topics_count,
                });
            }
        }
        DELETE_RECORDS => {
            let field = "DeleteRecordsRequest.topics";
            let start = r.position();
            let n = r.read_array_len_v(flexible, 2, field)?;
            let topics_count = start..r.position();
            let mut topics = Vec::new();
            for _ in 0..n {
                let tstart = r.position();
                let name = r.read_string_v(flexible, field)?;
                let cstart = r.position();
                // Smallest partition: index (4) + offset (8).
                let np = r.read_array_len_v(flexible, 12, field)?;
                let partitions_count = cstart..r.position();
                let mut parts = Vec::new();
                for _ in 0..np {
                    let pstart = r.position();
                    let index = r.read_i32(field)?;
                    r.read_i64(field)?;
                    r.skip_tagged_fields_v(flexible, field)?;
                    parts.push((index, pstart..r.position()));
                }
                r.skip_tagged_fields_v(flexible, field)?;
                topics.push(WriteTopic {
                    name: Some(name),
                    id: None,
                    span: tstart..r.position(),
                    partitions: Some(parts),
                    partitions_count,
                });
            }
            r.read_i32("DeleteRecordsRequest.timeout_ms")?;
            groups.push(WriteGroup {
                transactional_id: None,
                producer_id: -1,
                topics,
                topics_count,
            });
        }
        CREATE_PARTITIONS => {
            let field = "CreatePartitionsRequest.topics";
            let start = r.position();
            // Smallest topic: name (1) + count (4) + assignments (1).
            let n = r.read_array_len_v(flexible, 6, field)?;
            let topics_count = start..r.position();
            let mut topics = Vec::new();
            for _ in 0..n {
                let tstart = r.position();
                let name = r.read_string_v(flexible, field)?;
                r.read_i32(field)?;
                if let Some(na) = r.read_nullable_array_len_v(flexible, 1, field)? {
                    for _ in 0..na {
                        read_i32_array(&mut r, flexible, field)?;
                        r.skip_tagged_fields_v(flexible, field)?;
                    }
                }
                r.skip_tagged_fields_v(flexible, field)?;
                let end = r.position();
                topics.push(WriteTopic {
                    name: Some(name),
                    id: None,
                    span: tstart..end,
                    partitions: None,
                    partitions_count: end..end,
                });
            }
            r.read_i32("CreatePartitionsRequest.timeout_ms")?;
            r.read_bool("CreatePartitionsRequest.validate_only")?;
            groups.push(WriteGroup {
                transactional_id: None,
                producer_id: -1,
                topics,
                topics_count,
            });
        }
        DELETE_TOPICS => {
            let field = "DeleteTopicsRequest.topics";
            let start = r.position();
            let n = r.read_array_len_v(flexible, if version >= 6 { 17 } else { 1 }, field)?;
            let topics_count = start..r.position();
            let mut topics = Vec::new();
            for _ in 0..n {
                let tstart = r.position();
                let (name, id) = if version >= 6 {
                    let name = r.read_nullable_string_v(flexible, field)?;
                    let id = r.read_uuid(field)?;
                    r.skip_tagged_fields_v(flexible, field)?;
                    (name, (id != [0; 16]).then_some(id))
                } else {
                    (Some(r.read_string_v(flexible, field)?), None)
                };
                let end = r.position();
                topics.push(WriteTopic {
                    name,
                    id,
                    span: tstart..end,
                    partitions: None,
                    partitions_count: end..end,
                });
            }
            r.read_i32("DeleteTopicsRequest.timeout_ms")?;
            groups.push(WriteGroup {
                transactional_id: None,
                producer_id: -1,
                topics,
                topics_count,
            });
        }
        _ => unreachable!("versions() refused other keys"),
    }
    r.skip_tagged_fields_v(flexible, "_tagged_fields")?;
    Ok(WriteRequest {
        api_key,
        version,
        groups,
        end: r.position(),
    })
}

/// Copies a splittable request body keeping only what `keep` says: per
/// topic of its (only) group, one bool per partition entry (DeleteRecords)
/// or one bool for the whole entry (CreatePartitions, DeleteTopics).
/// Topics left without partitions are removed and counts fixed up; every
/// other byte is copied verbatim. `Ok(None)`: everything is kept (forward
/// the original frame).
pub fn split_write_request(
    req: &WriteRequest<'_>,
    body: &[u8],
    keep: &[Vec<bool>],
) -> WireResult<Option<Vec<u8>>> {
    let unsplittable = WireError::Unencodable {
        field: "split",
        reason: "this request cannot be split",
    };
    if !req.splittable() || req.groups.len() != 1 {
        return Err(unsplittable);
    }
    let g = &req.groups[0];
    if keep.len() != g.topics.len() {
        return Err(unsplittable);
    }
    if keep.iter().all(|k| k.iter().all(|b| *b)) {
        return Ok(None);
    }
    let flexible = api::is_flexible(req.api_key, req.version);
    let kept_topics = keep.iter().filter(|k| k.iter().any(|b| *b)).count();
    let mut sp = Splicer::new(body);
    let mut w = Writer::new(Vec::with_capacity(5));
    w.put_array_len_v(flexible, Some(kept_topics), "split.topics")?;
    sp.replace(g.topics_count.start, g.topics_count.end, &w.into_inner())?;
    for (t, k) in g.topics.iter().zip(keep) {
        let kept = k.iter().filter(|b| **b).count();
        if kept == 0 {
            sp.replace(t.span.start, t.span.end, &[])?;
            continue;
        }
        let Some(parts) = &t.partitions else {
            continue;
        };
        if kept == parts.len() || k.len() != parts.len() {
            continue;
        }
        let mut w = Writer::new(Vec::with_capacity(5));
        w.put_array_len_v(flexible, Some(kept), "split.partitions")?;
        sp.replace(
            t.partitions_count.start,
            t.partitions_count.end,
            &w.into_inner(),
        )?;
        for ((_, span), k) in parts.iter().zip(k) {
            if !k {
                sp.replace(span.start, span.end, &[])?;
            }
        }
    }
    Ok(sp.finish().or_else(|| Some(body.to_vec())))
}

/// The guard's answer for one topic: a topic-level error (CreatePartitions,
/// DeleteTopics) or one error per partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicAnswer {
    /// The topic's name as the request gave it (`None`: named by id only).
    pub name: Option<String>,
    /// The topic id (DeleteTopics v6+).
    pub id: Option<[u8; 16]>,
    /// Topic-level error code.
    pub error_code: i16,
    /// Topic-level error message (where the response has one).
    pub message: Option<String>,
    /// Per-partition error codes.
    pub partitions: Vec<(i32, i16)>,
}

/// The guard's answer for one group (see [`WriteGroup`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupAnswer {
    /// Transactional id (AddPartitionsToTxn v4+).
    pub transactional_id: Option<String>,
    /// Producer id (WriteTxnMarkers).
    pub producer_id: i64,
    /// Topics.
    pub topics: Vec<TopicAnswer>,
}

/// Appends the partition-level topic entries of AddPartitionsToTxn and
/// WriteTxnMarkers results: `name, [index, error, tags], tags`.
fn put_index_results(
    w: &mut Writer<&mut Vec<u8>>,
    flexible: bool,
    topics: &[TopicAnswer],
) -> WireResult<()> {
    w.put_array_len_v(flexible, Some(topics.len()), "results.topics")?;
    for t in topics {
        w.put_string_v(flexible, t.name.as_deref().unwrap_or(""), "results.name")?;
        w.put_array_len_v(flexible, Some(t.partitions.len()), "results.partitions")?;
        for (p, code) in &t.partitions {
            w.put_i32(*p);
            w.put_i16(*code);
            if flexible {
                w.put_uvarint(0);
            }
        }
        if flexible {
            w.put_uvarint(0);
        }
    }
    Ok(())
}

/// The entries of a splittable API's response array for `topics` (no count
/// prefix): DeleteRecords topics, CreatePartitions results, DeleteTopics
/// responses. Returns the bytes and the number of entries.
pub fn encode_result_entries(
    api_key: i16,
    version: i16,
    topics: &[TopicAnswer],
) -> WireResult<(Vec<u8>, usize)> {
    check_version(name_of(api_key), version, versions(api_key)?)?;
    let flexible = api::is_flexible(api_key, version);
    let mut out = Vec::new();
    let mut w = Writer::new(&mut out);
    for t in topics {
        match api_key {
            DELETE_RECORDS => {
                let f = "DeleteRecordsResponse.topics";
                w.put_string_v(flexible, t.name.as_deref().unwrap_or(""), f)?;
                w.put_array_len_v(flexible, Some(t.partitions.len()), f)?;
                for (p, code) in &t.partitions {
                    w.put_i32(*p);
                    w.put_i64(-1);
                    w.put_i16(*code);
                    if flexible {
                        w.put_uvarint(0);
                    }
                }
            }
            CREATE_PARTITIONS => {
                let f = "CreatePartitionsResponse.results";
                w.put_string_v(flexible, t.name.as_deref().unwrap_or(""), f)?;
                w.put_i16(t.error_code);
                w.put_nullable_string_v(flexible, t.message.as_deref(), f)?;
            }
            DELETE_TOPICS => {
                let f = "DeleteTopicsResponse.responses";
                if version >= 6 {
                    w.put_nullable_string_v(flexible, t.name.as_deref(), f)?;
                    w.put_uuid(&t.id.unwrap_or([0; 16]));
                } else {
                    w.put_string_v(flexible, t.name.as_deref().unwrap_or(""), f)?;
                }
                w.put_i16(t.error_code);
                if version >= 5 {
                    w.put_nullable_string_v(flexible, t.message.as_deref(), f)?;
                }
            }
            _ => {
                return Err(WireError::Unencodable {
                    field: "results",
                    reason: "not a splittable write",
                })
            }
        }
        if flexible {
            w.put_uvarint(0);
        }
    }
    Ok((out, topics.len()))
}

/// The only group of an API without an outer array.
fn one(groups: &[GroupAnswer]) -> WireResult<&GroupAnswer> {
    match groups {
        [g] => Ok(g),
        _ => Err(WireError::Unencodable {
            field: "groups",
            reason: "this API answers exactly one group",
        }),
    }
}

/// A whole response body of `api_key` at `version` answered by the guard:
/// throttle time 0, `groups` (exactly one unless the API batches), empty
/// tagged fields.
pub fn build_write_response(
    api_key: i16,
    version: i16,
    groups: &[GroupAnswer],
) -> WireResult<Vec<u8>> {
    check_version(name_of(api_key), version, versions(api_key)?)?;
    let flexible = api::is_flexible(api_key, version);
    let mut out = Vec::new();
    let mut w = Writer::new(&mut out);
    match api_key {
        ADD_PARTITIONS_TO_TXN => {
            w.put_i32(0);
            if version >= 4 {
                w.put_i16(0);
                w.put_array_len_v(flexible, Some(groups.len()), "results_by_transaction")?;
                for g in groups {
                    w.put_string_v(
                        flexible,
                        g.transactional_id.as_deref().unwrap_or(""),
                        "results_by_transaction.transactional_id",
                    )?;
                    put_index_results(&mut w, flexible, &g.topics)?;
                    if flexible {
                        w.put_uvarint(0);
                    }
                }
            } else {
                put_index_results(&mut w, flexible, &one(groups)?.topics)?;
            }
        }
        WRITE_TXN_MARKERS => {
            w.put_array_len_v(flexible, Some(groups.len()), "markers")?;
            for g in groups {
                w.put_i64(g.producer_id);
                put_index_results(&mut w, flexible, &g.topics)?;
                if flexible {
                    w.put_uvarint(0);
                }
            }
        }
        DELETE_RECORDS | CREATE_PARTITIONS | DELETE_TOPICS => {
            if api_key != DELETE_TOPICS || version >= 1 {
                w.put_i32(0);
            }
            let g = one(groups)?;
            w.put_array_len_v(flexible, Some(g.topics.len()), "results")?;
            let (entries, _) = encode_result_entries(api_key, version, &g.topics)?;
            w.put_raw(&entries);
        }
        _ => unreachable!("versions() refused other keys"),
    }
    if flexible {
        w.put_uvarint(0);
    }
    Ok(out)
}

/// Adds `count` result entries (from [`encode_result_entries`]) at the end
/// of the results array of an upstream response body of a splittable API
/// (DeleteRecords, CreatePartitions, DeleteTopics). The count is fixed up;
/// every upstream byte is copied verbatim. The whole response is walked
/// first: a malformed upstream response is an error, not a merge.
pub fn merge_write_response(
    api_key: i16,
    version: i16,
    upstream: &[u8],
    entries: &[u8],
    count: usize,
) -> WireResult<Vec<u8>> {
    check_version(name_of(api_key), version, versions(api_key)?)?;
    let flexible = api::is_flexible(api_key, version);
    let field = "upstream response";
    let mut r = Reader::new(upstream);
    if api_key != DELETE_TOPICS || version >= 1 {
        r.read_i32(field)?;
    }
    let count_at = r.position();
    let n = r.read_array_len_v(flexible, 2, field)?;
    let count_end = r.position();
    for _ in 0..n {
        match api_key {
            DELETE_RECORDS => {
                r.read_string_v(flexible, field)?;
                let np = r.read_array_len_v(flexible, 14, field)?;
                for _ in 0..np {
                    r.read_i32(field)?;
                    r.read_i64(field)?;
                    r.read_i16(field)?;
                    r.skip_tagged_fields_v(flexible, field)?;
                }
            }
            CREATE_PARTITIONS => {
                r.read_string_v(flexible, field)?;
                r.read_i16(field)?;
                r.read_nullable_string_v(flexible, field)?;
            }
            DELETE_TOPICS => {
                if version >= 6 {
                    r.read_nullable_string_v(flexible, field)?;
                    r.read_uuid(field)?;
                } else {
                    r.read_string_v(flexible, field)?;
                }
                r.read_i16(field)?;
                if version >= 5 {
                    r.read_nullable_string_v(flexible, field)?;
                }
            }
            _ => {
                return Err(WireError::Unencodable {
                    field: "merge",
                    reason: "not a splittable write",
                })
            }
        }
        r.skip_tagged_fields_v(flexible, field)?;
    }
    let array_end = r.position();
    r.skip_tagged_fields_v(flexible, field)?;
    let mut sp = Splicer::new(upstream);
    let mut w = Writer::new(Vec::with_capacity(5));
    w.put_array_len_v(flexible, Some(n.saturating_add(count)), field)?;
    sp.replace(count_at, count_end, &w.into_inner())?;
    sp.replace(array_end, array_end, entries)?;
    Ok(sp.finish().unwrap_or_else(|| upstream.to_vec()))
}
