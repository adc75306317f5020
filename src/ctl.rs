//! `mirrorguard ctl`: the admin API from a shell.
//!
//! Requests go through hyper's HTTP/1 client connection (hyper already
//! serves the admin API), on a current-thread runtime for the one call: plain
//! HTTP, or HTTPS with `--ca` (the admin listener's `[admin.tls]`; `--cert` /
//! `--key` when it requires client certificates). The bearer token
//! (`--token-file`) is sent with every call: mutating calls and the reads
//! that show producer ids need it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};

/// Why a `ctl` call failed before an HTTP status was known.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    /// A `--topic` selection is malformed.
    #[error("--topic {0:?}: partitions must be integers, e.g. orders:0,1")]
    Selection(String),
    /// The token file cannot be read.
    #[error("cannot read token file {path}: {source}")]
    TokenFile {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// `--ca`, `--cert` or `--key` cannot be used.
    #[error("--ca/--cert/--key: {0}")]
    Tls(String),
    /// The client runtime could not start.
    #[error("cannot start the HTTP client: {0}")]
    Runtime(std::io::Error),
    /// The call took longer than its timeout.
    #[error("no answer from the admin API at {addr} within {after:?}")]
    Timeout {
        /// Admin address.
        addr: String,
        /// The timeout.
        after: Duration,
    },
    /// The admin listener refused or could not be reached.
    #[error("cannot reach the admin API at {addr}: {source}")]
    Unreachable {
        /// Admin address.
        addr: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The request could not be built.
    #[error("cannot build the request: {0}")]
    Request(String),
    /// The HTTP exchange failed.
    #[error("admin API at {addr}: {reason}")]
    Http {
        /// Admin address.
        addr: String,
        /// The error and its causes.
        reason: String,
    },
    /// The response body ended before its framing said it would.
    #[error("admin API at {addr}: incomplete response body (HTTP {status}): {reason}")]
    IncompleteBody {
        /// Admin address.
        addr: String,
        /// The status already received.
        status: u16,
        /// The error and its causes.
        reason: String,
    },
}

impl From<CtlError> for String {
    fn from(e: CtlError) -> Self {
        e.to_string()
    }
}

/// `mirrorguard ctl` arguments.
#[derive(Args, Debug)]
pub struct CtlArgs {
    /// Admin listener address (host:port).
    #[arg(long, env = "MIRRORGUARD_ADMIN", default_value = "127.0.0.1:9644")]
    pub admin: String,
    /// File holding the bearer token (mutating calls, and the reads that show
    /// producer ids: producers, collisions, anomalies).
    #[arg(long, env = "MIRRORGUARD_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// CA bundle of the admin listener's certificate: speak HTTPS (for an
    /// admin listener with `[admin.tls]`).
    #[arg(long, env = "MIRRORGUARD_ADMIN_CA")]
    pub ca: Option<PathBuf>,
    /// Client certificate, for an admin listener that requires one
    /// (`[admin.tls] client_ca`); needs `--ca` and `--key`.
    #[arg(long, env = "MIRRORGUARD_ADMIN_CERT", requires_all = ["ca", "key"])]
    pub cert: Option<PathBuf>,
    /// The client certificate's private key.
    #[arg(long, env = "MIRRORGUARD_ADMIN_KEY", requires_all = ["ca", "cert"])]
    pub key: Option<PathBuf>,
    /// Name the admin listener's certificate is verified against (default:
    /// the host of `--admin`).
    #[arg(long, env = "MIRRORGUARD_ADMIN_SERVER_NAME", requires = "ca")]
    pub server_name: Option<String>,
    /// What to do.
    #[command(subcommand)]
    pub command: CtlCommand,
}

/// `mirrorguard ctl` subcommands.
#[derive(Subcommand, Debug)]
pub enum CtlCommand {
    /// Liveness (`GET /healthz`): exit 0 while mirrorguard runs (a container
    /// health check or exec probe with no HTTP client in the image).
    Health,
    /// Readiness (`GET /readyz`): exit 0 once every listener reached its upstream.
    Ready,
    /// List every mirrored partition with its state and seal progress.
    Partitions,
    /// Seal and stop partitions.
    Stop(Selection),
    /// Hold data without sealing.
    Pause(Selection),
    /// Continue after a pause.
    Resume(Selection),
    /// Protect STOPPED partitions again: a new mirroring episode (after a
    /// failback, or a new mirror from the old source).
    Protect(Selection),
    /// Abort, on the destination, the open mirrored transactions of stopped
    /// partitions whose destination fetcher is gone (`--topic T[:P]`).
    AbortOpen(Selection),
    /// Shadow producer state of a destination partition.
    Producers {
        /// Destination topic.
        topic: String,
        /// Partition.
        partition: i32,
    },
    /// Collision salts in force.
    Collisions,
    /// Recent producer-state anomalies.
    Anomalies,
}

/// Which partitions a mutating call targets.
#[derive(Args, Debug)]
pub struct Selection {
    /// Mirror name.
    #[arg(long)]
    pub mirror: String,
    /// Topic, optionally with partitions: `orders` or `orders:0,1,2`. Repeatable.
    #[arg(long = "topic")]
    pub topics: Vec<String>,
    /// Every partition of the mirror.
    #[arg(long)]
    pub all: bool,
}

impl Selection {
    fn body(&self) -> Result<serde_json::Value, CtlError> {
        let mut topics = Vec::new();
        for t in &self.topics {
            match t.split_once(':') {
                None => topics.push(serde_json::json!({"topic": t})),
                Some((name, parts)) => {
                    let ps: Result<Vec<i32>, _> =
                        parts.split(',').map(|p| p.trim().parse::<i32>()).collect();
                    let ps = ps.map_err(|_| CtlError::Selection(t.clone()))?;
                    topics.push(serde_json::json!({"topic": name, "partitions": ps}));
                }
            }
        }
        Ok(serde_json::json!({"mirror": self.mirror, "all": self.all, "topics": topics}))
    }
}

/// Runs `mirrorguard ctl`; prints the JSON answer, exit 0 on 2xx.
pub fn run(args: &CtlArgs) -> ExitCode {
    match call(args) {
        Ok((status, body)) => {
            println!("{body}");
            if (200..300).contains(&status) {
                ExitCode::SUCCESS
            } else {
                eprintln!("mirrorguard ctl: HTTP {status}");
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("mirrorguard ctl: {e}");
            ExitCode::from(2)
        }
    }
}

fn call(args: &CtlArgs) -> Result<(u16, String), CtlError> {
    let (method, path, body) = match &args.command {
        CtlCommand::Health => ("GET", "/healthz".to_string(), None),
        CtlCommand::Ready => ("GET", "/readyz".to_string(), None),
        CtlCommand::Partitions => ("GET", "/v1/partitions".to_string(), None),
        CtlCommand::Stop(s) => ("POST", "/v1/partitions/stop".into(), Some(s.body()?)),
        CtlCommand::Pause(s) => ("POST", "/v1/partitions/pause".into(), Some(s.body()?)),
        CtlCommand::Resume(s) => ("POST", "/v1/partitions/resume".into(), Some(s.body()?)),
        CtlCommand::Protect(s) => ("POST", "/v1/partitions/protect".into(), Some(s.body()?)),
        CtlCommand::AbortOpen(s) => ("POST", "/v1/partitions/abort-open".into(), Some(s.body()?)),
        CtlCommand::Producers { topic, partition } => (
            "GET",
            format!("/v1/partitions/{topic}/{partition}/producers"),
            None,
        ),
        CtlCommand::Collisions => ("GET", "/v1/collisions".into(), None),
        CtlCommand::Anomalies => ("GET", "/v1/anomalies".into(), None),
    };
    let token = match &args.token_file {
        Some(f) => Some(zeroize::Zeroizing::new(
            std::fs::read_to_string(f)
                .map_err(|source| CtlError::TokenFile {
                    path: f.clone(),
                    source,
                })?
                .trim()
                .to_string(),
        )),
        None => None,
    };
    let tls = match &args.ca {
        Some(ca) => Some(
            crate::tls::ClientTls::new(
                &crate::config::ClientTlsConfig {
                    ca: ca.clone(),
                    cert: args.cert.clone(),
                    key: args.key.clone(),
                    server_name: args.server_name.clone(),
                    insecure_skip_hostname_verification: false,
                    handshake_timeout_ms: 10_000,
                },
                "ctl",
            )
            .map_err(|e| CtlError::Tls(e.to_string()))?,
        ),
        None => None,
    };
    http_over(
        &args.admin,
        tls.as_deref(),
        method,
        &path,
        body.as_ref(),
        token.as_deref().map(String::as_str),
    )
}

/// How long one admin call may take, connect to last body byte.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// One HTTP/1.1 request with `Connection: close`; returns status and body.
///
/// The response is read by hyper's HTTP/1 client, so framing is checked: a
/// chunked body is decoded whole (chunk extensions included), and a body
/// shorter than its `Content-Length` is an error, never a silent success.
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
    token: Option<&str>,
) -> Result<(u16, String), CtlError> {
    http_over(addr, None, method, path, body, token)
}

/// [`http`] over TLS when `tls` is given (the server verified against its
/// CA bundle and the host of `addr`, or its `server_name`).
pub fn http_over(
    addr: &str,
    tls: Option<&crate::tls::ClientTls>,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
    token: Option<&str>,
) -> Result<(u16, String), CtlError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(CtlError::Runtime)?;
    rt.block_on(async {
        tokio::time::timeout(
            CALL_TIMEOUT,
            http_async(addr, tls, method, path, body, token),
        )
        .await
        .map_err(|_| CtlError::Timeout {
            addr: addr.to_owned(),
            after: CALL_TIMEOUT,
        })?
    })
}

