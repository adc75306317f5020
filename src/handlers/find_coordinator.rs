//! FindCoordinatorResponse (API key 10) v0-v6: rewrite coordinator addresses.
//!
//! v0-v3 carry one coordinator: `throttle_time_ms: i32 (v1+)`,
//! `error_code: i16`, `error_message: nullable string (v1+)`, `node_id`,
//! `host`, `port`, tagged fields (v3). v4+ (KIP-699) batch them:
//! `throttle_time_ms`, `coordinators: [key, node_id, host, port, error_code,
//! error_message, tagged fields]`, tagged fields. Flexible from v3.
//! Error entries carry node id -1 and are left as they are.

use super::{check_version, rewrite_node_address, NodeFields, NodeMapper};
use crate::codec::api;
use crate::wire::{Reader, Splicer, WireResult};

/// FindCoordinatorResponse: where its addresses sit.
const COORDINATOR: NodeFields = NodeFields {
    node_id: "FindCoordinatorResponse.node_id",
    host: "FindCoordinatorResponse.host",
    port: "FindCoordinatorResponse.port",
};

/// FindCoordinatorResponse.coordinators: where its addresses sit.
const COORDINATORS: NodeFields = NodeFields {
    node_id: "FindCoordinatorResponse.coordinators.node_id",
    host: "FindCoordinatorResponse.coordinators.host",
    port: "FindCoordinatorResponse.coordinators.port",
};

/// Rewrites the coordinator address(es) of a FindCoordinatorResponse body.
///
/// `nodes` is called for every entry with a non-negative node id. Returns
/// `Ok(None)` when nothing changed.
pub fn rewrite_find_coordinator_response(
    version: i16,
    body: &[u8],
    nodes: &mut NodeMapper<'_>,
) -> WireResult<Option<Vec<u8>>> {
    check_version("FindCoordinatorResponse", version, 0..=6)?;
    let flexible = api::is_flexible(api::FIND_COORDINATOR, version);
    let mut r = Reader::new(body);
    let mut sp = Splicer::new(body);
    if version >= 1 {
        r.read_i32("FindCoordinatorResponse.throttle_time_ms")?;
    }
    if version <= 3 {
        r.read_i16("FindCoordinatorResponse.error_code")?;
        if version >= 1 {
            r.read_nullable_string_v(flexible, "FindCoordinatorResponse.error_message")?;
        }
        rewrite_node_address(&mut r, flexible, &mut sp, nodes, &COORDINATOR)?;
    } else {
        // Smallest entry: key(1) node(4) host(1) port(4) err(2) msg(1) tags(1).
        let n = r.read_array_len_v(true, 14, "FindCoordinatorResponse.coordinators")?;
        for _ in 0..n {
            r.read_compact_string("FindCoordinatorResponse.coordinators.key")?;
            rewrite_node_address(&mut r, true, &mut sp, nodes, &COORDINATORS)?;
            r.read_i16("FindCoordinatorResponse.coordinators.error_code")?;
            r.read_compact_nullable_string("FindCoordinatorResponse.coordinators.error_message")?;
            r.read_tagged_fields("FindCoordinatorResponse.coordinators._tagged_fields")?;
        }
    }
    // The top-level tagged fields (v3+) are copied verbatim; reading them
    // makes a truncated frame an error instead of something forwarded.
    r.skip_tagged_fields_v(flexible, "FindCoordinatorResponse._tagged_fields")?;
    Ok(sp.finish())
}
