//! Frame decode and routing, as the two pumps of a connection do it:
//! `FrameReader` over an in-memory stream of realistic frames, then the
//! request header parse and the routing decision (does the listener decode
//! this API?), or the response correlation id check. A memcpy of the same
//! stream is the physical reference (the reader moves every byte once).
//!
//! Streams: 4,096 small requests (Fetch v12 ~ 100 B, Metadata, ApiVersions),
//! 256 Produce v9 requests of 16 KiB, 16 Fetch responses of 1 MiB.
//!
//! `cargo bench --bench frame -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use mirrorguard::codec::header::{response_body_offset, response_correlation_id};
use mirrorguard::codec::{api, FrameReader, RequestHeader};
use mirrorguard::filter::address::carries_address;
use mirrorguard::handlers::response_header_version;

fn request(api_key: i16, version: i16, corr: i32, body_len: usize) -> Vec<u8> {
    let client = b"rdkafka";
    let size = 2 + 2 + 4 + 2 + client.len() + 1 + body_len;
    let mut f = Vec::with_capacity(size + 4);
    f.extend_from_slice(&(size as i32).to_be_bytes());
    f.extend_from_slice(&api_key.to_be_bytes());
    f.extend_from_slice(&version.to_be_bytes());
    f.extend_from_slice(&corr.to_be_bytes());
    f.extend_from_slice(&(client.len() as i16).to_be_bytes());
    f.extend_from_slice(client);
    f.push(0); // header tagged fields
    f.resize(size + 4, 0x11);
    f
}

fn response(corr: i32, body_len: usize) -> Vec<u8> {
    let size = 4 + 1 + body_len;
    let mut f = Vec::with_capacity(size + 4);
    f.extend_from_slice(&(size as i32).to_be_bytes());
    f.extend_from_slice(&corr.to_be_bytes());
    f.push(0);
    f.resize(size + 4, 0x22);
    f
}

/// Reads every frame of `stream` and routes it; returns a checksum.
async fn route_requests(stream: &[u8]) -> (usize, i64) {
    let mut r = FrameReader::new(stream, 100 << 20);
    let (mut n, mut acc) = (0usize, 0i64);
    while let Some(frame) = r.next_frame().await.expect("frame") {
        let h = RequestHeader::parse(&frame).expect("header");
        let decoded = h.api_key == api::FETCH
            || h.api_key == api::API_VERSIONS
            || carries_address(h.api_key, h.api_version);
        acc = acc.wrapping_add(i64::from(h.correlation_id) + i64::from(decoded));
        n += 1;
    }
    (n, acc)
}

async fn route_responses(stream: &[u8], expected_versions: i16) -> (usize, i64) {
    let mut r = FrameReader::new(stream, 100 << 20);
    let hv = response_header_version(api::FETCH, expected_versions).expect("version");
    let (mut n, mut acc) = (0usize, 0i64);
    while let Some(frame) = r.next_frame().await.expect("frame") {
        let id = response_correlation_id(&frame).expect("id");
        let at = response_body_offset(&frame, hv).expect("body");
        acc = acc.wrapping_add(i64::from(id) + at as i64);
        n += 1;
    }
    (n, acc)
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let small: Vec<u8> = (0..4096)
        .flat_map(|i| match i % 8 {
            0 => request(api::METADATA, 12, i, 8),
            1 => request(api::API_VERSIONS, 3, i, 20),
            _ => request(api::FETCH, 12, i, 90),
        })
        .collect();
    let produce: Vec<u8> = (0..256)
        .flat_map(|i| request(api::PRODUCE, 9, i, 16 << 10))
        .collect();
    let responses: Vec<u8> = (0..16).flat_map(|i| response(i, 1 << 20)).collect();

    let mut g = c.benchmark_group("frame");
    g.sample_size(30);
    for (label, stream, frames) in [
        ("requests 4096 x ~100B", &small, 4096usize),
        ("produce 256 x 16KiB", &produce, 256),
    ] {
        g.throughput(Throughput::Elements(frames as u64));
        g.bench_with_input(
            BenchmarkId::new("read+route", label),
            stream,
            |b, stream| {
                b.iter(|| {
                    let (n, acc) = rt.block_on(route_requests(black_box(stream)));
                    assert_eq!(n, frames);
                    acc
                })
            },
        );
    }
    g.throughput(Throughput::Elements(16));
    g.bench_with_input(
        BenchmarkId::new("read+correlate", "fetch responses 16 x 1MiB"),
        &responses,
        |b, stream| {
            b.iter(|| {
                let (n, acc) = rt.block_on(route_responses(black_box(stream), 12));
                assert_eq!(n, 16);
                acc
            })
        },
    );
    for (label, stream) in [
        ("requests 4096 x ~100B", &small),
        ("produce 256 x 16KiB", &produce),
        ("fetch responses 16 x 1MiB", &responses),
    ] {
        g.throughput(Throughput::Bytes(stream.len() as u64));
        let mut dst = vec![0u8; stream.len()];
        g.bench_function(BenchmarkId::new("memcpy", label), |b| {
            b.iter(|| {
                dst.copy_from_slice(black_box(stream));
                black_box(&dst);
            })
        });
    }
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

criterion_group! {
    name = frame;
    config = config();
    targets = benches
}
criterion_main!(frame);
