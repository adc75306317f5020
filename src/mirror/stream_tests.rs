//! The streamed fetch path against the store-and-forward one: random
//! region-mode Fetch responses (several versions, topics and partitions,
//! legacy entries, corrupt CRCs, control batches and barriers, new producers
//! needing claims, a collision needing a salt, aborted transactions, error
//! partitions, truncated trailing batches) are rewritten both ways on two
//! identical mirrors; the streamed one is fed through an in-memory duplex
//! split at random byte boundaries. The bytes that leave, the producer state
//! afterwards and the mirror's counters must be equal.

use proptest::prelude::*;
use tokio::io::AsyncWriteExt;

use super::stream_check::*;
use super::*;
use crate::codec::FrameReader;
use crate::handlers::{build_fetch_response, AbortedTransaction, FetchPartitionResponse};
use crate::records::builder::{
    build_abort_marker, build_batch, build_commit_marker, build_mirror_pid_reset, BatchSpec,
    RecordSpec,
};

#[derive(Debug, Clone)]
enum Item {
    Data { pid: i64, txn: bool, records: usize },
    Commit(i64),
    Abort(i64),
    Barrier,
    Legacy,
    Corrupt(i64),
}

fn item() -> impl Strategy<Value = Item> {
    // PID 5 collides with a holder the state already has (see `mirror`);
    // high(900) is already mapped upstream and passes as it is.
    let pid = prop_oneof![
        Just(-1i64),
        Just(5),
        Just(6),
        Just(7),
        Just(high(900)),
        1000i64..1010
    ];
    prop_oneof![
        6 => (pid.clone(), any::<bool>(), 1usize..40).prop_map(|(pid, txn, records)| Item::Data { pid, txn, records }),
        1 => (5i64..8).prop_map(Item::Commit),
        1 => (5i64..8).prop_map(Item::Abort),
        1 => Just(Item::Barrier),
        1 => Just(Item::Legacy),
        // Not PID 5: a corrupt batch that needs a salt passes untouched when
        // streamed, where the held path maps it with the salt a later batch
        // of the same response creates (look-ahead; see `stream`).
        1 => prop_oneof![Just(-1i64), Just(6), Just(7), Just(high(900)), 1000i64..1010].prop_map(Item::Corrupt),
    ]
}

/// A magic-1 message at `offset`.
fn legacy_v1(offset: i64) -> Vec<u8> {
    let mut msg = vec![1u8, 0];
    msg.extend(0i64.to_be_bytes());
    msg.extend((-1i32).to_be_bytes());
    msg.extend(1i32.to_be_bytes());
    msg.push(b'x');
    let mut out = offset.to_be_bytes().to_vec();
    out.extend(((msg.len() + 4) as i32).to_be_bytes());
    out.extend(0u32.to_be_bytes());
    out.extend(msg);
    out
}

fn records_of(items: &[Item], base: i64, truncate: Option<usize>) -> Vec<u8> {
    let mut out = Vec::new();
    let mut offset = base;
    let mut last_len = 0;
    for it in items {
        let b = match it {
            Item::Data { pid, .. } | Item::Corrupt(pid) => {
                let (n, txn) = match it {
                    Item::Data { txn, records, .. } => (*records, *txn),
                    _ => (3, false),
                };
                let values: Vec<Vec<u8>> = (0..n).map(|i| vec![b'v'; 10 + i * 7]).collect();
                let recs: Vec<RecordSpec<'_>> = values
                    .iter()
                    .enumerate()
                    .map(|(i, v)| RecordSpec {
                        offset_delta: i as i32,
                        value: Some(v),
                        ..RecordSpec::default()
                    })
                    .collect();
                let mut b = build_batch(
                    &BatchSpec {
                        base_offset: offset,
                        partition_leader_epoch: 3,
                        attributes: if txn { 0x10 } else { 0 },
                        producer_id: *pid,
                        producer_epoch: if *pid == -1 { -1 } else { 0 },
                        base_sequence: if *pid == -1 {
                            -1
                        } else {
                            (offset % 1000) as i32
                        },
                        ..BatchSpec::default()
                    },
                    &recs,
                );
                if matches!(it, Item::Corrupt(_)) {
                    let last = b.len() - 1;
                    b[last] ^= 0x55;
                }
                offset += n as i64;
                b
            }
            Item::Commit(pid) => {
                offset += 1;
                build_commit_marker(*pid, 0, 1, 0, offset - 1, 3)
            }
            Item::Abort(pid) => {
                offset += 1;
                build_abort_marker(*pid, 0, 1, 0, offset - 1, 3)
            }
            Item::Barrier => {
                offset += 1;
                build_mirror_pid_reset("upstream", offset - 1, 3, 0)
            }
            Item::Legacy => {
                offset += 1;
                legacy_v1(offset - 1)
            }
        };
        last_len = b.len();
        out.extend(b);
    }
    if let Some(cut) = truncate {
        // Cut the last entry short (brokers send such a tail).
        let keep = out.len() - last_len + cut % last_len.max(1);
        out.truncate(keep);
    }
    out
}

