//! The one outbound Kafka connection layer.
//!
//! Everything mirrorguard itself asks a Kafka cluster (the state store, the
//! upstream Metadata refresh, the topic-id lookup, the replay of the source
//! log, the abort of open transactions on the destination) goes through a
//! [`Connection`]: connect with a timeout to one address or the first
//! reachable one of a bootstrap list, send one request at a time with our
//! correlation id and client id, and read one response frame bounded by a
//! maximum frame size, within a request timeout. Responses are parsed by the
//! callers with the bounds-checked readers of [`crate::wire`]; the header
//! versions come from the protocol table in [`crate::codec::api`].
//!
//! The connection never retries on its own: what a retry means (same
//! sequence number, next bootstrap server, give up) belongs to the caller.
//! [`ClientError::is_retriable`] says whether one may help, from the Kafka
//! error table for broker error codes.
//!
//! The byte stream is abstracted by [`Connector`]; [`TransportConnector`]
//! is the one place a connected transport (TCP, then TLS when configured)
//! is returned, so an authentication step belongs right after it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

use crate::codec::api::response_header_version;
use crate::codec::api::{api_label, error_name, is_retriable, request_header_version};
use crate::codec::frame::FrameReader;
use crate::codec::header::{response_body_offset, response_correlation_id};
use crate::tls::{ClientTls, Transport};
use crate::wire::{WireError, WireResult, Writer};

/// Why an outbound request failed. [`ClientError::kind`] gives a stable
/// label; [`ClientError::code`] the Kafka error code where there is one.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    /// No server could be connected to.
    #[error("unreachable: {0}")]
    Unreachable(String),
    /// A request got no answer within its timeout.
    #[error("timed out: {0}")]
    Timeout(String),
    /// The connection failed mid-request (or the frame was refused).
    #[error("connection failed: {0}")]
    Io(String),
    /// A request could not be encoded or a response not parsed.
    #[error("malformed exchange: {0}")]
    Protocol(String),
    /// mirrorguard's own SASL authentication was refused or broke down.
    #[error("authentication failed: {0}")]
    Authentication(String),
    /// The broker answered with an error code.
    #[error("{} failed: {} ({code}){}", api_label(*api), error_name(*code), message.as_deref().map(|m| format!(": {m}")).unwrap_or_default())]
    Broker {
        /// API key of the request that failed.
        api: i16,
        /// Kafka error code.
        code: i16,
        /// Broker's message, if any.
        message: Option<String>,
    },
}

impl ClientError {
    /// A broker error code answered to `api`.
    pub fn broker(api: i16, code: i16, message: Option<String>) -> Self {
        Self::Broker { api, code, message }
    }

    /// A failed SASL exchange with `addr`: transport failures stay
    /// retriable, refusals are not.
    pub fn from_sasl(addr: &str, e: crate::sasl::SaslError) -> Self {
        match e {
            crate::sasl::SaslError::Io(m) => Self::Io(format!("authenticating to {addr}: {m}")),
            e => Self::Authentication(format!("{addr}: {e}")),
        }
    }

    /// Stable label for a metric's or a log's `kind`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Unreachable(_) => "unreachable",
            Self::Timeout(_) => "timeout",
            Self::Io(_) => "io",
            Self::Protocol(_) => "protocol",
            Self::Authentication(_) => "authentication",
            Self::Broker { .. } => "broker_error",
        }
    }

    /// The Kafka error code, for a broker error.
    pub fn code(&self) -> Option<i16> {
        match self {
            Self::Broker { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Whether a retry (after reconnecting) may succeed: transport failures
    /// always, broker errors as Kafka's error table says.
    pub fn is_retriable(&self) -> bool {
        match self {
            Self::Unreachable(_) | Self::Timeout(_) | Self::Io(_) => true,
            Self::Broker { code, .. } => is_retriable(*code),
            Self::Protocol(_) | Self::Authentication(_) => false,
        }
    }
}

impl From<WireError> for ClientError {
    fn from(e: WireError) -> Self {
        Self::Protocol(e.to_string())
    }
}

impl From<ClientError> for String {
    fn from(e: ClientError) -> Self {
        e.to_string()
    }
}

/// Opens byte streams to brokers: [`TcpConnector`], or
/// [`TransportConnector`] (TCP or TLS, as configured).
pub trait Connector: Send + Sync + 'static {
    /// The stream type.
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static;
    /// Connects to `addr` (`host:port`).
    fn connect(&self, addr: &str) -> impl Future<Output = std::io::Result<Self::Stream>> + Send;

    /// mirrorguard's own SASL credentials toward this cluster: when set,
    /// [`Connection::connect`] authenticates right after the transport is
    /// up ([`TransportConnector::with_sasl`] adds them to a transport).
    fn sasl(&self) -> Option<&crate::sasl::ClientCredentials> {
        None
    }
}

/// Plain TCP with `TCP_NODELAY` (requests are small and latency-bound).
#[derive(Debug, Clone, Copy, Default)]
pub struct TcpConnector;

impl Connector for TcpConnector {
    type Stream = TcpStream;
    async fn connect(&self, addr: &str) -> std::io::Result<TcpStream> {
        let s = TcpStream::connect(addr).await?;
        s.set_nodelay(true)?;
        Ok(s)
    }
}

/// TCP, then TLS when the cluster's section asks for it, then (with
/// [`TransportConnector::with_sasl`]) mirrorguard's own SASL
/// authentication. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct TransportConnector {
    tls: Option<Arc<ClientTls>>,
    sasl: crate::sasl::Identity,
}

