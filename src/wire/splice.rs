//! Copy-on-write splicing of a byte buffer.
//!
//! Response rewriters walk a message and replace a few ranges (a broker's
//! host and port, a length prefix); everything else must reach the client
//! byte for byte. [`Splicer`] records replacements in increasing offset order
//! and only allocates the output on the first real replacement, so a message
//! that needs no change costs no copy at all.

use super::error::{WireError, WireResult};

/// Builds a copy of `src` with some ranges replaced.
#[derive(Debug)]
pub struct Splicer<'a> {
    src: &'a [u8],
    out: Option<Vec<u8>>,
    copied_upto: usize,
}

impl<'a> Splicer<'a> {
    /// A splicer over `src` with no replacement yet.
    pub fn new(src: &'a [u8]) -> Self {
        Splicer {
            src,
            out: None,
            copied_upto: 0,
        }
    }

    /// True once at least one replacement was made.
    pub fn changed(&self) -> bool {
        self.out.is_some()
    }

    /// Replaces `src[start..end]` with `with`. Replacements must be made in
    /// increasing, non-overlapping order.
    pub fn replace(&mut self, start: usize, end: usize, with: &[u8]) -> WireResult<()> {
        if start < self.copied_upto || end < start || end > self.src.len() {
            return Err(WireError::Unencodable {
                field: "splice",
                reason: "replacement ranges out of order or out of bounds",
            });
        }
        let src = self.src;
        let out = self.out.get_or_insert_with(|| {
            // The output is the input plus a few rewritten addresses; a small
            // headroom avoids one reallocation in the common case.
            Vec::with_capacity(src.len() + 256)
        });
        out.extend_from_slice(&src[self.copied_upto..start]);
        out.extend_from_slice(with);
        self.copied_upto = end;
        Ok(())
    }

    /// The spliced output, or `None` when nothing was replaced.
    pub fn finish(self) -> Option<Vec<u8>> {
        let mut out = self.out?;
        out.extend_from_slice(self.src.get(self.copied_upto..).unwrap_or_default());
        Some(out)
    }
}
