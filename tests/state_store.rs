//! State store tests: the `__mirror_state` schemas (byte-exact against the
//! SPEC 2.2 tables, round trips, decode never panics) and the client against
//! a real Tansu broker (topic creation, append/read byte-exact, a second
//! instance reading and tailing, reconnects, clear errors).
//!
//! Tansu comes from `scripts/install-test-deps.sh` (`.tools/bin/tansu`, or
//! `TANSU_BIN`); the tests fail, naming that script, when it is missing.

use std::net::Shutdown;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mirrorguard::state_store::schema::{
    decode, MirrorPartitionState, MirrorPartitionStateKey, MirrorPartitionStateValue,
    MirrorPidCollisionKey, MirrorPidCollisionValue, MirrorProducerSnapshotKey,
    MirrorProducerSnapshotValue, SnapshotProducer, StateKey, StateRecord,
};
use mirrorguard::state_store::{Connector, StateStore, StateStoreConfig, StoredRecord};
use proptest::prelude::*;

// ---------------------------------------------------------------------------
// Tansu fixture (shared with other broker tests)

#[path = "tansu_fixture/mod.rs"]
mod tansu_fixture;
use tansu_fixture::{free_port, root, Tansu};

/// Runs a Python snippet with the project venv's interpreter (confluent-kafka
/// AdminClient as an independent reader of the topic's configuration).
fn python(script: &str, args: &[&str]) -> String {
    let py = root().join(".tools/venv/bin/python");
    assert!(
        py.is_file(),
        "{} not found: run scripts/install-test-deps.sh first",
        py.display()
    );
    let out = Command::new(py)
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

// ---------------------------------------------------------------------------
// Sample records of every type

fn topic_id(n: u8) -> [u8; 16] {
    [n; 16]
}

fn collision(n: i64) -> (MirrorPidCollisionKey, MirrorPidCollisionValue) {
    (
        MirrorPidCollisionKey {
            topic_id: topic_id(1),
            partition: 2,
            source_cluster_id: "MkU3OEVBNTcwNTJENDM2Qg".into(),
            original_pid: n,
        },
        MirrorPidCollisionValue {
            salt: n * 7 + 1,
            colliding_cluster_id: "3243a1c6-1d26-4a0a-8b0e-4c1c1a1b2c3d".into(),
            timestamp_ms: 1_700_000_000_000 + n,
            unknown_tagged_fields: vec![],
        },
    )
}

fn partition_state(n: i32) -> (MirrorPartitionStateKey, MirrorPartitionStateValue) {
    (
        MirrorPartitionStateKey {
            topic_id: topic_id(2),
            partition: n,
        },
        MirrorPartitionStateValue {
            mirror: "eu-to-us".into(),
            topic_name: format!("orders-{n}"),
            state: MirrorPartitionState::from_code((n % 5) as i8),
            source_cluster_id: "MkU3OEVBNTcwNTJENDM2Qg".into(),
            cut_offset: if n % 2 == 0 { -1 } else { 1234 },
            seal_batches: if n % 2 == 0 { -1 } else { 2 },
            reason: (n == 4).then(|| "source unreachable".to_owned()),
            timestamp_ms: 1_700_000_000_000,
            unknown_tagged_fields: vec![],
        },
    )
}

fn snapshot(n: i32) -> (MirrorProducerSnapshotKey, MirrorProducerSnapshotValue) {
    let producers = (0..n)
        .map(|i| SnapshotProducer {
            producer_id: (1 << 62) | i64::from(i),
            origin_cluster_id: topic_id(9),
            original_pid: i64::from(i),
            producer_epoch: 3,
            last_sequence: 41,
            last_offset: 99,
            coordinator_epoch: 5,
            txn_first_offset: if i % 2 == 0 { -1 } else { 90 },
            last_timestamp: 1_700_000_000_123,
        })
        .collect();
    (
        MirrorProducerSnapshotKey {
            topic_id: topic_id(3),
            partition: n,
        },
        MirrorProducerSnapshotValue {
            snapshot_offset: 100,
            producers,
            unknown_tagged_fields: vec![],
        },
    )
}

/// `(key, value)` pairs of every type, tombstones and an unknown type.
fn sample_records() -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
    let mut v = Vec::new();
    for n in 0..3 {
        let (k, val) = collision(n);
        v.push((k.encode().unwrap(), Some(val.encode().unwrap())));
    }
    for n in 0..5 {
        let (k, val) = partition_state(n);
        v.push((k.encode(), Some(val.encode().unwrap())));
    }
    for n in [0, 1, 4] {
        let (k, val) = snapshot(n);
        v.push((k.encode(), Some(val.encode().unwrap())));
    }
    v.push((collision(0).0.encode().unwrap(), None));
    v.push((partition_state(1).0.encode(), None));
    v.push((vec![0, 42, 1, 2, 3], Some(vec![0, 0, 7])));
    v
}

