//! Fuzzes the client-facing decode path of every connection: frame
//! boundaries (size limit, TLS detection), the fixed request header, the body
//! offset for header v1/v2, and the Produce `acks` peek, over a stream of
//! frames split the way the input says.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mirrorguard::codec::frame::frame_boundary;
use mirrorguard::codec::header::{produce_acks, request_body_offset, RequestHeader};
use mirrorguard::handlers::request_header_version;

fuzz_target!(|data: &[u8]| {
    let max = 1 << 16;
    let mut rest = data;
    while !rest.is_empty() {
        match frame_boundary(rest, max) {
            Ok(Some(n)) => {
                assert!(n >= 4 && n <= rest.len() && n - 4 <= max);
                let frame = &rest[..n];
                if let Ok(h) = RequestHeader::parse(frame) {
                    if let Some(hv) = request_header_version(h.api_key, h.api_version) {
                        if let Ok(at) = request_body_offset(frame, hv) {
                            assert!(at <= frame.len());
                        }
                        if h.api_key == 0 {
                            let _ = produce_acks(frame, h.api_version, hv);
                        }
                    }
                }
                rest = &rest[n..];
            }
            Ok(None) | Err(_) => break,
        }
    }
});
