//! Shadow producer state of one destination partition.
//!
//! Modelled on Kafka's `ProducerStateManager` / `ProducerAppendInfo` as the
//! destination applies it on the replication path: every batch is accepted
//! and the state is updated the way the destination updates it (an epoch
//! may go backwards, a marker closes whatever transaction its PID has open),
//! while the CLIENT-path checks the destination skips are evaluated here and
//! reported as [`Anomaly`]s. Each entry also remembers the origin of its
//! mapped PID, which the destination cannot know.
//!
//! (Over 600 lines on purpose: one partition's producer entries, open and
//! closed transactions and their snapshot are one state machine, checked in
//! one place; a quarter of the file is its tests.)

use std::collections::{HashMap, VecDeque};
use std::mem::size_of;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::anomaly::{Anomaly, AnomalyDetail};
use super::hash::{hash_table_bytes, MixState};
use super::salt::SaltTable;
use super::{BatchObservation, ControlKind, Origin, PartitionKey};

/// Sequences live in `0..=i32::MAX`; Kafka wraps `i32::MAX + 1` to 0.
const SEQUENCE_SPACE: i64 = 1 << 31;

/// `seq + delta` with Kafka's wrap at `i32::MAX` (`DefaultRecordBatch.incrementSequence`).
#[inline]
pub(crate) fn add_sequence(seq: i32, delta: i32) -> i32 {
    let sum = i64::from(seq) + i64::from(delta);
    // Both inputs are non-negative in valid batches; rem_euclid keeps the
    // result in range for any input so this can never panic or overflow.
    sum.rem_euclid(SEQUENCE_SPACE) as i32
}

/// Sentinel for "no transaction open" in [`ProducerEntry`] (saves the 8
/// bytes an `Option<i64>` would add per producer).
const NO_TXN: i64 = -1;

/// State of one mapped PID (Kafka's `ProducerStateEntry`, keeping only the
/// last batch's metadata as Kafka's snapshot does, plus the origin).
///
/// 72 bytes; see [`PartitionState::memory_bytes`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ProducerEntry {
    /// The origin that holds this mapped PID: the owner of the open
    /// transaction while one is open, otherwise the last origin seen.
    pub origin: Origin,
    /// Offset of the last data batch (markers do not move it, as in Kafka).
    pub last_offset: i64,
    /// Max timestamp of the last batch (client-controlled under CreateTime).
    pub last_timestamp: i64,
    /// Wall-clock ms of the last batch; expiry uses this, not the batch
    /// timestamp, so a batch stamped 0 does not expire its producer at once.
    pub last_seen_ms: i64,
    /// First offset of the open transaction, -1 when none.
    txn_first_offset: i64,
    /// Coordinator epoch of the last marker, -1 when none seen.
    pub coordinator_epoch: i32,
    /// Last sequence of the last data batch, -1 when unknown (new epoch).
    pub last_sequence: i32,
    /// Producer epoch, -1 when unknown.
    pub epoch: i16,
}

impl ProducerEntry {
    /// First offset of the open transaction, if any.
    pub fn transaction_first_offset(&self) -> Option<i64> {
        (self.txn_first_offset >= 0).then_some(self.txn_first_offset)
    }
}

/// An open transaction, as needed for an ABORT marker at the seal.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct OpenTransaction {
    /// The mapped PID (the marker's PID).
    pub mapped_pid: i64,
    /// The producer's current epoch (the marker's epoch).
    pub epoch: i16,
    /// The transaction's first offset.
    pub first_offset: i64,
    /// The origin that opened it.
    pub origin: Origin,
}

/// A transaction closed by a COMMIT or ABORT marker the destination may
/// not hold: one at or above the destination fetcher's last known position
/// (its response lost, or not fetched yet), or one below it that a
/// destination leader can still lose (not yet replicated: a new leader
/// truncates to its own log). A cut taken below the marker must still see
/// the transaction open.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ClosedTransaction {
    /// The transaction as it was before its marker (epoch of its batches).
    pub txn: OpenTransaction,
    /// The producer's coordinator epoch before the marker (what the
    /// destination holds while the marker is not appended).
    pub coordinator_epoch: i32,
    /// Offset of the closing marker.
    pub marker_offset: i64,
}

/// A transaction open at a cut, with the coordinator epoch its ABORT
/// marker carries.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct TransactionAtCut {
    /// The transaction (mapped PID, epoch, first offset, origin).
    pub txn: OpenTransaction,
    /// Coordinator epoch of the producer's last marker before the cut (-1
    /// when none was seen).
    pub coordinator_epoch: i32,
}

/// The transactions open at a cut ([`PartitionState::open_at`]).
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct OpenAtCut {
    /// Open at the cut, ordered by first offset then mapped PID.
    pub transactions: Vec<TransactionAtCut>,
    /// How many of them the shadow state saw closed past the cut (a marker
    /// the fetcher did not append).
    pub closed_past_cut: usize,
    /// Closings at or above the cut may be unknown: dropped at the bound
    /// ([`MAX_CLOSED_TRANSACTIONS`]), lost with a restore from a snapshot
    /// (which holds no closings) taken past the cut, or pruned below the
    /// fetcher's position ([`ClosingsRetention`], [`ClosingsBudget`])
    /// before the position moved back below them. Transactions they closed are missing from
    /// `transactions`.
    pub incomplete: bool,
    /// Producers that may have begun a transaction in a range below the cut
    /// the state has not seen (a restart without the source): each gets an
    /// ABORT marker, up to [`MAX_UNSEEN_RANGE_ABORTS`].
    pub unseen_range_candidates: usize,
    /// More than [`MAX_UNSEEN_RANGE_ABORTS`] of them: the rest get no
    /// marker, and `incomplete` is set.
    pub unseen_range_truncated: bool,
}

/// At most this many ABORT markers for producers that may have begun a
/// transaction in a range the state has not seen (about 80 bytes each: the
/// seal stays one fetch response under Kafka's default 1 MiB
/// `replica.fetch.max.bytes`).
pub const MAX_UNSEEN_RANGE_ABORTS: usize = 4096;

/// Most closings remembered per partition (see [`ClosedTransaction`]). They
/// are pruned as the fetcher moves ([`ClosingsRetention`]); past the bound
/// the oldest are dropped and a cut at or below them is reported as
/// incomplete ([`OpenAtCut::incomplete`]), never silently.
pub const MAX_CLOSED_TRANSACTIONS: usize = 16_384;

/// Default of [`ClosingsRetention::offsets`].
pub const DEFAULT_CLOSINGS_RETAINED_OFFSETS: i64 = 1_000_000;
/// Default of [`ClosingsRetention::max`].
pub const DEFAULT_CLOSINGS_RETAINED_MAX: usize = 1024;

/// How many closings below the destination fetcher's position a partition
/// keeps (`[[mirror]] closings_retained_offsets` and
/// `closings_retained_max`).
///
/// The fetcher appended every offset below its position, but the
/// destination leader it runs on may not have replicated them yet: when
/// leadership moves, the new leader's log ends where its copy ended (never
/// below the destination's high watermark) and the fetcher comes back there.
/// A seal planned again at that offset needs the transactions closed by the
/// markers it lost. The destination's high watermark is not read in steady
/// state (a ListOffsets per partition), so closings are kept within a window
/// below the position instead: those whose marker is at most `offsets`
/// below it, and, of those, at most `max` (the oldest go first). A cut below
/// a closing that was pruned is reported incomplete, never silently.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ClosingsRetention {
    /// Offsets below the fetcher's position within which closings are kept.
    pub offsets: i64,
    /// Most closings kept below the fetcher's position.
    pub max: usize,
}

impl Default for ClosingsRetention {
    fn default() -> Self {
        Self {
            offsets: DEFAULT_CLOSINGS_RETAINED_OFFSETS,
            max: DEFAULT_CLOSINGS_RETAINED_MAX,
        }
    }
}

/// Default of [`ClosingsBudget::max`] (about 64 MiB).
pub const DEFAULT_CLOSINGS_RETAINED_TOTAL_MAX: usize = 1_000_000;

/// Seconds between two WARN lines of [`ClosingsBudget`].
const BUDGET_WARN_INTERVAL_SECS: u64 = 60;

/// The process-wide bound on the closings retained below the destination
/// fetchers' positions (`[producer_state] closings_retained_total_max`),
/// over every partition that shares it.
///
/// Each partition counts the closings it retains below its fetcher's
/// position here; when retaining one more would pass [`Self::max`], the
/// partition doing so forgets its own oldest below its position, as
/// [`ClosingsRetention`] does (a cut below them is reported incomplete).
/// Closings at or past a fetcher's position are never counted nor dropped
/// here: the seal at a cut needs them.
#[derive(Debug)]
pub struct ClosingsBudget {
    max: usize,
    retained: AtomicUsize,
    dropped: AtomicU64,
    /// Seconds since `started` of the last WARN, plus one (0: never).
    warned_at: AtomicU64,
    started: Instant,
}

impl ClosingsBudget {
    /// A budget of `max` closings, none retained.
    pub fn new(max: usize) -> Self {
        Self {
            max,
            retained: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
            warned_at: AtomicU64::new(0),
            started: Instant::now(),
        }
    }

    /// Most closings retained below the fetchers' positions, all
    /// partitions together.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Closings retained below the fetchers' positions now.
    pub fn retained(&self) -> usize {
        self.retained.load(Ordering::Relaxed)
    }

