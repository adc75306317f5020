//! Fuzzes the FetchResponse walker/visitor and its NodeEndpoints rewriter:
//! first byte picks the version (4..=18), the rest is the body. Offsets the
//! visitor reports must lie within the body.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mirrorguard::handlers::{rewrite_fetch_response, walk_fetch_response};

fn map(id: i32, _: &str, _: i32) -> Option<(String, i32)> {
    Some((format!("mg-{id}.proxy"), 30000 + (id & 0x7fff)))
}

fuzz_target!(|data: &[u8]| {
    let Some((&v, body)) = data.split_first() else {
        return;
    };
    let v = 4 + i16::from(v % 15);
    let _ = walk_fetch_response(v, body, &mut |p| {
        assert!(p.span.end <= body.len());
        if let Some(r) = &p.records {
            assert!(r.start <= r.end && r.end <= body.len());
        }
        if let Some(a) = &p.aborted_transactions {
            for t in a.iter() {
                assert!(t.producer_id_offset + 8 <= body.len());
            }
        }
    });
    if let Ok(Some(out)) = rewrite_fetch_response(v, body, &mut map) {
        assert_eq!(rewrite_fetch_response(v, &out, &mut map), Ok(None));
    }
});
