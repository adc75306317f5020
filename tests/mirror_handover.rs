//! Handover between instances on the fetch path (issue 17): a partition an
//! instance does not serve yet is taken over before any of its batches is
//! mapped; after the take-over the source range its state has not seen is
//! replayed; an instance that learns another one served the partition since
//! takes it over again instead of mapping from stale state; a fetcher past
//! the state of a partition it serves makes it read the state again first.

use std::sync::{Arc, Mutex};

use mirrorguard::config::MirrorConfig;
use mirrorguard::handlers::{build_fetch_response, FetchPartitionResponse, FetchTopic};
use mirrorguard::lifecycle::Lifecycle;
use mirrorguard::metrics::Metrics;
use mirrorguard::mirror::handover::{recheck, take_over, ServedBy, TakeOver};
use mirrorguard::mirror::{rewrite_fetch_body, MirrorContext, Pending, PendingSalt, SaltStore};
use mirrorguard::producer_state::{PartitionKey, ProducerStateRegistry, RegistryConfig};
use mirrorguard::records::builder::{build_batch, BatchSpec, RecordSpec};

/// Source cluster id whose fold is 1.
const SOURCE: &str = "AAAAAAAAAAAAAAAAAAAAAQ";

/// A state shared with other instances (no claims needed: not durable),
/// which records the take-overs asked of it.
#[derive(Default)]
struct Shared {
    take_overs: Mutex<Vec<(PartitionKey, i64)>>,
    reads: Mutex<usize>,
}

impl SaltStore for Shared {
    fn shared(&self) -> bool {
        true
    }
    fn take_over(
        &self,
        _mirror: &str,
        jobs: Vec<TakeOver>,
    ) -> mirrorguard::BoxFuture<'static, Result<Vec<Option<ServedBy>>, mirrorguard::PersistError>>
    {
        let n = jobs.len();
        let mut t = self.take_overs.lock().unwrap();
        t.extend(jobs.into_iter().map(|j| (j.key, j.from_offset)));
        Box::pin(async move { Ok(vec![None; n]) })
    }
    fn read_state(&self) -> mirrorguard::BoxFuture<'static, Result<(), mirrorguard::PersistError>> {
        *self.reads.lock().unwrap() += 1;
        Box::pin(async { Ok(()) })
    }
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
        panic!("no collision in these tests: {salts:?}");
    }
}

fn mirror(store: Arc<Shared>) -> Arc<MirrorContext> {
    mirror_with(store, &Metrics::new())
}

fn mirror_with(store: Arc<Shared>, metrics: &Arc<Metrics>) -> Arc<MirrorContext> {
    let cfg: MirrorConfig = toml::from_str(&format!(
        "name = \"m\"\nbootstrap = \"127.0.0.1:1\"\nadvertised_host = \"127.0.0.1\"\n\
         node_port_base = 20000\nsource_bootstrap = [\"127.0.0.1:2\"]\n\
         source_cluster_id = \"{SOURCE}\"\n"
    ))
    .unwrap();
    MirrorContext::new(
        &cfg,
        Arc::new(ProducerStateRegistry::new(RegistryConfig::default())),
        store,
        Lifecycle::new(metrics.clone()),
        metrics,
    )
    .unwrap()
}

fn key() -> PartitionKey {
    PartitionKey::new([0; 16], "t", 0)
}

fn response(base_offset: i64) -> Vec<u8> {
    let batch = build_batch(
        &BatchSpec {
            base_offset,
            producer_id: 7,
            producer_epoch: 0,
            base_sequence: base_offset as i32,
            ..BatchSpec::default()
        },
        &[RecordSpec {
            value: Some(b"v"),
            ..RecordSpec::default()
        }],
    );
    let mut p0 = FetchPartitionResponse::new(0);
    p0.high_watermark = 100;
    p0.last_stable_offset = 100;
    p0.log_start_offset = 0;
    p0.records = Some(batch.into());
    build_fetch_response(12, 0, 0, 0, &[(FetchTopic::Name("t"), vec![p0])]).unwrap()
}

/// What the response at `base_offset` waits for (None: rewritten).
fn pending(m: &MirrorContext, base_offset: i64) -> Option<Pending> {
    let mut body = response(base_offset);
    rewrite_fetch_body(m, 12, &mut body, &|_, _| false).unwrap()
}

fn take_over_of(p: Option<Pending>) -> Vec<(PartitionKey, i64)> {
    match p {
        Some(Pending::TakeOver(jobs)) => jobs.into_iter().map(|j| (j.key, j.from_offset)).collect(),
        other => panic!("expected a take-over, got {other:?}"),
    }
}

