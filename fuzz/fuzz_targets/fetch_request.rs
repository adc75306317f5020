//! Fuzzes the FetchRequest parser (client input): first byte picks the
//! version (4..=18), the rest is the body. Every reported span must lie in
//! the body and be consistent with the parse end; a split output must parse
//! again and hold exactly the kept partitions.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mirrorguard::handlers::{parse_fetch_request, split_fetch_request};

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
        let keep = |p: i32| p.rem_euclid(3) != 0;
        let want: Vec<(i32, i64)> = info
            .topics
            .iter()
            .flat_map(|t| t.partitions.iter())
            .filter(|p| keep(p.partition))
            .map(|p| (p.partition, p.fetch_offset))
            .collect();
        match split_fetch_request(v, body, &mut |_, p| keep(p)) {
            Ok(None) => assert_eq!(want.len(), info.partition_count()),
            Ok(Some(out)) => {
                let again = parse_fetch_request(v, &out).expect("split output parses");
                let got: Vec<(i32, i64)> = again
                    .topics
                    .iter()
                    .flat_map(|t| t.partitions.iter())
                    .map(|p| (p.partition, p.fetch_offset))
                    .collect();
                assert_eq!(got, want);
                assert_eq!(again.replica_id, info.replica_id);
                assert_eq!(again.session_epoch, info.session_epoch);
            }
            Err(e) => panic!("split failed on a parsed request: {e}"),
        }
    }
});
