//! Golden vectors of wire reference section 8, reproduced byte for byte by
//! the builders, plus the CRC-32C check values and the parsers run on them.

use mirrorguard::records::builder::{
    build_abort_marker, build_batch, build_commit_marker, build_control_batch,
    build_mirror_pid_reset, BatchSpec, RecordSpec,
};
use mirrorguard::records::control::{first_control_record, ControlType, ControlValue};
use mirrorguard::records::{self, walk, Entry};

fn hex(s: &str) -> Vec<u8> {
    let digits: String = s.chars().filter(|c| c.is_ascii_hexdigit()).collect();
    (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).unwrap())
        .collect()
}

const VECTOR_A: &str =
    "00 00 00 00 00 00 00 00 | 00 00 00 3d | ff ff ff ff | 02 | 66 36 fc 59 | 00 00 | 00 00 00 00
00 00 00 00 00 00 00 00 | 00 00 00 00 00 00 00 00 | ff ff ff ff ff ff ff ff | ff ff | ff ff ff ff
00 00 00 01 | 16 00 00 00 01 0a 68 65 6c 6c 6f 00";

const VECTOR_B: &str =
    "00 00 00 00 00 00 00 00 | 00 00 00 42 | ff ff ff ff | 02 | 3e 27 48 5e | 00 30 | 00 00 00 00
00 00 00 00 00 00 00 00 | 00 00 00 00 00 00 00 00 | 00 00 00 00 00 00 00 05 | 00 00 | ff ff ff ff
00 00 00 01 | 20 00 00 00 08 00 00 00 01 0c 00 00 00 00 00 00 00";

fn stored_crc(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[17..21].try_into().unwrap())
}

#[test]
fn crc32c_check_values() {
    assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
    assert_eq!(crc32c::crc32c(b"Some String"), 608_512_271);
}

#[test]
fn vector_a_minimal_record() {
    let built = build_batch(
        &BatchSpec::default(),
        &[RecordSpec {
            value: Some(b"hello"),
            ..RecordSpec::default()
        }],
    );
    assert_eq!(built, hex(VECTOR_A));
    assert_eq!(built.len(), 73);
    assert_eq!(stored_crc(&built), 0x6636_FC59);
    assert_eq!(stored_crc(&built), 1_714_879_577);
    assert!(records::verify_crc(&built));
}

#[test]
fn vector_a_prime_null_key_and_value() {
    let built = build_batch(&BatchSpec::default(), &[RecordSpec::default()]);
    assert_eq!(built.len(), 68);
    assert_eq!(stored_crc(&built), 0x34BB_9273);
    assert_eq!(&built[61..], &hex("0c 00 00 00 01 01 00")[..]);
    // Same header as (a) apart from batchLength and CRC.
    let a = hex(VECTOR_A);
    assert_eq!(&built[..8], &a[..8]);
    assert_eq!(&built[12..17], &a[12..17]);
    assert_eq!(&built[21..61], &a[21..61]);
    assert!(records::verify_crc(&built));
}

#[test]
fn vector_a_with_pid_minus_two() {
    let built = build_batch(
        &BatchSpec {
            producer_id: -2,
            producer_epoch: 0,
            base_sequence: 0,
            ..BatchSpec::default()
        },
        &[RecordSpec {
            value: Some(b"hello"),
            ..RecordSpec::default()
        }],
    );
    assert_eq!(stored_crc(&built), 0x7612_52A7);
}

#[test]
fn vector_b_commit_marker() {
    let built = build_commit_marker(5, 0, 0, 0, 0, -1);
    assert_eq!(built, hex(VECTOR_B));
    assert_eq!(built.len(), 78);
    assert_eq!(stored_crc(&built), 0x3E27_485E);
    assert_eq!(stored_crc(&built), 1_042_761_822);
    // The CRC does not cover the leader epoch.
    let stamped = build_commit_marker(5, 0, 0, 0, 0, 7);
    assert_eq!(stored_crc(&stamped), 0x3E27_485E);
    assert!(records::verify_crc(&stamped));
}

#[test]
fn abort_variant() {
    let built = build_abort_marker(5, 0, 0, 0, 0, -1);
    let mut expected = hex(VECTOR_B);
    expected[17..21].copy_from_slice(&0xCA19_9E16u32.to_be_bytes());
    expected[66..70].copy_from_slice(&[0, 0, 0, 0]);
    assert_eq!(built, expected);
    assert_eq!(stored_crc(&built), 0xCA19_9E16);
}

#[test]
fn type_7_variant() {
    let built = build_control_batch(7, &[0, 0, 0, 0, 0, 0], 5, 0, 0, 0, -1);
    let mut expected = hex(VECTOR_B);
    expected[17..21].copy_from_slice(&0x0D79_500Cu32.to_be_bytes());
    expected[66..70].copy_from_slice(&[0, 0, 0, 7]);
    assert_eq!(built, expected);
    assert_eq!(stored_crc(&built), 0x0D79_500C);
}

