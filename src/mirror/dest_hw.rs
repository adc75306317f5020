//! The destination high watermark gate of a seal (`[[mirror]] stopped_when
//! = "destination_hw"`, the default).
//!
//! A destination leader can lose records its followers have not copied
//! yet: when leadership moves, the new leader's log ends where its own copy
//! ended and the others truncate to it. A seal whose batches the fetcher
//! appended is therefore not complete until the destination's high
//! watermark (the offset every in-sync replica holds) has passed its end.
//! Until then the partition stays STOPPING, the persisted seal keeps being
//! served to whichever fetcher asks, and a fetcher that comes back below
//! the cut gets the seal planned again at its offset
//! ([`crate::lifecycle::seal::decide`]).
//!
//! The fetch path hands a partition whose fetcher holds the whole seal to
//! [`DestinationHw::watch`]; one task per mirror then reads the high
//! watermark of every watched partition with ListOffsets (LATEST,
//! READ_UNCOMMITTED: the high watermark) on the partition's leader, found
//! with Metadata through `destination_hw_bootstrap`. It polls every
//! `destination_hw_poll_ms`, backing off (doubling, up to
//! [`MAX_BACKOFF`]) while the destination cannot be read, and never
//! completes a seal on a guess: an unreadable high watermark leaves the
//! partition STOPPING, with the error in its `destination_hw` detail
//! (`GET /v1/partitions`) and a warning when the failure starts.
//!
//! Before completing a seal it reads `__mirror_state` to its end: another
//! instance may have planned the seal again below the cut (a new leader
//! that truncated) and persisted that before serving it, so a high
//! watermark that includes the new seal is only ever seen after its record
//! is readable; the completion is then checked against the current seal.
//! With instances sharing `__mirror_state`, only the instance serving the
//! partition completes it: the fetch path takes a STOPPING partition over
//! before serving its seal, so after a leadership move the old leader's
//! instance (which held the whole seal too) reads the new one's serving
//! record and leaves the completion to it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::kafka_client::{address, ClientError, Connection, TransportConnector};
use crate::lifecycle::{HwWait, State};
use crate::producer_state::PartitionKey;
use crate::wire::{Reader, WireResult, Writer};

use super::MirrorContext;

/// ListOffsets API key.
pub(super) const LIST_OFFSETS: i16 = 2;
/// ListOffsets v2: the first with an isolation level (READ_UNCOMMITTED
/// answers the high watermark), still without flexible fields.
pub(super) const LIST_OFFSETS_VERSION: i16 = 2;
/// The LATEST timestamp of ListOffsets.
const LATEST: i64 = -1;
/// The longest wait between two reads while the destination fails.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Client id of the reads.
const CLIENT_ID: &str = "mirrorguard-destination-hw";
/// The largest answer read.
const MAX_FRAME: usize = 1 << 20;

/// One partition whose seal waits for the destination's high watermark.
#[derive(Debug, Clone)]
struct Watch {
    /// The seal's end.
    end: i64,
    /// What the admin API shows.
    wait: HwWait,
}

/// The gate of one mirror: where the high watermark is read and what waits.
pub struct DestinationHw {
    bootstrap: Vec<(String, u16)>,
    connector: TransportConnector,
    poll: Duration,
    timeout: Duration,
    watched: Mutex<HashMap<PartitionKey, Watch>>,
    /// Seals whose fetcher fetched past their end: partition → (the seal's
    /// end, the fetch offset). The high watermark tells whether the
    /// destination holds records past the end for good (FAILED) or the
    /// fetch came from a replica about to be truncated (nothing).
    past_end: Mutex<HashMap<PartitionKey, (i64, i64)>>,
    wake: tokio::sync::Notify,
    started: std::sync::Once,
}

