//! Warming a partition's shadow producer state after a restart by replaying
//! the source log.
//!
//! Snapshots (record type 5) restore producer state up to their offset; a
//! crash loses what was observed after the last one. Before the first batch
//! of a partition leaves the proxy after start-up, the batches between the
//! state's next offset and the first offset the fetcher now asks for are read
//! from the source (a plain consumer Fetch v5) and observed, without being
//! forwarded anywhere. Only then can a collision with a producer seen before
//! the crash be recognised, and a transaction opened before the crash be
//! aborted by a seal.

use std::sync::Arc;
use std::time::Duration;

use crate::codec::api::error::OFFSET_OUT_OF_RANGE;
use crate::codec::api::FETCH;
use crate::handlers::{walk_fetch_response, FetchTopic};
use crate::kafka_client::{address, ClientError, Connection};
use crate::producer_state::PartitionKey;
use crate::records::{walk, Entry};
use crate::wire::{WireResult, Writer};

use super::{MirrorContext, SourceIdentity};

/// A range of a source partition to observe before serving it.
#[derive(Debug, Clone)]
pub struct ReplayJob {
    /// The destination partition whose state is warmed.
    pub key: PartitionKey,
    /// Source topic name.
    pub source_topic: String,
    /// Partition index.
    pub partition: i32,
    /// First offset to observe (the state's next offset).
    pub from: i64,
    /// First offset not to observe (where the fetcher is now).
    pub upto: i64,
}

const MAX_BYTES: i32 = 4 << 20;
/// The EARLIEST timestamp of ListOffsets: the log start offset.
const EARLIEST: i64 = -2;
const CLIENT_ID: &str = "mirrorguard-replay";

/// Fetch version of the replay: v5 is the first whose response carries the
/// partition's log start offset, which an OFFSET_OUT_OF_RANGE below it
/// (records deleted by retention) needs to move on. Kafka leaves it -1 in
/// an out-of-range answer of any version; the replay then asks for it with
/// ListOffsets (see `earliest_offset`).
const REPLAY_FETCH_VERSION: i16 = 5;

/// Fetch v5 request body: one partition, as a consumer, read uncommitted.
fn fetch_v5_body(
    topic: &str,
    partition: i32,
    offset: i64,
    w: &mut Writer<Vec<u8>>,
) -> WireResult<()> {
    w.put_i32(-1); // replica id: a consumer (followers must be replicas)
    w.put_i32(100); // max wait
    w.put_i32(1); // min bytes
    w.put_i32(MAX_BYTES);
    w.put_i8(0); // read uncommitted
    w.put_i32(1);
    w.put_string(topic, "topic")?;
    w.put_i32(1);
    w.put_i32(partition);
    w.put_i64(offset);
    w.put_i64(-1); // log start offset: a consumer's
    w.put_i32(MAX_BYTES);
    Ok(())
}

/// Why a range could not be replayed from any source broker.
#[derive(Debug, thiserror::Error)]
#[error("could not replay {topic}-{partition} [{from}, {upto}) from the source: {last}")]
pub struct ReplayError {
    /// Source topic.
    pub topic: String,
    /// Partition index.
    pub partition: i32,
    /// First offset of the range.
    pub from: i64,
    /// End of the range.
    pub upto: i64,
    /// The last broker's failure (`host:port: why`).
    pub last: String,
}

impl From<ReplayError> for String {
    fn from(e: ReplayError) -> Self {
        e.to_string()
    }
}

/// Observes `job`'s range from the first source broker that leads the
/// partition (`servers`: the known source nodes, then the bootstrap list).
pub async fn replay(
    mirror: Arc<MirrorContext>,
    source: SourceIdentity,
    servers: Vec<(String, u16)>,
    job: ReplayJob,
    max_frame: usize,
) -> Result<(), ReplayError> {
    let mut last_err = String::from("no source broker known");
    for (host, port) in &servers {
        match replay_from(&mirror, &source, host, *port, &job, max_frame).await {
            Ok(()) => return Ok(()),
            Err(e) => last_err = format!("{host}:{port}: {e}"),
        }
    }
    Err(ReplayError {
        topic: job.source_topic.clone(),
        partition: job.partition,
        from: job.from,
        upto: job.upto,
        last: last_err,
    })
}