#[test]
fn walker_reads_vector_b_header() {
    let b = hex(VECTOR_B);
    let entries: Vec<_> = walk(&b).collect();
    assert_eq!(entries.len(), 1);
    let Ok(Entry::V2(h)) = &entries[0] else {
        panic!("expected a v2 batch, got {entries:?}")
    };
    assert_eq!(h.base_offset, 0);
    assert_eq!(h.batch_length, 66);
    assert_eq!(h.partition_leader_epoch, -1);
    assert_eq!(h.magic, 2);
    assert_eq!(h.crc, 0x3E27_485E);
    assert_eq!(h.attributes, 0x30);
    assert!(h.is_transactional() && h.is_control());
    assert_eq!(h.producer_id, 5);
    assert_eq!(h.producer_epoch, 0);
    assert_eq!(h.base_sequence, -1);
    assert_eq!(h.last_sequence(), -1);
    assert_eq!(h.records_count, 1);
    assert_eq!(h.range, 0..78);
    assert_eq!(h.last_offset(), 0);
}

#[test]
fn control_records_parse() {
    let b = hex(VECTOR_B);
    let c = first_control_record(&b).unwrap();
    assert_eq!(c.key.control_type, ControlType::Commit);
    assert_eq!(
        c.value,
        ControlValue::EndTxnMarker {
            version: 0,
            coordinator_epoch: 0
        }
    );
    let a = build_abort_marker(9, 3, 17, 1000, 40, 2);
    let c = first_control_record(&a).unwrap();
    assert_eq!(c.key.control_type, ControlType::Abort);
    assert_eq!(
        c.value,
        ControlValue::EndTxnMarker {
            version: 0,
            coordinator_epoch: 17
        }
    );
    let t9 = build_control_batch(9, b"whatever", -1, -1, 0, 0, 0);
    let c = first_control_record(&t9).unwrap();
    assert_eq!(c.key.control_type, ControlType::Unknown(9));
    assert_eq!(c.value, ControlValue::Unknown);
    // A data batch is not a control batch.
    assert!(first_control_record(&hex(VECTOR_A)).is_err());
}

#[test]
fn barrier_layout() {
    let id = "MkU3OEVBNTcwNTJENDM2Qg";
    let b = build_mirror_pid_reset(id, 1234, 7, 1_700_000_000_000);
    let Some(Ok(Entry::V2(h))) = walk(&b).next() else {
        panic!("barrier must walk as one v2 batch")
    };
    assert_eq!(h.base_offset, 1234);
    assert_eq!(h.partition_leader_epoch, 7);
    assert_eq!(
        h.attributes, 0x20,
        "control only: not transactional, uncompressed"
    );
    assert_eq!(
        (h.producer_id, h.producer_epoch, h.base_sequence),
        (-1, -1, -1)
    );
    assert_eq!(h.records_count, 1);
    assert_eq!(h.base_timestamp, 1_700_000_000_000);
    assert_eq!(h.max_timestamp, 1_700_000_000_000);
    assert!(records::verify_crc(&b));
    // Record: key 00 00 00 07; value = version 0, compact string, no tags.
    let mut value = vec![0u8, 0, (id.len() + 1) as u8];
    value.extend_from_slice(id.as_bytes());
    value.push(0);
    let mut rec = vec![0u8, 0, 0, 0x08, 0, 0, 0, 7, (value.len() * 2) as u8];
    rec.extend_from_slice(&value);
    rec.push(0);
    let mut expected_records = vec![(rec.len() * 2) as u8];
    expected_records.extend_from_slice(&rec);
    assert_eq!(&b[61..], &expected_records[..]);
    let c = first_control_record(&b).unwrap();
    assert_eq!(c.key.control_type, ControlType::MirrorPidReset);
    assert_eq!(
        c.value,
        ControlValue::MirrorPidReset {
            version: 0,
            source_cluster_id: id
        }
    );
}

#[test]
fn rewrite_vector_b() {
    let mut b = hex(VECTOR_B);
    let orig = b.clone();
    assert!(
        !records::rewrite_producer_id(&mut b, 5),
        "same PID: no change"
    );
    assert_eq!(b, orig);
    assert!(records::rewrite_producer_id(
        &mut b,
        4_611_686_108_621_701_125
    ));
    assert!(records::verify_crc(&b));
    assert_eq!(&b[43..51], &4_611_686_108_621_701_125i64.to_be_bytes());
    // Equal to building the marker with the new PID directly.
    assert_eq!(
        b,
        build_commit_marker(4_611_686_108_621_701_125, 0, 0, 0, 0, -1)
    );
}

#[test]
fn rewrite_keeps_a_corrupt_batch_corrupt() {
    let mut b = hex(VECTOR_B);
    b[70] ^= 0x40; // corrupt a record byte
    assert!(!records::verify_crc(&b));
    let mut verified = b.clone();
    // The hot-path rewrite never reads the records, so it cannot tell...
    assert_eq!(
        records::rewrite_producer_id_checked(&mut b, 77),
        records::RewriteOutcome::Rewritten
    );
    // ...but the verifying variant does, and writes the very same bytes.
    assert_eq!(
        records::rewrite_producer_id_verified(&mut verified, 77),
        records::RewriteOutcome::RewrittenCrcWasInvalid
    );
    assert_eq!(b, verified);
    assert!(
        !records::verify_crc(&b),
        "a corrupt batch must not be laundered"
    );
    // Undoing the corruption shows the CRC was shifted by exactly the PID delta.
    b[70] ^= 0x40;
    assert!(records::verify_crc(&b));
}
