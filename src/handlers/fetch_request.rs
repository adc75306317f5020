//! FetchRequest (API key 1) v4-v18 parser: what a fetcher asks for.
//!
//! The partition life cycle (SPEC section 3) needs the destination fetcher's
//! next fetch offset of each partition (the cut of a seal, and the proof that
//! every sealing batch was appended), and whether the fetch comes from a
//! replica (replication path) or a consumer. Requests come from clients, so
//! this is hostile input: every length is checked by [`Reader`] and the
//! partition lists grow only by partitions actually parsed (no capacity is
//! ever reserved from a wire count).
//!
//! Layout (flexible from v12): `replica_id: i32 (v4-14)`, `max_wait_ms: i32`,
//! `min_bytes: i32`, `max_bytes: i32`, `isolation_level: i8`, `session_id:
//! i32 (v7+)`, `session_epoch: i32 (v7+)`, `topics: [topic: string (v4-12) |
//! topic_id: uuid (v13+), partitions: [partition: i32,
//! current_leader_epoch: i32 (v9+), fetch_offset: i64, last_fetched_epoch:
//! i32 (v12+), log_start_offset: i64 (v5+), partition_max_bytes: i32, tags
//! (v12+: ReplicaDirectoryId 0 from v17, HighWatermark 1 from v18)], tags]`,
//! `forgotten_topics_data: [topic | topic_id, partitions: [i32], tags] (v7+)`,
//! `rack_id: string (v11+)`, tags (v12+: ClusterId 0, ReplicaState 1 from
//! v15 = `{replica_id: i32, replica_epoch: i64, tags}`).

use std::ops::Range;

use super::check_version;
use super::fetch::FetchTopic;
use crate::codec::api;
use crate::wire::{Reader, Splicer, WireResult, Writer};

/// One partition a FetchRequest asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchRequestPartition {
    /// Partition index.
    pub partition: i32,
    /// Current leader epoch known to the fetcher (-1 before v9).
    pub current_leader_epoch: i32,
    /// The offset the fetcher wants next: for a replica, its log end offset.
    pub fetch_offset: i64,
    /// Epoch of the last fetched batch (v12+, else -1).
    pub last_fetched_epoch: i32,
    /// The fetcher's log start offset (v5+, else -1).
    pub log_start_offset: i64,
    /// Maximum bytes to return for this partition.
    pub partition_max_bytes: i32,
    /// Byte range of the whole partition entry within the request body
    /// (tagged fields included), for callers that splice requests.
    pub span: Range<usize>,
}

/// One topic of a FetchRequest with the partitions asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchRequestTopic<'a> {
    /// Topic name (v4-v12) or topic id (v13+).
    pub topic: FetchTopic<'a>,
    /// Partitions asked for, in wire order.
    pub partitions: Vec<FetchRequestPartition>,
    /// Byte range of the whole topic entry within the body.
    pub span: Range<usize>,
    /// Byte range of the partitions count prefix within the body.
    pub partitions_count: Range<usize>,
}

/// What [`parse_fetch_request`] learned about a FetchRequest body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchRequestInfo<'a> {
    /// Replica id of the fetcher: from the body for v4-v14, from the
    /// `ReplicaState` tagged field for v15+ (-1, a consumer, when absent).
    /// Non-negative means a follower (replication path).
    pub replica_id: i32,
    /// Broker epoch of the fetching replica (`ReplicaState`, v15+; -1
    /// otherwise).
    pub replica_epoch: i64,
    /// Maximum time the broker may wait for `min_bytes`.
    pub max_wait_ms: i32,
    /// Minimum bytes to accumulate before answering.
    pub min_bytes: i32,
    /// Maximum bytes for the whole response.
    pub max_bytes: i32,
    /// 0 = READ_UNCOMMITTED, 1 = READ_COMMITTED.
    pub isolation_level: i8,
    /// Fetch session id (v7+, else 0).
    pub session_id: i32,
    /// Fetch session epoch (v7+, else -1: no session).
    pub session_epoch: i32,
    /// Topics and partitions asked for, in wire order. With an incremental
    /// fetch session, partitions whose fetch state did not change are absent.
    pub topics: Vec<FetchRequestTopic<'a>>,
    /// Byte range of the `topics` count prefix within the body.
    pub topics_count: Range<usize>,
    /// Number of entries of `forgotten_topics_data` (v7+, else 0).
    pub forgotten_topics: usize,
    /// Byte range of the `forgotten_topics_data` count prefix (v7+; empty
    /// before), and the entries follow it up to `forgotten_topics_end`.
    pub forgotten_topics_count: Range<usize>,
    /// End of the `forgotten_topics_data` entries.
    pub forgotten_topics_end: usize,
    /// Rack of the fetcher (v11+, else empty).
    pub rack_id: &'a str,
    /// `ClusterId` tagged field (v12+), when present.
    pub cluster_id: Option<&'a str>,
    /// Offset just after the last field parsed (the end of the body for a
    /// well-formed request).
    pub end: usize,
}

