//! Property tests of cut-through relaying: the same exchanges, split at
//! random byte boundaries on both sides and carried through small duplex
//! buffers (slow readers and writers), are relayed once with every frame
//! held whole and once streamed; what the upstream and the client receive
//! must be byte for byte the same, and equal to what was sent. Requests
//! include Produce with `acks=0` (answered anyway by some exchanges, as
//! Tansu does), a request abandoned mid-frame, and responses with a wrong
//! correlation id.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{BufMut, BytesMut};
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::connection::{relay_with, ConnectionContext, UpstreamHealth};
use super::nodes::NodeRegistry;
use crate::codec::api;
use crate::filter::address::AddressRewrite;
use crate::filter::produce_guard::ProduceGuard;
use crate::filter::Chain;
use crate::metrics::Metrics;

/// One request and what the upstream does with it.
#[derive(Debug, Clone)]
struct Exchange {
    api_key: i16,
    api_version: i16,
    acks: i16,
    body: Vec<u8>,
    response: Vec<u8>,
    /// The upstream answers (an `acks=0` Produce is answered only if set).
    answer_acks0: bool,
    /// A whole request body (a real Produce for the guard), used instead
    /// of `acks` and `body`.
    encoded: Option<Vec<u8>>,
}

fn exchange() -> impl Strategy<Value = Exchange> {
    let kind = prop_oneof![
        // Produce v3..=9: no addresses in the response, nothing reads it.
        (Just(api::PRODUCE), 3i16..=9),
        // Fetch below v16: the response carries no addresses.
        (Just(api::FETCH), 4i16..=15),
        // ListOffsets: no filter of a plain chain handles it.
        (Just(2i16), 1i16..=5),
    ];
    (
        kind,
        prop_oneof![Just(-1i16), Just(1), Just(0)],
        proptest::collection::vec(any::<u8>(), 0..3000),
        proptest::collection::vec(any::<u8>(), 0..3000),
        any::<bool>(),
    )
        .prop_map(
            |((api_key, api_version), acks, body, response, answer_acks0)| Exchange {
                api_key,
                api_version,
                acks,
                body,
                response,
                answer_acks0,
                encoded: None,
            },
        )
}

impl Exchange {
    fn unanswered(&self) -> bool {
        self.api_key == api::PRODUCE && self.acks == 0
    }

    fn answered(&self) -> bool {
        !self.unanswered() || self.answer_acks0
    }

    /// The request frame: header v1 or v2 (client id "c"), then for
    /// Produce the null transactional id and `acks`, then the random body.
    fn request(&self, correlation_id: i32) -> Vec<u8> {
        let mut f = BytesMut::new();
        f.put_i32(0);
        f.put_i16(self.api_key);
        f.put_i16(self.api_version);
        f.put_i32(correlation_id);
        f.put_i16(1);
        f.put_u8(b'c');
        let flexible =
            crate::handlers::request_header_version(self.api_key, self.api_version) == Some(2);
        if flexible {
            f.put_u8(0); // no tagged fields
        }
        if let Some(body) = &self.encoded {
            f.extend_from_slice(body);
        } else if self.api_key == api::PRODUCE {
            if flexible {
                f.put_u8(0); // null compact transactional id
            } else {
                f.put_i16(-1);
            }
            f.put_i16(self.acks);
        }
        if self.encoded.is_none() {
            f.extend_from_slice(&self.body);
        }
        let n = (f.len() - 4) as i32;
        f[..4].copy_from_slice(&n.to_be_bytes());
        f.to_vec()
    }

    /// The response frame (header v0: these versions are not flexible).
    fn response(&self, correlation_id: i32) -> Vec<u8> {
        let mut f = BytesMut::new();
        f.put_i32((4 + self.response.len()) as i32);
        f.put_i32(correlation_id);
        f.extend_from_slice(&self.response);
        f.to_vec()
    }
}

#[derive(Debug, Clone)]
struct Case {
    exchanges: Vec<Exchange>,
    /// Bytes cut off the last request (the client abandons it), 0: none.
    truncate_last: usize,
    /// This answer (by index) comes back with a wrong correlation id.
    bad_correlation: Option<usize>,
    /// Piece sizes of the client's and the upstream's writes.
    client_pieces: Vec<usize>,
    upstream_pieces: Vec<usize>,
    /// Duplex buffer sizes (client side, upstream side).
    buffers: (usize, usize),
    /// The cut-through threshold of the streaming run.
    stream_above: usize,
}

