//! FetchRequest v4-v18 and ProduceRequest v3-v13 parsing, and the Produce
//! partition splitter, checked against kafka-protocol 0.18 as an independent
//! encoder/decoder; every truncation and random input must error, never
//! panic.

mod handlers_common;

use bytes::Bytes;
use handlers_common::*;
use kafka_protocol::messages::fetch_request::{
    FetchPartition as KFetchPartition, FetchTopic as KFetchTopic, ForgottenTopic, ReplicaState,
};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{BrokerId, FetchRequest, ProduceRequest, TopicName};
use mirrorguard::handlers::{
    parse_fetch_request, parse_produce_request, rewrite_fetch_request, split_fetch_request,
    split_produce_request, FetchTopic,
};
use proptest::prelude::*;

fn topic_uuid(t: u8) -> [u8; 16] {
    [0x30 + t, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, t]
}

fn fetch_request(v: i16, follower: bool) -> FetchRequest {
    let flex = v >= 12;
    let mut m = FetchRequest::default();
    if v <= 14 {
        m.replica_id = BrokerId(if follower { 3 } else { -1 });
    } else if follower {
        let mut rs = ReplicaState::default();
        rs.replica_id = BrokerId(3);
        rs.replica_epoch = 77;
        m.replica_state = rs;
    }
    m.max_wait_ms = 500;
    m.min_bytes = 1;
    m.max_bytes = 52_428_800;
    m.isolation_level = 1;
    if v >= 7 {
        m.session_id = 99;
        m.session_epoch = 4;
    }
    m.topics = (0..3u8)
        .map(|t| {
            let mut topic = KFetchTopic::default();
            if v >= 13 {
                topic.topic_id = uuid_of(topic_uuid(t)).topic_id;
            } else {
                topic.topic = TopicName(s(&format!("orders-{t}")));
            }
            topic.partitions = (0..i32::from(t) + 1)
                .map(|p| {
                    let mut d = KFetchPartition::default();
                    d.partition = p * 2 + 1;
                    if v >= 9 {
                        d.current_leader_epoch = 5 + p;
                    }
                    d.fetch_offset = 1_000_000 + i64::from(p) * 17 + i64::from(t);
                    if v >= 12 {
                        d.last_fetched_epoch = 4;
                    }
                    if v >= 5 {
                        d.log_start_offset = 33 + i64::from(p);
                    }
                    d.partition_max_bytes = 1_048_576;
                    if v >= 17 && p == 0 {
                        d.replica_directory_id = uuid_of([0xdd; 16]).topic_id;
                    }
                    if v >= 18 && p == 1 {
                        d.high_watermark = 12345;
                    }
                    if flex {
                        d.unknown_tagged_fields = tags(p + 3);
                    }
                    d
                })
                .collect();
            if flex {
                topic.unknown_tagged_fields = tags(i32::from(t));
            }
            topic
        })
        .collect();
    if v >= 7 {
        m.forgotten_topics_data = (0..2u8)
            .map(|t| {
                let mut f = ForgottenTopic::default();
                if v >= 13 {
                    f.topic_id = uuid_of(topic_uuid(9 + t)).topic_id;
                } else {
                    f.topic = TopicName(s(&format!("gone-{t}")));
                }
                f.partitions = vec![0, 1, 2];
                f
            })
            .collect();
    }
    if v >= 11 {
        m.rack_id = s("rack-b");
    }
    if flex {
        m.cluster_id = Some(s("dest-cluster"));
        m.unknown_tagged_fields = tags(50);
    }
    m
}

