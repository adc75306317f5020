//! Readers below the cut: a reader that is not the destination fetcher and
//! reads below the cut of a STOPPING or STOPPED partition is forwarded like
//! a MIRRORING one and its answer is cut at the cut.

use super::*;

/// A reader's entry for a sealed partition read below its cut: the source's
/// answer without the batches at or past the cut (a batch that crosses it
/// included), its aborted transactions below the cut, and watermarks no
/// higher than the destination's sealed log end.
pub(super) fn below_cut_response<'b>(
    body: &'b [u8],
    p: &handlers::FetchPartition<'b>,
    b: &BelowCut,
    read_committed: bool,
) -> FetchPartitionResponse<'b> {
    let mut r = FetchPartitionResponse::new(p.partition_index);
    r.error_code = p.error_code;
    r.high_watermark = p.high_watermark.min(b.end);
    r.last_stable_offset = p.last_stable_offset.min(b.end);
    r.log_start_offset = p.log_start_offset;
    r.aborted_transactions = match (&p.aborted_transactions, read_committed) {
        (None, false) => None,
        (source, _) => {
            let mut v: Vec<handlers::AbortedTransaction> = source
                .iter()
                .flat_map(|a| a.iter())
                .filter(|t| t.first_offset < b.cut)
                .map(|t| handlers::AbortedTransaction {
                    producer_id: t.producer_id,
                    first_offset: t.first_offset,
                })
                .collect();
            // The seal's ABORT markers at the cut end these on the
            // destination, even those the source committed past the cut.
            for &(producer_id, first_offset) in &b.sealed_aborts {
                if !v
                    .iter()
                    .any(|t| t.producer_id == producer_id && t.first_offset == first_offset)
                {
                    v.push(handlers::AbortedTransaction {
                        producer_id,
                        first_offset,
                    });
                }
            }
            Some(v)
        }
    };
    r.records = p
        .records
        .clone()
        .map(|range| Cow::Borrowed(records_below(body.get(range).unwrap_or(&[]), b.cut)));
    r
}

/// The entries of `records` wholly below `cut` (a batch that crosses it
/// excluded; a truncated tail or a corrupt batch ends them).
pub(super) fn records_below(records: &[u8], cut: i64) -> &[u8] {
    // Entry ranges are positions in `records`: keep up to the end of the
    // last entry wholly below the cut.
    let mut keep = 0;
    for entry in crate::records::walk(records) {
        let (last, end) = match entry {
            Ok(crate::records::Entry::V2(h)) => (h.last_offset(), h.range.end),
            Ok(crate::records::Entry::Legacy { range, .. }) => {
                // A legacy entry starts with its (last) offset.
                let offset = records
                    .get(range.start..range.start + 8)
                    .and_then(|o| o.try_into().ok())
                    .map_or(i64::MAX, i64::from_be_bytes);
                (offset, range.end)
            }
            _ => break,
        };
        if last >= cut {
            break;
        }
        keep = end;
    }
    records.get(..keep).unwrap_or(&[])
}

/// Whether the first batch of a below-cut entry is whole and crosses the
/// cut: the reader's offset lies in it, the answer holds no records and
/// the high watermark is past its offset, so a consumer fetches the same
/// offset again forever. The destination never holds such a batch (its
/// fetcher took the cut at a batch boundary of what it appended), so the
/// source's log there differs from what was mirrored (rewritten or
/// compacted since); no answer is right for it, and no error code means
/// that to a consumer (OFFSET_OUT_OF_RANGE would make it reset its
/// position). It is counted and logged so an operator sees the stuck
/// reader.
pub(super) fn below_cut_straddles(body: &[u8], p: &handlers::FetchPartition<'_>, cut: i64) -> bool {
    let Some(records) = p.records.clone().and_then(|r| body.get(r)) else {
        return false;
    };
    matches!(
        crate::records::walk(records).next(),
        Some(Ok(crate::records::Entry::V2(h))) if h.base_offset < cut && h.last_offset() >= cut
    )
}

