//! FetchResponse (API key 1) v4-v18 builder and splicer for locally answered
//! partitions.
//!
//! Sealing a partition (SPEC section 3) means answering some of a fetcher's
//! partitions from the proxy: ABORT markers and the MIRROR_PID_RESET barrier
//! at the cut, then empty answers once STOPPED, with watermarks the proxy
//! chooses. Three shapes are needed:
//!
//! - [`FetchPartitionResponse`]: one partition entry, encoded for a version;
//! - [`build_fetch_response`]: a whole body, when the proxy answers every
//!   partition of a request and nothing is forwarded;
//! - [`splice_fetch_response`]: the upstream's body with some partition
//!   entries replaced and entries added for partitions the upstream did not
//!   return (an incremental fetch session omits unchanged partitions, but the
//!   proxy still has seal batches to serve for them). Every other byte is
//!   copied verbatim, top-level tagged fields (NodeEndpoints) included.
//!
//! Layouts are those of [`super::fetch`]. Partition entries written here carry
//! an empty tagged-field section (v12+): a sealed partition must not inherit
//! the upstream's DivergingEpoch or CurrentLeader.

use std::borrow::Cow;
use std::ops::Range;

use super::check_version;
use super::fetch::{walk_fetch_response, FetchPartition, FetchTopic};
use super::topic_entries::{
    array_len, check_topic_kind, encode_entries, encode_fresh, plan_additions, put_topic_entry,
    Additions, PartitionEntry, TopicFields,
};
use crate::codec::api;
use crate::wire::{Reader, Splicer, WireError, WireResult, Writer};

/// A topic of a FetchResponse: name for v4-v12, topic id for v13+.
pub type FetchTopicRef<'a> = FetchTopic<'a>;

/// Versions of FetchResponse the builders here encode.
const VERSIONS: std::ops::RangeInclusive<i16> = 4..=18;

/// One aborted-transaction entry to encode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortedTransaction {
    /// Producer id of the aborted transaction.
    pub producer_id: i64,
    /// First offset of the aborted transaction.
    pub first_offset: i64,
}

/// One partition entry of a FetchResponse, built by the proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchPartitionResponse<'a> {
    /// Partition index.
    pub partition_index: i32,
    /// Partition error code (0 = none).
    pub error_code: i16,
    /// High watermark.
    pub high_watermark: i64,
    /// Last stable offset.
    pub last_stable_offset: i64,
    /// Log start offset (written from v5).
    pub log_start_offset: i64,
    /// Aborted transactions: `None` is encoded as a null array.
    pub aborted_transactions: Option<Vec<AbortedTransaction>>,
    /// Preferred read replica (written from v11; -1 = none).
    pub preferred_read_replica: i32,
    /// Record batches, copied verbatim (`None` = null). `Cow` so a caller
    /// can hand back a slice of the upstream body (e.g. the batches before a
    /// cut) or freshly built seal batches.
    pub records: Option<Cow<'a, [u8]>>,
}

impl<'a> FetchPartitionResponse<'a> {
    /// An entry for `partition_index` with no error, no records, null
    /// aborted transactions and every offset -1; set the fields that matter.
    pub fn new(partition_index: i32) -> Self {
        FetchPartitionResponse {
            partition_index,
            error_code: 0,
            high_watermark: -1,
            last_stable_offset: -1,
            log_start_offset: -1,
            aborted_transactions: None,
            preferred_read_replica: -1,
            records: None,
        }
    }

    /// The upstream entry `p` of `body` as a response to re-encode: every
    /// field as the upstream sent it, records borrowed from `body`. Its
    /// tagged fields are dropped (see the module documentation).
    pub fn from_upstream(p: &FetchPartition<'_>, body: &'a [u8]) -> Self {
        FetchPartitionResponse {
            partition_index: p.partition_index,
            error_code: p.error_code,
            high_watermark: p.high_watermark,
            last_stable_offset: p.last_stable_offset,
            log_start_offset: p.log_start_offset,
            aborted_transactions: p.aborted_transactions.as_ref().map(|a| {
                a.iter()
                    .map(|t| AbortedTransaction {
                        producer_id: t.producer_id,
                        first_offset: t.first_offset,
                    })
                    .collect()
            }),
            preferred_read_replica: p.preferred_read_replica,
            records: p
                .records
                .as_ref()
                .and_then(|r| body.get(r.clone()))
                .map(Cow::Borrowed),
        }
    }