#[test]
fn fetch_request_all_versions() {
    for v in 4..=18i16 {
        for follower in [true, false] {
            let m = fetch_request(v, follower);
            let body = enc(&m, v);
            let info = parse_fetch_request(v, &body).unwrap_or_else(|e| panic!("v{v}: {e}"));
            assert_eq!(info.end, body.len(), "v{v}");
            let expect_replica = if follower { 3 } else { -1 };
            assert_eq!(info.replica_id, expect_replica, "v{v}");
            assert_eq!(info.is_follower(), follower, "v{v}");
            assert_eq!(
                info.replica_epoch,
                if v >= 15 && follower { 77 } else { -1 },
                "v{v}"
            );
            assert_eq!(info.max_wait_ms, m.max_wait_ms);
            assert_eq!(info.min_bytes, m.min_bytes);
            assert_eq!(info.max_bytes, m.max_bytes);
            assert_eq!(info.isolation_level, m.isolation_level);
            if v >= 7 {
                assert_eq!(info.session_id, 99);
                assert_eq!(info.session_epoch, 4);
                assert_eq!(info.forgotten_topics, 2);
            } else {
                assert_eq!((info.session_id, info.session_epoch), (0, -1));
                assert_eq!(info.forgotten_topics, 0);
            }
            assert_eq!(info.rack_id, m.rack_id.as_str());
            assert_eq!(info.cluster_id, m.cluster_id.as_ref().map(|c| c.as_str()));
            assert_eq!(info.topics.len(), m.topics.len());
            assert_eq!(info.partition_count(), 6);
            for (got, want) in info.topics.iter().zip(&m.topics) {
                if v >= 13 {
                    assert_eq!(got.topic, FetchTopic::Id(*want.topic_id.as_bytes()));
                } else {
                    assert_eq!(got.topic, FetchTopic::Name(want.topic.0.as_str()));
                }
                assert_eq!(got.partitions.len(), want.partitions.len());
                for (gp, wp) in got.partitions.iter().zip(&want.partitions) {
                    assert_eq!(gp.partition, wp.partition);
                    assert_eq!(gp.current_leader_epoch, wp.current_leader_epoch);
                    assert_eq!(gp.fetch_offset, wp.fetch_offset);
                    assert_eq!(gp.last_fetched_epoch, wp.last_fetched_epoch);
                    assert_eq!(gp.log_start_offset, wp.log_start_offset);
                    assert_eq!(gp.partition_max_bytes, wp.partition_max_bytes);
                    // The span is exactly the partition's own encoding.
                    assert_eq!(&body[gp.span.clone()], &enc(wp, v)[..], "v{v} span");
                }
            }
            for cut in 0..body.len() {
                assert!(
                    parse_fetch_request(v, &body[..cut]).is_err(),
                    "v{v}: prefix {cut}/{} accepted",
                    body.len()
                );
            }
        }
    }
}

#[test]
fn fetch_request_split_all_versions() {
    // Topics have 1, 2 and 3 partitions (indices 1, 3, 5); keep by a bit
    // pattern over the 6 entries in wire order.
    let patterns: [u8; 6] = [0b111_111, 0, 0b000_001, 0b110_110, 0b111_000, 0b010_101];
    for v in 4..=18i16 {
        for follower in [true, false] {
            let m = fetch_request(v, follower);
            let body = enc(&m, v);
            for &pat in &patterns {
                let mut i = 0;
                let out = split_fetch_request(v, &body, &mut |_, _| {
                    i += 1;
                    pat >> (i - 1) & 1 == 1
                })
                .unwrap_or_else(|e| panic!("v{v}: {e}"));
                assert_eq!(i, 6);
                if pat == 0b111_111 {
                    assert!(out.is_none());
                    continue;
                }
                let out = out.expect("split");
                let mut expected = m.clone();
                let mut k = 0;
                expected.topics = m
                    .topics
                    .iter()
                    .filter_map(|t| {
                        let mut t = t.clone();
                        t.partitions.retain(|_| {
                            k += 1;
                            pat >> (k - 1) & 1 == 1
                        });
                        (!t.partitions.is_empty()).then_some(t)
                    })
                    .collect();
                let got: FetchRequest = dec(&out, v);
                assert_eq!(got, expected, "v{v} pattern {pat:#b}");
                assert_eq!(out, enc(&expected, v), "v{v} pattern {pat:#b} bytes");
            }
        }
    }
}

#[test]
fn fetch_request_defaults_and_bad_versions() {
    // An empty v4 request: kafka-protocol's defaults.
    let m = FetchRequest::default();
    for v in 4..=18i16 {
        let body = enc(&m, v);
        let info = parse_fetch_request(v, &body).expect("parse");
        assert!(info.topics.is_empty());
        assert_eq!(info.replica_id, -1);
    }
    for v in [-1i16, 0, 3, 19, i16::MAX] {
        assert!(parse_fetch_request(v, &[0; 64]).is_err());
    }
}

#[test]
fn fetch_request_huge_counts_refused_without_allocation() {
    // topics count i32::MAX in v4 and a compact count near u32::MAX in v12.
    let mut b = vec![0u8; 17];
    b.extend_from_slice(&i32::MAX.to_be_bytes());
    assert!(parse_fetch_request(4, &b).is_err());
    let mut b = vec![0u8; 25];
    b.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]);
    assert!(parse_fetch_request(12, &b).is_err());
}

