//! FetchResponse v4-v18 partition builder, whole-response builder and
//! splicer (replace upstream entries, add entries the upstream omitted),
//! checked against kafka-protocol 0.18: the output decodes to the expected
//! message and equals kafka-protocol's own encoding byte for byte.

mod handlers_common;

use std::borrow::Cow;

use bytes::Bytes;
use handlers_common::*;
use kafka_protocol::messages::fetch_response::{
    AbortedTransaction as KAborted, EpochEndOffset, FetchableTopicResponse, LeaderIdAndEpoch,
    NodeEndpoint, PartitionData,
};
use kafka_protocol::messages::{BrokerId, FetchResponse, ProducerId, TopicName};
use mirrorguard::handlers::{
    build_fetch_response, splice_fetch_response, splice_fetch_response_dropping,
    walk_fetch_response, AbortedTransaction, FetchPartitionResponse, FetchTopic,
};
use proptest::prelude::*;

fn bytes_of(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_mul(29).wrapping_add(i as u8))
        .collect()
}

fn tid(t: u8) -> [u8; 16] {
    [0x40 + t, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 1, 2, 3, 4, t]
}

fn topic_ref(v: i16, name: &'static str, t: u8) -> FetchTopic<'static> {
    if v >= 13 {
        FetchTopic::Id(tid(t))
    } else {
        FetchTopic::Name(name)
    }
}

fn k_topic(v: i16, name: &str, t: u8) -> FetchableTopicResponse {
    let mut topic = FetchableTopicResponse::default();
    if v >= 13 {
        topic.topic_id = uuid_of(tid(t)).topic_id;
    } else {
        topic.topic = TopicName(s(name));
    }
    topic
}

/// The kafka-protocol twin of a `FetchPartitionResponse` at `v`.
fn k_partition(v: i16, p: &FetchPartitionResponse<'_>) -> PartitionData {
    let mut d = PartitionData::default();
    d.partition_index = p.partition_index;
    d.error_code = p.error_code;
    d.high_watermark = p.high_watermark;
    d.last_stable_offset = p.last_stable_offset;
    d.log_start_offset = if v >= 5 { p.log_start_offset } else { -1 };
    d.aborted_transactions = p.aborted_transactions.as_ref().map(|a| {
        a.iter()
            .map(|t| {
                let mut k = KAborted::default();
                k.producer_id = ProducerId(t.producer_id);
                k.first_offset = t.first_offset;
                k
            })
            .collect()
    });
    d.preferred_read_replica = BrokerId(if v >= 11 {
        p.preferred_read_replica
    } else {
        -1
    });
    d.records = p.records.as_ref().map(|r| Bytes::copy_from_slice(r));
    d
}

/// Seal-like partition answers with every interesting shape.
fn local_partitions(seed: u8) -> Vec<FetchPartitionResponse<'static>> {
    let mut a = FetchPartitionResponse::new(0);
    a.high_watermark = 1002;
    a.last_stable_offset = 1000;
    a.log_start_offset = 5;
    a.aborted_transactions = Some(vec![
        AbortedTransaction {
            producer_id: -77,
            first_offset: 990,
        },
        AbortedTransaction {
            producer_id: 123_456_789,
            first_offset: 995,
        },
    ]);
    a.preferred_read_replica = -1;
    a.records = Some(Cow::Owned(bytes_of(seed, 140)));
    let mut b = FetchPartitionResponse::new(4);
    b.error_code = 0;
    b.high_watermark = 17;
    b.last_stable_offset = 17;
    b.log_start_offset = 0;
    b.aborted_transactions = Some(vec![]);
    b.records = Some(Cow::Owned(Vec::new()));
    let mut c = FetchPartitionResponse::new(9);
    c.error_code = 6;
    c.preferred_read_replica = 2;
    vec![a, b, c]
}

#[test]
fn partition_entry_matches_kafka_protocol() {
    for v in 4..=18i16 {
        for p in local_partitions(1) {
            let mine = p.to_bytes(v).expect("encode");
            let theirs = enc(&k_partition(v, &p), v);
            assert_eq!(mine, theirs, "v{v} partition {}", p.partition_index);
            let back: PartitionData = dec(&mine, v);
            assert_eq!(back, k_partition(v, &p));
        }
    }
}

