//! `mirrorguard ctl`: the admin API from a shell.
//!
//! A deliberately small HTTP/1.1 client over `std::net` (the admin listener
//! is local and plain HTTP), so the command line needs no extra stack.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};

/// `mirrorguard ctl` arguments.
#[derive(Args, Debug)]
pub struct CtlArgs {
    /// Admin listener address (host:port).
    #[arg(long, env = "MIRRORGUARD_ADMIN", default_value = "127.0.0.1:9644")]
    pub admin: String,
    /// File holding the bearer token (needed by stop, pause, resume).
    #[arg(long, env = "MIRRORGUARD_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// What to do.
    #[command(subcommand)]
    pub command: CtlCommand,
}

/// `mirrorguard ctl` subcommands.
#[derive(Subcommand, Debug)]
pub enum CtlCommand {
    /// List every mirrored partition with its state and seal progress.
    Partitions,
    /// Seal and stop partitions.
    Stop(Selection),
    /// Hold data without sealing.
    Pause(Selection),
    /// Continue after a pause.
    Resume(Selection),
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
    fn body(&self) -> Result<serde_json::Value, String> {
        let mut topics = Vec::new();
        for t in &self.topics {
            match t.split_once(':') {
                None => topics.push(serde_json::json!({"topic": t})),
                Some((name, parts)) => {
                    let ps: Result<Vec<i32>, _> =
                        parts.split(',').map(|p| p.trim().parse::<i32>()).collect();
                    let ps = ps.map_err(|_| {
                        format!("--topic {t:?}: partitions must be integers, e.g. orders:0,1")
                    })?;
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

fn call(args: &CtlArgs) -> Result<(u16, String), String> {
    let (method, path, body) = match &args.command {
        CtlCommand::Partitions => ("GET", "/v1/partitions".to_string(), None),
        CtlCommand::Stop(s) => ("POST", "/v1/partitions/stop".into(), Some(s.body()?)),
        CtlCommand::Pause(s) => ("POST", "/v1/partitions/pause".into(), Some(s.body()?)),
        CtlCommand::Resume(s) => ("POST", "/v1/partitions/resume".into(), Some(s.body()?)),
        CtlCommand::AbortOpen(s) => ("POST", "/v1/partitions/abort-open".into(), Some(s.body()?)),
        CtlCommand::Producers { topic, partition } => (
            "GET",
            format!("/v1/partitions/{topic}/{partition}/producers"),
            None,
        ),
        CtlCommand::Collisions => ("GET", "/v1/collisions".into(), None),
        CtlCommand::Anomalies => ("GET", "/v1/anomalies".into(), None),
    };
    let token = match (&args.token_file, method) {
        (Some(f), "POST") => Some(
            std::fs::read_to_string(f)
                .map_err(|e| format!("cannot read token file {}: {e}", f.display()))?
                .trim()
                .to_string(),
        ),
        _ => None,
    };
    http(&args.admin, method, &path, body.as_ref(), token.as_deref())
}

/// One HTTP/1.1 request with `Connection: close`; returns status and body.
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
    token: Option<&str>,
) -> Result<(u16, String), String> {
    let mut stream = TcpStream::connect(addr)
        .map_err(|e| format!("cannot reach the admin API at {addr}: {e}"))?;
    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
    let payload = body.map(|b| b.to_string()).unwrap_or_default();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(t) = token {
        req.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    if body.is_some() {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            payload.len()
        ));
    }
    req.push_str("\r\n");
    req.push_str(&payload);
    stream
        .write_all(req.as_bytes())
        .map_err(|e| e.to_string())?;
    let mut resp = Vec::new();
    stream.read_to_end(&mut resp).map_err(|e| e.to_string())?;
    let split = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("malformed HTTP response")?;
    let head = String::from_utf8_lossy(&resp[..split]);
    let rest = &resp[split + 4..];
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or("malformed HTTP status line")?;
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_vec()
    };
    let body = String::from_utf8_lossy(&body).into_owned();
    Ok((status, body))
}

/// Joins the chunks of a chunked HTTP body (byte-wise: chunk sizes count
/// bytes, not characters).
fn dechunk(mut s: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = s.windows(2).position(|w| w == b"\r\n") {
        let size = String::from_utf8_lossy(&s[..eol]);
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        let rest = &s[eol + 2..];
        if n == 0 || rest.len() < n {
            break;
        }
        out.extend_from_slice(&rest[..n]);
        s = rest[n..].strip_prefix(b"\r\n").unwrap_or(&rest[n..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::dechunk;

    #[test]
    fn dechunk_counts_bytes() {
        // "é" is two bytes: a chunk boundary may fall between them.
        let mut bytes = b"2\r\na".to_vec();
        bytes.push(0xc3);
        bytes.extend_from_slice(b"\r\n2\r\n");
        bytes.push(0xa9);
        bytes.extend_from_slice(b"b\r\n0\r\n\r\n");
        assert_eq!(String::from_utf8(dechunk(&bytes)).unwrap(), "aéb");
        assert_eq!(dechunk(b"zz\r\n"), Vec::<u8>::new());
    }
}
