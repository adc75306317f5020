//! `proxy.toml`: the configuration file, parsed with serde and checked in an
//! explicit validation step.
//!
//! Parsing refuses unknown keys (`deny_unknown_fields`) and reports the line,
//! column and field path of the first problem; [`Config::validate`] then checks
//! what types cannot express (addresses that parse, unique names, sane
//! limits), naming the offending field.
//!
//! (Over 600 lines on purpose: the whole `proxy.toml` schema and its
//! validation in one place, so defaults and checks are read together.)

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Kafka's `socket.request.max.bytes` default (100 MiB): the default frame limit.
pub const DEFAULT_MAX_FRAME_BYTES: u32 = 100 * 1024 * 1024;

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Admin HTTP listener (health, readiness, metrics, API).
    pub admin: AdminConfig,
    /// Log format and filter.
    #[serde(default)]
    pub logging: LoggingConfig,
    /// Frame size and shutdown limits.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// Plain proxy listeners, one per upstream cluster.
    #[serde(default, rename = "listener")]
    pub listeners: Vec<ListenerConfig>,
    /// Produce guards in front of the destination cluster: refuse Produce
    /// for mirrored partitions until they are STOPPED.
    #[serde(default, rename = "guard")]
    pub guards: Vec<ListenerConfig>,
    /// Mirror (fetch-path) listeners, one per source cluster.
    #[serde(default, rename = "mirror")]
    pub mirrors: Vec<MirrorConfig>,
    /// The cluster holding `__mirror_state`.
    #[serde(default)]
    pub state: Option<StateConfig>,
    /// Producer-state tracking.
    #[serde(default)]
    pub producer_state: ProducerStateConfig,
    /// How secret files are checked.
    #[serde(default)]
    pub secrets: SecretsConfig,
}

/// `[secrets]`: how the files holding secrets (admin token, TLS private
/// keys, SASL password and credential files) are checked at start-up.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretsConfig {
    /// A secret file users other than mirrorguard's own can read:
    /// `refuse` (default) stops start-up naming it, `warn` logs it.
    #[serde(default)]
    pub unsafe_permissions: crate::secrets::UnsafePermissions,
}

/// `[[mirror]]`: a fetch-path listener between a destination's mirror
/// fetcher and a source cluster. Port per node, like `[[listener]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MirrorConfig {
    /// Mirror name (logs, metrics, admin API).
    pub name: String,
    /// Address the destination's fetcher bootstraps from.
    pub bootstrap: String,
    /// Interface the per-node listeners bind to.
    #[serde(default = "default_listen_host")]
    pub listen_host: String,
    /// Host name handed to the fetcher in Metadata and friends; defaults to
    /// `listen_host` (as `[[listener]]`), which must then not be a wildcard.
    #[serde(default)]
    pub advertised_host: String,
    /// Source broker node N is served at `node_port_base + N`.
    pub node_port_base: u16,
    /// Source cluster bootstrap servers.
    pub source_bootstrap: Vec<String>,
    /// Source cluster id (Kafka base64 or UUID text); learned from the source's
    /// Metadata when absent.
    #[serde(default)]
    pub source_cluster_id: Option<String>,
    /// `region` (rewrite PIDs into the source's region) or `preserve`.
    #[serde(default)]
    pub pid_mode: PidMode,
    /// Region layout: `high` (EOS-safe, default) or `sign-bit`.
    #[serde(default)]
    pub layout: LayoutConfig,
    /// Destination topic = this prefix + source topic name (empty by default:
    /// same name, as KIP-1279 mirrors do).
    #[serde(default)]
    pub destination_topic_prefix: String,
    /// Upstream connect timeout.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// Period of the proxy's own source Metadata refresh.
    #[serde(default = "default_metadata_refresh_ms")]
    pub metadata_refresh_ms: u64,
    /// Bootstrap servers of the destination cluster (where the mirrored
    /// topics live): destination topic ids are read there, and open mirrored
    /// transactions are aborted there when the fetcher is gone. Defaults to
    /// `[state].bootstrap` (the usual deployment keeps `__mirror_state` on
    /// the destination); set it when the state cluster is a separate one.
    #[serde(default)]
    pub destination_bootstrap: Vec<String>,
    /// How long the source may take to answer a request (a Fetch: on top of
    /// its MaxWaitMs) before the connection is answered locally, as with a
    /// source that is down. Keep it below the destination fetcher's request
    /// timeout (Kafka's `replica.socket.timeout.ms`, 30 s), so a hung source
    /// is answered before the fetcher gives up.
    #[serde(default = "default_upstream_request_timeout_ms")]
    pub upstream_request_timeout_ms: u64,
    /// Bootstrap address reserved for the destination's mirror fetcher
    /// (with `fetcher_node_port_base`). Only fetches arriving on these
    /// ports take a cut, complete or fail a seal or change producer state;
    /// `bootstrap` and its node ports serve other readers (consumers, dump
    /// tools) without changing any seal. Required unless `fetcher_identity
    /// = "any-reader"`.
    #[serde(default)]
    pub fetcher_bootstrap: Option<String>,
    /// Source node N is served to the destination fetcher at
    /// `fetcher_node_port_base + N` (with `fetcher_bootstrap`).
    #[serde(default)]
    pub fetcher_node_port_base: Option<u16>,
    /// Who counts as the destination fetcher: `ports` (the default: only
    /// connections to `fetcher_bootstrap` / `fetcher_node_port_base`) or
    /// `any-reader` (every reader of the mirror listener: a test bed's
    /// opt-in, refused unless the listener binds a loopback address, since
    /// any reader could then take a cut, fail a seal or change producer
    /// state).
    #[serde(default)]
    pub fetcher_identity: FetcherIdentity,
    /// The principals of the destination's fetcher (`User:<sasl user>`, or
    /// `User:<certificate subject>` such as `User:CN=fetcher,O=Example`),
    /// required when the listener authenticates its clients (`listener_sasl`
    /// or `tls.client_ca`): only their fetches, on the fetcher ports, take a
    /// cut, complete a seal or change producer state; other authenticated
    /// clients are readers.
    #[serde(default)]
    pub fetcher_principals: Vec<String>,
    /// Verify the CRC-32C of one batch in this many that pass (0, the
    /// default: never) and count the corrupt ones in the `corrupt_records`
    /// mirror event. PID rewrites never need it (a corrupt batch stays
    /// corrupt by CRC linearity, valid stays valid) and the destination
    /// verifies every batch it appends; a batch that would create durable
    /// state (a new producer's claim, a salt) is always verified.
    #[serde(default)]
    pub crc_verify_every: u64,
    /// mirrorguard's own SASL identity toward the source: every upstream
    /// connection of the listener, the Metadata refresh, the topic-id
    /// lookup and the replay.
    #[serde(default)]
    pub source_sasl: Option<ClientSaslConfig>,
    /// mirrorguard's own SASL identity toward the destination (topic ids,
    /// the abort of open transactions); default: `[state.sasl]`.
    #[serde(default)]
    pub destination_sasl: Option<ClientSaslConfig>,
    /// SASL required from the listener's clients, terminated by mirrorguard
    /// (none: clients connect without authenticating).
    #[serde(default)]
    pub listener_sasl: Option<ListenerSaslConfig>,
    /// TLS towards the fetcher and other readers (absent: plaintext).
    #[serde(default)]
    pub tls: Option<ServerTlsConfig>,
    /// TLS towards the source brokers (absent: plaintext).
    #[serde(default)]
    pub source_tls: Option<ClientTlsConfig>,
    /// TLS towards the destination cluster (with `destination_bootstrap`;
    /// otherwise `[state].tls` applies there).
    #[serde(default)]
    pub destination_tls: Option<ClientTlsConfig>,
    /// When a sealing partition becomes STOPPED: `destination_hw` (the
    /// default) once the destination's high watermark has passed the seal's
    /// end, so a leadership move on the destination cannot lose a sealing
    /// batch; `fetcher_offset` once the fetcher fetches past the seal's end
    /// (sound only for a destination whose leader never loses appended
    /// records, such as a single replica).
    #[serde(default)]
    pub stopped_when: StoppedWhen,
    /// Where the destination's high watermark is read (Metadata, then
    /// ListOffsets on each partition's leader); defaults to
    /// `destination_bootstrap`, else `[state].bootstrap`. The same TLS and
    /// SASL settings as the destination apply.
    #[serde(default)]
    pub destination_hw_bootstrap: Vec<String>,
    /// How often a seal waiting for the destination's high watermark reads
    /// it (doubled up to 5 s while the destination cannot be read).
    #[serde(default = "default_destination_hw_poll_ms")]
    pub destination_hw_poll_ms: u64,
    /// Transaction closings kept below the destination fetcher's position,
    /// in offsets: a destination leader can lose records it appended but
    /// did not replicate, and a seal planned again where its successor's log
    /// ends needs the transactions their markers closed. A cut further back
    /// than what is kept is reported (`open_at_cut_incomplete`).
    #[serde(default = "default_closings_retained_offsets")]
    pub closings_retained_offsets: i64,
    /// Most transaction closings kept below the destination fetcher's
    /// position per partition (the oldest go first; at most 16,384 in all).
    #[serde(default = "default_closings_retained_max")]
    pub closings_retained_max: usize,
}

