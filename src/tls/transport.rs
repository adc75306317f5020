//! The byte stream of one connection: plain TCP or TLS over it.
//!
//! An enum rather than a boxed trait object: the relay and the outbound
//! client are generic over the stream, and a `match` per read or write is
//! cheaper and clearer than a virtual call per I/O operation.
//!
//! TLS writes are write-through ([`WriteThrough`]): tokio-rustls may accept
//! plaintext and report it written while part of its ciphertext still sits
//! in rustls' buffer (the socket was full), to go out on the next write or
//! flush. Plain TCP needs no flush, so the relay does not flush after each
//! frame; the tail of a response would then wait for the next one and the
//! peer would wait forever. A TLS write therefore returns only once its
//! ciphertext has reached the socket.

use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// One connection's transport.
#[derive(Debug)]
pub enum Transport {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS we initiated (to a broker).
    Client(Box<WriteThrough<tokio_rustls::client::TlsStream<TcpStream>>>),
    /// TLS we accepted (from a client).
    Server(Box<WriteThrough<tokio_rustls::server::TlsStream<TcpStream>>>),
}

/// A TLS stream whose writes complete only when flushed to the socket.
#[derive(Debug)]
pub struct WriteThrough<S> {
    inner: S,
    /// Bytes of the caller's buffer rustls has taken whose ciphertext is not
    /// all on the socket yet. While non-zero, a write only flushes, and then
    /// reports these bytes: like every `poll_write` that returned `Pending`,
    /// it is to be retried with the same bytes (as `write_all` does).
    accepted: usize,
}

impl<S> WriteThrough<S> {
    /// Wraps a TLS stream.
    pub fn new(inner: S) -> Self {
        Self { inner, accepted: 0 }
    }

    /// The TLS stream.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteThrough<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteThrough<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let me = self.get_mut();
        if me.accepted == 0 {
            match Pin::new(&mut me.inner).poll_write(cx, buf) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Ok(0)),
                Poll::Ready(Ok(n)) => me.accepted = n,
                other => return other,
            }
        }
        match Pin::new(&mut me.inner).poll_flush(cx) {
            Poll::Ready(Ok(())) => Poll::Ready(Ok(std::mem::take(&mut me.accepted).min(buf.len()))),
            Poll::Ready(Err(e)) => {
                me.accepted = 0;
                Poll::Ready(Err(e))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl Transport {
    /// Whether the connection is encrypted.
    pub fn is_tls(&self) -> bool {
        !matches!(self, Transport::Plain(_))
    }

    /// The DER of the leaf certificate the peer presented, if it presented
    /// one (a TLS client with mTLS; always a broker): for a later mapping
    /// to a principal.
    pub fn peer_certificate(&self) -> Option<&[u8]> {
        match self {
            Transport::Server(s) => s
                .get_ref()
                .get_ref()
                .1
                .peer_certificates()?
                .first()
                .map(|c| c.as_ref()),
            Transport::Client(s) => s
                .get_ref()
                .get_ref()
                .1
                .peer_certificates()?
                .first()
                .map(|c| c.as_ref()),
            Transport::Plain(_) => None,
        }
    }
}

macro_rules! each {
    ($self:ident, $s:ident => $e:expr) => {
        match $self.get_mut() {
            Transport::Plain($s) => $e,
            Transport::Client($s) => $e,
            Transport::Server($s) => $e,
        }
    };
}

impl AsyncRead for Transport {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        each!(self, s => Pin::new(s).poll_read(cx, buf))
    }
}

impl AsyncWrite for Transport {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        each!(self, s => Pin::new(s).poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        each!(self, s => Pin::new(s).poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Transport::Plain(s) => s.is_write_vectored(),
            Transport::Client(s) => s.is_write_vectored(),
            Transport::Server(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        each!(self, s => Pin::new(s).poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        each!(self, s => Pin::new(s).poll_shutdown(cx))
    }
}