#[test]
fn build_whole_response_all_versions() {
    for v in 4..=18i16 {
        let topics = vec![
            (topic_ref(v, "orders", 0), local_partitions(3)),
            (topic_ref(v, "payments", 1), vec![]),
            (topic_ref(v, "audit", 2), local_partitions(4)),
        ];
        let out = build_fetch_response(v, 25, 0, 4242, &topics).expect("build");
        let mut expected = FetchResponse::default();
        expected.throttle_time_ms = 25;
        if v >= 7 {
            expected.session_id = 4242;
        }
        expected.responses = [("orders", 0u8, 3u8), ("payments", 1, 0), ("audit", 2, 4)]
            .iter()
            .map(|(name, t, seed)| {
                let mut kt = k_topic(v, name, *t);
                if *seed != 0 {
                    kt.partitions = local_partitions(*seed)
                        .iter()
                        .map(|p| k_partition(v, p))
                        .collect();
                }
                kt
            })
            .collect();
        let got: FetchResponse = dec(&out, v);
        assert_eq!(got, expected, "v{v}");
        assert_eq!(out, enc(&expected, v), "v{v} bytes");
        // The proxy's own output walks cleanly with the upstream walker.
        let mut n = 0;
        walk_fetch_response(v, &out, &mut |_| n += 1).expect("walk");
        assert_eq!(n, 6);

        // Error-only response (e.g. FETCH_SESSION_ID_NOT_FOUND) with no topics.
        let out = build_fetch_response(v, 0, 70, 0, &[]).expect("build");
        let got: FetchResponse = dec(&out, v);
        assert_eq!(got.error_code, if v >= 7 { 70 } else { 0 });
        assert!(got.responses.is_empty());
    }
}

#[test]
fn builders_refuse_wrong_topic_kind_and_versions() {
    let parts = local_partitions(1);
    assert!(
        build_fetch_response(12, 0, 0, 0, &[(FetchTopic::Id([1; 16]), parts.clone())]).is_err()
    );
    assert!(build_fetch_response(13, 0, 0, 0, &[(FetchTopic::Name("x"), parts.clone())]).is_err());
    for v in [-1i16, 0, 3, 19] {
        assert!(build_fetch_response(v, 0, 0, 0, &[]).is_err());
        assert!(parts[0].to_bytes(v).is_err());
    }
    let up = enc(&upstream(12), 12);
    assert!(splice_fetch_response(
        12,
        &up,
        &mut |_| None,
        &[(FetchTopic::Id([0; 16]), parts.clone())]
    )
    .is_err());
}

/// An upstream response: topics "orders" (t0) and "payments" (t1), three
/// partitions each, tagged fields everywhere, NodeEndpoints from v16.
fn upstream(v: i16) -> FetchResponse {
    let flex = v >= 12;
    let mut m = FetchResponse::default();
    m.throttle_time_ms = 3;
    if v >= 7 {
        m.session_id = 777;
    }
    m.responses = [("orders", 0u8), ("payments", 1u8)]
        .iter()
        .map(|(name, t)| {
            let mut topic = k_topic(v, name, *t);
            topic.partitions = (0..3i32)
                .map(|p| {
                    let mut d = PartitionData::default();
                    d.partition_index = p;
                    d.high_watermark = 500 + i64::from(p);
                    d.last_stable_offset = 480;
                    if v >= 5 {
                        d.log_start_offset = 1;
                    }
                    d.aborted_transactions = (p == 0).then(|| {
                        let mut a = KAborted::default();
                        a.producer_id = ProducerId(5000);
                        a.first_offset = 470;
                        if flex {
                            a.unknown_tagged_fields = tags(1);
                        }
                        vec![a]
                    });
                    d.records = (p != 2).then(|| Bytes::from(bytes_of(*t + p as u8, 200)));
                    if flex {
                        let mut l = LeaderIdAndEpoch::default();
                        l.leader_id = BrokerId(2);
                        l.leader_epoch = 8;
                        d.current_leader = l;
                        if p == 1 {
                            let mut e = EpochEndOffset::default();
                            e.epoch = 3;
                            e.end_offset = 450;
                            d.diverging_epoch = e;
                        }
                        d.unknown_tagged_fields = tags(p);
                    }
                    d
                })
                .collect();
            if flex {
                topic.unknown_tagged_fields = tags(i32::from(*t) + 10);
            }
            topic
        })
        .collect();
    if v >= 16 {
        m.node_endpoints = UPSTREAM
            .iter()
            .map(|(id, h, p, rack)| {
                let mut e = NodeEndpoint::default();
                e.node_id = BrokerId(*id);
                e.host = s(h);
                e.port = *p;
                e.rack = rack.map(s);
                e
            })
            .collect();
    }
    if flex {
        m.unknown_tagged_fields = tags(30);
    }
    m
}

