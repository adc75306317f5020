//! Property tests: the wire primitives round-trip, and no rewriter panics on
//! random bytes or on mutated (truncated, bit-flipped, spliced) valid
//! encodings of every message it handles.

mod handlers_common;

use handlers_common::*;
use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::fetch_response::{
    AbortedTransaction, FetchableTopicResponse, NodeEndpoint, PartitionData,
};
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::metadata_response::MetadataResponseBroker;
use kafka_protocol::messages::{
    ApiVersionsResponse, BrokerId, DescribeClusterResponse, FetchResponse, FindCoordinatorResponse,
    MetadataResponse, ProducerId, TopicName,
};
use mirrorguard::handlers::*;
use mirrorguard::wire::{Reader, Writer};
use proptest::prelude::*;

fn map(id: i32, _: &str, _: i32) -> Option<(String, i32)> {
    Some(advertised(id))
}

/// Runs every parser of this crate over `b` at every version; must not panic.
fn run_all(b: &[u8]) {
    for v in -1..=20 {
        let _ = rewrite_metadata_response(v, b, &mut map);
        let _ = rewrite_find_coordinator_response(v, b, &mut map);
        let _ = rewrite_describe_cluster_response(v, b, &mut map);
        let _ = rewrite_produce_response(v, b, &mut map);
        let _ = rewrite_fetch_response(v, b, &mut map);
        let _ = walk_fetch_response(v, b, &mut |p| {
            if let Some(a) = &p.aborted_transactions {
                for t in a.iter() {
                    assert!(t.producer_id_offset + 8 <= b.len());
                }
            }
            if let Some(r) = &p.records {
                assert!(r.end <= b.len());
            }
        });
        let _ = clamp_api_versions_response(v, b, &clamp_table());
    }
}

/// Valid encodings of each handled message: (rewriter index, version, bytes).
fn corpus() -> Vec<(usize, i16, Vec<u8>)> {
    let mut out = Vec::new();
    for v in [0i16, 1, 9, 12, 13] {
        let mut m = MetadataResponse::default();
        m.brokers = UPSTREAM
            .iter()
            .map(|(id, h, p, r)| {
                let mut b = MetadataResponseBroker::default();
                b.node_id = BrokerId(*id);
                b.host = s(h);
                b.port = *p;
                if v >= 1 {
                    b.rack = r.map(s);
                }
                b
            })
            .collect();
        out.push((0, v, enc(&m, v)));
    }
    for v in [0i16, 3, 4, 6] {
        let mut m = FindCoordinatorResponse::default();
        if v <= 3 {
            m.node_id = BrokerId(1);
            m.host = s("h");
            m.port = 1;
        } else {
            let mut c = Coordinator::default();
            c.key = s("g");
            c.node_id = BrokerId(2);
            c.host = s("host-2");
            c.port = 2;
            m.coordinators = vec![c.clone(), c];
        }
        out.push((1, v, enc(&m, v)));
    }
    for v in 0i16..=2 {
        let mut m = DescribeClusterResponse::default();
        m.cluster_id = s("c");
        let mut b = DescribeClusterBroker::default();
        b.broker_id = BrokerId(3);
        b.host = s("host-3");
        b.port = 3;
        m.brokers = vec![b.clone(), b];
        out.push((2, v, enc(&m, v)));
    }
    for v in [4i16, 12, 16, 18] {
        let mut m = FetchResponse::default();
        let mut t = FetchableTopicResponse::default();
        t.topic = TopicName(s("t"));
        let mut p = PartitionData::default();
        let mut a = AbortedTransaction::default();
        a.producer_id = ProducerId(5);
        p.aborted_transactions = Some(vec![a]);
        p.records = Some(bytes::Bytes::from_static(&[1, 2, 3, 4, 5, 6, 7, 8]));
        t.partitions = vec![p.clone(), p];
        m.responses = vec![t];
        if v >= 16 {
            let mut e = NodeEndpoint::default();
            e.node_id = BrokerId(1);
            e.host = s("h1");
            e.port = 9;
            m.node_endpoints = vec![e];
        }
        out.push((3, v, enc(&m, v)));
    }
    for v in [0i16, 3] {
        let mut m = ApiVersionsResponse::default();
        let mut a = kafka_protocol::messages::api_versions_response::ApiVersion::default();
        a.api_key = 1;
        a.max_version = 19;
        m.api_keys = vec![a];
        out.push((4, v, enc(&m, v)));
    }
    out
}

