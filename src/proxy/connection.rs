//! One client connection: two pumps and the correlation queue between them.
//!
//! The request pump reads client frames, notes each request that expects a
//! response in a FIFO (Kafka answers requests on a connection in order), and
//! forwards the frame untouched. The response pump takes the oldest in-flight
//! entry, reads the upstream frame that answers it, checks the correlation id,
//! passes it through the listener's filter [`Chain`] (which rewrites what
//! its filters handle), and writes it to the client. A Produce with
//! `acks=0` never gets an entry. Nothing is locked across an `.await`: the
//! queue is a channel owned by the two pumps.
//!
//! Listeners whose chain can answer without the upstream (mirror
//! listeners, [`Chain::serves_offline`]) never lose a client to a
//! dead or hung upstream: each request gets a deadline, and when the upstream
//! refuses, closes, or misses a deadline the connection goes *offline* for
//! good: owed and later requests are answered by
//! [`Chain::offline_answer`] (no earlier than the time the request
//! allowed the broker to wait), and once the listener sees the upstream again
//! the connection stops reading, delivers what it owes and closes, so the
//! client reconnects to the live upstream.
//!
//! Frames the chain will not rewrite are relayed *cut-through*: a request
//! no filter reads, or whose head shows every filter that reads it lets it
//! pass untouched ([`Chain::streams_request`]: the produce guard, when no
//! partition of it is refused), and a response with no
//! request state that no filter handles ([`Chain::wants`]) are forwarded as
//! they arrive, in pieces of at most
//! [`READ_CHUNK`](crate::codec::frame::READ_CHUNK) bytes, once their head
//! (size, header, correlation id) has been read and checked; only frames of
//! at most [`STREAM_ABOVE`] bytes, and the frames the chain rewrites (but
//! see below), are held whole. So
//! a plain or guard listener's Produce requests and Fetch responses (below
//! v16, whose responses carry no addresses) cost one piece of memory
//! whatever their size. Requests a mirror listener keeps for a local answer (Fetch,
//! Metadata, ApiVersions: all small) are held whole; so are the responses
//! to requests it keeps, because a local answer is only possible while
//! nothing of the upstream's has reached the client.
//!
//! A mirror listener's Fetch responses are rewritten, yet large ones stream
//! too: when one filter of the chain rewrites a response as it arrives and
//! the others leave it alone ([`Chain::response_stream`]), the frame goes
//! through that filter's walker ([`crate::mirror::stream`]), which holds
//! back only what must change first. If the upstream fails before a byte of
//! it reached the client, the request is still answered locally like a held
//! one; after that the connection closes.
//!
//! A client that abandons a streamed request mid-frame has had part of it
//! forwarded: the connection then ends, closing the upstream connection
//! too, so the broker sees a truncated frame on a closed socket and never
//! acts on it (Kafka reads whole frames). An upstream that fails in the
//! middle of a streamed response likewise ends the connection: the client
//! sees a closed socket, never a short frame followed by another.
//!
//! A mirror listener's upstream connection is authenticated with
//! mirrorguard's own credentials; when the source gives the session a
//! lifetime (`connections.max.reauth.ms`, KIP-368) the relay
//! re-authenticates it in place before it expires ([`Reauth`]): the request
//! pump stops taking client frames, queues a barrier and waits until the
//! response pump has delivered every answer owed (the SASL rounds then
//! cannot be mistaken for, or interleave with, client responses), and runs
//! the SaslHandshake/SaslAuthenticate rounds itself: each round queues an
//! explicit internal entry, so the response pump hands the broker's answer
//! back to the request pump instead of forwarding it. Client frames resume
//! afterwards. A failed re-authentication is an upstream failure: the
//! connection goes offline (answered locally) as on any other.
//!
//! (Over 600 lines on purpose: the two pumps, their shared `Mode` and the
//! in-flight queue are one state machine, easier to check read in one place.)

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch};

use crate::codec::api;
use crate::codec::header::{
    produce_acks, request_body_offset, response_correlation_id, RequestHeader,
};
use crate::codec::{CopyError, FrameError, FrameReader};
use crate::filter::{Chain, Decision, RequestState, RewriteError, Rewritten};
use crate::metrics::{ApiMetrics, Metrics};
use crate::proxy::limits::{BudgetPermit, LogLimiter, MemoryBudget, SMALL_REQUEST_BYTES};
use crate::sasl::client::{reauth_delay, SaslRoundTrip};
use crate::sasl::server::{Exchange, ServerAuth, Step};
use crate::sasl::{ClientCredentials, SaslError};

/// Most requests one client may have outstanding before the proxy stops
/// reading from it (librdkafka's default max.in.flight is 1,000,000 per
/// connection, but anything near this bound means a stuck upstream).
const MAX_IN_FLIGHT: usize = 4096;

/// Frames longer than this (size prefix included) are relayed cut-through
/// when the chain does not rewrite them (or rewrites them as they arrive: a
/// mirror's Fetch); shorter ones are held whole. Its own constant, not the
/// read size: a bigger read must not hold more responses whole.
pub const STREAM_ABOVE: usize = 64 * 1024;

/// The most of a request's head read to find its header (and a Produce's
/// `acks`) before deciding to stream it: the client id and transactional
/// id are at most 32 KiB each. A request whose header does not fit is held
/// whole.
const MAX_REQUEST_HEAD: usize = 96 * 1024;

/// Longest a re-authentication waits for the answers owed to the client
/// before it starts (kept requests have their own, shorter, deadlines).
const MAX_REAUTH_DRAIN: Duration = Duration::from_secs(30);

/// Re-authentication (KIP-368) of the upstream connection with
/// mirrorguard's own credentials (mirror listeners with `source_sasl`).
pub struct Reauth {
    /// The credentials the connection authenticated with.
    pub creds: Arc<ClientCredentials>,
    /// The session lifetime the broker gave (ms, 0 = unlimited).
    pub lifetime_ms: i64,
    /// When that authentication ended.
    pub authenticated_at: Instant,
    /// Bound on the SASL rounds of one re-authentication.
    pub limit: Duration,
}

impl Reauth {
    /// When a session of `lifetime_ms` that began at `at` is re-authenticated.
    fn due(lifetime_ms: i64, at: Instant) -> Option<Instant> {
        reauth_delay(lifetime_ms, crate::sasl::client::jitter()).map(|d| at + d)
    }
}

/// An entry of the in-flight queue, in upstream order. (Nearly every entry
/// is a client request: boxing it would cost an allocation per request.)
#[allow(clippy::large_enum_variant)]
enum Entry {
    /// A client request.
    Client(InFlight),
    /// Re-authentication: signalled once every earlier answer is delivered.
    Barrier(oneshot::Sender<()>),
    /// Re-authentication: the next upstream frame (without its size) is a
    /// SASL response for the request pump, not for the client.
    Sasl(oneshot::Sender<Result<Vec<u8>, SaslError>>),
}

/// A request whose response is owed to the client, in request order.
pub struct InFlight {
    /// Header of the request.
    pub header: RequestHeader,
    /// When it was forwarded.
    pub sent_at: Instant,
    /// Metric handles of its API.
    pub metrics: ApiMetrics,
    /// What a filter attached to the request, for its response.
    pub state: Option<RequestState>,
    /// Answered by the proxy itself (by this filter of the chain): nothing
    /// is read from upstream for it.
    pub answered_by: Option<usize>,
    /// A Produce with `acks=0`: Kafka sends no response, but some brokers
    /// (Tansu) do; such a response is recognised by its id and dropped.
    pub unanswered: bool,
    /// The listener answers it locally if the upstream fails
    /// ([`Chain::serves_offline`]): it has a deadline, and its response is
    /// never streamed.
    pub kept: bool,
    /// The request as forwarded, kept for [`Chain::offline_answer`] (only
    /// for APIs some filter [answers offline](Chain::answers_offline)).
    pub request: Option<BytesMut>,
    /// When the upstream's answer is overdue (offline-capable listeners).
    pub deadline: Option<Instant>,
    /// The answer, built already (a SASL re-authentication round).
    pub local: Option<BytesMut>,
    /// The budget held by `request`.
    pub permit: Option<BudgetPermit>,
}

/// Whether a listener's upstream answers, shared by its connections.
#[derive(Default)]
pub struct UpstreamHealth {
    /// Bumped each time the upstream is seen again after a failure.
    recoveries: AtomicU64,
    down: AtomicBool,
}

