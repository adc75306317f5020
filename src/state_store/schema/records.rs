//! The record types of `__mirror_state` (types 3 to 7, keys and values; see
//! the tables in the parent module) and their field-by-field encoders and
//! decoders. The dispatch on the record type and the value version is in
//! the parent module ([`super::decode`]).

use super::{
    MirrorPartitionState, SchemaError, PARTITION_STATE_TYPE, PID_COLLISION_TYPE,
    PRODUCER_CLAIM_TYPE, PRODUCER_SNAPSHOT_CHUNK_TYPE, PRODUCER_SNAPSHOT_TYPE,
};
use crate::wire::{Reader, Writer};

/// A tagged field kept verbatim: `(tag, payload)`. Values decoded here keep
/// unknown tagged fields so that re-encoding preserves what a newer writer
/// added.
pub type RawTaggedField = (u32, Vec<u8>);

/// Key of a resolved PID collision (type 3, SPEC 2.2).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MirrorPidCollisionKey {
    /// Destination topic id where the collision occurred.
    pub topic_id: [u8; 16],
    /// Partition index.
    pub partition: i32,
    /// The source cluster whose PID was remapped (its id text).
    pub source_cluster_id: String,
    /// The PID on the source cluster before mapping.
    pub original_pid: i64,
}

/// Value of a resolved PID collision (v0, flexible, SPEC 2.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorPidCollisionValue {
    /// The salt added to the cluster hash.
    pub salt: i64,
    /// The cluster that already held the slot.
    pub colliding_cluster_id: String,
    /// Wall-clock time of the resolution (ms since the epoch).
    pub timestamp_ms: i64,
    /// Tagged fields not known to this version, kept verbatim.
    pub unknown_tagged_fields: Vec<RawTaggedField>,
}

/// Key of a partition's life-cycle state (type 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MirrorPartitionStateKey {
    /// Destination topic id.
    pub topic_id: [u8; 16],
    /// Partition index.
    pub partition: i32,
}

/// Value of a partition's life-cycle state (v0, flexible).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorPartitionStateValue {
    /// Name of the mirror feeding the partition.
    pub mirror: String,
    /// Destination topic name.
    pub topic_name: String,
    /// The state.
    pub state: MirrorPartitionState,
    /// The source cluster being mirrored.
    pub source_cluster_id: String,
    /// The cut (last mirrored offset + 1); -1 = none yet.
    pub cut_offset: i64,
    /// Number of sealing batches served at the cut; -1 = not yet.
    pub seal_batches: i32,
    /// Why (FAILED reason, operator note); `None` = none.
    pub reason: Option<String>,
    /// Wall-clock time of the transition (ms since the epoch).
    pub timestamp_ms: i64,
    /// Tagged fields not known to this version, kept verbatim.
    pub unknown_tagged_fields: Vec<RawTaggedField>,
}

/// Key of a partition's producer-state snapshot (type 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MirrorProducerSnapshotKey {
    /// Destination topic id.
    pub topic_id: [u8; 16],
    /// Partition index.
    pub partition: i32,
}

/// One producer of a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotProducer {
    /// The (mapped) PID as the destination sees it.
    pub producer_id: i64,
    /// Source cluster of the producer.
    pub origin_cluster_id: [u8; 16],
    /// The PID on the source cluster.
    pub original_pid: i64,
    /// Current epoch.
    pub producer_epoch: i16,
    /// Last sequence number.
    pub last_sequence: i32,
    /// Offset of the producer's last batch.
    pub last_offset: i64,
    /// Coordinator epoch of its last marker.
    pub coordinator_epoch: i32,
    /// First offset of the open transaction; -1 = none.
    pub txn_first_offset: i64,
    /// Max timestamp of its last batch.
    pub last_timestamp: i64,
}

/// Value of a partition's producer-state snapshot (v0, flexible).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorProducerSnapshotValue {
    /// Destination offset the snapshot is valid up to.
    pub snapshot_offset: i64,
    /// The producers.
    pub producers: Vec<SnapshotProducer>,
    /// Tagged fields not known to this version, kept verbatim.
    pub unknown_tagged_fields: Vec<RawTaggedField>,
}

/// Key of one producer's claim on a mapped PID in a partition (type 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MirrorProducerClaimKey {
    /// Destination topic id.
    pub topic_id: [u8; 16],
    /// Partition index.
    pub partition: i32,
    /// The (mapped) PID as the destination sees it.
    pub producer_id: i64,
}

/// Value of a producer claim (v0, flexible).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorProducerClaimValue {
    /// Source cluster of the producer.
    pub origin_cluster_id: [u8; 16],
    /// The PID on the source cluster.
    pub original_pid: i64,
    /// Wall-clock time of the claim (ms since the epoch).
    pub timestamp_ms: i64,
    /// Tagged fields not known to this version, kept verbatim.
    pub unknown_tagged_fields: Vec<RawTaggedField>,
}