impl MirrorConfig {
    /// What the partitions of this mirror keep below the fetcher's position.
    pub fn closings_retention(&self) -> crate::producer_state::ClosingsRetention {
        crate::producer_state::ClosingsRetention {
            offsets: self.closings_retained_offsets,
            max: self.closings_retained_max,
        }
    }
}

fn default_closings_retained_offsets() -> i64 {
    crate::producer_state::DEFAULT_CLOSINGS_RETAINED_OFFSETS
}

fn default_closings_retained_max() -> usize {
    crate::producer_state::DEFAULT_CLOSINGS_RETAINED_MAX
}

/// Who counts as a mirror's destination fetcher (`[[mirror]]
/// fetcher_identity`, SPEC 3 "Who moves a seal").
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum FetcherIdentity {
    /// Connections to the fetcher ports.
    #[default]
    Ports,
    /// Every reader of the mirror listener (loopback test beds only).
    AnyReader,
}

/// When a sealing partition becomes STOPPED (`[[mirror]] stopped_when`).
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StoppedWhen {
    /// Once the destination's high watermark passed the seal's end.
    #[default]
    DestinationHw,
    /// Once the fetcher fetched past the seal's end.
    FetcherOffset,
}

fn default_destination_hw_poll_ms() -> u64 {
    500
}

fn default_upstream_request_timeout_ms() -> u64 {
    10_000
}

impl MirrorConfig {
    /// The destination fetcher's own listener, when configured.
    pub fn fetcher_listener(&self) -> Option<ListenerConfig> {
        let (bootstrap, base) = (
            self.fetcher_bootstrap.as_ref()?,
            self.fetcher_node_port_base?,
        );
        Some(ListenerConfig {
            name: format!("{}-fetcher", self.name),
            bootstrap: bootstrap.clone(),
            node_port_base: base,
            ..self.listener()
        })
    }

    /// The proxy-listener part of the mirror.
    pub fn listener(&self) -> ListenerConfig {
        ListenerConfig {
            name: self.name.clone(),
            bootstrap: self.bootstrap.clone(),
            listen_host: self.listen_host.clone(),
            advertised_host: self.advertised_host.clone(),
            node_port_base: self.node_port_base,
            upstream_bootstrap: self.source_bootstrap.clone(),
            connect_timeout_ms: self.connect_timeout_ms,
            metadata_refresh_ms: self.metadata_refresh_ms,
            upstream_sasl: self.source_sasl.clone(),
            terminates_sasl: true,
            listener_sasl: self.listener_sasl.clone(),
            tls: self.tls.clone(),
            upstream_tls: self.source_tls.clone(),
            upstream_identity: None,
        }
    }

    /// Whether the mirror's listeners authenticate their clients (SASL or
    /// client certificates).
    pub fn authenticates_clients(&self) -> bool {
        self.listener_sasl.is_some() || self.tls.as_ref().is_some_and(|t| t.client_ca.is_some())
    }

    /// `fetcher_principals`, each as `User:<name>` (a bare name is a user).
    pub fn fetcher_principals(&self) -> Vec<String> {
        self.fetcher_principals
            .iter()
            .map(|p| {
                if p.starts_with("User:") {
                    p.clone()
                } else {
                    format!("User:{p}")
                }
            })
            .collect()
    }
}

/// PID handling of a mirror.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum PidMode {
    /// Rewrite every PID into the source cluster's region (SPEC 2.1).
    #[default]
    Region,
    /// Leave PIDs untouched; rely on the barrier (KIP-1279's final design).
    Preserve,
}

/// Region layout of a mirror.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
pub enum LayoutConfig {
    /// Bit 62 marks a mapped PID; PIDs stay positive (EOS-safe).
    #[default]
    #[serde(rename = "high")]
    High,
    /// Bit 63 marks a mapped PID (the seed layout; not EOS-safe on stock brokers).
    #[serde(rename = "sign-bit")]
    SignBit,
}

impl Config {
    /// Where `mirror`'s seals read the destination's high watermark:
    /// `destination_hw_bootstrap`, else its `destination_bootstrap`, else
    /// the destination cluster's bootstrap.
    pub fn destination_hw_bootstrap(&self, mirror: &MirrorConfig) -> Vec<String> {
        if !mirror.destination_hw_bootstrap.is_empty() {
            return mirror.destination_hw_bootstrap.clone();
        }
        if !mirror.destination_bootstrap.is_empty() {
            return mirror.destination_bootstrap.clone();
        }
        self.destination_bootstrap()
    }

    /// TLS towards the destination cluster: the `destination_tls` of the
    /// mirror whose `destination_bootstrap` is used, else `[state].tls`.
    pub fn destination_tls(&self) -> Option<ClientTlsConfig> {
        match self
            .mirrors
            .iter()
            .find(|m| !m.destination_bootstrap.is_empty())
        {
            Some(m) => m.destination_tls.clone(),
            None => self.state.as_ref().and_then(|s| s.tls.clone()),
        }
    }

    /// The destination cluster's bootstrap servers: the first
    /// `[[mirror]].destination_bootstrap` given, else `[state].bootstrap`.
    pub fn destination_bootstrap(&self) -> Vec<String> {
        self.mirrors
            .iter()
            .find(|m| !m.destination_bootstrap.is_empty())
            .map(|m| m.destination_bootstrap.clone())
            .or_else(|| self.state.as_ref().map(|s| s.bootstrap.clone()))
            .unwrap_or_default()
    }
}

impl Config {
    /// The SASL identity toward the destination cluster: the first
    /// `[[mirror]].destination_sasl` given, else `[state.sasl]`.
    pub fn destination_sasl(&self) -> Option<&ClientSaslConfig> {
        self.mirrors
            .iter()
            .find_map(|m| m.destination_sasl.as_ref())
            .or_else(|| self.state.as_ref().and_then(|s| s.sasl.as_ref()))
    }
}

/// `[state]`: where `__mirror_state` lives.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateConfig {
    /// Bootstrap servers of the state cluster (usually the destination).
    pub bootstrap: Vec<String>,
    /// Topic name.
    #[serde(default = "default_state_topic")]
    pub topic: String,
    /// Replication factor when creating the topic (-1 = broker default).
    #[serde(default = "default_replication_factor")]
    pub replication_factor: i16,
    /// Connect timeout.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// How long an append may take, retries included.
    #[serde(default = "default_state_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// Production mode (default): start-up refuses a state cluster that is
    /// a mirror's source, or a state topic with a replication factor below
    /// 3 or `min.insync.replicas` below 2. `false` reports them as WARN
    /// lines (single-broker test setups).
    #[serde(default = "default_state_production")]
    pub production: bool,
    /// Whether a state cluster that is a mirror's source cluster is only
    /// reported (WARN) instead of refused. Off by default, whatever
    /// `production` says: the disaster seal needs `__mirror_state` while
    /// the source is down. For test beds that run one cluster only.
    #[serde(default)]
    pub allow_source_cluster: bool,
    /// mirrorguard's own SASL identity toward the state cluster.
    #[serde(default)]
    pub sasl: Option<ClientSaslConfig>,
    /// TLS towards the state cluster (absent: plaintext).
    #[serde(default)]
    pub tls: Option<ClientTlsConfig>,
    /// This instance's name in `__mirror_state` (who serves which
    /// partition, type 9). Unique per instance sharing one state topic;
    /// default `<hostname>/<admin.listen>`.
    #[serde(default)]
    pub instance_id: Option<String>,
    /// How often `__mirror_state` is read for what other instances wrote
    /// (their stops, seals and serving records). Whatever this instance
    /// must know before it acts (a take-over, a seal's completion) is read
    /// to the end at that moment anyway; this bounds how stale the admin
    /// API and the fetch path's fast checks are.
    #[serde(default = "default_state_tail_interval_ms")]
    pub tail_interval_ms: u64,
}

fn default_state_tail_interval_ms() -> u64 {
    1_000
}

impl StateConfig {
    /// The configured `instance_id`, else `<hostname>/<admin listen address>`
    /// (unique for instances on one host, stable across restarts).
    pub fn instance_id(&self, admin_listen: &str) -> String {
        if let Some(id) = self.instance_id.as_deref().filter(|s| !s.is_empty()) {
            return id.to_string();
        }
        let host = std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.is_empty())
            .or_else(|| {
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .ok()
                    .map(|h| h.trim().to_string())
            })
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".to_string());
        format!("{host}/{admin_listen}")
    }
}

fn default_state_production() -> bool {
    true
}

fn default_state_topic() -> String {
    "__mirror_state".to_string()
}