impl FetchRequestInfo<'_> {
    /// True when the fetch comes from a follower replica (replica id >= 0),
    /// i.e. its data travels the replication path.
    pub fn is_follower(&self) -> bool {
        self.replica_id >= 0
    }

    /// Total number of partitions asked for.
    pub fn partition_count(&self) -> usize {
        self.topics.iter().map(|t| t.partitions.len()).sum()
    }
}

/// Tag of the top-level `ClusterId` field (v12+).
const CLUSTER_ID_TAG: u32 = 0;
/// Tag of the top-level `ReplicaState` field (v15+).
const REPLICA_STATE_TAG: u32 = 1;

/// Parses a FetchRequest body (the bytes after the request header) at
/// `version` (4..=18), checking every length.
///
/// Zero-copy: topic names, rack and cluster id are borrowed from `body`.
/// Trailing bytes after the last field are not an error (`end` says where
/// parsing stopped), as in Kafka's own request parsing.
pub fn parse_fetch_request(version: i16, body: &[u8]) -> WireResult<FetchRequestInfo<'_>> {
    check_version("FetchRequest", version, 4..=18)?;
    let flexible = api::is_flexible(api::FETCH, version);
    let mut r = Reader::new(body);
    let mut replica_id = if version <= 14 {
        r.read_i32("FetchRequest.replica_id")?
    } else {
        -1
    };
    let max_wait_ms = r.read_i32("FetchRequest.max_wait_ms")?;
    let min_bytes = r.read_i32("FetchRequest.min_bytes")?;
    let max_bytes = r.read_i32("FetchRequest.max_bytes")?;
    let isolation_level = r.read_i8("FetchRequest.isolation_level")?;
    let (session_id, session_epoch) = if version >= 7 {
        (
            r.read_i32("FetchRequest.session_id")?,
            r.read_i32("FetchRequest.session_epoch")?,
        )
    } else {
        (0, -1)
    };

    let topics_count_start = r.position();
    // Smallest topic: name or uuid (>= 1) + partitions count (>= 1) (+ tags).
    let n_topics = r.read_array_len_v(flexible, 2, "FetchRequest.topics")?;
    // Smallest partition: partition(4) fetch_offset(8) partition_max_bytes(4).
    let min_partition = 16
        + if version >= 9 { 4 } else { 0 }
        + if version >= 12 { 4 + 1 } else { 0 }
        + if version >= 5 { 8 } else { 0 };
    // No capacity from the wire counts: the vectors grow by parsed entries.
    let topics_count = topics_count_start..r.position();
    let mut topics = Vec::new();
    for _ in 0..n_topics {
        let tstart = r.position();
        let topic = read_topic(&mut r, version, flexible, "FetchRequest.topics.topic")?;
        let pstart = r.position();
        let n_parts =
            r.read_array_len_v(flexible, min_partition, "FetchRequest.topics.partitions")?;
        let partitions_count = pstart..r.position();
        let mut partitions = Vec::new();
        for _ in 0..n_parts {
            let start = r.position();
            let partition = r.read_i32("FetchRequest.partitions.partition")?;
            let current_leader_epoch = if version >= 9 {
                r.read_i32("FetchRequest.partitions.current_leader_epoch")?
            } else {
                -1
            };
            let fetch_offset = r.read_i64("FetchRequest.partitions.fetch_offset")?;
            let last_fetched_epoch = if version >= 12 {
                r.read_i32("FetchRequest.partitions.last_fetched_epoch")?
            } else {
                -1
            };
            let log_start_offset = if version >= 5 {
                r.read_i64("FetchRequest.partitions.log_start_offset")?
            } else {
                -1
            };
            let partition_max_bytes = r.read_i32("FetchRequest.partitions.partition_max_bytes")?;
            r.skip_tagged_fields_v(flexible, "FetchRequest.partitions._tagged_fields")?;
            partitions.push(FetchRequestPartition {
                partition,
                current_leader_epoch,
                fetch_offset,
                last_fetched_epoch,
                log_start_offset,
                partition_max_bytes,
                span: start..r.position(),
            });
        }
        r.skip_tagged_fields_v(flexible, "FetchRequest.topics._tagged_fields")?;
        topics.push(FetchRequestTopic {
            topic,
            partitions,
            span: tstart..r.position(),
            partitions_count,
        });
    }

    let forgotten_start = r.position();
    let mut forgotten_count_end = forgotten_start;
    let forgotten_topics = if version >= 7 {
        let n = r.read_array_len_v(flexible, 2, "FetchRequest.forgotten_topics_data")?;
        forgotten_count_end = r.position();
        for _ in 0..n {
            read_topic(
                &mut r,
                version,
                flexible,
                "FetchRequest.forgotten_topics_data.topic",
            )?;
            let parts =
                r.read_array_len_v(flexible, 4, "FetchRequest.forgotten_topics_data.partitions")?;
            r.skip(
                parts.saturating_mul(4),
                "FetchRequest.forgotten_topics_data.partitions",
            )?;
            r.skip_tagged_fields_v(
                flexible,
                "FetchRequest.forgotten_topics_data._tagged_fields",
            )?;
        }
        n
    } else {
        0
    };
    let forgotten_topics_end = r.position();
    let rack_id = if version >= 11 {
        r.read_string_v(flexible, "FetchRequest.rack_id")?
    } else {
        ""
    };

    let mut replica_epoch = -1;
    let mut cluster_id = None;
    if flexible {
        let tags = r.read_tagged_fields("FetchRequest._tagged_fields")?;
        for f in tags.iter() {
            match f.tag {
                CLUSTER_ID_TAG => {
                    let mut t = Reader::new(f.data);
                    cluster_id = t.read_compact_nullable_string("FetchRequest.cluster_id")?;
                }
                REPLICA_STATE_TAG if version >= 15 => {
                    let mut t = Reader::new(f.data);
                    replica_id = t.read_i32("FetchRequest.replica_state.replica_id")?;
                    replica_epoch = t.read_i64("FetchRequest.replica_state.replica_epoch")?;
                    t.read_tagged_fields("FetchRequest.replica_state._tagged_fields")?;
                }
                _ => {}
            }
        }
    }
    Ok(FetchRequestInfo {
        replica_id,
        replica_epoch,
        max_wait_ms,
        min_bytes,
        max_bytes,
        isolation_level,
        session_id,
        session_epoch,
        topics,
        topics_count,
        forgotten_topics,
        forgotten_topics_count: forgotten_start..forgotten_count_end,
        forgotten_topics_end,
        rack_id,
        cluster_id,
        end: r.position(),
    })
}