    /// Closings dropped because the budget was full, since start-up.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Whether a WARN is due (at most one per interval, all partitions).
    fn warn_due(&self) -> bool {
        let now = self.started.elapsed().as_secs() + 1;
        let last = self.warned_at.load(Ordering::Relaxed);
        (last == 0 || now >= last + BUDGET_WARN_INTERVAL_SECS)
            && self
                .warned_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

/// A partition's share of a [`ClosingsBudget`]: the closings it counted
/// there, given back when the state is dropped. A clone (a copy of the
/// state) shares no budget: only the state the registry holds counts.
#[derive(Debug, Default)]
struct BudgetShare {
    budget: Option<Arc<ClosingsBudget>>,
    counted: usize,
}

impl Clone for BudgetShare {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl Drop for BudgetShare {
    fn drop(&mut self) {
        if let Some(b) = &self.budget {
            b.retained.fetch_sub(self.counted, Ordering::Relaxed);
        }
    }
}

/// Capacity of the closings kept when they empty after a burst.
const CLOSED_KEPT_CAPACITY: usize = 64;

/// What [`PartitionState::observe`] did with a batch.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ObserveOutcome {
    /// The batch updated producer state (anomalies, if any, were reported).
    Applied,
    /// A MIRROR_PID_RESET barrier: all producer state was expired.
    Reset,
    /// The batch lies entirely below offsets already observed: a re-fetch of
    /// data already accounted for, so state is left alone (re-applying it
    /// would report every re-delivered batch as a duplicate).
    Replayed,
    /// No producer state involved (PID -1, e.g. KRaft control batches).
    Ignored,
    /// Negative or inverted offsets: not a batch any broker writes; ignored.
    Malformed,
}

/// Producer state of one destination partition.
#[derive(Clone, Debug)]
pub struct PartitionState {
    key: PartitionKey,
    producers: HashMap<i64, ProducerEntry, MixState>,
    salts: SaltTable,
    /// One past the last offset observed; batches below it are re-deliveries.
    next_offset: i64,
    /// Partition leader epoch of the last batch forwarded to the fetcher
    /// (-1 before any): stamps a seal when the fetcher's request carries no
    /// LastFetchedEpoch (Fetch < v12).
    last_leader_epoch: i32,
    /// Transactions closed at or above `fetcher_position`, and those below
    /// it still retained ([`ClosingsRetention`]), in marker offset order
    /// (markers are observed in offset order).
    closed: VecDeque<ClosedTransaction>,
    /// Lower bound of the destination fetcher's position: it appended
    /// every offset below it. Moved only by the fetcher's own responses.
    fetcher_position: i64,
    /// Every closing whose marker is at or above this offset is in
    /// `closed`; below it some may be missing. Raised past each closing
    /// forgotten (pruned below the fetcher's position, or dropped at the
    /// bound) and to a restored snapshot's offset when the snapshot holds
    /// no closings (markers re-fetched below its `next_offset` are replays
    /// and never remembered). A cut below it is incomplete.
    closed_known_from: i64,
    /// The closings of `closed` below `fetcher_position` counted in the
    /// process-wide budget, if the state shares one.
    budget: BudgetShare,
}

impl PartitionState {
    /// Empty state for `key`.
    pub fn new(key: PartitionKey) -> Self {
        Self {
            key,
            producers: HashMap::default(),
            salts: SaltTable::default(),
            next_offset: 0,
            last_leader_epoch: -1,
            closed: VecDeque::new(),
            fetcher_position: 0,
            closed_known_from: 0,
            budget: BudgetShare::default(),
        }
    }

    /// Counts this state's closings below the fetcher's position in
    /// `budget` from now on (and drops its oldest if the budget is full).
    /// The registry calls it for the states it holds; a state counted in
    /// another budget leaves it.
    pub fn share_closings_budget(&mut self, budget: Arc<ClosingsBudget>) {
        self.budget = BudgetShare {
            budget: Some(budget),
            counted: 0,
        };
        self.account_closings();
    }

    /// Brings the budget's count of this state's closings below the
    /// fetcher's position up to date; past the budget's bound, forgets the
    /// oldest of them (as [`Self::note_fetcher_position`] does). Call after
    /// every change of `closed` or `fetcher_position`. O(log closings +
    /// closings forgotten); never allocates.
    fn account_closings(&mut self) {
        let Some(budget) = &self.budget.budget else {
            return;
        };
        let position = self.fetcher_position;
        let below = self.closed.partition_point(|c| c.marker_offset < position);
        let counted = self.budget.counted;
        if below <= counted {
            budget
                .retained
                .fetch_sub(counted - below, Ordering::Relaxed);
            self.budget.counted = below;
            return;
        }
        let total = budget
            .retained
            .fetch_add(below - counted, Ordering::Relaxed)
            + below
            - counted;
        self.budget.counted = below;
        let excess = total.saturating_sub(budget.max).min(below);
        if excess == 0 {
            return;
        }
        let mut last_dropped = -1;
        for c in self.closed.drain(..excess) {
            last_dropped = c.marker_offset;
        }
        self.closed_known_from = self.closed_known_from.max(last_dropped.saturating_add(1));
        self.budget.counted -= excess;
        budget.retained.fetch_sub(excess, Ordering::Relaxed);
        budget.dropped.fetch_add(excess as u64, Ordering::Relaxed);
        if budget.warn_due() {
            tracing::warn!(partition = %self.key, dropped = excess, marker_offset = last_dropped,
                fetcher_position = position, bound = budget.max,
                "transaction closings retained below the destination fetchers' positions reached \
                 [producer_state] closings_retained_total_max: this partition's oldest are \
                 forgotten; a seal planned again at or below them is reported incomplete \
                 (further drops are counted in \
                 mirrorguard_producer_state_closings_dropped_total, logged once a minute)");
        }
    }

    /// Notes that the destination fetcher appended every offset below
    /// `offset` (its fetch offset, or the first batch of a response it
    /// fetched: that batch holds its fetch offset). Closings below it are
    /// appended on the destination, but its leader may still lose them
    /// (not replicated yet): they are kept as `retention` says, and the
    /// older ones forgotten. Only the destination fetcher's fetches may
    /// call this: another reader's position says nothing about the
    /// destination's log. O(closings forgotten); never allocates.
    pub fn note_fetcher_position(&mut self, offset: i64, retention: ClosingsRetention) {
        // A position that moved back (the destination's log truncated)
        // needs nothing more: the closings kept are still facts, and those
        // forgotten raised `closed_known_from` when they went.
        self.fetcher_position = offset;
        let floor = offset.saturating_sub(retention.offsets.max(0));
        // The count bound is on the closings below the position only: those
        // past it (a state ahead of the fetcher) must not push them out.
        let mut below = self.closed.partition_point(|c| c.marker_offset < offset);
        while let Some(c) = self.closed.front() {
            if !(c.marker_offset < floor || c.marker_offset < offset && below > retention.max) {
                break;
            }
            if c.marker_offset < offset {
                below -= 1;
            }
            self.closed_known_from = self
                .closed_known_from
                .max(c.marker_offset.saturating_add(1));
            self.closed.pop_front();
        }
        self.account_closings();
        let cap = self.closed.capacity();
        if cap > CLOSED_KEPT_CAPACITY && self.closed.len() < cap / 4 {
            // Give back the memory of a burst of markers, keeping a buffer
            // so that steady traffic does not reallocate.
            self.closed
                .shrink_to((2 * self.closed.len()).max(CLOSED_KEPT_CAPACITY));
        }
    }

    /// Notes that closings below `offset` may be unknown: the state skipped
    /// source records there (a replay that found them deleted or stopped
    /// at the source's high watermark, a partition made warm without a
    /// replay), so a cut below it is reported incomplete.
    pub fn closings_unknown_below(&mut self, offset: i64) {
        self.closed_known_from = self.closed_known_from.max(offset);
    }

    /// A copy for mapping lookups (producers and salts) without the
    /// closings, which no lookup reads and which may hold thousands.
    pub fn clone_for_lookup(&self) -> Self {
        Self {
            key: self.key.clone(),
            producers: self.producers.clone(),
            salts: self.salts.clone(),
            next_offset: self.next_offset,
            last_leader_epoch: self.last_leader_epoch,
            closed: VecDeque::new(),
            fetcher_position: self.fetcher_position,
            closed_known_from: self.closed_known_from,
            budget: BudgetShare::default(),
        }
    }

    /// Transactions closed past the fetcher's position, and those below it
    /// still retained, in marker offset order.
    pub fn closed_transactions(&self) -> impl Iterator<Item = &ClosedTransaction> {
        self.closed.iter()
    }

    /// Starts a new mirroring episode at `offset` (the destination
    /// fetcher's first fetch after `protect`): no producer, no closing,
    /// nothing below `offset` to replay (the episode before ended with a
    /// barrier, which expired the destination's producer state). Salts stay:
    /// a mapping never changes.
    pub fn start_episode_at(&mut self, offset: i64) {
        self.producers = HashMap::default();
        self.closed = VecDeque::new();
        self.next_offset = offset;
        self.fetcher_position = offset;
        self.closed_known_from = offset;
        self.last_leader_epoch = -1;
        self.account_closings();
    }

    /// Forgets the closings (the partition is sealed: nothing past its cut
    /// will ever be appended).
    pub fn forget_closed(&mut self) {
        self.closed = VecDeque::new();
        self.closed_known_from = 0;
        self.account_closings();
    }

    /// The transactions open at destination offset `cut`, as the
    /// destination holds them once it appended everything below the cut,
    /// even when this state saw batches past it (a response the fetcher
    /// lost): those open now that began below the cut, plus those that
    /// began below the cut and were closed by a marker at or past it.
    /// Transactions begun at or past the cut are not open there. O(producers
    /// log producers); meant for the seal.
    pub fn open_at(&self, cut: i64) -> OpenAtCut {
        let mut out = OpenAtCut::default();
        let mut pids = std::collections::HashSet::new();
        for c in &self.closed {
            if c.marker_offset >= cut && c.txn.first_offset < cut && pids.insert(c.txn.mapped_pid) {
                out.transactions.push(TransactionAtCut {
                    txn: c.txn,
                    coordinator_epoch: c.coordinator_epoch,
                });
                out.closed_past_cut += 1;
            }
        }
        for t in self.open_transactions() {
            if t.first_offset < cut && !pids.contains(&t.mapped_pid) {
                out.transactions.push(TransactionAtCut {
                    txn: t,
                    coordinator_epoch: self
                        .producers
                        .get(&t.mapped_pid)
                        .map_or(-1, |e| e.coordinator_epoch),
                });
            }
        }
        // The state has not seen [next_offset, cut) (a restart whose replay
        // could not reach the source): any producer that can have begun a
        // transaction there may hold one open at the cut. Those are the
        // transactional producers it knows (a marker seen) and the producers
        // claimed since its snapshot (a claim is durable before the first
        // batch of a new producer is forwarded; never observed here). An
        // idempotent producer known here cannot: its PID never takes part in
        // a transaction. An ABORT marker for a PID with nothing open is
        // harmless on the replication path but takes an offset, so it is not
        // sent for every producer; at most MAX_UNSEEN_RANGE_ABORTS are.
        let mut unseen: Vec<(i64, ProducerEntry)> = Vec::new();
        if self.next_offset < cut {
            unseen = self
                .producers
                .iter()
                .filter(|(pid, e)| {
                    !pids.contains(pid)
                        && e.txn_first_offset == NO_TXN
                        && (e.coordinator_epoch >= 0 || e.last_offset < 0)
                })
                .map(|(pid, e)| (*pid, *e))
                .collect();
            unseen.sort_unstable_by_key(|(pid, _)| *pid);
            out.unseen_range_candidates = unseen.len();
            out.unseen_range_truncated = unseen.len() > MAX_UNSEEN_RANGE_ABORTS;
            unseen.truncate(MAX_UNSEEN_RANGE_ABORTS);
        }
        for (pid, e) in unseen {
            out.transactions.push(TransactionAtCut {
                txn: OpenTransaction {
                    mapped_pid: pid,
                    // Unknown for a claim: the replication path accepts a
                    // marker of a lower epoch (it logs a WARN).
                    epoch: e.epoch.max(0),
                    // Begun at the earliest where the state lost sight.
                    first_offset: self.next_offset,
                    origin: e.origin,
                },
                coordinator_epoch: e.coordinator_epoch,
            });
        }
        out.transactions
            .sort_unstable_by_key(|t| (t.txn.first_offset, t.txn.mapped_pid));
        out.incomplete = cut < self.closed_known_from || out.unseen_range_truncated;
        out
    }

    /// The closings a seal at `cut` keeps with its snapshot (which holds the
    /// transactions open at the cut, at offset `cut`): those below the cut,
    /// so that the seal planned again further back (a new destination
    /// leader that truncated), after a restart or by another instance,
    /// still finds the transactions they closed. `None` when this state has
    /// not seen up to the cut (restored from an older record, say): it then
    /// cannot say what was closed below it.
    pub fn closings_at_cut(&self, cut: i64) -> Option<ClosingsSnapshot> {
        if self.next_offset < cut {
            return None;
        }
        let below = self.closed.partition_point(|c| c.marker_offset < cut);
        Some(ClosingsSnapshot {
            kept_from: self.fetcher_position.min(self.closed_known_from).min(cut),
            dropped_upto: self.closed_known_from - 1,
            closed: self.closed.range(..below).copied().collect(),
        })
    }

    /// Remembers a closing (bounded).
    fn remember_closed(&mut self, closed: ClosedTransaction) {
        if self.closed.len() >= MAX_CLOSED_TRANSACTIONS {
            if let Some(old) = self.closed.pop_front() {
                if old.marker_offset >= self.fetcher_position
                    && self.closed_known_from <= self.fetcher_position
                {
                    tracing::warn!(partition = %self.key, marker_offset = old.marker_offset,
                        fetcher_position = self.fetcher_position, bound = MAX_CLOSED_TRANSACTIONS,
                        "too many transaction closings past the destination fetcher's position: \
                         the oldest are forgotten; a seal cut at or below them may miss open \
                         transactions (reported when the cut is taken)");
                }
                self.closed_known_from = self
                    .closed_known_from
                    .max(old.marker_offset.saturating_add(1));
            }
        }
        self.closed.push_back(closed);
        // The closing dropped at the bound, or this one (below a position
        // ahead of the state), may change the count below the position.
        self.account_closings();
    }

    /// Partition leader epoch of the last batch forwarded (-1 before any).
    pub fn last_leader_epoch(&self) -> i32 {
        self.last_leader_epoch
    }

    /// Notes the partition leader epoch of a batch forwarded to the fetcher.
    pub fn note_leader_epoch(&mut self, epoch: i32) {
        self.last_leader_epoch = epoch;
    }

    /// The partition's key.
    pub fn key(&self) -> &PartitionKey {
        &self.key
    }

    /// Number of tracked producers.
    pub fn producer_count(&self) -> usize {
        self.producers.len()
    }

    /// The entry of a mapped PID.
    pub fn producer(&self, mapped_pid: i64) -> Option<&ProducerEntry> {
        self.producers.get(&mapped_pid)
    }

    /// All tracked producers (arbitrary order), for the admin API.
    pub fn producers(&self) -> impl Iterator<Item = (i64, &ProducerEntry)> {
        self.producers.iter().map(|(pid, e)| (*pid, e))
    }

    /// One past the highest offset observed.
    pub fn next_offset(&self) -> i64 {
        self.next_offset
    }

    /// The partition's salt records.
    pub fn salts(&self) -> &SaltTable {
        &self.salts
    }

    /// The partition's salt records, for applying `__mirror_state` records.
    pub fn salts_mut(&mut self) -> &mut SaltTable {
        &mut self.salts
    }

    /// Updates state with one batch and pushes any anomalies into `sink`.
    ///
    /// `origin` is where the batch comes from; `batch.producer_id` is the
    /// PID as it leaves the proxy. `now_ms` is wall-clock time (for expiry).
    /// O(1); allocates only when an anomaly is reported and `sink` must grow.
    pub fn observe(
        &mut self,
        origin: &Origin,
        batch: &BatchObservation,
        now_ms: i64,
        sink: &mut Vec<Anomaly>,
    ) -> ObserveOutcome {
        if batch.base_offset < 0 || batch.last_offset < batch.base_offset {
            // No broker writes such a batch; keep it out of the state so
            // offsets stay meaningful (and -1 stays free as "no txn").
            return ObserveOutcome::Malformed;
        }
        if batch.last_offset < self.next_offset {
            return ObserveOutcome::Replayed;
        }
        self.next_offset = batch.last_offset.saturating_add(1);

        if batch.control == Some(ControlKind::MirrorPidReset) {
            self.reset();
            return ObserveOutcome::Reset;
        }
        // Kafka's PSM rejects exactly -1; every other value, including the
        // negative sign-bit layout, is tracked so anomalies are still seen.
        if batch.producer_id == -1 {
            return ObserveOutcome::Ignored;
        }
        match batch.control {
            None => self.observe_data(origin, batch, now_ms, sink),
            Some(ControlKind::Commit { coordinator_epoch }) => {
                self.observe_marker(origin, batch, true, coordinator_epoch, now_ms, sink)
            }
            Some(ControlKind::Abort { coordinator_epoch }) => {
                self.observe_marker(origin, batch, false, coordinator_epoch, now_ms, sink)
            }
            Some(ControlKind::Unknown(control_type)) => {
                // A stock follower throws on this and fails the partition;
                // its state is not updated, so neither is ours.
                sink.push(self.anomaly(
                    origin,
                    batch,
                    AnomalyDetail::UnknownControlType { control_type },
                ));
            }
            Some(ControlKind::MirrorPidReset) => {}
        }
        ObserveOutcome::Applied
    }

    fn anomaly(&self, origin: &Origin, batch: &BatchObservation, detail: AnomalyDetail) -> Anomaly {
        Anomaly {
            partition: self.key.clone(),
            offset: batch.base_offset,
            last_offset: batch.last_offset,
            mapped_pid: batch.producer_id,
            origin: *origin,
            detail,
        }
    }

    fn observe_data(
        &mut self,
        origin: &Origin,
        batch: &BatchObservation,
        now_ms: i64,
        sink: &mut Vec<Anomaly>,
    ) {
        let Some(entry) = self.producers.get_mut(&batch.producer_id) else {
            // Unknown PID: any sequence is accepted (Kafka rule 4).
            self.producers.insert(
                batch.producer_id,
                ProducerEntry {
                    origin: *origin,
                    last_offset: batch.last_offset,
                    last_timestamp: batch.max_timestamp,
                    last_seen_ms: now_ms,
                    txn_first_offset: if batch.is_transactional {
                        batch.base_offset
                    } else {
                        NO_TXN
                    },
                    coordinator_epoch: -1,
                    last_sequence: batch.last_sequence,
                    epoch: batch.producer_epoch,
                },
            );
            return;
        };
        // Copy what the checks need so the anomaly constructor can borrow
        // `self` (cold path only).
        let before = *entry;
        let epoch_changed = batch.producer_epoch != before.epoch;

        // Apply the batch the way the destination does on replication.
        if before.origin != *origin && before.txn_first_offset == NO_TXN {
            entry.origin = *origin;
        }
        if entry.txn_first_offset == NO_TXN && batch.is_transactional {
            entry.txn_first_offset = batch.base_offset;
        }
        entry.epoch = batch.producer_epoch;
        entry.last_sequence = batch.last_sequence;
        entry.last_offset = batch.last_offset;
        entry.last_timestamp = batch.max_timestamp;
        entry.last_seen_ms = now_ms;

        // Checks (cold unless something is wrong).
        if before.origin != *origin {
            sink.push(self.anomaly(
                origin,
                batch,
                AnomalyDetail::PidClaimedByTwoOrigins {
                    holder: before.origin,
                },
            ));
        }
        if !batch.is_transactional && before.txn_first_offset != NO_TXN {
            sink.push(self.anomaly(
                origin,
                batch,
                AnomalyDetail::NonTransactionalInOpenTransaction {
                    transaction_first_offset: before.txn_first_offset,
                },
            ));
        }
        if before.epoch == -1 {
            // No epoch known (Kafka: NO_PRODUCER_EPOCH): any sequence is fine.
            return;
        }
        if batch.producer_epoch < before.epoch {
            // The sequence is meaningless against a lower epoch; the
            // regression itself is the finding.
            sink.push(self.anomaly(
                origin,
                batch,
                AnomalyDetail::EpochRegression {
                    stored_epoch: before.epoch,
                    batch_epoch: batch.producer_epoch,
                },
            ));
            return;
        }
        if batch.base_sequence < 0 {
            // NO_SEQUENCE: nothing to check.
            return;
        }
        if epoch_changed {
            // Epoch bump: the new epoch must start at sequence 0.
            if batch.base_sequence != 0 {
                sink.push(self.anomaly(
                    origin,
                    batch,
                    AnomalyDetail::SequenceGap {
                        epoch: batch.producer_epoch,
                        expected_sequence: 0,
                        base_sequence: batch.base_sequence,
                        previous_offset: before.last_offset,
                    },
                ));
            }
            return;
        }
        // Same epoch. last_sequence -1 (after an epoch-bumping marker) makes
        // 0 the expected sequence, as Kafka's inSequence(-1, 0) does.
        let expected = if before.last_sequence < 0 {
            0
        } else {
            add_sequence(before.last_sequence, 1)
        };
        if batch.base_sequence == expected {
            return;
        }
        // Decide direction in the wrapping sequence space: less than half
        // the space ahead is a gap, otherwise the batch is behind (overlap).
        let ahead =
            (i64::from(batch.base_sequence) - i64::from(expected)).rem_euclid(SEQUENCE_SPACE);
        let detail = if before.last_sequence < 0 || ahead < SEQUENCE_SPACE / 2 {
            AnomalyDetail::SequenceGap {
                epoch: batch.producer_epoch,
                expected_sequence: expected,
                base_sequence: batch.base_sequence,
                previous_offset: before.last_offset,
            }
        } else {
            AnomalyDetail::SequenceOverlap {
                epoch: batch.producer_epoch,
                last_sequence: before.last_sequence,
                base_sequence: batch.base_sequence,
                batch_last_sequence: batch.last_sequence,
                previous_offset: before.last_offset,
            }
        };
        sink.push(self.anomaly(origin, batch, detail));
    }

    fn observe_marker(
        &mut self,
        origin: &Origin,
        batch: &BatchObservation,
        commit: bool,
        coordinator_epoch: i32,
        now_ms: i64,
        sink: &mut Vec<Anomaly>,
    ) {
        let Some(entry) = self.producers.get_mut(&batch.producer_id) else {
            // Kafka accepts this and creates an entry with the marker's
            // epochs; the data may simply predate our state.
            self.producers.insert(
                batch.producer_id,
                ProducerEntry {
                    origin: *origin,
                    last_offset: -1,
                    last_timestamp: batch.max_timestamp,
                    last_seen_ms: now_ms,
                    txn_first_offset: NO_TXN,
                    coordinator_epoch,
                    last_sequence: -1,
                    epoch: batch.producer_epoch,
                },
            );
            sink.push(self.anomaly(
                origin,
                batch,
                AnomalyDetail::MarkerWithoutTransaction {
                    commit,
                    known_producer: false,
                },
            ));
            return;
        };
        let before = *entry;
        let mapped_pid = batch.producer_id;

        // Apply as Kafka's appendEndTxnMarker: epoch (clearing the sequence
        // if it changed), coordinator epoch, timestamp; close the txn.
        if batch.producer_epoch != before.epoch {
            entry.epoch = batch.producer_epoch;
            entry.last_sequence = -1;
        }
        entry.coordinator_epoch = coordinator_epoch;
        entry.txn_first_offset = NO_TXN;
        entry.origin = *origin;
        entry.last_timestamp = batch.max_timestamp;
        entry.last_seen_ms = now_ms;

        if before.epoch != -1 && batch.producer_epoch < before.epoch {
            sink.push(self.anomaly(
                origin,
                batch,
                AnomalyDetail::EpochRegression {
                    stored_epoch: before.epoch,
                    batch_epoch: batch.producer_epoch,
                },
            ));
        }
        if before.txn_first_offset != NO_TXN {
            self.remember_closed(ClosedTransaction {
                txn: OpenTransaction {
                    mapped_pid,
                    epoch: before.epoch,
                    first_offset: before.txn_first_offset,
                    origin: before.origin,
                },
                coordinator_epoch: before.coordinator_epoch,
                marker_offset: batch.base_offset,
            });
            // The marker closes whatever transaction the PID has open; that
            // is only right if the same origin opened it. (This specific
            // finding replaces PidClaimedByTwoOrigins for this batch.)
            if before.origin != *origin {
                sink.push(self.anomaly(
                    origin,
                    batch,
                    AnomalyDetail::MarkerForeignOrigin {
                        commit,
                        transaction_origin: before.origin,
                        transaction_first_offset: before.txn_first_offset,
                    },
                ));
            }
        } else {
            if before.origin != *origin {
                sink.push(self.anomaly(
                    origin,
                    batch,
                    AnomalyDetail::PidClaimedByTwoOrigins {
                        holder: before.origin,
                    },
                ));
            }
            sink.push(self.anomaly(
                origin,
                batch,
                AnomalyDetail::MarkerWithoutTransaction {
                    commit,
                    known_producer: true,
                },
            ));
        }
    }

    /// Expires all producer state (MIRROR_PID_RESET barrier). Salt records
    /// are kept: they are durable mappings, not producer state, and an
    /// origin PID must keep its mapped PID after the barrier.
    pub fn reset(&mut self) {
        // Replace rather than clear so the memory of a large table is freed.
        self.producers = HashMap::default();
    }

    /// The source's log was truncated at `end_offset`, below what this state
    /// observed (an unclean leader election, a lost unflushed tail): new
    /// records take those offsets. Kafka reloads its producer state from the
    /// log after a truncation (`ProducerStateManager.truncateAndReload`); a
    /// state cannot undo the batches it observed past `end_offset`, so it
    /// starts over empty and the caller replays the source from its start.
    /// Kept: salts and claims (durable mapping decisions; a claim becomes
    /// claim-only again), the leader epoch of the last batch forwarded. The
    /// destination fetcher truncates its own log to `end_offset` too.
    pub fn start_over_after_truncation(&mut self, end_offset: i64, now_ms: i64) {
        let claims: Vec<(i64, Origin)> = self
            .producers
            .iter()
            .map(|(pid, e)| (*pid, e.origin))
            .collect();
        self.producers = HashMap::default();
        for (pid, origin) in claims {
            self.claim(pid, origin, now_ms);
        }
        self.next_offset = 0;
        self.closed = VecDeque::new();
        self.closed_known_from = 0;
        self.fetcher_position = self.fetcher_position.min(end_offset.max(0));
        self.account_closings();
    }

    /// Drops producers with no open transaction whose last batch is at
    /// least `max_idle_ms` old (Kafka's `removeExpiredProducers`, on
    /// wall-clock time). Returns the number removed. O(producers): run it
    /// periodically (Kafka checks every 10 minutes), not per batch.
    pub fn expire_idle(&mut self, now_ms: i64, max_idle_ms: i64) -> usize {
        let before = self.producers.len();
        self.producers.retain(|_, e| {
            e.txn_first_offset != NO_TXN || now_ms.saturating_sub(e.last_seen_ms) < max_idle_ms
        });
        let removed = before - self.producers.len();
        if removed > 0 && self.producers.capacity() > 4 * self.producers.len().max(16) {
            // Give memory back after a mass expiry.
            self.producers.shrink_to_fit();
        }
        removed
    }

    /// Transactions still open, ordered by first offset then mapped PID, so
    /// the ABORT markers at the seal come out in a deterministic order.
    /// O(producers log producers); meant for the seal, not the batch path.
    pub fn open_transactions(&self) -> impl Iterator<Item = OpenTransaction> {
        let mut open: Vec<OpenTransaction> = self
            .producers
            .iter()
            .filter(|(_, e)| e.txn_first_offset != NO_TXN)
            .map(|(pid, e)| OpenTransaction {
                mapped_pid: *pid,
                epoch: e.epoch,
                first_offset: e.txn_first_offset,
                origin: e.origin,
            })
            .collect();
        open.sort_unstable_by_key(|t| (t.first_offset, t.mapped_pid));
        open.into_iter()
    }

    /// The origin holding `mapped_pid` in this partition, from producer
    /// state or a salt record, if any.
    pub fn holder_of(&self, mapped_pid: i64) -> Option<Origin> {
        self.producers
            .get(&mapped_pid)
            .map(|e| e.origin)
            .or_else(|| self.salts.claimant_of(mapped_pid))
    }

    /// Records that `origin` holds `mapped_pid` before any of its batches
    /// is observed (a claim made durable first, so a restart cannot forget
    /// it); nothing changes when the PID already has an entry. Returns
    /// whether an entry was added.
    pub fn claim(&mut self, mapped_pid: i64, origin: Origin, now_ms: i64) -> bool {
        if mapped_pid == -1 || self.producers.contains_key(&mapped_pid) {
            return false;
        }
        self.producers.insert(
            mapped_pid,
            ProducerEntry {
                origin,
                last_offset: -1,
                last_timestamp: -1,
                last_seen_ms: now_ms,
                txn_first_offset: NO_TXN,
                coordinator_epoch: -1,
                last_sequence: -1,
                epoch: -1,
            },
        );
        true
    }

    /// Estimated heap plus inline bytes of this state (hashbrown layout:
    /// one slot and one control byte per bucket, plus a 16-byte control
    /// group tail). Salt records are counted separately by
    /// [`SaltTable::memory_bytes`] and included here.
    pub fn memory_bytes(&self) -> usize {
        size_of::<Self>()
            + hash_table_bytes::<(i64, ProducerEntry)>(self.producers.capacity())
            + self.closed.capacity() * size_of::<ClosedTransaction>()
            + self.salts.memory_bytes()
    }

    /// A serialisable copy of the producer state and salts.
    pub fn snapshot(&self) -> PartitionSnapshot {
        let mut producers: Vec<ProducerSnapshotEntry> = self
            .producers
            .iter()
            .map(|(pid, e)| ProducerSnapshotEntry {
                mapped_pid: *pid,
                origin: e.origin,
                epoch: e.epoch,
                last_sequence: e.last_sequence,
                last_offset: e.last_offset,
                last_timestamp: e.last_timestamp,
                last_seen_ms: e.last_seen_ms,
                coordinator_epoch: e.coordinator_epoch,
                transaction_first_offset: e.transaction_first_offset(),
            })
            .collect();
        // Stable order makes snapshots comparable and compress better.
        producers.sort_unstable_by_key(|p| p.mapped_pid);
        let mut salts: Vec<super::SaltRecord> = self.salts.records().collect();
        salts.sort_unstable_by_key(|r| (r.origin.source_cluster, r.origin.original_pid));
        PartitionSnapshot {
            version: PARTITION_SNAPSHOT_VERSION,
            key: self.key.clone(),
            next_offset: self.next_offset,
            producers,
            salts,
            closings: Some(ClosingsSnapshot {
                // Read by an older reader as "the fetcher's position, every
                // closing at or above it kept; missing below `dropped_upto`
                // + 1": true of these values too (see `restore`).
                kept_from: self.fetcher_position.min(self.closed_known_from),
                dropped_upto: self.closed_known_from - 1,
                closed: self.closed.iter().copied().collect(),
            }),
        }
    }

    /// Rebuilds state from a snapshot.
    pub fn restore(snapshot: &PartitionSnapshot) -> Result<Self, SnapshotError> {
        if snapshot.version != PARTITION_SNAPSHOT_VERSION {
            return Err(SnapshotError::UnsupportedVersion(snapshot.version));
        }
        let mut state = Self::new(snapshot.key.clone());
        state.next_offset = snapshot.next_offset;
        match &snapshot.closings {
            // The markers below `next_offset` are replays from here on:
            // the closings they made come from the snapshot.
            Some(c) => {
                // Closings are kept from `kept_from` (an older writer: its
                // fetcher position, nothing kept below it), and those below
                // `dropped_upto` + 1 may be missing.
                state.fetcher_position = c.kept_from;
                state.closed_known_from = c.kept_from.max(c.dropped_upto.saturating_add(1));
                let known_from = state.closed_known_from;
                let kept = &c.closed[c.closed.partition_point(|t| t.marker_offset < known_from)..];
                // Bounded like the live record (a foreign record may hold
                // more): the oldest go, and a cut at them is reported.
                let extra = kept.len().saturating_sub(MAX_CLOSED_TRANSACTIONS);
                if let Some(last_dropped) = extra.checked_sub(1).map(|i| kept[i]) {
                    state.closed_known_from = state
                        .closed_known_from
                        .max(last_dropped.marker_offset.saturating_add(1));
                }
                state.closed = kept[extra..].iter().copied().collect();
            }
            // Without them, a snapshot taken ahead of the fetcher (a
            // response in flight) hides the transactions closed below its
            // offset from a cut there: report such a cut.
            None => state.closed_known_from = snapshot.next_offset,
        }
        state.producers.reserve(snapshot.producers.len());
        for p in &snapshot.producers {
            if p.mapped_pid == -1 {
                return Err(SnapshotError::InvalidProducerId);
            }
            let entry = ProducerEntry {
                origin: p.origin,
                last_offset: p.last_offset,
                last_timestamp: p.last_timestamp,
                last_seen_ms: p.last_seen_ms,
                txn_first_offset: match p.transaction_first_offset {
                    Some(o) if o >= 0 => o,
                    Some(o) => return Err(SnapshotError::InvalidTransactionOffset(o)),
                    None => NO_TXN,
                },
                coordinator_epoch: p.coordinator_epoch,
                last_sequence: p.last_sequence,
                epoch: p.epoch,
            };
            if state.producers.insert(p.mapped_pid, entry).is_some() {
                return Err(SnapshotError::DuplicateProducer(p.mapped_pid));
            }
        }
        for r in &snapshot.salts {
            state.salts.apply(*r);
        }
        Ok(state)
    }
}

/// Version of [`PartitionSnapshot`].
pub const PARTITION_SNAPSHOT_VERSION: u16 = 0;

/// Serialisable producer state of one partition (for `__mirror_state`).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct PartitionSnapshot {
    /// Format version ([`PARTITION_SNAPSHOT_VERSION`]).
    pub version: u16,
    /// The partition.
    pub key: PartitionKey,
    /// One past the last offset observed.
    pub next_offset: i64,
    /// Producers, ordered by mapped PID.
    pub producers: Vec<ProducerSnapshotEntry>,
    /// Salt records.
    pub salts: Vec<super::SaltRecord>,
    /// The closings past the fetcher's position, when kept (`None`: a
    /// snapshot without them; a restore then reports a cut below
    /// `next_offset` as possibly incomplete).
    #[serde(default)]
    pub closings: Option<ClosingsSnapshot>,
}

/// The closings of a [`PartitionSnapshot`].
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub struct ClosingsSnapshot {
    /// The offset they are kept from: at most the fetcher's position (an
    /// older writer kept none below it; this one keeps those a destination
    /// leader may still lose, see [`ClosingsRetention`]).
    pub kept_from: i64,
    /// Highest offset below which closings may be missing (-1: none).
    pub dropped_upto: i64,
    /// The closings, in marker offset order.
    pub closed: Vec<ClosedTransaction>,
}

/// One producer in a [`PartitionSnapshot`].
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ProducerSnapshotEntry {
    /// The mapped PID.
    pub mapped_pid: i64,
    /// Its origin.
    pub origin: Origin,
    /// Producer epoch.
    pub epoch: i16,
    /// Last sequence, -1 when unknown.
    pub last_sequence: i32,
    /// Offset of the last data batch.
    pub last_offset: i64,
    /// Max timestamp of the last batch.
    pub last_timestamp: i64,
    /// Wall-clock ms of the last batch.
    pub last_seen_ms: i64,
    /// Coordinator epoch, -1 when none.
    pub coordinator_epoch: i32,
    /// First offset of the open transaction.
    pub transaction_first_offset: Option<i64>,
}

/// Why a snapshot could not be restored.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    /// Written by a newer mirrorguard.
    #[error("unsupported producer-state snapshot version {0}")]
    UnsupportedVersion(u16),
    /// A producer entry with PID -1.
    #[error("producer-state snapshot contains producer id -1")]
    InvalidProducerId,
    /// A negative transaction first offset.
    #[error("producer-state snapshot has invalid transaction first offset {0}")]
    InvalidTransactionOffset(i64),
    /// The same mapped PID twice.
    #[error("producer-state snapshot lists producer {0} twice")]
    DuplicateProducer(i64),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::producer_state::ClusterId;

