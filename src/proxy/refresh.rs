//! The proxy's own upstream Metadata refresh.
//!
//! Clients are not the only source of node addresses: the listener asks the
//! upstream for its brokers at start-up (readiness waits for it) and then
//! periodically, so node ports exist before any client asks and moved brokers
//! are followed. Plain listeners send Metadata v4 for no topics (brokers only;
//! served by every broker from Kafka 0.11 to 4.x). Mirror listeners also need
//! the source's cluster id and topic ids, so they send Metadata v12 for all
//! topics (Kafka 3.1+).

use std::time::Duration;

use crate::codec::api;
use crate::codec::api::METADATA;
use crate::handlers::rewrite_metadata_response;
use crate::kafka_client::{address, ClientError, Connection, Response, TransportConnector};
use crate::proxy::nodes::NodeRegistry;
use crate::sasl::Identity;
use crate::wire::{Reader, WireResult, Writer};

const CLIENT_ID: &str = "mirrorguard";

/// What a refresh learned beyond the brokers.
#[derive(Debug, Default, Clone)]
pub struct ClusterView {
    /// The upstream's cluster id, if it sent one.
    pub cluster_id: Option<String>,
    /// Topic names, ids and partition counts (v12 refreshes only).
    pub topics: Vec<(String, [u8; 16], i32)>,
    /// The brokers (v12 refreshes only).
    pub brokers: Vec<crate::mirror::offline::Broker>,
    /// Topics with partition leaders and epochs (v12 refreshes only; what a
    /// mirror persists as its source topology).
    pub topic_details: Vec<crate::mirror::offline::TopicTopology>,
    /// The upstream's ApiVersions table (`(api_key, min, max)`; v12
    /// refreshes only): what a mirror listener answers ApiVersions with
    /// before its client authenticated.
    pub api_versions: Option<Vec<(i16, i16, i16)>>,
}

/// What a refresh needs of its listener (implemented by
/// [`crate::proxy::listener::Listener`]; a trait so that this module, which
/// the listener calls, does not import the listener back).
pub trait RefreshTarget {
    /// The upstream's bootstrap servers.
    fn upstream_bootstrap(&self) -> &[(String, u16)];
    /// The connect (and, doubled, answer) timeout.
    fn connect_timeout(&self) -> std::time::Duration;
    /// The largest frame read.
    fn max_frame(&self) -> usize;
    /// The node registry the brokers learned go to.
    fn nodes(&self) -> &NodeRegistry;
    /// mirrorguard's own SASL identity toward the upstream.
    fn upstream_identity(&self) -> Identity {
        None
    }
    /// How to connect to the upstream (TCP or TLS).
    fn connector(&self) -> &TransportConnector;
}

/// Receives what each refresh learned (mirror listeners use it).
pub trait RefreshHook: Send + Sync {
    /// Called after every successful refresh; an error makes the listener
    /// not ready and is logged.
    fn on_refresh(&self, view: &ClusterView) -> Result<(), RefreshError>;
}

/// Why a [`RefreshHook`] refused what a refresh taught: the hook's own
/// error, boxed so the proxy names no mirror type. Its text is the hook's.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct RefreshError(Box<dyn std::error::Error + Send + Sync>);

impl RefreshError {
    /// Wraps a hook's error.
    pub fn new(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self(Box::new(e))
    }
}

/// The Metadata request body: v4 asks for no topics, v9+ (flexible) for
/// all topics; never creates a topic nor asks for authorized operations.
pub fn metadata_body(version: i16, w: &mut Writer<Vec<u8>>) -> WireResult<()> {
    if version >= 9 {
        w.put_uvarint(0); // topics: compact null = all topics
        w.put_bool(false); // allow_auto_topic_creation
        w.put_bool(false); // include_topic_authorized_operations
        w.put_uvarint(0); // tagged fields
    } else {
        w.put_i32(0); // topics: empty array = none (null would mean all)
        w.put_bool(false); // allow_auto_topic_creation
    }
    Ok(())
}

/// Sends one Metadata request to the first reachable of `bootstrap` and
/// returns the response (connect within `timeout`, answer within twice it).
async fn metadata(
    bootstrap: &[(String, u16)],
    connector: &TransportConnector,
    version: i16,
    timeout: Duration,
    max_frame: usize,
) -> Result<Response, ClientError> {
    metadata_and_versions(bootstrap, connector, version, timeout, max_frame, false)
        .await
        .map(|(r, _)| r)
}

/// [`metadata`], then (`versions`) ApiVersions v0 on the same connection.
async fn metadata_and_versions(
    bootstrap: &[(String, u16)],
    connector: &TransportConnector,
    version: i16,
    timeout: Duration,
    max_frame: usize,
    versions: bool,
) -> Result<(Response, Option<Vec<(i16, i16, i16)>>), ClientError> {
    let servers: Vec<String> = bootstrap.iter().map(|(h, p)| address(h, *p)).collect();
    let mut conn =
        Connection::connect_first(connector, &servers, timeout, max_frame, CLIENT_ID).await?;
    let md = conn
        .request(METADATA, version, timeout * 2, |w| {
            metadata_body(version, w)
        })
        .await?;
    if !versions {
        return Ok((md, None));
    }
    let av = conn
        .request(api::API_VERSIONS, 0, timeout * 2, |_| Ok(()))
        .await?;
    Ok((md, parse_api_versions_v0(av.body()).ok()))
}

