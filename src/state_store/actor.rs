//! The state store's actor: the one task that owns the connection to the
//! partition leader, the idempotent producer id/epoch and the sequence
//! number. This file holds its set-up (bootstrap, ApiVersions negotiation,
//! Metadata, topic creation and config checks, InitProducerId) and the
//! retry budget; the appends and reads are in `log.rs`.
//!
//! Any transport failure drops the connection; the next attempt goes back
//! to the bootstrap servers (metadata, leader, versions).

use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio::time::{sleep, Instant};

use super::client::{
    Command, StateClusterReport, StateStoreConfig, BACKOFF_MAX, BACKOFF_MIN, CLIENT_ID, MAX_FRAME,
};
use super::error::{Result, StateStoreError};
use super::proto::{self, code};
use crate::kafka_client::{Connection, Connector};
use crate::wire::Writer;

/// A connection with its negotiated versions.
pub(super) struct Conn<S> {
    pub(super) inner: Connection<S>,
    pub(super) versions: Vec<(i16, i16)>,
    /// Whether the broker answers DescribeConfigs v1 (optional API).
    pub(super) describe_configs: bool,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Conn<S> {
    pub(super) fn version(&self, api: i16) -> i16 {
        // negotiate() produced an entry for every API in SUPPORTED.
        self.versions
            .iter()
            .find(|(k, _)| *k == api)
            .map_or(-1, |(_, v)| *v)
    }

    /// Sends one request and returns the response frame and the offset of
    /// its body (see [`Connection::request`]).
    pub(super) async fn roundtrip(
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

pub(super) struct Actor<C: Connector> {
    pub(super) cfg: StateStoreConfig,
    pub(super) connector: C,
    /// Connection to the partition leader; `None` after any failure.
    pub(super) conn: Option<Conn<C::Stream>>,
    /// Idempotent producer `(id, epoch)`; `None` until initialised or after
    /// a sequence error.
    pub(super) producer: Option<(i64, i16)>,
    /// Sequence number of the next batch.
    pub(super) next_seq: i32,
    /// Whether the topic's configs were checked.
    pub(super) policy_checked: bool,
    /// What the first connection learned (see [`StateClusterReport`]).
    pub(super) report: StateClusterReport,
}

/// Retry budget of one operation.
pub(super) struct Retry {
    pub(super) deadline: Instant,
    pub(super) backoff: Duration,
}

impl Retry {
    pub(super) fn new(budget: Duration) -> Self {
        Self {
            deadline: Instant::now() + budget,
            backoff: BACKOFF_MIN,
        }
    }
}

impl<C: Connector> Actor<C> {
    pub(super) async fn run(mut self, mut rx: mpsc::Receiver<Command>) {
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
                Command::Read {
                    from,
                    upto,
                    budget,
                    reply,
                } => {
                    let r = self.read_from(from, upto, budget).await;
                    let _ = reply.send(r);
                }
            }
        }
    }

    /// After a failed attempt: whether to try again. Sleeps the backoff and
    /// drops the connection when so (any error may have left it
    /// mid-response or pointed at a stale leader: start over from
    /// bootstrap).
    pub(super) async fn backoff(&mut self, retry: &mut Retry, e: &StateStoreError) -> bool {
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
    pub(super) async fn connect(&self, addr: &str) -> Result<Conn<C::Stream>> {
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
    pub(super) async fn connect_bootstrap(&self) -> Result<Conn<C::Stream>> {
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

    pub(super) async fn metadata(&self, conn: &mut Conn<C::Stream>) -> Result<proto::MetadataInfo> {
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

    pub(super) async fn create_topic(&self, conn: &mut Conn<C::Stream>) -> Result<()> {
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
            code::NONE => {
                tracing::info!(topic, "state store: created compacted topic");
                Ok(())
            }
            // Another instance (or an earlier attempt of this one whose
            // answer was lost) created it first: fine, it is read back next.
            code::TOPIC_ALREADY_EXISTS => {
                tracing::info!(
                    topic,
                    "state store: topic already exists (created meanwhile)"
                );
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
    pub(super) async fn check_cleanup_policy(&mut self, conn: &mut Conn<C::Stream>) {
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
    pub(super) async fn ensure_ready(&mut self) -> Result<()> {
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

    pub(super) fn conn_mut(&mut self) -> Result<&mut Conn<C::Stream>> {
        self.conn
            .as_mut()
            .ok_or_else(|| StateStoreError::Io("not connected".into()))
    }
}