    /// Nothing kept below the fetcher's position (the behaviour before
    /// issue 17), for the tests of what lies at or above it.
    const NONE: ClosingsRetention = ClosingsRetention { offsets: 0, max: 0 };

    fn key() -> PartitionKey {
        PartitionKey::new([7; 16], "t", 0)
    }

    fn origin(pid: i64) -> Origin {
        Origin {
            source_cluster: ClusterId([1; 16]),
            original_pid: pid,
        }
    }

    /// (mapped PID, epoch, first offset, coordinator epoch) of each
    /// transaction a seal at the cut aborts.
    fn aborts_at(at: &OpenAtCut) -> Vec<(i64, i16, i64, i32)> {
        at.transactions
            .iter()
            .map(|t| {
                (
                    t.txn.mapped_pid,
                    t.txn.epoch,
                    t.txn.first_offset,
                    t.coordinator_epoch,
                )
            })
            .collect()
    }

    /// Observes one batch at time 0, its anomalies discarded.
    fn see(s: &mut PartitionState, o: &Origin, b: BatchObservation) {
        s.observe(o, &b, 0, &mut Vec::new());
    }

    /// For each i in `txns`: a transaction of pid 100 + i begun at 2i and
    /// committed at 2i + 1.
    fn close_transactions(s: &mut PartitionState, o: &Origin, txns: std::ops::Range<i64>) {
        for i in txns {
            see(s, o, BatchObservation::data(100 + i, 0, 2 * i, 0, 1, true));
            see(
                s,
                o,
                BatchObservation::marker(100 + i, 0, 2 * i + 1, true, 0),
            );
        }
    }

