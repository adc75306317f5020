//! A listener's filters, composed: requests go through them in order,
//! responses too, and the ApiVersions clamp is computed from what they decode.

use std::ops::RangeInclusive;
use std::time::Duration;

use bytes::BytesMut;

use super::api_versions::ApiVersionsClamp;
use super::{
    Filter, OfflineAnswer, RequestAction, RequestState, ResponseStream, RewriteError, Rewritten,
};
use crate::codec::RequestHeader;

/// The filters of one listener, shared by its connections.
pub struct Chain {
    filters: Vec<Box<dyn Filter>>,
    /// Whether some filter answers without the upstream (fixed at build).
    serves_offline: bool,
}

/// What the chain decided about a request.
pub enum Decision {
    /// Forward `frame` (the original or a filter's replacement).
    Forward {
        /// The frame to send upstream.
        frame: BytesMut,
        /// State for the response's filters.
        state: Option<RequestState>,
    },
    /// Filter number `by` answers it ([`Chain::answer`]).
    Answer {
        /// Index of the answering filter.
        by: usize,
        /// Its state.
        state: RequestState,
    },
    /// Neither forward nor answer.
    Drop,
}

impl Chain {
    /// A chain of `filters` in data-path order, followed by the ApiVersions
    /// clamp to what they decode.
    pub fn new(mut filters: Vec<Box<dyn Filter>>) -> Self {
        let clamp = ApiVersionsClamp::for_filters(&filters);
        filters.push(Box::new(clamp));
        let serves_offline = filters.iter().any(|f| f.serves_offline());
        Self {
            filters,
            serves_offline,
        }
    }

    /// The decode set: per API key a filter parses, the versions every
    /// filter that parses it understands (sorted by key).
    pub fn decode_set(&self) -> Vec<(i16, RangeInclusive<i16>)> {
        decode_set(&self.filters)
    }

    /// Whether a response to `h` passes through some filter (else it is
    /// forwarded untouched).
    pub fn wants(&self, h: &RequestHeader) -> bool {
        self.filters
            .iter()
            .any(|f| f.handles(h.api_key, h.api_version))
    }

    /// Whether a request of `h` may be streamed upstream as it arrives: the
    /// listener would not keep it for a local answer
    /// ([`Filter::answers_offline`]), and every filter that reads it
    /// ([`Filter::reads_request`]) can tell from its head (`head`, of a
    /// frame `total` bytes long) that it would pass untouched
    /// ([`Filter::passes_from_head`]). Such a request bypasses
    /// [`on_request`](Self::on_request), which would forward it untouched
    /// with no state.
    pub fn streams_request(&self, h: &RequestHeader, head: &[u8], total: usize) -> bool {
        !self.filters.iter().any(|f| f.answers_offline(h.api_key))
            && self.filters.iter().all(|f| {
                !f.handles(h.api_key, h.api_version)
                    || !f.reads_request(h.api_key, h.api_version)
                    || f.passes_from_head(h, head, total)
            })
    }

    /// Whether more of the head of a request of `h` could make
    /// [`streams_request`](Self::streams_request) say yes: the listener does
    /// not keep it, and every filter that reads it may decide from a head
    /// ([`Filter::decides_from_head`]).
    pub fn head_may_decide(&self, h: &RequestHeader) -> bool {
        !self.filters.iter().any(|f| f.answers_offline(h.api_key))
            && self.filters.iter().all(|f| {
                !f.handles(h.api_key, h.api_version)
                    || !f.reads_request(h.api_key, h.api_version)
                    || f.decides_from_head(h.api_key, h.api_version)
            })
    }

    /// The streaming walker of the response to `h`, when one filter
    /// rewrites it as it arrives and every other that handles it leaves it
    /// untouched ([`Filter::response_stream`]); `None`: held whole (or, when
    /// no filter handles it, relayed as it is).
    pub fn response_stream(
        &self,
        h: &RequestHeader,
        state: Option<&RequestState>,
    ) -> Option<Box<crate::mirror::stream::FetchStream>> {
        let mut walker = None;
        for f in &self.filters {
            if !f.handles(h.api_key, h.api_version) {
                continue;
            }
            match f.response_stream(h, state) {
                ResponseStream::Hold => return None,
                ResponseStream::Untouched => {}
                ResponseStream::Rewrite(w) => {
                    if walker.is_some() {
                        return None;
                    }
                    walker = Some(w);
                }
            }
        }
        walker
    }

