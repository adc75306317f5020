//! Why the mirror fetch path refused or could not finish a response.
//!
//! [`MirrorError`] is what the planner and the batch rewriting return; its
//! text is what operators read in logs and in the `RewriteError` the filter
//! chain reports, so each variant spells out the fix where there is one.
//! Errors of the durable store come through the adapter's boxed
//! [`PersistError`] so the core names no adapter type.

use crate::pid::ClusterIdError;
use crate::producer_state::{CollisionError, Origin, PartitionKey};
use crate::wire::WireError;
pub use crate::PersistError;

/// Why a Fetch response (or a mirror's set-up) could not be handled.
#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    /// A source cluster id that is neither Kafka base64 nor UUID text.
    #[error(transparent)]
    ClusterId(#[from] ClusterIdError),
    /// The source's Metadata carried no cluster id and none is configured.
    #[error("mirror {mirror}: the source sent no cluster id; set source_cluster_id")]
    NoSourceId {
        /// The mirror.
        mirror: String,
    },
    /// The source's Metadata carried a cluster id that does not parse.
    #[error(
        "mirror {mirror}: the source's cluster id {text:?} is neither Kafka base64 nor UUID \
         text ({error}); set source_cluster_id explicitly (e.g. a UUIDv5 of the name)"
    )]
    BadSourceId {
        /// The mirror.
        mirror: String,
        /// The id as sent.
        text: String,
        /// Why it does not parse.
        error: ClusterIdError,
    },
    /// The source reported another cluster id than the one in use.
    #[error(
        "mirror {mirror}: source cluster id changed from {from} to {to}; refusing to remap PIDs \
         into a different region (set source_cluster_id explicitly if this is intended)"
    )]
    SourceChanged {
        /// The mirror.
        mirror: String,
        /// The id in use.
        from: String,
        /// The id reported now.
        to: String,
    },
    /// No source id yet: nothing can be mapped.
    #[error(
        "mirror {mirror}: the source cluster id is not known yet (not learned from the source's \
         Metadata and not configured)"
    )]
    SourceUnknown {
        /// The mirror.
        mirror: String,
    },
    /// A replay was asked for before the source was identified.
    #[error("source cluster not identified")]
    SourceNotIdentified,
    /// `producer_state.max_partitions` would be exceeded.
    #[error(
        "producer-state limit reached: {tracked} partitions tracked \
         (producer_state.max_partitions); refusing to track {key} rather than \
         mirror it without producer state"
    )]
    PartitionLimit {
        /// Partitions tracked.
        tracked: usize,
        /// The partition refused.
        key: PartitionKey,
    },
    /// `producer_state.max_producers` would be exceeded.
    #[error(
        "producer-state limit reached: {tracked} producers tracked, {new} new \
         (producer_state.max_producers = {max}); refusing to forward batches of \
         producers it cannot track"
    )]
    ProducerLimit {
        /// Producers tracked.
        tracked: u64,
        /// New producers in the response.
        new: u64,
        /// The limit.
        max: u64,
    },
    /// No salt could be chosen for a collision.
    #[error("cannot resolve PID collision: {0}")]
    Collision(#[from] CollisionError),
    /// A collision appeared between planning and rewriting (another
    /// connection): the response is dropped rather than sent unsalted.
    #[error(
        "PID collision appeared while forwarding {key}: origin {origin} would \
         leave as {mapped_pid}, which another origin holds; response dropped, \
         the next fetch persists a salt first"
    )]
    CollisionWhileForwarding {
        /// The partition.
        key: PartitionKey,
        /// The origin that would collide.
        origin: Origin,
        /// The mapped PID another origin holds.
        mapped_pid: i64,
    },
    /// The Fetch response does not parse.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// The durable store failed.
    #[error(transparent)]
    Persist(#[from] PersistError),
    /// A source range could not be replayed.
    #[error(transparent)]
    Replay(#[from] super::replay::ReplayError),
}