fn default_replication_factor() -> i16 {
    -1
}

fn default_state_request_timeout_ms() -> u64 {
    30_000
}

/// `[producer_state]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProducerStateConfig {
    /// Idle time after which a producer is forgotten (Kafka's
    /// `producer.id.expiration.ms`, default 24 h).
    #[serde(default = "default_producer_idle_ms")]
    pub max_idle_ms: i64,
    /// Anomalies kept in memory for the admin API.
    #[serde(default = "default_anomaly_log")]
    pub anomaly_log_capacity: usize,
    /// Period of producer-state snapshots to `__mirror_state` (and of idle
    /// expiry); a restart restores from the latest snapshot.
    #[serde(default = "default_snapshot_interval")]
    pub snapshot_interval_ms: u64,
    /// Most producers tracked over all partitions (about 110 bytes each);
    /// beyond it mirror fetches fail closed rather than forget a producer.
    #[serde(default = "default_max_producers")]
    pub max_producers: u64,
    /// Most destination partitions tracked.
    #[serde(default = "default_max_partitions")]
    pub max_partitions: usize,
    /// Most transaction closings kept below the destination fetchers'
    /// positions over all partitions (about 64 bytes each): past it, the
    /// partition keeping one more forgets its oldest (a seal planned again
    /// below them reports `open_at_cut_incomplete`). Those past a fetcher's
    /// position are not counted.
    #[serde(default = "default_closings_retained_total_max")]
    pub closings_retained_total_max: usize,
}

fn default_closings_retained_total_max() -> usize {
    crate::producer_state::DEFAULT_CLOSINGS_RETAINED_TOTAL_MAX
}

fn default_max_producers() -> u64 {
    crate::producer_state::DEFAULT_MAX_PRODUCERS
}

fn default_max_partitions() -> usize {
    crate::producer_state::DEFAULT_MAX_PARTITIONS
}

fn default_snapshot_interval() -> u64 {
    10_000
}

impl Default for ProducerStateConfig {
    fn default() -> Self {
        Self {
            max_idle_ms: default_producer_idle_ms(),
            anomaly_log_capacity: default_anomaly_log(),
            snapshot_interval_ms: default_snapshot_interval(),
            max_producers: default_max_producers(),
            max_partitions: default_max_partitions(),
            closings_retained_total_max: default_closings_retained_total_max(),
        }
    }
}

fn default_producer_idle_ms() -> i64 {
    86_400_000
}

fn default_anomaly_log() -> usize {
    1000
}

/// `[admin]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Address of the admin HTTP listener.
    pub listen: String,
    /// File holding the bearer token for mutating admin calls.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// Time allowed for a request's headers, and again for its body, to
    /// arrive (a stalled client gets its connection closed, or 408).
    #[serde(default = "default_admin_read_timeout_ms")]
    pub read_timeout_ms: u64,
    /// HTTPS instead of HTTP (absent: plain HTTP).
    #[serde(default)]
    pub tls: Option<ServerTlsConfig>,
    /// Host names (besides IP literals and `localhost`) a request's `Host`
    /// header may carry; any other name is refused (403), so a web page on a
    /// name that resolves to this address (DNS rebinding) cannot use the API
    /// from a browser.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Whether the reads that show producer ids (`/v1/partitions/{t}/{p}/producers`,
    /// `/v1/collisions`, `/v1/anomalies`) need the bearer token too (default
    /// true; false serves them to anyone who reaches the listener).
    #[serde(default = "default_true")]
    pub token_for_reads: bool,
    /// A second, plain HTTP listener serving only `GET /healthz`, `/readyz`
    /// and `/metrics` (no token, no producer ids): for probes and Prometheus
    /// when the admin API itself stays on loopback.
    #[serde(default)]
    pub metrics_listen: Option<String>,
}

fn default_admin_read_timeout_ms() -> u64 {
    10_000
}

fn default_true() -> bool {
    true
}

/// `[logging]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoggingConfig {
    /// Output format.
    #[serde(default)]
    pub format: LogFormat,
    /// A tracing filter such as `info` or `info,mirrorguard=debug`.
    #[serde(default = "default_log_level")]
    pub level: String,
}

impl Default for LoggingConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            level: default_log_level(),
        }
    }
}

fn default_log_level() -> String {
    "info".to_string()
}

/// Log output format.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// `[limits]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Largest frame accepted from a client or an upstream broker, in bytes.
    #[serde(default = "default_max_frame_bytes")]
    pub max_frame_bytes: u32,
    /// How long in-flight requests may take to drain after SIGTERM.
    #[serde(default = "default_shutdown_grace_ms")]
    pub shutdown_grace_ms: u64,
    /// Most client connections open at once, all listeners together; more
    /// are accepted and closed at once (logged, counted).
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Most client connections open at once from one client address, all
    /// listeners together.
    #[serde(default = "default_max_connections_per_address")]
    pub max_connections_per_address: usize,
    /// Budget for request bytes held in memory, all connections together:
    /// a request held whole (one a filter reads or answers itself, or the
    /// head read to route one) larger than [`SMALL_REQUEST_BYTES`] reserves
    /// its announced size here first; when the budget cannot cover it the
    /// connection is closed (logged, counted). Requests of at most
    /// `SMALL_REQUEST_BYTES` always pass (one per connection, so at most
    /// `max_connections` times that beyond the budget): a flood of large
    /// frames cannot lock out a fetcher's small requests.
    #[serde(default = "default_max_buffered_request_bytes")]
    pub max_buffered_request_bytes: usize,
}

/// Requests up to this size never wait for the budget of
/// `[limits] max_buffered_request_bytes` (but are counted in it).
pub const SMALL_REQUEST_BYTES: usize = 16 * 1024;

/// Default of `[limits] max_connections`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Default of `[limits] max_connections_per_address`.
pub const DEFAULT_MAX_CONNECTIONS_PER_ADDRESS: usize = 512;
/// Default of `[limits] max_buffered_request_bytes` (32 MiB).
pub const DEFAULT_MAX_BUFFERED_REQUEST_BYTES: usize = 32 * 1024 * 1024;

fn default_max_connections() -> usize {
    DEFAULT_MAX_CONNECTIONS
}

fn default_max_connections_per_address() -> usize {
    DEFAULT_MAX_CONNECTIONS_PER_ADDRESS
}

fn default_max_buffered_request_bytes() -> usize {
    DEFAULT_MAX_BUFFERED_REQUEST_BYTES
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            shutdown_grace_ms: default_shutdown_grace_ms(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_address: DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
            max_buffered_request_bytes: DEFAULT_MAX_BUFFERED_REQUEST_BYTES,
        }
    }
}

fn default_max_frame_bytes() -> u32 {
    DEFAULT_MAX_FRAME_BYTES
}

fn default_shutdown_grace_ms() -> u64 {
    10_000
}

/// `[[listener]]`: a plain proxy in front of one upstream cluster, port per node.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerConfig {
    /// Name used in logs and metric labels.
    pub name: String,
    /// Bootstrap address clients connect to first.
    pub bootstrap: String,
    /// Interface the per-node listeners bind to.
    #[serde(default = "default_listen_host")]
    pub listen_host: String,
    /// Host name handed to clients in Metadata and friends; defaults to
    /// `listen_host`, which must then not be a wildcard (0.0.0.0, ::).
    #[serde(default)]
    pub advertised_host: String,
    /// Broker node N is served at `node_port_base + N`.
    pub node_port_base: u16,
    /// Upstream bootstrap servers (`host:port`).
    pub upstream_bootstrap: Vec<String>,
    /// Upstream connect timeout.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// Period of the proxy's own upstream Metadata refresh.
    #[serde(default = "default_metadata_refresh_ms")]
    pub metadata_refresh_ms: u64,
    /// TLS towards clients (absent: plaintext).
    #[serde(default)]
    pub tls: Option<ServerTlsConfig>,
    /// TLS towards the upstream brokers (absent: plaintext).
    #[serde(default)]
    pub upstream_tls: Option<ClientTlsConfig>,
    /// mirrorguard's own SASL identity toward the upstream, for its own
    /// Metadata refresh. Clients' connections never use it: their
    /// SaslHandshake/SaslAuthenticate pass through to the broker.
    #[serde(default)]
    pub upstream_sasl: Option<ClientSaslConfig>,
    /// Set for mirror listeners (never in the file): clients authenticate
    /// to mirrorguard, not to the upstream, and every upstream connection
    /// authenticates with `upstream_sasl`.
    #[serde(skip)]
    pub terminates_sasl: bool,
    /// What a mirror listener requires from its clients (never in the file;
    /// from `[[mirror]].listener_sasl`).
    #[serde(skip)]
    pub listener_sasl: Option<ListenerSaslConfig>,
    /// `shared`: every client of this listener acts on the upstream as the
    /// client certificate of `upstream_tls` (a WARN at start). Required when
    /// `upstream_tls` has a certificate and `tls.client_ca` does not make
    /// the listener's own clients present one.
    #[serde(default)]
    pub upstream_identity: Option<UpstreamIdentity>,
}

