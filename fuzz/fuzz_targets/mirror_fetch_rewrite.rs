//! Fuzzes the mirror fetch path on arbitrary upstream Fetch response bodies
//! (the source is hostile input too): walk, PID mapping, producer-state
//! observation, in-place PID + CRC rewriting and aborted-transaction
//! rewriting, at every Fetch version. The body length never changes.
#![no_main]

use std::pin::Pin;
use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use mirrorguard::config::{LayoutConfig, MirrorConfig, PidMode};
use mirrorguard::lifecycle::Lifecycle;
use mirrorguard::metrics::Metrics;
use mirrorguard::mirror::{rewrite_fetch_body, MirrorContext, PendingSalt, SaltStore};
use mirrorguard::producer_state::ProducerStateRegistry;

type Fut = Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>>;

/// Salts are never persisted here: the rewrite only reports what it needs.
struct NoStore;

impl SaltStore for NoStore {
    fn durable(&self) -> bool {
        false
    }
    fn persist_snapshot(&self, _snapshot: mirrorguard::producer_state::PartitionSnapshot) -> Fut {
        Box::pin(async { Ok(()) })
    }
    fn topic_id(&self, _topic: &str) -> Option<[u8; 16]> {
        Some([7; 16])
    }
    fn refresh_topic_ids(&self) -> Fut {
        Box::pin(async { Ok(()) })
    }
    fn persist(&self, _salts: Vec<PendingSalt>) -> Fut {
        Box::pin(async { Ok(()) })
    }
}

fn mirror(layout: LayoutConfig) -> Arc<MirrorContext> {
    let cfg = MirrorConfig {
        name: "fuzz".into(),
        bootstrap: "127.0.0.1:1".into(),
        listen_host: "127.0.0.1".into(),
        advertised_host: "127.0.0.1".into(),
        node_port_base: 20000,
        source_bootstrap: vec!["127.0.0.1:2".into()],
        source_cluster_id: Some("AAAAAAAAAAAAAAAAAAAAAQ".into()),
        pid_mode: PidMode::Region,
        layout,
        destination_topic_prefix: String::new(),
        connect_timeout_ms: 1000,
        metadata_refresh_ms: 1000,
    };
    let metrics = Metrics::new();
    MirrorContext::new(
        &cfg,
        Arc::new(ProducerStateRegistry::default()),
        Arc::new(NoStore),
        Lifecycle::new(metrics.clone()),
        &metrics,
    )
    .expect("valid test config")
}

fuzz_target!(|data: &[u8]| {
    static HIGH: OnceLock<Arc<MirrorContext>> = OnceLock::new();
    static SIGN: OnceLock<Arc<MirrorContext>> = OnceLock::new();
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let version = 4 + (selector % 14) as i16;
    let m = if selector & 0x80 == 0 {
        HIGH.get_or_init(|| mirror(LayoutConfig::High))
    } else {
        SIGN.get_or_init(|| mirror(LayoutConfig::SignBit))
    };
    let mut body = rest.to_vec();
    let _ = rewrite_fetch_body(m, version, &mut body, &|_, _| false);
    assert_eq!(body.len(), rest.len());
});
