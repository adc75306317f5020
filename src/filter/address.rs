//! Address rewriting: a client only ever sees proxy addresses.
//!
//! Every response that can carry a broker address is rewritten to the
//! listener's per-node proxy ports: Metadata, FindCoordinator,
//! DescribeCluster, and the KIP-951 NodeEndpoints of Produce v10+ and Fetch
//! v16+. Every listener kind has this filter; it comes after the filters
//! that change a response's content, so whatever they add is rewritten too.

use std::ops::RangeInclusive;
use std::sync::Arc;

use bytes::BytesMut;

use super::{
    decoded_by_handlers, response_body_at, with_body, Filter, RequestState, RewriteError, Rewritten,
};
use crate::codec::api;
use crate::codec::RequestHeader;
use crate::handlers;
use crate::proxy::nodes::NodeRegistry;

/// The APIs whose responses carry broker addresses.
const ADDRESS_APIS: [i16; 5] = [
    api::METADATA,
    api::FIND_COORDINATOR,
    api::DESCRIBE_CLUSTER,
    api::PRODUCE,
    api::FETCH,
];

/// Whether a response of `api_key` at `api_version` can carry a broker
/// address.
pub fn carries_address(api_key: i16, api_version: i16) -> bool {
    match api_key {
        api::METADATA | api::FIND_COORDINATOR | api::DESCRIBE_CLUSTER => true,
        api::PRODUCE => api_version >= 10,
        api::FETCH => api_version > FETCH_WITHOUT_ADDRESSES,
        _ => false,
    }
}

/// The highest Fetch version whose response carries no broker address.
/// Fetch v16 (KIP-951) adds NodeEndpoints: the new leaders' addresses, sent
/// with NOT_LEADER_OR_FOLLOWER and FENCED_LEADER_EPOCH so a client can move
/// without a Metadata round trip.
pub const FETCH_WITHOUT_ADDRESSES: i16 = 15;

/// Rewrites broker addresses to the listener's proxy ports.
///
/// Fetch is the one address-carrying API whose responses are large: a v16+
/// response must be held whole (NodeEndpoints sit after the records and
/// change length when rewritten), while up to v15 it streams through a
/// listener that has no other Fetch filter (plain and guard listeners). So
/// this filter asks the ApiVersions clamp to advertise at most Fetch v15
/// ([`Filter::streams_at_most`]). The trade-off: clients lose the KIP-951
/// leader hints through the proxy and, as before v16, find a moved leader
/// by a Metadata request after the NOT_LEADER_OR_FOLLOWER error (one round
/// trip, on leader changes only), in exchange for memory that does not grow
/// with the Fetch size and no store-and-forward delay on every response.
/// A client that ignores ApiVersions and sends v16+ anyway is still
/// rewritten, held whole. Mirror listeners keep the broker's maximum: their
/// Fetch responses are held for the PID rewrite in any case.
pub struct AddressRewrite {
    nodes: Arc<NodeRegistry>,
    decodes: Vec<(i16, RangeInclusive<i16>)>,
}

impl AddressRewrite {
    /// A filter that advertises the nodes of `nodes`.
    pub fn new(nodes: Arc<NodeRegistry>) -> Self {
        Self {
            nodes,
            decodes: decoded_by_handlers(&ADDRESS_APIS),
        }
    }
}

impl Filter for AddressRewrite {
    fn decodes(&self) -> &[(i16, RangeInclusive<i16>)] {
        &self.decodes
    }

    fn handles(&self, api_key: i16, api_version: i16) -> bool {
        carries_address(api_key, api_version)
    }

    /// Fetch: the newest version without NodeEndpoints, so responses stream
    /// (see [`AddressRewrite`]).
    fn streams_at_most(&self, api_key: i16) -> Option<i16> {
        (api_key == api::FETCH).then_some(FETCH_WITHOUT_ADDRESSES)
    }

    /// Only responses carry addresses: requests stream past this filter.
    fn reads_request(&self, _api_key: i16, _api_version: i16) -> bool {
        false
    }

    fn on_response(
        &self,
        h: &RequestHeader,
        _state: Option<&mut RequestState>,
        frame: BytesMut,
    ) -> Result<Rewritten, RewriteError> {
        let mut map =
            |node_id: i32, host: &str, port: i32| Some(self.nodes.advertise(node_id, host, port));
        let body_at = response_body_at(h, &frame)?;
        let body = &frame[body_at..];
        let v = h.api_version;
        let rewritten = match h.api_key {
            api::METADATA => handlers::rewrite_metadata_response(v, body, &mut map),
            api::FIND_COORDINATOR => handlers::rewrite_find_coordinator_response(v, body, &mut map),
            api::DESCRIBE_CLUSTER => handlers::rewrite_describe_cluster_response(v, body, &mut map),
            api::PRODUCE => handlers::rewrite_produce_response(v, body, &mut map),
            api::FETCH => handlers::rewrite_fetch_response(v, body, &mut map),
            _ => Ok(None),
        }
        .map_err(|e| RewriteError::new(h, e.to_string()))?;
        Ok(Rewritten::Ready(match rewritten {
            None => frame,
            Some(new_body) => with_body(&frame, body_at, &new_body),
        }))
    }
}
