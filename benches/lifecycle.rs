//! What the fetch path pays to read the life cycle on an incremental fetch
//! of a mirror with controlled partitions (issue 29, item 6).
//!
//! `controlled_of` is what the fetch path calls: the controlled entries of
//! one mirror, topic/partition/state/cut only, a shared list rebuilt at the
//! first read after a change (the life cycle changes rarely; fetches come
//! every 500 ms per session). `list` is what it called before (every entry
//! cloned whole, then sorted), kept for the admin API; it is measured next
//! to it as the reference.
//!
//! `cargo bench --bench lifecycle`
//!
//! Shapes: 10,000 partitions with entries in the life cycle, of which 10,
//! 1,000 or all are controlled (the rest MIRRORING again after a protect).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use mirrorguard::lifecycle::{Entry, Lifecycle, State};
use mirrorguard::metrics::Metrics;
use mirrorguard::producer_state::PartitionKey;

const MIRROR: &str = "a-to-b";
const PARTITIONS: i32 = 10_000;

fn lifecycle(controlled: i32) -> std::sync::Arc<Lifecycle> {
    let lc = Lifecycle::new(Metrics::new());
    for i in 0..PARTITIONS {
        let topic = format!("topic-{}", i / 100);
        let partition = i % 100;
        let mut e = Entry::new(MIRROR, "c291cmNl", &topic, partition);
        if i < controlled {
            e.state = State::Stopping;
            e.cut = Some(1_000 + i64::from(i));
            e.reason = Some("sealing: 1 abort marker(s) and the barrier".into());
        }
        let mut id = [0u8; 16];
        id[..4].copy_from_slice(&(i / 100).to_be_bytes());
        lc.restore(PartitionKey::new(id, topic.as_str(), partition), e);
    }
    lc
}

fn bench_incremental_fetch_read(c: &mut Criterion) {
    let mut g = c.benchmark_group("lifecycle_read_per_incremental_fetch");
    for controlled in [10, 1_000, PARTITIONS] {
        let lc = lifecycle(controlled);
        g.bench_with_input(
            BenchmarkId::new("controlled_of", controlled),
            &controlled,
            |b, _| b.iter(|| black_box(lc.controlled_of(black_box(MIRROR)))),
        );
        g.bench_with_input(
            BenchmarkId::new("list_sorted_before", controlled),
            &controlled,
            |b, _| b.iter(|| black_box(lc.list())),
        );
    }
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20)
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_incremental_fetch_read
}
criterion_main!(benches);
