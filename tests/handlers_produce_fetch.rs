//! ProduceResponse v3-v13 and FetchResponse v4-v18: KIP-951 NodeEndpoints
//! rewriting and the zero-copy Fetch partition visitor, checked against
//! kafka-protocol.

mod handlers_common;

use bytes::Bytes;
use handlers_common::*;
use kafka_protocol::messages::fetch_response::{
    AbortedTransaction, EpochEndOffset, FetchableTopicResponse, LeaderIdAndEpoch,
    NodeEndpoint as FetchNodeEndpoint, PartitionData,
};
use kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, LeaderIdAndEpoch as ProduceLeader,
    NodeEndpoint as ProduceNodeEndpoint, PartitionProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::{BrokerId, FetchResponse, ProduceResponse, ProducerId, TopicName};
use mirrorguard::handlers::{
    rewrite_fetch_response, rewrite_produce_response, walk_fetch_response, walk_produce_response,
    FetchTopic,
};

fn records(seed: u8, len: usize) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|i| seed.wrapping_mul(31).wrapping_add(i as u8))
            .collect::<Vec<u8>>(),
    )
}

fn build_fetch(v: i16, adv: bool, with_endpoints: bool) -> FetchResponse {
    let flex = v >= 12;
    let mut m = FetchResponse::default();
    m.throttle_time_ms = 11;
    if v >= 7 {
        m.error_code = 0;
        m.session_id = 12345;
    }
    m.responses = (0..2u8)
        .map(|t| {
            let mut topic = FetchableTopicResponse::default();
            if v >= 13 {
                topic.topic_id = uuid_of([0x10 + t; 16]).topic_id;
            } else {
                topic.topic = TopicName(s(&format!("orders-{t}")));
            }
            topic.partitions = (0..3i32)
                .map(|p| {
                    let mut d = PartitionData::default();
                    d.partition_index = p;
                    d.error_code = if p == 2 { 6 } else { 0 };
                    d.high_watermark = 1000 + i64::from(p);
                    d.last_stable_offset = 990 + i64::from(p);
                    if v >= 5 {
                        d.log_start_offset = 10 * i64::from(p);
                    }
                    d.aborted_transactions = match p {
                        0 => Some(
                            (0..2)
                                .map(|k| {
                                    let mut a = AbortedTransaction::default();
                                    a.producer_id = ProducerId(4000 + k + i64::from(t));
                                    a.first_offset = 500 + k;
                                    if flex {
                                        a.unknown_tagged_fields = tags(k as i32);
                                    }
                                    a
                                })
                                .collect(),
                        ),
                        1 => Some(vec![]),
                        _ => None,
                    };
                    if v >= 11 {
                        d.preferred_read_replica = BrokerId(if p == 1 { 2 } else { -1 });
                    }
                    d.records = match p {
                        0 => Some(records(t, 300)),
                        1 => Some(Bytes::new()),
                        _ => None,
                    };
                    if flex {
                        if p == 0 {
                            let mut l = LeaderIdAndEpoch::default();
                            l.leader_id = BrokerId(1001);
                            l.leader_epoch = 9;
                            d.current_leader = l;
                        }
                        if p == 1 {
                            let mut e = EpochEndOffset::default();
                            e.epoch = 3;
                            e.end_offset = 77;
                            d.diverging_epoch = e;
                        }
                        d.unknown_tagged_fields = tags(p + 10);
                    }
                    d
                })
                .collect();
            if flex {
                topic.unknown_tagged_fields = tags(i32::from(t) + 20);
            }
            topic
        })
        .collect();
    if v >= 16 && with_endpoints {
        m.node_endpoints = UPSTREAM
            .iter()
            .map(|(id, h, p, rack)| {
                let (h, p) = addr(*id, h, *p, adv);
                let mut e = FetchNodeEndpoint::default();
                e.node_id = BrokerId(*id);
                e.host = s(&h);
                e.port = p;
                e.rack = rack.map(s);
                e.unknown_tagged_fields = tags(*id);
                e
            })
            .collect();
    }
    if flex {
        m.unknown_tagged_fields = tags(300);
    }
    m
}

