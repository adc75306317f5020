//! Fuzzes the FetchRequest parser (client input): first byte picks the
//! version (4..=18), the rest is the body. Every reported span must lie in
//! the body and be consistent with the parse end.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mirrorguard::handlers::parse_fetch_request;

fuzz_target!(|data: &[u8]| {
    let Some((&v, body)) = data.split_first() else {
        return;
    };
    let v = 4 + i16::from(v % 15);
    if let Ok(info) = parse_fetch_request(v, body) {
        assert!(info.end <= body.len());
        let mut last = 0;
        for t in &info.topics {
            for p in &t.partitions {
                assert!(p.span.start >= last && p.span.start < p.span.end);
                assert!(p.span.end <= info.end);
                last = p.span.end;
            }
        }
        assert!(info.forgotten_topics <= body.len());
    }
});
