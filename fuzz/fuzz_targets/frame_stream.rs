//! Fuzzes the cut-through frame path (`FrameReader::peek`, `head`,
//! `copy_frame`) against the whole-frame path (`next_frame`) over the same
//! byte stream, delivered in pieces whose sizes the input chooses: both must
//! yield the same bytes frame by frame and stop with the same error kind,
//! and neither may panic.
#![no_main]

use std::pin::Pin;
use std::task::{Context, Poll};

use libfuzzer_sys::fuzz_target;
use mirrorguard::codec::{CopyError, FrameError, FrameReader};
use tokio::io::{AsyncRead, ReadBuf};

/// An in-memory stream that hands out at most `piece` bytes per read.
struct Pieces<'a> {
    data: &'a [u8],
    sizes: &'a [u8],
    n: usize,
}

impl AsyncRead for Pieces<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let piece = self
            .sizes
            .get(self.n % self.sizes.len().max(1))
            .map_or(7, |s| *s as usize + 1);
        self.n += 1;
        let k = piece.min(self.data.len()).min(buf.remaining());
        buf.put_slice(&self.data[..k]);
        self.data = &self.data[k..];
        Poll::Ready(Ok(()))
    }
}

fn kind(e: &FrameError) -> &'static str {
    e.kind()
}

fuzz_target!(|input: &[u8]| {
    let Some((&split, rest)) = input.split_first() else {
        return;
    };
    let (sizes, data) = rest.split_at((split as usize % 16).min(rest.len()));
    let max = 1 << 12;
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(async {
        let mut whole = FrameReader::new(Pieces { data, sizes, n: 0 }, max);
        let mut stream = FrameReader::new(Pieces { data, sizes, n: 0 }, max);
        loop {
            let a = whole.next_frame().await;
            let want = sizes.first().map_or(8, |s| (*s as usize % 64) + 4);
            let b = match stream.peek(want).await {
                Ok(Some(total)) => {
                    assert!(total >= 4 && total - 4 <= max);
                    assert!(stream.head(total).len() <= total);
                    let mut out = Vec::new();
                    match stream.copy_frame(total, &mut out, None, false).await {
                        Ok(n) => {
                            assert_eq!(n, total);
                            assert_eq!(out.len(), total);
                            Ok(Some(out))
                        }
                        Err(CopyError::Read(e)) => Err(e),
                        Err(CopyError::Write(_)) => unreachable!("a Vec takes every write"),
                    }
                }
                Ok(None) => Ok(None),
                Err(e) => Err(e),
            };
            match (a, b) {
                (Ok(Some(x)), Ok(Some(y))) => assert_eq!(&x[..], &y[..]),
                (Ok(None), Ok(None)) => return,
                (Err(x), Err(y)) => {
                    assert_eq!(kind(&x), kind(&y));
                    return;
                }
                (x, y) => panic!("whole {x:?} vs streamed {y:?}"),
            }
        }
    });
});
