//! Shared helpers for the handler tests: kafka-protocol encode/decode, a
//! fixed multi-node upstream cluster, the advertised addresses the proxy maps
//! it to, and a generic rewrite checker (rewrite → decode → compare, byte
//! identity when nothing changes, truncations never panic).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fmt::Debug;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::ProduceResponse;
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use mirrorguard::handlers::NodeMapper;
use mirrorguard::wire::WireResult;

/// Upstream brokers: (node id, host, port, rack).
pub const UPSTREAM: [(i32, &str, i32, Option<&str>); 4] = [
    (1, "kafka-1.upstream.internal", 9092, Some("rack-a")),
    (2, "kafka-2.upstream.internal", 9093, None),
    (1001, "b1001.eu-west-1.example.com", 19092, Some("rack-c")),
    (7, "10.0.0.7", 9094, Some("r")),
];

/// The address the proxy advertises for `node_id`.
pub fn advertised(node_id: i32) -> (String, i32) {
    (format!("mg-{node_id}.proxy.test"), 30000 + node_id)
}

/// Host/port as seen by the client: advertised when `adv`, else upstream.
pub fn addr(node_id: i32, host: &str, port: i32, adv: bool) -> (String, i32) {
    if adv {
        advertised(node_id)
    } else {
        (host.to_string(), port)
    }
}

/// Encodes with kafka-protocol.
pub fn enc<T: Encodable>(m: &T, v: i16) -> Vec<u8> {
    let mut b = BytesMut::new();
    m.encode(&mut b, v).expect("kafka-protocol encode");
    b.to_vec()
}

/// Decodes with kafka-protocol, requiring every byte to be consumed.
pub fn dec<T: Decodable>(b: &[u8], v: i16) -> T {
    let mut bb = Bytes::copy_from_slice(b);
    let m = T::decode(&mut bb, v).expect("kafka-protocol decode");
    assert!(bb.is_empty(), "{} trailing bytes after decode", bb.len());
    m
}

/// A `StrBytes` from a `&str`.
pub fn s(x: &str) -> StrBytes {
    StrBytes::from_string(x.to_string())
}

/// Two unknown tagged fields, distinct per `seed`.
pub fn tags(seed: i32) -> BTreeMap<i32, Bytes> {
    let mut m = BTreeMap::new();
    m.insert(40 + seed % 7, Bytes::from(vec![seed as u8, 0xAB]));
    m.insert(99, Bytes::from_static(b"unknown-tag-payload"));
    m
}

/// A kafka-protocol `Uuid` (the crate is not a direct dependency, so one is
/// obtained by decoding a ProduceResponse v13 carrying it).
pub fn uuid_of(b: [u8; 16]) -> kafka_protocol::messages::produce_response::TopicProduceResponse {
    let mut raw = vec![2u8];
    raw.extend_from_slice(&b);
    raw.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0]);
    let mut m: ProduceResponse = dec(&raw, 13);
    m.responses.remove(0)
}

/// A rewriter under test.
pub type RewriteFn = fn(i16, &[u8], &mut NodeMapper<'_>) -> WireResult<Option<Vec<u8>>>;

/// Checks one rewriter on one version:
/// - with the proxy mapping, the output decodes (kafka-protocol) to
///   `expected` and equals kafka-protocol's own encoding of it byte for byte;
/// - the mapper saw exactly `expect_calls` (upstream addresses, in order);
/// - a mapper returning `None`, or the same address, leaves it unchanged;
/// - no truncation panics, and (when `full_walk`) every strict prefix errors.
pub fn check_rewrite<T>(
    name: &str,
    v: i16,
    orig: &T,
    expected: &T,
    f: RewriteFn,
    expect_calls: &[(i32, String, i32)],
    full_walk: bool,
) where
    T: Encodable + Decodable + PartialEq + Debug,
{
    let body = enc(orig, v);
    let mut seen = Vec::new();
    let mut map = |id: i32, h: &str, p: i32| {
        seen.push((id, h.to_string(), p));
        Some(advertised(id))
    };
    let out = f(v, &body, &mut map)
        .unwrap_or_else(|e| panic!("{name} v{v}: rewrite failed: {e}"))
        .unwrap_or_else(|| panic!("{name} v{v}: expected a rewrite"));
    assert_eq!(seen, expect_calls, "{name} v{v}: mapper calls");
    let got: T = dec(&out, v);
    assert_eq!(&got, expected, "{name} v{v}: decoded rewrite");
    assert_eq!(out, enc(expected, v), "{name} v{v}: canonical bytes");

    // Nothing to change: byte identity (no output at all).
    let none = f(v, &body, &mut |_, _, _| None).expect("parse");
    assert!(none.is_none(), "{name} v{v}: None mapper changed bytes");
    let same = f(v, &body, &mut |_, h, p| Some((h.to_string(), p))).expect("parse");
    assert!(same.is_none(), "{name} v{v}: identity mapper changed bytes");
    // Already rewritten input stays as is.
    let again = f(v, &out, &mut |id, _, _| Some(advertised(id))).expect("parse");
    assert!(again.is_none(), "{name} v{v}: rewrite not idempotent");

    for cut in 0..body.len() {
        let r = f(v, &body[..cut], &mut |id, _, _| Some(advertised(id)));
        if full_walk {
            assert!(
                r.is_err(),
                "{name} v{v}: prefix {cut}/{} accepted",
                body.len()
            );
        }
    }
}

/// The mapper calls expected for `UPSTREAM` (all nodes, in order).
pub fn upstream_calls() -> Vec<(i32, String, i32)> {
    UPSTREAM
        .iter()
        .map(|(id, h, p, _)| (*id, h.to_string(), *p))
        .collect()
}
