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

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{sleep, Instant};

use super::proto::{self, code};
use crate::handlers::walk_fetch_response;
use crate::kafka_client::{ClientError, Connection};
pub use crate::kafka_client::{Connector, TcpConnector};
use crate::records::builder::{build_batch, BatchSpec, RecordSpec};
use crate::records::record::records;
use crate::records::{batch::increment_sequence, walk, Entry};
use crate::wire::{WireError, Writer};

/// Default topic name.
pub const DEFAULT_TOPIC: &str = "__mirror_state";
/// Client id sent in request headers.
const CLIENT_ID: &str = "mirrorguard-state-store";
/// Largest response frame accepted from the state cluster.
const MAX_FRAME: usize = 128 << 20;
/// Initial and largest per-partition fetch size.
const FETCH_BYTES: i32 = 1 << 20;
const MAX_FETCH_BYTES: i32 = 64 << 20;
/// First and largest retry backoff.
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
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

/// Why a state-store operation failed. [`StateStoreError::kind`] gives a
/// stable label for metrics.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StateStoreError {
    /// No bootstrap server (or the leader) could be reached.
    #[error("state cluster unreachable: {0}")]
    Unreachable(String),
    /// A request got no answer within the request timeout.
    #[error("state cluster request timed out: {0}")]
    Timeout(String),
    /// The broker refused an operation for lack of permissions.
    #[error("not authorized on the state cluster: {api} returned {name} ({code})")]
    Authorization {
        /// API that was refused.
        api: &'static str,
        /// Kafka error code.
        code: i16,
        /// Its name.
        name: &'static str,
    },
    /// Creating the topic was refused.
    #[error("creating topic {topic} was refused: {name} ({code}){}", message.as_deref().map(|m| format!(": {m}")).unwrap_or_default())]
    TopicCreation {
        /// Topic name.
        topic: String,
        /// Kafka error code.
        code: i16,
        /// Its name.
        name: &'static str,
        /// Broker's message, if any.
        message: Option<String>,
    },
    /// The topic exists but cannot be used as the state topic.
    #[error("topic {topic} cannot hold mirrorguard state: {reason}")]
    TopicConfig {
        /// Topic name.
        topic: String,
        /// What is wrong.
        reason: String,
    },
    /// The broker answered with an error code.
    #[error("{api} failed on the state cluster: {name} ({code}){}", message.as_deref().map(|m| format!(": {m}")).unwrap_or_default())]
    Broker {
        /// API that failed.
        api: &'static str,
        /// Kafka error code.
        code: i16,
        /// Its name.
        name: &'static str,
        /// Broker's message, if any.
        message: Option<String>,
        /// Whether retrying may help.
        retriable: bool,
    },
    /// No version of an API is spoken by both sides.
    #[error("state cluster does not support {api} in a version mirrorguard speaks (broker offers {offered})")]
    UnsupportedVersion {
        /// API name.
        api: &'static str,
        /// What the broker offers.
        offered: String,
    },
    /// A response could not be parsed.
    #[error("malformed response from the state cluster: {0}")]
    Protocol(String),
    /// The connection failed mid-request.
    #[error("connection to the state cluster failed: {0}")]
    Io(String),
    /// Stored data cannot be read (e.g. a compressed or legacy batch).
    #[error("unreadable data in the state topic at offset {offset}: {detail}")]
    Corrupt {
        /// Offset of the offending batch.
        offset: i64,
        /// What is wrong.
        detail: String,
    },
    /// The configuration is unusable.
    #[error("invalid state store configuration: {0}")]
    Config(String),
    /// The store's task has stopped (the store was shut down).
    #[error("state store task has stopped")]
    Closed,
}

