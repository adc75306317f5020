//! The filter chain: what a listener does to the requests and responses of
//! the APIs it decodes, one filter per concern.
//!
//! Every frame that crosses a listener meets its [`Chain`] twice. On the way
//! up, [`Chain::on_request`] offers the request to each filter whose
//! [`Filter::handles`] says yes; a filter may forward it (possibly rewritten),
//! answer it itself, or drop it, and may attach a typed [`RequestState`] that
//! travels with the in-flight entry to the response. On the way down,
//! [`Chain::on_response`] passes the response through the same filters in
//! order. APIs no filter handles are forwarded byte for byte and never parsed.
//!
//! The filters, in data-path order:
//!
//! - [`offline::SourceOffline`]: a mirror listener answers its fetcher from
//!   its last known topology when the source is gone (no API of its own);
//! - [`produce_guard::ProduceGuard`]: Produce to partitions a mirror still
//!   feeds is refused;
//! - [`write_guard::WriteGuard`]: on the same guard listeners, the other
//!   writes into such partitions (AddPartitionsToTxn, WriteTxnMarkers,
//!   DeleteRecords, CreatePartitions, DeleteTopics) are refused;
//! - [`mirror_fetch::MirrorFetch`]: PIDs of mirrored Fetch responses are
//!   mapped and observed in the shadow producer state;
//! - [`seal::Seal`]: controlled partitions of a Fetch are served from the
//!   seal path, never from the source;
//! - [`sasl::SaslRelay`]: SaslHandshake v0 refused (raw tokens follow it);
//!   on mirror listeners every SASL request answered locally;
//! - [`address::AddressRewrite`]: broker addresses become proxy addresses;
//! - [`api_versions::ApiVersionsClamp`]: added by [`Chain::new`] to every
//!   chain, it lowers the advertised versions to what the chain's filters
//!   decode ([`Filter::decodes`]), so clients never pick a version a filter
//!   cannot parse.
//!
//! Adding an API rewrite is one file here (a type implementing [`Filter`]:
//! what it decodes, what it handles, what it does) plus one line where the
//! chains are assembled in `run.rs` (`common_filters` for every listener
//! kind, or one kind's chain). The decode set, the ApiVersions clamp and
//! which frames are parsed at all follow from the chain. A filter that
//! carries state from a request to its response also adds its variant to
//! [`RequestState`].

pub mod address;
pub mod allowlist;
pub mod api_versions;
pub mod chain;
pub mod mirror_fetch;
pub mod offline;
pub mod produce_guard;
pub mod sasl;
pub mod seal;
pub mod write_guard;

use std::ops::RangeInclusive;
use std::time::Duration;

use bytes::{BufMut, BytesMut};

use crate::codec::api;
use crate::codec::RequestHeader;

pub use crate::BoxFuture;
pub use chain::{Chain, Decision};

/// One concern of a listener on the APIs it handles.
///
/// Filters hold no per-connection state: a listener shares one chain across
/// its connections, and everything one request needs at its response is its
/// [`RequestState`].
pub trait Filter: Send + Sync {
    /// `(api_key, versions)` this filter parses. The chain's ApiVersions
    /// clamp lowers each API's advertised maximum to the lowest maximum any
    /// filter declares for it.
    fn decodes(&self) -> &[(i16, RangeInclusive<i16>)];

    /// Whether requests and responses of `api_key` at `api_version` pass
    /// through this filter.
    fn handles(&self, api_key: i16, api_version: i16) -> bool;

    /// The highest version of `api_key` whose responses this filter leaves
    /// untouched, when it must rewrite newer ones with a length change
    /// (which holds them whole instead of streaming them); `None` (the
    /// default) when it has no such preference. The chain's ApiVersions
    /// clamp advertises at most this version, unless another filter of the
    /// chain handles responses of that version anyway (then lowering it
    /// would give up the newer version's fields for nothing): clients then
    /// negotiate a version whose responses stream. It lowers only what is
    /// advertised: [`handles`](Self::handles) and [`decodes`](Self::decodes)
    /// still cover the newer versions, so a client that ignores ApiVersions
    /// and sends one is rewritten as before.
    fn streams_at_most(&self, _api_key: i16) -> Option<i16> {
        None
    }

    /// Whether this filter can rewrite responses of `api_key` at
    /// `api_version` as they arrive ([`response_stream`](Self::response_stream)
    /// says so for the common case). The ApiVersions clamp does not count
    /// such a filter as one that holds the responses anyway.
    fn streams_responses(&self, _api_key: i16, _api_version: i16) -> bool {
        false
    }

