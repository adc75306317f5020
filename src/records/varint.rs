//! Bounds-checked cursor over record bytes: zigzag varints (Kafka's
//! `ByteUtils`, at most 5 bytes for int32 and 10 for int64) and the unsigned
//! varints of flexible message versions.

/// Reads from a byte slice; every method returns `None` rather than reading
/// past the end.
#[derive(Debug, Clone)]
pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Cursor { buf, pos: 0 }
    }

    pub(crate) fn position(&self) -> usize {
        self.pos
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    pub(crate) fn u8(&mut self) -> Option<u8> {
        let b = *self.buf.get(self.pos)?;
        self.pos += 1;
        Some(b)
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }

    pub(crate) fn i16(&mut self) -> Option<i16> {
        Some(i16::from_be_bytes(self.bytes(2)?.try_into().ok()?))
    }

    pub(crate) fn i32(&mut self) -> Option<i32> {
        Some(i32::from_be_bytes(self.bytes(4)?.try_into().ok()?))
    }

    pub(crate) fn i64(&mut self) -> Option<i64> {
        Some(i64::from_be_bytes(self.bytes(8)?.try_into().ok()?))
    }

    /// Unsigned LEB128 varint, at most `max_bytes` long.
    fn raw_varint(&mut self, max_bytes: u32) -> Option<u64> {
        let mut value: u64 = 0;
        for i in 0..max_bytes {
            let b = self.u8()?;
            value |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Some(value);
            }
        }
        None // too long: Kafka's "Varint is too long"
    }

    /// Zigzag int32 varint.
    pub(crate) fn varint(&mut self) -> Option<i32> {
        // Like Kafka's ByteUtils.readVarint, bits shifted past 32 by the 5th
        // byte are dropped rather than refused.
        let raw = self.raw_varint(5)? as u32;
        Some(((raw >> 1) as i32) ^ -((raw & 1) as i32))
    }

    /// Zigzag int64 varlong.
    pub(crate) fn varlong(&mut self) -> Option<i64> {
        let raw = self.raw_varint(10)?;
        Some(((raw >> 1) as i64) ^ -((raw & 1) as i64))
    }

    /// Unsigned varint as used by flexible versions (compact lengths, tags).
    pub(crate) fn uvarint(&mut self) -> Option<u32> {
        // Same truncation as Kafka's readUnsignedVarint.
        Some(self.raw_varint(5)? as u32)
    }

    /// A varint-length-prefixed byte field; negative length = null.
    pub(crate) fn varint_bytes(&mut self) -> Option<Option<&'a [u8]>> {
        let len = self.varint()?;
        match usize::try_from(len) {
            Ok(n) => Some(Some(self.bytes(n)?)),
            Err(_) => Some(None),
        }
    }

    /// Skips a flexible tagged-field section.
    pub(crate) fn skip_tagged_fields(&mut self) -> Option<()> {
        let n = self.uvarint()?;
        for _ in 0..n {
            let _tag = self.uvarint()?;
            let size = self.uvarint()?;
            self.bytes(usize::try_from(size).ok()?)?;
        }
        Some(())
    }
}

/// Appends a zigzag varint.
pub(crate) fn put_varint(out: &mut Vec<u8>, v: i32) {
    put_uvarint(out, ((v << 1) ^ (v >> 31)) as u32 as u64);
}

/// Appends a zigzag varlong.
pub(crate) fn put_varlong(out: &mut Vec<u8>, v: i64) {
    put_uvarint(out, ((v << 1) ^ (v >> 63)) as u64);
}

/// Appends an unsigned LEB128 varint.
pub(crate) fn put_uvarint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zigzag_round_trip() {
        for v in [0, 1, -1, 63, -64, 64, i32::MAX, i32::MIN] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(Cursor::new(&out).varint(), Some(v));
        }
        for v in [0i64, -1, i64::MAX, i64::MIN, 1 << 40] {
            let mut out = Vec::new();
            put_varlong(&mut out, v);
            assert_eq!(Cursor::new(&out).varlong(), Some(v));
        }
        assert_eq!(Cursor::new(&[0x01]).varint(), Some(-1));
        assert_eq!(Cursor::new(&[0xff; 6]).varint(), None);
    }
}
