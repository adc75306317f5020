//! Fuzzes the mirror fetch path on arbitrary upstream Fetch response bodies
//! (the source is hostile input too): walk, PID mapping, producer-state
//! observation, in-place PID + CRC rewriting and aborted-transaction
//! rewriting, at every Fetch version. The body length never changes.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use mirrorguard::config::MirrorConfig;
use mirrorguard::lifecycle::Lifecycle;
use mirrorguard::metrics::Metrics;
use mirrorguard::mirror::{rewrite_fetch_body, MirrorContext, PendingSalt, SaltStore};
use mirrorguard::producer_state::{ProducerStateRegistry, RegistryConfig};
use mirrorguard::{BoxFuture, PersistError};

/// Salts are never persisted here: the rewrite only reports what it needs.
struct NoStore;

impl SaltStore for NoStore {
    fn topic_id(&self, _topic: &str) -> Option<[u8; 16]> {
        Some([7; 16])
    }
    fn refresh_topic_ids(&self) -> BoxFuture<'static, Result<(), PersistError>> {
        Box::pin(async { Ok(()) })
    }
    fn persist(&self, _salts: Vec<PendingSalt>) -> BoxFuture<'static, Result<(), PersistError>> {
        Box::pin(async { Ok(()) })
    }
}

/// A region-mode mirror with the given PID layout (`high` or `sign-bit`).
fn mirror(layout: &str) -> Arc<MirrorContext> {
    let cfg: MirrorConfig = toml::from_str(&format!(
        "name = \"fuzz\"\nbootstrap = \"127.0.0.1:1\"\nadvertised_host = \"127.0.0.1\"\n\
         node_port_base = 20000\nsource_bootstrap = [\"127.0.0.1:2\"]\n\
         source_cluster_id = \"AAAAAAAAAAAAAAAAAAAAAQ\"\npid_mode = \"region\"\n\
         layout = \"{layout}\"\n"
    ))
    .expect("valid fuzz config");
    let metrics = Metrics::new();
    MirrorContext::new(
        &cfg,
        Arc::new(ProducerStateRegistry::new(RegistryConfig::default())),
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
        HIGH.get_or_init(|| mirror("high"))
    } else {
        SIGN.get_or_init(|| mirror("sign-bit"))
    };
    let mut body = rest.to_vec();
    let _ = rewrite_fetch_body(m, version, &mut body, &|_, _| false);
    assert_eq!(body.len(), rest.len());
});
