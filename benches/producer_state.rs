//! Per-batch cost of producer-state tracking on a steady stream, against the
//! CRC-32C of a 1 KiB batch (the budget: the state update must cost less).
//!
//! Each iteration observes one in-sequence batch of the next producer
//! (round-robin over N producers), so with 100k producers every batch hits a
//! different, cache-cold entry, the realistic worst case of a busy partition.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use mirrorguard::producer_state::{
    BatchObservation, ClusterId, MappingLookup, Origin, PartitionKey, PartitionState,
    ProducerStateRegistry,
};

const CLUSTER: ClusterId = ClusterId([0x5a; 16]);

fn mapped(pid: i64) -> i64 {
    (1i64 << 62) | (42i64 << 31) | pid
}

/// Round-robin over `n` producers, one in-sequence single-record batch
/// each, at consecutive offsets. Counters instead of `i % n` / `i / n`: a
/// 64-bit division would add ~10 ns of harness cost to every iteration.
struct Stream {
    n: i64,
    pid: i64,
    seq: i32,
    offset: i64,
}

impl Stream {
    fn new(n: i64) -> Self {
        Self {
            n,
            pid: 0,
            seq: 0,
            offset: 0,
        }
    }

    #[inline]
    fn next(&mut self) -> (Origin, BatchObservation) {
        let out = (
            Origin {
                source_cluster: CLUSTER,
                original_pid: self.pid,
            },
            BatchObservation::data(mapped(self.pid), 0, self.offset, self.seq, 1, false),
        );
        self.offset += 1;
        self.pid += 1;
        if self.pid == self.n {
            self.pid = 0;
            self.seq = if self.seq == i32::MAX {
                0
            } else {
                self.seq + 1
            };
        }
        out
    }
}

/// A partition that already knows all `n` producers, and the stream that
/// continues it.
fn warm_state(n: i64) -> (PartitionState, Stream) {
    let mut s = PartitionState::new(PartitionKey::new([1; 16], "bench", 0));
    let mut stream = Stream::new(n);
    let mut sink = Vec::new();
    for _ in 0..n {
        let (o, b) = stream.next();
        s.observe(&o, &b, 0, &mut sink);
    }
    assert!(sink.is_empty());
    (s, stream)
}

fn bench_observe(c: &mut Criterion) {
    let mut g = c.benchmark_group("observe_steady");
    g.throughput(Throughput::Elements(1));
    for n in [1i64, 1_000, 100_000] {
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |bench, &n| {
            let (mut s, mut stream) = warm_state(n);
            let mut sink = Vec::with_capacity(4);
            bench.iter(|| {
                let (o, b) = stream.next();
                let out = s.observe(&o, black_box(&b), 0, &mut sink);
                if !sink.is_empty() {
                    panic!("unexpected anomaly: {}", sink[0]);
                }
                out
            });
        });
    }
    g.finish();
}

/// What the Fetch path does per batch: salt lookup + mapping, then observe,
/// through a cached registry handle (one uncontended mutex lock).
fn bench_full_path(c: &mut Criterion) {
    let mut g = c.benchmark_group("lookup_and_observe_via_handle");
    g.throughput(Throughput::Elements(1));
    for n in [1i64, 1_000, 100_000] {
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |bench, &n| {
            let registry = ProducerStateRegistry::default();
            let key = PartitionKey::new([1; 16], "bench", 0);
            let (warm, mut stream) = warm_state(n);
            registry.restore(&warm.snapshot()).unwrap();
            let handle = registry.partition(&key);
            let mut sink = Vec::with_capacity(4);
            bench.iter(|| {
                let (o, mut b) = stream.next();
                let original = o.original_pid;
                let map = move |salt: i64| mapped(original) + (salt << 31);
                handle.with(|s| {
                    if let MappingLookup::Ready { mapped_pid, .. } = s.lookup_mapping(&o, &map) {
                        b.producer_id = mapped_pid;
                    }
                    s.observe(&o, black_box(&b), 0, &mut sink)
                })
            });
            assert!(sink.is_empty());
        });
    }
    g.finish();
}

fn bench_crc_reference(c: &mut Criterion) {
    let data: Vec<u8> = (0..1024u32).map(|x| (x * 31 + 7) as u8).collect();
    c.bench_function("crc32c_1KiB_reference", |b| {
        b.iter(|| crc32c::crc32c(black_box(&data)))
    });
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_observe, bench_full_path, bench_crc_reference
}
criterion_main!(benches);
