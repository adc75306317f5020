//! Handover between instances through a real `__mirror_state` (Apache
//! Kafka, started through tests/integration/kafka_broker.py), issue 17:
//!
//! - another instance's producer-state snapshot written as a chunk
//!   generation (type 7, more producers than one 256 KiB record holds) is
//!   restored on a take-over, so the new instance neither replays the
//!   source from the log start nor meets the partition's producers as new;
//! - the producer claims (type 6) another instance wrote past the fetcher's
//!   offset (a response it walked that the destination never appended) are
//!   applied on a take-over, so a producer the destination then meets on the
//!   mapped PID those claims hold is salted exactly as a single instance
//!   (which kept them in its state) salts it.
//!
//! Instances are StateSyncs with their own registry and MirrorContext,
//! sharing one `__mirror_state`; the fetch path is driven through
//! `rewrite_fetch_body` and the waits it asks for, as the proxy does.

mod kafka_common;

use std::sync::Arc;
use std::time::Duration;

use kafka_common::{create_topic, host_port, Kafka};
use mirrorguard::config::MirrorConfig;
use mirrorguard::handlers::{build_fetch_response, FetchPartitionResponse, FetchTopic};
use mirrorguard::lifecycle::Lifecycle;
use mirrorguard::metrics::Metrics;
use mirrorguard::mirror::handover::{recheck, take_over, TakeOver};
use mirrorguard::mirror::{map_with_salt, rewrite_fetch_body, MirrorContext, Pending, SaltStore};
use mirrorguard::pid::Layout;
use mirrorguard::producer_state::{
    ClosedTransaction, ClosingsSnapshot, ClusterId, OpenTransaction, Origin, PartitionKey,
    PartitionSnapshot, ProducerSnapshotEntry, ProducerStateRegistry, PARTITION_SNAPSHOT_VERSION,
};
use mirrorguard::records::builder::{build_batch, BatchSpec, RecordSpec};
use mirrorguard::records::{walk, Entry};
use mirrorguard::state_store::sync::StateSync;
use mirrorguard::state_store::{StateStore, StateStoreConfig};

/// Source cluster id whose fold is 1.
const SOURCE: &str = "AAAAAAAAAAAAAAAAAAAAAQ";
const FOLD: u32 = 1;

/// One mirrorguard instance: its state sync, registry and mirror.
struct Instance {
    sync: Arc<StateSync>,
    registry: Arc<ProducerStateRegistry>,
    mirror: Arc<MirrorContext>,
    metrics: Arc<Metrics>,
    lifecycle: Arc<Lifecycle>,
}

async fn instance(bootstrap: &str, state_topic: &str, id: &str) -> Instance {
    let store = Arc::new(
        StateStore::open(StateStoreConfig {
            topic: state_topic.into(),
            request_timeout: Duration::from_secs(30),
            ..StateStoreConfig::new(vec![bootstrap.to_string()])
        })
        .await
        .unwrap(),
    );
    let metrics = Metrics::new();
    let registry = Arc::new(ProducerStateRegistry::default());
    let sync = StateSync::new(
        store,
        registry.clone(),
        metrics.clone(),
        vec![host_port(bootstrap)],
        mirrorguard::kafka_client::TransportConnector::plain(),
    );
    let lifecycle = Lifecycle::new(metrics.clone());
    lifecycle.set_store(sync.clone());
    sync.set_lifecycle(lifecycle.clone());
    let cfg: MirrorConfig = toml::from_str(&format!(
        "name = \"m\"\nbootstrap = \"127.0.0.1:1\"\nadvertised_host = \"127.0.0.1\"\n\
         node_port_base = 20000\nsource_bootstrap = [\"127.0.0.1:2\"]\n\
         source_cluster_id = \"{SOURCE}\"\n"
    ))
    .unwrap();
    let mirror = MirrorContext::new(
        &cfg,
        registry.clone(),
        sync.clone(),
        lifecycle.clone(),
        &metrics,
    )
    .unwrap();
    sync.add_mirror(mirror.clone());
    sync.set_instance_id(id.to_string());
    sync.load().await.unwrap();
    Instance {
        sync,
        registry,
        mirror,
        metrics,
        lifecycle,
    }
}

