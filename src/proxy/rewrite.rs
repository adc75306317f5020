//! Address rewriting for a plain proxy listener.
//!
//! Every response that can carry a broker address is rewritten so a client
//! only ever sees proxy addresses: Metadata, FindCoordinator, DescribeCluster,
//! and the KIP-951 NodeEndpoints of Produce v10+ and Fetch v16+. ApiVersions
//! is clamped so clients never choose a version of those APIs that the
//! rewriters cannot parse. Every other response passes untouched.

use std::sync::Arc;

use bytes::{BufMut, BytesMut};

use crate::codec::api;
use crate::codec::header::response_body_offset;
use crate::codec::RequestHeader;
use crate::handlers::{self, DECODED_VERSIONS};
use crate::proxy::connection::{ResponseRewriter, RewriteError, Rewritten};
use crate::proxy::nodes::NodeRegistry;

/// Rewrites broker addresses to the listener's proxy ports.
pub struct AddressRewriter {
    nodes: Arc<NodeRegistry>,
}

impl AddressRewriter {
    /// A rewriter that advertises the nodes of `nodes`.
    pub fn new(nodes: Arc<NodeRegistry>) -> Self {
        Self { nodes }
    }
}

/// Whether a response of this API and version can carry a broker address or
/// must be clamped.
pub fn needs_address_rewrite(h: &RequestHeader) -> bool {
    match h.api_key {
        api::METADATA | api::FIND_COORDINATOR | api::DESCRIBE_CLUSTER | api::API_VERSIONS => true,
        api::PRODUCE => h.api_version >= 10,
        api::FETCH => h.api_version >= 16,
        _ => false,
    }
}

impl ResponseRewriter for AddressRewriter {
    fn wants(&self, h: &RequestHeader) -> bool {
        needs_address_rewrite(h)
    }

    fn rewrite(
        &self,
        h: &RequestHeader,
        _plan: Option<&mut crate::proxy::connection::Plan>,
        frame: BytesMut,
    ) -> Result<Rewritten, RewriteError> {
        let mut map =
            |node_id: i32, host: &str, port: i32| Some(self.nodes.advertise(node_id, host, port));
        rewrite_addresses(h, frame, &mut map).map(Rewritten::Ready)
    }
}

/// Applies the address rewriters (and the ApiVersions clamp) to one response
/// frame; shared by every listener kind.
pub fn rewrite_addresses(
    h: &RequestHeader,
    frame: BytesMut,
    map: &mut handlers::NodeMapper<'_>,
) -> Result<BytesMut, RewriteError> {
    let err = |message: String| RewriteError {
        api: api::api_name(h.api_key).unwrap_or("unknown"),
        version: h.api_version,
        message,
    };
    let header_version = handlers::response_header_version(h.api_key, h.api_version)
        .ok_or_else(|| err("unknown response header version".into()))?;
    let body_at = response_body_offset(&frame, header_version)
        .ok_or_else(|| err("response header truncated".into()))?;
    let body = &frame[body_at..];
    let v = h.api_version;
    let rewritten = match h.api_key {
        api::METADATA => handlers::rewrite_metadata_response(v, body, map),
        api::FIND_COORDINATOR => handlers::rewrite_find_coordinator_response(v, body, map),
        api::DESCRIBE_CLUSTER => handlers::rewrite_describe_cluster_response(v, body, map),
        api::PRODUCE => handlers::rewrite_produce_response(v, body, map),
        api::FETCH => handlers::rewrite_fetch_response(v, body, map),
        api::API_VERSIONS => handlers::clamp_api_versions_response(v, body, DECODED_VERSIONS),
        _ => Ok(None),
    }
    .map_err(|e| err(e.to_string()))?;
    Ok(match rewritten {
        None => frame,
        Some(new_body) => {
            let mut out = BytesMut::with_capacity(body_at + new_body.len());
            out.put_i32((body_at - 4 + new_body.len()) as i32);
            out.extend_from_slice(&frame[4..body_at]);
            out.extend_from_slice(&new_body);
            out
        }
    })
}
