//! Kafka API keys: the numbers the proxy routes on, and their names for logs
//! and metric labels.

/// Produce.
pub const PRODUCE: i16 = 0;
/// Fetch.
pub const FETCH: i16 = 1;
/// Metadata.
pub const METADATA: i16 = 3;
/// FindCoordinator.
pub const FIND_COORDINATOR: i16 = 10;
/// ApiVersions.
pub const API_VERSIONS: i16 = 18;
/// DescribeCluster.
pub const DESCRIBE_CLUSTER: i16 = 60;

/// Highest API key with a name in [`api_name`]; also the size of per-key tables.
pub const MAX_KNOWN_API_KEY: i16 = 92;

const NAMES: [&str; (MAX_KNOWN_API_KEY + 1) as usize] = [
    "Produce",
    "Fetch",
    "ListOffsets",
    "Metadata",
    "LeaderAndIsr",
    "StopReplica",
    "UpdateMetadata",
    "ControlledShutdown",
    "OffsetCommit",
    "OffsetFetch",
    "FindCoordinator",
    "JoinGroup",
    "Heartbeat",
    "LeaveGroup",
    "SyncGroup",
    "DescribeGroups",
    "ListGroups",
    "SaslHandshake",
    "ApiVersions",
    "CreateTopics",
    "DeleteTopics",
    "DeleteRecords",
    "InitProducerId",
    "OffsetForLeaderEpoch",
    "AddPartitionsToTxn",
    "AddOffsetsToTxn",
    "EndTxn",
    "WriteTxnMarkers",
    "TxnOffsetCommit",
    "DescribeAcls",
    "CreateAcls",
    "DeleteAcls",
    "DescribeConfigs",
    "AlterConfigs",
    "AlterReplicaLogDirs",
    "DescribeLogDirs",
    "SaslAuthenticate",
    "CreatePartitions",
    "CreateDelegationToken",
    "RenewDelegationToken",
    "ExpireDelegationToken",
    "DescribeDelegationToken",
    "DeleteGroups",
    "ElectLeaders",
    "IncrementalAlterConfigs",
    "AlterPartitionReassignments",
    "ListPartitionReassignments",
    "OffsetDelete",
    "DescribeClientQuotas",
    "AlterClientQuotas",
    "DescribeUserScramCredentials",
    "AlterUserScramCredentials",
    "Vote",
    "BeginQuorumEpoch",
    "EndQuorumEpoch",
    "DescribeQuorum",
    "AlterPartition",
    "UpdateFeatures",
    "Envelope",
    "FetchSnapshot",
    "DescribeCluster",
    "DescribeProducers",
    "BrokerRegistration",
    "BrokerHeartbeat",
    "UnregisterBroker",
    "DescribeTransactions",
    "ListTransactions",
    "AllocateProducerIds",
    "ConsumerGroupHeartbeat",
    "ConsumerGroupDescribe",
    "ControllerRegistration",
    "GetTelemetrySubscriptions",
    "PushTelemetry",
    "AssignReplicasToDirs",
    "ListClientMetricsResources",
    "DescribeTopicPartitions",
    "ShareGroupHeartbeat",
    "ShareGroupDescribe",
    "ShareFetch",
    "ShareAcknowledge",
    "AddRaftVoter",
    "RemoveRaftVoter",
    "UpdateRaftVoter",
    "InitializeShareGroupState",
    "ReadShareGroupState",
    "WriteShareGroupState",
    "DeleteShareGroupState",
    "ReadShareGroupStateSummary",
    "StreamsGroupHeartbeat",
    "StreamsGroupDescribe",
    "DescribeShareGroupOffsets",
    "AlterShareGroupOffsets",
    "DeleteShareGroupOffsets",
];

/// The API's name, or `None` for a key this build does not know (forwarded
/// opaquely all the same).
pub fn api_name(api_key: i16) -> Option<&'static str> {
    usize::try_from(api_key)
        .ok()
        .and_then(|k| NAMES.get(k).copied())
}

/// Metric label for an API key: its name, or `unknown` for every key this
/// build does not know (one label, so hostile clients cannot create a series
/// per key; logs carry the number).
pub fn api_label(api_key: i16) -> &'static str {
    api_name(api_key).unwrap_or("unknown")
}

/// Name for logs: the API's name, or `unknown(<key>)`.
pub fn api_display(api_key: i16) -> String {
    match api_name(api_key) {
        Some(n) => n.to_string(),
        None => format!("unknown({api_key})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(api_name(PRODUCE), Some("Produce"));
        assert_eq!(api_name(API_VERSIONS), Some("ApiVersions"));
        assert_eq!(api_name(DESCRIBE_CLUSTER), Some("DescribeCluster"));
        assert_eq!(api_name(FIND_COORDINATOR), Some("FindCoordinator"));
        assert_eq!(api_name(75), Some("DescribeTopicPartitions"));
        assert_eq!(api_label(10000), "unknown");
        assert_eq!(api_label(-1), "unknown");
        assert_eq!(api_display(10000), "unknown(10000)");
    }
}
