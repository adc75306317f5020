//! ProduceResponse (API key 0) v0-v13 walker.
//!
//! The only address a ProduceResponse can carry is the KIP-951 top-level
//! tagged field `NodeEndpoints` (tag 0, v10+), which sits after everything
//! else; reaching it means walking the whole response. Layout (flexible from
//! v9): `responses: [name: string (v0-12) | topic_id: uuid (v13+),
//! partition_responses: [index: i32, error_code: i16, base_offset: i64,
//! log_append_time_ms: i64 (v2+), log_start_offset: i64 (v5+),
//! record_errors: [batch_index: i32, message: nullable string, tags] (v8+),
//! error_message: nullable string (v8+), tags (v9+; CurrentLeader is tag 0)],
//! tags (v9+)]`, `throttle_time_ms: i32 (v1+)`, tags (v9+).

use super::check_version;
use super::fetch::FetchTopic;
use crate::codec::api;
use crate::wire::{Reader, TaggedSection, WireResult};

/// What [`walk_produce_response`] learned about a ProduceResponse body.
#[derive(Debug, Clone, Copy)]
pub struct ProduceResponseInfo<'a> {
    /// Throttle time (0 before v1).
    pub throttle_time_ms: i32,
    /// The top-level tagged-field section (v9+); offsets are within the body.
    pub tagged_fields: Option<TaggedSection<'a>>,
    /// Offset just after the last field that was parsed.
    pub end: usize,
}

/// Walks a whole ProduceResponse body at `version`, checking every length,
/// and locates its top-level tagged fields.
pub fn walk_produce_response(version: i16, body: &[u8]) -> WireResult<ProduceResponseInfo<'_>> {
    check_version("ProduceResponse", version, 0..=13)?;
    let flexible = api::is_flexible(api::PRODUCE, version);
    let mut r = Reader::new(body);
    // Smallest topic: name/uuid + empty partitions array (+ tags) >= 2 bytes.
    let topics = r.read_array_len_v(flexible, 2, "ProduceResponse.responses")?;
    for _ in 0..topics {
        read_topic(&mut r, version, flexible)?;
        // Smallest partition: index(4) error(2) base_offset(8).
        let parts = r.read_array_len_v(
            flexible,
            14,
            "ProduceResponse.responses.partition_responses",
        )?;
        for _ in 0..parts {
            skip_partition(&mut r, version, flexible)?;
        }
        r.skip_tagged_fields_v(flexible, "ProduceResponse.responses._tagged_fields")?;
    }
    let throttle_time_ms = if version >= 1 {
        r.read_i32("ProduceResponse.throttle_time_ms")?
    } else {
        0
    };
    let tagged_fields = if flexible {
        Some(r.read_tagged_fields("ProduceResponse._tagged_fields")?)
    } else {
        None
    };
    Ok(ProduceResponseInfo {
        throttle_time_ms,
        tagged_fields,
        end: r.position(),
    })
}

/// Reads the topic of one `responses` entry (name up to v12, id from v13).
pub(crate) fn read_topic<'a>(
    r: &mut Reader<'a>,
    version: i16,
    flexible: bool,
) -> WireResult<FetchTopic<'a>> {
    Ok(if version >= 13 {
        FetchTopic::Id(r.read_uuid("ProduceResponse.responses.topic_id")?)
    } else {
        FetchTopic::Name(r.read_string_v(flexible, "ProduceResponse.responses.name")?)
    })
}

/// Reads past one `partition_responses` entry, checking every length.
pub(crate) fn skip_partition(r: &mut Reader<'_>, version: i16, flexible: bool) -> WireResult<()> {
    r.read_i32("ProduceResponse.partition_responses.index")?;
    r.read_i16("ProduceResponse.partition_responses.error_code")?;
    r.read_i64("ProduceResponse.partition_responses.base_offset")?;
    if version >= 2 {
        r.read_i64("ProduceResponse.partition_responses.log_append_time_ms")?;
    }
    if version >= 5 {
        r.read_i64("ProduceResponse.partition_responses.log_start_offset")?;
    }
    if version >= 8 {
        let errs = r.read_array_len_v(
            flexible,
            5,
            "ProduceResponse.partition_responses.record_errors",
        )?;
        for _ in 0..errs {
            r.read_i32("ProduceResponse.record_errors.batch_index")?;
            r.read_nullable_string_v(
                flexible,
                "ProduceResponse.record_errors.batch_index_error_message",
            )?;
            r.skip_tagged_fields_v(flexible, "ProduceResponse.record_errors._tagged_fields")?;
        }
        r.read_nullable_string_v(
            flexible,
            "ProduceResponse.partition_responses.error_message",
        )?;
    }
    r.skip_tagged_fields_v(
        flexible,
        "ProduceResponse.partition_responses._tagged_fields",
    )
}
