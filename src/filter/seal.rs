//! The seal on the fetch path, as a filter: Fetch requests touching
//! controlled partitions (PAUSED, STOPPING, STOPPED, FAILED) are planned
//! before they are forwarded, and their responses get the controlled
//! partitions' entries from the seal path, never from the source (see
//! [`crate::mirror::seal_path`] for the decisions themselves).
//!
//! The plan travels to the response as [`RequestState::Seal`]. A request
//! whose partitions are all controlled is answered here; a response to a
//! request without a plan still loses the controlled partitions an
//! incremental fetch session returned unasked ("strays").

use std::ops::RangeInclusive;
use std::sync::Arc;

use bytes::BytesMut;

use super::{
    decoded_by_handlers, Filter, RequestAction, RequestState, ResponseStream, RewriteError,
    Rewritten,
};
use crate::codec::api;
use crate::codec::RequestHeader;
use crate::mirror::{seal_path, MirrorContext};

/// Serves controlled partitions of a mirror's fetches from the seal path.
pub struct Seal {
    mirror: Arc<MirrorContext>,
    /// Whether this listener is the destination fetcher's: only its fetches
    /// take a cut and complete a seal.
    fetcher: bool,
    decodes: Vec<(i16, RangeInclusive<i16>)>,
}

impl Seal {
    /// The seal of `mirror`'s partitions for the destination fetcher
    /// (`fetcher`) or for other readers.
    pub fn new(mirror: Arc<MirrorContext>, fetcher: bool) -> Self {
        Self {
            mirror,
            fetcher,
            decodes: decoded_by_handlers(&[api::FETCH]),
        }
    }
}

impl Filter for Seal {
    fn decodes(&self) -> &[(i16, RangeInclusive<i16>)] {
        &self.decodes
    }

    fn handles(&self, api_key: i16, _api_version: i16) -> bool {
        api_key == api::FETCH
    }

    fn on_request(&self, h: &RequestHeader, frame: &[u8]) -> Result<RequestAction, RewriteError> {
        Ok(seal_path::plan_fetch(&self.mirror, h, frame, self.fetcher)?
            .unwrap_or_else(RequestAction::forward))
    }

    fn streams_responses(&self, api_key: i16, _api_version: i16) -> bool {
        api_key == api::FETCH
    }

    /// Untouched without a plan while no partition is controlled (no stray
    /// can come back); held otherwise.
    fn response_stream(&self, _h: &RequestHeader, state: Option<&RequestState>) -> ResponseStream {
        if state.is_none() && !self.mirror.lifecycle.controls() {
            ResponseStream::Untouched
        } else {
            ResponseStream::Hold
        }
    }

    fn on_response(
        &self,
        h: &RequestHeader,
        state: Option<&mut RequestState>,
        frame: BytesMut,
    ) -> Result<Rewritten, RewriteError> {
        match state.and_then(|s| s.seal_plan()) {
            Some(plan) => seal_path::splice_controlled(&self.mirror, h, plan, frame),
            None => seal_path::drop_strays(&self.mirror, h, frame).map(Rewritten::Ready),
        }
    }

    fn answer(
        &self,
        h: &RequestHeader,
        state: &mut RequestState,
    ) -> Result<Rewritten, RewriteError> {
        match state {
            RequestState::Seal(plan) => seal_path::answer_fetch(&self.mirror, h, plan),
            _ => Err(RewriteError::new(
                h,
                "the seal answers only its fetch plans",
            )),
        }
    }
}
