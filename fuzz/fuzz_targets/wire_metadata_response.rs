//! Fuzzes the MetadataResponse rewriter: first byte picks the version, the
//! rest is the body. Any output must itself parse and be a fixed point.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mirrorguard::handlers::rewrite_metadata_response;

fn map(id: i32, _: &str, _: i32) -> Option<(String, i32)> {
    Some((format!("mg-{id}.proxy"), 30000 + (id & 0x7fff)))
}

fuzz_target!(|data: &[u8]| {
    let Some((&v, body)) = data.split_first() else {
        return;
    };
    let v = i16::from(v % 15);
    if let Ok(Some(out)) = rewrite_metadata_response(v, body, &mut map) {
        assert_eq!(rewrite_metadata_response(v, &out, &mut map), Ok(None));
    }
});
