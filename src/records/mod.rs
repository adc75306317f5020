//! Record-batch engine: walks Kafka record blobs (the `records` field of
//! Fetch/Produce, or a log segment file) batch by batch, verifies and rewrites
//! v2 batches in place, parses control records and builds the control batches
//! mirrorguard injects (ABORT markers, the MIRROR_PID_RESET barrier).
//!
//! Byte layouts follow `reference/kafka-wire.md` section 1 (the v2 batch
//! header is 61 bytes, CRC-32C over `[21, 12 + batchLength)`).
//!
//! Design rules, because these bytes come straight off the network:
//! - nothing here panics on any input: every read is bounds-checked through
//!   `get`/`try_into`, and a length taken from the wire never sizes an
//!   allocation;
//! - walking never decompresses and never touches record bytes, so it costs a
//!   few header reads per batch regardless of batch size;
//! - the rewrite path changes exactly the producerId (bytes 43..51) and the CRC
//!   (bytes 17..21), reads nothing but the header (the CRC is shifted by the
//!   change's delta, so it is O(1) in the batch size), and does nothing at all
//!   when the PID does not change.

pub mod batch;
pub mod builder;
pub mod control;
pub mod record;
pub mod rewrite;

pub use batch::{walk, BatchError, BatchHeader, BatchWalker, Compression, Entry};
pub use rewrite::{
    rewrite_all, rewrite_all_verified, rewrite_producer_id, rewrite_producer_id_checked,
    rewrite_producer_id_in_head, rewrite_producer_id_verified, RewriteOutcome, RewriteStats,
};

/// baseOffset (8) + batchLength (4): the bytes before the length-covered part.
pub const LOG_OVERHEAD: usize = 12;
/// Size of the fixed v2 batch header (`RECORD_BATCH_OVERHEAD`).
pub const RECORD_BATCH_OVERHEAD: usize = 61;
/// Smallest legal entry size after the length field (`RECORD_OVERHEAD_V0`).
pub const MIN_ENTRY_SIZE: usize = 14;
/// Byte offset of the magic byte in every entry of every format.
pub const MAGIC_OFFSET: usize = 16;
/// Byte offset of the CRC field of a v2 batch.
pub const CRC_OFFSET: usize = 17;
/// First byte covered by the v2 CRC (the attributes field).
pub const ATTRIBUTES_OFFSET: usize = 21;
/// Byte offset of the producerId field of a v2 batch.
pub const PRODUCER_ID_OFFSET: usize = 43;
/// Byte offset of the records count of a v2 batch.
pub const RECORDS_COUNT_OFFSET: usize = 57;

/// Producer id meaning "no producer".
pub const NO_PRODUCER_ID: i64 = -1;

/// Checks the CRC-32C of one v2 batch.
///
/// `batch` starts at the batch's baseOffset; the covered range ends where
/// batchLength says, so trailing bytes after the batch are ignored. Returns
/// false when the slice is too short for the declared length, is not magic 2,
/// or the stored CRC does not match.
pub fn verify_crc(batch: &[u8]) -> bool {
    match crc_parts(batch) {
        Some((stored, covered)) => stored == crc32c::crc32c(covered),
        None => false,
    }
}

/// Computes the CRC-32C a v2 batch should carry (over bytes 21..end), or
/// `None` when the slice does not hold a whole v2 batch.
pub fn compute_crc(batch: &[u8]) -> Option<u32> {
    crc_parts(batch).map(|(_, covered)| crc32c::crc32c(covered))
}

/// Splits a v2 batch into its stored CRC and the CRC-covered bytes.
fn crc_parts(batch: &[u8]) -> Option<(u32, &[u8])> {
    let end = declared_end(batch)?;
    if batch.get(MAGIC_OFFSET).copied()? != 2 {
        return None;
    }
    let stored = read_u32(batch, CRC_OFFSET)?;
    let covered = batch.get(ATTRIBUTES_OFFSET..end)?;
    Some((stored, covered))
}

/// End of the batch as declared by batchLength, if it is at least a full v2
/// header and fits inside `batch`.
pub(crate) fn declared_end(batch: &[u8]) -> Option<usize> {
    let len = read_i32(batch, 8)?;
    let len = usize::try_from(len).ok()?;
    let end = len.checked_add(LOG_OVERHEAD)?;
    if end < RECORD_BATCH_OVERHEAD || end > batch.len() {
        return None;
    }
    Some(end)
}

/// Reads a big-endian i64 at `at`, if the bytes are there.
#[inline]
pub(crate) fn read_i64(buf: &[u8], at: usize) -> Option<i64> {
    let b: [u8; 8] = buf.get(at..at.checked_add(8)?)?.try_into().ok()?;
    Some(i64::from_be_bytes(b))
}

/// Reads a big-endian i32 at `at`, if the bytes are there.
#[inline]
pub(crate) fn read_i32(buf: &[u8], at: usize) -> Option<i32> {
    let b: [u8; 4] = buf.get(at..at.checked_add(4)?)?.try_into().ok()?;
    Some(i32::from_be_bytes(b))
}

/// Reads a big-endian u32 at `at`, if the bytes are there.
#[inline]
pub(crate) fn read_u32(buf: &[u8], at: usize) -> Option<u32> {
    let b: [u8; 4] = buf.get(at..at.checked_add(4)?)?.try_into().ok()?;
    Some(u32::from_be_bytes(b))
}