#[derive(Debug, Clone)]
struct PartSpec {
    error: bool,
    items: Vec<Item>,
    truncate: Option<usize>,
    aborted: Vec<(i64, i64)>,
}

fn part() -> impl Strategy<Value = PartSpec> {
    (
        prop::bool::weighted(0.1),
        prop::collection::vec(item(), 0..12),
        prop::option::weighted(0.3, 0usize..200),
        prop::collection::vec(
            (
                prop_oneof![Just(5i64), Just(6), Just(1000), Just(high(6))],
                0i64..50,
            ),
            0..3,
        ),
    )
        .prop_map(|(error, mut items, truncate, aborted)| {
            // Known divergence (see the module doc of `stream`): batches
            // after a barrier within one response are checked against the
            // state the barrier left by the streamed walk, against the state
            // from before the response by the held scan. Barriers are
            // generated as the last entry of a partition only.
            if items.iter().any(|i| matches!(i, Item::Barrier)) {
                items.retain(|i| !matches!(i, Item::Barrier));
                items.push(Item::Barrier);
            }
            // Likewise a corrupt batch of a producer whose claim or salt a
            // valid batch of the same response creates: the held path,
            // run again once that is durable, maps (and observes) the
            // corrupt one too; the streamed walk, past it already, passed it
            // untouched. Corrupt batches are generated for PIDs that have no
            // other batch in their partition.
            let pid_of = |i: &Item| match i {
                Item::Data { pid, .. } | Item::Commit(pid) | Item::Abort(pid) => Some(*pid),
                _ => None,
            };
            let others: Vec<i64> = items.iter().filter_map(pid_of).collect();
            items.retain(|i| !matches!(i, Item::Corrupt(p) if others.contains(p)));
            PartSpec {
                error,
                items,
                truncate,
                aborted,
            }
        })
}

fn response(version: i16, topics: &[Vec<PartSpec>]) -> Vec<u8> {
    response_from(version, topics, 0)
}

/// [`response`] whose records start at offset `base`.
fn response_from(version: i16, topics: &[Vec<PartSpec>], base: i64) -> Vec<u8> {
    let built: Vec<Vec<FetchPartitionResponse<'static>>> = topics
        .iter()
        .map(|parts| {
            parts
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let mut r = FetchPartitionResponse::new(i as i32);
                    r.error_code = if p.error { 6 } else { 0 };
                    r.high_watermark = 1000;
                    r.last_stable_offset = 1000;
                    r.log_start_offset = 0;
                    r.aborted_transactions = (!p.aborted.is_empty()).then(|| {
                        p.aborted
                            .iter()
                            .map(|(producer_id, first_offset)| AbortedTransaction {
                                producer_id: *producer_id,
                                first_offset: *first_offset,
                            })
                            .collect()
                    });
                    r.records = Some(records_of(&p.items, base, p.truncate).into());
                    r
                })
                .collect()
        })
        .collect();
    let topics: Vec<(FetchTopic<'_>, Vec<FetchPartitionResponse<'_>>)> = built
        .into_iter()
        .enumerate()
        .map(|(i, parts)| {
            let t = if version >= 13 {
                FetchTopic::Id(TOPIC_IDS[i])
            } else {
                FetchTopic::Name(TOPICS[i])
            };
            (t, parts)
        })
        .collect();
    build_fetch_response(version, 0, 0, 0, &topics).unwrap()
}

fn state(m: &MirrorContext) -> Vec<ps::PartitionSnapshot> {
    let mut s = m.registry.snapshot();
    for p in &mut s {
        for e in &mut p.producers {
            e.last_seen_ms = 0;
        }
        for r in &mut p.salts {
            r.timestamp_ms = 0;
        }
    }
    s.sort_by(|a, b| (&a.key.topic, a.key.partition).cmp(&(&b.key.topic, b.key.partition)));
    s
}

