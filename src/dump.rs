//! `mirrorguard dump`: reads Kafka log segment files and prints them in the
//! layout of Kafka's `kafka-dump-log.sh` (`DumpLogSegments`, wire reference
//! section 6), so existing habits and scripts carry over.
//!
//! Output, per file:
//! - `Dumping <path>`, then `Log starting offset: N` when the file name is a
//!   Kafka segment name (`<20 digits>.log`);
//! - one line per batch, exactly Kafka's fields; a batch whose producerId is
//!   mapped (SPEC 2.1, either layout) gets ` mappedPid: layout=L region=R
//!   originalPid=P` appended after `isvalid: …` (mirrorguard's addition);
//! - with `--deep-iteration`, one `| offset: …` line per record; control
//!   records end with ` endTxnMarker: COMMIT coordinatorEpoch: N` (as Kafka),
//!   ` MirrorPidReset {"version":0,"sourceClusterId":"…"}` for the barrier
//!   (shaped like Kafka's ` SnapshotHeader {json}` lines), or the fallback
//!   ` controlType: NAME(id)`, e.g. `UNKNOWN(9)`;
//! - `__mirror_state` records (type 3 of SPEC 2.2; types 4 to 7 as laid out
//!   in `state_store::schema`) get ` key: {json} payload: {json}`
//!   in the shape of Kafka's `--offsets-decoder`, when the file's directory
//!   is `__mirror_state-N` (with `--deep-iteration`) or `--mirror-state` is
//!   given (which implies `--deep-iteration`, as `--offsets-decoder` implies
//!   `--print-data-log` in Kafka);
//! - `Found N invalid bytes at the end of <file name>` after a truncated or
//!   corrupt tail (the reason of a corrupt tail also goes to stderr).
//!
//! Deviations from Kafka, all where Kafka would need a codec or would throw:
//! compressed batches are shown at batch level and their records are not
//! decoded (`| records compressed with gzip: not decoded`); a malformed
//! record or control record prints an error on its line instead of aborting
//! the whole dump; KRaft control records are shown by the fallback form.
//!
//! `--json` prints one JSON object per batch instead (`"type": "batch"`,
//! `"legacy"`, or a final `"invalidBytes"` object).
//!
//! Never panics on any file content: all parsing goes through the
//! bounds-checked walkers of [`crate::records`].

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::{json, Map, Value};

use crate::pid;
use crate::records::batch::{increment_sequence, BatchHeader, Compression, Entry};
use crate::records::control::{self, ControlValue};
use crate::records::record::{records, Record};
use crate::records::varint::Cursor;
use crate::records::{self as rec, BatchError};

/// Arguments of `mirrorguard dump`.
#[derive(Debug, Clone, clap::Args)]
pub struct DumpArgs {
    /// Print one line per record, not just per batch.
    #[arg(long)]
    pub deep_iteration: bool,
    /// Print one JSON object per batch.
    #[arg(long)]
    pub json: bool,
    /// Decode records as `__mirror_state` records (implies --deep-iteration).
    #[arg(long)]
    pub mirror_state: bool,
    /// Log segment files (`NNNNNNNNNNNNNNNNNNNN.log`).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}

/// Options of one dump.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DumpOptions {
    /// One line per record.
    pub deep_iteration: bool,
    /// JSON objects instead of text.
    pub json: bool,
    /// Decode `__mirror_state` records.
    pub mirror_state: bool,
}

/// Runs `mirrorguard dump`: every file in turn; exit code 1 if any file
/// could not be read (the others are still dumped).
pub fn run(args: &DumpArgs) -> ExitCode {
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    let mut failed = false;
    for path in &args.files {
        let opts = DumpOptions {
            deep_iteration: args.deep_iteration || args.mirror_state,
            json: args.json,
            mirror_state: args.mirror_state || is_mirror_state_dir(path),
        };
        match dump_file(path, opts, &mut out) {
            Ok(()) => {}
            Err(DumpError::Read(e)) => {
                let _ = out.flush();
                eprintln!("mirrorguard dump: cannot read {}: {e}", path.display());
                failed = true;
            }
            Err(DumpError::Write(_)) => {
                // stdout closed (e.g. piped into `head`): stop quietly.
                return ExitCode::from(if failed { 1 } else { 0 });
            }
        }
    }
    if out.flush().is_err() {
        return ExitCode::from(1);
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// Why a file could not be dumped.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    /// The file could not be read.
    #[error("cannot read file: {0}")]
    Read(io::Error),
    /// Output could not be written.
    #[error("cannot write output: {0}")]
    Write(io::Error),
}

/// Whether `path` lies in a `__mirror_state-<partition>` directory.
pub fn is_mirror_state_dir(path: &Path) -> bool {
    let dir = path
        .parent()
        .and_then(|p| p.file_name())
        .and_then(|n| n.to_str());
    match dir.and_then(|d| d.strip_prefix("__mirror_state-")) {
        Some(n) => !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()),
        None => false,
    }
}

