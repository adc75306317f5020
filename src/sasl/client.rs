//! mirrorguard authenticating itself: SaslHandshake v1, then
//! SaslAuthenticate v1 rounds of the configured mechanism, on a stream
//! nothing else has used yet.
//!
//! This runs once per connection, right after the transport is up (TCP or
//! TLS: it only needs a byte stream), before the first request of the
//! connection's owner. Frames are read exactly (size, then body), so nothing
//! past the last SASL response is consumed and the stream can be handed on
//! as it is.
//!
//! The same exchange re-authenticates (KIP-368) a connection already in
//! use: `reauthenticate` runs it over a `SaslRoundTrip` the owner of the
//! connection provides (the relay of a mirror listener routes the frames
//! between its pumps), and [`reauth_delay`] says when, as Kafka's Java
//! client does (`SaslClientAuthenticator.ReauthInfo`): after 85% to 95% of
//! the session lifetime the broker gave, the jitter keeping many
//! connections from re-authenticating at once. Owners that do not
//! re-authenticate (Metadata refreshes, the state store's short-lived
//! connections) reconnect when a broker with `connections.max.reauth.ms`
//! closes a connection whose session expired.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::scram::ScramClient;
use super::{ClientCredentials, Mechanism, SaslError};
use crate::kafka_client::request_frame;
use crate::wire::Reader;

const SASL_HANDSHAKE: i16 = 17;
const SASL_AUTHENTICATE: i16 = 36;
/// Kafka's `sasl.server.max.receive.size` default bounds what a server
/// accepts before authentication; responses are tiny too.
const MAX_SASL_FRAME: usize = 512 * 1024;
const CLIENT_ID: &str = "mirrorguard";

/// The outcome of a successful authentication.
#[derive(Debug, Clone, Copy)]
pub struct Session {
    /// The broker's session lifetime (SaslAuthenticate v1+), 0 = unlimited.
    pub lifetime_ms: i64,
}

/// Authenticates `stream` with `creds` within `limit`.
pub async fn authenticate<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    creds: &ClientCredentials,
    limit: Duration,
) -> Result<Session, SaslError> {
    match tokio::time::timeout(limit, exchange(stream, creds)).await {
        Ok(r) => r,
        Err(_) => Err(SaslError::Io(format!(
            "no answer within {limit:?} while authenticating as {} with {}",
            creds.username, creds.mechanism
        ))),
    }
}

/// One request frame out, its response frame (without the size prefix)
/// back: how [`reauthenticate`] reaches the broker on a connection someone
/// else owns.
pub(crate) trait SaslRoundTrip {
    /// Sends `frame` (size prefix included) and returns the next response
    /// frame of the connection, without its size prefix.
    async fn round_trip(&mut self, frame: Vec<u8>) -> Result<Vec<u8>, SaslError>;
}

/// A stream nothing else uses: frames written and read directly.
struct Direct<'a, S>(&'a mut S);

impl<S: AsyncRead + AsyncWrite + Unpin> SaslRoundTrip for Direct<'_, S> {
    async fn round_trip(&mut self, frame: Vec<u8>) -> Result<Vec<u8>, SaslError> {
        let io = |e: std::io::Error| SaslError::Io(e.to_string());
        self.0.write_all(&frame).await.map_err(io)?;
        self.0.flush().await.map_err(io)?;
        read_frame(self.0, MAX_SASL_FRAME).await
    }
}

/// Re-authenticates (KIP-368) an authenticated connection through `rt`:
/// the same SaslHandshake v1 and SaslAuthenticate v1 rounds as the first
/// time. The caller makes sure nothing else is in flight on it (responses
/// are read in order) and bounds the time.
pub(crate) async fn reauthenticate<T: SaslRoundTrip>(
    rt: &mut T,
    creds: &ClientCredentials,
) -> Result<Session, SaslError> {
    run(rt, creds).await
}

/// When to re-authenticate a session of `lifetime_ms` (0 or less: it never
/// expires), measured from the end of the authentication: `fraction`
/// (0..1, uniformly random) places it between 85% and 95% of the lifetime,
/// as Kafka's Java client does.
pub fn reauth_delay(lifetime_ms: i64, fraction: f64) -> Option<Duration> {
    if lifetime_ms <= 0 {
        return None;
    }
    let pct = 0.85 + 0.10 * fraction.clamp(0.0, 1.0);
    Some(Duration::from_millis((lifetime_ms as f64 * pct) as u64))
}

/// A uniformly random fraction in 0..1 for [`reauth_delay`] (0.5 if the
/// system's random source fails: the jitter only spreads load).
pub fn jitter() -> f64 {
    let mut b = [0u8; 4];
    match getrandom::getrandom(&mut b) {
        Ok(()) => f64::from(u32::from_be_bytes(b)) / f64::from(u32::MAX),
        Err(_) => 0.5,
    }
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    creds: &ClientCredentials,
) -> Result<Session, SaslError> {
    run(&mut Direct(stream), creds).await
}

