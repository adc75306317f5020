//! The `/v1` admin API: partition life cycle, producer state, collisions,
//! anomalies, and its OpenAPI document.
//!
//! Every mutating call needs `Authorization: Bearer <token>` with the token
//! read from `admin.token_file`, and so do the reads that show producer ids
//! (producers, collisions, anomalies) unless `[admin] token_for_reads =
//! false`; `GET /v1/partitions` and the OpenAPI document are open. The
//! admin listener checks the token before it reads a body
//! ([`crate::admin`]); the handlers check it again. A mutating request is
//! checked completely (mirror, topics, partitions, every transition) before
//! anything changes, so a request with one bad item changes nothing.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::lifecycle::State as LState;
use crate::lifecycle::{Entry, Lifecycle, Operation};
use crate::mirror::MirrorContext;
use crate::producer_state::ProducerStateRegistry;

mod abort_open;
mod serving;

/// The OpenAPI document, shipped in the repository and served at `/v1/openapi.json`.
pub const OPENAPI: &str = include_str!("../../docs/openapi.json");

/// What the API handlers read and change.
pub struct ApiState {
    /// Partition life cycle.
    pub lifecycle: Arc<Lifecycle>,
    /// Mirrors by name.
    pub mirrors: BTreeMap<String, Arc<MirrorContext>>,
    /// Shadow producer state.
    pub registry: Arc<ProducerStateRegistry>,
    /// Bearer token for mutating calls and the reads that show producer ids
    /// (`None`: those calls are refused).
    pub token: Option<crate::secrets::AdminToken>,
    /// Whether the reads that show producer ids need the token.
    pub token_for_reads: bool,
    /// Names a `Host` header may carry besides IP literals and `localhost`
    /// (lowercase, no trailing dot).
    pub allowed_hosts: Vec<String>,
    /// The destination cluster (abort-open talks to its partition leaders).
    pub destination_bootstrap: Vec<(String, u16)>,
    /// How to reach it (TCP or TLS).
    pub destination_connector: crate::kafka_client::TransportConnector,
    /// Metrics (abort-open counts its markers).
    pub metrics: Option<Arc<crate::metrics::Metrics>>,
}

/// The `/v1` routes.
pub fn routes(state: Arc<ApiState>) -> Router {
    Router::new()
        .route("/v1/openapi.json", get(openapi))
        .route("/v1/partitions", get(list_partitions))
        .route("/v1/partitions/stop", post(stop))
        .route("/v1/partitions/pause", post(pause))
        .route("/v1/partitions/resume", post(resume))
        .route("/v1/partitions/protect", post(protect))
        .route("/v1/partitions/abort-open", post(abort_open::abort_open))
        .route(
            "/v1/partitions/{topic}/{partition}/producers",
            get(producers),
        )
        .route("/v1/collisions", get(collisions))
        .route("/v1/anomalies", get(anomalies))
        .with_state(state)
}

/// An error answer of the admin port: `{"error": code, "message": text}`.
pub(crate) fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (
        status,
        Json(json!({"error": code, "message": message.into()})),
    )
        .into_response()
}

async fn openapi() -> impl IntoResponse {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        OPENAPI,
    )
}

