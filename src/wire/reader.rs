//! Bounds-checked, zero-copy reader over a Kafka protocol buffer.
//!
//! Every read is checked against the bytes actually present before anything
//! is consumed; strings and byte fields come back as slices borrowed from the
//! input. Nothing here allocates, and in particular no length or element
//! count read from the wire is ever used to reserve memory: counts are only
//! validated (against the remaining bytes) and handed back to the caller.
//! A read that fails consumes nothing: the cursor stays where it was, so a
//! caller can report the error position or try another interpretation.
//!
//! (Over 600 lines on purpose: every wire primitive of the protocol, strict and
//! Kafka's lenient varints alike, on one cursor whose invariant is checked
//! in one place; a third of the file is its tests.)

use super::error::{WireError, WireResult};

/// A cursor over a byte slice that reads Kafka primitive types.
///
/// Offsets reported by [`Reader::position`] and in errors are relative to the
/// start of the slice given to [`Reader::new`], so a handler parsing a
/// response body reports offsets within that body.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

/// One field of a tagged-field section: its tag and its raw payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaggedField<'a> {
    /// The field's tag number.
    pub tag: u32,
    /// The field's payload (without the tag and size prefixes).
    pub data: &'a [u8],
    /// Offset of the tag prefix within the reader's buffer.
    pub start: usize,
    /// Offset one past the end of the payload within the reader's buffer.
    pub end: usize,
    /// Offset of the payload within the reader's buffer.
    pub data_start: usize,
}

/// A validated tagged-field section (count prefix plus fields).
///
/// Produced by [`Reader::read_tagged_fields`], which has already checked that
/// every field fits; iterating it cannot fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaggedSection<'a> {
    buf: &'a [u8],
    /// Offset of the count prefix within the reader's buffer.
    pub start: usize,
    /// Offset of the first field (just after the count prefix).
    pub fields_start: usize,
    /// Offset one past the end of the section.
    pub end: usize,
    /// Number of fields in the section.
    pub count: u32,
}

impl<'a> TaggedSection<'a> {
    /// The raw bytes of the whole section, count prefix included.
    pub fn raw(&self) -> &'a [u8] {
        self.buf.get(self.start..self.end).unwrap_or_default()
    }

    /// Iterates the fields in wire order.
    pub fn iter(&self) -> TaggedFieldIter<'a> {
        TaggedFieldIter {
            reader: Reader {
                buf: self.buf.get(..self.end).unwrap_or_default(),
                pos: self.fields_start,
            },
            left: self.count,
        }
    }

    /// The first field carrying `tag`, if any.
    pub fn find(&self, tag: u32) -> Option<TaggedField<'a>> {
        self.iter().find(|f| f.tag == tag)
    }
}

/// Iterator over the fields of a [`TaggedSection`].
#[derive(Debug, Clone)]
pub struct TaggedFieldIter<'a> {
    reader: Reader<'a>,
    left: u32,
}

impl<'a> Iterator for TaggedFieldIter<'a> {
    type Item = TaggedField<'a>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        // The section was validated when it was read, so this cannot fail;
        // if it somehow did, ending the iteration is the safe answer.
        match self.reader.read_tagged_field("tagged field") {
            Ok(f) => Some(f),
            Err(_) => {
                self.left = 0;
                None
            }
        }
    }
}

macro_rules! read_be {
    ($name:ident, $ty:ty, $n:expr, $doc:expr) => {
        #[doc = $doc]
        pub fn $name(&mut self, field: &'static str) -> WireResult<$ty> {
            let b = self.take($n, field)?;
            let mut a = [0u8; $n];
            a.copy_from_slice(b);
            Ok(<$ty>::from_be_bytes(a))
        }
    };
}

impl<'a> Reader<'a> {
    /// A reader positioned at the start of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// A reader over `buf` positioned at `pos` (clamped to the end).
    pub fn at(buf: &'a [u8], pos: usize) -> Self {
        Reader {
            buf,
            pos: pos.min(buf.len()),
        }
    }

    /// Current offset within the buffer.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Bytes left to read.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// True when everything has been read.
    pub fn is_empty(&self) -> bool {
        self.remaining() == 0
    }

