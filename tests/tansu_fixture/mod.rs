//! A real Tansu broker for Rust tests: started on a free loopback port with
//! in-memory storage, killed on drop. Tansu comes from
//! `scripts/install-test-deps.sh` (`.tools/bin/tansu`, or `TANSU_BIN`); a
//! missing binary fails the test naming that script.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use mirrorguard::state_store::StateStoreConfig;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn tansu_bin() -> PathBuf {
    let p = std::env::var_os("TANSU_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".tools/bin/tansu"));
    assert!(
        p.is_file(),
        "Tansu broker not found at {}: run scripts/install-test-deps.sh first",
        p.display()
    );
    p
}

pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().unwrap().port()
}

/// A Tansu broker with in-memory storage, killed on drop.
pub struct Tansu {
    /// The broker process.
    pub child: Child,
    /// Its loopback port.
    pub port: u16,
}

impl Tansu {
    pub fn start() -> Tansu {
        let bin = tansu_bin();
        let port = free_port();
        let mut id = [0u8; 16];
        // Distinct per broker; no need for cryptographic randomness.
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
            ^ u128::from(port);
        id.copy_from_slice(&seed.to_be_bytes());
        let cluster = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(id);
        let url = format!("tcp://127.0.0.1:{port}");
        let child = Command::new(bin)
            .args([
                "broker",
                "--cluster-id",
                &cluster,
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
                "--storage-engine",
                "memory://tansu/",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start tansu");
        let t = Tansu { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "tansu did not listen on {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        t
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn config(&self, topic: &str) -> StateStoreConfig {
        StateStoreConfig {
            topic: topic.to_owned(),
            request_timeout: Duration::from_secs(10),
            ..StateStoreConfig::new(vec![self.addr()])
        }
    }
}

impl Drop for Tansu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
