//! Prometheus metrics, all named `mirrorguard_*`, served by the admin listener.
//!
//! Label lookups cost tens to hundreds of nanoseconds, so hot code never looks
//! a label set up per request or batch: it asks once for an [`ApiMetrics`]
//! handle (cheap `Arc` clones of the underlying atomics) and keeps it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Labels of per-API series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiLabels {
    /// Listener name.
    pub listener: String,
    /// Kafka API name (or `unknown`).
    pub api: String,
}

/// Labels of byte counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ByteLabels {
    /// Listener name.
    pub listener: String,
    /// Kafka API name.
    pub api: String,
    /// `client_to_upstream` or `upstream_to_client`.
    pub direction: &'static str,
}

/// Labels of per-listener series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabels {
    /// Listener name.
    pub listener: String,
}

/// Labels of error counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// Listener name.
    pub listener: String,
    /// Error kind (a stable, documented word).
    pub kind: &'static str,
}

/// Labels of `mirrorguard_connection_ends_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConnectionEndLabels {
    /// Listener name.
    pub listener: String,
    /// `client`, `upstream` or `proxy`.
    pub side: &'static str,
    /// `closed`, `reset`, `mid_request`, `protocol` or `shutdown`.
    pub cause: &'static str,
}

/// Labels of per-mirror event counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MirrorKindLabels {
    /// Mirror name.
    pub mirror: String,
    /// Event or anomaly kind.
    pub kind: &'static str,
}

/// Labels of per-mirror gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MirrorLabels {
    /// Mirror name.
    pub mirror: String,
}

/// Labels of `mirrorguard_tls_reloads_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `ok` or `error`.
    pub result: &'static str,
}

/// Labels of per-listener results.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerResultLabels {
    /// Listener name.
    pub listener: String,
    /// `ok` or `error`.
    pub result: &'static str,
}

/// Labels of `mirrorguard_admin_refused_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// `missing_token`, `bad_token`, `no_token_configured`, `host_not_allowed`.
    pub reason: &'static str,
}

/// Labels of `mirrorguard_tls_certificate_expiry_timestamp_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CertificateLabels {
    /// The TLS configuration (`admin tls`, `<listener> tls`, `state tls`, ...).
    pub tls: String,
    /// `server` (the certificate served), `client` (the one presented
    /// upstream) or `ca` (the earliest-expiring certificate of its CA bundle).
    pub role: &'static str,
}

/// Labels of per-state gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    /// MIRRORING, PAUSED, STOPPING, STOPPED or FAILED.
    pub state: &'static str,
}

fn latency_histogram() -> Histogram {
    // 100 us .. ~6.5 s
    Histogram::new(exponential_buckets(0.0001, 2.0, 17))
}

