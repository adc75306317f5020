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
//! This module also re-exports [`request_header_version`] /
//! [`response_header_version`] (kept in [`crate::codec::api`]), so the core
//! can find the correlation id and header tagged fields of any frame, and
//! holds [`DECODED_VERSIONS`], the versions the rewriters understand. What a
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
pub mod guarded_writes;
pub mod metadata;
pub mod node_endpoints;
pub mod produce;
pub mod produce_build;
pub mod produce_request;
mod topic_entries;

pub use crate::codec::api::{request_header_version, response_header_version};
pub use api_versions::{clamp_api_versions_response, set_api_versions, MaxVersion};
pub use describe_cluster::rewrite_describe_cluster_response;
pub use fetch::{
    diverging_epoch, walk_fetch_response, AbortedTxn, FetchPartition, FetchResponseInfo, FetchTopic,
};
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
    pub use crate::codec::api::{
        API_VERSIONS, DESCRIBE_CLUSTER, FETCH, FIND_COORDINATOR, METADATA, PRODUCE,
    };
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

/// The field names of one broker address structure (`node_id`, `host`,
/// `port`, adjacent in that order in every response that carries one).
pub(crate) struct NodeFields {
    /// The node (or broker) id field.
    pub node_id: &'static str,
    /// The host field.
    pub host: &'static str,
    /// The port field.
    pub port: &'static str,
}

/// Reads `node_id`, `host` and `port` at the reader's position, asks `nodes`
/// for the advertised address, and records a replacement of the
/// `host..port` bytes in `sp` when it differs.
///
/// Entries with a negative node id (e.g. a FindCoordinator error carrying
/// `-1, "", -1`) are not real brokers: they are skipped without asking
/// `nodes`.
pub(crate) fn rewrite_node_address(
    r: &mut Reader<'_>,
    flexible: bool,
    sp: &mut Splicer<'_>,
    nodes: &mut NodeMapper<'_>,
    fields: &NodeFields,
) -> WireResult<()> {
    let node_id = r.read_i32(fields.node_id)?;
    let start = r.position();
    let host = r.read_string_v(flexible, fields.host)?;
    let port = r.read_i32(fields.port)?;
    let end = r.position();
    if node_id < 0 {
        return Ok(());
    }
    if let Some((new_host, new_port)) = nodes(node_id, host, port) {
        if new_host != host || new_port != port {
            let mut w = Writer::new(Vec::with_capacity(new_host.len() + 8));
            w.put_string_v(flexible, &new_host, fields.host)?;
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