    /// Whether some filter can answer requests of `api_key` without the
    /// upstream ([`Filter::answers_offline`]).
    pub fn answers_offline(&self, api_key: i16) -> bool {
        self.filters.iter().any(|f| f.answers_offline(api_key))
    }

    /// Offers a request to every filter that handles it, in order; a
    /// replacement frame is what the next filter sees. At most one filter
    /// may attach state to a request.
    pub fn on_request(&self, h: &RequestHeader, frame: BytesMut) -> Result<Decision, RewriteError> {
        let mut frame = frame;
        let mut state: Option<RequestState> = None;
        for (i, f) in self.filters.iter().enumerate() {
            if !f.handles(h.api_key, h.api_version) {
                continue;
            }
            match f.on_request(h, &frame)? {
                RequestAction::Forward {
                    replacement,
                    state: s,
                } => {
                    if let Some(r) = replacement {
                        frame = r;
                    }
                    if let Some(s) = s {
                        if state.is_some() {
                            return Err(RewriteError::new(
                                h,
                                "two filters attached state to one request",
                            ));
                        }
                        state = Some(s);
                    }
                }
                RequestAction::Answer(s) => return Ok(Decision::Answer { by: i, state: s }),
                RequestAction::Drop => return Ok(Decision::Drop),
            }
        }
        Ok(Decision::Forward { frame, state })
    }

    /// Passes a response through every filter that handles it, in order,
    /// from filter number `*from` (0 for a fresh response), stopping at the
    /// first that blocks: `*from` is then that filter, and once the wait
    /// completes the caller resumes there with the returned frame. The
    /// filters before it already rewrote the frame and do not run again
    /// (they need not be idempotent).
    pub fn on_response(
        &self,
        h: &RequestHeader,
        state: &mut Option<RequestState>,
        frame: BytesMut,
        from: &mut usize,
    ) -> Result<Rewritten, RewriteError> {
        let mut frame = frame;
        for (i, f) in self.filters.iter().enumerate().skip(*from) {
            if !f.handles(h.api_key, h.api_version) {
                continue;
            }
            frame = match f.on_response(h, state.as_mut(), frame)? {
                Rewritten::Ready(next) => next,
                blocked => {
                    *from = i;
                    return Ok(blocked);
                }
            };
        }
        *from = self.filters.len();
        Ok(Rewritten::Ready(frame))
    }

    /// The answer of filter `by` to a request it kept ([`Decision::Answer`]).
    pub fn answer(
        &self,
        h: &RequestHeader,
        by: usize,
        state: &mut RequestState,
    ) -> Result<Rewritten, RewriteError> {
        match self.filters.get(by) {
            Some(f) => f.answer(h, state),
            None => Err(RewriteError::new(h, "no filter answers this request")),
        }
    }

    /// Whether the listener keeps its clients when the upstream is gone.
    pub fn serves_offline(&self) -> bool {
        self.serves_offline
    }

    /// The first deadline a filter sets for the upstream's answer to `h`.
    pub fn upstream_deadline(&self, h: &RequestHeader, frame: &[u8]) -> Option<Duration> {
        self.filters
            .iter()
            .find_map(|f| f.upstream_deadline(h, frame))
    }

    /// The first filter's answer to `request` without the upstream; `None`
    /// when no filter can answer it (the connection then closes).
    pub fn offline_answer(
        &self,
        h: &RequestHeader,
        request: &[u8],
    ) -> Option<Result<OfflineAnswer, RewriteError>> {
        self.filters
            .iter()
            .find_map(|f| f.offline_answer(h, request))
    }
}

