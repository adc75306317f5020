//! The guard's parsers, splitter and answers of the writes other than
//! Produce (`handlers::guarded_writes`): every version of AddPartitionsToTxn,
//! WriteTxnMarkers, DeleteRecords, CreatePartitions and DeleteTopics,
//! flexible ones included, against the independent `kafka-protocol` crate
//! (requests encoded with it, answers decoded with it).

mod handlers_common;

use handlers_common::{dec, enc, s};
use kafka_protocol::messages::*;
use mirrorguard::handlers::guarded_writes::*;
use mirrorguard::wire::Writer;

fn names(req: &WriteRequest<'_>) -> Vec<(Option<String>, Option<Vec<i32>>)> {
    req.groups
        .iter()
        .flat_map(|g| g.topics.iter())
        .map(|t| {
            (
                t.name.map(str::to_string),
                t.partitions
                    .as_ref()
                    .map(|p| p.iter().map(|(i, _)| *i).collect()),
            )
        })
        .collect()
}

fn delete_records(v: i16) -> Vec<u8> {
    let mut req = DeleteRecordsRequest::default();
    req.timeout_ms = 500;
    for (t, ps) in [("m", vec![0, 1]), ("l", vec![3])] {
        let mut dt = delete_records_request::DeleteRecordsTopic::default();
        dt.name = TopicName(s(t));
        for p in ps {
            let mut dp = delete_records_request::DeleteRecordsPartition::default();
            dp.partition_index = p;
            dp.offset = 7;
            dt.partitions.push(dp);
        }
        req.topics.push(dt);
    }
    enc(&req, v)
}

#[test]
fn delete_records_parse_split_answer_merge_every_version() {
    for v in 0..=2 {
        let body = delete_records(v);
        let req = parse_write_request(DELETE_RECORDS, v, &body).unwrap();
        assert_eq!(req.end, body.len());
        assert_eq!(
            names(&req),
            vec![
                (Some("m".into()), Some(vec![0, 1])),
                (Some("l".into()), Some(vec![3]))
            ]
        );
        assert!(req.splittable());
        // Keep m-1 and l-3: m-0 goes.
        let out = split_write_request(&req, &body, &[vec![false, true], vec![true]])
            .unwrap()
            .unwrap();
        let d: DeleteRecordsRequest = dec(&out, v);
        assert_eq!(d.topics.len(), 2);
        assert_eq!(d.topics[0].partitions.len(), 1);
        assert_eq!(d.topics[0].partitions[0].partition_index, 1);
        assert_eq!(d.timeout_ms, 500);
        // Keep only l.
        let out = split_write_request(&req, &body, &[vec![false, false], vec![true]])
            .unwrap()
            .unwrap();
        let d: DeleteRecordsRequest = dec(&out, v);
        assert_eq!(d.topics.len(), 1);
        assert_eq!(d.topics[0].name.0.as_str(), "l");
        // Everything kept: the original goes.
        assert_eq!(
            split_write_request(&req, &body, &[vec![true, true], vec![true]]).unwrap(),
            None
        );
        // The guard's answer and its merge into an upstream response.
        let refused = vec![TopicAnswer {
            name: Some("m".into()),
            id: None,
            error_code: 44,
            message: None,
            partitions: vec![(0, 44)],
        }];
        let body = build_write_response(
            DELETE_RECORDS,
            v,
            &[GroupAnswer {
                transactional_id: None,
                producer_id: -1,
                topics: refused.clone(),
            }],
        )
        .unwrap();
        let r: DeleteRecordsResponse = dec(&body, v);
        assert_eq!(r.topics[0].partitions[0].error_code, 44);
        assert_eq!(r.topics[0].partitions[0].low_watermark, -1);
        let mut up = DeleteRecordsResponse::default();
        up.throttle_time_ms = 9;
        let mut ut = delete_records_response::DeleteRecordsTopicResult::default();
        ut.name = TopicName(s("l"));
        let mut up_p = delete_records_response::DeleteRecordsPartitionResult::default();
        up_p.partition_index = 3;
        up_p.low_watermark = 7;
        ut.partitions.push(up_p);
        up.topics.push(ut);
        let (entries, n) = encode_result_entries(DELETE_RECORDS, v, &refused).unwrap();
        let merged = merge_write_response(DELETE_RECORDS, v, &enc(&up, v), &entries, n).unwrap();
        let m: DeleteRecordsResponse = dec(&merged, v);
        assert_eq!(m.throttle_time_ms, 9);
        assert_eq!(m.topics.len(), 2);
        assert_eq!(m.topics[0].partitions[0].low_watermark, 7);
        assert_eq!(m.topics[1].name.0.as_str(), "m");
        assert_eq!(m.topics[1].partitions[0].error_code, 44);
    }
}

