//! The guard over the writes other than Produce, as a guard listener's chain
//! runs it (`filter::write_guard`): what it refuses (every life-cycle state
//! but STOPPED), what it forwards (byte for byte when nothing is refused;
//! the kept items of a splittable request), and the answers clients get,
//! decoded with the independent `kafka-protocol` crate.

mod handlers_common;

use std::sync::Arc;

use bytes::BytesMut;
use handlers_common::{dec, enc, s};
use kafka_protocol::messages::*;
use mirrorguard::codec::header::response_frame;
use mirrorguard::codec::{api, RequestHeader};
use mirrorguard::filter::address::AddressRewrite;
use mirrorguard::filter::produce_guard::{GuardPolicy, ProduceGuard};
use mirrorguard::filter::write_guard::{TopicIdNames, WriteGuard};
use mirrorguard::filter::{Chain, Decision, RequestState, Rewritten};
use mirrorguard::handlers::guarded_writes::*;
use mirrorguard::lifecycle::{Entry, Lifecycle, State};
use mirrorguard::metrics::{ApiLabels, Metrics};
use mirrorguard::producer_state::PartitionKey;
use mirrorguard::proxy::nodes::NodeRegistry;

const POLICY_VIOLATION: i16 = 44;
const OPERATION_NOT_ATTEMPTED: i16 = 55;

fn entry(topic: &str, partition: i32, state: State) -> Entry {
    Entry {
        state,
        since_ms: 1,
        ..Entry::new("a-to-b", "src", topic, partition)
    }
}

/// `m`-0 MIRRORING, `m`-1 STOPPED, `p`-0 PAUSED, `f`-0 FAILED, `s`-0
/// STOPPED; every other topic is local. Topic ids: 1 is `m`, 2 is `l`.
fn chain() -> (Chain, Arc<Metrics>) {
    let metrics = Metrics::new();
    let lc = Lifecycle::new(metrics.clone());
    for (t, p, st) in [
        ("m", 0, State::Mirroring),
        ("m", 1, State::Stopped),
        ("p", 0, State::Paused),
        ("f", 0, State::Failed),
        ("s", 0, State::Stopped),
    ] {
        lc.restore(PartitionKey::new([0; 16], t, p), entry(t, p, st));
    }
    let ids: TopicIdNames = Arc::new(|id: &[u8; 16]| match id[0] {
        1 => Some("m".to_string()),
        2 => Some("l".to_string()),
        _ => None,
    });
    let policy = GuardPolicy::new(lc.clone(), Vec::new());
    let nodes = Arc::new(NodeRegistry::new("t", "127.0.0.1", 0, metrics.clone()));
    let chain = Chain::new(vec![
        Box::new(ProduceGuard::new("g", lc, Vec::new(), metrics.clone())),
        Box::new(WriteGuard::new("g", policy, metrics.clone(), Some(ids))),
        Box::new(AddressRewrite::new(nodes)),
    ]);
    (chain, metrics)
}

fn header(api_key: i16, api_version: i16) -> RequestHeader {
    RequestHeader {
        api_key,
        api_version,
        correlation_id: 42,
    }
}

/// A request frame: size, header (null client id), `body`.
fn frame(api_key: i16, v: i16, body: &[u8]) -> BytesMut {
    let hv = api::request_header_version(api_key, v).unwrap();
    let mut f = Vec::new();
    f.extend(0i32.to_be_bytes());
    f.extend(api_key.to_be_bytes());
    f.extend(v.to_be_bytes());
    f.extend(42i32.to_be_bytes());
    f.extend((-1i16).to_be_bytes());
    if hv >= 2 {
        f.push(0);
    }
    let at = f.len();
    f.extend(body);
    let n = (f.len() - 4) as i32;
    f[..4].copy_from_slice(&n.to_be_bytes());
    assert_eq!(&f[at..], body);
    BytesMut::from(&f[..])
}

fn request_body(api_key: i16, v: i16, f: &[u8]) -> Vec<u8> {
    let hv = api::request_header_version(api_key, v).unwrap();
    f[4 + 10 + usize::from(hv >= 2)..].to_vec()
}

