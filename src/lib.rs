//! mirrorguard: a Kafka-protocol sidecar proxy that makes cross-cluster
//! mirroring safe for idempotent and transactional producers.
//!
//! The modules follow the data path:
//!
//! - frame codec ([`codec`]) → routing and correlation ([`proxy`]: listeners,
//!   port-per-node registry, the per-connection relay) → the listener's
//!   filter chain ([`filter`]: one filter per concern — address rewrite,
//!   ApiVersions clamp, mirror fetch rewrite, seal, produce guard, offline
//!   answers);
//! - per-API handlers ([`handlers`], on the bounds-checked primitives of
//!   [`wire`]);
//! - the mirror fetch path ([`mirror`]: an I/O-free planner and batch
//!   rewriting, with adapters for what they ask to be persisted or replayed)
//!   on the record-batch engine ([`records`], [`pid`]) and the shadow
//!   producer state ([`producer_state`]);
//! - the partition life cycle and seal ([`lifecycle`]) and the durable state
//!   in `__mirror_state` ([`state_store`]; [`state_store::sync`] is the
//!   adapter that implements the persistence ports of the mirror and the
//!   life cycle: [`mirror::SaltStore`], [`lifecycle::TransitionStore`], whose
//!   futures are [`BoxFuture`]s failing with a [`PersistError`]);
//! - the disaster path: [`mirror::offline`] (answers and topology when the
//!   source is gone) and [`abort_open`] (closing open mirrored transactions on
//!   the destination when its fetcher is gone);
//! - outbound requests of our own (state store, refresh, replay, abort):
//!   [`kafka_client`];
//! - transport security: [`tls`] (rustls configurations from files, reloads,
//!   handshake errors; the [`tls::Transport`] every connection is);
//! - operations: [`admin`], [`admin_api`], [`metrics`], [`ctl`];
//! - secrets (file permissions, the admin token, passwords taken out of the
//!   environment, zeroized buffers): [`secrets`].
//!
//! [`config`] reads `proxy.toml`, [`run`] assembles the process, and [`dump`]
//! is the offline log-segment reader behind `mirrorguard dump`.
//! `docs/architecture.md` has the same map with where to change what.

/// A boxed, sendable future: what a blocked response waits for, what a
/// store persists.
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// Why a persistence port ([`mirror::SaltStore`],
/// [`lifecycle::TransitionStore`]) did not persist or read something: the
/// adapter's own error, boxed so the core names no adapter type. Its text is
/// the adapter's.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct PersistError(Box<dyn std::error::Error + Send + Sync>);

impl PersistError {
    /// Wraps an adapter's error.
    pub fn new(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self(Box::new(e))
    }
}

impl From<String> for PersistError {
    fn from(message: String) -> Self {
        Self(message.into())
    }
}

impl From<&str> for PersistError {
    fn from(message: &str) -> Self {
        Self(message.into())
    }
}

pub mod abort_open;
pub mod admin;
pub mod admin_api;
pub mod codec;
pub mod config;
pub mod ctl;
pub mod dump;
pub mod filter;
pub mod handlers;
pub mod kafka_client;
pub mod lifecycle;
pub mod metrics;
pub mod mirror;
pub mod pid;
pub mod producer_state;
pub mod proxy;
pub mod records;
pub mod run;
pub mod sasl;
pub mod secrets;
pub mod state_store;
pub mod tls;
pub mod wire;