#[test]
fn splice_unchanged_is_byte_identical() {
    for v in 4..=18i16 {
        let up = enc(&upstream(v), v);
        let mut calls = 0;
        let out = splice_fetch_response(
            v,
            &up,
            &mut |_| {
                calls += 1;
                None
            },
            &[],
        )
        .expect("splice");
        assert_eq!(out, up, "v{v}");
        assert_eq!(calls, 6);
        // Empty additions are no additions.
        let out = splice_fetch_response(v, &up, &mut |_| None, &[(topic_ref(v, "z", 9), vec![])])
            .expect("splice");
        assert_eq!(out, up, "v{v}");
    }
}

#[test]
fn splice_replace_and_add_all_versions() {
    for v in 4..=18i16 {
        let orig = upstream(v);
        let up = enc(&orig, v);
        // Replace orders/1 with a seal answer and payments/0 with its own
        // upstream values but only the first 50 record bytes (a cut).
        let seal = local_partitions(7).remove(0);
        let mut seal1 = seal.clone();
        seal1.partition_index = 1;
        let mut seen = Vec::new();
        let add = vec![
            // payments is in the upstream response: merged into its entry.
            (
                topic_ref(v, "payments", 1),
                vec![local_partitions(8).remove(1)],
            ),
            // A topic the upstream did not return: a new entry...
            (
                topic_ref(v, "audit", 2),
                vec![local_partitions(9).remove(2)],
            ),
            // ...and a second addition for it lands in the same new entry.
            (
                topic_ref(v, "audit", 2),
                vec![local_partitions(9).remove(0)],
            ),
        ];
        let out = splice_fetch_response(
            v,
            &up,
            &mut |p| {
                seen.push((p.topic, p.partition_index));
                match (p.topic, p.partition_index) {
                    (t, 1) if t == topic_ref(v, "orders", 0) => Some(seal1.clone()),
                    (t, 0) if t == topic_ref(v, "payments", 1) => {
                        // Keep the upstream's values, serve only the
                        // first 50 record bytes (the batches before a cut).
                        let mut r = FetchPartitionResponse::from_upstream(p, &up);
                        let recs = p.records.clone().expect("upstream records");
                        r.records = Some(Cow::Borrowed(&up[recs.start..recs.start + 50]));
                        Some(r)
                    }
                    _ => None,
                }
            },
            &add,
        )
        .unwrap_or_else(|e| panic!("v{v}: {e}"));
        assert_eq!(seen.len(), 6);

        let mut expected = orig.clone();
        expected.responses[0].partitions[1] = k_partition(v, &seal1);
        {
            let p = &mut expected.responses[1].partitions[0];
            // Re-encoded from upstream values: tagged fields dropped,
            // records cut to their first 50 bytes.
            let mut q = PartitionData::default();
            q.partition_index = p.partition_index;
            q.high_watermark = p.high_watermark;
            q.last_stable_offset = p.last_stable_offset;
            q.log_start_offset = p.log_start_offset;
            q.aborted_transactions = p.aborted_transactions.clone().map(|a| {
                a.into_iter()
                    .map(|mut t| {
                        t.unknown_tagged_fields.clear();
                        t
                    })
                    .collect()
            });
            q.preferred_read_replica = p.preferred_read_replica;
            q.records = p.records.as_ref().map(|r| r.slice(..50));
            *p = q;
        }
        expected.responses[1]
            .partitions
            .push(k_partition(v, &local_partitions(8)[1]));
        let mut audit = k_topic(v, "audit", 2);
        audit.partitions = vec![
            k_partition(v, &local_partitions(9)[2]),
            k_partition(v, &local_partitions(9)[0]),
        ];
        expected.responses.push(audit);

        let got: FetchResponse = dec(&out, v);
        assert_eq!(got, expected, "v{v}");
        assert_eq!(out, enc(&expected, v), "v{v} bytes");
        // Untouched partitions' records are byte-identical to the upstream's.
        assert_eq!(
            got.responses[0].partitions[0].records,
            orig.responses[0].partitions[0].records
        );
        if v >= 16 {
            assert_eq!(got.node_endpoints, orig.node_endpoints);
        }

        // Every strict prefix of the upstream body is refused.
        for cut in 0..up.len() {
            assert!(
                splice_fetch_response(v, &up[..cut], &mut |_| None, &add).is_err(),
                "v{v} prefix {cut}"
            );
        }
    }
}