impl UpstreamHealth {
    /// The upstream answered (a Metadata refresh succeeded).
    pub fn up(&self) {
        if self.down.swap(false, Ordering::SeqCst) {
            self.recoveries.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// The upstream did not answer (a refresh or a connection failed).
    pub fn down(&self) {
        self.down.store(true, Ordering::SeqCst);
    }

    /// Whether the last observation was a failure.
    pub fn is_down(&self) -> bool {
        self.down.load(Ordering::SeqCst)
    }

    /// The recovery count (changes when the upstream comes back).
    pub fn generation(&self) -> u64 {
        self.recoveries.load(Ordering::SeqCst)
    }
}

/// How many times one response may block before the connection gives up.
/// Each round does all of one step of the work a response needs (a seal's
/// take-overs, replays and persists for every partition of a fetch go in one
/// round each: `mirror::seal_path::jobs`), so a response that makes progress
/// needs a handful, whatever the number of partitions it carries.
const MAX_REWRITE_ROUNDS: usize = 16;

/// What a connection needs from its listener.
pub struct ConnectionContext {
    /// Listener name (logs, metric labels).
    pub listener: String,
    /// Frame limit.
    pub max_frame: usize,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The listener's filters, for the APIs they decode.
    pub chain: Arc<Chain>,
    /// The listener's view of its upstream (offline connections close once
    /// it recovers).
    pub health: Arc<UpstreamHealth>,
    /// The process-wide budget of request bytes held in memory.
    pub budget: Arc<MemoryBudget>,
}

/// How a connection ended, by side and cause. Only `ClientProtocol` is a
/// malformed-input event; a client that goes away (cleanly, by reset, or in the
/// middle of sending a request because it timed out) is ordinary.
#[derive(Debug)]
pub enum ConnectionEnd {
    /// The client closed between frames.
    ClientClosed,
    /// The client's socket failed (reset, broken pipe) while reading its
    /// requests or writing its responses.
    ClientReset(String),
    /// The client closed in the middle of sending a request (typically its
    /// own request timeout). A request held whole was not forwarded at all;
    /// a streamed one was in part, and the upstream connection is closed
    /// with this one so the broker never acts on the partial frame.
    ClientAbandonedRequest {
        /// Bytes of the frame received (including the 4-byte size).
        got: usize,
        /// Bytes the frame announced (including the size).
        expected: usize,
    },
    /// The upstream closed or failed.
    UpstreamClosed(String),
    /// The client sent something that is not Kafka.
    ClientProtocol(String),
    /// The upstream sent something the proxy cannot pass on safely.
    UpstreamProtocol(String),
    /// Shutdown drained the connection.
    Drained,
    /// The client's session ended: a failed re-authentication, or a
    /// request after the session expired (KIP-368).
    Authentication(String),
    /// A request the process could not hold within
    /// `[limits] max_buffered_request_bytes`.
    OverBudget {
        /// The request's size (size prefix included).
        size: usize,
    },
}

impl ConnectionEnd {
    /// The side that ended the connection: `client`, `upstream` or `proxy`.
    pub fn side(&self) -> &'static str {
        match self {
            ConnectionEnd::ClientClosed
            | ConnectionEnd::ClientReset(_)
            | ConnectionEnd::ClientAbandonedRequest { .. }
            | ConnectionEnd::ClientProtocol(_)
            | ConnectionEnd::Authentication(_) => "client",
            ConnectionEnd::UpstreamClosed(_) | ConnectionEnd::UpstreamProtocol(_) => "upstream",
            ConnectionEnd::Drained | ConnectionEnd::OverBudget { .. } => "proxy",
        }
    }

    /// The cause, a stable label of `mirrorguard_connection_ends_total`:
    /// `closed`, `reset`, `mid_request`, `protocol`, `shutdown`,
    /// `authentication` or `limit`.
    pub fn cause(&self) -> &'static str {
        match self {
            ConnectionEnd::ClientClosed | ConnectionEnd::UpstreamClosed(_) => "closed",
            ConnectionEnd::ClientReset(_) => "reset",
            ConnectionEnd::ClientAbandonedRequest { .. } => "mid_request",
            ConnectionEnd::ClientProtocol(_) | ConnectionEnd::UpstreamProtocol(_) => "protocol",
            ConnectionEnd::Drained => "shutdown",
            ConnectionEnd::Authentication(_) => "authentication",
            ConnectionEnd::OverBudget { .. } => "limit",
        }
    }
}

/// Relays one client connection to one upstream connection until either
/// side ends or shutdown is signalled (then in-flight requests are drained).
pub async fn relay<C, U>(
    client: C,
    upstream: U,
    peer: SocketAddr,
    ctx: Arc<ConnectionContext>,
    shutdown: watch::Receiver<bool>,
) -> ConnectionEnd
where
    C: AsyncRead + AsyncWrite + Unpin + Send,
    U: AsyncRead + AsyncWrite + Unpin + Send,
{
    relay_reauth(client, upstream, peer, ctx, shutdown, None).await
}

/// [`relay`] re-authenticating the upstream connection before its session
/// expires (`reauth`).
pub async fn relay_reauth<C, U>(
    client: C,
    upstream: U,
    peer: SocketAddr,
    ctx: Arc<ConnectionContext>,
    shutdown: watch::Receiver<bool>,
    reauth: Option<Reauth>,
) -> ConnectionEnd
where
    C: AsyncRead + AsyncWrite + Unpin + Send,
    U: AsyncRead + AsyncWrite + Unpin + Send,
{
    let opts = RelayOptions {
        reauth,
        ..RelayOptions::default()
    };
    relay_opts(client, upstream, peer, ctx, shutdown, opts).await
}

/// What a relayed connection starts with besides its two streams.
#[derive(Default)]
pub struct RelayOptions {
    /// Re-authentication of the upstream connection (mirror listeners).
    pub reauth: Option<Reauth>,
    /// Client bytes read before the relay started (the head of its first
    /// request, read before the upstream was opened).
    pub prefix: BytesMut,
    /// The client's authenticated session on a listener that terminates
    /// SASL: it must re-authenticate (KIP-368) before it expires.
    pub session: Option<ClientSession>,
}

/// A client's SASL session on a mirror listener.
pub struct ClientSession {
    /// The listener's authentication (for re-authentications).
    pub server: Arc<ServerAuth>,
    /// The authenticated principal (`User:<name>`); a re-authentication
    /// must keep it.
    pub principal: String,
    /// When the session ends (`None`: never).
    pub expires_at: Option<Instant>,
}

/// [`relay`] with [`RelayOptions`].
pub async fn relay_opts<C, U>(
    client: C,
    upstream: U,
    peer: SocketAddr,
    ctx: Arc<ConnectionContext>,
    shutdown: watch::Receiver<bool>,
    opts: RelayOptions,
) -> ConnectionEnd
where
    C: AsyncRead + AsyncWrite + Unpin + Send,
    U: AsyncRead + AsyncWrite + Unpin + Send,
{
    relay_inner(
        client,
        upstream,
        peer,
        ctx,
        shutdown,
        false,
        STREAM_ABOVE,
        opts,
    )
    .await
}

/// Serves a client whose upstream could not be reached: every request is
/// answered by [`Chain::offline_answer`] (listeners that
/// [`serve offline`](Chain::serves_offline) only).
pub async fn serve_offline<C>(
    client: C,
    peer: SocketAddr,
    ctx: Arc<ConnectionContext>,
    shutdown: watch::Receiver<bool>,
) -> ConnectionEnd
where
    C: AsyncRead + AsyncWrite + Unpin + Send,
{
    serve_offline_opts(client, peer, ctx, shutdown, RelayOptions::default()).await
}

/// [`serve_offline`] with [`RelayOptions`] (the upstream's are unused).
pub async fn serve_offline_opts<C>(
    client: C,
    peer: SocketAddr,
    ctx: Arc<ConnectionContext>,
    shutdown: watch::Receiver<bool>,
    opts: RelayOptions,
) -> ConnectionEnd
where
    C: AsyncRead + AsyncWrite + Unpin + Send,
{
    // Never read or written while offline; the other end is dropped.
    let (dead, _) = tokio::io::duplex(1);
    relay_inner(client, dead, peer, ctx, shutdown, true, STREAM_ABOVE, opts).await
}

/// The connection's mode, shared by its pumps.
struct Mode {
    offline: AtomicBool,
    /// The upstream generation when the connection went offline.
    since: AtomicU64,
}