    #[test]
    fn a_source_truncation_starts_over_with_the_claims_kept() {
        let mut s = PartitionState::new(key());
        let o = origin(1);
        close_transactions(&mut s, &o, 0..2); // pids 100, 101 at 0..4
        see(&mut s, &o, BatchObservation::data(7, 0, 4, 0, 1, true)); // open at 4
        see(&mut s, &o, BatchObservation::data(8, 0, 5, 0, 1, false));
        s.note_fetcher_position(6, NONE);
        assert_eq!((s.next_offset(), s.open_transactions().count()), (6, 1));

        s.start_over_after_truncation(4, 0);
        assert_eq!(s.next_offset(), 0);
        assert_eq!(s.open_transactions().count(), 0);
        assert_eq!(s.producer_count(), 4);
        assert!(s
            .producers()
            .all(|(_, e)| e.last_offset == -1 && e.origin == o));
        // The replay observes the source's log again from its start, and the
        // new records at the truncated offsets are observed, not replays.
        close_transactions(&mut s, &o, 0..2);
        let new = BatchObservation::data(9, 0, 4, 0, 1, true);
        assert!(!matches!(
            s.observe(&o, &new, 0, &mut Vec::new()),
            ObserveOutcome::Replayed
        ));
        let open: Vec<i64> = s.open_transactions().map(|t| t.mapped_pid).collect();
        assert_eq!(open, [9]);
        assert_eq!(aborts_at(&s.open_at(5)).len(), 1);
    }

