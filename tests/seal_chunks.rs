//! A seal with more open transactions than one `__mirror_state` record can
//! hold (issue 13): the open transactions taken at the cut are written as a
//! chunk generation (type 7, every record below 256 KiB) before the STOPPING
//! record, and a restarted instance rebuilds the very same seal from them.
//! Against Apache Kafka (started through tests/integration/kafka_broker.py)
//! with its default `message.max.bytes` (1 MiB), which a single record of
//! 20,000 open transactions (~1.3 MB) exceeds.

mod kafka_common;

use std::sync::Arc;
use std::time::Duration;

use kafka_common::{create_topic, host_port, Kafka};
use mirrorguard::lifecycle::seal::{decide, Decision, OpenTxn};
use mirrorguard::lifecycle::{Entry, Lifecycle, SealPlan};
use mirrorguard::metrics::Metrics;
use mirrorguard::producer_state::{
    ClosedTransaction, ClosingsSnapshot, ClusterId, OpenTransaction, Origin, PartitionKey,
    PartitionSnapshot, ProducerStateRegistry, PARTITION_SNAPSHOT_VERSION,
};
use mirrorguard::state_store::schema::{
    decode, MirrorPartitionState, SnapshotClosings, StateRecord,
};
use mirrorguard::state_store::sync::{StateSync, MAX_SNAPSHOT_BYTES};
use mirrorguard::state_store::{StateStore, StateStoreConfig};

const TOPIC: &str = "sealed";
const OPEN: usize = 20_000;
const CUT: i64 = 50_000;
const SOURCE: &str = "AAAAAAAAAAAAAAAAAAAAAQ";

async fn open_store(bootstrap: &str) -> Arc<StateStore> {
    Arc::new(
        StateStore::open(StateStoreConfig {
            topic: "__mirror_state_seal".into(),
            request_timeout: Duration::from_secs(30),
            ..StateStoreConfig::new(vec![bootstrap.to_string()])
        })
        .await
        .unwrap(),
    )
}

/// A StateSync, the life cycle persisted through it and its registry.
fn instance(
    store: Arc<StateStore>,
    bootstrap: &str,
) -> (Arc<StateSync>, Arc<Lifecycle>, Arc<ProducerStateRegistry>) {
    let metrics = Metrics::new();
    let registry = Arc::new(ProducerStateRegistry::default());
    let sync = StateSync::new(
        store,
        registry.clone(),
        metrics.clone(),
        vec![host_port(bootstrap)],
        mirrorguard::kafka_client::TransportConnector::plain(),
    );
    let lifecycle = Lifecycle::new(metrics);
    lifecycle.set_store(sync.clone());
    sync.set_lifecycle(lifecycle.clone());
    (sync, lifecycle, registry)
}

