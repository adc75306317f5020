//! Builder output and rewritten batches decoded and CRC-checked by an
//! independent implementation: kafka-python 3.0.12's record-batch reader plus
//! the `crc32c` PyPI package (tests/py/check_batches.py).
//!
//! The Python venv comes from `scripts/install-test-deps.sh`; if it is
//! missing this test fails (it never skips silently).

use std::path::{Path, PathBuf};
use std::process::Command;

use mirrorguard::records::builder::{
    build_abort_marker, build_batch, build_commit_marker, build_control_batch,
    build_mirror_pid_reset, BatchSpec, RecordSpec,
};
use mirrorguard::records::{rewrite_all, rewrite_producer_id};
use serde_json::Value;

fn venv_python() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let py = root.join(".tools/venv/bin/python");
    assert!(
        py.exists(),
        "{} is missing: run scripts/install-test-deps.sh to install the independent batch checker \
         (kafka-python 3.0.12, crc32c)",
        py.display()
    );
    py
}

/// Runs the checker on `files`; returns its JSON lines and whether it passed.
fn check(files: &[&Path]) -> (Vec<Value>, bool) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(venv_python())
        .arg(root.join("tests/py/check_batches.py"))
        .args(files)
        .output()
        .expect("run check_batches.py");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() == Some(0) || out.status.code() == Some(1),
        "checker crashed: {stderr}"
    );
    let lines = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("bad checker line {l:?}: {e}; stderr: {stderr}"))
        })
        .collect();
    (lines, out.status.success())
}

fn batches_of(lines: &[Value]) -> Vec<&Value> {
    lines.iter().filter(|l| l.get("magic").is_some()).collect()
}

#[test]
fn builders_and_rewrites_pass_kafka_python() {
    let dir = tempfile::tempdir().unwrap();
    let high = 4_611_686_108_621_701_125i64; // PID 5 in region 42, high layout
    let sign = ((1u64 << 63) | (42u64 << 31) | 5) as i64;

    // Builder output: a data batch, markers, the barrier, an unknown type.
    let mut seg = Vec::new();
    let data = build_batch(
        &BatchSpec {
            producer_id: 5,
            producer_epoch: 0,
            base_sequence: 0,
            attributes: 0x10,
            ..BatchSpec::default()
        },
        &[
            RecordSpec {
                value: Some(b"hello"),
                ..RecordSpec::default()
            },
            RecordSpec {
                offset_delta: 1,
                key: Some(b"k"),
                value: Some(b"world"),
                ..RecordSpec::default()
            },
        ],
    );
    seg.extend_from_slice(&data);
    seg.extend(build_abort_marker(5, 0, 3, 1_700_000_000_000, 2, 0));
    seg.extend(build_commit_marker(6, 1, 4, 1_700_000_000_001, 3, 0));
    seg.extend(build_mirror_pid_reset(
        "MkU3OEVBNTcwNTJENDM2Qg",
        4,
        0,
        1_700_000_000_002,
    ));
    seg.extend(build_control_batch(9, b"opaque", -1, -1, 0, 5, 0));
    let built = dir.path().join("built.log");
    std::fs::write(&built, &seg).unwrap();

    // Rewritten: every batch's PID mapped (-1 stays), in both layouts.
    let mut rew_high = seg.clone();
    let stats = rewrite_all(&mut rew_high, |h| {
        (h.producer_id != -1).then_some(high + h.producer_id - 5)
    })
    .unwrap();
    assert_eq!(stats.rewritten, 3);
    let rewritten_high = dir.path().join("rewritten-high.log");
    std::fs::write(&rewritten_high, &rew_high).unwrap();
    let mut rew_sign = data.clone();
    assert!(rewrite_producer_id(&mut rew_sign, sign));
    let rewritten_sign = dir.path().join("rewritten-sign.log");
    std::fs::write(&rewritten_sign, &rew_sign).unwrap();

    let (lines, ok) = check(&[&built, &rewritten_high, &rewritten_sign]);
    assert!(ok, "checker reported a problem: {lines:#?}");
    let b = batches_of(&lines);
    assert_eq!(b.len(), 5 + 5 + 1, "{lines:#?}");
    for x in &b {
        assert_eq!(x["crc_valid_kafka_python"], true, "{x}");
        assert_eq!(x["crc_valid_crc32c"], true, "{x}");
        assert!(x.get("error").is_none(), "{x}");
    }
    // Built file.
    assert_eq!(b[0]["producer_id"], 5);
    assert_eq!(
        b[0]["values"],
        serde_json::json!(["68656c6c6f", "776f726c64"])
    );
    assert_eq!(
        b[1]["control"],
        serde_json::json!({"version": 0, "type": 0, "coordinator_epoch": 3})
    );
    assert_eq!(b[1]["producer_id"], 5);
    assert_eq!(
        b[2]["control"],
        serde_json::json!({"version": 0, "type": 1, "coordinator_epoch": 4})
    );
    assert_eq!(
        b[3]["control"],
        serde_json::json!({"version": 0, "type": 7, "source_cluster_id": "MkU3OEVBNTcwNTJENDM2Qg"})
    );
    assert_eq!(b[3]["producer_id"], -1);
    assert_eq!(b[3]["is_transactional"], false);
    assert_eq!(b[3]["is_control"], true);
    assert_eq!(b[4]["control"]["type"], 9);
    // Rewritten file: PIDs changed, everything else decoded identically.
    assert_eq!(b[5]["producer_id"], high);
    assert_eq!(b[5]["values"], b[0]["values"]);
    assert_eq!(b[6]["producer_id"], high);
    assert_eq!(b[6]["control"], b[1]["control"]);
    assert_eq!(b[7]["producer_id"], high + 1);
    assert_eq!(b[8]["producer_id"], -1);
    assert_eq!(
        b[8]["crc"], b[3]["crc"],
        "the barrier (PID -1) is untouched"
    );
    assert_eq!(b[10]["producer_id"], sign);
}

#[test]
fn checker_catches_a_bad_crc() {
    // Guard against a checker that passes everything.
    let dir = tempfile::tempdir().unwrap();
    let mut b = build_commit_marker(5, 0, 0, 0, 0, -1);
    b[50] ^= 1;
    let f = dir.path().join("bad.log");
    std::fs::write(&f, &b).unwrap();
    let (lines, ok) = check(&[&f]);
    assert!(!ok);
    assert_eq!(batches_of(&lines)[0]["crc_valid_kafka_python"], false);
    assert_eq!(batches_of(&lines)[0]["crc_valid_crc32c"], false);
}