fn response_body(api_key: i16, v: i16, f: &[u8]) -> Vec<u8> {
    let hv = api::response_header_version(api_key, v).unwrap();
    f[8 + usize::from(hv >= 1)..].to_vec()
}

/// The chain's answer to a request it keeps (the guard answers it whole).
fn answered(chain: &Chain, h: &RequestHeader, d: Decision) -> Vec<u8> {
    let Decision::Answer { by, mut state } = d else {
        panic!("expected a local answer");
    };
    let Rewritten::Ready(out) = chain.answer(h, by, &mut state).unwrap() else {
        panic!("answers never block");
    };
    response_body(h.api_key, h.api_version, &out)
}

/// Passes an upstream response body through the chain.
fn through(chain: &Chain, h: &RequestHeader, state: Option<RequestState>, body: &[u8]) -> Vec<u8> {
    let hv = api::response_header_version(h.api_key, h.api_version).unwrap();
    let mut state = state;
    let Rewritten::Ready(out) = chain
        .on_response(h, &mut state, response_frame(42, hv, body), &mut 0)
        .unwrap()
    else {
        panic!("the guard never blocks");
    };
    response_body(h.api_key, h.api_version, &out)
}

fn refused(metrics: &Metrics, api: &str) -> u64 {
    metrics
        .guard_refused
        .get_or_create(&ApiLabels {
            listener: "g".into(),
            api: api.into(),
        })
        .get()
}

fn delete_records(v: i16, topics: &[(&str, &[i32])]) -> Vec<u8> {
    let mut req = DeleteRecordsRequest::default();
    req.timeout_ms = 500;
    for (t, ps) in topics {
        let mut dt = delete_records_request::DeleteRecordsTopic::default();
        dt.name = TopicName(s(t));
        for p in *ps {
            let mut dp = delete_records_request::DeleteRecordsPartition::default();
            dp.partition_index = *p;
            dp.offset = 2;
            dt.partitions.push(dp);
        }
        req.topics.push(dt);
    }
    enc(&req, v)
}

#[test]
fn delete_records_refuses_unstopped_partitions_and_forwards_the_rest() {
    for v in 0..=2 {
        let (chain, metrics) = chain();
        let h = header(DELETE_RECORDS, v);
        let body = delete_records(v, &[("m", &[0, 1]), ("p", &[0]), ("l", &[3])]);
        let Decision::Forward { frame: out, state } = chain
            .on_request(&h, frame(DELETE_RECORDS, v, &body))
            .unwrap()
        else {
            panic!("the kept partitions are forwarded");
        };
        let fwd: DeleteRecordsRequest = dec(&request_body(DELETE_RECORDS, v, &out), v);
        let kept: Vec<(String, Vec<i32>)> = fwd
            .topics
            .iter()
            .map(|t| {
                (
                    t.name.0.to_string(),
                    t.partitions.iter().map(|p| p.partition_index).collect(),
                )
            })
            .collect();
        assert_eq!(kept, vec![("m".into(), vec![1]), ("l".into(), vec![3])]);
        assert_eq!(refused(&metrics, "DeleteRecords"), 2);

        let mut up = DeleteRecordsResponse::default();
        for (t, p) in [("m", 1), ("l", 3)] {
            let mut ut = delete_records_response::DeleteRecordsTopicResult::default();
            ut.name = TopicName(s(t));
            let mut r = delete_records_response::DeleteRecordsPartitionResult::default();
            r.partition_index = p;
            r.low_watermark = 2;
            ut.partitions.push(r);
            up.topics.push(ut);
        }
        let merged: DeleteRecordsResponse = dec(&through(&chain, &h, state, &enc(&up, v)), v);
        let got: Vec<(String, i32, i16)> = merged
            .topics
            .iter()
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .map(|p| (t.name.0.to_string(), p.partition_index, p.error_code))
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("m".into(), 1, 0),
                ("l".into(), 3, 0),
                ("m".into(), 0, POLICY_VIOLATION),
                ("p".into(), 0, POLICY_VIOLATION),
            ]
        );

        // Nothing refused: the frame leaves as it came, with no state.
        let body = delete_records(v, &[("m", &[1]), ("l", &[0])]);
        let original = frame(DELETE_RECORDS, v, &body);
        let Decision::Forward { frame: out, state } =
            chain.on_request(&h, original.clone()).unwrap()
        else {
            panic!("forwarded");
        };
        assert_eq!(out, original);
        assert!(state.is_none());

        // Everything refused: answered by the guard.
        let body = delete_records(v, &[("f", &[0])]);
        let d = chain
            .on_request(&h, frame(DELETE_RECORDS, v, &body))
            .unwrap();
        let r: DeleteRecordsResponse = dec(&answered(&chain, &h, d), v);
        assert_eq!(r.topics[0].partitions[0].error_code, POLICY_VIOLATION);
        assert_eq!(r.topics[0].partitions[0].low_watermark, -1);
    }
}

