//! The seal of a STOPPING partition: the batches served at the cut and the
//! decision, per fetch, of what the fetcher gets.
//!
//! Sealing batches sit at consecutive offsets from the cut: one ABORT marker
//! per transaction open AT THE CUT (begun below it and not closed below it,
//! even when the shadow producer state saw its marker past the cut; see
//! `PartitionState::open_at`), ordered by first offset, then PID, so a
//! rebuilt plan is the same plan, then the
//! MIRROR_PID_RESET barrier carrying the source cluster id. All are stamped
//! with the partition leader epoch of the last mirrored batch.

use std::sync::Arc;

use super::State;
use crate::producer_state::PartitionKey;
use crate::records::builder::{build_abort_marker, build_mirror_pid_reset};

use super::{now_ms, Entry};

/// A transaction open at the cut (from the shadow producer state).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenTxn {
    /// PID as the destination knows it (mapped).
    pub producer_id: i64,
    /// Producer epoch.
    pub producer_epoch: i16,
    /// Coordinator epoch of the producer's last marker (0 if none seen).
    pub coordinator_epoch: i32,
    /// Offset of the transaction's first batch.
    pub first_offset: i64,
    /// Source cluster of the producer.
    pub origin_cluster: [u8; 16],
    /// PID on the source cluster.
    pub original_pid: i64,
}

/// One sealing batch.
#[derive(Debug, Clone)]
pub struct SealBatch {
    /// Its offset in the destination log.
    pub base_offset: i64,
    /// `abort` or `barrier`.
    pub kind: &'static str,
    /// The batch bytes (CRC-32C computed).
    pub bytes: Vec<u8>,
}

/// Everything served at the cut.
#[derive(Debug, Clone)]
pub struct SealPlan {
    /// Destination offset of the first sealing batch.
    pub cut: i64,
    /// Leader epoch stamped on every batch.
    pub leader_epoch: i32,
    /// The transactions the markers abort.
    pub open_txns: Vec<OpenTxn>,
    /// Markers then the barrier.
    pub batches: Vec<SealBatch>,
}

impl SealPlan {
    /// Builds the plan at `cut`, its batches stamped `ts_ms` (see
    /// [`seal_timestamp`]).
    pub fn build(
        cut: i64,
        leader_epoch: i32,
        source_cluster_id: &str,
        mut open: Vec<OpenTxn>,
        ts_ms: i64,
    ) -> Self {
        open.sort_by_key(|t| (t.first_offset, t.producer_id));
        let ts = ts_ms;
        let mut batches = Vec::with_capacity(open.len() + 1);
        let mut offset = cut;
        for t in &open {
            batches.push(SealBatch {
                base_offset: offset,
                kind: "abort",
                bytes: build_abort_marker(
                    t.producer_id,
                    t.producer_epoch,
                    t.coordinator_epoch.max(0),
                    ts,
                    offset,
                    leader_epoch,
                ),
            });
            offset += 1;
        }
        batches.push(SealBatch {
            base_offset: offset,
            kind: "barrier",
            bytes: build_mirror_pid_reset(source_cluster_id, offset, leader_epoch, ts),
        });
        Self {
            cut,
            leader_epoch,
            open_txns: open,
            batches,
        }
    }

    /// Number of sealing batches.
    pub fn len(&self) -> i32 {
        self.batches.len() as i32
    }

    /// Never empty (the barrier is always there); for clippy's sake.
    pub fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }

    /// The offset after the last sealing batch.
    pub fn end(&self) -> i64 {
        self.cut + i64::from(self.len())
    }

    /// The sealing batches at or after `fetch_offset`, concatenated.
    pub fn records_from(&self, fetch_offset: i64) -> Vec<u8> {
        let mut out = Vec::new();
        for b in self
            .batches
            .iter()
            .filter(|b| b.base_offset >= fetch_offset)
        {
            out.extend_from_slice(&b.bytes);
        }
        out
    }
}

/// What a controlled partition's fetch gets.
#[derive(Debug, Clone)]
pub struct LocalPartition {
    /// Records to return (possibly empty).
    pub records: Vec<u8>,
    /// High watermark to report.
    pub high_watermark: i64,
    /// Last stable offset to report.
    pub last_stable_offset: i64,
    /// ABORT markers among `records`.
    pub aborts_served: u32,
    /// Barriers among `records` (0 or 1).
    pub barriers_served: u32,
    /// The partition's error code (0: none); with an error, no records.
    pub error_code: i16,
}

