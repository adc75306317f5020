//! The guard's write-request parsers and splitter (AddPartitionsToTxn,
//! WriteTxnMarkers, DeleteRecords, CreatePartitions, DeleteTopics) on hostile
//! input: random bytes and mutated valid requests (encoded by the independent
//! `kafka-protocol` crate) never panic; a request that parses splits into one
//! that parses again and holds exactly the kept items, and the guard's
//! answers decode with the crate.

mod handlers_common;

use handlers_common::{enc, s};
use kafka_protocol::messages::*;
use mirrorguard::handlers::guarded_writes::{
    build_write_response, encode_result_entries, parse_write_request, split_write_request,
    GroupAnswer, TopicAnswer, CREATE_PARTITIONS, DELETE_RECORDS, DELETE_TOPICS,
    GUARDED_WRITE_VERSIONS,
};
use proptest::prelude::*;

const NAMES: [&str; 4] = ["a", "orders", "payments-eu", "t"];

/// Topics as (name index, partitions).
type Topics = Vec<(usize, Vec<i32>)>;

fn topics() -> impl Strategy<Value = Topics> {
    proptest::collection::vec(
        (
            0usize..NAMES.len(),
            proptest::collection::vec(0i32..64, 0..4),
        ),
        0..4,
    )
}

fn encode(api: i16, v: i16, t: &Topics) -> Vec<u8> {
    match api {
        DELETE_RECORDS => {
            let mut r = DeleteRecordsRequest::default();
            r.timeout_ms = 1;
            r.topics = t
                .iter()
                .map(|(n, ps)| {
                    let mut dt = delete_records_request::DeleteRecordsTopic::default();
                    dt.name = TopicName(s(NAMES[*n]));
                    dt.partitions = ps
                        .iter()
                        .map(|p| {
                            let mut dp = delete_records_request::DeleteRecordsPartition::default();
                            dp.partition_index = *p;
                            dp.offset = 3;
                            dp
                        })
                        .collect();
                    dt
                })
                .collect();
            enc(&r, v)
        }
        CREATE_PARTITIONS => {
            let mut r = CreatePartitionsRequest::default();
            r.topics = t
                .iter()
                .map(|(n, ps)| {
                    let mut ct = create_partitions_request::CreatePartitionsTopic::default();
                    ct.name = TopicName(s(NAMES[*n]));
                    ct.count = ps.len() as i32;
                    if !ps.is_empty() {
                        let mut a =
                            create_partitions_request::CreatePartitionsAssignment::default();
                        a.broker_ids = ps.iter().map(|p| BrokerId(*p)).collect();
                        ct.assignments = Some(vec![a]);
                    }
                    ct
                })
                .collect();
            enc(&r, v)
        }
        _ => {
            let mut r = DeleteTopicsRequest::default();
            r.topic_names = t.iter().map(|(n, _)| TopicName(s(NAMES[*n]))).collect();
            enc(&r, v)
        }
    }
}

