//! Destination topic ids looked up on demand, for partitions held meanwhile.
//!
//! A partition's producer claims and collision salts are keyed by its
//! destination topic id (and the salt sequence is seeded by it). When a
//! source topic is new, the destination may not list it yet (and a fetch by
//! topic id may name a source topic the listener's last look at the
//! source's Metadata did not: its destination name is not known): rather than
//! failing the whole Fetch response (which closes the fetcher's connection
//! and stalls every partition on it), the fetch path holds only that
//! partition's data (answers it with no records, so the fetcher keeps its
//! fetch offset and asks again) and starts a lookup here at once.
//!
//! At most one lookup per topic is in flight; a lookup that does not find
//! the topic backs off (doubling from [`FIRST_BACKOFF`] to [`MAX_BACKOFF`])
//! before the next one may start, and each is bounded in time. Topics are
//! forgotten once their id is known; at most [`MAX_TOPICS`] are tracked.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::MirrorContext;

/// Delay after the first lookup that did not find the topic.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// Longest delay between two lookups of one topic.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Topics tracked at once (a hostile source cannot grow the table beyond it;
/// partitions of further topics are still held, their lookups start when
/// others finish).
pub const MAX_TOPICS: usize = 10_000;

/// One lookup of a topic id: succeeds once the id is known.
pub type Lookup = crate::BoxFuture<'static, Result<(), LookupError>>;

