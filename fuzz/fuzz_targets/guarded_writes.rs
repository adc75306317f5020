//! Fuzzes the guard's parsers of the writes other than Produce
//! (AddPartitionsToTxn, WriteTxnMarkers, DeleteRecords, CreatePartitions,
//! DeleteTopics; client input): the first byte picks the API and version,
//! the rest is the body. A splittable request that parses must split (every
//! other item kept) into a request that parses again with exactly the kept
//! items.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mirrorguard::handlers::guarded_writes::{
    parse_write_request, split_write_request, GUARDED_WRITE_VERSIONS,
};

fuzz_target!(|data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else {
        return;
    };
    let (api, versions) = &GUARDED_WRITE_VERSIONS[usize::from(sel) % GUARDED_WRITE_VERSIONS.len()];
    let span = *versions.end() - *versions.start() + 1;
    let v = *versions.start() + i16::from(sel >> 3) % span;
    let Ok(req) = parse_write_request(*api, v, body) else {
        return;
    };
    assert!(req.end <= body.len());
    if !req.splittable() {
        return;
    }
    let mut n = 0usize;
    let keep: Vec<Vec<bool>> = req.groups[0]
        .topics
        .iter()
        .map(|t| {
            let items = t.partitions.as_ref().map_or(1, Vec::len);
            (0..items)
                .map(|_| {
                    n += 1;
                    n % 2 == 0
                })
                .collect()
        })
        .collect();
    let kept = keep.iter().flatten().filter(|k| **k).count();
    match split_write_request(&req, body, &keep) {
        Ok(None) => assert_eq!(kept, n),
        Ok(Some(out)) => {
            let again = parse_write_request(*api, v, &out).expect("split output parses");
            let got: usize = again.groups[0]
                .topics
                .iter()
                .map(|t| t.partitions.as_ref().map_or(1, Vec::len))
                .sum();
            assert_eq!(got, kept);
        }
        Err(e) => panic!("split failed on a parsed request: {e}"),
    }
});
