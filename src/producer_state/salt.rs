//! Collision detection and salt choice (SPEC 2.2).
//!
//! A collision is a batch whose mapped PID (with salt 0, or the origin's
//! current salt) is held in this partition by a *different* origin. The
//! newcomer then gets a salt from a deterministic candidate sequence seeded
//! by the collision key `(TopicId, Partition, SourceClusterId, OriginalPid)`:
//! the first candidate whose mapped PID is free in the partition wins.
//! Instances that see the same partition state therefore pick the same salt
//! without talking to each other; when they do not, the salt record at the
//! lowest `__mirror_state` offset wins ([`SaltTable::apply`]).
//!
//! The seed and candidate functions are part of the durable contract between
//! mirrorguard versions (a different sequence would remap PIDs after an
//! upgrade), so they are spelled out here and pinned by a golden test:
//!
//! * seed = FNV-1a 64 over `topic_id (16 bytes) ‖ partition (i32 BE) ‖
//!   source cluster id (16 bytes) ‖ original pid (i64 BE)`;
//! * stream = splitmix64 from that seed;
//! * candidate = output & 0x7FFF_FFFF (fits both layouts' region width),
//!   zero skipped.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::hash::{hash_table_bytes, MixState};
use super::{ClusterId, Origin};

/// Default bound on candidates tried before giving up. Each candidate is
/// free unless the partition is astronomically full, so this is generous.
pub const DEFAULT_MAX_SALT_CANDIDATES: usize = 64;

/// A resolved collision: the salt an origin uses in one partition.
///
/// Mirrors the `MirrorPidCollisionKey`/`Value` record of `__mirror_state`
/// (the partition is implied by the table holding it) plus the record's
/// offset, which decides between disagreeing records.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct SaltRecord {
    /// Source cluster and original PID that are remapped.
    pub origin: Origin,
    /// The salt added to the cluster fold.
    pub salt: i64,
    /// The mapped PID this salt produces (computed by the caller with the
    /// mirror's layout), so that "claimed by a salt record" is an O(1) check.
    pub mapped_pid: i64,
    /// The cluster that already held the slot.
    pub colliding_cluster: ClusterId,
    /// Wall-clock time of the resolution.
    pub timestamp_ms: i64,
    /// Offset of the record in `__mirror_state`; lowest wins.
    pub record_offset: i64,
}

/// What [`SaltTable::apply`] did.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum SaltApply {
    /// First record for this origin.
    Inserted,
    /// The record is the one already applied (same offset and salt).
    Unchanged,
    /// The new record has a lower offset and replaced `previous`; batches
    /// must use the new salt from now on.
    Replaced {
        /// The record that lost.
        previous: SaltRecord,
    },
    /// An existing record at a lower (or equal) offset wins; the new one is
    /// ignored.
    Kept {
        /// The record that stays.
        winner: SaltRecord,
    },
}

/// Per-partition salts: origin → salt, and mapped PID → claiming origin.
#[derive(Clone, Debug, Default)]
pub struct SaltTable {
    by_origin: HashMap<Origin, SaltRecord, MixState>,
    claims: HashMap<i64, Origin, MixState>,
}

impl SaltTable {
    /// The salt of `origin` in this partition, if one was resolved.
    /// O(1), no allocation; free when the partition has no salts (the
    /// normal case).
    #[inline]
    pub fn salt_for(&self, origin: &Origin) -> Option<i64> {
        if self.by_origin.is_empty() {
            return None;
        }
        self.by_origin.get(origin).map(|r| r.salt)
    }

    /// The full record of `origin`.
    pub fn record_for(&self, origin: &Origin) -> Option<&SaltRecord> {
        self.by_origin.get(origin)
    }

    /// The origin whose salt record maps onto `mapped_pid`.
    #[inline]
    pub fn claimant_of(&self, mapped_pid: i64) -> Option<Origin> {
        if self.claims.is_empty() {
            return None;
        }
        self.claims.get(&mapped_pid).copied()
    }

