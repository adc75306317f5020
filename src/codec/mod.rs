//! Frame codec: Kafka's size-prefixed frames and the request/response headers.
//!
//! Everything the proxy routes on is here: a frame reader generic over any
//! byte stream (TLS comes later, so nothing assumes a `TcpStream`), the
//! request-header fields needed for correlation, and the API-key name table
//! used for logs and metric labels.

pub mod api;
pub mod frame;
pub mod header;

pub use frame::{CopyError, FrameError, FrameReader};
pub use header::{RequestHeader, RequestHeaderError};
