//! [`StateStore`]: mirrorguard's own minimal Kafka client for the compacted
//! `__mirror_state` topic.
//!
//! Design:
//! - One actor task owns the connection to the partition leader, the
//!   idempotent producer id/epoch and the sequence number. [`StateStore`]
//!   handles send commands over an mpsc channel and await a oneshot reply, so
//!   no lock is ever held across `.await` and appends are naturally
//!   serialised (one batch in flight, which keeps idempotent sequencing
//!   trivially correct).
//! - The topic has exactly one partition: one total order is what "for one
//!   key the record at the lowest offset wins" needs.
//! - Any transport failure drops the connection; the next attempt goes back
//!   to the bootstrap servers (metadata, leader, versions). An append is
//!   retried with the *same* sequence number, so the broker's idempotence
//!   de-duplicates a batch that was written but whose acknowledgement was
//!   lost. Sequence/producer errors re-initialise the producer id.
//! - The byte stream is abstracted by [`Connector`], so TLS can be slotted in
//!   later without touching the protocol code.
//!
//! This file holds the handle and its configuration; the actor's set-up is
//! in `actor.rs`, its appends and reads in `log.rs`, the errors in
//! `error.rs`, the requests and responses in `proto.rs`, all connections go
//! through [`crate::kafka_client`].

use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use tokio::time::sleep;

use super::actor::{Actor, Retry};
use super::error::{Result, StateStoreError};
pub use crate::kafka_client::{Connector, TcpConnector};

/// Default topic name.
pub const DEFAULT_TOPIC: &str = "__mirror_state";
/// Client id sent in request headers.
pub(super) const CLIENT_ID: &str = "mirrorguard-state-store";
/// Largest response frame accepted from the state cluster.
pub(super) const MAX_FRAME: usize = 128 << 20;
/// Initial and largest per-partition fetch size.
pub(super) const FETCH_BYTES: i32 = 1 << 20;
pub(super) const MAX_FETCH_BYTES: i32 = 64 << 20;
/// Fetch size of a bounded read ([`StateStore::read_range`]): about one
/// snapshot record; a larger first batch is still returned whole.
pub(super) const RANGE_FETCH_BYTES: i32 = 64 << 10;
/// First and largest retry backoff.
pub(super) const BACKOFF_MIN: Duration = Duration::from_millis(50);
pub(super) const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Commands queued towards the actor before callers wait for room.
const QUEUE: usize = 1024;

/// Configuration of a [`StateStore`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateStoreConfig {
    /// Bootstrap servers of the state cluster, `host:port`.
    pub bootstrap: Vec<String>,
    /// Topic name (default `__mirror_state`).
    pub topic: String,
    /// Replication factor when creating the topic; -1 = broker default.
    pub replication_factor: i16,
    /// TCP connect timeout per attempt.
    pub connect_timeout: Duration,
    /// Per-request timeout, and the total time an operation is retried.
    pub request_timeout: Duration,
}

impl StateStoreConfig {
    /// A config with the defaults: topic `__mirror_state`, broker-default
    /// replication, 5 s connect timeout, 30 s request timeout.
    pub fn new(bootstrap: Vec<String>) -> Self {
        Self {
            bootstrap,
            topic: DEFAULT_TOPIC.to_owned(),
            replication_factor: -1,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
        }
    }
}

/// One record read back from the topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRecord {
    /// Offset in the (single) partition.
    pub offset: i64,
    /// Record timestamp (ms).
    pub timestamp: i64,
    /// Key bytes (decode with [`super::schema::decode`]).
    pub key: Bytes,
    /// Value bytes; `None` is a tombstone.
    pub value: Option<Bytes>,
}

impl StoredRecord {
    /// The record with its own copy of key and value: a record read is a
    /// slice of its whole fetch response and keeps all of it alive.
    pub fn detached(&self) -> StoredRecord {
        StoredRecord {
            offset: self.offset,
            timestamp: self.timestamp,
            key: Bytes::copy_from_slice(&self.key),
            value: self.value.as_deref().map(Bytes::copy_from_slice),
        }
    }
}

