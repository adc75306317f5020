//! ProduceResponse (API key 0) v3-v13 builder and merger for the produce
//! guard.
//!
//! The guard (SPEC section 3) refuses Produce for partitions that are still
//! mirrored and forwards the others. The client must get one response
//! covering every partition it wrote: [`build_produce_response`] when every
//! partition was refused, [`merge_produce_responses`] to add the refused
//! partitions to the upstream's response for the forwarded ones (the
//! upstream's throttle time and tagged fields, NodeEndpoints included, are
//! kept verbatim).
//!
//! Partition entries written here: `index, error_code, base_offset,
//! log_append_time_ms, log_start_offset, record_errors: [] (v8+),
//! error_message (v8+), tags: {} (v9+)`. Layout of the whole response in
//! [`super::produce`].

use super::check_version;
use super::fetch::FetchTopic;
use super::produce;
use super::produce_request::ProduceTopic;
use super::topic_entries::{
    array_len, check_topic_kind, encode_entries, encode_fresh, plan_additions, put_topic_entry,
    Additions, PartitionEntry, TopicFields,
};
use crate::codec::api;
use crate::wire::{Reader, Splicer, WireResult, Writer};

/// Versions of ProduceResponse the builders here encode.
const VERSIONS: std::ops::RangeInclusive<i16> = 3..=13;

/// One partition's result in a ProduceResponse built by the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducePartitionResult<'a> {
    /// Partition index.
    pub index: i32,
    /// Error code (0 = none).
    pub error_code: i16,
    /// Base offset of the appended batch (-1 on error).
    pub base_offset: i64,
    /// Log append time (-1 unless the topic uses LogAppendTime).
    pub log_append_time_ms: i64,
    /// Log start offset (written from v5; -1 on error).
    pub log_start_offset: i64,
    /// Error message (written from v8), shown by clients next to the code.
    pub error_message: Option<&'a str>,
}

impl<'a> ProducePartitionResult<'a> {
    /// A refusal of partition `index` with `error_code` and `message`
    /// (every offset -1).
    pub fn refused(index: i32, error_code: i16, message: Option<&'a str>) -> Self {
        ProducePartitionResult {
            index,
            error_code,
            base_offset: -1,
            log_append_time_ms: -1,
            log_start_offset: -1,
            error_message: message,
        }
    }

    /// Appends this entry, encoded for ProduceResponse `version`, to `w`.
    pub fn encode(&self, version: i16, w: &mut Writer<&mut Vec<u8>>) -> WireResult<()> {
        check_version("ProduceResponse", version, VERSIONS)?;
        let flexible = api::is_flexible(api::PRODUCE, version);
        w.put_i32(self.index);
        w.put_i16(self.error_code);
        w.put_i64(self.base_offset);
        w.put_i64(self.log_append_time_ms);
        if version >= 5 {
            w.put_i64(self.log_start_offset);
        }
        if version >= 8 {
            w.put_array_len_v(
                flexible,
                Some(0),
                "ProduceResponse.partition_responses.record_errors",
            )?;
            w.put_nullable_string_v(
                flexible,
                self.error_message,
                "ProduceResponse.partition_responses.error_message",
            )?;
        }
        if flexible {
            w.put_uvarint(0);
        }
        Ok(())
    }
}

impl PartitionEntry for ProducePartitionResult<'_> {
    fn encode(&self, version: i16, w: &mut Writer<&mut Vec<u8>>) -> WireResult<()> {
        ProducePartitionResult::encode(self, version, w)
    }
}

/// ProduceResponse's topic entries.
const FIELDS: TopicFields = TopicFields {
    api_key: api::PRODUCE,
    topic: "ProduceResponse.responses.name",
    partitions: "ProduceResponse.responses.partition_responses",
};

/// Builds a whole ProduceResponse body at `version` (3..=13) answered by the
/// proxy: the given topics and partitions in order, `throttle_ms`, and empty
/// tagged fields. Topics must be names for v3-v12 and ids for v13.
///
/// Note for acks=0 requests: Kafka sends no response at all, so neither
/// should the proxy.
pub fn build_produce_response(
    version: i16,
    topics: &[(ProduceTopic<'_>, Vec<ProducePartitionResult<'_>>)],
    throttle_ms: i32,
) -> WireResult<Vec<u8>> {
    check_version("ProduceResponse", version, VERSIONS)?;
    let flexible = api::is_flexible(api::PRODUCE, version);
    let mut out = Vec::with_capacity(16 + topics.len() * 64);
    let mut w = Writer::new(&mut out);
    w.put_array_len_v(flexible, Some(topics.len()), "ProduceResponse.responses")?;
    for (topic, parts) in topics {
        let refs: Vec<&ProducePartitionResult<'_>> = parts.iter().collect();
        put_topic_entry(&mut w, &FIELDS, version, topic, &refs)?;
    }
    w.put_i32(throttle_ms);
    if flexible {
        w.put_uvarint(0);
    }
    Ok(out)
}

