//! The two fetch paths side by side, for the proptests of
//! [`stream`](super::stream) and the `mirror_fetch_stream` fuzz target: a
//! region-mode mirror on an in-memory state store (two topics, `a` and `b`,
//! with four partitions each already observed, and a foreign holder of what
//! PID 5 maps to, so its first batch needs a salt), and the store-and-forward
//! and streamed rewrites of one response frame. Not part of the product.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use tokio::io::AsyncWriteExt;

use super::*;
use crate::codec::FrameReader;
use crate::producer_state::RegistryConfig;

/// Source cluster id whose fold is 1.
pub const SOURCE: &str = "AAAAAAAAAAAAAAAAAAAAAQ";
pub const TOPIC_IDS: [[u8; 16]; 2] = [[1; 16], [2; 16]];
pub const TOPICS: [&str; 2] = ["a", "b"];

/// A state store that keeps claims and salts in memory, applied to the
/// mirror's registry as the real store applies them.
pub struct MemStore {
    durable: bool,
    registry: Arc<ProducerStateRegistry>,
    offset: AtomicI64,
    /// Salts "persisted" but never applied: a wait that changes nothing.
    forgets_salts: bool,
}

impl SaltStore for MemStore {
    fn durable(&self) -> bool {
        self.durable
    }
    fn persist_claims(
        &self,
        _claims: Vec<(PartitionKey, Vec<(i64, Origin)>)>,
    ) -> crate::BoxFuture<'static, Result<(), PersistError>> {
        Box::pin(async { Ok(()) })
    }
    fn topic_id(&self, _topic: &str) -> Option<[u8; 16]> {
        Some([9; 16])
    }
    fn refresh_topic_ids(&self) -> crate::BoxFuture<'static, Result<(), PersistError>> {
        Box::pin(async { Ok(()) })
    }
    fn persist(
        &self,
        salts: Vec<PendingSalt>,
    ) -> crate::BoxFuture<'static, Result<(), PersistError>> {
        for s in salts.into_iter().filter(|_| !self.forgets_salts) {
            let at = self.offset.fetch_add(1, Ordering::SeqCst);
            let record = s.choice.to_record(s.origin, 0, at);
            self.registry
                .partition(&s.partition)
                .with(|st| st.salts_mut().apply(record));
        }
        Box::pin(async { Ok(()) })
    }
}

/// A mirror on a [`MemStore`] (`durable`: claims are kept) and its metrics.
pub fn mirror(durable: bool) -> (Arc<MirrorContext>, Arc<Metrics>) {
    mirror_on(durable, false)
}

/// [`mirror`] whose store never applies a salt it is given (`forgets_salts`).
pub fn mirror_on(durable: bool, forgets_salts: bool) -> (Arc<MirrorContext>, Arc<Metrics>) {
    let cfg: MirrorConfig = toml::from_str(&format!(
        "name = \"m\"\nbootstrap = \"127.0.0.1:1\"\nadvertised_host = \"127.0.0.1\"\n\
         node_port_base = 20000\nsource_bootstrap = [\"127.0.0.1:2\"]\n\
         source_cluster_id = \"{SOURCE}\"\n"
    ))
    .unwrap();
    let metrics = Metrics::new();
    let registry = Arc::new(ProducerStateRegistry::new(RegistryConfig::default()));
    let store = Arc::new(MemStore {
        durable,
        registry: registry.clone(),
        offset: AtomicI64::new(0),
        forgets_salts,
    });
    let m = MirrorContext::new(
        &cfg,
        registry,
        store,
        crate::lifecycle::Lifecycle::new(metrics.clone()),
        &metrics,
    )
    .unwrap();
    use crate::proxy::refresh::RefreshHook;
    m.on_refresh(&crate::proxy::refresh::ClusterView {
        cluster_id: None,
        topics: TOPICS
            .iter()
            .zip(TOPIC_IDS)
            .map(|(n, id)| (n.to_string(), id, 4))
            .collect(),
        ..Default::default()
    })
    .unwrap();
    for t in TOPICS {
        for p in 0..4 {
            // Observed from offset 0 already (no replay).
            let key = m.key_for(t, p);
            m.mark_warm(&key);
            // Another source's producer holds what PID 5 maps to: the first
            // batch of PID 5 needs a salt.
            let other = Origin {
                source_cluster: ps::ClusterId([7; 16]),
                original_pid: 5,
            };
            m.registry
                .partition(&key)
                .with(|s| s.claim(high(5), other, 0));
        }
    }
    (m, metrics)
}

