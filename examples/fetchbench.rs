//! End-to-end benchmark tools (not part of the proxy; see BENCHMARKS.md).
//!
//! `fetchbench fetch` is the load generator: a minimal Kafka fetcher
//! (FetchRequest v12 by topic name, one request in flight per connection,
//! full fetches without sessions, like a replica fetcher) that reads a
//! topic's partitions from offset 0 to their end, over and over, until a byte
//! or time bound, and prints one JSON line: bytes, records, batches,
//! requests, elapsed time and request latency percentiles. With `--rate` it
//! paces requests (per connection) to measure latency below saturation.
//!
//! `fetchbench upstream` is the *synthetic upstream benchmark fixture*: a
//! tiny Kafka "broker" that answers Metadata (one node: itself) and Fetch
//! with pre-built responses, at memory speed, so that mirrorguard's own
//! ceiling can be measured without a real broker in the way. Its batches
//! carry producer ids (one per batch slot, `--producers` per partition) and
//! baseSequence -1 (NO_SEQUENCE) so replaying them never trips sequence
//! checks; base offsets advance with every response (they are outside the
//! CRC, so patching them is free), so producer-state tracking sees new
//! batches every time and region mode rewrites every batch.
//!
//! `fetchbench relay` is the *floor relay*: the least any TCP relay can do,
//! to compare mirrorguard with. It accepts connections and copies bytes both
//! ways, one blocking thread per direction, with `read`/`write` through a
//! 256 KiB buffer, or with `--splice` through a pipe (`splice(2)`, Linux,
//! no copy into user space). It parses nothing, so what it costs is the
//! kernel's share of relaying: what no Kafka proxy can go below.
//!
//! `upstream --link-mbps M` paces each connection's responses to M MB/s (64
//! KiB pieces on a schedule), a model of a source across a network link
//! rather than in memory beside the fetcher.
//!
//! Both `upstream` and `fetch` take TLS options (`upstream --tls-cert C --tls-key K`, `fetch
//! --tls-ca CA`) so the cost of TLS on the mirror path can be measured
//! against the same path in plaintext.
//!
//! ```text
//! cargo run --release --example fetchbench -- upstream --listen 127.0.0.1:19999 \
//!     --topic t --partitions 8 --batch-bytes 16384 --batches 64
//! cargo run --release --example fetchbench -- fetch --addr 127.0.0.1:19999 \
//!     --topic t --partitions 8 --seconds 5
//! ```

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{BufMut, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic as ReqTopic};
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{
    BrokerId, FetchRequest, MetadataResponse, RequestHeader, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use mirrorguard::handlers::fetch_build::{build_fetch_response, FetchPartitionResponse};
use mirrorguard::handlers::{walk_fetch_response, FetchTopic};
use mirrorguard::records::builder::{build_batch, BatchSpec, RecordSpec};
use mirrorguard::records::{walk, Entry};

const FETCH: i16 = 1;
const METADATA: i16 = 3;

/// A benchmark connection: plain TCP or blocking rustls over it.
enum BenchStream {
    Plain(TcpStream),
    Server(Box<rustls::StreamOwned<rustls::ServerConnection, TcpStream>>),
    Client(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Read for BenchStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            BenchStream::Plain(s) => s.read(buf),
            BenchStream::Server(s) => s.read(buf),
            BenchStream::Client(s) => s.read(buf),
        }
    }
}

impl Write for BenchStream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            BenchStream::Plain(s) => s.write(buf),
            BenchStream::Server(s) => s.write(buf),
            BenchStream::Client(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            BenchStream::Plain(s) => s.flush(),
            BenchStream::Server(s) => s.flush(),
            BenchStream::Client(s) => s.flush(),
        }
    }
}

fn usage() -> ! {
    eprintln!(
        "usage:\n  fetchbench upstream --listen HOST:PORT --topic T --partitions N \
         [--batch-bytes B] [--batches K] [--producers P] [--records-per-batch R] \
         [--cluster-id ID] [--link-mbps M] [--tls-cert C --tls-key K]\n  fetchbench relay --listen HOST:PORT --upstream HOST:PORT [--splice] [--buffer-kib K]\n  fetchbench fetch --addr HOST:PORT --topic T --partitions N \
         [--connections C] [--seconds S] [--max-mb M] [--rate REQ_PER_S_PER_CONN] \
         [--partition-max-bytes B] [--max-wait-ms W] [--verify-crc] [--tls-ca CA]"
    );
    std::process::exit(2)
}

