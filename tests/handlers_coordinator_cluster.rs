//! FindCoordinatorResponse v0-v6 and DescribeClusterResponse v0-v2 address
//! rewriting, checked against kafka-protocol.

mod handlers_common;

use handlers_common::*;
use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{BrokerId, DescribeClusterResponse, FindCoordinatorResponse};
use mirrorguard::handlers::{rewrite_describe_cluster_response, rewrite_find_coordinator_response};

fn build_fc(v: i16, adv: bool, node: usize) -> FindCoordinatorResponse {
    let mut m = FindCoordinatorResponse::default();
    if v >= 1 {
        m.throttle_time_ms = 3;
    }
    if v <= 3 {
        let (id, h, p, _) = UPSTREAM[node];
        let (h, p) = addr(id, h, p, adv);
        m.error_code = 0;
        if v >= 1 {
            m.error_message = Some(s("ok"));
        }
        m.node_id = BrokerId(id);
        m.host = s(&h);
        m.port = p;
    } else {
        m.coordinators = UPSTREAM
            .iter()
            .enumerate()
            .map(|(i, (id, h, p, _))| {
                let (h, p) = addr(*id, h, *p, adv);
                let mut c = Coordinator::default();
                c.key = s(&format!("group-{i}"));
                c.node_id = BrokerId(*id);
                c.host = s(&h);
                c.port = p;
                c.error_message = if i == 1 { Some(s("msg")) } else { None };
                c.unknown_tagged_fields = tags(i as i32);
                c
            })
            .collect();
        // A failed lookup: node -1, empty host, port -1. Never rewritten.
        let mut c = Coordinator::default();
        c.key = s("txn-unknown");
        c.node_id = BrokerId(-1);
        c.host = s("");
        c.port = -1;
        c.error_code = 15;
        c.error_message = Some(s("COORDINATOR_NOT_AVAILABLE"));
        m.coordinators.push(c);
    }
    if v >= 3 {
        m.unknown_tagged_fields = tags(77);
    }
    m
}

#[test]
fn find_coordinator_all_versions() {
    for v in 0..=6 {
        let calls = if v <= 3 {
            let (id, h, p, _) = UPSTREAM[2];
            vec![(id, h.to_string(), p)]
        } else {
            upstream_calls()
        };
        check_rewrite(
            "FindCoordinatorResponse",
            v,
            &build_fc(v, false, 2),
            &build_fc(v, true, 2),
            rewrite_find_coordinator_response,
            &calls,
            true,
        );
    }
}

#[test]
fn find_coordinator_error_response_is_left_alone() {
    for v in 0..=3 {
        let mut m = build_fc(v, false, 0);
        m.error_code = 15;
        m.node_id = BrokerId(-1);
        m.host = s("");
        m.port = -1;
        let body = enc(&m, v);
        let mut called = false;
        let r = rewrite_find_coordinator_response(v, &body, &mut |_, _, _| {
            called = true;
            Some(("x".into(), 1))
        })
        .unwrap();
        assert!(r.is_none() && !called, "v{v}");
    }
}

fn build_dc(v: i16, adv: bool) -> DescribeClusterResponse {
    let mut m = DescribeClusterResponse::default();
    m.throttle_time_ms = 9;
    m.error_message = Some(s("none"));
    if v >= 1 {
        m.endpoint_type = 1;
    }
    m.cluster_id = s("cluster-abc");
    m.controller_id = BrokerId(1001);
    m.brokers = UPSTREAM
        .iter()
        .map(|(id, h, p, rack)| {
            let (h, p) = addr(*id, h, *p, adv);
            let mut b = DescribeClusterBroker::default();
            b.broker_id = BrokerId(*id);
            b.host = s(&h);
            b.port = p;
            b.rack = rack.map(s);
            if v >= 2 {
                b.is_fenced = *id == 7;
            }
            b.unknown_tagged_fields = tags(*id);
            b
        })
        .collect();
    m.cluster_authorized_operations = 0x1234;
    m.unknown_tagged_fields = tags(3);
    m
}

#[test]
fn describe_cluster_all_versions() {
    for v in 0..=2 {
        check_rewrite(
            "DescribeClusterResponse",
            v,
            &build_dc(v, false),
            &build_dc(v, true),
            rewrite_describe_cluster_response,
            &upstream_calls(),
            true,
        );
    }
}

#[test]
fn unsupported_versions_are_errors() {
    let body = enc(&build_dc(2, false), 2);
    assert!(rewrite_describe_cluster_response(3, &body, &mut |_, _, _| None).is_err());
    assert!(rewrite_find_coordinator_response(7, &body, &mut |_, _, _| None).is_err());
}
