//! Anomalies: batches that would silently corrupt a stock destination's
//! producer state, and the bounded log the admin API serves.

use std::collections::VecDeque;
use std::fmt;

use serde::Serialize;

use super::{Origin, PartitionKey};

/// The kind of an anomaly; [`AnomalyKind::as_str`] is the stable metric
/// label (`mirrorguard_producer_anomalies_total{kind=...}`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AnomalyKind {
    /// Same epoch, the first sequence is ahead of the expected one (or an
    /// epoch bump that does not start at sequence 0).
    SequenceGap,
    /// Same epoch, the first sequence is at or before the last one seen
    /// (duplicate or overlapping batch).
    SequenceOverlap,
    /// The producer epoch went backwards.
    EpochRegression,
    /// A COMMIT/ABORT marker closes a transaction opened by another origin.
    MarkerForeignOrigin,
    /// A COMMIT/ABORT marker for a PID with no open transaction.
    MarkerWithoutTransaction,
    /// One mapped PID used by two origins.
    PidClaimedByTwoOrigins,
    /// A non-transactional batch for a PID whose transaction is open: a
    /// stock follower throws `InvalidTxnStateException` and fails the
    /// partition.
    NonTransactionalInOpenTransaction,
    /// A control batch of a type other than COMMIT/ABORT/MIRROR_PID_RESET
    /// that carries a PID: a stock follower throws and fails the partition.
    UnknownControlType,
}

impl AnomalyKind {
    /// All kinds, for pre-registering metric label values.
    pub const ALL: [AnomalyKind; 8] = [
        AnomalyKind::SequenceGap,
        AnomalyKind::SequenceOverlap,
        AnomalyKind::EpochRegression,
        AnomalyKind::MarkerForeignOrigin,
        AnomalyKind::MarkerWithoutTransaction,
        AnomalyKind::PidClaimedByTwoOrigins,
        AnomalyKind::NonTransactionalInOpenTransaction,
        AnomalyKind::UnknownControlType,
    ];

    /// Stable snake_case label; never change an existing value.
    pub const fn as_str(self) -> &'static str {
        match self {
            AnomalyKind::SequenceGap => "sequence_gap",
            AnomalyKind::SequenceOverlap => "sequence_overlap",
            AnomalyKind::EpochRegression => "epoch_regression",
            AnomalyKind::MarkerForeignOrigin => "marker_foreign_origin",
            AnomalyKind::MarkerWithoutTransaction => "marker_without_transaction",
            AnomalyKind::PidClaimedByTwoOrigins => "pid_claimed_by_two_origins",
            AnomalyKind::NonTransactionalInOpenTransaction => {
                "non_transactional_in_open_transaction"
            }
            AnomalyKind::UnknownControlType => "unknown_control_type",
        }
    }
}

impl fmt::Display for AnomalyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Kind-specific facts of an anomaly.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AnomalyDetail {
    /// See [`AnomalyKind::SequenceGap`].
    SequenceGap {
        /// The batch's (and stored) epoch.
        epoch: i16,
        /// The sequence Kafka would expect next.
        expected_sequence: i32,
        /// The batch's first sequence.
        base_sequence: i32,
        /// Offset of the producer's previous data batch.
        previous_offset: i64,
    },
    /// See [`AnomalyKind::SequenceOverlap`].
    SequenceOverlap {
        /// The batch's (and stored) epoch.
        epoch: i16,
        /// The last sequence already seen.
        last_sequence: i32,
        /// The batch's first sequence.
        base_sequence: i32,
        /// The batch's last sequence.
        batch_last_sequence: i32,
        /// Offset of the producer's previous data batch.
        previous_offset: i64,
    },
    /// See [`AnomalyKind::EpochRegression`].
    EpochRegression {
        /// Epoch stored before this batch.
        stored_epoch: i16,
        /// The batch's (lower) epoch.
        batch_epoch: i16,
    },
    /// See [`AnomalyKind::MarkerForeignOrigin`].
    MarkerForeignOrigin {
        /// COMMIT (true) or ABORT (false).
        commit: bool,
        /// The origin that opened the transaction.
        transaction_origin: Origin,
        /// First offset of the transaction the marker closes.
        transaction_first_offset: i64,
    },
    /// See [`AnomalyKind::MarkerWithoutTransaction`].
    MarkerWithoutTransaction {
        /// COMMIT (true) or ABORT (false).
        commit: bool,
        /// Whether the PID was tracked at all (false right after start-up,
        /// expiry or a barrier, where the data may predate our state).
        known_producer: bool,
    },
    /// See [`AnomalyKind::PidClaimedByTwoOrigins`].
    PidClaimedByTwoOrigins {
        /// The origin that held the mapped PID.
        holder: Origin,
    },
    /// See [`AnomalyKind::NonTransactionalInOpenTransaction`].
    NonTransactionalInOpenTransaction {
        /// First offset of the open transaction.
        transaction_first_offset: i64,
    },
    /// See [`AnomalyKind::UnknownControlType`].
    UnknownControlType {
        /// The control record type.
        control_type: i16,
    },
}

/// One anomalous batch: where, which producer, and what is wrong.
///
/// Display gives the WARN line: partition, mapped PID, origin(s), offsets.
#[derive(Clone, PartialEq, Eq, Debug, Serialize)]
pub struct Anomaly {
    /// The destination partition.
    pub partition: PartitionKey,
    /// The batch's base offset.
    pub offset: i64,
    /// The batch's last offset.
    pub last_offset: i64,
    /// The PID as it leaves the proxy.
    pub mapped_pid: i64,
    /// The batch's origin.
    pub origin: Origin,
    /// What is wrong.
    pub detail: AnomalyDetail,
}

