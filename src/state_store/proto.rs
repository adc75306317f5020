//! The few Kafka requests the state store sends, and parsers for their
//! responses, on the bounds-checked [`crate::wire`] primitives.
//!
//! Each API is implemented over a version range (see [`SUPPORTED`]); the
//! client picks the highest version both it and the broker support. Only
//! fields the state store needs are kept from responses; everything else is
//! walked past with every length checked, so a hostile or broken state
//! cluster yields an error, never a panic or a huge allocation.
//!
//! (Over 600 lines only with its tests: the state store's few requests and
//! their response parsers, each a short function.)

use std::ops::RangeInclusive;

use kafka_protocol::messages::ApiKey;

use crate::codec::api::is_flexible;
use crate::wire::{Reader, WireResult, Writer};

/// Produce.
pub(crate) const PRODUCE: i16 = ApiKey::Produce as i16;
/// Fetch.
pub(crate) const FETCH: i16 = ApiKey::Fetch as i16;
/// Metadata.
pub(crate) const METADATA: i16 = ApiKey::Metadata as i16;
/// ApiVersions.
pub(crate) const API_VERSIONS: i16 = ApiKey::ApiVersions as i16;
/// CreateTopics.
pub(crate) const CREATE_TOPICS: i16 = ApiKey::CreateTopics as i16;
/// InitProducerId.
pub(crate) const INIT_PRODUCER_ID: i16 = ApiKey::InitProducerId as i16;
/// DescribeConfigs (optional: only to check an existing topic's config).
pub(crate) const DESCRIBE_CONFIGS: i16 = ApiKey::DescribeConfigs as i16;
/// The DescribeConfigs version sent (v1: non-flexible, with synonyms; Kafka
/// 4 answers v1..=v4).
pub(crate) const DESCRIBE_CONFIGS_VERSION: i16 = 1;

/// `(api_key, versions this code speaks)`.
///
/// Fetch stops at v12 because v13+ addresses topics by id only; Produce stops
/// at v12 for the same reason (v13). ApiVersions is always sent at v0, which
/// every broker answers, so it is not negotiated.
pub(crate) const SUPPORTED: &[(i16, RangeInclusive<i16>)] = &[
    (PRODUCE, 3..=12),
    (FETCH, 4..=12),
    (METADATA, 4..=12),
    (CREATE_TOPICS, 2..=7),
    (INIT_PRODUCER_ID, 0..=5),
];

/// Name of an API key, for error messages.
pub(crate) use crate::codec::api::api_label as api_name;

/// Kafka error codes the state store reacts to.
pub(crate) use crate::codec::api::error as code;
/// Kafka's name of an error code and its retriability.
pub(crate) use crate::codec::api::{error_name, is_retriable};

/// Whether the error code is an authorization failure.
pub(crate) fn is_authorization(c: i16) -> bool {
    matches!(
        c,
        code::TOPIC_AUTHORIZATION_FAILED
            | code::CLUSTER_AUTHORIZATION_FAILED
            | code::TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    )
}

// ---------------------------------------------------------------------------
// ApiVersions v0

/// ApiVersions v0 request body: empty.
pub(crate) fn api_versions_request(_w: &mut Writer<Vec<u8>>) -> WireResult<()> {
    Ok(())
}

/// Parsed ApiVersions response: error code and `(key, min, max)` entries.
/// `(api_key, min_version, max_version)` as ApiVersions lists it.
pub(crate) type ApiRange = (i16, i16, i16);

/// An API with no common version: its name and the broker's range, if any.
pub(crate) type NoCommonVersion = (&'static str, Option<(i16, i16)>);

pub(crate) fn parse_api_versions(body: &[u8]) -> WireResult<(i16, Vec<ApiRange>)> {
    let mut r = Reader::new(body);
    let err = r.read_i16("ApiVersionsResponse.error_code")?;
    let n = r
        .read_array_len(6, "ApiVersionsResponse.api_keys")?
        .unwrap_or(0);
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push((
            r.read_i16("ApiVersionsResponse.api_key")?,
            r.read_i16("ApiVersionsResponse.min_version")?,
            r.read_i16("ApiVersionsResponse.max_version")?,
        ));
    }
    Ok((err, out))
}

