//! Cross-check: `__mirror_state` records encoded by the state store's own
//! schema code (`state_store::schema`, written independently) are decoded by
//! `mirrorguard dump --mirror-state --json` with the same field values.

use std::path::Path;

use mirrorguard::dump::{dump_bytes, DumpOptions};
use mirrorguard::records::builder::{build_batch, BatchSpec, RecordSpec};
use mirrorguard::state_store::schema::{
    MirrorPartitionState, MirrorPartitionStateKey, MirrorPartitionStateValue,
    MirrorPidCollisionKey, MirrorPidCollisionValue, MirrorProducerSnapshotKey,
    MirrorProducerSnapshotValue, SnapshotProducer,
};
use serde_json::json;

#[test]
fn state_store_records_decode_in_dump() {
    let topic: [u8; 16] = std::array::from_fn(|i| i as u8 + 1);
    let k3 = MirrorPidCollisionKey {
        topic_id: topic,
        partition: 7,
        source_cluster_id: "MkU3OEVBNTcwNTJENDM2Qg".into(),
        original_pid: 5,
    }
    .encode()
    .unwrap();
    let v3 = MirrorPidCollisionValue {
        salt: 3,
        colliding_cluster_id: "AAAAAAAAAAAAAAAAAAAAAA".into(),
        timestamp_ms: 1_700_000_000_000,
        unknown_tagged_fields: vec![],
    }
    .encode()
    .unwrap();
    let k4 = MirrorPartitionStateKey {
        topic_id: topic,
        partition: 7,
    }
    .encode();
    let v4 = MirrorPartitionStateValue {
        mirror: "east".into(),
        topic_name: "orders".into(),
        state: MirrorPartitionState::Stopped,
        source_cluster_id: "MkU3OEVBNTcwNTJENDM2Qg".into(),
        cut_offset: 1234,
        seal_batches: 2,
        reason: None,
        timestamp_ms: 1_700_000_000_001,
        unknown_tagged_fields: vec![],
    }
    .encode()
    .unwrap();
    let k5 = MirrorProducerSnapshotKey {
        topic_id: topic,
        partition: 7,
    }
    .encode();
    let v5 = MirrorProducerSnapshotValue {
        snapshot_offset: 1234,
        producers: vec![SnapshotProducer {
            producer_id: 4_611_686_108_621_701_125,
            origin_cluster_id: [0x11; 16],
            original_pid: 5,
            producer_epoch: 2,
            last_sequence: 41,
            last_offset: 1200,
            coordinator_epoch: 9,
            txn_first_offset: -1,
            last_timestamp: 1_700_000_000_002,
        }],
        unknown_tagged_fields: vec![],
    }
    .encode()
    .unwrap();

    let recs = [(&k3, &v3), (&k4, &v4), (&k5, &v5)];
    let specs: Vec<RecordSpec<'_>> = recs
        .iter()
        .enumerate()
        .map(|(i, (k, v))| RecordSpec {
            offset_delta: i as i32,
            key: Some(k.as_slice()),
            value: Some(v.as_slice()),
            ..RecordSpec::default()
        })
        .collect();
    let batch = build_batch(&BatchSpec::default(), &specs);
    let mut out = Vec::new();
    let opts = DumpOptions {
        deep_iteration: true,
        json: true,
        mirror_state: true,
    };
    dump_bytes(
        Path::new("00000000000000000000.log"),
        &batch,
        opts,
        &mut out,
    )
    .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let ms: Vec<&serde_json::Value> = v["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["mirrorState"])
        .collect();
    let topic_b64 = "AQIDBAUGBwgJCgsMDQ4PEA";
    assert_eq!(
        ms[0],
        &json!({"key": {"type": "3", "data": {"topicId": topic_b64, "partition": 7, "sourceClusterId": "MkU3OEVBNTcwNTJENDM2Qg", "originalPid": 5}},
                "payload": {"version": "0", "data": {"salt": 3, "collidingClusterId": "AAAAAAAAAAAAAAAAAAAAAA", "timestampMs": 1_700_000_000_000i64}}})
    );
    assert_eq!(
        ms[1],
        &json!({"key": {"type": "4", "data": {"topicId": topic_b64, "partition": 7}},
                "payload": {"version": "0", "data": {"mirror": "east", "topicName": "orders", "state": "STOPPED",
                    "sourceClusterId": "MkU3OEVBNTcwNTJENDM2Qg", "cutOffset": 1234, "sealBatches": 2, "reason": null,
                    "timestampMs": 1_700_000_000_001i64}}})
    );
    assert_eq!(
        ms[2],
        &json!({"key": {"type": "5", "data": {"topicId": topic_b64, "partition": 7}},
                "payload": {"version": "0", "data": {"snapshotOffset": 1234, "producers": [{
                    "producerId": 4_611_686_108_621_701_125i64, "originClusterId": "EREREREREREREREREREREQ",
                    "originalPid": 5, "producerEpoch": 2, "lastSequence": 41, "lastOffset": 1200,
                    "coordinatorEpoch": 9, "txnFirstOffset": -1, "lastTimestamp": 1_700_000_000_002i64}]}}})
    );
}

#[test]
fn source_topology_record_decodes_in_dump() {
    use mirrorguard::mirror::offline::{Broker, PartitionTopology, TopicTopology, Topology};
    let t = Topology {
        source_cluster_id: "MkU3OEVBNTcwNTJENDM2Qg".into(),
        brokers: vec![Broker {
            node_id: 1,
            host: "src-1".into(),
            port: 9092,
        }],
        topics: vec![TopicTopology {
            name: "orders".into(),
            id: [3; 16],
            internal: false,
            partitions: vec![PartitionTopology {
                index: 0,
                leader: 1,
                leader_epoch: 4,
            }],
        }],
    };
    let k = Topology::encode_key("east").unwrap();
    let v = t.encode_value(1_700_000_000_003).unwrap();
    let batch = build_batch(
        &BatchSpec::default(),
        &[RecordSpec {
            key: Some(k.as_slice()),
            value: Some(v.as_slice()),
            ..RecordSpec::default()
        }],
    );
    let mut out = Vec::new();
    let opts = DumpOptions {
        deep_iteration: true,
        json: true,
        mirror_state: true,
    };
    dump_bytes(
        Path::new("00000000000000000000.log"),
        &batch,
        opts,
        &mut out,
    )
    .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(
        v["records"][0]["mirrorState"],
        json!({"key": {"type": "8", "data": {"mirror": "east"}},
               "payload": {"version": "0", "data": {"sourceClusterId": "MkU3OEVBNTcwNTJENDM2Qg",
                   "timestampMs": 1_700_000_000_003i64,
                   "brokers": [{"nodeId": 1, "host": "src-1", "port": 9092}],
                   "topics": [{"name": "orders", "partitions": [{"partition": 0, "leader": 1, "leaderEpoch": 4}]}]}}})
    );
}

/// A segment with every record type 3 to 7 (values, tombstones, a value
/// version newer than this code, an unknown state code) and malformed ones.
fn all_types_segment() -> Vec<u8> {
    use mirrorguard::state_store::schema::{
        MirrorProducerClaimKey, MirrorProducerClaimValue, MirrorProducerSnapshotChunkKey,
        MirrorProducerSnapshotChunkValue,
    };
    let topic: [u8; 16] = std::array::from_fn(|i| i as u8 + 1);
    let producer = SnapshotProducer {
        producer_id: 4_611_686_108_621_701_125,
        origin_cluster_id: [0x11; 16],
        original_pid: 5,
        producer_epoch: 2,
        last_sequence: 41,
        last_offset: 1200,
        coordinator_epoch: 9,
        txn_first_offset: 77,
        last_timestamp: 1_700_000_000_002,
    };
    let k6 = MirrorProducerClaimKey {
        topic_id: topic,
        partition: 3,
        producer_id: 4_611_686_108_621_701_125,
    }
    .encode();
    let v6 = MirrorProducerClaimValue {
        origin_cluster_id: [0x22; 16],
        original_pid: 5,
        timestamp_ms: 1_700_000_000_003,
        unknown_tagged_fields: vec![],
    }
    .encode()
    .unwrap();
    let k7 = MirrorProducerSnapshotChunkKey {
        topic_id: topic,
        partition: 3,
        generation: 12,
        chunk: 1,
    }
    .encode();
    let v7 = MirrorProducerSnapshotChunkValue {
        snapshot_offset: 999,
        chunk_count: 2,
        producers: vec![producer, producer],
        unknown_tagged_fields: vec![(5, vec![1, 2])],
    }
    .encode()
    .unwrap();
    let k4 = MirrorPartitionStateKey {
        topic_id: topic,
        partition: 3,
    }
    .encode();
    let mut v4 = MirrorPartitionStateValue {
        mirror: "west".into(),
        topic_name: "payments".into(),
        state: MirrorPartitionState::Other(9),
        source_cluster_id: "MkU3OEVBNTcwNTJENDM2Qg".into(),
        cut_offset: -1,
        seal_batches: -1,
        reason: Some("operator note".into()),
        timestamp_ms: 1_700_000_000_004,
        unknown_tagged_fields: vec![],
    }
    .encode()
    .unwrap();
    // The same value as written by a newer version that appends a field.
    let mut v4_newer = v4.clone();
    v4_newer[..2].copy_from_slice(&1i16.to_be_bytes());
    v4_newer.extend_from_slice(&[0xde, 0xad]);
    let k5 = MirrorProducerSnapshotKey {
        topic_id: topic,
        partition: 3,
    }
    .encode();
    let v5_empty = MirrorProducerSnapshotValue {
        snapshot_offset: 5,
        producers: vec![],
        unknown_tagged_fields: vec![],
    }
    .encode()
    .unwrap();
    let mut v4_trailing = v4.clone();
    v4_trailing.push(0);
    let mut v4_negative = v4.clone();
    v4_negative[..2].copy_from_slice(&(-3i16).to_be_bytes());
    v4.truncate(v4.len() - 3);
    let v4_truncated = v4;
    let mut k6_long = k6.clone();
    k6_long.push(1);
    let one: &[u8] = &[0];
    type KeyValue<'a> = (Option<&'a [u8]>, Option<&'a [u8]>);
    let records: Vec<KeyValue<'_>> = vec![
        (Some(&k6), Some(&v6)),
        (Some(&k6), None),
        (Some(&k7), Some(&v7)),
        (Some(&k7), None),
        (Some(&k4), Some(&v4_newer)),
        (Some(&k5), Some(&v5_empty)),
        (Some(&k4), Some(&v4_trailing)),
        (Some(&k4), Some(&v4_negative)),
        (Some(&k4), Some(&v4_truncated)),
        (Some(&k6_long), Some(&v6)),
        (Some(one), Some(&v6)),
        (None, Some(&v6)),
        (Some(&k5), Some(one)),
    ];
    let specs: Vec<RecordSpec<'_>> = records
        .iter()
        .enumerate()
        .map(|(i, (k, v))| RecordSpec {
            offset_delta: i as i32,
            key: *k,
            value: *v,
            ..RecordSpec::default()
        })
        .collect();
    build_batch(&BatchSpec::default(), &specs)
}