fn open_txns() -> Vec<OpenTxn> {
    (0..OPEN as i64)
        .map(|i| OpenTxn {
            producer_id: 0x4000_0000_0000_0000 + i,
            producer_epoch: (i % 7) as i16,
            coordinator_epoch: (i % 3) as i32,
            first_offset: i * 2,
            origin_cluster: [1; 16],
            original_pid: i,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seal_with_20000_open_transactions_persists_in_chunks_and_is_rebuilt() {
    let kafka = Kafka::start();
    create_topic(&kafka.bootstrap, TOPIC);
    let key = PartitionKey::new([0; 16], TOPIC, 0);

    // The cut is taken with 20,000 transactions open: STOPPING with its seal.
    let store = open_store(&kafka.bootstrap).await;
    let (sync, lifecycle, registry) = instance(store.clone(), &kafka.bootstrap);
    sync.load().await.unwrap();
    // The state has seen up to the cut and remembers a transaction closed
    // below it: the seal's chunks carry that closing (on the last chunk).
    registry
        .restore(&PartitionSnapshot {
            version: PARTITION_SNAPSHOT_VERSION,
            key: key.clone(),
            next_offset: CUT,
            producers: Vec::new(),
            salts: Vec::new(),
            closings: Some(ClosingsSnapshot {
                kept_from: CUT - 100,
                dropped_upto: -1,
                closed: vec![ClosedTransaction {
                    txn: OpenTransaction {
                        mapped_pid: 0x4000_0000_0001_0000,
                        epoch: 0,
                        first_offset: CUT - 50,
                        origin: Origin {
                            source_cluster: ClusterId([1; 16]),
                            original_pid: 99_999,
                        },
                    },
                    coordinator_epoch: 0,
                    marker_offset: CUT - 10,
                }],
            }),
        })
        .unwrap();
    let closings = registry
        .get(&key)
        .unwrap()
        .with(|s| s.closings_at_cut(CUT))
        .expect("the state has seen up to the cut");
    assert_eq!(closings.closed.len(), 1);
    // Another instance running meanwhile, tailing the topic.
    let (tailing, tailing_lifecycle, _) =
        instance(open_store(&kafka.bootstrap).await, &kafka.bootstrap);
    tailing.load().await.unwrap();
    tokio::spawn(tailing.clone().tail(Duration::from_millis(50)));
    let plan = SealPlan::build(CUT, 4, SOURCE, open_txns(), 1_700_000_000_000);
    assert_eq!(plan.len() as usize, OPEN + 1);
    let entry = Entry {
        state: mirrorguard::lifecycle::State::Stopping,
        cut: Some(CUT),
        seal_batches: Some(plan.len()),
        since_ms: 1,
        seal: Some(Arc::new(plan.clone())),
        ..Entry::new("m", SOURCE, TOPIC, 0)
    };
    lifecycle
        .commit(&key, entry)
        .await
        .expect("the seal is persisted");

    // What the state topic holds: every record below 256 KiB, the open
    // transactions in type-7 chunks of one generation, then the STOPPING record.
    let records = store.read_all().await.unwrap();
    let mut chunk_producers = 0;
    let mut chunks = 0;
    let mut last_chunk_at = -1;
    let mut stopping_at = -1;
    let mut closings_on = Vec::new();
    for r in &records {
        let size = r.key.len() + r.value.as_ref().map_or(0, |v| v.len());
        assert!(
            size <= MAX_SNAPSHOT_BYTES,
            "record at {} is {size} bytes",
            r.offset
        );
        match decode(&r.key, r.value.as_deref()).unwrap() {
            StateRecord::ProducerSnapshotChunk {
                value: Some(v),
                key,
            } => {
                assert_eq!(v.snapshot_offset, CUT);
                if let Some(c) = SnapshotClosings::from_tags(&v.unknown_tagged_fields).unwrap() {
                    assert_eq!(c.closings.len(), 1);
                    assert_eq!(c.closings[0].marker_offset, CUT - 10);
                    closings_on.push((key.chunk, v.chunk_count));
                }
                chunks += 1;
                chunk_producers += v.producers.len();
                last_chunk_at = r.offset;
            }
            StateRecord::PartitionState { value: Some(v), .. } => {
                assert_eq!(v.state, MirrorPartitionState::Stopping);
                assert_eq!((v.cut_offset, v.seal_batches), (CUT, OPEN as i32 + 1));
                stopping_at = r.offset;
            }
            StateRecord::ProducerSnapshot { .. } => panic!("a single type-5 seal record"),
            _ => {}
        }
    }
    assert_eq!((chunks, chunk_producers), (OPEN.div_ceil(3_000), OPEN));
    let count = OPEN.div_ceil(3_000) as i32;
    assert_eq!(
        closings_on,
        [(count - 1, count)],
        "the closings below the cut are on the last chunk only"
    );
    assert!(
        last_chunk_at < stopping_at,
        "the chunks precede the STOPPING record"
    );

    // The tailing instance learns the seal with its open transactions.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let tailed = loop {
        if let Some(e) = tailing_lifecycle.get(&key) {
            break e;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the tail never applied the seal"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        tailed.restored_open_txns.as_ref().map(Vec::len),
        Some(OPEN),
        "the tail found the chunked open transactions"
    );

    // A restarted instance reads them back and rebuilds the same seal.
    let store2 = open_store(&kafka.bootstrap).await;
    let (sync2, lifecycle2, registry2) = instance(store2, &kafka.bootstrap);
    sync2.load().await.unwrap();
    // With the closings below the cut: a seal planned again below it knows
    // the transaction they closed.
    assert_eq!(
        registry2
            .get(&key)
            .expect("the seal's chunks restored")
            .with(|s| s.closings_at_cut(CUT)),
        Some(closings)
    );
    let restored = lifecycle2
        .get(&key)
        .expect("the STOPPING entry is restored");
    assert_eq!(restored.cut, Some(CUT));
    let mut open = restored
        .restored_open_txns
        .clone()
        .expect("open transactions restored from the chunks");
    open.sort_by_key(|t| (t.first_offset, t.producer_id));
    assert_eq!(open, plan.open_txns);
    match decide(
        &key,
        &restored,
        CUT,
        4,
        4,
        &Vec::new,
        mirrorguard::lifecycle::StopRule::DestinationHw(None),
    ) {
        Decision::Answer(a) => {
            assert_eq!((a.aborts_served, a.barriers_served), (OPEN as u32, 1));
            let served: usize = plan.batches.iter().map(|b| b.bytes.len()).sum();
            assert_eq!(a.records.len(), served);
            assert_eq!(a.high_watermark, CUT + OPEN as i64 + 1);
        }
        other => panic!("rebuilt seal not served: {other:?}"),
    }
    drop(kafka);
}
