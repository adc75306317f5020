//! DescribeClusterResponse (API key 60) v0-v2: rewrite broker addresses.
//!
//! Field order from the Kafka schema (DescribeClusterResponse.json, flexible
//! from v0): `throttle_time_ms: i32`, `error_code: i16`,
//! `error_message: compact nullable string`, `endpoint_type: i8 (v1+)`,
//! `cluster_id: compact string`, `controller_id: i32`,
//! `brokers: [broker_id: i32, host, port: i32, rack: nullable string,
//! is_fenced: bool (v2+), tagged fields]`,
//! `cluster_authorized_operations: i32`, tagged fields.
//!
//! With `endpoint_type = 2` (controllers, KIP-919) the entries are controller
//! addresses; they are passed to the mapper all the same and the registry
//! decides.

use super::{check_version, rewrite_node_address, NodeFields, NodeMapper};
use crate::wire::{Reader, Splicer, WireResult};

/// DescribeClusterResponse.brokers: where its addresses sit.
const BROKERS: NodeFields = NodeFields {
    node_id: "DescribeClusterResponse.brokers.broker_id",
    host: "DescribeClusterResponse.brokers.host",
    port: "DescribeClusterResponse.brokers.port",
};

/// Rewrites every broker address of a DescribeClusterResponse body.
///
/// Returns `Ok(None)` when nothing changed.
pub fn rewrite_describe_cluster_response(
    version: i16,
    body: &[u8],
    nodes: &mut NodeMapper<'_>,
) -> WireResult<Option<Vec<u8>>> {
    check_version("DescribeClusterResponse", version, 0..=2)?;
    let mut r = Reader::new(body);
    let mut sp = Splicer::new(body);
    r.read_i32("DescribeClusterResponse.throttle_time_ms")?;
    r.read_i16("DescribeClusterResponse.error_code")?;
    r.read_compact_nullable_string("DescribeClusterResponse.error_message")?;
    if version >= 1 {
        r.read_i8("DescribeClusterResponse.endpoint_type")?;
    }
    r.read_compact_string("DescribeClusterResponse.cluster_id")?;
    r.read_i32("DescribeClusterResponse.controller_id")?;
    // Smallest broker: id(4) host(1) port(4) rack(1) tags(1).
    let n = r.read_array_len_v(true, 11, "DescribeClusterResponse.brokers")?;
    for _ in 0..n {
        rewrite_node_address(&mut r, true, &mut sp, nodes, &BROKERS)?;
        r.read_compact_nullable_string("DescribeClusterResponse.brokers.rack")?;
        if version >= 2 {
            r.read_bool("DescribeClusterResponse.brokers.is_fenced")?;
        }
        r.read_tagged_fields("DescribeClusterResponse.brokers._tagged_fields")?;
    }
    // cluster_authorized_operations and the top-level tags follow verbatim;
    // check they are present so a truncated frame is reported, not forwarded.
    r.read_i32("DescribeClusterResponse.cluster_authorized_operations")?;
    r.read_tagged_fields("DescribeClusterResponse._tagged_fields")?;
    Ok(sp.finish())
}
