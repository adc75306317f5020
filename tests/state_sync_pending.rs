//! Start-up with destination topic ids not known yet (issue 13, item 3),
//! against Apache Kafka (started through tests/integration/kafka_broker.py):
//! salt, producer-snapshot and claim records of a topic id the topic-id lookup
//! cannot see at start-up are kept, and applied once the topic shows up,
//! instead of being dropped for good.

mod kafka_common;

use std::sync::Arc;
use std::time::Duration;

use kafka_common::{create_topic, host_port, Kafka};
use mirrorguard::metrics::Metrics;
use mirrorguard::mirror::SaltStore;
use mirrorguard::producer_state::{ClusterId, Origin, PartitionKey, ProducerStateRegistry};
use mirrorguard::state_store::schema::{
    MirrorPidCollisionKey, MirrorPidCollisionValue, MirrorProducerClaimKey,
    MirrorProducerClaimValue, MirrorProducerSnapshotKey, MirrorProducerSnapshotValue,
    SnapshotProducer,
};
use mirrorguard::state_store::sync::StateSync;
use mirrorguard::state_store::{StateStore, StateStoreConfig};
use tokio::net::{TcpListener, TcpStream};

const TOPIC: &str = "orders";

/// Forwards every connection on `listener` to `upstream`.
async fn forward(listener: TcpListener, upstream: String) {
    loop {
        let Ok((mut a, _)) = listener.accept().await else {
            return;
        };
        let upstream = upstream.clone();
        tokio::spawn(async move {
            if let Ok(mut b) = TcpStream::connect(&upstream).await {
                let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
            }
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_unknown_topic_ids_are_applied_when_the_topic_appears() {
    let kafka = Kafka::start();
    create_topic(&kafka.bootstrap, TOPIC);
    let view = mirrorguard::proxy::refresh::fetch_cluster_view(
        &[host_port(&kafka.bootstrap)],
        &mirrorguard::kafka_client::TransportConnector::plain(),
        Duration::from_secs(10),
        1 << 20,
    )
    .await
    .unwrap();
    let topic_id = view
        .topics
        .iter()
        .find(|(n, _, _)| n == TOPIC)
        .map(|(_, id, _)| *id)
        .unwrap();

    let store = Arc::new(
        StateStore::open(StateStoreConfig {
            topic: "__mirror_state_pending".into(),
            request_timeout: Duration::from_secs(20),
            ..StateStoreConfig::new(vec![kafka.bootstrap.clone()])
        })
        .await
        .unwrap(),
    );
    // What an earlier instance made durable: a collision salt and a
    // producer-state snapshot of orders-0.
    let origin_cluster = [7u8; 16];
    let salt_key = MirrorPidCollisionKey {
        topic_id,
        partition: 0,
        source_cluster_id: ClusterId(origin_cluster).to_string(),
        original_pid: 5,
    };
    let salt_value = MirrorPidCollisionValue {
        salt: 3,
        colliding_cluster_id: ClusterId([8; 16]).to_string(),
        timestamp_ms: 1,
        unknown_tagged_fields: Vec::new(),
    };
    store
        .append(
            salt_key.encode().unwrap(),
            Some(salt_value.encode().unwrap()),
        )
        .await
        .unwrap();
    let snap = MirrorProducerSnapshotValue {
        snapshot_offset: 42,
        producers: vec![SnapshotProducer {
            producer_id: 0x4000_0000_0000_0009,
            origin_cluster_id: origin_cluster,
            original_pid: 9,
            producer_epoch: 0,
            last_sequence: 3,
            last_offset: 41,
            coordinator_epoch: -1,
            txn_first_offset: 40,
            last_timestamp: 0,
        }],
        unknown_tagged_fields: Vec::new(),
    };
    store
        .append(
            MirrorProducerSnapshotKey {
                topic_id,
                partition: 0,
            }
            .encode(),
            Some(snap.encode().unwrap()),
        )
        .await
        .unwrap();

    // And a claim of another producer after the snapshot (the start-up load
    // defers claims to its end and keeps only their values: the record is
    // made again to be kept).
    let claimed_pid = 0x4000_0000_0000_000b;
    let claim = MirrorProducerClaimValue {
        origin_cluster_id: origin_cluster,
        original_pid: 11,
        timestamp_ms: 2,
        unknown_tagged_fields: vec![(7, vec![1, 2, 3])],
    };
    store
        .append(
            MirrorProducerClaimKey {
                topic_id,
                partition: 0,
                producer_id: claimed_pid,
            }
            .encode(),
            Some(claim.encode().unwrap()),
        )
        .await
        .unwrap();

    // A new instance whose topic-id lookup cannot reach the cluster yet.
    let parked = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let lookup = parked.local_addr().unwrap();
    drop(parked);
    let registry = Arc::new(ProducerStateRegistry::default());
    let sync = StateSync::new(
        store.clone(),
        registry.clone(),
        Metrics::new(),
        vec![("127.0.0.1".to_string(), lookup.port())],
        mirrorguard::kafka_client::TransportConnector::plain(),
    );
    sync.load().await.unwrap();
    let key = PartitionKey::new([0; 16], TOPIC, 0);
    let producers = |r: &ProducerStateRegistry| r.get(&key).map(|h| h.with(|s| s.producer_count()));
    assert_eq!(sync.pending_records(), 3, "every record kept");
    assert_eq!(
        sync.record_keys_tracked(),
        2,
        "the salt's and the snapshot's keys tracked, not the claim's"
    );
    assert_eq!(producers(&registry), None, "nothing applied yet");

    // The lookup comes back: the kept records are applied.
    let listener = TcpListener::bind(lookup).await.unwrap();
    tokio::spawn(forward(listener, kafka.bootstrap.clone()));
    SaltStore::refresh_topic_ids(&*sync).await.unwrap();
    assert_eq!(sync.pending_records(), 0);
    assert_eq!(
        producers(&registry),
        Some(2),
        "the snapshot's producer is restored and the claimed one added"
    );
    let h = registry.get(&key).unwrap();
    assert_eq!(
        h.with(|s| s.holder_of(claimed_pid)),
        Some(Origin {
            source_cluster: ClusterId(origin_cluster),
            original_pid: 11,
        }),
        "the claim is applied"
    );
    let origin = Origin {
        source_cluster: ClusterId(origin_cluster),
        original_pid: 5,
    };
    assert_eq!(
        h.with(|s| s.salts().salt_for(&origin)),
        Some(3),
        "the salt is applied"
    );
    assert_eq!(
        h.with(|s| s.open_transactions().count()),
        1,
        "its open transaction too"
    );
}
