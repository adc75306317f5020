//! The admin HTTP listener: health, readiness and Prometheus metrics.
//!
//! `GET /healthz` answers 200 while the process runs; `GET /readyz` answers
//! 200 once every listener has reached its upstream cluster and 503 before
//! that and while shutting down; `GET /metrics` serves the registry in the
//! OpenMetrics text format Prometheus scrapes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

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

/// The admin router: health, readiness, metrics, and the `/v1` API.
pub fn router(state: Arc<AdminState>, api: Arc<crate::admin_api::ApiState>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
        .merge(crate::admin_api::routes(api))
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
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode(),
    )
}