impl Mode {
    fn go_offline(&self, ctx: &ConnectionContext, peer: SocketAddr, why: &str) {
        if !self.offline.swap(true, Ordering::SeqCst) {
            self.since.store(ctx.health.generation(), Ordering::SeqCst);
            ctx.health.down();
            Metrics::count(&ctx.metrics.upstream_errors, &ctx.listener, "offline");
            tracing::warn!(listener = %ctx.listener, %peer, reason = why,
                "upstream unavailable: answering this connection locally until the upstream is back");
        }
    }

    fn is_offline(&self) -> bool {
        self.offline.load(Ordering::SeqCst)
    }

    /// Offline, and the listener has seen the upstream again since.
    fn upstream_back(&self, ctx: &ConnectionContext) -> bool {
        self.is_offline()
            && !ctx.health.is_down()
            && ctx.health.generation() != self.since.load(Ordering::SeqCst)
    }
}

/// [`relay`] with the cut-through threshold as a parameter (`usize::MAX`:
/// every frame held whole), so tests can compare both paths.
#[cfg(test)]
pub(crate) async fn relay_with<C, U>(
    client: C,
    upstream: U,
    peer: SocketAddr,
    ctx: Arc<ConnectionContext>,
    shutdown: watch::Receiver<bool>,
    offline: bool,
    stream_above: usize,
) -> ConnectionEnd
where
    C: AsyncRead + AsyncWrite + Unpin + Send,
    U: AsyncRead + AsyncWrite + Unpin + Send,
{
    relay_inner(
        client,
        upstream,
        peer,
        ctx,
        shutdown,
        offline,
        stream_above,
        RelayOptions::default(),
    )
    .await
}

#[allow(clippy::too_many_arguments)]
async fn relay_inner<C, U>(
    client: C,
    upstream: U,
    peer: SocketAddr,
    ctx: Arc<ConnectionContext>,
    mut shutdown: watch::Receiver<bool>,
    offline: bool,
    stream_above: usize,
    opts: RelayOptions,
) -> ConnectionEnd
where
    C: AsyncRead + AsyncWrite + Unpin + Send,
    U: AsyncRead + AsyncWrite + Unpin + Send,
{
    let RelayOptions {
        reauth,
        prefix,
        session,
    } = opts;
    let (client_rd, client_wr) = tokio::io::split(client);
    let (upstream_rd, upstream_wr) = tokio::io::split(upstream);
    let (tx, rx) = mpsc::channel::<Entry>(MAX_IN_FLIGHT);
    let mode = Mode {
        offline: AtomicBool::new(false),
        since: AtomicU64::new(0),
    };
    if offline {
        mode.go_offline(&ctx, peer, "cannot connect");
    }

    let requests = request_pump(
        FrameReader::with_buffer(client_rd, ctx.max_frame, prefix),
        upstream_wr,
        tx,
        &ctx,
        peer,
        &mut shutdown,
        &mode,
        stream_above,
        reauth.as_ref(),
        session,
    );
    let responses = response_pump(upstream_rd, client_wr, rx, &ctx, peer, &mode, stream_above);
    tokio::pin!(requests, responses);
    tokio::select! {
        end = &mut requests => match end {
            // Stop reading new requests, but deliver the answers owed.
            ConnectionEnd::Drained => match responses.await {
                ConnectionEnd::ClientClosed => ConnectionEnd::Drained,
                other => other,
            },
            // The same for a failed re-authentication: its answer is owed.
            ConnectionEnd::Authentication(why) => match responses.await {
                ConnectionEnd::ClientClosed => ConnectionEnd::Authentication(why),
                other => other,
            },
            other => other,
        },
        end = &mut responses => end,
    }
}

/// How a client read error ends the connection.
fn client_read_end(ctx: &ConnectionContext, peer: SocketAddr, e: FrameError) -> ConnectionEnd {
    match e {
        FrameError::Io(e) => ConnectionEnd::ClientReset(format!("reading: {e}")),
        FrameError::Truncated { got, expected } => {
            ConnectionEnd::ClientAbandonedRequest { got, expected }
        }
        e => {
            Metrics::count(&ctx.metrics.frame_errors, &ctx.listener, e.kind());
            tracing::warn!(listener = %ctx.listener, %peer, kind = e.kind(), error = %e,
                "closing client connection: malformed frame");
            ConnectionEnd::ClientProtocol(e.to_string())
        }
    }
}

/// The request header of `frame` (the fixed part, and for every API whose
/// header version is known the whole header: client id and tagged fields).
fn parse_request_header(
    frame: &[u8],
) -> Result<RequestHeader, crate::codec::header::RequestHeaderError> {
    RequestHeader::parse(frame).and_then(|h| {
        match crate::handlers::request_header_version(h.api_key, h.api_version) {
            Some(hv) if hv >= 1 => request_body_offset(frame, hv).map(|_| h),
            _ => Ok(h),
        }
    })
}

/// How [`stream_head`] decided.
enum Head {
    /// Stream this request (its header).
    Stream(RequestHeader),
    /// Hold it whole.
    Hold,
    /// Its head could not be held within the budget.
    OverBudget,
}

/// Reads the head of the next request (`total` bytes long), growing it up
/// to [`MAX_REQUEST_HEAD`], until the request may be streamed: its header
/// (and for a Produce its `acks`) is in the head, the listener would not
/// keep it whole, and every filter that reads it can decide from the head
/// ([`Chain::streams_request`]). Stops at once when no more of the head
/// can change the decision ([`Chain::head_may_decide`]: a request the
/// listener keeps, or one whose readers cannot decide from a head); a head
/// grown past [`SMALL_REQUEST_BYTES`] holds its size in the budget.
async fn stream_head<R: AsyncRead + Unpin>(
    reader: &mut FrameReader<R>,
    total: usize,
    ctx: &ConnectionContext,
    permit: &mut Option<BudgetPermit>,
) -> Result<Head, FrameError> {
    let chain = &ctx.chain;
    let mut want = 512;
    loop {
        reader.peek(want).await?;
        let head = reader.head(total);
        let complete = head.len() == total;
        if let Ok(h) = parse_request_header(head) {
            let hv = api::request_header_version(api::PRODUCE, h.api_version).unwrap_or(1);
            let acks_known =
                h.api_key != api::PRODUCE || produce_acks(head, h.api_version, hv).is_some();
            if acks_known && chain.streams_request(&h, head, total) {
                return Ok(Head::Stream(h));
            }
            if acks_known && !chain.head_may_decide(&h) {
                return Ok(Head::Hold);
            }
        }
        if complete || want >= MAX_REQUEST_HEAD {
            return Ok(Head::Hold);
        }
        want = (want * 8).min(MAX_REQUEST_HEAD);
        if want.min(total) > SMALL_REQUEST_BYTES {
            match ctx.budget.acquire(want.min(total)) {
                Some(p) => *permit = Some(p),
                None => return Ok(Head::OverBudget),
            }
        }
    }
}

/// The end of a connection whose request could not be held within the
/// budget (logged at most once a second per process).
fn over_budget(ctx: &ConnectionContext, peer: SocketAddr, size: usize) -> ConnectionEnd {
    static LOG: LogLimiter = LogLimiter::new();
    ctx.metrics
        .budget_refused
        .get_or_create(&crate::metrics::ListenerLabels {
            listener: ctx.listener.clone(),
        })
        .inc();
    if let Some(held_back) = LOG.allow() {
        tracing::warn!(listener = %ctx.listener, %peer, size, used = ctx.budget.used(),
            limit = ctx.budget.limit(), held_back,
            "closing client connection: its request cannot be held within \
             [limits] max_buffered_request_bytes");
    }
    ConnectionEnd::OverBudget { size }
}

const SASL_HANDSHAKE: i16 = 17;
const SASL_AUTHENTICATE: i16 = 36;

/// A client's re-authentication (KIP-368) in progress, and its session.
struct SessionState {
    session: ClientSession,
    exchange: Option<Exchange>,
}

