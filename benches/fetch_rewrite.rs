//! The mirror fetch path on a whole Fetch response: `rewrite_fetch_body`
//! (walk every partition and batch, map PIDs, observe producer state, patch
//! PID + CRC in place) in `region` and `preserve` mode, beside a walk that
//! only reads headers, a raw CRC-32C pass and a memcpy of the same body.
//!
//! Shapes (response records bytes spread over the partitions, batches of
//! at most 16 KiB, 8 records each, one producer per batch slot):
//! - 1 partition x 16 KiB (one batch), 1 partition x 1 MiB (64 batches);
//! - 100 partitions x 16 KiB total (100 batches of ~164 B: per-partition
//!   costs dominate), 100 partitions x 1 MiB total (100 batches of ~10 KiB).
//!
//! Every iteration rewrites the response advanced to the next generation
//! (offsets and sequences continue, CRCs valid; prepared in one reused
//! buffer outside the timed section, so no page faults are measured), so producer state sees a steady in-sequence
//! stream and region mode rewrites every batch.
//!
//! `cargo bench --bench fetch_rewrite -- --warm-up-time 1 --measurement-time 3`

mod common;

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use mirrorguard::config::MirrorConfig;
use mirrorguard::handlers::walk_fetch_response;
use mirrorguard::metrics::Metrics;
use mirrorguard::mirror::{rewrite_fetch_body, MirrorContext, PendingSalt, SaltStore};
use mirrorguard::producer_state::ProducerStateRegistry;

use common::SyntheticFetch;

struct NoSalts;

impl SaltStore for NoSalts {
    fn topic_id(&self, _topic: &str) -> Option<[u8; 16]> {
        Some([7; 16])
    }
    fn refresh_topic_ids(
        &self,
    ) -> mirrorguard::BoxFuture<'static, Result<(), mirrorguard::PersistError>> {
        Box::pin(async { Ok(()) })
    }
    fn persist(
        &self,
        _salts: Vec<PendingSalt>,
    ) -> mirrorguard::BoxFuture<'static, Result<(), mirrorguard::PersistError>> {
        Box::pin(async { Err("bench: no collisions expected".into()) })
    }
}

/// A mirror context as `mirrorguard run` builds it, with a fixed source id.
pub fn mirror(mode: &str) -> Arc<MirrorContext> {
    let cfg: MirrorConfig = toml::from_str(&format!(
        r#"
name = "bench-{mode}"
bootstrap = "127.0.0.1:1"
advertised_host = "127.0.0.1"
node_port_base = 2
source_bootstrap = ["127.0.0.1:3"]
source_cluster_id = "MkU3OEVBNTcwNTJENDM2Qg"
pid_mode = "{mode}"
"#
    ))
    .expect("mirror config");
    let metrics = Metrics::new();
    MirrorContext::new(
        &cfg,
        Arc::new(ProducerStateRegistry::default()),
        Arc::new(NoSalts),
        mirrorguard::lifecycle::Lifecycle::new(metrics.clone()),
        &metrics,
    )
    .expect("mirror context")
}

/// Runs `f` `iters` times, each on the response advanced to the next
/// generation in one reused buffer; only `f` is timed.
fn on_fresh_copies(
    fetch: &SyntheticFetch,
    k: &mut u64,
    iters: u64,
    mut f: impl FnMut(&mut [u8]),
) -> Duration {
    let mut buf = fetch.body.clone();
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        buf.copy_from_slice(&fetch.body);
        fetch.advance(&mut buf, *k);
        *k += 1;
        let t = Instant::now();
        f(&mut buf);
        total += t.elapsed();
    }
    total
}

fn benches(c: &mut Criterion) {
    const KIB16: usize = 16 << 10;
    for (partitions, total, label) in [
        (1usize, KIB16, "1p x 16KiB"),
        (1, 1 << 20, "1p x 1MiB"),
        (100, KIB16, "100p x 16KiB"),
        (100, 1 << 20, "100p x 1MiB"),
    ] {
        let per_partition = total / partitions;
        let batch_bytes = per_partition.min(KIB16);
        let batches = (per_partition / batch_bytes).max(1);
        let fetch = SyntheticFetch::new("bench-topic", partitions, batches, batch_bytes);
        let mut g = c.benchmark_group("fetch_rewrite");
        g.throughput(Throughput::Bytes(fetch.body.len() as u64));
        g.sample_size(20);

        for mode in ["region", "preserve"] {
            let ctx = mirror(mode);
            let mut k = 0u64;
            g.bench_function(BenchmarkId::new(mode, label), |b| {
                b.iter_custom(|iters| {
                    on_fresh_copies(&fetch, &mut k, iters, |buf| {
                        let out = rewrite_fetch_body(&ctx, 12, black_box(buf), &|_, _| false)
                            .expect("rewrite");
                        assert!(out.is_none(), "no collisions in a single-source bench");
                    })
                })
            });
        }
        // The same reference on a buffer prepared like the rewrite's input
        // (copied and advanced just before), so cache state matches.
        let mut k = 0u64;
        g.bench_function(BenchmarkId::new("raw-crc32c-fresh", label), |b| {
            b.iter_custom(|iters| {
                on_fresh_copies(&fetch, &mut k, iters, |buf| {
                    black_box(crc32c::crc32c(black_box(buf)));
                })
            })
        });
        g.bench_with_input(
            BenchmarkId::new("walk-headers", label),
            &fetch.body,
            |b, body| {
                b.iter(|| {
                    let mut pids = 0i64;
                    walk_fetch_response(12, black_box(body), &mut |p| {
                        if let Some(r) = p.records.clone() {
                            for e in mirrorguard::records::walk(&body[r]).flatten() {
                                if let mirrorguard::records::Entry::V2(h) = e {
                                    pids = pids.wrapping_add(h.producer_id);
                                }
                            }
                        }
                    })
                    .expect("walk");
                    pids
                })
            },
        );
        g.bench_with_input(
            BenchmarkId::new("raw-crc32c", label),
            &fetch.body,
            |b, body| b.iter(|| crc32c::crc32c(black_box(body))),
        );
        let mut dst = vec![0u8; fetch.body.len()];
        g.bench_function(BenchmarkId::new("memcpy", label), |b| {
            b.iter(|| {
                dst.copy_from_slice(black_box(&fetch.body));
                black_box(&dst);
            })
        });
        g.finish();
    }
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! {
    name = fetch_rewrite;
    config = config();
    targets = benches
}
criterion_main!(fetch_rewrite);