/// Handle to the state store. Cheap to clone; the connection lives in a
/// background task that ends when the last handle is dropped.
#[derive(Debug, Clone)]
pub struct StateStore {
    tx: mpsc::Sender<Command>,
    topic: String,
    report: StateClusterReport,
}

pub(super) enum Command {
    Append {
        key: Vec<u8>,
        value: Option<Vec<u8>>,
        reply: oneshot::Sender<Result<i64>>,
    },
    /// Several records in one batch (one Produce request).
    AppendMany {
        records: Vec<(Vec<u8>, Option<Vec<u8>>)>,
        reply: oneshot::Sender<Result<i64>>,
    },
    Read {
        from: i64,
        /// Stop once the read passed this offset (exclusive; `i64::MAX`:
        /// read to the high watermark). Records at or past it are dropped.
        upto: i64,
        /// Hand back what was read once its keys and values pass this many
        /// bytes (`usize::MAX`: no bound), not complete, so the caller can
        /// apply it and read on.
        budget: usize,
        /// Records, next offset, and whether the read reached the high
        /// watermark.
        reply: oneshot::Sender<Result<(Vec<StoredRecord>, i64, bool)>>,
    },
}

/// A record to append: key and value (`None` = tombstone).
pub type KeyValue = (Vec<u8>, Option<Vec<u8>>);

/// Upper bound of one batch written by [`StateStore::append_many`]: far
/// below Kafka's default `message.max.bytes` (1 MiB + 12), so no default
/// broker refuses a state-topic batch as too large.
pub const MAX_APPEND_BYTES: usize = 256 * 1024;

/// Splits `records` into runs whose estimated batch size stays within
/// `limit` (each record costs its key and value plus a generous 24 bytes
/// of framing; a batch header is 61 bytes). A record above the limit on
/// its own gets a run of its own.
pub(super) fn chunk_records(records: Vec<KeyValue>, limit: usize) -> Vec<Vec<KeyValue>> {
    let mut out = Vec::new();
    let mut run = Vec::new();
    let mut size = 61;
    for r in records {
        let cost = r.0.len() + r.1.as_ref().map_or(0, Vec::len) + 24;
        if !run.is_empty() && size + cost > limit {
            out.push(std::mem::take(&mut run));
            size = 61;
        }
        size += cost;
        run.push(r);
    }
    if !run.is_empty() {
        out.push(run);
    }
    out
}

/// Rounds of [`StateStore::read_all`] in a row that may bring no record
/// before the read is declared stuck (each round is itself bounded by the
/// request timeout and retries inside it).
const READ_ALL_STALLED_ROUNDS: u32 = 3;

impl StateStore {
    /// Connects over plain TCP; see [`StateStore::open_with`].
    pub async fn open(cfg: StateStoreConfig) -> Result<StateStore> {
        Self::open_with(cfg, TcpConnector).await
    }

    /// Connects to the state cluster, creates the topic (one partition,
    /// `cleanup.policy=compact`) if it is missing, finds the partition leader
    /// and obtains an idempotent producer id. Fails if any of this does not
    /// succeed within the request timeout.
    pub async fn open_with<C: Connector>(
        cfg: StateStoreConfig,
        connector: C,
    ) -> Result<StateStore> {
        if cfg.bootstrap.is_empty() {
            return Err(StateStoreError::Config("no bootstrap servers".into()));
        }
        if cfg.topic.is_empty() {
            return Err(StateStoreError::Config("empty topic name".into()));
        }
        if cfg.replication_factor == 0 || cfg.replication_factor < -1 {
            return Err(StateStoreError::Config(format!(
                "replication factor {} (use -1 for the broker default)",
                cfg.replication_factor
            )));
        }
        let topic = cfg.topic.clone();
        let mut actor = Actor {
            cfg,
            connector,
            conn: None,
            producer: None,
            next_seq: 0,
            policy_checked: false,
            report: StateClusterReport::default(),
        };
        let mut retry = Retry::new(actor.cfg.request_timeout);
        loop {
            match actor.ensure_ready().await {
                Ok(()) => break,
                Err(e) => {
                    if !actor.backoff(&mut retry, &e).await {
                        return Err(e);
                    }
                }
            }
        }
        let report = actor.report.clone();
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(actor.run(rx));
        Ok(StateStore { tx, topic, report })
    }

