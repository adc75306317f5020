//! The durable work one Fetch needs before it can be answered, gathered
//! over every controlled partition it lists and run together: take-overs
//! in one call, replays in parallel under one deadline, and the persists of
//! the seal decisions in one batched commit (FAILED ones one by one). A disaster stop seals every partition of
//! a mirror at once, and the fetcher lists them all in each request: done
//! one partition per round, a fetch of 1,000 partitions needed 1,000 rounds
//! (and the connection was dropped every 16). Now a fetch needs one round
//! per step of a seal (take over, replay, take the cut), whatever its size.
//!
//! What the decisions would do besides (count, warn, watch the destination's
//! high watermark) is kept as [`Effect`]s and done only with the answer that
//! goes out, so a pass whose answers are thrown away changes nothing.

use super::*;

/// How long one fetch's replays may take in all before the seal is planned
/// from the persisted producer state alone (SPEC 3.1: the seal never needs
/// the source). A broker's fetcher waits 30 s for an answer
/// (`replica.socket.timeout.ms`); take-over, replays and persists must fit
/// in it.
pub(super) const SEAL_REPLAY_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// Replays of one fetch in flight at once: each reads the source on its own
/// connection.
const REPLAYS_IN_FLIGHT: usize = 16;

/// One seal decision to persist before the answer leaves.
pub(super) struct PersistJob {
    pub key: PartitionKey,
    /// The entry the decision was made on.
    pub entry: crate::lifecycle::Entry,
    pub next: Box<crate::lifecycle::Entry>,
    pub starts_episode: bool,
    pub fails: bool,
    pub fails_past_end: bool,
}

/// Everything one pass over a fetch's controlled partitions must make
/// durable (or bring up to date) first.
#[derive(Default)]
pub(super) struct SealJobs {
    pub take_overs: Vec<crate::mirror::handover::TakeOver>,
    pub replays: Vec<crate::mirror::replay::ReplayJob>,
    pub persists: Vec<PersistJob>,
}

impl SealJobs {
    pub fn is_empty(&self) -> bool {
        self.take_overs.is_empty() && self.replays.is_empty() && self.persists.is_empty()
    }

    /// The wait a blocked answer gives the connection: every job, then the
    /// fetch is decided again.
    pub fn into_wait(self, mirror: Arc<MirrorContext>, version: i16) -> Rewritten {
        Rewritten::Blocked {
            frame: None,
            wait: Box::pin(async move { self.run(mirror, version).await }),
        }
    }