/// `upstream_identity` of a `[[listener]]` or `[[guard]]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamIdentity {
    /// Every client shares mirrorguard's upstream client certificate.
    Shared,
}

/// mirrorguard's own SASL identity toward one cluster (`[state.sasl]`,
/// `[[mirror]].source_sasl`, `[[mirror]].destination_sasl`,
/// `[[listener]].upstream_sasl`). The password is read at start-up from
/// `password_file` or the environment variable `password_env` (exactly one),
/// never from this file, and never logged.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientSaslConfig {
    /// `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`.
    pub mechanism: String,
    /// The user name (Kafka principal `User:<username>`).
    pub username: String,
    /// A file holding the password (a trailing newline is dropped).
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// An environment variable holding the password.
    #[serde(default)]
    pub password_env: Option<String>,
    /// PLAIN sends the password itself: it is refused on a connection
    /// without TLS unless this is set.
    #[serde(default)]
    pub allow_plain_without_tls: bool,
}

/// `[[mirror]].listener_sasl`: the SASL authentication a mirror listener
/// requires from its clients (the destination's fetcher), checked by
/// mirrorguard itself against a local credential file (format in
/// [`crate::sasl::server`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerSaslConfig {
    /// Mechanisms offered: `SCRAM-SHA-256`, `SCRAM-SHA-512`, `PLAIN`.
    #[serde(default = "default_listener_mechanisms")]
    pub mechanisms: Vec<String>,
    /// The credential file (salted SCRAM credentials, no passwords).
    pub credentials_file: PathBuf,
    /// Lifetime of an authenticated session (KIP-368): a client must
    /// re-authenticate within it or its connection is closed; 0 = never
    /// expires (not recommended).
    #[serde(default = "default_session_lifetime_ms")]
    pub session_lifetime_ms: u64,
    /// PLAIN over a listener without `tls` (the password crosses the
    /// network in the clear): refused unless this is set.
    #[serde(default)]
    pub allow_plain_without_tls: bool,
}

/// Default of `listener_sasl.session_lifetime_ms` (1 h).
pub const DEFAULT_SESSION_LIFETIME_MS: u64 = 3_600_000;

fn default_session_lifetime_ms() -> u64 {
    DEFAULT_SESSION_LIFETIME_MS
}

fn default_listener_mechanisms() -> Vec<String> {
    vec!["SCRAM-SHA-256".into(), "SCRAM-SHA-512".into()]
}

/// `tls` of a listener or of `[admin]`: the server side of TLS. Files are
/// PEM and re-read on SIGHUP.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerTlsConfig {
    /// Certificate chain, leaf first.
    pub cert: PathBuf,
    /// Private key of the leaf (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// CA bundle client certificates must chain to. When set, every client
    /// must present one (mutual TLS).
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
    /// A client that has not finished its handshake by then is dropped.
    #[serde(default = "default_tls_handshake_timeout_ms")]
    pub handshake_timeout_ms: u64,
}

/// `upstream_tls` of a listener, `tls` of `[state]`, `destination_tls` of a
/// mirror: the client side of TLS towards a Kafka cluster.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientTlsConfig {
    /// CA bundle the brokers' certificates must chain to (there are no
    /// built-in roots).
    pub ca: PathBuf,
    /// Client certificate chain, for brokers that require mutual TLS.
    #[serde(default)]
    pub cert: Option<PathBuf>,
    /// Its private key.
    #[serde(default)]
    pub key: Option<PathBuf>,
    /// Name sent (SNI) and verified instead of the host connected to.
    #[serde(default)]
    pub server_name: Option<String>,
    /// Accept a broker certificate that chains to `ca` but does not name
    /// the host. Off by default; only for brokers whose certificates lack
    /// the advertised names.
    #[serde(default)]
    pub insecure_skip_hostname_verification: bool,
    /// The handshake must finish within this.
    #[serde(default = "default_tls_handshake_timeout_ms")]
    pub handshake_timeout_ms: u64,
}

fn default_tls_handshake_timeout_ms() -> u64 {
    10_000
}

/// Whether `host` (a listen address) is loopback only: `localhost`, an
/// address of 127.0.0.0/8 or `::1`.
pub fn is_loopback_host(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    h.eq_ignore_ascii_case("localhost")
        || h.parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn default_listen_host() -> String {
    "127.0.0.1".to_string()
}

fn default_connect_timeout_ms() -> u64 {
    5_000
}

fn default_metadata_refresh_ms() -> u64 {
    30_000
}

/// A configuration problem, with the file and field it concerns.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// TOML syntax or type error, unknown key, missing field.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// toml's message, which includes line, column and the expected fields.
        message: String,
    },
    /// A value that parses but makes no sense.
    #[error("{path}: invalid value for `{field}`: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Dotted path of the field, e.g. `listener[0].bootstrap`.
        field: String,
        /// What is wrong.
        message: String,
    },
}

