//! ApiVersionsResponse v0-v4 clamping and the request/response header
//! version tables, checked against kafka-protocol.

mod handlers_common;

use handlers_common::*;
use kafka_protocol::messages::api_versions_response::{
    ApiVersion, FinalizedFeatureKey, SupportedFeatureKey,
};
use kafka_protocol::messages::{ApiKey, ApiVersionsResponse};
use mirrorguard::handlers::{
    clamp_api_versions_response, clamp_table, is_decoded, request_header_version,
    response_header_version, DECODED_VERSIONS,
};

/// Broker advertisement: (key, min, max).
const ADVERTISED: [(i16, i16, i16); 9] = [
    (0, 3, 14),    // Produce, one above what we parse
    (1, 4, 19),    // Fetch
    (3, 0, 13),    // Metadata, already within range
    (10, 0, 6),    // FindCoordinator
    (18, 0, 6),    // ApiVersions, one above what we parse (Kafka 4.4 answers v5)
    (19, 2, 7),    // CreateTopics: not decoded, untouched
    (60, 0, 5),    // DescribeCluster
    (10000, 0, 7), // unknown key (Confluent Cloud)
    (92, 0, 0),    // newer key
];

fn build(v: i16, entries: &[(i16, i16, i16)]) -> ApiVersionsResponse {
    let mut m = ApiVersionsResponse::default();
    m.api_keys = entries
        .iter()
        .map(|(k, lo, hi)| {
            let mut a = ApiVersion::default();
            a.api_key = *k;
            a.min_version = *lo;
            a.max_version = *hi;
            if v >= 3 {
                a.unknown_tagged_fields = tags(i32::from(*k));
            }
            a
        })
        .collect();
    if v >= 1 {
        m.throttle_time_ms = 4;
    }
    if v >= 3 {
        let mut f = SupportedFeatureKey::default();
        f.name = s("metadata.version");
        f.min_version = 1;
        f.max_version = 25;
        m.supported_features = vec![f];
        m.finalized_features_epoch = 99;
        let mut f = FinalizedFeatureKey::default();
        f.name = s("metadata.version");
        f.max_version_level = 25;
        f.min_version_level = 25;
        m.finalized_features = vec![f];
        m.zk_migration_ready = false;
        m.unknown_tagged_fields = tags(1234);
    }
    m
}

fn clamped(entries: &[(i16, i16, i16)]) -> Vec<(i16, i16, i16)> {
    entries
        .iter()
        .map(|&(k, lo, hi)| {
            let max = DECODED_VERSIONS
                .iter()
                .find(|(key, _)| *key == k)
                .map_or(hi, |(_, r)| hi.min(*r.end()));
            (k, lo, max)
        })
        .collect()
}

#[test]
fn api_versions_clamped_for_decoded_keys_only() {
    for v in 0..=4 {
        let orig = build(v, &ADVERTISED);
        let body = enc(&orig, v);
        for table in [
            clamp_table(),
            DECODED_VERSIONS
                .iter()
                .map(|(k, r)| (*k, *r.end()))
                .collect(),
        ] {
            let out = clamp_api_versions_response(v, &body, &table)
                .unwrap()
                .unwrap();
            let got: ApiVersionsResponse = dec(&out, v);
            assert_eq!(got, build(v, &clamped(&ADVERTISED)), "v{v}");
            assert_eq!(out.len(), body.len(), "clamping is in place");
        }
        // The range table works directly too.
        let out2 = clamp_api_versions_response(v, &body, DECODED_VERSIONS)
            .unwrap()
            .unwrap();
        assert_eq!(
            dec::<ApiVersionsResponse>(&out2, v),
            build(v, &clamped(&ADVERTISED))
        );
        // Nothing to clamp: no output.
        let ok = build(v, &clamped(&ADVERTISED));
        let ok_body = enc(&ok, v);
        assert!(clamp_api_versions_response(v, &ok_body, &clamp_table())
            .unwrap()
            .is_none());
        assert!(clamp_api_versions_response::<i16>(v, &body, &[])
            .unwrap()
            .is_none());
        for cut in 0..body.len() {
            assert!(clamp_api_versions_response(v, &body[..cut], &clamp_table()).is_err());
        }
    }
}

/// Kafka 4.4 answers ApiVersions v5 (KIP-1242: only the request changed), which Kafka's
/// Java client and franz-go send first: the v5 body is v4's and is clamped like it.
/// (kafka-protocol 0.18 knows v0-v4, so the v5 body is the v4 encoding.)
#[test]
fn api_versions_v5_body_is_v4s_and_is_clamped() {
    let body = enc(&build(4, &ADVERTISED), 4);
    let out = clamp_api_versions_response(5, &body, DECODED_VERSIONS)
        .unwrap()
        .unwrap();
    assert_eq!(
        dec::<ApiVersionsResponse>(&out, 4),
        build(4, &clamped(&ADVERTISED))
    );
    assert!(is_decoded(18, 5) && !is_decoded(18, 6));
    for cut in 0..body.len() {
        assert!(clamp_api_versions_response(5, &body[..cut], &clamp_table()).is_err());
    }
}