/// The Fetch request header the responses answer.
pub fn header(version: i16) -> RequestHeader {
    RequestHeader {
        api_key: crate::codec::api::FETCH,
        api_version: version,
        correlation_id: 42,
    }
}

/// The response frame: size, correlation id, header tags, body.
pub fn frame(version: i16, body: &[u8]) -> Vec<u8> {
    let flexible = version >= 12;
    let mut out = Vec::new();
    let len = 4 + usize::from(flexible) + body.len();
    out.extend((len as i32).to_be_bytes());
    out.extend(42i32.to_be_bytes());
    if flexible {
        out.push(0);
    }
    out.extend(body);
    out
}

/// Store-and-forward: the held path, its waits run until it is ready.
pub async fn held(m: &Arc<MirrorContext>, version: i16, body: &[u8]) -> Result<Vec<u8>, String> {
    held_as(m, version, body, true).await
}

/// [`held`] for the fetcher or another reader (never observed, never replayed for).
pub async fn held_as(
    m: &Arc<MirrorContext>,
    version: i16,
    body: &[u8],
    fetcher: bool,
) -> Result<Vec<u8>, String> {
    for _ in 0..64 {
        let mut b = body.to_vec();
        match rewrite_fetch_body_as(m, version, &mut b, &|_, _| false, fetcher) {
            Ok(None) => return Ok(b),
            Ok(Some(p)) => m
                .pending_wait(p, version)
                .await
                .map_err(|e| e.to_string())?,
            Err(e) => return Err(e.to_string()),
        }
    }
    Err("still blocked".into())
}

/// Streamed through a duplex, written in pieces of `cuts` sizes.
pub async fn streamed(
    m: &Arc<MirrorContext>,
    version: i16,
    frame: Vec<u8>,
    cuts: Vec<usize>,
) -> Result<Vec<u8>, String> {
    streamed_as(m, version, frame, cuts, true).await
}

/// [`streamed`] for the fetcher or another reader.
pub async fn streamed_as(
    m: &Arc<MirrorContext>,
    version: i16,
    frame: Vec<u8>,
    cuts: Vec<usize>,
    fetcher: bool,
) -> Result<Vec<u8>, String> {
    let (mut up, down) = tokio::io::duplex(64);
    let writer = tokio::spawn(async move {
        let mut at = 0;
        let mut i = 0;
        while at < frame.len() {
            let n = cuts.get(i % cuts.len().max(1)).copied().unwrap_or(7).max(1);
            let end = (at + n).min(frame.len());
            if up.write_all(&frame[at..end]).await.is_err() {
                return;
            }
            at = end;
            i += 1;
        }
    });
    let mut reader = FrameReader::new(down, 1 << 26);
    let total = match reader.peek(8).await {
        Ok(Some(total)) => total,
        Ok(None) => return Err("no frame".into()),
        Err(e) => return Err(e.to_string()),
    };
    let Some(mut w) = stream::FetchStream::new(m.clone(), &header(version), fetcher) else {
        return Err("not a streamable request".into());
    };
    w.start(total);
    let mut out = Vec::new();
    let res = stream::relay(w, &mut reader, &mut out).await;
    // A relay that failed early leaves the writer blocked on a full duplex.
    drop(reader);
    let _ = writer.await;
    res.map_err(|f| f.error.to_string())?;
    Ok(out)
}

/// PID `pid` mapped into the region of fold 1 (high layout).
pub fn high(pid: i64) -> i64 {
    ((1u64 << 62) | (1u64 << 31) | pid as u64) as i64
}
