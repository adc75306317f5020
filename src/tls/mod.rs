//! Transport security: TLS on every listener and every outbound connection.
//!
//! This module has one job: turn the `tls` / `upstream_tls` sections of
//! `proxy.toml` into rustls server and client configurations read from PEM
//! files, re-read them on demand (SIGHUP) without disturbing connections
//! already open, and say in one stable word why a handshake failed.
//!
//! A connection is first a transport ([`Transport`]: plain TCP or TLS over
//! it), then optionally authenticated (SASL, elsewhere): nothing here looks
//! at Kafka bytes. The crypto provider is rustls' `ring` one; there are no
//! built-in root certificates, CA bundles are files the operator names.
//!
//! Reloading: each [`ServerTls`] / [`ClientTls`] keeps its current rustls
//! configuration behind a short-lived lock (cloned out as an `Arc`, never
//! held across an await). [`reload_all`] rebuilds every live one from its
//! files; a file that no longer parses keeps the old configuration and is
//! reported.

mod error;
mod material;
mod principal;
mod transport;
mod x509;

use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use rustls_pki_types::ServerName;
use tokio::net::TcpStream;

pub use error::{classify, HandshakeError, TlsError};
pub use principal::certificate_principal;
pub use transport::{Transport, WriteThrough};

use crate::config::{ClientTlsConfig, ServerTlsConfig};

/// The first byte of every TLS connection: a handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// Something whose TLS material can be re-read.
trait Reload: Send + Sync {
    /// Rebuilds from the files; on error keeps the old configuration.
    fn reload(&self) -> Result<(), TlsError>;
    /// What it is, for the log (`listener plain tls`, `state upstream_tls`).
    fn describe(&self) -> String;
    /// notAfter of its certificates: (role, Unix seconds).
    fn expiries(&self) -> Vec<(&'static str, i64)>;
}

/// Every live TLS configuration, for [`reload_all`]. Weak: a configuration
/// dropped (a test's listener gone) drops out of the list.
static LIVE: Mutex<Vec<Weak<dyn Reload>>> = Mutex::new(Vec::new());

fn register(r: Arc<dyn Reload>) {
    let mut live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
    live.retain(|w| w.strong_count() > 0);
    live.push(Arc::downgrade(&r));
}

/// Outcome of one [`reload_all`].
#[derive(Debug, Default)]
pub struct ReloadReport {
    /// Configurations rebuilt from their files.
    pub ok: usize,
    /// Configurations whose files were refused (the old ones stay), with why.
    pub failed: Vec<(String, TlsError)>,
}

/// Re-reads the certificates and keys of every live TLS configuration.
/// New connections use the new material; open ones keep theirs.
pub fn reload_all() -> ReloadReport {
    let live: Vec<Arc<dyn Reload>> = {
        let live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
        live.iter().filter_map(Weak::upgrade).collect()
    };
    let mut report = ReloadReport::default();
    for r in live {
        match r.reload() {
            Ok(()) => report.ok += 1,
            Err(e) => report.failed.push((r.describe(), e)),
        }
    }
    report
}

/// notAfter of the certificates of every live TLS configuration: (its
/// name, role `server` / `client` / `ca`, Unix seconds). Read at scrape time
/// into `mirrorguard_tls_certificate_expiry_timestamp_seconds`.
pub fn certificate_expiries() -> Vec<(String, &'static str, i64)> {
    let live: Vec<Arc<dyn Reload>> = {
        let live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
        live.iter().filter_map(Weak::upgrade).collect()
    };
    live.iter()
        .flat_map(|r| {
            let what = r.describe();
            r.expiries()
                .into_iter()
                .map(move |(role, t)| (what.clone(), role, t))
        })
        .collect()
}

/// The TLS server side of a listener (or the admin endpoint).
pub struct ServerTls {
    files: ServerTlsConfig,
    what: String,
    current: RwLock<Arc<rustls::ServerConfig>>,
    expiries: RwLock<Vec<(&'static str, i64)>>,
}

impl ServerTls {
    /// Reads the files; `what` names the listener in logs and errors.
    pub fn new(files: &ServerTlsConfig, what: &str) -> Result<Arc<Self>, TlsError> {
        let config = material::server_config(files)?;
        let me = Arc::new(Self {
            files: files.clone(),
            what: what.to_owned(),
            current: RwLock::new(Arc::new(config)),
            expiries: RwLock::new(material::server_expiries(files)),
        });
        register(me.clone());
        Ok(me)
    }

    /// Whether clients must present a certificate signed by `client_ca`.
    pub fn requires_client_cert(&self) -> bool {
        self.files.client_ca.is_some()
    }

    /// The handshake timeout.
    pub fn handshake_timeout(&self) -> Duration {
        Duration::from_millis(self.files.handshake_timeout_ms)
    }

