//! Type 9: which instance serves a partition (`MirrorPartitionServing`).
//!
//! Written by a mirrorguard instance when it starts serving a destination
//! partition's fetcher: its first Fetch response with records for the
//! partition since start-up, or the first one after another instance wrote
//! this record for the partition (a destination leadership move). Every
//! instance tails it: one that reads another instance's record for a
//! partition it served knows its shadow state of that partition is stale
//! and brings it up to date before it forwards a batch of it again. The
//! key is the partition (compaction keeps the latest holder).
//!
//! The codec is self-contained (like type 8, `mirror::offline`): an older
//! instance's [`super::decode`] reports type 9 as an unknown record type,
//! which it skips and counts.

use crate::wire::{Reader, WireError, WireResult, Writer};

/// Record type of the serving record.
pub const PARTITION_SERVING_TYPE: i16 = 9;
/// Value version written (and the only one read).
pub const PARTITION_SERVING_VERSION: i16 = 0;

/// Key of a serving record (type 9, not flexible; 22 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MirrorPartitionServingKey {
    /// Destination topic id.
    pub topic_id: [u8; 16],
    /// Partition index.
    pub partition: i32,
}

/// Value of a serving record (v0, flexible).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorPartitionServingValue {
    /// The serving instance (`[state] instance_id`).
    pub instance_id: String,
    /// The `[[mirror]]` feeding the partition.
    pub mirror: String,
    /// Destination topic name (for humans, and before the id is known).
    pub topic_name: String,
    /// The fetcher's offset when the instance started serving it.
    pub from_offset: i64,
    /// Wall-clock time the instance started serving it.
    pub timestamp_ms: i64,
}

impl MirrorPartitionServingKey {
    /// Encodes the key.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new(Vec::with_capacity(22));
        w.put_i16(PARTITION_SERVING_TYPE);
        w.put_uuid(&self.topic_id);
        w.put_i32(self.partition);
        w.into_inner()
    }

    /// Decodes a key of type 9.
    pub fn decode(key: &[u8]) -> WireResult<Self> {
        let mut r = Reader::new(key);
        let t = r.read_i16("MirrorPartitionServingKey.type")?;
        if t != PARTITION_SERVING_TYPE {
            return Err(WireError::UnsupportedVersion {
                api: "MirrorPartitionServingKey",
                version: t,
            });
        }
        Ok(Self {
            topic_id: r.read_uuid("MirrorPartitionServingKey.TopicId")?,
            partition: r.read_i32("MirrorPartitionServingKey.Partition")?,
        })
    }
}

impl MirrorPartitionServingValue {
    /// Encodes the value (version 0, no tagged fields).
    pub fn encode(&self) -> WireResult<Vec<u8>> {
        let mut w = Writer::new(Vec::with_capacity(
            32 + self.instance_id.len() + self.mirror.len() + self.topic_name.len(),
        ));
        w.put_i16(PARTITION_SERVING_VERSION);
        w.put_compact_string(&self.instance_id, "InstanceId")?;
        w.put_compact_string(&self.mirror, "Mirror")?;
        w.put_compact_string(&self.topic_name, "TopicName")?;
        w.put_i64(self.from_offset);
        w.put_i64(self.timestamp_ms);
        w.put_uvarint(0);
        Ok(w.into_inner())
    }

    /// Decodes a value; `Ok(None)` for a version newer than this code (the
    /// caller skips it and counts it). Unknown tagged fields are skipped.
    pub fn decode(value: &[u8]) -> WireResult<Option<Self>> {
        let mut r = Reader::new(value);
        if r.read_i16("MirrorPartitionServingValue.version")? != PARTITION_SERVING_VERSION {
            return Ok(None);
        }
        let v = Self {
            instance_id: r.read_compact_string("InstanceId")?.to_string(),
            mirror: r.read_compact_string("Mirror")?.to_string(),
            topic_name: r.read_compact_string("TopicName")?.to_string(),
            from_offset: r.read_i64("FromOffset")?,
            timestamp_ms: r.read_i64("TimestampMs")?,
        };
        r.skip_tagged_fields_v(true, "MirrorPartitionServingValue._tagged_fields")?;
        Ok(Some(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serving_record_round_trips_byte_for_byte() {
        let key = MirrorPartitionServingKey {
            topic_id: [0x11; 16],
            partition: 3,
        };
        let k = key.encode();
        assert_eq!(k.len(), 22);
        assert_eq!(&k[..2], &[0, 9]);
        assert_eq!(MirrorPartitionServingKey::decode(&k).unwrap(), key);
        let value = MirrorPartitionServingValue {
            instance_id: "host-a/127.0.0.1:9000".into(),
            mirror: "m".into(),
            topic_name: "t".into(),
            from_offset: 42,
            timestamp_ms: 1_700_000_000_000,
        };
        let v = value.encode().unwrap();
        assert_eq!(&v[..2], &[0, 0]);
        assert_eq!(*v.last().unwrap(), 0, "empty tagged-field section");
        assert_eq!(
            MirrorPartitionServingValue::decode(&v).unwrap(),
            Some(value)
        );
        // A newer version is reported, not an error; a truncated value is one.
        let mut newer = v.clone();
        newer[1] = 1;
        assert_eq!(MirrorPartitionServingValue::decode(&newer).unwrap(), None);
        assert!(MirrorPartitionServingValue::decode(&v[..v.len() - 9]).is_err());
        // An older reader sees an unknown record type, never an error.
        assert!(matches!(
            super::super::decode(&k, Some(&v)),
            Ok(super::super::StateRecord::Unknown { record_type: 9 })
        ));
    }
}
