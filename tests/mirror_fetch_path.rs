//! The mirror fetch path's production entry point (`rewrite_fetch_body`) on
//! Fetch responses a real fetcher can get (issue 13): a barrier fetched again
//! (lost response, a reader from 0, a replay) must not expire producer state
//! a second time; v2 batches after a legacy (v0/v1) entry are still mapped
//! and tracked; a barrier whose value does not parse still expires producer
//! state; a collision that appears while forwarding never leaves unsalted.
//! Issue 14: the PID rewrite never reads a batch's records, so a corrupt
//! batch leaves corrupt by the same CRC error; only a batch that would create
//! durable state (a new producer's claim, a collision's salt) is verified,
//! and one that arrived corrupt creates none.

use std::pin::Pin;
use std::sync::Arc;

use mirrorguard::config::MirrorConfig;
use mirrorguard::handlers::{
    build_fetch_response, walk_fetch_response, FetchPartitionResponse, FetchTopic,
};
use mirrorguard::lifecycle::Lifecycle;
use mirrorguard::metrics::{Metrics, MirrorKindLabels};
use mirrorguard::mirror::{rewrite_fetch_body, MirrorContext, Pending, PendingSalt, SaltStore};
use mirrorguard::producer_state::{
    ClusterId, Origin, PartitionKey, ProducerStateRegistry, RegistryConfig,
};
use mirrorguard::records::builder::{
    build_batch, build_control_batch, build_mirror_pid_reset, BatchSpec, RecordSpec,
};
use mirrorguard::records::{compute_crc, verify_crc, walk, Entry};

/// Source cluster id whose fold is 1 (msb 0, lsb 1).
const SOURCE: &str = "AAAAAAAAAAAAAAAAAAAAAQ";

/// A store that never persists anything (not durable: no claims).
struct NoStore;

impl SaltStore for NoStore {
    fn topic_id(&self, _topic: &str) -> Option<[u8; 16]> {
        None
    }
    fn refresh_topic_ids(
        &self,
    ) -> Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>> {
        Box::pin(async { Err("no topic ids here".to_string()) })
    }
    fn persist(
        &self,
        _salts: Vec<PendingSalt>,
    ) -> Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>> {
        Box::pin(async { Err("nothing is persisted here".to_string()) })
    }
}

fn mirror() -> Arc<MirrorContext> {
    mirror_with(Arc::new(NoStore), "").0
}

/// A mirror on `store`, with extra config lines; and its metrics.
fn mirror_with(store: Arc<dyn SaltStore>, extra: &str) -> (Arc<MirrorContext>, Arc<Metrics>) {
    let cfg: MirrorConfig = toml::from_str(&format!(
        "name = \"m\"\nbootstrap = \"127.0.0.1:1\"\nadvertised_host = \"127.0.0.1\"\n\
         node_port_base = 20000\nsource_bootstrap = [\"127.0.0.1:2\"]\n\
         source_cluster_id = \"{SOURCE}\"\n{extra}\n"
    ))
    .unwrap();
    let metrics = Metrics::new();
    let m = MirrorContext::new(
        &cfg,
        Arc::new(ProducerStateRegistry::new(RegistryConfig::default())),
        store,
        Lifecycle::new(metrics.clone()),
        &metrics,
    )
    .unwrap();
    // The partition counts as already observed from offset 0 (no replay).
    m.registry.partition(&key());
    (m, metrics)
}

fn key() -> PartitionKey {
    PartitionKey::new([0; 16], "t", 0)
}

fn expected_high(pid: i64) -> i64 {
    ((1u64 << 62) | (1u64 << 31) | pid as u64) as i64
}

fn data_batch(base_offset: i64, pid: i64, txn: bool) -> Vec<u8> {
    build_batch(
        &BatchSpec {
            base_offset,
            partition_leader_epoch: 3,
            attributes: if txn { 0x10 } else { 0 },
            producer_id: pid,
            producer_epoch: 0,
            base_sequence: 0,
            ..BatchSpec::default()
        },
        &[RecordSpec {
            value: Some(b"v"),
            ..RecordSpec::default()
        }],
    )
}

fn response(records: &[u8]) -> Vec<u8> {
    let mut p0 = FetchPartitionResponse::new(0);
    p0.high_watermark = 100;
    p0.last_stable_offset = 100;
    p0.log_start_offset = 0;
    p0.records = Some(records.to_vec().into());
    build_fetch_response(12, 0, 0, 0, &[(FetchTopic::Name("t"), vec![p0])]).unwrap()
}

