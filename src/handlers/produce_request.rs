//! ProduceRequest (API key 0) v3-v13 parser and partition splitter.
//!
//! The produce guard (SPEC section 3) must know which partitions a Produce
//! request writes to, refuse those still mirrored, and forward the rest. The
//! request comes from a client, so it is hostile input: every length is
//! checked by [`Reader`], records are never parsed (only their byte range is
//! noted), and no capacity is reserved from a wire count.
//!
//! Layout (flexible from v9): `transactional_id: nullable string`, `acks:
//! i16`, `timeout_ms: i32`, `topic_data: [name: string (v3-12) | topic_id:
//! uuid (v13+), partition_data: [index: i32, records: nullable bytes, tags
//! (v9+)], tags (v9+)]`, tags (v9+).

use std::ops::Range;

use super::check_version;
use super::fetch::FetchTopic;
use crate::codec::api;
use crate::wire::{Reader, Splicer, WireResult, Writer};

/// A topic as a Produce message names it: by name (v3-v12) or by topic id
/// (v13+). The same enum as [`FetchTopic`].
pub type ProduceTopic<'a> = FetchTopic<'a>;

/// One partition of a ProduceRequest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProduceRequestPartition {
    /// Partition index.
    pub index: i32,
    /// Byte range of the records within the body (`None` when null).
    pub records: Option<Range<usize>>,
    /// Byte range of the whole partition entry within the body.
    pub span: Range<usize>,
}

/// One topic of a ProduceRequest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProduceRequestTopic<'a> {
    /// Topic name (v3-v12) or id (v13+).
    pub topic: ProduceTopic<'a>,
    /// Partitions written, in wire order.
    pub partitions: Vec<ProduceRequestPartition>,
    /// Byte range of the whole topic entry within the body.
    pub span: Range<usize>,
}

/// What [`parse_produce_request`] learned about a ProduceRequest body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProduceRequestInfo<'a> {
    /// Transactional id (`None` for a non-transactional producer).
    pub transactional_id: Option<&'a str>,
    /// 0 (no response is sent at all), 1 or -1.
    pub acks: i16,
    /// Request timeout.
    pub timeout_ms: i32,
    /// Topics written, in wire order.
    pub topics: Vec<ProduceRequestTopic<'a>>,
    /// Offset of the `topic_data` array length prefix within the body.
    pub topics_start: usize,
    /// Offset just after the `topic_data` array (where the top-level tagged
    /// fields start in v9+).
    pub topics_end: usize,
    /// Offset just after the last field parsed.
    pub end: usize,
}

impl ProduceRequestInfo<'_> {
    /// Total number of partitions written.
    pub fn partition_count(&self) -> usize {
        self.topics.iter().map(|t| t.partitions.len()).sum()
    }
}

/// Parses a ProduceRequest body (the bytes after the request header) at
/// `version` (3..=13), checking every length.
///
/// Zero-copy: the transactional id and topic names are borrowed from `body`;
/// records are returned as byte ranges. Trailing bytes after the last field
/// are not an error (`end` says where parsing stopped).
pub fn parse_produce_request(version: i16, body: &[u8]) -> WireResult<ProduceRequestInfo<'_>> {
    check_version("ProduceRequest", version, 3..=13)?;
    let flexible = api::is_flexible(api::PRODUCE, version);
    let mut r = Reader::new(body);
    let transactional_id = r.read_nullable_string_v(flexible, "ProduceRequest.transactional_id")?;
    let acks = r.read_i16("ProduceRequest.acks")?;
    let timeout_ms = r.read_i32("ProduceRequest.timeout_ms")?;
    let topics_start = r.position();
    // Smallest topic: name or uuid (>= 1) + partition count (>= 1).
    let n_topics = r.read_array_len_v(flexible, 2, "ProduceRequest.topic_data")?;
    // No capacity from the wire counts: the vectors grow by parsed entries.
    let mut topics = Vec::new();
    for _ in 0..n_topics {
        let tstart = r.position();
        let topic = if version >= 13 {
            FetchTopic::Id(r.read_uuid("ProduceRequest.topic_data.topic_id")?)
        } else {
            FetchTopic::Name(r.read_string_v(flexible, "ProduceRequest.topic_data.name")?)
        };
        // Smallest partition: index(4) + records length (1 compact, 4 classic).
        let n_parts = r.read_array_len_v(
            flexible,
            if flexible { 6 } else { 8 },
            "ProduceRequest.topic_data.partition_data",
        )?;
        let mut partitions = Vec::new();
        for _ in 0..n_parts {
            let start = r.position();
            let index = r.read_i32("ProduceRequest.partition_data.index")?;
            let records = r
                .read_nullable_bytes_v(flexible, "ProduceRequest.partition_data.records")?
                .map(|b| {
                    let end = r.position();
                    end - b.len()..end
                });
            r.skip_tagged_fields_v(flexible, "ProduceRequest.partition_data._tagged_fields")?;
            partitions.push(ProduceRequestPartition {
                index,
                records,
                span: start..r.position(),
            });
        }
        r.skip_tagged_fields_v(flexible, "ProduceRequest.topic_data._tagged_fields")?;
        topics.push(ProduceRequestTopic {
            topic,
            partitions,
            span: tstart..r.position(),
        });
    }
    let topics_end = r.position();
    r.skip_tagged_fields_v(flexible, "ProduceRequest._tagged_fields")?;
    Ok(ProduceRequestInfo {
        transactional_id,
        acks,
        timeout_ms,
        topics,
        topics_start,
        topics_end,
        end: r.position(),
    })
}