/// Dumps one file to `out`.
pub fn dump_file(path: &Path, opts: DumpOptions, out: &mut dyn Write) -> Result<(), DumpError> {
    let bytes = std::fs::read(path).map_err(DumpError::Read)?;
    dump_bytes(path, &bytes, opts, out).map_err(DumpError::Write)
}

/// Dumps the contents `bytes` of the segment file `path` to `out`.
pub fn dump_bytes(
    path: &Path,
    bytes: &[u8],
    opts: DumpOptions,
    out: &mut dyn Write,
) -> io::Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !opts.json {
        writeln!(out, "Dumping {}", path.display())?;
        if let Some(start) = name
            .strip_suffix(".log")
            .and_then(|s| s.parse::<i64>().ok())
        {
            writeln!(out, "Log starting offset: {start}")?;
        }
    }
    let file = path.display().to_string();
    let mut walker = rec::walk(bytes);
    let mut valid = 0usize;
    let mut corrupt: Option<BatchError> = None;
    for entry in walker.by_ref() {
        match entry {
            Ok(Entry::V2(h)) => {
                let batch = bytes.get(h.range.clone()).unwrap_or_default();
                if opts.json {
                    writeln!(out, "{}", batch_json(&file, &h, batch, opts))?;
                } else {
                    write_batch_text(out, &h, batch, opts)?;
                }
                valid = h.range.end;
            }
            Ok(Entry::Legacy { range, .. }) => {
                let entry = bytes.get(range.clone()).unwrap_or_default();
                let l = LegacyEntry::parse(entry, range.start);
                if opts.json {
                    writeln!(out, "{}", l.json(&file))?;
                } else {
                    l.write_text(out, opts)?;
                }
                valid = range.end;
            }
            Ok(Entry::Truncated { .. }) => break,
            Err(e) => {
                corrupt = Some(e);
                break;
            }
        }
    }
    let invalid = bytes.len().saturating_sub(valid);
    if invalid > 0 {
        if let Some(e) = &corrupt {
            eprintln!("mirrorguard dump: {}: {e}", path.display());
        }
        if opts.json {
            let mut o = json!({"type": "invalidBytes", "file": file, "position": valid, "invalidBytes": invalid});
            if let Some(e) = corrupt {
                o["error"] = Value::String(e.to_string());
            }
            writeln!(out, "{o}")?;
        } else {
            writeln!(out, "Found {invalid} invalid bytes at the end of {name}")?;
        }
    }
    Ok(())
}

fn timestamp_type(h: &BatchHeader) -> &'static str {
    if h.is_log_append_time() {
        "LogAppendTime"
    } else {
        "CreateTime"
    }
}

fn write_batch_text(
    out: &mut dyn Write,
    h: &BatchHeader,
    batch: &[u8],
    opts: DumpOptions,
) -> io::Result<()> {
    let horizon = match h.delete_horizon_ms() {
        Some(ms) => format!("OptionalLong[{ms}]"),
        None => "OptionalLong.empty".to_owned(),
    };
    write!(
        out,
        "baseOffset: {} lastOffset: {} count: {} baseSequence: {} lastSequence: {} producerId: {} \
         producerEpoch: {} partitionLeaderEpoch: {} isTransactional: {} isControl: {} deleteHorizonMs: {} \
         position: {} {}: {} size: {} magic: {} compresscodec: {} crc: {} isvalid: {}",
        h.base_offset,
        h.last_offset(),
        h.records_count,
        h.base_sequence,
        h.last_sequence(),
        h.producer_id,
        h.producer_epoch,
        h.partition_leader_epoch,
        h.is_transactional(),
        h.is_control(),
        horizon,
        h.range.start,
        timestamp_type(h),
        h.max_timestamp,
        h.size(),
        h.magic,
        h.compression().name(),
        h.crc,
        rec::verify_crc(batch),
    )?;
    if let Some(d) = pid::decode(h.producer_id) {
        write!(
            out,
            " mappedPid: layout={} region={} originalPid={}",
            d.layout.name(),
            d.region,
            d.original
        )?;
    }
    writeln!(out)?;
    if !opts.deep_iteration {
        return Ok(());
    }
    let iter = match records(h, batch) {
        Ok(it) => it,
        Err(rec::record::RecordError::Compressed(codec)) => {
            return writeln!(out, "| records compressed with {codec}: not decoded");
        }
        Err(e) => return writeln!(out, "| error: {e}"),
    };
    for r in iter {
        match r {
            Ok(r) => write_record_text(out, h, &r, opts)?,
            Err(e) => writeln!(out, "| error: {e}")?,
        }
    }
    Ok(())
}