/// An ApiVersions v0 response body as `(api_key, min, max)`.
fn parse_api_versions_v0(body: &[u8]) -> WireResult<Vec<(i16, i16, i16)>> {
    let mut r = Reader::new(body);
    r.read_i16("error_code")?;
    let n = r.read_array_len_v(false, 6, "api_keys")?;
    let mut out = Vec::new();
    for _ in 0..n {
        out.push((
            r.read_i16("api_key")?,
            r.read_i16("min_version")?,
            r.read_i16("max_version")?,
        ));
    }
    Ok(out)
}

/// Reads the upstream's brokers into the listener's node registry; returns
/// how many brokers the upstream reported and what else it learned.
pub async fn refresh_nodes(
    listener: &impl RefreshTarget,
    with_topics: bool,
) -> anyhow::Result<(usize, ClusterView)> {
    let version: i16 = if with_topics { 12 } else { 4 };
    let (resp, versions) = metadata_and_versions(
        listener.upstream_bootstrap(),
        &listener
            .connector()
            .clone()
            .with_sasl(listener.upstream_identity()),
        version,
        listener.connect_timeout(),
        listener.max_frame(),
        with_topics,
    )
    .await?;
    let body = resp.body();
    let mut count = 0;
    let mut learn = |node_id: i32, host: &str, port: i32| {
        count += 1;
        listener.nodes().advertise(node_id, host, port);
        None
    };
    rewrite_metadata_response(version, body, &mut learn)?;
    let mut view = parse_cluster_view(version, body)?;
    view.api_versions = versions;
    Ok((count, view))
}

/// Reads the cluster id (v2+) and, for v10+, the topic names and ids.
pub fn parse_cluster_view(version: i16, body: &[u8]) -> WireResult<ClusterView> {
    let flexible = api::is_flexible(api::METADATA, version);
    let mut r = Reader::new(body);
    if version >= 3 {
        r.read_i32("throttle_time_ms")?;
    }
    let brokers = r.read_array_len_v(flexible, 14, "brokers")?;
    let mut view = ClusterView::default();
    for _ in 0..brokers {
        let node_id = r.read_i32("node_id")?;
        let host = r.read_string_v(flexible, "host")?;
        let port = r.read_i32("port")?;
        if version >= 1 {
            r.read_nullable_string_v(flexible, "rack")?;
        }
        r.skip_tagged_fields_v(flexible, "broker tags")?;
        if version >= 10 {
            view.brokers.push(crate::mirror::offline::Broker {
                node_id,
                host: host.to_string(),
                port,
            });
        }
    }
    if version >= 2 {
        view.cluster_id = r
            .read_nullable_string_v(flexible, "cluster_id")?
            .map(str::to_string);
    }
    if version < 10 {
        return Ok(view);
    }
    r.read_i32("controller_id")?;
    let topics = r.read_array_len_v(flexible, 8, "topics")?;
    for _ in 0..topics {
        r.read_i16("error_code")?;
        let name = r.read_nullable_string_v(flexible, "name")?;
        let id = r.read_uuid("topic_id")?;
        let internal = r.read_bool("is_internal")?;
        let partitions = r.read_array_len_v(flexible, 20, "partitions")?;
        let mut details = Vec::with_capacity(partitions);
        for _ in 0..partitions {
            r.read_i16("error_code")?;
            let index = r.read_i32("partition_index")?;
            let leader = r.read_i32("leader_id")?;
            let leader_epoch = r.read_i32("leader_epoch")?;
            for field in ["replica_nodes", "isr_nodes", "offline_replicas"] {
                let n = r.read_array_len_v(flexible, 4, field)?;
                r.skip(n * 4, field)?;
            }
            r.skip_tagged_fields_v(flexible, "partition tags")?;
            details.push(crate::mirror::offline::PartitionTopology {
                index,
                leader,
                leader_epoch,
            });
        }
        r.read_i32("topic_authorized_operations")?;
        r.skip_tagged_fields_v(flexible, "topic tags")?;
        if let Some(name) = name {
            view.topics.push((name.to_string(), id, partitions as i32));
            view.topic_details
                .push(crate::mirror::offline::TopicTopology {
                    name: name.to_string(),
                    id,
                    internal,
                    partitions: details,
                });
        }
    }
    Ok(view)
}

/// Reads brokers, cluster id and topics (Metadata v12) from any of
/// `bootstrap`, authenticating as `identity`; used for the state
/// (destination) cluster's topic ids.
pub async fn fetch_cluster_view(
    bootstrap: &[(String, u16)],
    connector: &TransportConnector,
    timeout: Duration,
    max_frame: usize,
) -> Result<ClusterView, ClientError> {
    let resp = metadata(bootstrap, connector, 12, timeout, max_frame).await?;
    Ok(parse_cluster_view(12, resp.body())?)
}