    /// The whole underlying buffer.
    pub fn buffer(&self) -> &'a [u8] {
        self.buf
    }

    /// The unread tail of the buffer (not consumed).
    pub fn rest(&self) -> &'a [u8] {
        self.buf.get(self.pos..).unwrap_or_default()
    }

    /// Consumes exactly `n` bytes and returns them.
    pub fn take(&mut self, n: usize, field: &'static str) -> WireResult<&'a [u8]> {
        let available = self.remaining();
        if n > available {
            return Err(WireError::Truncated {
                field,
                offset: self.pos,
                needed: n,
                available,
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// Skips exactly `n` bytes.
    pub fn skip(&mut self, n: usize, field: &'static str) -> WireResult<()> {
        self.take(n, field).map(|_| ())
    }

    read_be!(read_i8, i8, 1, "Reads an INT8.");
    read_be!(read_i16, i16, 2, "Reads a big-endian INT16.");
    read_be!(read_i32, i32, 4, "Reads a big-endian INT32.");
    read_be!(read_i64, i64, 8, "Reads a big-endian INT64.");
    read_be!(read_u16, u16, 2, "Reads a big-endian UINT16.");
    read_be!(read_u32, u32, 4, "Reads a big-endian UINT32.");
    read_be!(read_f64, f64, 8, "Reads a big-endian FLOAT64.");

    /// Reads a BOOLEAN (any non-zero byte is true, as Kafka's reader does).
    pub fn read_bool(&mut self, field: &'static str) -> WireResult<bool> {
        Ok(self.read_i8(field)? != 0)
    }

    /// Reads a 16-byte UUID.
    pub fn read_uuid(&mut self, field: &'static str) -> WireResult<[u8; 16]> {
        let b = self.take(16, field)?;
        let mut a = [0u8; 16];
        a.copy_from_slice(b);
        Ok(a)
    }

    /// Reads an UNSIGNED_VARINT (at most 5 bytes, value fits in u32).
    pub fn read_uvarint(&mut self, field: &'static str) -> WireResult<u32> {
        let start = self.pos;
        let mut value: u32 = 0;
        for i in 0..5 {
            let b = match self.buf.get(self.pos) {
                Some(b) => *b,
                None => {
                    self.pos = start;
                    return Err(WireError::Truncated {
                        field,
                        offset: start,
                        needed: i + 1,
                        available: i,
                    });
                }
            };
            self.pos += 1;
            // The fifth byte may only carry the top four bits of a u32.
            if i == 4 && b > 0x0f {
                self.pos = start;
                return Err(WireError::MalformedVarint {
                    field,
                    offset: start,
                });
            }
            value |= u32::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        self.pos = start;
        Err(WireError::MalformedVarint {
            field,
            offset: start,
        })
    }

    /// Reads an unsigned varlong (at most 10 bytes, value fits in u64).
    pub fn read_uvarlong(&mut self, field: &'static str) -> WireResult<u64> {
        let start = self.pos;
        let mut value: u64 = 0;
        for i in 0..10 {
            let b = match self.buf.get(self.pos) {
                Some(b) => *b,
                None => {
                    self.pos = start;
                    return Err(WireError::Truncated {
                        field,
                        offset: start,
                        needed: i + 1,
                        available: i,
                    });
                }
            };
            self.pos += 1;
            if i == 9 && b > 0x01 {
                self.pos = start;
                return Err(WireError::MalformedVarint {
                    field,
                    offset: start,
                });
            }
            value |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        self.pos = start;
        Err(WireError::MalformedVarint {
            field,
            offset: start,
        })
    }

    /// Reads a zig-zag VARINT.
    pub fn read_varint(&mut self, field: &'static str) -> WireResult<i32> {
        let u = self.read_uvarint(field)?;
        Ok(((u >> 1) as i32) ^ -((u & 1) as i32))
    }

    /// Reads a zig-zag VARLONG.
    pub fn read_varlong(&mut self, field: &'static str) -> WireResult<i64> {
        let u = self.read_uvarlong(field)?;
        Ok(((u >> 1) as i64) ^ -((u & 1) as i64))
    }

    fn utf8(&self, b: &'a [u8], field: &'static str, offset: usize) -> WireResult<&'a str> {
        std::str::from_utf8(b).map_err(|_| WireError::InvalidUtf8 { field, offset })
    }

    /// Reads a length that must fit in the remaining bytes; `len` was read
    /// from a prefix starting at `prefix_at`.
    fn checked_len(&self, len: i64, field: &'static str, prefix_at: usize) -> WireResult<usize> {
        let available = self.remaining();
        if len < 0 || len as u64 > available as u64 {
            return Err(WireError::InvalidLength {
                field,
                offset: prefix_at,
                len,
                available,
            });
        }
        Ok(len as usize)
    }

    /// Reads a NULLABLE_STRING (INT16 length, -1 = null).
    pub fn read_nullable_string(&mut self, field: &'static str) -> WireResult<Option<&'a str>> {
        let at = self.pos;
        let len = self.read_i16(field)?;
        if len == -1 {
            return Ok(None);
        }
        let n = self
            .checked_len(len.into(), field, at)
            .inspect_err(|_| self.pos = at)?;
        let data_at = self.pos;
        let b = self.take(n, field)?;
        self.utf8(b, field, data_at)
            .map(Some)
            .inspect_err(|_| self.pos = at)
    }

    /// Reads a STRING (INT16 length); null is an error.
    pub fn read_string(&mut self, field: &'static str) -> WireResult<&'a str> {
        let at = self.pos;
        self.read_nullable_string(field)?
            .ok_or(WireError::UnexpectedNull { field, offset: at })
            .inspect_err(|_| self.pos = at)
    }

    /// Reads a COMPACT_NULLABLE_STRING (UNSIGNED_VARINT length+1, 0 = null).
    pub fn read_compact_nullable_string(
        &mut self,
        field: &'static str,
    ) -> WireResult<Option<&'a str>> {
        let at = self.pos;
        let data_at;
        match self.read_compact_nullable_bytes_inner(field)? {
            None => Ok(None),
            Some((b, d)) => {
                data_at = d;
                self.utf8(b, field, data_at)
                    .map(Some)
                    .inspect_err(|_| self.pos = at)
            }
        }
    }

    /// Reads a COMPACT_STRING; null is an error.
    pub fn read_compact_string(&mut self, field: &'static str) -> WireResult<&'a str> {
        let at = self.pos;
        self.read_compact_nullable_string(field)?
            .ok_or(WireError::UnexpectedNull { field, offset: at })
            .inspect_err(|_| self.pos = at)
    }

    /// Reads a string in the encoding of the message's version: compact when
    /// `flexible`, classic otherwise. Null is an error.
    pub fn read_string_v(&mut self, flexible: bool, field: &'static str) -> WireResult<&'a str> {
        if flexible {
            self.read_compact_string(field)
        } else {
            self.read_string(field)
        }
    }

    /// Reads a nullable string in the encoding of the message's version.
    pub fn read_nullable_string_v(
        &mut self,
        flexible: bool,
        field: &'static str,
    ) -> WireResult<Option<&'a str>> {
        if flexible {
            self.read_compact_nullable_string(field)
        } else {
            self.read_nullable_string(field)
        }
    }

    /// Reads NULLABLE_BYTES (INT32 length, -1 = null).
    pub fn read_nullable_bytes(&mut self, field: &'static str) -> WireResult<Option<&'a [u8]>> {
        let at = self.pos;
        let len = self.read_i32(field)?;
        if len == -1 {
            return Ok(None);
        }
        let n = self
            .checked_len(len.into(), field, at)
            .inspect_err(|_| self.pos = at)?;
        self.take(n, field).map(Some)
    }

    /// Reads BYTES (INT32 length); null is an error.
    pub fn read_bytes(&mut self, field: &'static str) -> WireResult<&'a [u8]> {
        let at = self.pos;
        self.read_nullable_bytes(field)?
            .ok_or(WireError::UnexpectedNull { field, offset: at })
            .inspect_err(|_| self.pos = at)
    }

    fn read_compact_nullable_bytes_inner(
        &mut self,
        field: &'static str,
    ) -> WireResult<Option<(&'a [u8], usize)>> {
        let at = self.pos;
        let n1 = self.read_uvarint(field)?;
        if n1 == 0 {
            return Ok(None);
        }
        let n = self
            .checked_len(i64::from(n1) - 1, field, at)
            .inspect_err(|_| self.pos = at)?;
        let data_at = self.pos;
        self.take(n, field).map(|b| Some((b, data_at)))
    }

    /// Reads COMPACT_NULLABLE_BYTES (UNSIGNED_VARINT length+1, 0 = null).
    pub fn read_compact_nullable_bytes(
        &mut self,
        field: &'static str,
    ) -> WireResult<Option<&'a [u8]>> {
        Ok(self
            .read_compact_nullable_bytes_inner(field)?
            .map(|(b, _)| b))
    }

    /// Reads COMPACT_BYTES; null is an error.
    pub fn read_compact_bytes(&mut self, field: &'static str) -> WireResult<&'a [u8]> {
        let at = self.pos;
        self.read_compact_nullable_bytes(field)?
            .ok_or(WireError::UnexpectedNull { field, offset: at })
            .inspect_err(|_| self.pos = at)
    }

    /// Reads nullable bytes in the encoding of the message's version.
    pub fn read_nullable_bytes_v(
        &mut self,
        flexible: bool,
        field: &'static str,
    ) -> WireResult<Option<&'a [u8]>> {
        if flexible {
            self.read_compact_nullable_bytes(field)
        } else {
            self.read_nullable_bytes(field)
        }
    }

    /// Checks an element count against the bytes left: every element takes at
    /// least `min_elem_size` bytes (treated as 1 if 0), so a count that cannot
    /// fit is refused before the caller could reserve anything for it.
    fn checked_count(
        &self,
        count: i64,
        min_elem_size: usize,
        field: &'static str,
        prefix_at: usize,
    ) -> WireResult<usize> {
        let available = self.remaining();
        let need = (count.max(0) as u64).saturating_mul(min_elem_size.max(1) as u64);
        if count < 0 || need > available as u64 {
            return Err(WireError::InvalidLength {
                field,
                offset: prefix_at,
                len: count,
                available,
            });
        }
        Ok(count as usize)
    }

    /// Reads a classic ARRAY length (INT32, -1 = null). The count is checked
    /// against the remaining bytes assuming each element is at least
    /// `min_elem_size` bytes.
    pub fn read_array_len(
        &mut self,
        min_elem_size: usize,
        field: &'static str,
    ) -> WireResult<Option<usize>> {
        let at = self.pos;
        let n = self.read_i32(field)?;
        if n == -1 {
            return Ok(None);
        }
        self.checked_count(n.into(), min_elem_size, field, at)
            .inspect_err(|_| self.pos = at)
            .map(Some)
    }

    /// Reads a COMPACT_ARRAY length (UNSIGNED_VARINT count+1, 0 = null),
    /// checked like [`Reader::read_array_len`].
    pub fn read_compact_array_len(
        &mut self,
        min_elem_size: usize,
        field: &'static str,
    ) -> WireResult<Option<usize>> {
        let at = self.pos;
        let n1 = self.read_uvarint(field)?;
        if n1 == 0 {
            return Ok(None);
        }
        self.checked_count(i64::from(n1) - 1, min_elem_size, field, at)
            .inspect_err(|_| self.pos = at)
            .map(Some)
    }

    /// Reads a nullable array length in the encoding of the message's version.
    pub fn read_nullable_array_len_v(
        &mut self,
        flexible: bool,
        min_elem_size: usize,
        field: &'static str,
    ) -> WireResult<Option<usize>> {
        if flexible {
            self.read_compact_array_len(min_elem_size, field)
        } else {
            self.read_array_len(min_elem_size, field)
        }
    }

    /// Reads a non-nullable array length in the encoding of the message's
    /// version; null is an error.
    pub fn read_array_len_v(
        &mut self,
        flexible: bool,
        min_elem_size: usize,
        field: &'static str,
    ) -> WireResult<usize> {
        let at = self.pos;
        self.read_nullable_array_len_v(flexible, min_elem_size, field)?
            .ok_or(WireError::UnexpectedNull { field, offset: at })
            .inspect_err(|_| self.pos = at)
    }

    /// Reads one tagged field (tag, size, payload).
    pub fn read_tagged_field(&mut self, field: &'static str) -> WireResult<TaggedField<'a>> {
        let start = self.pos;
        let tag = self.read_uvarint(field).inspect_err(|_| self.pos = start)?;
        let size_at = self.pos;
        let size = self.read_uvarint(field).inspect_err(|_| self.pos = start)?;
        let n = self
            .checked_len(size.into(), field, size_at)
            .inspect_err(|_| self.pos = start)?;
        let data_start = self.pos;
        let data = self.take(n, field)?;
        Ok(TaggedField {
            tag,
            data,
            start,
            end: self.pos,
            data_start,
        })
    }

    /// Reads and validates a whole tagged-field section, returning a view of
    /// it. Each field needs at least two bytes (tag and size), which bounds
    /// the count before any field is walked.
    pub fn read_tagged_fields(&mut self, field: &'static str) -> WireResult<TaggedSection<'a>> {
        let start = self.pos;
        let count = self.read_uvarint(field)?;
        if let Err(e) = self.checked_count(count.into(), 2, field, start) {
            self.pos = start;
            return Err(e);
        }
        let fields_start = self.pos;
        for _ in 0..count {
            if let Err(e) = self.read_tagged_field(field) {
                self.pos = start;
                return Err(e);
            }
        }
        Ok(TaggedSection {
            buf: self.buf,
            start,
            fields_start,
            end: self.pos,
            count,
        })
    }

    /// Skips a tagged-field section when `flexible`; does nothing otherwise.
    pub fn skip_tagged_fields_v(&mut self, flexible: bool, field: &'static str) -> WireResult<()> {
        if flexible {
            self.read_tagged_fields(field)?;
        }
        Ok(())
    }

    // -----------------------------------------------------------------------
    // Kafka's lenient varints (`ByteUtils.readVarint` / `readVarlong` /
    // `readUnsignedVarint`). The broker reads record fields and request
    // header tagged fields this way: at most 5 (int32) or 10 (int64) bytes,
    // and bits the last byte carries past the type's width are dropped, not
    // refused. The record walkers and the header parser must accept exactly
    // what the broker accepts, so they use these; message bodies use the
    // strict readers above.

    /// An unsigned LEB128 varint of at most `max_bytes` bytes, excess high
    /// bits dropped. Consumes nothing on error.
    fn read_raw_varint_lenient(
        &mut self,
        max_bytes: usize,
        field: &'static str,
    ) -> WireResult<u64> {
        let start = self.pos;
        let mut value: u64 = 0;
        for i in 0..max_bytes {
            let Some(&b) = self.buf.get(start + i) else {
                return Err(WireError::Truncated {
                    field,
                    offset: start,
                    needed: i + 1,
                    available: i,
                });
            };
            // Shifts stay below 64 (at most 7 * 9 = 63): no overflow.
            value |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                self.pos = start + i + 1;
                return Ok(value);
            }
        }
        Err(WireError::MalformedVarint {
            field,
            offset: start,
        })
    }

    /// Reads an unsigned varint as Kafka's `readUnsignedVarint` does (at most
    /// 5 bytes, bits past 32 dropped).
    pub fn read_uvarint_lenient(&mut self, field: &'static str) -> WireResult<u32> {
        Ok(self.read_raw_varint_lenient(5, field)? as u32)
    }

    /// Reads a zig-zag varint as Kafka's `readVarint` does (record fields).
    pub fn read_varint_lenient(&mut self, field: &'static str) -> WireResult<i32> {
        let raw = self.read_uvarint_lenient(field)?;
        Ok(((raw >> 1) as i32) ^ -((raw & 1) as i32))
    }

    /// Reads a zig-zag varlong as Kafka's `readVarlong` does (record fields).
    pub fn read_varlong_lenient(&mut self, field: &'static str) -> WireResult<i64> {
        let raw = self.read_raw_varint_lenient(10, field)?;
        Ok(((raw >> 1) as i64) ^ -((raw & 1) as i64))
    }

    /// Reads a record key, value or header field: a lenient zig-zag varint
    /// length, then that many bytes; any negative length is null (as Kafka's
    /// `DefaultRecord` reads it). Consumes nothing on error.
    pub fn read_varint_bytes(&mut self, field: &'static str) -> WireResult<Option<&'a [u8]>> {
        let at = self.pos;
        let len = self.read_varint_lenient(field)?;
        let Ok(n) = usize::try_from(len) else {
            return Ok(None);
        };
        self.take(n, field).map(Some).inspect_err(|_| self.pos = at)
    }

    /// Skips a tagged-field section read with lenient varints (request
    /// headers, control record values). Consumes nothing on error.
    pub fn skip_tagged_fields_lenient(&mut self, field: &'static str) -> WireResult<()> {
        let at = self.pos;
        let result = (|| {
            let count = self.read_uvarint_lenient(field)?;
            for _ in 0..count {
                self.read_uvarint_lenient(field)?;
                let size = self.read_uvarint_lenient(field)?;
                self.skip(size as usize, field)?;
            }
            Ok(())
        })();
        result.inspect_err(|_| self.pos = at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Writer;

    #[test]
    fn lenient_zigzag_round_trip() {
        for v in [0, 1, -1, 63, -64, 64, i32::MAX, i32::MIN] {
            let mut w = Writer::new(Vec::new());
            w.put_varint(v);
            let b = w.into_inner();
            let mut r = Reader::new(&b);
            assert_eq!(r.read_varint_lenient("v"), Ok(v));
            assert!(r.is_empty());
        }
        for v in [0i64, -1, i64::MAX, i64::MIN, 1 << 40] {
            let mut w = Writer::new(Vec::new());
            w.put_varlong(v);
            let b = w.into_inner();
            assert_eq!(Reader::new(&b).read_varlong_lenient("v"), Ok(v));
        }
        assert_eq!(Reader::new(&[0x01]).read_varint_lenient("v"), Ok(-1));
    }

    #[test]
    fn lenient_varints_drop_excess_bits_like_kafka() {
        // 5-byte encodings whose last byte carries bits past 32: Kafka's
        // ByteUtils keeps the low 32 bits; the strict reader refuses them.
        let overlong_zero = [0x80, 0x80, 0x80, 0x80, 0x10];
        assert_eq!(Reader::new(&overlong_zero).read_uvarint_lenient("v"), Ok(0));
        assert!(Reader::new(&overlong_zero).read_uvarint("v").is_err());
        assert_eq!(
            Reader::new(&[0xff, 0xff, 0xff, 0xff, 0x7f]).read_uvarint_lenient("v"),
            Ok(u32::MAX)
        );
        // Too long (a sixth byte) and truncated: errors that consume nothing.
        let mut r = Reader::new(&[0xff; 6]);
        assert!(matches!(
            r.read_varint_lenient("v"),
            Err(WireError::MalformedVarint { .. })
        ));
        assert_eq!(r.position(), 0);
        let mut r = Reader::new(&[0x80, 0x80]);
        assert!(matches!(
            r.read_varlong_lenient("v"),
            Err(WireError::Truncated { .. })
        ));
        assert_eq!(r.position(), 0);
    }

    #[test]
    fn varint_bytes_and_lenient_tagged_fields() {
        // length 2 ("ab"), then null (-1), then -5 (also null).
        let b = [0x04, b'a', b'b', 0x01, 0x09];
        let mut r = Reader::new(&b);
        assert_eq!(r.read_varint_bytes("k"), Ok(Some(&b"ab"[..])));
        assert_eq!(r.read_varint_bytes("k"), Ok(None));
        assert_eq!(r.read_varint_bytes("k"), Ok(None));
        assert!(r.is_empty());
        // A length past the end fails without consuming.
        let mut r = Reader::new(&[0x06, b'a']);
        assert!(r.read_varint_bytes("k").is_err());
        assert_eq!(r.position(), 0);

        let mut r = Reader::new(&[1, 0, 2, 9, 9, 7]);
        assert_eq!(r.skip_tagged_fields_lenient("t"), Ok(()));
        assert_eq!(r.position(), 5);
        let mut r = Reader::new(&[1, 0, 9, 9]);
        assert!(r.skip_tagged_fields_lenient("t").is_err());
        assert_eq!(r.position(), 0);
    }
}