/// Counts a below-cut answer stuck on a batch crossing the cut; warns once
/// per partition.
pub(super) fn note_straddle(mirror: &MirrorContext, b: &BelowCut) {
    let m = &mirror.seal_metrics;
    m.below_cut_straddles.inc();
    let first = m
        .below_cut_straddle_warned
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(b.key.clone());
    if first {
        tracing::warn!(mirror = %mirror.name, partition = %b.key, cut = b.cut,
            "a reader below the cut is stuck: the source's batch at its offset crosses the cut, \
             which the destination never holds (the source's log changed since it was mirrored); \
             it gets no records there (logged once per partition)");
    }
}

/// Drops from a reader's upstream Fetch response the batches of its
/// below-cut partitions at or past the cut, before they are mapped: the
/// destination never holds them, so their producers must not be claimed,
/// persisted, salted or counted against `max_producers`. Everything else
/// is left as the upstream sent it (the seal's filter finishes the entry:
/// watermarks and the seal's aborts). The frame is returned unchanged when
/// there is nothing to drop.
pub fn trim_below_cut(
    h: &RequestHeader,
    plan: Option<&FetchPlan>,
    frame: BytesMut,
) -> Result<BytesMut, RewriteError> {
    let Some(plan) = plan.filter(|p| !p.below_cut.is_empty()) else {
        return Ok(frame);
    };
    let hv = handlers::response_header_version(h.api_key, h.api_version)
        .ok_or_else(|| err(h.api_version, "unknown response header version".into()))?;
    let body_at = response_body_offset(&frame, hv)
        .ok_or_else(|| err(h.api_version, "response header truncated".into()))?;
    let body = &frame[body_at..];
    let cut_of = |p: &handlers::FetchPartition<'_>| {
        plan.below_cut
            .iter()
            .find(|b| b.topic.as_fetch_topic() == p.topic && b.partition == p.partition_index)
            .map(|b| b.cut)
    };
    let mut past_cut = false;
    handlers::walk_fetch_response(h.api_version, body, &mut |p| {
        if let (Some(cut), Some(range)) = (cut_of(p), p.records.clone()) {
            let records = body.get(range).unwrap_or(&[]);
            past_cut |= records_below(records, cut).len() < records.len();
        }
    })
    .map_err(|e| err(h.api_version, e.to_string()))?;
    if !past_cut {
        return Ok(frame);
    }
    let new_body = splice_fetch_response_dropping(
        h.api_version,
        body,
        &mut |_| false,
        &mut |p| {
            let cut = cut_of(p)?;
            let mut r = FetchPartitionResponse::new(p.partition_index);
            r.error_code = p.error_code;
            r.high_watermark = p.high_watermark;
            r.last_stable_offset = p.last_stable_offset;
            r.log_start_offset = p.log_start_offset;
            r.preferred_read_replica = p.preferred_read_replica;
            r.aborted_transactions = p.aborted_transactions.as_ref().map(|a| {
                a.iter()
                    .map(|t| handlers::AbortedTransaction {
                        producer_id: t.producer_id,
                        first_offset: t.first_offset,
                    })
                    .collect()
            });
            r.records = p
                .records
                .clone()
                .map(|range| Cow::Borrowed(records_below(body.get(range).unwrap_or(&[]), cut)));
            Some(r)
        },
        &[],
    )
    .map_err(|e| err(h.api_version, e.to_string()))?;
    let out = crate::filter::with_body(&frame, body_at, &new_body);
    Ok(out)
}

/// Whether a response partition is a reader's read below the cut of a
/// sealed partition (forwarded, mapped like any other, then cut).
pub(super) fn is_below_cut(
    plan: Option<&FetchPlan>,
    topic: &FetchTopic<'_>,
    partition: i32,
) -> bool {
    plan.is_some_and(|p| {
        p.below_cut
            .iter()
            .any(|b| b.topic.as_fetch_topic() == *topic && b.partition == partition)
    })
}
