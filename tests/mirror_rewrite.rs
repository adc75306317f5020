//! The mirror fetch-path rewrite on Fetch responses built to match Kafka's
//! documented layout (Tansu never fills `aborted_transactions`, so this is
//! where that rewrite is checked): PIDs mapped per the SPEC formula, CRCs
//! valid, `aborted_transactions` mapped the same way, truncated tails, error
//! partitions and -1 PIDs untouched, a MIRROR_PID_RESET barrier expiring the
//! shadow producer state, and `preserve` mode changing nothing.

use std::sync::Arc;

use mirrorguard::config::{LayoutConfig, MirrorConfig, PidMode};
use mirrorguard::handlers::{
    build_fetch_response, walk_fetch_response, AbortedTransaction, FetchPartitionResponse,
    FetchTopic,
};
use mirrorguard::lifecycle::Lifecycle;
use mirrorguard::metrics::Metrics;
use mirrorguard::mirror::{rewrite_fetch_body, MirrorContext, MirrorError, PendingSalt, SaltStore};
use mirrorguard::producer_state::{PartitionKey, ProducerStateRegistry, RegistryConfig};
use mirrorguard::records::builder::{
    build_abort_marker, build_batch, build_mirror_pid_reset, BatchSpec, RecordSpec,
};
use mirrorguard::records::{verify_crc, walk, Entry};

/// Source cluster id whose fold is 1 (msb 0, lsb 1).
const SOURCE: &str = "AAAAAAAAAAAAAAAAAAAAAQ";

/// No collision happens in these tests: a salt store that is asked anything fails them.
struct NoCollisionsExpected;

impl SaltStore for NoCollisionsExpected {
    fn durable(&self) -> bool {
        false
    }
    fn persist_claims(
        &self,
        _claims: Vec<(
            mirrorguard::producer_state::PartitionKey,
            Vec<(i64, mirrorguard::producer_state::Origin)>,
        )>,
    ) -> mirrorguard::BoxFuture<'static, Result<(), mirrorguard::PersistError>> {
        panic!("no claim expected without a durable store");
    }
    fn topic_id(&self, _topic: &str) -> Option<[u8; 16]> {
        panic!("no collision expected");
    }
    fn refresh_topic_ids(
        &self,
    ) -> mirrorguard::BoxFuture<'static, Result<(), mirrorguard::PersistError>> {
        panic!("no collision expected");
    }
    fn persist(
        &self,
        _salts: Vec<PendingSalt>,
    ) -> mirrorguard::BoxFuture<'static, Result<(), mirrorguard::PersistError>> {
        panic!("no collision expected");
    }
}

fn mirror(mode: PidMode, layout: LayoutConfig) -> Arc<MirrorContext> {
    mirror_with(mode, layout, RegistryConfig::default())
}

fn mirror_with(mode: PidMode, layout: LayoutConfig, limits: RegistryConfig) -> Arc<MirrorContext> {
    let cfg = MirrorConfig {
        name: "test".into(),
        bootstrap: "127.0.0.1:1".into(),
        listen_host: "127.0.0.1".into(),
        advertised_host: "127.0.0.1".into(),
        node_port_base: 20000,
        source_bootstrap: vec!["127.0.0.1:2".into()],
        source_cluster_id: Some(SOURCE.into()),
        pid_mode: mode,
        layout,
        destination_topic_prefix: String::new(),
        connect_timeout_ms: 1000,
        metadata_refresh_ms: 1000,
        destination_bootstrap: Vec::new(),
        upstream_request_timeout_ms: 10_000,
        fetcher_bootstrap: None,
        fetcher_node_port_base: None,
        fetcher_identity: mirrorguard::config::FetcherIdentity::AnyReader,
        fetcher_principals: Vec::new(),
        crc_verify_every: 0,
        source_sasl: None,
        destination_sasl: None,
        listener_sasl: None,
        tls: None,
        source_tls: None,
        destination_tls: None,
        stopped_when: Default::default(),
        destination_hw_bootstrap: Vec::new(),
        destination_hw_poll_ms: 500,
        closings_retained_offsets: mirrorguard::producer_state::DEFAULT_CLOSINGS_RETAINED_OFFSETS,
        closings_retained_max: mirrorguard::producer_state::DEFAULT_CLOSINGS_RETAINED_MAX,
    };
    let metrics = Metrics::new();
    let m = MirrorContext::new(
        &cfg,
        Arc::new(ProducerStateRegistry::new(limits)),
        Arc::new(NoCollisionsExpected),
        Lifecycle::new(metrics.clone()),
        &metrics,
    )
    .unwrap();
    // The partition counts as already observed from offset 0 (no replay).
    m.registry.partition(&PartitionKey::new([0; 16], "t", 0));
    m
}

