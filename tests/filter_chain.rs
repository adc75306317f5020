//! The filter chain as a listener sees it: ApiVersions responses clamped to
//! what the chain's filters decode (checked against kafka-protocol), filters
//! run in registration order with the request's state, and a new API
//! rewrite registered as one filter.

mod handlers_common;

use std::ops::RangeInclusive;
use std::sync::Arc;

use bytes::BytesMut;
use handlers_common::*;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::ApiVersionsResponse;
use mirrorguard::codec::header::response_frame;
use mirrorguard::codec::{api, RequestHeader};
use mirrorguard::filter::address::AddressRewrite;
use mirrorguard::filter::produce_guard::ProduceGuard;
use mirrorguard::filter::{
    Chain, Decision, Filter, RequestAction, RequestState, RewriteError, Rewritten,
};
use mirrorguard::lifecycle::Lifecycle;
use mirrorguard::metrics::Metrics;
use mirrorguard::proxy::nodes::NodeRegistry;

/// Broker advertisement: (key, min, max).
const ADVERTISED: [(i16, i16, i16); 7] = [
    (0, 3, 14), // Produce
    (1, 4, 19), // Fetch
    (3, 0, 13), // Metadata
    (18, 0, 6), // ApiVersions
    (19, 2, 7), // CreateTopics: decoded by no filter
    (60, 0, 5), // DescribeCluster
    (75, 0, 1), // DescribeTopicPartitions
];

fn versions(entries: &[(i16, i16, i16)]) -> ApiVersionsResponse {
    let mut m = ApiVersionsResponse::default();
    m.api_keys = entries
        .iter()
        .map(|(k, lo, hi)| {
            let mut a = ApiVersion::default();
            a.api_key = *k;
            a.min_version = *lo;
            a.max_version = *hi;
            a
        })
        .collect();
    m
}

fn header(api_key: i16, api_version: i16) -> RequestHeader {
    RequestHeader {
        api_key,
        api_version,
        correlation_id: 42,
    }
}

fn nodes() -> Arc<NodeRegistry> {
    Arc::new(NodeRegistry::new("t", "127.0.0.1", 0, Metrics::new()))
}

/// The advertised `(key, min, max)` after the chain.
fn advertised_through(chain: &Chain) -> Vec<(i16, i16, i16)> {
    advertised_through_with(chain, &ADVERTISED)
}

/// The `(key, min, max)` a broker advertising `entries` has advertised
/// through the chain.
fn advertised_through_with(chain: &Chain, entries: &[(i16, i16, i16)]) -> Vec<(i16, i16, i16)> {
    let h = header(api::API_VERSIONS, 3);
    let frame = response_frame(42, 0, &enc(&versions(entries), 3));
    let Rewritten::Ready(out) = chain.on_response(&h, &mut None, frame, &mut 0).unwrap() else {
        panic!("the clamp never blocks");
    };
    let got: ApiVersionsResponse = dec(&out[8..], 3);
    got.api_keys
        .iter()
        .map(|a| (a.api_key, a.min_version, a.max_version))
        .collect()
}

fn guard() -> ProduceGuard {
    let metrics = Metrics::new();
    ProduceGuard::new("g", Lifecycle::new(metrics.clone()), Vec::new(), metrics)
}

/// Everything to what the address rewrite decodes, and Fetch to v15, the
/// newest whose responses carry no NodeEndpoints, so they stream.
#[test]
fn plain_chain_clamps_what_the_address_rewrite_decodes() {
    let chain = Chain::new(vec![Box::new(AddressRewrite::new(nodes()))]);
    assert_eq!(
        advertised_through(&chain),
        vec![
            (0, 3, 13),
            (1, 4, 15),
            (3, 0, 13),
            (18, 0, 5),
            (19, 2, 7),
            (60, 0, 2),
            (75, 0, 1),
        ]
    );
}