    /// What opening the store learned about the state cluster.
    pub fn report(&self) -> &StateClusterReport {
        &self.report
    }

    /// The topic this store reads and writes.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Appends one record (one batch, acks=all, idempotent) and returns its
    /// offset once the state cluster has acknowledged it. `value` `None`
    /// writes a tombstone.
    pub async fn append(&self, key: Vec<u8>, value: Option<Vec<u8>>) -> Result<i64> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Command::Append { key, value, reply })
            .await
            .map_err(|_| StateStoreError::Closed)?;
        rx.await.map_err(|_| StateStoreError::Closed)?
    }

    /// Appends `records` in as few batches as fit `MAX_APPEND_BYTES` (256 KiB) each
    /// (one Produce request per batch, acks=all, idempotent) and returns
    /// the offset of the last one. A batch the broker refuses as too large
    /// (MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE: a `message.max.bytes` or
    /// topic `max.message.bytes` below the bound) is split in halves and
    /// sent again, so only a single record larger than the broker's limit
    /// fails, with [`StateStoreError::is_too_large`] true.
    pub async fn append_many(&self, records: Vec<KeyValue>) -> Result<i64> {
        Ok(self
            .append_many_at(records)
            .await?
            .last()
            .copied()
            .unwrap_or(-1))
    }

    /// [`append_many`](Self::append_many), returning the offset of each
    /// record in order (a batch's records take consecutive offsets ending at
    /// the one the broker acknowledges).
    pub async fn append_many_at(&self, records: Vec<KeyValue>) -> Result<Vec<i64>> {
        let mut offsets = Vec::with_capacity(records.len());
        let mut queue: std::collections::VecDeque<Vec<KeyValue>> =
            chunk_records(records, MAX_APPEND_BYTES).into();
        while let Some(chunk) = queue.pop_front() {
            let (reply, rx) = oneshot::channel();
            let n = chunk.len();
            // Kept to split again if the broker refuses the batch as too large.
            let copy = (n > 1).then(|| chunk.clone());
            self.tx
                .send(Command::AppendMany {
                    records: chunk,
                    reply,
                })
                .await
                .map_err(|_| StateStoreError::Closed)?;
            match rx.await.map_err(|_| StateStoreError::Closed)? {
                Ok(last) => offsets.extend((0..n as i64).map(|i| last - (n as i64 - 1) + i)),
                Err(e) if e.is_too_large() && copy.is_some() => {
                    let mut first = copy.unwrap_or_default();
                    let second = first.split_off(n / 2);
                    tracing::warn!(records = n, error = %e,
                        "state store: batch refused as too large by the state cluster; \
                         sending it again in two halves (check message.max.bytes / max.message.bytes)");
                    queue.push_front(second);
                    queue.push_front(first);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(offsets)
    }

    /// Reads every record from offset 0 up to the high watermark. A read
    /// that stops short of it (a slow or large topic, a stalled broker) goes
    /// on from where it stopped while it makes progress; one that cannot
    /// reach the end is an error, never a partial result that looks whole.
    pub async fn read_all(&self) -> Result<Vec<StoredRecord>> {
        let mut out = Vec::new();
        self.read_all_each(usize::MAX, |records| out.extend(records))
            .await?;
        Ok(out)
    }

    /// [`Self::read_all`] a piece at a time: `each` gets the records of one
    /// read of at most about `budget` bytes (at least one fetch), in offset
    /// order, and the read goes on once it returns. The start-up load
    /// applies each piece and drops it, so the whole topic is never held
    /// at once (1,000,000 producers' claims are ~100 MB of records).
    /// Returns the records read.
    pub async fn read_all_each(
        &self,
        budget: usize,
        mut each: impl FnMut(Vec<StoredRecord>),
    ) -> Result<usize> {
        let mut pos = 0;
        let mut stalled = 0;
        let mut read = 0;
        loop {
            let (records, next, complete) = self.read_checked(pos, budget).await?;
            read += records.len();
            each(records);
            if complete {
                return Ok(read);
            }
            if next > pos {
                stalled = 0;
            } else {
                stalled += 1;
                if stalled >= READ_ALL_STALLED_ROUNDS {
                    return Err(StateStoreError::Timeout(format!(
                        "reading the state topic stopped at offset {pos} before its high \
                         watermark ({stalled} rounds without progress); refusing to start from \
                         a partial read"
                    )));
                }
                sleep(BACKOFF_MIN).await;
            }
            pos = next;
        }
    }

    async fn read_checked(
        &self,
        offset: i64,
        budget: usize,
    ) -> Result<(Vec<StoredRecord>, i64, bool)> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Command::Read {
                from: offset,
                upto: i64::MAX,
                budget,
                reply,
            })
            .await
            .map_err(|_| StateStoreError::Closed)?;
        rx.await.map_err(|_| StateStoreError::Closed)?
    }

    /// Reads records from `offset` up to the current high watermark and
    /// returns them with the offset to read from next (for tailing: call
    /// again with it to see other instances' writes).
    pub async fn read_from(&self, offset: i64) -> Result<(Vec<StoredRecord>, i64)> {
        let (records, next, _) = self.read_checked(offset, usize::MAX).await?;
        Ok((records, next))
    }

    /// Reads the records at offsets `[from, upto)` (fewer when the topic
    /// ends first, or compaction removed some): one bounded read of a few
    /// known records (another instance's snapshot, re-read on a take-over)
    /// instead of the whole topic from `from`.
    pub async fn read_range(&self, from: i64, upto: i64) -> Result<Vec<StoredRecord>> {
        let mut out = Vec::new();
        let mut pos = from;
        while pos < upto {
            let (reply, rx) = oneshot::channel();
            self.tx
                .send(Command::Read {
                    from: pos,
                    upto,
                    budget: usize::MAX,
                    reply,
                })
                .await
                .map_err(|_| StateStoreError::Closed)?;
            let (records, next, complete) = rx.await.map_err(|_| StateStoreError::Closed)??;
            out.extend(records);
            if complete || next <= pos {
                break;
            }
            pos = next;
        }
        Ok(out)
    }
}

