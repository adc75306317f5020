//! Per-API response rewriters and the protocol tables the proxy core routes by.
//!
//! The proxy decodes as little as possible: only the responses that can carry
//! a broker address (so a client is never handed an upstream address) and
//! ApiVersions (so clients never pick a version we cannot parse). Every
//! rewriter *splices*: it parses up to and through the address structures,
//! re-emits only those, and copies every other byte verbatim. A rewriter
//! returns `Ok(None)` when the message needs no change, so the caller can
//! forward the original frame untouched.
//!
//! All rewriters take the response *body*: the bytes after the response
//! header (correlation id and, for flexible header v1, its tagged fields).
//!
//! This module also holds [`request_header_version`] /
//! [`response_header_version`] for every standard API key, so the core can
//! find the correlation id and header tagged fields of any frame, and
//! [`DECODED_VERSIONS`], the versions the rewriters understand. What a
//! listener clamps ApiVersions to is computed from its filter chain
//! (`crate::filter`), whose filters declare their decode sets from this table.

use std::ops::RangeInclusive;

use crate::wire::{Reader, Splicer, WireResult, Writer};

pub mod api_versions;
pub mod describe_cluster;
pub mod fetch;
pub mod fetch_build;
pub mod fetch_request;
pub mod find_coordinator;
pub mod metadata;
pub mod node_endpoints;
pub mod produce;
pub mod produce_build;
pub mod produce_request;

pub use api_versions::{clamp_api_versions_response, MaxVersion};
pub use describe_cluster::rewrite_describe_cluster_response;
pub use fetch::{walk_fetch_response, AbortedTxn, FetchPartition, FetchResponseInfo, FetchTopic};
pub use fetch_build::{
    build_fetch_response, splice_fetch_response, splice_fetch_response_dropping,
    AbortedTransaction, FetchPartitionResponse, FetchTopicRef,
};
pub use fetch_request::{
    parse_fetch_request, rewrite_fetch_request, split_fetch_request, FetchRequestInfo,
    FetchRequestPartition, FetchRequestTopic,
};
pub use find_coordinator::rewrite_find_coordinator_response;
pub use metadata::rewrite_metadata_response;
pub use node_endpoints::{rewrite_fetch_response, rewrite_produce_response};
pub use produce::{walk_produce_response, ProduceResponseInfo};
pub use produce_build::{build_produce_response, merge_produce_responses, ProducePartitionResult};
pub use produce_request::{
    parse_produce_request, split_produce_request, ProduceRequestInfo, ProduceRequestPartition,
    ProduceRequestTopic, ProduceTopic,
};

/// Maps an upstream broker `(node_id, host, port)` to the address clients
/// must see, or `None` to leave it as it is. The proxy's node registry also
/// learns upstream addresses through it.
pub type NodeMapper<'f> = dyn FnMut(i32, &str, i32) -> Option<(String, i32)> + 'f;

/// API key numbers of the messages decoded here.
pub mod api_key {
    /// Produce.
    pub const PRODUCE: i16 = 0;
    /// Fetch.
    pub const FETCH: i16 = 1;
    /// Metadata.
    pub const METADATA: i16 = 3;
    /// FindCoordinator.
    pub const FIND_COORDINATOR: i16 = 10;
    /// ApiVersions.
    pub const API_VERSIONS: i16 = 18;
    /// DescribeCluster.
    pub const DESCRIBE_CLUSTER: i16 = 60;
}

/// `(api_key, versions)` whose responses the handlers here can parse.
///
/// A listener's ApiVersions clamp never exceeds the maxima of this table
/// (see [`clamp_table`]; the clamp itself is computed from the listener's
/// filters); for versions below a range's minimum the response
/// carries no broker address (Fetch < 4 has none either) and the core may
/// forward it opaquely.
pub const DECODED_VERSIONS: &[(i16, RangeInclusive<i16>)] = &[
    (api_key::PRODUCE, 0..=13),
    (api_key::FETCH, 4..=18),
    (api_key::METADATA, 0..=13),
    (api_key::FIND_COORDINATOR, 0..=6),
    (api_key::API_VERSIONS, 0..=5),
    (api_key::DESCRIBE_CLUSTER, 0..=2),
];

/// The versions of `api_key` the handlers here parse (`None` for an API
/// they do not decode). Filters declare their decode sets from it.
pub fn decoded_versions(api_key: i16) -> Option<RangeInclusive<i16>> {
    DECODED_VERSIONS
        .iter()
        .find(|(k, _)| *k == api_key)
        .map(|(_, r)| r.clone())
}

/// The `(api_key, max_version)` table for [`clamp_api_versions_response`],
/// derived from [`DECODED_VERSIONS`].
pub fn clamp_table() -> Vec<(i16, i16)> {
    DECODED_VERSIONS
        .iter()
        .map(|(k, r)| (*k, *r.end()))
        .collect()
}

/// True when the handlers here can parse `api_key` at `version`.
pub fn is_decoded(api_key: i16, version: i16) -> bool {
    DECODED_VERSIONS
        .iter()
        .any(|(k, r)| *k == api_key && r.contains(&version))
}