fn record_offset(h: &BatchHeader, r: &Record<'_>) -> i64 {
    h.base_offset.wrapping_add(i64::from(r.offset_delta))
}

fn record_timestamp(h: &BatchHeader, r: &Record<'_>) -> i64 {
    // Kafka's DefaultRecord: LogAppendTime batches report maxTimestamp.
    if h.is_log_append_time() {
        h.max_timestamp
    } else {
        h.base_timestamp.wrapping_add(r.timestamp_delta)
    }
}

fn header_keys(r: &Record<'_>) -> Vec<String> {
    r.headers()
        .map(|(k, _)| String::from_utf8_lossy(k).into_owned())
        .collect()
}

fn write_record_text(
    out: &mut dyn Write,
    h: &BatchHeader,
    r: &Record<'_>,
    opts: DumpOptions,
) -> io::Result<()> {
    let offset = record_offset(h, r);
    write!(
        out,
        "| offset: {} {}: {} keySize: {} valueSize: {} sequence: {} headerKeys: [{}]",
        offset,
        timestamp_type(h),
        record_timestamp(h, r),
        r.key_size(),
        r.value_size(),
        increment_sequence(h.base_sequence, r.offset_delta),
        header_keys(r).join(","),
    )?;
    if h.is_control() {
        match control::parse_record(r.key, r.value) {
            Ok(c) => match c.value {
                ControlValue::EndTxnMarker {
                    coordinator_epoch, ..
                } => write!(
                    out,
                    " endTxnMarker: {} coordinatorEpoch: {}",
                    c.key.control_type.name(),
                    coordinator_epoch
                )?,
                ControlValue::MirrorPidReset {
                    version,
                    source_cluster_id,
                } => write!(
                    out,
                    " MirrorPidReset {}",
                    Fields(vec![
                        ("version", json!(version)),
                        ("sourceClusterId", json!(source_cluster_id))
                    ])
                    .render()
                )?,
                ControlValue::Unknown => write!(
                    out,
                    " controlType: {}({})",
                    c.key.control_type.name(),
                    c.key.control_type.id()
                )?,
            },
            Err(e) => write!(out, " controlRecordError: {e}")?,
        }
    } else if opts.mirror_state {
        let (key, payload) = mirror_state_text(r, offset);
        write!(out, " key: {key}")?;
        if let Some(p) = payload {
            write!(out, " payload: {p}")?;
        }
    }
    writeln!(out)
}

fn batch_json(file: &str, h: &BatchHeader, batch: &[u8], opts: DumpOptions) -> Value {
    let mut o = json!({
        "type": "batch",
        "file": file,
        "position": h.range.start,
        "baseOffset": h.base_offset,
        "lastOffset": h.last_offset(),
        "count": h.records_count,
        "baseSequence": h.base_sequence,
        "lastSequence": h.last_sequence(),
        "producerId": h.producer_id,
        "producerEpoch": h.producer_epoch,
        "partitionLeaderEpoch": h.partition_leader_epoch,
        "isTransactional": h.is_transactional(),
        "isControl": h.is_control(),
        "deleteHorizonMs": h.delete_horizon_ms(),
        "timestampType": timestamp_type(h),
        "maxTimestamp": h.max_timestamp,
        "baseTimestamp": h.base_timestamp,
        "size": h.size(),
        "magic": h.magic,
        "compresscodec": h.compression().name(),
        "crc": h.crc,
        "isValid": rec::verify_crc(batch),
    });
    if let Some(d) = pid::decode(h.producer_id) {
        o["mappedPid"] =
            json!({"layout": d.layout.name(), "region": d.region, "originalPid": d.original});
    }
    if h.is_control() {
        o["control"] = match control::first_control_record(batch) {
            Ok(c) => control_json(&c),
            Err(e) => json!({"error": e.to_string()}),
        };
    }
    if opts.deep_iteration {
        o["records"] = match records(h, batch) {
            Ok(it) => Value::Array(
                it.map(|r| match r {
                    Ok(r) => record_json(h, &r, opts),
                    Err(e) => json!({"error": e.to_string()}),
                })
                .collect(),
            ),
            Err(e) => json!({"error": e.to_string()}),
        };
    }
    o
}