async fn http_async(
    addr: &str,
    tls: Option<&crate::tls::ClientTls>,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
    token: Option<&str>,
) -> Result<(u16, String), CtlError> {
    use http_body_util::{BodyExt, Full};
    use hyper::body::Bytes;
    use hyper::header;

    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|source| CtlError::Unreachable {
            addr: addr.to_owned(),
            source,
        })?;
    let stream = match tls {
        None => crate::tls::Transport::Plain(tcp),
        Some(tls) => {
            let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
            tls.connect(tcp, host).await.map_err(|e| CtlError::Http {
                addr: addr.to_owned(),
                reason: format!("TLS handshake failed: {e}"),
            })?
        }
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake::<_, Full<Bytes>>(
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .map_err(|e| CtlError::Http {
        addr: addr.to_owned(),
        reason: e.to_string(),
    })?;
    // Drives the connection; it ends when the response has been read (or
    // the peer goes away, which the response future then reports).
    let conn = tokio::spawn(conn);

    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, addr)
        .header(header::CONNECTION, "close");
    if let Some(t) = token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let payload = match body {
        Some(b) => {
            req = req.header(header::CONTENT_TYPE, "application/json");
            Bytes::from(b.to_string())
        }
        None => Bytes::new(),
    };
    let req = req
        .body(Full::new(payload))
        .map_err(|e| CtlError::Request(e.to_string()))?;
    let resp = sender.send_request(req).await.map_err(|e| CtlError::Http {
        addr: addr.to_owned(),
        reason: error_chain(&e),
    })?;
    let status = resp.status().as_u16();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| CtlError::IncompleteBody {
            addr: addr.to_owned(),
            status,
            reason: error_chain(&e),
        })?
        .to_bytes();
    conn.abort();
    Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
}