/// Every metric the proxy exports, with the registry that serves them.
pub struct Metrics {
    registry: Registry,
    requests: Family<ApiLabels, Counter>,
    bytes: Family<ByteLabels, Counter>,
    latency: Family<ApiLabels, Histogram, fn() -> Histogram>,
    /// Open client connections per listener.
    pub connections_open: Family<ListenerLabels, Gauge>,
    /// Accepted client connections per listener.
    pub connections_total: Family<ListenerLabels, Counter>,
    /// Ended client connections by the side and cause that ended them.
    connection_ends: Family<ConnectionEndLabels, Counter>,
    /// Upstream failures by kind (`connect`, `connect_timeout`, `disconnect`, `protocol`).
    pub upstream_errors: Family<KindLabels, Counter>,
    /// Hostile or broken client frames by kind.
    pub frame_errors: Family<KindLabels, Counter>,
    /// Responses the proxy could not rewrite and had to fail.
    pub rewrite_errors: Family<KindLabels, Counter>,
    /// Upstream broker nodes currently served, per listener.
    pub upstream_nodes: Family<ListenerLabels, Gauge>,
    /// Fetch-path events per mirror (see the help text for the kinds).
    pub mirror_events: Family<MirrorKindLabels, Counter>,
    /// Destination partitions this instance serves, per mirror (its
    /// serving record is the latest; one instance per destination broker).
    pub partitions_served: Family<MirrorLabels, Gauge>,
    /// Sealed partitions whose fetcher holds the whole seal, waiting for the
    /// destination's high watermark to pass its end, per mirror.
    pub seals_awaiting_destination_hw: Family<MirrorLabels, Gauge>,
    /// Producer-state anomalies per mirror and kind.
    pub anomalies: Family<MirrorKindLabels, Counter>,
    /// Producers tracked in the shadow producer state, all partitions.
    pub producer_state_producers: Gauge,
    /// Estimated memory of the shadow producer state.
    pub producer_state_bytes: Gauge,
    /// Destination partitions with producer state.
    pub producer_state_partitions: Gauge,
    /// Transaction closings retained below the destination fetchers'
    /// positions, all partitions.
    pub producer_state_closings_retained: Gauge,
    /// Closings dropped by `[producer_state] closings_retained_total_max`
    /// (see [`Self::set_closings_dropped`]).
    producer_state_closings_dropped: Counter,
    /// The total last exported into `producer_state_closings_dropped`.
    closings_dropped_exported: AtomicU64,
    /// `__mirror_state` operations by kind (`append`, `append_error`, `load`, `load_error`).
    pub state_store_ops: Family<KindLabels, Counter>,
    /// Mirrored partitions per life-cycle state (entries only; untouched
    /// partitions are MIRRORING without an entry).
    pub partitions_by_state: Family<StateLabels, Gauge>,
    /// Seal events by kind: `abort_marker_served`, `barrier_served`, `seal_completed`.
    pub seal_events: Family<MirrorKindLabels, Counter>,
    /// Produce requests (partitions) refused by the produce guard, by listener.
    pub produce_refused: Family<ListenerLabels, Counter>,
    /// Writes other than Produce refused by the guard (partitions, or
    /// topics for CreatePartitions and DeleteTopics), by listener and API.
    pub guard_refused: Family<ApiLabels, Counter>,
    /// Failed client TLS handshakes by listener and kind (`plaintext`,
    /// `timeout`, `eof`, `protocol`, `unknown_ca`, `cert_expired`,
    /// `no_client_cert`, `bad_certificate`, `alert`, ...).
    pub tls_handshake_errors: Family<KindLabels, Counter>,
    /// TLS configurations re-read on SIGHUP, by result (`ok`, `error`).
    pub tls_reloads: Family<ResultLabels, Counter>,
    /// Re-authentications (KIP-368) of mirror listeners' upstream
    /// connections, by listener and result (`ok`, `error`).
    reauthentications: Family<ListenerResultLabels, Counter>,
    /// Requests a mirror listener refused (an API not on its list), by
    /// listener and API.
    pub mirror_refused: Family<ApiLabels, Counter>,
    /// Connections refused by `[limits]`, by listener and reason
    /// (`max_connections`, `max_connections_per_address`).
    pub connections_refused: Family<KindLabels, Counter>,
    /// Connections closed because a request they sent could not be held
    /// within `[limits] max_buffered_request_bytes`, by listener.
    pub budget_refused: Family<ListenerLabels, Counter>,
    /// Request bytes held in memory now, all connections (the budget's use).
    pub buffered_request_bytes: Gauge,
    /// Client (re-)authentications on mirror listeners, by listener and
    /// result (`ok`, `failed`, `expired`: a request after the session's end).
    pub client_authentications: Family<KindLabels, Counter>,
    /// Admin requests refused before any handler ran, by reason.
    admin_refused: Family<ReasonLabels, Counter>,
    /// notAfter of every certificate mirrorguard serves or presents, and of
    /// its CA bundles (set at scrape time from the live TLS configurations).
    tls_certificate_expiry: Family<CertificateLabels, Gauge>,
}