impl TransportConnector {
    /// Plain TCP.
    pub fn plain() -> Self {
        Self::default()
    }

    /// TLS with `tls` (re-read on SIGHUP), or plain TCP without.
    pub fn new(tls: Option<Arc<ClientTls>>) -> Self {
        Self { tls, sasl: None }
    }

    /// The same transport, authenticating with `identity` (none: no SASL).
    pub fn with_sasl(mut self, identity: crate::sasl::Identity) -> Self {
        self.sasl = identity;
        self
    }

    /// From a `ClientTlsConfig` section (absent: plain TCP); `what` names
    /// the connection in logs.
    pub fn from_config(
        cfg: Option<&crate::config::ClientTlsConfig>,
        what: &str,
    ) -> Result<Self, crate::tls::TlsError> {
        Ok(Self {
            tls: cfg.map(|c| ClientTls::new(c, what)).transpose()?,
            sasl: None,
        })
    }

    /// The TLS side, if any.
    pub fn tls(&self) -> Option<&Arc<ClientTls>> {
        self.tls.as_ref()
    }
}

impl Connector for TransportConnector {
    type Stream = Transport;
    async fn connect(&self, addr: &str) -> std::io::Result<Transport> {
        let tcp = TcpConnector.connect(addr).await?;
        match &self.tls {
            None => Ok(Transport::Plain(tcp)),
            Some(tls) => {
                let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
                Ok(tls.connect(tcp, host).await?)
            }
        }
    }

    fn sasl(&self) -> Option<&crate::sasl::ClientCredentials> {
        self.sasl.as_deref()
    }
}