/// What the request pump does with a request of a client that has a SASL
/// session: `Ok(None)` relay it; `Ok(Some(frame))` answer it with `frame`
/// (a SASL round); `Err` ends the connection (after delivering `frame`
/// when the error carries one).
async fn session_step(
    state: &mut SessionState,
    ctx: &ConnectionContext,
    peer: SocketAddr,
    header: &RequestHeader,
    frame: &[u8],
) -> Result<Option<BytesMut>, (Option<BytesMut>, String)> {
    let sasl = header.api_key == SASL_HANDSHAKE || header.api_key == SASL_AUTHENTICATE;
    if !sasl {
        if state.exchange.is_some() {
            return Err((
                None,
                "a request in the middle of a re-authentication".into(),
            ));
        }
        if state
            .session
            .expires_at
            .is_some_and(|at| Instant::now() >= at)
        {
            ctx.metrics
                .count_client_authentication(&ctx.listener, "expired");
            return Err((
                None,
                format!(
                    "{} v{} after the client's session expired (KIP-368: it must \
                     re-authenticate first)",
                    api::api_display(header.api_key),
                    header.api_version
                ),
            ));
        }
        return Ok(None);
    }
    if header.api_key == SASL_HANDSHAKE {
        state.exchange = Some(state.session.server.exchange());
    }
    let Some(exchange) = state.exchange.as_mut() else {
        return Err((None, "SaslAuthenticate without a SaslHandshake".into()));
    };
    match exchange.step(header, frame, &ctx.listener) {
        Step::Answer(f) => Ok(Some(f)),
        Step::Authenticated {
            frame: f,
            principal,
        } => {
            state.exchange = None;
            if principal != state.session.principal {
                ctx.metrics
                    .count_client_authentication(&ctx.listener, "failed");
                return Err((
                    None,
                    format!(
                        "re-authenticated as {principal}, not {}: a session cannot change \
                         principals",
                        state.session.principal
                    ),
                ));
            }
            ctx.metrics.count_client_authentication(&ctx.listener, "ok");
            state.session.expires_at = state.session.server.session_end(Instant::now());
            tracing::debug!(listener = %ctx.listener, %peer, principal = %principal,
                "client re-authenticated");
            Ok(Some(f))
        }
        Step::Failed { frame: f, why } => {
            ctx.metrics
                .count_client_authentication(&ctx.listener, "failed");
            if f.is_some() {
                tokio::time::sleep(crate::sasl::server::FAILED_AUTH_DELAY).await;
            }
            Err((f, format!("re-authentication failed: {why}")))
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn request_pump<R, W>(
    mut reader: FrameReader<R>,
    mut upstream_wr: W,
    tx: mpsc::Sender<Entry>,
    ctx: &ConnectionContext,
    peer: SocketAddr,
    shutdown: &mut watch::Receiver<bool>,
    mode: &Mode,
    stream_above: usize,
    reauth: Option<&Reauth>,
    session: Option<ClientSession>,
) -> ConnectionEnd
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut api_metrics: HashMap<i16, ApiMetrics> = HashMap::new();
    let keeps = ctx.chain.serves_offline();
    let mut reauth_at = reauth.and_then(|r| Reauth::due(r.lifetime_ms, r.authenticated_at));
    let mut session = session.map(|session| SessionState {
        session,
        exchange: None,
    });
    loop {
        if mode.upstream_back(ctx) {
            // Deliver what is owed, then close: the client reconnects to the
            // live upstream.
            tracing::info!(listener = %ctx.listener, %peer,
                "upstream is back: closing the locally answered connection so the client reconnects");
            return ConnectionEnd::Drained;
        }
        // The head first (cancellation safe, like the whole-frame read):
        // long frames no filter reads are streamed from there.
        // An offline connection has no upstream session to keep.
        let due = reauth_at.filter(|_| !mode.is_offline());
        // (The re-authentication runs outside the select: the shutdown
        // signal's guard must not live across its awaits.)
        let peeked = tokio::select! {
            biased;
            _ = shutdown.wait_for(|s| *s) => return ConnectionEnd::Drained,
            _ = sleep_until_some(due) => None,
            t = reader.peek(8) => Some(t),
        };
        let Some(peeked) = peeked else {
            if let Some(r) = reauth {
                match reauthenticate(&mut upstream_wr, &tx, ctx, peer, mode, r).await {
                    Ok(next) => reauth_at = next,
                    Err(end) => return end,
                }
            }
            continue;
        };
        let total = match peeked {
            Ok(Some(total)) => total,
            Ok(None) => return ConnectionEnd::ClientClosed,
            Err(e) => return client_read_end(ctx, peer, e),
        };
        // A client with a session streams nothing: each of its requests is
        // checked against the session first.
        let mut head_permit = None;
        if total > stream_above && session.is_none() {
            match stream_head(&mut reader, total, ctx, &mut head_permit).await {
                Ok(Head::Stream(header)) => {
                    drop(head_permit);
                    match stream_request(
                        &mut reader,
                        &mut upstream_wr,
                        &tx,
                        ctx,
                        peer,
                        mode,
                        &mut api_metrics,
                        header,
                        total,
                    )
                    .await
                    {
                        Ok(()) => continue,
                        Err(end) => return end,
                    }
                }
                Ok(Head::Hold) => {}
                Ok(Head::OverBudget) => return over_budget(ctx, peer, total),
                Err(e) => return client_read_end(ctx, peer, e),
            }
        }
        // Held whole: its bytes count against the budget until it is
        // forwarded (or, kept for a local answer, until it is answered).
        let Some(permit) = ctx.budget.acquire(total) else {
            return over_budget(ctx, peer, total);
        };
        drop(head_permit);
        let frame = tokio::select! {
            biased;
            _ = shutdown.wait_for(|s| *s) => return ConnectionEnd::Drained,
            f = reader.next_frame() => f,
        };
        let frame = match frame {
            Ok(Some(f)) => f,
            Ok(None) => return ConnectionEnd::ClientClosed,
            Err(e) => return client_read_end(ctx, peer, e),
        };
        let header = match parse_request_header(&frame) {
            Ok(h) => h,
            Err(e) => {
                Metrics::count(&ctx.metrics.frame_errors, &ctx.listener, "bad_header");
                tracing::warn!(listener = %ctx.listener, %peer, error = %e,
                    "closing client connection: unreadable request header");
                return ConnectionEnd::ClientProtocol(e.to_string());
            }
        };
        let m = api_metrics
            .entry(header.api_key)
            .or_insert_with(|| ctx.metrics.api(&ctx.listener, header.api_key));
        m.requests.inc();
        m.bytes_in.inc_by(frame.len() as u64);
        if let Some(state) = session.as_mut() {
            match session_step(state, ctx, peer, &header, &frame).await {
                Ok(None) => {}
                Ok(Some(answer)) => {
                    if queue_local(&tx, header, m, answer).await.is_err() {
                        return ConnectionEnd::UpstreamClosed("response side closed".into());
                    }
                    continue;
                }
                Err((answer, why)) => {
                    tracing::info!(listener = %ctx.listener, %peer, reason = %why,
                        "closing client connection: its session ended");
                    if let Some(answer) = answer {
                        let _ = queue_local(&tx, header, m, answer).await;
                    }
                    return ConnectionEnd::Authentication(why);
                }
            }
        }
        let (frame, state, answered_by) = match ctx.chain.on_request(&header, frame) {
            Ok(Decision::Forward { frame, state }) => (frame, state, None),
            Ok(Decision::Answer { by, state }) => (BytesMut::new(), Some(state), Some(by)),
            Ok(Decision::Drop) => continue,
            Err(e) => {
                Metrics::count(&ctx.metrics.frame_errors, &ctx.listener, "bad_request");
                tracing::warn!(listener = %ctx.listener, %peer, error = %e,
                    "closing client connection: request cannot be handled");
                return ConnectionEnd::ClientProtocol(e.to_string());
            }
        };
        let local = answered_by.is_some();
        let unanswered = !local && !expects_response(&header, &frame);
        let kept = keeps && !local && !unanswered;
        let (request, deadline) = if kept {
            let wait = ctx.chain.upstream_deadline(&header, &frame);
            let request = ctx
                .chain
                .answers_offline(header.api_key)
                .then(|| frame.clone());
            (request, wait.map(|w| Instant::now() + w))
        } else {
            (None, None)
        };
        let write_wait = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        // The copy kept for a local answer holds the budget until it is
        // answered; otherwise the frame holds it until it is written.
        let (kept_permit, held) = if request.is_some() {
            (Some(permit), None)
        } else {
            (None, Some(permit))
        };
        {
            let permit = kept_permit;
            let entry = InFlight {
                header,
                sent_at: Instant::now(),
                metrics: m.clone(),
                state,
                answered_by,
                unanswered,
                kept,
                request,
                deadline,
                local: None,
                permit,
            };
            if tx.send(Entry::Client(entry)).await.is_err() {
                // The response pump is gone; its end reason wins the select.
                return ConnectionEnd::UpstreamClosed("response side closed".into());
            }
        }
        if local || (keeps && mode.is_offline()) {
            continue;
        }
        let written = match write_wait {
            Some(w) => tokio::time::timeout(w, upstream_wr.write_all(&frame))
                .await
                .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into())),
            None => upstream_wr.write_all(&frame).await,
        };
        drop(held);
        if let Err(e) = written {
            Metrics::count(&ctx.metrics.upstream_errors, &ctx.listener, "disconnect");
            if keeps {
                // The response side answers it (and what follows) locally.
                mode.go_offline(ctx, peer, &format!("write to upstream: {e}"));
                continue;
            }
            return ConnectionEnd::UpstreamClosed(format!("write to upstream: {e}"));
        }
    }
}