fn run_one(which: usize, v: i16, b: &[u8]) {
    let r = match which {
        0 => rewrite_metadata_response(v, b, &mut map),
        1 => rewrite_find_coordinator_response(v, b, &mut map),
        2 => rewrite_describe_cluster_response(v, b, &mut map),
        3 => rewrite_fetch_response(v, b, &mut map),
        _ => clamp_api_versions_response(v, b, &clamp_table()),
    };
    // Whatever a rewriter emits must itself parse, and be a fixed point.
    if let Ok(Some(out)) = r {
        let again = match which {
            0 => rewrite_metadata_response(v, &out, &mut map),
            1 => rewrite_find_coordinator_response(v, &out, &mut map),
            2 => rewrite_describe_cluster_response(v, &out, &mut map),
            3 => rewrite_fetch_response(v, &out, &mut map),
            _ => clamp_api_versions_response(v, &out, &clamp_table()),
        };
        assert_eq!(again.expect("rewritten output parses"), None);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..200)) {
        run_all(&b);
    }

    #[test]
    fn mutated_valid_encodings_never_panic(
        pick in any::<prop::sample::Index>(),
        cut in any::<prop::sample::Index>(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        insert in proptest::collection::vec(any::<u8>(), 0..6),
        at in any::<prop::sample::Index>(),
    ) {
        let c = corpus();
        let (which, v, orig) = &c[pick.index(c.len())];
        // Truncation.
        run_one(*which, *v, &orig[..cut.index(orig.len() + 1)]);
        // Byte flips.
        let mut m = orig.clone();
        for (i, x) in &flips {
            let i = i.index(m.len());
            m[i] ^= *x;
        }
        run_one(*which, *v, &m);
        // Insertion.
        let mut m = orig.clone();
        let i = at.index(m.len() + 1);
        m.splice(i..i, insert.iter().copied());
        run_one(*which, *v, &m);
        run_all(&m);
    }

    #[test]
    fn primitives_round_trip(
        a in any::<i8>(), b in any::<i16>(), c in any::<i32>(), d in any::<i64>(),
        u in any::<u32>(), z in any::<i32>(), zl in any::<i64>(), ul in any::<u64>(),
        st in "[a-z0-9.-]{0,40}", ns in proptest::option::of("[ -~]{0,20}"),
        by in proptest::collection::vec(any::<u8>(), 0..50),
        id in any::<[u8; 16]>(),
    ) {
        let mut w = Writer::new(Vec::new());
        w.put_i8(a); w.put_i16(b); w.put_i32(c); w.put_i64(d);
        w.put_uvarint(u); w.put_varint(z); w.put_varlong(zl); w.put_uvarlong(ul);
        w.put_string(&st, "s").unwrap();
        w.put_nullable_string(ns.as_deref(), "ns").unwrap();
        w.put_compact_string(&st, "cs").unwrap();
        w.put_compact_nullable_string(ns.as_deref(), "cns").unwrap();
        w.put_bytes(&by, "b").unwrap();
        w.put_compact_nullable_bytes(Some(&by), "cb").unwrap();
        w.put_compact_nullable_bytes(None, "cbn").unwrap();
        w.put_uuid(&id);
        w.put_array_len(None, "a").unwrap();
        w.put_compact_array_len(Some(0), "ca").unwrap();
        w.put_tagged_fields(&[(0, &by[..]), (7, b"x")], "t").unwrap();
        let buf = w.into_inner();
        let mut r = Reader::new(&buf);
        prop_assert_eq!(r.read_i8("a").unwrap(), a);
        prop_assert_eq!(r.read_i16("b").unwrap(), b);
        prop_assert_eq!(r.read_i32("c").unwrap(), c);
        prop_assert_eq!(r.read_i64("d").unwrap(), d);
        prop_assert_eq!(r.read_uvarint("u").unwrap(), u);
        prop_assert_eq!(r.read_varint("z").unwrap(), z);
        prop_assert_eq!(r.read_varlong("zl").unwrap(), zl);
        prop_assert_eq!(r.read_uvarlong("ul").unwrap(), ul);
        prop_assert_eq!(r.read_string("s").unwrap(), st.as_str());
        prop_assert_eq!(r.read_nullable_string("ns").unwrap(), ns.as_deref());
        prop_assert_eq!(r.read_compact_string("cs").unwrap(), st.as_str());
        prop_assert_eq!(r.read_compact_nullable_string("cns").unwrap(), ns.as_deref());
        prop_assert_eq!(r.read_bytes("b").unwrap(), &by[..]);
        prop_assert_eq!(r.read_compact_nullable_bytes("cb").unwrap(), Some(&by[..]));
        prop_assert_eq!(r.read_compact_nullable_bytes("cbn").unwrap(), None);
        prop_assert_eq!(r.read_uuid("id").unwrap(), id);
        prop_assert_eq!(r.read_array_len(1, "a").unwrap(), None);
        prop_assert_eq!(r.read_compact_array_len(1, "ca").unwrap(), Some(0));
        let t = r.read_tagged_fields("t").unwrap();
        let f: Vec<_> = t.iter().map(|f| (f.tag, f.data.to_vec())).collect();
        prop_assert_eq!(f, vec![(0, by.clone()), (7, b"x".to_vec())]);
        prop_assert!(r.is_empty());
        // Every strict prefix fails somewhere, and never panics.
        for cut in 0..buf.len() {
            let mut r = Reader::new(&buf[..cut]);
            let ok = r.read_i8("a").is_ok() && r.read_i16("b").is_ok() && r.read_i32("c").is_ok()
                && r.read_i64("d").is_ok() && r.read_uvarint("u").is_ok()
                && r.read_varint("z").is_ok() && r.read_varlong("zl").is_ok()
                && r.read_uvarlong("ul").is_ok() && r.read_string("s").is_ok()
                && r.read_nullable_string("ns").is_ok() && r.read_compact_string("cs").is_ok()
                && r.read_compact_nullable_string("cns").is_ok() && r.read_bytes("b").is_ok()
                && r.read_compact_nullable_bytes("cb").is_ok()
                && r.read_compact_nullable_bytes("cbn").is_ok() && r.read_uuid("id").is_ok()
                && r.read_array_len(1, "a").is_ok() && r.read_compact_array_len(1, "ca").is_ok()
                && r.read_tagged_fields("t").is_ok();
            prop_assert!(!ok, "prefix {} parsed", cut);
        }
    }
}

