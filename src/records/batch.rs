//! The batch walker: splits a records blob into entries (v2 batches, legacy
//! v0/v1 message-set entries, a truncated trailing batch) without copying,
//! allocating or decompressing anything.
//!
//! The size and magic checks mirror Kafka's `ByteBufferLogInputStream
//! .nextBatchSize` so that mirrorguard accepts and refuses exactly what a
//! broker would, in the same order: fewer than 12 bytes left is a truncated
//! tail, a size below 14 is corrupt, fewer than 17 bytes is a truncated tail,
//! a magic outside 0..=2 is corrupt, fewer bytes than the declared size is a
//! truncated tail.

use std::ops::Range;

use super::{LOG_OVERHEAD, MAGIC_OFFSET, MIN_ENTRY_SIZE, RECORD_BATCH_OVERHEAD};

/// Compression codec of a v2 batch (attribute bits 0-2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// Uncompressed.
    None,
    /// gzip.
    Gzip,
    /// snappy.
    Snappy,
    /// lz4.
    Lz4,
    /// zstd.
    Zstd,
    /// Codec ids 5-7: Kafka refuses them only when decompressing, so the
    /// walker carries them through rather than failing the whole blob.
    Unknown(u8),
}

impl Compression {
    /// Codec from the attributes field.
    pub fn from_attributes(attributes: i16) -> Self {
        match attributes & 0x07 {
            0 => Compression::None,
            1 => Compression::Gzip,
            2 => Compression::Snappy,
            3 => Compression::Lz4,
            4 => Compression::Zstd,
            // Masked to 3 bits, so the cast cannot truncate.
            other => Compression::Unknown(other as u8),
        }
    }

    /// Kafka's name for the codec (`CompressionType.name`).
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
            Compression::Snappy => "snappy",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
            Compression::Unknown(_) => "unknown",
        }
    }
}

/// Attribute bit: LogAppendTime timestamp type.
pub const ATTR_LOG_APPEND_TIME: i16 = 0x08;
/// Attribute bit: transactional batch.
pub const ATTR_TRANSACTIONAL: i16 = 0x10;
/// Attribute bit: control batch.
pub const ATTR_CONTROL: i16 = 0x20;
/// Attribute bit: baseTimestamp holds the delete horizon.
pub const ATTR_DELETE_HORIZON: i16 = 0x40;

/// The decoded 61-byte header of a v2 batch plus where it sits in the blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchHeader {
    /// Offset of the first record.
    pub base_offset: i64,
    /// Bytes after the length field; total size is `batch_length + 12`.
    pub batch_length: i32,
    /// Leader epoch stamped by the partition leader.
    pub partition_leader_epoch: i32,
    /// Always 2 for a `BatchHeader`.
    pub magic: i8,
    /// Stored CRC-32C.
    pub crc: u32,
    /// Attribute bits (codec, timestamp type, transactional, control, ...).
    pub attributes: i16,
    /// Offset delta of the last record (also the last-sequence delta).
    pub last_offset_delta: i32,
    /// First timestamp, or the delete horizon when attribute bit 6 is set.
    pub base_timestamp: i64,
    /// Largest timestamp of the batch.
    pub max_timestamp: i64,
    /// Producer id, -1 for none.
    pub producer_id: i64,
    /// Producer epoch, -1 for none.
    pub producer_epoch: i16,
    /// Sequence of the first record, -1 for none.
    pub base_sequence: i32,
    /// Number of records (the walker guarantees it is not negative).
    pub records_count: i32,
    /// Byte range of the whole batch in the walked buffer.
    pub range: Range<usize>,
}