async fn replay_from(
    mirror: &MirrorContext,
    source: &SourceIdentity,
    host: &str,
    port: u16,
    job: &ReplayJob,
    max_frame: usize,
) -> Result<(), ClientError> {
    let mut conn = Connection::connect(
        &mirror.source_connector(),
        &address(host, port),
        Duration::from_secs(5),
        max_frame,
        CLIENT_ID,
    )
    .await?;
    let handle = mirror.registry.partition(&job.key);
    let mut offset = job.from;
    let mut sink = Vec::new();
    let now = super::now_ms();
    let mut observed = 0usize;
    while offset < job.upto {
        let resp = conn
            .request(FETCH, REPLAY_FETCH_VERSION, Duration::from_secs(10), |w| {
                fetch_v5_body(&job.source_topic, job.partition, offset, w)
            })
            .await?;
        let mut body = resp.body().to_vec();
        let mut found: Option<(i16, i64, i64, std::ops::Range<usize>)> = None;
        walk_fetch_response(REPLAY_FETCH_VERSION, &body, &mut |p| {
            if p.partition_index == job.partition && p.topic == FetchTopic::Name(&job.source_topic)
            {
                found = Some((
                    p.error_code,
                    p.high_watermark,
                    p.log_start_offset,
                    p.records.clone().unwrap_or(0..0),
                ));
            }
        })?;
        let (error, high_watermark, mut log_start, records) = found.ok_or_else(|| {
            ClientError::Protocol("partition missing from the Fetch response".into())
        })?;
        if error == OFFSET_OUT_OF_RANGE && log_start < 0 {
            // Kafka answers an out-of-range fetch with no log start offset
            // (-1): ask for it.
            log_start = earliest_offset(&mut conn, job).await?;
        }
        // OFFSET_OUT_OF_RANGE below the log start: what was deleted by
        // retention cannot be replayed; start at the log start.
        if error == OFFSET_OUT_OF_RANGE && log_start > offset && log_start < job.upto {
            // Transactions closed in the skipped range are not known.
            tracing::info!(partition = %job.key, offset, log_start, upto = job.upto,
                "replay below the source's log start (records deleted): starting at the log \
                 start; transactions closed below it are unknown");
            handle.with(|s| s.closings_unknown_below(log_start));
            offset = log_start;
            continue;
        }
        if error != 0 {
            return Err(ClientError::broker(FETCH, error, None));
        }
        // Batches past `upto` are the fetcher's to get, not ours to observe.
        let mut end = records.start;
        let mut next = offset;
        for e in walk(body.get(records.clone()).unwrap_or(&[])) {
            let Ok(Entry::V2(h)) = e else { break };
            if h.base_offset >= job.upto {
                break;
            }
            end = records.start + h.range.end;
            next = h.last_offset() + 1;
        }
        if next <= offset {
            // Nothing new below the high watermark: the fetcher is beyond it
            // (followers read to the log end); what remains cannot be read
            // as a consumer and is observed when it is fetched.
            tracing::info!(partition = %job.key, offset, high_watermark, upto = job.upto,
                "replay stopped at the source's high watermark");
            handle.with(|s| s.closings_unknown_below(job.upto));
            break;
        }
        if let Some(slice) = body.get_mut(records.start..end) {
            super::observe_records(mirror, source, &handle, slice, now, &mut sink);
            observed += 1;
        }
        offset = next;
    }
    tracing::info!(mirror = %mirror.name, partition = %job.key, from = job.from, upto = job.upto,
        fetches = observed, "producer state warmed by replaying the source log");
    Ok(())
}

/// The source partition's log start offset (ListOffsets EARLIEST).
async fn earliest_offset<S>(conn: &mut Connection<S>, job: &ReplayJob) -> Result<i64, ClientError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let topics =
        std::collections::BTreeMap::from([(job.source_topic.clone(), vec![job.partition])]);
    let resp = conn
        .request(
            super::dest_hw::LIST_OFFSETS,
            super::dest_hw::LIST_OFFSETS_VERSION,
            Duration::from_secs(10),
            |w| super::dest_hw::list_offsets_body_at(&topics, EARLIEST, w),
        )
        .await?;
    let answers = super::dest_hw::parse_list_offsets(resp.body())
        .map_err(|e| ClientError::Protocol(format!("ListOffsets response: {e}")))?;
    match answers
        .into_iter()
        .find(|(t, p, _, _)| *t == job.source_topic && *p == job.partition)
    {
        Some((_, _, 0, offset)) => Ok(offset),
        Some((_, _, code, _)) => Err(ClientError::broker(
            super::dest_hw::LIST_OFFSETS,
            code,
            None,
        )),
        None => Err(ClientError::Protocol(
            "partition missing from the ListOffsets response".into(),
        )),
    }
}