// ---------------------------------------------------------------------------
// Metadata v4-v12

/// Metadata request for one topic, never auto-creating it (the store creates
/// it itself, compacted).
pub(crate) fn metadata_request(v: i16, topic: &str, w: &mut Writer<Vec<u8>>) -> WireResult<()> {
    let flex = is_flexible(METADATA, v);
    w.put_array_len_v(flex, Some(1), "MetadataRequest.topics")?;
    if v >= 10 {
        w.put_uuid(&[0; 16]);
        w.put_nullable_string_v(flex, Some(topic), "MetadataRequest.topics.name")?;
    } else {
        w.put_string_v(flex, topic, "MetadataRequest.topics.name")?;
    }
    if flex {
        w.put_uvarint(0);
    }
    w.put_bool(false); // allow_auto_topic_creation
    if (8..=10).contains(&v) {
        w.put_bool(false); // include_cluster_authorized_operations
    }
    if v >= 8 {
        w.put_bool(false); // include_topic_authorized_operations
    }
    if flex {
        w.put_uvarint(0);
    }
    Ok(())
}

/// A broker of a Metadata response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BrokerMeta {
    pub node_id: i32,
    pub host: String,
    pub port: i32,
}

/// A partition of a Metadata response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PartitionMeta {
    pub error_code: i16,
    pub partition: i32,
    pub leader: i32,
    /// Number of replicas (the topic's replication factor).
    pub replicas: usize,
}

/// A topic of a Metadata response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TopicMeta {
    pub error_code: i16,
    pub name: Option<String>,
    pub partitions: Vec<PartitionMeta>,
}

/// What the state store needs from a Metadata response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MetadataInfo {
    pub brokers: Vec<BrokerMeta>,
    pub topics: Vec<TopicMeta>,
    /// The cluster's id (Kafka base64 text), if it sent one.
    pub cluster_id: Option<String>,
}

fn skip_i32_array(r: &mut Reader<'_>, flex: bool, field: &'static str) -> WireResult<()> {
    let n = r.read_array_len_v(flex, 4, field)?;
    r.skip(n.saturating_mul(4), field)
}

/// Parses a Metadata response body at `v` (4..=12).
pub(crate) fn parse_metadata(v: i16, body: &[u8]) -> WireResult<MetadataInfo> {
    let flex = is_flexible(METADATA, v);
    let mut r = Reader::new(body);
    r.read_i32("MetadataResponse.throttle_time_ms")?;
    let nb = r.read_array_len_v(flex, 10, "MetadataResponse.brokers")?;
    let mut brokers = Vec::with_capacity(nb);
    for _ in 0..nb {
        let node_id = r.read_i32("MetadataResponse.brokers.node_id")?;
        let host = r
            .read_string_v(flex, "MetadataResponse.brokers.host")?
            .to_owned();
        let port = r.read_i32("MetadataResponse.brokers.port")?;
        r.read_nullable_string_v(flex, "MetadataResponse.brokers.rack")?;
        r.skip_tagged_fields_v(flex, "MetadataResponse.brokers._tagged_fields")?;
        brokers.push(BrokerMeta {
            node_id,
            host,
            port,
        });
    }
    let cluster_id = r
        .read_nullable_string_v(flex, "MetadataResponse.cluster_id")?
        .map(str::to_owned);
    r.read_i32("MetadataResponse.controller_id")?;
    let nt = r.read_array_len_v(flex, 4, "MetadataResponse.topics")?;
    let mut topics = Vec::with_capacity(nt);
    for _ in 0..nt {
        let error_code = r.read_i16("MetadataResponse.topics.error_code")?;
        let name = r
            .read_nullable_string_v(flex, "MetadataResponse.topics.name")?
            .map(str::to_owned);
        if v >= 10 {
            r.read_uuid("MetadataResponse.topics.topic_id")?;
        }
        r.read_bool("MetadataResponse.topics.is_internal")?;
        let np = r.read_array_len_v(flex, 14, "MetadataResponse.topics.partitions")?;
        let mut partitions = Vec::with_capacity(np);
        for _ in 0..np {
            let error_code = r.read_i16("MetadataResponse.partitions.error_code")?;
            let partition = r.read_i32("MetadataResponse.partitions.partition_index")?;
            let leader = r.read_i32("MetadataResponse.partitions.leader_id")?;
            if v >= 7 {
                r.read_i32("MetadataResponse.partitions.leader_epoch")?;
            }
            let replicas =
                r.read_array_len_v(flex, 4, "MetadataResponse.partitions.replica_nodes")?;
            r.skip(
                replicas.saturating_mul(4),
                "MetadataResponse.partitions.replica_nodes",
            )?;
            skip_i32_array(&mut r, flex, "MetadataResponse.partitions.isr_nodes")?;
            if v >= 5 {
                skip_i32_array(&mut r, flex, "MetadataResponse.partitions.offline_replicas")?;
            }
            r.skip_tagged_fields_v(flex, "MetadataResponse.partitions._tagged_fields")?;
            partitions.push(PartitionMeta {
                error_code,
                partition,
                leader,
                replicas,
            });
        }
        if v >= 8 {
            r.read_i32("MetadataResponse.topics.topic_authorized_operations")?;
        }
        r.skip_tagged_fields_v(flex, "MetadataResponse.topics._tagged_fields")?;
        topics.push(TopicMeta {
            error_code,
            name,
            partitions,
        });
    }
    Ok(MetadataInfo {
        brokers,
        topics,
        cluster_id,
    })
}