    fn config(&self) -> Arc<rustls::ServerConfig> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Runs the server handshake on an accepted connection within the
    /// handshake timeout. A peer whose first byte is not a TLS handshake
    /// record (a plaintext Kafka client) is refused before rustls sees it,
    /// so the error says so plainly.
    pub async fn accept(&self, tcp: TcpStream) -> Result<Transport, HandshakeError> {
        let limit = self.handshake_timeout();
        let started = Instant::now();
        let mut first = [0u8; 1];
        match tokio::time::timeout(limit, tcp.peek(&mut first)).await {
            Err(_) => return Err(HandshakeError::Timeout(limit)),
            Ok(Err(e)) => return Err(HandshakeError::Io(e)),
            Ok(Ok(0)) => return Err(HandshakeError::Eof),
            Ok(Ok(_)) if first[0] != TLS_HANDSHAKE_RECORD => {
                return Err(HandshakeError::NotTls(first[0]))
            }
            Ok(Ok(_)) => {}
        }
        let acceptor = tokio_rustls::TlsAcceptor::from(self.config());
        let rest = limit.saturating_sub(started.elapsed());
        match tokio::time::timeout(rest, acceptor.accept(tcp)).await {
            Err(_) => Err(HandshakeError::Timeout(limit)),
            Ok(Err(e)) => Err(HandshakeError::from_io(e)),
            Ok(Ok(s)) => Ok(Transport::Server(Box::new(WriteThrough::new(s)))),
        }
    }
}

impl Reload for ServerTls {
    fn reload(&self) -> Result<(), TlsError> {
        let config = material::server_config(&self.files)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(config);
        *self.expiries.write().unwrap_or_else(|p| p.into_inner()) =
            material::server_expiries(&self.files);
        Ok(())
    }
    fn describe(&self) -> String {
        self.what.clone()
    }
    fn expiries(&self) -> Vec<(&'static str, i64)> {
        self.expiries
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// The TLS client side of outbound connections to one cluster.
pub struct ClientTls {
    files: ClientTlsConfig,
    what: String,
    current: RwLock<Arc<rustls::ClientConfig>>,
    expiries: RwLock<Vec<(&'static str, i64)>>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("what", &self.what)
            .finish()
    }
}

impl ClientTls {
    /// Reads the files; `what` names the connection in logs and errors.
    pub fn new(files: &ClientTlsConfig, what: &str) -> Result<Arc<Self>, TlsError> {
        let config = material::client_config(files)?;
        let me = Arc::new(Self {
            files: files.clone(),
            what: what.to_owned(),
            current: RwLock::new(Arc::new(config)),
            expiries: RwLock::new(material::client_expiries(files)),
        });
        register(me.clone());
        Ok(me)
    }

    /// The handshake timeout.
    pub fn handshake_timeout(&self) -> Duration {
        Duration::from_millis(self.files.handshake_timeout_ms)
    }

    /// Runs the client handshake over a connected socket to `host`. The
    /// server name sent (SNI) and verified is `server_name` when configured,
    /// else `host` (an IP literal is verified against the certificate's IP
    /// addresses and sends no SNI).
    pub async fn connect(&self, tcp: TcpStream, host: &str) -> Result<Transport, HandshakeError> {
        let name = self.files.server_name.as_deref().unwrap_or(host);
        let name = name.trim_start_matches('[').trim_end_matches(']');
        let server_name = ServerName::try_from(name.to_owned())
            .map_err(|_| HandshakeError::BadServerName(name.to_owned()))?;
        let connector = tokio_rustls::TlsConnector::from(
            self.current
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        );
        let limit = self.handshake_timeout();
        match tokio::time::timeout(limit, connector.connect(server_name, tcp)).await {
            Err(_) => Err(HandshakeError::Timeout(limit)),
            Ok(Err(e)) => Err(HandshakeError::from_io(e)),
            Ok(Ok(s)) => Ok(Transport::Client(Box::new(WriteThrough::new(s)))),
        }
    }
}

impl Reload for ClientTls {
    fn reload(&self) -> Result<(), TlsError> {
        let config = material::client_config(&self.files)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(config);
        *self.expiries.write().unwrap_or_else(|p| p.into_inner()) =
            material::client_expiries(&self.files);
        Ok(())
    }
    fn describe(&self) -> String {
        self.what.clone()
    }
    fn expiries(&self) -> Vec<(&'static str, i64)> {
        self.expiries
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Builds a server section's rustls configuration once, not registered for
/// reloads (config validation; tools such as the benchmark fixture).
pub fn server_config(files: &ServerTlsConfig) -> Result<rustls::ServerConfig, TlsError> {
    material::server_config(files)
}

/// Builds a client section's rustls configuration once, not registered for
/// reloads.
pub fn client_config(files: &ClientTlsConfig) -> Result<rustls::ClientConfig, TlsError> {
    material::client_config(files)
}

#[cfg(test)]
mod tests;
