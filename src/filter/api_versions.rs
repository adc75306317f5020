//! The ApiVersions clamp: the versions a listener advertises are the ones
//! its filters can parse.
//!
//! A broker advertises every version it speaks; a client picks the highest
//! one both know. If that version is newer than a filter of the listener
//! parses, the filter would fail on the response (and the connection would
//! close), so each advertised maximum is lowered to the lowest maximum any
//! filter of the chain declares for that API. APIs no filter decodes are
//! advertised as the broker sent them. [`Chain::new`](super::Chain::new)
//! appends this filter to every chain, computed from the others.

use std::ops::RangeInclusive;

use bytes::BytesMut;

use super::{
    decoded_by_handlers, response_body_at, with_body, Filter, RequestState, RewriteError, Rewritten,
};
use crate::codec::api;
use crate::codec::RequestHeader;
use crate::handlers;

/// Lowers advertised maxima to the chain's decode set.
pub struct ApiVersionsClamp {
    /// What this filter parses itself: ApiVersions.
    decodes: Vec<(i16, RangeInclusive<i16>)>,
    /// `(api_key, max_version)` of every API some filter decodes.
    table: Vec<(i16, i16)>,
}

impl ApiVersionsClamp {
    /// The clamp of a chain made of `filters` (and this clamp).
    pub fn for_filters(filters: &[Box<dyn Filter>]) -> Self {
        let decodes = decoded_by_handlers(&[api::API_VERSIONS]);
        let mut table: Vec<(i16, i16)> = super::chain::decode_set(filters)
            .into_iter()
            .map(|(k, r)| (k, *r.end()))
            .collect();
        for (key, r) in &decodes {
            match table.iter_mut().find(|(k, _)| k == key) {
                Some((_, max)) => *max = (*max).min(*r.end()),
                None => table.push((*key, *r.end())),
            }
        }
        table.sort_by_key(|(k, _)| *k);
        Self { decodes, table }
    }

    /// The `(api_key, max_version)` table responses are clamped to.
    pub fn table(&self) -> &[(i16, i16)] {
        &self.table
    }
}

impl Filter for ApiVersionsClamp {
    fn decodes(&self) -> &[(i16, RangeInclusive<i16>)] {
        &self.decodes
    }

    fn handles(&self, api_key: i16, _api_version: i16) -> bool {
        api_key == api::API_VERSIONS
    }

    fn on_response(
        &self,
        h: &RequestHeader,
        _state: Option<&mut RequestState>,
        frame: BytesMut,
    ) -> Result<Rewritten, RewriteError> {
        let body_at = response_body_at(h, &frame)?;
        let clamped =
            handlers::clamp_api_versions_response(h.api_version, &frame[body_at..], &self.table)
                .map_err(|e| RewriteError::new(h, e.to_string()))?;
        Ok(Rewritten::Ready(match clamped {
            None => frame,
            Some(body) => with_body(&frame, body_at, &body),
        }))
    }
}