// ---------------------------------------------------------------------------
// CreateTopics v2-v7

/// CreateTopics request for one topic with the given configs.
pub(crate) fn create_topics_request(
    v: i16,
    topic: &str,
    partitions: i32,
    replication_factor: i16,
    configs: &[(&str, &str)],
    timeout_ms: i32,
    w: &mut Writer<Vec<u8>>,
) -> WireResult<()> {
    let flex = is_flexible(CREATE_TOPICS, v);
    w.put_array_len_v(flex, Some(1), "CreateTopicsRequest.topics")?;
    w.put_string_v(flex, topic, "CreateTopicsRequest.topics.name")?;
    w.put_i32(partitions);
    w.put_i16(replication_factor);
    w.put_array_len_v(flex, Some(0), "CreateTopicsRequest.topics.assignments")?;
    w.put_array_len_v(
        flex,
        Some(configs.len()),
        "CreateTopicsRequest.topics.configs",
    )?;
    for (name, value) in configs {
        w.put_string_v(flex, name, "CreateTopicsRequest.configs.name")?;
        w.put_nullable_string_v(flex, Some(value), "CreateTopicsRequest.configs.value")?;
        if flex {
            w.put_uvarint(0);
        }
    }
    if flex {
        w.put_uvarint(0);
    }
    w.put_i32(timeout_ms);
    w.put_bool(false); // validate_only
    if flex {
        w.put_uvarint(0);
    }
    Ok(())
}

/// DescribeConfigs v1 request body: the topic's `keys`, no synonyms.
pub(crate) fn describe_topic_configs_request(
    topic: &str,
    keys: &[&str],
    w: &mut Writer<Vec<u8>>,
) -> WireResult<()> {
    w.put_array_len(Some(1), "DescribeConfigsRequest.resources")?;
    w.put_i8(2); // resource type TOPIC
    w.put_string(topic, "DescribeConfigsRequest.resources.resource_name")?;
    w.put_array_len(
        Some(keys.len()),
        "DescribeConfigsRequest.configuration_keys",
    )?;
    for k in keys {
        w.put_string(k, "DescribeConfigsRequest.configuration_keys")?;
    }
    w.put_bool(false); // include_synonyms
    Ok(())
}

/// Config entries `(name, value)` of a DescribeConfigs result.
pub(crate) type ConfigEntries = Vec<(String, Option<String>)>;