fn case() -> impl Strategy<Value = Case> {
    (
        proptest::collection::vec(exchange(), 1..6),
        prop_oneof![3 => Just(0usize), 1 => 1usize..400],
        proptest::option::weighted(0.15, 0usize..6),
        proptest::collection::vec(1usize..5000, 1..8),
        proptest::collection::vec(1usize..5000, 1..8),
        (7usize..4096, 7usize..4096),
        0usize..600,
    )
        .prop_map(
            |(
                exchanges,
                truncate_last,
                bad_correlation,
                client_pieces,
                upstream_pieces,
                buffers,
                stream_above,
            )| {
                // A wrong id only on an answer the client waits for, and
                // not racing an abandoned request.
                let bad_correlation = bad_correlation.filter(|b| {
                    truncate_last == 0 && exchanges.get(*b).is_some_and(|x| !x.unanswered())
                });
                Case {
                    exchanges,
                    truncate_last,
                    bad_correlation,
                    client_pieces,
                    upstream_pieces,
                    buffers,
                    stream_above,
                }
            },
        )
}

/// A real Produce (v3-v9: no addresses in the response) for a guard
/// listener, encoded by the independent `kafka-protocol` crate, or one of
/// the plain exchanges.
fn guard_exchange() -> impl Strategy<Value = Exchange> {
    let produce = (
        3i16..=9,
        prop_oneof![Just(-1i16), Just(1), Just(0)],
        proptest::collection::vec(
            (
                0usize..3,
                proptest::collection::vec((0i32..8, 0usize..2500), 0..3),
            ),
            1..3,
        ),
        proptest::collection::vec(any::<u8>(), 0..300),
        any::<bool>(),
    )
        .prop_map(|(api_version, acks, topics, response, answer_acks0)| {
            use kafka_protocol::messages::produce_request::{
                PartitionProduceData, TopicProduceData,
            };
            use kafka_protocol::messages::{ProduceRequest, TopicName};
            use kafka_protocol::protocol::{Encodable, StrBytes};
            let mut req = ProduceRequest::default();
            req.acks = acks;
            req.timeout_ms = 1000;
            req.topic_data = topics
                .iter()
                .map(|(t, parts)| {
                    let mut td = TopicProduceData::default();
                    td.name = TopicName(StrBytes::from_static_str(["a", "bb", "ccc"][*t]));
                    td.partition_data = parts
                        .iter()
                        .map(|(p, n)| {
                            let mut d = PartitionProduceData::default();
                            d.index = *p;
                            d.records = Some(bytes::Bytes::from(vec![*p as u8; *n]));
                            d
                        })
                        .collect();
                    td
                })
                .collect();
            let mut body = BytesMut::new();
            req.encode(&mut body, api_version).unwrap();
            Exchange {
                api_key: api::PRODUCE,
                api_version,
                acks,
                body: Vec::new(),
                response,
                answer_acks0,
                encoded: Some(body.to_vec()),
            }
        });
    prop_oneof![3 => produce, 1 => exchange().prop_filter("not a random Produce", |x| x.api_key != api::PRODUCE)]
}

/// What one relay run produced.
#[derive(Debug, PartialEq)]
struct Outcome {
    /// Bytes the upstream received.
    upstream_got: Vec<u8>,
    /// Bytes the client received.
    client_got: Vec<u8>,
    /// Side and cause of the connection's end.
    end: (&'static str, &'static str),
}

fn context(guard: bool) -> Arc<ConnectionContext> {
    let metrics = Metrics::new();
    let nodes = Arc::new(NodeRegistry::new("t", "127.0.0.1", 0, metrics.clone()));
    let mut filters: Vec<Box<dyn crate::filter::Filter>> = Vec::new();
    if guard {
        // No mirrors, no life cycle: the guard refuses nothing.
        filters.push(Box::new(ProduceGuard::new(
            "t",
            crate::lifecycle::Lifecycle::new(metrics.clone()),
            Vec::new(),
            metrics.clone(),
        )));
    }
    filters.push(Box::new(AddressRewrite::new(nodes)));
    Arc::new(ConnectionContext {
        listener: "t".into(),
        max_frame: 1 << 20,
        metrics,
        chain: Arc::new(Chain::new(filters)),
        health: Arc::new(UpstreamHealth::default()),
        budget: crate::proxy::limits::MemoryBudget::unlimited(),
    })
}

