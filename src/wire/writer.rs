//! Writer for Kafka protocol primitives onto any [`BufMut`] (`Vec<u8>`,
//! `BytesMut`, or a `&mut` of either).
//!
//! The counterpart of [`Reader`](super::Reader): handlers use it to emit the
//! few structures they rewrite, while every other byte is copied verbatim.
//! Lengths that cannot be represented are refused with
//! [`WireError::Unencodable`] rather than silently truncated.

use bytes::BufMut;

use super::error::{WireError, WireResult};

/// Appends Kafka primitives to a buffer.
#[derive(Debug)]
pub struct Writer<B: BufMut> {
    buf: B,
}

impl<B: BufMut> Writer<B> {
    /// Wraps `buf`; writes are appended after its current contents.
    pub fn new(buf: B) -> Self {
        Writer { buf }
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> B {
        self.buf
    }

    /// Mutable access to the underlying buffer.
    pub fn buf_mut(&mut self) -> &mut B {
        &mut self.buf
    }

    /// Appends raw bytes verbatim.
    pub fn put_raw(&mut self, b: &[u8]) {
        self.buf.put_slice(b);
    }

    /// Writes an INT8.
    pub fn put_i8(&mut self, v: i8) {
        self.buf.put_i8(v);
    }
    /// Writes a big-endian INT16.
    pub fn put_i16(&mut self, v: i16) {
        self.buf.put_i16(v);
    }
    /// Writes a big-endian INT32.
    pub fn put_i32(&mut self, v: i32) {
        self.buf.put_i32(v);
    }
    /// Writes a big-endian INT64.
    pub fn put_i64(&mut self, v: i64) {
        self.buf.put_i64(v);
    }
    /// Writes a big-endian UINT32.
    pub fn put_u32(&mut self, v: u32) {
        self.buf.put_u32(v);
    }
    /// Writes a big-endian FLOAT64.
    pub fn put_f64(&mut self, v: f64) {
        self.buf.put_f64(v);
    }
    /// Writes a BOOLEAN as 0 or 1.
    pub fn put_bool(&mut self, v: bool) {
        self.buf.put_u8(u8::from(v));
    }
    /// Writes a 16-byte UUID.
    pub fn put_uuid(&mut self, v: &[u8; 16]) {
        self.buf.put_slice(v);
    }

    /// Writes an UNSIGNED_VARINT.
    pub fn put_uvarint(&mut self, mut v: u32) {
        while v >= 0x80 {
            self.buf.put_u8((v as u8 & 0x7f) | 0x80);
            v >>= 7;
        }
        self.buf.put_u8(v as u8);
    }

    /// Writes an unsigned varlong.
    pub fn put_uvarlong(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.buf.put_u8((v as u8 & 0x7f) | 0x80);
            v >>= 7;
        }
        self.buf.put_u8(v as u8);
    }

    /// Writes a zig-zag VARINT.
    pub fn put_varint(&mut self, v: i32) {
        self.put_uvarint(((v << 1) ^ (v >> 31)) as u32);
    }

    /// Writes a zig-zag VARLONG.
    pub fn put_varlong(&mut self, v: i64) {
        self.put_uvarlong(((v << 1) ^ (v >> 63)) as u64);
    }

    /// Writes a compact length prefix (`len + 1`, 0 for null).
    fn put_compact_len(&mut self, len: Option<usize>, field: &'static str) -> WireResult<()> {
        match len {
            None => self.put_uvarint(0),
            Some(n) => {
                let n1 = u32::try_from(n).ok().and_then(|n| n.checked_add(1)).ok_or(
                    WireError::Unencodable {
                        field,
                        reason: "length does not fit an unsigned varint",
                    },
                )?;
                self.put_uvarint(n1);
            }
        }
        Ok(())
    }

    /// Writes a NULLABLE_STRING (INT16 length, -1 = null).
    pub fn put_nullable_string(&mut self, s: Option<&str>, field: &'static str) -> WireResult<()> {
        match s {
            None => self.put_i16(-1),
            Some(s) => {
                let n = i16::try_from(s.len()).map_err(|_| WireError::Unencodable {
                    field,
                    reason: "string longer than 32767 bytes",
                })?;
                self.put_i16(n);
                self.put_raw(s.as_bytes());
            }
        }
        Ok(())
    }

    /// Writes a STRING.
    pub fn put_string(&mut self, s: &str, field: &'static str) -> WireResult<()> {
        self.put_nullable_string(Some(s), field)
    }