/// Text output for types 6 and 7, tombstones, a value version newer than
/// this code (read as its v0 prefix), an unknown state code and malformed
/// records, pinned to the output of the dump's earlier, separate decoder.
#[test]
fn all_record_types_and_malformed_records_text() {
    let mut out = Vec::new();
    let opts = DumpOptions {
        deep_iteration: true,
        mirror_state: true,
        ..DumpOptions::default()
    };
    dump_bytes(
        Path::new("__mirror_state-0/00000000000000000000.log"),
        &all_types_segment(),
        opts,
        &mut out,
    )
    .unwrap();
    let text = String::from_utf8(out).unwrap();
    let got: Vec<&str> = text.lines().skip(3).collect();
    let want: Vec<&str> = ALL_TYPES_TEXT.lines().collect();
    assert_eq!(got, want);
}

const ALL_TYPES_TEXT: &str = r#"| offset: 0 CreateTime: 0 keySize: 30 valueSize: 35 sequence: -1 headerKeys: [] key: {"type":"6","data":{"topicId":"AQIDBAUGBwgJCgsMDQ4PEA","partition":3,"producerId":4611686108621701125}} payload: {"version":"0","data":{"originClusterId":"IiIiIiIiIiIiIiIiIiIiIg","originalPid":5,"timestampMs":1700000000003}}
| offset: 1 CreateTime: 0 keySize: 30 valueSize: -1 sequence: -1 headerKeys: [] key: {"type":"6","data":{"topicId":"AQIDBAUGBwgJCgsMDQ4PEA","partition":3,"producerId":4611686108621701125}} payload: <DELETE>
| offset: 2 CreateTime: 0 keySize: 34 valueSize: 154 sequence: -1 headerKeys: [] key: {"type":"7","data":{"topicId":"AQIDBAUGBwgJCgsMDQ4PEA","partition":3,"generation":12,"chunk":1}} payload: {"version":"0","data":{"snapshotOffset":999,"chunkCount":2,"producers":[{"coordinatorEpoch":9,"lastOffset":1200,"lastSequence":41,"lastTimestamp":1700000000002,"originClusterId":"EREREREREREREREREREREQ","originalPid":5,"producerEpoch":2,"producerId":4611686108621701125,"txnFirstOffset":77},{"coordinatorEpoch":9,"lastOffset":1200,"lastSequence":41,"lastTimestamp":1700000000002,"originClusterId":"EREREREREREREREREREREQ","originalPid":5,"producerEpoch":2,"producerId":4611686108621701125,"txnFirstOffset":77}]}}
| offset: 3 CreateTime: 0 keySize: 34 valueSize: -1 sequence: -1 headerKeys: [] key: {"type":"7","data":{"topicId":"AQIDBAUGBwgJCgsMDQ4PEA","partition":3,"generation":12,"chunk":1}} payload: <DELETE>
| offset: 4 CreateTime: 0 keySize: 22 valueSize: 77 sequence: -1 headerKeys: [] key: {"type":"4","data":{"topicId":"AQIDBAUGBwgJCgsMDQ4PEA","partition":3}} payload: {"version":"1","data":{"mirror":"west","topicName":"payments","state":"UNKNOWN(9)","sourceClusterId":"MkU3OEVBNTcwNTJENDM2Qg","cutOffset":-1,"sealBatches":-1,"reason":"operator note","timestampMs":1700000000004}}
| offset: 5 CreateTime: 0 keySize: 22 valueSize: 12 sequence: -1 headerKeys: [] key: {"type":"5","data":{"topicId":"AQIDBAUGBwgJCgsMDQ4PEA","partition":3}} payload: {"version":"0","data":{"snapshotOffset":5,"producers":[]}}
| offset: 6 CreateTime: 0 keySize: 22 valueSize: 76 sequence: -1 headerKeys: [] key: Error at offset 6, skipping. unexpected bytes after the value
| offset: 7 CreateTime: 0 keySize: 22 valueSize: 75 sequence: -1 headerKeys: [] key: Error at offset 7, skipping. invalid value version -3
| offset: 8 CreateTime: 0 keySize: 22 valueSize: 72 sequence: -1 headerKeys: [] key: Error at offset 8, skipping. truncated TimestampMs
| offset: 9 CreateTime: 0 keySize: 31 valueSize: 35 sequence: -1 headerKeys: [] key: Error at offset 9, skipping. unexpected bytes after the key
| offset: 10 CreateTime: 0 keySize: 1 valueSize: 35 sequence: -1 headerKeys: [] key: Error at offset 10, skipping. key shorter than its record type
| offset: 11 CreateTime: 0 keySize: -1 valueSize: 35 sequence: -1 headerKeys: [] key: Error at offset 11, skipping. missing key
| offset: 12 CreateTime: 0 keySize: 22 valueSize: 1 sequence: -1 headerKeys: [] key: Error at offset 12, skipping. value shorter than its version"#;

