//! Why the state sync could not read or write `__mirror_state`, and how
//! that reaches the persistence ports of the mirror and the life cycle.

use super::*;

/// Why the state sync could not read or write `__mirror_state`.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// The state cluster refused or lost a read or write.
    #[error(transparent)]
    Store(#[from] crate::state_store::StateStoreError),
    /// A record could not be encoded.
    #[error(transparent)]
    Schema(#[from] crate::state_store::schema::SchemaError),
    /// A source-topology record could not be encoded.
    #[error(transparent)]
    Wire(#[from] crate::wire::WireError),
    /// More chunks than a chunk count can say.
    #[error("too many snapshot chunks")]
    TooManyChunks,
    /// The destination topic a record is keyed by does not exist.
    #[error(
        "destination topic {0:?} does not exist on the destination cluster; its state cannot be \
         recorded"
    )]
    UnknownTopic(String),
    /// The destination topic a collision salt is keyed by does not exist yet.
    #[error(
        "destination topic {0:?} does not exist on the destination cluster yet; a collision salt \
         for it cannot be recorded"
    )]
    NoTopicForSalt(String),
    /// Reading `__mirror_state` or the destination's topics failed.
    #[error("{0}")]
    Read(anyhow::Error),
    /// The state sync is being dropped.
    #[error("state store is shutting down")]
    ShuttingDown,
}

impl From<SyncError> for PersistError {
    fn from(e: SyncError) -> Self {
        PersistError::new(e)
    }
}