#[test]
fn create_partitions_parse_split_answer_merge_every_version() {
    for v in 0..=3 {
        let mut req = CreatePartitionsRequest::default();
        req.timeout_ms = 100;
        req.validate_only = true;
        for (t, a) in [("m", true), ("l", false)] {
            let mut ct = create_partitions_request::CreatePartitionsTopic::default();
            ct.name = TopicName(s(t));
            ct.count = 3;
            if a {
                let mut asg = create_partitions_request::CreatePartitionsAssignment::default();
                asg.broker_ids = vec![BrokerId(1), BrokerId(2)];
                ct.assignments = Some(vec![asg]);
            }
            req.topics.push(ct);
        }
        let body = enc(&req, v);
        let parsed = parse_write_request(CREATE_PARTITIONS, v, &body).unwrap();
        assert_eq!(parsed.end, body.len());
        assert_eq!(
            names(&parsed),
            vec![(Some("m".into()), None), (Some("l".into()), None)]
        );
        let out = split_write_request(&parsed, &body, &[vec![false], vec![true]])
            .unwrap()
            .unwrap();
        let d: CreatePartitionsRequest = dec(&out, v);
        assert_eq!(d.topics.len(), 1);
        assert_eq!(d.topics[0].name.0.as_str(), "l");
        assert!(d.validate_only);
        let refused = vec![TopicAnswer {
            name: Some("m".into()),
            id: None,
            error_code: 44,
            message: Some("mirrored by mirror 'x'".into()),
            partitions: vec![],
        }];
        let mut up = CreatePartitionsResponse::default();
        let mut ur = create_partitions_response::CreatePartitionsTopicResult::default();
        ur.name = TopicName(s("l"));
        up.results.push(ur);
        let (entries, n) = encode_result_entries(CREATE_PARTITIONS, v, &refused).unwrap();
        let m: CreatePartitionsResponse = dec(
            &merge_write_response(CREATE_PARTITIONS, v, &enc(&up, v), &entries, n).unwrap(),
            v,
        );
        assert_eq!(m.results.len(), 2);
        assert_eq!(m.results[1].error_code, 44);
        assert_eq!(
            m.results[1].error_message.as_ref().map(|x| x.as_str()),
            Some("mirrored by mirror 'x'")
        );
        let whole: CreatePartitionsResponse = dec(
            &build_write_response(
                CREATE_PARTITIONS,
                v,
                &[GroupAnswer {
                    transactional_id: None,
                    producer_id: -1,
                    topics: refused,
                }],
            )
            .unwrap(),
            v,
        );
        assert_eq!(whole.results[0].error_code, 44);
    }
}

