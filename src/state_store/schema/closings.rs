//! The transaction closings a type-5 snapshot carries in an optional tagged
//! field (see [`SnapshotClosings`]).

use super::{RawTaggedField, SchemaError};
use crate::wire::{Reader, Writer};

/// Tag of [`SnapshotClosings`] in a `MirrorProducerSnapshotValue` (v0):
/// an optional tagged field, so an instance that does not know it skips it.
pub const SNAPSHOT_CLOSINGS_TAG: u32 = 0;

/// The transaction closings a partition's producer state remembers (past
/// the destination fetcher's position, and those below it a destination
/// leader may still lose), kept with a type-5 snapshot (tagged field
/// [`SNAPSHOT_CLOSINGS_TAG`]): the markers below a snapshot's offset are
/// replays after a restart or a take-over, so the closings they made are
/// restored from here, not observed again.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SnapshotClosings {
    /// The offset the closings are kept from: at most the fetcher's
    /// position (written before issue 17 as exactly that position, with no
    /// closing kept below it).
    pub kept_from: i64,
    /// Highest offset below which closings may be missing (-1: none).
    pub dropped_upto: i64,
    /// The closings, in marker offset order.
    pub closings: Vec<SnapshotClosing>,
}

/// One transaction closing in [`SnapshotClosings`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotClosing {
    /// Offset of the closing marker.
    pub marker_offset: i64,
    /// The (mapped) PID.
    pub producer_id: i64,
    /// The producer epoch of the transaction's batches.
    pub producer_epoch: i16,
    /// The transaction's first offset.
    pub first_offset: i64,
    /// The coordinator epoch before the marker.
    pub coordinator_epoch: i32,
    /// Source cluster of the producer.
    pub origin_cluster_id: [u8; 16],
    /// The PID on the source cluster.
    pub original_pid: i64,
}

/// Smallest encoded closing: 8+8+2+8+4+16+8 bytes and an empty tag section.
pub(super) const MIN_CLOSING_ENTRY: usize = 55;

impl SnapshotClosings {
    /// Encodes the closings as a tagged field of a snapshot value.
    pub fn encode_tag(&self) -> Result<RawTaggedField, SchemaError> {
        let mut w = Writer::new(Vec::with_capacity(
            20 + self.closings.len().saturating_mul(MIN_CLOSING_ENTRY),
        ));
        w.put_i64(self.kept_from);
        w.put_i64(self.dropped_upto);
        w.put_compact_array_len(Some(self.closings.len()), "SnapshotClosings.Closings")?;
        for c in &self.closings {
            w.put_i64(c.marker_offset);
            w.put_i64(c.producer_id);
            w.put_i16(c.producer_epoch);
            w.put_i64(c.first_offset);
            w.put_i32(c.coordinator_epoch);
            w.put_uuid(&c.origin_cluster_id);
            w.put_i64(c.original_pid);
            w.put_uvarint(0);
        }
        w.put_uvarint(0);
        Ok((SNAPSHOT_CLOSINGS_TAG, w.into_inner()))
    }

    /// The closings among a snapshot value's tagged fields (`None` when the
    /// writer kept none).
    pub fn from_tags(tags: &[RawTaggedField]) -> Result<Option<Self>, SchemaError> {
        let Some((_, data)) = tags.iter().find(|(t, _)| *t == SNAPSHOT_CLOSINGS_TAG) else {
            return Ok(None);
        };
        let mut r = Reader::new(data);
        let kept_from = r.read_i64("SnapshotClosings.KeptFrom")?;
        let dropped_upto = r.read_i64("SnapshotClosings.DroppedUpto")?;
        let n = r.read_array_len_v(true, MIN_CLOSING_ENTRY, "SnapshotClosings.Closings")?;
        // Bounded: `n` was checked against the bytes present.
        let mut closings = Vec::with_capacity(n);
        for _ in 0..n {
            closings.push(SnapshotClosing {
                marker_offset: r.read_i64("SnapshotClosing.MarkerOffset")?,
                producer_id: r.read_i64("SnapshotClosing.ProducerId")?,
                producer_epoch: r.read_i16("SnapshotClosing.ProducerEpoch")?,
                first_offset: r.read_i64("SnapshotClosing.FirstOffset")?,
                coordinator_epoch: r.read_i32("SnapshotClosing.CoordinatorEpoch")?,
                origin_cluster_id: r.read_uuid("SnapshotClosing.OriginClusterId")?,
                original_pid: r.read_i64("SnapshotClosing.OriginalPid")?,
            });
            r.read_tagged_fields("SnapshotClosing._tagged_fields")?;
        }
        r.read_tagged_fields("SnapshotClosings._tagged_fields")?;
        Ok(Some(Self {
            kept_from,
            dropped_upto,
            closings,
        }))
    }
}