    #[test]
    fn sequence_wraps_like_kafka() {
        assert_eq!(add_sequence(i32::MAX, 1), 0);
        assert_eq!(add_sequence(i32::MAX - 1, 3), 1);
        assert_eq!(add_sequence(5, 0), 5);
    }

    #[test]
    fn entry_stays_small() {
        assert!(
            size_of::<ProducerEntry>() <= 72,
            "{}",
            size_of::<ProducerEntry>()
        );
        // README ("Limits for operators") quotes it for the closings kept.
        assert!(size_of::<ClosedTransaction>() <= 64);
    }

    #[test]
    fn hash_table_bytes_matches_hashbrown_capacity() {
        for n in [1usize, 3, 7, 8, 14, 15, 100, 1000, 100_000] {
            let mut m: HashMap<i64, ProducerEntry, MixState> = HashMap::default();
            m.reserve(n);
            let bytes = hash_table_bytes::<(i64, ProducerEntry)>(m.capacity());
            // At least n slots and at most twice the minimum bucket count.
            assert!(bytes >= n * 81, "n={n} bytes={bytes}");
            assert!(bytes <= (n * 8 / 7 + 8).next_power_of_two() * 2 * 81 + 16);
        }
    }

    #[test]
    fn wrap_is_in_sequence_and_far_back_is_overlap() {
        let mut s = PartitionState::new(key());
        let mut sink = Vec::new();
        let o = origin(1);
        s.observe(
            &o,
            &BatchObservation::data(9, 0, 0, i32::MAX - 1, 2, false),
            0,
            &mut sink,
        );
        s.observe(
            &o,
            &BatchObservation::data(9, 0, 2, 0, 1, false),
            0,
            &mut sink,
        );
        assert!(sink.is_empty(), "{sink:?}");
        // Jump back across the wrap: behind, so an overlap.
        s.observe(
            &o,
            &BatchObservation::data(9, 0, 3, i32::MAX, 1, false),
            0,
            &mut sink,
        );
        assert_eq!(sink.len(), 1);
        assert!(matches!(
            sink[0].detail,
            AnomalyDetail::SequenceOverlap { .. }
        ));
    }