fn counters(metrics: &Metrics) -> Vec<u64> {
    [
        "batch_seen",
        "batch_rewritten",
        "aborted_txn_rewritten",
        "barrier_seen",
        "collision",
        "corrupt_records",
    ]
    .iter()
    .map(|kind| {
        metrics
            .mirror_events
            .get_or_create(&MirrorKindLabels {
                mirror: "m".into(),
                kind,
            })
            .get()
    })
    .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn streamed_equals_store_and_forward(
        version in prop_oneof![Just(4i16), Just(7), Just(11), Just(12), Just(13), Just(15)],
        topics in prop::collection::vec(prop::collection::vec(part(), 1..4), 1..3),
        cuts in prop::collection::vec(1usize..300, 1..8),
        durable in any::<bool>(),
        rounds in 1usize..3,
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (a, ma) = mirror(durable);
            let (b, mb) = mirror(durable);
            // Several responses in a row: the second meets the state the
            // first left (known producers, salts, barriers passed).
            for round in 0..rounds {
                let body = response(version, &topics);
                let want = held(&a, version, &body).await;
                let got = streamed(&b, version, frame(version, &body), cuts.clone()).await;
                match (&want, &got) {
                    (Ok(w), Ok(g)) => {
                        prop_assert_eq!(&frame(version, w), g, "round {}", round);
                    }
                    (Err(_), Err(_)) => return Ok(()),
                    _ => prop_assert!(false, "held {:?} vs streamed {:?}", want.as_ref().err(), got.as_ref().err()),
                }
                prop_assert_eq!(state(&a), state(&b));
                prop_assert_eq!(counters(&ma), counters(&mb));
            }
            Ok(())
        })?;
    }
}

/// A response of `n` batches of `size` bytes each from producer 6 (a new
/// producer: its first batch waits for a claim when `durable`).
fn big_response(n: usize, size: usize) -> Vec<u8> {
    let value = vec![b'x'; size];
    let mut records = Vec::new();
    for i in 0..n {
        records.extend(build_batch(
            &BatchSpec {
                base_offset: i as i64,
                partition_leader_epoch: 3,
                producer_id: 6,
                producer_epoch: 0,
                base_sequence: i as i32,
                ..BatchSpec::default()
            },
            &[RecordSpec {
                value: Some(&value),
                ..RecordSpec::default()
            }],
        ));
    }
    let mut p = FetchPartitionResponse::new(0);
    p.high_watermark = n as i64;
    p.last_stable_offset = n as i64;
    p.records = Some(records.into());
    build_fetch_response(12, 0, 0, 0, &[(FetchTopic::Name("a"), vec![p])]).unwrap()
}

/// Streamed through a duplex in 64 KiB writes: the bytes out and the most
/// the walker's buffer held.
async fn streamed_peak(m: &Arc<MirrorContext>, frame: Vec<u8>) -> (Vec<u8>, usize) {
    let (mut up, down) = tokio::io::duplex(1 << 16);
    let writer = tokio::spawn(async move {
        for piece in frame.chunks(1 << 16) {
            let _ = up.write_all(piece).await;
        }
    });
    let mut reader = FrameReader::new(down, 1 << 26);
    let total = reader.peek(8).await.unwrap().unwrap();
    let mut w = stream::FetchStream::new(m.clone(), &header(12), true).unwrap();
    w.start(total);
    let mut out = Vec::new();
    let mut peak = 0;
    stream::relay_measured(w, &mut reader, &mut out, &mut peak)
        .await
        .unwrap();
    writer.await.unwrap();
    (out, peak)
}

/// Memory is bounded by one read piece and one held batch, not the
/// response: 16 batches of 1 MiB stream with at most a new producer's
/// first batch (held whole for its claim) and a piece in the buffer.
#[tokio::test]
async fn a_large_response_streams_in_bounded_memory() {
    let (a, _) = mirror(true);
    let (b, _) = mirror(true);
    let body = big_response(16, 1 << 20);
    let want = held(&a, 12, &body).await.unwrap();
    let (got, peak) = streamed_peak(&b, frame(12, &body)).await;
    assert_eq!(got, frame(12, &want));
    assert!(
        peak <= (1 << 20) + 2 * READ_CHUNK_FOR_TESTS,
        "peak buffer {peak} bytes"
    );
    // Known producer now: nothing held but heads and a piece.
    let body = big_response(16, 1 << 20);
    let (_, peak) = streamed_peak(&b, frame(12, &body)).await;
    assert!(peak <= 2 * READ_CHUNK_FOR_TESTS, "peak buffer {peak} bytes");
    assert_eq!(b.metrics.streamed.get(), 2);
}

