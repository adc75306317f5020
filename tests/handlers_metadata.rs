//! MetadataResponse v0-v13 address rewriting, checked against kafka-protocol.

mod handlers_common;

use handlers_common::*;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId, MetadataResponse, TopicName};
use mirrorguard::handlers::rewrite_metadata_response;

fn build(v: i16, adv: bool) -> MetadataResponse {
    let flex = v >= 9;
    let mut m = MetadataResponse::default();
    if v >= 3 {
        m.throttle_time_ms = 17;
    }
    m.brokers = UPSTREAM
        .iter()
        .map(|(id, h, p, rack)| {
            let (h, p) = addr(*id, h, *p, adv);
            let mut b = MetadataResponseBroker::default();
            b.node_id = BrokerId(*id);
            b.host = s(&h);
            b.port = p;
            if v >= 1 {
                b.rack = rack.map(s);
            }
            if flex {
                b.unknown_tagged_fields = tags(*id);
            }
            b
        })
        .collect();
    if v >= 2 {
        m.cluster_id = Some(s("cluster-Xyz_01"));
    }
    if v >= 1 {
        m.controller_id = BrokerId(2);
    }
    m.topics = (0..3)
        .map(|t| {
            let mut topic = MetadataResponseTopic::default();
            topic.error_code = if t == 2 { 3 } else { 0 };
            topic.name = Some(TopicName(s(&format!("topic-{t}"))));
            if v >= 10 {
                topic.topic_id = uuid_of([t as u8 + 1; 16]).topic_id;
            }
            if v >= 1 {
                topic.is_internal = t == 1;
            }
            if v >= 8 {
                topic.topic_authorized_operations = 0x0ff8;
            }
            topic.partitions = (0..4)
                .map(|p| {
                    let mut part = MetadataResponsePartition::default();
                    part.partition_index = p;
                    part.leader_id = BrokerId(UPSTREAM[p as usize % 4].0);
                    if v >= 7 {
                        part.leader_epoch = 5 + p;
                    }
                    part.replica_nodes = vec![BrokerId(1), BrokerId(2), BrokerId(1001)];
                    part.isr_nodes = vec![BrokerId(1), BrokerId(1001)];
                    if v >= 5 {
                        part.offline_replicas = vec![BrokerId(2)];
                    }
                    if flex {
                        part.unknown_tagged_fields = tags(p);
                    }
                    part
                })
                .collect();
            if flex {
                topic.unknown_tagged_fields = tags(t + 100);
            }
            topic
        })
        .collect();
    if (8..=10).contains(&v) {
        m.cluster_authorized_operations = 0x0ff0;
    }
    if v >= 13 {
        m.error_code = 0;
    }
    if flex {
        m.unknown_tagged_fields = tags(500);
    }
    m
}

#[test]
fn metadata_all_versions_rewrite_every_broker() {
    for v in 0..=13 {
        check_rewrite(
            "MetadataResponse",
            v,
            &build(v, false),
            &build(v, true),
            rewrite_metadata_response,
            &upstream_calls(),
            false,
        );
    }
}

#[test]
fn metadata_partial_mapping_rewrites_only_mapped_nodes() {
    let v = 12;
    let orig = build(v, false);
    let body = enc(&orig, v);
    let out = rewrite_metadata_response(v, &body, &mut |id, _, _| {
        (id == 1001).then(|| advertised(id))
    })
    .unwrap()
    .unwrap();
    let got: MetadataResponse = dec(&out, v);
    let mut expected = orig.clone();
    let (h, p) = advertised(1001);
    expected.brokers[2].host = s(&h);
    expected.brokers[2].port = p;
    assert_eq!(got, expected);
}

#[test]
fn metadata_empty_broker_list_and_unsupported_version() {
    let mut m = build(9, false);
    m.brokers.clear();
    let body = enc(&m, 9);
    assert!(
        rewrite_metadata_response(9, &body, &mut |id, _, _| Some(advertised(id)))
            .unwrap()
            .is_none()
    );
    assert!(rewrite_metadata_response(14, &body, &mut |_, _, _| None).is_err());
    assert!(rewrite_metadata_response(-1, &body, &mut |_, _, _| None).is_err());
}

#[test]
fn metadata_huge_broker_count_is_refused_before_allocation() {
    // throttle, then a classic array claiming i32::MAX brokers in 4 bytes.
    let body = [0, 0, 0, 0, 0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 1];
    let e = rewrite_metadata_response(3, &body, &mut |_, _, _| None).unwrap_err();
    assert!(e.to_string().contains("brokers"), "{e}");
    // Compact form: uvarint count of 2^32-1.
    let body = [0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f];
    assert!(rewrite_metadata_response(9, &body, &mut |_, _, _| None).is_err());
}
