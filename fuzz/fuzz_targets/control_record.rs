//! Fuzzes the control-record parsers (key, EndTxnMarker value,
//! MirrorPidResetRecord value) directly, and the barrier builder/parser
//! round trip. Any panic is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mirrorguard::records::builder::build_mirror_pid_reset;
use mirrorguard::records::control::{
    first_control_record, parse_end_txn_marker, parse_key, parse_mirror_pid_reset, parse_record,
    ControlValue,
};

fuzz_target!(|data: &[u8]| {
    let split = usize::from(data.first().copied().unwrap_or(0)) % (data.len() + 1);
    let (key, value) = data.split_at(split);
    let _ = parse_key(key);
    let _ = parse_end_txn_marker(value);
    let _ = parse_mirror_pid_reset(value);
    let _ = parse_record(Some(key), Some(value));
    let _ = parse_record(None, Some(value));
    let _ = parse_record(Some(key), None);

    // Round trip: any UTF-8 id survives the barrier builder and parser.
    if let Ok(id) = std::str::from_utf8(value) {
        let batch = build_mirror_pid_reset(id, 7, 3, 1_700_000_000_000);
        assert!(mirrorguard::records::verify_crc(&batch));
        match first_control_record(&batch).map(|c| c.value) {
            Ok(ControlValue::MirrorPidReset {
                source_cluster_id, ..
            }) => assert_eq!(source_cluster_id, id),
            other => panic!("barrier did not round-trip: {other:?}"),
        }
    }
});