/// Queues `answer`, built already, as the response to `header`.
async fn queue_local(
    tx: &mpsc::Sender<Entry>,
    header: RequestHeader,
    metrics: &ApiMetrics,
    answer: BytesMut,
) -> Result<(), ()> {
    let entry = InFlight {
        header,
        sent_at: Instant::now(),
        metrics: metrics.clone(),
        state: None,
        answered_by: None,
        unanswered: false,
        kept: false,
        request: None,
        deadline: None,
        local: Some(answer),
        permit: None,
    };
    tx.send(Entry::Client(entry)).await.map_err(|_| ())
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// The SASL rounds of a re-authentication, through the pumps: each request
/// is written upstream by the request pump, its answer read by the
/// response pump and handed back.
struct RelayRoundTrip<'a, W> {
    upstream_wr: &'a mut W,
    tx: &'a mpsc::Sender<Entry>,
}

impl<W: AsyncWrite + Unpin> SaslRoundTrip for RelayRoundTrip<'_, W> {
    async fn round_trip(&mut self, frame: Vec<u8>) -> Result<Vec<u8>, SaslError> {
        let gone = |_| SaslError::Io("the response side of the connection ended".into());
        let (answer, answered) = oneshot::channel();
        // Queued first: the response pump must know the frame is ours
        // before the broker can answer it.
        self.tx
            .send(Entry::Sasl(answer))
            .await
            .map_err(|_| SaslError::Io("the response side of the connection ended".into()))?;
        let io = |e: std::io::Error| SaslError::Io(format!("write to upstream: {e}"));
        self.upstream_wr.write_all(&frame).await.map_err(io)?;
        self.upstream_wr.flush().await.map_err(io)?;
        answered.await.map_err(gone)?
    }
}

/// Re-authenticates the upstream connection (the request pump is not
/// taking client frames meanwhile): waits until every answer owed is
/// delivered, then runs the SASL rounds. Returns when the next one is due;
/// a failure is an upstream failure (offline, or the end of a connection
/// that cannot serve offline).
async fn reauthenticate<W: AsyncWrite + Unpin>(
    upstream_wr: &mut W,
    tx: &mpsc::Sender<Entry>,
    ctx: &ConnectionContext,
    peer: SocketAddr,
    mode: &Mode,
    r: &Reauth,
) -> Result<Option<Instant>, ConnectionEnd> {
    let drained = async {
        let (done, drained) = oneshot::channel();
        if tx.send(Entry::Barrier(done)).await.is_err() || drained.await.is_err() {
            return Err(SaslError::Io(
                "the response side of the connection ended".into(),
            ));
        }
        Ok(())
    };
    let res = match tokio::time::timeout(MAX_REAUTH_DRAIN, drained).await {
        Err(_) => Err(SaslError::Io(format!(
            "answers owed to the client not delivered within {MAX_REAUTH_DRAIN:?}"
        ))),
        Ok(Err(e)) => Err(e),
        Ok(Ok(())) => {
            let mut rt = RelayRoundTrip { upstream_wr, tx };
            let rounds = crate::sasl::client::reauthenticate(&mut rt, &r.creds);
            match tokio::time::timeout(r.limit, rounds).await {
                Ok(res) => res,
                Err(_) => Err(SaslError::Io(format!(
                    "no answer within {:?} while re-authenticating",
                    r.limit
                ))),
            }
        }
    };
    match res {
        Ok(session) => {
            ctx.metrics.count_reauthentication(&ctx.listener, "ok");
            tracing::debug!(listener = %ctx.listener, %peer, lifetime_ms = session.lifetime_ms,
                "upstream connection re-authenticated");
            Ok(Reauth::due(session.lifetime_ms, Instant::now()))
        }
        Err(e) => {
            ctx.metrics.count_reauthentication(&ctx.listener, "error");
            Metrics::count(
                &ctx.metrics.upstream_errors,
                &ctx.listener,
                "authentication",
            );
            let why = format!("re-authentication to the upstream failed: {e}");
            if ctx.chain.serves_offline() {
                mode.go_offline(ctx, peer, &why);
                return Ok(None);
            }
            tracing::warn!(listener = %ctx.listener, %peer, error = %e,
                "re-authentication to the upstream failed");
            Err(ConnectionEnd::UpstreamClosed(why))
        }
    }
}

/// Relays one request cut-through: notes it in flight, then copies it
/// upstream piece by piece (or discards it while offline). `Err` ends the
/// connection.
#[allow(clippy::too_many_arguments)]
async fn stream_request<R, W>(
    reader: &mut FrameReader<R>,
    upstream_wr: &mut W,
    tx: &mpsc::Sender<Entry>,
    ctx: &ConnectionContext,
    peer: SocketAddr,
    mode: &Mode,
    api_metrics: &mut HashMap<i16, ApiMetrics>,
    header: RequestHeader,
    total: usize,
) -> Result<(), ConnectionEnd>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let keeps = ctx.chain.serves_offline();
    let m = api_metrics
        .entry(header.api_key)
        .or_insert_with(|| ctx.metrics.api(&ctx.listener, header.api_key));
    m.requests.inc();
    m.bytes_in.inc_by(total as u64);
    let head = reader.head(total);
    let unanswered = !expects_response(&header, head);
    let kept = keeps && !unanswered;
    // Only the deadline is needed from a request kept but not answerable
    // offline (the connection closes if the upstream fails it).
    let deadline = if kept {
        ctx.chain
            .upstream_deadline(&header, head)
            .map(|w| Instant::now() + w)
    } else {
        None
    };
    let entry = InFlight {
        header,
        sent_at: Instant::now(),
        metrics: m.clone(),
        state: None,
        answered_by: None,
        unanswered,
        kept,
        request: None,
        deadline,
        local: None,
        permit: None,
    };
    if tx.send(Entry::Client(entry)).await.is_err() {
        return Err(ConnectionEnd::UpstreamClosed("response side closed".into()));
    }
    if keeps && mode.is_offline() {
        return reader
            .skip_frame(total)
            .await
            .map_err(|e| client_read_end(ctx, peer, e));
    }
    match reader.copy_frame(total, upstream_wr, deadline, keeps).await {
        Ok(_) => Ok(()),
        Err(CopyError::Read(e)) => Err(client_read_end(ctx, peer, e)),
        Err(CopyError::Write(e)) => {
            Metrics::count(&ctx.metrics.upstream_errors, &ctx.listener, "disconnect");
            if keeps {
                // The rest of the frame was drained: the client stream is
                // at a frame boundary; the response side closes when it
                // cannot answer this one locally.
                mode.go_offline(ctx, peer, &format!("write to upstream: {e}"));
                return Ok(());
            }
            Err(ConnectionEnd::UpstreamClosed(format!(
                "write to upstream: {e}"
            )))
        }
    }
}

/// The local answer of an owed request, sent no earlier than it allows.
async fn offline_frame(
    ctx: &ConnectionContext,
    h: &RequestHeader,
    request: Option<&BytesMut>,
    sent_at: Instant,
) -> Result<BytesMut, ConnectionEnd> {
    let answer = request.and_then(|r| ctx.chain.offline_answer(h, r));
    match answer {
        Some(Ok(a)) => {
            let at = sent_at + a.not_before;
            tokio::time::sleep_until(at.into()).await;
            Metrics::count(
                &ctx.metrics.upstream_errors,
                &ctx.listener,
                "answered_offline",
            );
            Ok(a.frame)
        }
        Some(Err(e)) => {
            Metrics::count(&ctx.metrics.rewrite_errors, &ctx.listener, "offline_answer");
            Err(ConnectionEnd::UpstreamProtocol(e.to_string()))
        }
        None => Err(ConnectionEnd::UpstreamClosed(format!(
            "upstream unavailable and {} v{} cannot be answered locally",
            api::api_display(h.api_key),
            h.api_version
        ))),
    }
}

