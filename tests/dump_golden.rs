//! `mirrorguard dump` output compared line for line: the golden dump of
//! vector (b) from wire reference section 6, a segment of builder batches
//! (data, mapped PIDs, markers, barrier, unknown control type, bad CRC,
//! truncated tail), `__mirror_state` records, JSON mode, and the binary's
//! exit codes. Also `mirrorguard map` through the binary.

use std::path::Path;
use std::process::Command;

use mirrorguard::dump::{dump_bytes, DumpOptions};
use mirrorguard::records::builder::{
    build_abort_marker, build_batch, build_commit_marker, build_control_batch,
    build_mirror_pid_reset, BatchSpec, RecordSpec,
};

const BIN: &str = env!("CARGO_BIN_EXE_mirrorguard");
const HIGH_5_R42: i64 = 4_611_686_108_621_701_125;
const CLUSTER: &str = "MkU3OEVBNTcwNTJENDM2Qg";

fn dump(path: &Path, bytes: &[u8], opts: DumpOptions) -> Vec<String> {
    let mut out = Vec::new();
    dump_bytes(path, bytes, opts, &mut out).unwrap();
    String::from_utf8(out)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn deep() -> DumpOptions {
    DumpOptions {
        deep_iteration: true,
        ..DumpOptions::default()
    }
}

fn crc(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[17..21].try_into().unwrap())
}

#[test]
fn golden_dump_of_vector_b() {
    let b = build_commit_marker(5, 0, 0, 0, 0, 0);
    let path = Path::new("/data/t-0/00000000000000000000.log");
    assert_eq!(
        dump(path, &b, deep()),
        vec![
            "Dumping /data/t-0/00000000000000000000.log",
            "Log starting offset: 0",
            "baseOffset: 0 lastOffset: 0 count: 1 baseSequence: -1 lastSequence: -1 producerId: 5 producerEpoch: 0 partitionLeaderEpoch: 0 isTransactional: true isControl: true deleteHorizonMs: OptionalLong.empty position: 0 CreateTime: 0 size: 78 magic: 2 compresscodec: none crc: 1042761822 isvalid: true",
            "| offset: 0 CreateTime: 0 keySize: 4 valueSize: 6 sequence: -1 headerKeys: [] endTxnMarker: COMMIT coordinatorEpoch: 0",
        ]
    );
}