#[test]
fn guard_chain_also_clamps_produce_to_what_the_guard_parses() {
    let chain = Chain::new(vec![
        Box::new(guard()),
        Box::new(AddressRewrite::new(nodes())),
    ]);
    assert_eq!(advertised_through(&chain)[0], (0, 3, 12));
    assert_eq!(advertised_through(&chain)[1], (1, 4, 15));
}

/// Fetch v15 responses pass a plain chain untouched (they stream); a client
/// that ignores the advertisement and sends v16+ is still rewritten: the
/// chain handles those versions and decodes them up to v18.
#[test]
fn fetch_above_the_clamp_is_still_rewritten() {
    let chain = Chain::new(vec![Box::new(AddressRewrite::new(nodes()))]);
    assert!(!chain.wants(&header(api::FETCH, 15)));
    for v in 16..=18 {
        assert!(chain.wants(&header(api::FETCH, v)), "v{v}");
    }
    assert!(chain.decode_set().contains(&(api::FETCH, 4..=18)));
}

/// A broker whose oldest Fetch is v16 keeps its entry as advertised: the
/// v15 preference never removes an API clients need.
#[test]
fn fetch_preference_never_removes_the_entry() {
    let chain = Chain::new(vec![Box::new(AddressRewrite::new(nodes()))]);
    let got = advertised_through_with(&chain, &[(1, 16, 19), (18, 0, 4)]);
    assert_eq!(got, vec![(1, 16, 18), (18, 0, 4)]);
}

/// A filter that holds every Fetch response (as the mirror listener's PID
/// rewrite does) and decodes what the handlers decode.
struct HoldsFetch(Vec<(i16, RangeInclusive<i16>)>);

impl Filter for HoldsFetch {
    fn decodes(&self) -> &[(i16, RangeInclusive<i16>)] {
        &self.0
    }

    fn handles(&self, api_key: i16, _api_version: i16) -> bool {
        api_key == api::FETCH
    }

    fn on_response(
        &self,
        _h: &RequestHeader,
        _state: Option<&mut RequestState>,
        frame: BytesMut,
    ) -> Result<Rewritten, RewriteError> {
        Ok(Rewritten::Ready(frame))
    }
}

/// Where another filter holds Fetch responses anyway (mirror listeners),
/// lowering Fetch would lose the KIP-951 leader hints for nothing: the
/// broker's maximum (within what is decoded) stays.
#[test]
fn fetch_is_not_lowered_where_responses_are_held_anyway() {
    let chain = Chain::new(vec![
        Box::new(HoldsFetch(vec![(api::FETCH, 4..=18)])),
        Box::new(AddressRewrite::new(nodes())),
    ]);
    assert_eq!(advertised_through(&chain)[1], (1, 4, 18));
}

/// A hypothetical new API rewrite: one type, registered in the chain.
/// It decodes DescribeTopicPartitions v0 only and marks the responses it
/// sees by appending a byte, so the test can see the order filters run in.
struct Marker {
    decodes: Vec<(i16, RangeInclusive<i16>)>,
    mark: u8,
}

impl Filter for Marker {
    fn decodes(&self) -> &[(i16, RangeInclusive<i16>)] {
        &self.decodes
    }

    fn handles(&self, api_key: i16, _api_version: i16) -> bool {
        api_key == 75
    }

    fn on_request(&self, h: &RequestHeader, frame: &[u8]) -> Result<RequestAction, RewriteError> {
        // The request as the previous filter left it, plus this filter's mark.
        let mut replacement = BytesMut::from(frame);
        replacement.extend_from_slice(&[self.mark]);
        match frame.last() {
            Some(0xEE) => Ok(RequestAction::Drop),
            Some(0xAA) if self.mark == 2 => Err(RewriteError::new(h, "marker 2 refuses 0xAA")),
            _ => Ok(RequestAction::Forward {
                replacement: Some(replacement),
                state: None,
            }),
        }
    }

    fn on_response(
        &self,
        _h: &RequestHeader,
        _state: Option<&mut RequestState>,
        mut frame: BytesMut,
    ) -> Result<Rewritten, RewriteError> {
        frame.extend_from_slice(&[self.mark]);
        Ok(Rewritten::Ready(frame))
    }
}

