//! Fuzzes the other decoded responses: FindCoordinator, DescribeCluster,
//! Produce (NodeEndpoints) and the ApiVersions clamp. First byte picks the
//! message and version, the rest is the body.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mirrorguard::handlers::{
    clamp_api_versions_response, clamp_table, rewrite_describe_cluster_response,
    rewrite_find_coordinator_response, rewrite_produce_response, NodeMapper,
};
use mirrorguard::wire::WireResult;

fn map(id: i32, _: &str, _: i32) -> Option<(String, i32)> {
    Some((format!("mg-{id}.proxy"), 30000 + (id & 0x7fff)))
}

fn run(f: fn(i16, &[u8], &mut NodeMapper<'_>) -> WireResult<Option<Vec<u8>>>, v: i16, b: &[u8]) {
    if let Ok(Some(out)) = f(v, b, &mut map) {
        assert_eq!(f(v, &out, &mut map), Ok(None));
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else {
        return;
    };
    let v = i16::from(sel >> 2) % 16;
    match sel & 3 {
        0 => run(rewrite_find_coordinator_response, v % 7, body),
        1 => run(rewrite_describe_cluster_response, v % 3, body),
        2 => run(rewrite_produce_response, v % 14, body),
        _ => {
            let t = clamp_table();
            if let Ok(Some(out)) = clamp_api_versions_response(v % 5, body, &t) {
                // A clamped response may have fallen back to v0; either way
                // clamping again changes nothing.
                let a = clamp_api_versions_response(v % 5, &out, &t);
                let b = clamp_api_versions_response(0, &out, &t);
                assert!(a == Ok(None) || b == Ok(None));
            }
        }
    }
});
