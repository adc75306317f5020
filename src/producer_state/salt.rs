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

use super::hash::MixState;
use super::partition::{hash_table_bytes, PartitionState};
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

/// Result of [`PartitionState::lookup_mapping`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum MappingLookup {
    /// Use `mapped_pid`.
    Ready {
        /// The mapped PID.
        mapped_pid: i64,
        /// The salt it was computed with (0 unless a collision was resolved).
        salt: i64,
    },
    /// `mapped_pid` is held by `holder`: resolve (region mode) or report
    /// (preserve mode).
    Collision {
        /// The mapped PID that collides.
        mapped_pid: i64,
        /// The salt it was computed with.
        salt: i64,
        /// The origin holding it.
        holder: Origin,
    },
}

impl PartitionState {
    /// The mapped PID `origin` should use in this partition, with its salt,
    /// or the collision that prevents it. `map(salt)` computes the mapped PID
    /// of the origin's PID for a salt (`crate::pid` with the mirror's fold
    /// and layout). O(1), no allocation.
    #[inline]
    pub fn lookup_mapping(&self, origin: &Origin, map: &dyn Fn(i64) -> i64) -> MappingLookup {
        let salt = self.salts().salt_for(origin).unwrap_or(0);
        let mapped_pid = map(salt);
        match self.holder_of(mapped_pid) {
            Some(holder) if holder != *origin => MappingLookup::Collision {
                mapped_pid,
                salt,
                holder,
            },
            _ => MappingLookup::Ready { mapped_pid, salt },
        }
    }
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

/// Picks the salt for `origin`, whose current mapped PID is held by another
/// origin in `state`: the first candidate (at most `max_candidates`) whose
/// mapped PID is free (not in producer state, not claimed by a salt record)
/// or already the origin's own. Deterministic in the collision key and the
/// partition's state. The caller must persist the choice and apply it
/// ([`SaltTable::apply`]) before any batch uses it.
pub fn resolve_collision(
    state: &PartitionState,
    origin: &Origin,
    map: &dyn Fn(i64) -> i64,
    max_candidates: usize,
) -> Result<SaltChoice, CollisionError> {
    resolve_collision_for_topic(state, &state.key().topic_id, origin, map, max_candidates)
}

/// [`resolve_collision`] with the destination topic id of the collision key
/// given explicitly (for partitions keyed by topic name, whose id is known
/// elsewhere): the salt sequence is seeded by (TopicId, Partition,
/// SourceClusterId, OriginalPid) as SPEC 2.2 requires.
pub fn resolve_collision_for_topic(
    state: &PartitionState,
    topic_id: &[u8; 16],
    origin: &Origin,
    map: &dyn Fn(i64) -> i64,
    max_candidates: usize,
) -> Result<SaltChoice, CollisionError> {
    let holder = match state.lookup_mapping(origin, map) {
        MappingLookup::Collision { holder, .. } => holder,
        MappingLookup::Ready { mapped_pid, .. } => {
            return Err(CollisionError::NotColliding {
                origin: *origin,
                mapped_pid,
            })
        }
    };
    let key = state.key();
    let seed = collision_seed(
        topic_id,
        key.partition,
        &origin.source_cluster,
        origin.original_pid,
    );
    for (i, salt) in salt_candidates(seed).take(max_candidates).enumerate() {
        let mapped_pid = map(salt);
        if mapped_pid == -1 {
            continue;
        }
        match state.holder_of(mapped_pid) {
            Some(other) if other != *origin => continue,
            _ => {
                return Ok(SaltChoice {
                    salt,
                    mapped_pid,
                    holder,
                    attempts: i + 1,
                })
            }
        }
    }
    Err(CollisionError::Exhausted {
        origin: *origin,
        tried: max_candidates,
    })
}