/// Key of one chunk of a partition's chunked producer-state snapshot (type 7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MirrorProducerSnapshotChunkKey {
    /// Destination topic id.
    pub topic_id: [u8; 16],
    /// Partition index.
    pub partition: i32,
    /// The snapshot this chunk belongs to (increasing per partition).
    pub generation: i64,
    /// Chunk index, 0-based.
    pub chunk: i32,
}

/// Value of a snapshot chunk (v0, flexible).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorProducerSnapshotChunkValue {
    /// Destination offset the snapshot is valid up to.
    pub snapshot_offset: i64,
    /// Number of chunks of this generation.
    pub chunk_count: i32,
    /// The producers of this chunk.
    pub producers: Vec<SnapshotProducer>,
    /// Tagged fields not known to this version, kept verbatim.
    pub unknown_tagged_fields: Vec<RawTaggedField>,
}

/// Reads a value's trailing tagged-field section, keeping each field.
pub(super) fn read_tags(
    r: &mut Reader<'_>,
    field: &'static str,
) -> Result<Vec<RawTaggedField>, SchemaError> {
    let section = r.read_tagged_fields(field)?;
    // The section was validated against the bytes present, so this
    // allocation is bounded by the input.
    Ok(section.iter().map(|f| (f.tag, f.data.to_vec())).collect())
}

/// Writes a tagged-field section from kept fields (ascending tag order, as
/// the protocol requires).
pub(super) fn write_tags(
    w: &mut Writer<Vec<u8>>,
    tags: &[RawTaggedField],
    field: &'static str,
) -> Result<(), SchemaError> {
    let mut sorted: Vec<(u32, &[u8])> = tags.iter().map(|(t, d)| (*t, d.as_slice())).collect();
    sorted.sort_by_key(|(t, _)| *t);
    w.put_tagged_fields(&sorted, field)?;
    Ok(())
}

impl MirrorPidCollisionKey {
    pub(super) fn read_fields(r: &mut Reader<'_>) -> Result<Self, SchemaError> {
        Ok(Self {
            topic_id: r.read_uuid("MirrorPidCollisionKey.TopicId")?,
            partition: r.read_i32("MirrorPidCollisionKey.Partition")?,
            source_cluster_id: r
                .read_string("MirrorPidCollisionKey.SourceClusterId")?
                .to_owned(),
            original_pid: r.read_i64("MirrorPidCollisionKey.OriginalPid")?,
        })
    }

    /// Encodes the key (type 3). Fails only for a source cluster id longer
    /// than 32767 bytes.
    pub fn encode(&self) -> Result<Vec<u8>, SchemaError> {
        let mut w = Writer::new(Vec::with_capacity(32 + self.source_cluster_id.len()));
        w.put_i16(PID_COLLISION_TYPE);
        w.put_uuid(&self.topic_id);
        w.put_i32(self.partition);
        w.put_string(
            &self.source_cluster_id,
            "MirrorPidCollisionKey.SourceClusterId",
        )?;
        w.put_i64(self.original_pid);
        Ok(w.into_inner())
    }
}

impl MirrorPidCollisionValue {
    pub(super) fn read_fields(r: &mut Reader<'_>) -> Result<Self, SchemaError> {
        Ok(Self {
            salt: r.read_i64("MirrorPidCollisionValue.Salt")?,
            colliding_cluster_id: r
                .read_compact_string("MirrorPidCollisionValue.CollidingClusterId")?
                .to_owned(),
            timestamp_ms: r.read_i64("MirrorPidCollisionValue.TimestampMs")?,
            unknown_tagged_fields: read_tags(r, "MirrorPidCollisionValue._tagged_fields")?,
        })
    }

    /// Encodes the value (version 0).
    pub fn encode(&self) -> Result<Vec<u8>, SchemaError> {
        let mut w = Writer::new(Vec::with_capacity(24 + self.colliding_cluster_id.len()));
        w.put_i16(0);
        w.put_i64(self.salt);
        w.put_compact_string(
            &self.colliding_cluster_id,
            "MirrorPidCollisionValue.CollidingClusterId",
        )?;
        w.put_i64(self.timestamp_ms);
        write_tags(
            &mut w,
            &self.unknown_tagged_fields,
            "MirrorPidCollisionValue._tagged_fields",
        )?;
        Ok(w.into_inner())
    }
}

/// Encodes `type, TopicId, Partition` (the shared layout of types 4 and 5).
pub(super) fn encode_topic_partition_key(
    record_type: i16,
    topic_id: &[u8; 16],
    partition: i32,
) -> Vec<u8> {
    let mut w = Writer::new(Vec::with_capacity(22));
    w.put_i16(record_type);
    w.put_uuid(topic_id);
    w.put_i32(partition);
    w.into_inner()
}