/// Kafka's POLICY_VIOLATION: the partition's fetches are refused by policy
/// (an ended episode fetched again without `protect`, another mirror's
/// partition); the fetcher retries after its back-off, and the reason is in
/// mirrorguard's log and metrics.
pub const POLICY_VIOLATION: i16 = 44;

/// The decision for one controlled partition at one fetch.
#[derive(Debug)]
pub enum Decision {
    /// Answer with this.
    Answer(LocalPartition),
    /// Persist this entry first, then decide again.
    Persist(Box<Entry>),
    /// The fetcher holds the whole seal, but the destination's high
    /// watermark is not known to have passed `end`: answer with this (no
    /// records) and have the high watermark read.
    AwaitHw {
        /// The answer meanwhile.
        answer: LocalPartition,
        /// The seal's end: the high watermark it waits for.
        end: i64,
    },
    /// The fetch cannot be served in this episode (a STOPPED partition
    /// fetched past its seal's end: the destination took local writes and
    /// mirrors again without `protect`): answer with this error, never
    /// "caught up", never source data.
    Refuse {
        /// The answer (an error, no records).
        answer: LocalPartition,
        /// Why, for the log.
        why: String,
    },
    /// The fetch is past the seal's end and the destination's high
    /// watermark is not known to be: answer with this (no records), never
    /// complete the seal, and have the high watermark read (past the end:
    /// FAILED; see [`decide`]).
    PastEnd {
        /// The answer.
        answer: LocalPartition,
        /// The seal's end.
        end: i64,
    },
}

/// The sealing batches' timestamp: when the partition's stop was persisted
/// (the life-cycle record's timestamp, restored after a restart), so a seal
/// rebuilt after a restart, or on another instance, is byte-identical to the
/// one first served: two destination replicas never hold different bytes at
/// one offset. (Before: the time each plan was built.)
pub fn seal_timestamp(entry: &Entry) -> i64 {
    if entry.since_ms > 0 {
        entry.since_ms
    } else {
        now_ms()
    }
}

/// The seal of `entry` planned at `cut` with `open` transactions, stamped
/// with [`seal_timestamp`] (every plan of one stop is built here, so they
/// agree byte for byte).
pub fn plan_for(entry: &Entry, cut: i64, leader_epoch: i32, open: Vec<OpenTxn>) -> SealPlan {
    SealPlan::build(
        cut,
        leader_epoch,
        &entry.source_cluster_id,
        open,
        seal_timestamp(entry),
    )
}

/// The entry of a partition whose seal is complete.
pub fn stopped(entry: &Entry, plan: Arc<SealPlan>) -> Entry {
    let mut next = entry.clone();
    next.state = State::Stopped;
    next.reason = None;
    next.seal = Some(plan);
    next.destination_hw = None;
    next
}

impl LocalPartition {
    /// Nothing to serve, watermarks at `offset`.
    pub fn empty_at(offset: i64) -> Self {
        Self {
            records: Vec::new(),
            high_watermark: offset,
            last_stable_offset: offset,
            aborts_served: 0,
            barriers_served: 0,
            error_code: 0,
        }
    }

    /// An error answer (no records) to a fetch at `offset`.
    pub fn refused_at(offset: i64, error_code: i16) -> Self {
        Self {
            error_code,
            ..Self::empty_at(offset)
        }
    }
}

/// When a sealing partition becomes STOPPED (`[[mirror]] stopped_when`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopRule {
    /// Once the destination's high watermark (ListOffsets LATEST,
    /// READ_UNCOMMITTED, on the destination partition's leader) has passed
    /// the seal's end: the sealing batches are then on every in-sync
    /// replica and no leadership move can lose them. The value is the high
    /// watermark last read (`None`: not read yet, or unreadable).
    DestinationHw(Option<i64>),
    /// Once the fetcher fetches past the seal's end (it appended every
    /// sealing batch on its own log). Only sound for a destination whose
    /// leader never loses an appended record (a single replica).
    FetcherOffset,
}