impl BatchHeader {
    /// Decodes a header from its fixed 61 bytes; `range` locates the batch.
    pub fn parse(h: &[u8; RECORD_BATCH_OVERHEAD], range: Range<usize>) -> Self {
        // Constant indices into a fixed-size array: checked at compile time.
        let i64_at = |o: usize| {
            i64::from_be_bytes([
                h[o],
                h[o + 1],
                h[o + 2],
                h[o + 3],
                h[o + 4],
                h[o + 5],
                h[o + 6],
                h[o + 7],
            ])
        };
        let i32_at = |o: usize| i32::from_be_bytes([h[o], h[o + 1], h[o + 2], h[o + 3]]);
        let i16_at = |o: usize| i16::from_be_bytes([h[o], h[o + 1]]);
        BatchHeader {
            base_offset: i64_at(0),
            batch_length: i32_at(8),
            partition_leader_epoch: i32_at(12),
            magic: h[16] as i8,
            crc: u32::from_be_bytes([h[17], h[18], h[19], h[20]]),
            attributes: i16_at(21),
            last_offset_delta: i32_at(23),
            base_timestamp: i64_at(27),
            max_timestamp: i64_at(35),
            producer_id: i64_at(43),
            producer_epoch: i16_at(51),
            base_sequence: i32_at(53),
            records_count: i32_at(57),
            range,
        }
    }

    /// Whether the transactional bit is set.
    pub fn is_transactional(&self) -> bool {
        self.attributes & ATTR_TRANSACTIONAL != 0
    }

    /// Whether the control bit is set.
    pub fn is_control(&self) -> bool {
        self.attributes & ATTR_CONTROL != 0
    }

    /// Whether timestamps are LogAppendTime (else CreateTime).
    pub fn is_log_append_time(&self) -> bool {
        self.attributes & ATTR_LOG_APPEND_TIME != 0
    }

    /// The delete horizon, when the log cleaner set one.
    pub fn delete_horizon_ms(&self) -> Option<i64> {
        (self.attributes & ATTR_DELETE_HORIZON != 0).then_some(self.base_timestamp)
    }

    /// Compression codec.
    pub fn compression(&self) -> Compression {
        Compression::from_attributes(self.attributes)
    }

    /// Offset of the last record; wraps like Java's long arithmetic so a
    /// hostile header cannot make this panic.
    pub fn last_offset(&self) -> i64 {
        self.base_offset
            .wrapping_add(i64::from(self.last_offset_delta))
    }

    /// Sequence of the last record, Kafka's `incrementSequence` (wraps past
    /// i32::MAX back to 0), or -1 when the batch has no sequence.
    pub fn last_sequence(&self) -> i32 {
        increment_sequence(self.base_sequence, self.last_offset_delta)
    }

    /// Whether the batch carries a producer id in Kafka's sense
    /// (`hasProducerId()` is `producerId > -1`).
    pub fn has_producer_id(&self) -> bool {
        self.producer_id > -1
    }

    /// Total size in bytes.
    pub fn size(&self) -> usize {
        self.range.len()
    }
}

/// Kafka's `DefaultRecordBatch.incrementSequence` with the "-1 stays -1"
/// rule of `lastSequence`/record sequences.
pub fn increment_sequence(base: i32, delta: i32) -> i32 {
    if base < 0 {
        return -1;
    }
    if delta < 0 {
        // Never produced by Kafka; keep it total instead of panicking.
        return base.wrapping_add(delta);
    }
    if base > i32::MAX - delta {
        delta - (i32::MAX - base) - 1
    } else {
        base + delta
    }
}

/// One entry of a records blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A complete magic-2 batch.
    V2(BatchHeader),
    /// A complete legacy (magic 0 or 1) entry: passed through untouched.
    Legacy {
        /// Byte range of the entry.
        range: Range<usize>,
        /// 0 or 1.
        magic: u8,
    },
    /// A trailing entry cut short (brokers send these in Fetch responses);
    /// always the last entry, never rewritten.
    Truncated {
        /// Byte range of the partial entry (up to the end of the buffer).
        range: Range<usize>,
    },
}

impl Entry {
    /// Byte range of the entry in the walked buffer.
    pub fn range(&self) -> &Range<usize> {
        match self {
            Entry::V2(h) => &h.range,
            Entry::Legacy { range, .. } | Entry::Truncated { range } => range,
        }
    }
}

/// A corrupt entry: the walk cannot continue past it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    /// Size field below the minimum for the format.
    #[error("record size {size} at position {position} is less than the minimum record overhead ({min})")]
    SizeTooSmall {
        /// Byte position of the entry.
        position: usize,
        /// The declared size (batchLength).
        size: i32,
        /// The minimum for this entry's format.
        min: usize,
    },
    /// Magic byte outside 0..=2.
    #[error("invalid magic found in record at position {position}: {magic}")]
    InvalidMagic {
        /// Byte position of the entry.
        position: usize,
        /// The magic found.
        magic: i8,
    },
    /// Negative records count in a v2 header.
    #[error("invalid record count {count} in batch at position {position}")]
    InvalidCount {
        /// Byte position of the batch.
        position: usize,
        /// The count found.
        count: i32,
    },
}