struct Args(HashMap<String, String>);

impl Args {
    fn parse(it: impl Iterator<Item = String>) -> Self {
        let mut m = HashMap::new();
        let mut it = it.peekable();
        while let Some(k) = it.next() {
            let Some(k) = k.strip_prefix("--") else {
                usage()
            };
            let v = match it.peek() {
                Some(v) if !v.starts_with("--") => it.next().unwrap_or_default(),
                _ => "true".to_string(),
            };
            m.insert(k.to_string(), v);
        }
        Args(m)
    }
    fn str(&self, k: &str) -> String {
        self.0.get(k).cloned().unwrap_or_else(|| {
            eprintln!("missing --{k}");
            usage()
        })
    }
    fn opt(&self, k: &str) -> Option<String> {
        self.0.get(k).cloned()
    }
    fn num<T: std::str::FromStr>(&self, k: &str, default: T) -> T {
        match self.0.get(k) {
            Some(v) => v.parse().unwrap_or_else(|_| {
                eprintln!("bad --{k} {v}");
                usage()
            }),
            None => default,
        }
    }
    fn flag(&self, k: &str) -> bool {
        self.0.contains_key(k)
    }
}

fn main() {
    let mut argv = std::env::args().skip(1);
    let cmd = argv.next().unwrap_or_else(|| usage());
    let args = Args::parse(argv);
    match cmd.as_str() {
        "upstream" => upstream(&args),
        "relay" => relay(&args),
        "fetch" => fetch(&args),
        "crc" => crc(&args),
        _ => usage(),
    }
}

/// Raw CRC-32C speed of one core on 16 KiB buffers (the reference the
/// rewrite path is compared with), measured for `--seconds` (default 1).
fn crc(args: &Args) {
    let seconds: f64 = args.num("seconds", 1.0);
    let bufs: Vec<Vec<u8>> = (0..64u8).map(|i| vec![i; 16384]).collect();
    let start = Instant::now();
    let (mut bytes, mut acc, mut i) = (0u64, 0u32, 0usize);
    while start.elapsed().as_secs_f64() < seconds {
        for _ in 0..1024 {
            acc ^= crc32c::crc32c(std::hint::black_box(&bufs[i % bufs.len()]));
            i += 1;
            bytes += 16384;
        }
    }
    let el = start.elapsed().as_secs_f64();
    println!(
        "{{\"mb_per_s\": {:.1}, \"check\": {acc}}}",
        bytes as f64 / el / 1e6
    );
}

// ---------------------------------------------------------------------------
// frames

fn read_frame(s: &mut impl Read, buf: &mut Vec<u8>) -> std::io::Result<bool> {
    let mut size = [0u8; 4];
    match s.read_exact(&mut size) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(false),
        Err(e) => return Err(e),
    }
    let n = i32::from_be_bytes(size);
    if !(0..=(256 << 20)).contains(&n) {
        return Err(std::io::Error::other(format!("bad frame size {n}")));
    }
    buf.clear();
    buf.extend_from_slice(&size);
    buf.resize(4 + n as usize, 0);
    s.read_exact(&mut buf[4..])?;
    Ok(true)
}

fn frame_of(header: &[u8], body: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(4 + header.len() + body.len());
    f.put_i32((header.len() + body.len()) as i32);
    f.extend_from_slice(header);
    f.extend_from_slice(body);
    f
}

// ---------------------------------------------------------------------------
// synthetic upstream

struct Fixture {
    topic: String,
    partitions: i32,
    /// Pre-built records of one partition, one blob per producer variant:
    /// `batches` batches each.
    variants: Vec<Vec<u8>>,
    records_per_batch: i64,
    batches: i64,
    cluster_id: String,
    advertised: (String, i32),
}

/// Pre-built responses by (version, partitions requested, producer variant).
type ResponseCache = HashMap<(i16, Vec<i32>, usize), Arc<Mutex<Prebuilt>>>;

/// A pre-built response frame and where its batches are.
struct Prebuilt {
    frame: Vec<u8>,
    batches: Vec<usize>,
}

