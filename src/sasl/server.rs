//! SASL terminated by a `[[mirror]]` listener: its clients (the
//! destination's fetcher) authenticate to mirrorguard, against a local
//! credential file, never to the source.
//!
//! Why here and not at the source: the seal must keep answering the
//! fetcher with the source dead, and a fetcher that reconnects must be able
//! to authenticate then. So authentication is a *pre-relay phase* on each
//! accepted connection ([`ServerAuth::accept`]): it reads the client's first
//! frames itself, exactly (size, then body: nothing past the last
//! authentication frame is read, so the stream is handed to the relay as
//! is), and follows Kafka's `SaslServerAuthenticator`:
//!
//! - ApiVersions is answered before authentication. The answer is the one
//!   the relay would give (the source's, through the listener's chain, or
//!   the chain's offline answer when the source is down), with
//!   SaslHandshake v1 and SaslAuthenticate v0-v2 set to what this server
//!   speaks.
//! - SaslHandshake v1 selects a mechanism; v0 (raw tokens follow it) is
//!   answered UNSUPPORTED_VERSION and the connection closed; an unknown
//!   mechanism gets UNSUPPORTED_SASL_MECHANISM with the enabled list, then
//!   the close.
//! - SaslAuthenticate v0-v2 carries the mechanism's tokens. A failure gets
//!   SASL_AUTHENTICATION_FAILED with Kafka's message, sent after 100 ms
//!   (Kafka's `connection.failed.authentication.delay.ms`), then the close.
//!   Success carries `session_lifetime_ms = 0`: clients never
//!   re-authenticate (KIP-368), and a later SaslHandshake/SaslAuthenticate
//!   on the relayed connection is answered ILLEGAL_SASL_STATE by
//!   [`crate::filter::sasl`] like a Kafka broker does after authentication,
//!   never forwarded to the source.
//! - Any other request before authentication closes the connection without
//!   an answer (Kafka: "Unexpected Kafka request of type ... during SASL
//!   handshake"; after the handshake Kafka first answers it with an error,
//!   mirrorguard only closes).
//!
//! The whole phase must end within [`AUTH_DEADLINE`]. Meanwhile, the
//! listener's own upstream connection was opened and authenticated with
//! mirrorguard's source credentials ([`super::client`]).
//!
//! # The credential file
//!
//! One credential per line, blank lines and `#` comments ignored:
//!
//! ```text
//! # user    mechanism      iterations salt(base64) stored_key(base64) server_key(base64)
//! fetcher   SCRAM-SHA-256  4096       c2FsdHNhbHQ= 3q2+7w...            Zm9vYmFy...
//! ```
//!
//! Only salted SCRAM credentials are stored (RFC 5802's StoredKey and
//! ServerKey), never a password. SASL/PLAIN, when enabled, is checked
//! against the user's SCRAM-SHA-256 (else SCRAM-SHA-512) credential: the
//! password received is salted and compared. `mirrorguard sasl-credential`
//! prints a line for a user and a password read from stdin.
//!
//! (Over 600 lines with its tests: the pre-relay phase, the credential
//! file and the server side of the mechanisms are one exchange, checked
//! together against Kafka's order of answers; the code itself is ~600.)

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use bytes::{BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use super::client::read_frame;
use super::scram::{ScramServer, StoredCredential, MAX_ITERATIONS, MIN_ITERATIONS};
use super::{Mechanism, SaslError};
use crate::codec::api;
use crate::codec::header::{request_body_offset, response_frame};
use crate::codec::RequestHeader;
use crate::config::ListenerSaslConfig;
use crate::filter::Rewritten;
use crate::proxy::connection::ConnectionContext;
use crate::wire::{Reader, Writer};

/// How long a client has to authenticate after connecting.
pub const AUTH_DEADLINE: Duration = Duration::from_secs(30);
/// Pause before a failed authentication is answered (Kafka's
/// `connection.failed.authentication.delay.ms` default): slows password
/// guessing down.
const FAILED_AUTH_DELAY: Duration = Duration::from_millis(100);
/// Largest frame read before authentication (Kafka's
/// `sasl.server.max.receive.size` default).
const MAX_PRE_AUTH_FRAME: usize = 512 * 1024;

const SASL_HANDSHAKE: i16 = 17;
const SASL_AUTHENTICATE: i16 = 36;
const UNSUPPORTED_SASL_MECHANISM: i16 = 33;
const SASL_AUTHENTICATION_FAILED: i16 = 58;

/// What this server advertises for the SASL APIs (ApiVersions).
pub const SASL_VERSIONS: [(i16, i16, i16); 2] = [(SASL_HANDSHAKE, 1, 1), (SASL_AUTHENTICATE, 0, 2)];

/// The credentials of a credential file, by user and mechanism.
#[derive(Debug, Default)]
pub struct CredentialStore {
    users: HashMap<(String, Mechanism), StoredCredential>,
}

impl CredentialStore {
    /// Reads a credential file (format in the module documentation).
    pub fn load(path: &Path) -> Result<Self, CredentialFileError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| CredentialFileError::Read {
            file: file.clone(),
            source,
        })?;
        Self::parse(&text).map_err(|e| match e {
            CredentialFileError::Line { line, reason, .. } => CredentialFileError::Line {
                file: Some(file),
                line,
                reason,
            },
            other => other,
        })
    }

    /// Parses credential-file text.
    pub fn parse(text: &str) -> Result<Self, CredentialFileError> {
        let mut users = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let f: Vec<&str> = line.split_whitespace().collect();
            let bad = |m: &str| CredentialFileError::Line {
                file: None,
                line: i + 1,
                reason: m.to_owned(),
            };
            let [user, mech, iterations, salt, stored, server] = f[..] else {
                return Err(bad(
                    "expected 6 fields: user mechanism iterations salt stored_key server_key",
                ));
            };
            let m = Mechanism::parse(mech)
                .filter(|m| *m != Mechanism::Plain)
                .ok_or_else(|| bad("mechanism must be SCRAM-SHA-256 or SCRAM-SHA-512"))?;
            let iterations: u32 = iterations
                .parse()
                .ok()
                .filter(|n| (MIN_ITERATIONS..=MAX_ITERATIONS).contains(n))
                .ok_or_else(|| bad("iterations must be 4096..=16384 (Kafka's bounds)"))?;
            let b64 = |s: &str, what: &str| {
                B64.decode(s)
                    .map_err(|_| bad(&format!("{what} is not base64")))
            };
            let cred = StoredCredential {
                salt: b64(salt, "salt")?,
                iterations,
                stored_key: b64(stored, "stored_key")?,
                server_key: b64(server, "server_key")?,
            };
            let len = if m == Mechanism::ScramSha512 { 64 } else { 32 };
            if cred.stored_key.len() != len || cred.server_key.len() != len {
                return Err(bad(&format!("{mech} keys are {len} bytes")));
            }
            if users.insert((user.to_owned(), m), cred).is_some() {
                return Err(bad("duplicate user and mechanism"));
            }
        }
        Ok(Self { users })
    }

    fn get(&self, user: &str, m: Mechanism) -> Option<StoredCredential> {
        self.users.get(&(user.to_owned(), m)).cloned()
    }

    /// Number of credentials.
    pub fn len(&self) -> usize {
        self.users.len()
    }

    /// Whether the file held none.
    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }
}

