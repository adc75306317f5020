//! SASL: mirrorguard's own identity toward Kafka clusters, and the
//! authentication its `[[mirror]]` listeners require from their clients.
//!
//! A connection is first a transport (TCP today, TLS later: whatever the
//! [`Connector`](crate::kafka_client::Connector) or the listener's accept
//! gives), then optionally authenticated on that stream. Three roles:
//!
//! - **Passthrough** (`[[listener]]`, `[[guard]]`): SaslHandshake and
//!   SaslAuthenticate of the clients flow through the relay to the broker
//!   like any other request; mirrorguard never sees a client credential.
//!   SaslHandshake v0 (raw SASL tokens follow it, not Kafka frames) is never
//!   advertised and refused ([`crate::filter::sasl`]).
//! - **Client** ([`client::authenticate`]): mirrorguard's own connections
//!   (state store, Metadata refresh, topic-id lookup, replay, the
//!   destination admin calls, and every upstream connection of a mirror
//!   listener) authenticate with PLAIN or SCRAM-SHA-256/512 right after the
//!   transport is up, before the first request.
//! - **Server** ([`server`]): a mirror listener authenticates its clients
//!   itself, against a local credential file, before relaying anything,
//!   because the seal must keep serving the destination's fetcher with the
//!   source dead.
//!
//! Secrets come from a file or an environment variable named in the
//! configuration, are read once at start-up, and are never logged: the
//! types holding them print `<redacted>`.

pub mod client;
pub mod scram;
pub mod server;

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use crate::config::ClientSaslConfig;

/// A SASL mechanism mirrorguard speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mechanism {
    /// RFC 4616 (only over TLS in production: the password crosses the wire).
    Plain,
    /// RFC 7677.
    ScramSha256,
    /// RFC 5802 with SHA-512 (Kafka's SCRAM-SHA-512).
    ScramSha512,
}

impl Mechanism {
    /// The mechanism's name on the wire (SaslHandshake).
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::ScramSha256 => "SCRAM-SHA-256",
            Mechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }

    /// Parses a wire name (case-sensitive, as Kafka).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "PLAIN" => Some(Mechanism::Plain),
            "SCRAM-SHA-256" => Some(Mechanism::ScramSha256),
            "SCRAM-SHA-512" => Some(Mechanism::ScramSha512),
            _ => None,
        }
    }
}

impl fmt::Display for Mechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why an authentication failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SaslError {
    /// The peer sent something that is not a valid SASL or Kafka message.
    #[error("malformed SASL exchange: {0}")]
    Malformed(String),
    /// The peer refused the credentials (or we refused the peer's).
    #[error("authentication failed: {0}")]
    Rejected(String),
    /// The broker does not offer the configured mechanism.
    #[error("the broker does not enable SASL mechanism {wanted} (it offers {offered:?})")]
    Mechanism {
        /// What we asked for.
        wanted: String,
        /// What it offers.
        offered: Vec<String>,
    },
    /// Transport failure or timeout during the exchange.
    #[error("SASL exchange failed: {0}")]
    Io(String),
    /// A local problem (no randomness, unreadable secret).
    #[error("{0}")]
    Local(String),
}

impl SaslError {
    pub(crate) fn malformed(m: impl Into<String>) -> Self {
        SaslError::Malformed(m.into())
    }
}

/// A password, never printed.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl Secret {
    /// Wraps a secret value.
    pub fn new(v: impl Into<Vec<u8>>) -> Self {
        Secret(v.into())
    }

    /// The secret bytes (for the mechanism only).
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.0);
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// mirrorguard's own credentials toward one cluster, resolved from a
/// [`ClientSaslConfig`] at start-up.
#[derive(Clone, Debug)]
pub struct ClientCredentials {
    /// The mechanism.
    pub mechanism: Mechanism,
    /// The user name (Kafka principal `User:<username>`).
    pub username: String,
    /// The password.
    pub password: Secret,
}