impl DestinationHw {
    /// A gate reading the high watermark through `bootstrap`, every `poll`.
    pub fn new(
        bootstrap: Vec<(String, u16)>,
        connector: TransportConnector,
        poll: Duration,
        timeout: Duration,
    ) -> Arc<Self> {
        Arc::new(Self {
            bootstrap,
            connector,
            poll: poll.max(Duration::from_millis(10)),
            timeout,
            watched: Mutex::new(HashMap::new()),
            past_end: Mutex::new(HashMap::new()),
            wake: tokio::sync::Notify::new(),
            started: std::sync::Once::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PartitionKey, Watch>> {
        self.watched.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Number of partitions waiting.
    pub fn waiting(&self) -> usize {
        self.lock().len()
    }

    fn lock_past_end(&self) -> std::sync::MutexGuard<'_, HashMap<PartitionKey, (i64, i64)>> {
        self.past_end.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The fetcher of `key` fetched at `fetch_offset`, past its seal's end
    /// `end`: have the destination's high watermark read once; past `end`,
    /// the partition is FAILED ([`crate::lifecycle::seal::failed_past_end`]).
    pub fn check_past_end(
        self: &Arc<Self>,
        mirror: &Arc<MirrorContext>,
        key: &PartitionKey,
        end: i64,
        fetch_offset: i64,
    ) {
        let fresh = self
            .lock_past_end()
            .insert(key.clone(), (end, fetch_offset))
            .is_none_or(|(e, _)| e != end);
        if fresh {
            self.wake.notify_one();
        }
        self.started.call_once(|| {
            tokio::spawn(run(self.clone(), Arc::downgrade(mirror)));
        });
    }

    /// The fetcher of `key` holds its whole seal, which ends at `end`: have
    /// the destination's high watermark read until it passes `end` (the
    /// watching task of `mirror` is started on the first call).
    pub fn watch(self: &Arc<Self>, mirror: &Arc<MirrorContext>, key: &PartitionKey, end: i64) {
        let fresh = {
            let mut w = self.lock();
            match w.get(key) {
                Some(x) if x.end == end => false,
                _ => {
                    let wait = HwWait {
                        seal_end: end,
                        high_watermark: None,
                        leader: None,
                        checked_ms: None,
                        error: None,
                        waiting_since_ms: crate::lifecycle::now_ms(),
                    };
                    mirror.lifecycle.note_hw_wait(key, Some(wait.clone()));
                    w.insert(key.clone(), Watch { end, wait });
                    true
                }
            }
        };
        if fresh {
            mirror.seal_metrics.hw_waiting.set(self.waiting() as i64);
            tracing::info!(mirror = %mirror.name, partition = %key, seal_end = end,
                "seal fetched whole: waiting for the destination's high watermark to pass its end \
                 before the partition is STOPPED");
            self.wake.notify_one();
        }
        self.started.call_once(|| {
            tokio::spawn(run(self.clone(), Arc::downgrade(mirror)));
        });
    }
}

/// The watching task: reads the high watermarks until nothing waits, then
/// sleeps until woken; ends with the mirror.
async fn run(gate: Arc<DestinationHw>, mirror: std::sync::Weak<MirrorContext>) {
    let mut delay = gate.poll;
    let mut failing = false;
    loop {
        if gate.lock().is_empty() && gate.lock_past_end().is_empty() {
            gate.wake.notified().await;
        }
        let Some(m) = mirror.upgrade() else { return };
        let result = round(&gate, &m).await;
        m.seal_metrics.hw_waiting.set(gate.waiting() as i64);
        drop(m);
        if let Err(error) = result {
            if !failing {
                tracing::warn!(bootstrap = ?gate.bootstrap, %error,
                    "cannot read the destination's high watermark: sealed partitions stay STOPPING \
                     (their seal keeps being served) until it can be read");
            }
            failing = true;
            delay = (delay * 2).min(MAX_BACKOFF).max(gate.poll);
        } else {
            if failing {
                tracing::info!(bootstrap = ?gate.bootstrap, "the destination's high watermark is readable again");
            }
            delay = gate.poll;
            failing = false;
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = gate.wake.notified() => {}
        }
    }
}

/// One round over the watched partitions; the first failed read's error.
async fn round(gate: &Arc<DestinationHw>, mirror: &Arc<MirrorContext>) -> Result<(), String> {
    let watched: Vec<(PartitionKey, i64)> = gate
        .lock()
        .iter()
        .map(|(k, w)| (k.clone(), w.end))
        .collect();
    let past_end: Vec<(PartitionKey, i64, i64)> = gate
        .lock_past_end()
        .drain()
        .map(|(k, (end, at))| (k, end, at))
        .collect();
    // Drop what no longer waits (resumed, failed, completed elsewhere, or
    // planned again with another end: the fetch path watches that one).
    let mut live = Vec::new();
    for (key, end) in watched {
        let current = mirror.lifecycle.get(&key).and_then(|e| {
            (e.state == State::Stopping)
                .then(|| e.cut.zip(e.seal_batches).map(|(c, n)| c + i64::from(n)))
                .flatten()
        });
        if current == Some(end) {
            live.push((key, end));
        } else {
            gate.lock().remove(&key);
        }
    }
    // Past-end checks of seals still current (each read once; the fetch
    // path asks again at the next such fetch).
    let current_end = |key: &PartitionKey| {
        mirror.lifecycle.get(key).and_then(|e| {
            (e.state == State::Stopping)
                .then(|| e.cut.zip(e.seal_batches).map(|(c, n)| c + i64::from(n)))
                .flatten()
        })
    };
    let past_end: Vec<(PartitionKey, i64, i64)> = past_end
        .into_iter()
        .filter(|(k, end, _)| current_end(k) == Some(*end))
        .collect();
    if live.is_empty() && past_end.is_empty() {
        return Ok(());
    }
    let mut asked = live.clone();
    asked.extend(
        past_end
            .iter()
            .filter(|(k, ..)| !live.iter().any(|(l, _)| l == k))
            .map(|(k, end, _)| (k.clone(), *end)),
    );
    let read = read_high_watermarks(gate, &asked).await;
    // A high watermark past a seal's end: the destination holds records the
    // seal did not write, on every in-sync replica (FAILED, whether the
    // fetcher was seen past the end or not). At or below it, a past-end
    // fetch came from a replica about to be truncated: nothing to do.
    let mut failing: Vec<(PartitionKey, i64, i64, i64)> = Vec::new();
    for (key, end) in &asked {
        if let Ok(map) = &read {
            if let Some(Ok((hw, _))) = map.get(&(key.topic.to_string(), key.partition)) {
                if *hw > *end {
                    let at = past_end
                        .iter()
                        .find(|(k, ..)| k == key)
                        .map_or(*end, |(_, _, at)| *at);
                    failing.push((key.clone(), *end, *hw, at));
                }
            }
        }
    }
    if !failing.is_empty() {
        if let Err(e) = mirror.salts.read_state().await {
            return Err(format!(
                "cannot read __mirror_state before failing seals (they stay STOPPING): {e}"
            ));
        }
        for (key, end, hw, at) in &failing {
            fail(mirror, key, *end, *hw, *at).await;
            gate.lock().remove(key);
        }
    }
    let live: Vec<(PartitionKey, i64)> = live
        .into_iter()
        .filter(|(k, _)| !failing.iter().any(|(f, ..)| f == k))
        .collect();
    let now = crate::lifecycle::now_ms();
    let mut first_error = None;
    let mut passed = Vec::new();
    for (key, end) in &live {
        let result = match &read {
            Ok(map) => map
                .get(&(key.topic.to_string(), key.partition))
                .cloned()
                .unwrap_or_else(|| Err("not in the answer".into())),
            Err(e) => Err(e.to_string()),
        };
        let wait = {
            let mut w = gate.lock();
            let Some(watch) = w.get_mut(key) else {
                continue;
            };
            match result {
                Ok((hw, leader)) => {
                    watch.wait.high_watermark = Some(hw);
                    watch.wait.leader = Some(leader);
                    watch.wait.checked_ms = Some(now);
                    watch.wait.error = None;
                    mirror.seal_metrics.hw_reads.inc();
                    if hw >= *end {
                        passed.push((key.clone(), *end, hw));
                    }
                }
                Err(e) => {
                    first_error.get_or_insert_with(|| format!("{key}: {e}"));
                    watch.wait.error = Some(e);
                    mirror.seal_metrics.hw_read_errors.inc();
                }
            }
            watch.wait.clone()
        };
        mirror.lifecycle.note_hw_wait(key, Some(wait));
    }
    let done = first_error.map_or(Ok(()), Err);
    if passed.is_empty() {
        return done;
    }
    // Another instance may have planned a seal again below the cut: read
    // its record before completing anything.
    if let Err(e) = mirror.salts.read_state().await {
        return Err(format!(
            "cannot read __mirror_state before completing seals (they stay STOPPING): {e}"
        ));
    }
    // One batched commit for every seal the round completes (a disaster
    // stop completes thousands in the same round).
    let mut items = Vec::new();
    let mut completed = Vec::new();
    for (key, end, hw) in passed {
        if let Some(next) = completion(mirror, &key, end, hw) {
            items.push((key.clone(), next));
            completed.push((key.clone(), end, hw));
        }
        gate.lock().remove(&key);
    }
    if items.is_empty() {
        return done;
    }
    let (applied, failed) = mirror.lifecycle.commit_many(items).await;
    for ((key, end, hw), _) in completed.iter().zip(&applied).filter(|(_, ok)| **ok) {
        super::seal_path::after_stopped(mirror, key);
        tracing::info!(mirror = %mirror.name, partition = %key, seal_end = end, high_watermark = hw,
            "seal complete: the destination's high watermark passed the seal's end; partition STOPPED");
    }
    if let Some(e) = failed {
        // The fetcher's next fetch of each serves its seal again and watches it.
        tracing::warn!(mirror = %mirror.name, partitions = completed.len() - applied.len(), error = %e,
            "seals complete on the destination but STOPPED not persisted: retried at the fetcher's next fetch");
    }
    done
}

/// Persists FAILED for `key` if its current seal still ends at `end`
/// (read from an up-to-date `__mirror_state`: another instance may have
/// completed or planned it again) and it is still STOPPING: the
/// destination's high watermark `hw` passed the end, and its fetcher
/// fetched at `fetch_offset`.
async fn fail(
    mirror: &Arc<MirrorContext>,
    key: &PartitionKey,
    end: i64,
    hw: i64,
    fetch_offset: i64,
) {
    let Some(entry) = mirror.lifecycle.get(key) else {
        return;
    };
    let current_end = entry
        .cut
        .zip(entry.seal_batches)
        .map(|(c, n)| c + i64::from(n));
    if entry.state != State::Stopping || current_end != Some(end) {
        return;
    }
    let next = crate::lifecycle::seal::failed_past_end(
        &entry,
        fetch_offset,
        end,
        crate::lifecycle::StopRule::DestinationHw(Some(hw)),
    );
    match mirror.lifecycle.commit(key, next).await {
        Ok(()) => {
            mirror.seal_metrics.failed_past_end.inc();
            tracing::error!(mirror = %mirror.name, partition = %key, seal_end = end, high_watermark = hw,
                fetch_offset, "seal FAILED: the destination holds records past the seal's end");
        }
        Err(e) => {
            tracing::warn!(mirror = %mirror.name, partition = %key, error = %e,
                "seal inconsistent on the destination but FAILED not persisted: retried at the next past-end fetch");
        }
    }
}

/// STOPPED for `key`, to persist, if its current seal still ends at `end`
/// and, when instances share `__mirror_state`, this instance serves the
/// partition: after a leadership move the new leader's instance took it
/// over before serving its fetcher (its serving record is read above, so
/// this one no longer owns it) and completes the seal itself; two instances
/// that both held the whole seal never both persist STOPPED. An instance
/// whose fetcher comes back takes the partition over again at its next
/// fetch and watches the seal again.
fn completion(
    mirror: &Arc<MirrorContext>,
    key: &PartitionKey,
    end: i64,
    hw: i64,
) -> Option<crate::lifecycle::Entry> {
    if mirror.salts.shared() && !mirror.is_owned(key) {
        mirror.lifecycle.note_hw_wait(key, None);
        tracing::info!(mirror = %mirror.name, partition = %key, seal_end = end, high_watermark = hw,
            "the destination's high watermark passed the seal's end, but another instance serves the \
             partition now: it completes the seal");
        return None;
    }
    let entry = mirror.lifecycle.get(key)?;
    let current_end = entry
        .cut
        .zip(entry.seal_batches)
        .map(|(c, n)| c + i64::from(n));
    if entry.state != State::Stopping || current_end != Some(end) {
        return None;
    }
    let plan = entry.seal.clone().or_else(|| {
        // Restored from __mirror_state and not served here since: the plan
        // is only needed for its open transactions, which the entry holds.
        let cut = entry.cut?;
        let open = entry.restored_open_txns.clone().unwrap_or_default();
        let plan =
            crate::lifecycle::seal::plan_for(&entry, cut, entry.leader_epoch.unwrap_or(0), open);
        (Some(plan.len()) == entry.seal_batches).then(|| Arc::new(plan))
    })?;
    Some(crate::lifecycle::seal::stopped(&entry, plan))
}

/// (topic, partition) → (high watermark, leader address) or why not.
type Answers = HashMap<(String, i32), Result<(i64, String), String>>;

/// Reads the high watermarks of `parts` on their destination leaders.
async fn read_high_watermarks(
    gate: &DestinationHw,
    parts: &[(PartitionKey, i64)],
) -> Result<Answers, ClientError> {
    let view = crate::proxy::refresh::fetch_cluster_view(
        &gate.bootstrap,
        &gate.connector,
        gate.timeout,
        MAX_FRAME,
    )
    .await?;
    let mut out: Answers = HashMap::new();
    // Leader address → (topic → partitions).
    let mut by_leader: BTreeMap<String, BTreeMap<String, Vec<i32>>> = BTreeMap::new();
    for (key, _) in parts {
        let topic = key.topic.to_string();
        let leader = view
            .topic_details
            .iter()
            .find(|t| t.name == topic)
            .and_then(|t| t.partitions.iter().find(|p| p.index == key.partition))
            .map(|p| p.leader);
        let broker = leader.and_then(|l| view.brokers.iter().find(|b| b.node_id == l));
        match (leader, broker) {
            (None, _) => {
                out.insert(
                    (topic.clone(), key.partition),
                    Err(format!(
                        "{topic}-{} is not listed by the destination",
                        key.partition
                    )),
                );
            }
            (Some(l), None) => {
                out.insert(
                    (topic.clone(), key.partition),
                    Err(format!(
                        "{topic}-{} has no leader (leader id {l})",
                        key.partition
                    )),
                );
            }
            (Some(_), Some(b)) => {
                let addr = address(&b.host, u16::try_from(b.port).unwrap_or(0));
                by_leader
                    .entry(addr)
                    .or_default()
                    .entry(topic)
                    .or_default()
                    .push(key.partition);
            }
        }
    }
    for (addr, topics) in by_leader {
        let answer = async {
            let mut c =
                Connection::connect(&gate.connector, &addr, gate.timeout, MAX_FRAME, CLIENT_ID)
                    .await?;
            let resp = c
                .request(LIST_OFFSETS, LIST_OFFSETS_VERSION, gate.timeout, |w| {
                    list_offsets_body(&topics, w)
                })
                .await?;
            Ok::<_, ClientError>(parse_list_offsets(resp.body())?)
        }
        .await;
        match answer {
            Ok(rows) => {
                for (topic, partition, code, offset) in rows {
                    let r = if code == 0 {
                        Ok((offset, addr.clone()))
                    } else {
                        Err(format!(
                            "ListOffsets at {addr}: {} ({code})",
                            crate::codec::api::error_name(code)
                        ))
                    };
                    out.insert((topic, partition), r);
                }
            }
            Err(e) => {
                for (topic, ps) in topics {
                    for p in ps {
                        out.insert(
                            (topic.clone(), p),
                            Err(format!("ListOffsets at {addr}: {e}")),
                        );
                    }
                }
            }
        }
    }
    Ok(out)
}

/// ListOffsets v2 request body: LATEST of every partition, as a consumer
/// (replica id -1) reading uncommitted (the high watermark).
pub fn list_offsets_body(
    topics: &BTreeMap<String, Vec<i32>>,
    w: &mut Writer<Vec<u8>>,
) -> WireResult<()> {
    list_offsets_body_at(topics, LATEST, w)
}

/// ListOffsets v2 request body for `timestamp` (LATEST = -1, EARLIEST =
/// -2: the log start offset) of every partition, as a consumer reading
/// uncommitted.
pub fn list_offsets_body_at(
    topics: &BTreeMap<String, Vec<i32>>,
    timestamp: i64,
    w: &mut Writer<Vec<u8>>,
) -> WireResult<()> {
    w.put_i32(-1); // replica id: a consumer
    w.put_i8(0); // READ_UNCOMMITTED: the answer is the high watermark
    w.put_array_len(Some(topics.len()), "topics")?;
    for (topic, parts) in topics {
        w.put_string(topic, "topic")?;
        w.put_array_len(Some(parts.len()), "partitions")?;
        for p in parts {
            w.put_i32(*p);
            w.put_i64(timestamp);
        }
    }
    Ok(())
}

/// ListOffsets v2 response body: (topic, partition, error code, offset).
pub fn parse_list_offsets(body: &[u8]) -> WireResult<Vec<(String, i32, i16, i64)>> {
    let mut r = Reader::new(body);
    r.read_i32("throttle_time_ms")?;
    let topics = r.read_array_len(6, "topics")?.unwrap_or(0);
    let mut out = Vec::new();
    for _ in 0..topics {
        let topic = r.read_string("topic")?.to_owned();
        let parts = r.read_array_len(22, "partitions")?.unwrap_or(0);
        for _ in 0..parts {
            let partition = r.read_i32("partition")?;
            let code = r.read_i16("error_code")?;
            r.read_i64("timestamp")?;
            let offset = r.read_i64("offset")?;
            out.push((topic.clone(), partition, code, offset));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::MirrorConfig;
    use crate::lifecycle::{Entry, Lifecycle};
    use crate::mirror::test_store::NoopStore;
    use crate::producer_state::{ProducerStateRegistry, RegistryConfig};

    /// `__mirror_state` as the gate sees it: shared with other instances or
    /// not; transitions always persist.
    fn store(shared: bool) -> Arc<NoopStore> {
        Arc::new(NoopStore {
            shared,
            topic_id: |_| Some([0; 16]),
            ..NoopStore::new()
        })
    }

    /// A mirror whose partition t-0 is STOPPING with a seal (the barrier
    /// alone) at cut 10, restored from `__mirror_state`.
    fn stopping(shared: bool) -> (Arc<MirrorContext>, PartitionKey) {
        let metrics = crate::metrics::Metrics::new();
        let lifecycle = Lifecycle::new(metrics.clone());
        lifecycle.set_store(store(shared));
        let cfg: MirrorConfig = toml::from_str(
            "name = \"m\"\nbootstrap = \"127.0.0.1:1\"\nadvertised_host = \"127.0.0.1\"\n\
             node_port_base = 20000\nsource_bootstrap = [\"127.0.0.1:2\"]\n\
             source_cluster_id = \"AAAAAAAAAAAAAAAAAAAAAQ\"\n",
        )
        .unwrap();
        let mirror = MirrorContext::new(
            &cfg,
            Arc::new(ProducerStateRegistry::new(RegistryConfig::default())),
            store(shared),
            lifecycle.clone(),
            &metrics,
        )
        .unwrap();
        let key = PartitionKey::new([0; 16], "t", 0);
        lifecycle.restore(
            key.clone(),
            Entry {
                mirror: "m".into(),
                topic: "t".into(),
                partition: 0,
                state: State::Stopping,
                source_cluster_id: "AAAAAAAAAAAAAAAAAAAAAQ".into(),
                cut: Some(10),
                seal_batches: Some(1),
                fetcher_offset: Some(11),
                last_fetch_ms: None,
                reason: None,
                since_ms: 0,
                seal: None,
                restored_open_txns: Some(Vec::new()),
                destination_hw: None,
                topic_id: [0; 16],
                episode: 0,
                episode_start: None,
                leader_epoch: None,
                history: Vec::new(),
            },
        );
        (mirror, key)
    }

    fn state(mirror: &MirrorContext, key: &PartitionKey) -> State {
        mirror.lifecycle.get(key).unwrap().state
    }

    /// What a round does for one partition whose high watermark passed
    /// `end`: true when STOPPED was persisted.
    async fn complete(mirror: &Arc<MirrorContext>, key: &PartitionKey, end: i64, hw: i64) -> bool {
        let Some(next) = completion(mirror, key, end, hw) else {
            return false;
        };
        let (applied, failed) = mirror
            .lifecycle
            .commit_many(vec![(key.clone(), next)])
            .await;
        failed.is_none() && applied == [true]
    }

    #[tokio::test]
    async fn only_the_instance_serving_the_partition_completes_a_shared_seal() {
        // Another instance took the partition over after a leadership move
        // (this one does not own it): the high watermark passed the seal's
        // end, yet this instance leaves the completion to that one.
        let (mirror, key) = stopping(true);
        assert!(!complete(&mirror, &key, 11, 11).await);
        assert_eq!(state(&mirror, &key), State::Stopping);
        // Served here (its fetcher took the partition over): completed.
        mirror.mark_owned(&key);
        assert!(!complete(&mirror, &key, 12, 12).await, "another seal's end");
        assert!(complete(&mirror, &key, 11, 11).await);
        assert_eq!(state(&mirror, &key), State::Stopped);
        // A single instance (nothing shared) completes without a take-over.
        let (single, key) = stopping(false);
        assert!(complete(&single, &key, 11, 11).await);
        assert_eq!(state(&single, &key), State::Stopped);
    }

    #[test]
    fn a_fetcher_served_a_seal_planned_elsewhere_takes_the_partition_over() {
        let (mirror, key) = stopping(true);
        let entry = mirror.lifecycle.get(&key).unwrap();
        let takes = crate::mirror::seal_path::seal_needs_take_over;
        // At or past the cut of a seal another instance planned: take over.
        assert!(takes(&entry, false, true));
        // Owned here, or no other instance: nothing to take over.
        assert!(!takes(&entry, true, true));
        assert!(!takes(&entry, false, false));
        // STOPPED (or not controlled): answered locally, never taken over.
        let done = Entry {
            state: State::Stopped,
            ..entry
        };
        assert!(!takes(&done, false, true));
    }

    #[test]
    fn list_offsets_v2_round_trip() {
        let mut topics = BTreeMap::new();
        topics.insert("t".to_string(), vec![0, 2]);
        let mut w = Writer::new(Vec::new());
        list_offsets_body(&topics, &mut w).unwrap();
        let body = w.into_inner();
        // replica -1, isolation 0, one topic "t" with partitions 0 and 2 at LATEST.
        let mut want = vec![
            0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 1, 0, 1, b't', 0, 0, 0, 2,
        ];
        for p in [0i32, 2] {
            want.extend_from_slice(&p.to_be_bytes());
            want.extend_from_slice(&(-1i64).to_be_bytes());
        }
        assert_eq!(body, want);
        let mut resp = Vec::new();
        resp.extend_from_slice(&0i32.to_be_bytes());
        resp.extend_from_slice(&1i32.to_be_bytes());
        resp.extend_from_slice(&1i16.to_be_bytes());
        resp.push(b't');
        resp.extend_from_slice(&1i32.to_be_bytes());
        resp.extend_from_slice(&2i32.to_be_bytes());
        resp.extend_from_slice(&6i16.to_be_bytes());
        resp.extend_from_slice(&(-1i64).to_be_bytes());
        resp.extend_from_slice(&42i64.to_be_bytes());
        assert_eq!(
            parse_list_offsets(&resp).unwrap(),
            vec![("t".to_string(), 2, 6, 42)]
        );
        // A truncated answer is an error, never a guess.
        assert!(parse_list_offsets(&resp[..resp.len() - 1]).is_err());
    }
}
