//! Closing open mirrored transactions on the destination when the
//! destination's mirror fetcher is gone (SPEC 3.1), the way Kafka's
//! `kafka-transactions.sh abort` (KIP-664, `Admin.abortTransaction`) does it.
//!
//! For each partition: Metadata on the destination finds the leader;
//! DescribeProducers (v0) on the leader lists the active producers with
//! their current epoch, coordinator epoch and open transaction's first
//! offset (persisted snapshots can lag, and with Transactions V2 the epoch
//! moves with every transaction, so the destination is asked, not our
//! state); for every open transaction whose PID lies in a mapped region
//! (bit 62 or 63 set: mirrored, never a PID the destination's allocator
//! hands out) WriteTxnMarkers (v1) ABORT is sent to the leader with exactly
//! those epochs, as `AbortTransactionHandler` sends it. PIDs outside the
//! regions are reported and never touched. The identity mirrorguard uses
//! on the destination needs the CLUSTER_ACTION operation on the Cluster
//! resource (WriteTxnMarkers is an inter-broker API).
//!
//! No MIRROR_PID_RESET barrier can be written on this path (a stock broker
//! accepts control batches only from the replication path or the
//! coordinator's markers). Local producers still cannot collide with the
//! mirrored ones: the destination's own allocator hands out PIDs from 0
//! upwards, far below bit 62, while every mirrored PID has bit 62 (or 63)
//! set, so the two sets are disjoint without any barrier. In `preserve` mode
//! mirrored PIDs are the source's own and overlap the destination's range:
//! this path cannot prevent collisions there and is refused.

use std::time::Duration;

use crate::kafka_client::{address, ClientError, Connection, TransportConnector};
use crate::wire::{Reader, WireResult, Writer};

const DESCRIBE_PRODUCERS: i16 = kafka_protocol::messages::ApiKey::DescribeProducers as i16;
const WRITE_TXN_MARKERS: i16 = kafka_protocol::messages::ApiKey::WriteTxnMarkers as i16;
const CLIENT_ID: &str = "mirrorguard-abort-open";
/// Largest response accepted from the destination.
const MAX_FRAME: usize = crate::config::DEFAULT_MAX_FRAME_BYTES as usize;

/// One transaction found open on the destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct OpenTransaction {
    /// Producer id as the destination knows it.
    pub producer_id: i64,
    /// Its current epoch (DescribeProducers).
    pub producer_epoch: i32,
    /// Coordinator epoch of its last marker.
    pub coordinator_epoch: i32,
    /// First offset of the open transaction.
    pub first_offset: i64,
}

/// What happened to one partition.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PartitionReport {
    /// Destination topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// Leader node id on the destination.
    pub leader: i32,
    /// Mirrored transactions aborted now.
    pub aborted: Vec<OpenTransaction>,
    /// Open transactions of PIDs outside the mapped regions (left alone).
    pub not_mirrored: Vec<OpenTransaction>,
    /// Why the partition could not be handled, if it could not.
    pub error: Option<String>,
}

/// DescribeProducers v0 request body for one topic's partitions.
pub fn describe_producers_body(
    topic: &str,
    partitions: &[i32],
    w: &mut Writer<Vec<u8>>,
) -> WireResult<()> {
    w.put_uvarint(2); // one topic
    w.put_compact_string(topic, "topic")?;
    w.put_compact_array_len(Some(partitions.len()), "partitions")?;
    for p in partitions {
        w.put_i32(*p);
    }
    w.put_uvarint(0); // topic tags
    w.put_uvarint(0); // request tags
    Ok(())
}

/// WriteTxnMarkers v1 request body: one ABORT marker per transaction.
pub fn write_abort_markers_body(
    topic: &str,
    partition: i32,
    txns: &[OpenTransaction],
    w: &mut Writer<Vec<u8>>,
) -> WireResult<()> {
    w.put_compact_array_len(Some(txns.len()), "markers")?;
    for t in txns {
        w.put_i64(t.producer_id);
        w.put_i16(t.producer_epoch as i16);
        w.put_bool(false); // TransactionResult = false: ABORT
        w.put_uvarint(2); // one topic
        w.put_compact_string(topic, "topic")?;
        w.put_uvarint(2); // one partition
        w.put_i32(partition);
        w.put_uvarint(0); // topic tags
        w.put_i32(t.coordinator_epoch);
        w.put_uvarint(0); // marker tags
    }
    w.put_uvarint(0);
    Ok(())
}

/// One partition of a DescribeProducers answer: index, error code, error
/// message, active producers (with their last sequence).
pub type DescribedPartition = (i32, i16, Option<String>, Vec<(OpenTransaction, i32)>);

