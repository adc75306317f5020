//! Synthetic Fetch responses shared by the benches (not a bench itself).
//!
//! A response holds `partitions` partitions of one topic, each with
//! `batches_per_partition` uncompressed v2 batches of about `batch_bytes`
//! bytes, every batch from its own idempotent producer (PIDs 1000..).
//! [`SyntheticFetch::advance`] moves every batch to generation `k` (base
//! offset and base sequence continue the previous generation, CRC
//! recomputed), so replaying the response through producer-state tracking
//! exercises the full in-sequence path instead of "already seen".

#![allow(dead_code)]

use std::borrow::Cow;

use mirrorguard::handlers::fetch_build::{build_fetch_response, FetchPartitionResponse};
use mirrorguard::handlers::FetchTopic;
use mirrorguard::records::builder::{build_batch, BatchSpec, RecordSpec};

/// Records per batch (one value each).
pub const RECORDS_PER_BATCH: usize = 8;

/// A Fetch response body and where its batches are.
pub struct SyntheticFetch {
    /// The body (after the response header).
    pub body: Vec<u8>,
    /// Start of every batch in `body`, with its partition-local index.
    pub batches: Vec<(usize, usize)>,
    /// Batches per partition.
    pub per_partition: usize,
    /// Bytes of record batches in the body.
    pub record_bytes: usize,
}

/// One batch of about `size` bytes (at least one record of 1 byte).
pub fn batch(pid: i64, size: usize) -> Vec<u8> {
    let value_len = (size.saturating_sub(61) / RECORDS_PER_BATCH)
        .saturating_sub(8)
        .max(1);
    let value = vec![0x5au8; value_len];
    let recs: Vec<RecordSpec<'_>> = (0..RECORDS_PER_BATCH as i32)
        .map(|i| RecordSpec {
            offset_delta: i,
            timestamp_delta: i64::from(i),
            value: Some(&value),
            ..RecordSpec::default()
        })
        .collect();
    build_batch(
        &BatchSpec {
            producer_id: pid,
            producer_epoch: 0,
            base_sequence: 0,
            base_timestamp: 1_700_000_000_000,
            max_timestamp: 1_700_000_000_000 + RECORDS_PER_BATCH as i64 - 1,
            ..BatchSpec::default()
        },
        &recs,
    )
}

impl SyntheticFetch {
    /// Builds a Fetch v12 body (topic names) for `topic`.
    pub fn new(
        topic: &str,
        partitions: usize,
        batches_per_partition: usize,
        batch_bytes: usize,
    ) -> Self {
        let mut parts = Vec::with_capacity(partitions);
        for p in 0..partitions {
            let mut records = Vec::new();
            for b in 0..batches_per_partition {
                records.extend_from_slice(&batch(1000 + b as i64, batch_bytes));
            }
            let mut r = FetchPartitionResponse::new(p as i32);
            r.high_watermark = i64::MAX / 2;
            r.last_stable_offset = i64::MAX / 2;
            r.log_start_offset = 0;
            r.records = Some(Cow::Owned(records));
            parts.push(r);
        }
        let body = build_fetch_response(12, 0, 0, 0, &[(FetchTopic::Name(topic), parts)])
            .expect("synthetic fetch response");
        let mut batches = Vec::new();
        let mut record_bytes = 0;
        mirrorguard::handlers::walk_fetch_response(12, &body, &mut |p| {
            let Some(r) = p.records.clone() else { return };
            record_bytes += r.len();
            for (i, e) in mirrorguard::records::walk(&body[r.clone()])
                .flatten()
                .enumerate()
            {
                batches.push((r.start + e.range().start, i));
            }
        })
        .expect("walk synthetic response");
        Self {
            body,
            batches,
            per_partition: batches_per_partition,
            record_bytes,
        }
    }

    /// Moves every batch of `buf` (a copy of `body`) to generation `k`.
    pub fn advance(&self, buf: &mut [u8], k: u64) {
        let r = RECORDS_PER_BATCH as i64;
        for &(at, i) in &self.batches {
            let base_offset = (k as i64 * self.per_partition as i64 + i as i64) * r;
            buf[at..at + 8].copy_from_slice(&base_offset.to_be_bytes());
            let seq = ((k as i64 * r) % (i32::MAX as i64)) as i32;
            buf[at + 53..at + 57].copy_from_slice(&seq.to_be_bytes());
            let len = i32::from_be_bytes(buf[at + 8..at + 12].try_into().unwrap()) as usize;
            let crc = crc32c::crc32c(&buf[at + 21..at + 12 + len]);
            buf[at + 17..at + 21].copy_from_slice(&crc.to_be_bytes());
        }
    }
}
