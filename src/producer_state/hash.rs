//! A fast hasher for the per-batch maps (mapped PID, origin).
//!
//! std's SipHash costs ~15-20 ns per i64 key, a large share of the per-batch
//! budget. A multiply-only hash (FxHash) is not enough either: mapped PIDs of
//! different regions differ only in bits 31..62, and a bare multiply leaves
//! the low bits (which pick the hashbrown bucket) depending only on the low
//! bits of the key, so all regions' PID 5 would share a bucket. We therefore
//! run the murmur3 64-bit finaliser over the accumulated words, keyed with a
//! per-map random seed (taken from std's `RandomState`) so bucket placement
//! is not predictable from the outside.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

/// Builds [`MixHasher`]s with a per-map random seed.
#[derive(Clone, Debug)]
pub(crate) struct MixState {
    seed: u64,
}

impl Default for MixState {
    fn default() -> Self {
        // RandomState is itself randomly keyed per process (and per instance);
        // hashing a constant through it yields a random 64-bit seed without
        // pulling in a RNG crate.
        let mut h = RandomState::new().build_hasher();
        h.write_u64(0x6d69_7272_6f72_6775);
        Self { seed: h.finish() }
    }
}

impl BuildHasher for MixState {
    type Hasher = MixHasher;

    fn build_hasher(&self) -> MixHasher {
        MixHasher { acc: self.seed }
    }
}

/// Accumulates words with a multiply-rotate step and finishes with fmix64.
pub(crate) struct MixHasher {
    acc: u64,
}

/// murmur3's 64-bit finaliser: full avalanche in a few cycles.
#[inline]
pub(crate) fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^= k >> 33;
    k
}

impl MixHasher {
    #[inline]
    fn mix(&mut self, word: u64) {
        self.acc = (self.acc ^ word)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .rotate_left(29);
    }
}

impl Hasher for MixHasher {
    #[inline]
    fn finish(&self) -> u64 {
        fmix64(self.acc)
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(chunk);
            self.mix(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.mix(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 56));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.mix(u64::from(i));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.mix(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.mix(i);
    }

    #[inline]
    fn write_i64(&mut self, i: i64) {
        self.mix(i as u64);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.mix(i as u64);
    }
}

/// Bytes of a hashbrown table with the given usable `capacity`.
pub(crate) fn hash_table_bytes<T>(capacity: usize) -> usize {
    if capacity == 0 {
        return 0;
    }
    // Inverse of hashbrown's bucket_mask_to_capacity: tables under 8
    // buckets use buckets - 1 slots, larger ones 7/8 of the buckets.
    let buckets = if capacity < 8 {
        (capacity + 1).next_power_of_two()
    } else {
        (capacity / 7 * 8).next_power_of_two()
    };
    buckets * (std::mem::size_of::<T>() + 1) + 16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_with_same_low_bits_spread_over_buckets() {
        let state = MixState::default();
        let mut low_bits = std::collections::HashSet::new();
        for region in 0..64i64 {
            let key = (1i64 << 62) | (region << 31) | 5;
            low_bits.insert(state.hash_one(key) & 63);
        }
        // 64 keys into 64 buckets: a bare multiply would give exactly 1.
        assert!(low_bits.len() > 20, "{}", low_bits.len());
    }
}
