//! `__mirror_state` synchronisation against a real Tansu broker: a salt
//! record written by another instance at a lower offset wins over ours, and
//! when its salt differs it is written again so that compaction (which keeps
//! the last record of a key) cannot leave the losing salt behind.

#[path = "tansu_fixture/mod.rs"]
mod tansu_fixture;

use std::process::Command;
use std::sync::Arc;

use mirrorguard::metrics::Metrics;
use mirrorguard::mirror::{PendingSalt, SaltStore};
use mirrorguard::producer_state::{
    ClusterId, Origin, PartitionKey, ProducerStateRegistry, SaltChoice,
};
use mirrorguard::state_store::schema::{
    decode, MirrorPidCollisionKey, MirrorPidCollisionValue, StateRecord,
};
use mirrorguard::state_store::sync::StateSync;
use mirrorguard::state_store::StateStore;
use tansu_fixture::{root, Tansu};

const TOPIC: &str = "orders";

fn create_topic(tansu: &Tansu) {
    let py = root().join(".tools/venv/bin/python");
    assert!(py.is_file(), "run scripts/install-test-deps.sh first");
    let out = Command::new(py)
        .args([
            "-c",
            "import sys\nfrom confluent_kafka.admin import AdminClient, NewTopic\n\
             a = AdminClient({'bootstrap.servers': sys.argv[1]})\n\
             [f.result() for f in a.create_topics([NewTopic(sys.argv[2], 1, 1)]).values()]",
            &tansu.addr(),
            TOPIC,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lower_offset_record_wins_and_is_reasserted() {
    let tansu = Tansu::start();
    create_topic(&tansu);
    let store = Arc::new(
        StateStore::open(tansu.config("__mirror_state"))
            .await
            .unwrap(),
    );
    let registry = Arc::new(ProducerStateRegistry::default());
    let sync = StateSync::new(
        store.clone(),
        registry.clone(),
        Metrics::new(),
        vec![("127.0.0.1".to_string(), tansu.port)],
        mirrorguard::kafka_client::TransportConnector::plain(),
    );
    sync.load().await.unwrap();

    let b = ClusterId([2; 16]);
    let a = ClusterId([1; 16]);
    let origin = Origin {
        source_cluster: b,
        original_pid: 1,
    };
    // Read from the state cluster's Metadata by `load`.
    let topic_id = sync
        .topic_id(TOPIC)
        .expect("topic id of the destination topic");

    // "Another instance" recorded salt 111 first (offset 0).
    let key = MirrorPidCollisionKey {
        topic_id,
        partition: 0,
        source_cluster_id: b.to_string(),
        original_pid: 1,
    }
    .encode()
    .unwrap();
    let theirs = MirrorPidCollisionValue {
        salt: 111,
        colliding_cluster_id: a.to_string(),
        timestamp_ms: 1,
        unknown_tagged_fields: vec![],
    }
    .encode()
    .unwrap();
    assert_eq!(store.append(key.clone(), Some(theirs)).await.unwrap(), 0);

    // This instance chose salt 222 for the same key without having seen it.
    let pending = PendingSalt {
        partition: PartitionKey::new([0; 16], TOPIC, 0),
        origin,
        choice: SaltChoice {
            salt: 222,
            mapped_pid: 42,
            holder: Origin {
                source_cluster: a,
                original_pid: 1,
            },
            attempts: 1,
        },
        timestamp_ms: 2,
    };
    sync.persist(vec![pending]).await.unwrap();

    // The lowest offset (theirs) is in force here...
    let salt = registry
        .partition(&PartitionKey::new([0; 16], TOPIC, 0))
        .with(|s| s.salts().salt_for(&origin));
    assert_eq!(salt, Some(111));
    // ...and written again after ours, so compaction keeps 111 too.
    let records = store.read_all().await.unwrap();
    let salts: Vec<(i64, i64)> = records
        .iter()
        .filter(|r| r.key == key)
        .map(|r| match decode(&r.key, r.value.as_deref()).unwrap() {
            StateRecord::PidCollision { value: Some(v), .. } => (r.offset, v.salt),
            other => panic!("unexpected record {other:?}"),
        })
        .collect();
    assert_eq!(salts, vec![(0, 111), (1, 222), (2, 111)]);
}