    /// Appends this entry, encoded for FetchResponse `version`, to `w`.
    pub fn encode(&self, version: i16, w: &mut Writer<&mut Vec<u8>>) -> WireResult<()> {
        check_version("FetchResponse", version, VERSIONS)?;
        let flexible = api::is_flexible(api::FETCH, version);
        w.put_i32(self.partition_index);
        w.put_i16(self.error_code);
        w.put_i64(self.high_watermark);
        w.put_i64(self.last_stable_offset);
        if version >= 5 {
            w.put_i64(self.log_start_offset);
        }
        let aborted = self.aborted_transactions.as_deref();
        w.put_array_len_v(
            flexible,
            aborted.map(<[_]>::len),
            "FetchResponse.partitions.aborted_transactions",
        )?;
        for t in aborted.unwrap_or_default() {
            w.put_i64(t.producer_id);
            w.put_i64(t.first_offset);
            if flexible {
                w.put_uvarint(0);
            }
        }
        if version >= 11 {
            w.put_i32(self.preferred_read_replica);
        }
        let records = self.records.as_deref();
        if flexible {
            w.put_compact_nullable_bytes(records, "FetchResponse.partitions.records")?;
            w.put_uvarint(0);
        } else {
            w.put_nullable_bytes(records, "FetchResponse.partitions.records")?;
        }
        Ok(())
    }

    /// This entry encoded for FetchResponse `version`.
    pub fn to_bytes(&self, version: i16) -> WireResult<Vec<u8>> {
        let mut out = Vec::with_capacity(64 + self.records.as_ref().map_or(0, |r| r.len()));
        self.encode(version, &mut Writer::new(&mut out))?;
        Ok(out)
    }
}

impl PartitionEntry for FetchPartitionResponse<'_> {
    fn encode(&self, version: i16, w: &mut Writer<&mut Vec<u8>>) -> WireResult<()> {
        FetchPartitionResponse::encode(self, version, w)
    }
}

/// FetchResponse's topic entries.
const FIELDS: TopicFields = TopicFields {
    api_key: api::FETCH,
    topic: "FetchResponse.responses.topic",
    partitions: "FetchResponse.responses.partitions",
};

/// Builds a whole FetchResponse body at `version` (4..=18) answered by the
/// proxy: the given topics and partitions in order, empty tagged fields
/// (no NodeEndpoints). `error_code` and `session_id` are written from v7.
///
/// Topics must be names for v4-v12 and ids for v13+ (otherwise
/// `Unencodable`).
pub fn build_fetch_response(
    version: i16,
    throttle_ms: i32,
    error_code: i16,
    session_id: i32,
    topics: &[(FetchTopicRef<'_>, Vec<FetchPartitionResponse<'_>>)],
) -> WireResult<Vec<u8>> {
    check_version("FetchResponse", version, VERSIONS)?;
    let flexible = api::is_flexible(api::FETCH, version);
    let mut out = Vec::with_capacity(
        64 + topics
            .iter()
            .flat_map(|(_, ps)| ps)
            .map(|p| 64 + p.records.as_ref().map_or(0, |r| r.len()))
            .sum::<usize>(),
    );
    let mut w = Writer::new(&mut out);
    w.put_i32(throttle_ms);
    if version >= 7 {
        w.put_i16(error_code);
        w.put_i32(session_id);
    }
    w.put_array_len_v(flexible, Some(topics.len()), "FetchResponse.responses")?;
    for (topic, parts) in topics {
        let refs: Vec<&FetchPartitionResponse<'_>> = parts.iter().collect();
        put_topic_entry(&mut w, &FIELDS, version, topic, &refs)?;
    }
    if flexible {
        w.put_uvarint(0);
    }
    Ok(out)
}

/// Where one upstream topic entry sits in the body.
struct TopicLayout<'a> {
    topic: FetchTopic<'a>,
    /// Byte range of the partitions count prefix.
    count: std::ops::Range<usize>,
    /// Offset just after the last partition entry (where extra entries go).
    parts_end: usize,
    /// Index of its first partition in the walker's partition list.
    first: usize,
    /// Number of partitions.
    len: usize,
    /// The whole topic entry (tagged fields included).
    span: Range<usize>,
}

/// Copies an upstream FetchResponse body at `version` (4..=18), replacing
/// and adding partition entries.
///
/// - `replace` is called for every upstream partition in wire order; when it
///   returns `Some`, that entry is re-encoded from the returned value (its
///   `partition_index` should stay the same), otherwise copied verbatim.
/// - `add` lists partitions the upstream did not return. Partitions of a
///   topic the upstream response already holds are appended to that topic's
///   entry; the others become new topic entries at the end of the
///   responses array. Counts are fixed up. A partition the upstream did
///   return must be handled through `replace`, not `add` (it would appear
///   twice).
///
/// Everything else (throttle, error code, session id, every other
/// partition, per-topic and top-level tagged fields, any trailing bytes) is
/// copied verbatim. Always returns a new body, even when nothing changed.
pub fn splice_fetch_response<'b>(
    version: i16,
    body: &'b [u8],
    replace: &mut dyn FnMut(&FetchPartition<'b>) -> Option<FetchPartitionResponse<'b>>,
    add: &[(FetchTopicRef<'_>, Vec<FetchPartitionResponse<'_>>)],
) -> WireResult<Vec<u8>> {
    splice_fetch_response_dropping(version, body, &mut |_| false, replace, add)
}