/// The `(error_code, [(name, value)])` of the first resource of a
/// DescribeConfigs v1 response.
pub(crate) fn parse_describe_configs_v1(body: &[u8]) -> WireResult<(i16, ConfigEntries)> {
    let mut r = Reader::new(body);
    r.read_i32("DescribeConfigsResponse.throttle_time_ms")?;
    let n = r.read_array_len_v(false, 10, "DescribeConfigsResponse.results")?;
    let mut out = (0, Vec::new());
    for i in 0..n {
        let code = r.read_i16("DescribeConfigsResponse.results.error_code")?;
        r.read_nullable_string_v(false, "DescribeConfigsResponse.results.error_message")?;
        r.read_i8("DescribeConfigsResponse.results.resource_type")?;
        r.read_string_v(false, "DescribeConfigsResponse.results.resource_name")?;
        let nc = r.read_array_len_v(false, 6, "DescribeConfigsResponse.results.configs")?;
        let mut configs = Vec::new();
        for _ in 0..nc {
            let name = r.read_string_v(false, "DescribeConfigsResponse.configs.name")?;
            let value = r.read_nullable_string_v(false, "DescribeConfigsResponse.configs.value")?;
            r.read_i8("DescribeConfigsResponse.configs.read_only")?;
            r.read_i8("DescribeConfigsResponse.configs.config_source")?;
            r.read_i8("DescribeConfigsResponse.configs.is_sensitive")?;
            let ns = r.read_array_len_v(false, 5, "DescribeConfigsResponse.configs.synonyms")?;
            for _ in 0..ns {
                r.read_string_v(false, "DescribeConfigsResponse.synonyms.name")?;
                r.read_nullable_string_v(false, "DescribeConfigsResponse.synonyms.value")?;
                r.read_i8("DescribeConfigsResponse.synonyms.source")?;
            }
            configs.push((name.to_owned(), value.map(str::to_owned)));
        }
        if i == 0 {
            out = (code, configs);
        }
    }
    Ok(out)
}

/// `(name, error_code, error_message)` of each topic of a CreateTopics
/// response at `v` (2..=7).
pub(crate) fn parse_create_topics(
    v: i16,
    body: &[u8],
) -> WireResult<Vec<(String, i16, Option<String>)>> {
    let flex = is_flexible(CREATE_TOPICS, v);
    let mut r = Reader::new(body);
    r.read_i32("CreateTopicsResponse.throttle_time_ms")?;
    let n = r.read_array_len_v(flex, 4, "CreateTopicsResponse.topics")?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let name = r
            .read_string_v(flex, "CreateTopicsResponse.topics.name")?
            .to_owned();
        if v >= 7 {
            r.read_uuid("CreateTopicsResponse.topics.topic_id")?;
        }
        let err = r.read_i16("CreateTopicsResponse.topics.error_code")?;
        let msg = r
            .read_nullable_string_v(flex, "CreateTopicsResponse.topics.error_message")?
            .map(str::to_owned);
        if v >= 5 {
            r.read_i32("CreateTopicsResponse.topics.num_partitions")?;
            r.read_i16("CreateTopicsResponse.topics.replication_factor")?;
            let nc = r.read_compact_array_len(4, "CreateTopicsResponse.topics.configs")?;
            for _ in 0..nc.unwrap_or(0) {
                r.read_compact_string("CreateTopicsResponse.configs.name")?;
                r.read_compact_nullable_string("CreateTopicsResponse.configs.value")?;
                r.read_bool("CreateTopicsResponse.configs.read_only")?;
                r.read_i8("CreateTopicsResponse.configs.config_source")?;
                r.read_bool("CreateTopicsResponse.configs.is_sensitive")?;
                r.read_tagged_fields("CreateTopicsResponse.configs._tagged_fields")?;
            }
        }
        r.skip_tagged_fields_v(flex, "CreateTopicsResponse.topics._tagged_fields")?;
        out.push((name, err, msg));
    }
    Ok(out)
}

// ---------------------------------------------------------------------------
// InitProducerId v0-v5

/// InitProducerId for an idempotent (non-transactional) producer: always
/// asks for a fresh producer id.
pub(crate) fn init_producer_id_request(v: i16, w: &mut Writer<Vec<u8>>) -> WireResult<()> {
    let flex = is_flexible(INIT_PRODUCER_ID, v);
    w.put_nullable_string_v(flex, None, "InitProducerIdRequest.transactional_id")?;
    w.put_i32(i32::MAX); // transaction_timeout_ms: unused without a transactional id
    if v >= 3 {
        w.put_i64(-1);
        w.put_i16(-1);
    }
    if flex {
        w.put_uvarint(0);
    }
    Ok(())
}

