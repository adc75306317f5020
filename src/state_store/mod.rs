//! The state store: mirrorguard's durable decisions in the compacted
//! `__mirror_state` topic of the real cluster (SPEC 2.2, 3).
//!
//! - [`schema`]: the binary key/value schemas of the records (PID collision
//!   salts, partition life-cycle states, producer-state snapshots) and their
//!   decoder/encoders.
//! - [`StateStore`]: a minimal Kafka client of its own (on the project's
//!   wire codec, not a client library) that creates the topic compacted with
//!   one partition if it is missing, appends with acks=all from an idempotent
//!   producer, and reads the topic back from any offset so that several
//!   mirrorguard instances converge on the same records.
//!
//! - [`sync`]: the adapter between the mirrors and the store (start-up load,
//!   the tail of records other instances write, snapshots, persisting salts,
//!   claims, life-cycle transitions and source topologies); it implements
//!   the mirror's and the life cycle's persistence ports.
//!
//! The client is split by concern: `client.rs` (the handle and its
//! configuration), `actor.rs` (the task owning the connection: bootstrap,
//! versions, topic set-up, producer id), `log.rs` (appends and reads),
//! `error.rs` ([`StateStoreError`]) and `proto.rs` (request and response
//! bodies); connections go through [`crate::kafka_client`].
//!
//! Records are opaque bytes to the client; callers encode them with
//! [`schema`] and resolve conflicts themselves ("for one key the record at
//! the lowest offset wins").

mod actor;
pub mod checks;
mod client;
mod error;
mod log;
mod proto;
pub mod schema;
pub mod sync;

pub use client::{
    Connector, StateClusterReport, StateStore, StateStoreConfig, StoredRecord, TcpConnector,
    DEFAULT_TOPIC,
};
pub use error::StateStoreError;