/// One partition as `GET /v1/partitions` shows it.
#[derive(Serialize)]
struct PartitionView {
    mirror: String,
    topic: String,
    partition: i32,
    state: &'static str,
    cut: Option<i64>,
    seal_batches: Option<i32>,
    fetcher_offset: Option<i64>,
    last_fetch_ms: Option<i64>,
    reason: Option<String>,
    since_ms: Option<i64>,
    producers: usize,
    /// The instance that last started serving the partition (type 9).
    served_by: Option<String>,
    /// The fetcher's offset when that instance started serving it.
    served_from_offset: Option<i64>,
    /// Whether that instance is this one.
    served_here: bool,
    /// The partition's latest producer-state snapshot offset in
    /// `__mirror_state` (any instance's): progress, one interval behind.
    snapshot_offset: Option<i64>,
    /// Where this instance's shadow producer state of the partition is
    /// (its next offset): the progress, where served here.
    state_offset: Option<i64>,
    /// A STOPPING partition whose fetcher holds the whole seal: what it
    /// waits for (the destination's high watermark), on the instance that
    /// reads it.
    #[serde(skip_serializing_if = "Option::is_none")]
    destination_hw: Option<crate::lifecycle::HwWait>,
    /// The mirroring episode (0: the first).
    episode: i32,
    /// Where this episode's fetcher started.
    episode_start: Option<i64>,
    /// The leader epoch the seal is stamped with.
    leader_epoch: Option<i32>,
    /// Earlier episodes, oldest first.
    history: Vec<crate::lifecycle::Episode>,
}

fn view(e: &Entry, producers: usize) -> PartitionView {
    PartitionView {
        mirror: e.mirror.clone(),
        topic: e.topic.clone(),
        partition: e.partition,
        state: e.state.name(),
        cut: e.cut,
        seal_batches: e.seal_batches,
        fetcher_offset: e.fetcher_offset,
        last_fetch_ms: e.last_fetch_ms,
        reason: e.reason.clone(),
        since_ms: Some(e.since_ms),
        producers,
        served_by: None,
        served_from_offset: None,
        served_here: false,
        snapshot_offset: None,
        state_offset: None,
        destination_hw: e.destination_hw.clone(),
        episode: e.episode,
        episode_start: e.episode_start,
        leader_epoch: e.leader_epoch,
        history: e.history.clone(),
    }
}

async fn list_partitions(State(s): State<Arc<ApiState>>) -> Json<serde_json::Value> {
    let mut out: BTreeMap<(String, i32), PartitionView> = BTreeMap::new();
    let producer_count = |topic: &str, partition: i32| {
        s.registry
            .get(&crate::producer_state::PartitionKey::new(
                [0; 16], topic, partition,
            ))
            .map(|h| h.with(|p| p.producer_count()))
            .unwrap_or(0)
    };
    for (name, m) in &s.mirrors {
        for (topic, n) in m.destination_topics() {
            for p in 0..n {
                let pc = producer_count(&topic, p);
                out.insert(
                    (topic.clone(), p),
                    PartitionView {
                        mirror: name.clone(),
                        topic: topic.clone(),
                        partition: p,
                        state: LState::Mirroring.name(),
                        cut: None,
                        seal_batches: None,
                        fetcher_offset: None,
                        last_fetch_ms: None,
                        reason: None,
                        since_ms: None,
                        producers: pc,
                        served_by: None,
                        served_from_offset: None,
                        served_here: false,
                        snapshot_offset: None,
                        state_offset: None,
                        destination_hw: None,
                        episode: 0,
                        episode_start: None,
                        leader_epoch: None,
                        history: Vec::new(),
                    },
                );
            }
        }
    }
    for e in s.lifecycle.list() {
        let pc = producer_count(&e.topic, e.partition);
        out.insert((e.topic.clone(), e.partition), view(&e, pc));
    }
    for v in out.values_mut() {
        serving::fill(&s, v);
    }
    Json(json!({"partitions": out.into_values().collect::<Vec<_>>()}))
}

/// Body of stop/pause/resume: `{"mirror", "all": true}` or
/// `{"mirror", "topics": [...]}` (non-empty), never both; the OpenAPI
/// `Selection` schema says the same.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SelectionBody {
    /// The mirror.
    mirror: String,
    /// Topics (and optionally partitions); `null` is refused, not read as absent.
    #[serde(default, deserialize_with = "present")]
    topics: Option<Vec<TopicSelection>>,
    /// Every partition of the mirror.
    #[serde(default)]
    all: bool,
}