impl Anomaly {
    /// The kind, for the metric label.
    pub fn kind(&self) -> AnomalyKind {
        match self.detail {
            AnomalyDetail::SequenceGap { .. } => AnomalyKind::SequenceGap,
            AnomalyDetail::SequenceOverlap { .. } => AnomalyKind::SequenceOverlap,
            AnomalyDetail::EpochRegression { .. } => AnomalyKind::EpochRegression,
            AnomalyDetail::MarkerForeignOrigin { .. } => AnomalyKind::MarkerForeignOrigin,
            AnomalyDetail::MarkerWithoutTransaction { .. } => AnomalyKind::MarkerWithoutTransaction,
            AnomalyDetail::PidClaimedByTwoOrigins { .. } => AnomalyKind::PidClaimedByTwoOrigins,
            AnomalyDetail::NonTransactionalInOpenTransaction { .. } => {
                AnomalyKind::NonTransactionalInOpenTransaction
            }
            AnomalyDetail::UnknownControlType { .. } => AnomalyKind::UnknownControlType,
        }
    }
}

fn marker_name(commit: bool) -> &'static str {
    if commit {
        "COMMIT"
    } else {
        "ABORT"
    }
}

impl fmt::Display for Anomaly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} in {} at offsets {}..={}: mapped pid {} from origin {}: ",
            self.kind(),
            self.partition,
            self.offset,
            self.last_offset,
            self.mapped_pid,
            self.origin
        )?;
        match self.detail {
            AnomalyDetail::SequenceGap {
                epoch,
                expected_sequence,
                base_sequence,
                previous_offset,
            } => write!(
                f,
                "epoch {epoch} expected sequence {expected_sequence} but got {base_sequence} \
                 (previous batch at offset {previous_offset})"
            ),
            AnomalyDetail::SequenceOverlap {
                epoch,
                last_sequence,
                base_sequence,
                batch_last_sequence,
                previous_offset,
            } => write!(
                f,
                "epoch {epoch} sequences {base_sequence}..={batch_last_sequence} overlap the last \
                 sequence {last_sequence} (previous batch at offset {previous_offset})"
            ),
            AnomalyDetail::EpochRegression {
                stored_epoch,
                batch_epoch,
            } => write!(
                f,
                "epoch {batch_epoch} is smaller than the last seen epoch {stored_epoch}"
            ),
            AnomalyDetail::MarkerForeignOrigin {
                commit,
                transaction_origin,
                transaction_first_offset,
            } => write!(
                f,
                "{} marker closes the transaction opened at offset {transaction_first_offset} \
                 by origin {transaction_origin}",
                marker_name(commit)
            ),
            AnomalyDetail::MarkerWithoutTransaction {
                commit,
                known_producer,
            } => write!(
                f,
                "{} marker with no open transaction ({})",
                marker_name(commit),
                if known_producer {
                    "producer known"
                } else {
                    "producer not tracked"
                }
            ),
            AnomalyDetail::PidClaimedByTwoOrigins { holder } => {
                write!(f, "the mapped pid is held by origin {holder}")
            }
            AnomalyDetail::NonTransactionalInOpenTransaction {
                transaction_first_offset,
            } => write!(
                f,
                "non-transactional batch while the transaction opened at offset \
                 {transaction_first_offset} is open"
            ),
            AnomalyDetail::UnknownControlType { control_type } => {
                write!(
                    f,
                    "control type {control_type} on a batch with a producer id"
                )
            }
        }
    }
}

/// An anomaly with the wall-clock time it was recorded.
#[derive(Clone, Debug, Serialize)]
pub struct AnomalyRecord {
    /// Wall-clock milliseconds since the epoch.
    pub at_ms: i64,
    /// Stable kind label.
    pub kind: AnomalyKind,
    /// The human-readable line (same as the WARN log).
    pub message: String,
    /// The structured anomaly.
    pub anomaly: Anomaly,
}

/// Bounded ring buffer of the most recent anomalies (admin API
/// `GET /v1/anomalies`). Old records are dropped first; counts survive.
#[derive(Clone, Debug, Serialize)]
pub struct AnomalyLog {
    capacity: usize,
    total_recorded: u64,
    records: VecDeque<AnomalyRecord>,
}

impl AnomalyLog {
    /// Default number of records kept.
    pub const DEFAULT_CAPACITY: usize = 1000;

    /// A log keeping the last `capacity` records (at least 1).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            total_recorded: 0,
            records: VecDeque::new(),
        }
    }

    /// Records one anomaly.
    pub fn record(&mut self, at_ms: i64, anomaly: Anomaly) {
        if self.records.len() >= self.capacity {
            self.records.pop_front();
        }
        self.total_recorded = self.total_recorded.saturating_add(1);
        self.records.push_back(AnomalyRecord {
            at_ms,
            kind: anomaly.kind(),
            message: anomaly.to_string(),
            anomaly,
        });
    }

    /// The records kept, oldest first.
    pub fn records(&self) -> impl ExactSizeIterator<Item = &AnomalyRecord> {
        self.records.iter()
    }

    /// Number of records kept.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// True when nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Anomalies recorded since creation, including those dropped.
    pub fn total_recorded(&self) -> u64 {
        self.total_recorded
    }

    /// The configured capacity.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

impl Default for AnomalyLog {
    fn default() -> Self {
        Self::new(Self::DEFAULT_CAPACITY)
    }
}
