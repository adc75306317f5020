//! FetchResponse (API key 1) v4-v18 walker and zero-copy partition visitor.
//!
//! Layout (flexible from v12): `throttle_time_ms: i32`, `error_code: i16
//! (v7+)`, `session_id: i32 (v7+)`, `responses: [topic: string (v4-12) |
//! topic_id: uuid (v13+), partitions: [partition_index: i32, error_code: i16,
//! high_watermark: i64, last_stable_offset: i64, log_start_offset: i64 (v5+),
//! aborted_transactions: nullable [producer_id: i64, first_offset: i64,
//! tags (v12+)], preferred_read_replica: i32 (v11+), records: nullable bytes,
//! tags (v12+: DivergingEpoch 0, CurrentLeader 1, SnapshotId 2)], tags
//! (v12+)]`, tags (v12+: NodeEndpoints 0 from v16).
//!
//! Records are never parsed here: the visitor gets their byte range within
//! the body, which is what the mirror path needs to patch batches in place.

use std::ops::Range;

use super::check_version;
use crate::codec::api;
use crate::wire::{Reader, TaggedSection, WireResult};

/// A topic as a FetchResponse names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchTopic<'a> {
    /// Topic name (v4-v12).
    Name(&'a str),
    /// Topic id (v13+).
    Id([u8; 16]),
}

/// One aborted-transaction entry of a fetched partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortedTxn {
    /// Producer id of the aborted transaction.
    pub producer_id: i64,
    /// First offset of the aborted transaction.
    pub first_offset: i64,
    /// Byte offset of `producer_id` within the body (8 bytes, big-endian),
    /// so the PID can be patched in place.
    pub producer_id_offset: usize,
}

/// The validated aborted-transactions array of a partition.
#[derive(Debug, Clone, Copy)]
pub struct AbortedTxns<'a> {
    body: &'a [u8],
    first: usize,
    count: usize,
    flexible: bool,
}

impl<'a> AbortedTxns<'a> {
    /// Number of entries.
    pub fn len(&self) -> usize {
        self.count
    }

    /// True when the array is present but empty.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Iterates the entries in wire order.
    pub fn iter(&self) -> impl Iterator<Item = AbortedTxn> + 'a {
        let mut r = Reader::at(self.body, self.first);
        let flexible = self.flexible;
        // Already validated by the walker: a failure here can only end the
        // iteration early, never panic.
        (0..self.count).map_while(move |_| {
            let producer_id_offset = r.position();
            let producer_id = r.read_i64("aborted_transactions.producer_id").ok()?;
            let first_offset = r.read_i64("aborted_transactions.first_offset").ok()?;
            r.skip_tagged_fields_v(flexible, "aborted_transactions._tagged_fields")
                .ok()?;
            Some(AbortedTxn {
                producer_id,
                first_offset,
                producer_id_offset,
            })
        })
    }
}

/// One partition of a FetchResponse, borrowed from the body.
#[derive(Debug, Clone)]
pub struct FetchPartition<'a> {
    /// The topic this partition belongs to.
    pub topic: FetchTopic<'a>,
    /// Partition index.
    pub partition_index: i32,
    /// Partition error code.
    pub error_code: i16,
    /// High watermark.
    pub high_watermark: i64,
    /// Last stable offset.
    pub last_stable_offset: i64,
    /// Log start offset (-1 before v5).
    pub log_start_offset: i64,
    /// Aborted transactions (`None` when null).
    pub aborted_transactions: Option<AbortedTxns<'a>>,
    /// Preferred read replica (-1 before v11).
    pub preferred_read_replica: i32,
    /// Byte range of the records within the body (`None` when null). The
    /// range may end in a truncated batch, as brokers legitimately send.
    pub records: Option<Range<usize>>,
    /// The partition's tagged fields (v12+).
    pub tagged_fields: Option<TaggedSection<'a>>,
    /// Byte range of the whole partition entry within the body.
    pub span: Range<usize>,
}

impl FetchPartition<'_> {
    /// The DivergingEpoch (v12+, tag 0) of the partition: the leader's
    /// `(epoch, end_offset)` where its log diverges from the fetcher's.
    pub fn diverging_epoch(&self) -> Option<(i32, i64)> {
        self.tagged_fields.as_ref().and_then(diverging_epoch)
    }
}

/// The DivergingEpoch field (tag 0: `epoch: i32, end_offset: i64, tags`) of
/// a FetchResponse partition's tagged section, if present and well formed.
pub fn diverging_epoch(tags: &TaggedSection<'_>) -> Option<(i32, i64)> {
    let field = tags.find(0)?;
    let mut r = Reader::new(field.data);
    let epoch = r
        .read_i32("FetchResponse.partitions.diverging_epoch.epoch")
        .ok()?;
    let end = r
        .read_i64("FetchResponse.partitions.diverging_epoch.end_offset")
        .ok()?;
    Some((epoch, end))
}