#[test]
fn delete_topics_by_name_and_by_id_every_version() {
    for v in 1..=6 {
        let body = if v >= 6 {
            // By hand: the second entry names its topic by id only.
            let mut b = Vec::new();
            let mut w = Writer::new(&mut b);
            w.put_array_len_v(true, Some(2), "t").unwrap();
            w.put_nullable_string_v(true, Some("m"), "n").unwrap();
            w.put_uuid(&[0; 16]);
            w.put_uvarint(0);
            w.put_nullable_string_v(true, None, "n").unwrap();
            w.put_uuid(&[9; 16]);
            w.put_uvarint(0);
            w.put_i32(100);
            w.put_uvarint(0);
            b
        } else {
            let mut req = DeleteTopicsRequest::default();
            req.timeout_ms = 100;
            req.topic_names = vec![TopicName(s("m")), TopicName(s("l"))];
            enc(&req, v)
        };
        let parsed = parse_write_request(DELETE_TOPICS, v, &body).unwrap();
        assert_eq!(parsed.end, body.len());
        let g = &parsed.groups[0];
        assert_eq!(g.topics[0].name, Some("m"));
        if v >= 6 {
            assert_eq!(g.topics[0].id, None);
            assert_eq!(g.topics[1].name, None);
            assert_eq!(g.topics[1].id, Some([9; 16]));
        } else {
            assert_eq!(g.topics[1].name, Some("l"));
        }
        let out = split_write_request(&parsed, &body, &[vec![false], vec![true]])
            .unwrap()
            .unwrap();
        let d: DeleteTopicsRequest = dec(&out, v);
        if v >= 6 {
            assert_eq!(d.topics.len(), 1);
            assert_eq!(d.topics[0].topic_id.as_bytes(), &[9; 16]);
        } else {
            assert_eq!(d.topic_names.len(), 1);
            assert_eq!(d.topic_names[0].0.as_str(), "l");
        }
        let refused = vec![TopicAnswer {
            name: Some("m".into()),
            id: None,
            error_code: 44,
            message: Some("no".into()),
            partitions: vec![],
        }];
        let mut up = DeleteTopicsResponse::default();
        let mut ur = delete_topics_response::DeletableTopicResult::default();
        ur.name = Some(TopicName(s("l")));
        up.responses.push(ur);
        let (entries, n) = encode_result_entries(DELETE_TOPICS, v, &refused).unwrap();
        let m: DeleteTopicsResponse = dec(
            &merge_write_response(DELETE_TOPICS, v, &enc(&up, v), &entries, n).unwrap(),
            v,
        );
        assert_eq!(m.responses.len(), 2);
        assert_eq!(m.responses[1].error_code, 44);
        assert_eq!(
            m.responses[1].name.as_ref().map(|n| n.0.as_str()),
            Some("m")
        );
        if v >= 5 {
            assert_eq!(
                m.responses[1].error_message.as_ref().map(|x| x.as_str()),
                Some("no")
            );
        }
    }
}

#[test]
fn add_partitions_to_txn_client_and_batched_versions() {
    for v in 0..=5 {
        let mut req = AddPartitionsToTxnRequest::default();
        let mut topic = add_partitions_to_txn_request::AddPartitionsToTxnTopic::default();
        topic.name = TopicName(s("m"));
        topic.partitions = vec![0, 2];
        if v >= 4 {
            let mut t = add_partitions_to_txn_request::AddPartitionsToTxnTransaction::default();
            t.transactional_id = TransactionalId(s("tx"));
            t.producer_id = ProducerId(42);
            t.topics = vec![topic];
            req.transactions = vec![t];
        } else {
            req.v3_and_below_transactional_id = TransactionalId(s("tx"));
            req.v3_and_below_producer_id = ProducerId(42);
            req.v3_and_below_topics = vec![topic];
        }
        let body = enc(&req, v);
        let parsed = parse_write_request(ADD_PARTITIONS_TO_TXN, v, &body).unwrap();
        assert_eq!(parsed.end, body.len());
        assert!(!parsed.splittable());
        assert_eq!(parsed.groups[0].transactional_id, Some("tx"));
        assert_eq!(parsed.groups[0].producer_id, 42);
        assert_eq!(names(&parsed), vec![(Some("m".into()), Some(vec![0, 2]))]);
        let answer = GroupAnswer {
            transactional_id: Some("tx".into()),
            producer_id: 42,
            topics: vec![TopicAnswer {
                name: Some("m".into()),
                id: None,
                error_code: 0,
                message: None,
                partitions: vec![(0, 44), (2, 55)],
            }],
        };
        let r: AddPartitionsToTxnResponse = dec(
            &build_write_response(ADD_PARTITIONS_TO_TXN, v, &[answer]).unwrap(),
            v,
        );
        let topics = if v >= 4 {
            assert_eq!(r.results_by_transaction.len(), 1);
            r.results_by_transaction[0].topic_results.clone()
        } else {
            r.results_by_topic_v3_and_below.clone()
        };
        assert_eq!(topics[0].results_by_partition[0].partition_error_code, 44);
        assert_eq!(topics[0].results_by_partition[1].partition_error_code, 55);
    }
}

