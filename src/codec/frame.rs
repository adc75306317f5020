//! Size-prefixed frame reader.
//!
//! A Kafka frame is an int32 size followed by that many bytes. The size is
//! checked against a configured maximum *before* any memory is reserved, and
//! the buffer grows only as bytes actually arrive, so a peer announcing a huge
//! frame and then stalling costs nothing. A TLS ClientHello (`0x16 0x03 ..`)
//! reads as a ~369 MB size on a plaintext port and is reported as such.

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Reads whole frames from a byte stream. Cancellation safe: partial frames
/// stay in the internal buffer across `select!` cancellations.
pub struct FrameReader<R> {
    inner: R,
    buf: BytesMut,
    max_frame: usize,
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The peer opened with a TLS record header on a plaintext port.
    #[error("peer sent a TLS handshake (bytes 16 03 ..) to a plaintext Kafka port")]
    TlsOnPlaintext,
    /// The announced size is negative: not a Kafka frame.
    #[error("frame size {0} is negative")]
    NegativeSize(i32),
    /// The announced size exceeds the configured maximum.
    #[error("frame size {size} exceeds the limit of {max} bytes")]
    TooLarge {
        /// Announced size.
        size: i64,
        /// Configured limit.
        max: usize,
    },
    /// The stream ended in the middle of a frame.
    #[error("connection closed after {got} of {expected} bytes of a frame")]
    Truncated {
        /// Bytes of the frame received (including the 4-byte size).
        got: usize,
        /// Bytes the frame should have had (including the size).
        expected: usize,
    },
    /// Transport error.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

impl FrameError {
    /// Stable label for the `kind` of `mirrorguard_frame_errors_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            FrameError::TlsOnPlaintext => "tls_on_plaintext",
            FrameError::NegativeSize(_) => "negative_size",
            FrameError::TooLarge { .. } => "too_large",
            FrameError::Truncated { .. } => "truncated",
            FrameError::Io(_) => "io",
        }
    }
}

/// Where the first frame in `buf` ends (its length including the 4-byte
/// size), `None` if more bytes are needed, or why `buf` does not start with
/// an acceptable frame. This is the whole decision the reader makes; it is
/// public so it can be fuzzed without an async stream.
pub fn frame_boundary(buf: &[u8], max_frame: usize) -> Result<Option<usize>, FrameError> {
    let Some(head) = buf.get(..4) else {
        // Even two bytes are enough to recognise a TLS record header.
        if buf.len() >= 2 && buf[0] == 0x16 && buf[1] == 0x03 {
            return Err(FrameError::TlsOnPlaintext);
        }
        return Ok(None);
    };
    if head[0] == 0x16 && head[1] == 0x03 {
        return Err(FrameError::TlsOnPlaintext);
    }
    let size = i32::from_be_bytes([head[0], head[1], head[2], head[3]]);
    if size < 0 {
        return Err(FrameError::NegativeSize(size));
    }
    if size as usize > max_frame {
        return Err(FrameError::TooLarge {
            size: size as i64,
            max: max_frame,
        });
    }
    let total = size as usize + 4;
    Ok((buf.len() >= total).then_some(total))
}

