//! A proxy listener: the bootstrap port, one port per upstream node, and the
//! periodic upstream Metadata refresh that discovers nodes.
//!
//! Connections on the bootstrap port go to any upstream bootstrap server;
//! connections on node N's port go to wherever node N is now (from the
//! [`NodeRegistry`]). Each accepted connection runs [`relay`](crate::proxy::connection::relay) in its own task
//! and is counted so that shutdown can wait for in-flight requests. On a
//! mirror listener with `listener_sasl`, the client authenticates to
//! mirrorguard first ([`crate::sasl::server`]; ApiVersions is answered
//! locally meanwhile): nothing is opened upstream for a client that has not
//! authenticated. Every listener then waits for the client's first request
//! (its head: [`FIRST_REQUEST_DEADLINE`]) before it connects upstream (and,
//! on a mirror listener, authenticates there with mirrorguard's own
//! credentials), so a connection that sends nothing, or announces a frame
//! the memory budget cannot hold, costs the upstream nothing.
//!
//! Before any of that a connection is admitted by the process's connection
//! caps ([`crate::proxy::limits`]); a refused one is closed at once.
//!
//! With `tls` configured, the TLS handshake runs in that task (never in the
//! accept loop, so a client that stalls its handshake holds only itself up);
//! a failed handshake closes that connection alone, logged and counted in
//! `mirrorguard_tls_handshake_errors_total`. The upstream side is TCP or TLS
//! as `upstream_tls` says.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};

use crate::codec::FrameReader;
use crate::config::{split_host_port, ListenerConfig};
use crate::filter::Chain;
use crate::kafka_client::TransportConnector;
use crate::metrics::{ListenerLabels, Metrics};
use crate::proxy::connection::{
    relay_opts, serve_offline_opts, ClientSession, ConnectionContext, ConnectionEnd, Reauth,
    RelayOptions, UpstreamHealth,
};
use crate::proxy::limits::{ConnectionLimits, LogLimiter, MemoryBudget};
use crate::proxy::nodes::{NodeBinder, NodeRegistry};
use crate::proxy::refresh::{RefreshHook, RefreshTarget};
use crate::proxy::upstream::{connect, connect_any, ConnectError};
use crate::sasl::server::ServerAuth;
use crate::sasl::Identity;
use crate::tls::{ServerTls, TlsError, Transport};

/// How long a client has, once connected (and authenticated, where the
/// listener authenticates), to send the head of its first request; the
/// upstream is connected only then.
pub const FIRST_REQUEST_DEADLINE: Duration = Duration::from_secs(30);

/// What every listener of the process shares.
#[derive(Clone)]
pub struct Shared {
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The shutdown signal.
    pub shutdown: watch::Receiver<bool>,
    /// Live connections (shutdown waits for them).
    pub tracker: Arc<ConnectionTracker>,
    /// Connection caps.
    pub limits: Arc<ConnectionLimits>,
    /// The budget of request bytes held in memory.
    pub budget: Arc<MemoryBudget>,
}

/// An ApiVersions table: `(api_key, min, max)`.
type ApiTable = Arc<Vec<(i16, i16, i16)>>;

/// Where a listening port sends its connections.
#[derive(Debug, Clone, Copy)]
pub enum Target {
    /// Any upstream bootstrap server.
    Bootstrap,
    /// A specific upstream broker node.
    Node(i32),
}

/// Counts live connections so shutdown can wait for them to drain.
#[derive(Default)]
pub struct ConnectionTracker {
    live: AtomicUsize,
    idle: Notify,
}

impl ConnectionTracker {
    fn enter(self: &Arc<Self>) -> TrackerGuard {
        self.live.fetch_add(1, Ordering::SeqCst);
        TrackerGuard(self.clone())
    }

    /// Live connections.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }

    /// Resolves when no connection is live.
    pub async fn wait_idle(&self) {
        loop {
            let notified = self.idle.notified();
            if self.live() == 0 {
                return;
            }
            notified.await;
        }
    }
}

struct TrackerGuard(Arc<ConnectionTracker>);