    /// Writes a COMPACT_NULLABLE_STRING.
    pub fn put_compact_nullable_string(
        &mut self,
        s: Option<&str>,
        field: &'static str,
    ) -> WireResult<()> {
        // Kafka's readers refuse strings longer than i16::MAX even in compact
        // form, so refuse to produce one.
        if let Some(s) = s {
            if s.len() > i16::MAX as usize {
                return Err(WireError::Unencodable {
                    field,
                    reason: "string longer than 32767 bytes",
                });
            }
        }
        self.put_compact_len(s.map(str::len), field)?;
        if let Some(s) = s {
            self.put_raw(s.as_bytes());
        }
        Ok(())
    }

    /// Writes a COMPACT_STRING.
    pub fn put_compact_string(&mut self, s: &str, field: &'static str) -> WireResult<()> {
        self.put_compact_nullable_string(Some(s), field)
    }

    /// Writes a string in the encoding of the message's version.
    pub fn put_string_v(&mut self, flexible: bool, s: &str, field: &'static str) -> WireResult<()> {
        if flexible {
            self.put_compact_string(s, field)
        } else {
            self.put_string(s, field)
        }
    }

    /// Writes a nullable string in the encoding of the message's version.
    pub fn put_nullable_string_v(
        &mut self,
        flexible: bool,
        s: Option<&str>,
        field: &'static str,
    ) -> WireResult<()> {
        if flexible {
            self.put_compact_nullable_string(s, field)
        } else {
            self.put_nullable_string(s, field)
        }
    }

    /// Writes NULLABLE_BYTES (INT32 length, -1 = null).
    pub fn put_nullable_bytes(&mut self, b: Option<&[u8]>, field: &'static str) -> WireResult<()> {
        match b {
            None => self.put_i32(-1),
            Some(b) => {
                let n = i32::try_from(b.len()).map_err(|_| WireError::Unencodable {
                    field,
                    reason: "bytes longer than i32::MAX",
                })?;
                self.put_i32(n);
                self.put_raw(b);
            }
        }
        Ok(())
    }

    /// Writes BYTES.
    pub fn put_bytes(&mut self, b: &[u8], field: &'static str) -> WireResult<()> {
        self.put_nullable_bytes(Some(b), field)
    }

    /// Writes COMPACT_NULLABLE_BYTES.
    pub fn put_compact_nullable_bytes(
        &mut self,
        b: Option<&[u8]>,
        field: &'static str,
    ) -> WireResult<()> {
        self.put_compact_len(b.map(<[u8]>::len), field)?;
        if let Some(b) = b {
            self.put_raw(b);
        }
        Ok(())
    }

    /// Writes COMPACT_BYTES.
    pub fn put_compact_bytes(&mut self, b: &[u8], field: &'static str) -> WireResult<()> {
        self.put_compact_nullable_bytes(Some(b), field)
    }

    /// Writes a classic ARRAY length (INT32, -1 = null).
    pub fn put_array_len(&mut self, n: Option<usize>, field: &'static str) -> WireResult<()> {
        match n {
            None => self.put_i32(-1),
            Some(n) => {
                let n = i32::try_from(n).map_err(|_| WireError::Unencodable {
                    field,
                    reason: "array longer than i32::MAX",
                })?;
                self.put_i32(n);
            }
        }
        Ok(())
    }

    /// Writes a COMPACT_ARRAY length (`count + 1`, 0 = null).
    pub fn put_compact_array_len(
        &mut self,
        n: Option<usize>,
        field: &'static str,
    ) -> WireResult<()> {
        self.put_compact_len(n, field)
    }

    /// Writes an array length in the encoding of the message's version.
    pub fn put_array_len_v(
        &mut self,
        flexible: bool,
        n: Option<usize>,
        field: &'static str,
    ) -> WireResult<()> {
        if flexible {
            self.put_compact_array_len(n, field)
        } else {
            self.put_array_len(n, field)
        }
    }

    /// Writes one tagged field: tag, payload size, payload.
    pub fn put_tagged_field(
        &mut self,
        tag: u32,
        data: &[u8],
        field: &'static str,
    ) -> WireResult<()> {
        let n = u32::try_from(data.len()).map_err(|_| WireError::Unencodable {
            field,
            reason: "tagged field larger than u32::MAX",
        })?;
        self.put_uvarint(tag);
        self.put_uvarint(n);
        self.put_raw(data);
        Ok(())
    }

    /// Writes a whole tagged-field section from `(tag, payload)` pairs, which
    /// must already be in ascending tag order.
    pub fn put_tagged_fields(
        &mut self,
        fields: &[(u32, &[u8])],
        field: &'static str,
    ) -> WireResult<()> {
        let n = u32::try_from(fields.len()).map_err(|_| WireError::Unencodable {
            field,
            reason: "too many tagged fields",
        })?;
        self.put_uvarint(n);
        for (tag, data) in fields {
            self.put_tagged_field(*tag, data, field)?;
        }
        Ok(())
    }
}