#[test]
fn write_txn_markers_every_version() {
    for v in 1..=1 {
        let mut req = WriteTxnMarkersRequest::default();
        let mut m = write_txn_markers_request::WritableTxnMarker::default();
        m.producer_id = ProducerId(7);
        let mut t = write_txn_markers_request::WritableTxnMarkerTopic::default();
        t.name = TopicName(s("m"));
        t.partition_indexes = vec![1];
        m.topics = vec![t];
        req.markers = vec![m];
        let body = enc(&req, v);
        let parsed = parse_write_request(WRITE_TXN_MARKERS, v, &body).unwrap();
        assert_eq!(parsed.end, body.len());
        assert_eq!(parsed.groups[0].producer_id, 7);
        assert_eq!(names(&parsed), vec![(Some("m".into()), Some(vec![1]))]);
        let r: WriteTxnMarkersResponse = dec(
            &build_write_response(
                WRITE_TXN_MARKERS,
                v,
                &[GroupAnswer {
                    transactional_id: None,
                    producer_id: 7,
                    topics: vec![TopicAnswer {
                        name: Some("m".into()),
                        id: None,
                        error_code: 0,
                        message: None,
                        partitions: vec![(1, 44)],
                    }],
                }],
            )
            .unwrap(),
            v,
        );
        assert_eq!(r.markers[0].producer_id, ProducerId(7));
        assert_eq!(r.markers[0].topics[0].partitions[0].error_code, 44);
    }
    // v0 (not flexible) and v2 (with transaction_version) by hand.
    for v in [0i16, 2] {
        let flexible = v >= 1;
        let mut body = Vec::new();
        let mut w = Writer::new(&mut body);
        w.put_array_len_v(flexible, Some(1), "m").unwrap();
        w.put_i64(7);
        w.put_i16(0);
        w.put_bool(false);
        w.put_array_len_v(flexible, Some(1), "t").unwrap();
        w.put_string_v(flexible, "m", "n").unwrap();
        w.put_array_len_v(flexible, Some(1), "p").unwrap();
        w.put_i32(3);
        if flexible {
            w.put_uvarint(0);
        }
        w.put_i32(5);
        if v >= 2 {
            w.put_i8(2);
        }
        if flexible {
            w.put_uvarint(0);
            w.put_uvarint(0);
        }
        let parsed = parse_write_request(WRITE_TXN_MARKERS, v, &body).unwrap();
        assert_eq!(parsed.end, body.len());
        assert_eq!(names(&parsed), vec![(Some("m".into()), Some(vec![3]))]);
    }
}

#[test]
fn truncated_and_hostile_bodies_are_errors() {
    let body = delete_records(2);
    for cut in 0..body.len() {
        assert!(parse_write_request(DELETE_RECORDS, 2, &body[..cut]).is_err());
    }
    // A huge count is refused before anything is allocated.
    let hostile = [0x7f, 0xff, 0xff, 0xff, 0, 0];
    for (k, r) in GUARDED_WRITE_VERSIONS.iter() {
        for v in r.clone() {
            assert!(parse_write_request(*k, v, &hostile).is_err());
        }
    }
    assert!(parse_write_request(DELETE_RECORDS, 3, &body).is_err());
    assert!(parse_write_request(0, 3, &body).is_err());
}
