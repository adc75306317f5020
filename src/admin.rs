//! The admin HTTP listener: health, readiness and Prometheus metrics.
//!
//! `GET /healthz` answers 200 while the process runs; `GET /readyz` answers
//! 200 once every listener has reached its upstream cluster and 503 before
//! that and while shutting down; `GET /metrics` serves the registry in the
//! OpenMetrics text format Prometheus scrapes.
//!
//! The listener is served by hyper directly so that slow or stalled clients
//! cannot hold a connection forever: request headers must arrive within
//! `admin.read_timeout_ms` (the connection is closed otherwise) and a request
//! body within the same time (408). Before any handler runs, in this order:
//! the `Host` header must be an IP literal, `localhost` or a name of
//! `[admin] allowed_hosts` (403 `host_not_allowed`: DNS rebinding); a body
//! announced larger than [`MAX_BODY_BYTES`] gets 413; a call that needs the
//! bearer token (every POST, and the reads that show producer ids unless
//! `token_for_reads = false`) is refused without it (401/403) before a byte
//! of its body is read; a request without a valid token may send at most
//! [`PRE_AUTH_MAX_BODY_BYTES`] of body (413). Every error the admin port
//! returns, routing and extraction errors included, is a JSON body
//! `{"error": code, "message": text}`.
//!
//! `[admin] metrics_listen` serves [`metrics_router`]: `/healthz`,
//! `/readyz` and `/metrics` only, for probes and Prometheus when the API
//! itself stays on loopback.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::metrics::Metrics;
use crate::proxy::listener::Listener;

/// What the admin handlers read.
pub struct AdminState {
    /// Shadow producer state of every mirrored partition.
    pub registry: Arc<crate::producer_state::ProducerStateRegistry>,
    /// The metrics registry.
    pub metrics: Arc<Metrics>,
    /// Every proxy listener (readiness).
    pub listeners: Vec<Arc<Listener>>,
    /// Set once shutdown begins.
    pub shutting_down: AtomicBool,
}

/// The largest request body accepted from a client with the bearer token
/// (413 beyond).
pub const MAX_BODY_BYTES: usize = 2 * 1024 * 1024;

/// The largest request body read from a client without a valid token (413
/// beyond); calls that need the token are refused before their body is read.
pub const PRE_AUTH_MAX_BODY_BYTES: usize = 64 * 1024;

/// The admin router: health, readiness, metrics, and the `/v1` API.
/// `read_timeout` bounds the arrival of each request body (408 beyond).
pub fn router(
    state: Arc<AdminState>,
    api: Arc<crate::admin_api::ApiState>,
    read_timeout: Duration,
) -> Router {
    let gate = api.clone();
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
        .merge(crate::admin_api::routes(api))
        .fallback(not_found)
        .method_not_allowed_fallback(|| async {
            crate::admin_api::error(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this path does not take that method",
            )
        })
        .layer(axum::middleware::from_fn(move |req, next| {
            gate_and_read_body(req, next, gate.clone(), read_timeout)
        }))
}

/// The router of `[admin] metrics_listen`: health, readiness and metrics
/// only (nothing there needs a token or shows a producer id).
pub fn metrics_router(state: Arc<AdminState>, read_timeout: Duration) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
        .fallback(not_found)
        .method_not_allowed_fallback(|| async {
            crate::admin_api::error(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this path does not take that method",
            )
        })
        .layer(axum::middleware::from_fn(move |req, next| {
            read_body_bounded(req, next, read_timeout, PRE_AUTH_MAX_BODY_BYTES)
        }))
}

async fn not_found() -> Response {
    crate::admin_api::error(StatusCode::NOT_FOUND, "not_found", "no such path")
}

