//! SaslHandshake and SaslAuthenticate on the relayed path.
//!
//! On `[[listener]]` and `[[guard]]` listeners ([`SaslRelay::Passthrough`])
//! both APIs flow to the broker untouched (the client authenticates to the
//! broker, KIP-368 re-authentication included), except SaslHandshake v0:
//! after it a client sends raw SASL tokens, not Kafka frames, which no
//! frame reader can follow. v0 is therefore never advertised (the
//! ApiVersions clamp raises SaslHandshake's minimum to 1) and a v0 request
//! is answered UNSUPPORTED_VERSION locally instead of forwarded. Every
//! Kafka client since 1.0 (Java, librdkafka, franz-go, Sarama with
//! `Version >= 1.0`) uses v1.
//!
//! On `[[mirror]]` listeners ([`SaslRelay::Terminated`]) clients
//! authenticate to mirrorguard before the relay starts
//! ([`crate::sasl::server`]) and the upstream connection is mirrorguard's
//! own: a SASL request on the relayed connection is answered
//! ILLEGAL_SASL_STATE, as a Kafka broker answers it after authentication,
//! and never reaches the source.

use std::ops::RangeInclusive;

use bytes::BytesMut;

use super::{Filter, RequestAction, RequestState, RewriteError, Rewritten};
use crate::codec::api::error::UNSUPPORTED_VERSION;
use crate::codec::header::response_frame;
use crate::codec::RequestHeader;

const SASL_HANDSHAKE: i16 = 17;
const SASL_AUTHENTICATE: i16 = 36;
const ILLEGAL_SASL_STATE: i16 = 34;

/// How a listener treats SASL requests on relayed connections.
pub enum SaslRelay {
    /// Forward them (v0 handshakes excepted).
    Passthrough,
    /// Answer them ILLEGAL_SASL_STATE (authentication happened before the
    /// relay, against mirrorguard).
    Terminated,
}

/// The error a SASL request is answered with locally.
#[derive(Debug)]
pub struct LocalSaslAnswer {
    code: i16,
}

impl Filter for SaslRelay {
    fn decodes(&self) -> &[(i16, RangeInclusive<i16>)] {
        // Nothing is parsed beyond the header.
        &[]
    }

    fn handles(&self, api_key: i16, api_version: i16) -> bool {
        match self {
            SaslRelay::Passthrough => api_key == SASL_HANDSHAKE && api_version == 0,
            SaslRelay::Terminated => api_key == SASL_HANDSHAKE || api_key == SASL_AUTHENTICATE,
        }
    }

    fn on_request(&self, h: &RequestHeader, _frame: &[u8]) -> Result<RequestAction, RewriteError> {
        let code = match self {
            SaslRelay::Passthrough => UNSUPPORTED_VERSION,
            SaslRelay::Terminated => ILLEGAL_SASL_STATE,
        };
        tracing::debug!(
            api_key = h.api_key,
            api_version = h.api_version,
            code,
            "SASL request answered locally"
        );
        Ok(RequestAction::Answer(RequestState::Sasl(LocalSaslAnswer {
            code,
        })))
    }

    fn on_response(
        &self,
        _h: &RequestHeader,
        _state: Option<&mut RequestState>,
        frame: BytesMut,
    ) -> Result<Rewritten, RewriteError> {
        Ok(Rewritten::Ready(frame))
    }

    fn answer(
        &self,
        h: &RequestHeader,
        state: &mut RequestState,
    ) -> Result<Rewritten, RewriteError> {
        let RequestState::Sasl(LocalSaslAnswer { code }) = state else {
            return Err(RewriteError::new(h, "no SASL answer state"));
        };
        Ok(Rewritten::Ready(match h.api_key {
            SASL_HANDSHAKE => {
                // error_code, mechanisms (none): the same in v0 and v1.
                let mut body = code.to_be_bytes().to_vec();
                body.extend_from_slice(&0i32.to_be_bytes());
                response_frame(h.correlation_id, 0, &body)
            }
            _ => crate::sasl::server::authenticate_response(
                h,
                *code,
                Some("SaslAuthenticate request received after successful authentication"),
                &[],
                0,
            ),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(api_key: i16, api_version: i16) -> RequestHeader {
        RequestHeader {
            api_key,
            api_version,
            correlation_id: 7,
        }
    }

    #[test]
    fn v0_handshakes_are_refused_and_mirror_sasl_is_illegal() {
        let p = SaslRelay::Passthrough;
        assert!(p.handles(SASL_HANDSHAKE, 0));
        assert!(!p.handles(SASL_HANDSHAKE, 1));
        assert!(!p.handles(SASL_AUTHENTICATE, 2));
        let h = header(SASL_HANDSHAKE, 0);
        let RequestAction::Answer(mut s) = p.on_request(&h, &[]).unwrap() else {
            panic!("v0 must be answered locally")
        };
        let Rewritten::Ready(f) = p.answer(&h, &mut s).unwrap() else {
            panic!()
        };
        assert_eq!(&f[..], &[0, 0, 0, 10, 0, 0, 0, 7, 0, 35, 0, 0, 0, 0]);

        let t = SaslRelay::Terminated;
        for v in 0..=2 {
            assert!(t.handles(SASL_AUTHENTICATE, v));
            let h = header(SASL_AUTHENTICATE, v);
            let RequestAction::Answer(mut s) = t.on_request(&h, &[]).unwrap() else {
                panic!()
            };
            let Rewritten::Ready(f) = t.answer(&h, &mut s).unwrap() else {
                panic!()
            };
            let body_at = if v >= 2 { 9 } else { 8 };
            assert_eq!(&f[body_at..body_at + 2], &ILLEGAL_SASL_STATE.to_be_bytes());
        }
    }
}