fn control_json(c: &control::ControlRecord<'_>) -> Value {
    let t = c.key.control_type;
    let mut o = json!({"type": t.name(), "typeId": t.id(), "keyVersion": c.key.version});
    match c.value {
        ControlValue::EndTxnMarker {
            version,
            coordinator_epoch,
        } => {
            o["version"] = json!(version);
            o["coordinatorEpoch"] = json!(coordinator_epoch);
        }
        ControlValue::MirrorPidReset {
            version,
            source_cluster_id,
        } => {
            o["version"] = json!(version);
            o["sourceClusterId"] = json!(source_cluster_id);
        }
        ControlValue::Unknown => {}
    }
    o
}

fn record_json(h: &BatchHeader, r: &Record<'_>, opts: DumpOptions) -> Value {
    let offset = record_offset(h, r);
    let mut o = json!({
        "offset": offset,
        "timestamp": record_timestamp(h, r),
        "keySize": r.key_size(),
        "valueSize": r.value_size(),
        "sequence": increment_sequence(h.base_sequence, r.offset_delta),
        "headerKeys": header_keys(r),
    });
    if h.is_control() {
        o["control"] = match control::parse_record(r.key, r.value) {
            Ok(c) => control_json(&c),
            Err(e) => json!({"error": e.to_string()}),
        };
    } else if opts.mirror_state {
        o["mirrorState"] = match decode_mirror_state(r.key, r.value) {
            Ok(MirrorState::Known {
                record_type,
                key,
                value,
            }) => json!({
                "key": {"type": record_type.to_string(), "data": key.to_value()},
                "payload": value.map(|(v, d)| json!({"version": v.to_string(), "data": d.to_value()})),
            }),
            Ok(MirrorState::UnknownType(t)) => json!({"error": format!("unknown record type {t}")}),
            Err(e) => json!({"error": e}),
        };
    }
    o
}

// ---------------------------------------------------------------------------
// __mirror_state records (SPEC 2.2): key = int16 record type + fields,
// value = int16 version + fields. New record types are added as rows of
// MIRROR_STATE_TYPES; nothing else has to change.