fn source_cluster() -> ClusterId {
    ClusterId(mirrorguard::pid::ClusterId::parse(SOURCE).unwrap().0)
}

/// A Fetch v12 response with one idempotent batch of `pid` at `offset`.
fn response(topic: &str, offset: i64, pid: i64, sequence: i32) -> Vec<u8> {
    let batch = build_batch(
        &BatchSpec {
            base_offset: offset,
            producer_id: pid,
            producer_epoch: 0,
            base_sequence: sequence,
            ..BatchSpec::default()
        },
        &[RecordSpec {
            value: Some(b"v"),
            ..RecordSpec::default()
        }],
    );
    let mut p0 = FetchPartitionResponse::new(0);
    p0.high_watermark = offset + 1;
    p0.last_stable_offset = offset + 1;
    p0.log_start_offset = 0;
    p0.records = Some(batch.into());
    build_fetch_response(12, 0, 0, 0, &[(FetchTopic::Name(topic), vec![p0])]).unwrap()
}

/// What the instance forwards for the response: the waits it asks for are
/// run as the proxy runs them (a replay is not expected here: it would mean
/// the take-over did not bring the state up to the fetcher). Returns the
/// mapped PID of the batch and the waits met, in order.
async fn forward(i: &Instance, mut body: Vec<u8>) -> (i64, Vec<&'static str>) {
    let mut waits = Vec::new();
    loop {
        let pending = rewrite_fetch_body(&i.mirror, 12, &mut body, &|_, _| false).unwrap();
        let Some(pending) = pending else { break };
        match pending {
            Pending::TakeOver(jobs) => {
                waits.push("take_over");
                take_over(i.mirror.clone(), jobs).await.unwrap();
            }
            Pending::Recheck(jobs) => {
                waits.push("recheck");
                recheck(i.mirror.clone(), jobs).await.unwrap();
            }
            Pending::Claims(claims) => {
                waits.push("claims");
                let records = claims
                    .iter()
                    .map(|(h, new)| (h.key().clone(), new.clone()))
                    .collect();
                i.sync.persist_claims(records).await.unwrap();
            }
            Pending::Salts(salts) => {
                waits.push("salts");
                SaltStore::persist(&*i.sync, salts).await.unwrap();
            }
            Pending::TopicIds => {
                waits.push("topic_ids");
                i.sync.refresh_topic_ids().await.unwrap();
            }
            Pending::Replay(jobs) => panic!("unexpected replay of {jobs:?}: waits {waits:?}"),
        }
    }
    (mapped_pid_in(&body), waits)
}

/// The producer id of the (one) batch of a Fetch v12 response.
fn mapped_pid_in(body: &[u8]) -> i64 {
    let mut pid = None;
    mirrorguard::handlers::walk_fetch_response(12, body, &mut |p| {
        let records = body.get(p.records.clone().unwrap_or(0..0)).unwrap_or(&[]);
        if let Some(Ok(Entry::V2(h))) = walk(records).next() {
            pid = Some(h.producer_id);
        }
    })
    .unwrap();
    pid.expect("a batch in the response")
}

fn key(topic: &str) -> PartitionKey {
    PartitionKey::new([0; 16], topic, 0)
}

/// `i` holds the partition up to offset 10 with `n` idempotent producers
/// (source PIDs 0..n, last sequence 4 at offset 9), as if it had served it.
fn serve_up_to_10(i: &Instance, topic: &str, n: i64) {
    serve_up_to_10_with(i, topic, n, None);
}

