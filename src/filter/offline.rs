//! Answers without the source: a mirror listener keeps its clients (the
//! destination's fetcher above all) when the source is dead or hung.
//!
//! This filter decodes no API on the live path. It gives each request a
//! deadline (a Fetch's MaxWaitMs, capped, plus the mirror's request
//! timeout) and, once the connection has gone offline, answers requests
//! from the mirror's last known topology ([`crate::mirror::offline`]). The
//! answers pass through the rest of the chain like upstream responses.

use std::ops::RangeInclusive;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;

use super::{Filter, OfflineAnswer, RequestState, RewriteError, Rewritten};
use crate::codec::api;
use crate::codec::RequestHeader;
use crate::mirror::{offline, MirrorContext};

/// Answers a mirror listener's clients from the last known topology.
pub struct SourceOffline {
    mirror: Arc<MirrorContext>,
}

impl SourceOffline {
    /// Offline answers for `mirror`'s listeners.
    pub fn new(mirror: Arc<MirrorContext>) -> Self {
        Self { mirror }
    }
}

impl Filter for SourceOffline {
    fn decodes(&self) -> &[(i16, RangeInclusive<i16>)] {
        &[]
    }

    fn handles(&self, _api_key: i16, _api_version: i16) -> bool {
        false
    }

    fn on_response(
        &self,
        _h: &RequestHeader,
        _state: Option<&mut RequestState>,
        frame: BytesMut,
    ) -> Result<Rewritten, RewriteError> {
        Ok(Rewritten::Ready(frame))
    }

    fn serves_offline(&self) -> bool {
        true
    }

    fn answers_offline(&self, api_key: i16) -> bool {
        offline::answers(api_key)
    }

    fn upstream_deadline(&self, h: &RequestHeader, frame: &[u8]) -> Option<Duration> {
        let wait = if h.api_key == api::FETCH {
            offline::fetch_max_wait_ms(h, frame)
                .and_then(|w| u64::try_from(w).ok())
                .map(Duration::from_millis)
                .unwrap_or_default()
                .min(self.mirror.request_timeout)
        } else {
            Duration::ZERO
        };
        Some(wait + self.mirror.request_timeout)
    }

    fn offline_answer(
        &self,
        h: &RequestHeader,
        request: &[u8],
    ) -> Option<Result<OfflineAnswer, RewriteError>> {
        let topology = self.mirror.topology().unwrap_or_default();
        let brokers = self.mirror.offline_brokers();
        offline::answer(h, request, &topology, &brokers, self.mirror.request_timeout)
    }
}