async fn run<T: SaslRoundTrip>(
    stream: &mut T,
    creds: &ClientCredentials,
) -> Result<Session, SaslError> {
    let mut corr = 0;
    // SaslHandshake v1: mechanism -> error_code, mechanisms.
    let body = roundtrip(stream, &mut corr, SASL_HANDSHAKE, |w| {
        w.put_string(creds.mechanism.name(), "SaslHandshakeRequest.mechanism")
    })
    .await?;
    let mut r = Reader::new(&body);
    let code = r.read_i16("SaslHandshakeResponse.error_code")?;
    let n = r
        .read_array_len(2, "SaslHandshakeResponse.mechanisms")?
        .unwrap_or(0);
    let mut offered = Vec::with_capacity(n);
    for _ in 0..n {
        offered.push(
            r.read_string("SaslHandshakeResponse.mechanisms")?
                .to_owned(),
        );
    }
    match code {
        0 => {}
        33 => {
            return Err(SaslError::Mechanism {
                wanted: creds.mechanism.name().into(),
                offered,
            })
        }
        34 => {
            return Err(SaslError::Rejected(
                "the broker's listener does not use SASL (ILLEGAL_SASL_STATE): \
                 remove the credentials or point at a SASL listener"
                    .into(),
            ))
        }
        c => {
            return Err(SaslError::Rejected(format!(
                "SaslHandshake answered {}",
                crate::codec::api::error_name(c)
            )))
        }
    }
    let user = &creds.username;
    let password = creds.password.expose();
    match creds.mechanism {
        Mechanism::Plain => {
            let mut token = Vec::with_capacity(user.len() + password.len() + 2);
            token.push(0);
            token.extend_from_slice(user.as_bytes());
            token.push(0);
            token.extend_from_slice(password);
            let (_, session) = authenticate_round(stream, &mut corr, &token).await?;
            Ok(session)
        }
        m => {
            let mut scram = ScramClient::new(m, user, password, None)?;
            let (server_first, _) =
                authenticate_round(stream, &mut corr, scram.client_first().as_bytes()).await?;
            let server_first = std::str::from_utf8(&server_first)
                .map_err(|_| SaslError::malformed("server-first is not UTF-8"))?;
            let client_final = scram.client_final(server_first)?;
            let (server_final, session) =
                authenticate_round(stream, &mut corr, client_final.as_bytes()).await?;
            let server_final = std::str::from_utf8(&server_final)
                .map_err(|_| SaslError::malformed("server-final is not UTF-8"))?;
            scram.verify_server_final(server_final)?;
            Ok(session)
        }
    }
}

/// One SaslAuthenticate v1 round: our token out, the server's back.
async fn authenticate_round<S: SaslRoundTrip>(
    stream: &mut S,
    corr: &mut i32,
    token: &[u8],
) -> Result<(Vec<u8>, Session), SaslError> {
    let body = roundtrip(stream, corr, SASL_AUTHENTICATE, |w| {
        w.put_bytes(token, "SaslAuthenticateRequest.auth_bytes")
    })
    .await?;
    let mut r = Reader::new(&body);
    let code = r.read_i16("SaslAuthenticateResponse.error_code")?;
    let message = r.read_nullable_string("SaslAuthenticateResponse.error_message")?;
    let bytes = r
        .read_bytes("SaslAuthenticateResponse.auth_bytes")?
        .to_vec();
    let lifetime_ms = r.read_i64("SaslAuthenticateResponse.session_lifetime_ms")?;
    if code != 0 {
        return Err(SaslError::Rejected(format!(
            "{}{}",
            crate::codec::api::error_name(code),
            message.map(|m| format!(": {m}")).unwrap_or_default()
        )));
    }
    Ok((bytes, Session { lifetime_ms }))
}

/// Sends one v1 request of `api` and returns its response body.
async fn roundtrip<S: SaslRoundTrip>(
    stream: &mut S,
    corr: &mut i32,
    api: i16,
    body: impl FnOnce(&mut crate::wire::Writer<Vec<u8>>) -> crate::wire::WireResult<()>,
) -> Result<Vec<u8>, SaslError> {
    *corr += 1;
    let frame = request_frame(api, 1, *corr, CLIENT_ID, body)?;
    let resp = stream.round_trip(frame.to_vec()).await?;
    if resp.len() > MAX_SASL_FRAME {
        return Err(SaslError::malformed(format!(
            "SASL response of {} bytes",
            resp.len()
        )));
    }
    // Both APIs answer v1 with response header v0: correlation id only.
    let got = resp
        .get(..4)
        .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]));
    if got != Some(*corr) {
        return Err(SaslError::malformed(format!(
            "response carries correlation id {got:?}, expected {corr}"
        )));
    }
    Ok(resp[4..].to_vec())
}

/// Reads one size-prefixed frame (without its size) of at most `max` bytes,
/// consuming nothing beyond it.
pub(crate) async fn read_frame<S: AsyncRead + Unpin>(
    stream: &mut S,
    max: usize,
) -> Result<Vec<u8>, SaslError> {
    let mut size = [0u8; 4];
    stream.read_exact(&mut size).await.map_err(|e| {
        SaslError::Io(match e.kind() {
            std::io::ErrorKind::UnexpectedEof => {
                "the peer closed the connection (a broker closes it after a failed \
                 authentication or on a request it does not accept before one)"
                    .to_owned()
            }
            _ => e.to_string(),
        })
    })?;
    let size = i32::from_be_bytes(size);
    let size = usize::try_from(size)
        .ok()
        .filter(|s| (4..=max).contains(s))
        .ok_or_else(|| SaslError::malformed(format!("frame size {size} out of range")))?;
    let mut buf = vec![0u8; size];
    stream
        .read_exact(&mut buf)
        .await
        .map_err(|e| SaslError::Io(e.to_string()))?;
    Ok(buf)
}

impl From<crate::wire::WireError> for SaslError {
    fn from(e: crate::wire::WireError) -> Self {
        SaslError::Malformed(e.to_string())
    }
}
