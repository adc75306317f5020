//! Zero-copy iteration over the records of an uncompressed v2 batch
//! (`DefaultRecord` layout, wire reference section 1), with Kafka's
//! validation rules: the body must consume exactly its declared length,
//! 0 <= headerCount <= remaining bytes, header keys are never null.
//!
//! Used by the control-record parser and by `mirrorguard dump`; the proxy's
//! hot path never calls it.

use super::batch::{BatchHeader, Compression};
use super::RECORD_BATCH_OVERHEAD;
use crate::wire::Reader;

/// One record, borrowing from the batch bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<'a> {
    /// Record attributes (unused by Kafka, written as 0).
    pub attributes: i8,
    /// Timestamp relative to the batch's baseTimestamp.
    pub timestamp_delta: i64,
    /// Offset relative to the batch's baseOffset.
    pub offset_delta: i32,
    /// Key bytes, `None` for a null key.
    pub key: Option<&'a [u8]>,
    /// Value bytes, `None` for a null value.
    pub value: Option<&'a [u8]>,
    /// Number of headers.
    pub header_count: i32,
    headers: &'a [u8],
}

impl<'a> Record<'a> {
    /// Kafka's `keySize`: -1 for null.
    pub fn key_size(&self) -> i64 {
        self.key.map_or(-1, |k| k.len() as i64)
    }

    /// Kafka's `valueSize`: -1 for null.
    pub fn value_size(&self) -> i64 {
        self.value.map_or(-1, |v| v.len() as i64)
    }

    /// Iterates over `(key, value)` header pairs (already validated).
    pub fn headers(&self) -> impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)> + 'a {
        let mut c = Reader::new(self.headers);
        let mut left = self.header_count;
        std::iter::from_fn(move || {
            if left <= 0 {
                return None;
            }
            left -= 1;
            let key = c.read_varint_bytes("Record.headers.key").ok()??;
            let value = c.read_varint_bytes("Record.headers.value").ok()?;
            Some((key, value))
        })
    }
}

/// Why records could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// Not a complete magic-2 batch.
    #[error("not a complete v2 record batch")]
    NotV2,
    /// Records are compressed; mirrorguard never decompresses.
    #[error("records are compressed ({0}); not decoded")]
    Compressed(&'static str),
    /// A record is malformed.
    #[error("record {index}: {reason}")]
    Malformed {
        /// Index of the record in the batch.
        index: i32,
        /// What is wrong.
        reason: &'static str,
    },
    /// Bytes remain after the last record.
    #[error("incorrect declared batch size, records still remaining in batch")]
    TrailingBytes,
}

/// Iterator over the records of one batch; stops after the first error.
#[derive(Debug, Clone)]
pub struct RecordIter<'a> {
    cursor: Reader<'a>,
    index: i32,
    count: i32,
    failed: bool,
}

/// Iterates over the records of a complete, uncompressed v2 batch
/// (`batch` starts at baseOffset and holds exactly the batch, as given by
/// `header.range`).
pub fn records<'a>(header: &BatchHeader, batch: &'a [u8]) -> Result<RecordIter<'a>, RecordError> {
    if header.magic != 2 {
        return Err(RecordError::NotV2);
    }
    match header.compression() {
        Compression::None => {}
        other => return Err(RecordError::Compressed(other.name())),
    }
    let end = header.range.len();
    let body = batch
        .get(RECORD_BATCH_OVERHEAD..end)
        .ok_or(RecordError::NotV2)?;
    Ok(RecordIter {
        cursor: Reader::new(body),
        index: 0,
        count: header.records_count,
        failed: false,
    })
}

impl<'a> Iterator for RecordIter<'a> {
    type Item = Result<Record<'a>, RecordError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        if self.index >= self.count {
            if self.cursor.remaining() > 0 {
                self.failed = true;
                return Some(Err(RecordError::TrailingBytes));
            }
            return None;
        }
        let index = self.index;
        self.index += 1;
        let r = parse_record(&mut self.cursor)
            .map_err(|reason| RecordError::Malformed { index, reason });
        if r.is_err() {
            self.failed = true;
        }
        Some(r)
    }
}

// The reasons stay short phrases (they end up in `RecordError`, which is
// compared and logged); the wire error's offsets add nothing inside a record.
fn parse_record<'a>(c: &mut Reader<'a>) -> Result<Record<'a>, &'static str> {
    let len = c
        .read_varint_lenient("Record.length")
        .map_err(|_| "bad length varint")?;
    let len = usize::try_from(len).map_err(|_| "negative record length")?;
    let body = c
        .take(len, "Record")
        .map_err(|_| "record extends past the batch")?;
    let mut b = Reader::new(body);
    let attributes = b
        .read_i8("Record.attributes")
        .map_err(|_| "truncated attributes")?;
    let timestamp_delta = b
        .read_varlong_lenient("Record.timestampDelta")
        .map_err(|_| "bad timestamp delta")?;
    let offset_delta = b
        .read_varint_lenient("Record.offsetDelta")
        .map_err(|_| "bad offset delta")?;
    let key = b.read_varint_bytes("Record.key").map_err(|_| "bad key")?;
    let value = b
        .read_varint_bytes("Record.value")
        .map_err(|_| "bad value")?;
    let header_count = b
        .read_varint_lenient("Record.headers.count")
        .map_err(|_| "bad header count")?;
    if header_count < 0 || usize::try_from(header_count).map_or(true, |n| n > b.remaining()) {
        return Err("invalid header count");
    }
    let headers_start = b.position();
    for _ in 0..header_count {
        match b
            .read_varint_bytes("Record.headers.key")
            .map_err(|_| "bad header key")?
        {
            Some(_) => {}
            None => return Err("null header key"),
        }
        b.read_varint_bytes("Record.headers.value")
            .map_err(|_| "bad header value")?;
    }
    if b.remaining() != 0 {
        return Err("record body has unread bytes");
    }
    let headers = body.get(headers_start..).unwrap_or_default();
    Ok(Record {
        attributes,
        timestamp_delta,
        offset_delta,
        key,
        value,
        header_count,
        headers,
    })
}
