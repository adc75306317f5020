//! The seal on the fetch path: Fetch requests that touch controlled
//! partitions (PAUSED, STOPPING, STOPPED, FAILED) and the responses they get.
//!
//! Requests are only parsed when some partition is controlled. A request
//! whose partitions are all controlled is answered by the proxy and never
//! reaches the source; otherwise it is forwarded and the controlled
//! partitions' entries in the response are replaced (or added, when an
//! incremental session left them out), so no source byte past the cut ever
//! reaches the fetcher. Decisions that must be durable first (taking the
//! cut, completing the seal) block the response until `__mirror_state`
//! acknowledges them.
//!
//! A reader that is not the destination fetcher and reads below the cut of
//! a STOPPING or STOPPED partition reads what the destination holds there:
//! that partition is forwarded to the source like a MIRRORING one (mapped,
//! never observed) and its answer is cut at the cut.
//!
//! The files: `plan` (what a request needs and the durable decisions first),
//! `answer` (local answers and the splice into forwarded responses),
//! `jobs` (the durable work of one fetch, run together), `below_cut`
//! (readers below the cut) and `sessions` (incremental fetch sessions and
//! stray partitions).

use std::borrow::Cow;
use std::sync::Arc;

use bytes::{BufMut, BytesMut};

use crate::codec::header::{request_body_offset, response_body_offset};
use crate::codec::RequestHeader;
use crate::filter::{RequestAction, RequestState, RewriteError, Rewritten};
use crate::handlers::{
    self, build_fetch_response, parse_fetch_request, rewrite_fetch_request,
    splice_fetch_response_dropping, FetchPartitionResponse, FetchTopic,
};
use crate::lifecycle::seal::{decide, serve_reader, Decision, LocalPartition, OpenTxn, StopRule};
use crate::lifecycle::State;
use crate::producer_state::PartitionKey;

use super::MirrorContext;

mod answer;
mod below_cut;
mod jobs;
mod plan;
mod sessions;

pub use answer::answer_fetch;
pub use answer::splice_controlled;
use below_cut::below_cut_response;
use below_cut::below_cut_straddles;
use below_cut::is_below_cut;
use below_cut::note_straddle;
pub use below_cut::trim_below_cut;
pub(crate) use plan::after_stopped;
use plan::decide_all;
pub use plan::plan_fetch;
#[cfg(test)]
pub(crate) use plan::seal_needs_take_over;
pub use sessions::drop_strays;
pub use sessions::is_stray;
use sessions::note_session;
pub use sessions::SessionMemory;

/// Kafka's FETCH_SESSION_ID_NOT_FOUND: the fetcher starts a full fetch.
const FETCH_SESSION_ID_NOT_FOUND: i16 = 70;

use super::TopicRef;

/// One controlled partition of a request.
#[derive(Debug, Clone)]
struct Controlled {
    topic: TopicRef,
    partition: i32,
    key: PartitionKey,
    fetch_offset: i64,
    last_fetched_epoch: i32,
    current_leader_epoch: i32,
}

impl Controlled {
    /// A partition of the request that mirrorguard answers itself.
    fn listed(
        topic: &FetchTopic<'_>,
        p: &crate::handlers::FetchRequestPartition,
        key: PartitionKey,
    ) -> Self {
        Self {
            topic: TopicRef::of(topic),
            partition: p.partition,
            key,
            fetch_offset: p.fetch_offset,
            last_fetched_epoch: p.last_fetched_epoch,
            current_leader_epoch: p.current_leader_epoch,
        }
    }
}

/// A sealed partition a reader (not the destination fetcher) reads below
/// its cut: forwarded to the source, and the answer cut there.
#[derive(Debug, Clone)]
struct BelowCut {
    topic: TopicRef,
    partition: i32,
    /// The destination partition (for metrics and logs).
    key: PartitionKey,
    /// The cut: batches at or past it never reach the reader.
    cut: i64,
    /// The destination's log end once sealed (cut + sealing batches, or
    /// the cut while their number is unknown): the highest watermark shown.
    end: i64,
    /// (mapped PID, first offset) of the transactions the seal aborts at the
    /// cut: aborted on the destination whatever the source did past the cut,
    /// so a read_committed reader is told so.
    sealed_aborts: Vec<(i64, i64)>,
}

/// The plan of a Fetch request on a mirror listener.
#[derive(Debug)]
pub struct FetchPlan {
    controlled: Vec<Controlled>,
    /// Sealed partitions a reader reads below the cut (forwarded).
    below_cut: Vec<BelowCut>,
    read_committed: bool,
    /// Answer with FETCH_SESSION_ID_NOT_FOUND (forces a full fetch that lists
    /// every partition with its offset).
    force_full_fetch: bool,
    session_id: i32,
    session_epoch: i32,
    /// Controlled partitions the forwarded request keeps out of the upstream
    /// session (dropped from the request, or added to its forgotten topics):
    /// remembered once the upstream accepted the request.
    out_of_session: Vec<PartitionKey>,
    /// Every partition a fetcher's full session request listed: what the
    /// session it creates holds (see [`SessionMemory::may_hold`]).
    listed: Option<Vec<PartitionKey>>,
    /// Whether the request came in on the destination fetcher's listener.
    fetcher: bool,
    /// The request's MaxWaitMs: a local answer with no records is held this
    /// long, as a broker holds a Fetch that finds nothing, so a fetcher of a
    /// sealed partition polls at its own pace instead of spinning.
    max_wait_ms: i32,
    /// Set once the local answer has waited.
    waited: bool,
    /// When a forwarded request's MaxWaitMs runs out (`None` when the
    /// request may not be held: MaxWaitMs or MinBytes of 0, or a seal to
    /// serve at once). The upstream answers at once a request left with no
    /// partitions (Kafka's `ReplicaManager.fetchMessages` holds only a fetch
    /// that asks for something), which is what a fetcher of only sealed
    /// partitions sends once they are dropped or out of its session: an
    /// answer with no records and no error is held until then.
    hold_until: Option<std::time::Instant>,
}