/// Why a credential file, a credential line or a listener's SASL section
/// cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CredentialFileError {
    /// The file cannot be read.
    #[error("cannot read {file}: {source}")]
    Read {
        /// The file.
        file: String,
        /// The read error.
        source: std::io::Error,
    },
    /// A line of the file is malformed.
    #[error("{}line {line}: {reason}", file.as_deref().map(|f| format!("{f}: ")).unwrap_or_default())]
    Line {
        /// The file, when it was read from one.
        file: Option<String>,
        /// The line number (1-based).
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// A mechanism name mirrorguard does not speak.
    #[error("unknown mechanism {0:?} (SCRAM-SHA-256, SCRAM-SHA-512, PLAIN)")]
    UnknownMechanism(String),
    /// `mechanisms` is empty.
    #[error("no mechanism enabled")]
    NoMechanism,
    /// A credential line for PLAIN was asked for.
    #[error("the file stores SCRAM credentials; PLAIN is checked against them")]
    PlainNotStored,
    /// The user name is empty or has whitespace.
    #[error("the user name must be non-empty, without whitespace")]
    BadUser,
    /// The iteration count is outside Kafka's bounds.
    #[error("iterations must be 4096..=16384")]
    BadIterations,
    /// No randomness for the salt.
    #[error("no random salt: {0}")]
    Random(getrandom::Error),
}

