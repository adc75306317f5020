//! Why TLS material was refused, and why a handshake failed (one stable
//! word per cause, for the `kind` label of
//! `mirrorguard_tls_handshake_errors_total` and the log line).

use std::path::PathBuf;
use std::time::Duration;

use rustls::CertificateError;

/// A TLS file that cannot be used, naming the config field and the file.
#[derive(Debug, Clone, thiserror::Error)]
#[error("`{field}` ({}): {message}", path.display())]
pub struct TlsError {
    /// The field of the TLS section: `cert`, `key`, `client_ca` or `ca`.
    pub field: &'static str,
    /// The file.
    pub path: PathBuf,
    /// What is wrong with it.
    pub message: String,
}

impl TlsError {
    pub(super) fn new(field: &'static str, path: &std::path::Path, message: String) -> Self {
        Self {
            field,
            path: path.to_path_buf(),
            message,
        }
    }
}

/// Why one handshake failed. Only that connection is closed.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The handshake did not finish in time (a stalled or slow peer).
    #[error("TLS handshake not finished within {0:?}")]
    Timeout(Duration),
    /// The peer closed before the handshake finished.
    #[error("peer closed the connection during the TLS handshake")]
    Eof,
    /// The first byte was not a TLS handshake record: most likely a
    /// plaintext Kafka client on a TLS port.
    #[error("not TLS (first byte {0:#04x}; a plaintext client on a TLS port?)")]
    NotTls(u8),
    /// The socket failed.
    #[error("I/O error during the TLS handshake: {0}")]
    Io(std::io::Error),
    /// rustls refused the peer (certificate, protocol, alert).
    #[error("TLS handshake failed: {0}")]
    Tls(rustls::Error),
    /// The configured or connected-to name is not a valid server name.
    #[error("{0:?} is not a valid TLS server name")]
    BadServerName(String),
}

impl HandshakeError {
    /// Wraps an error from tokio-rustls, keeping the rustls cause.
    pub(super) fn from_io(e: std::io::Error) -> Self {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            return Self::Eof;
        }
        match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
            Some(tls) => Self::Tls(tls.clone()),
            None => Self::Io(e),
        }
    }

    /// Stable metric label.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Timeout(_) => "timeout",
            Self::Eof => "eof",
            Self::NotTls(_) => "plaintext",
            Self::Io(_) => "io",
            Self::BadServerName(_) => "bad_server_name",
            Self::Tls(e) => classify(e),
        }
    }
}

impl From<HandshakeError> for std::io::Error {
    fn from(e: HandshakeError) -> Self {
        match e {
            HandshakeError::Io(e) => e,
            HandshakeError::Timeout(_) => std::io::Error::new(std::io::ErrorKind::TimedOut, e),
            e => std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        }
    }
}

/// One word for a rustls error.
pub fn classify(e: &rustls::Error) -> &'static str {
    use rustls::Error as E;
    match e {
        E::InvalidCertificate(c) => match c {
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => "cert_expired",
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                "cert_not_yet_valid"
            }
            CertificateError::UnknownIssuer => "unknown_ca",
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                "bad_hostname"
            }
            CertificateError::Revoked => "cert_revoked",
            _ => "bad_certificate",
        },
        E::NoCertificatesPresented => "no_client_cert",
        E::AlertReceived(_) => "alert",
        E::InvalidMessage(_)
        | E::PeerMisbehaved(_)
        | E::InappropriateMessage { .. }
        | E::InappropriateHandshakeMessage { .. }
        | E::DecryptError => "protocol",
        E::PeerIncompatible(_) => "incompatible",
        _ => "other",
    }
}