/// Writes `data` in pieces cycling through `pieces`, yielding in between.
async fn write_pieces<W: tokio::io::AsyncWrite + Unpin>(
    w: &mut W,
    data: &[u8],
    pieces: &[usize],
) -> std::io::Result<()> {
    let mut at = 0;
    let mut i = 0;
    while at < data.len() {
        let n = pieces[i % pieces.len()].min(data.len() - at);
        w.write_all(&data[at..at + n]).await?;
        at += n;
        i += 1;
        tokio::task::yield_now().await;
    }
    Ok(())
}

/// The client's request bytes and the response bytes it waits for.
fn client_script(case: &Case) -> (Vec<u8>, usize) {
    let mut requests = Vec::new();
    let mut expect = 0;
    let last = case.exchanges.len() - 1;
    for (i, x) in case.exchanges.iter().enumerate() {
        let mut r = x.request(i as i32);
        if i == last && case.truncate_last > 0 {
            let keep = r.len().saturating_sub(case.truncate_last).max(1);
            r.truncate(keep);
        } else if !x.unanswered() {
            expect += x.response(i as i32).len();
        }
        requests.extend_from_slice(&r);
    }
    (requests, expect)
}

async fn run(case: &Case, stream_above: usize, guard: bool) -> Outcome {
    let ctx = context(guard);
    let (client, proxy_client) = tokio::io::duplex(case.buffers.0);
    let (proxy_upstream, upstream) = tokio::io::duplex(case.buffers.1);
    let (_tx, shutdown) = tokio::sync::watch::channel(false);
    let peer: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let relay = tokio::spawn(relay_with(
        proxy_client,
        proxy_upstream,
        peer,
        ctx,
        shutdown,
        false,
        stream_above,
    ));

    // The upstream: answers each whole request it reads, in order.
    let exchanges = case.exchanges.clone();
    let pieces = case.upstream_pieces.clone();
    let bad = case.bad_correlation;
    // Reads and answers concurrently: an answer the relay does not read
    // yet (to an `acks=0` Produce) must not stop the reading.
    let (answers_tx, mut answers_rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    let upstream_task = tokio::spawn(async move {
        let (mut rd, mut wr) = tokio::io::split(upstream);
        let answering = tokio::spawn(async move {
            while let Some(a) = answers_rx.recv().await {
                // A relay that has ended cannot be written to.
                if write_pieces(&mut wr, &a, &pieces).await.is_err() {
                    break;
                }
            }
        });
        let mut got = Vec::new();
        let mut parsed = 0;
        let mut buf = vec![0u8; 8192];
        loop {
            let n = match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            got.extend_from_slice(&buf[..n]);
            while got.len() >= parsed + 12 {
                let size = i32::from_be_bytes(got[parsed..parsed + 4].try_into().unwrap());
                let end = parsed + 4 + size as usize;
                if got.len() < end {
                    break;
                }
                let id = i32::from_be_bytes(got[parsed + 8..parsed + 12].try_into().unwrap());
                parsed = end;
                let x = &exchanges[id as usize];
                if !x.answered() {
                    continue;
                }
                let answer_id = if bad == Some(id as usize) {
                    id + 1000
                } else {
                    id
                };
                let _ = answers_tx.send(x.response(answer_id));
            }
        }
        drop(answers_tx);
        answering.abort();
        got
    });

    let (requests, expect) = client_script(case);
    let truncated = case.truncate_last > 0;
    let (mut crd, mut cwr) = tokio::io::split(client);
    let pieces = case.client_pieces.clone();
    let writer = tokio::spawn(async move {
        let _ = write_pieces(&mut cwr, &requests, &pieces).await;
        if truncated {
            // Abandon the last request: close the write side.
            let _ = cwr.shutdown().await;
            drop(cwr);
            return None;
        }
        Some(cwr)
    });
    let mut client_got = Vec::new();
    let mut buf = vec![0u8; 8192];
    while truncated || client_got.len() < expect {
        match crd.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => client_got.extend_from_slice(&buf[..n]),
        }
    }
    // All answers are in (or the relay ended): close the client.
    let cwr = writer.await.unwrap();
    drop(cwr);
    drop(crd);
    let end = relay.await.unwrap();
    let upstream_got = upstream_task.await.unwrap();
    Outcome {
        upstream_got,
        client_got,
        end: (end.side(), end.cause()),
    }
}