impl StateStoreError {
    /// Stable label for a metric's `kind`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Unreachable(_) => "unreachable",
            Self::Timeout(_) => "timeout",
            Self::Authorization { .. } => "authorization",
            Self::TopicCreation { .. } => "topic_creation",
            Self::TopicConfig { .. } => "topic_config",
            Self::Broker { .. } => "broker_error",
            Self::UnsupportedVersion { .. } => "unsupported_version",
            Self::Protocol(_) => "protocol",
            Self::Io(_) => "io",
            Self::Corrupt { .. } => "corrupt",
            Self::Config(_) => "config",
            Self::Closed => "closed",
        }
    }

    /// Whether the broker refused a batch as too large (MESSAGE_TOO_LARGE
    /// or RECORD_LIST_TOO_LARGE): retrying the same batch cannot succeed.
    pub fn is_too_large(&self) -> bool {
        matches!(self, Self::Broker { code, .. }
            if *code == code::MESSAGE_TOO_LARGE || *code == code::RECORD_LIST_TOO_LARGE)
    }

    /// Whether a retry (after reconnecting) may succeed.
    pub fn is_retriable(&self) -> bool {
        match self {
            Self::Unreachable(_) | Self::Timeout(_) | Self::Io(_) => true,
            Self::Broker { retriable, .. } => *retriable,
            _ => false,
        }
    }

    fn broker(api: i16, code: i16, message: Option<String>) -> Self {
        let api = proto::api_name(api);
        if proto::is_authorization(code) {
            return Self::Authorization {
                api,
                code,
                name: proto::error_name(code),
            };
        }
        Self::Broker {
            api,
            code,
            name: proto::error_name(code),
            message,
            retriable: proto::is_retriable(code),
        }
    }
}

impl From<ClientError> for StateStoreError {
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::Unreachable(m) => Self::Unreachable(m),
            ClientError::Timeout(m) => Self::Timeout(m),
            ClientError::Io(m) => Self::Io(m),
            ClientError::Protocol(m) => Self::Protocol(m),
            ClientError::Broker { api, code, message } => Self::broker(api, code, message),
        }
    }
}

impl From<StateStoreError> for String {
    fn from(e: StateStoreError) -> Self {
        e.to_string()
    }
}

impl From<WireError> for StateStoreError {
    fn from(e: WireError) -> Self {
        Self::Protocol(e.to_string())
    }
}

type Result<T> = std::result::Result<T, StateStoreError>;

/// Handle to the state store. Cheap to clone; the connection lives in a
/// background task that ends when the last handle is dropped.
#[derive(Debug, Clone)]
pub struct StateStore {
    tx: mpsc::Sender<Command>,
    topic: String,
    report: StateClusterReport,
}