    /// Applies a salt record (ours after its acknowledgement, or one read
    /// from `__mirror_state`). For one origin the record at the lowest
    /// offset wins, so every instance converges on the same salt whatever
    /// order it reads the records in.
    pub fn apply(&mut self, record: SaltRecord) -> SaltApply {
        let outcome = match self.by_origin.get(&record.origin) {
            None => SaltApply::Inserted,
            Some(existing)
                if existing.record_offset == record.record_offset
                    && existing.salt == record.salt =>
            {
                return SaltApply::Unchanged;
            }
            Some(existing) if existing.record_offset <= record.record_offset => {
                return SaltApply::Kept { winner: *existing };
            }
            Some(existing) => SaltApply::Replaced {
                previous: *existing,
            },
        };
        if let SaltApply::Replaced { previous } = outcome {
            if self.claims.get(&previous.mapped_pid) == Some(&previous.origin) {
                self.claims.remove(&previous.mapped_pid);
            }
        }
        self.by_origin.insert(record.origin, record);
        // First claim on a mapped PID stays: two origins salted onto the
        // same PID would be a bug upstream, and keeping the first makes the
        // answer independent of later reads.
        self.claims
            .entry(record.mapped_pid)
            .or_insert(record.origin);
        outcome
    }

    /// All records (arbitrary order), e.g. for `GET /v1/collisions`.
    pub fn records(&self) -> impl Iterator<Item = SaltRecord> + '_ {
        self.by_origin.values().copied()
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.by_origin.len()
    }

    /// True when no salt was resolved in this partition.
    pub fn is_empty(&self) -> bool {
        self.by_origin.is_empty()
    }

    /// Estimated heap bytes.
    pub fn memory_bytes(&self) -> usize {
        hash_table_bytes::<(Origin, SaltRecord)>(self.by_origin.capacity())
            + hash_table_bytes::<(i64, Origin)>(self.claims.capacity())
    }
}

/// A salt chosen for a collision, to be persisted before use.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct SaltChoice {
    /// The chosen salt (non-zero).
    pub salt: i64,
    /// The mapped PID it produces (free in the partition).
    pub mapped_pid: i64,
    /// The origin that held the colliding slot.
    pub holder: Origin,
    /// 1-based position of the salt in the candidate sequence.
    pub attempts: usize,
}

impl SaltChoice {
    /// The record to persist; `record_offset` is the offset the state
    /// cluster acknowledged.
    pub fn to_record(&self, origin: Origin, timestamp_ms: i64, record_offset: i64) -> SaltRecord {
        SaltRecord {
            origin,
            salt: self.salt,
            mapped_pid: self.mapped_pid,
            colliding_cluster: self.holder.source_cluster,
            timestamp_ms,
            record_offset,
        }
    }
}

/// Why no salt was chosen.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
pub enum CollisionError {
    /// The origin's current mapped PID is free or its own: nothing to do.
    #[error("origin {origin} does not collide (mapped pid {mapped_pid} is free or its own)")]
    NotColliding {
        /// The origin.
        origin: Origin,
        /// Its current mapped PID.
        mapped_pid: i64,
    },
    /// Every candidate was occupied (or the mapping ignores the salt, as in
    /// `preserve` mode).
    #[error("no free salt for origin {origin} after {tried} candidates")]
    Exhausted {
        /// The origin.
        origin: Origin,
        /// Candidates tried.
        tried: usize,
    },
}

/// FNV-1a 64 over the collision key (see the module doc).
pub fn collision_seed(
    topic_id: &[u8; 16],
    partition: i32,
    source_cluster: &ClusterId,
    original_pid: i64,
) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = OFFSET;
    let parts: [&[u8]; 4] = [
        topic_id,
        &partition.to_be_bytes(),
        &source_cluster.0,
        &original_pid.to_be_bytes(),
    ];
    for part in parts {
        for b in part {
            h ^= u64::from(*b);
            h = h.wrapping_mul(PRIME);
        }
    }
    h
}

/// The endless, deterministic salt candidate sequence for a seed:
/// splitmix64 outputs masked to 31 bits, zeros skipped.
pub fn salt_candidates(seed: u64) -> impl Iterator<Item = i64> {
    let mut state = seed;
    std::iter::from_fn(move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        Some((z & 0x7fff_ffff) as i64)
    })
    .filter(|s| *s != 0)
}
