//! Request and response headers.
//!
//! Routing needs only the first eight bytes of a request (API key, version,
//! correlation id). The body offset is needed only for the few requests the
//! proxy looks into; it depends on the header version (v0: no client id,
//! v1: nullable client id, v2: client id plus a tagged-field section).

use crate::wire::Reader;

/// The fixed part of a request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    /// API key (Produce = 0, Fetch = 1, ...).
    pub api_key: i16,
    /// API version.
    pub api_version: i16,
    /// Correlation id the response will echo.
    pub correlation_id: i32,
}

/// A request header that cannot be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RequestHeaderError {
    /// Fewer bytes than the header needs.
    #[error("request header truncated at byte {0}")]
    Truncated(usize),
    /// A negative API key or version.
    #[error("invalid request header: api_key {api_key}, api_version {api_version}")]
    Invalid {
        /// Key read.
        api_key: i16,
        /// Version read.
        api_version: i16,
    },
}

impl RequestHeader {
    /// Parses the fixed header of a frame (`frame` includes the 4-byte size).
    pub fn parse(frame: &[u8]) -> Result<Self, RequestHeaderError> {
        let b = frame
            .get(4..12)
            .ok_or(RequestHeaderError::Truncated(frame.len()))?;
        let api_key = i16::from_be_bytes([b[0], b[1]]);
        let api_version = i16::from_be_bytes([b[2], b[3]]);
        let correlation_id = i32::from_be_bytes([b[4], b[5], b[6], b[7]]);
        if api_key < 0 || api_version < 0 {
            return Err(RequestHeaderError::Invalid {
                api_key,
                api_version,
            });
        }
        Ok(Self {
            api_key,
            api_version,
            correlation_id,
        })
    }
}

/// Offset of the request body in a frame (including the size prefix) for a
/// request header of version 1 or 2.
pub fn request_body_offset(frame: &[u8], header_version: i16) -> Result<usize, RequestHeaderError> {
    let mut pos = 12;
    if header_version >= 1 {
        let b = frame
            .get(pos..pos + 2)
            .ok_or(RequestHeaderError::Truncated(pos))?;
        let len = i16::from_be_bytes([b[0], b[1]]);
        pos += 2;
        if len > 0 {
            pos += len as usize;
        }
        if pos > frame.len() {
            return Err(RequestHeaderError::Truncated(frame.len()));
        }
    }
    if header_version >= 2 {
        pos = skip_tagged_fields(frame, pos).ok_or(RequestHeaderError::Truncated(pos))?;
    }
    Ok(pos)
}

/// Offset of the response body in a frame (including the size prefix):
/// header v0 is the correlation id, v1 adds a tagged-field section.
pub fn response_body_offset(frame: &[u8], header_version: i16) -> Option<usize> {
    if frame.len() < 8 {
        return None;
    }
    if header_version >= 1 {
        skip_tagged_fields(frame, 8)
    } else {
        Some(8)
    }
}

/// A whole response frame (size prefix included) for `correlation_id` with
/// the given response header version (v1 adds an empty tagged-field
/// section) around `body`.
pub fn response_frame(correlation_id: i32, header_version: i16, body: &[u8]) -> bytes::BytesMut {
    use bytes::BufMut;
    let header_len = if header_version >= 1 { 5 } else { 4 };
    let mut out = bytes::BytesMut::with_capacity(4 + header_len + body.len());
    out.put_i32((header_len + body.len()) as i32);
    out.put_i32(correlation_id);
    if header_version >= 1 {
        out.put_u8(0);
    }
    out.extend_from_slice(body);
    out
}

/// Correlation id of a response frame (including the size prefix).
pub fn response_correlation_id(frame: &[u8]) -> Option<i32> {
    let b = frame.get(4..8)?;
    Some(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

/// Skips a tagged-field section starting at `pos`; `None` if it overruns.
/// Varints are read as the broker reads header tagged fields (Kafka's
/// lenient `readUnsignedVarint`).
pub fn skip_tagged_fields(buf: &[u8], pos: usize) -> Option<usize> {
    if pos > buf.len() {
        return None;
    }
    let mut r = Reader::at(buf, pos);
    r.skip_tagged_fields_lenient("RequestHeader._tagged_fields")
        .ok()?;
    Some(r.position())
}

/// The `acks` of a Produce request: `Some(0)` means the broker sends no
/// response. `frame` includes the size prefix; `header_version` is 1 or 2.
pub fn produce_acks(frame: &[u8], api_version: i16, header_version: i16) -> Option<i16> {
    let mut pos = request_body_offset(frame, header_version).ok()?;
    if api_version >= 3 {
        // transactional_id: nullable string (compact from v9).
        if api_version >= 9 {
            let mut r = Reader::at(frame, pos);
            let len_plus_one = r
                .read_uvarint_lenient("ProduceRequest.transactional_id")
                .ok()?;
            pos = r.position() + (len_plus_one as usize).saturating_sub(1);
        } else {
            let b = frame.get(pos..pos + 2)?;
            let len = i16::from_be_bytes([b[0], b[1]]);
            pos += 2 + len.max(0) as usize;
        }
    }
    let b = frame.get(pos..pos + 2)?;
    Some(i16::from_be_bytes([b[0], b[1]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fixed_header() {
        let f = [0, 0, 0, 10, 0, 3, 0, 12, 0, 0, 0, 42, 0xff, 0xff];
        let h = RequestHeader::parse(&f).unwrap();
        assert_eq!((h.api_key, h.api_version, h.correlation_id), (3, 12, 42));
        assert_eq!(request_body_offset(&f, 1).unwrap(), 14);
        assert!(request_body_offset(&f, 2).is_err());
    }

    #[test]
    fn short_and_negative_headers_fail() {
        assert!(RequestHeader::parse(&[0, 0, 0, 2, 0, 1]).is_err());
        assert!(RequestHeader::parse(&[0, 0, 0, 8, 0xff, 0, 0, 1, 0, 0, 0, 1]).is_err());
    }

    #[test]
    fn produce_acks_v3_and_v9() {
        // v3, header v1, client id "c", transactional id null, acks 0
        let f = [
            0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 1, 0, 1, b'c', 0xff, 0xff, 0, 0,
        ];
        assert_eq!(produce_acks(&f, 3, 1), Some(0));
        // v9, header v2 (no tags), transactional id compact "t", acks -1
        let f = [
            0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 1, 0xff, 0xff, 0, 2, b't', 0xff, 0xff,
        ];
        assert_eq!(produce_acks(&f, 9, 2), Some(-1));
        // v2: acks first
        let f = [0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 1];
        assert_eq!(produce_acks(&f, 2, 1), Some(1));
    }

    #[test]
    fn tagged_fields_are_bounded() {
        assert_eq!(skip_tagged_fields(&[0], 0), Some(1));
        assert_eq!(skip_tagged_fields(&[1, 0, 2, 9, 9], 0), Some(5));
        assert_eq!(skip_tagged_fields(&[1, 0, 9, 9], 0), None);
        // An over-long count of 0 is read as the broker reads it.
        assert_eq!(
            skip_tagged_fields(&[0x80, 0x80, 0x80, 0x80, 0x10], 0),
            Some(5)
        );
        assert_eq!(skip_tagged_fields(&[0], 2), None);
        assert_eq!(
            skip_tagged_fields(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff], 0),
            None
        );
    }
}