impl ClientCredentials {
    /// Resolves `cfg`: reads the password from its file (trailing newline
    /// dropped) or environment variable. `section` names the config section
    /// in errors; the secret never appears in them.
    pub fn resolve(cfg: &ClientSaslConfig, section: &str) -> Result<Arc<Self>, CredentialsError> {
        let section = section.to_owned();
        let mechanism =
            Mechanism::parse(&cfg.mechanism).ok_or_else(|| CredentialsError::UnknownMechanism {
                section: section.clone(),
                name: cfg.mechanism.clone(),
            })?;
        let password = match (&cfg.password_file, &cfg.password_env) {
            (Some(path), None) => {
                read_secret_file(path).map_err(|source| CredentialsError::PasswordFile {
                    section: section.clone(),
                    path: path.display().to_string(),
                    source,
                })?
            }
            // Taken out of the environment at start-up (crate::secrets).
            (None, Some(var)) => crate::secrets::env_secret(var)
                .and_then(|v| String::from_utf8(v.to_vec()).ok())
                .ok_or_else(|| CredentialsError::PasswordEnv {
                    section: section.clone(),
                    var: var.clone(),
                })?,
            _ => return Err(CredentialsError::PasswordSource { section }),
        };
        if password.is_empty() || cfg.username.is_empty() {
            return Err(CredentialsError::Empty { section });
        }
        Ok(Arc::new(Self {
            mechanism,
            username: cfg.username.clone(),
            password: Secret::new(password),
        }))
    }

    /// Optional credentials of an optional section.
    pub fn resolve_opt(
        cfg: Option<&ClientSaslConfig>,
        section: &str,
    ) -> Result<Option<Arc<Self>>, CredentialsError> {
        cfg.map(|c| Self::resolve(c, section)).transpose()
    }
}

/// Why mirrorguard's own SASL credentials of a config section cannot be
/// used. The secret never appears in it.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// `mechanism` is none of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512.
    #[error("{section}.mechanism: unknown SASL mechanism {name:?} (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)")]
    UnknownMechanism {
        /// The config section.
        section: String,
        /// The configured name.
        name: String,
    },
    /// `password_file` cannot be read.
    #[error("{section}.password_file: cannot read {path}: {source}")]
    PasswordFile {
        /// The config section.
        section: String,
        /// The file.
        path: String,
        /// The read error.
        source: std::io::Error,
    },
    /// `password_env` names no (UTF-8) variable.
    #[error("{section}.password_env: environment variable {var} is not set (or not UTF-8)")]
    PasswordEnv {
        /// The config section.
        section: String,
        /// The variable.
        var: String,
    },
    /// Neither or both of `password_file` and `password_env`.
    #[error("{section}: exactly one of password_file and password_env is required")]
    PasswordSource {
        /// The config section.
        section: String,
    },
    /// An empty user name or password.
    #[error("{section}: empty username or password")]
    Empty {
        /// The config section.
        section: String,
    },
}

/// mirrorguard's own identity toward one cluster: its credentials, or none
/// (the cluster's listener does not use SASL).
pub type Identity = Option<Arc<ClientCredentials>>;

/// A secret file's content, without a trailing newline.
fn read_secret_file(path: &Path) -> std::io::Result<String> {
    // The copy read from the file is wiped; the password moves on in a Secret.
    let s = zeroize::Zeroizing::new(std::fs::read_to_string(path)?);
    Ok(s.strip_suffix('\n')
        .map(|s| s.strip_suffix('\r').unwrap_or(s))
        .unwrap_or(&s)
        .to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_redacted_and_resolved_from_file_or_env() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("pw");
        std::fs::write(&f, "hunter2\n").unwrap();
        let cfg = ClientSaslConfig {
            mechanism: "SCRAM-SHA-512".into(),
            username: "mg".into(),
            password_file: Some(f),
            password_env: None,
            allow_plain_without_tls: false,
        };
        let c = ClientCredentials::resolve(&cfg, "state.sasl").unwrap();
        assert_eq!(c.password.expose(), b"hunter2");
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("hunter2") && shown.contains("<redacted>"),
            "{shown}"
        );

        std::env::set_var("MG_SASL_TEST_PW", "envpw");
        let cfg = ClientSaslConfig {
            password_file: None,
            password_env: Some("MG_SASL_TEST_PW".into()),
            ..cfg
        };
        let c = ClientCredentials::resolve(&cfg, "s").unwrap();
        assert_eq!(c.password.expose(), b"envpw");
        let bad = ClientSaslConfig {
            mechanism: "GSSAPI".into(),
            ..cfg.clone()
        };
        assert!(ClientCredentials::resolve(&bad, "s")
            .unwrap_err()
            .to_string()
            .contains("GSSAPI"));
        let none = ClientSaslConfig {
            password_env: Some("MG_SASL_TEST_UNSET".into()),
            ..cfg
        };
        let e = ClientCredentials::resolve(&none, "s")
            .unwrap_err()
            .to_string();
        assert!(e.contains("MG_SASL_TEST_UNSET"), "{e}");
    }
}