/// Whether a `Host` header value may reach the API: an IPv4 or bracketed
/// IPv6 literal (a page loaded from a name never shares its origin with
/// one), `localhost`, or a name in `allowed` (lowercase, without a trailing
/// dot); each with or without a port. DNS rebinding makes a browser send
/// the attacker's own name, which none of these is.
pub fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let host = host.trim();
    if let Some(rest) = host.strip_prefix('[') {
        let Some((ip, port)) = rest.split_once(']') else {
            return false;
        };
        return ip.parse::<std::net::Ipv6Addr>().is_ok()
            && (port.is_empty()
                || port
                    .strip_prefix(':')
                    .is_some_and(|p| p.parse::<u16>().is_ok()));
    }
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.parse::<u16>().is_ok() => name,
        Some(_) => return false,
        None => host,
    };
    if name.parse::<std::net::Ipv4Addr>().is_ok() {
        return true;
    }
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    name == "localhost" || allowed.contains(&name)
}

/// What the admin listener checks before a handler runs (module doc): the
/// Host header, the announced size, the token of calls that need it (before
/// the body is read), then reads the body within its limit.
async fn gate_and_read_body(
    req: Request,
    next: Next,
    api: Arc<crate::admin_api::ApiState>,
    read_timeout: Duration,
) -> Response {
    let refuse = |reason: &'static str, response: Response| {
        if let Some(m) = &api.metrics {
            m.count_admin_refused(reason);
        }
        response
    };
    let mut hosts = req.headers().get_all(header::HOST).iter();
    let host = hosts.next();
    let host_ok = hosts.next().is_none()
        && host.is_none_or(|h| {
            h.to_str()
                .is_ok_and(|h| host_allowed(h, &api.allowed_hosts))
        });
    if !host_ok {
        return refuse(
            "host_not_allowed",
            crate::admin_api::error(
                StatusCode::FORBIDDEN,
                "host_not_allowed",
                "the Host header must be an IP address, localhost or a name in \
                 [admin] allowed_hosts",
            ),
        );
    }
    if announced(&req).is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return too_large(MAX_BODY_BYTES);
    }
    let needs_token = req.method() == axum::http::Method::POST
        || (api.token_for_reads && crate::admin_api::shows_producer_ids(req.uri().path()));
    let authenticated = match crate::admin_api::check_token(&api, req.headers()) {
        Ok(()) => true,
        Err((reason, response)) if needs_token => return refuse(reason, *response),
        Err(_) => false,
    };
    let limit = if authenticated {
        MAX_BODY_BYTES
    } else {
        PRE_AUTH_MAX_BODY_BYTES
    };
    read_body_bounded(req, next, read_timeout, limit).await
}

/// The Content-Length a request announces.
fn announced(req: &Request) -> Option<u64> {
    req.headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
}

/// Reads the whole request body before any handler runs, bounded in size and
/// time: a request announcing or sending more than `limit` gets 413, one
/// whose body does not arrive within `read_timeout` gets 408. Handlers then
/// never wait on the client, so a mutating call can never be cut off
/// half-applied by a slow client.
async fn read_body_bounded(
    req: Request,
    next: Next,
    read_timeout: Duration,
    limit: usize,
) -> Response {
    if announced(&req).is_some_and(|n| n > limit as u64) {
        return too_large(limit);
    }
    let (parts, body) = req.into_parts();
    let bytes = match tokio::time::timeout(read_timeout, axum::body::to_bytes(body, limit)).await {
        Err(_) => {
            return crate::admin_api::error(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                format!(
                    "the request body did not arrive within {} ms",
                    read_timeout.as_millis()
                ),
            )
        }
        Ok(Err(e)) => {
            // `to_bytes` fails for an over-long body or a broken connection.
            if is_length_limit(&e) {
                return too_large(limit);
            }
            return crate::admin_api::error(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("cannot read the request body: {e}"),
            );
        }
        Ok(Ok(b)) => b,
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// Whether `to_bytes` stopped because the body exceeded its limit.
fn is_length_limit(e: &axum::Error) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if err.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        cur = err.source();
    }
    false
}

fn too_large(limit: usize) -> Response {
    crate::admin_api::error(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        if limit < MAX_BODY_BYTES {
            format!(
                "request bodies are limited to {limit} bytes without the bearer token \
                 ({MAX_BODY_BYTES} with it)"
            )
        } else {
            format!("request bodies are limited to {limit} bytes")
        },
    )
}