/// Parses a DescribeProducers v0 response body: per partition, its error
/// and active producers.
pub fn parse_describe_producers(body: &[u8]) -> WireResult<Vec<DescribedPartition>> {
    let mut r = Reader::new(body);
    r.read_i32("throttle_time_ms")?;
    let mut out = Vec::new();
    let topics = r.read_compact_array_len(3, "topics")?.unwrap_or(0);
    for _ in 0..topics {
        r.read_compact_string("name")?;
        let parts = r.read_compact_array_len(9, "partitions")?.unwrap_or(0);
        for _ in 0..parts {
            let index = r.read_i32("partition_index")?;
            let error = r.read_i16("error_code")?;
            let message = r
                .read_compact_nullable_string("error_message")?
                .map(str::to_string);
            let n = r
                .read_compact_array_len(37, "active_producers")?
                .unwrap_or(0);
            let mut producers = Vec::with_capacity(n);
            for _ in 0..n {
                let producer_id = r.read_i64("producer_id")?;
                let producer_epoch = r.read_i32("producer_epoch")?;
                let last_sequence = r.read_i32("last_sequence")?;
                r.read_i64("last_timestamp")?;
                let coordinator_epoch = r.read_i32("coordinator_epoch")?;
                let first_offset = r.read_i64("current_txn_start_offset")?;
                r.skip_tagged_fields_v(true, "producer tags")?;
                producers.push((
                    OpenTransaction {
                        producer_id,
                        producer_epoch,
                        coordinator_epoch,
                        first_offset,
                    },
                    last_sequence,
                ));
            }
            r.skip_tagged_fields_v(true, "partition tags")?;
            out.push((index, error, message, producers));
        }
        r.skip_tagged_fields_v(true, "topic tags")?;
    }
    Ok(out)
}

/// Parses a WriteTxnMarkers v1 response: (producer id, partition, error).
pub fn parse_write_txn_markers(body: &[u8]) -> WireResult<Vec<(i64, i32, i16)>> {
    let mut r = Reader::new(body);
    let mut out = Vec::new();
    let markers = r.read_compact_array_len(10, "markers")?.unwrap_or(0);
    for _ in 0..markers {
        let pid = r.read_i64("producer_id")?;
        let topics = r.read_compact_array_len(3, "topics")?.unwrap_or(0);
        for _ in 0..topics {
            r.read_compact_string("name")?;
            let parts = r.read_compact_array_len(7, "partitions")?.unwrap_or(0);
            for _ in 0..parts {
                let p = r.read_i32("partition_index")?;
                let e = r.read_i16("error_code")?;
                r.skip_tagged_fields_v(true, "partition tags")?;
                out.push((pid, p, e));
            }
            r.skip_tagged_fields_v(true, "topic tags")?;
        }
        r.skip_tagged_fields_v(true, "marker tags")?;
    }
    Ok(out)
}

