//! `mirrorguard run`: assembles the process from the configuration.
//!
//! Order matters: logging first (so config problems are reported), then
//! metrics, listeners and the admin endpoint; SIGTERM/SIGINT stop accepting,
//! mark the process not ready, and wait for in-flight requests to drain for at
//! most `limits.shutdown_grace_ms`.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::admin::{self, AdminState};
use crate::config::{Config, LogFormat, LoggingConfig};
use crate::filter::address::AddressRewrite;
use crate::filter::allowlist::MirrorAllowlist;
use crate::filter::mirror_fetch::MirrorFetch;
use crate::filter::offline::SourceOffline;
use crate::filter::produce_guard::{GuardPolicy, ProduceGuard};
use crate::filter::sasl::SaslRelay;
use crate::filter::seal::Seal;
use crate::filter::write_guard::{TopicIdNames, WriteGuard};
use crate::filter::{BoxFuture, Chain, Filter};
use crate::kafka_client::TransportConnector;
use crate::lifecycle::Lifecycle;
use crate::metrics::Metrics;
use crate::mirror::{MirrorContext, PendingSalt, SaltStore};
use crate::producer_state::{ProducerStateRegistry, RegistryConfig};
use crate::proxy::limits::{ConnectionLimits, MemoryBudget};
use crate::proxy::listener::{ConnectionTracker, Listener, Shared};
use crate::proxy::nodes::NodeRegistry;
use crate::sasl::server::ServerAuth;
use crate::sasl::ClientCredentials;
use crate::state_store::sync::StateSync;
use crate::state_store::{StateStore, StateStoreConfig};

/// Salt store of a process without a `[state]` section: only `preserve`
/// mirrors are allowed then (config validation), and they never persist.
struct NoStateCluster;

impl SaltStore for NoStateCluster {
    fn durable(&self) -> bool {
        false
    }

    fn persist_claims(
        &self,
        _claims: Vec<(
            crate::producer_state::PartitionKey,
            Vec<(i64, crate::producer_state::Origin)>,
        )>,
    ) -> BoxFuture<'static, Result<(), crate::PersistError>> {
        Box::pin(async { Err("no [state] cluster is configured".into()) })
    }

    fn topic_id(&self, _topic: &str) -> Option<[u8; 16]> {
        None
    }

    fn refresh_topic_ids(&self) -> BoxFuture<'static, Result<(), crate::PersistError>> {
        Box::pin(async { Err("no [state] cluster is configured".into()) })
    }

    fn persist(
        &self,
        _salts: Vec<PendingSalt>,
    ) -> BoxFuture<'static, Result<(), crate::PersistError>> {
        Box::pin(async { Err("no [state] cluster is configured".into()) })
    }
}

// The filter chains, one per listener kind. Filters run in the order
// listed (responses too); `Chain::new` appends the ApiVersions clamp,
// computed from them.

/// The filters every listener kind ends with (after those that change a
/// response's content, so whatever they add is rewritten too). `sasl`:
/// whether clients' SASL requests pass through or were terminated before
/// the relay (mirror listeners).
fn common_filters(nodes: Arc<NodeRegistry>, sasl: SaslRelay) -> Vec<Box<dyn Filter>> {
    vec![Box::new(sasl), Box::new(AddressRewrite::new(nodes))]
}

/// The chain of a plain listener.
fn plain_chain(nodes: Arc<NodeRegistry>) -> Chain {
    Chain::new(common_filters(nodes, SaslRelay::Passthrough))
}

/// The chain of a `[[mirror]]` listener: its API list first (nothing else
/// reaches the source as mirrorguard), offline answers, the PID rewrite,
/// the seal. `fetcher`: whether its clients are the destination fetcher
/// (only its fetches move a seal and feed producer state).
fn mirror_chain(
    nodes: Arc<NodeRegistry>,
    mirror: Arc<MirrorContext>,
    fetcher: bool,
    listener: &str,
    metrics: Arc<Metrics>,
) -> Chain {
    mirror.set_nodes(nodes.clone());
    let mut filters: Vec<Box<dyn Filter>> = vec![
        Box::new(MirrorAllowlist::new(listener, metrics)),
        Box::new(SourceOffline::new(mirror.clone())),
        Box::new(MirrorFetch::new(mirror.clone(), fetcher)),
        Box::new(Seal::new(mirror, fetcher)),
    ];
    filters.extend(common_filters(nodes, SaslRelay::Terminated));
    Chain::new(filters)
}

