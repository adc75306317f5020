//! KIP-951 `NodeEndpoints`: rewrite the broker addresses that ProduceResponse
//! v10+ and FetchResponse v16+ carry in their top-level tagged field 0.
//!
//! A client that gets NOT_LEADER_OR_FOLLOWER learns the new leader's address
//! from these entries (`[node_id: i32, host: compact string, port: i32,
//! rack: compact nullable string, tags]`) and would connect to it directly,
//! bypassing the proxy, if they were left alone. The per-partition
//! `CurrentLeader` tagged field carries only a leader id and epoch, no
//! address, so it is forwarded as is.
//!
//! Reaching the top-level tagged section requires walking the whole response
//! (records are skipped as opaque bytes); the rewritten tagged field is then
//! spliced in with its new size, everything else copied verbatim.

use super::{check_version, fetch::walk_fetch_response, produce::walk_produce_response};
use super::{rewrite_node_address, NodeFields, NodeMapper};
use crate::wire::{Reader, Splicer, TaggedSection, WireResult, Writer};

/// NodeEndpoints: where its addresses sit.
const ENDPOINT: NodeFields = NodeFields {
    node_id: "NodeEndpoints.node_id",
    host: "NodeEndpoints.host",
    port: "NodeEndpoints.port",
};

/// Tag of the top-level `NodeEndpoints` field in Produce and Fetch responses.
pub const NODE_ENDPOINTS_TAG: u32 = 0;

/// Rewrites the payload of a `NodeEndpoints` tagged field. Returns the new
/// payload, or `None` when no address changed.
pub fn rewrite_node_endpoints_payload(
    data: &[u8],
    nodes: &mut NodeMapper<'_>,
) -> WireResult<Option<Vec<u8>>> {
    let mut r = Reader::new(data);
    let mut sp = Splicer::new(data);
    // Smallest entry: id(4) host(1) port(4) rack(1) tags(1).
    let n = r.read_array_len_v(true, 11, "NodeEndpoints")?;
    for _ in 0..n {
        rewrite_node_address(&mut r, true, &mut sp, nodes, &ENDPOINT)?;
        r.read_compact_nullable_string("NodeEndpoints.rack")?;
        r.read_tagged_fields("NodeEndpoints._tagged_fields")?;
    }
    Ok(sp.finish())
}

/// Rewrites `NodeEndpoints` inside a top-level tagged section of `body`.
fn rewrite_in_section(
    body: &[u8],
    section: &TaggedSection<'_>,
    nodes: &mut NodeMapper<'_>,
) -> WireResult<Option<Vec<u8>>> {
    let mut sp = Splicer::new(body);
    for f in section.iter() {
        if f.tag != NODE_ENDPOINTS_TAG {
            continue;
        }
        if let Some(new_data) = rewrite_node_endpoints_payload(f.data, nodes)? {
            let mut w = Writer::new(Vec::with_capacity(new_data.len() + 10));
            w.put_tagged_field(f.tag, &new_data, "NodeEndpoints")?;
            sp.replace(f.start, f.end, &w.into_inner())?;
        }
    }
    Ok(sp.finish())
}

/// Rewrites the `NodeEndpoints` of a ProduceResponse body (v0-v13; only
/// v10+ can carry them, earlier versions return `Ok(None)` unparsed).
pub fn rewrite_produce_response(
    version: i16,
    body: &[u8],
    nodes: &mut NodeMapper<'_>,
) -> WireResult<Option<Vec<u8>>> {
    check_version("ProduceResponse", version, 0..=13)?;
    if version < 10 {
        return Ok(None);
    }
    let info = walk_produce_response(version, body)?;
    match info.tagged_fields {
        Some(section) => rewrite_in_section(body, &section, nodes),
        None => Ok(None),
    }
}

/// Rewrites the `NodeEndpoints` of a FetchResponse body (v4-v18; only v16+
/// can carry them, earlier versions return `Ok(None)` unparsed).
pub fn rewrite_fetch_response(
    version: i16,
    body: &[u8],
    nodes: &mut NodeMapper<'_>,
) -> WireResult<Option<Vec<u8>>> {
    check_version("FetchResponse", version, 4..=18)?;
    if version < 16 {
        return Ok(None);
    }
    let info = walk_fetch_response(version, body, &mut |_| {})?;
    match info.tagged_fields {
        Some(section) => rewrite_in_section(body, &section, nodes),
        None => Ok(None),
    }
}