/// Runs the chain (or, for a request a filter answers itself, that
/// filter), awaiting whatever it blocks on, until the frame is ready.
async fn rewrite_until_ready(
    ctx: &ConnectionContext,
    h: &RequestHeader,
    state: &mut Option<RequestState>,
    answered_by: Option<usize>,
    mut frame: Option<BytesMut>,
) -> Result<BytesMut, RewriteError> {
    // The filter an upstream response resumes at after a wait.
    let mut from = 0;
    for _ in 0..MAX_REWRITE_ROUNDS {
        let step = match (frame, answered_by, state.as_mut()) {
            (Some(f), _, _) => ctx.chain.on_response(h, state, f, &mut from)?,
            (None, Some(by), Some(s)) => ctx.chain.answer(h, by, s)?,
            (None, _, _) => {
                return Err(RewriteError::new(
                    h,
                    "local answer without a filter's state",
                ))
            }
        };
        match step {
            Rewritten::Ready(f) => return Ok(f),
            Rewritten::Blocked { frame: f, wait } => {
                wait.await?;
                frame = f;
            }
        }
    }
    Err(RewriteError::new(
        h,
        format!("response still blocked after {MAX_REWRITE_ROUNDS} rounds"),
    ))
}

/// An upstream answer: read whole, or to be streamed (its head is buffered).
enum Answer {
    /// The whole frame.
    Whole(BytesMut),
    /// A frame of this total length, to be copied cut-through.
    Stream(usize),
}

/// Reads the upstream frame answering `correlation_id` (whole, or only its
/// head if it is longer than `stream_above`), dropping responses to earlier
/// `acks=0` Produce requests (which Kafka never sends).
async fn read_answer<R: AsyncRead + Unpin>(
    reader: &mut FrameReader<R>,
    unanswered: &mut std::collections::VecDeque<i32>,
    correlation_id: i32,
    stream_above: Option<usize>,
) -> Result<Option<Answer>, FrameError> {
    loop {
        let Some(total) = reader.peek(8).await? else {
            return Ok(None);
        };
        let id = response_correlation_id(reader.head(total));
        if id != Some(correlation_id) {
            if let Some(pos) = unanswered.iter().position(|u| Some(*u) == id) {
                unanswered.drain(..=pos);
                reader.skip_frame(total).await?;
                continue;
            }
        }
        // Responses come in request order: no earlier acks=0 answer can follow.
        unanswered.clear();
        if stream_above.is_some_and(|above| total > above) {
            return Ok(Some(Answer::Stream(total)));
        }
        return Ok(reader.next_frame().await?.map(Answer::Whole));
    }
}

/// After a streamed response failed: the end of the connection, or, when
/// the upstream failed before a byte reached the client and the request is
/// kept for a local answer, that answer (the connection goes offline as on
/// a held response). Once bytes went out the connection closes: the client
/// never sees a short frame followed by another.
async fn streamed_failure(
    ctx: &ConnectionContext,
    peer: SocketAddr,
    mode: &Mode,
    h: &RequestHeader,
    entry: &InFlight,
    failure: crate::mirror::stream::StreamFailure,
) -> Result<BytesMut, ConnectionEnd> {
    use crate::mirror::stream::StreamError;
    match failure.error {
        StreamError::Write(e) => Err(ConnectionEnd::ClientReset(format!(
            "writing a response: {e}"
        ))),
        StreamError::Read(e) => {
            let kind = if matches!(e, FrameError::Io(_) | FrameError::Truncated { .. }) {
                "disconnect"
            } else {
                "protocol"
            };
            Metrics::count(&ctx.metrics.upstream_errors, &ctx.listener, kind);
            let why = format!("reading upstream: {e}");
            if failure.written > 0 || !entry.kept {
                return Err(ConnectionEnd::UpstreamClosed(why));
            }
            mode.go_offline(ctx, peer, &why);
            offline_frame(ctx, h, entry.request.as_ref(), entry.sent_at).await
        }
        StreamError::Rewrite(_) | StreamError::NotStreamable(_) => {
            let kind = if matches!(failure.error, StreamError::NotStreamable(_)) {
                "not_streamable"
            } else {
                "unparseable_response"
            };
            Metrics::count(&ctx.metrics.rewrite_errors, &ctx.listener, kind);
            tracing::warn!(listener = %ctx.listener, error = %failure.error, written = failure.written,
                "streamed Fetch response failed; closing the connection");
            Err(ConnectionEnd::UpstreamProtocol(failure.error.to_string()))
        }
    }
}

/// The error for a response that does not answer the oldest request.
fn correlation_mismatch(
    ctx: &ConnectionContext,
    h: &RequestHeader,
    got: Option<i32>,
) -> ConnectionEnd {
    Metrics::count(&ctx.metrics.upstream_errors, &ctx.listener, "protocol");
    ConnectionEnd::UpstreamProtocol(format!(
        "response correlation id {:?} does not answer the oldest request ({} v{} id {})",
        got,
        api::api_display(h.api_key),
        h.api_version,
        h.correlation_id
    ))
}

/// Every request is answered except Produce with `acks=0`.
fn expects_response(header: &RequestHeader, frame: &[u8]) -> bool {
    if header.api_key != api::PRODUCE {
        return true;
    }
    let header_version = api::request_header_version(api::PRODUCE, header.api_version).unwrap_or(1);
    produce_acks(frame, header.api_version, header_version) != Some(0)
}