fn produce_request(v: i16, txn: bool) -> ProduceRequest {
    let flex = v >= 9;
    let mut m = ProduceRequest::default();
    m.transactional_id = txn.then(|| s("txn-1").into());
    m.acks = -1;
    m.timeout_ms = 30_000;
    m.topic_data = (0..3u8)
        .map(|t| {
            let mut topic = TopicProduceData::default();
            if v >= 13 {
                topic.topic_id = uuid_of(topic_uuid(t)).topic_id;
            } else {
                topic.name = TopicName(s(&format!("payments-{t}")));
            }
            topic.partition_data = (0..3i32)
                .map(|p| {
                    let mut d = PartitionProduceData::default();
                    d.index = p;
                    d.records = match (t, p) {
                        (1, 2) => None,
                        (2, 0) => Some(Bytes::new()),
                        _ => Some(Bytes::from(
                            (0..(50 + 7 * p as usize + t as usize))
                                .map(|i| (i as u8) ^ t)
                                .collect::<Vec<u8>>(),
                        )),
                    };
                    if flex {
                        d.unknown_tagged_fields = tags(p);
                    }
                    d
                })
                .collect();
            if flex {
                topic.unknown_tagged_fields = tags(i32::from(t) + 5);
            }
            topic
        })
        .collect();
    if flex {
        m.unknown_tagged_fields = tags(9);
    }
    m
}

fn produce_topic_of(v: i16, t: &TopicProduceData) -> String {
    if v >= 13 {
        format!("{:?}", t.topic_id.as_bytes())
    } else {
        t.name.0.to_string()
    }
}

fn topic_key(t: &FetchTopic<'_>) -> String {
    match t {
        FetchTopic::Name(n) => n.to_string(),
        FetchTopic::Id(id) => format!("{id:?}"),
    }
}

#[test]
fn produce_request_all_versions() {
    for v in 3..=13i16 {
        for txn in [true, false] {
            let m = produce_request(v, txn);
            let body = enc(&m, v);
            let info = parse_produce_request(v, &body).unwrap_or_else(|e| panic!("v{v}: {e}"));
            assert_eq!(info.end, body.len());
            assert_eq!(
                info.transactional_id,
                m.transactional_id.as_ref().map(|t| t.0.as_str())
            );
            assert_eq!(info.acks, -1);
            assert_eq!(info.timeout_ms, 30_000);
            assert_eq!(info.partition_count(), 9);
            for (got, want) in info.topics.iter().zip(&m.topic_data) {
                assert_eq!(topic_key(&got.topic), produce_topic_of(v, want));
                assert_eq!(&body[got.span.clone()], &enc(want, v)[..]);
                for (gp, wp) in got.partitions.iter().zip(&want.partition_data) {
                    assert_eq!(gp.index, wp.index);
                    assert_eq!(
                        gp.records.clone().map(|r| &body[r]),
                        wp.records.as_deref(),
                        "v{v} records"
                    );
                    assert_eq!(&body[gp.span.clone()], &enc(wp, v)[..]);
                }
            }
            for cut in 0..body.len() {
                assert!(
                    parse_produce_request(v, &body[..cut]).is_err(),
                    "v{v} {cut}"
                );
            }
        }
    }
    for v in [-1i16, 0, 2, 14] {
        assert!(parse_produce_request(v, &[0; 64]).is_err());
    }
}

