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
use crate::metrics::Metrics;
use crate::proxy::connection::ResponseRewriter;
use crate::proxy::listener::{ConnectionTracker, Listener};
use crate::proxy::rewrite::AddressRewriter;

/// Initialises tracing from the `[logging]` section (`RUST_LOG` overrides the level).
pub fn init_logging(cfg: &LoggingConfig) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&cfg.level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
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
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(serve(config))
}

/// Runs every listener and the admin endpoint until SIGTERM/SIGINT.
pub async fn serve(config: Config) -> anyhow::Result<()> {
    let metrics = Metrics::new();
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let tracker = Arc::new(ConnectionTracker::default());
    let max_frame = config.limits.max_frame_bytes as usize;

    let mut listeners = Vec::new();
    for lc in &config.listeners {
        let listener = Listener::new(
            lc.clone(),
            max_frame,
            metrics.clone(),
            shutdown_rx.clone(),
            tracker.clone(),
            |nodes| Arc::new(AddressRewriter::new(nodes)) as Arc<dyn ResponseRewriter>,
        );
        listener.start().await?;
        listeners.push(listener);
    }

    let admin_state = Arc::new(AdminState {
        metrics: metrics.clone(),
        listeners: listeners.clone(),
        shutting_down: AtomicBool::new(false),
    });
    let admin_addr =
        crate::config::parse_socket_addr(&config.admin.listen).map_err(anyhow::Error::msg)?;
    let admin_socket = tokio::net::TcpListener::bind(admin_addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot bind admin listener {admin_addr}: {e}"))?;
    tracing::info!(%admin_addr, "admin listener bound (/healthz /readyz /metrics)");
    let mut admin_shutdown = shutdown_rx.clone();
    let admin_router = admin::router(admin_state.clone());
    let admin_task = tokio::spawn(async move {
        let served = axum::serve(admin_socket, admin_router)
            .with_graceful_shutdown(async move {
                let _ = admin_shutdown.wait_for(|s| *s).await;
            })
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "admin listener failed");
        }
    });

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
    let _ = tokio::time::timeout(Duration::from_secs(1), admin_task).await;
    tracing::info!("stopped");
    Ok(())
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