/// Type 9 (which instance serves a partition), encoded by the state store's
/// own codec: a value, a tombstone, a value version newer than this code,
/// and malformed records, in text and JSON output.
#[test]
fn partition_serving_records_decode_in_dump() {
    use mirrorguard::state_store::schema::serving::{
        MirrorPartitionServingKey, MirrorPartitionServingValue,
    };
    let topic: [u8; 16] = std::array::from_fn(|i| i as u8 + 1);
    let k9 = MirrorPartitionServingKey {
        topic_id: topic,
        partition: 3,
    }
    .encode();
    let v9 = MirrorPartitionServingValue {
        instance_id: "mg-1/127.0.0.1:9000".into(),
        mirror: "east".into(),
        topic_name: "orders".into(),
        from_offset: 1234,
        timestamp_ms: 1_700_000_000_005,
    }
    .encode()
    .unwrap();
    let mut v9_newer = v9.clone();
    v9_newer[..2].copy_from_slice(&1i16.to_be_bytes());
    let mut v9_negative = v9.clone();
    v9_negative[..2].copy_from_slice(&(-1i16).to_be_bytes());
    let v9_truncated = &v9[..v9.len() - 9];
    let mut k9_long = k9.clone();
    k9_long.push(0);
    let k9_short = &k9[..20];
    type KeyValue<'a> = (&'a [u8], Option<&'a [u8]>);
    let records: Vec<KeyValue<'_>> = vec![
        (&k9, Some(&v9)),
        (&k9, None),
        (&k9, Some(&v9_newer)),
        (&k9, Some(&v9_negative)),
        (&k9, Some(v9_truncated)),
        (&k9_long, Some(&v9)),
        (k9_short, Some(&v9)),
    ];
    let specs: Vec<RecordSpec<'_>> = records
        .iter()
        .enumerate()
        .map(|(i, (k, v))| RecordSpec {
            offset_delta: i as i32,
            key: Some(k),
            value: *v,
            ..RecordSpec::default()
        })
        .collect();
    let batch = build_batch(&BatchSpec::default(), &specs);

    let mut out = Vec::new();
    let opts = DumpOptions {
        deep_iteration: true,
        mirror_state: true,
        ..DumpOptions::default()
    };
    dump_bytes(
        Path::new("__mirror_state-0/00000000000000000000.log"),
        &batch,
        opts,
        &mut out,
    )
    .unwrap();
    let text = String::from_utf8(out).unwrap();
    let got: Vec<&str> = text.lines().skip(3).collect();
    let want: Vec<&str> = SERVING_TEXT.lines().collect();
    assert_eq!(got, want);

    let mut out = Vec::new();
    let opts = DumpOptions { json: true, ..opts };
    dump_bytes(
        Path::new("00000000000000000000.log"),
        &batch,
        opts,
        &mut out,
    )
    .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(
        v["records"][0]["mirrorState"],
        json!({"key": {"type": "9", "data": {"topicId": "AQIDBAUGBwgJCgsMDQ4PEA", "partition": 3}},
               "payload": {"version": "0", "data": {"instanceId": "mg-1/127.0.0.1:9000",
                   "mirror": "east", "topicName": "orders", "fromOffset": 1234,
                   "timestampMs": 1_700_000_000_005i64}}})
    );
    assert_eq!(
        v["records"][1]["mirrorState"],
        json!({"key": {"type": "9", "data": {"topicId": "AQIDBAUGBwgJCgsMDQ4PEA", "partition": 3}},
               "payload": null})
    );
}

