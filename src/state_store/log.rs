//! The state store actor's appends (one idempotent Produce per batch, retried
//! with the same sequence number so the broker de-duplicates a batch whose
//! acknowledgement was lost; sequence/producer errors re-initialise the
//! producer id) and reads (Fetch from an offset up to the high watermark,
//! growing the fetch size for a batch larger than it), and the parsing of
//! the fetched record batches into [`StoredRecord`]s.

use std::time::{SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use bytes::Bytes;

use super::actor::{Actor, Retry};
use super::client::{StoredRecord, FETCH_BYTES, MAX_FETCH_BYTES, RANGE_FETCH_BYTES};
use super::error::{Result, StateStoreError};
use super::proto::{self, code};
use crate::handlers::walk_fetch_response;
use crate::kafka_client::Connector;
use crate::records::builder::{build_batch, BatchSpec, RecordSpec};
use crate::records::record::records;
use crate::records::{batch::increment_sequence, walk, Entry};

impl<C: Connector> Actor<C> {
    pub(super) async fn append(&mut self, records: Vec<(Vec<u8>, Option<Vec<u8>>)>) -> Result<i64> {
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let mut retry = Retry::new(self.cfg.request_timeout);
        loop {
            match self.try_append(&records, ts).await {
                Ok(off) => return Ok(off),
                Err(e) => {
                    if !self.backoff(&mut retry, &e).await {
                        // The batch may have been written with its ack lost.
                        // Reusing its sequence number for the next record
                        // would get that record "de-duplicated" away, so the
                        // next append starts a fresh producer id instead.
                        self.producer = None;
                        return Err(e);
                    }
                }
            }
        }
    }

    /// One attempt at writing `records` as one batch; returns the offset
    /// of the last record.
    async fn try_append(&mut self, records: &[(Vec<u8>, Option<Vec<u8>>)], ts: i64) -> Result<i64> {
        self.ensure_ready().await?;
        let (pid, epoch) = self
            .producer
            .ok_or_else(|| StateStoreError::Io("no producer id".into()))?;
        let seq = self.next_seq;
        let n = i32::try_from(records.len())
            .map_err(|_| StateStoreError::Config("too many records in one append".into()))?;
        let specs: Vec<RecordSpec<'_>> = records
            .iter()
            .zip(0..n)
            .map(|((key, value), delta)| RecordSpec {
                key: Some(key.as_slice()),
                value: value.as_deref(),
                offset_delta: delta,
                ..RecordSpec::default()
            })
            .collect();
        let batch = build_batch(
            &BatchSpec {
                base_timestamp: ts,
                max_timestamp: ts,
                producer_id: pid,
                producer_epoch: epoch,
                base_sequence: seq,
                ..BatchSpec::default()
            },
            &specs,
        );
        let topic = self.cfg.topic.clone();
        let limit = self.cfg.request_timeout;
        let timeout_ms = i32::try_from(limit.as_millis()).unwrap_or(i32::MAX);
        let conn = self.conn_mut()?;
        let v = conn.version(proto::PRODUCE);
        let (resp, off) = conn
            .roundtrip(proto::PRODUCE, v, limit, |w| {
                proto::produce_request(v, -1, timeout_ms, &topic, 0, &batch, w)
            })
            .await?;
        let parts = proto::parse_produce(v, resp.get(off..).unwrap_or_default())?;
        let p = parts
            .into_iter()
            .find(|p| p.partition == 0)
            .ok_or_else(|| {
                StateStoreError::Protocol("Produce response lacks partition 0".into())
            })?;
        match p.error_code {
            code::NONE | code::DUPLICATE_SEQUENCE_NUMBER => {
                // DUPLICATE: an earlier attempt of this very batch was
                // written; it counts as acknowledged.
                self.next_seq = increment_sequence(seq, n);
                Ok(p.base_offset + i64::from(n) - 1)
            }
            code::OUT_OF_ORDER_SEQUENCE_NUMBER
            | code::UNKNOWN_PRODUCER_ID
            | code::INVALID_PRODUCER_EPOCH
            | code::PRODUCER_FENCED => {
                // The broker lost or rejected our producer state: start a
                // new producer and resend. A duplicate record is harmless
                // (same key and value; the lowest offset wins).
                tracing::warn!(
                    producer_id = pid,
                    error = proto::error_name(p.error_code),
                    "state store: re-initialising the producer id"
                );
                self.producer = None;
                Err(StateStoreError::Broker {
                    api: "Produce",
                    code: p.error_code,
                    name: proto::error_name(p.error_code),
                    message: p.error_message,
                    retriable: true,
                })
            }
            c => Err(StateStoreError::broker(proto::PRODUCE, c, p.error_message)),
        }
    }

    /// Reads from `from` to the high watermark, or until `upto` (exclusive;
    /// records at or past it are dropped, and reaching it counts as the end).
    /// Hands back what it read, not complete, once the keys and values read
    /// pass `budget` bytes.
    pub(super) async fn read_from(
        &mut self,
        from: i64,
        upto: i64,
        budget: usize,
    ) -> Result<(Vec<StoredRecord>, i64, bool)> {
        if from < 0 {
            return Err(StateStoreError::Config(format!("read offset {from}")));
        }
        let mut retry = Retry::new(self.cfg.request_timeout);
        let mut out = Vec::new();
        let mut pos = from;
        // A bounded read (a few known records, re-read on a take-over) asks
        // for little at a time: the broker still returns a first batch
        // larger than that, and the read goes on while it is short of `upto`.
        let first_bytes = if upto == i64::MAX {
            FETCH_BYTES
        } else {
            RANGE_FETCH_BYTES
        };
        let mut max_bytes = first_bytes;
        let mut read_bytes = 0usize;
        loop {
            let step = match self.fetch_once(pos, max_bytes).await {
                Ok(s) => s,
                Err(e) => {
                    if self.backoff(&mut retry, &e).await {
                        continue;
                    }
                    return Err(e);
                }
            };
            let progressed = step.next > pos;
            let before = out.len();
            out.extend(step.records.into_iter().filter(|r| r.offset < upto));
            read_bytes = read_bytes.saturating_add(
                out[before..]
                    .iter()
                    .map(|r| r.key.len() + r.value.as_ref().map_or(0, |v| v.len()))
                    .sum(),
            );
            if progressed {
                pos = step.next;
                max_bytes = first_bytes;
                if pos >= upto {
                    return Ok((out, pos, true));
                }
            } else if step.truncated {
                // The first batch did not fit: ask for more.
                if max_bytes >= MAX_FETCH_BYTES {
                    return Err(StateStoreError::Corrupt {
                        offset: pos,
                        detail: format!("batch larger than {MAX_FETCH_BYTES} bytes"),
                    });
                }
                max_bytes = max_bytes.saturating_mul(2).min(MAX_FETCH_BYTES);
                continue;
            } else if let Some(start) = step.log_start.filter(|s| *s > pos) {
                // Offset out of range below the log start: skip ahead.
                pos = start;
                continue;
            }
            if pos >= step.high_watermark {
                return Ok((out, pos, true));
            }
            if !progressed {
                // Nothing readable at `pos` although the high watermark is
                // past it: not the end.
                return Ok((out, pos, false));
            }
            if read_bytes >= budget {
                // The caller's piece is full: it applies it and reads on.
                return Ok((out, pos, false));
            }
            if Instant::now() >= retry.deadline {
                // Still behind after a whole request timeout of reading:
                // hand back what was read; the caller continues from `pos`.
                return Ok((out, pos, false));
            }
        }
    }

    async fn fetch_once(&mut self, pos: i64, max_bytes: i32) -> Result<FetchStep> {
        self.ensure_ready().await?;
        let topic = self.cfg.topic.clone();
        let limit = self.cfg.request_timeout;
        let conn = self.conn_mut()?;
        let v = conn.version(proto::FETCH);
        let (resp, off) = conn
            .roundtrip(proto::FETCH, v, limit, |w| {
                proto::fetch_request(v, &topic, 0, pos, max_bytes, w)
            })
            .await?;
        let body = resp.get(off..).unwrap_or_default();
        let mut part = None;
        let info = walk_fetch_response(v, body, &mut |p| {
            if p.partition_index == 0 && part.is_none() {
                part = Some((
                    p.error_code,
                    p.high_watermark,
                    p.log_start_offset,
                    p.records.clone(),
                ));
            }
        })?;
        if info.error_code != code::NONE {
            return Err(StateStoreError::broker(proto::FETCH, info.error_code, None));
        }
        let (err, hw, log_start, range) = part
            .ok_or_else(|| StateStoreError::Protocol("Fetch response lacks partition 0".into()))?;
        if err == code::OFFSET_OUT_OF_RANGE && log_start > pos {
            return Ok(FetchStep {
                records: Vec::new(),
                next: pos,
                high_watermark: hw,
                truncated: false,
                log_start: Some(log_start),
            });
        }
        if err != code::NONE {
            return Err(StateStoreError::broker(proto::FETCH, err, None));
        }
        let blob = match range {
            Some(r) => body.get(r).unwrap_or_default(),
            None => &[],
        };
        let (records, next, truncated) = parse_records(&resp, blob, pos)?;
        Ok(FetchStep {
            records,
            next,
            high_watermark: hw,
            truncated,
            log_start: None,
        })
    }
}

/// Decodes the records of a fetched blob (which lies inside `frame`, so the
/// returned keys and values are zero-copy slices of it), keeping those at
/// or after `pos`. Returns the records, the offset after the last complete
/// batch (at least `pos`), and whether the blob ended in a partial batch.
/// Control batches are skipped but advance the offset.
fn parse_records(frame: &Bytes, blob: &[u8], pos: i64) -> Result<(Vec<StoredRecord>, i64, bool)> {
    let mut out = Vec::new();
    let mut next = pos;
    for entry in walk(blob) {
        let entry = entry.map_err(|e| StateStoreError::Corrupt {
            offset: next,
            detail: e.to_string(),
        })?;
        let h = match entry {
            Entry::V2(h) => h,
            Entry::Truncated { .. } => return Ok((out, next, true)),
            Entry::Legacy { magic, .. } => {
                return Err(StateStoreError::Corrupt {
                    offset: next,
                    detail: format!("legacy magic {magic} message; only v2 batches are read"),
                })
            }
        };
        let batch_bytes = blob.get(h.range.clone()).unwrap_or_default();
        // Control batches (transaction markers) carry no state.
        if !h.is_control() {
            let recs = records(&h, batch_bytes).map_err(|e| StateStoreError::Corrupt {
                offset: h.base_offset,
                detail: e.to_string(),
            })?;
            for rec in recs {
                let rec = rec.map_err(|e| StateStoreError::Corrupt {
                    offset: h.base_offset,
                    detail: e.to_string(),
                })?;
                let offset = h.base_offset.saturating_add(i64::from(rec.offset_delta));
                // A batch can start before the requested offset.
                if offset < pos {
                    continue;
                }
                let Some(key) = rec.key else {
                    // Kafka refuses keyless records in compacted topics;
                    // skip rather than stop the load.
                    tracing::warn!(offset, "state store: skipping a record without a key");
                    continue;
                };
                let timestamp = if h.is_log_append_time() {
                    h.max_timestamp
                } else {
                    h.base_timestamp.saturating_add(rec.timestamp_delta)
                };
                out.push(StoredRecord {
                    offset,
                    timestamp,
                    key: frame.slice_ref(key),
                    value: rec.value.map(|v| frame.slice_ref(v)),
                });
            }
        }
        next = next.max(h.last_offset().saturating_add(1));
    }
    Ok((out, next, false))
}

/// Result of one Fetch round trip.
struct FetchStep {
    records: Vec<StoredRecord>,
    /// Offset after the last complete batch (or the requested one).
    next: i64,
    high_watermark: i64,
    /// The response ended in a partial batch.
    truncated: bool,
    /// Set when the requested offset is below the log start.
    log_start: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::builder::build_commit_marker;

    fn batch(base: i64, keys: &[&[u8]]) -> Vec<u8> {
        let recs: Vec<RecordSpec<'_>> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| RecordSpec {
                offset_delta: i as i32,
                timestamp_delta: i as i64,
                key: Some(k),
                value: if i % 2 == 0 { Some(b"v") } else { None },
                ..RecordSpec::default()
            })
            .collect();
        build_batch(
            &BatchSpec {
                base_offset: base,
                base_timestamp: 1000,
                ..BatchSpec::default()
            },
            &recs,
        )
    }

    #[test]
    fn several_batches_control_and_truncated_tail() {
        let mut blob = batch(3, &[b"a", b"b"]);
        blob.extend(build_commit_marker(1, 0, 0, 0, 5, 0));
        blob.extend(batch(6, &[b"c"]));
        let tail = batch(7, &[b"d"]);
        blob.extend(&tail[..tail.len() - 3]);
        let frame = Bytes::from(blob);
        let (recs, next, truncated) = parse_records(&frame, &frame, 4).unwrap();
        assert!(truncated);
        assert_eq!(next, 7);
        type Row<'a> = (i64, i64, &'a [u8], Option<&'a [u8]>);
        let got: Vec<Row<'_>> = recs
            .iter()
            .map(|r| (r.offset, r.timestamp, &r.key[..], r.value.as_deref()))
            .collect();
        // Offset 3 is before the requested offset; 5 is the marker.
        assert_eq!(
            got,
            vec![
                (4, 1001, &b"b"[..], None),
                (6, 1000, &b"c"[..], Some(&b"v"[..]))
            ]
        );
    }

    #[test]
    fn corrupt_blob_is_an_error_not_a_panic() {
        let mut blob = batch(0, &[b"a"]);
        blob[16] = 7; // magic
        let frame = Bytes::from(blob);
        assert_eq!(
            parse_records(&frame, &frame, 0).unwrap_err().kind(),
            "corrupt"
        );
        let empty = Bytes::new();
        assert_eq!(
            parse_records(&empty, &empty, 9).unwrap(),
            (vec![], 9, false)
        );
    }
}