/// What opening the store learned about the state cluster and its topic,
/// for the start-up checks (`crate::state_store::checks`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StateClusterReport {
    /// The state cluster's id (Kafka base64 text), if its Metadata carried one.
    pub cluster_id: Option<String>,
    /// Brokers the state cluster's Metadata listed.
    pub brokers: usize,
    /// Replicas of the state topic's partition (its replication factor).
    pub replication_factor: usize,
    /// The topic's `min.insync.replicas`, when DescribeConfigs answered.
    pub min_insync_replicas: Option<i32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_are_chunked_below_the_bound() {
        // 20,000 claim-sized records (30-byte key, 35-byte value).
        let records: Vec<KeyValue> = (0..20_000)
            .map(|_| (vec![0u8; 30], Some(vec![0u8; 35])))
            .collect();
        let chunks = chunk_records(records, MAX_APPEND_BYTES);
        assert_eq!(chunks.iter().map(Vec::len).sum::<usize>(), 20_000);
        assert!(chunks.len() >= 6, "{} chunks", chunks.len());
        for c in &chunks {
            let size: usize = 61 + c.len() * (30 + 35 + 24);
            assert!(size <= MAX_APPEND_BYTES, "{size}");
        }
        // A record above the bound on its own still gets a chunk.
        let big = chunk_records(
            vec![(vec![0; 10], Some(vec![0; 300_000]))],
            MAX_APPEND_BYTES,
        );
        assert_eq!(big.len(), 1);
    }
}