impl Config {
    /// Reads, parses and validates a configuration file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parses and validates configuration text; `path` is only used in messages.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let de = toml::de::Deserializer::parse(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        let mut config: Config =
            serde_path_to_error::deserialize(de).map_err(|e| ConfigError::Parse {
                path: path.to_path_buf(),
                message: format!("at `{}`: {}", e.path(), e.inner()),
            })?;
        config.default_advertised_hosts(path)?;
        config.validate(path)?;
        Ok(config)
    }

    /// `advertised_host` left out of a `[[listener]]`, `[[guard]]` or
    /// `[[mirror]]` is its `listen_host`: what a client on that interface
    /// connects to. A wildcard `listen_host` cannot be advertised, so it
    /// needs an explicit `advertised_host`.
    fn default_advertised_hosts(&mut self, path: &Path) -> Result<(), ConfigError> {
        let sections = self
            .listeners
            .iter_mut()
            .enumerate()
            .map(|(i, l)| {
                (
                    format!("listener[{i}]"),
                    &l.listen_host,
                    &mut l.advertised_host,
                )
            })
            .chain(self.guards.iter_mut().enumerate().map(|(i, l)| {
                (
                    format!("guard[{i}]"),
                    &l.listen_host,
                    &mut l.advertised_host,
                )
            }))
            .chain(self.mirrors.iter_mut().enumerate().map(|(i, m)| {
                (
                    format!("mirror[{i}]"),
                    &m.listen_host,
                    &mut m.advertised_host,
                )
            }));
        for (section, listen_host, advertised_host) in sections {
            if !advertised_host.is_empty() {
                continue;
            }
            if listen_host
                .parse::<IpAddr>()
                .is_ok_and(|ip| ip.is_unspecified())
            {
                return Err(ConfigError::Invalid {
                    path: path.to_path_buf(),
                    field: format!("{section}.advertised_host"),
                    message: format!(
                        "required when listen_host is {listen_host:?}: a wildcard address \
                         cannot be handed to clients"
                    ),
                });
            }
            advertised_host.clone_from(listen_host);
        }
        Ok(())
    }

    /// Checks the values types cannot express.
    pub fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let invalid = |field: String, message: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            field,
            message,
        };
        parse_socket_addr(&self.admin.listen)
            .map_err(|m| invalid("admin.listen".into(), m.into()))?;
        if let Some(listen) = &self.admin.metrics_listen {
            let addr = parse_socket_addr(listen)
                .map_err(|m| invalid("admin.metrics_listen".into(), m.into()))?;
            if Some(addr) == parse_socket_addr(&self.admin.listen).ok() {
                return Err(invalid(
                    "admin.metrics_listen".into(),
                    format!("{listen} is admin.listen itself"),
                ));
            }
        }
        for (i, h) in self.admin.allowed_hosts.iter().enumerate() {
            if h.is_empty() || h.contains([':', '/', ' ']) {
                return Err(invalid(
                    format!("admin.allowed_hosts[{i}]"),
                    format!("{h:?} is not a host name (no port, no scheme)"),
                ));
            }
        }
        if let Some(token_file) = &self.admin.token_file {
            crate::secrets::AdminToken::load(token_file, self.secrets.unsafe_permissions)
                .map_err(|e| invalid("admin.token_file".into(), e.to_string()))?;
        }
        self.check_secret_files(path)?;
        if !(100..=600_000).contains(&self.admin.read_timeout_ms) {
            return Err(invalid(
                "admin.read_timeout_ms".into(),
                format!("{} is outside 100..=600000 ms", self.admin.read_timeout_ms),
            ));
        }
        tracing_subscriber::EnvFilter::try_new(&self.logging.level)
            .map_err(|e| invalid("logging.level".into(), e.to_string()))?;
        const MIN_FRAME: u32 = 1024 * 1024;
        if self.limits.max_frame_bytes < MIN_FRAME || self.limits.max_frame_bytes > i32::MAX as u32
        {
            return Err(invalid(
                "limits.max_frame_bytes".into(),
                format!(
                    "{} is outside 1 MiB..=2 GiB (Kafka's default is {DEFAULT_MAX_FRAME_BYTES})",
                    self.limits.max_frame_bytes
                ),
            ));
        }
        if self.listeners.is_empty() && self.mirrors.is_empty() && self.guards.is_empty() {
            return Err(invalid(
                "listener".into(),
                "at least one [[listener]] or [[mirror]] is required".into(),
            ));
        }
        for (i, m) in self.mirrors.iter().enumerate() {
            if let Some(id) = &m.source_cluster_id {
                crate::pid::ClusterId::parse(id).map_err(|e| {
                    invalid(format!("mirror[{i}].source_cluster_id"), e.to_string())
                })?;
            }
            for (j, addr) in m.destination_bootstrap.iter().enumerate() {
                split_host_port(addr).map_err(|e| {
                    invalid(format!("mirror[{i}].destination_bootstrap[{j}]"), e.into())
                })?;
            }
            if !m.destination_bootstrap.is_empty() {
                // One instance feeds one destination: its producer state and
                // life cycle are keyed by destination topic name.
                if let Some((k, other)) = self.mirrors[..i].iter().enumerate().find(|(_, o)| {
                    !o.destination_bootstrap.is_empty()
                        && o.destination_bootstrap != m.destination_bootstrap
                }) {
                    return Err(invalid(
                        format!("mirror[{i}].destination_bootstrap"),
                        format!(
                            "differs from mirror[{k}].destination_bootstrap ({}): the mirrors of \
                             one mirrorguard instance feed one destination cluster",
                            other.destination_bootstrap.join(",")
                        ),
                    ));
                }
            }
            if m.closings_retained_offsets < 0 {
                return Err(invalid(
                    format!("mirror[{i}].closings_retained_offsets"),
                    "must not be negative".into(),
                ));
            }
            if m.closings_retained_max > crate::producer_state::MAX_CLOSED_TRANSACTIONS {
                return Err(invalid(
                    format!("mirror[{i}].closings_retained_max"),
                    format!(
                        "at most {} (the bound of all closings a partition keeps)",
                        crate::producer_state::MAX_CLOSED_TRANSACTIONS
                    ),
                ));
            }
            if !(100..=600_000).contains(&m.upstream_request_timeout_ms) {
                return Err(invalid(
                    format!("mirror[{i}].upstream_request_timeout_ms"),
                    "must be within 100..=600000 (and below the fetcher's request timeout)".into(),
                ));
            }
            if m.fetcher_bootstrap.is_some() != m.fetcher_node_port_base.is_some() {
                return Err(invalid(
                    format!("mirror[{i}].fetcher_bootstrap"),
                    "fetcher_bootstrap and fetcher_node_port_base go together".into(),
                ));
            }
            match (m.fetcher_identity, m.fetcher_bootstrap.is_some()) {
                (FetcherIdentity::Ports, false) => {
                    return Err(invalid(
                        format!("mirror[{i}].fetcher_bootstrap"),
                        "a mirror needs its destination fetcher's identity: set \
                         fetcher_bootstrap and fetcher_node_port_base (the ports only the \
                         destination's mirror fetcher connects to; only its fetches take cuts and \
                         move seals), or, on a loopback test bed only, fetcher_identity = \
                         \"any-reader\""
                            .into(),
                    ))
                }
                (FetcherIdentity::AnyReader, true) => {
                    return Err(invalid(
                        format!("mirror[{i}].fetcher_identity"),
                        "\"any-reader\" contradicts fetcher_bootstrap: with fetcher ports only \
                         their connections are the fetcher"
                            .into(),
                    ))
                }
                (FetcherIdentity::AnyReader, false) if !is_loopback_host(&m.listen_host) => {
                    return Err(invalid(
                        format!("mirror[{i}].fetcher_identity"),
                        format!(
                            "\"any-reader\" makes every reader of the mirror listener the \
                             destination fetcher (any reader could take a cut, fail a seal or \
                             change producer state); it is refused unless listen_host is a \
                             loopback address (it is {:?})",
                            m.listen_host
                        ),
                    ))
                }
                _ => {}
            }
            if m.fetcher_node_port_base == Some(m.node_port_base) {
                return Err(invalid(
                    format!("mirror[{i}].fetcher_node_port_base"),
                    "must differ from node_port_base: the fetcher's ports are its identity".into(),
                ));
            }
            if m.pid_mode == PidMode::Region && self.state.is_none() {
                return Err(invalid(
                    format!("mirror[{i}].pid_mode"),
                    "region mode persists collision salts: add a [state] section naming the \
                     cluster that holds __mirror_state"
                        .into(),
                ));
            }
        }
        if let Some(st) = &self.state {
            if !(100..=60_000).contains(&st.tail_interval_ms) {
                return Err(invalid(
                    "state.tail_interval_ms".into(),
                    "must be within 100..=60000".into(),
                ));
            }
            if st.bootstrap.is_empty() {
                return Err(invalid(
                    "state.bootstrap".into(),
                    "needs at least one host:port".into(),
                ));
            }
            for (j, addr) in st.bootstrap.iter().enumerate() {
                split_host_port(addr)
                    .map_err(|m| invalid(format!("state.bootstrap[{j}]"), m.into()))?;
            }
            if st.topic.is_empty() {
                return Err(invalid("state.topic".into(), "must not be empty".into()));
            }
        }
        if self.producer_state.snapshot_interval_ms < 100 {
            return Err(invalid(
                "producer_state.snapshot_interval_ms".into(),
                "must be >= 100".into(),
            ));
        }
        if self.producer_state.max_producers == 0 || self.producer_state.max_partitions == 0 {
            return Err(invalid(
                "producer_state.max_producers".into(),
                "max_producers and max_partitions must be > 0".into(),
            ));
        }
        if self.producer_state.closings_retained_total_max == 0 {
            return Err(invalid(
                "producer_state.closings_retained_total_max".into(),
                "must be > 0 (to keep no closings below the fetcher's position, set \
                 [[mirror]] closings_retained_max = 0)"
                    .into(),
            ));
        }
        if self.producer_state.max_idle_ms <= 0 {
            return Err(invalid(
                "producer_state.max_idle_ms".into(),
                "must be > 0".into(),
            ));
        }
        let all: Vec<(String, ListenerConfig)> = self
            .listeners
            .iter()
            .enumerate()
            .map(|(i, l)| (format!("listener[{i}]"), l.clone()))
            .chain(
                self.guards
                    .iter()
                    .enumerate()
                    .map(|(i, l)| (format!("guard[{i}]"), l.clone())),
            )
            .chain(
                self.mirrors
                    .iter()
                    .enumerate()
                    .map(|(i, m)| (format!("mirror[{i}]"), m.listener())),
            )
            .collect();
        let mut names = std::collections::HashSet::new();
        for (prefix, l) in &all {
            let upstream_field = if prefix.starts_with("mirror") {
                "source_bootstrap"
            } else {
                "upstream_bootstrap"
            };
            let f = |name: &str| {
                let name = if name == "upstream_bootstrap" {
                    upstream_field
                } else {
                    name
                };
                format!("{prefix}.{name}")
            };
            if l.name.is_empty()
                || !l
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return Err(invalid(
                    f("name"),
                    format!("{:?}: use letters, digits, '-' or '_'", l.name),
                ));
            }
            if !names.insert(l.name.clone()) {
                return Err(invalid(f("name"), format!("{:?} is used twice", l.name)));
            }
            parse_socket_addr(&l.bootstrap).map_err(|m| invalid(f("bootstrap"), m.into()))?;
            l.listen_host
                .parse::<IpAddr>()
                .map_err(|e| invalid(f("listen_host"), format!("{:?}: {e}", l.listen_host)))?;
            if l.advertised_host.is_empty() {
                return Err(invalid(f("advertised_host"), "must not be empty".into()));
            }
            if l.upstream_bootstrap.is_empty() {
                return Err(invalid(
                    f("upstream_bootstrap"),
                    "needs at least one host:port".into(),
                ));
            }
            for (j, addr) in l.upstream_bootstrap.iter().enumerate() {
                split_host_port(addr)
                    .map_err(|m| invalid(format!("{}[{j}]", f("upstream_bootstrap")), m.into()))?;
            }
            if l.connect_timeout_ms == 0 {
                return Err(invalid(f("connect_timeout_ms"), "must be > 0".into()));
            }
            if l.metadata_refresh_ms < 100 {
                return Err(invalid(f("metadata_refresh_ms"), "must be >= 100".into()));
            }
        }
        self.validate_abort_path(path)?;
        self.validate_tls(path)?;
        self.validate_least_privilege(path)
    }

    /// SPEC 5, least privilege on every listener: no listener lends
    /// mirrorguard's identity to an anonymous client, and no password
    /// crosses a connection without TLS unless the operator said so.
    fn validate_least_privilege(&self, path: &Path) -> Result<(), ConfigError> {
        let invalid = |field: String, message: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            field,
            message,
        };
        let l = &self.limits;
        if l.max_connections == 0 || l.max_connections_per_address == 0 {
            return Err(invalid(
                "limits.max_connections".into(),
                "max_connections and max_connections_per_address must be > 0".into(),
            ));
        }
        if l.max_buffered_request_bytes < SMALL_REQUEST_BYTES {
            return Err(invalid(
                "limits.max_buffered_request_bytes".into(),
                format!("must be at least {SMALL_REQUEST_BYTES}"),
            ));
        }
        for (section, list) in [("listener", &self.listeners), ("guard", &self.guards)] {
            for (i, lc) in list.iter().enumerate() {
                let lends = lc.upstream_tls.as_ref().is_some_and(|t| t.cert.is_some());
                let clients_have_certs = lc.tls.as_ref().is_some_and(|t| t.client_ca.is_some());
                if lends && !clients_have_certs && lc.upstream_identity.is_none() {
                    return Err(invalid(
                        format!("{section}[{i}].upstream_identity"),
                        "upstream_tls presents mirrorguard's client certificate to the brokers \
                         for every client of this listener, and its clients do not authenticate: \
                         require client certificates (tls.client_ca), or set \
                         upstream_identity = \"shared\" to let every client act as that certificate"
                            .into(),
                    ));
                }
                plain_needs_tls(
                    lc.upstream_sasl.as_ref(),
                    lc.upstream_tls.is_some(),
                    &format!("{section}[{i}].upstream_sasl"),
                )
                .map_err(|(f, m)| invalid(f, m))?;
            }
        }
        for (i, m) in self.mirrors.iter().enumerate() {
            let mut hosts = vec![m.listen_host.clone(), m.bootstrap.clone()];
            hosts.extend(m.fetcher_bootstrap.iter().cloned());
            let off_loopback = hosts.iter().any(|h| {
                let ip = h
                    .parse::<SocketAddr>()
                    .map(|a| a.ip())
                    .or_else(|_| h.parse::<IpAddr>());
                !ip.is_ok_and(|ip| ip.is_loopback())
            });
            if off_loopback && !m.authenticates_clients() {
                return Err(invalid(
                    format!("mirror[{i}].listener_sasl"),
                    "a mirror listener on an address other than loopback speaks for \
                     mirrorguard's own identity on the source to whoever connects: require \
                     authenticated clients with listener_sasl or tls.client_ca"
                        .into(),
                ));
            }
            if m.authenticates_clients() && m.fetcher_principals.is_empty() {
                return Err(invalid(
                    format!("mirror[{i}].fetcher_principals"),
                    "the listener authenticates its clients: name the destination fetcher's \
                     principals (e.g. [\"User:fetcher\"]); only they take part in seals"
                        .into(),
                ));
            }
            if !m.authenticates_clients() && !m.fetcher_principals.is_empty() {
                return Err(invalid(
                    format!("mirror[{i}].fetcher_principals"),
                    "no client has a principal: the listener authenticates no one (add \
                     listener_sasl or tls.client_ca)"
                        .into(),
                ));
            }
            if let Some(ls) = &m.listener_sasl {
                if ls.mechanisms.iter().any(|x| x == "PLAIN")
                    && m.tls.is_none()
                    && !ls.allow_plain_without_tls
                {
                    return Err(invalid(
                        format!("mirror[{i}].listener_sasl.mechanisms"),
                        "PLAIN sends the client's password itself and the listener has no tls: \
                         add tls, drop PLAIN, or set allow_plain_without_tls = true"
                            .into(),
                    ));
                }
            }
            plain_needs_tls(
                m.source_sasl.as_ref(),
                m.source_tls.is_some(),
                &format!("mirror[{i}].source_sasl"),
            )
            .map_err(|(f, m)| invalid(f, m))?;
        }
        if let Some(st) = &self.state {
            plain_needs_tls(st.sasl.as_ref(), st.tls.is_some(), "state.sasl")
                .map_err(|(f, m)| invalid(f, m))?;
        }
        // The destination: its credentials are `destination_sasl`, else
        // [state.sasl]'s; its TLS `destination_tls` (with a destination
        // bootstrap of its own), else [state].tls.
        if let Some((i, m)) = self
            .mirrors
            .iter()
            .enumerate()
            .find(|(_, m)| !m.destination_bootstrap.is_empty())
        {
            let explicit = self.mirrors.iter().any(|m| m.destination_sasl.is_some());
            let inherited = self.state.as_ref().and_then(|s| s.sasl.as_ref());
            if m.destination_tls.is_none() && !explicit && inherited.is_some() {
                return Err(invalid(
                    format!("mirror[{i}].destination_tls"),
                    "destination_bootstrap has no destination_tls, so mirrorguard would send \
                     [state.sasl]'s credentials to the destination without TLS: add \
                     destination_tls, or name the destination's own credentials in \
                     destination_sasl"
                        .into(),
                ));
            }
        }
        plain_needs_tls(
            self.destination_sasl(),
            self.destination_tls().is_some(),
            "mirror.destination_sasl",
        )
        .map_err(|(f, m)| invalid(f, m))?;
        Ok(())
    }

    /// mirrorguard's own abort of open mirrored transactions
    /// (WriteTxnMarkers) reaches the destination through the destination
    /// bootstrap (`[[mirror]].destination_bootstrap`, else `[state]`) and
    /// then the leaders it lists: never through a guard listener, which
    /// refuses WriteTxnMarkers into mirrored partitions. A destination
    /// bootstrap naming a guard's own bootstrap address is refused.
    fn validate_abort_path(&self, path: &Path) -> Result<(), ConfigError> {
        let invalid = |field: String, message: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            field,
            message,
        };
        let dest = self.destination_bootstrap();
        for (i, g) in self.guards.iter().enumerate() {
            let Ok((_, port)) = split_host_port(&g.bootstrap) else {
                continue;
            };
            let own = [
                g.bootstrap.clone(),
                format!("{}:{port}", g.advertised_host),
                format!("{}:{port}", g.listen_host),
            ];
            if let Some(a) = dest.iter().find(|a| own.contains(a)) {
                return Err(invalid(
                    format!("guard[{i}].bootstrap"),
                    format!(
                        "the destination bootstrap {a} is this guard listener: mirrorguard's own \
                         requests to the destination (the abort of open mirrored transactions, \
                         topic ids, high watermarks) must reach the destination brokers directly"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Every file holding a secret (TLS private keys, SASL password and
    /// credential files; the admin token is checked with its contents):
    /// refused when users other than mirrorguard's own can read it, per
    /// `[secrets] unsafe_permissions` (see [`crate::secrets`]).
    fn check_secret_files(&self, path: &Path) -> Result<(), ConfigError> {
        let mut files: Vec<(String, &Path)> = Vec::new();
        let mut servers: Vec<(String, &ServerTlsConfig)> = Vec::new();
        for (section, list) in [("listener", &self.listeners), ("guard", &self.guards)] {
            for (i, l) in list.iter().enumerate() {
                servers.extend(l.tls.iter().map(|t| (format!("{section}[{i}].tls"), t)));
            }
        }
        for (i, m) in self.mirrors.iter().enumerate() {
            servers.extend(m.tls.iter().map(|t| (format!("mirror[{i}].tls"), t)));
        }
        servers.extend(self.admin.tls.iter().map(|t| ("admin.tls".to_owned(), t)));
        for (section, t) in servers {
            files.push((format!("{section}.key"), t.key.as_path()));
        }
        let mut clients: Vec<(String, &ClientTlsConfig)> = Vec::new();
        let mut sasl: Vec<(String, &ClientSaslConfig)> = Vec::new();
        for (section, list) in [("listener", &self.listeners), ("guard", &self.guards)] {
            for (i, l) in list.iter().enumerate() {
                clients.extend(
                    l.upstream_tls
                        .iter()
                        .map(|t| (format!("{section}[{i}].upstream_tls"), t)),
                );
                sasl.extend(
                    l.upstream_sasl
                        .iter()
                        .map(|c| (format!("{section}[{i}].upstream_sasl"), c)),
                );
            }
        }
        for (i, m) in self.mirrors.iter().enumerate() {
            clients.extend(
                m.source_tls
                    .iter()
                    .map(|t| (format!("mirror[{i}].source_tls"), t)),
            );
            clients.extend(
                m.destination_tls
                    .iter()
                    .map(|t| (format!("mirror[{i}].destination_tls"), t)),
            );
            sasl.extend(
                m.source_sasl
                    .iter()
                    .map(|c| (format!("mirror[{i}].source_sasl"), c)),
            );
            sasl.extend(
                m.destination_sasl
                    .iter()
                    .map(|c| (format!("mirror[{i}].destination_sasl"), c)),
            );
            if let Some(l) = &m.listener_sasl {
                files.push((
                    format!("mirror[{i}].listener_sasl.credentials_file"),
                    l.credentials_file.as_path(),
                ));
            }
        }
        if let Some(st) = &self.state {
            clients.extend(st.tls.iter().map(|t| ("state.tls".to_owned(), t)));
            sasl.extend(st.sasl.iter().map(|c| ("state.sasl".to_owned(), c)));
        }
        for (section, t) in clients {
            if let Some(k) = &t.key {
                files.push((format!("{section}.key"), k.as_path()));
            }
        }
        for (section, c) in sasl {
            if let Some(f) = &c.password_file {
                files.push((format!("{section}.password_file"), f.as_path()));
            }
        }
        for (field, file) in files {
            crate::secrets::check_permissions(file, self.secrets.unsafe_permissions).map_err(
                |e| ConfigError::Invalid {
                    path: path.to_path_buf(),
                    field,
                    message: e.to_string(),
                },
            )?;
        }
        Ok(())
    }

    /// The environment variables holding passwords (`password_env` of every
    /// SASL identity): taken out of the environment at start-up.
    pub fn password_env_vars(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        let sections = self
            .listeners
            .iter()
            .chain(&self.guards)
            .filter_map(|l| l.upstream_sasl.as_ref())
            .chain(
                self.mirrors
                    .iter()
                    .flat_map(|m| m.source_sasl.iter().chain(&m.destination_sasl)),
            )
            .chain(self.state.iter().filter_map(|s| s.sasl.as_ref()));
        for c in sections {
            if let Some(v) = &c.password_env {
                out.push(v.as_str());
            }
        }
        out
    }

    /// Every TLS section: its files are read and made into a configuration
    /// now, so a missing file, bad PEM or a key that is not the
    /// certificate's fails start-up naming the field and the file.
    fn validate_tls(&self, path: &Path) -> Result<(), ConfigError> {
        let mut servers: Vec<(String, &ServerTlsConfig)> = Vec::new();
        let mut clients: Vec<(String, &ClientTlsConfig)> = Vec::new();
        for (section, list) in [("listener", &self.listeners), ("guard", &self.guards)] {
            for (i, l) in list.iter().enumerate() {
                servers.extend(l.tls.iter().map(|t| (format!("{section}[{i}].tls"), t)));
                clients.extend(
                    l.upstream_tls
                        .iter()
                        .map(|t| (format!("{section}[{i}].upstream_tls"), t)),
                );
            }
        }
        for (i, m) in self.mirrors.iter().enumerate() {
            servers.extend(m.tls.iter().map(|t| (format!("mirror[{i}].tls"), t)));
            clients.extend(
                m.source_tls
                    .iter()
                    .map(|t| (format!("mirror[{i}].source_tls"), t)),
            );
            clients.extend(
                m.destination_tls
                    .iter()
                    .map(|t| (format!("mirror[{i}].destination_tls"), t)),
            );
        }
        servers.extend(self.admin.tls.iter().map(|t| ("admin.tls".to_owned(), t)));
        if let Some(st) = &self.state {
            clients.extend(st.tls.iter().map(|t| ("state.tls".to_owned(), t)));
        }
        let invalid = |section: &str, e: crate::tls::TlsError| ConfigError::Invalid {
            path: path.to_path_buf(),
            field: format!("{section}.{}", e.field),
            message: format!("{}: {}", e.path.display(), e.message),
        };
        let timeout = |section: &str, ms: u64| {
            if (100..=600_000).contains(&ms) {
                Ok(())
            } else {
                Err(ConfigError::Invalid {
                    path: path.to_path_buf(),
                    field: format!("{section}.handshake_timeout_ms"),
                    message: "must be between 100 and 600000".into(),
                })
            }
        };
        for (section, t) in servers {
            timeout(&section, t.handshake_timeout_ms)?;
            crate::tls::server_config(t).map_err(|e| invalid(&section, e))?;
        }
        for (section, t) in clients {
            timeout(&section, t.handshake_timeout_ms)?;
            crate::tls::client_config(t).map_err(|e| invalid(&section, e))?;
        }
        Ok(())
    }
}

/// PLAIN without TLS: the password crosses the network as it is.
fn plain_needs_tls(
    sasl: Option<&ClientSaslConfig>,
    tls: bool,
    section: &str,
) -> Result<(), (String, String)> {
    match sasl {
        Some(c) if c.mechanism == "PLAIN" && !tls && !c.allow_plain_without_tls => Err((
            format!("{section}.mechanism"),
            "PLAIN sends mirrorguard's password itself and this connection has no TLS: \
             configure TLS for it, use SCRAM-SHA-256/512, or set allow_plain_without_tls = true"
                .into(),
        )),
        _ => Ok(()),
    }
}

/// Why an address in the configuration is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    /// Not an `ip:port` literal (listen addresses).
    #[error("{input:?} is not an ip:port address ({reason})")]
    NotSocketAddr {
        /// The text given.
        input: String,
        /// The parser's reason.
        reason: String,
    },
    /// No `:port` part.
    #[error("{0:?} is not host:port")]
    NotHostPort(String),
    /// Nothing before the `:port`.
    #[error("{0:?} has an empty host")]
    EmptyHost(String),
    /// The port is not a number in 1-65535.
    #[error("{0:?} has an invalid port")]
    InvalidPort(String),
    /// Port 0.
    #[error("{0:?} has port 0")]
    PortZero(String),
}

impl From<AddressError> for String {
    fn from(e: AddressError) -> Self {
        e.to_string()
    }
}

/// Parses `ip:port` (listen addresses must be IP literals so binding is predictable).
pub fn parse_socket_addr(s: &str) -> Result<SocketAddr, AddressError> {
    s.parse::<SocketAddr>()
        .map_err(|e| AddressError::NotSocketAddr {
            input: s.to_owned(),
            reason: e.to_string(),
        })
}

/// Splits `host:port` (host may be a name or `[v6]`).
pub fn split_host_port(s: &str) -> Result<(String, u16), AddressError> {
    let (host, port) = s
        .rsplit_once(':')
        .ok_or_else(|| AddressError::NotHostPort(s.to_owned()))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(AddressError::EmptyHost(s.to_owned()));
    }
    let port: u16 = port
        .parse()
        .map_err(|_| AddressError::InvalidPort(s.to_owned()))?;
    if port == 0 {
        return Err(AddressError::PortZero(s.to_owned()));
    }
    Ok((host.to_string(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[admin]
listen = "127.0.0.1:9644"

[[listener]]
name = "main"
bootstrap = "127.0.0.1:19092"
advertised_host = "localhost"
node_port_base = 19100
upstream_bootstrap = ["127.0.0.1:9092"]
"#;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("proxy.toml"))
    }

    /// A mirror needs its fetcher's identity (SPEC 3, "Who moves a seal"):
    /// fetcher ports, or the explicit loopback-only `any-reader` opt-in.
    #[test]
    fn a_mirror_without_a_fetcher_identity_does_not_start() {
        let base = r#"
[admin]
listen = "127.0.0.1:9644"

[[mirror]]
name = "a-to-b"
bootstrap = "127.0.0.1:39092"
node_port_base = 39100
source_bootstrap = ["127.0.0.1:9093"]
pid_mode = "preserve"
"#;
        let err = parse(base).unwrap_err().to_string();
        assert!(err.contains("mirror[0].fetcher_bootstrap"), "{err}");
        assert!(err.contains("fetcher_node_port_base"), "{err}");
        assert!(err.contains("any-reader"), "{err}");
        let ports = format!(
            "{base}fetcher_bootstrap = \"127.0.0.1:39093\"\nfetcher_node_port_base = 39200\n"
        );
        let c = parse(&ports).unwrap();
        assert_eq!(c.mirrors[0].fetcher_identity, FetcherIdentity::Ports);
        assert!(c.mirrors[0].fetcher_listener().is_some());
        // The opt-in: on loopback only, never with fetcher ports.
        let any = format!("{base}fetcher_identity = \"any-reader\"\n");
        assert_eq!(
            parse(&any).unwrap().mirrors[0].fetcher_identity,
            FetcherIdentity::AnyReader
        );
        for host in ["::1", "127.0.0.9"] {
            let t = any.replace("node_port_base = 39100", &format!("node_port_base = 39100\nlisten_host = \"{host}\"\nadvertised_host = \"127.0.0.1\""));
            parse(&t).unwrap_or_else(|e| panic!("{host}: {e}"));
        }
        for host in ["0.0.0.0", "10.0.0.5", "::"] {
            let t = any.replace("node_port_base = 39100", &format!("node_port_base = 39100\nlisten_host = \"{host}\"\nadvertised_host = \"mirror.example\""));
            let err = parse(&t).unwrap_err().to_string();
            assert!(err.contains("mirror[0].fetcher_identity"), "{host}: {err}");
            assert!(err.contains("loopback"), "{host}: {err}");
        }
        let both = format!("{ports}fetcher_identity = \"any-reader\"\n");
        let err = parse(&both).unwrap_err().to_string();
        assert!(err.contains("contradicts"), "{err}");
    }

    /// mirrorguard's own requests to the destination (the abort of open
    /// mirrored transactions among them) never go through a guard listener.
    #[test]
    fn destination_bootstrap_naming_a_guard_is_refused() {
        let text = r#"
[admin]
listen = "127.0.0.1:9644"

[[guard]]
name = "guard"
bootstrap = "127.0.0.1:29092"
node_port_base = 29100
upstream_bootstrap = ["127.0.0.1:9092"]

[[mirror]]
name = "a-to-b"
bootstrap = "127.0.0.1:39092"
node_port_base = 39100
fetcher_bootstrap = "127.0.0.1:39900"
fetcher_node_port_base = 39600
source_bootstrap = ["127.0.0.1:9093"]
destination_bootstrap = ["127.0.0.1:9092"]
pid_mode = "preserve"
"#;
        parse(text).unwrap();
        let bad = text.replace(
            "destination_bootstrap = [\"127.0.0.1:9092\"]",
            "destination_bootstrap = [\"127.0.0.1:29092\"]",
        );
        let err = parse(&bad).unwrap_err().to_string();
        assert!(err.contains("guard[0].bootstrap"), "{err}");
        assert!(err.contains("directly"), "{err}");
    }

    /// `advertised_host` defaults to `listen_host` in every listener kind,
    /// `[[mirror]]` included (README: its keys are those of `[[listener]]`).
    #[test]
    fn advertised_host_defaults_to_listen_host() {
        let text = r#"
[admin]
listen = "127.0.0.1:9644"

[[listener]]
name = "plain"
bootstrap = "127.0.0.1:19092"
node_port_base = 19100
upstream_bootstrap = ["127.0.0.1:9092"]

[[guard]]
name = "guard"
bootstrap = "127.0.0.1:29092"
listen_host = "127.0.0.2"
node_port_base = 29100
upstream_bootstrap = ["127.0.0.1:9092"]

[[mirror]]
name = "a-to-b"
bootstrap = "127.0.0.1:39092"
listen_host = "127.0.0.3"
node_port_base = 39100
fetcher_bootstrap = "127.0.0.1:39900"
fetcher_node_port_base = 39600
source_bootstrap = ["127.0.0.1:9093"]
pid_mode = "preserve"

[[mirror]]
name = "c-to-b"
bootstrap = "127.0.0.1:49092"
advertised_host = "mirror.example"
node_port_base = 49100
fetcher_bootstrap = "127.0.0.1:49900"
fetcher_node_port_base = 49600
source_bootstrap = ["127.0.0.1:9094"]
pid_mode = "preserve"
"#;
        let c = parse(text).unwrap();
        assert_eq!(c.listeners[0].advertised_host, "127.0.0.1");
        assert_eq!(c.guards[0].advertised_host, "127.0.0.2");
        assert_eq!(c.mirrors[0].advertised_host, "127.0.0.3");
        assert_eq!(c.mirrors[0].listener().advertised_host, "127.0.0.3");
        assert_eq!(c.mirrors[1].advertised_host, "mirror.example");

        // A wildcard listen_host cannot be the default: the error names the field.
        let wild = text.replace("listen_host = \"127.0.0.3\"", "listen_host = \"0.0.0.0\"");
        let err = parse(&wild).unwrap_err().to_string();
        assert!(err.contains("mirror[0].advertised_host"), "{err}");
        assert!(err.contains("wildcard"), "{err}");
    }

    /// The process-wide bound on closings kept below the fetchers'
    /// positions: default, a value read, 0 refused by name.
    #[test]
    fn closings_retained_total_max_is_read_and_checked() {
        let text = GOOD;
        assert_eq!(
            parse(text)
                .unwrap()
                .producer_state
                .closings_retained_total_max,
            crate::producer_state::DEFAULT_CLOSINGS_RETAINED_TOTAL_MAX
        );
        let set =
            |v: &str| format!("{text}\n[producer_state]\nclosings_retained_total_max = {v}\n");
        assert_eq!(
            parse(&set("5"))
                .unwrap()
                .producer_state
                .closings_retained_total_max,
            5
        );
        let err = parse(&set("0")).unwrap_err().to_string();
        assert!(
            err.contains("producer_state.closings_retained_total_max"),
            "{err}"
        );
        assert!(parse(&set("-1")).is_err());
    }

    /// The closings kept below the fetcher's position (issue 17): defaults,
    /// and out-of-range values refused by name.
    #[test]
    fn closings_retention_is_read_and_checked() {
        let text = r#"
[admin]
listen = "127.0.0.1:9644"

[[mirror]]
name = "a-to-b"
bootstrap = "127.0.0.1:39092"
node_port_base = 39100
fetcher_bootstrap = "127.0.0.1:39900"
fetcher_node_port_base = 39600
source_bootstrap = ["127.0.0.1:9093"]
pid_mode = "preserve"
"#;
        let c = parse(text).unwrap();
        assert_eq!(
            c.mirrors[0].closings_retention(),
            crate::producer_state::ClosingsRetention::default()
        );
        let set = format!("{text}closings_retained_offsets = 500\nclosings_retained_max = 7\n");
        let r = parse(&set).unwrap().mirrors[0].closings_retention();
        assert_eq!((r.offsets, r.max), (500, 7));
        for (bad, field) in [
            (
                "closings_retained_offsets = -1",
                "mirror[0].closings_retained_offsets",
            ),
            (
                "closings_retained_max = 16385",
                "mirror[0].closings_retained_max",
            ),
        ] {
            let err = parse(&format!("{text}{bad}\n")).unwrap_err().to_string();
            assert!(err.contains(field), "{err}");
        }
    }

    #[test]
    fn defaults_apply() {
        let c = parse(GOOD).unwrap();
        assert_eq!(c.limits.max_frame_bytes, 100 * 1024 * 1024);
        assert_eq!(c.listeners[0].listen_host, "127.0.0.1");
        assert_eq!(c.logging.format, LogFormat::Text);
    }

    #[test]
    fn unknown_key_is_refused_with_line() {
        let text = GOOD.replace(
            "node_port_base = 19100",
            "node_port_base = 19100\nnode_prot = 1",
        );
        let err = parse(&text).unwrap_err().to_string();
        assert!(err.contains("node_prot"), "{err}");
        assert!(err.contains("line"), "{err}");
    }

    #[test]
    fn bad_address_names_field() {
        let text = GOOD.replace("127.0.0.1:19092", "nowhere");
        let err = parse(&text).unwrap_err().to_string();
        assert!(err.contains("listener[0].bootstrap"), "{err}");
    }

    #[test]
    fn frame_limit_bounds() {
        let text = format!("{GOOD}\n[limits]\nmax_frame_bytes = 1000\n");
        let err = parse(&text).unwrap_err().to_string();
        assert!(err.contains("limits.max_frame_bytes"), "{err}");
    }

    #[test]
    fn duplicate_listener_names() {
        let text = format!("{GOOD}{}", &GOOD[GOOD.find("[[listener]]").unwrap()..]);
        let err = parse(&text).unwrap_err().to_string();
        assert!(err.contains("used twice"), "{err}");
    }

    #[test]
    fn example_file_is_valid() {
        let text = include_str!("../proxy.toml.example");
        parse(text).unwrap();
    }

    #[test]
    fn sasl_sections_of_the_example_parse_and_reach_the_listeners() {
        // The example with its SASL lines uncommented.
        let text = include_str!("../proxy.toml.example")
            .lines()
            .map(|l| {
                let t = l.trim_start_matches("# ");
                let sasl = [
                    "upstream_sasl",
                    "source_sasl",
                    "destination_sasl",
                    "listener_sasl",
                    "fetcher_principals",
                ]
                .iter()
                .any(|k| t.starts_with(&format!("{k} = ")));
                let state = t == "[state.sasl]"
                    || (t.starts_with("mechanism = ")
                        || t.starts_with("username = ")
                        || t.starts_with("password_env = "));
                if sasl || state {
                    t.to_string()
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        let c = parse(&text).unwrap();
        let state = c.state.as_ref().unwrap().sasl.as_ref().unwrap();
        assert_eq!(
            state.password_env.as_deref(),
            Some("MIRRORGUARD_STATE_PASSWORD")
        );
        assert!(c.listeners[0].upstream_sasl.is_some() && !c.listeners[0].terminates_sasl);
        let m = c.mirrors[0].listener();
        assert!(m.terminates_sasl && m.upstream_sasl.is_some() && m.listener_sasl.is_some());
        assert_eq!(
            c.destination_sasl().unwrap().password_file.as_deref(),
            Some(Path::new("/run/secrets/dest"))
        );
        let bad = text.replace(
            "username = \"mirrorguard\"\npassword_env",
            "user = \"x\"\npassword_env",
        );
        assert!(parse(&bad).unwrap_err().to_string().contains("user"));
    }
}