/// SPEC 2.1, computed independently of the crate.
fn expected_high(pid: i64, fold: u64) -> i64 {
    ((1u64 << 62) | ((fold & 0x7fff_ffff) << 31) | pid as u64) as i64
}

fn expected_sign_bit(pid: i64, fold: u64) -> i64 {
    ((1u64 << 63) | ((fold & 0xffff_ffff) << 31) | pid as u64) as i64
}

fn data_batch(base_offset: i64, pid: i64, txn: bool) -> Vec<u8> {
    build_batch(
        &BatchSpec {
            base_offset,
            partition_leader_epoch: 3,
            attributes: if txn { 0x10 } else { 0 },
            producer_id: pid,
            producer_epoch: if pid == -1 { -1 } else { 0 },
            base_sequence: if pid == -1 { -1 } else { 0 },
            ..BatchSpec::default()
        },
        &[RecordSpec {
            value: Some(b"v"),
            ..RecordSpec::default()
        }],
    )
}

/// A v12 Fetch response body: t-0 with `records` and aborted transactions,
/// t-1 with an error and records that must stay untouched.
fn response(records: &[u8], aborted: Option<Vec<AbortedTransaction>>) -> Vec<u8> {
    let mut p0 = FetchPartitionResponse::new(0);
    p0.high_watermark = 100;
    p0.last_stable_offset = 100;
    p0.log_start_offset = 0;
    p0.aborted_transactions = aborted;
    p0.records = Some(records.to_vec().into());
    let mut p1 = FetchPartitionResponse::new(1);
    p1.error_code = 6; // NOT_LEADER_OR_FOLLOWER
    p1.records = Some(data_batch(0, 9, false).into());
    build_fetch_response(12, 0, 0, 0, &[(FetchTopic::Name("t"), vec![p0, p1])]).unwrap()
}

struct Seen {
    pids: Vec<i64>,
    crcs_ok: bool,
    aborted: Vec<i64>,
    records: Vec<u8>,
    p1_records: Vec<u8>,
}

fn inspect(body: &[u8]) -> Seen {
    let mut seen = Seen {
        pids: vec![],
        crcs_ok: true,
        aborted: vec![],
        records: vec![],
        p1_records: vec![],
    };
    walk_fetch_response(12, body, &mut |p| {
        let r = &body[p.records.clone().unwrap()];
        if p.partition_index == 1 {
            seen.p1_records = r.to_vec();
            return;
        }
        seen.records = r.to_vec();
        for e in walk(r) {
            if let Ok(Entry::V2(h)) = e {
                seen.pids.push(h.producer_id);
                seen.crcs_ok &= verify_crc(&r[h.range.clone()]);
            }
        }
        if let Some(a) = &p.aborted_transactions {
            seen.aborted = a.iter().map(|t| t.producer_id).collect();
        }
    })
    .unwrap();
    seen
}

