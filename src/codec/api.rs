//! The protocol tables: Kafka API keys, their names, request and response
//! header versions, and error codes with their names and retriability.
//!
//! The facts come from the `kafka-protocol` crate ([`ApiKey`],
//! [`ResponseError`]), which is generated from Kafka's message schemas. The
//! crate is used for these tables only: proxied traffic is never decoded
//! with it (its decoders size allocations from wire counts); our own
//! bounds-checked readers in [`crate::wire`] stay in charge of every length.
//!
//! # Where the crate lags the broker
//!
//! kafka-protocol 0.18 is generated from the Kafka 4.1 schemas; the tests run
//! Apache Kafka 4.4. The gaps, and how each is handled:
//!
//! - **Newer versions of a known key** (ApiVersions v5, ListOffsets v11,
//!   ShareFetch v2, ...): header versions are still right, because every
//!   message's flexible range is open-ended ("N+") and the crate's
//!   `header_version` is a threshold on that N; they are not range-checked
//!   against the crate's `valid_versions`. Whether a body is *decoded* is a
//!   separate question, answered by the handlers' own version tables (a
//!   version they do not know is forwarded without decoding, and ApiVersions
//!   responses are clamped to what they know).
//! - **Versions below the crate's range** (removed by Kafka 4.0, still
//!   spoken by older brokers): the crate's `header_version` is only right
//!   inside its range. Every key was checked against the old hand table for
//!   versions 0..=25; the one difference, WriteTxnMarkers v0 (not flexible,
//!   while the crate's range starts at the flexible v1), is special-cased.
//! - **Keys the crate does not have**: StreamsGroupHeartbeat (88) and
//!   StreamsGroupDescribe (89) were unstable in 4.1 and are missing, as are
//!   the inter-broker keys 4..=7 that Kafka 4.0 removed (a pre-4.0 broker
//!   still answers them). They are listed in [`NOT_IN_CRATE`], the only hand
//!   kept rows; a test fails once the crate learns one of them, so the row
//!   can go.
//! - **Keys nobody here knows** (93 StreamsGroupTopologyDescriptionUpdate,
//!   94 UnregisterController in Kafka 4.4, anything later): no name (metric
//!   label `unknown`, logs carry the number) and no header version, so the
//!   proxy forwards such frames opaquely, touching nothing past the
//!   correlation id.
//! - **Error codes newer than the crate** (above 133; Kafka 4.4 adds
//!   134..=136, GROUP_DELETION_FAILED and two more): no name
//!   ([`error_name`] says `UNKNOWN_SERVER_ERROR_CODE`) and not retriable, the
//!   conservative reading Kafka's own clients apply to codes they do not know.

use std::sync::LazyLock;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::ApiKey;

/// Produce.
pub const PRODUCE: i16 = ApiKey::Produce as i16;
/// Fetch.
pub const FETCH: i16 = ApiKey::Fetch as i16;
/// Metadata.
pub const METADATA: i16 = ApiKey::Metadata as i16;
/// FindCoordinator.
pub const FIND_COORDINATOR: i16 = ApiKey::FindCoordinator as i16;
/// ApiVersions.
pub const API_VERSIONS: i16 = ApiKey::ApiVersions as i16;
/// DescribeCluster.
pub const DESCRIBE_CLUSTER: i16 = ApiKey::DescribeCluster as i16;
/// DeleteTopics.
pub const DELETE_TOPICS: i16 = ApiKey::DeleteTopics as i16;
/// DeleteRecords.
pub const DELETE_RECORDS: i16 = ApiKey::DeleteRecords as i16;
/// AddPartitionsToTxn.
pub const ADD_PARTITIONS_TO_TXN: i16 = ApiKey::AddPartitionsToTxn as i16;
/// WriteTxnMarkers (its v0 header is special-cased below).
pub const WRITE_TXN_MARKERS: i16 = ApiKey::WriteTxnMarkers as i16;
/// CreatePartitions.
pub const CREATE_PARTITIONS: i16 = ApiKey::CreatePartitions as i16;