/// `host:port` for a host and port, with an IPv6 literal in brackets.
pub fn address(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Builds a whole request frame (size prefix included) with the request
/// header version the protocol table gives for `api_key` at `version`.
pub fn request_frame(
    api_key: i16,
    version: i16,
    correlation_id: i32,
    client_id: &str,
    body: impl FnOnce(&mut Writer<Vec<u8>>) -> WireResult<()>,
) -> WireResult<Vec<u8>> {
    let hv = request_header_version(api_key, version).ok_or(WireError::UnsupportedVersion {
        api: api_label(api_key),
        version,
    })?;
    let mut w = Writer::new(Vec::with_capacity(256));
    w.put_i32(0); // size, patched below
    w.put_i16(api_key);
    w.put_i16(version);
    w.put_i32(correlation_id);
    if hv >= 1 {
        w.put_string(client_id, "RequestHeader.client_id")?;
    }
    if hv >= 2 {
        w.put_uvarint(0);
    }
    body(&mut w)?;
    let mut buf = w.into_inner();
    let size = i32::try_from(buf.len() - 4).map_err(|_| WireError::Unencodable {
        field: "RequestHeader.size",
        reason: "request larger than i32::MAX",
    })?;
    buf[..4].copy_from_slice(&size.to_be_bytes());
    Ok(buf)
}

/// One response frame and where its body starts.
#[derive(Debug, Clone)]
pub struct Response {
    frame: Bytes,
    body_at: usize,
}

impl Response {
    /// The response body (after the response header).
    pub fn body(&self) -> &[u8] {
        self.frame.get(self.body_at..).unwrap_or_default()
    }

    /// The whole frame (size prefix excluded) and the body offset in it.
    pub fn into_parts(self) -> (Bytes, usize) {
        (self.frame, self.body_at)
    }
}

/// One connection to one broker, one request in flight at a time.
pub struct Connection<S> {
    frames: FrameReader<S>,
    addr: String,
    client_id: &'static str,
    correlation: i32,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Connection<S> {
    /// Connects to `addr` within `connect_timeout`; responses larger than
    /// `max_frame` are refused.
    pub async fn connect<C: Connector<Stream = S>>(
        connector: &C,
        addr: &str,
        connect_timeout: Duration,
        max_frame: usize,
        client_id: &'static str,
    ) -> Result<Self, ClientError> {
        let mut stream = match timeout(connect_timeout, connector.connect(addr)).await {
            Err(_) => {
                return Err(ClientError::Unreachable(format!(
                    "connecting to {addr} timed out after {connect_timeout:?}"
                )))
            }
            Ok(Err(e)) => {
                return Err(ClientError::Unreachable(format!(
                    "connecting to {addr}: {e}"
                )))
            }
            Ok(Ok(s)) => s,
        };
        // The one authentication step, on whatever transport the connector made.
        if let Some(creds) = connector.sasl() {
            crate::sasl::client::authenticate(&mut stream, creds, connect_timeout)
                .await
                .map_err(|e| ClientError::from_sasl(addr, e))?;
        }
        Ok(Self {
            frames: FrameReader::new(stream, max_frame),
            addr: addr.to_owned(),
            client_id,
            correlation: 0,
        })
    }

    /// Connects to the first of `servers` that accepts, in order; the error
    /// lists every failed attempt.
    pub async fn connect_first<C: Connector<Stream = S>>(
        connector: &C,
        servers: &[String],
        connect_timeout: Duration,
        max_frame: usize,
        client_id: &'static str,
    ) -> Result<Self, ClientError> {
        let mut errors = Vec::new();
        for addr in servers {
            match Self::connect(connector, addr, connect_timeout, max_frame, client_id).await {
                Ok(c) => return Ok(c),
                Err(e) => errors.push(e.to_string()),
            }
        }
        if errors.is_empty() {
            errors.push("no server to connect to".to_owned());
        }
        Err(ClientError::Unreachable(errors.join("; ")))
    }

    /// The address this connection went to.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Sends one request (header built from the protocol table, our
    /// correlation id and client id) and reads its response within `limit`.
    /// One request is in flight at a time, so the response must carry our
    /// correlation id. Any error leaves the connection unusable: drop it.
    pub async fn request(
        &mut self,
        api: i16,
        version: i16,
        limit: Duration,
        body: impl FnOnce(&mut Writer<Vec<u8>>) -> WireResult<()>,
    ) -> Result<Response, ClientError> {
        self.correlation = self.correlation.wrapping_add(1);
        let corr = self.correlation;
        let frame = request_frame(api, version, corr, self.client_id, body)?;
        let name = api_label(api);
        let addr = self.addr.clone();
        let io = async {
            self.frames.get_mut().write_all(&frame).await?;
            self.frames.get_mut().flush().await?;
            self.frames
                .next_frame_bytes()
                .await
                .map_err(|e| std::io::Error::other(e.to_string()))
        };
        let resp = match timeout(limit, io).await {
            Err(_) => {
                return Err(ClientError::Timeout(format!(
                    "{name} to {addr} got no answer within {limit:?}"
                )))
            }
            Ok(Err(e)) => return Err(ClientError::Io(format!("{name} to {addr}: {e}"))),
            Ok(Ok(None)) => {
                return Err(ClientError::Io(format!(
                    "{addr} closed the connection during {name}"
                )))
            }
            Ok(Ok(Some(f))) => f,
        };
        if response_correlation_id(&resp) != Some(corr) {
            return Err(ClientError::Protocol(format!(
                "{name} response from {addr} carries correlation id {:?}, expected {corr}",
                response_correlation_id(&resp)
            )));
        }
        let header = response_header_version(api, version).unwrap_or(0);
        let body_at = response_body_offset(&resp, header)
            .ok_or_else(|| ClientError::Protocol(format!("{name} response header truncated")))?;
        Ok(Response {
            frame: resp,
            body_at,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_follows_the_table() {
        // Metadata v4: header v1 (client id, no tags).
        let f = request_frame(3, 4, 1, "ab", |w| {
            w.put_i32(0);
            Ok(())
        })
        .unwrap();
        assert_eq!(
            f,
            [0, 0, 0, 16, 0, 3, 0, 4, 0, 0, 0, 1, 0, 2, b'a', b'b', 0, 0, 0, 0]
        );
        // Metadata v12: header v2 (tagged fields after the client id).
        let f = request_frame(3, 12, 2, "", |_| Ok(())).unwrap();
        assert_eq!(f, [0, 0, 0, 11, 0, 3, 0, 12, 0, 0, 0, 2, 0, 0, 0]);
    }

    #[test]
    fn errors_carry_codes_and_retriability() {
        let e = ClientError::broker(0, 6, None);
        assert_eq!(e.code(), Some(6));
        assert!(e.is_retriable());
        assert!(!ClientError::broker(0, 17, None).is_retriable());
        assert!(ClientError::Timeout("x".into()).is_retriable());
        assert_eq!(address("::1", 9), "[::1]:9");
        assert_eq!(address("h", 9), "h:9");
    }

    /// A peer that reads one request and answers with `answer(correlation)`
    /// (nothing when `None`), then keeps the socket open for a while.
    async fn peer(answer: fn(i32) -> Option<Vec<u8>>) -> String {
        use tokio::io::AsyncReadExt;
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut head = [0u8; 12];
            s.read_exact(&mut head).await.unwrap();
            let size = i32::from_be_bytes(head[..4].try_into().unwrap()) as usize;
            let mut rest = vec![0u8; size - 8];
            s.read_exact(&mut rest).await.unwrap();
            let corr = i32::from_be_bytes(head[8..12].try_into().unwrap());
            if let Some(a) = answer(corr) {
                s.write_all(&a).await.unwrap();
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
        });
        addr
    }

    async fn ask(addr: &str, limit: Duration) -> Result<Response, ClientError> {
        let mut c = Connection::connect(&TcpConnector, addr, Duration::from_secs(1), 64, "t")
            .await
            .unwrap();
        // Metadata v4: response header v0 (correlation id only).
        c.request(3, 4, limit, |w| {
            w.put_i32(0);
            Ok(())
        })
        .await
    }

    #[tokio::test]
    async fn a_response_is_matched_bounded_and_timed() {
        let ok =
            peer(|c| Some([&8i32.to_be_bytes()[..], &c.to_be_bytes(), &[1, 2, 3, 4]].concat()));
        let r = ask(&ok.await, Duration::from_secs(5)).await.unwrap();
        assert_eq!(r.body(), &[1, 2, 3, 4]);

        let wrong = peer(|c| Some([&4i32.to_be_bytes()[..], &(c + 1).to_be_bytes()].concat()));
        let e = ask(&wrong.await, Duration::from_secs(5)).await.unwrap_err();
        assert_eq!(e.kind(), "protocol", "{e}");

        // Larger than the 64-byte limit: refused before it is read.
        let big = peer(|_| Some(1000i32.to_be_bytes().to_vec()));
        let e = ask(&big.await, Duration::from_secs(5)).await.unwrap_err();
        assert!(e.to_string().contains("exceeds the limit"), "{e}");

        let silent = peer(|_| None);
        let e = ask(&silent.await, Duration::from_millis(200))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), "timeout", "{e}");
        assert!(e.is_retriable());
    }

    #[tokio::test]
    async fn the_first_reachable_server_is_used() {
        // A port nobody listens on: bind, note it, close.
        let closed = {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            l.local_addr().unwrap().to_string()
        };
        let live = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let live_addr = live.local_addr().unwrap().to_string();
        let servers = vec![closed.clone(), live_addr.clone()];
        let c = Connection::connect_first(&TcpConnector, &servers, Duration::from_secs(1), 64, "t")
            .await
            .unwrap();
        assert_eq!(c.addr(), live_addr);
        let e =
            Connection::connect_first(&TcpConnector, &[closed], Duration::from_secs(1), 64, "t")
                .await
                .err()
                .unwrap();
        assert_eq!(e.kind(), "unreachable");
    }
}