/// Decides what a fetch at `fetch_offset` of a controlled partition gets.
/// `open_txns(at)` is consulted only when a cut is taken at `at`;
/// `last_fetched_epoch` is the request's LastFetchedEpoch (v12+, else -1)
/// and `current_leader_epoch` its CurrentLeaderEpoch (v9+, else -1).
///
/// A fetch exactly at the seal's end completes the seal under
/// [`StopRule::FetcherOffset`]; under [`StopRule::DestinationHw`] only
/// when the destination's high watermark has passed the end too, and
/// otherwise it is answered with no records ([`Decision::AwaitHw`]): the
/// caller has the high watermark read and completes the seal then. A fetch
/// past the end never completes the seal: it fails it (FAILED) when the
/// destination holds records past the end for good (its high watermark
/// passed the end, or `fetcher_offset`), and is otherwise answered with no
/// records ([`Decision::PastEnd`]): the caller has the high watermark read.
///
/// A fetch below the cut of a STOPPING partition is the fetcher of a
/// destination leader that lost records it had not replicated (sealing
/// batches, maybe source records below the cut): the seal is planned again
/// at its fetch offset, as if the cut were taken there (persisted first,
/// never source data).
pub fn decide(
    key: &PartitionKey,
    entry: &Entry,
    fetch_offset: i64,
    last_fetched_epoch: i32,
    current_leader_epoch: i32,
    open_txns: &dyn Fn() -> Vec<OpenTxn>,
    rule: StopRule,
) -> Decision {
    match entry.state {
        State::Stopping => {}
        // A protected partition's new episode starts at this fetch: its
        // shadow producer state starts empty here (persisted first).
        State::Mirroring if entry.start_pending() => {
            let mut next = entry.clone();
            next.episode_start = Some(fetch_offset);
            next.reason = None;
            tracing::info!(mirror = %entry.mirror, partition = %key, episode = entry.episode,
                start = fetch_offset, "episode starts at the destination fetcher's offset");
            return Decision::Persist(Box::new(next));
        }
        // Past the end of a completed seal: the destination wrote locally
        // since and mirrors again, a new episode that was never protected.
        // "Caught up" would leave it without the source's records for good.
        State::Stopped if entry.seal_end().is_some_and(|end| fetch_offset > end) => {
            return Decision::Refuse {
                answer: LocalPartition::refused_at(fetch_offset, POLICY_VIOLATION),
                why: format!(
                    "the partition is STOPPED (episode {} sealed up to {}) and its destination \
                     fetcher fetches at {fetch_offset}, past the seal: the destination took local \
                     writes and mirrors again; `POST /v1/partitions/protect` (ctl protect) starts \
                     a new episode",
                    entry.episode,
                    entry.seal_end().unwrap_or(-1)
                ),
            };
        }
        // PAUSED holds data; STOPPED and FAILED are answered locally: no byte
        // of the source beyond the fetcher's position is ever served.
        _ => return Decision::Answer(LocalPartition::empty_at(fetch_offset)),
    }
    let epoch = if last_fetched_epoch >= 0 {
        last_fetched_epoch
    } else {
        current_leader_epoch.max(0)
    };
    let Some(cut) = entry.cut else {
        // Take the cut now: the fetcher's next offset is the destination's
        // log end offset.
        let plan = plan_for(entry, fetch_offset, epoch, open_txns());
        let mut next = entry.clone();
        next.cut = Some(fetch_offset);
        next.seal_batches = Some(plan.len());
        next.leader_epoch = Some(epoch);
        next.reason = Some(format!(
            "sealing: {} abort marker(s) and the barrier at offsets {}..{}",
            plan.open_txns.len(),
            plan.cut,
            plan.end() - 1
        ));
        next.seal = Some(Arc::new(plan));
        tracing::info!(mirror = %entry.mirror, partition = %key, cut = fetch_offset, epoch,
            "seal: cut taken at the destination fetcher's offset");
        return Decision::Persist(Box::new(next));
    };
    let plan = match &entry.seal {
        Some(p) => p.clone(),
        None => {
            // Restored after a restart: rebuild from the persisted open
            // transactions, stamped with the leader epoch persisted with the
            // cut (the bytes served before the restart), else the one the
            // fetcher reports as its last fetched epoch.
            let open = entry_open_txns(entry);
            let plan = plan_for(entry, cut, entry.leader_epoch.unwrap_or(epoch), open);
            // The seal as persisted had `seal_batches` batches, some of which
            // the destination may hold already: a rebuilt seal of another
            // length (its open transactions lost) must never be served.
            if let Some(n) = entry.seal_batches.filter(|n| *n != plan.len()) {
                let mut next = entry.clone();
                next.state = State::Failed;
                next.reason = Some(format!(
                    "the seal restored from __mirror_state has {} batch(es) but {n} were \
                     persisted at the cut {cut} (its open-transaction snapshot is missing or \
                     differs); sealing stopped, operator action needed",
                    plan.len()
                ));
                tracing::error!(mirror = %entry.mirror, partition = %key, cut, persisted = n,
                    rebuilt = plan.len(), "restored seal does not match the persisted one");
                return Decision::Persist(Box::new(next));
            }
            Arc::new(plan)
        }
    };
    if fetch_offset > plan.end() {
        // Past the end: the destination replica asking holds records the
        // seal did not put there. That is either an inconsistency (a stray
        // reader took the cut, another writer) or, during a leadership move,
        // a replica whose log is about to be truncated to the new leader's
        // (its fetch still in flight after a seal planned again below the
        // old cut). The destination's high watermark tells them apart: past
        // the seal's end, the records past it are on every in-sync replica
        // and no truncation takes them back, so the seal can never complete
        // (FAILED, with the reason); at or below it, the fetch is answered
        // with nothing and the seal waits for a fetch exactly at its end.
        // Without a high watermark to read (`fetcher_offset`: a destination
        // that never loses what it appended) nothing can truncate it.
        let end = plan.end();
        let committed_past = match rule {
            StopRule::FetcherOffset => true,
            StopRule::DestinationHw(hw) => hw.is_some_and(|hw| hw > end),
        };
        if committed_past {
            return Decision::Persist(Box::new(failed_past_end(entry, fetch_offset, end, rule)));
        }
        return Decision::PastEnd {
            answer: LocalPartition::empty_at(fetch_offset),
            end,
        };
    }
    if fetch_offset == plan.end() {
        let end = plan.end();
        if let StopRule::DestinationHw(hw) = rule {
            if hw.is_none_or(|hw| hw < end) {
                return Decision::AwaitHw {
                    answer: LocalPartition::empty_at(fetch_offset),
                    end,
                };
            }
        }
        return Decision::Persist(Box::new(stopped(entry, plan)));
    }
    if fetch_offset < cut {
        // The destination leader's log ends below the cut: the new leader
        // of a leadership move that never got the sealing batches (and
        // maybe records below the cut). Its log is what the destination
        // holds now, so the seal is planned again at its end.
        let plan = plan_for(entry, fetch_offset, epoch, open_txns());
        let mut next = entry.clone();
        next.cut = Some(fetch_offset);
        next.seal_batches = Some(plan.len());
        next.leader_epoch = Some(epoch);
        next.reason = Some(format!(
            "sealing again below the old cut {cut} (the destination leader's log ends at \
             {fetch_offset}): {} abort marker(s) and the barrier at offsets {}..{}",
            plan.open_txns.len(),
            plan.cut,
            plan.end() - 1
        ));
        next.restored_open_txns = None;
        next.seal = Some(Arc::new(plan));
        tracing::warn!(mirror = %entry.mirror, partition = %key, old_cut = cut, cut = fetch_offset, epoch,
            "seal: the destination fetcher fetches below the cut (its leader lost unreplicated \
             records): the seal is planned again at its offset");
        return Decision::Persist(Box::new(next));
    }
    let served = plan
        .batches
        .iter()
        .filter(|b| b.base_offset >= fetch_offset);
    let aborts_served = served.clone().filter(|b| b.kind == "abort").count() as u32;
    let barriers_served = served.filter(|b| b.kind == "barrier").count() as u32;
    Decision::Answer(LocalPartition {
        records: plan.records_from(fetch_offset),
        high_watermark: plan.end(),
        last_stable_offset: plan.end(),
        aborts_served,
        barriers_served,
        error_code: 0,
    })
}

