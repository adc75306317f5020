//! Bounds-checked, zero-copy primitives for the Kafka wire protocol.
//!
//! Why not a generated codec: `kafka-protocol` 0.18 reserves memory from
//! unchecked wire lengths and can abort the process on a few hostile bytes.
//! The proxy therefore parses only what it must with these primitives:
//! every read is checked against the bytes present, errors are typed and name
//! the field, strings and bytes are borrowed from the input, and no length or
//! count read from the wire ever drives an allocation.
//!
//! - [`Reader`]: cursor over `&[u8]` reading INT8..INT64, UUID, (unsigned)
//!   varints, classic and compact strings/bytes/array lengths, and
//!   tagged-field sections; also record fields and request-header tagged
//!   fields with Kafka's lenient `ByteUtils` varints (`read_*_lenient`). It
//!   is the crate's one field-by-field reader (fixed-offset fields such as
//!   batch headers are read in place by `records`).
//! - [`Writer`]: the same types onto any `bytes::BufMut`.
//! - [`Splicer`]: builds an output that is the input with a few byte ranges
//!   replaced, copying everything else verbatim, and allocating only once a
//!   replacement actually happens.

mod error;
mod reader;
mod splice;
mod writer;

pub use error::{WireError, WireResult};
pub use reader::{Reader, TaggedField, TaggedFieldIter, TaggedSection};
pub use splice::Splicer;
pub use writer::Writer;
