//! In-place producerId rewrite of v2 batches, O(1) in the batch size.
//!
//! Only bytes 43..51 (producerId) and 17..21 (CRC) ever change, and the
//! record bytes are never read. CRC-32C is linear: for two messages of equal
//! length, `crc(a) ^ crc(b)` depends only on `a ^ b`, which here is 8 bytes
//! followed by `end - 51` zeros, and costs O(log n) multiplications to
//! compute (a handful for any real batch size). The new stored CRC is the old
//! one XOR that delta. So a batch that arrived valid leaves valid, and a
//! batch that arrived corrupt leaves corrupt with exactly the same error
//! (`stored ^ computed` unchanged), without a byte of it being read: it is
//! never laundered into a valid one that a downstream broker would accept.
//!
//! Whether a batch is corrupt is therefore not known from a rewrite. Callers
//! that must know (before a batch creates durable state) verify it first:
//! [`rewrite_producer_id_verified`] does both.

use super::batch::{next_entry, BatchError, BatchHeader, Entry};
use super::{
    declared_end, read_i64, read_u32, verify_crc, CRC_OFFSET, MAGIC_OFFSET, PRODUCER_ID_OFFSET,
};

/// What [`rewrite_producer_id_checked`] (or the verifying variant) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RewriteOutcome {
    /// The batch already carries the requested PID: not a byte touched, no
    /// CRC work.
    Unchanged,
    /// PID replaced and the stored CRC shifted by the change's CRC delta:
    /// valid stays valid, corrupt stays corrupt. From
    /// [`rewrite_producer_id_verified`]: the original CRC was valid.
    Rewritten,
    /// Only from [`rewrite_producer_id_verified`]: PID replaced, but the
    /// original CRC was already invalid, and so is the rewritten one (by the
    /// same error).
    RewrittenCrcWasInvalid,
    /// Not a complete magic-2 batch (too short, truncated, other magic):
    /// left untouched.
    NotV2Batch,
}

/// Replaces the producerId of one v2 batch in place and fixes its CRC.
///
/// Returns whether anything changed. `batch` starts at the batch's
/// baseOffset; bytes past the declared batch end are ignored.
pub fn rewrite_producer_id(batch: &mut [u8], new_pid: i64) -> bool {
    rewrite_producer_id_checked(batch, new_pid) == RewriteOutcome::Rewritten
}

/// [`rewrite_producer_id`] with the outcome: O(1) in the batch size (only
/// the header is read), never [`RewriteOutcome::RewrittenCrcWasInvalid`].
pub fn rewrite_producer_id_checked(batch: &mut [u8], new_pid: i64) -> RewriteOutcome {
    let Some(end) = declared_end(batch) else {
        return RewriteOutcome::NotV2Batch;
    };
    rewrite_producer_id_in_head(batch, end, new_pid)
}

/// [`rewrite_producer_id_checked`] on the head of a batch only: `head` holds
/// at least the 61-byte header, `end` is the batch's total length
/// (`12 + batchLength`, at least 61) as the caller checked it against the
/// records the batch sits in. The rest of the batch need not have arrived:
/// the CRC delta depends only on the changed bytes and how many bytes follow
/// them, which is how a streamed batch is patched before its payload is read.
pub fn rewrite_producer_id_in_head(head: &mut [u8], end: usize, new_pid: i64) -> RewriteOutcome {
    let batch = head;
    if end < super::RECORD_BATCH_OVERHEAD || batch.len() < super::RECORD_BATCH_OVERHEAD {
        return RewriteOutcome::NotV2Batch;
    }
    if batch.get(MAGIC_OFFSET).copied() != Some(2) {
        return RewriteOutcome::NotV2Batch;
    }
    let (Some(old_pid), Some(stored)) = (
        read_i64(batch, PRODUCER_ID_OFFSET),
        read_u32(batch, CRC_OFFSET),
    ) else {
        return RewriteOutcome::NotV2Batch;
    };
    if old_pid == new_pid {
        return RewriteOutcome::Unchanged;
    }
    let Some(pid_field) = batch.get_mut(PRODUCER_ID_OFFSET..PRODUCER_ID_OFFSET + 8) else {
        return RewriteOutcome::NotV2Batch;
    };
    pid_field.copy_from_slice(&new_pid.to_be_bytes());
    // end >= 61 (declared_end), so this cannot underflow.
    let zeros_after = end - (PRODUCER_ID_OFFSET + 8);
    let delta = crc_delta(&(old_pid ^ new_pid).to_be_bytes(), zeros_after);
    if let Some(f) = batch.get_mut(CRC_OFFSET..CRC_OFFSET + 4) {
        f.copy_from_slice(&(stored ^ delta).to_be_bytes());
    }
    RewriteOutcome::Rewritten
}