/// Copies a ProduceRequest body keeping only the partitions for which
/// `keep(topic, partition)` is true.
///
/// Returns `Ok(None)` when every partition is kept (forward the original
/// frame untouched). Otherwise the copy has the dropped partitions removed,
/// topics left without partitions removed, and the array counts fixed up;
/// every other byte (transactional id, acks, timeout, the kept entries with
/// their records and tagged fields, the top-level tagged fields) is copied
/// verbatim. When nothing is kept the copy has an empty `topic_data`: the
/// caller should then answer locally instead of forwarding (check
/// [`ProduceRequestInfo::partition_count`] or count the kept partitions).
pub fn split_produce_request(
    version: i16,
    body: &[u8],
    keep: &mut dyn FnMut(&ProduceTopic<'_>, i32) -> bool,
) -> WireResult<Option<Vec<u8>>> {
    let info = parse_produce_request(version, body)?;
    let flexible = api::is_flexible(api::PRODUCE, version);
    // Decide first: the topics count prefix precedes everything it counts.
    // One bool per parsed partition: bounded by the bytes actually present.
    let mut decisions = Vec::new();
    let mut all_kept = true;
    let mut kept_topics = 0usize;
    for t in &info.topics {
        let mut kept_here = 0usize;
        for p in &t.partitions {
            let k = keep(&t.topic, p.index);
            all_kept &= k;
            kept_here += usize::from(k);
            decisions.push(k);
        }
        if kept_here > 0 {
            kept_topics += 1;
        }
    }
    if all_kept {
        return Ok(None);
    }

    let mut sp = Splicer::new(body);
    let mut count = Writer::new(Vec::with_capacity(5));
    count.put_array_len_v(flexible, Some(kept_topics), "ProduceRequest.topic_data")?;
    let mut r = Reader::at(body, info.topics_start);
    r.read_array_len_v(flexible, 2, "ProduceRequest.topic_data")?;
    sp.replace(info.topics_start, r.position(), &count.into_inner())?;

    let mut d = decisions.iter();
    for t in &info.topics {
        let mine: Vec<bool> = d.by_ref().take(t.partitions.len()).copied().collect();
        let kept_here = mine.iter().filter(|k| **k).count();
        if kept_here == 0 {
            sp.replace(t.span.start, t.span.end, &[])?;
            continue;
        }
        if kept_here == t.partitions.len() {
            continue;
        }
        // Re-encode this topic's partition count, then drop the refused
        // entries; the name and every kept entry stay verbatim.
        let Some(first) = t.partitions.first() else {
            continue;
        };
        // The count prefix ends where the first partition starts; find its
        // start by re-reading the topic name from the topic entry start.
        let mut h = Reader::at(body, t.span.start);
        if version >= 13 {
            h.read_uuid("ProduceRequest.topic_data.topic_id")?;
        } else {
            h.read_string_v(flexible, "ProduceRequest.topic_data.name")?;
        }
        let count_start = h.position();
        let mut w = Writer::new(Vec::with_capacity(5));
        w.put_array_len_v(
            flexible,
            Some(kept_here),
            "ProduceRequest.topic_data.partition_data",
        )?;
        sp.replace(count_start, first.span.start, &w.into_inner())?;
        for (p, k) in t.partitions.iter().zip(mine) {
            if !k {
                sp.replace(p.span.start, p.span.end, &[])?;
            }
        }
    }
    // A Splicer with at least one replacement always yields Some.
    Ok(sp.finish().or_else(|| Some(body.to_vec())))
}