    async fn run(self, mirror: Arc<MirrorContext>, version: i16) -> Result<(), RewriteError> {
        if !self.take_overs.is_empty() {
            crate::mirror::handover::take_over(mirror.clone(), self.take_overs)
                .await
                .map_err(|e| {
                    err(
                        version,
                        format!("partition not taken over for its seal: {e}"),
                    )
                })?;
        }
        if !self.replays.is_empty() {
            replay_all(&mirror, self.replays).await;
        }
        if self.persists.is_empty() {
            return Ok(());
        }
        // FAILED goes one by one (each reads `__mirror_state` first); every
        // other step of the fetch goes in one batched commit.
        let (failing, steps): (Vec<PersistJob>, Vec<PersistJob>) =
            self.persists.into_iter().partition(|j| j.fails);
        let mut first_error = None;
        if !steps.is_empty() {
            let items = steps
                .iter()
                .map(|j| (j.key.clone(), (*j.next).clone()))
                .collect();
            let (applied, failed) = mirror.lifecycle.commit_many(items).await;
            for (job, _) in steps.iter().zip(&applied).filter(|(_, done)| **done) {
                after_persisted(&mirror, job);
            }
            if let Some(e) = failed {
                tracing::warn!(error = %e, partitions = steps.len() - applied.len(),
                    "seal decisions not persisted; the fetch is answered with an error");
                first_error = Some(err(version, e.to_string()));
            }
        }
        for job in failing {
            if let Err(e) = persist_failed(mirror.clone(), job, version).await {
                tracing::warn!(error = %e.message, "seal FAILED not persisted; the fetch is answered with an error");
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Replays the source ranges the producer state has not seen, at most
/// [`REPLAYS_IN_FLIGHT`] at once, all within [`SEAL_REPLAY_DEADLINE`] (or the
/// mirror's upstream request timeout, if shorter). A partition whose replay
/// fails or is not done by then is sealed from its persisted state.
async fn replay_all(mirror: &Arc<MirrorContext>, jobs: Vec<crate::mirror::replay::ReplayJob>) {
    let limit = mirror.request_timeout.min(SEAL_REPLAY_DEADLINE);
    let deadline = tokio::time::Instant::now() + limit;
    let servers = mirror.replay_servers();
    let max_frame = crate::config::DEFAULT_MAX_FRAME_BYTES as usize;
    let mut pending: std::collections::VecDeque<_> = jobs.into();
    let mut unfinished: std::collections::HashMap<tokio::task::Id, PartitionKey> =
        std::collections::HashMap::new();
    let mut set = tokio::task::JoinSet::new();
    loop {
        while set.len() < REPLAYS_IN_FLIGHT {
            let Some(job) = pending.pop_front() else {
                break;
            };
            let key = job.key.clone();
            let run =
                crate::mirror::run_replays(mirror.clone(), servers.clone(), vec![job], max_frame);
            let handle = set.spawn(async move { run.await.map_err(|e| e.to_string()) });
            unfinished.insert(handle.id(), key);
        }
        match tokio::time::timeout_at(deadline, set.join_next_with_id()).await {
            Ok(Some(done)) => {
                let (id, failed) = match done {
                    Ok((id, Ok(()))) => (id, None),
                    Ok((id, Err(m))) => (id, Some(m)),
                    Err(e) => (e.id(), Some(e.to_string())),
                };
                if let Some(key) = unfinished.remove(&id) {
                    if let Some(why) = failed {
                        sealed_without_replay(mirror, &key, &why);
                    }
                }
            }
            Ok(None) => break,
            Err(_) => {
                // Cancelled, and waited for: no replay may still apply
                // records once the cut is taken from the state as it is.
                set.abort_all();
                while let Some(done) = set.join_next_with_id().await {
                    if let Ok((id, Ok(()))) = done {
                        unfinished.remove(&id);
                    }
                }
                let why = format!("no answer within {limit:?}");
                for key in unfinished.values().chain(pending.iter().map(|j| &j.key)) {
                    sealed_without_replay(mirror, key, &why);
                }
                break;
            }
        }
    }
}

fn sealed_without_replay(mirror: &MirrorContext, key: &PartitionKey, why: &str) {
    tracing::warn!(partition = %key, error = %why,
        "source unreachable: sealing from the persisted producer state \
         (every producer that may have begun a transaction since its \
         snapshot gets an ABORT marker)");
    mirror.mark_warm(key);
}

/// What follows a persisted step of a seal.
fn after_persisted(mirror: &Arc<MirrorContext>, job: &PersistJob) {
    if job.starts_episode {
        super::plan::start_episode(mirror, &job.key, &job.next);
    }
    if job.fails_past_end {
        mirror.seal_metrics.failed_past_end.inc();
        tracing::error!(partition = %job.key,
            "seal FAILED: the destination fetcher fetched past the seal's end");
    }
    if job.next.state == State::Stopped {
        super::plan::after_stopped(mirror, &job.key);
        tracing::info!(partition = %job.key, "seal complete: partition STOPPED; its fetches are answered locally from now on");
    }
}

/// Persists FAILED for one seal, from an up-to-date view: another instance
/// may have completed the seal (and the partition taken local writes since)
/// in records this one has not read yet.
async fn persist_failed(
    mirror: Arc<MirrorContext>,
    job: PersistJob,
    version: i16,
) -> Result<(), RewriteError> {
    mirror
        .salts
        .read_state()
        .await
        .map_err(|e| err(version, e.to_string()))?;
    let unchanged = mirror.lifecycle.get(&job.key).is_some_and(|cur| {
        cur.state == job.entry.state
            && cur.cut == job.entry.cut
            && cur.seal_batches == job.entry.seal_batches
    });
    if !unchanged {
        tracing::info!(partition = %job.key,
            "seal: not failed: __mirror_state holds a newer step of it; decided again");
        return Ok(());
    }
    mirror
        .lifecycle
        .commit(&job.key, (*job.next).clone())
        .await
        .map_err(|e| err(version, e.to_string()))?;
    after_persisted(&mirror, &job);
    Ok(())
}

/// What a decision does besides its answer, done only when the answers go
/// out.
pub(super) enum Effect {
    /// A refused fetch: counted and explained.
    Refuse { key: PartitionKey, why: String },
    /// A seal served: its markers counted.
    Served { aborts: u32, barriers: u32 },
    /// A seal served whole, awaiting the destination's high watermark.
    Watch { key: PartitionKey, end: i64 },
    /// The fetcher fetched past the seal's end.
    PastEnd {
        key: PartitionKey,
        end: i64,
        fetch_offset: i64,
    },
}

impl Effect {
    pub fn apply(self, mirror: &Arc<MirrorContext>) {
        match self {
            Effect::Refuse { key, why } => super::plan::refuse(mirror, &key, why),
            Effect::Served { aborts, barriers } => {
                mirror.seal_metrics.aborts.inc_by(u64::from(aborts));
                mirror.seal_metrics.barriers.inc_by(u64::from(barriers));
            }
            Effect::Watch { key, end } => {
                if let Some(gate) = mirror.destination_hw() {
                    gate.watch(mirror, &key, end);
                }
            }
            Effect::PastEnd {
                key,
                end,
                fetch_offset,
            } => {
                mirror.seal_metrics.fetches_past_end.inc();
                tracing::info!(mirror = %mirror.name, partition = %key, end, fetch_offset,
                    "seal: the destination fetcher fetches past the seal's end: the destination's \
                     high watermark is read (past the end: FAILED; otherwise a replica about to \
                     be truncated asked, and the seal waits for a fetch at its end)");
                if let Some(gate) = mirror.destination_hw() {
                    gate.check_past_end(mirror, &key, end, fetch_offset);
                }
            }
        }
    }
}