/// [`rewrite_producer_id_checked`] after a full CRC-32C pass over the batch
/// (O(n)): tells a batch that arrived corrupt
/// ([`RewriteOutcome::RewrittenCrcWasInvalid`]) from a valid one. For the
/// few batches whose validity matters (sampled checks, tools), not the hot
/// path.
pub fn rewrite_producer_id_verified(batch: &mut [u8], new_pid: i64) -> RewriteOutcome {
    let valid = verify_crc(batch);
    match rewrite_producer_id_checked(batch, new_pid) {
        RewriteOutcome::Rewritten if !valid => RewriteOutcome::RewrittenCrcWasInvalid,
        other => other,
    }
}

/// Summary of a [`rewrite_all`] pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RewriteStats {
    /// Complete v2 batches seen.
    pub batches: usize,
    /// Batches whose PID was rewritten.
    pub rewritten: usize,
    /// Rewritten batches whose original CRC was already invalid (counted by
    /// [`rewrite_all_verified`] only: [`rewrite_all`] never reads records).
    pub crc_was_invalid: usize,
    /// Legacy v0/v1 entries passed through.
    pub legacy: usize,
    /// Whether the blob ended in a truncated entry (left untouched).
    pub truncated_tail: bool,
}

/// Walks a mutable records blob and rewrites each v2 batch's producerId to
/// whatever `decide` returns (`None` or the same PID leaves it untouched),
/// O(1) per batch (see the module doc).
///
/// Stops at the first corrupt entry and returns its error; batches before it
/// have been processed, bytes from it on are untouched.
pub fn rewrite_all(
    buf: &mut [u8],
    decide: impl FnMut(&BatchHeader) -> Option<i64>,
) -> Result<RewriteStats, BatchError> {
    rewrite_all_with(buf, false, decide)
}

/// [`rewrite_all`] that also verifies the CRC of every batch it rewrites
/// (one full pass each) and counts those that arrived corrupt in
/// [`RewriteStats::crc_was_invalid`]. The bytes written are the same.
pub fn rewrite_all_verified(
    buf: &mut [u8],
    decide: impl FnMut(&BatchHeader) -> Option<i64>,
) -> Result<RewriteStats, BatchError> {
    rewrite_all_with(buf, true, decide)
}

fn rewrite_all_with(
    buf: &mut [u8],
    verify: bool,
    mut decide: impl FnMut(&BatchHeader) -> Option<i64>,
) -> Result<RewriteStats, BatchError> {
    let mut stats = RewriteStats::default();
    let mut pos = 0;
    while let Some(entry) = next_entry(buf, pos) {
        match entry? {
            Entry::V2(h) => {
                stats.batches += 1;
                pos = h.range.end;
                if let Some(pid) = decide(&h) {
                    if let Some(batch) = buf.get_mut(h.range.clone()) {
                        let outcome = if verify {
                            rewrite_producer_id_verified(batch, pid)
                        } else {
                            rewrite_producer_id_checked(batch, pid)
                        };
                        match outcome {
                            RewriteOutcome::Rewritten => stats.rewritten += 1,
                            RewriteOutcome::RewrittenCrcWasInvalid => {
                                stats.rewritten += 1;
                                stats.crc_was_invalid += 1;
                            }
                            RewriteOutcome::Unchanged | RewriteOutcome::NotV2Batch => {}
                        }
                    }
                }
            }
            Entry::Legacy { range, .. } => {
                stats.legacy += 1;
                pos = range.end;
            }
            Entry::Truncated { .. } => {
                stats.truncated_tail = true;
                break;
            }
        }
    }
    Ok(stats)
}

/// Reflected CRC-32C polynomial.
const POLY: u32 = 0x82F6_3B78;

/// Multiplies two polynomials modulo POLY in the reflected representation
/// (bit 31 is x^0), as zlib's `multmodp`.
const fn multmodp(a: u32, mut b: u32) -> u32 {
    if a == 0 {
        return 0;
    }
    let mut m: u32 = 1 << 31;
    let mut p: u32 = 0;
    loop {
        if a & m != 0 {
            p ^= b;
            if a & (m - 1) == 0 {
                break;
            }
        }
        m >>= 1;
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
    }
    p
}