/// Top-level facts of a FetchResponse learned by [`walk_fetch_response`].
#[derive(Debug, Clone, Copy)]
pub struct FetchResponseInfo<'a> {
    /// Throttle time.
    pub throttle_time_ms: i32,
    /// Top-level error code (0 before v7).
    pub error_code: i16,
    /// Fetch session id (0 before v7).
    pub session_id: i32,
    /// Top-level tagged-field section (v12+).
    pub tagged_fields: Option<TaggedSection<'a>>,
    /// Offset just after the last field parsed.
    pub end: usize,
}

/// Walks a whole FetchResponse body at `version` (4..=18), checking every
/// length, and calls `visit` for each partition in wire order.
pub fn walk_fetch_response<'a>(
    version: i16,
    body: &'a [u8],
    visit: &mut dyn FnMut(&FetchPartition<'a>),
) -> WireResult<FetchResponseInfo<'a>> {
    check_version("FetchResponse", version, 4..=18)?;
    let flexible = api::is_flexible(api::FETCH, version);
    let mut r = Reader::new(body);
    let throttle_time_ms = r.read_i32("FetchResponse.throttle_time_ms")?;
    let (error_code, session_id) = if version >= 7 {
        (
            r.read_i16("FetchResponse.error_code")?,
            r.read_i32("FetchResponse.session_id")?,
        )
    } else {
        (0, 0)
    };
    let topics = r.read_array_len_v(flexible, 2, "FetchResponse.responses")?;
    for _ in 0..topics {
        let topic = if version >= 13 {
            FetchTopic::Id(r.read_uuid("FetchResponse.responses.topic_id")?)
        } else {
            FetchTopic::Name(r.read_string_v(flexible, "FetchResponse.responses.topic")?)
        };
        // Smallest partition: index(4) error(2) hw(8) lso(8) aborted(1) records(1).
        let parts = r.read_array_len_v(flexible, 24, "FetchResponse.responses.partitions")?;
        for _ in 0..parts {
            let start = r.position();
            let partition_index = r.read_i32("FetchResponse.partitions.partition_index")?;
            let error_code = r.read_i16("FetchResponse.partitions.error_code")?;
            let high_watermark = r.read_i64("FetchResponse.partitions.high_watermark")?;
            let last_stable_offset = r.read_i64("FetchResponse.partitions.last_stable_offset")?;
            let log_start_offset = if version >= 5 {
                r.read_i64("FetchResponse.partitions.log_start_offset")?
            } else {
                -1
            };
            let aborted = r.read_nullable_array_len_v(
                flexible,
                16,
                "FetchResponse.partitions.aborted_transactions",
            )?;
            let aborted_transactions = match aborted {
                None => None,
                Some(count) => {
                    let first = r.position();
                    for _ in 0..count {
                        r.read_i64("FetchResponse.aborted_transactions.producer_id")?;
                        r.read_i64("FetchResponse.aborted_transactions.first_offset")?;
                        r.skip_tagged_fields_v(
                            flexible,
                            "FetchResponse.aborted_transactions._tagged_fields",
                        )?;
                    }
                    Some(AbortedTxns {
                        body,
                        first,
                        count,
                        flexible,
                    })
                }
            };
            let preferred_read_replica = if version >= 11 {
                r.read_i32("FetchResponse.partitions.preferred_read_replica")?
            } else {
                -1
            };
            let records = r
                .read_nullable_bytes_v(flexible, "FetchResponse.partitions.records")?
                .map(|b| {
                    let end = r.position();
                    end - b.len()..end
                });
            let tagged_fields = if flexible {
                Some(r.read_tagged_fields("FetchResponse.partitions._tagged_fields")?)
            } else {
                None
            };
            visit(&FetchPartition {
                topic,
                partition_index,
                error_code,
                high_watermark,
                last_stable_offset,
                log_start_offset,
                aborted_transactions,
                preferred_read_replica,
                records,
                tagged_fields,
                span: start..r.position(),
            });
        }
        r.skip_tagged_fields_v(flexible, "FetchResponse.responses._tagged_fields")?;
    }
    let tagged_fields = if flexible {
        Some(r.read_tagged_fields("FetchResponse._tagged_fields")?)
    } else {
        None
    };
    Ok(FetchResponseInfo {
        throttle_time_ms,
        error_code,
        session_id,
        tagged_fields,
        end: r.position(),
    })
}