/// API keys Kafka has (or had) that kafka-protocol 0.18 lacks:
/// `(key, name, first flexible version)`. See the module documentation.
pub const NOT_IN_CRATE: &[(i16, &str, i16)] = &[
    // Removed in Kafka 4.0; header versions as in Kafka 3.9's schemas.
    (4, "LeaderAndIsr", 4),
    (5, "StopReplica", 2),
    (6, "UpdateMetadata", 6),
    (7, "ControlledShutdown", 3),
    // In Kafka 4.4 (versions 0-1), unstable and so left out in 4.1;
    // flexible from version 0.
    (88, "StreamsGroupHeartbeat", 0),
    (89, "StreamsGroupDescribe", 0),
];

/// Names by key (index = key) for every key the crate or [`NOT_IN_CRATE`]
/// knows; built once from the crate's enum so names need no hand table.
static NAMES: LazyLock<Vec<Option<String>>> = LazyLock::new(|| {
    let mut names: Vec<Option<String>> = Vec::new();
    let mut set = |key: i16, name: String| {
        let i = key as usize;
        if names.len() <= i {
            names.resize(i + 1, None);
        }
        names[i] = Some(name);
    };
    for key in ApiKey::iter() {
        set(key as i16, format!("{key:?}"));
    }
    for (key, name, _) in NOT_IN_CRATE {
        set(*key, (*name).to_owned());
    }
    names
});

/// The API's name, or `None` for a key this build does not know (forwarded
/// opaquely all the same).
pub fn api_name(api_key: i16) -> Option<&'static str> {
    let names: &'static [Option<String>] = &NAMES;
    usize::try_from(api_key)
        .ok()
        .and_then(|k| names.get(k))
        .and_then(|n| n.as_deref())
}

/// Metric label for an API key: its name, or `unknown` for every key this
/// build does not know (one label, so hostile clients cannot create a series
/// per key; logs carry the number).
pub fn api_label(api_key: i16) -> &'static str {
    api_name(api_key).unwrap_or("unknown")
}

/// Name for logs: the API's name, or `unknown(<key>)`.
pub fn api_display(api_key: i16) -> String {
    match api_name(api_key) {
        Some(n) => n.to_string(),
        None => format!("unknown({api_key})"),
    }
}

/// Request header version (0, 1 or 2) for `api_key` at `api_version`, or
/// `None` for an API key this build does not know or a negative version (the
/// caller must then forward the frame without touching anything past the
/// correlation id, because it cannot know whether header tagged fields
/// follow).
pub fn request_header_version(api_key: i16, api_version: i16) -> Option<i16> {
    if api_version < 0 {
        return None;
    }
    if api_key == WRITE_TXN_MARKERS && api_version == 0 {
        return Some(1);
    }
    if let Ok(key) = ApiKey::try_from(api_key) {
        return Some(key.request_header_version(api_version));
    }
    let (_, _, flex) = NOT_IN_CRATE.iter().find(|(k, _, _)| *k == api_key)?;
    // ControlledShutdown v0 used a header without client id (header v0).
    if api_key == 7 && api_version == 0 {
        return Some(0);
    }
    Some(if api_version >= *flex { 2 } else { 1 })
}

// WriteTxnMarkers: its v0 (removed in Kafka 4.0) was not flexible, but the
// crate, whose range starts at v1, answers "flexible" for every version.

/// Response header version (0 or 1) for `api_key` at `api_version`, or
/// `None` for an unknown API key or a negative version.
///
/// ApiVersions responses always use header v0, even for flexible versions:
/// a client must be able to read the response before it knows which versions
/// the broker supports.
pub fn response_header_version(api_key: i16, api_version: i16) -> Option<i16> {
    if api_version < 0 {
        return None;
    }
    if api_key == WRITE_TXN_MARKERS && api_version == 0 {
        return Some(0);
    }
    if let Ok(key) = ApiKey::try_from(api_key) {
        return Some(key.response_header_version(api_version));
    }
    let (_, _, flex) = NOT_IN_CRATE.iter().find(|(k, _, _)| *k == api_key)?;
    Some(if api_version >= *flex { 1 } else { 0 })
}

/// Whether `api_key`'s messages are flexible (compact strings and arrays,
/// tagged fields) at `api_version`: exactly when its request header is v2,
/// so the answer comes from the same table. `false` for unknown keys.
pub fn is_flexible(api_key: i16, api_version: i16) -> bool {
    request_header_version(api_key, api_version) == Some(2)
}