impl Fixture {
    fn build_response(&self, version: i16, wanted: &[i32], variant: usize) -> Prebuilt {
        let parts: Vec<FetchPartitionResponse<'_>> = wanted
            .iter()
            .map(|&p| {
                let mut r = FetchPartitionResponse::new(p);
                r.high_watermark = i64::MAX / 4;
                r.last_stable_offset = i64::MAX / 4;
                r.log_start_offset = 0;
                r.records = Some(Cow::Borrowed(&self.variants[variant][..]));
                r
            })
            .collect();
        let body =
            build_fetch_response(version, 0, 0, 0, &[(FetchTopic::Name(&self.topic), parts)])
                .expect("fetch response");
        let header: &[u8] = if version >= 12 {
            &[0, 0, 0, 0, 0]
        } else {
            &[0, 0, 0, 0]
        };
        let frame = frame_of(header, &body);
        let at = 4 + header.len();
        let mut batches = Vec::new();
        walk_fetch_response(version, &frame[at..], &mut |p| {
            if let Some(r) = p.records.clone() {
                for e in walk(&frame[at + r.start..at + r.end]).flatten() {
                    batches.push(at + r.start + e.range().start);
                }
            }
        })
        .expect("walk own response");
        Prebuilt { frame, batches }
    }

    fn metadata(&self, version: i16, corr: i32) -> Vec<u8> {
        let broker = MetadataResponseBroker::default()
            .with_node_id(BrokerId(0))
            .with_host(StrBytes::from_string(self.advertised.0.clone()))
            .with_port(self.advertised.1);
        let parts = (0..self.partitions)
            .map(|p| {
                MetadataResponsePartition::default()
                    .with_partition_index(p)
                    .with_leader_id(BrokerId(0))
                    .with_replica_nodes(vec![BrokerId(0)])
                    .with_isr_nodes(vec![BrokerId(0)])
            })
            .collect();
        let topic = MetadataResponseTopic::default()
            .with_name(Some(TopicName(StrBytes::from_string(self.topic.clone()))))
            .with_partitions(parts);
        let msg = MetadataResponse::default()
            .with_brokers(vec![broker])
            .with_cluster_id(Some(StrBytes::from_string(self.cluster_id.clone())))
            .with_controller_id(BrokerId(0))
            .with_topics(vec![topic]);
        let mut body = BytesMut::new();
        msg.encode(&mut body, version).expect("metadata encode");
        let mut header = BytesMut::new();
        ResponseHeader::default()
            .with_correlation_id(corr)
            .encode(&mut header, if version >= 9 { 1 } else { 0 })
            .expect("header encode");
        frame_of(&header, &body)
    }
}