/// The chain of a produce guard listener.
fn guard_chain(
    nodes: Arc<NodeRegistry>,
    name: &str,
    lifecycle: Arc<Lifecycle>,
    mirrors: Vec<Arc<MirrorContext>>,
    metrics: Arc<Metrics>,
    topic_ids: Option<TopicIdNames>,
) -> Chain {
    let policy = GuardPolicy::new(lifecycle.clone(), mirrors.clone());
    let mut filters: Vec<Box<dyn Filter>> = vec![
        Box::new(ProduceGuard::new(name, lifecycle, mirrors, metrics.clone())),
        Box::new(WriteGuard::new(name, policy, metrics, topic_ids)),
    ];
    filters.extend(common_filters(nodes, SaslRelay::Passthrough));
    Chain::new(filters)
}

/// The authentication a mirror's listeners require from their clients.
fn sasl_server(mc: &crate::config::MirrorConfig) -> anyhow::Result<Option<Arc<ServerAuth>>> {
    mc.listener_sasl
        .as_ref()
        .map(|c| {
            ServerAuth::new(c)
                .map(Arc::new)
                .map_err(|e| anyhow::anyhow!("mirror[{}].listener_sasl: {e}", mc.name))
        })
        .transpose()
}

/// Initialises tracing from the `[logging]` section (`RUST_LOG` overrides the level).
pub fn init_logging(cfg: &LoggingConfig) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&cfg.level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only on a terminal: log files and journald get plain text.
    // NO_COLOR (https://no-color.org) turns it off on a terminal too.
    use std::io::IsTerminal;
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let _ = match cfg.format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// Loads the config and runs the proxy until a shutdown signal.
pub fn run(config_path: &Path) -> anyhow::Result<()> {
    let config = Config::load(config_path)?;
    init_logging(&config.logging);
    // Passwords given by `password_env` leave the environment before any
    // thread starts (see crate::secrets).
    crate::secrets::take_env_secrets(config.password_env_vars());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(serve(config))
}