    /// For a response this filter handles, decided before it arrives (from
    /// the request's `state`): whether the filter needs it whole (the
    /// default), leaves it untouched, or rewrites it as it arrives with a
    /// streaming walker. The chain streams a response only when one filter
    /// streams it and every other that handles it leaves it untouched.
    fn response_stream(&self, _h: &RequestHeader, _state: Option<&RequestState>) -> ResponseStream {
        ResponseStream::Hold
    }

    /// Whether [`on_request`](Self::on_request) reads the body of a request
    /// of `api_key` at `api_version`. When no filter of a chain does, the
    /// connection streams the request upstream as it arrives instead of
    /// holding it whole (and `on_request` is not called). The default is
    /// [`handles`](Self::handles), the safe answer for a filter that
    /// overrides `on_request`; filters that only rewrite responses say no.
    fn reads_request(&self, api_key: i16, api_version: i16) -> bool {
        self.handles(api_key, api_version)
    }

    /// For a request this filter reads: whether the head of the request
    /// (`head`: its first bytes, size prefix included, at most about
    /// 96 KiB; `total`: the frame's length) already shows that
    /// [`on_request`](Self::on_request) would forward it untouched with no
    /// state. Then the connection streams it without calling `on_request`.
    /// The default says no: the request is held whole.
    fn passes_from_head(&self, _h: &RequestHeader, _head: &[u8], _total: usize) -> bool {
        false
    }

    /// Whether more of a request's head may let
    /// [`passes_from_head`](Self::passes_from_head) say yes (the produce
    /// guard, which finds a Produce's partitions in its head); the default
    /// says no, so a connection holding a request this filter reads stops
    /// reading its head at once and holds it whole, within the budget.
    fn decides_from_head(&self, _api_key: i16, _api_version: i16) -> bool {
        false
    }

    /// Decides about a request before it is forwarded. The default forwards
    /// it untouched.
    fn on_request(&self, _h: &RequestHeader, _frame: &[u8]) -> Result<RequestAction, RewriteError> {
        Ok(RequestAction::forward())
    }

    /// Rewrites a whole response frame (size prefix included). `state` is
    /// what a filter of the chain attached to the request. Errors close the
    /// connection: an unparseable response might carry an upstream address,
    /// which a client must never see.
    fn on_response(
        &self,
        h: &RequestHeader,
        state: Option<&mut RequestState>,
        frame: BytesMut,
    ) -> Result<Rewritten, RewriteError>;

    /// Builds the response to a request this filter answered itself
    /// ([`RequestAction::Answer`]).
    fn answer(
        &self,
        h: &RequestHeader,
        _state: &mut RequestState,
    ) -> Result<Rewritten, RewriteError> {
        Err(RewriteError::new(
            h,
            "this filter answers no request itself",
        ))
    }

    /// Whether this filter can answer the listener's clients without the
    /// upstream (then the connection keeps requests until they are answered
    /// and gives them deadlines).
    fn serves_offline(&self) -> bool {
        false
    }

    /// Whether [`offline_answer`](Self::offline_answer) can answer requests
    /// of `api_key` (a connection keeps only those requests, whole, for a
    /// local answer; the others may stream).
    fn answers_offline(&self, _api_key: i16) -> bool {
        false
    }

    /// How long the upstream may take to answer this request before the
    /// connection goes offline (`None`: no opinion).
    fn upstream_deadline(&self, _h: &RequestHeader, _frame: &[u8]) -> Option<Duration> {
        None
    }

    /// The answer to `request` built without the upstream; `None` when this
    /// filter cannot answer it.
    fn offline_answer(
        &self,
        _h: &RequestHeader,
        _request: &[u8],
    ) -> Option<Result<OfflineAnswer, RewriteError>> {
        None
    }
}

/// What a filter carries from a request to its response, one variant per
/// stateful filter (matched, never downcast).
#[derive(Debug)]
pub enum RequestState {
    /// The partitions the produce guard refused ([`produce_guard`]).
    Guard(produce_guard::Refusals),
    /// A write other than Produce the guard refused ([`write_guard`]).
    GuardWrite(write_guard::WriteRefusals),
    /// The seal's plan of a Fetch touching controlled partitions ([`seal`]).
    Seal(crate::mirror::seal_path::FetchPlan),
    /// A SASL request answered locally ([`sasl`]).
    Sasl(sasl::LocalSaslAnswer),
    /// The body refusing a request a mirror listener does not forward
    /// ([`allowlist`]).
    Refused(Vec<u8>),
}

impl RequestState {
    /// The seal's plan, if this is one.
    pub fn seal_plan(&self) -> Option<&crate::mirror::seal_path::FetchPlan> {
        match self {
            RequestState::Seal(p) => Some(p),
            _ => None,
        }
    }
}