fn upstream(args: &Args) {
    let listen = args.str("listen");
    let topic = args.str("topic");
    let partitions: i32 = args.num("partitions", 1);
    let batch_bytes: usize = args.num("batch-bytes", 16384);
    let batches: usize = args.num("batches", 64);
    let producers: usize = args.num("producers", batches).max(1);
    let rpb: usize = args.num("records-per-batch", 16);
    let cluster_id = args
        .0
        .get("cluster-id")
        .cloned()
        .unwrap_or_else(|| "MkU3OEVBNTcwNTJENDM2Qg".into());
    let value_len = (batch_bytes.saturating_sub(61) / rpb)
        .saturating_sub(8)
        .max(1);
    let value = vec![0x6bu8; value_len];
    let recs: Vec<RecordSpec<'_>> = (0..rpb as i32)
        .map(|i| RecordSpec {
            offset_delta: i,
            value: Some(&value),
            ..RecordSpec::default()
        })
        .collect();
    // Producer slot j of variant v is PID 1000 + (v * batches + j) % producers.
    let nvariants = producers.div_ceil(batches);
    let variants: Vec<Vec<u8>> = (0..nvariants)
        .map(|v| {
            let mut blob = Vec::new();
            for j in 0..batches {
                let pid = 1000 + ((v * batches + j) % producers) as i64;
                blob.extend_from_slice(&build_batch(
                    &BatchSpec {
                        producer_id: pid,
                        producer_epoch: 0,
                        base_sequence: -1,
                        base_timestamp: 1_700_000_000_000,
                        max_timestamp: 1_700_000_000_000,
                        ..BatchSpec::default()
                    },
                    &recs,
                ));
            }
            blob
        })
        .collect();
    let tls = args.opt("tls-cert").map(|cert| {
        let files = mirrorguard::config::ServerTlsConfig {
            cert: cert.into(),
            key: args.str("tls-key").into(),
            client_ca: None,
            handshake_timeout_ms: 10_000,
        };
        Arc::new(mirrorguard::tls::server_config(&files).expect("fixture TLS files"))
    });
    let socket = TcpListener::bind(&listen).expect("bind");
    let local = socket.local_addr().expect("addr");
    let fx = Arc::new(Fixture {
        topic,
        partitions,
        variants,
        records_per_batch: rpb as i64,
        batches: batches as i64,
        cluster_id,
        advertised: (local.ip().to_string(), i32::from(local.port())),
    });
    eprintln!(
        "synthetic upstream on {local}: {partitions} partitions, {batches} batches of {} B per \
         partition per response, {producers} producers per partition ({nvariants} variants)",
        fx.variants[0].len() / batches
    );
    // Bytes per second of each connection's link (0: memory speed).
    let link_bps: f64 = args.num::<f64>("link-mbps", 0.0) * 1e6;
    let cache: Arc<Mutex<ResponseCache>> = Arc::default();
    for conn in socket.incoming() {
        let Ok(tcp) = conn else { continue };
        let fx = fx.clone();
        let cache = cache.clone();
        let tls = tls.clone();
        std::thread::spawn(move || {
            let _ = tcp.set_nodelay(true);
            let mut conn = match tls {
                None => BenchStream::Plain(tcp),
                Some(cfg) => match rustls::ServerConnection::new(cfg) {
                    Ok(c) => BenchStream::Server(Box::new(rustls::StreamOwned::new(c, tcp))),
                    Err(_) => return,
                },
            };
            let mut buf = Vec::new();
            let mut variant = 0usize;
            let mut link = Link::new(link_bps);
            while let Ok(true) = read_frame(&mut conn, &mut buf) {
                let mut b = bytes::Bytes::copy_from_slice(&buf[4..]);
                let api = i16::from_be_bytes([buf[4], buf[5]]);
                let version = i16::from_be_bytes([buf[6], buf[7]]);
                let corr = i32::from_be_bytes([buf[8], buf[9], buf[10], buf[11]]);
                let hv = if (api == FETCH && version >= 12) || (api == METADATA && version >= 9) {
                    2
                } else {
                    1
                };
                if RequestHeader::decode(&mut b, hv).is_err() {
                    return;
                }
                let out_ok = match api {
                    METADATA => link.send(&mut conn, &fx.metadata(version, corr)).is_ok(),
                    FETCH if (4..=12).contains(&version) => {
                        let Ok(req) = FetchRequest::decode(&mut b, version) else {
                            return;
                        };
                        let mut asked: Vec<(i32, i64)> = req
                            .topics
                            .iter()
                            .filter(|t| t.topic.0.as_str() == fx.topic)
                            .flat_map(|t| {
                                t.partitions.iter().map(|p| (p.partition, p.fetch_offset))
                            })
                            .collect();
                        asked.sort_unstable();
                        let wanted: Vec<i32> = asked.iter().map(|(p, _)| *p).collect();
                        let key = (version, wanted, variant);
                        variant = (variant + 1) % fx.variants.len();
                        let entry = {
                            let mut c = cache.lock().unwrap_or_else(|p| p.into_inner());
                            c.entry(key)
                                .or_insert_with_key(|(v, w, var)| {
                                    Arc::new(Mutex::new(fx.build_response(*v, w, *var)))
                                })
                                .clone()
                        };
                        let mut pre = entry.lock().unwrap_or_else(|p| p.into_inner());
                        let Prebuilt { frame, batches } = &mut *pre;
                        frame[4..8].copy_from_slice(&corr.to_be_bytes());
                        // Like a log: each partition's batches start at the offset
                        // the fetcher asked for (a mirror checks that its fetcher's
                        // position and what it is served agree).
                        for (i, &at) in batches.iter().enumerate() {
                            let part = i / fx.batches as usize;
                            let slot = i as i64 % fx.batches;
                            let from = asked.get(part).map_or(0, |(_, o)| (*o).max(0));
                            let off = from + slot * fx.records_per_batch;
                            frame[at..at + 8].copy_from_slice(&off.to_be_bytes());
                        }
                        link.send(&mut conn, frame).is_ok()
                    }
                    _ => {
                        eprintln!("synthetic upstream: unsupported api {api} v{version}");
                        false
                    }
                };
                if !out_ok {
                    return;
                }
            }
        });
    }
}