/// [`splice_fetch_response`] that also leaves out every upstream partition
/// for which `drop` returns true (asked first, before `replace`). A topic
/// left with no partition (and nothing added to it) is left out whole.
/// In an incremental fetch session an absent partition means "nothing new",
/// which is what a partition the proxy answers itself must look like when
/// the fetcher did not ask for it.
pub fn splice_fetch_response_dropping<'b>(
    version: i16,
    body: &'b [u8],
    drop: &mut dyn FnMut(&FetchPartition<'b>) -> bool,
    replace: &mut dyn FnMut(&FetchPartition<'b>) -> Option<FetchPartitionResponse<'b>>,
    add: &[(FetchTopicRef<'_>, Vec<FetchPartitionResponse<'_>>)],
) -> WireResult<Vec<u8>> {
    check_version("FetchResponse", version, VERSIONS)?;
    let flexible = api::is_flexible(api::FETCH, version);
    for (t, _) in add {
        check_topic_kind(t, version, FIELDS.topic)?;
    }
    // Validate everything first; the list grows only by parsed partitions.
    let mut parts: Vec<FetchPartition<'b>> = Vec::new();
    let info = walk_fetch_response(version, body, &mut |p| parts.push(p.clone()))?;
    let topics_array_end = info.tagged_fields.map_or(info.end, |t| t.start);

    // Topic-level layout; the walker validated every byte of it already.
    let topics_start = if version >= 7 { 10 } else { 4 };
    let mut r = Reader::at(body, topics_start);
    let n_topics = r.read_array_len_v(flexible, 2, "FetchResponse.responses")?;
    let topics_count = topics_start..r.position();
    let mut layout: Vec<TopicLayout<'b>> = Vec::new();
    let mut next = 0usize;
    for _ in 0..n_topics {
        let tstart = r.position();
        let topic = if version >= 13 {
            FetchTopic::Id(r.read_uuid("FetchResponse.responses.topic_id")?)
        } else {
            FetchTopic::Name(r.read_string_v(flexible, "FetchResponse.responses.topic")?)
        };
        let cstart = r.position();
        let len = r.read_array_len_v(flexible, 24, "FetchResponse.responses.partitions")?;
        let count = cstart..r.position();
        let first = next;
        next = next.saturating_add(len);
        let parts_end = match len {
            0 => count.end,
            _ => parts
                .get(next - 1)
                .map(|p| p.span.end)
                .ok_or(WireError::Unencodable {
                    field: "FetchResponse.responses.partitions",
                    reason: "partition layout disagrees with the walker",
                })?,
        };
        r = Reader::at(body, parts_end);
        r.skip_tagged_fields_v(flexible, "FetchResponse.responses._tagged_fields")?;
        layout.push(TopicLayout {
            span: tstart..r.position(),
            topic,
            count,
            parts_end,
            first,
            len,
        });
    }

    // Plan the additions: merged into an upstream topic entry, or new topic
    // entries (one per distinct topic, in the order given).
    let upstream: Vec<FetchTopic<'_>> = layout.iter().map(|l| l.topic).collect();
    let Additions { merged, fresh } = plan_additions(&upstream, add);

    // Drops first (one bool per parsed partition), so counts are known.
    let dropped: Vec<bool> = parts.iter().map(&mut *drop).collect();
    let kept_of = |l: &TopicLayout<'_>| {
        dropped
            .get(l.first..l.first + l.len)
            .unwrap_or_default()
            .iter()
            .filter(|d| !**d)
            .count()
    };
    let removed_topics = layout
        .iter()
        .zip(&merged)
        .filter(|(l, extra)| l.len > 0 && kept_of(l) == 0 && extra.is_empty())
        .count();
    let mut sp = Splicer::new(body);
    if !fresh.is_empty() || removed_topics > 0 {
        let n = n_topics
            .saturating_add(fresh.len())
            .saturating_sub(removed_topics);
        let w = array_len(flexible, n, "FetchResponse.responses")?;
        sp.replace(topics_count.start, topics_count.end, &w)?;
    }
    for (l, extra) in layout.iter().zip(&merged) {
        let kept = kept_of(l);
        if l.len > 0 && kept == 0 && extra.is_empty() {
            sp.replace(l.span.start, l.span.end, &[])?;
            continue;
        }
        if !extra.is_empty() || kept != l.len {
            let n = kept.saturating_add(extra.len());
            let w = array_len(flexible, n, FIELDS.partitions)?;
            sp.replace(l.count.start, l.count.end, &w)?;
        }
        let mine = parts.get(l.first..l.first + l.len).unwrap_or_default();
        let gone = dropped.get(l.first..l.first + l.len).unwrap_or_default();
        for (p, &d) in mine.iter().zip(gone) {
            if d {
                sp.replace(p.span.start, p.span.end, &[])?;
            } else if let Some(resp) = replace(p) {
                sp.replace(p.span.start, p.span.end, &resp.to_bytes(version)?)?;
            }
        }
        if !extra.is_empty() {
            sp.replace(l.parts_end, l.parts_end, &encode_entries(version, extra)?)?;
        }
    }
    if !fresh.is_empty() {
        let out = encode_fresh(&FIELDS, version, &fresh)?;
        sp.replace(topics_array_end, topics_array_end, &out)?;
    }
    Ok(sp.finish().unwrap_or_else(|| body.to_vec()))
}