/// Cached handles for one (listener, API) pair.
#[derive(Clone)]
pub struct ApiMetrics {
    /// Requests forwarded.
    pub requests: Counter,
    /// Request bytes, client to upstream.
    pub bytes_in: Counter,
    /// Response bytes, upstream to client.
    pub bytes_out: Counter,
    /// Time from the request leaving for upstream to its response reaching the client.
    pub latency: Histogram,
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Arc<Self> {
        let mut registry = Registry::default();
        let requests = Family::<ApiLabels, Counter>::default();
        let bytes = Family::<ByteLabels, Counter>::default();
        let latency = Family::<ApiLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram,
        );
        let connections_open = Family::<ListenerLabels, Gauge>::default();
        let connections_total = Family::<ListenerLabels, Counter>::default();
        let connection_ends = Family::<ConnectionEndLabels, Counter>::default();
        let upstream_errors = Family::<KindLabels, Counter>::default();
        let frame_errors = Family::<KindLabels, Counter>::default();
        let rewrite_errors = Family::<KindLabels, Counter>::default();
        let upstream_nodes = Family::<ListenerLabels, Gauge>::default();
        let tls_handshake_errors = Family::<KindLabels, Counter>::default();
        let tls_reloads = Family::<ResultLabels, Counter>::default();
        registry.register(
            "mirrorguard_tls_handshake_errors",
            "Client TLS handshakes that failed, by listener and kind (plaintext, timeout, eof, \
             protocol, unknown_ca, cert_expired, no_client_cert, bad_certificate, alert, io)",
            tls_handshake_errors.clone(),
        );
        registry.register(
            "mirrorguard_tls_reloads",
            "TLS configurations re-read from their files on SIGHUP, by result (ok, error: the old \
             configuration stays)",
            tls_reloads.clone(),
        );
        let reauthentications = Family::<ListenerResultLabels, Counter>::default();
        registry.register(
            "mirrorguard_reauthentications",
            "Re-authentications (KIP-368) of mirror listeners' upstream connections before their \
             session expires, by listener and result (ok, error: the connection is answered \
             locally, then closed)",
            reauthentications.clone(),
        );
        let admin_refused = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "mirrorguard_admin_refused",
            "Admin API requests refused before any handler ran, by reason (missing_token, \
             bad_token, no_token_configured, host_not_allowed: a Host header naming neither an IP \
             literal, localhost nor [admin] allowed_hosts, as DNS rebinding sends)",
            admin_refused.clone(),
        );
        let tls_certificate_expiry = Family::<CertificateLabels, Gauge>::default();
        registry.register(
            "mirrorguard_tls_certificate_expiry_timestamp_seconds",
            "notAfter (Unix time) of the certificates of each TLS configuration: role server (the \
             leaf served to clients), client (the leaf presented upstream), ca (the \
             earliest-expiring certificate of its CA bundle); re-read on SIGHUP",
            tls_certificate_expiry.clone(),
        );
        let mirror_events = Family::<MirrorKindLabels, Counter>::default();
        let partitions_served = Family::<MirrorLabels, Gauge>::default();
        registry.register(
            "mirrorguard_partitions_served",
            "Destination partitions this instance serves (took over, or served since start-up \
             without shared state), per mirror",
            partitions_served.clone(),
        );
        let seals_awaiting_destination_hw = Family::<MirrorLabels, Gauge>::default();
        registry.register(
            "mirrorguard_seals_awaiting_destination_hw",
            "Sealed partitions whose fetcher holds the whole seal, waiting for the destination's \
             high watermark to pass the seal's end before they are STOPPED, per mirror",
            seals_awaiting_destination_hw.clone(),
        );
        let anomalies = Family::<MirrorKindLabels, Counter>::default();
        let producer_state_producers = Gauge::default();
        let producer_state_bytes = Gauge::default();
        let producer_state_partitions = Gauge::default();
        let producer_state_closings_retained = Gauge::default();
        let producer_state_closings_dropped = Counter::default();
        registry.register(
            "mirrorguard_producer_state_closings_retained",
            "Transaction closings retained below the destination fetchers' positions, all \
             partitions (bounded by [producer_state] closings_retained_total_max)",
            producer_state_closings_retained.clone(),
        );
        registry.register(
            "mirrorguard_producer_state_closings_dropped",
            "Transaction closings below a destination fetcher's position forgotten because \
             [producer_state] closings_retained_total_max was reached (a seal planned again \
             below them reports open_at_cut_incomplete)",
            producer_state_closings_dropped.clone(),
        );
        let state_store_ops = Family::<KindLabels, Counter>::default();
        let partitions_by_state = Family::<StateLabels, Gauge>::default();
        let seal_events = Family::<MirrorKindLabels, Counter>::default();
        let produce_refused = Family::<ListenerLabels, Counter>::default();
        let guard_refused = Family::<ApiLabels, Counter>::default();
        registry.register(
            "mirrorguard_partitions",
            "Mirrored partitions with a life-cycle entry, by state",
            partitions_by_state.clone(),
        );
        registry.register(
            "mirrorguard_seal_events",
            "Seal events per mirror: abort_marker_served, barrier_served, seal_completed",
            seal_events.clone(),
        );
        registry.register(
            "mirrorguard_produce_refused",
            "Produce partitions refused by the produce guard because the partition is mirrored",
            produce_refused.clone(),
        );
        let mirror_refused = Family::<ApiLabels, Counter>::default();
        registry.register(
            "mirrorguard_mirror_refused",
            "Requests a mirror listener refused because their API is not on its list (README, \
             Security), by listener and API",
            mirror_refused.clone(),
        );
        let connections_refused = Family::<KindLabels, Counter>::default();
        registry.register(
            "mirrorguard_connections_refused",
            "Client connections closed at accept by [limits], by listener and kind \
             (max_connections, max_connections_per_address)",
            connections_refused.clone(),
        );
        let budget_refused = Family::<ListenerLabels, Counter>::default();
        registry.register(
            "mirrorguard_budget_refused",
            "Client connections closed because a request could not be held within \
             [limits] max_buffered_request_bytes, by listener",
            budget_refused.clone(),
        );
        let buffered_request_bytes = Gauge::default();
        registry.register(
            "mirrorguard_buffered_request_bytes",
            "Request bytes held in memory, all connections (the use of \
             [limits] max_buffered_request_bytes)",
            buffered_request_bytes.clone(),
        );
        let client_authentications = Family::<KindLabels, Counter>::default();
        registry.register(
            "mirrorguard_client_authentications",
            "Client authentications on mirror listeners (first ones and KIP-368 \
             re-authentications), by listener and kind (ok, failed, expired)",
            client_authentications.clone(),
        );
        registry.register(
            "mirrorguard_guard_refused",
            "Partitions (topics for CreatePartitions and DeleteTopics) of writes other than \
             Produce refused by the guard because they are mirrored, by API",
            guard_refused.clone(),
        );
        registry.register(
            "mirrorguard_mirror_events",
            "Fetch-path events per mirror: batch_seen, batch_rewritten (PID rewritten, CRC \
             updated in O(1)), aborted_txn_rewritten, barrier_seen, collision, \
             oversized_source_pid, corrupt_records, state_limit, take_over (a partition taken \
             over from another instance or at its first fetch here), stale_dropped (another \
             instance took a partition served here over), response_streamed (a large Fetch \
             response rewritten as it arrived), response_held_long (a streamed response held \
             10 s or more by its waits: take-overs, replays, claims), source_truncated (the source's log was \
             truncated below what a partition's producer state observed: the state started \
             over and the source is replayed)",
            mirror_events.clone(),
        );
        registry.register(
            "mirrorguard_anomalies",
            "Producer-state anomalies per mirror and kind (sequence_gap, sequence_overlap, \
             epoch_regression, marker_foreign_origin, marker_without_transaction, \
             pid_claimed_by_two_origins, ...)",
            anomalies.clone(),
        );
        registry.register(
            "mirrorguard_producer_state_producers",
            "Producers tracked in the shadow producer state",
            producer_state_producers.clone(),
        );
        registry.register(
            "mirrorguard_producer_state_bytes",
            "Estimated memory of the shadow producer state",
            producer_state_bytes.clone(),
        );
        registry.register(
            "mirrorguard_producer_state_partitions",
            "Destination partitions with shadow producer state",
            producer_state_partitions.clone(),
        );
        registry.register(
            "mirrorguard_state_store_ops",
            "__mirror_state operations: append, append_error, load, load_error, tail_error",
            state_store_ops.clone(),
        );
        registry.register(
            "mirrorguard_requests",
            "Kafka requests forwarded, by listener and API",
            requests.clone(),
        );
        registry.register(
            "mirrorguard_bytes",
            "Kafka frame bytes forwarded, by listener, API and direction",
            bytes.clone(),
        );
        registry.register(
            "mirrorguard_request_duration_seconds",
            "Time from forwarding a request upstream to returning its response",
            latency.clone(),
        );
        registry.register(
            "mirrorguard_connections_open",
            "Open client connections",
            connections_open.clone(),
        );
        registry.register(
            "mirrorguard_connections",
            "Client connections accepted",
            connections_total.clone(),
        );
        registry.register(
            "mirrorguard_connection_ends",
            "Client connections ended, by the side that ended them (client, upstream, proxy) and \
             the cause (closed, reset, mid_request, protocol, shutdown); only protocol is \
             malformed input",
            connection_ends.clone(),
        );
        registry.register(
            "mirrorguard_upstream_errors",
            "Upstream broker failures: connect, connect_timeout, disconnect, protocol",
            upstream_errors.clone(),
        );
        registry.register(
            "mirrorguard_frame_errors",
            "Malformed client frames (the connection is closed): too_large, negative_size, tls_on_plaintext, bad_header, bad_request",
            frame_errors.clone(),
        );
        registry.register(
            "mirrorguard_rewrite_errors",
            "Upstream responses that could not be parsed for address rewriting",
            rewrite_errors.clone(),
        );
        registry.register(
            "mirrorguard_upstream_nodes",
            "Upstream broker nodes known and served on a proxy port",
            upstream_nodes.clone(),
        );
        Arc::new(Self {
            registry,
            requests,
            bytes,
            latency,
            connections_open,
            connections_total,
            connection_ends,
            upstream_errors,
            frame_errors,
            rewrite_errors,
            upstream_nodes,
            mirror_events,
            partitions_served,
            seals_awaiting_destination_hw,
            anomalies,
            producer_state_producers,
            producer_state_bytes,
            producer_state_partitions,
            producer_state_closings_retained,
            producer_state_closings_dropped,
            closings_dropped_exported: AtomicU64::new(0),
            state_store_ops,
            partitions_by_state,
            seal_events,
            produce_refused,
            guard_refused,
            tls_handshake_errors,
            tls_reloads,
            reauthentications,
            mirror_refused,
            connections_refused,
            budget_refused,
            buffered_request_bytes,
            client_authentications,
            admin_refused,
            tls_certificate_expiry,
        })
    }

    /// Handles for one (listener, API) pair; look up once, then keep.
    pub fn api(&self, listener: &str, api_key: i16) -> ApiMetrics {
        let api = crate::codec::api::api_label(api_key).to_string();
        let labels = ApiLabels {
            listener: listener.to_string(),
            api: api.clone(),
        };
        let byte_labels = |direction| ByteLabels {
            listener: listener.to_string(),
            api: api.clone(),
            direction,
        };
        // Each get_or_create guard must be dropped before the next call on the
        // same family: the second call may need the family's write lock.
        let requests = self.requests.get_or_create(&labels).clone();
        let bytes_in = self
            .bytes
            .get_or_create(&byte_labels("client_to_upstream"))
            .clone();
        let bytes_out = self
            .bytes
            .get_or_create(&byte_labels("upstream_to_client"))
            .clone();
        let latency = self.latency.get_or_create(&labels).clone();
        ApiMetrics {
            requests,
            bytes_in,
            bytes_out,
            latency,
        }
    }

    /// Increments an error family for (listener, kind).
    /// Counts one ended client connection (once per connection, not per batch).
    pub fn connection_end(&self, listener: &str, side: &'static str, cause: &'static str) {
        self.connection_ends
            .get_or_create(&ConnectionEndLabels {
                listener: listener.to_string(),
                side,
                cause,
            })
            .inc();
    }

    /// Brings `mirrorguard_producer_state_closings_dropped_total` up to
    /// `total` (the producer state's own count, read at scrape time; a
    /// smaller total is ignored). Concurrent scrapes add each drop once.
    pub fn set_closings_dropped(&self, total: u64) {
        let before = self
            .closings_dropped_exported
            .fetch_max(total, Ordering::Relaxed);
        if total > before {
            self.producer_state_closings_dropped.inc_by(total - before);
        }
    }

    /// Counts one re-authentication of an upstream connection.
    pub fn count_reauthentication(&self, listener: &str, result: &'static str) {
        self.reauthentications
            .get_or_create(&ListenerResultLabels {
                listener: listener.to_string(),
                result,
            })
            .inc();
    }

    /// Counts a client (re-)authentication on a mirror listener (`ok`,
    /// `failed`, `expired`).
    pub fn count_client_authentication(&self, listener: &str, kind: &'static str) {
        Self::count(&self.client_authentications, listener, kind);
    }

    /// Counts one admin request refused for `reason`.
    pub fn count_admin_refused(&self, reason: &'static str) {
        self.admin_refused
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Replaces the certificate expiry gauges with `expiries` (TLS
    /// configuration, role, notAfter): the earliest per label set.
    pub fn set_certificate_expiries(&self, expiries: &[(String, &'static str, i64)]) {
        let mut earliest: std::collections::HashMap<CertificateLabels, i64> =
            std::collections::HashMap::new();
        for (tls, role, not_after) in expiries {
            let e = earliest
                .entry(CertificateLabels {
                    tls: tls.clone(),
                    role,
                })
                .or_insert(*not_after);
            *e = (*e).min(*not_after);
        }
        self.tls_certificate_expiry.clear();
        for (labels, not_after) in earliest {
            self.tls_certificate_expiry
                .get_or_create(&labels)
                .set(not_after);
        }
    }

    /// Increments `family` for one listener and kind.
    pub fn count(family: &Family<KindLabels, Counter>, listener: &str, kind: &'static str) {
        family
            .get_or_create(&KindLabels {
                listener: listener.to_string(),
                kind,
            })
            .inc();
    }

    /// The Prometheus/OpenMetrics text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "failed to encode metrics");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every metric family this module registers is in the README's metrics
    /// table, so an operator looking one up finds it. The names are read from
    /// this file's registrations (an empty family is not encoded at all).
    #[test]
    fn every_metric_family_is_documented_in_the_readme() {
        let readme = include_str!("../README.md");
        let source = include_str!("metrics.rs");
        let registrations = &source[..source.find("#[cfg(test)]").unwrap_or(source.len())];
        let families: Vec<&str> = registrations
            .split("registry.register(")
            .skip(1)
            .filter_map(|call| call.split('"').nth(1))
            .collect();
        assert!(families.len() >= 20, "{families:?}");
        let missing: Vec<&str> = families
            .into_iter()
            .filter(|f| !readme.contains(&format!("`{f}")))
            .collect();
        assert!(missing.is_empty(), "not in README.md: {missing:?}");
    }

    #[test]
    fn api_handles_share_series() {
        let m = Metrics::new();
        let a = m.api("main", 0);
        let _other_api = m.api("main", 1); // a second label set must not deadlock
        let b = m.api("main", 0);
        a.requests.inc();
        b.requests.inc();
        a.bytes_in.inc_by(10);
        Metrics::count(&m.frame_errors, "main", "too_large");
        let text = m.encode();
        assert!(
            text.contains(r#"mirrorguard_requests_total{listener="main",api="Produce"} 2"#),
            "{text}"
        );
        assert!(text.contains(r#"mirrorguard_bytes_total{listener="main",api="Produce",direction="client_to_upstream"} 10"#), "{text}");
        assert!(
            text.contains(r#"mirrorguard_frame_errors_total{listener="main",kind="too_large"} 1"#),
            "{text}"
        );
    }

    #[test]
    fn closings_dropped_follows_the_producer_state_total() {
        let m = Metrics::new();
        m.producer_state_closings_retained.set(7);
        m.set_closings_dropped(3);
        m.set_closings_dropped(5);
        // An older total read by a slower scrape adds nothing.
        m.set_closings_dropped(4);
        let text = m.encode();
        assert!(
            text.contains("mirrorguard_producer_state_closings_dropped_total 5\n"),
            "{text}"
        );
        assert!(
            text.contains("mirrorguard_producer_state_closings_retained 7\n"),
            "{text}"
        );
    }
}
