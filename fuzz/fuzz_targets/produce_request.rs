//! Fuzzes the ProduceRequest parser and partition splitter (client input):
//! first byte picks the version (3..=13) and, with its high bit, which
//! partitions the splitter keeps; the rest is the body. A split output must
//! parse again and hold exactly the kept partitions with their records.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mirrorguard::handlers::{parse_produce_request, split_produce_request};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else {
        return;
    };
    let v = 3 + i16::from(sel % 11);
    let parity = i32::from(sel >> 7);
    let Ok(info) = parse_produce_request(v, body) else {
        return;
    };
    assert!(info.end <= body.len());
    for t in &info.topics {
        assert!(t.span.end <= info.topics_end);
        for p in &t.partitions {
            if let Some(r) = &p.records {
                assert!(r.start <= r.end && r.end <= p.span.end);
            }
        }
    }
    let keep = |p: i32| p.rem_euclid(2) == parity;
    match split_produce_request(v, body, &mut |_, p| keep(p)) {
        Ok(None) => assert!(info
            .topics
            .iter()
            .all(|t| t.partitions.iter().all(|p| keep(p.index)))),
        Ok(Some(out)) => {
            let again = parse_produce_request(v, &out).expect("split output parses");
            let want: Vec<Option<&[u8]>> = info
                .topics
                .iter()
                .flat_map(|t| t.partitions.iter())
                .filter(|p| keep(p.index))
                .map(|p| p.records.clone().map(|r| &body[r]))
                .collect();
            let got: Vec<Option<&[u8]>> = again
                .topics
                .iter()
                .flat_map(|t| t.partitions.iter())
                .map(|p| p.records.clone().map(|r| &out[r]))
                .collect();
            assert_eq!(got, want);
            assert!(again.topics.iter().all(|t| !t.partitions.is_empty()));
        }
        Err(e) => panic!("split failed on a parsed request: {e}"),
    }
});