#[test]
fn create_partitions_refuses_a_topic_with_an_unstopped_partition() {
    for v in 0..=3 {
        let (chain, metrics) = chain();
        let h = header(CREATE_PARTITIONS, v);
        let mut req = CreatePartitionsRequest::default();
        for t in ["m", "s", "l"] {
            let mut ct = create_partitions_request::CreatePartitionsTopic::default();
            ct.name = TopicName(s(t));
            ct.count = 4;
            req.topics.push(ct);
        }
        let Decision::Forward { frame: out, state } = chain
            .on_request(&h, frame(CREATE_PARTITIONS, v, &enc(&req, v)))
            .unwrap()
        else {
            panic!("the other topics are forwarded");
        };
        let fwd: CreatePartitionsRequest = dec(&request_body(CREATE_PARTITIONS, v, &out), v);
        let names: Vec<String> = fwd.topics.iter().map(|t| t.name.0.to_string()).collect();
        assert_eq!(names, ["s", "l"]);
        assert_eq!(refused(&metrics, "CreatePartitions"), 1);
        let mut up = CreatePartitionsResponse::default();
        for t in ["s", "l"] {
            let mut r = create_partitions_response::CreatePartitionsTopicResult::default();
            r.name = TopicName(s(t));
            up.results.push(r);
        }
        let merged: CreatePartitionsResponse = dec(&through(&chain, &h, state, &enc(&up, v)), v);
        assert_eq!(merged.results.len(), 3);
        let m = &merged.results[2];
        assert_eq!((m.name.0.as_str(), m.error_code), ("m", POLICY_VIOLATION));
        let msg = m.error_message.as_ref().unwrap().to_string();
        assert!(
            msg.contains("mirror 'a-to-b'") && msg.contains("MIRRORING"),
            "{msg}"
        );
    }
}