impl Drop for TrackerGuard {
    fn drop(&mut self) {
        if self.0.live.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// One configured listener at run time.
pub struct Listener {
    /// Its configuration.
    pub config: ListenerConfig,
    /// Upstream nodes and their proxy ports.
    pub nodes: Arc<NodeRegistry>,
    ctx: Arc<ConnectionContext>,
    metrics: Arc<Metrics>,
    upstream_bootstrap: Vec<(String, u16)>,
    shutdown: watch::Receiver<bool>,
    tracker: Arc<ConnectionTracker>,
    ready: AtomicBool,
    next_bootstrap: AtomicUsize,
    me: Weak<Listener>,
    refresh_hook: std::sync::Mutex<Option<Arc<dyn RefreshHook>>>,
    /// mirrorguard's own identity toward the upstream, and (mirror
    /// listeners) the authentication required from clients.
    sasl: std::sync::OnceLock<(Identity, Option<Arc<ServerAuth>>)>,
    /// TLS towards clients, when configured.
    tls: Option<Arc<ServerTls>>,
    /// TCP or TLS towards the upstream.
    upstream: TransportConnector,
    /// Connection caps, shared by the process's listeners.
    limits: Arc<ConnectionLimits>,
    /// On a fetcher listener that authenticates its clients: the chain of
    /// the clients whose principal is not a fetcher principal (readers),
    /// and those principals.
    readers: std::sync::OnceLock<(Arc<ConnectionContext>, Vec<String>)>,
    /// The source's ApiVersions table as the last refresh read it (mirror
    /// listeners: ApiVersions before authentication is answered from it).
    api_versions: std::sync::Mutex<Option<ApiTable>>,
    /// Refusals by the connection caps, logged at most once a second.
    refusal_log: LogLimiter,
}

impl Listener {
    /// Builds a listener; `make_chain` receives the node registry so the
    /// listener's filters can translate addresses. Fails only when its TLS
    /// files cannot be read (they were checked at config load).
    pub fn new(
        config: ListenerConfig,
        max_frame: usize,
        shared: Shared,
        make_chain: impl FnOnce(Arc<NodeRegistry>) -> Chain,
    ) -> Result<Arc<Self>, TlsError> {
        let Shared {
            metrics,
            shutdown,
            tracker,
            limits,
            budget,
        } = shared;
        let tls = match &config.tls {
            Some(t) => Some(ServerTls::new(t, &format!("{} tls", config.name))?),
            None => None,
        };
        let upstream = TransportConnector::from_config(
            config.upstream_tls.as_ref(),
            &format!("{} upstream_tls", config.name),
        )?;
        let nodes = Arc::new(NodeRegistry::new(
            &config.name,
            &config.advertised_host,
            config.node_port_base,
            metrics.clone(),
        ));
        let ctx = Arc::new(ConnectionContext {
            listener: config.name.clone(),
            max_frame,
            metrics: metrics.clone(),
            chain: Arc::new(make_chain(nodes.clone())),
            health: Arc::new(UpstreamHealth::default()),
            budget,
        });
        // Validated at config load.
        let upstream_bootstrap = config
            .upstream_bootstrap
            .iter()
            .filter_map(|s| split_host_port(s).ok())
            .collect();
        let listener = Arc::new_cyclic(|me| Self {
            config,
            nodes,
            ctx,
            metrics,
            upstream_bootstrap,
            shutdown,
            tracker,
            ready: AtomicBool::new(false),
            next_bootstrap: AtomicUsize::new(0),
            me: me.clone(),
            refresh_hook: std::sync::Mutex::new(None),
            sasl: std::sync::OnceLock::new(),
            tls,
            upstream,
            limits,
            readers: std::sync::OnceLock::new(),
            api_versions: std::sync::Mutex::new(None),
            refusal_log: LogLimiter::new(),
        });
        let weak: Weak<dyn NodeBinder> = listener.me.clone();
        listener.nodes.set_binder(weak);
        Ok(listener)
    }

    /// How this listener reaches its upstream (shared with what the
    /// listener's mirror uses for replays).
    pub fn upstream_connector(&self) -> &TransportConnector {
        &self.upstream
    }

    /// Makes every Metadata refresh read topics and report to `hook`
    /// (mirror listeners: source cluster id and topic ids). Set before `start`.
    pub fn set_refresh_hook(&self, hook: Arc<dyn RefreshHook>) {
        *crate::proxy::nodes::lock(&self.refresh_hook) = Some(hook);
    }

    /// Sets mirrorguard's own SASL identity toward the upstream (its
    /// Metadata refresh; on a mirror listener every upstream connection)
    /// and, for a mirror listener, the authentication its clients must
    /// pass before anything is relayed. Set before `start`.
    pub fn set_sasl(&self, upstream: Identity, clients: Option<Arc<ServerAuth>>) {
        let _ = self.sasl.set((upstream, clients));
    }

    /// On a fetcher listener whose clients authenticate: the chain of the
    /// clients whose principal is not one of `fetcher_principals` (they
    /// read, but never take a cut, complete a seal or change producer
    /// state). Set before `start`.
    pub fn set_reader_chain(&self, chain: Chain, fetcher_principals: Vec<String>) {
        let ctx = Arc::new(ConnectionContext {
            listener: self.ctx.listener.clone(),
            max_frame: self.ctx.max_frame,
            metrics: self.ctx.metrics.clone(),
            chain: Arc::new(chain),
            health: self.ctx.health.clone(),
            budget: self.ctx.budget.clone(),
        });
        let _ = self.readers.set((ctx, fetcher_principals));
    }

    /// The source's ApiVersions table (`(api_key, min, max)`), learned by
    /// the Metadata refresh.
    pub fn set_upstream_api_versions(&self, table: Vec<(i16, i16, i16)>) {
        *crate::proxy::nodes::lock(&self.api_versions) = Some(Arc::new(table));
    }

    /// The connection context of a client with `principal`.
    fn context_for(&self, principal: Option<&str>) -> Arc<ConnectionContext> {
        match (self.readers.get(), principal) {
            (Some((readers, fetchers)), Some(p)) if !fetchers.iter().any(|f| f == p) => {
                readers.clone()
            }
            (Some((readers, _)), None) => readers.clone(),
            _ => self.ctx.clone(),
        }
    }

    /// Whether the upstream cluster has been reached at least once (or, for
    /// a mirror, its last known topology was restored from `__mirror_state`).
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// Marks the listener ready without the upstream: a mirror whose source
    /// topology was restored from `__mirror_state` can serve its fetcher
    /// (locally) with the source down.
    pub fn mark_ready_from_persisted(&self) {
        if !self.ready.swap(true, Ordering::SeqCst) {
            tracing::info!(listener = %self.config.name,
                "ready from the source topology persisted in __mirror_state (source not reached yet)");
        }
    }

    /// Binds the bootstrap port and starts the metadata refresh loop.
    pub async fn start(self: &Arc<Self>) -> anyhow::Result<()> {
        let addr: SocketAddr = self.config.bootstrap.parse()?;
        let socket = TcpListener::bind(addr).await.map_err(|e| {
            anyhow::anyhow!(
                "listener {}: cannot bind bootstrap {addr}: {e}",
                self.config.name
            )
        })?;
        tracing::info!(listener = %self.config.name, %addr, upstream = ?self.config.upstream_bootstrap,
            "bootstrap listener bound");
        tokio::spawn(self.clone().accept_loop(socket, Target::Bootstrap));
        tokio::spawn(self.clone().refresh_loop());
        Ok(())
    }

    async fn accept_loop(self: Arc<Self>, socket: TcpListener, target: Target) {
        let mut shutdown = self.shutdown.clone();
        loop {
            let accepted = tokio::select! {
                _ = shutdown.wait_for(|s| *s) => return,
                a = socket.accept() => a,
            };
            match accepted {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    let guard = self.tracker.enter();
                    tokio::spawn(self.clone().serve(stream, peer, target, guard));
                }
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(listener = %self.config.name, error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    async fn serve(
        self: Arc<Self>,
        client: tokio::net::TcpStream,
        peer: SocketAddr,
        target: Target,
        _guard: TrackerGuard,
    ) {
        let _admitted = match self.limits.admit(peer.ip()) {
            Ok(a) => a,
            Err(why) => {
                Metrics::count(
                    &self.metrics.connections_refused,
                    &self.config.name,
                    why.label(),
                );
                if let Some(held_back) = self.refusal_log.allow() {
                    tracing::warn!(listener = %self.config.name, %peer, limit = why.label(),
                        open = self.limits.open(), held_back,
                        "client connection refused: [limits] {} reached", why.label());
                }
                return;
            }
        };
        let labels = ListenerLabels {
            listener: self.config.name.clone(),
        };
        self.metrics.connections_total.get_or_create(&labels).inc();
        let open = self.metrics.connections_open.get_or_create(&labels).clone();
        open.inc();
        let mut client = match &self.tls {
            None => Transport::Plain(client),
            Some(tls) => match tls.accept(client).await {
                Ok(t) => t,
                Err(e) => {
                    Metrics::count(
                        &self.metrics.tls_handshake_errors,
                        &self.config.name,
                        e.kind(),
                    );
                    if matches!(e, crate::tls::HandshakeError::Eof) {
                        // Connect-and-close: TCP health checks, port scans.
                        tracing::debug!(listener = %self.config.name, %peer, kind = e.kind(),
                            error = %e, "closing client connection: TLS handshake failed");
                    } else {
                        tracing::warn!(listener = %self.config.name, %peer, kind = e.kind(),
                            error = %e, "closing client connection: TLS handshake failed");
                    }
                    open.dec();
                    return;
                }
            },
        };
        // The client's principal: its certificate's subject (mTLS), replaced
        // by its SASL user where the listener terminates SASL.
        let mut principal = client
            .peer_certificate()
            .and_then(crate::tls::certificate_principal);
        let mut session = None;
        if self.config.terminates_sasl {
            if let Some(server) = self.sasl.get().and_then(|(_, s)| s.clone()) {
                let table = crate::proxy::nodes::lock(&self.api_versions).clone();
                match server
                    .accept(&mut client, &self.ctx, peer, table.as_ref().map(|t| &t[..]))
                    .await
                {
                    Ok(p) => {
                        self.metrics
                            .count_client_authentication(&self.config.name, "ok");
                        tracing::info!(listener = %self.config.name, %peer, principal = %p,
                            user = p.trim_start_matches("User:"), "client authenticated");
                        session = Some(ClientSession {
                            expires_at: server.session_end(std::time::Instant::now()),
                            server,
                            principal: p.clone(),
                        });
                        principal = Some(p);
                    }
                    Err(e) => {
                        if let crate::sasl::server::AcceptError::OverBudget(size) = e {
                            Metrics::count(
                                &self.metrics.frame_errors,
                                &self.config.name,
                                "over_budget",
                            );
                            self.metrics.budget_refused.get_or_create(&labels).inc();
                            tracing::debug!(listener = %self.config.name, %peer, size,
                                "client not authenticated: frame over the budget");
                        } else {
                            self.metrics
                                .count_client_authentication(&self.config.name, "failed");
                            tracing::info!(listener = %self.config.name, %peer, error = %e,
                                "client not authenticated: connection closed");
                        }
                        self.metrics
                            .connection_end(&self.config.name, "client", "authentication");
                        open.dec();
                        return;
                    }
                }
            }
        }
        let ctx = self.context_for(principal.as_deref());
        // Nothing upstream until the client sent the head of a request the
        // budget can hold.
        let prefix = match self.first_request(&mut client, &ctx, peer).await {
            Some(p) => p,
            None => {
                open.dec();
                return;
            }
        };
        let upstream = match self.connect_upstream(target).await {
            Ok(u) => Some(u),
            Err(e) => {
                Metrics::count(&self.metrics.upstream_errors, &self.config.name, e.kind());
                if !ctx.chain.serves_offline() {
                    tracing::warn!(listener = %self.config.name, %peer, ?target, error = %e,
                        "closing client connection: upstream unavailable");
                    open.dec();
                    return;
                }
                tracing::warn!(listener = %self.config.name, %peer, ?target, error = %e,
                    "upstream unavailable: serving the connection locally");
                None
            }
        };
        let Some((upstream, reauth)) = self.authenticate_upstream(upstream, peer, &ctx).await
        else {
            open.dec();
            return;
        };
        tracing::debug!(listener = %self.config.name, %peer, ?target, principal = ?principal,
            "connection opened");
        let opts = RelayOptions {
            reauth,
            prefix,
            session,
        };
        let end = match upstream {
            Some(upstream) => {
                relay_opts(client, upstream, peer, ctx, self.shutdown.clone(), opts).await
            }
            None => serve_offline_opts(client, peer, ctx, self.shutdown.clone(), opts).await,
        };
        self.metrics
            .connection_end(&self.config.name, end.side(), end.cause());
        match &end {
            ConnectionEnd::ClientClosed | ConnectionEnd::Drained => {
                tracing::debug!(listener = %self.config.name, %peer, ?end, "connection closed")
            }
            // A client going away is ordinary (its own timeout, a restart): not a warning.
            ConnectionEnd::ClientReset(why) => {
                tracing::info!(listener = %self.config.name, %peer, reason = %why,
                    "client connection reset by the client")
            }
            ConnectionEnd::ClientAbandonedRequest { got, expected } => {
                tracing::info!(listener = %self.config.name, %peer, got, expected,
                    "client closed in the middle of sending a request (nothing of it was forwarded)")
            }
            // Logged where detected.
            ConnectionEnd::ClientProtocol(_)
            | ConnectionEnd::Authentication(_)
            | ConnectionEnd::OverBudget { .. } => {}
            ConnectionEnd::UpstreamClosed(why) | ConnectionEnd::UpstreamProtocol(why) => {
                tracing::warn!(listener = %self.config.name, %peer, ?target, reason = %why,
                    "closing client connection: upstream side ended")
            }
        }
        open.dec();
    }

    /// Waits (at most [`FIRST_REQUEST_DEADLINE`]) for the head of the
    /// client's first request: its whole frame, or the first
    /// [`SMALL_REQUEST_BYTES`](crate::proxy::limits::SMALL_REQUEST_BYTES)
    /// of a longer one the budget could hold. Returns the bytes read (the
    /// relay starts from them); `None`: close the connection.
    async fn first_request<C: AsyncRead + Unpin>(
        &self,
        client: &mut C,
        ctx: &ConnectionContext,
        peer: SocketAddr,
    ) -> Option<bytes::BytesMut> {
        let max = ctx.max_frame;
        let read = async {
            // The size and the first header bytes, read exactly: nothing
            // more is buffered before the budget has its say (a flood of
            // connections announcing large frames costs 8 bytes each).
            let mut head = [0u8; 8];
            let mut got = 0;
            while got < head.len() {
                let n = client.read(&mut head[got..]).await?;
                if n == 0 {
                    if got == 0 {
                        return Ok(None);
                    }
                    let expected = match head[..got].try_into() {
                        Ok(size) if got >= 4 => i32::from_be_bytes(size) as usize + 4,
                        _ => 4,
                    };
                    return Err(crate::codec::FrameError::Truncated { got, expected });
                }
                got += n;
                crate::codec::frame::frame_boundary(&head[..got], max)?;
            }
            let total = i32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize + 4;
            if !ctx.budget.would_admit(total) {
                return Ok(Some(Err(total)));
            }
            let mut reader =
                FrameReader::with_buffer(&mut *client, max, bytes::BytesMut::from(&head[..]));
            reader
                .peek(total.min(crate::proxy::limits::SMALL_REQUEST_BYTES))
                .await?;
            Ok(Some(Ok(reader.into_parts().1)))
        };
        let got = tokio::time::timeout(FIRST_REQUEST_DEADLINE, read).await;
        let name = &self.config.name;
        match got {
            Ok(Ok(Some(Ok(prefix)))) => Some(prefix),
            Ok(Ok(Some(Err(total)))) => {
                self.metrics
                    .budget_refused
                    .get_or_create(&ListenerLabels {
                        listener: name.clone(),
                    })
                    .inc();
                self.metrics.connection_end(name, "proxy", "limit");
                if let Some(held_back) = self.refusal_log.allow() {
                    tracing::warn!(listener = %name, %peer, size = total, held_back,
                        "closing client connection: its first request cannot be held within \
                         [limits] max_buffered_request_bytes (nothing was opened upstream)");
                }
                None
            }
            Ok(Ok(None)) => {
                self.metrics.connection_end(name, "client", "closed");
                None
            }
            Ok(Err(e)) => {
                // As the relay names a client's end (`ConnectionEnd`).
                let cause = match &e {
                    crate::codec::FrameError::Io(why) => {
                        tracing::info!(listener = %name, %peer, reason = %why,
                            "client connection reset by the client");
                        "reset"
                    }
                    crate::codec::FrameError::Truncated { got, expected } => {
                        tracing::info!(listener = %name, %peer, got, expected,
                            "client closed in the middle of sending a request (nothing of it was forwarded)");
                        "mid_request"
                    }
                    other => {
                        Metrics::count(&self.metrics.frame_errors, name, other.kind());
                        tracing::warn!(listener = %name, %peer, kind = other.kind(), error = %other,
                            "closing client connection: malformed frame");
                        "protocol"
                    }
                };
                self.metrics.connection_end(name, "client", cause);
                None
            }
            Err(_) => {
                self.metrics.connection_end(name, "client", "idle");
                tracing::debug!(listener = %name, %peer,
                    "closing client connection: no request within {FIRST_REQUEST_DEADLINE:?}");
                None
            }
        }
    }

    /// On a mirror listener, authenticates the upstream connection with
    /// mirrorguard's source credentials (failing that it is dropped, and
    /// the connection is served offline). `None`: close the client. With
    /// the upstream comes its re-authentication schedule, when the source
    /// gave the session a lifetime.
    async fn authenticate_upstream<U>(
        &self,
        mut upstream: Option<U>,
        peer: SocketAddr,
        ctx: &ConnectionContext,
    ) -> Option<(Option<U>, Option<Reauth>)>
    where
        U: AsyncRead + AsyncWrite + Unpin,
    {
        if !self.config.terminates_sasl {
            return Some((upstream, None));
        }
        let identity = self.sasl.get().and_then(|(i, _)| i.clone());
        let mut reauth = None;
        if let (Some(creds), Some(u)) = (&identity, upstream.as_mut()) {
            match crate::sasl::client::authenticate(u, creds, self.connect_timeout()).await {
                Ok(session) => {
                    reauth = (session.lifetime_ms > 0).then(|| Reauth {
                        creds: creds.clone(),
                        lifetime_ms: session.lifetime_ms,
                        authenticated_at: std::time::Instant::now(),
                        limit: self.connect_timeout(),
                    });
                }
                Err(e) => {
                    Metrics::count(
                        &self.metrics.upstream_errors,
                        &self.config.name,
                        "authentication",
                    );
                    tracing::warn!(listener = %self.config.name, %peer, error = %e,
                    "mirrorguard's own authentication to the upstream failed");
                    if !ctx.chain.serves_offline() {
                        return None;
                    }
                    upstream = None;
                }
            }
        }
        Some((upstream, reauth))
    }

    async fn connect_upstream(&self, target: Target) -> Result<Transport, ConnectError> {
        let timeout = Duration::from_millis(self.config.connect_timeout_ms);
        match target {
            Target::Bootstrap => {
                let start = self.next_bootstrap.fetch_add(1, Ordering::Relaxed);
                connect_any(&self.upstream_bootstrap, start, timeout, &self.upstream).await
            }
            Target::Node(id) => {
                let addr = self
                    .nodes
                    .upstream_of(id)
                    .ok_or(ConnectError::UnknownNode(id))?;
                connect(&addr.host, addr.port, timeout, &self.upstream).await
            }
        }
    }

    async fn refresh_loop(self: Arc<Self>) {
        let mut shutdown = self.shutdown.clone();
        let period = Duration::from_millis(self.config.metadata_refresh_ms);
        let mut failures: u32 = 0;
        loop {
            let hook = crate::proxy::nodes::lock(&self.refresh_hook).clone();
            let refreshed = super::refresh::refresh_nodes(&*self, hook.is_some())
                .await
                .inspect(|(_, view)| {
                    if let Some(t) = &view.api_versions {
                        self.set_upstream_api_versions(t.clone());
                    }
                })
                .and_then(|(n, view)| match &hook {
                    Some(h) => h.on_refresh(&view).map(|_| n).map_err(anyhow::Error::msg),
                    None => Ok(n),
                });
            match refreshed {
                Ok(n) => {
                    self.ctx.health.up();
                    if !self.ready.swap(true, Ordering::SeqCst) || failures > 0 {
                        tracing::info!(listener = %self.config.name, nodes = n, "upstream metadata read");
                    }
                    failures = 0;
                }
                Err(e) => {
                    self.ctx.health.down();
                    failures += 1;
                    Metrics::count(
                        &self.metrics.upstream_errors,
                        &self.config.name,
                        "metadata_refresh",
                    );
                    tracing::warn!(listener = %self.config.name, error = %e, failures,
                        "upstream metadata refresh failed");
                }
            }
            // Retry quickly until the upstream has been seen once.
            let wait = if self.is_ready() {
                period
            } else {
                period.min(Duration::from_millis(500))
            };
            tokio::select! {
                _ = shutdown.wait_for(|s| *s) => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Upstream bootstrap servers, parsed.
    pub fn upstream_bootstrap(&self) -> &[(String, u16)] {
        &self.upstream_bootstrap
    }

    /// Connect timeout.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.config.connect_timeout_ms)
    }

    /// Frame limit.
    pub fn max_frame(&self) -> usize {
        self.ctx.max_frame
    }
}

impl RefreshTarget for Listener {
    fn upstream_identity(&self) -> Identity {
        self.sasl.get().and_then(|(i, _)| i.clone())
    }
    fn upstream_bootstrap(&self) -> &[(String, u16)] {
        Listener::upstream_bootstrap(self)
    }
    fn connect_timeout(&self) -> Duration {
        Listener::connect_timeout(self)
    }
    fn max_frame(&self) -> usize {
        Listener::max_frame(self)
    }
    fn nodes(&self) -> &NodeRegistry {
        &self.nodes
    }
    fn connector(&self) -> &TransportConnector {
        &self.upstream
    }
}

impl NodeBinder for Listener {
    fn bind_node(&self, node_id: i32, port: u16) -> bool {
        let Ok(ip) = self.config.listen_host.parse::<std::net::IpAddr>() else {
            return false;
        };
        let addr = SocketAddr::new(ip, port);
        let std_socket = match std::net::TcpListener::bind(addr) {
            Ok(s) => s,
            Err(e) => {
                Metrics::count(
                    &self.metrics.upstream_errors,
                    &self.config.name,
                    "node_port_bind",
                );
                tracing::error!(listener = %self.config.name, node_id, %addr, error = %e,
                    "cannot bind the proxy port of an upstream node; clients cannot reach it");
                return false;
            }
        };
        let socket = std_socket
            .set_nonblocking(true)
            .and_then(|_| TcpListener::from_std(std_socket));
        match socket {
            Ok(socket) => {
                tracing::info!(listener = %self.config.name, node_id, %addr, "node listener bound");
                if let Some(me) = self.me.upgrade() {
                    tokio::spawn(me.accept_loop(socket, Target::Node(node_id)));
                    true
                } else {
                    false
                }
            }
            Err(e) => {
                tracing::error!(listener = %self.config.name, node_id, %addr, error = %e, "cannot serve node port");
                false
            }
        }
    }
}
