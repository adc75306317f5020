//! Fuzzes request-header parsing built on the wire `Reader` and the header
//! version tables: api key, version, correlation id, client id, and (header
//! v2) tagged fields, then walks the remaining bytes as a sequence of
//! primitive reads chosen by the input itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mirrorguard::handlers::{request_header_version, response_header_version};
use mirrorguard::wire::Reader;

fuzz_target!(|data: &[u8]| {
    let mut r = Reader::new(data);
    let (Ok(key), Ok(ver), Ok(_corr)) = (r.read_i16("k"), r.read_i16("v"), r.read_i32("c")) else {
        return;
    };
    let _ = response_header_version(key, ver);
    match request_header_version(key, ver) {
        Some(0) | None => {}
        Some(h) => {
            if r.read_nullable_string("client_id").is_err() {
                return;
            }
            if h >= 2 {
                if let Ok(t) = r.read_tagged_fields("header tags") {
                    for f in t.iter() {
                        assert!(f.end <= data.len() && f.data.len() <= f.end - f.start);
                    }
                }
            }
        }
    }
    // Drive the remaining primitives from the input.
    while let Ok(op) = r.read_i8("op") {
        let before = r.position();
        let ok = match op as u8 % 14 {
            0 => r.read_uvarint("x").is_ok(),
            1 => r.read_varlong("x").is_ok(),
            2 => r.read_compact_nullable_string("x").is_ok(),
            3 => r.read_nullable_string("x").is_ok(),
            4 => r.read_nullable_bytes("x").is_ok(),
            5 => r.read_compact_nullable_bytes("x").is_ok(),
            6 => r.read_array_len(4, "x").is_ok(),
            7 => r.read_compact_array_len(1, "x").is_ok(),
            8 => r.read_tagged_fields("x").is_ok(),
            9 => r.read_uuid("x").is_ok(),
            10 => r.read_i64("x").is_ok(),
            11 => r.read_uvarlong("x").is_ok(),
            12 => r.read_varint("x").is_ok(),
            _ => r.read_compact_string("x").is_ok(),
        };
        // A failed read consumes nothing; a successful one stays in bounds.
        assert!(ok || r.position() == before);
        assert!(r.position() <= data.len());
        if !ok {
            break;
        }
    }
});