/// Runs every listener and the admin endpoint until SIGTERM/SIGINT.
pub async fn serve(config: Config) -> anyhow::Result<()> {
    let metrics = Metrics::new();
    // Installed first: SIGHUP's default action would end the process during
    // a long start-up (the state load).
    let hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
    tokio::spawn(reload_tls_on_sighup(hangup, metrics.clone()));
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let tracker = Arc::new(ConnectionTracker::default());
    let max_frame = config.limits.max_frame_bytes as usize;
    raise_open_file_limit(&config.limits);
    let shared = Shared {
        metrics: metrics.clone(),
        shutdown: shutdown_rx.clone(),
        tracker: tracker.clone(),
        limits: ConnectionLimits::new(
            config.limits.max_connections,
            config.limits.max_connections_per_address,
        ),
        budget: MemoryBudget::new(
            config.limits.max_buffered_request_bytes,
            Some(metrics.clone()),
        ),
    };
    for (i, l) in config.listeners.iter().chain(&config.guards).enumerate() {
        if l.upstream_identity == Some(crate::config::UpstreamIdentity::Shared) {
            tracing::warn!(listener = %l.name, index = i,
                "upstream_identity = \"shared\": every client of this listener acts on the \
                 upstream as mirrorguard's client certificate (upstream_tls.cert)");
        }
    }

    let mut listeners = Vec::new();

    // mirrorguard's own SASL identities, secrets read once here.
    let resolve = |cfg: Option<&crate::config::ClientSaslConfig>, section: &str| {
        ClientCredentials::resolve_opt(cfg, section).map_err(anyhow::Error::msg)
    };
    let state_identity = resolve(
        config.state.as_ref().and_then(|s| s.sasl.as_ref()),
        "state.sasl",
    )?;
    let destination_identity = resolve(config.destination_sasl(), "mirror.destination_sasl")?;

    // Mirrors: shared producer state, the state store loaded before any
    // mirror listener accepts a connection.
    let registry = Arc::new(ProducerStateRegistry::new(RegistryConfig {
        max_idle_ms: config.producer_state.max_idle_ms,
        anomaly_log_capacity: config.producer_state.anomaly_log_capacity,
        max_producers: config.producer_state.max_producers,
        max_partitions: config.producer_state.max_partitions,
        max_retained_closings: config.producer_state.closings_retained_total_max,
    }));
    let destination_connector =
        TransportConnector::from_config(config.destination_tls().as_ref(), "destination tls")?
            .with_sasl(destination_identity.clone());
    let state_sync = match &config.state {
        Some(st) if !config.mirrors.is_empty() || !config.guards.is_empty() => {
            let connector = TransportConnector::from_config(st.tls.as_ref(), "state tls")?
                .with_sasl(state_identity.clone());
            let store = StateStore::open_with(
                StateStoreConfig {
                    bootstrap: st.bootstrap.clone(),
                    topic: st.topic.clone(),
                    replication_factor: st.replication_factor,
                    connect_timeout: Duration::from_millis(st.connect_timeout_ms),
                    request_timeout: Duration::from_millis(st.request_timeout_ms),
                },
                connector,
            )
            .await
            .map_err(|e| anyhow::anyhow!("state cluster ({}): {e}", st.bootstrap.join(",")))?;
            crate::state_store::checks::check(&config, store.report()).await?;
            // Destination topic ids are read on the destination, which may
            // be another cluster than the one holding __mirror_state.
            let bootstrap = config
                .destination_bootstrap()
                .iter()
                .filter_map(|a| crate::config::split_host_port(a).ok())
                .collect();
            Some(StateSync::new(
                Arc::new(store),
                registry.clone(),
                metrics.clone(),
                bootstrap,
                destination_connector.clone(),
            ))
        }
        _ => None,
    };
    let salt_store: Arc<dyn SaltStore> = match &state_sync {
        Some(s) => s.clone(),
        None => Arc::new(NoStateCluster),
    };
    let lifecycle = Lifecycle::new(metrics.clone());
    if let Some(s) = &state_sync {
        lifecycle.set_store(s.clone());
        s.set_lifecycle(lifecycle.clone());
    }
    let mut mirrors = Vec::new();
    for mc in &config.mirrors {
        let mirror = MirrorContext::new(
            mc,
            registry.clone(),
            salt_store.clone(),
            lifecycle.clone(),
            &metrics,
        )
        .map_err(anyhow::Error::msg)?;
        mirror.set_source_identity(resolve(
            mc.source_sasl.as_ref(),
            &format!("mirror[{}].source_sasl", mc.name),
        )?);
        if let Some(s) = &state_sync {
            s.add_mirror(mirror.clone());
        }
        if mc.stopped_when == crate::config::StoppedWhen::DestinationHw {
            let bootstrap = config
                .destination_hw_bootstrap(mc)
                .iter()
                .filter_map(|a| crate::config::split_host_port(a).ok())
                .collect();
            mirror.set_destination_hw(crate::mirror::dest_hw::DestinationHw::new(
                bootstrap,
                destination_connector.clone(),
                Duration::from_millis(mc.destination_hw_poll_ms),
                Duration::from_millis(mc.upstream_request_timeout_ms.max(1000)),
            ));
        }
        mirrors.push((mc.clone(), mirror));
    }
    if let Some(s) = &state_sync {
        // The destination's topics are read as often as the sources'.
        let tail = Duration::from_millis(
            config
                .state
                .as_ref()
                .map_or(1_000, |st| st.tail_interval_ms),
        );
        if let Some(ms) = config.mirrors.iter().map(|m| m.metadata_refresh_ms).min() {
            s.set_destination_refresh(Duration::from_millis(ms), tail);
        }
        if let Some(st) = &config.state {
            s.set_instance_id(st.instance_id(&config.admin.listen));
        }
        s.load().await?;
        tokio::spawn(s.clone().tail(tail));
        tokio::spawn(s.clone().snapshot_loop(Duration::from_millis(
            config.producer_state.snapshot_interval_ms,
        )));
    }
    for (mc, mirror) in &mirrors {
        // With a dedicated fetcher listener, the main one serves readers
        // only: they never move a seal nor change producer state.
        let fetcher_listener = mc.fetcher_listener();
        // Without fetcher ports only `fetcher_identity = "any-reader"` (a
        // loopback test bed; the config check refuses anything else) gets here.
        let main_is_fetcher = fetcher_listener.is_none();
        if main_is_fetcher {
            tracing::warn!(mirror = %mc.name, listen_host = %mc.listen_host,
                "fetcher_identity = \"any-reader\": every reader of this mirror listener counts as \
                 the destination fetcher (any reader can take a cut or move a seal); for loopback \
                 test beds only, never in production");
        }
        let kinds = std::iter::once((mc.listener(), main_is_fetcher))
            .chain(fetcher_listener.map(|fc| (fc, true)));
        for (lc, fetcher) in kinds {
            let m = mirror.clone();
            let (name, metrics2) = (lc.name.clone(), metrics.clone());
            let listener = Listener::new(lc, max_frame, shared.clone(), move |nodes| {
                mirror_chain(nodes, m, fetcher, &name, metrics2)
            })?;
            // Where the listener authenticates its clients, only the
            // fetcher principals are the fetcher; the others read.
            if fetcher && mc.authenticates_clients() {
                let readers = mirror_chain(
                    listener.nodes.clone(),
                    mirror.clone(),
                    false,
                    &listener.config.name,
                    metrics.clone(),
                );
                listener.set_reader_chain(readers, mc.fetcher_principals());
            }
            // Replays and topic lookups reach the source as the first
            // (main) listener does.
            mirror.set_source_connector(listener.upstream_connector().clone());
            listener.set_refresh_hook(mirror.clone());
            listener.set_sasl(mirror.source_identity(), sasl_server(mc)?);
            listener.start().await?;
            // With a topology restored from __mirror_state the source's node
            // ports are bound now, so the fetcher finds them with the source down.
            if let Some(t) = mirror.topology() {
                for b in &t.brokers {
                    listener.nodes.advertise(b.node_id, &b.host, b.port);
                }
                listener.mark_ready_from_persisted();
            }
            listeners.push(listener);
        }
    }

    let mirror_contexts: Vec<Arc<MirrorContext>> = mirrors.iter().map(|(_, m)| m.clone()).collect();
    // DeleteTopics by topic id: ids are mapped with the destination topic
    // listing the state sync keeps (without [state], every id is unknown).
    let topic_ids: Option<TopicIdNames> = state_sync.as_ref().map(|s| {
        let s = s.clone();
        Arc::new(move |id: &[u8; 16]| s.destination_topic_name_of(id)) as TopicIdNames
    });
    for gc in &config.guards {
        let (lifecycle, mirror_contexts, metrics2, name, topic_ids) = (
            lifecycle.clone(),
            mirror_contexts.clone(),
            metrics.clone(),
            gc.name.clone(),
            topic_ids.clone(),
        );
        let listener = Listener::new(gc.clone(), max_frame, shared.clone(), move |nodes| {
            guard_chain(
                nodes,
                &name,
                lifecycle,
                mirror_contexts,
                metrics2,
                topic_ids,
            )
        })?;
        listener.set_sasl(
            resolve(
                gc.upstream_sasl.as_ref(),
                &format!("guard[{}].upstream_sasl", gc.name),
            )?,
            None,
        );
        listener.start().await?;
        listeners.push(listener);
    }

    for lc in &config.listeners {
        let listener = Listener::new(lc.clone(), max_frame, shared.clone(), plain_chain)?;
        listener.set_sasl(
            resolve(
                lc.upstream_sasl.as_ref(),
                &format!("listener[{}].upstream_sasl", lc.name),
            )?,
            None,
        );
        listener.start().await?;
        listeners.push(listener);
    }

    let admin_state = Arc::new(AdminState {
        registry: registry.clone(),
        metrics: metrics.clone(),
        listeners: listeners.clone(),
        shutting_down: AtomicBool::new(false),
    });
    let admin_addr =
        crate::config::parse_socket_addr(&config.admin.listen).map_err(anyhow::Error::msg)?;
    let admin_socket = tokio::net::TcpListener::bind(admin_addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot bind admin listener {admin_addr}: {e}"))?;
    let admin_tls = match &config.admin.tls {
        Some(t) => Some(crate::tls::ServerTls::new(t, "admin tls")?),
        None => None,
    };
    tracing::info!(%admin_addr, https = admin_tls.is_some(),
        "admin listener bound (/healthz /readyz /metrics)");
    let token = match &config.admin.token_file {
        Some(path) => Some(
            crate::secrets::AdminToken::load(path, config.secrets.unsafe_permissions)
                .map_err(|e| anyhow::anyhow!("admin.token_file {e}"))?,
        ),
        None => None,
    };
    let api_state = Arc::new(crate::admin_api::ApiState {
        lifecycle: lifecycle.clone(),
        mirrors: mirrors
            .iter()
            .map(|(mc, m)| (mc.name.clone(), m.clone()))
            .collect(),
        registry: registry.clone(),
        token,
        token_for_reads: config.admin.token_for_reads,
        allowed_hosts: config
            .admin
            .allowed_hosts
            .iter()
            .map(|h| h.strip_suffix('.').unwrap_or(h).to_ascii_lowercase())
            .collect(),
        destination_bootstrap: config
            .destination_bootstrap()
            .iter()
            .filter_map(|a| crate::config::split_host_port(a).ok())
            .collect(),
        destination_connector,
        metrics: Some(metrics.clone()),
    });
    let admin_read_timeout = Duration::from_millis(config.admin.read_timeout_ms);
    let admin_router = admin::router(admin_state.clone(), api_state, admin_read_timeout);
    let admin_task = tokio::spawn(admin::serve(
        admin_socket,
        admin_router,
        admin_read_timeout,
        shutdown_rx.clone(),
        admin_tls,
        metrics.clone(),
    ));
    // Health, readiness and metrics only, for probes and Prometheus while
    // the API stays on loopback.
    let metrics_task = match &config.admin.metrics_listen {
        Some(listen) => {
            let addr = crate::config::parse_socket_addr(listen).map_err(anyhow::Error::msg)?;
            let socket = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| anyhow::anyhow!("cannot bind admin.metrics_listen {addr}: {e}"))?;
            tracing::info!(%addr, "metrics listener bound (/healthz /readyz /metrics)");
            Some(tokio::spawn(admin::serve(
                socket,
                admin::metrics_router(admin_state.clone(), admin_read_timeout),
                admin_read_timeout,
                shutdown_rx.clone(),
                None,
                metrics.clone(),
            )))
        }
        None => None,
    };

    wait_for_signal().await;
    admin_state.shutting_down.store(true, Ordering::SeqCst);
    let grace = Duration::from_millis(config.limits.shutdown_grace_ms);
    tracing::info!(
        live_connections = tracker.live(),
        grace_ms = grace.as_millis() as u64,
        "shutdown requested: no new connections, draining in-flight requests"
    );
    let _ = shutdown_tx.send(true);
    if tokio::time::timeout(grace, tracker.wait_idle())
        .await
        .is_err()
    {
        tracing::warn!(
            live_connections = tracker.live(),
            "grace period over; closing remaining connections"
        );
    }
    // Everything observed since the last periodic snapshot, so a graceful
    // restart loses no producer state (a crash loses at most one interval).
    if let Some(s) = &state_sync {
        match tokio::time::timeout(Duration::from_secs(5), s.snapshot_once()).await {
            Ok(Ok(n)) => tracing::info!(partitions = n, "final producer-state snapshot written"),
            Ok(Err(e)) => tracing::warn!(error = %e, "final producer-state snapshot failed"),
            Err(_) => tracing::warn!("final producer-state snapshot timed out"),
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), admin_task).await;
    if let Some(t) = metrics_task {
        let _ = tokio::time::timeout(Duration::from_secs(1), t).await;
    }
    tracing::info!("stopped");
    Ok(())
}