/// Aborts the open mirrored transactions of `topic`'s `partitions` (all
/// when `None`) on the destination. `mirrored(pid)` says whether a PID is
/// one of ours (a mapped region).
pub async fn abort_open(
    bootstrap: &[(String, u16)],
    connector: &TransportConnector,
    topic: &str,
    partitions: Option<&[i32]>,
    mirrored: &(dyn Fn(i64) -> bool + Sync),
    timeout: Duration,
) -> anyhow::Result<Vec<PartitionReport>> {
    let view = crate::proxy::refresh::fetch_cluster_view(
        bootstrap,
        connector,
        timeout,
        crate::config::DEFAULT_MAX_FRAME_BYTES as usize,
    )
    .await?;
    let t = view
        .topic_details
        .iter()
        .find(|t| t.name == topic)
        .ok_or_else(|| anyhow::anyhow!("topic {topic:?} does not exist on the destination"))?;
    let wanted: Vec<i32> = match partitions {
        Some(ps) => ps.to_vec(),
        None => t.partitions.iter().map(|p| p.index).collect(),
    };
    let mut reports = Vec::new();
    for p in &wanted {
        let mut rep = PartitionReport {
            topic: topic.to_string(),
            partition: *p,
            leader: -1,
            ..Default::default()
        };
        let Some(part) = t.partitions.iter().find(|x| x.index == *p) else {
            rep.error = Some(format!("{topic}-{p} does not exist on the destination"));
            reports.push(rep);
            continue;
        };
        rep.leader = part.leader;
        let Some(b) = view.brokers.iter().find(|b| b.node_id == part.leader) else {
            rep.error = Some(format!(
                "{topic}-{p} has no reachable leader ({})",
                part.leader
            ));
            reports.push(rep);
            continue;
        };
        let port = u16::try_from(b.port).unwrap_or(0);
        // One connection to the leader for both requests.
        let mut conn = None;
        let described = async {
            let c = conn.insert(
                Connection::connect(
                    connector,
                    &address(&b.host, port),
                    timeout,
                    MAX_FRAME,
                    CLIENT_ID,
                )
                .await?,
            );
            let resp = c
                .request(DESCRIBE_PRODUCERS, 0, timeout, |w| {
                    describe_producers_body(topic, &[*p], w)
                })
                .await?;
            Ok::<_, ClientError>(parse_describe_producers(resp.body())?)
        }
        .await;
        let described = match described {
            Ok(d) => d,
            Err(e) => {
                rep.error = Some(format!("DescribeProducers: {e}"));
                reports.push(rep);
                continue;
            }
        };
        let Some((_, code, message, producers)) = described.into_iter().find(|d| d.0 == *p) else {
            rep.error = Some("DescribeProducers did not answer for the partition".into());
            reports.push(rep);
            continue;
        };
        if code != 0 {
            rep.error = Some(format!(
                "DescribeProducers error {code}{}",
                message.map(|m| format!(": {m}")).unwrap_or_default()
            ));
            reports.push(rep);
            continue;
        }
        let (ours, others): (Vec<OpenTransaction>, Vec<OpenTransaction>) = producers
            .into_iter()
            .map(|(t, _)| t)
            .filter(|t| t.first_offset >= 0)
            .partition(|t| mirrored(t.producer_id));
        rep.not_mirrored = others;
        if ours.is_empty() {
            reports.push(rep);
            continue;
        }
        let written = async {
            let Some(c) = conn.as_mut() else {
                return Err(ClientError::Unreachable("no connection".into()));
            };
            let resp = c
                .request(WRITE_TXN_MARKERS, 1, timeout, |w| {
                    write_abort_markers_body(topic, *p, &ours, w)
                })
                .await?;
            Ok(parse_write_txn_markers(resp.body())?)
        }
        .await;
        match written {
            Ok(results) => {
                let failed: Vec<String> = results
                    .iter()
                    .filter(|(_, _, e)| *e != 0)
                    .map(|(pid, _, e)| format!("PID {pid}: error {e}"))
                    .collect();
                rep.aborted = ours
                    .into_iter()
                    .filter(|t| {
                        results
                            .iter()
                            .any(|(pid, _, e)| *pid == t.producer_id && *e == 0)
                    })
                    .collect();
                if !failed.is_empty() {
                    rep.error = Some(format!("WriteTxnMarkers: {}", failed.join(", ")));
                }
            }
            Err(e) => rep.error = Some(format!("WriteTxnMarkers: {e}")),
        }
        reports.push(rep);
    }
    Ok(reports)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;

    #[test]
    fn requests_have_the_schema_layout() {
        use crate::kafka_client::request_frame;
        let d = request_frame(DESCRIBE_PRODUCERS, 0, 7, CLIENT_ID, |w| {
            describe_producers_body("t", &[0, 3], w)
        })
        .unwrap();
        // size, key 61, v0, correlation 7
        assert_eq!(&d[4..12], &[0, 61, 0, 0, 0, 0, 0, 7]);
        let body = &d[4 + 8 + 2 + CLIENT_ID.len() + 1..];
        assert_eq!(body, &[2, 2, b't', 3, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0]);
        let t = OpenTransaction {
            producer_id: 0x4000_0000_0000_0005,
            producer_epoch: 3,
            coordinator_epoch: 9,
            first_offset: 10,
        };
        let w = request_frame(WRITE_TXN_MARKERS, 1, 8, CLIENT_ID, |w| {
            write_abort_markers_body("t", 2, &[t], w)
        })
        .unwrap();
        let body = &w[4 + 8 + 2 + CLIENT_ID.len() + 1..];
        let mut want = vec![2];
        want.extend_from_slice(&0x4000_0000_0000_0005i64.to_be_bytes());
        want.extend_from_slice(&3i16.to_be_bytes());
        want.push(0);
        want.extend_from_slice(&[2, 2, b't', 2, 0, 0, 0, 2, 0]);
        want.extend_from_slice(&9i32.to_be_bytes());
        want.extend_from_slice(&[0, 0]);
        assert_eq!(body, &want[..]);
    }

    #[test]
    fn describe_producers_response_parses_and_never_panics() {
        let mut b = Vec::new();
        b.put_i32(0);
        b.put_u8(2);
        b.put_u8(2);
        b.put_u8(b't');
        b.put_u8(2);
        b.put_i32(0);
        b.put_i16(0);
        b.put_u8(0); // null message
        b.put_u8(2);
        b.put_i64(5);
        b.put_i32(1);
        b.put_i32(4);
        b.put_i64(-1);
        b.put_i32(2);
        b.put_i64(17);
        b.put_u8(0);
        b.put_u8(0);
        b.put_u8(0);
        b.put_u8(0);
        let got = parse_describe_producers(&b).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].3[0].0.producer_id, 5);
        assert_eq!(got[0].3[0].0.first_offset, 17);
        assert_eq!(got[0].3[0].0.coordinator_epoch, 2);
        for n in 0..b.len() {
            let _ = parse_describe_producers(&b[..n]);
            let _ = parse_write_txn_markers(&b[..n]);
        }
    }
}