#[test]
fn region_high_maps_batches_markers_and_aborted_transactions() {
    let m = mirror(PidMode::Region, LayoutConfig::High);
    let mut records = data_batch(0, 5, true);
    records.extend(data_batch(1, -1, false));
    records.extend(build_abort_marker(5, 0, 2, 0, 2, 3));
    records.extend(data_batch(3, 7, false));
    let truncated = data_batch(4, 8, false);
    records.extend(&truncated[..truncated.len() - 10]);
    let original = response(
        &records,
        Some(vec![AbortedTransaction {
            producer_id: 5,
            first_offset: 0,
        }]),
    );
    let mut body = original.clone();
    assert!(rewrite_fetch_body(&m, 12, &mut body, &|_, _| false)
        .unwrap()
        .is_none());
    let seen = inspect(&body);
    assert_eq!(
        seen.pids,
        vec![
            expected_high(5, 1),
            -1,
            expected_high(5, 1),
            expected_high(7, 1)
        ]
    );
    assert!(
        seen.crcs_ok,
        "every rewritten batch carries a valid CRC-32C"
    );
    assert_eq!(seen.aborted, vec![expected_high(5, 1)]);
    // The truncated tail is forwarded byte for byte.
    assert!(seen.records.ends_with(&truncated[..truncated.len() - 10]));
    // The error partition is untouched.
    assert_eq!(seen.p1_records, data_batch(0, 9, false));
    // Same length: nothing but PIDs and CRCs changed.
    assert_eq!(body.len(), original.len());
    // The marker closed the transaction in the shadow producer state.
    let key = PartitionKey::new([0; 16], "t", 0);
    let open = m
        .registry
        .get(&key)
        .unwrap()
        .with(|s| s.open_transactions().count());
    assert_eq!(open, 0);
    assert_eq!(
        m.registry.get(&key).unwrap().with(|s| s.producer_count()),
        2
    );

    // Idempotent: rewriting the rewritten response changes nothing.
    let mut again = body.clone();
    assert!(rewrite_fetch_body(&m, 12, &mut again, &|_, _| false)
        .unwrap()
        .is_none());
    assert_eq!(again, body);
}

#[test]
fn sign_bit_layout_and_already_mapped_pids() {
    let m = mirror(PidMode::Region, LayoutConfig::SignBit);
    let already_high = expected_high(11, 99);
    let mut records = data_batch(0, 5, false);
    records.extend(data_batch(1, already_high, false));
    let mut body = response(&records, None);
    rewrite_fetch_body(&m, 12, &mut body, &|_, _| false).unwrap();
    let seen = inspect(&body);
    assert_eq!(seen.pids, vec![expected_sign_bit(5, 1), already_high]);
    assert!(seen.crcs_ok);
}

#[test]
fn preserve_mode_changes_no_byte() {
    let m = mirror(PidMode::Preserve, LayoutConfig::High);
    let mut records = data_batch(0, 5, true);
    records.extend(build_abort_marker(5, 0, 2, 0, 1, 3));
    let original = response(
        &records,
        Some(vec![AbortedTransaction {
            producer_id: 5,
            first_offset: 0,
        }]),
    );
    let mut body = original.clone();
    rewrite_fetch_body(&m, 12, &mut body, &|_, _| false).unwrap();
    assert_eq!(body, original);
}

#[test]
fn barrier_expires_producer_state() {
    let m = mirror(PidMode::Region, LayoutConfig::High);
    let mut records = data_batch(0, 5, true);
    records.extend(data_batch(1, 6, false));
    records.extend(build_mirror_pid_reset("upstream-cluster", 2, 3, 0));
    let mut body = response(&records, None);
    rewrite_fetch_body(&m, 12, &mut body, &|_, _| false).unwrap();
    let key = PartitionKey::new([0; 16], "t", 0);
    let (producers, open) = m
        .registry
        .get(&key)
        .unwrap()
        .with(|s| (s.producer_count(), s.open_transactions().count()));
    assert_eq!(
        (producers, open),
        (0, 0),
        "the barrier expires every producer"
    );
    let seen = inspect(&body);
    assert_eq!(seen.pids[2], -1, "the barrier keeps PID -1");
    assert!(seen.crcs_ok);
}