/// Why one lookup of a topic id did not find it (logged, then retried after
/// a backoff).
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    /// The lookup took longer than its limit.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The source's Metadata could not be read.
    #[error(transparent)]
    Source(#[from] crate::kafka_client::ClientError),
    /// The mirror refused what the source's Metadata said.
    #[error(transparent)]
    Refresh(#[from] crate::proxy::refresh::RefreshError),
    /// The destination's topic listing could not be read.
    #[error(transparent)]
    Destination(#[from] crate::PersistError),
    /// The source's Metadata does not name the topic id yet.
    #[error("the source's Metadata does not name it yet")]
    NotNamedBySource,
    /// The destination does not list the topic yet.
    #[error("the destination does not list it yet")]
    NotListedByDestination,
}

/// One topic's lookup state.
struct Tracked {
    in_flight: bool,
    attempts: u32,
    next_try: Instant,
    since: Instant,
}

/// Lookups of destination topic ids, one in flight per topic.
#[derive(Default)]
pub struct TopicIdLookups {
    topics: Mutex<HashMap<String, Tracked>>,
    /// Woken whenever a lookup ends (found or not).
    ended: tokio::sync::Notify,
}

/// What [`TopicIdLookups::hold`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum HoldStart {
    /// The topic was not tracked: its first hold, a lookup started.
    First,
    /// A lookup was started again after its backoff.
    Retried,
    /// A lookup is in flight or backing off.
    Waiting,
    /// Nothing started (no async runtime, or the table is full).
    NotStarted,
}

impl TopicIdLookups {
    /// Notes that a partition of `topic` is held for its id and starts
    /// `lookup` (built only when one starts; it succeeds once the id is
    /// known) unless one is in flight or backing off. `known` tells which
    /// tracked topics other reads resolved meanwhile (they are forgotten).
    /// `limit` bounds one lookup.
    pub fn hold(
        self: &Arc<Self>,
        topic: &str,
        known: &dyn Fn(&str) -> bool,
        lookup: impl FnOnce() -> Lookup,
        limit: Duration,
    ) -> HoldStart {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return HoldStart::NotStarted;
        };
        let now = Instant::now();
        let started = {
            let mut t = self.topics.lock().unwrap_or_else(|p| p.into_inner());
            if !t.contains_key(topic) {
                // Ids learned meanwhile by other reads (the periodic
                // listings): those topics are not held anymore.
                t.retain(|name, l| l.in_flight || !known(name));
            }
            let full = t.len() >= MAX_TOPICS;
            match t.get_mut(topic) {
                Some(l) if l.in_flight || now < l.next_try => return HoldStart::Waiting,
                Some(l) => {
                    l.in_flight = true;
                    HoldStart::Retried
                }
                None if full => return HoldStart::NotStarted,
                None => {
                    t.insert(
                        topic.to_string(),
                        Tracked {
                            in_flight: true,
                            attempts: 0,
                            next_try: now,
                            since: now,
                        },
                    );
                    HoldStart::First
                }
            }
        };
        let me = self.clone();
        let topic = topic.to_string();
        let lookup = lookup();
        runtime.spawn(async move {
            let outcome = match tokio::time::timeout(limit, lookup).await {
                Ok(r) => r,
                Err(_) => Err(LookupError::Timeout(limit)),
            };
            me.ended(&topic, outcome);
        });
        started
    }

    fn ended(&self, topic: &str, outcome: Result<(), LookupError>) {
        {
            let mut t = self.topics.lock().unwrap_or_else(|p| p.into_inner());
            match outcome {
                Ok(()) => {
                    if let Some(l) = t.remove(topic) {
                        tracing::info!(
                            topic,
                            waited_ms = l.since.elapsed().as_millis() as u64,
                            lookups = l.attempts + 1,
                            "held topic resolved: its partitions are forwarded again"
                        );
                    }
                }
                Err(e) => {
                    if let Some(l) = t.get_mut(topic) {
                        let backoff = FIRST_BACKOFF
                            .saturating_mul(1u32 << l.attempts.min(10))
                            .min(MAX_BACKOFF);
                        l.attempts = l.attempts.saturating_add(1);
                        l.in_flight = false;
                        l.next_try = Instant::now() + backoff;
                        tracing::debug!(topic, error = %e, attempts = l.attempts,
                            backoff_ms = backoff.as_millis() as u64,
                            "held topic not resolved yet; its partitions stay held");
                    }
                }
            }
        }
        self.ended.notify_waiters();
    }

    /// Waits until some lookup ends, at most `max`.
    pub async fn wait(&self, max: Duration) {
        let _ = tokio::time::timeout(max, self.ended.notified()).await;
    }

    /// Topics whose id is being looked up.
    pub fn len(&self) -> usize {
        self.topics.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether no topic is being looked up.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The id a placeholder destination topic name (`topic-id:<base64>`, a
/// source topic id the source's Metadata has not named yet) stands for.
fn placeholder_id(topic: &str) -> Option<[u8; 16]> {
    let text = topic.strip_prefix("topic-id:")?;
    crate::pid::ClusterId::parse(text).ok().map(|c| c.0)
}

/// What a held topic waits for, for the log lines.
fn waits_for(topic: &str) -> &'static str {
    if topic.starts_with("topic-id:") {
        "the source topic's name (the source's Metadata)"
    } else {
        "the destination topic id (the destination's Metadata)"
    }
}

/// How long a response whose only records were held is kept back (or less,
/// when a lookup ends first): a broker with nothing to return holds a Fetch
/// for its MaxWaitMs (500 ms by default), and the fetcher, which keeps its
/// offset, would otherwise ask again at once and get the same records.
pub const HOLD_PAUSE: Duration = Duration::from_millis(500);

/// Answers the `held` partitions of a Fetch response with no records (their
/// high watermark, last stable and log start offsets as the source sent
/// them, aborted transactions emptied: their PIDs are not mapped) and starts
/// the lookups of their topic ids. Every other partition is copied byte for
/// byte.
///
/// In an incremental fetch session (KIP-227) the source's session keeps the
/// fetch offset the fetcher last sent (`FetchSession.CachedPartition`), and
/// the fetcher's `FetchSessionHandler` only sends a partition again when its
/// offset changed: the offset stays, so the source returns the same records
/// again and again (they are new to the session each time) until the id is
/// known and they are forwarded. A full (or sessionless) response keeps
/// every partition it lists, as the fetcher checks it does.
pub fn hold_partitions(
    mirror: &Arc<MirrorContext>,
    h: &crate::codec::RequestHeader,
    body_at: usize,
    frame: bytes::BytesMut,
    held: &[crate::producer_state::PartitionKey],
) -> Result<crate::filter::Rewritten, crate::filter::RewriteError> {
    use crate::filter::{RewriteError, Rewritten};
    use crate::handlers::{splice_fetch_response_dropping, FetchPartitionResponse};

    let version = h.api_version;
    let err = |message: String| RewriteError {
        api: "Fetch",
        version,
        message,
    };
    let body = frame
        .get(body_at..)
        .ok_or_else(|| err("response header truncated".into()))?;
    let mut others_have_records = false;
    let new_body = splice_fetch_response_dropping(
        version,
        body,
        &mut |_| false,
        &mut |p| {
            let records = p.records.as_ref().is_some_and(|r| !r.is_empty());
            if !records && p.aborted_transactions.as_ref().is_none_or(|a| a.is_empty()) {
                return None;
            }
            let key = mirror.partition_key(&p.topic, p.partition_index);
            if !held.contains(&key) {
                others_have_records |= records && p.error_code == 0;
                return None;
            }
            let mut entry = FetchPartitionResponse::from_upstream(p, body);
            entry.records = Some(std::borrow::Cow::Borrowed(&[]));
            if let Some(a) = entry.aborted_transactions.as_mut() {
                a.clear();
            }
            Some(entry)
        },
        &[],
    )
    .map_err(|e| err(e.to_string()))?;
    mirror.metrics.held.inc_by(held.len() as u64);
    let mut topics: Vec<&str> = held.iter().map(|k| k.topic.as_ref()).collect();
    topics.sort_unstable();
    topics.dedup();
    for topic in topics {
        let partitions: Vec<i32> = held
            .iter()
            .filter(|k| k.topic.as_ref() == topic)
            .map(|k| k.partition)
            .collect();
        let limit = mirror.request_timeout;
        let known = |name: &str| match placeholder_id(name) {
            Some(id) => mirror.names_source_id(&id),
            None => mirror.salts.topic_id(name).is_some(),
        };
        // Built only when a lookup starts (see `hold`).
        let lookup: Box<dyn FnOnce() -> Lookup> = if let Some(id) = placeholder_id(topic) {
            // A source topic id the source's Metadata did not name yet: the
            // source is asked at once (its listener refreshes only every
            // metadata_refresh_ms).
            let m = mirror.clone();
            Box::new(move || {
                Box::pin(async move {
                    let view = crate::proxy::refresh::fetch_cluster_view(
                        &m.replay_servers(),
                        &m.source_connector(),
                        limit,
                        crate::config::DEFAULT_MAX_FRAME_BYTES as usize,
                    )
                    .await?;
                    crate::proxy::refresh::RefreshHook::on_refresh(&*m, &view)?;
                    if m.names_source_id(&id) {
                        Ok(())
                    } else {
                        Err(LookupError::NotNamedBySource)
                    }
                })
            })
        } else {
            let store = mirror.salts.clone();
            let name = topic.to_string();
            Box::new(move || {
                Box::pin(async move {
                    store.refresh_topic_ids().await?;
                    store
                        .topic_id(&name)
                        .map(|_| ())
                        .ok_or(LookupError::NotListedByDestination)
                })
            })
        };
        let started = mirror.lookups.hold(topic, &known, lookup, limit);
        match started {
            HoldStart::First => tracing::info!(mirror = %mirror.name, topic, ?partitions,
                fetch_version = version, wait = waits_for(topic),
                "Fetch v{version} response: partitions held (answered with no records at the \
                 fetcher's offset) until {} is known; looking it up now", waits_for(topic)),
            HoldStart::NotStarted => tracing::warn!(mirror = %mirror.name, topic, ?partitions,
                fetch_version = version, tracked = mirror.lookups.len(),
                "Fetch v{version} response: partitions held until {} is known; no lookup started \
                 (too many topics being looked up)", waits_for(topic)),
            HoldStart::Retried | HoldStart::Waiting => {}
        }
    }
    let out = crate::filter::with_body(&frame, body_at, &new_body);
    if others_have_records {
        return Ok(Rewritten::Ready(out));
    }
    let lookups = mirror.lookups.clone();
    Ok(Rewritten::Blocked {
        frame: Some(out),
        wait: Box::pin(async move {
            lookups.wait(HOLD_PAUSE).await;
            Ok(())
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::RequestHeader;
    use crate::config::MirrorConfig;
    use crate::filter::Rewritten;
    use crate::handlers::{build_fetch_response, FetchPartitionResponse, FetchTopicRef};
    use crate::metrics::Metrics;
    use crate::mirror::test_store::NoopStore;
    use crate::mirror::MirrorContext;
    use crate::producer_state::{PartitionKey, ProducerStateRegistry};
    use crate::records::builder::{build_batch, BatchSpec, RecordSpec};
    use std::borrow::Cow;

    /// A durable store that knows the id of `known` only.
    fn knows_one() -> Arc<NoopStore> {
        Arc::new(NoopStore {
            durable: true,
            topic_id: |topic| (topic == "known").then_some([7; 16]),
            ..NoopStore::new()
        })
    }

    fn ctx() -> Arc<MirrorContext> {
        let cfg: MirrorConfig = toml::from_str(
            "name = \"m\"\nbootstrap = \"127.0.0.1:1\"\nadvertised_host = \"h\"\n\
             node_port_base = 2\nsource_bootstrap = [\"127.0.0.1:3\"]\n\
             source_cluster_id = \"MkU3OEVBNTcwNTJENDM2Qg\"\n",
        )
        .unwrap();
        let metrics = Metrics::new();
        MirrorContext::new(
            &cfg,
            Arc::new(ProducerStateRegistry::default()),
            knows_one(),
            crate::lifecycle::Lifecycle::new(metrics.clone()),
            &metrics,
        )
        .unwrap()
    }

    /// A batch without a producer id (nothing to claim) at `base`.
    fn batch(base: i64) -> Vec<u8> {
        let spec = BatchSpec {
            base_offset: base,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
            ..BatchSpec::default()
        };
        build_batch(
            &spec,
            &[RecordSpec {
                value: Some(b"v"),
                ..RecordSpec::default()
            }],
        )
    }

    fn entry(records: &[u8], hw: i64) -> FetchPartitionResponse<'_> {
        let mut p = FetchPartitionResponse::new(0);
        p.high_watermark = hw;
        p.last_stable_offset = hw;
        p.log_start_offset = 0;
        p.aborted_transactions = Some(Vec::new());
        p.records = Some(Cow::Borrowed(records));
        p
    }

    /// Runs the mirror's fetch rewrite with holding, then the hold splice.
    fn rewrite(m: &Arc<MirrorContext>, topics: &[(&str, &[u8])]) -> (Vec<PartitionKey>, Rewritten) {
        let list: Vec<(FetchTopicRef<'_>, Vec<FetchPartitionResponse<'_>>)> = topics
            .iter()
            .map(|(t, r)| (FetchTopicRef::Name(t), vec![entry(r, 9)]))
            .collect();
        let body = build_fetch_response(12, 0, 0, 0, &list).unwrap();
        let h = RequestHeader {
            api_key: 1,
            api_version: 12,
            correlation_id: 4,
        };
        let mut frame = crate::codec::header::response_frame(4, 1, &body);
        let body_at = 4 + 5;
        let mut held = Vec::new();
        let pending = crate::mirror::rewrite_fetch_body_holding(
            m,
            12,
            &mut frame[body_at..],
            &|_, _| false,
            true,
            Some(&mut held),
        )
        .unwrap();
        assert!(pending.is_none());
        let out = hold_partitions(m, &h, body_at, frame, &held).unwrap();
        (held, out)
    }

    fn frame_of(r: &Rewritten) -> &[u8] {
        match r {
            Rewritten::Ready(f) => f,
            Rewritten::Blocked { frame: Some(f), .. } => f,
            Rewritten::Blocked { frame: None, .. } => panic!("no frame"),
        }
    }

    #[tokio::test]
    async fn only_the_unknown_topic_is_answered_without_records() {
        let m = ctx();
        let (a, b) = (batch(0), batch(5));
        let (held, out) = rewrite(&m, &[("known", &a), ("fresh", &b)]);
        assert_eq!(held.len(), 1);
        assert_eq!(&*held[0].topic, "fresh");
        assert!(
            matches!(out, Rewritten::Ready(_)),
            "the known topic flows at once"
        );
        // The known topic's entry byte for byte; the fresh one with its offsets
        // and no records.
        let expect = build_fetch_response(
            12,
            0,
            0,
            0,
            &[
                (FetchTopicRef::Name("known"), vec![entry(&a, 9)]),
                (FetchTopicRef::Name("fresh"), vec![entry(&[], 9)]),
            ],
        )
        .unwrap();
        assert_eq!(&frame_of(&out)[9..], &expect[..]);
        assert_eq!(m.metrics.held.get(), 1);
        assert!(m.lookups.len() <= 1, "one lookup for the topic");
    }

    #[tokio::test]
    async fn a_response_of_held_records_only_is_paused() {
        let m = ctx();
        let b = batch(0);
        let (held, out) = rewrite(&m, &[("fresh", &b)]);
        assert_eq!(held.len(), 1);
        let Rewritten::Blocked {
            frame: Some(f),
            wait,
        } = out
        else {
            panic!("a response with nothing to forward is held back a moment");
        };
        let started = std::time::Instant::now();
        wait.await.unwrap();
        assert!(started.elapsed() <= HOLD_PAUSE + Duration::from_millis(200));
        let expect = build_fetch_response(
            12,
            0,
            0,
            0,
            &[(FetchTopicRef::Name("fresh"), vec![entry(&[], 9)])],
        )
        .unwrap();
        assert_eq!(&f[9..], &expect[..]);
    }
}