fn rewrite(m: &MirrorContext, records: &[u8]) -> Result<Vec<u8>, String> {
    let mut body = response(records);
    match rewrite_fetch_body(m, 12, &mut body, &|_, _| false)? {
        None => Ok(body),
        Some(p) => Err(format!("response held: {p:?}")),
    }
}

/// (pid, crc ok) of every v2 batch of partition 0.
fn v2_pids(body: &[u8]) -> Vec<(i64, bool)> {
    let mut out = Vec::new();
    walk_fetch_response(12, body, &mut |p| {
        let r = &body[p.records.clone().unwrap()];
        for e in walk(r) {
            if let Ok(Entry::V2(h)) = e {
                out.push((h.producer_id, verify_crc(&r[h.range.clone()])));
            }
        }
    })
    .unwrap();
    out
}

fn producers(m: &MirrorContext) -> (usize, usize) {
    m.registry
        .get(&key())
        .unwrap()
        .with(|s| (s.producer_count(), s.open_transactions().count()))
}

#[test]
fn refetched_barrier_does_not_expire_producers_seen_after_it() {
    let m = mirror();
    // offsets 0-1 data, 2 barrier, 3 an open transaction of PID 7
    let mut first = data_batch(0, 5, false);
    first.extend(data_batch(1, 6, false));
    first.extend(build_mirror_pid_reset("upstream", 2, 3, 0));
    first.extend(data_batch(3, 7, true));
    rewrite(&m, &first).unwrap();
    assert_eq!(
        producers(&m),
        (1, 1),
        "PID 7 after the barrier, transaction open"
    );
    // The same range again (a lost response, a reader from 0): nothing changes.
    rewrite(&m, &first).unwrap();
    assert_eq!(
        producers(&m),
        (1, 1),
        "a re-fetched barrier must not expire PID 7 and its open transaction"
    );
    // Only the barrier again (a fetch from offset 2): still nothing.
    rewrite(&m, &build_mirror_pid_reset("upstream", 2, 3, 0)).unwrap();
    assert_eq!(producers(&m), (1, 1));
    // A new barrier past what was seen expires it.
    rewrite(&m, &build_mirror_pid_reset("upstream", 4, 3, 0)).unwrap();
    assert_eq!(producers(&m), (0, 0));
}

/// A magic-1 message (offset, size, crc, magic, attributes, timestamp, key, value).
fn legacy_v1(offset: i64, value: &[u8]) -> Vec<u8> {
    let mut msg = vec![1u8, 0]; // magic 1, attributes 0
    msg.extend(0i64.to_be_bytes()); // timestamp
    msg.extend((-1i32).to_be_bytes()); // null key
    msg.extend((value.len() as i32).to_be_bytes());
    msg.extend(value);
    let crc = crc32fast_ieee(&msg);
    let mut out = offset.to_be_bytes().to_vec();
    out.extend(((msg.len() + 4) as i32).to_be_bytes());
    out.extend(crc.to_be_bytes());
    out.extend(msg);
    out
}

