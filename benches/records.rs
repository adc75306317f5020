//! Criterion benches of the record-batch engine, each beside the raw
//! `crc32c` pass and a `memcpy` of the same bytes:
//! - walk: headers only (never touches record bytes);
//! - walk + verify: CRC-32C of every batch;
//! - walk + rewrite + CRC: PID changed in every batch, CRC recomputed.
//!
//! At batch sizes 256 B, 1 KiB, 16 KiB and 1 MiB, with 1 and up to 1000
//! batches per blob (capped at 16 MiB per blob).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use mirrorguard::records::builder::{build_batch, BatchSpec, RecordSpec};
use mirrorguard::records::{rewrite_all, verify_crc, walk, Entry};

/// One v2 batch of exactly `size` bytes (one record holding the payload).
fn batch_of(size: usize) -> Vec<u8> {
    let spec = BatchSpec {
        producer_id: 5,
        producer_epoch: 0,
        base_sequence: 0,
        ..BatchSpec::default()
    };
    let mut n = size.saturating_sub(80);
    loop {
        let value = vec![0xabu8; n];
        let b = build_batch(
            &spec,
            &[RecordSpec {
                value: Some(&value),
                ..RecordSpec::default()
            }],
        );
        match b.len().cmp(&size) {
            std::cmp::Ordering::Equal => return b,
            std::cmp::Ordering::Less => n += size - b.len(),
            std::cmp::Ordering::Greater => n -= (b.len() - size).min(n),
        }
    }
}

fn benches(c: &mut Criterion) {
    const MAX_BLOB: usize = 16 << 20;
    for size in [256usize, 1 << 10, 16 << 10, 1 << 20] {
        for count in [1usize, 1000] {
            let count = count.min(MAX_BLOB / size).max(1);
            let one = batch_of(size);
            let blob: Vec<u8> = std::iter::repeat_n(one.as_slice(), count)
                .flatten()
                .copied()
                .collect();
            let id = format!("{size}B x{count}");
            let mut g = c.benchmark_group("records");
            g.throughput(Throughput::Bytes(blob.len() as u64));
            g.warm_up_time(Duration::from_millis(500));
            g.measurement_time(Duration::from_secs(2));
            g.sample_size(20);

            g.bench_with_input(BenchmarkId::new("walk", &id), &blob, |b, blob| {
                b.iter(|| {
                    let mut pids = 0i64;
                    for e in walk(black_box(blob)).flatten() {
                        if let Entry::V2(h) = e {
                            pids = pids.wrapping_add(h.producer_id);
                        }
                    }
                    pids
                })
            });
            g.bench_with_input(BenchmarkId::new("walk+verify", &id), &blob, |b, blob| {
                b.iter(|| {
                    let mut ok = 0usize;
                    for e in walk(black_box(blob)).flatten() {
                        ok += usize::from(verify_crc(&blob[e.range().clone()]));
                    }
                    assert_eq!(ok, count);
                    ok
                })
            });
            let mut work = blob.clone();
            g.bench_function(BenchmarkId::new("walk+rewrite+crc", &id), |b| {
                b.iter(|| {
                    // Flip the PID each pass so every batch really changes.
                    let stats = rewrite_all(black_box(&mut work), |h| Some(h.producer_id ^ 1))
                        .unwrap_or_default();
                    assert_eq!(stats.rewritten, count);
                    stats.rewritten
                })
            });
            g.bench_with_input(BenchmarkId::new("raw-crc32c", &id), &blob, |b, blob| {
                b.iter(|| crc32c::crc32c(black_box(blob)))
            });
            let mut dst = vec![0u8; blob.len()];
            g.bench_function(BenchmarkId::new("memcpy", &id), |b| {
                b.iter(|| {
                    dst.copy_from_slice(black_box(&blob));
                    black_box(&dst);
                })
            });
            g.finish();
        }
    }
}

criterion_group!(records_benches, benches);
criterion_main!(records_benches);
