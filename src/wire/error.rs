//! Typed errors for the bounds-checked Kafka wire primitives.
//!
//! Every error names the field being read and the byte offset where the read
//! started, so a log line about a hostile or truncated frame says exactly which
//! structure was malformed without dumping the frame itself.

use thiserror::Error;

/// An error raised while reading or writing Kafka protocol primitives.
///
/// `field` is a static, human-readable path such as
/// `"MetadataResponse.brokers.host"`; `offset` is the byte offset (within the
/// buffer given to the [`Reader`](super::Reader)) at which the failing read
/// started.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    /// Fewer bytes are present than the field needs.
    #[error("truncated {field} at offset {offset}: needs {needed} bytes, {available} available")]
    Truncated {
        /// Field being read.
        field: &'static str,
        /// Offset where the read started.
        offset: usize,
        /// Bytes the field needs.
        needed: usize,
        /// Bytes actually present from `offset`.
        available: usize,
    },
    /// A declared length or element count is negative (other than the null
    /// marker) or cannot possibly fit in the bytes present.
    #[error("invalid length {len} for {field} at offset {offset} ({available} bytes available)")]
    InvalidLength {
        /// Field being read.
        field: &'static str,
        /// Offset where the length prefix started.
        offset: usize,
        /// The declared length or count as read from the wire.
        len: i64,
        /// Bytes present after the length prefix.
        available: usize,
    },
    /// A varint ran past its maximum encoded width.
    #[error("malformed varint for {field} at offset {offset}")]
    MalformedVarint {
        /// Field being read.
        field: &'static str,
        /// Offset where the varint started.
        offset: usize,
    },
    /// A string field is not valid UTF-8.
    #[error("invalid UTF-8 in {field} at offset {offset}")]
    InvalidUtf8 {
        /// Field being read.
        field: &'static str,
        /// Offset where the string bytes start.
        offset: usize,
    },
    /// A non-nullable field was encoded as null.
    #[error("unexpected null for non-nullable {field} at offset {offset}")]
    UnexpectedNull {
        /// Field being read.
        field: &'static str,
        /// Offset where the length prefix started.
        offset: usize,
    },
    /// The message version is outside what this parser understands.
    #[error("unsupported version {version} of {api}")]
    UnsupportedVersion {
        /// Message name.
        api: &'static str,
        /// Requested version.
        version: i16,
    },
    /// A value cannot be encoded (for example a string longer than the
    /// 32767 bytes a classic Kafka string can hold).
    #[error("value of {field} cannot be encoded: {reason}")]
    Unencodable {
        /// Field being written.
        field: &'static str,
        /// Why it cannot be encoded.
        reason: &'static str,
    },
}

/// Result alias for wire operations.
pub type WireResult<T> = Result<T, WireError>;