/// A field that, when present, must hold a value (`null` is an error), so the
/// server is exactly as strict as the OpenAPI schema.
fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TopicSelection {
    topic: String,
    /// Absent: every partition of the topic.
    #[serde(default, deserialize_with = "present")]
    partitions: Option<Vec<i32>>,
}

/// Whether a GET of `path` shows producer ids (and so needs the token unless
/// `token_for_reads = false`): `/v1/collisions`, `/v1/anomalies`,
/// `/v1/partitions/{topic}/{partition}/producers`.
pub fn shows_producer_ids(path: &str) -> bool {
    path == "/v1/collisions"
        || path == "/v1/anomalies"
        || (path.starts_with("/v1/partitions/") && path.ends_with("/producers"))
}

/// Checks the bearer token of a request: `Err` with the refusal's reason
/// (`no_token_configured`, `missing_token`, `bad_token`, as counted in
/// `mirrorguard_admin_refused_total`) and its answer.
pub fn check_token(s: &ApiState, headers: &HeaderMap) -> Result<(), (&'static str, Box<Response>)> {
    let Some(token) = &s.token else {
        return Err((
            "no_token_configured",
            Box::new(error(
                StatusCode::FORBIDDEN,
                "no_token_configured",
                "this call needs admin.token_file in the configuration",
            )),
        ));
    };
    let given = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token);
    match given {
        Some(g) if token.matches(g.as_bytes()) => Ok(()),
        Some(_) => Err((
            "bad_token",
            Box::new(error(
                StatusCode::UNAUTHORIZED,
                "bad_token",
                "the bearer token is not valid",
            )),
        )),
        None => Err((
            "missing_token",
            Box::new(error(
                StatusCode::UNAUTHORIZED,
                "missing_token",
                "send Authorization: Bearer <token> (the token is in admin.token_file)",
            )),
        )),
    }
}

fn authorized(s: &ApiState, headers: &HeaderMap) -> Result<(), Box<Response>> {
    check_token(s, headers).map_err(|(_, r)| r)
}

/// The token check of a read that shows producer ids.
fn authorized_read(s: &ApiState, headers: &HeaderMap) -> Result<(), Box<Response>> {
    if s.token_for_reads {
        authorized(s, headers)
    } else {
        Ok(())
    }
}

/// The token of an `Authorization: Bearer <token>` value. The scheme is
/// case-insensitive (RFC 9110 section 11.1), so `bearer` and `BEARER` work too.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(token)
}

async fn stop(
    State(s): State<Arc<ApiState>>,
    headers: HeaderMap,
    body: Result<Json<SelectionBody>, JsonRejection>,
) -> Response {
    mutate(s, headers, body, Operation::Stop).await
}

async fn pause(
    State(s): State<Arc<ApiState>>,
    headers: HeaderMap,
    body: Result<Json<SelectionBody>, JsonRejection>,
) -> Response {
    mutate(s, headers, body, Operation::Pause).await
}

async fn protect(
    State(s): State<Arc<ApiState>>,
    headers: HeaderMap,
    body: Result<Json<SelectionBody>, JsonRejection>,
) -> Response {
    mutate(s, headers, body, Operation::Protect).await
}

async fn resume(
    State(s): State<Arc<ApiState>>,
    headers: HeaderMap,
    body: Result<Json<SelectionBody>, JsonRejection>,
) -> Response {
    mutate(s, headers, body, Operation::Resume).await
}

/// The token first (401/403), then the body (400): the prologue of every
/// mutating call.
fn authorized_body(
    s: &ApiState,
    headers: &HeaderMap,
    body: Result<Json<SelectionBody>, JsonRejection>,
) -> Result<SelectionBody, Box<Response>> {
    authorized(s, headers)?;
    body.map(|Json(b)| b)
        .map_err(|e| Box::new(error(StatusCode::BAD_REQUEST, "bad_request", e.body_text())))
}