/// Partition `partition` answering one batch at offset 0: the first of
/// producer `pid` (epoch 0, sequence 0).
fn first_batch_of(partition: i32, pid: i64) -> FetchPartitionResponse<'static> {
    let mut p = FetchPartitionResponse::new(partition);
    p.high_watermark = 1;
    p.last_stable_offset = 1;
    p.records = Some(
        build_batch(
            &BatchSpec {
                partition_leader_epoch: 3,
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
        .into(),
    );
    p
}

/// A response of one batch in each of `n` partitions, each from a new
/// producer (its first batch waits for a claim when `durable`).
fn new_producer_per_partition(n: usize) -> Vec<u8> {
    let parts: Vec<FetchPartitionResponse> = (0..n)
        .map(|i| first_batch_of(i as i32, 1000 + i as i64))
        .collect();
    build_fetch_response(12, 0, 0, 0, &[(FetchTopic::Name("a"), parts)]).unwrap()
}

/// A wait that makes progress never ends the relay: a response listing
/// more partitions than `MAX_STREAM_WAITS`, each waiting on its own (a new
/// producer's claim here; a take-over after a leadership move), streams
/// whole, as the held path rewrites it. Before, the relay gave up after 256
/// waits and the fetcher's connection was closed, every 256 partitions.
#[tokio::test]
async fn a_response_with_more_waiting_partitions_than_the_bound_streams_whole() {
    let n = stream::MAX_STREAM_WAITS + 44;
    let (reference, _) = mirror(false);
    let (m, _) = mirror(true);
    let body = new_producer_per_partition(n);
    let want = held(&reference, 12, &body).await.unwrap();
    let (got, _) = streamed_peak(&m, frame(12, &body)).await;
    assert_eq!(got, frame(12, &want));
    assert_eq!(m.metrics.streamed.get(), 1);
}

/// Relays a whole response frame held in memory through the streaming walker
/// (as the fetcher's connection would), counting a response whose waits add
/// up to `slow` as held long; the bytes out, or the failure.
async fn relay_whole(
    m: &Arc<MirrorContext>,
    frame: Vec<u8>,
    slow: std::time::Duration,
) -> Result<Vec<u8>, stream::StreamFailure> {
    let mut reader = FrameReader::new(std::io::Cursor::new(frame), 1 << 26);
    let total = reader.peek(8).await.unwrap().unwrap();
    let mut w = stream::FetchStream::new(m.clone(), &header(12), true).unwrap();
    w.start(total);
    w.set_slow_waits(slow);
    let mut out = Vec::new();
    stream::relay(w, &mut reader, &mut out).await.map(|_| out)
}

/// A response held by its waits past the threshold is counted (and logged)
/// as `response_held_long`; one that streams without a wait is not.
#[tokio::test]
async fn a_response_held_long_by_its_waits_is_counted() {
    for (body, slow, counted) in [
        (new_producer_per_partition(3), std::time::Duration::ZERO, 1),
        (
            new_producer_per_partition(3),
            std::time::Duration::from_secs(3600),
            0,
        ),
    ] {
        let (m, _) = mirror(true);
        relay_whole(&m, frame(12, &body), slow).await.unwrap();
        assert_eq!(m.metrics.held_long.get(), counted, "threshold {slow:?}");
    }
    // No wait at all (producers known): never counted, even at a zero threshold.
    let (m, _) = mirror(true);
    let body = new_producer_per_partition(3);
    held(&m, 12, &body).await.unwrap();
    relay_whole(&m, frame(12, &body), std::time::Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(m.metrics.held_long.get(), 0);
}

/// A wait that changes nothing still ends the relay: PID 5's first batch
/// waits for a salt the store never applies, so the walk stays at that
/// batch; the relay fails after `MAX_STREAM_WAITS` waits there (the
/// connection then closes) instead of waiting for ever.
#[tokio::test]
async fn a_wait_that_changes_nothing_ends_the_relay() {
    let (m, _) = mirror_on(true, true);
    let p = first_batch_of(0, 5);
    let body = build_fetch_response(12, 0, 0, 0, &[(FetchTopic::Name("a"), vec![p])]).unwrap();
    let failure = relay_whole(&m, frame(12, &body), stream::SLOW_WAITS)
        .await
        .unwrap_err();
    assert!(
        failure
            .error
            .to_string()
            .contains("still blocked after 256 waits"),
        "{}",
        failure.error
    );
}

const READ_CHUNK_FOR_TESTS: usize = crate::codec::frame::READ_CHUNK;

/// An upstream that ends mid-response after bytes went to the client: the
/// relay fails (the connection then closes; no short frame is completed).
#[tokio::test]
async fn an_upstream_ending_mid_response_fails_after_bytes_left() {
    let (m, _) = mirror(false);
    let body = big_response(4, 256 << 10);
    let mut f = frame(12, &body);
    f.truncate(f.len() / 2);
    let (mut up, down) = tokio::io::duplex(1 << 16);
    let writer = tokio::spawn(async move {
        let _ = up.write_all(&f).await;
    });
    let mut reader = FrameReader::new(down, 1 << 26);
    let total = reader.peek(8).await.unwrap().unwrap();
    let mut w = stream::FetchStream::new(m.clone(), &header(12), true).unwrap();
    w.start(total);
    let mut out = Vec::new();
    let failure = stream::relay(w, &mut reader, &mut out).await.unwrap_err();
    writer.await.unwrap();
    assert!(
        matches!(failure.error, stream::StreamError::Read(_)),
        "{:?}",
        failure.error
    );
    assert!(failure.written > 0 && failure.written == out.len() && out.len() < total);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Hostile upstream bytes (a valid response with bytes overwritten, or
    /// cut short with its size prefix fixed up): the walker never panics,
    /// and fails wherever the held path fails. A reader's responses (a
    /// flipped partition index would send the fetcher's to a replay).
    #[test]
    fn mutated_responses_never_panic_and_fail_alike(
        version in prop_oneof![Just(4i16), Just(11), Just(12), Just(13)],
        topics in prop::collection::vec(prop::collection::vec(part(), 1..3), 1..3),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in prop::option::of(any::<prop::sample::Index>()),
        cuts in prop::collection::vec(1usize..300, 1..8),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (a, _) = mirror(false);
            let (b, _) = mirror(false);
            let mut body = response(version, &topics);
            for (at, byte) in &flips {
                let i = at.index(body.len());
                body[i] = *byte;
            }
            if let Some(c) = cut {
                let n = c.index(body.len());
                body.truncate(n);
            }
            let want = tokio::time::timeout(std::time::Duration::from_secs(5), held_as(&a, version, &body, false))
                .await
                .expect("held path hangs");
            let got = tokio::time::timeout(
                std::time::Duration::from_secs(5),
                streamed_as(&b, version, frame(version, &body), cuts.clone(), false),
            )
            .await
            .expect("streamed path hangs");
            // Equal bytes are not asserted here: a flipped CRC makes a batch
            // corrupt, which the two paths treat differently where the held
            // one looks ahead (see the module doc of `stream`);
            // `streamed_equals_store_and_forward` compares them.
            if want.is_err() {
                prop_assert!(got.is_err(), "held failed ({:?}) but the stream passed", want);
            }
            Ok(())
        })?;
    }
}

/// The records of the only partition of a Fetch response body.
fn only_records(version: i16, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    crate::handlers::walk_fetch_response(version, body, &mut |p| {
        if let Some(r) = p.records.clone() {
            out.extend_from_slice(&body[r]);
        }
    })
    .unwrap();
    out
}

/// The offset after `item` when it starts at `offset` (as `records_of`
/// numbers them).
fn offset_after(item: &Item, offset: i64) -> i64 {
    match item {
        Item::Data { records, .. } => offset + *records as i64,
        Item::Corrupt(_) => offset + 3,
        _ => offset + 1,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// What the streamed walk does where the held path looks ahead (the
    /// module doc of `stream`): a response with barriers anywhere and
    /// corrupt batches of any producer, streamed whole, gives the bytes,
    /// state and counters the held path gives for the same entries served
    /// one per response. So the walk does not depend on where the source cut
    /// its responses.
    #[test]
    fn streamed_equals_held_one_entry_per_response(
        version in prop_oneof![Just(4i16), Just(12), Just(13)],
        items in prop::collection::vec(
            prop_oneof![
                4 => item(),
                1 => Just(Item::Barrier),
                1 => prop_oneof![Just(5i64), Just(6), Just(1000)].prop_map(Item::Corrupt),
            ],
            1..14,
        ),
        cuts in prop::collection::vec(1usize..300, 1..8),
        durable in any::<bool>(),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (a, ma) = mirror(durable);
            let (b, mb) = mirror(durable);
            let spec = |items: Vec<Item>| vec![vec![PartSpec { error: false, items, truncate: None, aborted: vec![] }]];
            let mut want = Vec::new();
            let mut offset = 0;
            for it in &items {
                let one = response_from(version, &spec(vec![it.clone()]), offset);
                // Never an error: these responses carry nothing a mirror refuses.
                let body = held(&a, version, &one).await;
                prop_assert!(body.is_ok(), "held failed: {:?}", body);
                let body = body.unwrap_or_default();
                want.extend(only_records(version, &body));
                offset = offset_after(it, offset);
            }
            let whole = response(version, &spec(items.clone()));
            let got = streamed(&b, version, frame(version, &whole), cuts).await;
            prop_assert!(got.is_ok(), "streamed failed where the held path did not: {:?}", got);
            let got = got.unwrap_or_default();
            let hdr = frame(version, &[]).len();
            prop_assert_eq!(only_records(version, &got[hdr..]), want);
            // The closings are kept from where each fetch started, which
            // the response cuts change by construction.
            let without_closings = |m: &MirrorContext| {
                let mut s = state(m);
                for p in &mut s {
                    p.closings = None;
                }
                s
            };
            prop_assert_eq!(without_closings(&a), without_closings(&b));
            prop_assert_eq!(counters(&ma), counters(&mb));
            Ok(())
        })?;
    }
}

