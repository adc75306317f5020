//! A replay that cannot read part of its range marks the transaction
//! closings there unknown, so a seal cut in that part is reported incomplete
//! (`open_at_cut_incomplete`) rather than planned as if nothing had been
//! closed there. Against a real Apache Kafka source (started through
//! tests/integration/kafka_broker.py) holding two committed transactions:
//!
//! - records deleted below the log start (DeleteRecords, as retention does):
//!   the replay answers OFFSET_OUT_OF_RANGE, jumps to the log start, and the
//!   range below it is unknown;
//! - a range that reaches past the source's high watermark (a follower-side
//!   fetcher reads to the log end): the replay stops there, and the rest of
//!   the range is unknown.

mod kafka_common;

use std::sync::Arc;

use kafka_common::{create_topic, host_port, python, Kafka};
use mirrorguard::config::MirrorConfig;
use mirrorguard::lifecycle::Lifecycle;
use mirrorguard::metrics::Metrics;
use mirrorguard::mirror::replay::{replay, ReplayJob};
use mirrorguard::mirror::{MirrorContext, PendingSalt, SaltStore, SourceIdentity};
use mirrorguard::producer_state::{PartitionKey, ProducerStateRegistry, RegistryConfig};

const SOURCE: &str = "AAAAAAAAAAAAAAAAAAAAAQ";
const TOPIC: &str = "replayed";

/// A state store that keeps nothing: the replay only observes.
struct Keeps;

impl SaltStore for Keeps {
    fn topic_id(&self, _topic: &str) -> Option<[u8; 16]> {
        Some([9; 16])
    }
    fn refresh_topic_ids(
        &self,
    ) -> mirrorguard::BoxFuture<'static, Result<(), mirrorguard::PersistError>> {
        Box::pin(async { Ok(()) })
    }
    fn persist(
        &self,
        salts: Vec<PendingSalt>,
    ) -> mirrorguard::BoxFuture<'static, Result<(), mirrorguard::PersistError>> {
        panic!("no collision in this test: {salts:?}");
    }
}

fn mirror(source: &str) -> Arc<MirrorContext> {
    let metrics = Metrics::new();
    let cfg: MirrorConfig = toml::from_str(&format!(
        "name = \"m\"\nbootstrap = \"127.0.0.1:1\"\nadvertised_host = \"127.0.0.1\"\n\
         node_port_base = 20000\nsource_bootstrap = [\"{source}\"]\n\
         source_cluster_id = \"{SOURCE}\"\n"
    ))
    .unwrap();
    MirrorContext::new(
        &cfg,
        Arc::new(ProducerStateRegistry::new(RegistryConfig::default())),
        Arc::new(Keeps),
        Lifecycle::new(metrics.clone()),
        &metrics,
    )
    .unwrap()
}

/// Replays `[from, upto)` of the source partition into a fresh state and
/// returns the mirror holding it.
async fn replayed(bootstrap: &str, from: i64, upto: i64) -> Arc<MirrorContext> {
    let m = mirror(bootstrap);
    let job = ReplayJob {
        key: PartitionKey::new([0; 16], TOPIC, 0),
        source_topic: TOPIC.into(),
        partition: 0,
        from,
        upto,
    };
    replay(
        m.clone(),
        SourceIdentity::parse(SOURCE).unwrap(),
        vec![host_port(bootstrap)],
        job,
        64 << 20,
    )
    .await
    .unwrap();
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_marks_the_closings_it_could_not_read_unknown() {
    let kafka = Kafka::start();
    let bs = kafka.bootstrap.as_str();
    create_topic(bs, TOPIC);
    // Transaction 1: records at 0 and 1, COMMIT at 2. Transaction 2: a
    // record at 3, COMMIT at 4. High watermark 5.
    python(
        "import sys\nfrom confluent_kafka import Producer\n\
         p = Producer({'bootstrap.servers': sys.argv[1], 'transactional.id': 'replayed'})\n\
         p.init_transactions()\n\
         for n in (2, 1):\n\
         \x20   p.begin_transaction()\n\
         \x20   [p.produce(sys.argv[2], b'v', partition=0) for _ in range(n)]\n\
         \x20   p.commit_transaction()\n",
        &[bs, TOPIC],
    );
    let key = PartitionKey::new([0; 16], TOPIC, 0);

    // The whole range readable: both closings observed, nothing unknown.
    let m = replayed(bs, 0, 5).await;
    let h = m.registry.partition(&key);
    let markers: Vec<i64> = h.with(|s| s.closed_transactions().map(|c| c.marker_offset).collect());
    assert_eq!(markers, [2, 4]);
    assert!(!h.with(|s| s.open_at(1).incomplete));

    // Past the high watermark: 2 and 4 observed, [5, 9) not. What is known
    // is one bound (closings may be missing below it), so every cut below 9
    // is reported incomplete: conservative for the cuts below 5.
    let m = replayed(bs, 0, 9).await;
    let h = m.registry.partition(&key);
    assert_eq!(h.with(|s| s.closed_transactions().count()), 2);
    assert!(
        h.with(|s| s.open_at(8).incomplete),
        "a cut the replay could not read up to is reported incomplete"
    );
    assert!(!h.with(|s| s.open_at(9).incomplete));

    // Records below 3 deleted: the replay starts at the log start; the
    // COMMIT at 2 is not observed, so a cut at or below 2 is incomplete.
    python(
        "import sys\nfrom confluent_kafka import TopicPartition\n\
         from confluent_kafka.admin import AdminClient\n\
         a = AdminClient({'bootstrap.servers': sys.argv[1]})\n\
         [f.result() for f in a.delete_records([TopicPartition(sys.argv[2], 0, 3)]).values()]\n",
        &[bs, TOPIC],
    );
    let m = replayed(bs, 0, 5).await;
    let h = m.registry.partition(&key);
    let markers: Vec<i64> = h.with(|s| s.closed_transactions().map(|c| c.marker_offset).collect());
    assert_eq!(markers, [4]);
    assert!(
        h.with(|s| s.open_at(2).incomplete),
        "a cut below the deleted records is reported incomplete"
    );
    assert!(!h.with(|s| s.open_at(3).incomplete));
    drop(kafka);
}