fn pairs(recs: &[StoredRecord]) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
    recs.iter()
        .map(|r| (r.key.to_vec(), r.value.as_ref().map(|v| v.to_vec())))
        .collect()
}

// ---------------------------------------------------------------------------
// Schemas

/// SPEC 2.2's type-3 record, against bytes computed by hand from its tables.
#[test]
fn collision_record_is_byte_exact_to_spec() {
    let key = MirrorPidCollisionKey {
        topic_id: [
            0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd,
            0xee, 0xff,
        ],
        partition: 258,
        source_cluster_id: "MkU3OEVBNTcwNTJENDM2Qg".into(),
        original_pid: 5,
    };
    let value = MirrorPidCollisionValue {
        salt: -2,
        colliding_cluster_id: "clusterB".into(),
        timestamp_ms: 1_700_000_000_000,
        unknown_tagged_fields: vec![],
    };
    let mut want_key = vec![0x00, 0x03]; // int16 record type 3
    want_key.extend([
        0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee,
        0xff,
    ]); // TopicId uuid
    want_key.extend([0x00, 0x00, 0x01, 0x02]); // Partition int32 258
    want_key.extend([0x00, 0x16]); // SourceClusterId: int16 length 22 (not flexible)
    want_key.extend(b"MkU3OEVBNTcwNTJENDM2Qg");
    want_key.extend([0, 0, 0, 0, 0, 0, 0, 5]); // OriginalPid int64
    let mut want_value = vec![0x00, 0x00]; // int16 version 0
    want_value.extend([0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe]); // Salt -2
    want_value.push(0x09); // CollidingClusterId: compact, uvarint 8 + 1
    want_value.extend(b"clusterB");
    // TimestampMs 1_700_000_000_000 = 0x0000018B_CFE56800
    want_value.extend([0x00, 0x00, 0x01, 0x8b, 0xcf, 0xe5, 0x68, 0x00]);
    want_value.push(0x00); // empty tagged-field section
    assert_eq!(key.encode().unwrap(), want_key);
    assert_eq!(value.encode().unwrap(), want_value);
    assert_eq!(
        decode(&want_key, Some(&want_value)).unwrap(),
        StateRecord::PidCollision {
            key,
            value: Some(value)
        }
    );
}

#[test]
fn every_sample_round_trips() {
    for (k, v) in sample_records() {
        let rec = decode(&k, v.as_deref()).unwrap();
        match rec.encode() {
            Some(enc) => assert_eq!(enc.unwrap(), (k, v)),
            None => assert_eq!(rec, StateRecord::Unknown { record_type: 42 }),
        }
    }
    // A newer value version keeps its decoded key.
    let k = partition_state(3).0;
    assert_eq!(
        decode(&k.encode(), Some(&[0, 5, 1, 2, 3])).unwrap(),
        StateRecord::NewerVersion {
            key: StateKey::PartitionState(k),
            version: 5
        }
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Arbitrary bytes never panic the decoder.
    #[test]
    fn decode_never_panics(key in proptest::collection::vec(any::<u8>(), 0..80),
                           value in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..300))) {
        let _ = decode(&key, value.as_deref());
    }

    /// Valid keys with arbitrary (or mutated valid) values never panic.
    #[test]
    fn decode_known_key_with_garbage_value_never_panics(
        t in 3i16..=5, garbage in proptest::collection::vec(any::<u8>(), 0..300),
        flip in any::<usize>(), cut in any::<usize>(),
    ) {
        let (k, mut v) = match t {
            3 => { let (k, v) = collision(3); (k.encode().unwrap(), v.encode().unwrap()) }
            4 => { let (k, v) = partition_state(4); (k.encode(), v.encode().unwrap()) }
            _ => { let (k, v) = snapshot(3); (k.encode(), v.encode().unwrap()) }
        };
        let _ = decode(&k, Some(&garbage));
        let i = flip % v.len();
        v[i] ^= 0xff;
        let _ = decode(&k, Some(&v));
        v.truncate(cut % (v.len() + 1));
        let _ = decode(&k, Some(&v));
    }

    /// Arbitrary values of every type round-trip.
    #[test]
    fn arbitrary_values_round_trip(
        tid in any::<[u8; 16]>(), part in any::<i32>(), pid in any::<i64>(), salt in any::<i64>(),
        s1 in "[ -~]{0,40}", s2 in "\\PC{0,20}", state in any::<i8>(), reason in proptest::option::of("\\PC{0,30}"),
        nums in proptest::collection::vec((any::<i64>(), any::<i16>(), any::<i32>()), 0..5),
    ) {
        let c = StateRecord::PidCollision {
            key: MirrorPidCollisionKey { topic_id: tid, partition: part, source_cluster_id: s1.clone(), original_pid: pid },
            value: Some(MirrorPidCollisionValue { salt, colliding_cluster_id: s2.clone(), timestamp_ms: pid, unknown_tagged_fields: vec![] }),
        };
        let p = StateRecord::PartitionState {
            key: MirrorPartitionStateKey { topic_id: tid, partition: part },
            value: Some(MirrorPartitionStateValue {
                mirror: s1.clone(), topic_name: s2.clone(), state: MirrorPartitionState::from_code(state),
                source_cluster_id: s1, cut_offset: salt, seal_batches: part, reason,
                timestamp_ms: pid, unknown_tagged_fields: vec![(3, s2.into_bytes())],
            }),
        };
        let s = StateRecord::ProducerSnapshot {
            key: MirrorProducerSnapshotKey { topic_id: tid, partition: part },
            value: Some(MirrorProducerSnapshotValue {
                snapshot_offset: salt,
                producers: nums.iter().map(|&(a, b, c)| SnapshotProducer {
                    producer_id: a, origin_cluster_id: tid, original_pid: a ^ 1, producer_epoch: b,
                    last_sequence: c, last_offset: a, coordinator_epoch: c, txn_first_offset: -1, last_timestamp: a,
                }).collect(),
                unknown_tagged_fields: vec![],
            }),
        };
        for rec in [c, p, s] {
            let (k, v) = rec.encode().unwrap().unwrap();
            prop_assert_eq!(decode(&k, v.as_deref()).unwrap(), rec);
        }
    }
}

