//! MetadataResponse (API key 3) v0-v13: rewrite broker addresses.
//!
//! Layout up to the part we touch (flexible from v9):
//! `throttle_time_ms: i32 (v3+)`, `brokers: [node_id: i32, host: string,
//! port: i32, rack: nullable string (v1+), tagged fields (v9+)]`. Everything
//! after the brokers array (cluster id, controller, topics, ...) is copied
//! verbatim without being parsed: it carries node ids but no addresses.

use super::{check_version, rewrite_node_address, NodeFields, NodeMapper};
use crate::codec::api;
use crate::wire::{Reader, Splicer, WireResult};

/// MetadataResponse.brokers: where its addresses sit.
const BROKERS: NodeFields = NodeFields {
    node_id: "MetadataResponse.brokers.node_id",
    host: "MetadataResponse.brokers.host",
    port: "MetadataResponse.brokers.port",
};

/// Rewrites every broker address of a MetadataResponse body at `version`.
///
/// `nodes` is called once per broker with its upstream `(node_id, host,
/// port)`. Returns `Ok(None)` when no address changed (forward the original),
/// `Ok(Some(body))` with the spliced body otherwise.
pub fn rewrite_metadata_response(
    version: i16,
    body: &[u8],
    nodes: &mut NodeMapper<'_>,
) -> WireResult<Option<Vec<u8>>> {
    check_version("MetadataResponse", version, 0..=13)?;
    let flexible = api::is_flexible(api::METADATA, version);
    let mut r = Reader::new(body);
    let mut sp = Splicer::new(body);
    if version >= 3 {
        r.read_i32("MetadataResponse.throttle_time_ms")?;
    }
    // Smallest broker: node id + empty host + port (+ rack / tags) >= 10 bytes.
    let n = r.read_array_len_v(flexible, 10, "MetadataResponse.brokers")?;
    for _ in 0..n {
        rewrite_node_address(&mut r, flexible, &mut sp, nodes, &BROKERS)?;
        if version >= 1 {
            r.read_nullable_string_v(flexible, "MetadataResponse.brokers.rack")?;
        }
        r.skip_tagged_fields_v(flexible, "MetadataResponse.brokers._tagged_fields")?;
    }
    Ok(sp.finish())
}