/// `(error_code, producer_id, producer_epoch)`.
pub(crate) fn parse_init_producer_id(v: i16, body: &[u8]) -> WireResult<(i16, i64, i16)> {
    let mut r = Reader::new(body);
    r.read_i32("InitProducerIdResponse.throttle_time_ms")?;
    let err = r.read_i16("InitProducerIdResponse.error_code")?;
    let pid = r.read_i64("InitProducerIdResponse.producer_id")?;
    let epoch = r.read_i16("InitProducerIdResponse.producer_epoch")?;
    r.skip_tagged_fields_v(
        is_flexible(INIT_PRODUCER_ID, v),
        "InitProducerIdResponse._tagged_fields",
    )?;
    Ok((err, pid, epoch))
}

// ---------------------------------------------------------------------------
// Produce v3-v12

/// Produce request carrying one batch for one partition.
pub(crate) fn produce_request(
    v: i16,
    acks: i16,
    timeout_ms: i32,
    topic: &str,
    partition: i32,
    batch: &[u8],
    w: &mut Writer<Vec<u8>>,
) -> WireResult<()> {
    let flex = is_flexible(PRODUCE, v);
    w.put_nullable_string_v(flex, None, "ProduceRequest.transactional_id")?;
    w.put_i16(acks);
    w.put_i32(timeout_ms);
    w.put_array_len_v(flex, Some(1), "ProduceRequest.topic_data")?;
    w.put_string_v(flex, topic, "ProduceRequest.topic_data.name")?;
    w.put_array_len_v(flex, Some(1), "ProduceRequest.partition_data")?;
    w.put_i32(partition);
    if flex {
        w.put_compact_nullable_bytes(Some(batch), "ProduceRequest.records")?;
        w.put_uvarint(0);
        w.put_uvarint(0);
        w.put_uvarint(0);
    } else {
        w.put_nullable_bytes(Some(batch), "ProduceRequest.records")?;
    }
    Ok(())
}

/// A partition result of a Produce response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProducePartition {
    pub partition: i32,
    pub error_code: i16,
    pub base_offset: i64,
    pub error_message: Option<String>,
}

/// Parses the partition results of a Produce response at `v` (3..=12).
pub(crate) fn parse_produce(v: i16, body: &[u8]) -> WireResult<Vec<ProducePartition>> {
    let flex = is_flexible(PRODUCE, v);
    let mut r = Reader::new(body);
    let nt = r.read_array_len_v(flex, 2, "ProduceResponse.responses")?;
    let mut out = Vec::new();
    for _ in 0..nt {
        r.read_string_v(flex, "ProduceResponse.responses.name")?;
        let np = r.read_array_len_v(flex, 14, "ProduceResponse.partition_responses")?;
        for _ in 0..np {
            let partition = r.read_i32("ProduceResponse.partition_responses.index")?;
            let error_code = r.read_i16("ProduceResponse.partition_responses.error_code")?;
            let base_offset = r.read_i64("ProduceResponse.partition_responses.base_offset")?;
            r.read_i64("ProduceResponse.partition_responses.log_append_time_ms")?;
            if v >= 5 {
                r.read_i64("ProduceResponse.partition_responses.log_start_offset")?;
            }
            let mut error_message = None;
            if v >= 8 {
                let ne = r.read_array_len_v(flex, 5, "ProduceResponse.record_errors")?;
                for _ in 0..ne {
                    r.read_i32("ProduceResponse.record_errors.batch_index")?;
                    r.read_nullable_string_v(flex, "ProduceResponse.record_errors.message")?;
                    r.skip_tagged_fields_v(flex, "ProduceResponse.record_errors._tagged_fields")?;
                }
                error_message = r
                    .read_nullable_string_v(
                        flex,
                        "ProduceResponse.partition_responses.error_message",
                    )?
                    .map(str::to_owned);
            }
            r.skip_tagged_fields_v(flex, "ProduceResponse.partition_responses._tagged_fields")?;
            out.push(ProducePartition {
                partition,
                error_code,
                base_offset,
                error_message,
            });
        }
        r.skip_tagged_fields_v(flex, "ProduceResponse.responses._tagged_fields")?;
    }
    Ok(out)
}

// ---------------------------------------------------------------------------
// Fetch v4-v12 (responses are walked by handlers::walk_fetch_response)

