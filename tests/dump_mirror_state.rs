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
