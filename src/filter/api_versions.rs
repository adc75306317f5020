//! The ApiVersions clamp: the versions a listener advertises are the ones
//! its filters can parse.
//!
//! A broker advertises every version it speaks; a client picks the highest
//! one both know. If that version is newer than a filter of the listener
//! parses, the filter would fail on the response (and the connection would
//! close), so each advertised maximum is lowered to the lowest maximum any
//! filter of the chain declares for that API. APIs no filter decodes are
//! advertised as the broker sent them, except SaslHandshake, advertised as
//! v1 only (v0 is followed by raw SASL tokens no frame reader can follow).
//! A filter may ask for less than it decodes
//! ([`Filter::streams_at_most`]: the
//! address rewrite for Fetch, whose v16+ responses it must hold whole):
//! the maximum is lowered to that version too, unless another filter of
//! the chain holds responses of that version anyway (a filter that
//! streams them, [`Filter::streams_responses`]: the mirror fetch rewrite,
//! does not count).
//! [`Chain::new`](super::Chain::new)
//! appends this filter to every chain, computed from the others.

use std::ops::RangeInclusive;

use bytes::BytesMut;

use super::{
    decoded_by_handlers, response_body_at, with_body, Filter, RequestState, RewriteError, Rewritten,
};
use crate::codec::api;
use crate::codec::RequestHeader;
use crate::handlers;

/// SaslHandshake's API key.
const SASL_HANDSHAKE: i16 = 17;

/// Lowers advertised maxima to the chain's decode set.
pub struct ApiVersionsClamp {
    /// What this filter parses itself: ApiVersions.
    decodes: Vec<(i16, RangeInclusive<i16>)>,
    /// `(api_key, max_version)` of every API some filter decodes.
    table: Vec<(i16, i16)>,
    /// `(api_key, max_version)` whose responses stream
    /// ([`Filter::streams_at_most`]): lowered to unless the broker's
    /// minimum is above it.
    prefer: Vec<(i16, i16)>,
}

impl ApiVersionsClamp {
    /// The clamp of a chain made of `filters` (and this clamp).
    pub fn for_filters(filters: &[Box<dyn Filter>]) -> Self {
        let decodes = decoded_by_handlers(&[api::API_VERSIONS]);
        let mut table: Vec<(i16, i16)> = super::chain::decode_set(filters)
            .into_iter()
            .map(|(k, r)| (k, *r.end()))
            .collect();
        // Versions whose responses would stream: only worth asking for when
        // no filter of the chain holds such responses anyway.
        let mut prefer: Vec<(i16, i16)> = Vec::new();
        for f in filters {
            for (key, _) in &table {
                let Some(v) = f.streams_at_most(*key) else {
                    continue;
                };
                if filters
                    .iter()
                    .any(|g| g.handles(*key, v) && !g.streams_responses(*key, v))
                {
                    continue;
                }
                match prefer.iter_mut().find(|(k, _)| k == key) {
                    Some((_, max)) => *max = (*max).min(v),
                    None => prefer.push((*key, v)),
                }
            }
        }
        prefer.sort_by_key(|(k, _)| *k);
        for (key, r) in &decodes {
            match table.iter_mut().find(|(k, _)| k == key) {
                Some((_, max)) => *max = (*max).min(*r.end()),
                None => table.push((*key, *r.end())),
            }
        }
        table.sort_by_key(|(k, _)| *k);
        Self {
            decodes,
            table,
            prefer,
        }
    }

    /// The `(api_key, max_version)` table responses are clamped to.
    pub fn table(&self) -> &[(i16, i16)] {
        &self.table
    }

    /// The `(api_key, max_version)` preferred so responses stream
    /// ([`Filter::streams_at_most`]).
    pub fn preferred(&self) -> &[(i16, i16)] {
        &self.prefer
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
        let frame = match clamped {
            None => frame,
            Some(body) => with_body(&frame, body_at, &body),
        };
        let preferred = handlers::api_versions::prefer_api_versions_response(
            h.api_version,
            &frame[body_at..],
            &self.prefer,
        )
        .map_err(|e| RewriteError::new(h, e.to_string()))?;
        let frame = match preferred {
            None => frame,
            Some(body) => with_body(&frame, body_at, &body),
        };
        // SaslHandshake v0 is followed by raw SASL tokens, not frames: never
        // offer it (see filter::sasl, which refuses a v0 request).
        let raised = handlers::set_api_versions(
            h.api_version,
            &frame[body_at..],
            &[(SASL_HANDSHAKE, 1, 1)],
            false,
        )
        .map_err(|e| RewriteError::new(h, e.to_string()))?;
        Ok(Rewritten::Ready(match raised {
            None => frame,
            Some(body) => with_body(&frame, body_at, &body),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ApiVersions v`version` response frame advertising `entries`.
    fn response(version: i16, entries: &[(i16, i16, i16)]) -> BytesMut {
        let flexible = version >= 3;
        let mut b = vec![0, 0]; // error_code
        if flexible {
            b.push(entries.len() as u8 + 1);
        } else {
            b.extend_from_slice(&(entries.len() as i32).to_be_bytes());
        }
        for (k, min, max) in entries {
            for v in [k, min, max] {
                b.extend_from_slice(&v.to_be_bytes());
            }
            if flexible {
                b.push(0);
            }
        }
        if version >= 1 {
            b.extend_from_slice(&0i32.to_be_bytes());
        }
        if flexible {
            b.push(0);
        }
        crate::codec::header::response_frame(9, 0, &b)
    }

    #[test]
    fn sasl_handshake_v0_is_never_advertised() {
        let clamp = ApiVersionsClamp::for_filters(&[]);
        for v in [0, 3, 4] {
            let h = RequestHeader {
                api_key: api::API_VERSIONS,
                api_version: v,
                correlation_id: 9,
            };
            let f = response(v, &[(17, 0, 1), (18, 0, 4), (36, 0, 2)]);
            let Rewritten::Ready(out) = clamp.on_response(&h, None, f).unwrap() else {
                panic!()
            };
            let max_api_versions = handlers::decoded_versions(api::API_VERSIONS)
                .map(|r| *r.end())
                .unwrap();
            assert_eq!(
                out,
                response(
                    v,
                    &[(17, 1, 1), (18, 0, max_api_versions.min(4)), (36, 0, 2)]
                ),
                "v{v}"
            );
        }
    }

    #[test]
    fn missing_entries_are_added_in_place() {
        for v in [0, 3] {
            let f = response(v, &[(1, 4, 17), (17, 0, 1)]);
            let body = handlers::set_api_versions(v, &f[8..], &[(17, 1, 1), (36, 0, 2)], true)
                .unwrap()
                .unwrap();
            assert_eq!(
                &body[..],
                &response(v, &[(1, 4, 17), (17, 1, 1), (36, 0, 2)])[8..],
                "v{v}"
            );
            // Nothing to change: None.
            let same = response(v, &[(17, 1, 1)]);
            assert!(
                handlers::set_api_versions(v, &same[8..], &[(17, 1, 1)], false)
                    .unwrap()
                    .is_none()
            );
        }
    }
}