/// `X2N[k]` = x^(2^k) mod POLY.
const X2N: [u32; 64] = {
    let mut t = [0u32; 64];
    let mut p: u32 = 1 << 30; // x^1
    let mut k = 0;
    while k < 64 {
        t[k] = p;
        p = multmodp(p, p);
        k += 1;
    }
    t
};

/// `OPS[k][d]` = x^(8 * d * 16^k) mod POLY: the operator appending
/// `d * 16^k` zero bytes, so any byte count takes one multiplication per
/// non-zero hex digit (at most 4 for a 64 KiB batch, 6 for 16 MiB).
const OPS: [[u32; 16]; 16] = {
    let mut t = [[0u32; 16]; 16];
    let mut k = 0;
    while k < 16 {
        t[k][0] = 1 << 31; // x^0
        let mut d = 1;
        while d < 16 {
            t[k][d] = multmodp(t[k][d - 1], X2N[3 + 4 * k]);
            d += 1;
        }
        k += 1;
    }
    t
};

/// The reflected CRC-32C byte table: `T8[i]` is the byte `i` (at the
/// highest powers) times x^8 mod POLY, so `state * x^8` is one lookup.
const T8: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = (c >> 1) ^ (POLY & (c & 1).wrapping_neg());
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// `a * b mod POLY`, a byte of `a` at a time (Horner over x^8 with the byte
/// table); same result as [`multmodp`], several times faster at run time.
#[inline]
fn mul_fast(a: u32, b: u32) -> u32 {
    // bx[j] = b * x^j for j in 0..8.
    let mut bx = [0u32; 8];
    let mut v = b;
    for slot in bx.iter_mut() {
        *slot = v;
        v = (v >> 1) ^ (POLY & (v & 1).wrapping_neg());
    }
    // Byte c of `a` (c = 0 holds x^0..x^7) sits at bit shift 24 - 8c, and
    // within it bit 7 - j is the coefficient of x^(8c + j).
    let chunk = |c: u32| {
        let byte = (a >> (24 - 8 * c)) & 0xff;
        let mut acc = 0u32;
        for (j, bxj) in bx.iter().enumerate() {
            acc ^= bxj & ((byte >> (7 - j)) & 1).wrapping_neg();
        }
        acc
    };
    let mut p = chunk(3);
    for c in [2u32, 1, 0] {
        p = (p >> 8) ^ T8[(p & 0xff) as usize] ^ chunk(c);
    }
    p
}

/// Appends `bytes` zero bytes to a raw (zero-init, no xorout) CRC state.
fn shift_zeros(mut state: u32, bytes: usize) -> u32 {
    let mut n = bytes as u64;
    for ops in OPS.iter() {
        if n == 0 {
            break;
        }
        let d = (n & 15) as usize;
        if d != 0 {
            state = mul_fast(ops.get(d).copied().unwrap_or(1 << 31), state);
        }
        n >>= 4;
    }
    state
}

/// `crc(a) ^ crc(b)` for equal-length messages whose XOR is `diff` followed
/// by `zeros_after` zero bytes (leading zeros contribute nothing).
pub(crate) fn crc_delta(diff: &[u8], zeros_after: usize) -> u32 {
    // Raw CRC of `diff` from a zero state: crc32c_append inverts on entry and
    // exit, so feed it the inverted zero state and invert the result.
    let raw = !crc32c::crc32c_append(!0, diff);
    shift_zeros(raw, zeros_after)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_multiply_matches_bit_serial() {
        let mut x: u32 = 0x1234_5678;
        for _ in 0..10_000 {
            // xorshift32
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let y = x.rotate_left(11) ^ 0x9e37_79b9;
            assert_eq!(mul_fast(x, y), multmodp(x, y), "{x:#x} * {y:#x}");
        }
        assert_eq!(mul_fast(0, 5), 0);
        assert_eq!(mul_fast(1 << 31, 0xdead_beef), 0xdead_beef);
    }

    #[test]
    fn delta_matches_direct_computation() {
        for len in [0usize, 1, 7, 8, 100, 4096, 100_000] {
            let mut a = vec![0x5au8; 30 + len];
            let b0 = crc32c::crc32c(&a);
            let diff = [1u8, 2, 3, 4, 5, 6, 7, 8];
            for (x, d) in a.iter_mut().skip(22).zip(diff) {
                *x ^= d;
            }
            let b1 = crc32c::crc32c(&a);
            assert_eq!(b0 ^ b1, crc_delta(&diff, len), "len {len}");
        }
    }
}