/// Raises the soft limit of open files to the hard limit (each proxied
/// connection holds two descriptors), and warns when even that cannot hold
/// `[limits] max_connections`.
fn raise_open_file_limit(limits: &crate::config::LimitsConfig) {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit write and read only the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) != 0 {
            return;
        }
        if rl.rlim_cur < rl.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: rl.rlim_max,
                rlim_max: rl.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                rl = raised;
            }
        }
    }
    let needed = (limits.max_connections as u64).saturating_mul(2) + 256;
    let have: u64 = rl.rlim_cur;
    if have < needed {
        tracing::warn!(
            open_files = have,
            max_connections = limits.max_connections,
            "the open-file limit cannot hold [limits] max_connections proxied connections \
             (two descriptors each): raise it (LimitNOFILE=) or lower max_connections"
        );
    }
}

/// SIGHUP re-reads every TLS certificate, key and CA bundle: new
/// connections use the new files, open ones keep theirs; a file that no
/// longer makes a valid configuration keeps the old one and says why.
async fn reload_tls_on_sighup(
    hangup: std::io::Result<tokio::signal::unix::Signal>,
    metrics: Arc<Metrics>,
) {
    let mut hup = match hangup {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot install SIGHUP handler; TLS files are not reloaded");
            return;
        }
    };
    while hup.recv().await.is_some() {
        let report = crate::tls::reload_all();
        let count = |result| {
            metrics
                .tls_reloads
                .get_or_create(&crate::metrics::ResultLabels { result })
                .clone()
        };
        count("ok").inc_by(report.ok as u64);
        count("error").inc_by(report.failed.len() as u64);
        for (what, e) in &report.failed {
            tracing::error!(config = %what, error = %e,
                "SIGHUP: TLS files refused; keeping the previous certificates and keys");
        }
        tracing::info!(
            reloaded = report.ok,
            refused = report.failed.len(),
            "SIGHUP: TLS certificates and keys re-read"
        );
    }
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot install SIGTERM handler; waiting for ctrl-c only");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
    }
}