#[test]
fn api_versions_entry_unusable_through_proxy_is_removed() {
    for v in 0..=4 {
        let body = enc(&build(v, &ADVERTISED), v);
        // We could parse key 19 only up to v1 but the broker's minimum is 2.
        let out = clamp_api_versions_response(v, &body, &[(19, 1), (0, 12)])
            .unwrap()
            .unwrap();
        let mut expect: Vec<_> = ADVERTISED.iter().copied().filter(|e| e.0 != 19).collect();
        expect[0].2 = 12;
        assert_eq!(
            dec::<ApiVersionsResponse>(&out, v),
            build(v, &expect),
            "v{v}"
        );
    }
}

/// A preferred maximum (Fetch v15 so responses stream) lowers the max but
/// never removes an entry whose minimum is above it, and leaves every other
/// byte (tags, throttle time) as it came.
#[test]
fn api_versions_preference_lowers_but_never_removes() {
    use mirrorguard::handlers::api_versions::prefer_api_versions_response;
    for v in 0..=4 {
        let body = enc(&build(v, &ADVERTISED), v);
        let out = prefer_api_versions_response(v, &body, &[(1, 15), (19, 1)])
            .unwrap()
            .unwrap();
        let mut expect = ADVERTISED.to_vec();
        let fetch = expect.iter_mut().find(|e| e.0 == 1).unwrap();
        fetch.2 = 15;
        // Key 19's minimum (2) is above 1: kept as advertised.
        assert_eq!(
            dec::<ApiVersionsResponse>(&out, v),
            build(v, &expect),
            "v{v}"
        );
        // Already at or below the preference: nothing changes.
        let low = enc(&build(v, &[(1, 4, 15), (19, 2, 7)]), v);
        assert!(prefer_api_versions_response(v, &low, &[(1, 15), (19, 1)])
            .unwrap()
            .is_none());
    }
}

#[test]
fn api_versions_falls_back_to_v0_on_unsupported_version() {
    // A broker answering a too-new request sends a v0 body with error 35.
    let mut m = build(0, &[(18, 0, 3)]);
    m.error_code = 35;
    let body = enc(&m, 0);
    for v in 1..=4 {
        let out = clamp_api_versions_response(v, &body, &[(18, 2)])
            .unwrap()
            .unwrap();
        let mut expect = m.clone();
        expect.api_keys[0].max_version = 2;
        assert_eq!(dec::<ApiVersionsResponse>(&out, 0), expect);
    }
}

#[test]
fn header_versions_match_kafka_schemas() {
    let mut checked = 0;
    for key in ApiKey::iter() {
        let vr = key.valid_versions();
        for v in vr.min..=vr.max {
            assert_eq!(
                request_header_version(key as i16, v),
                Some(key.request_header_version(v)),
                "request header {key:?} v{v}"
            );
            assert_eq!(
                response_header_version(key as i16, v),
                Some(key.response_header_version(v)),
                "response header {key:?} v{v}"
            );
            checked += 1;
        }
    }
    assert!(checked > 250, "{checked}");
    // Keys removed in Kafka 4.0 and older versions still known.
    assert_eq!(request_header_version(4, 3), Some(1)); // LeaderAndIsr
    assert_eq!(request_header_version(7, 0), Some(0)); // ControlledShutdown v0
    assert_eq!(request_header_version(0, 0), Some(1)); // Produce v0
    assert_eq!(response_header_version(18, 4), Some(0)); // ApiVersions
    assert_eq!(request_header_version(18, 3), Some(2));
    // Unknown keys and negative versions: None (forward opaquely).
    for key in [-1i16, 93, 1000, 10000, i16::MAX] {
        assert_eq!(request_header_version(key, 0), None);
        assert_eq!(response_header_version(key, 0), None);
    }
    assert_eq!(request_header_version(0, -1), None);
}

#[test]
fn decoded_versions_table() {
    assert!(is_decoded(1, 18) && !is_decoded(1, 19) && !is_decoded(1, 3));
    assert!(is_decoded(3, 0) && is_decoded(60, 2) && !is_decoded(19, 0));
    for (k, r) in DECODED_VERSIONS {
        let key = ApiKey::try_from(*k).unwrap();
        let vr = key.valid_versions();
        // ApiVersions v5 (Kafka 4.4) is newer than kafka-protocol 0.18, and its
        // response body is v4's (api_versions_v5_body_is_v4s_and_is_clamped).
        let known_max = if *k == 18 { vr.max + 1 } else { vr.max };
        assert!(
            *r.end() <= known_max,
            "{key:?} range beyond kafka-protocol 0.18"
        );
    }
}