/// Reads a topic name (v4-v12) or topic id (v13+).
fn read_topic<'a>(
    r: &mut Reader<'a>,
    version: i16,
    flexible: bool,
    field: &'static str,
) -> WireResult<FetchTopic<'a>> {
    if version >= 13 {
        Ok(FetchTopic::Id(r.read_uuid(field)?))
    } else {
        Ok(FetchTopic::Name(r.read_string_v(flexible, field)?))
    }
}

/// Copies a FetchRequest body at `version` (4..=18) keeping only the
/// partitions for which `keep(topic, partition)` is true: the request to
/// forward upstream when the proxy answers some partitions itself (STOPPED
/// partitions are never fetched from the source again).
///
/// Returns `Ok(None)` when every partition is kept (forward the original).
/// Otherwise dropped partitions are removed, topics left without partitions
/// removed, counts fixed up, and every other byte (session, forgotten
/// topics, rack, kept entries with their tagged fields, top-level tagged
/// fields) copied verbatim. When nothing is kept the copy asks for no
/// partition at all.
///
/// Fetch sessions: in an incremental request (session epoch > 0) a partition
/// absent from the request stays in the upstream session, so the upstream
/// may still return it; the caller must then replace or drop it in the
/// response (see `splice_fetch_response`). This function does not add the
/// dropped partitions to `forgotten_topics_data`.
pub fn split_fetch_request(
    version: i16,
    body: &[u8],
    keep: &mut dyn FnMut(&FetchTopic<'_>, i32) -> bool,
) -> WireResult<Option<Vec<u8>>> {
    let out = rewrite_fetch_request(version, body, keep, &[], None)?;
    Ok((out.as_slice() != body).then_some(out))
}

/// Copies a FetchRequest body at `version` (4..=18) for the upstream:
/// keeps only the partitions for which `keep(topic, partition)` is true
/// (as [`split_fetch_request`]), appends `forget` to
/// `forgotten_topics_data` (v7+; ignored before), and sets `max_wait_ms`
/// when given. Every other byte is copied verbatim.
///
/// `forget` takes partitions out of the upstream's incremental fetch
/// session (KIP-227), so a partition the fetcher left out of the request
/// is not returned by the upstream either; forgetting a partition the
/// session does not hold is a no-op for a broker. Topics in `forget` must
/// be names before v13 and ids from v13.
pub fn rewrite_fetch_request(
    version: i16,
    body: &[u8],
    keep: &mut dyn FnMut(&FetchTopic<'_>, i32) -> bool,
    forget: &[(FetchTopic<'_>, Vec<i32>)],
    max_wait_ms: Option<i32>,
) -> WireResult<Vec<u8>> {
    let info = parse_fetch_request(version, body)?;
    let flexible = api::is_flexible(api::FETCH, version);
    let mut sp = Splicer::new(body);
    if let Some(ms) = max_wait_ms {
        let at = if version <= 14 { 4 } else { 0 };
        sp.replace(at, at + 4, &ms.to_be_bytes())?;
    }
    // Decide first: the topics count prefix precedes everything it counts.
    // One bool per parsed partition: bounded by the bytes actually present.
    let mut decisions = Vec::new();
    let mut kept_topics = 0usize;
    for t in &info.topics {
        let mut any = false;
        for p in &t.partitions {
            let k = keep(&t.topic, p.partition);
            any |= k;
            decisions.push(k);
        }
        kept_topics += usize::from(any);
    }
    if !decisions.iter().all(|k| *k) {
        let mut w = Vec::with_capacity(5);
        Writer::new(&mut w).put_array_len_v(flexible, Some(kept_topics), "FetchRequest.topics")?;
        sp.replace(info.topics_count.start, info.topics_count.end, &w)?;
        let mut d = decisions.iter().copied();
        for t in &info.topics {
            let mine: Vec<bool> = d.by_ref().take(t.partitions.len()).collect();
            let kept = mine.iter().filter(|k| **k).count();
            if kept == 0 {
                sp.replace(t.span.start, t.span.end, &[])?;
                continue;
            }
            if kept == t.partitions.len() {
                continue;
            }
            let mut w = Vec::with_capacity(5);
            Writer::new(&mut w).put_array_len_v(
                flexible,
                Some(kept),
                "FetchRequest.topics.partitions",
            )?;
            sp.replace(t.partitions_count.start, t.partitions_count.end, &w)?;
            for (p, k) in t.partitions.iter().zip(mine) {
                if !k {
                    sp.replace(p.span.start, p.span.end, &[])?;
                }
            }
        }
    }
    let forget: Vec<&(FetchTopic<'_>, Vec<i32>)> =
        forget.iter().filter(|(_, ps)| !ps.is_empty()).collect();
    if version >= 7 && !forget.is_empty() {
        let mut w = Vec::with_capacity(8);
        Writer::new(&mut w).put_array_len_v(
            flexible,
            Some(info.forgotten_topics.saturating_add(forget.len())),
            "FetchRequest.forgotten_topics_data",
        )?;
        sp.replace(
            info.forgotten_topics_count.start,
            info.forgotten_topics_count.end,
            &w,
        )?;
        let mut out = Vec::new();
        let mut w = Writer::new(&mut out);
        for (topic, parts) in forget {
            match topic {
                FetchTopic::Id(id) if version >= 13 => w.put_uuid(id),
                FetchTopic::Name(n) if version < 13 => {
                    w.put_string_v(flexible, n, "FetchRequest.forgotten_topics_data.topic")?
                }
                _ => {
                    return Err(crate::wire::WireError::Unencodable {
                        field: "FetchRequest.forgotten_topics_data.topic",
                        reason: "topic names before v13, topic ids from v13",
                    })
                }
            }
            w.put_array_len_v(
                flexible,
                Some(parts.len()),
                "FetchRequest.forgotten_topics_data.partitions",
            )?;
            for p in parts {
                w.put_i32(*p);
            }
            if flexible {
                w.put_uvarint(0);
            }
        }
        sp.replace(info.forgotten_topics_end, info.forgotten_topics_end, &out)?;
    }
    Ok(sp.finish().unwrap_or_else(|| body.to_vec()))
}