/// The first flexible version of each standard API key (`Some(i16::MAX)`
/// where the API never became flexible), from the `flexibleVersions` of the
/// Kafka message schemas (clients/src/main/resources/common/message/*.json,
/// up to Kafka 4.1). `None` for keys we do not know.
fn first_flexible_version(api_key: i16) -> Option<i16> {
    const NEVER: i16 = i16::MAX;
    Some(match api_key {
        0 => 9,       // Produce
        1 => 12,      // Fetch
        2 => 6,       // ListOffsets
        3 => 9,       // Metadata
        4 => 4,       // LeaderAndIsr (removed in 4.0)
        5 => 2,       // StopReplica (removed in 4.0)
        6 => 6,       // UpdateMetadata (removed in 4.0)
        7 => 3,       // ControlledShutdown (removed in 4.0)
        8 => 8,       // OffsetCommit
        9 => 6,       // OffsetFetch
        10 => 3,      // FindCoordinator
        11 => 6,      // JoinGroup
        12 => 4,      // Heartbeat
        13 => 4,      // LeaveGroup
        14 => 4,      // SyncGroup
        15 => 5,      // DescribeGroups
        16 => 3,      // ListGroups
        17 => NEVER,  // SaslHandshake
        18 => 3,      // ApiVersions (request only; see response_header_version)
        19 => 5,      // CreateTopics
        20 => 4,      // DeleteTopics
        21 => 2,      // DeleteRecords
        22 => 2,      // InitProducerId
        23 => 4,      // OffsetForLeaderEpoch
        24 => 3,      // AddPartitionsToTxn
        25 => 3,      // AddOffsetsToTxn
        26 => 3,      // EndTxn
        27 => 1,      // WriteTxnMarkers
        28 => 3,      // TxnOffsetCommit
        29 => 2,      // DescribeAcls
        30 => 2,      // CreateAcls
        31 => 2,      // DeleteAcls
        32 => 4,      // DescribeConfigs
        33 => 2,      // AlterConfigs
        34 => 2,      // AlterReplicaLogDirs
        35 => 2,      // DescribeLogDirs
        36 => 2,      // SaslAuthenticate
        37 => 2,      // CreatePartitions
        38 => 2,      // CreateDelegationToken
        39 => 2,      // RenewDelegationToken
        40 => 2,      // ExpireDelegationToken
        41 => 2,      // DescribeDelegationToken
        42 => 2,      // DeleteGroups
        43 => 2,      // ElectLeaders
        44 => 1,      // IncrementalAlterConfigs
        45 | 46 => 0, // Alter/ListPartitionReassignments
        47 => NEVER,  // OffsetDelete
        48 | 49 => 1, // Describe/AlterClientQuotas
        50 | 51 => 0, // Describe/AlterUserScramCredentials
        52 => 0,      // Vote
        53 | 54 => 1, // Begin/EndQuorumEpoch
        // DescribeQuorum .. DescribeShareGroupOffsets and later: every API
        // added after KIP-482 is flexible from version 0.
        55..=92 => 0,
        _ => return None,
    })
}

/// Request header version (0, 1 or 2) for `api_key` at `api_version`, or
/// `None` for an API key this table does not know (the caller must then
/// forward the frame without touching anything past the correlation id,
/// because it cannot know whether header tagged fields follow).
pub fn request_header_version(api_key: i16, api_version: i16) -> Option<i16> {
    if api_version < 0 {
        return None;
    }
    let flex = first_flexible_version(api_key)?;
    // ControlledShutdown v0 used a header without client id (header v0).
    if api_key == 7 && api_version == 0 {
        return Some(0);
    }
    Some(if api_version >= flex { 2 } else { 1 })
}

/// Response header version (0 or 1) for `api_key` at `api_version`, or
/// `None` for an unknown API key.
///
/// ApiVersions responses always use header v0, even for flexible versions:
/// a client must be able to read the response before it knows which versions
/// the broker supports.
pub fn response_header_version(api_key: i16, api_version: i16) -> Option<i16> {
    if api_version < 0 {
        return None;
    }
    let flex = first_flexible_version(api_key)?;
    if api_key == api_key::API_VERSIONS {
        return Some(0);
    }
    Some(if api_version >= flex { 1 } else { 0 })
}

/// Reads `host` and `port` (the two are adjacent in every broker structure)
/// at the reader's position, asks `nodes` for the advertised address, and
/// records a replacement of the `host..port` bytes in `sp` when it differs.
///
/// Entries with a negative node id (e.g. a FindCoordinator error carrying
/// `-1, "", -1`) are not real brokers: they are skipped without asking
/// `nodes`.
pub(crate) fn rewrite_host_port(
    r: &mut Reader<'_>,
    flexible: bool,
    node_id: i32,
    sp: &mut Splicer<'_>,
    nodes: &mut NodeMapper<'_>,
    host_field: &'static str,
    port_field: &'static str,
) -> WireResult<()> {
    let start = r.position();
    let host = r.read_string_v(flexible, host_field)?;
    let port = r.read_i32(port_field)?;
    let end = r.position();
    if node_id < 0 {
        return Ok(());
    }
    if let Some((new_host, new_port)) = nodes(node_id, host, port) {
        if new_host != host || new_port != port {
            let mut w = Writer::new(Vec::with_capacity(new_host.len() + 8));
            w.put_string_v(flexible, &new_host, host_field)?;
            w.put_i32(new_port);
            sp.replace(start, end, &w.into_inner())?;
        }
    }
    Ok(())
}

/// Fails with `UnsupportedVersion` when `version` is outside `range`.
pub(crate) fn check_version(
    api: &'static str,
    version: i16,
    range: RangeInclusive<i16>,
) -> WireResult<()> {
    if range.contains(&version) {
        Ok(())
    } else {
        Err(crate::wire::WireError::UnsupportedVersion { api, version })
    }
}