/// The mirror a request body names, or 404 listing the configured ones.
fn named_mirror<'a>(s: &'a ApiState, name: &str) -> Result<&'a Arc<MirrorContext>, Box<Response>> {
    s.mirrors.get(name).ok_or_else(|| {
        Box::new(error(
            StatusCode::NOT_FOUND,
            "unknown_mirror",
            format!(
                "no mirror named {name:?} (configured: {})",
                s.mirrors.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        ))
    })
}

/// 404 for a selected topic the mirror's destination does not hold.
fn unknown_topic(mirror: &str, topic: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        "unknown_topic",
        format!("mirror {mirror:?} does not mirror a topic {topic:?}"),
    )
}

/// Checks the shape of a selection body as the OpenAPI `Selection` schema
/// does: `Ok(None)` for `all: true`, `Ok(Some(topics))` for a non-empty topic
/// list whose `partitions`, when given, are non-empty; 400 otherwise.
fn selection_shape(body: &SelectionBody) -> Result<Option<&Vec<TopicSelection>>, Box<Response>> {
    let bad = |m: String| Box::new(error(StatusCode::BAD_REQUEST, "bad_request", m));
    let selection = match (body.all, &body.topics) {
        (true, Some(_)) => return Err(bad("give either `all: true` or `topics`, not both".into())),
        (true, None) => None,
        (false, Some(t)) if !t.is_empty() => Some(t),
        (false, _) => {
            return Err(bad(
                "name a non-empty `topics` list or set `all: true`".into()
            ))
        }
    };
    if let Some(empty) = selection
        .into_iter()
        .flatten()
        .find(|sel| sel.partitions.as_ref().is_some_and(|p| p.is_empty()))
    {
        return Err(bad(format!(
            "`partitions` of {:?} is empty: leave it out for every partition",
            empty.topic
        )));
    }
    Ok(selection)
}