#[test]
fn a_new_filter_is_one_registration_and_runs_in_order() {
    let marker = |mark| {
        Box::new(Marker {
            decodes: vec![(75, 0..=0)],
            mark,
        }) as Box<dyn Filter>
    };
    let chain = Chain::new(vec![
        marker(1),
        Box::new(AddressRewrite::new(nodes())),
        marker(2),
    ]);
    // Its decode set reaches the clamp: DescribeTopicPartitions max 1 -> 0.
    assert!(advertised_through(&chain).contains(&(75, 0, 0)));
    assert!(chain.decode_set().contains(&(75, 0..=0)));
    assert!(chain.wants(&header(75, 0)));
    assert!(!chain.wants(&header(19, 7)));

    // Requests: each filter sees the previous one's replacement.
    let h = header(75, 0);
    match chain.on_request(&h, BytesMut::from(&b"req"[..])).unwrap() {
        Decision::Forward { frame, state } => {
            assert_eq!(&frame[..], b"req\x01\x02");
            assert!(state.is_none());
        }
        _ => panic!("forwarded"),
    }
    assert!(matches!(
        chain.on_request(&h, BytesMut::from(&b"\xEE"[..])).unwrap(),
        Decision::Drop
    ));
    // Marker 2 refuses a frame ending in 0xAA, but it sees marker 1's
    // replacement (ending in 0x01).
    assert!(chain.on_request(&h, BytesMut::from(&b"\xAA"[..])).is_ok());
    // APIs no filter handles are never offered.
    match chain
        .on_request(&header(19, 7), BytesMut::from(&b"\xEE"[..]))
        .unwrap()
    {
        Decision::Forward { frame, .. } => assert_eq!(&frame[..], b"\xEE"),
        _ => panic!("forwarded untouched"),
    }

    // Responses: in registration order.
    let Rewritten::Ready(out) = chain
        .on_response(&h, &mut None, BytesMut::from(&b"resp"[..]), &mut 0)
        .unwrap()
    else {
        panic!("ready");
    };
    assert_eq!(&out[..], b"resp\x01\x02");
}

/// A Produce the guard has nothing against is forwarded byte for byte and
/// carries no state (refusals are covered by test_produce_guard.py with a
/// real destination).
#[test]
fn guard_forwards_what_it_does_not_refuse() {
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::{ProduceRequest, TopicName};
    let chain = Chain::new(vec![
        Box::new(guard()),
        Box::new(AddressRewrite::new(nodes())),
    ]);
    let mut req = ProduceRequest::default();
    req.acks = -1;
    req.timeout_ms = 1000;
    let mut t = TopicProduceData::default();
    t.name = TopicName(s("local"));
    let mut p = PartitionProduceData::default();
    p.index = 0;
    t.partition_data = vec![p];
    req.topic_data = vec![t];
    let body = enc(&req, 9);
    // Request header v2: key, version, correlation id, client id, tags.
    let mut frame = BytesMut::new();
    let header_len = 2 + 2 + 4 + 2 + 1;
    frame.extend_from_slice(&((header_len + body.len()) as i32).to_be_bytes());
    frame.extend_from_slice(&0i16.to_be_bytes());
    frame.extend_from_slice(&9i16.to_be_bytes());
    frame.extend_from_slice(&42i32.to_be_bytes());
    frame.extend_from_slice(&(-1i16).to_be_bytes());
    frame.extend_from_slice(&[0]);
    frame.extend_from_slice(&body);
    let before = frame.clone();
    match chain.on_request(&header(0, 9), frame).unwrap() {
        Decision::Forward { frame, state } => {
            assert_eq!(frame, before);
            assert!(state.is_none());
        }
        _ => panic!("forwarded"),
    }
    // Produce v13 names topics by id: the guard refuses to parse it.
    assert!(chain.on_request(&header(0, 13), before.clone()).is_err());
}