/// The entry of a sealing partition whose destination fetcher fetched at
/// `fetch_offset`, past the seal's end `end`, on a destination that holds
/// records there for good (see [`decide`]): FAILED with the reason.
pub fn failed_past_end(entry: &Entry, fetch_offset: i64, end: i64, rule: StopRule) -> Entry {
    let evidence = match rule {
        StopRule::DestinationHw(Some(hw)) => {
            format!("the destination's high watermark is {hw}")
        }
        _ => "the destination (stopped_when = \"fetcher_offset\": one replica) never truncates"
            .to_string(),
    };
    let mut next = entry.clone();
    next.state = State::Failed;
    next.reason = Some(format!(
        "the destination fetcher fetched at {fetch_offset}, past the seal's end {end} (cut {}), \
         and {evidence}: the destination holds records at offsets the seal did not write (a \
         reader that is not the fetcher took the cut, or another writer), so its ABORT markers \
         and barrier are not where they must be; sealing stopped, operator action needed \
         (check the destination with `mirrorguard verify`)",
        entry.cut.unwrap_or(-1)
    ));
    next.destination_hw = None;
    next
}

/// What a reader that is not the destination fetcher gets for a controlled
/// partition it is answered locally for: the sealing batches already built
/// when its offset lies within them, nothing otherwise. (A read below the
/// cut of a STOPPING or STOPPED partition never gets here: the fetch path
/// forwards it to the source and cuts the answer at the cut.) Never a
/// decision: a reader takes no cut, completes no seal and fails nothing.
pub fn serve_reader(entry: &Entry, fetch_offset: i64) -> LocalPartition {
    let (State::Stopping, Some(plan)) = (entry.state, &entry.seal) else {
        return LocalPartition::empty_at(fetch_offset);
    };
    if fetch_offset < plan.cut || fetch_offset >= plan.end() {
        return LocalPartition::empty_at(fetch_offset);
    }
    LocalPartition {
        records: plan.records_from(fetch_offset),
        high_watermark: plan.end(),
        last_stable_offset: plan.end(),
        aborts_served: 0,
        barriers_served: 0,
        error_code: 0,
    }
}