/// Longest a Fetch may wait for data. Tansu answers a Fetch with
/// max_wait 0 with no partitions at all, so a short wait is used; with
/// min_bytes 0 a broker answers at once when data is there.
pub(crate) const FETCH_MAX_WAIT_MS: i32 = 100;

/// A sessionless, read_uncommitted Fetch of one partition from `offset`
/// with min_bytes 0 (answer as soon as possible): the state store polls,
/// it never parks its single connection in a long poll.
pub(crate) fn fetch_request(
    v: i16,
    topic: &str,
    partition: i32,
    offset: i64,
    max_bytes: i32,
    w: &mut Writer<Vec<u8>>,
) -> WireResult<()> {
    let flex = is_flexible(FETCH, v);
    w.put_i32(-1); // replica_id: a consumer
    w.put_i32(FETCH_MAX_WAIT_MS);
    w.put_i32(0); // min_bytes
    w.put_i32(max_bytes);
    w.put_i8(0); // isolation_level: read_uncommitted (the store writes no transactions)
    if v >= 7 {
        w.put_i32(0); // session_id: none
        w.put_i32(-1); // session_epoch: full fetch, no session
    }
    w.put_array_len_v(flex, Some(1), "FetchRequest.topics")?;
    w.put_string_v(flex, topic, "FetchRequest.topics.topic")?;
    w.put_array_len_v(flex, Some(1), "FetchRequest.partitions")?;
    w.put_i32(partition);
    if v >= 9 {
        w.put_i32(-1); // current_leader_epoch: unknown
    }
    w.put_i64(offset);
    if v >= 12 {
        w.put_i32(-1); // last_fetched_epoch
    }
    if v >= 5 {
        w.put_i64(-1); // log_start_offset (followers only)
    }
    w.put_i32(max_bytes);
    if flex {
        w.put_uvarint(0); // partition tags
        w.put_uvarint(0); // topic tags
    }
    if v >= 7 {
        w.put_array_len_v(flex, Some(0), "FetchRequest.forgotten_topics_data")?;
    }
    if v >= 11 {
        w.put_string_v(flex, "", "FetchRequest.rack_id")?;
    }
    if flex {
        w.put_uvarint(0);
    }
    Ok(())
}

/// Picks the highest version both sides support for each API in
/// [`SUPPORTED`]; `Err((api, broker_range))` names the first API with no
/// common version (`None` range: the broker does not offer it at all).
pub(crate) fn negotiate(broker: &[ApiRange]) -> Result<Vec<(i16, i16)>, NoCommonVersion> {
    let mut out = Vec::with_capacity(SUPPORTED.len());
    for (key, ours) in SUPPORTED {
        let name = api_name(*key);
        let Some(&(_, bmin, bmax)) = broker.iter().find(|(k, _, _)| k == key) else {
            return Err((name, None));
        };
        let hi = bmax.min(*ours.end());
        let lo = bmin.max(*ours.start());
        if hi < lo {
            return Err((name, Some((bmin, bmax))));
        }
        out.push((*key, hi));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_picks_highest_common() {
        let broker = [
            (0, 0, 11),
            (1, 0, 17),
            (3, 0, 12),
            (19, 0, 7),
            (22, 0, 5),
            (18, 0, 3),
        ];
        let v = negotiate(&broker).unwrap();
        assert_eq!(v, vec![(0, 11), (1, 12), (3, 12), (19, 7), (22, 5)]);
        assert_eq!(
            negotiate(&[(0, 0, 2)]).unwrap_err(),
            ("Produce", Some((0, 2)))
        );
        assert_eq!(negotiate(&[]).unwrap_err(), ("Produce", None));
    }

    #[test]
    fn parsers_do_not_panic_on_garbage() {
        let junk: Vec<Vec<u8>> = vec![
            vec![],
            vec![0xff; 3],
            vec![0x7f; 40],
            vec![0, 0, 0, 0, 0x7f, 0xff, 0xff, 0xff],
        ];
        for b in &junk {
            for v in 3..=12 {
                let _ = parse_metadata(v.max(4), b);
                let _ = parse_produce(v, b);
                let _ = parse_create_topics(v.clamp(2, 7), b);
                let _ = parse_init_producer_id(v.min(5), b);
            }
            let _ = parse_api_versions(b);
        }
    }
}
