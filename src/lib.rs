//! mirrorguard: a Kafka-protocol sidecar proxy that makes cross-cluster
//! mirroring safe for idempotent and transactional producers.
//!
//! The modules follow the data path:
//! frame codec ([`codec`]) → routing/correlation ([`proxy`]) → per-API
//! handlers ([`handlers`], built on the bounds-checked primitives of [`wire`])
//! → record-batch engine ([`records`], [`pid`]) → producer state
//! ([`producer_state`]) → admin/metrics ([`admin`], [`metrics`]).
//! [`dump`] is the offline log-segment reader behind `mirrorguard dump`.

pub mod admin;
pub mod admin_api;
pub mod codec;
pub mod config;
pub mod ctl;
pub mod dump;
pub mod guard;
pub mod handlers;
pub mod lifecycle;
pub mod metrics;
pub mod mirror;
pub mod pid;
pub mod producer_state;
pub mod proxy;
pub mod records;
pub mod run;
pub mod state_store;
pub mod wire;