    #[test]
    fn a_cut_past_what_the_state_saw_aborts_every_producer_that_may_have_begun_a_transaction() {
        let mut s = PartitionState::new(key());
        let o = origin(1);
        // pid 20: idempotent; pid 21: a committed transaction (transactional,
        // nothing open); pid 22: a transaction open at 4. The state saw up to 6.
        see(&mut s, &o, BatchObservation::data(20, 0, 0, 0, 1, false));
        see(&mut s, &o, BatchObservation::data(21, 1, 1, 0, 1, true));
        see(&mut s, &o, BatchObservation::marker(21, 1, 2, true, 5));
        see(&mut s, &o, BatchObservation::data(20, 0, 3, 1, 1, false));
        see(&mut s, &o, BatchObservation::data(22, 0, 4, 0, 1, true));
        see(&mut s, &o, BatchObservation::data(20, 0, 5, 2, 1, false));
        assert_eq!(s.next_offset(), 6);
        // pid 23: claimed since (a new producer; its batches never observed).
        assert!(s.claim(23, origin(23), 0));

        // Up to what it saw: only the open transaction.
        let at = s.open_at(6);
        let pids: Vec<i64> = at.transactions.iter().map(|t| t.txn.mapped_pid).collect();
        assert_eq!(pids, vec![22]);
        assert_eq!((at.unseen_range_candidates, at.incomplete), (0, false));

        // A cut at 9 (offsets 6..9 never seen): the open one, then the
        // transactional producer and the claimed one from where the state
        // lost sight; never the idempotent producer.
        let at = s.open_at(9);
        let got = aborts_at(&at);
        assert_eq!(got, vec![(22, 0, 4, -1), (21, 1, 6, 5), (23, 0, 6, -1)]);
        assert_eq!(
            (
                at.unseen_range_candidates,
                at.unseen_range_truncated,
                at.incomplete
            ),
            (2, false, false)
        );
    }

    #[test]
    fn unseen_range_aborts_are_bounded_and_the_rest_reported_incomplete() {
        let mut s = PartitionState::new(key());
        let o = origin(1);
        see(&mut s, &o, BatchObservation::data(1, 0, 0, 0, 1, false));
        for pid in 0..(MAX_UNSEEN_RANGE_ABORTS as i64 + 3) {
            s.claim(1000 + pid, origin(pid), 0);
        }
        let at = s.open_at(50);
        assert_eq!(at.transactions.len(), MAX_UNSEEN_RANGE_ABORTS);
        assert_eq!(at.unseen_range_candidates, MAX_UNSEEN_RANGE_ABORTS + 3);
        assert!(at.unseen_range_truncated && at.incomplete);
        // The same ones every time (a rebuilt plan is the same plan).
        assert_eq!(at.transactions, s.open_at(50).transactions);
        assert_eq!(at.transactions[0].txn.mapped_pid, 1000);
    }

    #[test]
    fn transactions_are_taken_open_at_the_cut_when_the_state_is_ahead() {
        let mut s = PartitionState::new(key());
        let mut sink = Vec::new();
        let o = origin(1);
        // pid 9: txn at 0..=1, committed at 12 (past the cut 10);
        // pid 8: txn at 2, committed at 5 (below the cut);
        // pid 7: txn at 11 (opened past the cut), still open;
        // pid 6: txn at 3, still open.
        s.observe(
            &o,
            &BatchObservation::data(9, 2, 0, 0, 2, true),
            0,
            &mut sink,
        );
        s.observe(
            &o,
            &BatchObservation::data(8, 0, 2, 0, 1, true),
            0,
            &mut sink,
        );
        s.observe(
            &o,
            &BatchObservation::data(6, 0, 3, 0, 1, true),
            0,
            &mut sink,
        );
        s.note_fetcher_position(4, NONE);
        s.observe(
            &o,
            &BatchObservation::marker(8, 0, 5, true, 3),
            0,
            &mut sink,
        );
        s.note_fetcher_position(10, NONE);
        s.observe(
            &o,
            &BatchObservation::data(7, 0, 11, 0, 1, true),
            0,
            &mut sink,
        );
        s.observe(
            &o,
            &BatchObservation::marker(9, 3, 12, false, 4),
            0,
            &mut sink,
        );
        assert!(sink.is_empty(), "{sink:?}");
        assert_eq!(s.next_offset(), 13);
        // Only the closing past the fetcher's position is remembered.
        assert_eq!(
            s.closed_transactions()
                .map(|c| c.marker_offset)
                .collect::<Vec<_>>(),
            vec![12]
        );
        let at = s.open_at(10);
        let got = aborts_at(&at);
        // pid 9 with the epoch and coordinator epoch of before its marker.
        assert_eq!(got, vec![(9, 2, 0, -1), (6, 0, 3, -1)]);
        assert_eq!((at.closed_past_cut, at.incomplete), (1, false));
        // A cut past the marker: pid 9 is closed there, pid 7 is open.
        let at = s.open_at(13);
        let pids: Vec<i64> = at.transactions.iter().map(|t| t.txn.mapped_pid).collect();
        assert_eq!(pids, vec![6, 7]);
        // The fetcher appends the marker: forgotten.
        s.note_fetcher_position(13, NONE);
        assert_eq!(s.closed_transactions().count(), 0);
    }