async fn mutate(
    s: Arc<ApiState>,
    headers: HeaderMap,
    body: Result<Json<SelectionBody>, JsonRejection>,
    op: Operation,
) -> Response {
    let body = match authorized_body(&s, &headers, body) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    // The shape of the selection first (400), then what it names (404).
    let selection = match selection_shape(&body) {
        Ok(sel) => sel,
        Err(r) => return *r,
    };
    let mirror = match named_mirror(&s, &body.mirror) {
        Ok(m) => m,
        Err(r) => return *r,
    };
    let Some(source) = mirror.source() else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "source_unknown",
            format!(
                "mirror {:?} has not identified its source cluster yet",
                body.mirror
            ),
        );
    };
    let known: BTreeMap<String, i32> = mirror.destination_topics().into_iter().collect();
    // Resolve the selection completely before changing anything.
    let mut targets: Vec<(String, i32)> = Vec::new();
    let selection_is_all = selection.is_none();
    match selection {
        None => {
            // Internal topics (`__consumer_offsets`, `__transaction_state`,
            // `__mirror_state`, ...) are never stopped wholesale: a
            // destination's own internal topics must not be sealed by `--all`.
            for (t, n) in known.iter().filter(|(t, _)| !is_internal_topic(t)) {
                targets.extend((0..*n).map(|p| (t.clone(), p)));
            }
        }
        Some(topics) => {
            for sel in topics {
                let Some(n) = known.get(&sel.topic) else {
                    return unknown_topic(&body.mirror, &sel.topic);
                };
                match &sel.partitions {
                    None => targets.extend((0..*n).map(|p| (sel.topic.clone(), p))),
                    Some(ps) => {
                        for &p in ps {
                            if p < 0 || p >= *n {
                                return error(
                                    StatusCode::NOT_FOUND,
                                    "unknown_partition",
                                    format!(
                                        "{}-{p} does not exist ({} has {n} partitions)",
                                        sel.topic, sel.topic
                                    ),
                                );
                            }
                            targets.push((sel.topic.clone(), p));
                        }
                    }
                }
            }
        }
    }
    targets.sort();
    targets.dedup();
    // `--all` covers the source's topics; one the destination never created
    // has nothing mirrored to seal and no topic id to key a record by: it is
    // left out and named in the answer, not a reason to refuse the rest (a
    // disaster stop must not hinge on a topic nobody mirrored).
    let mut skipped = Vec::new();
    if selection_is_all {
        let mut topics: Vec<String> = targets.iter().map(|(t, _)| t.clone()).collect();
        topics.dedup();
        let missing = match s.lifecycle.missing_destination_topics(topics).await {
            Ok(m) => m,
            Err(e) => {
                return (
                    StatusCode::SERVICE_UNAVAILABLE,
                    Json(json!({"error": "transition_failed", "message": e.to_string(), "applied": []})),
                )
                    .into_response();
            }
        };
        if !missing.is_empty() {
            tracing::warn!(mirror = %mirror.name, topics = ?missing, operation = ?op,
                "source topics with no destination topic left out of --all (nothing of them is mirrored)");
            targets.retain(|(t, _)| !missing.contains(t));
            skipped = missing
                .into_iter()
                .map(|t| json!({"topic": t, "reason": "no_destination_topic"}))
                .collect();
        }
    }
    // Every transition must be allowed before any is made. Protecting a
    // partition this mirror already mirrors changes nothing.
    let mut unchanged = Vec::new();
    let mut to_change = Vec::new();
    for (topic, p) in &targets {
        let key = mirror.key_for(topic, *p);
        let current = s.lifecycle.get(&key);
        let mirroring_here = current
            .as_ref()
            .is_none_or(|e| e.mirror == mirror.name && e.state == LState::Mirroring);
        if op == Operation::Protect && mirroring_here {
            unchanged.push(json!({"topic": topic, "partition": p, "state": "MIRRORING"}));
            continue;
        }
        if let Err(e) =
            crate::lifecycle::Lifecycle::check_transition(&key, current.as_ref(), &mirror.name, op)
        {
            let code = match e {
                crate::lifecycle::TransitionError::OtherMirror { .. } => "other_mirror",
                _ => "transition_not_allowed",
            };
            return error(
                StatusCode::CONFLICT,
                code,
                format!("{e}; nothing was changed"),
            );
        }
        to_change.push((topic.clone(), *p));
    }
    // Persisted in batches (one append per few hundred partitions): a
    // disaster `stop --all` of thousands of partitions is one round trip
    // per batch, not one per partition.
    let keys: Vec<_> = to_change
        .iter()
        .map(|(topic, p)| mirror.key_for(topic, *p))
        .collect();
    let (changed, failed) = s
        .lifecycle
        .request_many(&keys, &mirror.name, &source.text, op)
        .await;
    let mut done = Vec::with_capacity(changed.len());
    for (key, e) in keys.iter().zip(&changed) {
        if let (Operation::Protect, Some(floor)) = (op, e.episode_floor()) {
            // The episode before ended with a barrier: nothing of its
            // producer state carries over (the next fetch starts the
            // new one; its claims are tombstoned by the next
            // snapshot round).
            mirror
                .registry
                .partition(key)
                .with(|st| st.start_episode_at(floor));
        }
        done.push(view(e, 0));
    }
    if let Some(e) = failed {
        let status = match e {
            crate::lifecycle::TransitionError::NotPersisted { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            _ => StatusCode::CONFLICT,
        };
        return (
            status,
            Json(json!({"error": "transition_failed", "message": e.to_string(), "applied": done})),
        )
            .into_response();
    }
    let mut answer = json!({"applied": done});
    if op == Operation::Protect {
        answer["unchanged"] = json!(unchanged);
    }
    if !skipped.is_empty() {
        answer["skipped"] = json!(skipped);
    }
    (StatusCode::OK, Json(answer)).into_response()
}

/// Kafka's internal topics and mirrorguard's own: names starting with `__`.
pub fn is_internal_topic(topic: &str) -> bool {
    topic.starts_with("__")
}

