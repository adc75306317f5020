//! Routing and correlation: listeners, connections, upstream nodes.
//!
//! A [`listener::Listener`] owns a bootstrap port and one port per upstream
//! node ([`nodes`]); each accepted client connection is relayed to its
//! upstream by [`connection::relay`], which keeps the per-connection
//! correlation queue and passes the APIs the listener decodes through its
//! filter chain ([`crate::filter`]).

pub mod connection;
pub mod limits;
pub mod listener;
pub mod nodes;
pub mod refresh;
pub mod upstream;

#[cfg(test)]
mod stream_tests;