/// Kafka error codes, by their names in Kafka's `Errors` (the numbers come
/// from the crate's table, so none is typed by hand).
pub mod error {
    use kafka_protocol::error::ResponseError as E;

    /// No error.
    pub const NONE: i16 = 0;
    /// OFFSET_OUT_OF_RANGE.
    pub const OFFSET_OUT_OF_RANGE: i16 = E::OffsetOutOfRange.code();
    /// UNKNOWN_TOPIC_OR_PARTITION.
    pub const UNKNOWN_TOPIC_OR_PARTITION: i16 = E::UnknownTopicOrPartition.code();
    /// LEADER_NOT_AVAILABLE.
    pub const LEADER_NOT_AVAILABLE: i16 = E::LeaderNotAvailable.code();
    /// NOT_LEADER_OR_FOLLOWER.
    pub const NOT_LEADER_OR_FOLLOWER: i16 = E::NotLeaderOrFollower.code();
    /// REQUEST_TIMED_OUT.
    pub const REQUEST_TIMED_OUT: i16 = E::RequestTimedOut.code();
    /// MESSAGE_TOO_LARGE.
    pub const MESSAGE_TOO_LARGE: i16 = E::MessageTooLarge.code();
    /// NETWORK_EXCEPTION.
    pub const NETWORK_EXCEPTION: i16 = E::NetworkException.code();
    /// COORDINATOR_LOAD_IN_PROGRESS.
    pub const COORDINATOR_LOAD_IN_PROGRESS: i16 = E::CoordinatorLoadInProgress.code();
    /// COORDINATOR_NOT_AVAILABLE.
    pub const COORDINATOR_NOT_AVAILABLE: i16 = E::CoordinatorNotAvailable.code();
    /// RECORD_LIST_TOO_LARGE.
    pub const RECORD_LIST_TOO_LARGE: i16 = E::RecordListTooLarge.code();
    /// NOT_ENOUGH_REPLICAS.
    pub const NOT_ENOUGH_REPLICAS: i16 = E::NotEnoughReplicas.code();
    /// NOT_ENOUGH_REPLICAS_AFTER_APPEND.
    pub const NOT_ENOUGH_REPLICAS_AFTER_APPEND: i16 = E::NotEnoughReplicasAfterAppend.code();
    /// TOPIC_AUTHORIZATION_FAILED.
    pub const TOPIC_AUTHORIZATION_FAILED: i16 = E::TopicAuthorizationFailed.code();
    /// CLUSTER_AUTHORIZATION_FAILED.
    pub const CLUSTER_AUTHORIZATION_FAILED: i16 = E::ClusterAuthorizationFailed.code();
    /// GROUP_AUTHORIZATION_FAILED (30).
    pub const GROUP_AUTHORIZATION_FAILED: i16 = E::GroupAuthorizationFailed.code();
    /// UNSUPPORTED_VERSION.
    pub const UNSUPPORTED_VERSION: i16 = E::UnsupportedVersion.code();
    /// TOPIC_ALREADY_EXISTS.
    pub const TOPIC_ALREADY_EXISTS: i16 = E::TopicAlreadyExists.code();
    /// POLICY_VIOLATION.
    pub const POLICY_VIOLATION: i16 = E::PolicyViolation.code();
    /// OUT_OF_ORDER_SEQUENCE_NUMBER.
    pub const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = E::OutOfOrderSequenceNumber.code();
    /// DUPLICATE_SEQUENCE_NUMBER.
    pub const DUPLICATE_SEQUENCE_NUMBER: i16 = E::DuplicateSequenceNumber.code();
    /// INVALID_PRODUCER_EPOCH.
    pub const INVALID_PRODUCER_EPOCH: i16 = E::InvalidProducerEpoch.code();
    /// TRANSACTIONAL_ID_AUTHORIZATION_FAILED.
    pub const TRANSACTIONAL_ID_AUTHORIZATION_FAILED: i16 =
        E::TransactionalIdAuthorizationFailed.code();
    /// KAFKA_STORAGE_ERROR.
    pub const KAFKA_STORAGE_ERROR: i16 = E::KafkaStorageError.code();
    /// UNKNOWN_PRODUCER_ID.
    pub const UNKNOWN_PRODUCER_ID: i16 = E::UnknownProducerId.code();
    /// FETCH_SESSION_ID_NOT_FOUND.
    pub const FETCH_SESSION_ID_NOT_FOUND: i16 = E::FetchSessionIdNotFound.code();
    /// FENCED_LEADER_EPOCH.
    pub const FENCED_LEADER_EPOCH: i16 = E::FencedLeaderEpoch.code();
    /// UNKNOWN_LEADER_EPOCH.
    pub const UNKNOWN_LEADER_EPOCH: i16 = E::UnknownLeaderEpoch.code();
    /// THROTTLING_QUOTA_EXCEEDED.
    pub const THROTTLING_QUOTA_EXCEEDED: i16 = E::ThrottlingQuotaExceeded.code();
    /// PRODUCER_FENCED.
    pub const PRODUCER_FENCED: i16 = E::ProducerFenced.code();
}