/// A connection's link: writes paced to a byte rate, in 64 KiB pieces.
struct Link {
    bytes_per_s: f64,
    /// When the link is free again (the last piece's end on the schedule).
    free_at: Instant,
}

impl Link {
    const PIECE: usize = 64 << 10;

    fn new(bytes_per_s: f64) -> Self {
        Self {
            bytes_per_s,
            free_at: Instant::now(),
        }
    }

    fn send(&mut self, out: &mut impl Write, frame: &[u8]) -> std::io::Result<()> {
        if self.bytes_per_s <= 0.0 {
            return out.write_all(frame);
        }
        // An idle link starts now; a busy one continues its schedule.
        self.free_at = self.free_at.max(Instant::now());
        for piece in frame.chunks(Self::PIECE) {
            let wait = self.free_at.saturating_duration_since(Instant::now());
            if !wait.is_zero() {
                std::thread::sleep(wait);
            }
            out.write_all(piece)?;
            self.free_at += Duration::from_secs_f64(piece.len() as f64 / self.bytes_per_s);
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// floor relay

fn relay(args: &Args) {
    let listen = args.str("listen");
    let upstream = args.str("upstream");
    let splice = args.flag("splice");
    let buffer = args.num::<usize>("buffer-kib", 256).max(1) << 10;
    if splice && !cfg!(target_os = "linux") {
        eprintln!("--splice needs Linux");
        std::process::exit(2)
    }
    let socket = TcpListener::bind(&listen).expect("bind");
    eprintln!(
        "floor relay on {} to {upstream} ({})",
        socket.local_addr().expect("addr"),
        if splice { "splice" } else { "read/write" }
    );
    for conn in socket.incoming() {
        let Ok(client) = conn else { continue };
        let Ok(up) = TcpStream::connect(&upstream) else {
            eprintln!("floor relay: cannot connect to {upstream}");
            continue;
        };
        for s in [&client, &up] {
            let _ = s.set_nodelay(true);
        }
        let (Ok(client2), Ok(up2)) = (client.try_clone(), up.try_clone()) else {
            continue;
        };
        std::thread::spawn(move || copy_one_way(client, up, splice, buffer));
        std::thread::spawn(move || copy_one_way(up2, client2, splice, buffer));
    }
}

/// Copies `from` to `to` until end of stream, then half-closes `to`.
fn copy_one_way(mut from: TcpStream, mut to: TcpStream, splice: bool, buffer: usize) {
    #[cfg(target_os = "linux")]
    if splice {
        let _ = splice_one_way(&from, &to);
        let _ = to.shutdown(std::net::Shutdown::Write);
        return;
    }
    let _ = splice;
    let mut buf = vec![0u8; buffer];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

/// `from` to `to` through a 1 MiB pipe with splice(2): the bytes never
/// enter user space.
#[cfg(target_os = "linux")]
fn splice_one_way(from: &TcpStream, to: &TcpStream) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut pipe = [0i32; 2];
    // SAFETY: pipe() writes two descriptors into the array it is given.
    if unsafe { libc::pipe(pipe.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let (rd, wr) = (pipe[0], pipe[1]);
    // SAFETY: fcntl on a descriptor this function owns; failure keeps 64 KiB.
    unsafe { libc::fcntl(wr, libc::F_SETPIPE_SZ, 1 << 20) };
    // Not SPLICE_F_MORE: it corks the socket (MSG_MORE), holding a
    // response's tail back for up to 200 ms.
    let flags = libc::SPLICE_F_MOVE;
    let result = 'copy: loop {
        // SAFETY: splice between descriptors alive for the whole loop
        // (`from`, `to` borrowed; the pipe closed below).
        let n = unsafe {
            libc::splice(
                from.as_raw_fd(),
                std::ptr::null_mut(),
                wr,
                std::ptr::null_mut(),
                1 << 20,
                flags,
            )
        };
        if n <= 0 {
            break if n == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            };
        }
        let mut left = n as usize;
        while left > 0 {
            // SAFETY: as above.
            let m = unsafe {
                libc::splice(
                    rd,
                    std::ptr::null_mut(),
                    to.as_raw_fd(),
                    std::ptr::null_mut(),
                    left,
                    flags,
                )
            };
            if m <= 0 {
                break 'copy Err(std::io::Error::last_os_error());
            }
            left -= m as usize;
        }
    };
    // SAFETY: closing the pipe this function opened, once.
    unsafe {
        libc::close(rd);
        libc::close(wr);
    }
    result
}

// ---------------------------------------------------------------------------
// load generator

#[derive(Default)]
struct Tally {
    requests: u64,
    frame_bytes: u64,
    record_bytes: u64,
    records: u64,
    batches: u64,
    mapped_batches: u64,
    crc_errors: u64,
    wraps: u64,
    latencies_us: Vec<u32>,
}

fn fetch_request(
    corr: i32,
    topic: &str,
    offsets: &[(i32, i64)],
    max_wait_ms: i32,
    partition_max: i32,
) -> Vec<u8> {
    let parts = offsets
        .iter()
        .map(|&(p, o)| {
            FetchPartition::default()
                .with_partition(p)
                .with_current_leader_epoch(-1)
                .with_fetch_offset(o)
                .with_last_fetched_epoch(-1)
                .with_log_start_offset(-1)
                .with_partition_max_bytes(partition_max)
        })
        .collect();
    let req = FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(max_wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(64 << 20)
        .with_isolation_level(0)
        .with_session_id(0)
        .with_session_epoch(-1)
        .with_topics(vec![ReqTopic::default()
            .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partitions(parts)]);
    let mut header = BytesMut::new();
    RequestHeader::default()
        .with_request_api_key(FETCH)
        .with_request_api_version(12)
        .with_correlation_id(corr)
        .with_client_id(Some(StrBytes::from_static_str("fetchbench")))
        .encode(&mut header, 2)
        .expect("header");
    let mut body = BytesMut::new();
    req.encode(&mut body, 12).expect("fetch request");
    frame_of(&header, &body)
}

#[allow(clippy::too_many_arguments)]
fn fetch_loop(
    addr: &str,
    tls: Option<Arc<rustls::ClientConfig>>,
    topic: &str,
    partitions: Vec<i32>,
    deadline: Instant,
    byte_budget: Arc<AtomicU64>,
    interval: Option<Duration>,
    max_wait_ms: i32,
    partition_max: i32,
    verify: bool,
) -> Tally {
    let mut t = Tally::default();
    let tcp = TcpStream::connect(addr).expect("connect");
    tcp.set_nodelay(true).ok();
    let mut s = match tls {
        None => BenchStream::Plain(tcp),
        Some(cfg) => {
            let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h).to_owned();
            let name = rustls::pki_types::ServerName::try_from(host).expect("server name");
            let c = rustls::ClientConnection::new(cfg, name).expect("TLS client");
            BenchStream::Client(Box::new(rustls::StreamOwned::new(c, tcp)))
        }
    };
    let mut offsets: Vec<(i32, i64)> = partitions.iter().map(|&p| (p, 0)).collect();
    let mut buf = Vec::with_capacity(4 << 20);
    let mut corr = 0i32;
    let mut next_send = Instant::now();
    while Instant::now() < deadline && byte_budget.load(Ordering::Relaxed) > 0 {
        if let Some(iv) = interval {
            let now = Instant::now();
            if next_send > now {
                std::thread::sleep(next_send - now);
            }
            next_send += iv;
        }
        corr = corr.wrapping_add(1);
        let req = fetch_request(corr, topic, &offsets, max_wait_ms, partition_max);
        let t0 = Instant::now();
        s.write_all(&req).expect("send fetch");
        if !read_frame(&mut s, &mut buf).expect("read response") {
            panic!("connection closed by {addr}");
        }
        let lat = t0.elapsed();
        t.latencies_us
            .push(lat.as_micros().min(u128::from(u32::MAX)) as u32);
        t.requests += 1;
        t.frame_bytes += buf.len() as u64;
        let got = i32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]);
        assert_eq!(got, corr, "correlation id");
        let body = &buf[9..]; // size, correlation id, empty tagged fields
        let mut next: HashMap<i32, i64> = HashMap::new();
        let mut empty: Vec<i32> = Vec::new();
        walk_fetch_response(12, body, &mut |p| {
            assert_eq!(p.error_code, 0, "partition {} error", p.partition_index);
            let Some(r) = p.records.clone() else {
                empty.push(p.partition_index);
                return;
            };
            let mut last = None;
            for e in walk(&body[r.clone()]).flatten() {
                if let Entry::V2(h) = e {
                    t.batches += 1;
                    t.records += h.records_count.max(0) as u64;
                    t.record_bytes += h.range.len() as u64;
                    if mirrorguard::pid::is_mapped(h.producer_id) {
                        t.mapped_batches += 1;
                    }
                    if verify
                        && !mirrorguard::records::verify_crc(
                            &body[r.start + h.range.start..r.start + h.range.end],
                        )
                    {
                        t.crc_errors += 1;
                    }
                    last = Some(h.last_offset());
                }
            }
            match last {
                Some(l) => {
                    next.insert(p.partition_index, l + 1);
                }
                None => empty.push(p.partition_index),
            }
        })
        .expect("fetch response");
        for (p, o) in offsets.iter_mut() {
            if let Some(n) = next.get(p) {
                *o = *n;
            } else if empty.contains(p) && *o > 0 {
                *o = 0; // end of the partition: read it again from the start
                t.wraps += 1;
            }
        }
        let n = buf.len() as u64;
        let _ = byte_budget.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
            Some(b.saturating_sub(n))
        });
    }
    t
}

