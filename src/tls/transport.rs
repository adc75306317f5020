//! The byte stream of one connection: plain TCP or TLS over it.
//!
//! An enum rather than a boxed trait object: the relay and the outbound
//! client are generic over the stream, and a `match` per read or write is
//! cheaper and clearer than a virtual call per I/O operation.

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
    Client(Box<tokio_rustls::client::TlsStream<TcpStream>>),
    /// TLS we accepted (from a client).
    Server(Box<tokio_rustls::server::TlsStream<TcpStream>>),
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
                .1
                .peer_certificates()?
                .first()
                .map(|c| c.as_ref()),
            Transport::Client(s) => s
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