/// Open transactions remembered for a restored entry.
fn entry_open_txns(entry: &Entry) -> Vec<OpenTxn> {
    match (&entry.seal, &entry.restored_open_txns) {
        (Some(p), _) => p.open_txns.clone(),
        (None, Some(open)) => open.clone(),
        (None, None) => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sealing batches' timestamp in these tests.
    const TS: i64 = 1_700_000_000_000;

    fn entry(seal_batches: Option<i32>, open: Option<Vec<OpenTxn>>) -> Entry {
        Entry {
            mirror: "m".into(),
            topic: "t".into(),
            partition: 0,
            state: State::Stopping,
            source_cluster_id: "AAAAAAAAAAAAAAAAAAAAAQ".into(),
            cut: Some(10),
            seal_batches,
            fetcher_offset: None,
            last_fetch_ms: None,
            reason: None,
            since_ms: 0,
            seal: None,
            restored_open_txns: open,
            destination_hw: None,
            topic_id: [0; 16],
            episode: 0,
            episode_start: None,
            leader_epoch: None,
            history: Vec::new(),
        }
    }

    fn txn() -> OpenTxn {
        OpenTxn {
            producer_id: 5,
            producer_epoch: 1,
            coordinator_epoch: 0,
            first_offset: 8,
            origin_cluster: [1; 16],
            original_pid: 5,
        }
    }

    #[test]
    fn restored_seal_that_lost_its_open_transactions_is_never_served() {
        let key = PartitionKey::new([0; 16], "t", 0);
        // Persisted: one abort marker and the barrier; the snapshot is gone.
        match decide(
            &key,
            &entry(Some(2), None),
            10,
            3,
            3,
            &Vec::new,
            StopRule::FetcherOffset,
        ) {
            Decision::Persist(next) => {
                assert_eq!(next.state, State::Failed);
                assert!(next.reason.unwrap().contains("2 were persisted"));
            }
            other => panic!("not failed: {other:?}"),
        }
        // With its snapshot the same seal is served again.
        match decide(
            &key,
            &entry(Some(2), Some(vec![txn()])),
            10,
            3,
            3,
            &Vec::new,
            StopRule::FetcherOffset,
        ) {
            Decision::Answer(a) => assert_eq!((a.aborts_served, a.barriers_served), (1, 1)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn readers_get_the_built_seal_but_never_a_decision() {
        let mut e = entry(Some(1), Some(vec![]));
        assert!(serve_reader(&e, 10).records.is_empty(), "no plan built yet");
        e.seal = Some(Arc::new(SealPlan::build(
            10,
            3,
            &e.source_cluster_id,
            vec![],
            TS,
        )));
        assert!(!serve_reader(&e, 10).records.is_empty());
        assert!(serve_reader(&e, 11).records.is_empty());
        assert!(serve_reader(&e, 0).records.is_empty());
    }

    /// A sealing entry whose plan (one abort, the barrier) is built at 10.
    fn built() -> Entry {
        let mut e = entry(Some(2), Some(vec![txn()]));
        e.seal = Some(Arc::new(SealPlan::build(
            10,
            3,
            &e.source_cluster_id,
            vec![txn()],
            TS,
        )));
        e
    }

    #[test]
    fn stopped_only_once_the_destination_high_watermark_passed_the_seal() {
        let key = PartitionKey::new([0; 16], "t", 0);
        let e = built();
        // The fetcher holds the whole seal (10, 11): without the high
        // watermark, or with one below 12, the partition keeps STOPPING.
        for hw in [None, Some(0), Some(11)] {
            match decide(&key, &e, 12, 3, 3, &Vec::new, StopRule::DestinationHw(hw)) {
                Decision::AwaitHw { answer, end } => {
                    assert_eq!(end, 12);
                    assert!(answer.records.is_empty());
                }
                other => panic!("hw {hw:?}: {other:?}"),
            }
        }
        for hw in [12, 40] {
            match decide(
                &key,
                &e,
                12,
                3,
                3,
                &Vec::new,
                StopRule::DestinationHw(Some(hw)),
            ) {
                Decision::Persist(next) => {
                    assert_eq!(next.state, State::Stopped);
                    assert_eq!((next.cut, next.seal_batches), (Some(10), Some(2)));
                }
                other => panic!("hw {hw}: {other:?}"),
            }
        }
        // A high watermark past the end never completes a seal the fetcher
        // has not fetched whole: it is still served.
        match decide(
            &key,
            &e,
            11,
            3,
            3,
            &Vec::new,
            StopRule::DestinationHw(Some(99)),
        ) {
            Decision::Answer(a) => assert_eq!((a.aborts_served, a.barriers_served), (0, 1)),
            other => panic!("{other:?}"),
        }
        // The opt-out: the fetcher's offset alone.
        match decide(&key, &e, 12, 3, 3, &Vec::new, StopRule::FetcherOffset) {
            Decision::Persist(next) => assert_eq!(next.state, State::Stopped),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_seal_rebuilt_after_a_restart_is_byte_identical() {
        let key = PartitionKey::new([0; 16], "t", 0);
        let mut e = entry(None, None);
        e.cut = None; // the stop is persisted; the cut is taken at this fetch
        e.since_ms = TS; // when the stop was persisted
        let first = match decide(&key, &e, 10, 3, 3, &|| vec![txn()], StopRule::FetcherOffset) {
            Decision::Persist(next) => next,
            other => panic!("{other:?}"),
        };
        let served = |e: &Entry| match decide(&key, e, 10, 3, 3, &Vec::new, StopRule::FetcherOffset)
        {
            Decision::Answer(a) => a.records,
            other => panic!("{other:?}"),
        };
        let before = served(&first);
        assert_eq!((first.cut, first.seal_batches), (Some(10), Some(2)));
        // A restart: the entry comes back from __mirror_state without its
        // plan (the record's timestamp is the stop's), some time later.
        std::thread::sleep(std::time::Duration::from_millis(5));
        let mut restored = (*first).clone();
        restored.seal = None;
        restored.restored_open_txns = Some(vec![txn()]);
        assert_eq!(served(&restored), before);
    }

    #[test]
    fn a_fetch_past_the_seal_end_fails_the_seal_once_the_destination_holds_records_there() {
        let key = PartitionKey::new([0; 16], "t", 0);
        let e = built(); // the seal is 10 (abort), 11 (barrier): its end is 12
                         // The high watermark unknown, or at or below the end: a replica about
                         // to be truncated may be asking; nothing is decided.
        for hw in [None, Some(7), Some(12)] {
            match decide(&key, &e, 17, 3, 3, &Vec::new, StopRule::DestinationHw(hw)) {
                Decision::PastEnd { answer, end } => {
                    assert_eq!(end, 12, "{hw:?}");
                    assert!(answer.records.is_empty());
                    assert_eq!(answer.high_watermark, 17);
                }
                other => panic!("{hw:?}: {other:?}"),
            }
        }
        // Past the end for good: FAILED with the reason, never STOPPED.
        for rule in [StopRule::FetcherOffset, StopRule::DestinationHw(Some(13))] {
            match decide(&key, &e, 17, 3, 3, &Vec::new, rule) {
                Decision::Persist(next) => {
                    assert_eq!(next.state, State::Failed, "{rule:?}");
                    let why = next.reason.unwrap();
                    assert!(
                        why.contains("fetched at 17, past the seal's end 12"),
                        "{why}"
                    );
                }
                other => panic!("{rule:?}: {other:?}"),
            }
        }
        // Exactly at the end: completed (or awaiting the high watermark).
        match decide(&key, &e, 12, 3, 3, &Vec::new, StopRule::FetcherOffset) {
            Decision::Persist(next) => assert_eq!(next.state, State::Stopped),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_fetch_below_the_cut_plans_the_seal_again_at_its_offset() {
        let key = PartitionKey::new([0; 16], "t", 0);
        let e = built();
        // The new leader's log ends at 7 (it lost 7..10 and the seal); at 7
        // the transaction that began at 8 is not open, one begun at 5 is.
        let early = OpenTxn {
            producer_id: 9,
            first_offset: 5,
            ..txn()
        };
        let asked = std::cell::Cell::new(0);
        let open = || {
            asked.set(asked.get() + 1);
            vec![early]
        };
        for rule in [StopRule::DestinationHw(Some(100)), StopRule::FetcherOffset] {
            match decide(&key, &e, 7, 4, 4, &open, rule) {
                Decision::Persist(next) => {
                    assert_eq!(next.state, State::Stopping);
                    assert_eq!((next.cut, next.seal_batches), (Some(7), Some(2)));
                    let plan = next.seal.clone().unwrap();
                    assert_eq!((plan.cut, plan.end(), plan.leader_epoch), (7, 9, 4));
                    assert_eq!(plan.open_txns, vec![early]);
                    assert_eq!(plan.batches[0].base_offset, 7);
                    // The re-planned seal is then served from its new cut.
                    match decide(&key, &next, 7, 4, 4, &Vec::new, rule) {
                        Decision::Answer(a) => {
                            assert_eq!((a.aborts_served, a.barriers_served), (1, 1));
                            assert_eq!(a.high_watermark, 9);
                        }
                        other => panic!("{other:?}"),
                    }
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(
            asked.get(),
            2,
            "the open transactions are read at the new cut"
        );
    }

    #[test]
    fn an_ended_episode_is_never_caught_up_and_a_protected_one_starts_at_the_fetch() {
        let key = PartitionKey::new([0; 16], "t", 0);
        let mut e = built();
        e.state = State::Stopped; // sealed 10..12
        for at in [12, 11] {
            match decide(&key, &e, at, 3, 3, &Vec::new, StopRule::FetcherOffset) {
                Decision::Answer(a) => assert_eq!((a.error_code, a.high_watermark), (0, at)),
                other => panic!("{other:?}"),
            }
        }
        // Past the seal: the destination wrote locally and mirrors again
        // without `protect`: refused, never "caught up".
        match decide(&key, &e, 20, 3, 3, &Vec::new, StopRule::FetcherOffset) {
            Decision::Refuse { answer, why } => {
                assert_eq!(answer.error_code, POLICY_VIOLATION);
                assert!(answer.records.is_empty());
                assert!(why.contains("protect"), "{why}");
            }
            other => panic!("{other:?}"),
        }
        let next = e.next_episode("m", "AAAAAAAAAAAAAAAAAAAAAQ");
        match decide(&key, &next, 20, 3, 3, &Vec::new, StopRule::FetcherOffset) {
            Decision::Persist(started) => {
                assert_eq!(
                    (started.state, started.episode, started.episode_start),
                    (State::Mirroring, 1, Some(20))
                );
                assert!(!started.is_controlled());
            }
            other => panic!("{other:?}"),
        }
    }
}
