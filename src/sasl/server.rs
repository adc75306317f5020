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
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use bytes::BytesMut;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

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
pub const FAILED_AUTH_DELAY: Duration = Duration::from_millis(100);
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

    /// The iteration count most credentials of `m` use (Kafka's minimum
    /// when there are none): what an unknown user is offered.
    fn usual_iterations(&self, m: Mechanism) -> u32 {
        let mut counts: HashMap<u32, usize> = HashMap::new();
        for ((_, cm), c) in &self.users {
            if *cm == m {
                *counts.entry(c.iterations).or_default() += 1;
            }
        }
        counts
            .into_iter()
            .max_by_key(|(i, n)| (*n, *i))
            .map(|(i, _)| i)
            .unwrap_or(MIN_ITERATIONS)
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
    /// Session lifetime (KIP-368); `None`: sessions never expire.
    lifetime: Option<Duration>,
    /// Secret key the made-up credentials of unknown users derive from
    /// (from the credential file's content: stable across restarts, not
    /// computable without the file).
    fake_key: [u8; 32],
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
    /// A frame larger than the budget allows before authentication.
    #[error("a {0}-byte frame before authentication cannot be held within the budget")]
    OverBudget(usize),
}

enum Phase {
    Initial,
    Authenticating(Mechanism, Option<ScramServer>),
}

/// One SASL exchange (SaslHandshake, then SaslAuthenticate rounds), frame
/// by frame: the first authentication of a connection
/// ([`ServerAuth::accept`]) and each re-authentication (KIP-368) on the
/// relayed connection go through it.
pub struct Exchange {
    auth: Arc<ServerAuth>,
    phase: Phase,
}

/// What an exchange answers one frame with.
pub enum Step {
    /// This frame; the exchange goes on.
    Answer(BytesMut),
    /// This frame; the client is authenticated as `principal`.
    Authenticated {
        /// The answer.
        frame: BytesMut,
        /// `User:<name>`.
        principal: String,
    },
    /// The exchange failed: answer with `frame` (if any, after
    /// [`FAILED_AUTH_DELAY`]), then close the connection.
    Failed {
        /// The answer, when Kafka gives one.
        frame: Option<BytesMut>,
        /// Why (logged, never sent).
        why: String,
    },
}