impl MirrorPartitionStateKey {
    /// Encodes the key (type 4).
    pub fn encode(&self) -> Vec<u8> {
        encode_topic_partition_key(PARTITION_STATE_TYPE, &self.topic_id, self.partition)
    }
}

impl MirrorPartitionStateValue {
    pub(super) fn read_fields(r: &mut Reader<'_>) -> Result<Self, SchemaError> {
        Ok(Self {
            mirror: r
                .read_compact_string("MirrorPartitionStateValue.Mirror")?
                .to_owned(),
            topic_name: r
                .read_compact_string("MirrorPartitionStateValue.TopicName")?
                .to_owned(),
            state: MirrorPartitionState::from_code(r.read_i8("MirrorPartitionStateValue.State")?),
            source_cluster_id: r
                .read_compact_string("MirrorPartitionStateValue.SourceClusterId")?
                .to_owned(),
            cut_offset: r.read_i64("MirrorPartitionStateValue.CutOffset")?,
            seal_batches: r.read_i32("MirrorPartitionStateValue.SealBatches")?,
            reason: r
                .read_compact_nullable_string("MirrorPartitionStateValue.Reason")?
                .map(str::to_owned),
            timestamp_ms: r.read_i64("MirrorPartitionStateValue.TimestampMs")?,
            unknown_tagged_fields: read_tags(r, "MirrorPartitionStateValue._tagged_fields")?,
        })
    }

    /// Encodes the value (version 0).
    pub fn encode(&self) -> Result<Vec<u8>, SchemaError> {
        let mut w = Writer::new(Vec::with_capacity(64));
        w.put_i16(0);
        w.put_compact_string(&self.mirror, "MirrorPartitionStateValue.Mirror")?;
        w.put_compact_string(&self.topic_name, "MirrorPartitionStateValue.TopicName")?;
        w.put_i8(self.state.code());
        w.put_compact_string(
            &self.source_cluster_id,
            "MirrorPartitionStateValue.SourceClusterId",
        )?;
        w.put_i64(self.cut_offset);
        w.put_i32(self.seal_batches);
        w.put_compact_nullable_string(self.reason.as_deref(), "MirrorPartitionStateValue.Reason")?;
        w.put_i64(self.timestamp_ms);
        write_tags(
            &mut w,
            &self.unknown_tagged_fields,
            "MirrorPartitionStateValue._tagged_fields",
        )?;
        Ok(w.into_inner())
    }
}

impl MirrorProducerSnapshotKey {
    /// Encodes the key (type 5).
    pub fn encode(&self) -> Vec<u8> {
        encode_topic_partition_key(PRODUCER_SNAPSHOT_TYPE, &self.topic_id, self.partition)
    }
}

/// Smallest encoded producer entry: 8+16+8+2+4+8+4+8+8 fixed bytes plus an
/// empty tagged-field section. Bounds the array count before any allocation.
pub(super) const MIN_PRODUCER_ENTRY: usize = 67;

pub(super) fn read_producers(r: &mut Reader<'_>) -> Result<Vec<SnapshotProducer>, SchemaError> {
    {
        let n = r.read_array_len_v(
            true,
            MIN_PRODUCER_ENTRY,
            "MirrorProducerSnapshotValue.Producers",
        )?;
        // `n` was checked against the bytes present (each entry needs at
        // least MIN_PRODUCER_ENTRY bytes), so this reservation is bounded.
        let mut producers = Vec::with_capacity(n);
        for _ in 0..n {
            producers.push(SnapshotProducer {
                producer_id: r.read_i64("SnapshotProducer.ProducerId")?,
                origin_cluster_id: r.read_uuid("SnapshotProducer.OriginClusterId")?,
                original_pid: r.read_i64("SnapshotProducer.OriginalPid")?,
                producer_epoch: r.read_i16("SnapshotProducer.ProducerEpoch")?,
                last_sequence: r.read_i32("SnapshotProducer.LastSequence")?,
                last_offset: r.read_i64("SnapshotProducer.LastOffset")?,
                coordinator_epoch: r.read_i32("SnapshotProducer.CoordinatorEpoch")?,
                txn_first_offset: r.read_i64("SnapshotProducer.TxnFirstOffset")?,
                last_timestamp: r.read_i64("SnapshotProducer.LastTimestamp")?,
            });
            // Entry-level tags: none defined in v0; skipped (a newer writer
            // adding one would bump the value version).
            r.read_tagged_fields("SnapshotProducer._tagged_fields")?;
        }
        Ok(producers)
    }
}