/// A credential-file line for `user` (a fresh 16-byte salt).
pub fn credential_line(
    user: &str,
    m: Mechanism,
    password: &[u8],
    iterations: u32,
) -> Result<String, CredentialFileError> {
    if m == Mechanism::Plain {
        return Err(CredentialFileError::PlainNotStored);
    }
    if user.is_empty() || user.contains(char::is_whitespace) {
        return Err(CredentialFileError::BadUser);
    }
    if !(MIN_ITERATIONS..=MAX_ITERATIONS).contains(&iterations) {
        return Err(CredentialFileError::BadIterations);
    }
    let mut salt = [0u8; 16];
    getrandom::getrandom(&mut salt).map_err(CredentialFileError::Random)?;
    let c = StoredCredential::derive(m, password, &salt, iterations);
    Ok(format!(
        "{user} {} {iterations} {} {} {}",
        m.name(),
        B64.encode(&c.salt),
        B64.encode(&c.stored_key),
        B64.encode(&c.server_key)
    ))
}

/// `mirrorguard sasl-credential`: one credential-file line on stdout.
#[derive(Debug, clap::Args)]
pub struct CredentialArgs {
    /// The user name.
    #[arg(long)]
    pub user: String,
    /// SCRAM-SHA-256 or SCRAM-SHA-512.
    #[arg(long, default_value = "SCRAM-SHA-256")]
    pub mechanism: String,
    /// PBKDF2 iterations (4096..=16384).
    #[arg(long, default_value_t = MIN_ITERATIONS)]
    pub iterations: u32,
}

/// Reads the password from stdin (first line) and prints the line.
pub fn run_credential(args: &CredentialArgs) -> std::process::ExitCode {
    let mut password = String::new();
    if let Err(e) = std::io::stdin().read_line(&mut password) {
        eprintln!("mirrorguard: cannot read the password from stdin: {e}");
        return std::process::ExitCode::from(2);
    }
    let password = password.trim_end_matches(['\n', '\r']);
    let line = Mechanism::parse(&args.mechanism)
        .ok_or_else(|| CredentialFileError::UnknownMechanism(args.mechanism.clone()))
        .and_then(|m| credential_line(&args.user, m, password.as_bytes(), args.iterations));
    match line {
        Ok(l) if !password.is_empty() => {
            println!("{l}");
            std::process::ExitCode::SUCCESS
        }
        Ok(_) => {
            eprintln!("mirrorguard: empty password");
            std::process::ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("mirrorguard: {e}");
            std::process::ExitCode::from(2)
        }
    }
}

/// A mirror listener's authentication of its clients.
#[derive(Debug)]
pub struct ServerAuth {
    mechanisms: Vec<Mechanism>,
    store: CredentialStore,
}

/// Why a client was not let through.
#[derive(Debug, thiserror::Error)]
pub enum AcceptError {
    /// The client closed or its socket failed.
    #[error("client went away during authentication: {0}")]
    Gone(String),
    /// Wrong credentials, unknown mechanism, or a protocol violation.
    #[error("{0}")]
    Refused(String),
    /// No authentication within [`AUTH_DEADLINE`].
    #[error("no authentication within {AUTH_DEADLINE:?}")]
    Deadline,
}

enum Phase {
    Initial,
    Authenticating(Mechanism, Option<ScramServer>),
}

impl ServerAuth {
    /// From `[[mirror]].listener_sasl`.
    pub fn new(cfg: &ListenerSaslConfig) -> Result<Self, CredentialFileError> {
        let mut mechanisms = Vec::new();
        for name in &cfg.mechanisms {
            let m = Mechanism::parse(name)
                .ok_or_else(|| CredentialFileError::UnknownMechanism(name.clone()))?;
            if !mechanisms.contains(&m) {
                mechanisms.push(m);
            }
        }
        if mechanisms.is_empty() {
            return Err(CredentialFileError::NoMechanism);
        }
        let store = CredentialStore::load(&cfg.credentials_file)?;
        Ok(Self { mechanisms, store })
    }