    #[test]
    fn closings_past_the_bound_are_dropped_and_reported() {
        let mut s = PartitionState::new(key());
        let o = origin(1);
        let n = MAX_CLOSED_TRANSACTIONS as i64 + 2;
        close_transactions(&mut s, &o, 0..n);
        assert_eq!(s.closed_transactions().count(), MAX_CLOSED_TRANSACTIONS);
        // The two oldest closings (markers 1 and 3) are gone: a cut at or
        // below marker 3 is reported incomplete (pid 100 or 101 was open
        // there and is missing), one above it is not.
        let at = s.open_at(1);
        assert!(at.incomplete && at.transactions.is_empty(), "{at:?}");
        let at = s.open_at(3);
        assert!(at.incomplete && at.transactions.is_empty(), "{at:?}");
        let at = s.open_at(5);
        assert!(!at.incomplete);
        assert_eq!(
            at.transactions
                .iter()
                .map(|t| t.txn.mapped_pid)
                .collect::<Vec<_>>(),
            vec![102]
        );
        s.note_fetcher_position(2 * n, NONE);
        assert_eq!(s.closed_transactions().count(), 0);
        assert!(!s.open_at(2 * n).incomplete);
    }

    #[test]
    fn a_fetcher_position_moving_back_reports_the_forgotten_closings() {
        let mut s = PartitionState::new(key());
        let o = origin(1);
        see(&mut s, &o, BatchObservation::data(9, 0, 0, 0, 1, true));
        see(&mut s, &o, BatchObservation::marker(9, 0, 5, true, 0));
        s.note_fetcher_position(6, NONE);
        assert!(!s.open_at(6).incomplete);
        // The destination truncated to 3: the closing at 5 was forgotten;
        // pid 9 is open at 3 and a cut there must not pass silently.
        s.note_fetcher_position(3, NONE);
        let at = s.open_at(3);
        assert!(
            at.incomplete || at.transactions.iter().any(|t| t.txn.mapped_pid == 9),
            "{at:?}"
        );
        // Past the old position nothing is missing.
        s.note_fetcher_position(6, NONE);
        assert!(!s.open_at(6).incomplete);
    }

    #[test]
    fn a_restored_state_ahead_of_the_fetcher_reports_closings_it_cannot_know() {
        let mut s = PartitionState::new(key());
        let mut sink = Vec::new();
        let o = origin(1);
        s.observe(
            &o,
            &BatchObservation::data(9, 0, 0, 0, 1, true),
            0,
            &mut sink,
        );
        s.note_fetcher_position(1, NONE);
        s.observe(
            &o,
            &BatchObservation::marker(9, 0, 5, true, 0),
            0,
            &mut sink,
        );
        // Snapshot taken ahead of the fetcher (next offset 6, fetcher at 1).
        let snap = s.snapshot();
        let mut without = snap.clone();
        without.closings = None;
        for (snap, kept) in [(snap, true), (without, false)] {
            let mut r = PartitionState::restore(&snap).unwrap();
            // The fetcher re-fetches from 1: the marker at 5 is a replay.
            r.note_fetcher_position(1, NONE);
            assert_eq!(
                r.observe(
                    &o,
                    &BatchObservation::marker(9, 0, 5, true, 0),
                    0,
                    &mut sink
                ),
                ObserveOutcome::Replayed
            );
            let at = r.open_at(1);
            let pids: Vec<i64> = at.transactions.iter().map(|t| t.txn.mapped_pid).collect();
            if kept {
                // The closing came back with the snapshot: pid 9 is open at 1.
                assert!(!at.incomplete && pids == [9], "{at:?}");
            } else {
                // Without it, the cut is reported.
                assert!(at.incomplete, "{at:?}");
            }
            // A fetcher at or past the snapshot's offset misses nothing.
            let mut r = PartitionState::restore(&snap).unwrap();
            r.note_fetcher_position(6, NONE);
            assert!(!r.open_at(6).incomplete);
        }
    }

    #[test]
    fn closings_keep_a_small_buffer_when_emptied() {
        let mut s = PartitionState::new(key());
        let o = origin(1);
        close_transactions(&mut s, &o, 0..200);
        assert!(s.closed.capacity() > CLOSED_KEPT_CAPACITY);
        s.note_fetcher_position(400, NONE);
        let cap = s.closed.capacity();
        assert!(
            (CLOSED_KEPT_CAPACITY..=2 * CLOSED_KEPT_CAPACITY).contains(&cap),
            "{cap}"
        );
        s.note_fetcher_position(400, NONE);
        assert_eq!(s.closed.capacity(), cap);
    }

    #[test]
    fn a_lookup_copy_has_the_producers_but_not_the_closings() {
        let mut s = PartitionState::new(key());
        let mut sink = Vec::new();
        let o = origin(1);
        s.observe(
            &o,
            &BatchObservation::data(9, 0, 0, 0, 1, true),
            0,
            &mut sink,
        );
        s.observe(
            &o,
            &BatchObservation::marker(9, 0, 1, true, 0),
            0,
            &mut sink,
        );
        assert_eq!(s.closed_transactions().count(), 1);
        let c = s.clone_for_lookup();
        assert_eq!(c.closed_transactions().count(), 0);
        assert_eq!(c.producer(9), s.producer(9));
        assert_eq!(c.next_offset(), s.next_offset());
    }

    /// Issue 17: txn T (pid 9) begins at 10 and its COMMIT marker is at 15;
    /// the fetcher appends past it (positions 16, 20) and the cut is taken
    /// at 20, where T is closed. Returns the state and the origin.
    fn committed_below_the_cut() -> (PartitionState, Origin) {
        let mut s = PartitionState::new(key());
        let mut sink = Vec::new();
        let o = origin(1);
        let r = ClosingsRetention::default();
        s.observe(
            &o,
            &BatchObservation::data(5, 0, 0, 0, 10, false),
            0,
            &mut sink,
        );
        s.observe(
            &o,
            &BatchObservation::data(9, 3, 10, 0, 5, true),
            0,
            &mut sink,
        );
        s.note_fetcher_position(12, r);
        s.observe(
            &o,
            &BatchObservation::marker(9, 3, 15, true, 7),
            0,
            &mut sink,
        );
        s.note_fetcher_position(16, r);
        s.observe(
            &o,
            &BatchObservation::data(5, 0, 16, 10, 4, false),
            0,
            &mut sink,
        );
        s.note_fetcher_position(20, r);
        assert!(sink.is_empty(), "{sink:?}");
        let at = s.open_at(20);
        assert!(at.transactions.is_empty() && !at.incomplete, "{at:?}");
        (s, o)
    }

    fn pids(at: &OpenAtCut) -> Vec<i64> {
        at.transactions.iter().map(|t| t.txn.mapped_pid).collect()
    }

    #[test]
    fn a_seal_planned_again_below_a_lost_marker_aborts_its_transaction() {
        let (mut s, _) = committed_below_the_cut();
        // The marker at 15 is below the fetcher's position but kept: the
        // destination leader may not have replicated it.
        assert_eq!(
            s.closed_transactions()
                .map(|c| c.marker_offset)
                .collect::<Vec<_>>(),
            vec![15]
        );
        // Leadership moves; the new leader truncated to 12 and fetches there.
        s.note_fetcher_position(12, ClosingsRetention::default());
        let at = s.open_at(12);
        assert!(!at.incomplete, "{at:?}");
        assert_eq!(at.closed_past_cut, 1);
        let t = at.transactions[0];
        assert_eq!(
            (
                pids(&at),
                t.txn.epoch,
                t.txn.first_offset,
                t.coordinator_epoch
            ),
            (vec![9], 3, 10, -1)
        );
        // At 10 T had not begun; at 16 it was closed.
        assert!(s.open_at(10).transactions.is_empty());
        assert!(s.open_at(16).transactions.is_empty());
    }

    #[test]
    fn closings_further_below_the_position_than_kept_are_reported() {
        // By offsets: kept 10 below the position.
        let (mut s, _) = committed_below_the_cut();
        let r = ClosingsRetention {
            offsets: 10,
            max: 1024,
        };
        s.note_fetcher_position(25, r);
        assert_eq!(s.closed_transactions().count(), 1);
        s.note_fetcher_position(26, r);
        assert_eq!(s.closed_transactions().count(), 0);
        // A destination that truncated to 12 finds it reported, not missing
        // silently; a cut past the forgotten marker is complete.
        s.note_fetcher_position(12, r);
        assert!(s.open_at(12).incomplete);
        assert!(s.open_at(15).incomplete);
        assert!(!s.open_at(16).incomplete);

        // By count: of three closings below the position, two are kept.
        let mut s = PartitionState::new(key());
        let o = origin(1);
        close_transactions(&mut s, &o, 0..3);
        let r = ClosingsRetention {
            offsets: 1000,
            max: 2,
        };
        s.note_fetcher_position(10, r);
        assert_eq!(
            s.closed_transactions()
                .map(|c| c.marker_offset)
                .collect::<Vec<_>>(),
            vec![3, 5]
        );
        s.note_fetcher_position(2, r);
        let at = s.open_at(3);
        assert!(!at.incomplete && pids(&at) == [101], "{at:?}");
        let at = s.open_at(1);
        assert!(at.incomplete, "{at:?}");
        // Closings at or above the position are never pruned by count.
        let mut s = PartitionState::new(key());
        close_transactions(&mut s, &o, 0..3);
        s.note_fetcher_position(0, r);
        assert_eq!(s.closed_transactions().count(), 3);
        assert!(!s.open_at(0).incomplete);
        // Nor do closings past the position push those below it out: two
        // below (at 1 and 3) stay kept with max 2, whatever lies past 4.
        s.note_fetcher_position(4, r);
        assert_eq!(
            s.closed_transactions()
                .map(|c| c.marker_offset)
                .collect::<Vec<_>>(),
            vec![1, 3, 5]
        );
        assert!(!s.open_at(0).incomplete);
    }

