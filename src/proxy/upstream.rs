//! Connecting to upstream brokers.
//!
//! TCP with a connect timeout, then TLS when the listener's `upstream_tls`
//! asks for it: what comes back is a [`Transport`] the relay is generic over.

use std::time::Duration;

use tokio::net::TcpStream;

use crate::kafka_client::TransportConnector;
use crate::tls::{HandshakeError, Transport};

/// Why an upstream connection failed; `kind()` labels the metric.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// Refused, unreachable, DNS failure.
    #[error("cannot connect to upstream {addr}: {source}")]
    Io {
        /// `host:port` tried.
        addr: String,
        /// The error.
        source: std::io::Error,
    },
    /// No answer within the configured timeout.
    #[error("connecting to upstream {addr} timed out after {timeout_ms} ms")]
    Timeout {
        /// `host:port` tried.
        addr: String,
        /// The timeout.
        timeout_ms: u64,
    },
    /// The node is not known (yet).
    #[error("upstream node {0} is unknown")]
    UnknownNode(i32),
    /// Connected, but the TLS handshake failed.
    #[error("TLS to upstream {addr}: {source}")]
    Tls {
        /// `host:port` tried.
        addr: String,
        /// Why.
        source: HandshakeError,
    },
}

impl ConnectError {
    /// Metric label.
    pub fn kind(&self) -> &'static str {
        match self {
            ConnectError::Io { .. } => "connect",
            ConnectError::Timeout { .. } => "connect_timeout",
            ConnectError::UnknownNode(_) => "unknown_node",
            ConnectError::Tls { .. } => "tls_handshake",
        }
    }
}

/// Connects to `host:port` with a timeout, with Nagle off (Kafka is
/// request/response; batching small frames only adds latency), then runs
/// the TLS handshake (its own timeout) when `connector` has TLS.
pub async fn connect(
    host: &str,
    port: u16,
    timeout: Duration,
    connector: &TransportConnector,
) -> Result<Transport, ConnectError> {
    let addr = format!("{host}:{port}");
    let stream = match tokio::time::timeout(timeout, TcpStream::connect((host, port))).await {
        Ok(Ok(s)) => s,
        Ok(Err(source)) => return Err(ConnectError::Io { addr, source }),
        Err(_) => {
            return Err(ConnectError::Timeout {
                addr,
                timeout_ms: timeout.as_millis() as u64,
            })
        }
    };
    let _ = stream.set_nodelay(true);
    match connector.tls() {
        None => Ok(Transport::Plain(stream)),
        Some(tls) => tls
            .connect(stream, host)
            .await
            .map_err(|source| ConnectError::Tls { addr, source }),
    }
}

/// Tries each bootstrap server in turn, starting at `start` (rotating the
/// start spreads connections), and returns the first that connects.
pub async fn connect_any(
    servers: &[(String, u16)],
    start: usize,
    timeout: Duration,
    connector: &TransportConnector,
) -> Result<Transport, ConnectError> {
    let mut last = None;
    for i in 0..servers.len() {
        let (host, port) = &servers[(start + i) % servers.len()];
        match connect(host, *port, timeout, connector).await {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or(ConnectError::UnknownNode(-1)))
}