/// Serves `router` on `listener` until `shutdown` turns true, then lets open
/// connections finish their current request. HTTP/1.1 only; a request's
/// headers must arrive within `header_timeout`. With `tls`, HTTPS: the
/// handshake runs in the connection's task, a failed one is counted in
/// `mirrorguard_tls_handshake_errors_total{listener="admin"}`.
/// (`[admin] metrics_listen` is served by the same loop, plain HTTP.)
pub async fn serve(
    listener: TcpListener,
    router: Router,
    header_timeout: Duration,
    mut shutdown: watch::Receiver<bool>,
    tls: Option<Arc<crate::tls::ServerTls>>,
    metrics: Arc<crate::metrics::Metrics>,
) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.wait_for(|s| *s) => break,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors and the like: back off, keep serving.
                tracing::warn!(error = %e, "admin listener: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let service = TowerToHyperService::new(router.clone());
        let mut conn_shutdown = shutdown.clone();
        let (tls, metrics) = (tls.clone(), metrics.clone());
        tokio::spawn(async move {
            let stream = match &tls {
                None => crate::tls::Transport::Plain(stream),
                Some(tls) => match tls.accept(stream).await {
                    Ok(s) => s,
                    Err(e) => {
                        crate::metrics::Metrics::count(
                            &metrics.tls_handshake_errors,
                            "admin",
                            e.kind(),
                        );
                        tracing::warn!(%peer, kind = e.kind(), error = %e,
                            "admin listener: closing connection: TLS handshake failed");
                        return;
                    }
                },
            };
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!(%peer, error = %e, "admin connection ended with an error");
                    }
                    return;
                }
                _ = conn_shutdown.wait_for(|s| *s) => conn.as_mut().graceful_shutdown(),
            }
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "admin connection ended with an error");
            }
        });
    }
}

async fn readyz(State(s): State<Arc<AdminState>>) -> impl IntoResponse {
    if s.shutting_down.load(Ordering::SeqCst) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting down\n".to_string(),
        );
    }
    let waiting: Vec<&str> = s
        .listeners
        .iter()
        .filter(|l| !l.is_ready())
        .map(|l| l.config.name.as_str())
        .collect();
    if waiting.is_empty() {
        (StatusCode::OK, "ready\n".to_string())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "waiting for upstream of listener(s): {}\n",
                waiting.join(", ")
            ),
        )
    }
}

async fn metrics(State(s): State<Arc<AdminState>>) -> impl IntoResponse {
    // Gauges read from the registry at scrape time, not maintained per batch.
    s.metrics
        .producer_state_producers
        .set(s.registry.total_producers() as i64);
    s.metrics
        .producer_state_bytes
        .set(s.registry.memory_bytes() as i64);
    s.metrics
        .producer_state_partitions
        .set(s.registry.partition_keys().len() as i64);
    let closings = s.registry.closings_budget();
    s.metrics
        .producer_state_closings_retained
        .set(closings.retained() as i64);
    s.metrics.set_closings_dropped(closings.dropped());
    s.metrics
        .set_certificate_expiries(&crate::tls::certificate_expiries());
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode(),
    )
}

#[cfg(test)]
mod tests {
    use super::host_allowed;

    #[test]
    fn host_header_check_against_dns_rebinding() {
        let allowed = vec!["mirrorguard.internal".to_owned()];
        for ok in [
            "127.0.0.1",
            "127.0.0.1:9644",
            "10.1.2.3:80",
            "[::1]",
            "[::1]:9644",
            "[fe80::1]:1",
            "localhost",
            "LocalHost:9644",
            "localhost.",
            "mirrorguard.internal",
            "MirrorGuard.Internal:9644",
            "mirrorguard.internal.:9644",
        ] {
            assert!(host_allowed(ok, &allowed), "{ok}");
        }
        for bad in [
            "rebind.attacker.example",
            "rebind.attacker.example:9644",
            "localhost.attacker.example",
            "127.0.0.1.attacker.example",
            "mirrorguard.internal.attacker.example",
            "[::1",
            "[::1]x",
            "[not-ip]:1",
            "127.0.0.1:port",
            "localhost:99999",
            "",
        ] {
            assert!(!host_allowed(bad, &allowed), "{bad}");
        }
    }
}