/// As [`serve_up_to_10`], the state remembering `closings`.
fn serve_up_to_10_with(i: &Instance, topic: &str, n: i64, closings: Option<ClosingsSnapshot>) {
    let producers: Vec<ProducerSnapshotEntry> = (0..n)
        .map(|p| ProducerSnapshotEntry {
            mapped_pid: map_with_salt(p, FOLD, 0, Layout::High),
            origin: Origin {
                source_cluster: source_cluster(),
                original_pid: p,
            },
            epoch: 0,
            last_sequence: 4,
            last_offset: 9,
            last_timestamp: 1,
            last_seen_ms: mirrorguard::lifecycle::now_ms(),
            coordinator_epoch: -1,
            transaction_first_offset: None,
        })
        .collect();
    i.registry
        .restore(&PartitionSnapshot {
            version: PARTITION_SNAPSHOT_VERSION,
            key: key(topic),
            next_offset: 10,
            producers,
            salts: Vec::new(),
            closings,
        })
        .unwrap();
}

fn counter(m: &Metrics, kind: &str) -> f64 {
    let series =
        format!("mirrorguard_state_store_ops_total{{listener=\"__mirror_state\",kind=\"{kind}\"}}");
    m.encode()
        .lines()
        .find_map(|l| {
            l.strip_prefix(series.as_str())
                .and_then(|r| r.trim().parse().ok())
        })
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn take_over_restores_chunked_snapshots_and_claims_of_other_instances() {
    let kafka = Kafka::start();
    let bs = kafka.bootstrap.as_str();

    // -- Another instance's chunked snapshot (type 7) is restored. --------
    let topic = "chunked";
    create_topic(bs, topic);
    let a = instance(bs, "__mirror_state_h1", "a").await;
    let b = instance(bs, "__mirror_state_h1", "b").await;
    // A serves the partition up to offset 10 with 5,000 producers: more
    // than one type-5 record holds, so its snapshot is a chunk generation.
    serve_up_to_10(&a, topic, 5_000);
    assert_eq!(a.sync.snapshot_once().await.unwrap(), 1);
    assert_eq!(counter(&a.metrics, "snapshot_chunked"), 1.0);
    SaltStore::read_state(&*b.sync).await.unwrap();
    // What B keeps of it is where it is, not the 5,000 producers.
    assert!(
        b.sync.others_memory_bytes() < 512,
        "{} bytes kept for other instances' records",
        b.sync.others_memory_bytes()
    );

    // B's broker becomes the leader at offset 10: B takes the partition
    // over from A's generation (no replay from offset 0), and producer 7's
    // next batch continues its sequence.
    let (mapped, waits) = forward(&b, response(topic, 10, 7, 5)).await;
    assert_eq!(waits, ["take_over"], "no replay, no new claim");
    assert_eq!(mapped, map_with_salt(7, FOLD, 0, Layout::High));
    assert_eq!(counter(&b.metrics, "take_over_chunked_restore"), 1.0);
    let h = b.registry.get(&key(topic)).unwrap();
    assert_eq!(h.with(|s| s.producer_count()), 5_000);
    assert_eq!(h.with(|s| s.next_offset()), 11);
    assert_eq!(h.with(|s| s.producer(mapped).unwrap().last_sequence), 5);

    // -- Claims another instance wrote past the fetcher are applied, --------
    // from the claim records, or from its snapshot past the fetcher once
    // that snapshot made it tombstone them.
    claims_past_the_fetcher(bs, "claims", false).await;
    claims_past_the_fetcher(bs, "claims_snapshotted", true).await;
    refused_snapshot_falls_back_to_the_next(bs, "refused").await;
    chunked_snapshots_carry_closings(bs, "chunked_closings").await;
    drop(kafka);
}

/// A's type-5 snapshot at 10 is followed by a record of the same partition
/// that the registry refuses (a producer listed twice: no mirrorguard
/// writes it). B's take-over at 10 tries the refused one first (the record
/// written last wins a tie) and must go on to A's, not stop as if it had
/// restored something.
async fn refused_snapshot_falls_back_to_the_next(bs: &str, topic: &str) {
    use mirrorguard::state_store::schema::{decode, StateRecord};

    create_topic(bs, topic);
    let state_topic = format!("__mirror_state_{topic}");
    let a = instance(bs, &state_topic, "a").await;
    let b = instance(bs, &state_topic, "b").await;
    serve_up_to_10(&a, topic, 3);
    assert_eq!(a.sync.snapshot_once().await.unwrap(), 1);

    // The refused record: A's snapshot with its first producer twice.
    let raw = StateStore::open(StateStoreConfig {
        topic: state_topic.clone(),
        request_timeout: Duration::from_secs(30),
        ..StateStoreConfig::new(vec![bs.to_string()])
    })
    .await
    .unwrap();
    let (snapshot_key, mut value) = raw
        .read_all()
        .await
        .unwrap()
        .into_iter()
        .find_map(|r| match decode(&r.key, r.value.as_deref()) {
            Ok(StateRecord::ProducerSnapshot { value: Some(v), .. }) => Some((r.key, v)),
            _ => None,
        })
        .expect("A's type-5 snapshot");
    let first = value.producers[0];
    value.producers.push(first);
    raw.append(snapshot_key.to_vec(), Some(value.encode().unwrap()))
        .await
        .unwrap();

    SaltStore::read_state(&*b.sync).await.unwrap();
    let (mapped, waits) = forward(&b, response(topic, 10, 1, 5)).await;
    assert_eq!(waits, ["take_over"], "restored from A's snapshot: no claim");
    assert_eq!(counter(&b.metrics, "snapshot_restore_refused"), 1.0);
    assert_eq!(counter(&b.metrics, "take_over_restore"), 1.0);
    assert_eq!(mapped, map_with_salt(1, FOLD, 0, Layout::High));
    let h = b.registry.get(&key(topic)).unwrap();
    assert_eq!(h.with(|s| s.producer_count()), 3);
    assert_eq!(h.with(|s| s.producer(mapped).unwrap().last_sequence), 5);
}

/// A (with B sharing its state) forwards P at 0, snapshots at 1, forwards X
/// at 1 (a response the destination never appends), and with
/// `snapshot_after` snapshots again (at 2, past the fetcher: X's claim is
/// tombstoned); then leadership moves and B's fetcher asks for 1 and gets Z,
/// which maps onto X's PID. B must salt Z exactly as a single instance does.
async fn claims_past_the_fetcher(bs: &str, topic: &str, snapshot_after: bool) {
    // X (source PID 5) and Z (an oversized source PID that folds onto 5)
    // map to the same PID without a salt.
    let (x, z) = (5i64, (1i64 << 31) | 4);
    assert_eq!(
        map_with_salt(x, FOLD, 0, Layout::High),
        map_with_salt(z, FOLD, 0, Layout::High)
    );
    create_topic(bs, topic);

    // The reference: one instance, no move. It forwards producer P at 0,
    // X at 1 (a response the destination never appends), then the fetcher
    // asks for 1 again and the source has Z there (the fetcher reads past
    // the source's high watermark, which a source leader change truncates).
    let single = instance(bs, &format!("__mirror_state_{topic}_ref"), "ref").await;
    forward(&single, response(topic, 0, 100, 0)).await;
    let (single_x, _) = forward(&single, response(topic, 1, x, 0)).await;
    let (single_z, single_waits) = forward(&single, response(topic, 1, z, 0)).await;
    // Z collides with X, which the state holds; the batch is below what
    // the state has seen, so it starts no producer (no claim).
    assert_eq!(single_waits, ["salts"]);
    assert_ne!(single_z, single_x);

    // Two instances: A forwards P at 0, snapshots at 1, forwards X at 1;
    // then leadership moves and B's fetcher asks for 1 and gets Z.
    let a = instance(bs, &format!("__mirror_state_{topic}"), "a").await;
    let b = instance(bs, &format!("__mirror_state_{topic}"), "b").await;
    forward(&a, response(topic, 0, 100, 0)).await;
    assert_eq!(a.sync.snapshot_once().await.unwrap(), 1);
    let (a_x, waits) = forward(&a, response(topic, 1, x, 0)).await;
    assert_eq!(waits, ["claims"]);
    assert_eq!(a_x, single_x);
    if snapshot_after {
        assert_eq!(a.sync.snapshot_once().await.unwrap(), 1);
        // Tombstone rounds: P's claim after the first snapshot, X's now.
        assert_eq!(counter(&a.metrics, "claim_tombstone"), 2.0);
    }
    SaltStore::read_state(&*b.sync).await.unwrap();
    let (b_z, waits) = forward(&b, response(topic, 1, z, 0)).await;
    assert_eq!(
        waits,
        ["take_over", "salts"],
        "B holds X's claim as the single instance does: Z collides with it"
    );
    assert_eq!(b_z, single_z, "Z is salted exactly as by a single instance");
    assert_eq!(counter(&b.metrics, "take_over_claim"), 1.0, "X's claim");
    let hb = b.registry.get(&key(topic)).unwrap();
    let hs = single.registry.get(&key(topic)).unwrap();
    for pid in [
        single_x,
        single_z,
        map_with_salt(100, FOLD, 0, Layout::High),
    ] {
        assert_eq!(
            hb.with(|s| s.holder_of(pid)),
            hs.with(|s| s.holder_of(pid)),
            "holder of {pid:#x}"
        );
    }
}

/// A chunk generation (5,000 producers) carries the partition's transaction
/// closings as a type-5 record does: a restarted instance restores them
/// from it, and another instance re-planning a seal below its cut (a new
/// destination leader that truncated, the source gone) restores the
/// generation past the fetcher because its closings reach down to it.
async fn chunked_snapshots_carry_closings(bs: &str, topic: &str) {
    create_topic(bs, topic);
    let state_topic = format!("__mirror_state_{topic}");
    let a = instance(bs, &state_topic, "a").await;
    // B runs before A's snapshot: it learns of it as another instance's.
    let b = instance(bs, &state_topic, "b").await;
    // Two transactions of producer 1 closed at 3 and 6 (begun at 1 and 4).
    let closing = |first: i64, marker: i64| ClosedTransaction {
        txn: OpenTransaction {
            mapped_pid: map_with_salt(1, FOLD, 0, Layout::High),
            epoch: 0,
            first_offset: first,
            origin: Origin {
                source_cluster: source_cluster(),
                original_pid: 1,
            },
        },
        coordinator_epoch: 0,
        marker_offset: marker,
    };
    let closings = ClosingsSnapshot {
        kept_from: 0,
        dropped_upto: -1,
        closed: vec![closing(1, 3), closing(4, 6)],
    };
    serve_up_to_10_with(&a, topic, 5_000, Some(closings));
    assert_eq!(a.sync.snapshot_once().await.unwrap(), 1);
    assert_eq!(counter(&a.metrics, "snapshot_chunked"), 1.0);
    let markers = |i: &Instance| {
        i.registry.get(&key(topic)).map_or(Vec::new(), |h| {
            h.with(|s| s.closed_transactions().map(|c| c.marker_offset).collect())
        })
    };

    // A restart: the generation comes back with its closings.
    let restarted = instance(bs, &state_topic, "a").await;
    assert_eq!(
        restarted
            .registry
            .get(&key(topic))
            .unwrap()
            .with(|s| s.producer_count()),
        5_000
    );
    assert_eq!(markers(&restarted), [3, 6], "closings restored at start-up");

    // B finds the partition STOPPING with its cut at 10, and its fetcher
    // (a new leader that truncated) at 8: the seal is planned again below
    // the cut, from A's generation at 10 whose closings reach down to 8.
    SaltStore::read_state(&*b.sync).await.unwrap();
    b.lifecycle.restore(
        key(topic),
        mirrorguard::lifecycle::Entry {
            state: mirrorguard::lifecycle::State::Stopping,
            cut: Some(10),
            seal_batches: Some(1),
            since_ms: 1,
            ..mirrorguard::lifecycle::Entry::new("m", SOURCE, topic, 0)
        },
    );
    take_over(
        b.mirror.clone(),
        vec![TakeOver {
            key: key(topic),
            from_offset: 8,
        }],
    )
    .await
    .unwrap();
    assert_eq!(counter(&b.metrics, "take_over_chunked_restore"), 1.0);
    assert_eq!(markers(&b), [3, 6], "closings restored on the take-over");
}