/// Where one upstream topic entry sits in a ProduceResponse body.
struct TopicLayout<'a> {
    topic: FetchTopic<'a>,
    /// Byte range of the partition count prefix.
    count: std::ops::Range<usize>,
    /// Number of partitions.
    len: usize,
    /// Offset just after the last partition entry.
    parts_end: usize,
}

/// Walks the `responses` array of a ProduceResponse body, checking every
/// length, and returns the count prefix range, each topic's layout and the
/// offset just after the array.
fn layout(
    version: i16,
    body: &[u8],
) -> WireResult<(std::ops::Range<usize>, Vec<TopicLayout<'_>>, usize)> {
    let flexible = api::is_flexible(api::PRODUCE, version);
    let mut r = Reader::new(body);
    let n = r.read_array_len_v(flexible, 2, "ProduceResponse.responses")?;
    let count_range = 0..r.position();
    // Grows by parsed topics only, never from the wire count.
    let mut topics = Vec::new();
    for _ in 0..n {
        let topic = produce::read_topic(&mut r, version, flexible)?;
        let cstart = r.position();
        // Smallest partition: index(4) error(2) base_offset(8).
        let len = r.read_array_len_v(
            flexible,
            14,
            "ProduceResponse.responses.partition_responses",
        )?;
        let count = cstart..r.position();
        for _ in 0..len {
            produce::skip_partition(&mut r, version, flexible)?;
        }
        let parts_end = r.position();
        r.skip_tagged_fields_v(flexible, "ProduceResponse.responses._tagged_fields")?;
        topics.push(TopicLayout {
            topic,
            count,
            len,
            parts_end,
        });
    }
    let end = r.position();
    // The rest (throttle, tagged fields) is copied verbatim but must be
    // well-formed: a truncated upstream response is an error, not a merge.
    r.read_i32("ProduceResponse.throttle_time_ms")?;
    r.skip_tagged_fields_v(flexible, "ProduceResponse._tagged_fields")?;
    Ok((count_range, topics, end))
}

/// Merges the proxy's local results into the upstream's ProduceResponse
/// body at `version` (3..=13).
///
/// Local partitions of a topic the upstream response already holds are
/// appended to that topic's entry; the other topics are added as new entries
/// at the end of the `responses` array (local entries naming the same topic
/// share one entry). Counts are fixed up; every upstream byte (its
/// partitions, throttle time, per-topic and top-level tagged fields) is
/// copied verbatim. Always returns a new body.
pub fn merge_produce_responses(
    version: i16,
    upstream_body: &[u8],
    local: &[(ProduceTopic<'_>, Vec<ProducePartitionResult<'_>>)],
) -> WireResult<Vec<u8>> {
    check_version("ProduceResponse", version, VERSIONS)?;
    let flexible = api::is_flexible(api::PRODUCE, version);
    for (t, _) in local {
        check_topic_kind(t, version, FIELDS.topic)?;
    }
    let (count_range, topics, array_end) = layout(version, upstream_body)?;

    let upstream: Vec<FetchTopic<'_>> = topics.iter().map(|l| l.topic).collect();
    let Additions { merged, fresh } = plan_additions(&upstream, local);

    let mut sp = Splicer::new(upstream_body);
    if !fresh.is_empty() {
        let n = topics.len().saturating_add(fresh.len());
        let w = array_len(flexible, n, "ProduceResponse.responses")?;
        sp.replace(count_range.start, count_range.end, &w)?;
    }
    for (l, extra) in topics.iter().zip(&merged) {
        if extra.is_empty() {
            continue;
        }
        let w = array_len(
            flexible,
            l.len.saturating_add(extra.len()),
            FIELDS.partitions,
        )?;
        sp.replace(l.count.start, l.count.end, &w)?;
        sp.replace(l.parts_end, l.parts_end, &encode_entries(version, extra)?)?;
    }
    if !fresh.is_empty() {
        let out = encode_fresh(&FIELDS, version, &fresh)?;
        sp.replace(array_end, array_end, &out)?;
    }
    Ok(sp.finish().unwrap_or_else(|| upstream_body.to_vec()))
}