impl Exchange {
    /// Answers one request frame (size prefix included) of the exchange
    /// (`listener` names the listener in logs).
    pub fn step(&mut self, h: &RequestHeader, frame: &[u8], listener: &str) -> Step {
        let fail = |frame: Option<BytesMut>, why: String| Step::Failed { frame, why };
        let offered: Vec<&str> = self.auth.mechanisms.iter().map(|m| m.name()).collect();
        match (h.api_key, &mut self.phase) {
            (SASL_HANDSHAKE, Phase::Initial) => {
                if h.api_version != 1 {
                    let body = handshake_response(api::error::UNSUPPORTED_VERSION, &offered);
                    return fail(
                        Some(response_frame(h.correlation_id, 0, &body)),
                        format!(
                            "SaslHandshake v{} refused (only v1: v0 sends raw tokens)",
                            h.api_version
                        ),
                    );
                }
                let wanted = match request_body(h, frame)
                    .and_then(|b| Ok(Reader::new(b).read_string("mechanism")?.to_owned()))
                {
                    Ok(w) => w,
                    Err(e) => return fail(None, e.to_string()),
                };
                let chosen = Mechanism::parse(&wanted).filter(|m| self.auth.mechanisms.contains(m));
                let code = if chosen.is_some() {
                    0
                } else {
                    UNSUPPORTED_SASL_MECHANISM
                };
                let answer =
                    response_frame(h.correlation_id, 0, &handshake_response(code, &offered));
                match chosen {
                    Some(m) => {
                        self.phase = Phase::Authenticating(m, None);
                        Step::Answer(answer)
                    }
                    None => fail(
                        Some(answer),
                        format!("SASL mechanism {wanted:?} is not enabled (enabled: {offered:?})"),
                    ),
                }
            }
            (SASL_AUTHENTICATE, Phase::Authenticating(m, scram)) if h.api_version <= 2 => {
                let m = *m;
                let token = match request_body(h, frame).and_then(|b| {
                    let mut r = Reader::new(b);
                    Ok(if h.api_version >= 2 {
                        r.read_compact_bytes("auth_bytes")?
                    } else {
                        r.read_bytes("auth_bytes")?
                    }
                    .to_vec())
                }) {
                    Ok(t) => t,
                    Err(e) => return fail(None, e.to_string()),
                };
                let lifetime = self.auth.lifetime_ms();
                match self.auth.step(m, scram, &token) {
                    Ok(ServerStep::Continue(reply)) => {
                        Step::Answer(authenticate_response(h, 0, None, &reply, 0))
                    }
                    Ok(ServerStep::Done(reply, user)) => {
                        tracing::debug!(listener = %listener, user = %user, mechanism = %m,
                            "client authenticated");
                        Step::Authenticated {
                            frame: authenticate_response(h, 0, None, &reply, lifetime),
                            principal: format!("User:{user}"),
                        }
                    }
                    Err(e) => {
                        let message = format!(
                            "Authentication failed during authentication due to invalid credentials with SASL mechanism {m}"
                        );
                        fail(
                            Some(authenticate_response(
                                h,
                                SASL_AUTHENTICATION_FAILED,
                                Some(&message),
                                &[],
                                0,
                            )),
                            format!("{m}: {e}"),
                        )
                    }
                }
            }
            (key, _) => fail(
                None,
                format!(
                    "unexpected {} v{} during SASL authentication (closed, as Kafka does)",
                    api::api_name(key).unwrap_or("unknown request"),
                    h.api_version
                ),
            ),
        }
    }
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
        let text =
            std::fs::read(&cfg.credentials_file).map_err(|source| CredentialFileError::Read {
                file: cfg.credentials_file.display().to_string(),
                source,
            })?;
        let store = CredentialStore::load(&cfg.credentials_file)?;
        let lifetime =
            (cfg.session_lifetime_ms > 0).then(|| Duration::from_millis(cfg.session_lifetime_ms));
        Ok(Self::with_store(mechanisms, store, lifetime, &text))
    }

    /// A server over `store` (`secret`: what the made-up credentials of
    /// unknown users derive from; the credential file's bytes).
    pub fn with_store(
        mechanisms: Vec<Mechanism>,
        store: CredentialStore,
        lifetime: Option<Duration>,
        secret: &[u8],
    ) -> Self {
        let mut h = Sha256::new();
        h.update(b"mirrorguard unknown-user credentials v1\0");
        h.update(secret);
        let fake_key = h.finalize().into();
        Self {
            mechanisms,
            store,
            lifetime,
            fake_key,
        }
    }

    /// A new exchange (a SaslHandshake starts it).
    pub fn exchange(self: &Arc<Self>) -> Exchange {
        Exchange {
            auth: self.clone(),
            phase: Phase::Initial,
        }
    }

    /// When a session authenticated at `at` ends (`None`: never).
    pub fn session_end(&self, at: Instant) -> Option<Instant> {
        self.lifetime.map(|l| at + l)
    }

    fn lifetime_ms(&self) -> i64 {
        self.lifetime
            .map(|l| i64::try_from(l.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0)
    }

    /// The credential of `user` for `m`, or a made-up one (`false`) derived
    /// from the secret key: an unknown user gets a stable salt and the
    /// usual iteration count, and fails at the same check, after the same
    /// work, as a wrong password.
    fn credential(&self, user: &str, m: Mechanism) -> (StoredCredential, bool) {
        if let Some(c) = self.store.get(user, m) {
            return (c, true);
        }
        let derive = |label: &[u8]| {
            let mut mac = <hmac::Hmac<Sha256> as hmac::KeyInit>::new_from_slice(&self.fake_key)
                .expect("any key length");
            hmac::Mac::update(&mut mac, label);
            hmac::Mac::update(&mut mac, m.name().as_bytes());
            hmac::Mac::update(&mut mac, b"\0");
            hmac::Mac::update(&mut mac, user.as_bytes());
            hmac::Mac::finalize(mac).into_bytes().to_vec()
        };
        let len = if m == Mechanism::ScramSha512 { 64 } else { 32 };
        let stretch = |label: &[u8]| {
            let mut out = derive(label);
            while out.len() < len {
                out.extend(derive(&out.clone()));
            }
            out.truncate(len);
            out
        };
        let fake = StoredCredential {
            salt: derive(b"salt")[..16].to_vec(),
            iterations: self.store.usual_iterations(m),
            stored_key: stretch(b"stored"),
            server_key: stretch(b"server"),
        };
        (fake, false)
    }

    /// Runs the pre-relay authentication phase on `client`: ApiVersions is
    /// answered locally (`api_versions`: the source's table, when known;
    /// else the chain's offline answer), nothing is opened upstream.
    /// Returns the authenticated principal (`User:<name>`).
    pub async fn accept<C>(
        self: &Arc<Self>,
        client: &mut C,
        ctx: &ConnectionContext,
        peer: SocketAddr,
        api_versions: Option<&[(i16, i16, i16)]>,
    ) -> Result<String, AcceptError>
    where
        C: AsyncRead + AsyncWrite + Unpin,
    {
        match tokio::time::timeout(AUTH_DEADLINE, self.phase(client, ctx, peer, api_versions)).await
        {
            Ok(r) => r,
            Err(_) => Err(AcceptError::Deadline),
        }
    }

    async fn phase<C>(
        self: &Arc<Self>,
        client: &mut C,
        ctx: &ConnectionContext,
        peer: SocketAddr,
        table: Option<&[(i16, i16, i16)]>,
    ) -> Result<String, AcceptError>
    where
        C: AsyncRead + AsyncWrite + Unpin,
    {
        let mut exchange = self.exchange();
        let mut started = false;
        loop {
            let mut size = [0u8; 4];
            client
                .read_exact(&mut size)
                .await
                .map_err(|e| AcceptError::Gone(e.to_string()))?;
            let len = i32::from_be_bytes(size);
            let len = usize::try_from(len)
                .ok()
                .filter(|s| (4..=MAX_PRE_AUTH_FRAME).contains(s))
                .ok_or_else(|| {
                    AcceptError::Refused(format!(
                        "unreadable frame before authentication: frame size {len} out of range \
                         (at most {MAX_PRE_AUTH_FRAME} before authentication)"
                    ))
                })?;
            // Held whole: within the budget.
            let _permit = ctx
                .budget
                .acquire(len + 4)
                .ok_or(AcceptError::OverBudget(len + 4))?;
            let mut frame = BytesMut::zeroed(len + 4);
            frame[..4].copy_from_slice(&size);
            client
                .read_exact(&mut frame[4..])
                .await
                .map_err(|e| AcceptError::Gone(e.to_string()))?;
            let h = RequestHeader::parse(&frame)
                .map_err(|e| AcceptError::Refused(format!("not a Kafka request: {e}")))?;
            if h.api_key == api::API_VERSIONS && !started {
                let answer = api_versions(&h, &frame, table, ctx)?;
                write(client, &answer).await?;
                continue;
            }
            started = true;
            match exchange.step(&h, &frame, &ctx.listener) {
                Step::Answer(f) => write(client, &f).await?,
                Step::Authenticated { frame, principal } => {
                    write(client, &frame).await?;
                    tracing::debug!(listener = %ctx.listener, %peer, principal = %principal,
                        "client authenticated");
                    return Ok(principal);
                }
                Step::Failed { frame, why } => {
                    if let Some(f) = frame {
                        tokio::time::sleep(FAILED_AUTH_DELAY).await;
                        write(client, &f).await?;
                    }
                    return Err(AcceptError::Refused(why));
                }
            }
        }
    }

    fn step(
        &self,
        m: Mechanism,
        scram: &mut Option<ScramServer>,
        token: &[u8],
    ) -> Result<ServerStep, SaslError> {
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
                // One PBKDF2 derivation whether the user is known or not:
                // its SCRAM-SHA-256 credential (else SHA-512), or a made-up one.
                let sm = [Mechanism::ScramSha256, Mechanism::ScramSha512]
                    .into_iter()
                    .find(|sm| self.store.get(user, *sm).is_some())
                    .unwrap_or(Mechanism::ScramSha256);
                let (cred, known) = self.credential(user, sm);
                let matches = cred.matches_password(sm, pw);
                if !authz.is_empty() && authz != user.as_bytes() {
                    return Err(SaslError::Rejected(
                        "authorization id differs from the user".into(),
                    ));
                }
                if matches && known {
                    Ok(ServerStep::Done(Vec::new(), user.to_owned()))
                } else {
                    Err(SaslError::Rejected("invalid credentials".into()))
                }
            }
            (m, None) => {
                let first = std::str::from_utf8(token)
                    .map_err(|_| SaslError::malformed("client-first is not UTF-8"))?;
                let s = ScramServer::new_with(m, first, |u| self.credential(u, m))?;
                let reply = s.server_first().as_bytes().to_vec();
                *scram = Some(s);
                Ok(ServerStep::Continue(reply))
            }
            (_, Some(s)) => {
                let fin = std::str::from_utf8(token)
                    .map_err(|_| SaslError::malformed("client-final is not UTF-8"))?;
                let reply = s.finish(fin)?;
                Ok(ServerStep::Done(reply.into_bytes(), s.user))
            }
        }
    }
}

