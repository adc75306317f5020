//! Schema tests: byte-exact encodings against the SPEC tables, round trips,
//! and hostile input.

use super::closings::MIN_CLOSING_ENTRY;
use super::*;

fn tid() -> [u8; 16] {
    let mut t = [0u8; 16];
    for (i, b) in t.iter_mut().enumerate() {
        *b = i as u8 + 1;
    }
    t
}

/// The type-3 record of SPEC 2.2, checked byte for byte against bytes
/// written out by hand from the SPEC tables.
#[test]
fn collision_record_matches_hand_computed_bytes() {
    let key = MirrorPidCollisionKey {
        topic_id: tid(),
        partition: 7,
        source_cluster_id: "abc".into(),
        original_pid: 5,
    };
    let value = MirrorPidCollisionValue {
        salt: 1,
        colliding_cluster_id: "xy".into(),
        timestamp_ms: 0x0102_0304_0506_0708,
        unknown_tagged_fields: vec![],
    };
    #[rustfmt::skip]
    let want_key: &[u8] = &[
        0x00, 0x03,                                     // record type 3
        1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, // TopicId
        0x00, 0x00, 0x00, 0x07,                         // Partition 7
        0x00, 0x03, b'a', b'b', b'c',                   // SourceClusterId: int16 len 3
        0, 0, 0, 0, 0, 0, 0, 5,                         // OriginalPid 5
    ];
    #[rustfmt::skip]
    let want_value: &[u8] = &[
        0x00, 0x00,                                     // version 0
        0, 0, 0, 0, 0, 0, 0, 1,                         // Salt 1
        0x03, b'x', b'y',                               // CollidingClusterId: uvarint len+1 = 3
        1, 2, 3, 4, 5, 6, 7, 8,                         // TimestampMs
        0x00,                                           // no tagged fields
    ];
    assert_eq!(key.encode().unwrap(), want_key);
    assert_eq!(value.encode().unwrap(), want_value);
    assert_eq!(
        decode(want_key, Some(want_value)).unwrap(),
        StateRecord::PidCollision {
            key,
            value: Some(value)
        }
    );
}

#[test]
fn tombstones_unknown_and_newer() {
    let k = MirrorPartitionStateKey {
        topic_id: tid(),
        partition: 1,
    };
    assert_eq!(
        decode(&k.encode(), None).unwrap(),
        StateRecord::PartitionState {
            key: k,
            value: None
        }
    );
    assert_eq!(
        decode(&[0, 9, 1, 2, 3], Some(b"zz")).unwrap(),
        StateRecord::Unknown { record_type: 9 }
    );
    assert_eq!(
        decode(&k.encode(), Some(&[0, 1, 0xff])).unwrap(),
        StateRecord::NewerVersion {
            key: StateKey::PartitionState(k),
            version: 1
        }
    );
    assert!(matches!(decode(&[0], None), Err(SchemaError::ShortKey(1))));
    assert!(decode(&k.encode(), Some(&[0xff, 0xff])).is_err());
    let mut long = k.encode();
    long.push(0);
    assert!(matches!(
        decode(&long, None),
        Err(SchemaError::TrailingBytes { what: "key", .. })
    ));
}

#[test]
fn unknown_tags_round_trip() {
    let k = MirrorPartitionStateKey {
        topic_id: tid(),
        partition: 3,
    };
    let v = MirrorPartitionStateValue {
        mirror: "m1".into(),
        topic_name: "orders".into(),
        state: MirrorPartitionState::Other(9),
        source_cluster_id: "MkU3OEVBNTcwNTJENDM2Qg".into(),
        cut_offset: -1,
        seal_batches: -1,
        reason: None,
        timestamp_ms: 12,
        unknown_tagged_fields: vec![(2, vec![1, 2]), (7, vec![])],
    };
    let bytes = v.encode().unwrap();
    assert_eq!(
        decode(&k.encode(), Some(&bytes)).unwrap(),
        StateRecord::PartitionState {
            key: k,
            value: Some(v)
        }
    );
}