async fn response_pump<R, W>(
    upstream_rd: R,
    mut client_wr: W,
    mut rx: mpsc::Receiver<Entry>,
    ctx: &ConnectionContext,
    peer: SocketAddr,
    mode: &Mode,
    stream_above: usize,
) -> ConnectionEnd
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut reader = FrameReader::new(upstream_rd, ctx.max_frame);
    // Correlation ids of acks=0 Produce requests an upstream might answer anyway.
    let mut unanswered: std::collections::VecDeque<i32> = std::collections::VecDeque::new();
    // Waiting on the queue first means an idle connection does not read
    // upstream; a closed queue with nothing owed means "drained".
    while let Some(entry) = rx.recv().await {
        let mut entry = match entry {
            Entry::Client(e) => e,
            Entry::Barrier(done) => {
                // Every earlier answer is delivered (or answered locally).
                let _ = done.send(());
                continue;
            }
            Entry::Sasl(mut answer) => {
                let got = if mode.is_offline() {
                    Err(SaslError::Io("the upstream connection is offline".into()))
                } else {
                    tokio::select! {
                        f = reader.next_frame() => match f {
                            Ok(Some(f)) => Ok(f.get(4..).unwrap_or_default().to_vec()),
                            Ok(None) => Err(SaslError::Io("the upstream closed the connection".into())),
                            Err(e) => Err(SaslError::Io(format!("reading upstream: {e}"))),
                        },
                        // The request pump gave up (its time bound): the
                        // connection is offline from here on.
                        _ = answer.closed() => continue,
                    }
                };
                let _ = answer.send(got);
                continue;
            }
        };
        let h = entry.header;
        if entry.unanswered {
            if unanswered.len() >= MAX_IN_FLIGHT {
                unanswered.pop_front();
            }
            unanswered.push_back(h.correlation_id);
            continue;
        }
        if let Some(frame) = entry.local.take() {
            if let Err(e) = client_wr.write_all(&frame).await {
                return ConnectionEnd::ClientReset(format!("writing a response: {e}"));
            }
            entry.metrics.bytes_out.inc_by(frame.len() as u64);
            continue;
        }
        if entry.answered_by.is_some() {
            let frame = match rewrite_until_ready(
                ctx,
                &h,
                &mut entry.state,
                entry.answered_by,
                None,
            )
            .await
            {
                Ok(f) => f,
                Err(e) => {
                    Metrics::count(&ctx.metrics.rewrite_errors, &ctx.listener, "local_answer");
                    tracing::warn!(listener = %ctx.listener, error = %e, "cannot answer request locally");
                    return ConnectionEnd::UpstreamProtocol(e.to_string());
                }
            };
            if let Err(e) = client_wr.write_all(&frame).await {
                return ConnectionEnd::ClientReset(format!("writing a response: {e}"));
            }
            entry.metrics.bytes_out.inc_by(frame.len() as u64);
            entry
                .metrics
                .latency
                .observe(entry.sent_at.elapsed().as_secs_f64());
            continue;
        }
        // Streamed: nothing to rewrite, and no local answer to fall back on.
        // A response the chain rewrites as it arrives (a mirror's Fetch)
        // streams too, through its walker.
        let mut walker = if !mode.is_offline() && ctx.chain.wants(&h) {
            ctx.chain.response_stream(&h, entry.state.as_ref())
        } else {
            None
        };
        let streams = (walker.is_some()
            || (!entry.kept && entry.state.is_none() && !ctx.chain.wants(&h)))
        .then_some(stream_above);
        let read = if mode.is_offline() && entry.kept {
            Err(None)
        } else {
            let answer = read_answer(&mut reader, &mut unanswered, h.correlation_id, streams);
            let res = match entry.deadline {
                Some(d) => match tokio::time::timeout_at(d.into(), answer).await {
                    Ok(r) => r,
                    Err(_) => {
                        Metrics::count(&ctx.metrics.upstream_errors, &ctx.listener, "timeout");
                        Err(FrameError::Io(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            format!(
                                "no answer to {} v{} within its deadline",
                                api::api_display(h.api_key),
                                h.api_version
                            ),
                        )))
                    }
                },
                None => answer.await,
            };
            match res {
                Ok(Some(f)) => Ok(f),
                Ok(None) => {
                    Metrics::count(&ctx.metrics.upstream_errors, &ctx.listener, "disconnect");
                    Err(Some(ConnectionEnd::UpstreamClosed(
                        "upstream closed with a request in flight".into(),
                    )))
                }
                Err(e) => {
                    let kind = if matches!(e, FrameError::Io(_)) {
                        "disconnect"
                    } else {
                        "protocol"
                    };
                    Metrics::count(&ctx.metrics.upstream_errors, &ctx.listener, kind);
                    Err(Some(ConnectionEnd::UpstreamClosed(format!(
                        "reading upstream: {e}"
                    ))))
                }
            }
        };
        let frame = match read {
            Ok(Answer::Whole(f)) => f,
            Ok(Answer::Stream(total)) => {
                let id = response_correlation_id(reader.head(total));
                if id != Some(h.correlation_id) {
                    return correlation_mismatch(ctx, &h, id);
                }
                if let Some(mut w) = walker.take() {
                    w.start(total);
                    match crate::mirror::stream::relay(*w, &mut reader, &mut client_wr).await {
                        Ok(n) => {
                            entry.metrics.bytes_out.inc_by(n as u64);
                            entry
                                .metrics
                                .latency
                                .observe(entry.sent_at.elapsed().as_secs_f64());
                            continue;
                        }
                        Err(failure) => {
                            match streamed_failure(ctx, peer, mode, &h, &entry, failure).await {
                                Ok(f) => f,
                                Err(end) => return end,
                            }
                        }
                    }
                } else {
                    match reader.copy_frame(total, &mut client_wr, None, false).await {
                        Ok(n) => {
                            entry.metrics.bytes_out.inc_by(n as u64);
                            entry
                                .metrics
                                .latency
                                .observe(entry.sent_at.elapsed().as_secs_f64());
                            continue;
                        }
                        Err(CopyError::Write(e)) => {
                            return ConnectionEnd::ClientReset(format!("writing a response: {e}"))
                        }
                        Err(CopyError::Read(e)) => {
                            let kind =
                                if matches!(e, FrameError::Io(_) | FrameError::Truncated { .. }) {
                                    "disconnect"
                                } else {
                                    "protocol"
                                };
                            Metrics::count(&ctx.metrics.upstream_errors, &ctx.listener, kind);
                            return ConnectionEnd::UpstreamClosed(format!("reading upstream: {e}"));
                        }
                    }
                }
            }
            // Already offline: answered locally.
            Err(None) => {
                match offline_frame(ctx, &h, entry.request.as_ref(), entry.sent_at).await {
                    Ok(f) => f,
                    Err(end) => return end,
                }
            }
            Err(Some(end)) => {
                if !entry.kept {
                    return end;
                }
                // The upstream connection is unusable from here on (a
                // frame may be half read): this and every later request
                // are answered locally.
                let why = match &end {
                    ConnectionEnd::UpstreamClosed(w) => w.clone(),
                    other => format!("{other:?}"),
                };
                mode.go_offline(ctx, peer, &why);
                match offline_frame(ctx, &h, entry.request.as_ref(), entry.sent_at).await {
                    Ok(f) => f,
                    Err(end) => return end,
                }
            }
        };
        if response_correlation_id(&frame) != Some(h.correlation_id) {
            return correlation_mismatch(ctx, &h, response_correlation_id(&frame));
        }
        let frame = if entry.state.is_some() || ctx.chain.wants(&h) {
            match rewrite_until_ready(ctx, &h, &mut entry.state, None, Some(frame)).await {
                Ok(f) => f,
                Err(e) => {
                    Metrics::count(
                        &ctx.metrics.rewrite_errors,
                        &ctx.listener,
                        "unparseable_response",
                    );
                    return ConnectionEnd::UpstreamProtocol(e.to_string());
                }
            }
        } else {
            frame
        };
        if let Err(e) = client_wr.write_all(&frame).await {
            return ConnectionEnd::ClientReset(format!("writing a response: {e}"));
        }
        entry.metrics.bytes_out.inc_by(frame.len() as u64);
        entry
            .metrics
            .latency
            .observe(entry.sent_at.elapsed().as_secs_f64());
    }
    let _ = client_wr.flush().await;
    ConnectionEnd::ClientClosed
}

#[cfg(test)]
mod reauth_tests {
    //! The relay re-authenticating its upstream against a scripted broker
    //! that enforces KIP-368 like Kafka: a request other than SaslHandshake
    //! or SaslAuthenticate after the session expired closes the connection.

    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::filter::address::AddressRewrite;
    use crate::proxy::nodes::NodeRegistry;
    use crate::sasl::{Mechanism, Secret};

    const LIFETIME_MS: i64 = 200;

    fn context() -> Arc<ConnectionContext> {
        let metrics = Metrics::new();
        let nodes = Arc::new(NodeRegistry::new("t", "127.0.0.1", 0, metrics.clone()));
        Arc::new(ConnectionContext {
            listener: "t".into(),
            max_frame: 1 << 20,
            metrics,
            chain: Arc::new(Chain::new(vec![Box::new(AddressRewrite::new(nodes))])),
            health: Arc::new(UpstreamHealth::default()),
            budget: MemoryBudget::unlimited(),
        })
    }

    async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> Option<Vec<u8>> {
        let mut size = [0u8; 4];
        r.read_exact(&mut size).await.ok()?;
        let mut body = vec![0u8; i32::from_be_bytes(size) as usize];
        r.read_exact(&mut body).await.ok()?;
        Some(body)
    }

    fn framed(body: &[u8]) -> Vec<u8> {
        let mut f = (body.len() as i32).to_be_bytes().to_vec();
        f.extend_from_slice(body);
        f
    }

    /// The broker: answers SASL (PLAIN, lifetime [`LIFETIME_MS`]) and any
    /// other request with its correlation id and `ok`; returns the number of
    /// authentications, or an error once it had to close.
    async fn broker(mut up: tokio::io::DuplexStream) -> Result<usize, String> {
        let mut expires = Instant::now() + Duration::from_millis(LIFETIME_MS as u64);
        let mut auths = 1; // the first one happened before the relay
        while let Some(req) = read_frame(&mut up).await {
            let api_key = i16::from_be_bytes([req[0], req[1]]);
            let corr = &req[4..8];
            let mut resp = corr.to_vec();
            match api_key {
                17 => {
                    resp.extend_from_slice(&0i16.to_be_bytes());
                    resp.extend_from_slice(&1i32.to_be_bytes());
                    resp.extend_from_slice(&5i16.to_be_bytes());
                    resp.extend_from_slice(b"PLAIN");
                }
                36 => {
                    resp.extend_from_slice(&0i16.to_be_bytes());
                    resp.extend_from_slice(&(-1i16).to_be_bytes());
                    resp.extend_from_slice(&0i32.to_be_bytes());
                    resp.extend_from_slice(&LIFETIME_MS.to_be_bytes());
                    expires = Instant::now() + Duration::from_millis(LIFETIME_MS as u64);
                    auths += 1;
                }
                _ => {
                    if Instant::now() >= expires {
                        return Err(format!("request {api_key} after the session expired"));
                    }
                    resp.extend_from_slice(b"ok");
                }
            }
            if up.write_all(&framed(&resp)).await.is_err() {
                break;
            }
        }
        Ok(auths)
    }

