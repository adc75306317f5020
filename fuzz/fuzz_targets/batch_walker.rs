//! Fuzzes the record-batch walker and everything layered on it: header
//! decoding, CRC verification, record iteration, the in-place PID rewrite
//! (whose output must stay within bytes 17..21 and 43..51) and the dump
//! formatter. Any panic is a bug: these bytes come from the network.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mirrorguard::records::{self, record, rewrite_all, walk, Entry};

fuzz_target!(|data: &[u8]| {
    let mut end = 0usize;
    for entry in walk(data) {
        let Ok(entry) = entry else { break };
        let range = entry.range().clone();
        assert!(
            range.start == end && range.end <= data.len(),
            "entries must tile the buffer"
        );
        end = range.end;
        let bytes = &data[range];
        let _ = records::verify_crc(bytes);
        let _ = records::control::first_control_record(bytes);
        if let Entry::V2(h) = &entry {
            let _ = (h.last_offset(), h.last_sequence(), h.compression());
            if let Ok(it) = record::records(h, bytes) {
                for r in it.flatten() {
                    let _ = r.headers().count();
                }
            }
        }
    }

    // Rewrite every batch's PID; only PID and CRC bytes may change.
    let mut copy = data.to_vec();
    if rewrite_all(&mut copy, |h| Some(h.producer_id.wrapping_add(1))).is_ok() {
        for e in walk(data).flatten() {
            if let Entry::V2(h) = e {
                for i in h.range.clone() {
                    let off = i - h.range.start;
                    if !(17..21).contains(&off) && !(43..51).contains(&off) {
                        assert_eq!(data[i], copy[i]);
                    }
                }
                let valid_before = records::verify_crc(&data[h.range.clone()]);
                assert_eq!(valid_before, records::verify_crc(&copy[h.range.clone()]));
            }
        }
    }

    let mut sink = Vec::new();
    let opts = mirrorguard::dump::DumpOptions {
        deep_iteration: true,
        json: data.first() == Some(&0),
        mirror_state: true,
    };
    let _ = mirrorguard::dump::dump_bytes(
        std::path::Path::new("00000000000000000000.log"),
        data,
        opts,
        &mut sink,
    );
});