#[test]
fn skipped_partitions_are_left_alone() {
    let m = mirror(PidMode::Region, LayoutConfig::High);
    let records = data_batch(0, 5, false);
    let original = response(&records, None);
    let mut body = original.clone();
    rewrite_fetch_body(&m, 12, &mut body, &|_, p| p == 0).unwrap();
    assert_eq!(body, original);
}

#[test]
fn producer_limit_fails_closed() {
    let m = mirror_with(
        PidMode::Region,
        LayoutConfig::High,
        RegistryConfig {
            max_producers: 2,
            ..RegistryConfig::default()
        },
    );
    let mut records = data_batch(0, 5, false);
    records.extend(data_batch(1, 6, false));
    let mut body = response(&records, None);
    assert!(rewrite_fetch_body(&m, 12, &mut body, &|_, _| false).is_ok());
    // A third producer would exceed the limit: the response is refused whole,
    // unchanged, instead of being forwarded with an untracked producer.
    let mut records = data_batch(2, 7, false);
    records.extend(data_batch(3, 8, false));
    let original = response(&records, None);
    let mut body = original.clone();
    let err = rewrite_fetch_body(&m, 12, &mut body, &|_, _| false).unwrap_err();
    assert!(matches!(err, MirrorError::ProducerLimit { .. }), "{err:?}");
    assert!(err.to_string().contains("max_producers"), "{err}");
    assert_eq!(body, original);
}

#[test]
fn partition_limit_fails_closed() {
    let m = mirror_with(
        PidMode::Region,
        LayoutConfig::High,
        RegistryConfig {
            max_partitions: 1, // t-0 is created by `mirror_with`
            ..RegistryConfig::default()
        },
    );
    let mut p1 = FetchPartitionResponse::new(1);
    p1.high_watermark = 1;
    p1.last_stable_offset = 1;
    p1.records = Some(data_batch(0, 9, false).into());
    let original = build_fetch_response(12, 0, 0, 0, &[(FetchTopic::Name("t"), vec![p1])]).unwrap();
    let mut body = original.clone();
    let err = rewrite_fetch_body(&m, 12, &mut body, &|_, _| false).unwrap_err();
    assert!(matches!(err, MirrorError::PartitionLimit { .. }), "{err:?}");
    assert!(err.to_string().contains("max_partitions"), "{err}");
    assert_eq!(body, original);
}

mod hostile {
    //! The upstream is hostile input too: arbitrary or mutated Fetch response
    //! bodies never panic the rewriter, and a rejected body is never half
    //! rewritten in a way that changes its length.
    use super::*;
    use proptest::prelude::*;

    fn valid_body() -> Vec<u8> {
        let mut records = data_batch(0, 5, true);
        records.extend(build_abort_marker(5, 0, 2, 0, 1, 3));
        records.extend(data_batch(2, 7, false));
        response(
            &records,
            Some(vec![AbortedTransaction {
                producer_id: 5,
                first_offset: 0,
            }]),
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn random_bodies_never_panic(body in proptest::collection::vec(any::<u8>(), 0..512), version in 4i16..=17) {
            let m = mirror(PidMode::Region, LayoutConfig::High);
            let mut b = body.clone();
            let _ = rewrite_fetch_body(&m, version, &mut b, &|_, _| false);
            prop_assert_eq!(b.len(), body.len());
        }

        #[test]
        fn mutated_bodies_never_panic(pos in any::<prop::sample::Index>(), byte in any::<u8>(), cut in any::<prop::sample::Index>()) {
            let m = mirror(PidMode::Region, LayoutConfig::High);
            let mut body = valid_body();
            let i = pos.index(body.len());
            body[i] = byte;
            body.truncate(cut.index(body.len() + 1));
            let len = body.len();
            let _ = rewrite_fetch_body(&m, 12, &mut body, &|_, _| false);
            prop_assert_eq!(body.len(), len);
        }
    }
}
