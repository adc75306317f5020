//! A `__mirror_state` stand-in for unit tests that need a mirror but not
//! what a state cluster keeps: nothing is written and every persist
//! succeeds at once. What differs between the tests (durable claims, a
//! shared state, which destination topic ids are known) is a field. Not
//! part of the product; `stream_check`'s `MemStore` applies salts and is
//! separate.

use super::{PendingSalt, SaltStore};
use crate::lifecycle::{Entry, TransitionStore};
use crate::producer_state::{Origin, PartitionKey};
use crate::PersistError;

type Done = crate::BoxFuture<'static, Result<(), PersistError>>;

/// A store that keeps nothing (see the module doc).
pub(crate) struct NoopStore {
    /// What [`SaltStore::durable`] says.
    pub durable: bool,
    /// What [`SaltStore::shared`] says.
    pub shared: bool,
    /// The destination topic ids known.
    pub topic_id: fn(&str) -> Option<[u8; 16]>,
}

impl NoopStore {
    /// Not durable, not shared, no topic id known.
    pub fn new() -> Self {
        Self {
            durable: false,
            shared: false,
            topic_id: |_| None,
        }
    }
}

impl SaltStore for NoopStore {
    fn durable(&self) -> bool {
        self.durable
    }
    fn persist_claims(&self, _claims: Vec<(PartitionKey, Vec<(i64, Origin)>)>) -> Done {
        Box::pin(async { Ok(()) })
    }
    fn topic_id(&self, topic: &str) -> Option<[u8; 16]> {
        (self.topic_id)(topic)
    }
    fn refresh_topic_ids(&self) -> Done {
        Box::pin(async { Ok(()) })
    }
    fn persist(&self, _salts: Vec<PendingSalt>) -> Done {
        Box::pin(async { Ok(()) })
    }
    fn shared(&self) -> bool {
        self.shared
    }
}

impl TransitionStore for NoopStore {
    fn persist_many(
        &self,
        entries: Vec<Entry>,
    ) -> crate::BoxFuture<'static, Result<Vec<[u8; 16]>, crate::PersistError>> {
        Box::pin(async move { Ok(vec![[0; 16]; entries.len()]) })
    }
}