/// How a filter treats a response before it arrives
/// ([`Filter::response_stream`]).
pub enum ResponseStream {
    /// Held whole and passed to [`Filter::on_response`].
    Hold,
    /// `on_response` would return it unchanged: it may pass as it arrives.
    Untouched,
    /// Rewritten as it arrives by this walker (a mirror's Fetch response).
    Rewrite(Box<crate::mirror::stream::FetchStream>),
}

/// What to do with a client request.
pub enum RequestAction {
    /// Forward it upstream (or `replacement` instead of the original frame).
    Forward {
        /// A rewritten request frame to send instead of the original.
        replacement: Option<BytesMut>,
        /// Handed back with the response.
        state: Option<RequestState>,
    },
    /// Do not forward; the filter's [`Filter::answer`] builds the response.
    Answer(RequestState),
    /// Do not forward and do not answer (a refused `acks=0` Produce).
    Drop,
}

impl RequestAction {
    /// Forward the request untouched, with no state.
    pub fn forward() -> Self {
        RequestAction::Forward {
            replacement: None,
            state: None,
        }
    }
}

/// Result of [`Filter::on_response`] and [`Filter::answer`].
pub enum Rewritten {
    /// The frame to send on (to the next filter, then the client).
    Ready(BytesMut),
    /// The frame cannot leave until `wait` completes (for example a collision
    /// salt being persisted); then the chain resumes on `frame` at the filter
    /// that blocked ([`Chain::on_response`](Chain::on_response)),
    /// which must be idempotent on its own partly rewritten frame.
    Blocked {
        /// The frame, possibly partly rewritten (`None` for a local answer,
        /// which is built again).
        frame: Option<BytesMut>,
        /// What must complete first.
        wait: BoxFuture<'static, Result<(), RewriteError>>,
    },
}

/// A response built by a filter in place of the upstream's.
pub struct OfflineAnswer {
    /// The frame, as the upstream would have sent it (it passes through the
    /// chain like an upstream response).
    pub frame: BytesMut,
    /// Not sent before `sent_at + not_before` (a Fetch's MaxWaitMs: no hot
    /// retry loop for a fetcher that gets nothing).
    pub not_before: Duration,
}

/// A request or response a filter could not handle.
#[derive(Debug, thiserror::Error)]
#[error("cannot rewrite {api} v{version} response: {message}")]
pub struct RewriteError {
    /// API name.
    pub api: &'static str,
    /// API version.
    pub version: i16,
    /// What went wrong.
    pub message: String,
}

impl RewriteError {
    /// An error about the request or response of `h`.
    pub fn new(h: &RequestHeader, message: impl Into<String>) -> Self {
        Self {
            api: api::api_name(h.api_key).unwrap_or("unknown"),
            version: h.api_version,
            message: message.into(),
        }
    }
}

/// The decode set of a filter parsing `api_keys` with the handlers of
/// [`crate::handlers`], at every version they parse.
pub(crate) fn decoded_by_handlers(api_keys: &[i16]) -> Vec<(i16, RangeInclusive<i16>)> {
    api_keys
        .iter()
        .filter_map(|k| crate::handlers::decoded_versions(*k).map(|r| (*k, r)))
        .collect()
}

/// `frame` with everything after `body_at` replaced by `body` (the size
/// prefix follows; the header bytes are kept as they came).
pub(crate) fn with_body(frame: &[u8], body_at: usize, body: &[u8]) -> BytesMut {
    let mut out = BytesMut::with_capacity(body_at + body.len());
    out.put_i32((body_at - 4 + body.len()) as i32);
    out.extend_from_slice(&frame[4..body_at]);
    out.extend_from_slice(body);
    out
}

/// A response frame the proxy answers `h` with itself (no upstream frame to
/// splice into): `h`'s correlation id, an empty header tagged-field section
/// where the response header is flexible, then `body`.
pub(crate) fn answer_frame(h: &RequestHeader, body: &[u8]) -> Result<BytesMut, RewriteError> {
    let hv = crate::handlers::response_header_version(h.api_key, h.api_version)
        .ok_or_else(|| RewriteError::new(h, "unknown response header version"))?;
    Ok(crate::codec::header::response_frame(
        h.correlation_id,
        hv,
        body,
    ))
}

/// The response body offset of `frame`, answering `h`.
pub(crate) fn response_body_at(h: &RequestHeader, frame: &[u8]) -> Result<usize, RewriteError> {
    let hv = crate::handlers::response_header_version(h.api_key, h.api_version)
        .ok_or_else(|| RewriteError::new(h, "unknown response header version"))?;
    crate::codec::header::response_body_offset(frame, hv)
        .ok_or_else(|| RewriteError::new(h, "response header truncated"))
}