/// One run, failing (not hanging) if the relay stalls.
fn run_bounded(
    rt: &tokio::runtime::Runtime,
    case: &Case,
    stream_above: usize,
    guard: bool,
) -> Outcome {
    rt.block_on(async {
        tokio::time::timeout(
            std::time::Duration::from_secs(30),
            run(case, stream_above, guard),
        )
        .await
    })
    .expect("the relay stalled")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Streamed and held-whole relaying deliver the same bytes to both
    /// sides; a request abandoned mid-frame ends both with the same cause,
    /// the streamed run having forwarded at most a prefix of it.
    #[test]
    fn streaming_matches_store_and_forward(case in case()) {
        let rt = runtime();
        let stored = run_bounded(&rt, &case, usize::MAX, false);
        let streamed = run_bounded(&rt, &case, case.stream_above, false);
        let (requests, _) = client_script(&case);
        if case.truncate_last > 0 {
            prop_assert_eq!(stored.end, ("client", "mid_request"));
            prop_assert_eq!(streamed.end, ("client", "mid_request"));
            // Whole requests all reach the upstream either way; of the
            // abandoned one only the streamed run may have sent a part.
            let last = case.exchanges.len() - 1;
            let whole = requests.len() - requests.len().min(
                case.exchanges[last].request(last as i32).len()
                    - case.truncate_last.min(case.exchanges[last].request(last as i32).len() - 1),
            );
            prop_assert_eq!(&stored.upstream_got[..], &requests[..whole]);
            prop_assert!(requests.starts_with(&streamed.upstream_got));
            prop_assert!(streamed.upstream_got.len() >= whole);
        } else if let Some(bad) = case.bad_correlation {
            prop_assert_eq!(stored.end, ("upstream", "protocol"));
            prop_assert_eq!(&streamed.end, &stored.end);
            // Nothing of the mismatched answer reaches the client.
            let before: usize = case.exchanges[..bad]
                .iter()
                .enumerate()
                .filter(|(_, x)| !x.unanswered())
                .map(|(i, x)| x.response(i as i32).len())
                .sum();
            prop_assert_eq!(stored.client_got.len(), before);
            prop_assert_eq!(&streamed.client_got, &stored.client_got);
        } else {
            prop_assert_eq!(&stored.upstream_got, &requests);
            let expected: Vec<u8> = case
                .exchanges
                .iter()
                .enumerate()
                .filter(|(_, x)| !x.unanswered())
                .flat_map(|(i, x)| x.response(i as i32))
                .collect();
            prop_assert_eq!(&stored.client_got, &expected);
            prop_assert_eq!(&streamed, &stored);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// A guard listener (nothing refused) streams real Produce requests
    /// whose partition headers are in their head, and holds the others:
    /// the bytes both sides see are the same as when every frame is held.
    #[test]
    fn guard_streaming_matches_store_and_forward(
        exchanges in proptest::collection::vec(guard_exchange(), 1..5),
        pieces in proptest::collection::vec(1usize..3000, 1..6),
        buffers in (7usize..4096, 7usize..4096),
        stream_above in 0usize..600,
    ) {
        let case = Case {
            exchanges,
            truncate_last: 0,
            bad_correlation: None,
            client_pieces: pieces.clone(),
            upstream_pieces: pieces,
            buffers,
            stream_above,
        };
        let rt = runtime();
        let stored = run_bounded(&rt, &case, usize::MAX, true);
        let streamed = run_bounded(&rt, &case, case.stream_above, true);
        let (requests, _) = client_script(&case);
        prop_assert_eq!(&stored.upstream_got, &requests);
        prop_assert_eq!(&streamed, &stored);
    }
}