/// A segment of builder batches and what the dump must say about it.
fn segment() -> (Vec<u8>, Vec<String>) {
    let mut seg = Vec::new();
    let mut lines = Vec::new();
    let sign_5_r42 = ((1u64 << 63) | (42u64 << 31) | 5) as i64;

    // 0: data batch with a high-layout mapped PID, two records, headers.
    let h: &[(&[u8], Option<&[u8]>)] = &[(b"h1", Some(b"x")), (b"h2", None)];
    let data = build_batch(
        &BatchSpec {
            base_offset: 100,
            partition_leader_epoch: 3,
            base_timestamp: 1000,
            max_timestamp: 1005,
            producer_id: HIGH_5_R42,
            producer_epoch: 2,
            base_sequence: 10,
            ..BatchSpec::default()
        },
        &[
            RecordSpec {
                key: Some(b"k"),
                value: Some(b"hello"),
                ..RecordSpec::default()
            },
            RecordSpec {
                timestamp_delta: 5,
                offset_delta: 1,
                value: Some(b"abc"),
                headers: h,
                ..RecordSpec::default()
            },
        ],
    );
    lines.push(format!("baseOffset: 100 lastOffset: 101 count: 2 baseSequence: 10 lastSequence: 11 producerId: {HIGH_5_R42} producerEpoch: 2 partitionLeaderEpoch: 3 isTransactional: false isControl: false deleteHorizonMs: OptionalLong.empty position: 0 CreateTime: 1005 size: {} magic: 2 compresscodec: none crc: {} isvalid: true mappedPid: layout=high region=42 originalPid=5", data.len(), crc(&data)));
    lines.push(
        "| offset: 100 CreateTime: 1000 keySize: 1 valueSize: 5 sequence: 10 headerKeys: []".into(),
    );
    lines.push(
        "| offset: 101 CreateTime: 1005 keySize: -1 valueSize: 3 sequence: 11 headerKeys: [h1,h2]"
            .into(),
    );
    seg.extend_from_slice(&data);

    // 1: the barrier.
    let pos = seg.len();
    let barrier = build_mirror_pid_reset(CLUSTER, 102, 3, 2000);
    lines.push(format!("baseOffset: 102 lastOffset: 102 count: 1 baseSequence: -1 lastSequence: -1 producerId: -1 producerEpoch: -1 partitionLeaderEpoch: 3 isTransactional: false isControl: true deleteHorizonMs: OptionalLong.empty position: {pos} CreateTime: 2000 size: {} magic: 2 compresscodec: none crc: {} isvalid: true", barrier.len(), crc(&barrier)));
    lines.push(format!("| offset: 102 CreateTime: 2000 keySize: 4 valueSize: 26 sequence: -1 headerKeys: [] MirrorPidReset {{\"version\":0,\"sourceClusterId\":\"{CLUSTER}\"}}"));
    seg.extend_from_slice(&barrier);

    // 2: unknown control type 9.
    let pos = seg.len();
    let unknown = build_control_batch(9, b"xyz", -1, -1, 0, 103, 3);
    lines.push(format!("baseOffset: 103 lastOffset: 103 count: 1 baseSequence: -1 lastSequence: -1 producerId: -1 producerEpoch: -1 partitionLeaderEpoch: 3 isTransactional: false isControl: true deleteHorizonMs: OptionalLong.empty position: {pos} CreateTime: 0 size: {} magic: 2 compresscodec: none crc: {} isvalid: true", unknown.len(), crc(&unknown)));
    lines.push("| offset: 103 CreateTime: 0 keySize: 4 valueSize: 3 sequence: -1 headerKeys: [] controlType: UNKNOWN(9)".into());
    seg.extend_from_slice(&unknown);

    // 3: sign-bit mapped ABORT marker with a broken CRC.
    let pos = seg.len();
    let mut abort = build_abort_marker(sign_5_r42, 1, 7, 3000, 104, 3);
    abort[20] ^= 0xff;
    lines.push(format!("baseOffset: 104 lastOffset: 104 count: 1 baseSequence: -1 lastSequence: -1 producerId: {sign_5_r42} producerEpoch: 1 partitionLeaderEpoch: 3 isTransactional: true isControl: true deleteHorizonMs: OptionalLong.empty position: {pos} CreateTime: 3000 size: 78 magic: 2 compresscodec: none crc: {} isvalid: false mappedPid: layout=sign-bit region=42 originalPid=5", crc(&abort)));
    lines.push("| offset: 104 CreateTime: 3000 keySize: 4 valueSize: 6 sequence: -1 headerKeys: [] endTxnMarker: ABORT coordinatorEpoch: 7".into());
    seg.extend_from_slice(&abort);

    // 4: a truncated tail of 30 bytes.
    seg.extend_from_slice(&build_commit_marker(1, 0, 0, 0, 105, 3)[..30]);
    lines.push("Found 30 invalid bytes at the end of 00000000000000000100.log".into());
    (seg, lines)
}

#[test]
fn segment_of_builder_batches() {
    let (seg, lines) = segment();
    let path = Path::new("seg/00000000000000000100.log");
    let mut want = vec![
        "Dumping seg/00000000000000000100.log".to_owned(),
        "Log starting offset: 100".to_owned(),
    ];
    want.extend(lines.iter().cloned());
    assert_eq!(dump(path, &seg, deep()), want);
    // Without --deep-iteration: batch lines only.
    let shallow: Vec<String> = want.into_iter().filter(|l| !l.starts_with('|')).collect();
    assert_eq!(dump(path, &seg, DumpOptions::default()), shallow);
}

#[test]
fn binary_matches_and_reports_unreadable_files() {
    let dir = tempfile::tempdir().unwrap();
    let (seg, lines) = segment();
    let f = dir.path().join("00000000000000000100.log");
    std::fs::write(&f, &seg).unwrap();
    let out = Command::new(BIN)
        .args(["dump", "--deep-iteration"])
        .arg(&f)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(got[0], format!("Dumping {}", f.display()));
    assert_eq!(got[2..], lines[..]);

    // An unreadable file: clear message, non-zero exit, other files still dumped.
    let missing = dir.path().join("nope.log");
    let out = Command::new(BIN)
        .arg("dump")
        .arg(&missing)
        .arg(&f)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot read") && err.contains("nope.log"),
        "{err}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("Log starting offset: 100"));
}

