//! `POST /v1/partitions/abort-open`: the disaster path's admin call, which
//! closes the open mirrored transactions of partitions whose destination
//! fetcher is gone (the work itself is in [`crate::abort_open`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::{
    authorized_body, error, named_mirror, selection_shape, unknown_topic, ApiState, LState,
    SelectionBody,
};

/// `POST /v1/partitions/abort-open`: aborts, on the destination, the open
/// mirrored transactions of partitions whose destination fetcher is gone
/// (see [`crate::abort_open`]). Only STOPPING, STOPPED or FAILED partitions
/// (mirroring stopped: nothing else writes them through the replication
/// path); refused for `preserve` mirrors. Idempotent: a second call finds
/// nothing open. Each partition handled is recorded in `__mirror_state` as
/// STOPPED (writable) with the aborted PIDs in its reason.
pub(super) async fn abort_open(
    State(s): State<Arc<ApiState>>,
    headers: HeaderMap,
    body: Result<Json<SelectionBody>, JsonRejection>,
) -> Response {
    let body = match authorized_body(&s, &headers, body) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let mirror = match named_mirror(&s, &body.mirror) {
        Ok(m) => m,
        Err(r) => return *r,
    };
    if mirror.mode == crate::config::PidMode::Preserve {
        return error(
            StatusCode::CONFLICT,
            "preserve_mode",
            "mirror uses pid_mode = \"preserve\": mirrored PIDs are the source's own and overlap \
             the destination's allocator, so closing transactions without the barrier cannot \
             prevent collisions with local producers; use kafka-transactions.sh abort knowingly",
        );
    }
    let selected = match selection_shape(&body) {
        Ok(Some(t)) => t,
        Ok(None) => {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_request",
                "name `topics` (abort-open does not take `all`)",
            )
        }
        Err(r) => return *r,
    };
    if s.destination_bootstrap.is_empty() {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "no_destination",
            "no destination bootstrap: set [[mirror]].destination_bootstrap or [state]",
        );
    }
    let source = mirror.source().map(|x| x.text.clone()).unwrap_or_default();
    // Every partition must have mirroring stopped before anything is done.
    let known: BTreeMap<String, i32> = mirror.destination_topics().into_iter().collect();
    let mut targets: Vec<(String, Option<Vec<i32>>)> = Vec::new();
    for sel in selected {
        let parts: Vec<i32> = match (&sel.partitions, known.get(&sel.topic)) {
            (Some(ps), n) => {
                if let Some(p) = ps.iter().find(|&&p| p < 0 || n.is_some_and(|n| p >= *n)) {
                    return error(
                        StatusCode::NOT_FOUND,
                        "unknown_partition",
                        format!("{}-{p} does not exist", sel.topic),
                    );
                }
                ps.clone()
            }
            (None, Some(n)) => (0..*n).collect(),
            (None, None) => return unknown_topic(&body.mirror, &sel.topic),
        };
        for p in &parts {
            let state = s
                .lifecycle
                .get(&mirror.key_for(&sel.topic, *p))
                .map(|e| e.state)
                .unwrap_or(LState::Mirroring);
            if matches!(state, LState::Mirroring | LState::Paused) {
                return error(
                    StatusCode::CONFLICT,
                    "still_mirroring",
                    format!(
                        "{}-{p} is {}: stop it first (and stop mirroring on the destination); \
                         nothing was changed",
                        sel.topic,
                        state.name()
                    ),
                );
            }
        }
        targets.push((sel.topic.clone(), Some(parts)));
    }
    let mut reports = Vec::new();
    for (topic, parts) in &targets {
        let result = crate::abort_open::abort_open(
            &s.destination_bootstrap,
            &s.destination_connector,
            topic,
            parts.as_deref(),
            &crate::pid::is_mapped,
            std::time::Duration::from_secs(10),
        )
        .await;
        let got = match result {
            Ok(r) => r,
            Err(e) => {
                return (
                    StatusCode::BAD_GATEWAY,
                    Json(json!({"error": "destination_unavailable", "message": e.to_string(), "partitions": reports})),
                )
                    .into_response()
            }
        };
        for rep in got {
            if let Some(m) = &s.metrics {
                let c = |kind: &'static str| {
                    m.seal_events
                        .get_or_create(&crate::metrics::MirrorKindLabels {
                            mirror: mirror.name.clone(),
                            kind,
                        })
                        .clone()
                };
                c("abort_open_marker_written").inc_by(rep.aborted.len() as u64);
                if rep.error.is_some() {
                    c("abort_open_failed").inc();
                }
            }
            if rep.error.is_none() {
                let key = mirror.key_for(&rep.topic, rep.partition);
                if let Some(mut e) = s.lifecycle.get(&key) {
                    e.state = LState::Stopped;
                    e.since_ms = crate::lifecycle::now_ms();
                    e.reason = Some(format!(
                        "closed by abort-open (no barrier: the destination fetcher was gone); \
                         aborted PIDs {:?}",
                        rep.aborted
                            .iter()
                            .map(|t| t.producer_id)
                            .collect::<Vec<_>>()
                    ));
                    if e.source_cluster_id.is_empty() {
                        e.source_cluster_id = source.clone();
                    }
                    if let Err(err) = s.lifecycle.commit(&key, e).await {
                        return (
                            StatusCode::SERVICE_UNAVAILABLE,
                            Json(json!({"error": "not_persisted", "message": err.to_string(), "partitions": reports})),
                        )
                            .into_response();
                    }
                }
                tracing::info!(mirror = %mirror.name, topic = %rep.topic, partition = rep.partition,
                    aborted = rep.aborted.len(), not_mirrored = rep.not_mirrored.len(),
                    "abort-open: open mirrored transactions closed on the destination");
            } else {
                tracing::warn!(mirror = %mirror.name, topic = %rep.topic, partition = rep.partition,
                    error = ?rep.error, "abort-open failed for a partition");
            }
            reports.push(rep);
        }
    }
    let status = if reports.iter().all(|r| r.error.is_none()) {
        StatusCode::OK
    } else {
        StatusCode::BAD_GATEWAY
    };
    (status, Json(json!({"partitions": reports}))).into_response()
}