fn pct(sorted: &[u32], q: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn fetch(args: &Args) {
    let addr = args.str("addr");
    let topic = args.str("topic");
    let partitions: i32 = args.num("partitions", 1);
    let connections: usize = args.num("connections", 1).max(1);
    let seconds: f64 = args.num("seconds", 10.0);
    let max_mb: u64 = args.num("max-mb", 100_000);
    let rate: f64 = args.num("rate", 0.0);
    let max_wait_ms: i32 = args.num("max-wait-ms", 100);
    let partition_max: i32 = args.num("partition-max-bytes", 1 << 20);
    let verify = args.flag("verify-crc");
    let tls = args.opt("tls-ca").map(|ca| {
        let files = mirrorguard::config::ClientTlsConfig {
            ca: ca.into(),
            cert: None,
            key: None,
            server_name: None,
            insecure_skip_hostname_verification: false,
            handshake_timeout_ms: 10_000,
        };
        Arc::new(mirrorguard::tls::client_config(&files).expect("TLS CA file"))
    });
    let interval = (rate > 0.0).then(|| Duration::from_secs_f64(1.0 / rate));
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let budget = Arc::new(AtomicU64::new(max_mb << 20));
    let threads: Vec<_> = (0..connections)
        .map(|c| {
            let mine: Vec<i32> = (0..partitions)
                .filter(|p| *p as usize % connections == c)
                .collect();
            let (addr, topic, budget) = (addr.clone(), topic.clone(), budget.clone());
            let tls = tls.clone();
            std::thread::spawn(move || {
                fetch_loop(
                    &addr,
                    tls,
                    &topic,
                    mine,
                    deadline,
                    budget,
                    interval,
                    max_wait_ms,
                    partition_max,
                    verify,
                )
            })
        })
        .collect();
    let mut all = Tally::default();
    for th in threads {
        let t = th.join().expect("fetch thread");
        all.requests += t.requests;
        all.frame_bytes += t.frame_bytes;
        all.record_bytes += t.record_bytes;
        all.records += t.records;
        all.batches += t.batches;
        all.mapped_batches += t.mapped_batches;
        all.crc_errors += t.crc_errors;
        all.wraps += t.wraps;
        all.latencies_us.extend(t.latencies_us);
    }
    let elapsed = start.elapsed().as_secs_f64();
    all.latencies_us.sort_unstable();
    let l = &all.latencies_us;
    println!(
        "{{\"requests\": {}, \"frame_bytes\": {}, \"record_bytes\": {}, \"records\": {}, \
         \"batches\": {}, \"mapped_batches\": {}, \"crc_errors\": {}, \"wraps\": {}, \
         \"elapsed_s\": {:.4}, \"mb_per_s\": {:.2}, \"records_per_s\": {:.0}, \
         \"lat_us\": {{\"p50\": {}, \"p99\": {}, \"p999\": {}, \"max\": {}}}}}",
        all.requests,
        all.frame_bytes,
        all.record_bytes,
        all.records,
        all.batches,
        all.mapped_batches,
        all.crc_errors,
        all.wraps,
        elapsed,
        all.frame_bytes as f64 / elapsed / 1e6,
        all.records as f64 / elapsed,
        pct(l, 0.50),
        pct(l, 0.99),
        pct(l, 0.999),
        l.last().copied().unwrap_or(0),
    );
}