/// Iterator over the entries of a records blob; see [`walk`].
///
/// After an error or a truncated entry it yields nothing more: the position of
/// the next entry is unknowable past a corrupt length.
#[derive(Debug, Clone)]
pub struct BatchWalker<'a> {
    buf: &'a [u8],
    pos: usize,
    done: bool,
}

impl<'a> BatchWalker<'a> {
    /// Starts a walk at the beginning of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        BatchWalker {
            buf,
            pos: 0,
            done: false,
        }
    }

    /// Bytes consumed by complete entries so far (where the next entry starts).
    pub fn position(&self) -> usize {
        self.pos
    }
}

/// Walks `buf` entry by entry. Zero allocation; never reads record bytes.
pub fn walk(buf: &[u8]) -> BatchWalker<'_> {
    BatchWalker::new(buf)
}

impl Iterator for BatchWalker<'_> {
    type Item = Result<Entry, BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let item = next_entry(self.buf, self.pos)?;
        match &item {
            Ok(Entry::Truncated { .. }) | Err(_) => self.done = true,
            Ok(e) => self.pos = e.range().end,
        }
        if self.pos >= self.buf.len() {
            self.done = true;
        }
        Some(item)
    }
}

/// Decodes the entry starting at `pos`; `None` at the end of the buffer.
pub(crate) fn next_entry(buf: &[u8], pos: usize) -> Option<Result<Entry, BatchError>> {
    let rest = buf.get(pos..)?;
    entry_at(rest, rest.len(), pos)
}

/// The entry at the start of `head`, the first bytes (at least 61, or all
/// of them if fewer) of `rest_len` bytes of records: what [`walk`] would say
/// of it over the whole records, for a streamed walk that has only the head.
pub(crate) fn next_entry_sized(head: &[u8], rest_len: usize) -> Option<Result<Entry, BatchError>> {
    entry_at(head, rest_len, 0)
}

fn entry_at(rest: &[u8], rest_len: usize, pos: usize) -> Option<Result<Entry, BatchError>> {
    if rest_len == 0 {
        return None;
    }
    let truncated = || {
        Some(Ok(Entry::Truncated {
            range: pos..pos + rest_len,
        }))
    };
    let Some(size) = super::read_i32(rest, 8) else {
        return truncated();
    };
    // Negative sizes fail the conversion and are corrupt like small ones.
    let size_ok = usize::try_from(size).ok().filter(|s| *s >= MIN_ENTRY_SIZE);
    let Some(size_usize) = size_ok else {
        return Some(Err(BatchError::SizeTooSmall {
            position: pos,
            size,
            min: MIN_ENTRY_SIZE,
        }));
    };
    let Some(&magic) = rest.get(MAGIC_OFFSET) else {
        return truncated();
    };
    let magic = magic as i8;
    if !(0..=2).contains(&magic) {
        return Some(Err(BatchError::InvalidMagic {
            position: pos,
            magic,
        }));
    }
    // size <= i32::MAX, so this cannot overflow on 32- or 64-bit targets.
    let total = size_usize.saturating_add(LOG_OVERHEAD);
    if magic == 2 && total < RECORD_BATCH_OVERHEAD {
        return Some(Err(BatchError::SizeTooSmall {
            position: pos,
            size,
            min: RECORD_BATCH_OVERHEAD - LOG_OVERHEAD,
        }));
    }
    if rest_len < total {
        return truncated();
    }
    let range = pos..pos + total;
    if magic < 2 {
        return Some(Ok(Entry::Legacy {
            range,
            magic: magic as u8,
        }));
    }
    let header: &[u8; RECORD_BATCH_OVERHEAD] =
        rest.get(..RECORD_BATCH_OVERHEAD)?.try_into().ok()?;
    let header = BatchHeader::parse(header, range);
    if header.records_count < 0 {
        return Some(Err(BatchError::InvalidCount {
            position: pos,
            count: header.records_count,
        }));
    }
    Some(Ok(Entry::V2(header)))
}
