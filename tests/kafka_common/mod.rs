//! Shared set-up of the Rust tests that run against Apache Kafka: a one-node
//! cluster started through tests/integration/kafka_broker.py (the Python test
//! bed, so the Rust and Python suites use the same broker set-up), topic
//! creation with the venv's confluent-kafka, and address parsing.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A one-node Kafka cluster, stopped on drop.
pub struct Kafka {
    child: Child,
    /// `host:port` of its client listener.
    pub bootstrap: String,
}

impl Kafka {
    /// Starts the cluster and waits for the script's `bootstrap=` line.
    pub fn start() -> Self {
        let py = root().join(".tools/venv/bin/python");
        assert!(py.is_file(), "run scripts/install-test-deps.sh first");
        let dir = tempfile::tempdir().unwrap().keep();
        let mut child = Command::new(py)
            .arg(root().join("tests/integration/kafka_broker.py"))
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let bootstrap = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("bootstrap="))
            .unwrap_or_else(|| panic!("no bootstrap in {line:?}"))
            .to_string();
        Kafka { child, bootstrap }
    }
}

impl Drop for Kafka {
    fn drop(&mut self) {
        // SIGINT: the script's `finally` stops its brokers (SIGTERM would
        // end the script before that and leave the broker running).
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

/// Creates `topic` (one partition, replication factor 1) on `bootstrap`.
pub fn create_topic(bootstrap: &str, topic: &str) {
    python(
        "import sys\nfrom confluent_kafka.admin import AdminClient, NewTopic\n\
         a = AdminClient({'bootstrap.servers': sys.argv[1]})\n\
         [f.result() for f in a.create_topics([NewTopic(sys.argv[2], 1, 1)]).values()]",
        &[bootstrap, topic],
    );
}

/// Runs `script` with the test venv's Python (confluent-kafka), `args` as
/// its `sys.argv[1..]`; fails the test with its stderr if it fails.
pub fn python(script: &str, args: &[&str]) {
    let out = Command::new(root().join(".tools/venv/bin/python"))
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `host:port` split into its parts.
pub fn host_port(addr: &str) -> (String, u16) {
    let (h, p) = addr.rsplit_once(':').unwrap();
    (h.to_string(), p.parse().unwrap())
}