/// Decoder of one `__mirror_state` record type.
struct MirrorStateType {
    /// Record type (first int16 of the key).
    record_type: i16,
    /// Decodes the key fields after the type, consuming them all.
    key: fn(&mut Cursor<'_>) -> Result<Fields, &'static str>,
    /// Decodes the value fields after the version.
    value: fn(&mut Cursor<'_>, i16) -> Result<Fields, &'static str>,
}

/// All known `__mirror_state` record types.
const MIRROR_STATE_TYPES: &[MirrorStateType] = &[
    MirrorStateType {
        record_type: 3,
        key: collision_key,
        value: collision_value,
    },
    MirrorStateType {
        record_type: 4,
        key: topic_partition_key,
        value: partition_state_value,
    },
    MirrorStateType {
        record_type: 5,
        key: topic_partition_key,
        value: producer_snapshot_value,
    },
    MirrorStateType {
        record_type: crate::mirror::offline::SOURCE_TOPOLOGY_TYPE,
        key: mirror_name_key,
        value: source_topology_value,
    },
    MirrorStateType {
        record_type: crate::state_store::schema::PRODUCER_CLAIM_TYPE,
        key: producer_claim_key,
        value: producer_claim_value,
    },
    MirrorStateType {
        record_type: crate::state_store::schema::PRODUCER_SNAPSHOT_CHUNK_TYPE,
        key: snapshot_chunk_key,
        value: snapshot_chunk_value,
    },
];

fn mirror_name_key(c: &mut Cursor<'_>) -> Result<Fields, &'static str> {
    Ok(Fields(vec![("mirror", json!(string16(c)?))]))
}

/// Type 8 (decoded by `mirror::offline`, which owns the schema).
fn source_topology_value(c: &mut Cursor<'_>, version: i16) -> Result<Fields, &'static str> {
    let rest = c.bytes(c.remaining()).ok_or("truncated")?;
    let mut with_version = version.to_be_bytes().to_vec();
    with_version.extend_from_slice(rest);
    let (t, ts) = crate::mirror::offline::Topology::decode_value(&with_version)
        .map_err(|_| "malformed source topology")?
        .ok_or("source topology value version newer than this code")?;
    let brokers: Vec<Value> = t
        .brokers
        .iter()
        .map(|b| json!({"nodeId": b.node_id, "host": b.host, "port": b.port}))
        .collect();
    let topics: Vec<Value> = t
        .topics
        .iter()
        .map(|x| {
            json!({
                "name": x.name,
                "partitions": x.partitions.iter().map(|p| json!({"partition": p.index, "leader": p.leader, "leaderEpoch": p.leader_epoch})).collect::<Vec<_>>(),
            })
        })
        .collect();
    Ok(Fields(vec![
        ("sourceClusterId", json!(t.source_cluster_id)),
        ("timestampMs", json!(ts)),
        ("brokers", Value::Array(brokers)),
        ("topics", Value::Array(topics)),
    ]))
}

/// A decoded `__mirror_state` record.
enum MirrorState {
    Known {
        record_type: i16,
        key: Fields,
        value: Option<(i16, Fields)>,
    },
    UnknownType(i16),
}

/// JSON object fields in schema order. serde_json's `Map` sorts keys, but
/// Kafka's dump output lists fields in schema order, so text output is
/// rendered from this list directly.
struct Fields(Vec<(&'static str, Value)>);

impl Fields {
    /// Compact JSON text, fields in order.
    fn render(&self) -> String {
        let body: Vec<String> = self
            .0
            .iter()
            .map(|(k, v)| format!("{}:{}", Value::from(*k), v))
            .collect();
        format!("{{{}}}", body.join(","))
    }

    /// As a JSON value (keys sorted; for `--json`).
    fn to_value(&self) -> Value {
        Value::Object(
            self.0
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect(),
        )
    }
}

fn uuid_b64(c: &mut Cursor<'_>) -> Option<String> {
    let b: [u8; 16] = c.bytes(16)?.try_into().ok()?;
    Some(pid::ClusterId(b).to_base64())
}

/// Non-flexible string: int16 length, then UTF-8 bytes (null refused).
fn string16(c: &mut Cursor<'_>) -> Result<String, &'static str> {
    let len = c.i16().ok_or("truncated string length")?;
    let len = usize::try_from(len).map_err(|_| "null string")?;
    let b = c.bytes(len).ok_or("string extends past the record")?;
    std::str::from_utf8(b)
        .map(str::to_owned)
        .map_err(|_| "string is not UTF-8")
}

/// Compact string: unsigned varint length + 1, then UTF-8 bytes.
fn compact_string(c: &mut Cursor<'_>) -> Result<String, &'static str> {
    let n = c.uvarint().ok_or("bad compact string length")?;
    let len = n.checked_sub(1).ok_or("null string")?;
    let len = usize::try_from(len).map_err(|_| "bad compact string length")?;
    let b = c.bytes(len).ok_or("string extends past the record")?;
    std::str::from_utf8(b)
        .map(str::to_owned)
        .map_err(|_| "string is not UTF-8")
}

/// `MirrorPidCollisionKey` (type 3, version 0, not flexible).
fn collision_key(c: &mut Cursor<'_>) -> Result<Fields, &'static str> {
    let topic_id = uuid_b64(c).ok_or("truncated TopicId")?;
    let partition = c.i32().ok_or("truncated Partition")?;
    let source = string16(c)?;
    let original = c.i64().ok_or("truncated OriginalPid")?;
    Ok(Fields(vec![
        ("topicId", json!(topic_id)),
        ("partition", json!(partition)),
        ("sourceClusterId", json!(source)),
        ("originalPid", json!(original)),
    ]))
}

/// `MirrorPidCollisionValue` (version 0, flexible).
fn collision_value(c: &mut Cursor<'_>, _version: i16) -> Result<Fields, &'static str> {
    let salt = c.i64().ok_or("truncated Salt")?;
    let colliding = compact_string(c)?;
    let ts = c.i64().ok_or("truncated TimestampMs")?;
    c.skip_tagged_fields().ok_or("bad tagged fields")?;
    Ok(Fields(vec![
        ("salt", json!(salt)),
        ("collidingClusterId", json!(colliding)),
        ("timestampMs", json!(ts)),
    ]))
}

/// Compact nullable string: unsigned varint length + 1, 0 = null.
fn compact_nullable_string(c: &mut Cursor<'_>) -> Result<Option<String>, &'static str> {
    let n = c.uvarint().ok_or("bad compact string length")?;
    if n == 0 {
        return Ok(None);
    }
    let b = c
        .bytes(usize::try_from(n - 1).map_err(|_| "bad compact string length")?)
        .ok_or("string extends past the record")?;
    std::str::from_utf8(b)
        .map(|s| Some(s.to_owned()))
        .map_err(|_| "string is not UTF-8")
}

/// Key of types 4 (`MirrorPartitionStateKey`) and 5
/// (`MirrorProducerSnapshotKey`): TopicId, Partition (not flexible).
fn topic_partition_key(c: &mut Cursor<'_>) -> Result<Fields, &'static str> {
    let topic_id = uuid_b64(c).ok_or("truncated TopicId")?;
    let partition = c.i32().ok_or("truncated Partition")?;
    Ok(Fields(vec![
        ("topicId", json!(topic_id)),
        ("partition", json!(partition)),
    ]))
}

/// `MirrorPartitionStateValue` (version 0, flexible); schema in
/// `state_store::schema`.
fn partition_state_value(c: &mut Cursor<'_>, _version: i16) -> Result<Fields, &'static str> {
    let mirror = compact_string(c)?;
    let topic = compact_string(c)?;
    let state = c.u8().ok_or("truncated State")? as i8;
    let state_name = match state {
        0 => "MIRRORING".to_owned(),
        1 => "PAUSED".to_owned(),
        2 => "STOPPING".to_owned(),
        3 => "STOPPED".to_owned(),
        4 => "FAILED".to_owned(),
        other => format!("UNKNOWN({other})"),
    };
    let source = compact_string(c)?;
    let cut = c.i64().ok_or("truncated CutOffset")?;
    let seal = c.i32().ok_or("truncated SealBatches")?;
    let reason = compact_nullable_string(c)?;
    let ts = c.i64().ok_or("truncated TimestampMs")?;
    c.skip_tagged_fields().ok_or("bad tagged fields")?;
    Ok(Fields(vec![
        ("mirror", json!(mirror)),
        ("topicName", json!(topic)),
        ("state", json!(state_name)),
        ("sourceClusterId", json!(source)),
        ("cutOffset", json!(cut)),
        ("sealBatches", json!(seal)),
        ("reason", json!(reason)),
        ("timestampMs", json!(ts)),
    ]))
}

/// Key of type 6 (`MirrorProducerClaimKey`): TopicId, Partition, ProducerId.
fn producer_claim_key(c: &mut Cursor<'_>) -> Result<Fields, &'static str> {
    let mut f = topic_partition_key(c)?;
    let pid = c.i64().ok_or("truncated ProducerId")?;
    f.0.push(("producerId", json!(pid)));
    Ok(f)
}

/// `MirrorProducerClaimValue` (version 0, flexible).
fn producer_claim_value(c: &mut Cursor<'_>, _version: i16) -> Result<Fields, &'static str> {
    let origin = uuid_b64(c).ok_or("truncated OriginClusterId")?;
    let original = c.i64().ok_or("truncated OriginalPid")?;
    let ts = c.i64().ok_or("truncated TimestampMs")?;
    c.skip_tagged_fields().ok_or("bad tagged fields")?;
    Ok(Fields(vec![
        ("originClusterId", json!(origin)),
        ("originalPid", json!(original)),
        ("timestampMs", json!(ts)),
    ]))
}

/// Key of type 7 (`MirrorProducerSnapshotChunkKey`): TopicId, Partition,
/// Generation, Chunk.
fn snapshot_chunk_key(c: &mut Cursor<'_>) -> Result<Fields, &'static str> {
    let mut f = topic_partition_key(c)?;
    let generation = c.i64().ok_or("truncated Generation")?;
    let chunk = c.i32().ok_or("truncated Chunk")?;
    f.0.push(("generation", json!(generation)));
    f.0.push(("chunk", json!(chunk)));
    Ok(f)
}

/// `MirrorProducerSnapshotChunkValue` (version 0, flexible).
fn snapshot_chunk_value(c: &mut Cursor<'_>, _version: i16) -> Result<Fields, &'static str> {
    let snapshot_offset = c.i64().ok_or("truncated SnapshotOffset")?;
    let count = c.i32().ok_or("truncated ChunkCount")?;
    let producers = producer_entries(c)?;
    c.skip_tagged_fields().ok_or("bad tagged fields")?;
    Ok(Fields(vec![
        ("snapshotOffset", json!(snapshot_offset)),
        ("chunkCount", json!(count)),
        ("producers", Value::Array(producers)),
    ]))
}

/// `MirrorProducerSnapshotValue` (version 0, flexible). The producer array
/// is read entry by entry; nothing is sized from the wire count.
fn producer_snapshot_value(c: &mut Cursor<'_>, _version: i16) -> Result<Fields, &'static str> {
    let snapshot_offset = c.i64().ok_or("truncated SnapshotOffset")?;
    let producers = producer_entries(c)?;
    c.skip_tagged_fields().ok_or("bad tagged fields")?;
    Ok(Fields(vec![
        ("snapshotOffset", json!(snapshot_offset)),
        ("producers", Value::Array(producers)),
    ]))
}

/// The producer array of types 5 and 7, entry by entry.
fn producer_entries(c: &mut Cursor<'_>) -> Result<Vec<Value>, &'static str> {
    let n = c.uvarint().ok_or("bad Producers length")?;
    let count = n.checked_sub(1).ok_or("null Producers array")?;
    let mut producers = Vec::new();
    for _ in 0..count {
        let t = "truncated producer entry";
        let pid = c.i64().ok_or(t)?;
        let origin = uuid_b64(c).ok_or(t)?;
        let original = c.i64().ok_or(t)?;
        let epoch = c.i16().ok_or(t)?;
        let last_seq = c.i32().ok_or(t)?;
        let last_offset = c.i64().ok_or(t)?;
        let coord = c.i32().ok_or(t)?;
        let txn_first = c.i64().ok_or(t)?;
        let last_ts = c.i64().ok_or(t)?;
        c.skip_tagged_fields().ok_or("bad tagged fields")?;
        producers.push(json!({
            "producerId": pid,
            "originClusterId": origin,
            "originalPid": original,
            "producerEpoch": epoch,
            "lastSequence": last_seq,
            "lastOffset": last_offset,
            "coordinatorEpoch": coord,
            "txnFirstOffset": txn_first,
            "lastTimestamp": last_ts,
        }));
    }
    Ok(producers)
}

fn decode_mirror_state(key: Option<&[u8]>, value: Option<&[u8]>) -> Result<MirrorState, String> {
    let key = key.ok_or("missing key")?;
    let mut kc = Cursor::new(key);
    let t = kc.i16().ok_or("key shorter than its record type")?;
    let Some(d) = MIRROR_STATE_TYPES.iter().find(|d| d.record_type == t) else {
        return Ok(MirrorState::UnknownType(t));
    };
    let key = (d.key)(&mut kc)?;
    if kc.remaining() != 0 {
        return Err("unexpected bytes after the key".into());
    }
    let Some(value) = value else {
        return Ok(MirrorState::Known {
            record_type: t,
            key,
            value: None,
        });
    };
    let mut vc = Cursor::new(value);
    let version = vc.i16().ok_or("value shorter than its version")?;
    if version < 0 {
        return Err(format!("invalid value version {version}"));
    }
    let data = (d.value)(&mut vc, version)?;
    // Version 0 must be consumed exactly; later versions may append fields.
    if version == 0 && vc.remaining() != 0 {
        return Err("unexpected bytes after the value".into());
    }
    Ok(MirrorState::Known {
        record_type: t,
        key,
        value: Some((version, data)),
    })
}

/// Text for ` key: … payload: …`, in the phrasing of Kafka's offsets decoder.
fn mirror_state_text(r: &Record<'_>, offset: i64) -> (String, Option<String>) {
    match decode_mirror_state(r.key, r.value) {
        Ok(MirrorState::Known {
            record_type,
            key,
            value,
        }) => (
            format!("{{\"type\":\"{record_type}\",\"data\":{}}}", key.render()),
            Some(value.map_or_else(
                || "<DELETE>".to_owned(),
                |(version, data)| {
                    format!("{{\"version\":\"{version}\",\"data\":{}}}", data.render())
                },
            )),
        ),
        Ok(MirrorState::UnknownType(t)) => (
            format!("Unknown record type {t} at offset {offset}, skipping."),
            None,
        ),
        Err(e) => (format!("Error at offset {offset}, skipping. {e}"), None),
    }
}

// ---------------------------------------------------------------------------
// Legacy v0/v1 entries: shown at batch level like Kafka; their CRC is IEEE
// CRC-32 (not CRC-32C) over magic..end.

struct LegacyEntry<'a> {
    position: usize,
    offset: i64,
    size: usize,
    crc: u32,
    valid: bool,
    magic: u8,
    attributes: u8,
    timestamp: i64,
    key: Option<&'a [u8]>,
    value: Option<&'a [u8]>,
    parsed: bool,
}

impl<'a> LegacyEntry<'a> {
    fn parse(e: &'a [u8], position: usize) -> Self {
        let mut c = Cursor::new(e);
        let offset = c.i64().unwrap_or(-1);
        let _size = c.i32();
        let crc = rec::read_u32(e, 12).unwrap_or(0);
        let covered = e.get(16..).unwrap_or_default();
        let magic = e.get(16).copied().unwrap_or(0);
        let attributes = e.get(17).copied().unwrap_or(0);
        let mut body = Cursor::new(e.get(18..).unwrap_or_default());
        let timestamp = if magic == 1 { body.i64() } else { Some(-1) };
        let mut field = || -> Option<Option<&'a [u8]>> {
            let len = body.i32()?;
            match usize::try_from(len) {
                Ok(n) => Some(Some(body.bytes(n)?)),
                Err(_) => Some(None),
            }
        };
        let key = field();
        let value = field();
        let parsed = timestamp.is_some() && key.is_some() && value.is_some();
        LegacyEntry {
            position,
            offset,
            size: e.len(),
            crc,
            valid: crc32_ieee(covered) == crc,
            magic,
            attributes,
            timestamp: timestamp.unwrap_or(-1),
            key: key.flatten(),
            value: value.flatten(),
            parsed,
        }
    }

    fn timestamp_type(&self) -> &'static str {
        match (self.magic, self.attributes & 0x08 != 0) {
            (0, _) => "NoTimestampType",
            (_, true) => "LogAppendTime",
            (_, false) => "CreateTime",
        }
    }

    fn codec(&self) -> &'static str {
        Compression::from_attributes(i16::from(self.attributes)).name()
    }

    fn write_text(&self, out: &mut dyn Write, opts: DumpOptions) -> io::Result<()> {
        writeln!(
            out,
            "offset: {} position: {} {}: {} size: {} magic: {} compresscodec: {} crc: {} isvalid: {}",
            self.offset,
            self.position,
            self.timestamp_type(),
            self.timestamp,
            self.size,
            self.magic,
            self.codec(),
            self.crc,
            self.valid
        )?;
        if !opts.deep_iteration {
            return Ok(());
        }
        if self.attributes & 0x07 != 0 {
            return writeln!(
                out,
                "| records compressed with {}: not decoded",
                self.codec()
            );
        }
        if !self.parsed {
            return writeln!(out, "| error: malformed legacy message");
        }
        // Kafka's format string really has the stray closing brace.
        writeln!(
            out,
            "| offset: {} {}: {} keySize: {} valueSize: {} isValid: {} crc: {}}}",
            self.offset,
            self.timestamp_type(),
            self.timestamp,
            self.key.map_or(-1, |k| k.len() as i64),
            self.value.map_or(-1, |v| v.len() as i64),
            self.valid,
            self.crc
        )
    }

    fn json(&self, file: &str) -> Value {
        let mut o = Map::new();
        o.insert("type".into(), json!("legacy"));
        o.insert("file".into(), json!(file));
        o.insert("position".into(), json!(self.position));
        o.insert("offset".into(), json!(self.offset));
        o.insert("timestampType".into(), json!(self.timestamp_type()));
        o.insert("maxTimestamp".into(), json!(self.timestamp));
        o.insert("size".into(), json!(self.size));
        o.insert("magic".into(), json!(self.magic));
        o.insert("compresscodec".into(), json!(self.codec()));
        o.insert("crc".into(), json!(self.crc));
        o.insert("isValid".into(), json!(self.valid));
        Value::Object(o)
    }
}

/// IEEE CRC-32 table (reflected polynomial 0xEDB88320), for legacy entries.
const CRC32_TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// IEEE CRC-32 (`java.util.zip.CRC32`).
pub fn crc32_ieee(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c = CRC32_TABLE[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}