fn build_produce(v: i16, adv: bool, with_endpoints: bool) -> ProduceResponse {
    let flex = v >= 9;
    let mut m = ProduceResponse::default();
    m.responses = (0..2u8)
        .map(|t| {
            let mut topic = TopicProduceResponse::default();
            if v >= 13 {
                topic.topic_id = uuid_of([0x20 + t; 16]).topic_id;
            } else {
                topic.name = TopicName(s(&format!("payments-{t}")));
            }
            topic.partition_responses = (0..2i32)
                .map(|p| {
                    let mut r = PartitionProduceResponse::default();
                    r.index = p;
                    r.error_code = if p == 1 { 6 } else { 0 };
                    r.base_offset = 42 + i64::from(p);
                    if v >= 2 {
                        r.log_append_time_ms = 1_700_000_000_000;
                    }
                    if v >= 5 {
                        r.log_start_offset = 7;
                    }
                    if v >= 8 {
                        let mut e = BatchIndexAndErrorMessage::default();
                        e.batch_index = 3;
                        e.batch_index_error_message = Some(s("bad record"));
                        if flex {
                            e.unknown_tagged_fields = tags(1);
                        }
                        r.record_errors = vec![e];
                        r.error_message = (p == 1).then(|| s("NOT_LEADER_OR_FOLLOWER"));
                    }
                    if v >= 10 && p == 1 {
                        let mut l = ProduceLeader::default();
                        l.leader_id = BrokerId(1001);
                        l.leader_epoch = 4;
                        r.current_leader = l;
                    }
                    if flex {
                        r.unknown_tagged_fields = tags(p + 2);
                    }
                    r
                })
                .collect();
            if flex {
                topic.unknown_tagged_fields = tags(5);
            }
            topic
        })
        .collect();
    m.throttle_time_ms = 8;
    if v >= 10 && with_endpoints {
        m.node_endpoints = UPSTREAM
            .iter()
            .map(|(id, h, p, rack)| {
                let (h, p) = addr(*id, h, *p, adv);
                let mut e = ProduceNodeEndpoint::default();
                e.node_id = BrokerId(*id);
                e.host = s(&h);
                e.port = p;
                e.rack = rack.map(s);
                e
            })
            .collect();
    }
    if flex {
        m.unknown_tagged_fields = tags(6);
    }
    m
}

#[test]
fn fetch_node_endpoints_rewritten_v16_plus() {
    for v in 16..=18 {
        check_rewrite(
            "FetchResponse",
            v,
            &build_fetch(v, false, true),
            &build_fetch(v, true, true),
            rewrite_fetch_response,
            &upstream_calls(),
            true,
        );
    }
}

#[test]
fn fetch_without_endpoints_is_unchanged_all_versions() {
    for v in 4..=18 {
        let body = enc(&build_fetch(v, false, false), v);
        let r = rewrite_fetch_response(v, &body, &mut |id, _, _| Some(advertised(id))).unwrap();
        assert!(r.is_none(), "v{v}");
    }
}

#[test]
fn produce_node_endpoints_rewritten_v10_plus() {
    for v in 10..=13 {
        check_rewrite(
            "ProduceResponse",
            v,
            &build_produce(v, false, true),
            &build_produce(v, true, true),
            rewrite_produce_response,
            &upstream_calls(),
            true,
        );
    }
}

#[test]
fn produce_walker_all_versions_and_unchanged_without_endpoints() {
    for v in 3..=13 {
        let m = build_produce(v, false, false);
        let body = enc(&m, v);
        let info = walk_produce_response(v, &body).unwrap();
        assert_eq!(info.end, body.len(), "v{v}");
        assert_eq!(info.throttle_time_ms, 8, "v{v}");
        assert_eq!(info.tagged_fields.is_some(), v >= 9, "v{v}");
        let r = rewrite_produce_response(v, &body, &mut |id, _, _| Some(advertised(id))).unwrap();
        assert!(r.is_none(), "v{v}");
        for cut in 0..body.len() {
            assert!(
                walk_produce_response(v, &body[..cut]).is_err(),
                "v{v} cut {cut}"
            );
        }
    }
}