/// The longest a local answer with no records is held (a hostile MaxWaitMs
/// cannot park a request for longer).
const MAX_LOCAL_WAIT_MS: i32 = 30_000;

fn err(version: i16, message: String) -> RewriteError {
    RewriteError {
        api: "Fetch",
        version,
        message,
    }
}

/// The source topic of a destination partition as a Fetch request at
/// `version` names it (a name before v13, the id from v13).
fn source_topic_ref(mirror: &MirrorContext, key: &PartitionKey, version: i16) -> Option<TopicRef> {
    let name = mirror.source_topic(&key.topic)?;
    if version < 13 {
        return Some(TopicRef::Name(name));
    }
    let t = mirror.topics.read().unwrap_or_else(|p| p.into_inner());
    t.by_id
        .iter()
        .find(|(_, n)| ***n == *name)
        .map(|(id, _)| TopicRef::Id(*id))
}

/// Whether a response partition is controlled by the plan (its records are
/// replaced, so the PID rewriting skips it).
pub fn is_controlled(plan: Option<&FetchPlan>, topic: &FetchTopic<'_>, partition: i32) -> bool {
    plan.map(|p| {
        p.controlled
            .iter()
            .any(|c| c.topic.as_fetch_topic() == *topic && c.partition == partition)
    })
    .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::builder::{build_batch, BatchSpec, RecordSpec};

    /// A data batch of `n` records at `base`.
    fn batch(base: i64, n: i32) -> Vec<u8> {
        let records: Vec<RecordSpec<'_>> = (0..n)
            .map(|i| RecordSpec {
                offset_delta: i,
                value: Some(b"v"),
                ..RecordSpec::default()
            })
            .collect();
        build_batch(
            &BatchSpec {
                base_offset: base,
                ..BatchSpec::default()
            },
            &records,
        )
    }

    /// The below-cut entry built from an upstream answer holding `records`.
    fn cut_at(records: &[u8], cut: i64, aborted: Vec<(i64, i64)>) -> (Vec<u8>, i64, i64, usize) {
        let mut p = FetchPartitionResponse::new(0);
        p.high_watermark = 100;
        p.last_stable_offset = 90;
        p.log_start_offset = 0;
        p.aborted_transactions = Some(
            aborted
                .iter()
                .map(
                    |&(producer_id, first_offset)| handlers::AbortedTransaction {
                        producer_id,
                        first_offset,
                    },
                )
                .collect(),
        );
        p.records = Some(Cow::Borrowed(records));
        let body = build_fetch_response(12, 0, 0, 0, &[(FetchTopic::Name("t"), vec![p])]).unwrap();
        let mut parts = Vec::new();
        handlers::walk_fetch_response(12, &body, &mut |p| parts.push(p.clone())).unwrap();
        let b = BelowCut {
            topic: TopicRef::Name("t".into()),
            partition: 0,
            key: PartitionKey::new([0; 16], "t", 0),
            cut,
            end: cut + 2,
            sealed_aborts: vec![(7, 3)],
        };
        let r = below_cut_response(&body, &parts[0], &b, true);
        (
            r.records.unwrap().into_owned(),
            r.high_watermark,
            r.last_stable_offset,
            r.aborted_transactions.unwrap().len(),
        )
    }

    #[test]
    fn a_below_cut_answer_ends_before_the_cut() {
        let (a, b, c) = (batch(0, 3), batch(3, 2), batch(5, 4));
        let all = [a.clone(), b.clone(), c.clone()].concat();
        // Cut at a batch boundary: the batches below it, nothing else.
        let (records, hw, lso, aborted) = cut_at(&all, 5, vec![(1, 0), (2, 6)]);
        assert_eq!(records, [a.clone(), b.clone()].concat());
        assert_eq!((hw, lso), (7, 7));
        // (1, 0) is below the cut, (2, 6) past it; the seal's (7, 3) added.
        assert_eq!(aborted, 2);
        // A batch crossing the cut is dropped with everything after it.
        let (records, ..) = cut_at(&all, 4, vec![]);
        assert_eq!(records, a);
        // A reader whose offset lies in a batch crossing the cut gets
        // nothing: that is detected (counted, warned once).
        let straddles = |records: &[u8], cut| {
            let mut p = FetchPartitionResponse::new(0);
            p.records = Some(Cow::Borrowed(records));
            let body =
                build_fetch_response(12, 0, 0, 0, &[(FetchTopic::Name("t"), vec![p])]).unwrap();
            let mut parts = Vec::new();
            handlers::walk_fetch_response(12, &body, &mut |p| parts.push(p.clone())).unwrap();
            below_cut_straddles(&body, &parts[0], cut)
        };
        assert!(straddles(&[b.clone(), c.clone()].concat(), 4));
        assert!(!straddles(&all, 4), "the first batch is below the cut");
        assert!(
            !straddles(&[b.clone(), c.clone()].concat(), 5),
            "a batch boundary"
        );
        assert!(!straddles(&b[..b.len() - 3], 4), "a truncated batch");
        // A truncated tail below the cut is left out too.
        let partial = [a.clone(), b[..b.len() - 3].to_vec()].concat();
        let (records, ..) = cut_at(&partial, 9, vec![]);
        assert_eq!(records, a);
        // Nothing below the cut: no records.
        let (records, ..) = cut_at(&all, 0, vec![]);
        assert!(records.is_empty());
    }
}