fn never_panics(b: &[u8]) {
    for (k, r) in GUARDED_WRITE_VERSIONS.iter() {
        for v in r.clone() {
            if let Ok(req) = parse_write_request(*k, v, b) {
                assert!(req.end <= b.len());
                if req.splittable() {
                    let keep: Vec<Vec<bool>> = req.groups[0]
                        .topics
                        .iter()
                        .map(|t| match &t.partitions {
                            Some(ps) => ps.iter().map(|(p, _)| p % 2 == 0).collect(),
                            None => vec![t.span.start % 2 == 0],
                        })
                        .collect();
                    let out = split_write_request(&req, b, &keep).expect("a parsed request splits");
                    if let Some(out) = out {
                        parse_write_request(*k, v, &out).expect("a split request parses");
                    }
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..200)) {
        never_panics(&b);
    }

    /// Splitting keeps exactly the kept items, every one with its bytes.
    #[test]
    fn split_keeps_exactly_the_kept_items(
        api in prop::sample::select(vec![DELETE_RECORDS, CREATE_PARTITIONS, DELETE_TOPICS]),
        t in topics(),
        vpick in any::<prop::sample::Index>(),
        mask in any::<u64>(),
    ) {
        let versions = match api {
            DELETE_RECORDS => 0..=2,
            CREATE_PARTITIONS => 0..=3,
            _ => 1..=5,
        };
        let vs: Vec<i16> = versions.collect();
        let v = vs[vpick.index(vs.len())];
        let body = enc_body(api, v, &t);
        let req = parse_write_request(api, v, &body).unwrap();
        prop_assert_eq!(req.end, body.len());
        let mut bit = 0;
        let mut next = || { bit += 1; (mask >> (bit % 64)) & 1 == 1 };
        let keep: Vec<Vec<bool>> = req.groups[0]
            .topics
            .iter()
            .map(|t| match &t.partitions {
                Some(ps) => ps.iter().map(|_| next()).collect(),
                None => vec![next()],
            })
            .collect();
        let want: Vec<(Option<&str>, Option<&[u8]>)> = req.groups[0]
            .topics
            .iter()
            .zip(&keep)
            .flat_map(|(t, k)| {
                let items: Vec<(Option<&str>, Option<&[u8]>)> = match &t.partitions {
                    Some(ps) => ps
                        .iter()
                        .zip(k)
                        .filter(|(_, k)| **k)
                        .map(|((_, span), _)| (t.name, Some(&body[span.clone()])))
                        .collect(),
                    None if k[0] => vec![(t.name, None)],
                    None => vec![],
                };
                items
            })
            .collect();
        match split_write_request(&req, &body, &keep).unwrap() {
            None => prop_assert!(keep.iter().all(|k| k.iter().all(|b| *b))),
            Some(out) => {
                let again = parse_write_request(api, v, &out).unwrap();
                prop_assert_eq!(again.end, out.len());
                let got: Vec<(Option<&str>, Option<&[u8]>)> = again.groups[0]
                    .topics
                    .iter()
                    .flat_map(|t| {
                        let items: Vec<(Option<&str>, Option<&[u8]>)> = match &t.partitions {
                            Some(ps) => ps
                                .iter()
                                .map(|(_, span)| (t.name, Some(&out[span.clone()])))
                                .collect(),
                            None => vec![(t.name, None)],
                        };
                        items
                    })
                    .collect();
                prop_assert_eq!(got, want);
                prop_assert!(again.groups[0]
                    .topics
                    .iter()
                    .all(|t| t.partitions.as_ref().is_none_or(|p| !p.is_empty())));
            }
        }
        // The answers decode with the crate.
        let answers: Vec<TopicAnswer> = req.groups[0]
            .topics
            .iter()
            .map(|t| TopicAnswer {
                name: t.name.map(str::to_string),
                id: t.id,
                error_code: 44,
                message: Some("refused".into()),
                partitions: t
                    .partitions
                    .iter()
                    .flatten()
                    .map(|(p, _)| (*p, 44))
                    .collect(),
            })
            .collect();
        let whole = build_write_response(
            api,
            v,
            &[GroupAnswer { transactional_id: None, producer_id: -1, topics: answers.clone() }],
        )
        .unwrap();
        let (_, n) = encode_result_entries(api, v, &answers).unwrap();
        prop_assert_eq!(n, answers.len());
        decode_response(api, v, &whole);
    }

    #[test]
    fn mutated_valid_requests_never_panic(
        api in prop::sample::select(vec![DELETE_RECORDS, CREATE_PARTITIONS, DELETE_TOPICS]),
        t in topics(),
        cut in any::<prop::sample::Index>(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
    ) {
        let body = enc_body(api, 2, &t);
        never_panics(&body[..cut.index(body.len() + 1)]);
        let mut m = body.clone();
        if !m.is_empty() {
            for (i, x) in &flips {
                let i = i.index(m.len());
                m[i] ^= *x;
            }
        }
        never_panics(&m);
    }
}

fn enc_body(api: i16, v: i16, t: &Topics) -> Vec<u8> {
    encode(api, v, t)
}

fn decode_response(api: i16, v: i16, b: &[u8]) {
    use bytes::Bytes;
    use kafka_protocol::protocol::Decodable;
    let mut buf = Bytes::copy_from_slice(b);
    match api {
        DELETE_RECORDS => {
            DeleteRecordsResponse::decode(&mut buf, v).unwrap();
        }
        CREATE_PARTITIONS => {
            CreatePartitionsResponse::decode(&mut buf, v).unwrap();
        }
        _ => {
            DeleteTopicsResponse::decode(&mut buf, v).unwrap();
        }
    }
    assert!(buf.is_empty());
}
