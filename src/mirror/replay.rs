//! Warming a partition's shadow producer state after a restart by replaying
//! the source log.
//!
//! Snapshots (record type 5) restore producer state up to their offset; a
//! crash loses what was observed after the last one. Before the first batch
//! of a partition leaves the proxy after start-up, the batches between the
//! state's next offset and the first offset the fetcher now asks for are read
//! from the source (a plain consumer Fetch v4) and observed, without being
//! forwarded anywhere. Only then can a collision with a producer seen before
//! the crash be recognised, and a transaction opened before the crash be
//! aborted by a seal.

use std::sync::Arc;
use std::time::Duration;

use bytes::BufMut;
use tokio::io::AsyncWriteExt;

use crate::codec::api::error::OFFSET_OUT_OF_RANGE;
use crate::codec::header::{response_body_offset, response_correlation_id};
use crate::codec::FrameReader;
use crate::handlers::{walk_fetch_response, FetchTopic};
use crate::producer_state::PartitionKey;
use crate::proxy::upstream::connect;
use crate::records::{walk, Entry};

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
const CLIENT_ID: &[u8] = b"mirrorguard-replay";

fn fetch_v4_request(correlation_id: i32, topic: &str, partition: i32, offset: i64) -> Vec<u8> {
    let mut b = Vec::with_capacity(64 + topic.len());
    b.put_i16(crate::codec::api::FETCH);
    b.put_i16(4);
    b.put_i32(correlation_id);
    b.put_i16(CLIENT_ID.len() as i16);
    b.put_slice(CLIENT_ID);
    b.put_i32(-1); // replica id: a consumer (followers must be replicas)
    b.put_i32(100); // max wait
    b.put_i32(1); // min bytes
    b.put_i32(MAX_BYTES);
    b.put_i8(0); // read uncommitted
    b.put_i32(1);
    b.put_i16(topic.len() as i16);
    b.put_slice(topic.as_bytes());
    b.put_i32(1);
    b.put_i32(partition);
    b.put_i64(offset);
    b.put_i32(MAX_BYTES);
    let mut f = Vec::with_capacity(b.len() + 4);
    f.put_i32(b.len() as i32);
    f.extend_from_slice(&b);
    f
}

/// Observes `job`'s range from the first source broker that leads the
/// partition (`servers`: the known source nodes, then the bootstrap list).
pub async fn replay(
    mirror: Arc<MirrorContext>,
    source: SourceIdentity,
    servers: Vec<(String, u16)>,
    job: ReplayJob,
    max_frame: usize,
) -> Result<(), String> {
    let mut last_err = String::from("no source broker known");
    for (host, port) in &servers {
        match replay_from(&mirror, &source, host, *port, &job, max_frame).await {
            Ok(()) => return Ok(()),
            Err(e) => last_err = format!("{host}:{port}: {e}"),
        }
    }
    Err(format!(
        "could not replay {}-{} [{}, {}) from the source: {last_err}",
        job.source_topic, job.partition, job.from, job.upto
    ))
}

async fn replay_from(
    mirror: &MirrorContext,
    source: &SourceIdentity,
    host: &str,
    port: u16,
    job: &ReplayJob,
    max_frame: usize,
) -> Result<(), String> {
    let mut stream = connect(host, port, Duration::from_secs(5))
        .await
        .map_err(|e| e.to_string())?;
    let handle = mirror.registry.partition(&job.key);
    let mut offset = job.from;
    let mut correlation_id = 0;
    let mut sink = Vec::new();
    let now = super::now_ms();
    let mut observed = 0usize;
    while offset < job.upto {
        correlation_id += 1;
        stream
            .write_all(&fetch_v4_request(
                correlation_id,
                &job.source_topic,
                job.partition,
                offset,
            ))
            .await
            .map_err(|e| e.to_string())?;
        let mut reader = FrameReader::new(&mut stream, max_frame);
        let frame = tokio::time::timeout(Duration::from_secs(10), reader.next_frame())
            .await
            .map_err(|_| "no Fetch response within 10 s".to_string())?
            .map_err(|e| e.to_string())?
            .ok_or("source closed the connection")?;
        if response_correlation_id(&frame) != Some(correlation_id) {
            return Err("Fetch response with the wrong correlation id".into());
        }
        let body_at = response_body_offset(&frame, 0).ok_or("Fetch response too short")?;
        let mut body = frame[body_at..].to_vec();
        let mut found: Option<(i16, i64, i64, std::ops::Range<usize>)> = None;
        walk_fetch_response(4, &body, &mut |p| {
            if p.partition_index == job.partition && p.topic == FetchTopic::Name(&job.source_topic)
            {
                found = Some((
                    p.error_code,
                    p.high_watermark,
                    p.log_start_offset,
                    p.records.clone().unwrap_or(0..0),
                ));
            }
        })
        .map_err(|e| e.to_string())?;
        let (error, high_watermark, log_start, records) =
            found.ok_or("partition missing from the Fetch response")?;
        // OFFSET_OUT_OF_RANGE below the log start: what was deleted by
        // retention cannot be replayed; start at the log start.
        if error == OFFSET_OUT_OF_RANGE && log_start > offset && log_start < job.upto {
            offset = log_start;
            continue;
        }
        if error != 0 {
            return Err(format!("Fetch error code {error}"));
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