/// Initial buffer and the most we reserve before bytes arrive.
const READ_CHUNK: usize = 64 * 1024;

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// Wraps a stream; frames larger than `max_frame` bytes (after the size) are refused.
    pub fn new(inner: R, max_frame: usize) -> Self {
        Self {
            inner,
            buf: BytesMut::with_capacity(READ_CHUNK),
            max_frame,
        }
    }

    /// Returns the next frame *including* its 4-byte size prefix, so it can be
    /// forwarded as is, or `None` on a clean end of stream between frames.
    pub async fn next_frame(&mut self) -> Result<Option<BytesMut>, FrameError> {
        loop {
            if let Some(total) = self.complete_frame_len()? {
                return Ok(Some(self.buf.split_to(total)));
            }
            let want = self.wanted();
            if self.buf.capacity() - self.buf.len() < want {
                self.buf.reserve(want);
            }
            let n = self.inner.read_buf(&mut self.buf).await?;
            if n == 0 {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                let expected = self.announced().map(|s| s + 4).unwrap_or(4);
                return Err(FrameError::Truncated {
                    got: self.buf.len(),
                    expected,
                });
            }
        }
    }

    /// Like [`next_frame`](Self::next_frame) but frozen into `Bytes`.
    pub async fn next_frame_bytes(&mut self) -> Result<Option<Bytes>, FrameError> {
        Ok(self.next_frame().await?.map(BytesMut::freeze))
    }

    /// The announced body size of the frame at the head of the buffer, if the
    /// 4 size bytes are present. Validates it against the limit.
    fn announced(&self) -> Option<usize> {
        let head: [u8; 4] = self.buf.get(..4)?.try_into().ok()?;
        let size = i32::from_be_bytes(head);
        usize::try_from(size).ok()
    }

    fn complete_frame_len(&self) -> Result<Option<usize>, FrameError> {
        frame_boundary(&self.buf, self.max_frame)
    }

    /// How much spare capacity to make before the next read: the rest of the
    /// current frame, but never more than one chunk ahead of received bytes.
    fn wanted(&self) -> usize {
        let rest = match self.announced() {
            Some(size) => (size + 4).saturating_sub(self.buf.len()),
            None => READ_CHUNK,
        };
        rest.clamp(1, READ_CHUNK.max(self.buf.len()))
    }

    /// The underlying stream.
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn frames(input: &[u8], max: usize) -> (Vec<Vec<u8>>, Option<FrameError>) {
        let mut r = FrameReader::new(input, max);
        let mut out = Vec::new();
        loop {
            match r.next_frame().await {
                Ok(Some(f)) => out.push(f.to_vec()),
                Ok(None) => return (out, None),
                Err(e) => return (out, Some(e)),
            }
        }
    }

    #[tokio::test]
    async fn splits_frames_and_keeps_prefix() {
        let input = [0, 0, 0, 2, 7, 8, 0, 0, 0, 0, 0, 0, 0, 1, 9];
        let (f, e) = frames(&input, 100).await;
        assert!(e.is_none());
        assert_eq!(
            f,
            vec![
                vec![0, 0, 0, 2, 7, 8],
                vec![0, 0, 0, 0],
                vec![0, 0, 0, 1, 9]
            ]
        );
    }

    #[tokio::test]
    async fn tls_client_hello_is_recognised() {
        let (_, e) = frames(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01], 1 << 20).await;
        assert!(matches!(e, Some(FrameError::TlsOnPlaintext)));
    }

    #[tokio::test]
    async fn oversize_and_negative_are_refused() {
        let (_, e) = frames(&[0x00, 0x10, 0x00, 0x01], 1024).await;
        assert!(matches!(
            e,
            Some(FrameError::TooLarge { size: 1048577, .. })
        ));
        let (_, e) = frames(&[0xff, 0xff, 0xff, 0xfe], 1024).await;
        assert!(matches!(e, Some(FrameError::NegativeSize(-2))));
        assert_eq!(e.unwrap().kind(), "negative_size");
    }

    #[tokio::test]
    async fn truncated_frame_is_an_error() {
        let (f, e) = frames(&[0, 0, 0, 1, 5, 0, 0, 0, 9, 1, 2], 1024).await;
        assert_eq!(f.len(), 1);
        assert!(matches!(
            e,
            Some(FrameError::Truncated {
                got: 6,
                expected: 13
            })
        ));
    }

    #[tokio::test]
    async fn large_announced_frame_does_not_reserve_up_front() {
        // 50 MB announced, 10 bytes present: capacity stays near one chunk.
        let mut input = vec![0x02, 0xfa, 0xf0, 0x80];
        input.extend_from_slice(&[0; 10]);
        let mut r = FrameReader::new(&input[..], 100 << 20);
        assert!(r.next_frame().await.is_err());
        assert!(r.buf.capacity() <= 2 * READ_CHUNK, "{}", r.buf.capacity());
    }
}