    /// Runs the pre-relay authentication phase on `client`; `upstream` (if
    /// connected) answers ApiVersions. Returns the authenticated user.
    pub async fn accept<C, U>(
        &self,
        client: &mut C,
        upstream: Option<&mut U>,
        ctx: &ConnectionContext,
        peer: SocketAddr,
    ) -> Result<String, AcceptError>
    where
        C: AsyncRead + AsyncWrite + Unpin,
        U: AsyncRead + AsyncWrite + Unpin,
    {
        match tokio::time::timeout(AUTH_DEADLINE, self.phase(client, upstream, ctx, peer)).await {
            Ok(r) => r,
            Err(_) => Err(AcceptError::Deadline),
        }
    }

    async fn phase<C, U>(
        &self,
        client: &mut C,
        mut upstream: Option<&mut U>,
        ctx: &ConnectionContext,
        peer: SocketAddr,
    ) -> Result<String, AcceptError>
    where
        C: AsyncRead + AsyncWrite + Unpin,
        U: AsyncRead + AsyncWrite + Unpin,
    {
        let mut phase = Phase::Initial;
        loop {
            let body = read_frame(client, MAX_PRE_AUTH_FRAME)
                .await
                .map_err(|e| match e {
                    SaslError::Io(m) => AcceptError::Gone(m),
                    e => {
                        AcceptError::Refused(format!("unreadable frame before authentication: {e}"))
                    }
                })?;
            let mut frame = BytesMut::with_capacity(body.len() + 4);
            frame.put_i32(body.len() as i32);
            frame.extend_from_slice(&body);
            let h = RequestHeader::parse(&frame)
                .map_err(|e| AcceptError::Refused(format!("not a Kafka request: {e}")))?;
            match (h.api_key, &mut phase) {
                (api::API_VERSIONS, Phase::Initial) => {
                    let answer = api_versions(&h, frame, upstream.as_deref_mut(), ctx).await?;
                    write(client, &answer).await?;
                }
                (SASL_HANDSHAKE, Phase::Initial) => {
                    let offered: Vec<&str> = self.mechanisms.iter().map(|m| m.name()).collect();
                    if h.api_version != 1 {
                        let body = handshake_response(api::error::UNSUPPORTED_VERSION, &offered);
                        write(client, &response_frame(h.correlation_id, 0, &body)).await?;
                        return Err(AcceptError::Refused(format!(
                            "SaslHandshake v{} refused (only v1: v0 sends raw tokens)",
                            h.api_version
                        )));
                    }
                    let wanted = request_body(&h, &frame)
                        .and_then(|b| Ok(Reader::new(b).read_string("mechanism")?.to_owned()))
                        .map_err(|e| AcceptError::Refused(e.to_string()))?;
                    let chosen = Mechanism::parse(&wanted).filter(|m| self.mechanisms.contains(m));
                    let code = if chosen.is_some() {
                        0
                    } else {
                        UNSUPPORTED_SASL_MECHANISM
                    };
                    write(
                        client,
                        &response_frame(h.correlation_id, 0, &handshake_response(code, &offered)),
                    )
                    .await?;
                    match chosen {
                        Some(m) => phase = Phase::Authenticating(m, None),
                        None => {
                            return Err(AcceptError::Refused(format!(
                                "SASL mechanism {wanted:?} is not enabled (enabled: {offered:?})"
                            )))
                        }
                    }
                }
                (SASL_AUTHENTICATE, Phase::Authenticating(m, scram)) if h.api_version <= 2 => {
                    let m = *m;
                    let token = request_body(&h, &frame)
                        .and_then(|b| {
                            let mut r = Reader::new(b);
                            Ok(if h.api_version >= 2 {
                                r.read_compact_bytes("auth_bytes")?
                            } else {
                                r.read_bytes("auth_bytes")?
                            }
                            .to_vec())
                        })
                        .map_err(|e| AcceptError::Refused(e.to_string()))?;
                    match self.step(m, scram, &token) {
                        Ok(Step::Continue(reply)) => {
                            write(client, &authenticate_response(&h, 0, None, &reply)).await?;
                        }
                        Ok(Step::Done(reply, user)) => {
                            write(client, &authenticate_response(&h, 0, None, &reply)).await?;
                            tracing::debug!(listener = %ctx.listener, %peer, user = %user, mechanism = %m,
                                "client authenticated");
                            return Ok(user);
                        }
                        Err(e) => {
                            tokio::time::sleep(FAILED_AUTH_DELAY).await;
                            let message = format!(
                                "Authentication failed during authentication due to invalid credentials with SASL mechanism {m}"
                            );
                            write(
                                client,
                                &authenticate_response(
                                    &h,
                                    SASL_AUTHENTICATION_FAILED,
                                    Some(&message),
                                    &[],
                                ),
                            )
                            .await?;
                            return Err(AcceptError::Refused(format!("{m}: {e}")));
                        }
                    }
                }
                (key, _) => {
                    return Err(AcceptError::Refused(format!(
                        "unexpected {} v{} during SASL authentication (closed, as Kafka does)",
                        api::api_name(key).unwrap_or("unknown request"),
                        h.api_version
                    )))
                }
            }
        }
    }