#[test]
fn varint_edge_cases() {
    // Known encodings.
    let mut w = Writer::new(Vec::new());
    w.put_uvarint(300);
    assert_eq!(w.into_inner(), vec![0xac, 0x02]);
    assert_eq!(
        Reader::new(&[0xff, 0xff, 0xff, 0xff, 0x0f]).read_uvarint("x"),
        Ok(u32::MAX)
    );
    // A sixth byte or overflowing fifth byte is malformed, not wrapped.
    assert!(Reader::new(&[0xff, 0xff, 0xff, 0xff, 0x1f])
        .read_uvarint("x")
        .is_err());
    assert!(Reader::new(&[0x80, 0x80, 0x80, 0x80, 0x80, 0x00])
        .read_uvarint("x")
        .is_err());
    assert!(Reader::new(&[0x80]).read_uvarint("x").is_err());
    // Lengths larger than what is present are refused with context.
    let e = Reader::new(&[0x7f, 0xff, b'a'])
        .read_string("Foo.bar")
        .unwrap_err();
    assert!(e.to_string().contains("Foo.bar"), "{e}");
    assert!(Reader::new(&[0xff, 0xfe])
        .read_nullable_string("x")
        .is_err());
    assert!(Reader::new(&[0x80, 0, 0, 0])
        .read_array_len(1, "x")
        .is_err());
    assert!(Reader::new(&[0, 0, 0, 3, 1, 2, 3])
        .read_array_len(2, "x")
        .is_err());
    assert_eq!(
        Reader::new(&[0, 0, 0, 3, 1, 2, 3]).read_array_len(1, "x"),
        Ok(Some(3))
    );
    // A null where a value is required is an error that consumes nothing
    // (found by the wire_request_header fuzz target).
    let mut r = Reader::new(&[0x00, 0x0a]);
    assert!(r.read_compact_string("x").is_err());
    assert_eq!(r.position(), 0);
    let mut r = Reader::new(&[0xff, 0xff, 0xff, 0xff]);
    assert!(r.read_bytes("x").is_err());
    assert_eq!(r.position(), 0);
    // Invalid UTF-8.
    assert!(Reader::new(&[2, 0xff]).read_compact_string("x").is_err());
    // Tagged section claiming more fields than bytes.
    assert!(Reader::new(&[0x7f, 0, 0]).read_tagged_fields("x").is_err());
    // Writer refuses strings too long for the classic encoding.
    let long = "x".repeat(40000);
    assert!(Writer::new(Vec::new()).put_string(&long, "x").is_err());
    assert!(Writer::new(Vec::new())
        .put_compact_string(&long, "x")
        .is_err());
}
