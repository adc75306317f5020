//! The mirror fetch rewrite: PIDs of the Fetch responses a mirror listener
//! relays are mapped into the source cluster's region and observed in the
//! shadow producer state (see [`crate::mirror`] for the rewrite itself).
//!
//! Partitions the seal controls are left alone here: their source bytes are
//! never observed nor forwarded (the [`seal`](super::seal) filter that
//! follows replaces them). A response whose rewrite must wait for something
//! durable (a collision salt, producer claims, a replay) is held: the filter
//! returns [`Rewritten::Blocked`] with the frame unchanged.
//!
//! Large responses whose length cannot change are not held at all: they
//! are rewritten as they arrive ([`Filter::response_stream`], the walker of
//! [`crate::mirror::stream`]), with the same result.

use std::ops::RangeInclusive;
use std::sync::Arc;

use bytes::BytesMut;

use super::{decoded_by_handlers, Filter, RequestState, ResponseStream, RewriteError, Rewritten};
use crate::codec::api;
use crate::codec::RequestHeader;
use crate::handlers::FetchTopic;
use crate::mirror::{seal_path, MirrorContext};

/// Maps and observes the PIDs of a mirror's Fetch responses.
pub struct MirrorFetch {
    mirror: Arc<MirrorContext>,
    /// Whether this listener is the destination fetcher's: only its fetches
    /// feed the shadow producer state (other readers are mapped alike).
    fetcher: bool,
    decodes: Vec<(i16, RangeInclusive<i16>)>,
}

impl MirrorFetch {
    /// The rewrite of `mirror`'s Fetch responses for the destination fetcher
    /// (`fetcher`) or for other readers.
    pub fn new(mirror: Arc<MirrorContext>, fetcher: bool) -> Self {
        Self {
            mirror,
            fetcher,
            decodes: decoded_by_handlers(&[api::FETCH]),
        }
    }
}

impl Filter for MirrorFetch {
    fn decodes(&self) -> &[(i16, RangeInclusive<i16>)] {
        &self.decodes
    }

    fn handles(&self, api_key: i16, _api_version: i16) -> bool {
        api_key == api::FETCH
    }

    fn streams_responses(&self, api_key: i16, _api_version: i16) -> bool {
        api_key == api::FETCH
    }

    /// Streamed unless the response may need a length change: a seal plan
    /// (controlled partitions, readers below a cut), any controlled
    /// partition (a session's strays), or the mirror holding responses
    /// until its topic ids are known (see [`crate::mirror::stream`]).
    fn response_stream(&self, h: &RequestHeader, state: Option<&RequestState>) -> ResponseStream {
        if state.is_some()
            || self.mirror.lifecycle.controls()
            || self
                .mirror
                .stream_hold
                .load(std::sync::atomic::Ordering::Relaxed)
        {
            return ResponseStream::Hold;
        }
        match crate::mirror::stream::FetchStream::new(self.mirror.clone(), h, self.fetcher) {
            Some(w) => ResponseStream::Rewrite(Box::new(w)),
            None => ResponseStream::Hold,
        }
    }

    fn on_response(
        &self,
        h: &RequestHeader,
        state: Option<&mut RequestState>,
        frame: BytesMut,
    ) -> Result<Rewritten, RewriteError> {
        let fetch_plan = state.and_then(|s| s.seal_plan());
        // A reader's batches past the cut of a sealed partition never reach
        // it: they are dropped before the scan, so they claim nothing.
        let frame = seal_path::trim_below_cut(h, fetch_plan, frame)?;
        // Controlled partitions, listed or not, are answered by the seal
        // path: their source bytes are never observed nor forwarded.
        let skip = |t: &FetchTopic<'_>, p: i32| {
            seal_path::is_controlled(fetch_plan, t, p)
                || seal_path::is_stray(&self.mirror, fetch_plan, t, p)
        };
        self.mirror
            .rewrite_fetch_frame(h, frame, &skip, self.fetcher)
    }
}