    fn step(
        &self,
        m: Mechanism,
        scram: &mut Option<ScramServer>,
        token: &[u8],
    ) -> Result<Step, SaslError> {
        match (m, scram.take()) {
            (Mechanism::Plain, _) => {
                // [authzid] NUL authcid NUL passwd
                let mut parts = token.split(|b| *b == 0);
                let (Some(authz), Some(user), Some(pw), None) =
                    (parts.next(), parts.next(), parts.next(), parts.next())
                else {
                    return Err(SaslError::malformed(
                        "PLAIN token is not authzid\\0user\\0password",
                    ));
                };
                let user = std::str::from_utf8(user)
                    .map_err(|_| SaslError::malformed("user name is not UTF-8"))?;
                if !authz.is_empty() && authz != user.as_bytes() {
                    return Err(SaslError::Rejected(
                        "authorization id differs from the user".into(),
                    ));
                }
                let ok = [Mechanism::ScramSha256, Mechanism::ScramSha512]
                    .into_iter()
                    .find_map(|sm| self.store.get(user, sm).map(|c| c.matches_password(sm, pw)))
                    .unwrap_or(false);
                if ok {
                    Ok(Step::Done(Vec::new(), user.to_owned()))
                } else {
                    Err(SaslError::Rejected("invalid credentials".into()))
                }
            }
            (m, None) => {
                let first = std::str::from_utf8(token)
                    .map_err(|_| SaslError::malformed("client-first is not UTF-8"))?;
                let s = ScramServer::new(m, first, |u| self.store.get(u, m))?;
                let reply = s.server_first().as_bytes().to_vec();
                *scram = Some(s);
                Ok(Step::Continue(reply))
            }
            (_, Some(s)) => {
                let fin = std::str::from_utf8(token)
                    .map_err(|_| SaslError::malformed("client-final is not UTF-8"))?;
                let reply = s.finish(fin)?;
                Ok(Step::Done(reply.into_bytes(), s.user))
            }
        }
    }
}

enum Step {
    Continue(Vec<u8>),
    Done(Vec<u8>, String),
}

fn request_body<'a>(h: &RequestHeader, frame: &'a [u8]) -> Result<&'a [u8], SaslError> {
    let hv = api::request_header_version(h.api_key, h.api_version)
        .ok_or_else(|| SaslError::malformed("unknown request header version"))?;
    let at = request_body_offset(frame, hv).map_err(|e| SaslError::malformed(e.to_string()))?;
    Ok(&frame[at..])
}

async fn write<C: AsyncWrite + Unpin>(client: &mut C, frame: &[u8]) -> Result<(), AcceptError> {
    client
        .write_all(frame)
        .await
        .map_err(|e| AcceptError::Gone(e.to_string()))?;
    client
        .flush()
        .await
        .map_err(|e| AcceptError::Gone(e.to_string()))
}

/// SaslHandshake response body (v0 and v1 alike).
fn handshake_response(code: i16, mechanisms: &[&str]) -> Vec<u8> {
    let mut w = Writer::new(Vec::new());
    w.put_i16(code);
    w.put_i32(mechanisms.len() as i32);
    for m in mechanisms {
        // Mechanism names are short ASCII: encoding cannot fail.
        let _ = w.put_string(m, "mechanism");
    }
    w.into_inner()
}