enum Command {
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
fn chunk_records(records: Vec<KeyValue>, limit: usize) -> Vec<Vec<KeyValue>> {
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

    /// Appends `records` in as few batches as fit [`MAX_APPEND_BYTES`] each
    /// (one Produce request per batch, acks=all, idempotent) and returns
    /// the offset of the last one. A batch the broker refuses as too large
    /// (MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE: a `message.max.bytes` or
    /// topic `max.message.bytes` below the bound) is split in halves and
    /// sent again, so only a single record larger than the broker's limit
    /// fails, with [`StateStoreError::is_too_large`] true.
    pub async fn append_many(&self, records: Vec<KeyValue>) -> Result<i64> {
        let mut last = -1;
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
                Ok(off) => last = last.max(off),
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
        Ok(last)
    }

    /// Reads every record from offset 0 up to the high watermark. A read
    /// that stops short of it (a slow or large topic, a stalled broker) goes
    /// on from where it stopped while it makes progress; one that cannot
    /// reach the end is an error, never a partial result that looks whole.
    pub async fn read_all(&self) -> Result<Vec<StoredRecord>> {
        let mut out = Vec::new();
        let mut pos = 0;
        let mut stalled = 0;
        loop {
            let (records, next, complete) = self.read_checked(pos).await?;
            out.extend(records);
            if complete {
                return Ok(out);
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

    async fn read_checked(&self, offset: i64) -> Result<(Vec<StoredRecord>, i64, bool)> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Command::Read {
                from: offset,
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
        let (records, next, _) = self.read_checked(offset).await?;
        Ok((records, next))
    }
}

/// A connection with its negotiated versions.
struct Conn<S> {
    inner: Connection<S>,
    versions: Vec<(i16, i16)>,
    /// Whether the broker answers DescribeConfigs v1 (optional API).
    describe_configs: bool,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Conn<S> {
    fn version(&self, api: i16) -> i16 {
        // negotiate() produced an entry for every API in SUPPORTED.
        self.versions
            .iter()
            .find(|(k, _)| *k == api)
            .map_or(-1, |(_, v)| *v)
    }

    /// Sends one request and returns the response frame and the offset of
    /// its body (see [`Connection::request`]).
    async fn roundtrip(
        &mut self,
        api: i16,
        version: i16,
        limit: Duration,
        body: impl FnOnce(&mut Writer<Vec<u8>>) -> crate::wire::WireResult<()>,
    ) -> Result<(Bytes, usize)> {
        Ok(self
            .inner
            .request(api, version, limit, body)
            .await?
            .into_parts())
    }
}

struct Actor<C: Connector> {
    cfg: StateStoreConfig,
    connector: C,
    /// Connection to the partition leader; `None` after any failure.
    conn: Option<Conn<C::Stream>>,
    /// Idempotent producer `(id, epoch)`; `None` until initialised or after
    /// a sequence error.
    producer: Option<(i64, i16)>,
    /// Sequence number of the next batch.
    next_seq: i32,
    /// Whether the topic's configs were checked.
    policy_checked: bool,
    /// What the first connection learned (see [`StateClusterReport`]).
    report: StateClusterReport,
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

/// Retry budget of one operation.
struct Retry {
    deadline: Instant,
    backoff: Duration,
}

impl Retry {
    fn new(budget: Duration) -> Self {
        Self {
            deadline: Instant::now() + budget,
            backoff: BACKOFF_MIN,
        }
    }
}

impl<C: Connector> Actor<C> {
    async fn run(mut self, mut rx: mpsc::Receiver<Command>) {
        while let Some(cmd) = rx.recv().await {
            match cmd {
                Command::Append { key, value, reply } => {
                    let r = self.append(vec![(key, value)]).await;
                    let _ = reply.send(r);
                }
                Command::AppendMany { records, reply } => {
                    let r = self.append(records).await;
                    let _ = reply.send(r);
                }
                Command::Read { from, reply } => {
                    let r = self.read_from(from).await;
                    let _ = reply.send(r);
                }
            }
        }
    }

    /// After a failed attempt: whether to try again. Sleeps the backoff and
    /// drops the connection when so (any error may have left it
    /// mid-response or pointed at a stale leader: start over from
    /// bootstrap).
    async fn backoff(&mut self, retry: &mut Retry, e: &StateStoreError) -> bool {
        if !e.is_retriable() || Instant::now() + retry.backoff >= retry.deadline {
            return false;
        }
        tracing::debug!(error = %e, kind = e.kind(), "state store: retrying");
        self.conn = None;
        sleep(retry.backoff).await;
        retry.backoff = (retry.backoff * 2).min(BACKOFF_MAX);
        true
    }

    /// Connects to `addr` and negotiates API versions.
    async fn connect(&self, addr: &str) -> Result<Conn<C::Stream>> {
        let inner = Connection::connect(
            &self.connector,
            addr,
            self.cfg.connect_timeout,
            MAX_FRAME,
            CLIENT_ID,
        )
        .await?;
        let mut conn = Conn {
            inner,
            versions: Vec::new(),
            describe_configs: false,
        };
        let (resp, off) = conn
            .roundtrip(
                proto::API_VERSIONS,
                0,
                self.cfg.request_timeout,
                proto::api_versions_request,
            )
            .await?;
        let (err, keys) = proto::parse_api_versions(resp.get(off..).unwrap_or_default())?;
        if err != code::NONE {
            return Err(StateStoreError::broker(proto::API_VERSIONS, err, None));
        }
        conn.describe_configs = keys.iter().any(|&(k, lo, hi)| {
            k == proto::DESCRIBE_CONFIGS && (lo..=hi).contains(&proto::DESCRIBE_CONFIGS_VERSION)
        });
        conn.versions = proto::negotiate(&keys).map_err(|(api, offered)| {
            StateStoreError::UnsupportedVersion {
                api,
                offered: offered.map_or_else(
                    || "nothing".to_owned(),
                    |(lo, hi)| format!("versions {lo}-{hi}"),
                ),
            }
        })?;
        Ok(conn)
    }

    /// Connects to the first reachable bootstrap server.
    async fn connect_bootstrap(&self) -> Result<Conn<C::Stream>> {
        let mut errors = Vec::new();
        for addr in &self.cfg.bootstrap {
            match self.connect(addr).await {
                Ok(c) => return Ok(c),
                Err(e) if e.is_retriable() => errors.push(e.to_string()),
                Err(e) => return Err(e),
            }
        }
        Err(StateStoreError::Unreachable(errors.join("; ")))
    }

    async fn metadata(&self, conn: &mut Conn<C::Stream>) -> Result<proto::MetadataInfo> {
        let v = conn.version(proto::METADATA);
        let topic = self.cfg.topic.as_str();
        let (resp, off) = conn
            .roundtrip(proto::METADATA, v, self.cfg.request_timeout, |w| {
                proto::metadata_request(v, topic, w)
            })
            .await?;
        Ok(proto::parse_metadata(
            v,
            resp.get(off..).unwrap_or_default(),
        )?)
    }

    async fn create_topic(&self, conn: &mut Conn<C::Stream>) -> Result<()> {
        let v = conn.version(proto::CREATE_TOPICS);
        let topic = self.cfg.topic.as_str();
        let rf = self.cfg.replication_factor;
        let timeout_ms = i32::try_from(self.cfg.request_timeout.as_millis()).unwrap_or(i32::MAX);
        let (resp, off) = conn
            .roundtrip(proto::CREATE_TOPICS, v, self.cfg.request_timeout, |w| {
                proto::create_topics_request(
                    v,
                    topic,
                    1,
                    rf,
                    &[("cleanup.policy", "compact")],
                    timeout_ms,
                    w,
                )
            })
            .await?;
        let topics = proto::parse_create_topics(v, resp.get(off..).unwrap_or_default())?;
        let Some((_, err, msg)) = topics.into_iter().find(|(n, _, _)| n == topic) else {
            return Err(StateStoreError::Protocol(format!(
                "CreateTopics response does not mention {topic}"
            )));
        };
        match err {
            // Another instance created it first: fine, it is read back next.
            code::NONE | code::TOPIC_ALREADY_EXISTS => {
                tracing::info!(topic, "state store: created compacted topic");
                Ok(())
            }
            c if proto::is_authorization(c) => {
                Err(StateStoreError::broker(proto::CREATE_TOPICS, c, msg))
            }
            c if proto::is_retriable(c) => {
                Err(StateStoreError::broker(proto::CREATE_TOPICS, c, msg))
            }
            c => Err(StateStoreError::TopicCreation {
                topic: topic.to_owned(),
                code: c,
                name: proto::error_name(c),
                message: msg,
            }),
        }
    }

    /// Reports an existing state topic whose `cleanup.policy` is not
    /// `compact`: the broker would delete durable decisions with age, and
    /// never drop superseded ones. Reported, not refused (an operator may
    /// have a reason); a broker without DescribeConfigs is not checked.
    /// Also notes the topic's `min.insync.replicas` in the report.
    async fn check_cleanup_policy(&mut self, conn: &mut Conn<C::Stream>) {
        let topic = self.cfg.topic.clone();
        let topic = topic.as_str();
        if !conn.describe_configs {
            tracing::info!(
                topic,
                "state store: the broker has no DescribeConfigs v1; cleanup.policy not checked"
            );
            return;
        }
        // A topic created a moment ago may not be known to the broker's
        // config view yet: ask again a few times (bounded).
        let mut res;
        let mut attempts = 0;
        loop {
            res = conn
                .roundtrip(
                    proto::DESCRIBE_CONFIGS,
                    proto::DESCRIBE_CONFIGS_VERSION,
                    self.cfg.request_timeout,
                    |w| {
                        proto::describe_topic_configs_request(
                            topic,
                            &["cleanup.policy", "min.insync.replicas"],
                            w,
                        )
                    },
                )
                .await
                .and_then(|(resp, off)| {
                    Ok(proto::parse_describe_configs_v1(
                        resp.get(off..).unwrap_or_default(),
                    )?)
                });
            attempts += 1;
            match &res {
                Ok((code::UNKNOWN_TOPIC_OR_PARTITION, _)) if attempts < 20 => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                _ => break,
            }
        }
        match res {
            Ok((code::NONE, configs)) => {
                self.report.min_insync_replicas = configs
                    .iter()
                    .find(|(n, _)| n == "min.insync.replicas")
                    .and_then(|(_, v)| v.as_deref())
                    .and_then(|v| v.trim().parse().ok());
                let policy = configs
                    .iter()
                    .find(|(n, _)| n == "cleanup.policy")
                    .and_then(|(_, v)| v.clone())
                    .unwrap_or_default();
                if policy.split(',').any(|p| p.trim() == "compact") && !policy.contains("delete") {
                    tracing::debug!(topic, policy, "state store: topic is compacted");
                } else {
                    tracing::error!(topic, cleanup_policy = %policy,
                        "state store: the existing state topic's cleanup.policy is not `compact`: \
                         the broker deletes durable decisions (salts, seals, claims) as they age; \
                         set cleanup.policy=compact on it");
                }
            }
            Ok((c, _)) => tracing::warn!(
                topic,
                code = c,
                error = proto::error_name(c),
                "state store: cannot read the state topic's cleanup.policy"
            ),
            Err(e) => tracing::warn!(topic, error = %e,
                "state store: cannot read the state topic's cleanup.policy"),
        }
    }

    /// Makes sure there is a connection to the partition leader (creating
    /// the topic if it is missing) and an idempotent producer id.
    async fn ensure_ready(&mut self) -> Result<()> {
        if self.conn.is_none() {
            let mut boot = self.connect_bootstrap().await?;
            let mut meta = self.metadata(&mut boot).await?;
            let topic = self.cfg.topic.clone();
            let find = |m: &proto::MetadataInfo| {
                m.topics
                    .iter()
                    .find(|t| t.name.as_deref() == Some(topic.as_str()))
                    .cloned()
            };
            let missing = match find(&meta) {
                None => true,
                Some(t) => t.error_code == code::UNKNOWN_TOPIC_OR_PARTITION,
            };
            if missing {
                self.create_topic(&mut boot).await?;
                meta = self.metadata(&mut boot).await?;
            }
            if !self.policy_checked {
                // A topic just created is compact; its min.insync.replicas
                // (the broker's default) is still worth reading.
                self.policy_checked = true;
                self.check_cleanup_policy(&mut boot).await;
            }
            let t = find(&meta).ok_or_else(|| StateStoreError::Broker {
                api: "Metadata",
                code: code::UNKNOWN_TOPIC_OR_PARTITION,
                name: proto::error_name(code::UNKNOWN_TOPIC_OR_PARTITION),
                message: Some(format!("{topic} not in metadata")),
                retriable: true,
            })?;
            if t.error_code != code::NONE {
                return Err(StateStoreError::broker(proto::METADATA, t.error_code, None));
            }
            // Several partitions would split the total order that "lowest
            // offset wins" relies on: refuse rather than use partition 0.
            if t.partitions.len() != 1 {
                return Err(StateStoreError::TopicConfig {
                    topic,
                    reason: format!(
                        "it has {} partitions; it needs exactly 1 for a single total order",
                        t.partitions.len()
                    ),
                });
            }
            let p = t.partitions[0];
            self.report.cluster_id = meta.cluster_id.clone();
            self.report.brokers = meta.brokers.len();
            self.report.replication_factor = p.replicas;
            if p.error_code != code::NONE {
                return Err(StateStoreError::broker(proto::METADATA, p.error_code, None));
            }
            if p.partition != 0 {
                return Err(StateStoreError::TopicConfig {
                    topic,
                    reason: format!("its only partition is {}, not 0", p.partition),
                });
            }
            let leader = meta
                .brokers
                .iter()
                .find(|b| b.node_id == p.leader)
                .ok_or_else(|| StateStoreError::Broker {
                    api: "Metadata",
                    code: code::LEADER_NOT_AVAILABLE,
                    name: proto::error_name(code::LEADER_NOT_AVAILABLE),
                    message: Some(format!(
                        "leader {} of {topic}-0 not among brokers",
                        p.leader
                    )),
                    retriable: true,
                })?;
            let leader_addr = format!("{}:{}", leader.host, leader.port);
            let conn = if leader_addr == boot.inner.addr() {
                boot
            } else {
                drop(boot);
                self.connect(&leader_addr).await?
            };
            self.conn = Some(conn);
        }
        if self.producer.is_none() {
            let limit = self.cfg.request_timeout;
            let conn = self.conn_mut()?;
            let v = conn.version(proto::INIT_PRODUCER_ID);
            let (resp, off) = conn
                .roundtrip(proto::INIT_PRODUCER_ID, v, limit, |w| {
                    proto::init_producer_id_request(v, w)
                })
                .await?;
            let (err, pid, epoch) =
                proto::parse_init_producer_id(v, resp.get(off..).unwrap_or_default())?;
            if err != code::NONE {
                return Err(StateStoreError::broker(proto::INIT_PRODUCER_ID, err, None));
            }
            if pid < 0 {
                return Err(StateStoreError::Protocol(format!(
                    "InitProducerId returned producer id {pid}"
                )));
            }
            self.producer = Some((pid, epoch));
            self.next_seq = 0;
        }
        Ok(())
    }

    fn conn_mut(&mut self) -> Result<&mut Conn<C::Stream>> {
        self.conn
            .as_mut()
            .ok_or_else(|| StateStoreError::Io("not connected".into()))
    }

    async fn append(&mut self, records: Vec<(Vec<u8>, Option<Vec<u8>>)>) -> Result<i64> {
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let mut retry = Retry::new(self.cfg.request_timeout);
        loop {
            match self.try_append(&records, ts).await {
                Ok(off) => return Ok(off),
                Err(e) => {
                    if !self.backoff(&mut retry, &e).await {
                        // The batch may have been written with its ack lost.
                        // Reusing its sequence number for the next record
                        // would get that record "de-duplicated" away, so the
                        // next append starts a fresh producer id instead.
                        self.producer = None;
                        return Err(e);
                    }
                }
            }
        }
    }

    /// One attempt at writing `records` as one batch; returns the offset
    /// of the last record.
    async fn try_append(&mut self, records: &[(Vec<u8>, Option<Vec<u8>>)], ts: i64) -> Result<i64> {
        self.ensure_ready().await?;
        let (pid, epoch) = self
            .producer
            .ok_or_else(|| StateStoreError::Io("no producer id".into()))?;
        let seq = self.next_seq;
        let n = i32::try_from(records.len())
            .map_err(|_| StateStoreError::Config("too many records in one append".into()))?;
        let specs: Vec<RecordSpec<'_>> = records
            .iter()
            .zip(0..n)
            .map(|((key, value), delta)| RecordSpec {
                key: Some(key.as_slice()),
                value: value.as_deref(),
                offset_delta: delta,
                ..RecordSpec::default()
            })
            .collect();
        let batch = build_batch(
            &BatchSpec {
                base_timestamp: ts,
                max_timestamp: ts,
                producer_id: pid,
                producer_epoch: epoch,
                base_sequence: seq,
                ..BatchSpec::default()
            },
            &specs,
        );
        let topic = self.cfg.topic.clone();
        let limit = self.cfg.request_timeout;
        let timeout_ms = i32::try_from(limit.as_millis()).unwrap_or(i32::MAX);
        let conn = self.conn_mut()?;
        let v = conn.version(proto::PRODUCE);
        let (resp, off) = conn
            .roundtrip(proto::PRODUCE, v, limit, |w| {
                proto::produce_request(v, -1, timeout_ms, &topic, 0, &batch, w)
            })
            .await?;
        let parts = proto::parse_produce(v, resp.get(off..).unwrap_or_default())?;
        let p = parts
            .into_iter()
            .find(|p| p.partition == 0)
            .ok_or_else(|| {
                StateStoreError::Protocol("Produce response lacks partition 0".into())
            })?;
        match p.error_code {
            code::NONE | code::DUPLICATE_SEQUENCE_NUMBER => {
                // DUPLICATE: an earlier attempt of this very batch was
                // written; it counts as acknowledged.
                self.next_seq = increment_sequence(seq, n);
                Ok(p.base_offset + i64::from(n) - 1)
            }
            code::OUT_OF_ORDER_SEQUENCE_NUMBER
            | code::UNKNOWN_PRODUCER_ID
            | code::INVALID_PRODUCER_EPOCH
            | code::PRODUCER_FENCED => {
                // The broker lost or rejected our producer state: start a
                // new producer and resend. A duplicate record is harmless
                // (same key and value; the lowest offset wins).
                tracing::warn!(
                    producer_id = pid,
                    error = proto::error_name(p.error_code),
                    "state store: re-initialising the producer id"
                );
                self.producer = None;
                Err(StateStoreError::Broker {
                    api: "Produce",
                    code: p.error_code,
                    name: proto::error_name(p.error_code),
                    message: p.error_message,
                    retriable: true,
                })
            }
            c => Err(StateStoreError::broker(proto::PRODUCE, c, p.error_message)),
        }
    }

    async fn read_from(&mut self, from: i64) -> Result<(Vec<StoredRecord>, i64, bool)> {
        if from < 0 {
            return Err(StateStoreError::Config(format!("read offset {from}")));
        }
        let mut retry = Retry::new(self.cfg.request_timeout);
        let mut out = Vec::new();
        let mut pos = from;
        let mut max_bytes = FETCH_BYTES;
        loop {
            let step = match self.fetch_once(pos, max_bytes).await {
                Ok(s) => s,
                Err(e) => {
                    if self.backoff(&mut retry, &e).await {
                        continue;
                    }
                    return Err(e);
                }
            };
            let progressed = step.next > pos;
            out.extend(step.records);
            if progressed {
                pos = step.next;
                max_bytes = FETCH_BYTES;
            } else if step.truncated {
                // The first batch did not fit: ask for more.
                if max_bytes >= MAX_FETCH_BYTES {
                    return Err(StateStoreError::Corrupt {
                        offset: pos,
                        detail: format!("batch larger than {MAX_FETCH_BYTES} bytes"),
                    });
                }
                max_bytes = max_bytes.saturating_mul(2).min(MAX_FETCH_BYTES);
                continue;
            } else if let Some(start) = step.log_start.filter(|s| *s > pos) {
                // Offset out of range below the log start: skip ahead.
                pos = start;
                continue;
            }
            if pos >= step.high_watermark {
                return Ok((out, pos, true));
            }
            if !progressed {
                // Nothing readable at `pos` although the high watermark is
                // past it: not the end.
                return Ok((out, pos, false));
            }
            if Instant::now() >= retry.deadline {
                // Still behind after a whole request timeout of reading:
                // hand back what was read; the caller continues from `pos`.
                return Ok((out, pos, false));
            }
        }
    }

    async fn fetch_once(&mut self, pos: i64, max_bytes: i32) -> Result<FetchStep> {
        self.ensure_ready().await?;
        let topic = self.cfg.topic.clone();
        let limit = self.cfg.request_timeout;
        let conn = self.conn_mut()?;
        let v = conn.version(proto::FETCH);
        let (resp, off) = conn
            .roundtrip(proto::FETCH, v, limit, |w| {
                proto::fetch_request(v, &topic, 0, pos, max_bytes, w)
            })
            .await?;
        let body = resp.get(off..).unwrap_or_default();
        let mut part = None;
        let info = walk_fetch_response(v, body, &mut |p| {
            if p.partition_index == 0 && part.is_none() {
                part = Some((
                    p.error_code,
                    p.high_watermark,
                    p.log_start_offset,
                    p.records.clone(),
                ));
            }
        })?;
        if info.error_code != code::NONE {
            return Err(StateStoreError::broker(proto::FETCH, info.error_code, None));
        }
        let (err, hw, log_start, range) = part
            .ok_or_else(|| StateStoreError::Protocol("Fetch response lacks partition 0".into()))?;
        if err == code::OFFSET_OUT_OF_RANGE && log_start > pos {
            return Ok(FetchStep {
                records: Vec::new(),
                next: pos,
                high_watermark: hw,
                truncated: false,
                log_start: Some(log_start),
            });
        }
        if err != code::NONE {
            return Err(StateStoreError::broker(proto::FETCH, err, None));
        }
        let blob = match range {
            Some(r) => body.get(r).unwrap_or_default(),
            None => &[],
        };
        let (records, next, truncated) = parse_records(&resp, blob, pos)?;
        Ok(FetchStep {
            records,
            next,
            high_watermark: hw,
            truncated,
            log_start: None,
        })
    }
}

/// Decodes the records of a fetched blob (which lies inside `frame`, so the
/// returned keys and values are zero-copy slices of it), keeping those at
/// or after `pos`. Returns the records, the offset after the last complete
/// batch (at least `pos`), and whether the blob ended in a partial batch.
/// Control batches are skipped but advance the offset.
fn parse_records(frame: &Bytes, blob: &[u8], pos: i64) -> Result<(Vec<StoredRecord>, i64, bool)> {
    let mut out = Vec::new();
    let mut next = pos;
    for entry in walk(blob) {
        let entry = entry.map_err(|e| StateStoreError::Corrupt {
            offset: next,
            detail: e.to_string(),
        })?;
        let h = match entry {
            Entry::V2(h) => h,
            Entry::Truncated { .. } => return Ok((out, next, true)),
            Entry::Legacy { magic, .. } => {
                return Err(StateStoreError::Corrupt {
                    offset: next,
                    detail: format!("legacy magic {magic} message; only v2 batches are read"),
                })
            }
        };
        let batch_bytes = blob.get(h.range.clone()).unwrap_or_default();
        // Control batches (transaction markers) carry no state.
        if !h.is_control() {
            let recs = records(&h, batch_bytes).map_err(|e| StateStoreError::Corrupt {
                offset: h.base_offset,
                detail: e.to_string(),
            })?;
            for rec in recs {
                let rec = rec.map_err(|e| StateStoreError::Corrupt {
                    offset: h.base_offset,
                    detail: e.to_string(),
                })?;
                let offset = h.base_offset.saturating_add(i64::from(rec.offset_delta));
                // A batch can start before the requested offset.
                if offset < pos {
                    continue;
                }
                let Some(key) = rec.key else {
                    // Kafka refuses keyless records in compacted topics;
                    // skip rather than stop the load.
                    tracing::warn!(offset, "state store: skipping a record without a key");
                    continue;
                };
                let timestamp = if h.is_log_append_time() {
                    h.max_timestamp
                } else {
                    h.base_timestamp.saturating_add(rec.timestamp_delta)
                };
                out.push(StoredRecord {
                    offset,
                    timestamp,
                    key: frame.slice_ref(key),
                    value: rec.value.map(|v| frame.slice_ref(v)),
                });
            }
        }
        next = next.max(h.last_offset().saturating_add(1));
    }
    Ok((out, next, false))
}

/// Result of one Fetch round trip.
struct FetchStep {
    records: Vec<StoredRecord>,
    /// Offset after the last complete batch (or the requested one).
    next: i64,
    high_watermark: i64,
    /// The response ended in a partial batch.
    truncated: bool,
    /// Set when the requested offset is below the log start.
    log_start: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::builder::build_commit_marker;

    fn batch(base: i64, keys: &[&[u8]]) -> Vec<u8> {
        let recs: Vec<RecordSpec<'_>> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| RecordSpec {
                offset_delta: i as i32,
                timestamp_delta: i as i64,
                key: Some(k),
                value: if i % 2 == 0 { Some(b"v") } else { None },
                ..RecordSpec::default()
            })
            .collect();
        build_batch(
            &BatchSpec {
                base_offset: base,
                base_timestamp: 1000,
                ..BatchSpec::default()
            },
            &recs,
        )
    }

    #[test]
    fn several_batches_control_and_truncated_tail() {
        let mut blob = batch(3, &[b"a", b"b"]);
        blob.extend(build_commit_marker(1, 0, 0, 0, 5, 0));
        blob.extend(batch(6, &[b"c"]));
        let tail = batch(7, &[b"d"]);
        blob.extend(&tail[..tail.len() - 3]);
        let frame = Bytes::from(blob);
        let (recs, next, truncated) = parse_records(&frame, &frame, 4).unwrap();
        assert!(truncated);
        assert_eq!(next, 7);
        type Row<'a> = (i64, i64, &'a [u8], Option<&'a [u8]>);
        let got: Vec<Row<'_>> = recs
            .iter()
            .map(|r| (r.offset, r.timestamp, &r.key[..], r.value.as_deref()))
            .collect();
        // Offset 3 is before the requested offset; 5 is the marker.
        assert_eq!(
            got,
            vec![
                (4, 1001, &b"b"[..], None),
                (6, 1000, &b"c"[..], Some(&b"v"[..]))
            ]
        );
    }

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

    #[test]
    fn corrupt_blob_is_an_error_not_a_panic() {
        let mut blob = batch(0, &[b"a"]);
        blob[16] = 7; // magic
        let frame = Bytes::from(blob);
        assert_eq!(
            parse_records(&frame, &frame, 0).unwrap_err().kind(),
            "corrupt"
        );
        let empty = Bytes::new();
        assert_eq!(
            parse_records(&empty, &empty, 9).unwrap(),
            (vec![], 9, false)
        );
    }
}