/// Error names by code (index = code + 1, so -1 is index 0), in Kafka's
/// spelling (`NOT_LEADER_OR_FOLLOWER`), derived from the crate's variant
/// names once.
static ERROR_NAMES: LazyLock<Vec<Option<String>>> = LazyLock::new(|| {
    // Far above the crate's last code (133 in 0.18): a gap cannot cut the
    // table short, and building it costs a few microseconds once.
    const SCAN_UP_TO: i16 = 1000;
    let mut names = vec![None; (SCAN_UP_TO + 2) as usize];
    names[1] = Some("NONE".to_owned());
    for code in -1..=SCAN_UP_TO {
        match ResponseError::try_from_code(code) {
            None | Some(ResponseError::Unknown(_)) => {}
            Some(e) => names[(code + 1) as usize] = Some(screaming_snake(&e.to_string())),
        }
    }
    names
});

/// `NotLeaderOrFollower` -> `NOT_LEADER_OR_FOLLOWER`.
fn screaming_snake(camel: &str) -> String {
    let mut out = String::with_capacity(camel.len() + 8);
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

/// Kafka's name of an error code (`NONE` for 0), or
/// `UNKNOWN_SERVER_ERROR_CODE` for a code this build does not know.
pub fn error_name(code: i16) -> &'static str {
    let names: &'static [Option<String>] = &ERROR_NAMES;
    usize::try_from(i32::from(code) + 1)
        .ok()
        .and_then(|i| names.get(i))
        .and_then(|n| n.as_deref())
        .unwrap_or("UNKNOWN_SERVER_ERROR_CODE")
}