#[tokio::test]
async fn a_partition_is_taken_over_before_its_first_batch_and_again_once_served_elsewhere() {
    let store = Arc::new(Shared::default());
    let m = mirror(store.clone());

    // First fetch here: nothing is mapped or observed before the take-over.
    assert_eq!(take_over_of(pending(&m, 0)), vec![(key(), 0)]);
    assert_eq!(m.registry.partition(&key()).with(|s| s.producer_count()), 0);
    take_over(
        m.clone(),
        vec![TakeOver {
            key: key(),
            from_offset: 0,
        }],
    )
    .await
    .unwrap();
    assert_eq!(store.take_overs.lock().unwrap().as_slice(), &[(key(), 0)]);
    // Owned, and the state is complete up to offset 0: rewritten and observed.
    assert!(pending(&m, 0).is_none());
    assert_eq!(m.registry.partition(&key()).with(|s| s.next_offset()), 1);
    assert!(pending(&m, 1).is_none());

    // Another instance served it since (its serving record was read): the
    // next batch here waits for a take-over again, then for the replay of
    // what the other instance forwarded.
    assert!(m.disown(&key()));
    assert_eq!(take_over_of(pending(&m, 5)), vec![(key(), 5)]);
    take_over(
        m.clone(),
        vec![TakeOver {
            key: key(),
            from_offset: 5,
        }],
    )
    .await
    .unwrap();
    match pending(&m, 5) {
        Some(Pending::Replay(jobs)) => {
            assert_eq!(jobs.len(), 1);
            assert_eq!((jobs[0].from, jobs[0].upto), (2, 5), "{jobs:?}");
        }
        other => panic!("expected a replay of [2, 5), got {other:?}"),
    }
    assert_eq!(m.registry.partition(&key()).with(|s| s.next_offset()), 2);
}

#[tokio::test]
async fn a_fetcher_past_the_state_of_an_owned_partition_reads_the_state_again_once() {
    let store = Arc::new(Shared::default());
    let m = mirror(store.clone());
    assert_eq!(take_over_of(pending(&m, 0)), vec![(key(), 0)]);
    take_over(
        m.clone(),
        vec![TakeOver {
            key: key(),
            from_offset: 0,
        }],
    )
    .await
    .unwrap();
    assert!(pending(&m, 0).is_none());
    // The fetcher is at 5, the state at 1: possibly served elsewhere within
    // the last tail round. Nothing is mapped before the state is read.
    let jobs = match pending(&m, 5) {
        Some(Pending::Recheck(jobs)) => jobs,
        other => panic!("expected a re-read of the state, got {other:?}"),
    };
    assert_eq!(m.registry.partition(&key()).with(|s| s.next_offset()), 1);
    recheck(m.clone(), jobs).await.unwrap();
    assert_eq!(*store.reads.lock().unwrap(), 1);
    // No serving record of another instance (none, or one of an older
    // release that writes none): the gap is replayed all the same.
    match pending(&m, 5) {
        Some(Pending::Replay(jobs)) => {
            assert_eq!((jobs[0].from, jobs[0].upto), (1, 5), "{jobs:?}");
        }
        other => panic!("expected a replay of [1, 5), got {other:?}"),
    }
    assert_eq!(*store.reads.lock().unwrap(), 1, "the gap is read once");
}

/// The value of one exported sample, by its full name and labels.
fn sample(metrics: &Metrics, series: &str) -> Option<f64> {
    metrics.encode().lines().find_map(|l| {
        l.strip_prefix(series)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
    })
}

#[tokio::test]
async fn take_overs_stale_drops_and_partitions_served_are_exported() {
    let metrics = Metrics::new();
    let store = Arc::new(Shared::default());
    let m = mirror_with(store, &metrics);
    let take_overs = r#"mirrorguard_mirror_events_total{mirror="m",kind="take_over"}"#;
    let stale = r#"mirrorguard_mirror_events_total{mirror="m",kind="stale_dropped"}"#;
    let served = r#"mirrorguard_partitions_served{mirror="m"}"#;
    // Registered at start-up, before any event, so alerts see a zero.
    assert_eq!(sample(&metrics, take_overs), Some(0.0));
    assert_eq!(sample(&metrics, stale), Some(0.0));
    assert_eq!(sample(&metrics, served), Some(0.0));

    let other = PartitionKey::new([0; 16], "t", 1);
    take_over(
        m.clone(),
        vec![
            TakeOver {
                key: key(),
                from_offset: 0,
            },
            TakeOver {
                key: other.clone(),
                from_offset: 0,
            },
        ],
    )
    .await
    .unwrap();
    assert_eq!(sample(&metrics, take_overs), Some(2.0));
    assert_eq!(sample(&metrics, served), Some(2.0));

    // Another instance's serving record: dropped as stale once.
    assert!(m.disown_stale(&key()));
    assert!(!m.disown_stale(&key()));
    assert_eq!(sample(&metrics, stale), Some(1.0));
    assert_eq!(sample(&metrics, served), Some(1.0));
    // A deleted destination topic is not a stale drop.
    m.forget_partition(&other);
    assert_eq!(sample(&metrics, stale), Some(1.0));
    assert_eq!(sample(&metrics, served), Some(0.0));

    // Taken back: counted again.
    take_over(
        m.clone(),
        vec![TakeOver {
            key: key(),
            from_offset: 5,
        }],
    )
    .await
    .unwrap();
    assert_eq!(sample(&metrics, take_overs), Some(3.0));
    assert_eq!(sample(&metrics, served), Some(1.0));
}
