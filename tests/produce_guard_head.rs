//! The produce guard's head decision (`partitions_in_head`): for any Produce
//! request (v3-v12, encoded by the independent `kafka-protocol` crate) and
//! any prefix of its body, the answer is either "not decidable" or exactly
//! the request's `(topic, partition)` pairs, and the whole body always
//! decides. A wrong or partial list would let a refused partition stream.

mod handlers_common;

use bytes::Bytes;
use handlers_common::{enc, s};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ProduceRequest, TopicName};
use mirrorguard::filter::produce_guard::partitions_in_head;
use proptest::prelude::*;

const NAMES: [&str; 4] = ["a", "orders", "payments-eu", "t"];

/// Topics as (name index, partitions as (index, records length or null)).
type Topics = Vec<(usize, Vec<(i32, Option<usize>)>)>;

fn request() -> impl Strategy<Value = (i16, Topics)> {
    (
        3i16..=12,
        proptest::collection::vec(
            (
                0usize..NAMES.len(),
                proptest::collection::vec(
                    (0i32..64, proptest::option::weighted(0.9, 0usize..400)),
                    0..4,
                ),
            ),
            0..4,
        ),
    )
}

proptest! {
    #[test]
    fn head_decisions_are_all_or_nothing((v, topics) in request(), cuts in proptest::collection::vec(any::<prop::sample::Index>(), 1..12)) {
        let mut req = ProduceRequest::default();
        req.acks = -1;
        req.timeout_ms = 1000;
        req.topic_data = topics
            .iter()
            .map(|(t, parts)| {
                let mut td = TopicProduceData::default();
                td.name = TopicName(s(NAMES[*t]));
                td.partition_data = parts
                    .iter()
                    .map(|(p, len)| {
                        let mut d = PartitionProduceData::default();
                        d.index = *p;
                        d.records = len.map(|n| Bytes::from(vec![7u8; n]));
                        d
                    })
                    .collect();
                td
            })
            .collect();
        let body = enc(&req, v);
        let all: Vec<(&str, i32)> = topics
            .iter()
            .flat_map(|(t, parts)| parts.iter().map(move |(p, _)| (NAMES[*t], *p)))
            .collect();
        prop_assert_eq!(partitions_in_head(v, &body, body.len()), Some(all.clone()));
        for cut in cuts {
            let at = cut.index(body.len() + 1);
            if let Some(got) = partitions_in_head(v, &body[..at], body.len()) {
                prop_assert_eq!(got, all.clone(), "prefix of {} bytes", at);
            }
        }
    }

    /// Random bytes never panic, whatever the claimed body length.
    #[test]
    fn random_heads_never_panic(v in 0i16..16, b in proptest::collection::vec(any::<u8>(), 0..200), extra in 0usize..1000) {
        let _ = partitions_in_head(v, &b, b.len() + extra);
    }
}