/// CRC-32 (IEEE), as legacy messages use it.
fn crc32fast_ieee(data: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn v2_batches_after_a_legacy_entry_are_mapped_and_tracked() {
    let m = mirror();
    let legacy = legacy_v1(0, b"old");
    let mut records = legacy.clone();
    records.extend(data_batch(1, 5, false));
    records.extend(data_batch(2, 6, true));
    let body = rewrite(&m, &records).unwrap();
    assert_eq!(
        v2_pids(&body),
        vec![(expected_high(5), true), (expected_high(6), true)],
        "v2 batches after a legacy entry leave mapped, with valid CRCs"
    );
    assert_eq!(producers(&m), (2, 1), "and are tracked");
    // The legacy entry leaves byte for byte.
    let mut seen = Vec::new();
    walk_fetch_response(12, &body, &mut |p| {
        seen = body[p.records.clone().unwrap()][..legacy.len()].to_vec()
    })
    .unwrap();
    assert_eq!(seen, legacy);
}

#[test]
fn barrier_with_an_unparseable_value_still_expires_producer_state() {
    let m = mirror();
    let mut records = data_batch(0, 5, true);
    // Control type 7 whose value is two bytes of nonsense.
    records.extend(build_control_batch(7, &[0xff, 0xff], -1, -1, 0, 1, 3));
    rewrite(&m, &records).unwrap();
    assert_eq!(
        producers(&m),
        (0, 0),
        "the destination log holds a barrier: producer state expires"
    );
}

#[test]
fn collision_within_one_response_is_not_forwarded_unsalted() {
    let m = mirror();
    // An already-mapped PID (a chain: it passes through as is) and then a
    // source PID that maps onto the same value: two origins on one PID,
    // which only shows once the first batch is observed.
    let mut records = data_batch(0, expected_high(5), false);
    records.extend(data_batch(1, 5, false));
    let mut body = response(&records);
    let outcome = rewrite_fetch_body(&m, 12, &mut body, &|_, _| false);
    match outcome {
        // Held for a salt (this store knows no topic id): nothing forwarded yet.
        Ok(Some(_)) | Err(_) => {}
        Ok(None) => panic!("two origins left on one PID: {:?}", v2_pids(&body)),
    }
}

/// A store that keeps claims durable (`[state]` configured) and knows the
/// destination topic id, so the fetch path asks for claims and salts; it is
/// never called by `rewrite_fetch_body` itself (the connection does that
/// with what the path returns), so any call is a failure here.
struct DurableStore {
    durable: bool,
}

impl SaltStore for DurableStore {
    fn durable(&self) -> bool {
        self.durable
    }
    fn persist_claims(
        &self,
        claims: Vec<(PartitionKey, Vec<(i64, Origin)>)>,
    ) -> Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>> {
        panic!("the fetch path persists nothing by itself: {claims:?}");
    }
    fn topic_id(&self, _topic: &str) -> Option<[u8; 16]> {
        Some([9; 16])
    }
    fn refresh_topic_ids(
        &self,
    ) -> Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>> {
        Box::pin(async { Ok(()) })
    }
    fn persist(
        &self,
        salts: Vec<PendingSalt>,
    ) -> Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>> {
        panic!("the fetch path persists nothing by itself: {salts:?}");
    }
}

fn corrupt_count(metrics: &Metrics) -> u64 {
    metrics
        .mirror_events
        .get_or_create(&MirrorKindLabels {
            mirror: "m".into(),
            kind: "corrupt_records",
        })
        .get()
}

/// `data_batch` with its last record byte flipped: the header is intact,
/// the CRC-32C does not match.
fn corrupt_batch(base_offset: i64, pid: i64) -> Vec<u8> {
    let mut b = data_batch(base_offset, pid, false);
    *b.last_mut().unwrap() ^= 0x20;
    assert!(!verify_crc(&b));
    b
}

/// `stored ^ computed` CRC of every v2 batch of partition 0, with its PID.
fn crc_errors(body: &[u8]) -> Vec<(i64, u32)> {
    let mut out = Vec::new();
    walk_fetch_response(12, body, &mut |p| {
        let r = &body[p.records.clone().unwrap()];
        for e in walk(r).flatten() {
            if let Entry::V2(h) = e {
                let b = &r[h.range.clone()];
                let stored = u32::from_be_bytes(b[17..21].try_into().unwrap());
                out.push((h.producer_id, stored ^ compute_crc(b).unwrap()));
            }
        }
    })
    .unwrap();
    out
}

fn origin(pid: i64) -> Origin {
    Origin {
        source_cluster: ClusterId(mirrorguard::pid::ClusterId::parse(SOURCE).unwrap().0),
        original_pid: pid,
    }
}

fn holder(m: &MirrorContext, mapped: i64) -> Option<Origin> {
    m.registry
        .get(&key())
        .unwrap()
        .with(|s| s.holder_of(mapped))
}

#[test]
fn corrupt_first_batch_of_a_new_producer_creates_no_claim() {
    let (m, metrics) = mirror_with(Arc::new(DurableStore { durable: true }), "");
    // The control case: the same batch, valid, is held for its claim.
    let mut body = response(&data_batch(0, 5, false));
    match rewrite_fetch_body(&m, 12, &mut body, &|_, _| false) {
        Ok(Some(Pending::Claims(c))) => {
            assert_eq!(c.len(), 1);
            assert_eq!(c[0].1, vec![(expected_high(5), origin(5))]);
        }
        other => panic!("a valid first batch must wait for its claim: {other:?}"),
    }
    // Corrupt: no claim asked for, no state, forwarded byte for byte, counted.
    let sent = response(&corrupt_batch(0, 5));
    let mut body = sent.clone();
    let outcome = rewrite_fetch_body(&m, 12, &mut body, &|_, _| false);
    assert!(
        matches!(outcome, Ok(None)),
        "a corrupt batch must not ask for a claim: {outcome:?}"
    );
    assert_eq!(body, sent, "forwarded as it came");
    assert_eq!(producers(&m), (0, 0), "no producer state");
    assert_eq!(holder(&m, expected_high(5)), None, "no claim");
    assert_eq!(corrupt_count(&metrics), 1);
}

#[test]
fn a_valid_batch_after_a_corrupt_one_claims_and_both_leave_mapped() {
    let (m, metrics) = mirror_with(Arc::new(DurableStore { durable: true }), "");
    let mut records = corrupt_batch(0, 5);
    records.extend(data_batch(1, 5, false));
    let before = crc_errors(&response(&records));
    assert!(before[0].1 != 0 && before[1].1 == 0);
    let mut body = response(&records);
    // The claim comes from the valid batch only (offset 1).
    let claims = match rewrite_fetch_body(&m, 12, &mut body, &|_, _| false) {
        Ok(Some(Pending::Claims(c))) => c,
        other => panic!("the valid batch must wait for its claim: {other:?}"),
    };
    assert_eq!(claims[0].1, vec![(expected_high(5), origin(5))]);
    // What the connection does once the state cluster acknowledged it.
    for (handle, new) in &claims {
        handle.with(|s| {
            for (mapped, o) in new {
                s.claim(*mapped, *o, 0);
            }
        });
    }
    assert!(matches!(
        rewrite_fetch_body(&m, 12, &mut body, &|_, _| false),
        Ok(None)
    ));
    // Now a known producer's batches: both mapped, the corrupt one still
    // corrupt by exactly the same error, the valid one valid.
    assert_eq!(
        crc_errors(&body),
        vec![(expected_high(5), before[0].1), (expected_high(5), 0)]
    );
    assert_eq!(
        corrupt_count(&metrics),
        0,
        "a known producer's batch is not read (sampling off)"
    );
}

#[test]
fn corrupt_batch_that_would_need_a_salt_writes_no_salt() {
    // Claims in memory only (no [state]), so the holder below needs no
    // persisting; salts are still asked for.
    let (m, metrics) = mirror_with(Arc::new(DurableStore { durable: false }), "");
    // An already mapped PID passes as is and holds expected_high(5).
    rewrite(&m, &data_batch(0, expected_high(5), false)).unwrap();
    assert_eq!(holder(&m, expected_high(5)), Some(origin(expected_high(5))));
    // The control case: source PID 5 maps onto it, valid: a salt first.
    let mut body = response(&data_batch(1, 5, false));
    assert!(
        matches!(
            rewrite_fetch_body(&m, 12, &mut body, &|_, _| false),
            Ok(Some(Pending::Salts(_)))
        ),
        "a valid colliding batch waits for its salt"
    );
    // Corrupt: no salt, no state, forwarded as it came, counted.
    let sent = response(&corrupt_batch(1, 5));
    let mut body = sent.clone();
    let outcome = rewrite_fetch_body(&m, 12, &mut body, &|_, _| false);
    assert!(
        matches!(outcome, Ok(None)),
        "a corrupt batch must not ask for a salt: {outcome:?}"
    );
    assert_eq!(body, sent);
    assert_eq!(producers(&m), (1, 0), "only the holder");
    assert_eq!(corrupt_count(&metrics), 1);
}

#[test]
fn corrupt_batch_of_a_known_producer_keeps_its_crc_error_unread_unless_sampled() {
    for (every, counted) in [(0u64, 0u64), (1, 1)] {
        let (m, metrics) = mirror_with(
            Arc::new(DurableStore { durable: false }),
            &format!("crc_verify_every = {every}"),
        );
        rewrite(&m, &data_batch(0, 5, false)).unwrap();
        let records = corrupt_batch(1, 5);
        let error = crc_errors(&response(&records))[0].1;
        let body = rewrite(&m, &records).unwrap();
        assert_eq!(crc_errors(&body), vec![(expected_high(5), error)]);
        assert_eq!(
            corrupt_count(&metrics),
            counted,
            "crc_verify_every = {every}"
        );
        assert_eq!(producers(&m), (1, 0));
    }
}