#[test]
fn json_mode_one_object_per_batch() {
    let (seg, _) = segment();
    let opts = DumpOptions {
        json: true,
        deep_iteration: true,
        ..DumpOptions::default()
    };
    let lines = dump(Path::new("00000000000000000100.log"), &seg, opts);
    let v: Vec<serde_json::Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(v.len(), 5);
    assert_eq!(v[0]["type"], "batch");
    assert_eq!(v[0]["producerId"], HIGH_5_R42);
    assert_eq!(
        v[0]["mappedPid"],
        serde_json::json!({"layout": "high", "region": 42, "originalPid": 5})
    );
    assert_eq!(
        v[0]["records"][1]["headerKeys"],
        serde_json::json!(["h1", "h2"])
    );
    assert_eq!(v[1]["control"]["type"], "MIRROR_PID_RESET");
    assert_eq!(v[1]["control"]["sourceClusterId"], CLUSTER);
    assert_eq!(v[2]["control"]["type"], "UNKNOWN");
    assert_eq!(v[2]["control"]["typeId"], 9);
    assert_eq!(v[3]["isValid"], false);
    assert_eq!(v[3]["control"]["coordinatorEpoch"], 7);
    assert_eq!(
        v[4],
        serde_json::json!({"type": "invalidBytes", "file": "00000000000000000100.log", "position": seg.len() - 30, "invalidBytes": 30})
    );
}

fn collision_key(type_id: i16, topic: [u8; 16], partition: i32, source: &str, pid: i64) -> Vec<u8> {
    let mut k = type_id.to_be_bytes().to_vec();
    k.extend_from_slice(&topic);
    k.extend_from_slice(&partition.to_be_bytes());
    k.extend_from_slice(&(source.len() as i16).to_be_bytes());
    k.extend_from_slice(source.as_bytes());
    k.extend_from_slice(&pid.to_be_bytes());
    k
}

fn collision_value(salt: i64, colliding: &str, ts: i64) -> Vec<u8> {
    let mut v = 0i16.to_be_bytes().to_vec();
    v.extend_from_slice(&salt.to_be_bytes());
    v.push(colliding.len() as u8 + 1); // compact string length (< 127)
    v.extend_from_slice(colliding.as_bytes());
    v.extend_from_slice(&ts.to_be_bytes());
    v.push(0); // no tagged fields
    v
}

#[test]
fn mirror_state_records() {
    let topic: [u8; 16] = std::array::from_fn(|i| i as u8 + 1);
    let key = collision_key(3, topic, 7, CLUSTER, 5);
    let value = collision_value(1, "AAAAAAAAAAAAAAAAAAAAAA", 1_700_000_000_000);
    // Type 9 is the serving record; 99 is unassigned.
    let unknown = collision_key(99, topic, 7, CLUSTER, 5);
    let short = &key[..20];
    let batch = build_batch(
        &BatchSpec {
            base_offset: 42,
            ..BatchSpec::default()
        },
        &[
            RecordSpec {
                key: Some(&key),
                value: Some(&value),
                ..RecordSpec::default()
            },
            RecordSpec {
                offset_delta: 1,
                key: Some(&key),
                ..RecordSpec::default()
            },
            RecordSpec {
                offset_delta: 2,
                key: Some(&unknown),
                value: Some(&value),
                ..RecordSpec::default()
            },
            RecordSpec {
                offset_delta: 3,
                key: Some(short),
                value: Some(&value),
                ..RecordSpec::default()
            },
        ],
    );
    let (kl, vl) = (key.len(), value.len());
    let want_records = [
        format!("| offset: 42 CreateTime: 0 keySize: {kl} valueSize: {vl} sequence: -1 headerKeys: [] key: {{\"type\":\"3\",\"data\":{{\"topicId\":\"AQIDBAUGBwgJCgsMDQ4PEA\",\"partition\":7,\"sourceClusterId\":\"{CLUSTER}\",\"originalPid\":5}}}} payload: {{\"version\":\"0\",\"data\":{{\"salt\":1,\"collidingClusterId\":\"AAAAAAAAAAAAAAAAAAAAAA\",\"timestampMs\":1700000000000}}}}"),
        format!("| offset: 43 CreateTime: 0 keySize: {kl} valueSize: -1 sequence: -1 headerKeys: [] key: {{\"type\":\"3\",\"data\":{{\"topicId\":\"AQIDBAUGBwgJCgsMDQ4PEA\",\"partition\":7,\"sourceClusterId\":\"{CLUSTER}\",\"originalPid\":5}}}} payload: <DELETE>"),
        format!("| offset: 44 CreateTime: 0 keySize: {kl} valueSize: {vl} sequence: -1 headerKeys: [] key: Unknown record type 99 at offset 44, skipping."),
        format!("| offset: 45 CreateTime: 0 keySize: 20 valueSize: {vl} sequence: -1 headerKeys: [] key: Error at offset 45, skipping. truncated Partition"),
    ];

    // Recognised from the directory name...
    let dir = tempfile::tempdir().unwrap();
    let ms = dir.path().join("__mirror_state-0");
    std::fs::create_dir(&ms).unwrap();
    let f = ms.join("00000000000000000042.log");
    std::fs::write(&f, &batch).unwrap();
    let out = Command::new(BIN)
        .args(["dump", "--deep-iteration"])
        .arg(&f)
        .output()
        .unwrap();
    assert!(out.status.success());
    let got: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(got.len(), 3 + 4, "{got:#?}");
    assert_eq!(got[3..], want_records[..]);

    // ...or when asked (which implies deep iteration), and not otherwise.
    let other = dir.path().join("t-0");
    std::fs::create_dir(&other).unwrap();
    let g = other.join("00000000000000000042.log");
    std::fs::write(&g, &batch).unwrap();
    let out = Command::new(BIN)
        .args(["dump", "--mirror-state"])
        .arg(&g)
        .output()
        .unwrap();
    let got: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(got[3..], want_records[..]);
    let out = Command::new(BIN)
        .args(["dump", "--deep-iteration"])
        .arg(&g)
        .output()
        .unwrap();
    let got: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(
        got[3],
        format!(
            "| offset: 42 CreateTime: 0 keySize: {kl} valueSize: {vl} sequence: -1 headerKeys: []"
        )
    );
}