#[test]
fn delete_topics_by_name_and_by_id() {
    for v in 0..=5 {
        let (chain, _) = chain();
        let h = header(DELETE_TOPICS, v);
        let mut req = DeleteTopicsRequest::default();
        req.topic_names = vec![TopicName(s("p")), TopicName(s("l"))];
        // kafka-protocol encodes from v1; v0 is v1's layout.
        let body = enc(&req, v.max(1));
        let Decision::Forward { frame: out, state } = chain
            .on_request(&h, frame(DELETE_TOPICS, v, &body))
            .unwrap()
        else {
            panic!("the local topic is forwarded");
        };
        let fwd: DeleteTopicsRequest = dec(&request_body(DELETE_TOPICS, v, &out), v.max(1));
        assert_eq!(fwd.topic_names.len(), 1);
        assert_eq!(fwd.topic_names[0].0.as_str(), "l");
        if v == 0 {
            continue;
        }
        let mut up = DeleteTopicsResponse::default();
        let mut r = delete_topics_response::DeletableTopicResult::default();
        r.name = Some(TopicName(s("l")));
        up.responses.push(r);
        let merged: DeleteTopicsResponse = dec(&through(&chain, &h, state, &enc(&up, v)), v);
        assert_eq!(merged.responses.len(), 2);
        assert_eq!(merged.responses[1].error_code, POLICY_VIOLATION);
        if v >= 5 {
            let msg = merged.responses[1]
                .error_message
                .as_ref()
                .unwrap()
                .to_string();
            assert!(msg.contains("PAUSED"), "{msg}");
        }
    }

    // v6 by id: id 1 is `m` (refused), id 2 is `l` (forwarded), id 3 is
    // unknown (refused: something is protected), `s` by name (STOPPED).
    let (chain, metrics) = chain();
    let h = header(DELETE_TOPICS, 6);
    let mut body = Vec::new();
    let mut w = mirrorguard::wire::Writer::new(&mut body);
    w.put_array_len_v(true, Some(4), "t").unwrap();
    for (name, id) in [
        (None, [1u8; 16]),
        (None, [2; 16]),
        (None, [3; 16]),
        (Some("s"), [0; 16]),
    ] {
        w.put_nullable_string_v(true, name, "n").unwrap();
        w.put_uuid(&id);
        w.put_uvarint(0);
    }
    w.put_i32(1000);
    w.put_uvarint(0);
    let Decision::Forward { frame: out, state } = chain
        .on_request(&h, frame(DELETE_TOPICS, 6, &body))
        .unwrap()
    else {
        panic!("forwarded");
    };
    let fwd: DeleteTopicsRequest = dec(&request_body(DELETE_TOPICS, 6, &out), 6);
    assert_eq!(fwd.topics.len(), 2);
    assert_eq!(fwd.topics[0].topic_id.as_bytes(), &[2; 16]);
    assert_eq!(fwd.topics[1].name.as_ref().unwrap().0.as_str(), "s");
    assert_eq!(refused(&metrics, "DeleteTopics"), 2);
    let merged: DeleteTopicsResponse = dec(
        &through(&chain, &h, state, &enc(&DeleteTopicsResponse::default(), 6)),
        6,
    );
    let got: Vec<([u8; 16], i16, String)> = merged
        .responses
        .iter()
        .map(|r| {
            (
                *r.topic_id.as_bytes(),
                r.error_code,
                r.error_message
                    .as_ref()
                    .map(|m| m.to_string())
                    .unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(got.len(), 2);
    assert_eq!((got[0].0, got[0].1), ([1; 16], POLICY_VIOLATION));
    assert!(got[0].2.contains("topic m is mirrored"), "{}", got[0].2);
    assert_eq!((got[1].0, got[1].1), ([3; 16], POLICY_VIOLATION));
    assert!(got[1].2.contains("cannot tell"), "{}", got[1].2);
}

#[test]
fn add_partitions_to_txn_is_refused_whole() {
    for v in 0..=5 {
        let (chain, metrics) = chain();
        let h = header(ADD_PARTITIONS_TO_TXN, v);
        let topic = |name: &str, ps: Vec<i32>| {
            let mut t = add_partitions_to_txn_request::AddPartitionsToTxnTopic::default();
            t.name = TopicName(s(name));
            t.partitions = ps;
            t
        };
        let build = |topics: Vec<add_partitions_to_txn_request::AddPartitionsToTxnTopic>| {
            let mut req = AddPartitionsToTxnRequest::default();
            if v >= 4 {
                let mut t = add_partitions_to_txn_request::AddPartitionsToTxnTransaction::default();
                t.transactional_id = TransactionalId(s("tx"));
                t.topics = topics;
                req.transactions = vec![t];
            } else {
                req.v3_and_below_transactional_id = TransactionalId(s("tx"));
                req.v3_and_below_topics = topics;
            }
            enc(&req, v)
        };
        let body = build(vec![topic("l", vec![0]), topic("m", vec![1, 0])]);
        let d = chain
            .on_request(&h, frame(ADD_PARTITIONS_TO_TXN, v, &body))
            .unwrap();
        let r: AddPartitionsToTxnResponse = dec(&answered(&chain, &h, d), v);
        let topics = if v >= 4 {
            assert_eq!(
                r.results_by_transaction[0].transactional_id.0.as_str(),
                "tx"
            );
            r.results_by_transaction[0].topic_results.clone()
        } else {
            r.results_by_topic_v3_and_below.clone()
        };
        let got: Vec<(String, i32, i16)> = topics
            .iter()
            .flat_map(|t| {
                t.results_by_partition.iter().map(|p| {
                    (
                        t.name.0.to_string(),
                        p.partition_index,
                        p.partition_error_code,
                    )
                })
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("l".into(), 0, OPERATION_NOT_ATTEMPTED),
                ("m".into(), 1, OPERATION_NOT_ATTEMPTED),
                ("m".into(), 0, POLICY_VIOLATION),
            ]
        );
        assert_eq!(refused(&metrics, "AddPartitionsToTxn"), 1);
        // Nothing mirrored short of STOPPED: forwarded untouched.
        let original = frame(
            ADD_PARTITIONS_TO_TXN,
            v,
            &build(vec![topic("l", vec![0]), topic("m", vec![1])]),
        );
        let Decision::Forward { frame: out, state } =
            chain.on_request(&h, original.clone()).unwrap()
        else {
            panic!("forwarded");
        };
        assert_eq!(out, original);
        assert!(state.is_none());
    }
}

#[test]
fn write_txn_markers_from_a_client_are_refused_whole() {
    let (chain, metrics) = chain();
    let h = header(WRITE_TXN_MARKERS, 1);
    let mut req = WriteTxnMarkersRequest::default();
    let mut m = write_txn_markers_request::WritableTxnMarker::default();
    m.producer_id = ProducerId(9);
    for (t, ps) in [("f", vec![0]), ("l", vec![2])] {
        let mut mt = write_txn_markers_request::WritableTxnMarkerTopic::default();
        mt.name = TopicName(s(t));
        mt.partition_indexes = ps;
        m.topics.push(mt);
    }
    req.markers = vec![m];
    let d = chain
        .on_request(&h, frame(WRITE_TXN_MARKERS, 1, &enc(&req, 1)))
        .unwrap();
    let r: WriteTxnMarkersResponse = dec(&answered(&chain, &h, d), 1);
    assert_eq!(r.markers[0].producer_id, ProducerId(9));
    let codes: Vec<i16> = r.markers[0]
        .topics
        .iter()
        .map(|t| t.partitions[0].error_code)
        .collect();
    assert_eq!(codes, [POLICY_VIOLATION, OPERATION_NOT_ATTEMPTED]);
    assert_eq!(refused(&metrics, "WriteTxnMarkers"), 1);
}

/// A malformed or truncated write closes the connection (an error), never
/// a panic, and nothing is forwarded.
#[test]
fn malformed_writes_are_errors() {
    let (chain, _) = chain();
    for (k, r) in GUARDED_WRITE_VERSIONS.iter() {
        for v in r.clone() {
            let h = header(*k, v);
            for body in [&[][..], &[0xff; 3][..], &[0x7f, 0xff, 0xff, 0xff, 1, 2][..]] {
                assert!(chain.on_request(&h, frame(*k, v, body)).is_err());
            }
        }
    }
    let body = delete_records(2, &[("m", &[0])]);
    for cut in 0..body.len() {
        let h = header(DELETE_RECORDS, 2);
        assert!(chain
            .on_request(&h, frame(DELETE_RECORDS, 2, &body[..cut]))
            .is_err());
    }
}

/// The guard's APIs are advertised as the broker advertises them (every
/// version Kafka 4.4 speaks is parsed).
#[test]
fn guard_chain_keeps_the_write_apis_advertised() {
    let (chain, _) = chain();
    let set = chain.decode_set();
    for (k, r) in GUARDED_WRITE_VERSIONS.iter() {
        assert!(set.contains(&(*k, r.clone())), "{k}");
    }
    assert!(set.contains(&(api::PRODUCE, 3..=12)));
}