#[test]
fn splice_into_empty_upstream_response() {
    // An incremental fetch with nothing new: upstream returns no topics; the
    // proxy still serves seal batches.
    for v in 4..=18i16 {
        let mut orig = FetchResponse::default();
        if v >= 7 {
            orig.session_id = 5;
        }
        if v >= 12 {
            orig.unknown_tagged_fields = tags(2);
        }
        let up = enc(&orig, v);
        let add = vec![(topic_ref(v, "orders", 0), local_partitions(1))];
        let out = splice_fetch_response(v, &up, &mut |_| None, &add).expect("splice");
        let mut expected = orig.clone();
        let mut t = k_topic(v, "orders", 0);
        t.partitions = local_partitions(1)
            .iter()
            .map(|p| k_partition(v, p))
            .collect();
        expected.responses.push(t);
        assert_eq!(dec::<FetchResponse>(&out, v), expected, "v{v}");
        assert_eq!(out, enc(&expected, v), "v{v}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn splice_random_bytes_never_panics(b in proptest::collection::vec(any::<u8>(), 0..300)) {
        for v in -1..=20i16 {
            let add = vec![(topic_ref(v, "orders", 0), local_partitions(1))];
            let _ = splice_fetch_response(v, &b, &mut |p| {
                Some(FetchPartitionResponse::new(p.partition_index))
            }, &add);
        }
    }

    #[test]
    fn splice_mutated_upstream_never_panics(
        v in 4i16..=18,
        idx in any::<usize>(),
        byte in any::<u8>(),
        cut in any::<usize>(),
    ) {
        let mut b = enc(&upstream(v), v);
        let i = idx % b.len();
        b[i] = byte;
        b.truncate(cut % (b.len() + 1));
        let add = vec![
            (topic_ref(v, "orders", 0), local_partitions(2)),
            (topic_ref(v, "new", 5), local_partitions(3)),
        ];
        if let Ok(out) = splice_fetch_response(v, &b, &mut |p| {
            (p.partition_index == 1).then(|| FetchPartitionResponse::new(1))
        }, &add) {
            // Whatever was accepted yields a walkable response with the
            // additions counted in.
            let mut before = 0usize;
            walk_fetch_response(v, &b, &mut |_| before += 1).expect("input walked");
            let mut after = 0usize;
            walk_fetch_response(v, &out, &mut |_| after += 1).expect("output walks");
            prop_assert_eq!(after, before + 6);
        }
    }
}

/// Dropping upstream partitions (a controlled partition an incremental
/// session still returns): the output is kafka-protocol's encoding of the
/// message without them, and a topic left with none disappears whole.
#[test]
fn splice_dropping_matches_kafka_encoding_all_versions() {
    for v in 4..=18i16 {
        let orig = upstream(v);
        let up = enc(&orig, v);
        // Drop orders/0 and orders/2, and every payments partition.
        let out = splice_fetch_response_dropping(
            v,
            &up,
            &mut |p| {
                p.topic == topic_ref(v, "payments", 1)
                    || (p.topic == topic_ref(v, "orders", 0) && p.partition_index != 1)
            },
            &mut |_| None,
            &[],
        )
        .unwrap();
        let mut want = orig.clone();
        want.responses.truncate(1);
        want.responses[0]
            .partitions
            .retain(|p| p.partition_index == 1);
        assert_eq!(dec::<FetchResponse>(&out, v), want, "v{v}");
        assert_eq!(out, enc(&want, v), "v{v}: byte for byte");
        // Nothing dropped: byte-identical.
        let same =
            splice_fetch_response_dropping(v, &up, &mut |_| false, &mut |_| None, &[]).unwrap();
        assert_eq!(same, up, "v{v}");
    }
}