/// Whether Kafka classes the error as retriable (a `RetriableException`):
/// the same request may succeed later. Unknown codes are not retriable.
pub fn is_retriable(code: i16) -> bool {
    ResponseError::try_from_code(code).is_some_and(|e| e.is_retriable())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(api_name(PRODUCE), Some("Produce"));
        assert_eq!(api_name(API_VERSIONS), Some("ApiVersions"));
        assert_eq!(api_name(DESCRIBE_CLUSTER), Some("DescribeCluster"));
        assert_eq!(api_name(FIND_COORDINATOR), Some("FindCoordinator"));
        assert_eq!(api_name(75), Some("DescribeTopicPartitions"));
        assert_eq!(api_name(74), Some("ListConfigResources"));
        assert_eq!(api_name(92), Some("DeleteShareGroupOffsets"));
        assert_eq!(api_label(10000), "unknown");
        assert_eq!(api_label(-1), "unknown");
        assert_eq!(api_display(10000), "unknown(10000)");
        // Every key 0..=92 has a name: the crate's plus the hand rows.
        for k in 0..=92 {
            assert!(api_name(k).is_some(), "key {k}");
        }
    }

    #[test]
    fn hand_rows_are_only_what_the_crate_lacks() {
        for (key, name, _) in NOT_IN_CRATE {
            assert!(
                ApiKey::try_from(*key).is_err(),
                "kafka-protocol now knows {name} ({key}): delete its NOT_IN_CRATE row"
            );
            assert_eq!(api_name(*key), Some(*name));
        }
    }

    /// Kafka 4.4 keys and versions newer than the crate (see the module
    /// documentation): newer versions get header versions, newer keys none.
    #[test]
    fn newer_than_the_crate() {
        // ApiVersions v5 (Kafka 4.4; the crate stops at v4).
        assert_eq!(request_header_version(API_VERSIONS, 5), Some(2));
        assert_eq!(response_header_version(API_VERSIONS, 5), Some(0));
        // Fetch v19, Produce v14, ListOffsets v11: past the crate's maxima.
        assert_eq!(request_header_version(FETCH, 19), Some(2));
        assert_eq!(response_header_version(FETCH, 19), Some(1));
        assert_eq!(request_header_version(PRODUCE, 14), Some(2));
        assert_eq!(request_header_version(2, 11), Some(2));
        // StreamsGroupHeartbeat / Describe: hand rows, flexible from v0.
        assert_eq!(api_name(88), Some("StreamsGroupHeartbeat"));
        assert_eq!(request_header_version(88, 0), Some(2));
        assert_eq!(response_header_version(89, 1), Some(1));
        // Removed keys still get their pre-4.0 headers.
        assert_eq!(request_header_version(7, 0), Some(0));
        assert_eq!(request_header_version(7, 3), Some(2));
        assert_eq!(request_header_version(4, 3), Some(1));
        // Below the crate's range: WriteTxnMarkers v0 was not flexible.
        assert_eq!(request_header_version(27, 0), Some(1));
        assert_eq!(response_header_version(27, 0), Some(0));
        assert_eq!(request_header_version(27, 1), Some(2));
        assert_eq!(request_header_version(PRODUCE, 0), Some(1));
        // 93 and 94 (Kafka 4.4) and later: unknown, forwarded opaquely.
        for key in [93, 94, 95, 1000, i16::MAX] {
            assert_eq!(api_name(key), None);
            assert_eq!(request_header_version(key, 0), None);
            assert_eq!(response_header_version(key, 0), None);
        }
        assert_eq!(request_header_version(PRODUCE, -1), None);
    }

    /// The first flexible version of each API mirrorguard encodes or
    /// decodes, as in Kafka 4.4's message schemas (`flexibleVersions`).
    #[test]
    fn flexible_versions_of_the_apis_we_speak() {
        for (key, first) in [
            (PRODUCE, 9),
            (FETCH, 12),
            (METADATA, 9),
            (FIND_COORDINATOR, 3),
            (API_VERSIONS, 3),
            (ApiKey::CreateTopics as i16, 5),
            (ApiKey::InitProducerId as i16, 2),
            (ApiKey::DescribeConfigs as i16, 4),
            (ApiKey::DescribeProducers as i16, 0),
            (DESCRIBE_CLUSTER, 0),
        ] {
            for v in 0..=20 {
                assert_eq!(is_flexible(key, v), v >= first, "key {key} v{v}");
            }
        }
        assert!(!is_flexible(ApiKey::SaslHandshake as i16, 1));
        assert!(!is_flexible(93, 0));
    }

    #[test]
    fn error_codes() {
        assert_eq!(error_name(0), "NONE");
        assert_eq!(error_name(-1), "UNKNOWN_SERVER_ERROR");
        assert_eq!(error_name(6), "NOT_LEADER_OR_FOLLOWER");
        assert_eq!(error_name(17), "INVALID_TOPIC_EXCEPTION");
        assert_eq!(error_name(56), "KAFKA_STORAGE_ERROR");
        assert_eq!(error_name(70), "FETCH_SESSION_ID_NOT_FOUND");
        assert_eq!(error_name(90), "PRODUCER_FENCED");
        assert_eq!(error_name(133), "SHARE_SESSION_LIMIT_REACHED");
        // Newer than the crate (Kafka 4.4 may have more) and nonsense.
        assert_eq!(error_name(134), "UNKNOWN_SERVER_ERROR_CODE");
        assert_eq!(error_name(-2), "UNKNOWN_SERVER_ERROR_CODE");
        assert_eq!(error_name(i16::MIN), "UNKNOWN_SERVER_ERROR_CODE");
        assert_eq!(error::POLICY_VIOLATION, 44);
        assert_eq!(error::FETCH_SESSION_ID_NOT_FOUND, 70);
        for c in [3, 5, 6, 7, 13, 14, 15, 19, 20, 56, 74, 75, 89] {
            assert!(is_retriable(c), "{c}");
        }
        for c in [0, -1, 1, 10, 29, 31, 35, 36, 45, 47, 59, 90, 134, i16::MAX] {
            assert!(!is_retriable(c), "{c}");
        }
    }
}