/// A whole SaslAuthenticate response frame answering `h` (v0-v2).
pub(crate) fn authenticate_response(
    h: &RequestHeader,
    code: i16,
    message: Option<&str>,
    bytes: &[u8],
) -> BytesMut {
    let flexible = h.api_version >= 2;
    let mut w = Writer::new(Vec::new());
    w.put_i16(code);
    // Short messages and tokens below the frame limit: encoding cannot fail.
    let _ = w.put_nullable_string_v(flexible, message, "error_message");
    if flexible {
        let _ = w.put_compact_bytes(bytes, "auth_bytes");
    } else {
        let _ = w.put_bytes(bytes, "auth_bytes");
    }
    if h.api_version >= 1 {
        w.put_i64(0); // session_lifetime_ms: no re-authentication
    }
    if flexible {
        w.put_uvarint(0);
    }
    response_frame(
        h.correlation_id,
        if flexible { 1 } else { 0 },
        &w.into_inner(),
    )
}

/// The ApiVersions answer before authentication: the upstream's (or the
/// offline one) through the chain, with this server's SASL versions.
async fn api_versions<U: AsyncRead + AsyncWrite + Unpin>(
    h: &RequestHeader,
    frame: BytesMut,
    upstream: Option<&mut U>,
    ctx: &ConnectionContext,
) -> Result<BytesMut, AcceptError> {
    let limit = ctx
        .chain
        .upstream_deadline(h, &frame)
        .unwrap_or(Duration::from_secs(10));
    let from_upstream = match upstream {
        Some(u) => {
            let asked = async {
                u.write_all(&frame)
                    .await
                    .map_err(|e| SaslError::Io(e.to_string()))?;
                u.flush().await.map_err(|e| SaslError::Io(e.to_string()))?;
                read_frame(u, ctx.max_frame).await
            };
            match tokio::time::timeout(limit, asked).await {
                Ok(Ok(body)) if body.get(..4) == Some(&h.correlation_id.to_be_bytes()[..]) => {
                    let mut f = BytesMut::with_capacity(body.len() + 4);
                    f.put_i32(body.len() as i32);
                    f.extend_from_slice(&body);
                    Some(f)
                }
                // The upstream is now out of step: the relay finds it out.
                Ok(Ok(_)) => {
                    return Err(AcceptError::Refused(
                        "the upstream answered ApiVersions with another correlation id".into(),
                    ))
                }
                Ok(Err(e)) => {
                    tracing::debug!(listener = %ctx.listener, error = %e,
                        "upstream did not answer ApiVersions: answering it locally");
                    None
                }
                Err(_) => None,
            }
        }
        None => None,
    };
    let response = match from_upstream {
        Some(f) => f,
        None => match ctx.chain.offline_answer(h, &frame) {
            Some(Ok(a)) => a.frame,
            Some(Err(e)) => return Err(AcceptError::Refused(e.to_string())),
            None => {
                return Err(AcceptError::Refused(
                    "ApiVersions cannot be answered without the upstream".into(),
                ))
            }
        },
    };
    let mut state = None;
    let mut from = 0;
    let response = match ctx.chain.on_response(h, &mut state, response, &mut from) {
        Ok(Rewritten::Ready(f)) => f,
        Ok(Rewritten::Blocked { .. }) => {
            return Err(AcceptError::Refused("ApiVersions answer blocked".into()))
        }
        Err(e) => return Err(AcceptError::Refused(e.to_string())),
    };
    // ApiVersions responses always have header v0 (4 bytes after the size).
    let patched =
        crate::handlers::set_api_versions(h.api_version, &response[8..], &SASL_VERSIONS, true)
            .map_err(|e| AcceptError::Refused(format!("ApiVersions answer: {e}")))?;
    Ok(match patched {
        Some(body) => crate::filter::with_body(&response, 8, &body),
        None => response,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sasl::{client, ClientCredentials, Secret};
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, DuplexStream};

    fn ctx() -> ConnectionContext {
        ConnectionContext {
            listener: "m".into(),
            max_frame: 1 << 20,
            metrics: crate::metrics::Metrics::new(),
            chain: Arc::new(crate::filter::Chain::new(Vec::new())),
            health: Default::default(),
        }
    }

    fn server(mechanisms: &[Mechanism]) -> ServerAuth {
        let lines: Vec<String> = [Mechanism::ScramSha256, Mechanism::ScramSha512]
            .iter()
            .map(|m| credential_line("fetcher", *m, b"right", 4096).unwrap())
            .collect();
        ServerAuth {
            mechanisms: mechanisms.to_vec(),
            store: CredentialStore::parse(&lines.join("\n")).unwrap(),
        }
    }

    fn creds(m: Mechanism, password: &str) -> ClientCredentials {
        ClientCredentials {
            mechanism: m,
            username: "fetcher".into(),
            password: Secret::new(password),
        }
    }

    /// mirrorguard's client against mirrorguard's server over an in-memory pipe.
    async fn exchange(
        s: &ServerAuth,
        c: &ClientCredentials,
    ) -> (
        Result<client::Session, SaslError>,
        Result<String, AcceptError>,
    ) {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        let peer = "127.0.0.1:1".parse().unwrap();
        let ctx = ctx();
        let (cr, sr) = tokio::join!(
            async {
                let r = client::authenticate(&mut a, c, Duration::from_secs(5)).await;
                drop(a);
                r
            },
            async {
                let r = s
                    .accept(&mut b, None::<&mut DuplexStream>, &ctx, peer)
                    .await;
                drop(b);
                r
            }
        );
        (cr, sr)
    }

    #[tokio::test]
    async fn client_and_server_agree_and_wrong_passwords_fail() {
        let all = [
            Mechanism::ScramSha256,
            Mechanism::ScramSha512,
            Mechanism::Plain,
        ];
        let s = server(&all);
        for m in all {
            let (c, sv) = exchange(&s, &creds(m, "right")).await;
            assert_eq!(c.unwrap().lifetime_ms, 0, "{m}: no re-authentication");
            assert_eq!(sv.unwrap(), "fetcher");
            let (c, sv) = exchange(&s, &creds(m, "wrong")).await;
            let e = c.unwrap_err().to_string();
            assert!(
                e.contains("SASL_AUTHENTICATION_FAILED")
                    || e.contains("SaslAuthenticationFailed")
                    || e.contains("invalid credentials"),
                "{m}: {e}"
            );
            assert!(matches!(sv, Err(AcceptError::Refused(_))), "{m}");
        }
        // A mechanism that is not enabled: the client learns what is.
        let s = server(&[Mechanism::ScramSha512]);
        let (c, sv) = exchange(&s, &creds(Mechanism::Plain, "right")).await;
        match c.unwrap_err() {
            SaslError::Mechanism { offered, .. } => assert_eq!(offered, ["SCRAM-SHA-512"]),
            e => panic!("{e}"),
        }
        assert!(sv.is_err());
    }

    /// Sends `frames` to a fresh server phase; returns its result and what it wrote.
    async fn raw(frames: &[Vec<u8>]) -> (Result<String, AcceptError>, Vec<u8>) {
        let s = server(&[Mechanism::ScramSha256]);
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        for f in frames {
            a.write_all(f).await.unwrap();
        }
        // The client sends nothing more (EOF after its frames).
        a.shutdown().await.unwrap();
        let ctx = ctx();
        let r = s
            .accept(
                &mut b,
                None::<&mut DuplexStream>,
                &ctx,
                "127.0.0.1:1".parse().unwrap(),
            )
            .await;
        drop(b);
        let mut out = Vec::new();
        a.read_to_end(&mut out).await.unwrap();
        (r, out)
    }

    fn request(api_key: i16, version: i16, body: &[u8]) -> Vec<u8> {
        crate::kafka_client::request_frame(api_key, version, 3, "t", |w| {
            w.put_raw(body);
            Ok(())
        })
        .unwrap()
    }

    #[tokio::test]
    async fn hostile_or_early_requests_close_the_connection() {
        // Metadata before authentication: closed without an answer.
        let (r, out) = raw(&[request(3, 1, &[0, 0, 0, 0])]).await;
        assert!(matches!(r, Err(AcceptError::Refused(m)) if m.contains("Metadata")));
        assert!(out.is_empty());
        // SaslHandshake v0: UNSUPPORTED_VERSION, then closed.
        let (r, out) = raw(&[request(17, 0, b"\0\x05PLAIN")]).await;
        assert!(r.is_err());
        assert_eq!(&out[8..10], &api::error::UNSUPPORTED_VERSION.to_be_bytes());
        // SaslAuthenticate before SaslHandshake.
        let (r, _) = raw(&[request(36, 1, &[0, 0, 0, 0])]).await;
        assert!(r.is_err());
        // A frame larger than the pre-authentication limit, a negative size, garbage.
        for bad in [
            (MAX_PRE_AUTH_FRAME as i32 + 1).to_be_bytes().to_vec(),
            (-1i32).to_be_bytes().to_vec(),
            vec![0, 0, 0, 4, 0xff, 0xff, 0xff, 0xff],
        ] {
            let (r, out) = raw(&[bad]).await;
            assert!(matches!(r, Err(AcceptError::Refused(_))), "{r:?}");
            assert!(out.is_empty());
        }
        // A client that goes away.
        let (r, _) = raw(&[]).await;
        assert!(matches!(r, Err(AcceptError::Gone(_))), "{r:?}");
    }

    #[tokio::test]
    async fn api_versions_come_from_the_upstream_with_the_local_sasl_versions() {
        let s = server(&[Mechanism::ScramSha256]);
        let (mut client, mut server_end) = tokio::io::duplex(1 << 16);
        let (mut upstream, mut broker) = tokio::io::duplex(1 << 16);
        // The broker answers one ApiVersions v0: Fetch 4..17, SaslHandshake 0..1.
        tokio::spawn(async move {
            let body = read_frame(&mut broker, 1 << 20).await.unwrap();
            let corr = &body[4..8];
            let mut resp = corr.to_vec();
            resp.extend_from_slice(&[0, 0, 0, 0, 0, 2, 0, 1, 0, 4, 0, 17, 0, 17, 0, 0, 0, 1]);
            let mut f = (resp.len() as i32).to_be_bytes().to_vec();
            f.extend_from_slice(&resp);
            broker.write_all(&f).await.unwrap();
        });
        client.write_all(&request(18, 0, &[])).await.unwrap();
        drop(client.write_all(&request(3, 1, &[0, 0, 0, 0])).await);
        let ctx = ctx();
        let r = s
            .accept(
                &mut server_end,
                Some(&mut upstream),
                &ctx,
                "127.0.0.1:1".parse().unwrap(),
            )
            .await;
        assert!(r.is_err(), "Metadata before authentication");
        let resp = read_frame(&mut client, 1 << 20).await.unwrap();
        let body = &resp[4..];
        // error 0, three entries: Fetch as the broker sent it (the empty chain
        // clamps nothing), SaslHandshake v1 only, SaslAuthenticate v0..2 added.
        assert_eq!(
            body,
            &[0, 0, 0, 0, 0, 3, 0, 1, 0, 4, 0, 17, 0, 17, 0, 1, 0, 1, 0, 36, 0, 0, 0, 2][..]
        );
    }

    #[test]
    fn credential_lines_round_trip_and_bad_files_are_refused() {
        let line = credential_line("fetcher", Mechanism::ScramSha512, b"pw", 4096).unwrap();
        let store = CredentialStore::parse(&format!("# comment\n\n{line}\n")).unwrap();
        let c = store.get("fetcher", Mechanism::ScramSha512).unwrap();
        assert!(c.matches_password(Mechanism::ScramSha512, b"pw"));
        assert!(store.get("fetcher", Mechanism::ScramSha256).is_none());
        assert!(!format!("{c:?}").contains(&B64.encode(&c.stored_key)));
        for bad in [
            "u SCRAM-SHA-256 4096 AA== AA== AA==",
            "u PLAIN 4096 AA== AA== AA==",
            "u SCRAM-SHA-256 100 AA== AA== AA==",
            "u SCRAM-SHA-256 4096 !! AA== AA==",
            "u SCRAM-SHA-256",
        ] {
            assert!(CredentialStore::parse(bad).is_err(), "{bad}");
        }
        let dup = format!("{line}\n{line}\n");
        assert!(CredentialStore::parse(&dup)
            .unwrap_err()
            .to_string()
            .contains("duplicate"));
        assert!(credential_line("a b", Mechanism::ScramSha256, b"p", 4096).is_err());
    }
}