#[test]
fn fetch_visitor_sees_every_partition_zero_copy() {
    for v in 4..=18 {
        let m = build_fetch(v, false, true);
        let body = enc(&m, v);
        let mut seen = Vec::new();
        let info = walk_fetch_response(v, &body, &mut |p| seen.push(p.clone())).unwrap();
        assert_eq!(info.end, body.len(), "v{v}");
        assert_eq!(info.throttle_time_ms, 11);
        if v >= 7 {
            assert_eq!(info.session_id, 12345);
        }
        assert_eq!(info.tagged_fields.is_some(), v >= 12);
        if v >= 16 {
            assert!(
                info.tagged_fields.unwrap().find(0).is_some(),
                "NodeEndpoints tag"
            );
        }
        let expected: Vec<_> = m
            .responses
            .iter()
            .flat_map(|t| t.partitions.iter().map(move |p| (t, p)))
            .collect();
        assert_eq!(seen.len(), expected.len(), "v{v}");
        for (got, (t, p)) in seen.iter().zip(expected) {
            match got.topic {
                FetchTopic::Name(n) => {
                    assert!(v <= 12);
                    assert_eq!(n, t.topic.0.as_str());
                }
                FetchTopic::Id(id) => {
                    assert!(v >= 13);
                    assert_eq!(&id, t.topic_id.as_bytes());
                }
            }
            assert_eq!(got.partition_index, p.partition_index);
            assert_eq!(got.error_code, p.error_code);
            assert_eq!(got.high_watermark, p.high_watermark);
            assert_eq!(got.last_stable_offset, p.last_stable_offset);
            assert_eq!(got.log_start_offset, p.log_start_offset);
            assert_eq!(got.preferred_read_replica, p.preferred_read_replica.0);
            match (&got.records, &p.records) {
                (None, None) => {}
                (Some(r), Some(b)) => assert_eq!(&body[r.clone()], &b[..]),
                other => panic!("records mismatch {other:?}"),
            }
            match (&got.aborted_transactions, &p.aborted_transactions) {
                (None, None) => {}
                (Some(a), Some(b)) => {
                    let a: Vec<_> = a.iter().collect();
                    assert_eq!(a.len(), b.len());
                    for (x, y) in a.iter().zip(b) {
                        assert_eq!(x.producer_id, y.producer_id.0);
                        assert_eq!(x.first_offset, y.first_offset);
                        let at = x.producer_id_offset;
                        assert_eq!(&body[at..at + 8], &y.producer_id.0.to_be_bytes());
                    }
                }
                other => panic!("aborted mismatch v{v} {other:?}"),
            }
            if v >= 12 && p.partition_index == 0 {
                let tf = got.tagged_fields.unwrap();
                assert!(tf.find(1).is_some(), "CurrentLeader tag present");
            }
            assert!(got.span.start < got.span.end && got.span.end <= body.len());
        }
    }
}

#[test]
fn fetch_pids_patch_in_place_through_offsets() {
    let v = 16;
    let m = build_fetch(v, false, true);
    let mut body = enc(&m, v);
    let mut offsets = Vec::new();
    walk_fetch_response(v, &body, &mut |p| {
        if let Some(a) = &p.aborted_transactions {
            offsets.extend(a.iter().map(|t| t.producer_id_offset));
        }
    })
    .unwrap();
    assert_eq!(offsets.len(), 4);
    for at in offsets {
        body[at..at + 8].copy_from_slice(&(-77i64).to_be_bytes());
    }
    let got: FetchResponse = dec(&body, v);
    let mut expected = m;
    for t in &mut expected.responses {
        for p in &mut t.partitions {
            for a in p.aborted_transactions.iter_mut().flatten() {
                a.producer_id = ProducerId(-77);
            }
        }
    }
    assert_eq!(got, expected);
}

#[test]
fn fetch_truncations_error_and_old_versions_refused() {
    for v in [4i16, 11, 12, 13, 17] {
        let body = enc(&build_fetch(v, false, true), v);
        for cut in 0..body.len() {
            assert!(
                walk_fetch_response(v, &body[..cut], &mut |_| {}).is_err(),
                "v{v} {cut}"
            );
        }
    }
    assert!(walk_fetch_response(3, &[], &mut |_| {}).is_err());
    assert!(walk_fetch_response(19, &[], &mut |_| {}).is_err());
    assert!(rewrite_fetch_response(19, &[], &mut |_, _, _| None).is_err());
    assert!(rewrite_produce_response(14, &[], &mut |_, _, _| None).is_err());
}