const SERVING_TEXT: &str = r#"| offset: 0 CreateTime: 0 keySize: 22 valueSize: 51 sequence: -1 headerKeys: [] key: {"type":"9","data":{"topicId":"AQIDBAUGBwgJCgsMDQ4PEA","partition":3}} payload: {"version":"0","data":{"instanceId":"mg-1/127.0.0.1:9000","mirror":"east","topicName":"orders","fromOffset":1234,"timestampMs":1700000000005}}
| offset: 1 CreateTime: 0 keySize: 22 valueSize: -1 sequence: -1 headerKeys: [] key: {"type":"9","data":{"topicId":"AQIDBAUGBwgJCgsMDQ4PEA","partition":3}} payload: <DELETE>
| offset: 2 CreateTime: 0 keySize: 22 valueSize: 51 sequence: -1 headerKeys: [] key: Error at offset 2, skipping. serving value version newer than this code
| offset: 3 CreateTime: 0 keySize: 22 valueSize: 51 sequence: -1 headerKeys: [] key: Error at offset 3, skipping. invalid value version -1
| offset: 4 CreateTime: 0 keySize: 22 valueSize: 42 sequence: -1 headerKeys: [] key: Error at offset 4, skipping. truncated TimestampMs
| offset: 5 CreateTime: 0 keySize: 23 valueSize: 51 sequence: -1 headerKeys: [] key: Error at offset 5, skipping. unexpected bytes after the key
| offset: 6 CreateTime: 0 keySize: 20 valueSize: 51 sequence: -1 headerKeys: [] key: Error at offset 6, skipping. truncated Partition"#;