async fn producers(
    State(s): State<Arc<ApiState>>,
    headers: HeaderMap,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Response {
    if let Err(r) = authorized_read(&s, &headers) {
        return *r;
    }
    let (topic, partition) = match path {
        Ok(Path(p)) => p,
        Err(e) => return error(StatusCode::BAD_REQUEST, "bad_request", e.body_text()),
    };
    let Ok(partition) = partition.parse::<i32>() else {
        return error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("partition must be an int32, got {partition:?}"),
        );
    };
    let key = crate::producer_state::PartitionKey::new([0; 16], topic.as_str(), partition);
    let Some(handle) = s.registry.get(&key) else {
        return error(
            StatusCode::NOT_FOUND,
            "unknown_partition",
            format!("no producer state for {topic}-{partition} (nothing mirrored through this proxy yet)"),
        );
    };
    let producers: Vec<serde_json::Value> = handle.with(|p| {
        let mut v: Vec<_> = p
            .producers()
            .map(|(pid, e)| {
                json!({
                    "producer_id": pid,
                    "decoded": crate::pid::decode(pid).map(|d| json!({"layout": d.layout.name(), "region": d.region, "original_pid": d.original})),
                    "origin_cluster": e.origin.source_cluster.to_string(),
                    "original_pid": e.origin.original_pid,
                    "epoch": e.epoch,
                    "last_sequence": e.last_sequence,
                    "last_offset": e.last_offset,
                    "coordinator_epoch": e.coordinator_epoch,
                    "open_transaction_first_offset": e.transaction_first_offset(),
                    "last_timestamp": e.last_timestamp,
                })
            })
            .collect();
        v.sort_by_key(|x| x["producer_id"].as_i64());
        v
    });
    Json(json!({"topic": topic, "partition": partition, "producers": producers})).into_response()
}

async fn collisions(State(s): State<Arc<ApiState>>, headers: HeaderMap) -> Response {
    if let Err(r) = authorized_read(&s, &headers) {
        return *r;
    }
    let mut out = Vec::new();
    for key in s.registry.partition_keys() {
        if let Some(h) = s.registry.get(&key) {
            h.with(|p| {
                for r in p.salts().records() {
                    out.push(json!({
                        "topic": key.topic.to_string(),
                        "partition": key.partition,
                        "source_cluster": r.origin.source_cluster.to_string(),
                        "original_pid": r.origin.original_pid,
                        "salt": r.salt,
                        "mapped_pid": r.mapped_pid,
                        "colliding_cluster": r.colliding_cluster.to_string(),
                        "timestamp_ms": r.timestamp_ms,
                        "record_offset": r.record_offset,
                    }));
                }
            });
        }
    }
    Json(json!({"collisions": out})).into_response()
}

async fn anomalies(State(s): State<Arc<ApiState>>, headers: HeaderMap) -> Response {
    if let Err(r) = authorized_read(&s, &headers) {
        return *r;
    }
    let log = s.registry.anomaly_log();
    let records: Vec<_> = log.records().collect();
    Json(json!({"total_recorded": log.total_recorded(), "anomalies": records})).into_response()
}

#[cfg(test)]
mod tests {
    use super::{bearer_token, shows_producer_ids};

    #[test]
    fn reads_showing_producer_ids_are_recognised() {
        for p in [
            "/v1/collisions",
            "/v1/anomalies",
            "/v1/partitions/t/0/producers",
            "/v1/partitions/a/b/c/producers",
        ] {
            assert!(shows_producer_ids(p), "{p}");
        }
        for p in [
            "/v1/partitions",
            "/v1/openapi.json",
            "/metrics",
            "/v1/partitions/stop",
        ] {
            assert!(!shows_producer_ids(p), "{p}");
        }
    }

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer abc"), Some("abc"));
        assert_eq!(bearer_token("BEARER abc"), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer"), None);
        assert_eq!(bearer_token("Bearerabc"), None);
    }
}