pub(super) fn write_producers(
    w: &mut Writer<Vec<u8>>,
    producers: &[SnapshotProducer],
) -> Result<(), SchemaError> {
    w.put_compact_array_len(
        Some(producers.len()),
        "MirrorProducerSnapshotValue.Producers",
    )?;
    for p in producers {
        w.put_i64(p.producer_id);
        w.put_uuid(&p.origin_cluster_id);
        w.put_i64(p.original_pid);
        w.put_i16(p.producer_epoch);
        w.put_i32(p.last_sequence);
        w.put_i64(p.last_offset);
        w.put_i32(p.coordinator_epoch);
        w.put_i64(p.txn_first_offset);
        w.put_i64(p.last_timestamp);
        w.put_uvarint(0);
    }
    Ok(())
}

impl MirrorProducerSnapshotValue {
    pub(super) fn read_fields(r: &mut Reader<'_>) -> Result<Self, SchemaError> {
        let snapshot_offset = r.read_i64("MirrorProducerSnapshotValue.SnapshotOffset")?;
        let producers = read_producers(r)?;
        Ok(Self {
            snapshot_offset,
            producers,
            unknown_tagged_fields: read_tags(r, "MirrorProducerSnapshotValue._tagged_fields")?,
        })
    }

    /// Encodes the value (version 0).
    pub fn encode(&self) -> Result<Vec<u8>, SchemaError> {
        let mut w = Writer::new(Vec::with_capacity(
            12 + self.producers.len().saturating_mul(MIN_PRODUCER_ENTRY),
        ));
        w.put_i16(0);
        w.put_i64(self.snapshot_offset);
        write_producers(&mut w, &self.producers)?;
        write_tags(
            &mut w,
            &self.unknown_tagged_fields,
            "MirrorProducerSnapshotValue._tagged_fields",
        )?;
        Ok(w.into_inner())
    }
}

impl MirrorProducerClaimKey {
    /// Encodes the key (type 6): 30 bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut k = encode_topic_partition_key(PRODUCER_CLAIM_TYPE, &self.topic_id, self.partition);
        k.extend_from_slice(&self.producer_id.to_be_bytes());
        k
    }
}

impl MirrorProducerClaimValue {
    pub(super) fn read_fields(r: &mut Reader<'_>) -> Result<Self, SchemaError> {
        Ok(Self {
            origin_cluster_id: r.read_uuid("MirrorProducerClaimValue.OriginClusterId")?,
            original_pid: r.read_i64("MirrorProducerClaimValue.OriginalPid")?,
            timestamp_ms: r.read_i64("MirrorProducerClaimValue.TimestampMs")?,
            unknown_tagged_fields: read_tags(r, "MirrorProducerClaimValue._tagged_fields")?,
        })
    }

    /// Encodes the value (version 0): 35 bytes without tagged fields.
    pub fn encode(&self) -> Result<Vec<u8>, SchemaError> {
        let mut w = Writer::new(Vec::with_capacity(35));
        w.put_i16(0);
        w.put_uuid(&self.origin_cluster_id);
        w.put_i64(self.original_pid);
        w.put_i64(self.timestamp_ms);
        write_tags(
            &mut w,
            &self.unknown_tagged_fields,
            "MirrorProducerClaimValue._tagged_fields",
        )?;
        Ok(w.into_inner())
    }
}

impl MirrorProducerSnapshotChunkKey {
    /// Encodes the key (type 7): 34 bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut k = encode_topic_partition_key(
            PRODUCER_SNAPSHOT_CHUNK_TYPE,
            &self.topic_id,
            self.partition,
        );
        k.extend_from_slice(&self.generation.to_be_bytes());
        k.extend_from_slice(&self.chunk.to_be_bytes());
        k
    }
}

impl MirrorProducerSnapshotChunkValue {
    pub(super) fn read_fields(r: &mut Reader<'_>) -> Result<Self, SchemaError> {
        let snapshot_offset = r.read_i64("MirrorProducerSnapshotChunkValue.SnapshotOffset")?;
        let chunk_count = r.read_i32("MirrorProducerSnapshotChunkValue.ChunkCount")?;
        let producers = read_producers(r)?;
        Ok(Self {
            snapshot_offset,
            chunk_count,
            producers,
            unknown_tagged_fields: read_tags(r, "MirrorProducerSnapshotChunkValue._tagged_fields")?,
        })
    }

    /// Encodes the value (version 0).
    pub fn encode(&self) -> Result<Vec<u8>, SchemaError> {
        let mut w = Writer::new(Vec::with_capacity(
            16 + self.producers.len().saturating_mul(MIN_PRODUCER_ENTRY),
        ));
        w.put_i16(0);
        w.put_i64(self.snapshot_offset);
        w.put_i32(self.chunk_count);
        write_producers(&mut w, &self.producers)?;
        write_tags(
            &mut w,
            &self.unknown_tagged_fields,
            "MirrorProducerSnapshotChunkValue._tagged_fields",
        )?;
        Ok(w.into_inner())
    }
}