/// `body` (one topic, one partition, flexible) with a DivergingEpoch
/// `(epoch, end_offset)` in the partition's tagged fields.
fn with_diverging_epoch(mut body: Vec<u8>, epoch: i32, end_offset: i64) -> Vec<u8> {
    // Partition, topic and top-level tagged sections: three empty ones.
    assert!(body.ends_with(&[0, 0, 0]));
    let at = body.len() - 3;
    let mut field = vec![1u8, 0, 13];
    field.extend(epoch.to_be_bytes());
    field.extend(end_offset.to_be_bytes());
    field.push(0);
    body.splice(at..at + 1, field);
    body
}

fn next_offset_and_open(m: &MirrorContext) -> (i64, usize) {
    let s = state(m);
    let open = s[0]
        .producers
        .iter()
        .filter(|e| e.transaction_first_offset.is_some())
        .count();
    (s[0].next_offset, open)
}

/// The source truncated its log below what the state observed: the
/// fetcher's answer carries a DivergingEpoch, on the held and the streamed
/// path alike the partition's state starts over (claims kept) and the
/// mirror counts it; a reader's answer changes nothing.
#[tokio::test]
async fn a_diverging_epoch_below_the_state_starts_the_partition_over() {
    let seen = PartSpec {
        error: false,
        items: vec![
            Item::Data {
                pid: 6,
                txn: true,
                records: 3,
            },
            Item::Data {
                pid: 7,
                txn: false,
                records: 2,
            },
        ],
        truncate: None,
        aborted: Vec::new(),
    };
    let empty = PartSpec {
        items: Vec::new(),
        ..seen.clone()
    };
    let diverged = |end| with_diverging_epoch(response(12, &[vec![empty.clone()]]), 0, end);
    for (path, fetcher) in [("held", true), ("streamed", true), ("reader", false)] {
        let (m, metrics) = mirror(true);
        held(&m, 12, &response(12, &[vec![seen.clone()]]))
            .await
            .unwrap();
        assert_eq!(next_offset_and_open(&m), (5, 1), "{path}");
        let producers = state(&m)[0].producers.len();
        // At or past what the state saw: no truncation of what it observed.
        held(&m, 12, &diverged(5)).await.unwrap();
        assert_eq!(next_offset_and_open(&m), (5, 1), "{path}");
        match path {
            "streamed" => {
                let frame = frame(12, &diverged(2));
                streamed(&m, 12, frame, vec![9, 31]).await.unwrap();
            }
            _ => {
                held_as(&m, 12, &diverged(2), fetcher).await.unwrap();
            }
        }
        let truncations = metrics
            .mirror_events
            .get_or_create(&MirrorKindLabels {
                mirror: "m".into(),
                kind: "source_truncated",
            })
            .get();
        if fetcher {
            assert_eq!(next_offset_and_open(&m), (0, 0), "{path}");
            let after = &state(&m)[0].producers;
            assert_eq!(after.len(), producers, "{path}: claims kept");
            assert!(after.iter().all(|e| e.last_offset == -1), "{path}");
            assert_eq!(truncations, 1, "{path}");
        } else {
            assert_eq!(next_offset_and_open(&m), (5, 1), "{path}");
            assert_eq!(truncations, 0, "{path}");
        }
    }
}