#[test]
fn map_binary() {
    let run = |args: &[&str]| {
        let out = Command::new(BIN).arg("map").args(args).output().unwrap();
        (
            out.status.code(),
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    let id = "MkU3OEVBNTcwNTJENDM2Qg";
    let fold = {
        let c = mirrorguard::pid::ClusterId::parse(id).unwrap();
        mirrorguard::pid::fold(&c)
    };
    let (code, out, _) = run(&["--source-cluster-id", id, "--pid", "5"]);
    assert_eq!(code, Some(0));
    let want = (1i64 << 62) | (i64::from(fold & 0x7FFF_FFFF) << 31) | 5;
    assert_eq!(out.lines().last().unwrap(), want.to_string());
    let (_, out, _) = run(&[
        "--source-cluster-id",
        id,
        "--pid",
        "5",
        "--layout",
        "sign-bit",
        "--salt",
        "2",
    ]);
    let want = ((1u64 << 63) | (u64::from(fold.wrapping_add(2)) << 31) | 5) as i64;
    assert_eq!(out.lines().last().unwrap(), want.to_string());
    // -1 and already-mapped PIDs pass through.
    let (_, out, _) = run(&["--source-cluster-id", id, "--pid", "-1"]);
    assert_eq!(out.lines().last().unwrap(), "-1");
    let (_, out, _) = run(&["--source-cluster-id", id, "--pid", &HIGH_5_R42.to_string()]);
    assert_eq!(out.lines().last().unwrap(), HIGH_5_R42.to_string());
    // Decode.
    let (code, out, _) = run(&["--decode", &HIGH_5_R42.to_string()]);
    assert_eq!(code, Some(0));
    assert_eq!(out, "layout: high\nregion: 42\noriginalPid: 5\n");
    let (_, out, _) = run(&["--decode", "12"]);
    assert_eq!(out, "12 is not a mapped PID\n");
    // Kafka's base64 ids may start with '-': taken as the value, with or without '='.
    let dash_id = "-tjk3MbD0rRBZ_zkwWw7pA";
    let dash_fold = {
        let c = mirrorguard::pid::ClusterId::parse(dash_id).unwrap();
        mirrorguard::pid::fold(&c)
    };
    let want = ((1i64 << 62) | (i64::from(dash_fold & 0x7FFF_FFFF) << 31) | 5).to_string();
    for args in [
        &["--source-cluster-id", dash_id, "--pid", "5"][..],
        &["--source-cluster-id=-tjk3MbD0rRBZ_zkwWw7pA", "--pid", "5"][..],
    ] {
        let (code, out, err) = run(args);
        assert_eq!(code, Some(0), "{args:?}: {err}");
        assert_eq!(out.lines().last().unwrap(), want);
    }
    // Bad cluster id: clear message, non-zero exit.
    let (code, _, err) = run(&["--source-cluster-id", "prod-east", "--pid", "5"]);
    assert_ne!(code, Some(0));
    assert!(
        err.contains("invalid cluster id") && err.contains("UUID"),
        "{err}"
    );
}