// ---------------------------------------------------------------------------
// Client against Tansu

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_missing_topic_compacted_with_one_partition() {
    let tansu = Tansu::start();
    let store = StateStore::open(tansu.config("__mirror_state"))
        .await
        .expect("open creates the topic");
    assert_eq!(store.topic(), "__mirror_state");
    assert!(store.read_all().await.unwrap().is_empty());
    // Checked by an independent client: confluent-kafka's AdminClient.
    let out = python(
        r#"
import sys
from confluent_kafka.admin import AdminClient, ConfigResource
a = AdminClient({"bootstrap.servers": sys.argv[1]})
md = a.list_topics("__mirror_state", timeout=10)
print("partitions", len(md.topics["__mirror_state"].partitions))
for f in a.describe_configs([ConfigResource("TOPIC", "__mirror_state")]).values():
    print("cleanup.policy", f.result(timeout=10)["cleanup.policy"].value)
"#,
        &[&tansu.addr()],
    );
    assert!(out.contains("partitions 1"), "{out}");
    assert!(out.contains("cleanup.policy compact"), "{out}");
    // Opening again finds the existing topic.
    drop(store);
    StateStore::open(tansu.config("__mirror_state"))
        .await
        .expect("reopen");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_every_type_and_reads_back_byte_exact() {
    let tansu = Tansu::start();
    let store = StateStore::open(tansu.config("__mirror_state"))
        .await
        .unwrap();
    let sample = sample_records();
    let mut offsets = Vec::new();
    for (k, v) in &sample {
        offsets.push(store.append(k.clone(), v.clone()).await.unwrap());
    }
    let want: Vec<i64> = (0..sample.len() as i64).collect();
    assert_eq!(offsets, want, "one record per batch, consecutive offsets");
    let recs = store.read_all().await.unwrap();
    assert_eq!(pairs(&recs), sample);
    assert_eq!(recs.iter().map(|r| r.offset).collect::<Vec<_>>(), want);
    assert!(recs.iter().all(|r| r.timestamp > 1_600_000_000_000));
    // And they decode to what was encoded.
    assert_eq!(
        decode(&recs[0].key, recs[0].value.as_deref()).unwrap(),
        StateRecord::PidCollision {
            key: collision(0).0,
            value: Some(collision(0).1)
        }
    );
    assert_eq!(
        decode(&recs[12].key, recs[12].value.as_deref()).unwrap(),
        StateRecord::PartitionState {
            key: partition_state(1).0,
            value: None
        }
    );
    // read_from in the middle.
    let (tail, next) = store.read_from(10).await.unwrap();
    assert_eq!(pairs(&tail), sample[10..].to_vec());
    assert_eq!(next, sample.len() as i64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_instance_reads_and_tails_the_first() {
    let tansu = Tansu::start();
    let a = StateStore::open(tansu.config("__mirror_state"))
        .await
        .unwrap();
    let b = StateStore::open(tansu.config("__mirror_state"))
        .await
        .unwrap();
    let sample = sample_records();
    for (k, v) in &sample[..4] {
        a.append(k.clone(), v.clone()).await.unwrap();
    }
    let (seen, next) = b.read_from(0).await.unwrap();
    assert_eq!(pairs(&seen), sample[..4].to_vec());
    assert_eq!(next, 4);
    assert_eq!(pairs(&b.read_all().await.unwrap()), sample[..4].to_vec());
    // Nothing new yet.
    let (none, same) = b.read_from(next).await.unwrap();
    assert!(none.is_empty());
    assert_eq!(same, next);
    // Both write; each sees the other's records in one total order.
    let o1 = a
        .append(sample[4].0.clone(), sample[4].1.clone())
        .await
        .unwrap();
    let o2 = b
        .append(sample[5].0.clone(), sample[5].1.clone())
        .await
        .unwrap();
    assert_eq!((o1, o2), (4, 5));
    let (tail, next2) = b.read_from(next).await.unwrap();
    assert_eq!(pairs(&tail), sample[4..6].to_vec());
    assert_eq!(next2, 6);
    assert_eq!(
        pairs(&a.read_all().await.unwrap()),
        pairs(&b.read_all().await.unwrap())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_from_clones_get_distinct_offsets() {
    let tansu = Tansu::start();
    let store = StateStore::open(tansu.config("__mirror_state"))
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for i in 0..20u8 {
        let s = store.clone();
        tasks.push(tokio::spawn(async move {
            s.append(vec![0, 3, i], Some(vec![i])).await.unwrap()
        }));
    }
    let mut offs = Vec::new();
    for t in tasks {
        offs.push(t.await.unwrap());
    }
    offs.sort_unstable();
    assert_eq!(offs, (0..20).collect::<Vec<i64>>());
    let recs = store.read_all().await.unwrap();
    assert_eq!(recs.len(), 20);
    for r in &recs {
        assert_eq!(r.value.as_deref(), Some(&r.key[2..3]));
    }
}

/// A TCP connector whose connections the test can cut.
#[derive(Clone, Default)]
struct Cuttable {
    sockets: Arc<Mutex<Vec<std::net::TcpStream>>>,
    connects: Arc<Mutex<usize>>,
}

impl Cuttable {
    fn cut_all(&self) {
        for s in self.sockets.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
    fn connects(&self) -> usize {
        *self.connects.lock().unwrap()
    }
}

impl Connector for Cuttable {
    type Stream = tokio::net::TcpStream;
    async fn connect(&self, addr: &str) -> std::io::Result<tokio::net::TcpStream> {
        let s = tokio::net::TcpStream::connect(addr).await?;
        let std = s.into_std()?;
        self.sockets.lock().unwrap().push(std.try_clone()?);
        *self.connects.lock().unwrap() += 1;
        tokio::net::TcpStream::from_std(std)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_survive_reconnects() {
    let tansu = Tansu::start();
    let conn = Cuttable::default();
    let store = StateStore::open_with(tansu.config("__mirror_state"), conn.clone())
        .await
        .unwrap();
    let sample = sample_records();
    for (k, v) in &sample[..3] {
        store.append(k.clone(), v.clone()).await.unwrap();
    }
    let before = conn.connects();
    conn.cut_all();
    // The next append finds the connection dead, reconnects and succeeds
    // with the same producer (no duplicate).
    let off = store
        .append(sample[3].0.clone(), sample[3].1.clone())
        .await
        .unwrap();
    assert_eq!(off, 3);
    assert!(conn.connects() > before, "a new connection was opened");
    conn.cut_all();
    assert_eq!(
        pairs(&store.read_all().await.unwrap()),
        sample[..4].to_vec()
    );
    conn.cut_all();
    let (tail, next) = store.read_from(2).await.unwrap();
    assert_eq!(pairs(&tail), sample[2..4].to_vec());
    assert_eq!(next, 4);
    // A fresh instance sees exactly the four records.
    let other = StateStore::open(tansu.config("__mirror_state"))
        .await
        .unwrap();
    assert_eq!(
        pairs(&other.read_all().await.unwrap()),
        sample[..4].to_vec()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_records_are_read_in_several_fetches() {
    let tansu = Tansu::start();
    let store = StateStore::open(tansu.config("state-big")).await.unwrap();
    // 40 records of 64 KiB: more than one 1 MiB fetch.
    let value = vec![0xab; 64 << 10];
    for i in 0..40u8 {
        store
            .append(vec![0, 77, i], Some(value.clone()))
            .await
            .unwrap();
    }
    let recs = store.read_all().await.unwrap();
    assert_eq!(recs.len(), 40);
    for (i, r) in recs.iter().enumerate() {
        assert_eq!(r.offset, i as i64);
        assert_eq!(&r.key[..], &[0, 77, i as u8]);
        assert_eq!(r.value.as_deref(), Some(&value[..]));
    }
    // A piece at a time (the start-up load): the same records, in order, in
    // pieces that stop once past the budget (each read is whole fetches of
    // up to 1 MiB, so a piece may pass the budget by up to one fetch).
    let budget = 256 << 10;
    let mut pieces: Vec<Vec<StoredRecord>> = Vec::new();
    let read = store
        .read_all_each(budget, |piece| pieces.push(piece))
        .await
        .unwrap();
    assert_eq!(read, 40);
    assert!(
        pieces.len() >= 3,
        "40 x 64 KiB in pieces of 256 KiB: {} pieces",
        pieces.len()
    );
    for piece in &pieces[..pieces.len() - 1] {
        let bytes: usize = piece
            .iter()
            .map(|r| r.key.len() + r.value.as_ref().map_or(0, |v| v.len()))
            .sum();
        assert!(
            bytes >= budget && bytes <= budget + (1 << 20) + (64 << 10),
            "piece of {bytes} bytes"
        );
    }
    let flat: Vec<StoredRecord> = pieces.into_iter().flatten().collect();
    assert_eq!(pairs(&flat), pairs(&recs));
    assert_eq!(
        flat.iter().map(|r| r.offset).collect::<Vec<_>>(),
        (0..40).collect::<Vec<i64>>()
    );
    // A detached copy is equal and shares nothing with the response it came from.
    let d = recs[3].detached();
    assert_eq!(pairs(std::slice::from_ref(&d)), pairs(&recs[3..4]));
    assert_ne!(
        d.value.as_ref().unwrap().as_ptr(),
        recs[3].value.as_ref().unwrap().as_ptr()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_state_cluster_is_a_clear_error() {
    let port = free_port(); // nothing listens there
    let cfg = StateStoreConfig {
        connect_timeout: Duration::from_millis(300),
        request_timeout: Duration::from_millis(500),
        ..StateStoreConfig::new(vec![format!("127.0.0.1:{port}")])
    };
    let t0 = Instant::now();
    let err = StateStore::open(cfg).await.unwrap_err();
    assert_eq!(err.kind(), "unreachable", "{err}");
    assert!(err.to_string().contains(&port.to_string()), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(5));
    let err = StateStore::open(StateStoreConfig::new(vec![]))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), "config");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_partition_topic_is_refused() {
    let tansu = Tansu::start();
    let out = python(
        r#"
import sys
from confluent_kafka.admin import AdminClient, NewTopic
a = AdminClient({"bootstrap.servers": sys.argv[1]})
for f in a.create_topics([NewTopic("three", 3, 1)]).values():
    f.result(timeout=10)
print("ok")
"#,
        &[&tansu.addr()],
    );
    assert!(out.contains("ok"));
    let err = StateStore::open(tansu.config("three")).await.unwrap_err();
    assert_eq!(err.kind(), "topic_config", "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_fails_clearly_when_the_state_cluster_goes_away() {
    let mut tansu = Tansu::start();
    let cfg = StateStoreConfig {
        connect_timeout: Duration::from_millis(300),
        request_timeout: Duration::from_millis(1500),
        ..tansu.config("__mirror_state")
    };
    let store = StateStore::open(cfg).await.unwrap();
    store.append(vec![0, 3, 1], Some(vec![1])).await.unwrap();
    let _ = tansu.child.kill();
    let _ = tansu.child.wait();
    let t0 = Instant::now();
    let err = store
        .append(vec![0, 3, 2], Some(vec![2]))
        .await
        .unwrap_err();
    // Retried until the request timeout, then reported as unreachable
    // (or the i/o error of the dead connection): never a hang.
    assert!(
        matches!(err.kind(), "unreachable" | "io" | "timeout"),
        "{err}"
    );
    assert!(err.is_retriable());
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    let err = store.read_all().await.unwrap_err();
    assert!(
        matches!(err.kind(), "unreachable" | "io" | "timeout"),
        "{err}"
    );
}