    #[test]
    fn closings_kept_below_the_position_survive_a_restore() {
        let (s, o) = committed_below_the_cut();
        let snap = s.snapshot();
        let c = snap.closings.as_ref().unwrap();
        assert_eq!((c.kept_from, c.dropped_upto, c.closed.len()), (0, -1, 1));
        // A restarted instance, or one taking the partition over, plans the
        // seal again at 12 exactly.
        let mut r = PartitionState::restore(&snap).unwrap();
        let mut sink = Vec::new();
        r.note_fetcher_position(12, ClosingsRetention::default());
        assert_eq!(
            r.observe(
                &o,
                &BatchObservation::marker(9, 3, 15, true, 7),
                0,
                &mut sink
            ),
            ObserveOutcome::Replayed
        );
        let at = r.open_at(12);
        assert!(!at.incomplete && pids(&at) == [9], "{at:?}");

        // The seal's own snapshot (the transactions open at the cut, at
        // offset 20) keeps the closings below the cut: restored from it, the
        // seal is planned again at 12 exactly too.
        let seal = PartitionSnapshot {
            next_offset: 20,
            producers: Vec::new(),
            closings: s.closings_at_cut(20),
            ..s.snapshot()
        };
        let mut r = PartitionState::restore(&seal).unwrap();
        r.note_fetcher_position(12, ClosingsRetention::default());
        let at = r.open_at(12);
        assert!(!at.incomplete && pids(&at) == [9], "{at:?}");
        // Only what lies below the cut, and nothing from a state that has
        // not seen up to it.
        assert!(s.closings_at_cut(15).unwrap().closed.is_empty());
        assert!(s.closings_at_cut(21).is_none());

        // What was forgotten stays reported through a restore.
        let mut s = s;
        let tight = ClosingsRetention {
            offsets: 10,
            max: 1024,
        };
        s.note_fetcher_position(30, tight);
        let snap = s.snapshot();
        let c = snap.closings.as_ref().unwrap();
        // As an older reader reads it: kept from 16, missing below 16.
        assert_eq!((c.kept_from, c.dropped_upto, c.closed.len()), (16, 15, 0));
        let r = PartitionState::restore(&snap).unwrap();
        assert!(r.open_at(12).incomplete);
        assert!(!r.open_at(16).incomplete);

        // A record written before issue 17: closings kept from the fetcher's
        // position only, so a cut below it is reported.
        let old = PartitionSnapshot {
            closings: Some(ClosingsSnapshot {
                kept_from: 20,
                dropped_upto: -1,
                closed: Vec::new(),
            }),
            ..s.snapshot()
        };
        let r = PartitionState::restore(&old).unwrap();
        assert!(r.open_at(12).incomplete);
        assert!(!r.open_at(20).incomplete);
    }

    #[test]
    fn noting_the_position_does_not_allocate_in_steady_state() {
        let mut s = PartitionState::new(key());
        let o = origin(1);
        let r = ClosingsRetention {
            offsets: 100,
            max: 1024,
        };
        let mut caps = Vec::new();
        for i in 0..2000i64 {
            see(
                &mut s,
                &o,
                BatchObservation::data(100 + (i % 10), 0, 2 * i, 0, 1, true),
            );
            see(
                &mut s,
                &o,
                BatchObservation::marker(100 + (i % 10), 0, 2 * i + 1, true, 0),
            );
            s.note_fetcher_position(2 * i + 2, r);
            if i >= 1000 {
                caps.push(s.closed.capacity());
            }
        }
        // 50 markers in the window; the buffer settles and stays.
        assert_eq!(s.closed_transactions().count(), 50);
        assert!(caps.windows(2).all(|w| w[0] == w[1]), "{:?}", &caps[..5]);
    }

    /// A state of partition `p` sharing `budget`, with a transaction of pid
    /// 100 + i begun at 2i and closed at 2i + 1 for each i in `markers`.
    fn budgeted(
        p: i32,
        budget: &Arc<ClosingsBudget>,
        markers: std::ops::Range<i64>,
    ) -> PartitionState {
        let mut s = PartitionState::new(PartitionKey::new([7; 16], "t", p));
        s.share_closings_budget(Arc::clone(budget));
        let o = origin(1);
        close_transactions(&mut s, &o, markers);
        s
    }

    fn markers(s: &PartitionState) -> Vec<i64> {
        s.closed_transactions().map(|c| c.marker_offset).collect()
    }

    #[test]
    fn the_partition_passing_the_shared_budget_drops_its_own_oldest_below_its_position() {
        let budget = Arc::new(ClosingsBudget::new(3));
        let r = ClosingsRetention::default();
        // a: markers 1 and 3, both below its position: 2 of 3 counted.
        let mut a = budgeted(0, &budget, 0..2);
        a.note_fetcher_position(4, r);
        assert_eq!((budget.retained(), budget.dropped()), (2, 0));
        // b: markers 1, 3, 5, past its position (0): not counted, never
        // dropped, however full the budget.
        let mut b = budgeted(1, &budget, 0..3);
        assert_eq!((budget.retained(), markers(&b).len()), (2, 3));
        // b's position passes them: 5 would be retained, b drops its two
        // oldest and reports a cut below them incomplete; a keeps its own.
        b.note_fetcher_position(6, r);
        assert_eq!(markers(&b), vec![5]);
        assert_eq!((budget.retained(), budget.dropped()), (3, 2));
        assert!(b.open_at(3).incomplete);
        assert!(!b.open_at(4).incomplete);
        assert_eq!(markers(&a), vec![1, 3]);
        assert!(!a.open_at(0).incomplete);
        // More closings past b's position (7, 9) are kept with a full budget.
        let o = origin(1);
        close_transactions(&mut b, &o, 3..5);
        assert_eq!(markers(&b), vec![5, 7, 9]);
        assert_eq!(budget.retained(), 3);
        // Once 7 is below the position, 5 goes; 9, past it, stays.
        b.note_fetcher_position(8, r);
        assert_eq!(markers(&b), vec![7, 9]);
        assert_eq!((budget.retained(), budget.dropped()), (3, 3));
        assert!(b.open_at(5).incomplete && !b.open_at(6).incomplete);
        // A seal at 9 still sees pid 104 (begun at 8) open: closed at 9.
        assert_eq!(pids(&b.open_at(9)), vec![104]);
        // A position moving back gives the count back; forgetting too.
        b.note_fetcher_position(0, r);
        assert_eq!(budget.retained(), 2);
        a.forget_closed();
        assert_eq!(budget.retained(), 0);
        a.note_fetcher_position(8, r);
        b.note_fetcher_position(8, r);
        assert_eq!(budget.retained(), 1);
        drop(b);
        drop(a);
        assert_eq!(budget.retained(), 0);
    }

    #[test]
    fn a_restored_state_counts_in_the_budget_and_a_copy_does_not() {
        let budget = Arc::new(ClosingsBudget::new(100));
        let r = ClosingsRetention::default();
        let mut s = budgeted(0, &budget, 0..3);
        s.note_fetcher_position(6, r);
        assert_eq!(budget.retained(), 3);
        let lookup = s.clone_for_lookup();
        let copy = s.clone();
        assert_eq!(markers(&copy), vec![1, 3, 5]);
        drop((lookup, copy));
        assert_eq!(budget.retained(), 3);
        let snap = s.snapshot();
        drop(s);
        assert_eq!(budget.retained(), 0);
        // Restored, its closings lie at or past the position it restores
        // (the lowest it can vouch for): counted once the fetcher passes.
        let mut restored = PartitionState::restore(&snap).unwrap();
        restored.share_closings_budget(Arc::clone(&budget));
        assert_eq!((budget.retained(), markers(&restored).len()), (0, 3));
        restored.note_fetcher_position(6, r);
        assert_eq!((budget.retained(), markers(&restored).len()), (3, 3));
        // A restored state in a full budget drops its oldest, reported.
        let small = Arc::new(ClosingsBudget::new(1));
        let mut again = PartitionState::restore(&snap).unwrap();
        again.share_closings_budget(Arc::clone(&small));
        again.note_fetcher_position(6, r);
        assert_eq!(markers(&again), vec![5]);
        assert_eq!((small.retained(), small.dropped()), (1, 2));
        assert!(again.open_at(3).incomplete && !again.open_at(4).incomplete);
        // Moving to another budget leaves the first.
        again.share_closings_budget(Arc::clone(&budget));
        assert_eq!((small.retained(), budget.retained()), (0, 4));
        drop((restored, again));
        assert_eq!(budget.retained(), 0);
    }
}
