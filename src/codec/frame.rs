//! Size-prefixed frame reader.
//!
//! A Kafka frame is an int32 size followed by that many bytes. The size is
//! checked against a configured maximum *before* any memory is reserved, and
//! the buffer grows only as bytes actually arrive, so a peer announcing a huge
//! frame and then stalling costs nothing. A TLS ClientHello (`0x16 0x03 ..`)
//! reads as a ~369 MB size on a plaintext port and is reported as such.
//!
//! Frames can also be taken in pieces, for cut-through relaying:
//! [`FrameReader::peek`] buffers the head of the next frame (enough to route
//! it) and [`FrameReader::copy_frame`] writes the frame to a sink in chunks
//! of at most [`READ_CHUNK`] bytes as they arrive, so a relayed frame costs
//! one chunk of memory whatever its size.

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

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

/// Why [`FrameReader::copy_frame`] stopped before the end of the frame.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// Reading the frame failed (the source closed mid-frame: `Truncated`).
    #[error("reading: {0}")]
    Read(FrameError),
    /// Writing it failed or missed its deadline; when the copy was asked to
    /// drain, the rest of the frame was read and discarded first.
    #[error("writing: {0}")]
    Write(std::io::Error),
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

/// The most we reserve before bytes arrive, and the largest piece
/// [`FrameReader::copy_frame`] holds. 256 KiB: with 64 KiB pieces a relay
/// made four times the syscalls and carried about a fifth less
/// (BENCHMARKS.md, "Relay floor and read size").
pub const READ_CHUNK: usize = 256 * 1024;