#[test]
fn produce_request_split_all_versions() {
    // Patterns over the 9 partitions (bit = kept), topic by topic.
    let patterns: [u16; 6] = [
        0b111_111_111,
        0,
        0b000_000_111,
        0b101_000_010,
        0b111_000_000,
        0b011_110_001,
    ];
    for v in 3..=13i16 {
        let m = produce_request(v, true);
        let body = enc(&m, v);
        for &pat in &patterns {
            let mut seen = Vec::new();
            let out = split_produce_request(v, &body, &mut |t, p| {
                let ti = seen.len() / 3;
                seen.push((topic_key(t), p));
                pat >> (ti * 3 + p as usize) & 1 == 1
            })
            .unwrap_or_else(|e| panic!("v{v}: {e}"));
            assert_eq!(seen.len(), 9);
            if pat == 0b111_111_111 {
                assert!(out.is_none(), "v{v}: all kept must be None");
                continue;
            }
            let out = out.expect("split");
            let mut expected = m.clone();
            expected.topic_data = m
                .topic_data
                .iter()
                .enumerate()
                .filter_map(|(ti, t)| {
                    let mut t = t.clone();
                    t.partition_data
                        .retain(|p| pat >> (ti * 3 + p.index as usize) & 1 == 1);
                    (!t.partition_data.is_empty()).then_some(t)
                })
                .collect();
            let got: ProduceRequest = dec(&out, v);
            assert_eq!(got, expected, "v{v} pattern {pat:#b}");
            assert_eq!(out, enc(&expected, v), "v{v} pattern {pat:#b} bytes");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..200)) {
        for v in -1..=20 {
            let _ = parse_fetch_request(v, &b);
            let _ = parse_produce_request(v, &b);
            let _ = split_produce_request(v, &b, &mut |_, p| p % 2 == 0);
            let _ = split_fetch_request(v, &b, &mut |_, p| p % 2 == 0);
        }
    }

    #[test]
    fn mutated_valid_requests_never_panic(
        v in 3i16..=18,
        idx in any::<usize>(),
        byte in any::<u8>(),
        cut in any::<usize>(),
    ) {
        let mut bodies = Vec::new();
        if v >= 4 {
            bodies.push(enc(&fetch_request(v, true), v));
        }
        if v <= 13 {
            bodies.push(enc(&produce_request(v, true), v));
        }
        for mut b in bodies {
            let i = idx % b.len();
            b[i] = byte;
            b.truncate(cut % (b.len() + 1));
            let _ = parse_fetch_request(v, &b);
            let _ = parse_produce_request(v, &b);
            if let Ok(Some(out)) = split_fetch_request(v, &b, &mut |_, p| p != 1) {
                let info = parse_fetch_request(v, &out).expect("split output parses");
                prop_assert!(info.topics.iter().all(|t| t.partitions.iter().all(|p| p.partition != 1)));
            }
            if let Ok(Some(out)) = split_produce_request(v, &b, &mut |_, p| p != 1) {
                // A split output is itself a valid request with no partition 1.
                let info = parse_produce_request(v, &out).expect("split output parses");
                prop_assert!(info.topics.iter().all(|t| t.partitions.iter().all(|p| p.index != 1)));
            }
        }
    }
}

/// The request forwarded in a fetch session: controlled partitions dropped,
/// added to `forgotten_topics_data` (after the fetcher's own entries),
/// `max_wait_ms` set; kafka-protocol decodes exactly that.
#[test]
fn rewrite_fetch_request_forgets_partitions_all_versions() {
    for v in 7..=18i16 {
        let mut orig = fetch_request(v, false);
        let mut own = ForgottenTopic::default();
        if v >= 13 {
            own.topic_id = uuid_of(topic_uuid(9)).topic_id;
        } else {
            own.topic = TopicName(s("gone"));
        }
        own.partitions = vec![4];
        orig.forgotten_topics_data = vec![own];
        let body = enc(&orig, v);
        let t1 = if v >= 13 {
            FetchTopic::Id(topic_uuid(1))
        } else {
            FetchTopic::Name("orders-1")
        };
        let forget_topic = if v >= 13 {
            FetchTopic::Id(topic_uuid(7))
        } else {
            FetchTopic::Name("stopped")
        };
        // Drop orders-1/p1 (listed and controlled); forget it and stopped/0,2.
        let out = rewrite_fetch_request(
            v,
            &body,
            &mut |t, p| !(*t == t1 && p == 1),
            &[(t1, vec![1]), (forget_topic, vec![0, 2])],
            Some(0),
        )
        .unwrap();
        let mut want = orig.clone();
        want.max_wait_ms = 0;
        want.topics[1].partitions.retain(|p| p.partition != 1);
        for (t, ps) in [(1u8, vec![1]), (7u8, vec![0, 2])] {
            let mut f = ForgottenTopic::default();
            if v >= 13 {
                f.topic_id = uuid_of(topic_uuid(t)).topic_id;
            } else {
                f.topic = TopicName(s(if t == 1 { "orders-1" } else { "stopped" }));
            }
            f.partitions = ps;
            want.forgotten_topics_data.push(f);
        }
        assert_eq!(dec::<FetchRequest>(&out, v), want, "v{v}");
        assert_eq!(parse_fetch_request(v, &out).unwrap().forgotten_topics, 3);
        // Nothing to change: byte-identical.
        let same = rewrite_fetch_request(v, &body, &mut |_, _| true, &[], None).unwrap();
        assert_eq!(same, body, "v{v}");
    }
}