/// Per API key any of `filters` decodes, the intersection of their version
/// ranges, sorted by key.
pub(super) fn decode_set(filters: &[Box<dyn Filter>]) -> Vec<(i16, RangeInclusive<i16>)> {
    let mut set: Vec<(i16, RangeInclusive<i16>)> = Vec::new();
    for (key, r) in filters.iter().flat_map(|f| f.decodes().iter()) {
        match set.iter_mut().find(|(k, _)| k == key) {
            Some((_, have)) => {
                *have = (*have.start()).max(*r.start())..=(*have.end()).min(*r.end());
            }
            None => set.push((*key, r.clone())),
        }
    }
    set.sort_by_key(|(k, _)| *k);
    set
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::codec::api;
    use crate::filter::address::AddressRewrite;
    use crate::filter::produce_guard::ProduceGuard;
    use crate::metrics::Metrics;
    use crate::proxy::nodes::NodeRegistry;

    fn nodes() -> Arc<NodeRegistry> {
        Arc::new(NodeRegistry::new("t", "127.0.0.1", 0, Metrics::new()))
    }

    fn header(api_key: i16, api_version: i16) -> RequestHeader {
        RequestHeader {
            api_key,
            api_version,
            correlation_id: 7,
        }
    }

    /// A plain listener clamps to exactly what the handlers parse.
    #[test]
    fn plain_chain_decodes_the_handler_table() {
        let chain = Chain::new(vec![Box::new(AddressRewrite::new(nodes()))]);
        let mut expected = crate::handlers::DECODED_VERSIONS.to_vec();
        expected.sort_by_key(|(k, _)| *k);
        assert_eq!(chain.decode_set(), expected);
        assert!(chain.wants(&header(api::METADATA, 0)));
        assert!(chain.wants(&header(api::API_VERSIONS, 3)));
        assert!(!chain.wants(&header(api::PRODUCE, 9)));
        assert!(chain.wants(&header(api::PRODUCE, 10)));
        assert!(!chain.wants(&header(api::FETCH, 15)));
        assert!(chain.wants(&header(api::FETCH, 16)));
        assert!(!chain.wants(&header(2, 8)));
    }

    /// Counts its responses; blocks the first `blocks` of them.
    struct Probe {
        seen: Arc<std::sync::atomic::AtomicUsize>,
        blocks: usize,
    }

    impl Filter for Probe {
        fn decodes(&self) -> &[(i16, RangeInclusive<i16>)] {
            &[]
        }

        fn handles(&self, api_key: i16, _api_version: i16) -> bool {
            api_key == api::FETCH
        }

        fn on_response(
            &self,
            _h: &RequestHeader,
            _state: Option<&mut RequestState>,
            mut frame: BytesMut,
        ) -> Result<Rewritten, RewriteError> {
            let n = self.seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if n < self.blocks {
                return Ok(Rewritten::Blocked {
                    frame: Some(frame),
                    wait: Box::pin(async { Ok(()) }),
                });
            }
            frame.extend_from_slice(b"!");
            Ok(Rewritten::Ready(frame))
        }
    }

    /// After a filter blocks, the chain resumes at it: the filters before
    /// it ran once, the frame keeps their rewrite, the ones after run once.
    #[test]
    fn a_blocked_response_resumes_at_the_filter_that_blocked() {
        let counters: Vec<Arc<std::sync::atomic::AtomicUsize>> =
            (0..3).map(|_| Default::default()).collect();
        let chain = Chain::new(vec![
            Box::new(Probe {
                seen: counters[0].clone(),
                blocks: 0,
            }),
            Box::new(Probe {
                seen: counters[1].clone(),
                blocks: 2,
            }),
            Box::new(Probe {
                seen: counters[2].clone(),
                blocks: 0,
            }),
        ]);
        let h = header(api::FETCH, 12);
        let mut state = None;
        let mut from = 0;
        let mut frame = BytesMut::from(&b"f"[..]);
        let out = loop {
            match chain.on_response(&h, &mut state, frame, &mut from).unwrap() {
                Rewritten::Ready(f) => break f,
                Rewritten::Blocked { frame: f, .. } => {
                    assert_eq!(from, 1);
                    frame = f.unwrap();
                }
            }
        };
        let seen: Vec<usize> = counters
            .iter()
            .map(|c| c.load(std::sync::atomic::Ordering::SeqCst))
            .collect();
        assert_eq!(seen, vec![1, 3, 1]);
        assert_eq!(&out[..], b"f!!!");
    }

    /// The guard's own Produce limit lowers the chain's clamp; nothing else moves.
    #[test]
    fn guard_chain_clamps_produce_to_what_the_guard_parses() {
        let metrics = Metrics::new();
        let guard = ProduceGuard::new(
            "g",
            crate::lifecycle::Lifecycle::new(metrics.clone()),
            Vec::new(),
            metrics,
        );
        let chain = Chain::new(vec![
            Box::new(guard),
            Box::new(AddressRewrite::new(nodes())),
        ]);
        let set = chain.decode_set();
        let produce = set.iter().find(|(k, _)| *k == api::PRODUCE).unwrap();
        assert_eq!(produce.1, 3..=12);
        let fetch = set.iter().find(|(k, _)| *k == api::FETCH).unwrap();
        assert_eq!(fetch.1, 4..=18);
        assert!(chain.wants(&header(api::PRODUCE, 3)));
    }
}