enum ServerStep {
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

/// A whole SaslAuthenticate response frame answering `h` (v0-v2), with
/// the session's lifetime (v1+; 0 = no re-authentication asked).
pub(crate) fn authenticate_response(
    h: &RequestHeader,
    code: i16,
    message: Option<&str>,
    bytes: &[u8],
    session_lifetime_ms: i64,
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
        w.put_i64(session_lifetime_ms);
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

/// The ApiVersions answer before authentication, built locally (nothing
/// is opened upstream before the client authenticated): the source's
/// table as the listener last read it (`table`), else the chain's offline
/// answer; then through the chain (clamp, the mirror's API list) with this
/// server's SASL versions.
fn api_versions(
    h: &RequestHeader,
    frame: &[u8],
    table: Option<&[(i16, i16, i16)]>,
    ctx: &ConnectionContext,
) -> Result<BytesMut, AcceptError> {
    let response = match table {
        Some(t) => {
            // This answer is built in v0-v3: a client asking for more gets
            // UNSUPPORTED_VERSION and, here, v3 as ApiVersions' highest
            // version, and asks again with it (KIP-511).
            let capped: Vec<(i16, i16, i16)> = t
                .iter()
                .map(|&(k, lo, hi)| {
                    if k == api::API_VERSIONS {
                        (k, lo, hi.min(3))
                    } else {
                        (k, lo, hi)
                    }
                })
                .collect();
            crate::mirror::offline::api_versions_response(h, &capped)
                .map_err(|e| AcceptError::Refused(e.to_string()))?
        }
        None => match ctx.chain.offline_answer(h, frame) {
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
    use tokio::io::AsyncReadExt;

    fn ctx() -> ConnectionContext {
        ConnectionContext {
            listener: "m".into(),
            max_frame: 1 << 20,
            metrics: crate::metrics::Metrics::new(),
            chain: Arc::new(crate::filter::Chain::new(Vec::new())),
            health: Default::default(),
            budget: crate::proxy::limits::MemoryBudget::unlimited(),
        }
    }

    fn server_with(mechanisms: &[Mechanism], lifetime: Option<Duration>) -> Arc<ServerAuth> {
        let lines: Vec<String> = [Mechanism::ScramSha256, Mechanism::ScramSha512]
            .iter()
            .map(|m| credential_line("fetcher", *m, b"right", 4096).unwrap())
            .collect();
        let text = lines.join("\n");
        Arc::new(ServerAuth::with_store(
            mechanisms.to_vec(),
            CredentialStore::parse(&text).unwrap(),
            lifetime,
            text.as_bytes(),
        ))
    }

    fn server(mechanisms: &[Mechanism]) -> Arc<ServerAuth> {
        server_with(mechanisms, None)
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
        s: &Arc<ServerAuth>,
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
                let r = s.accept(&mut b, &ctx, peer, None).await;
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
            assert_eq!(sv.unwrap(), "User:fetcher");
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
            .accept(&mut b, &ctx, "127.0.0.1:1".parse().unwrap(), None)
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
    async fn api_versions_are_answered_locally_with_the_local_sasl_versions() {
        let s = server(&[Mechanism::ScramSha256]);
        let (mut client, mut server_end) = tokio::io::duplex(1 << 16);
        client.write_all(&request(18, 0, &[])).await.unwrap();
        drop(client.write_all(&request(3, 1, &[0, 0, 0, 0])).await);
        let ctx = ctx();
        // The source's table as the listener's refresh read it: Fetch
        // 4..17, SaslHandshake 0..1.
        let table = [(1, 4, 17), (17, 0, 1)];
        let r = s
            .accept(
                &mut server_end,
                &ctx,
                "127.0.0.1:1".parse().unwrap(),
                Some(&table),
            )
            .await;
        assert!(r.is_err(), "Metadata before authentication");
        let mut size = [0u8; 4];
        client.read_exact(&mut size).await.unwrap();
        let mut resp = vec![0u8; i32::from_be_bytes(size) as usize];
        client.read_exact(&mut resp).await.unwrap();
        let body = &resp[4..];
        // error 0, three entries: Fetch as the table has it (the empty chain
        // clamps nothing), SaslHandshake v1 only, SaslAuthenticate v0..2 added.
        assert_eq!(
            body,
            &[0, 0, 0, 0, 0, 3, 0, 1, 0, 4, 0, 17, 0, 17, 0, 1, 0, 1, 0, 36, 0, 0, 0, 2][..]
        );
    }

    /// A client asking for ApiVersions v4+ before authentication is told
    /// v3 is the highest, and asks again (KIP-511): never told v4 again.
    #[test]
    fn api_versions_before_authentication_offer_what_they_encode() {
        let ctx = ctx();
        let table = [(1, 4, 17), (18, 0, 4)];
        let h = RequestHeader {
            api_key: api::API_VERSIONS,
            api_version: 4,
            correlation_id: 1,
        };
        let frame = request(18, 4, &[]);
        let resp = api_versions(&h, &frame, Some(&table), &ctx).unwrap();
        let body = &resp[8..];
        assert_eq!(&body[..2], &api::error::UNSUPPORTED_VERSION.to_be_bytes());
        use kafka_protocol::protocol::Decodable;
        let v0 = kafka_protocol::messages::ApiVersionsResponse::decode(&mut &body[..], 0).unwrap();
        let av = v0.api_keys.iter().find(|k| k.api_key == 18).unwrap();
        assert_eq!(av.max_version, 3);
    }

    #[tokio::test]
    async fn sessions_carry_their_lifetime_and_reauthenticate_frame_by_frame() {
        let s = server_with(&[Mechanism::ScramSha512], Some(Duration::from_secs(60)));
        let (c, sv) = exchange(&s, &creds(Mechanism::ScramSha512, "right")).await;
        assert_eq!(c.unwrap().lifetime_ms, 60_000);
        assert_eq!(sv.unwrap(), "User:fetcher");
        let now = Instant::now();
        assert_eq!(s.session_end(now), Some(now + Duration::from_secs(60)));
    }

    /// An unknown user gets a stable salt (the same on every attempt and
    /// from another server over the same file), the usual iteration count,
    /// and the same failure as a wrong password.
    #[test]
    fn unknown_users_look_like_known_ones() {
        let s = server(&[Mechanism::ScramSha256]);
        let first = |user: &str| {
            let mut scram = None;
            let token = format!("n,,n={user},r=abcdef");
            match s.step(Mechanism::ScramSha256, &mut scram, token.as_bytes()) {
                Ok(ServerStep::Continue(reply)) => String::from_utf8(reply).unwrap(),
                _ => panic!("no server-first"),
            }
        };
        let attrs = |sf: &str| -> (String, String) {
            let parts: Vec<&str> = sf.split(',').collect();
            (parts[1].to_string(), parts[2].to_string())
        };
        let (known_salt, known_iter) = attrs(&first("fetcher"));
        let (ghost_salt, ghost_iter) = attrs(&first("ghost"));
        assert_eq!(known_iter, ghost_iter);
        assert_eq!(known_salt.len(), ghost_salt.len());
        assert_eq!(attrs(&first("ghost")).0, ghost_salt, "stable");
        assert_ne!(attrs(&first("ghost2")).0, ghost_salt);
        // Not computable from the name alone: not the old hash of it.
        let old = B64.encode(&Sha256::digest(b"ghost")[..16]);
        assert_ne!(ghost_salt, format!("s={old}"));
        // PLAIN: unknown user and wrong password fail alike.
        let mut none = None;
        for token in [&b"\0ghost\0right"[..], b"\0fetcher\0wrong"] {
            let e = s.step(Mechanism::Plain, &mut none, token).err().unwrap();
            assert_eq!(e.to_string(), "authentication failed: invalid credentials");
        }
        assert!(matches!(
            s.step(Mechanism::Plain, &mut none, b"\0fetcher\0right"),
            Ok(ServerStep::Done(_, _))
        ));
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