/// A new reader's buffer: enough for the frames of an ordinary request or
/// response; it grows towards [`READ_CHUNK`] only on a connection that
/// carries large frames, so idle connections stay small.
const INITIAL_BUFFER: usize = 16 * 1024;

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// Wraps a stream; frames larger than `max_frame` bytes (after the size) are refused.
    pub fn new(inner: R, max_frame: usize) -> Self {
        Self {
            inner,
            buf: BytesMut::with_capacity(INITIAL_BUFFER),
            max_frame,
        }
    }

    /// Wraps a stream whose first bytes were already read into `buf` (they
    /// come first).
    pub fn with_buffer(inner: R, max_frame: usize, mut buf: BytesMut) -> Self {
        if buf.capacity() < INITIAL_BUFFER {
            buf.reserve(INITIAL_BUFFER - buf.len());
        }
        Self {
            inner,
            buf,
            max_frame,
        }
    }

    /// The stream and the bytes read from it but not consumed yet.
    pub fn into_parts(self) -> (R, BytesMut) {
        (self.inner, self.buf)
    }

    /// Returns the next frame *including* its 4-byte size prefix, so it can be
    /// forwarded as is, or `None` on a clean end of stream between frames.
    pub async fn next_frame(&mut self) -> Result<Option<BytesMut>, FrameError> {
        loop {
            if let Some(total) = self.complete_frame_len()? {
                return Ok(Some(self.buf.split_to(total)));
            }
            if !self.fill().await? {
                return Ok(None);
            }
        }
    }

    /// Like [`next_frame`](Self::next_frame) but frozen into `Bytes`.
    pub async fn next_frame_bytes(&mut self) -> Result<Option<Bytes>, FrameError> {
        Ok(self.next_frame().await?.map(BytesMut::freeze))
    }

    /// Reads more into the buffer (never more than one chunk ahead of the
    /// current frame, see [`wanted`](Self::wanted)). `Ok(false)`: a clean
    /// end of stream between frames; an end inside a frame is `Truncated`.
    /// Cancellation safe (one `read_buf`).
    async fn fill(&mut self) -> Result<bool, FrameError> {
        let want = self.wanted();
        if self.buf.capacity() - self.buf.len() < want {
            self.buf.reserve(want);
        }
        if self.inner.read_buf(&mut self.buf).await? > 0 {
            return Ok(true);
        }
        if self.buf.is_empty() {
            return Ok(false);
        }
        let expected = self.announced().map(|s| s + 4).unwrap_or(4);
        Err(FrameError::Truncated {
            got: self.buf.len(),
            expected,
        })
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
    /// current frame, but never more than one chunk ahead of received bytes;
    /// a frame whose size is not read yet gets [`INITIAL_BUFFER`], so a
    /// connection of small frames never reserves a chunk.
    fn wanted(&self) -> usize {
        let rest = match self.announced() {
            Some(size) => (size + 4).saturating_sub(self.buf.len()),
            None => INITIAL_BUFFER,
        };
        rest.clamp(1, READ_CHUNK.max(self.buf.len()))
    }

    /// Buffers the head of the next frame: at least `want` bytes of it
    /// (size prefix included), or all of it if it is shorter. Returns the
    /// frame's total length (size prefix included), or `None` on a clean
    /// end of stream between frames. The size is checked against the limit
    /// first, as by [`next_frame`](Self::next_frame); the frame stays
    /// unconsumed ([`head`](Self::head) shows it; take it whole with
    /// `next_frame` or piecewise with [`copy_frame`](Self::copy_frame)).
    /// Cancellation safe.
    pub async fn peek(&mut self, want: usize) -> Result<Option<usize>, FrameError> {
        loop {
            frame_boundary(&self.buf, self.max_frame)?;
            if let Some(size) = self.announced() {
                let total = size + 4;
                if self.buf.len() >= total.min(want.max(4)) {
                    return Ok(Some(total));
                }
            }
            if !self.fill().await? {
                return Ok(None);
            }
        }
    }

    /// The buffered bytes of the next frame of length `total` (as returned
    /// by [`peek`](Self::peek)): its head, possibly all of it.
    pub fn head(&self, total: usize) -> &[u8] {
        &self.buf[..self.buf.len().min(total)]
    }

    /// Writes the next frame, `total` bytes long (as returned by
    /// [`peek`](Self::peek)), to `out` in pieces of at most [`READ_CHUNK`]
    /// bytes as they arrive, never holding more than one piece. Each write
    /// must finish by `deadline`, if given. When a write fails and `drain`
    /// is set, the rest of the frame is still read and discarded, so the
    /// stream stays at a frame boundary. Returns the bytes written.
    pub async fn copy_frame<W: AsyncWrite + Unpin>(
        &mut self,
        total: usize,
        out: &mut W,
        deadline: Option<Instant>,
        drain: bool,
    ) -> Result<usize, CopyError> {
        let mut left = total;
        let mut failed: Option<std::io::Error> = None;
        loop {
            let n = left.min(self.buf.len());
            if n > 0 {
                let piece = self.buf.split_to(n);
                left -= n;
                if failed.is_none() {
                    let write = out.write_all(&piece);
                    let res = match deadline {
                        Some(d) => tokio::time::timeout_at(d.into(), write)
                            .await
                            .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into())),
                        None => write.await,
                    };
                    if let Err(e) = res {
                        if !drain {
                            return Err(CopyError::Write(e));
                        }
                        failed = Some(e);
                    }
                }
            }
            if left == 0 {
                return match failed {
                    Some(e) => Err(CopyError::Write(e)),
                    None => Ok(total),
                };
            }
            let want = left.min(READ_CHUNK);
            if self.buf.capacity() - self.buf.len() < want {
                self.buf.reserve(want);
            }
            let got = self
                .inner
                .read_buf(&mut self.buf)
                .await
                .map_err(|e| CopyError::Read(FrameError::Io(e)))?;
            if got == 0 {
                return Err(CopyError::Read(FrameError::Truncated {
                    got: total - left + self.buf.len(),
                    expected: total,
                }));
            }
        }
    }

    /// Takes the next piece of the frame being read piecewise: at most
    /// `max` bytes, whatever is buffered, else what one read brings (at
    /// most [`READ_CHUNK`]). The caller counts how much of the frame is
    /// left and never asks past it. A stream that ends is `Truncated`
    /// (`got`/`expected` count this piece only).
    pub async fn read_piece(&mut self, max: usize) -> Result<BytesMut, FrameError> {
        if self.buf.is_empty() && max > 0 {
            let want = max.min(READ_CHUNK);
            if self.buf.capacity() < want {
                self.buf.reserve(want);
            }
            if self.inner.read_buf(&mut self.buf).await? == 0 {
                return Err(FrameError::Truncated {
                    got: 0,
                    expected: max,
                });
            }
        }
        let n = max.min(self.buf.len());
        Ok(self.buf.split_to(n))
    }

    /// Reads the next frame, `total` bytes long, and discards it.
    pub async fn skip_frame(&mut self, total: usize) -> Result<(), FrameError> {
        match self
            .copy_frame(total, &mut tokio::io::sink(), None, false)
            .await
        {
            Ok(_) => Ok(()),
            Err(CopyError::Read(e)) => Err(e),
            Err(CopyError::Write(e)) => Err(FrameError::Io(e)),
        }
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

    /// A connection of small frames keeps the small initial buffer: only a
    /// frame larger than it makes the reader reserve more.
    #[tokio::test]
    async fn small_frames_keep_the_initial_buffer() {
        let mut input = Vec::new();
        for i in 0..2000u32 {
            let body = vec![7u8; (i % 300) as usize];
            input.extend_from_slice(&(body.len() as i32).to_be_bytes());
            input.extend_from_slice(&body);
        }
        let mut r = FrameReader::new(&input[..], 1 << 20);
        let mut n = 0;
        while let Some(f) = r.next_frame().await.unwrap() {
            drop(f);
            n += 1;
            assert!(r.buf.capacity() <= INITIAL_BUFFER, "{}", r.buf.capacity());
        }
        assert_eq!(n, 2000);
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

    /// A frame copied cut-through leaves its bytes unchanged, never makes
    /// the reader hold more than a chunk or two, and leaves the next frame
    /// in place.
    #[tokio::test]
    async fn copy_frame_streams_in_bounded_pieces() {
        let body: Vec<u8> = (0..5_000_000u32).map(|i| i as u8).collect();
        let mut input = (body.len() as i32).to_be_bytes().to_vec();
        input.extend_from_slice(&body);
        input.extend_from_slice(&[0, 0, 0, 1, 42]);
        let (mut tx, rx) = tokio::io::duplex(4096);
        let feed = input.clone();
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            tx.write_all(&feed).await.unwrap();
        });
        let mut r = FrameReader::new(rx, 10 << 20);
        let total = r.peek(8).await.unwrap().unwrap();
        assert_eq!(total, body.len() + 4);
        assert!(r.head(total).len() < total);
        let mut out = Vec::new();
        let n = r.copy_frame(total, &mut out, None, false).await.unwrap();
        assert_eq!(n, total);
        assert_eq!(out, input[..total]);
        assert!(r.buf.capacity() <= 2 * READ_CHUNK, "{}", r.buf.capacity());
        let next = r.next_frame().await.unwrap().unwrap();
        assert_eq!(&next[..], &[0, 0, 0, 1, 42]);
    }

    /// A source that ends mid-frame is `Truncated`, with the bytes seen.
    #[tokio::test]
    async fn copy_frame_reports_truncation() {
        let input = [0u8, 0, 0, 10, 1, 2, 3];
        let mut r = FrameReader::new(&input[..], 100);
        let total = r.peek(4).await.unwrap().unwrap();
        let mut out = Vec::new();
        let e = r
            .copy_frame(total, &mut out, None, false)
            .await
            .unwrap_err();
        assert!(matches!(
            e,
            CopyError::Read(FrameError::Truncated {
                got: 7,
                expected: 14
            })
        ));
        assert_eq!(out, input);
    }

    /// An in-memory stream handing out at most the next of `sizes` bytes per read.
    struct Pieces {
        data: Vec<u8>,
        sizes: Vec<usize>,
        n: usize,
    }

    impl AsyncRead for Pieces {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _cx: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            let piece = self.sizes[self.n % self.sizes.len()];
            self.n += 1;
            let k = piece.min(self.data.len()).min(buf.remaining());
            let rest = self.data.split_off(k);
            buf.put_slice(&self.data);
            self.data = rest;
            std::task::Poll::Ready(Ok(()))
        }
    }

    /// A stream of frames (some too long, some cut short) read in pieces
    /// of random sizes.
    fn stream_of_frames() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        proptest::collection::vec(
            (
                0usize..300,
                any::<u8>(),
                prop_oneof![8 => Just(0usize), 1 => 1usize..50],
            ),
            0..6,
        )
        .prop_map(|frames| {
            let mut out = Vec::new();
            for (len, fill, cut) in frames {
                let mut f = (len as i32).to_be_bytes().to_vec();
                f.extend(std::iter::repeat_n(fill, len));
                f.truncate(f.len().saturating_sub(cut).max(1));
                out.extend_from_slice(&f);
                if cut > 0 {
                    break;
                }
            }
            out
        })
    }

    proptest::proptest! {
        /// Peek + copy yields the frames `next_frame` yields, and the same
        /// error kind at the same place (also the `frame_stream` fuzz target).
        #[test]
        fn streamed_frames_match_whole_frames(
            data in stream_of_frames(),
            sizes in proptest::collection::vec(1usize..40, 1..5),
            want in 4usize..64,
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            rt.block_on(async {
                let max = 250;
                let mut whole = FrameReader::new(Pieces { data: data.clone(), sizes: sizes.clone(), n: 0 }, max);
                let mut stream = FrameReader::new(Pieces { data, sizes, n: 0 }, max);
                loop {
                    let a = whole.next_frame().await;
                    let b = match stream.peek(want).await {
                        Ok(Some(total)) => {
                            let mut out = Vec::new();
                            match stream.copy_frame(total, &mut out, None, false).await {
                                Ok(_) => Ok(Some(out)),
                                Err(CopyError::Read(e)) => Err(e),
                                Err(CopyError::Write(e)) => panic!("{e}"),
                            }
                        }
                        Ok(None) => Ok(None),
                        Err(e) => Err(e),
                    };
                    match (a, b) {
                        (Ok(Some(x)), Ok(Some(y))) => assert_eq!(&x[..], &y[..]),
                        (Ok(None), Ok(None)) => return,
                        (Err(x), Err(y)) => {
                            assert_eq!(x.kind(), y.kind());
                            return;
                        }
                        (x, y) => panic!("whole {x:?} vs streamed {y:?}"),
                    }
                }
            });
        }
    }
}