#[test]
fn claim_record_round_trips_and_is_small() {
    let key = MirrorProducerClaimKey {
        topic_id: tid(),
        partition: 7,
        producer_id: 0x1234_5678,
    };
    let value = MirrorProducerClaimValue {
        origin_cluster_id: [9; 16],
        original_pid: 42,
        timestamp_ms: 1_700_000_000_000,
        unknown_tagged_fields: Vec::new(),
    };
    let rec = StateRecord::ProducerClaim {
        key,
        value: Some(value.clone()),
    };
    let (k, v) = rec.encode().unwrap().unwrap();
    assert_eq!(k.len(), 30);
    assert_eq!(v.as_ref().unwrap().len(), 35);
    assert_eq!(&k[..2], &[0, 6]);
    assert_eq!(decode(&k, v.as_deref()).unwrap(), rec);
    assert_eq!(
        decode(&k, None).unwrap(),
        StateRecord::ProducerClaim { key, value: None }
    );
    // Truncated or over-long records of a known type are errors, never panics.
    assert!(decode(&k[..29], v.as_deref()).is_err());
    assert!(decode(&k, Some(&v.as_ref().unwrap()[..20])).is_err());
    let mut newer = v.unwrap();
    newer[1] = 1;
    assert!(matches!(
        decode(&k, Some(&newer)).unwrap(),
        StateRecord::NewerVersion { version: 1, .. }
    ));
}

#[test]
fn snapshot_chunk_round_trips() {
    let key = MirrorProducerSnapshotChunkKey {
        topic_id: tid(),
        partition: 3,
        generation: 1_700_000_000_000,
        chunk: 2,
    };
    let p = SnapshotProducer {
        producer_id: 5,
        origin_cluster_id: [1; 16],
        original_pid: 6,
        producer_epoch: 0,
        last_sequence: 9,
        last_offset: 100,
        coordinator_epoch: -1,
        txn_first_offset: -1,
        last_timestamp: 7,
    };
    let rec = StateRecord::ProducerSnapshotChunk {
        key,
        value: Some(MirrorProducerSnapshotChunkValue {
            snapshot_offset: 101,
            chunk_count: 4,
            producers: vec![p; 3],
            unknown_tagged_fields: Vec::new(),
        }),
    };
    let (k, v) = rec.encode().unwrap().unwrap();
    assert_eq!(k.len(), 34);
    assert_eq!(
        v.as_ref().unwrap().len(),
        2 + 8 + 4 + 1 + 3 * MIN_PRODUCER_ENTRY + 1
    );
    assert_eq!(decode(&k, v.as_deref()).unwrap(), rec);
    assert!(decode(&k[..33], v.as_deref()).is_err());
}

/// The closings ride in tagged field 0 of a v0 snapshot value: a reader
/// that does not know them decodes the producers as before and keeps
/// the field opaque; one that does gets them back.
#[test]
fn snapshot_closings_are_an_optional_tagged_field() {
    let closings = SnapshotClosings {
        kept_from: 40,
        dropped_upto: -1,
        closings: vec![SnapshotClosing {
            marker_offset: 44,
            producer_id: 5,
            producer_epoch: 2,
            first_offset: 12,
            coordinator_epoch: 3,
            origin_cluster_id: [9; 16],
            original_pid: 6,
        }],
    };
    let tag = closings.encode_tag().unwrap();
    assert_eq!(tag.0, SNAPSHOT_CLOSINGS_TAG);
    assert_eq!(tag.1.len(), 8 + 8 + 1 + MIN_CLOSING_ENTRY + 1);
    let value = MirrorProducerSnapshotValue {
        snapshot_offset: 45,
        producers: vec![SnapshotProducer {
            producer_id: 5,
            origin_cluster_id: [9; 16],
            original_pid: 6,
            producer_epoch: 2,
            last_sequence: 0,
            last_offset: 43,
            coordinator_epoch: 4,
            txn_first_offset: -1,
            last_timestamp: 7,
        }],
        unknown_tagged_fields: vec![tag],
    };
    let k = MirrorProducerSnapshotKey {
        topic_id: tid(),
        partition: 0,
    }
    .encode();
    let v = value.encode().unwrap();
    let StateRecord::ProducerSnapshot {
        value: Some(back), ..
    } = decode(&k, Some(&v)).unwrap()
    else {
        panic!("a type-5 record");
    };
    assert_eq!(back, value);
    assert_eq!(
        SnapshotClosings::from_tags(&back.unknown_tagged_fields).unwrap(),
        Some(closings)
    );
    assert_eq!(SnapshotClosings::from_tags(&[]).unwrap(), None);
    // Hostile bytes: an error, never a panic or a huge allocation.
    let bad = vec![(SNAPSHOT_CLOSINGS_TAG, vec![0u8; 17])];
    assert!(SnapshotClosings::from_tags(&bad).is_err());
    let mut huge = vec![0u8; 16];
    huge.extend_from_slice(&[0xff, 0xff, 0xff, 0x0f]);
    assert!(SnapshotClosings::from_tags(&[(SNAPSHOT_CLOSINGS_TAG, huge)]).is_err());
}