    #[tokio::test]
    async fn upstream_session_renewed_in_place() {
        let ctx = context();
        let (client, mut app) = tokio::io::duplex(1 << 16);
        let (upstream, broker_end) = tokio::io::duplex(1 << 16);
        let broker = tokio::spawn(broker(broker_end));
        let (_stop, shutdown) = watch::channel(false);
        let reauth = Reauth {
            creds: Arc::new(ClientCredentials {
                mechanism: Mechanism::Plain,
                username: "mg".into(),
                password: Secret::new("pw"),
            }),
            lifetime_ms: LIFETIME_MS,
            authenticated_at: Instant::now(),
            limit: Duration::from_secs(5),
        };
        let peer: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let relay = tokio::spawn(relay_reauth(
            client,
            upstream,
            peer,
            ctx.clone(),
            shutdown,
            Some(reauth),
        ));
        // ListOffsets v1 (no filter reads it) for about five lifetimes,
        // with pauses both shorter and longer than the re-auth window.
        let end = Instant::now() + Duration::from_millis(5 * LIFETIME_MS as u64);
        let mut corr = 0i32;
        while Instant::now() < end {
            corr += 1;
            let mut req = Vec::new();
            req.extend_from_slice(&2i16.to_be_bytes());
            req.extend_from_slice(&1i16.to_be_bytes());
            req.extend_from_slice(&corr.to_be_bytes());
            req.extend_from_slice(&(-1i16).to_be_bytes());
            req.extend_from_slice(b"body");
            app.write_all(&framed(&req)).await.unwrap();
            let resp = tokio::time::timeout(Duration::from_secs(5), read_frame(&mut app))
                .await
                .expect("answer in time")
                .expect("connection open");
            let mut want = corr.to_be_bytes().to_vec();
            want.extend_from_slice(b"ok");
            assert_eq!(resp, want, "only the client's own answers reach it");
            tokio::time::sleep(Duration::from_millis(if corr % 3 == 0 { 120 } else { 15 })).await;
        }
        drop(app);
        let end = relay.await.unwrap();
        assert!(matches!(end, ConnectionEnd::ClientClosed), "{end:?}");
        let auths = broker.await.unwrap().expect("no request after expiry");
        assert!(auths >= 5, "authentications: {auths}");
        let text = ctx.metrics.encode();
        let line = format!(
            "mirrorguard_reauthentications_total{{listener=\"t\",result=\"ok\"}} {}",
            auths - 1
        );
        assert!(text.contains(&line), "{line} in\n{text}");
    }

    /// An upstream that answers every request with its correlation id and `ok`.
    async fn echo(mut up: tokio::io::DuplexStream) {
        while let Some(req) = read_frame(&mut up).await {
            let mut resp = req[4..8].to_vec();
            resp.extend_from_slice(b"ok");
            if up.write_all(&framed(&resp)).await.is_err() {
                break;
            }
        }
    }

    fn list_offsets(corr: i32) -> Vec<u8> {
        let mut req = Vec::new();
        req.extend_from_slice(&2i16.to_be_bytes());
        req.extend_from_slice(&1i16.to_be_bytes());
        req.extend_from_slice(&corr.to_be_bytes());
        req.extend_from_slice(&(-1i16).to_be_bytes());
        req.extend_from_slice(b"body");
        framed(&req)
    }

    /// A client's SASL session on a mirror listener (KIP-368): a request
    /// after it expired closes the connection; re-authenticating in place
    /// (as the same user) keeps it; another user is refused.
    #[tokio::test]
    async fn client_sessions_expire_and_reauthenticate_in_place() {
        use crate::sasl::server::{credential_line, CredentialStore, ServerAuth};
        let lines: Vec<String> = ["fetcher", "other"]
            .iter()
            .map(|u| credential_line(u, Mechanism::ScramSha256, b"pw", 4096).unwrap())
            .collect();
        let text = lines.join("\n");
        let server = Arc::new(ServerAuth::with_store(
            vec![Mechanism::ScramSha256],
            CredentialStore::parse(&text).unwrap(),
            Some(Duration::from_millis(LIFETIME_MS as u64)),
            text.as_bytes(),
        ));
        let creds = |user: &str| ClientCredentials {
            mechanism: Mechanism::ScramSha256,
            username: user.into(),
            password: Secret::new("pw"),
        };
        let start = |server: &Arc<ServerAuth>| {
            let ctx = context();
            let (client, app) = tokio::io::duplex(1 << 16);
            let (upstream, broker_end) = tokio::io::duplex(1 << 16);
            tokio::spawn(echo(broker_end));
            let (stop, shutdown) = watch::channel(false);
            let opts = RelayOptions {
                session: Some(ClientSession {
                    server: server.clone(),
                    principal: "User:fetcher".into(),
                    expires_at: server.session_end(Instant::now()),
                }),
                ..RelayOptions::default()
            };
            let peer: SocketAddr = "127.0.0.1:1".parse().unwrap();
            let relay = tokio::spawn(relay_opts(
                client,
                upstream,
                peer,
                ctx.clone(),
                shutdown,
                opts,
            ));
            (app, relay, stop, ctx)
        };
        let ok = |corr: i32| {
            let mut want = corr.to_be_bytes().to_vec();
            want.extend_from_slice(b"ok");
            want
        };

        // Expired: the next request closes the connection.
        let (mut app, relay, _stop, ctx) = start(&server);
        app.write_all(&list_offsets(1)).await.unwrap();
        assert_eq!(read_frame(&mut app).await.unwrap(), ok(1));
        tokio::time::sleep(Duration::from_millis(LIFETIME_MS as u64 + 50)).await;
        app.write_all(&list_offsets(2)).await.unwrap();
        assert_eq!(read_frame(&mut app).await, None, "closed after expiry");
        let end = relay.await.unwrap();
        assert!(matches!(end, ConnectionEnd::Authentication(_)), "{end:?}");
        assert!(ctx.metrics.encode().contains(
            "mirrorguard_client_authentications_total{listener=\"t\",kind=\"expired\"} 1"
        ));

        // Re-authenticated in place: served past the first lifetime.
        let (mut app, relay, _stop, _) = start(&server);
        for round in 0..3 {
            tokio::time::sleep(Duration::from_millis(LIFETIME_MS as u64 * 2 / 3)).await;
            let s = crate::sasl::client::authenticate(
                &mut app,
                &creds("fetcher"),
                Duration::from_secs(5),
            )
            .await
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
            assert_eq!(s.lifetime_ms, LIFETIME_MS);
            app.write_all(&list_offsets(10 + round)).await.unwrap();
            assert_eq!(read_frame(&mut app).await.unwrap(), ok(10 + round));
        }
        drop(app);
        assert!(matches!(relay.await.unwrap(), ConnectionEnd::ClientClosed));

        // Another principal: refused, closed.
        let (mut app, relay, _stop, _) = start(&server);
        let _ =
            crate::sasl::client::authenticate(&mut app, &creds("other"), Duration::from_secs(5))
                .await;
        app.write_all(&list_offsets(20)).await.ok();
        assert_eq!(read_frame(&mut app).await, None);
        assert!(matches!(
            relay.await.unwrap(),
            ConnectionEnd::Authentication(_)
        ));
    }

    #[test]
    fn reauth_window_is_85_to_95_percent() {
        use crate::sasl::client::reauth_delay;
        assert_eq!(reauth_delay(0, 0.5), None);
        assert_eq!(reauth_delay(-1, 0.5), None);
        assert_eq!(
            reauth_delay(10_000, 0.0),
            Some(Duration::from_millis(8_500))
        );
        assert_eq!(
            reauth_delay(10_000, 1.0),
            Some(Duration::from_millis(9_500))
        );
        assert_eq!(
            reauth_delay(10_000, 7.0),
            Some(Duration::from_millis(9_500))
        );
        let j = crate::sasl::client::jitter();
        assert!((0.0..=1.0).contains(&j));
    }
}