/// An error and its causes, `outer: inner: ...` (hyper's own messages are
/// terse; the cause says what actually went wrong).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpListener;

    use super::http;

    /// A one-shot HTTP peer on 127.0.0.1: reads the request head, answers
    /// `response` verbatim, closes. Returns its address.
    fn peer(response: &'static [u8]) -> String {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut req = Vec::new();
            let mut buf = [0u8; 1024];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => req.extend_from_slice(&buf[..n]),
                }
            }
            let _ = s.write_all(response);
        });
        addr
    }

    #[test]
    fn chunked_body_with_extensions_is_read_whole() {
        let addr = peer(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
              5;name=value\r\n{\"a\":\r\n3;x\r\n\xc3\xa91\r\n1\r\n}\r\n0\r\n\r\n",
        );
        let (status, body) = http(&addr, "GET", "/v1/partitions", None, None).unwrap();
        assert_eq!((status, body.as_str()), (200, "{\"a\":é1}"));
    }

    #[test]
    fn body_shorter_than_content_length_is_an_error() {
        let addr = peer(b"HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n{\"partitions\": []}");
        let err = http(&addr, "GET", "/v1/partitions", None, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("incomplete response body"), "{err}");
    }

    #[test]
    fn status_and_body_of_an_error_answer() {
        let addr = peer(
            b"HTTP/1.1 409 Conflict\r\nContent-Length: 13\r\nConnection: close\r\n\r\n{\"error\":\"x\"}",
        );
        let body = serde_json::json!({"mirror": "m", "all": true});
        let (status, text) =
            http(&addr, "POST", "/v1/partitions/stop", Some(&body), Some("t")).unwrap();
        assert_eq!((status, text.as_str()), (409, "{\"error\":\"x\"}"));
    }

    #[test]
    fn unreachable_admin_api_is_a_clear_error() {
        // Bind then drop: nothing listens on the port any more.
        let addr = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .to_string();
        let err = http(&addr, "GET", "/v1/partitions", None, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot reach the admin API"), "{err}");
    }
}
