//! Collision lookups and resolution over a partition's producer state
//! (SPEC 2.2): whether an origin's mapped PID is free, and, when it is held
//! by another origin, the salt that frees it. Kept apart from [`super::salt`]
//! (the salt table and the candidate sequence) so the partition state can
//! own a salt table without the two modules importing each other.

use super::partition::PartitionState;
use super::salt::{collision_seed, salt_candidates, CollisionError, SaltChoice};
use super::Origin;

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

/// Picks the salt for `origin`, whose current mapped PID is held by another
/// origin in `state`: the first candidate (at most `max_candidates`) whose
/// mapped PID is free (not in producer state, not claimed by a salt record)
/// or already the origin's own. Deterministic in the collision key and the
/// partition's state. The caller must persist the choice and apply it
/// ([`super::SaltTable::apply`]) before any batch uses it.
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
