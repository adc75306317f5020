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
//!   in `state_store::schema`, type 8 in `mirror::offline`, type 9 in
//!   `state_store::schema::serving`) get ` key: {json} payload: {json}`
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
//!
//! (Over 600 lines on purpose: one command's output, segment walking and
//! `kafka-dump-log.sh` layout, kept together.)

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::{json, Map, Value};

use crate::mirror::offline::SOURCE_TOPOLOGY_TYPE;
use crate::pid;
use crate::records::batch::{increment_sequence, BatchHeader, Compression, Entry};
use crate::records::control::{self, ControlValue};
use crate::records::record::{records, Record};
use crate::records::{self as rec, BatchError};
use crate::state_store::schema::serving::{
    MirrorPartitionServingKey, MirrorPartitionServingValue, PARTITION_SERVING_TYPE,
};
use crate::state_store::schema::{self, MirrorPartitionState, SchemaError, StateKey, StateRecord};
use crate::wire::{Reader, WireError};

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
            Err(e) => json!({"error": e.to_string()}),
        };
    }
    o
}

// ---------------------------------------------------------------------------
// __mirror_state records (SPEC 2.2): key = int16 record type + fields,
// value = int16 version + fields. Types 3 to 7 are decoded by
// `state_store::schema` (the decoder the state store itself uses), type 8 by
// `mirror::offline` and type 9 by `state_store::schema::serving`, which own
// theirs; this part only renders them.

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

fn uuid_b64(id: &[u8; 16]) -> String {
    pid::ClusterId(*id).to_base64()
}

/// `topicId`, `partition`: the first two fields of every key of types 4-7 and 9.
fn topic_partition(topic_id: &[u8; 16], partition: i32) -> Vec<(&'static str, Value)> {
    vec![
        ("topicId", json!(uuid_b64(topic_id))),
        ("partition", json!(partition)),
    ]
}

fn producers_json(producers: &[schema::SnapshotProducer]) -> Value {
    Value::Array(
        producers
            .iter()
            .map(|p| {
                json!({
                    "producerId": p.producer_id,
                    "originClusterId": uuid_b64(&p.origin_cluster_id),
                    "originalPid": p.original_pid,
                    "producerEpoch": p.producer_epoch,
                    "lastSequence": p.last_sequence,
                    "lastOffset": p.last_offset,
                    "coordinatorEpoch": p.coordinator_epoch,
                    "txnFirstOffset": p.txn_first_offset,
                    "lastTimestamp": p.last_timestamp,
                })
            })
            .collect(),
    )
}

/// The transaction closings a type-5 record or a last type-7 chunk carries
/// (tag 0), if any: `None` when the tag is absent, an `error` object when it
/// does not decode.
fn closings_json(tags: &[schema::RawTaggedField]) -> Option<Value> {
    match schema::SnapshotClosings::from_tags(tags) {
        Ok(None) => None,
        Err(e) => Some(json!({ "error": e.to_string() })),
        Ok(Some(c)) => Some(json!({
            "keptFrom": c.kept_from,
            "droppedUpto": c.dropped_upto,
            "closings": c.closings.iter().map(|t| json!({
                "markerOffset": t.marker_offset,
                "producerId": t.producer_id,
                "producerEpoch": t.producer_epoch,
                "firstOffset": t.first_offset,
                "coordinatorEpoch": t.coordinator_epoch,
                "originClusterId": uuid_b64(&t.origin_cluster_id),
                "originalPid": t.original_pid,
            })).collect::<Vec<_>>(),
        })),
    }
}

/// The key fields of a known record type.
fn key_fields(key: &StateKey) -> Fields {
    Fields(match key {
        StateKey::PidCollision(k) => vec![
            ("topicId", json!(uuid_b64(&k.topic_id))),
            ("partition", json!(k.partition)),
            ("sourceClusterId", json!(k.source_cluster_id)),
            ("originalPid", json!(k.original_pid)),
        ],
        StateKey::PartitionState(k) => topic_partition(&k.topic_id, k.partition),
        StateKey::ProducerSnapshot(k) => topic_partition(&k.topic_id, k.partition),
        StateKey::ProducerClaim(k) => {
            let mut f = topic_partition(&k.topic_id, k.partition);
            f.push(("producerId", json!(k.producer_id)));
            f
        }
        StateKey::ProducerSnapshotChunk(k) => {
            let mut f = topic_partition(&k.topic_id, k.partition);
            f.push(("generation", json!(k.generation)));
            f.push(("chunk", json!(k.chunk)));
            f
        }
    })
}

/// The key and (unless a tombstone) the value fields of a decoded record.
fn record_fields(rec: &StateRecord) -> Option<(StateKey, Option<Fields>)> {
    let key = rec.key()?;
    let value = match rec {
        StateRecord::PidCollision { value, .. } => value.as_ref().map(|v| {
            vec![
                ("salt", json!(v.salt)),
                ("collidingClusterId", json!(v.colliding_cluster_id)),
                ("timestampMs", json!(v.timestamp_ms)),
            ]
        }),
        StateRecord::PartitionState { value, .. } => value.as_ref().map(|v| {
            let state = match v.state {
                MirrorPartitionState::Other(c) => format!("UNKNOWN({c})"),
                s => s.name().to_owned(),
            };
            vec![
                ("mirror", json!(v.mirror)),
                ("topicName", json!(v.topic_name)),
                ("state", json!(state)),
                ("sourceClusterId", json!(v.source_cluster_id)),
                ("cutOffset", json!(v.cut_offset)),
                ("sealBatches", json!(v.seal_batches)),
                ("reason", json!(v.reason)),
                ("timestampMs", json!(v.timestamp_ms)),
            ]
        }),
        StateRecord::ProducerSnapshot { value, .. } => value.as_ref().map(|v| {
            let mut f = vec![
                ("snapshotOffset", json!(v.snapshot_offset)),
                ("producers", producers_json(&v.producers)),
            ];
            f.extend(closings_json(&v.unknown_tagged_fields).map(|c| ("closings", c)));
            f
        }),
        StateRecord::ProducerClaim { value, .. } => value.as_ref().map(|v| {
            vec![
                ("originClusterId", json!(uuid_b64(&v.origin_cluster_id))),
                ("originalPid", json!(v.original_pid)),
                ("timestampMs", json!(v.timestamp_ms)),
            ]
        }),
        StateRecord::ProducerSnapshotChunk { value, .. } => value.as_ref().map(|v| {
            let mut f = vec![
                ("snapshotOffset", json!(v.snapshot_offset)),
                ("chunkCount", json!(v.chunk_count)),
                ("producers", producers_json(&v.producers)),
            ];
            f.extend(closings_json(&v.unknown_tagged_fields).map(|c| ("closings", c)));
            f
        }),
        StateRecord::NewerVersion { .. } | StateRecord::Unknown { .. } => None,
    };
    Some((key, value.map(Fields)))
}

/// A schema error in the short phrasing of the dump lines: a truncated field
/// is named by its last path segment (`truncated Partition`).
fn schema_error_text(e: &SchemaError) -> String {
    match e {
        SchemaError::ShortKey(_) => "key shorter than its record type".to_owned(),
        SchemaError::Wire(WireError::Truncated { field, .. })
            if *field == "MirrorStateValue.version" =>
        {
            "value shorter than its version".to_owned()
        }
        SchemaError::Wire(WireError::Truncated { field, .. }) => {
            format!("truncated {}", field.rsplit('.').next().unwrap_or(field))
        }
        SchemaError::TrailingBytes { what, .. } => format!("unexpected bytes after the {what}"),
        SchemaError::InvalidVersion { version, .. } => format!("invalid value version {version}"),
        SchemaError::Wire(w) => w.to_string(),
    }
}

/// Why a `__mirror_state` record cannot be shown decoded; its `Display` is
/// the short phrasing of the dump lines.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum StateDecodeError {
    /// The schema module refused the record.
    #[error("{}", schema_error_text(.0))]
    Schema(SchemaError),
    /// The record has no key.
    #[error("missing key")]
    MissingKey,
    /// The key has bytes after its fields.
    #[error("unexpected bytes after the key")]
    TrailingKeyBytes,
    /// The value has fewer than two bytes.
    #[error("value shorter than its version")]
    ShortValue,
    /// A negative value version.
    #[error("invalid value version {0}")]
    InvalidVersion(i16),
    /// A type-8 value that does not parse.
    #[error("malformed source topology")]
    MalformedTopology,
    /// A type-8 value written by a newer mirrorguard.
    #[error("source topology value version newer than this code")]
    NewerTopology,
    /// A type-9 value written by a newer mirrorguard.
    #[error("serving value version newer than this code")]
    NewerServing,
    /// A known record the dump has no field list for.
    #[error("undecodable record")]
    Undecodable,
}

impl From<SchemaError> for StateDecodeError {
    fn from(e: SchemaError) -> Self {
        Self::Schema(e)
    }
}

/// Type 8 (decoded by `mirror::offline`, which owns the schema).
fn source_topology(key: &[u8], value: Option<&[u8]>) -> Result<MirrorState, StateDecodeError> {
    let mut kr = Reader::at(key, 2);
    let mirror = kr
        .read_string("MirrorSourceTopologyKey.Mirror")
        .map_err(SchemaError::from)?;
    if !kr.is_empty() {
        return Err(StateDecodeError::TrailingKeyBytes);
    }
    let key = Fields(vec![("mirror", json!(mirror))]);
    let Some(value) = value else {
        return Ok(MirrorState::Known {
            record_type: SOURCE_TOPOLOGY_TYPE,
            key,
            value: None,
        });
    };
    let version = value_version(value)?;
    let (t, ts) = crate::mirror::offline::Topology::decode_value(value)
        .map_err(|_| StateDecodeError::MalformedTopology)?
        .ok_or(StateDecodeError::NewerTopology)?;
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
    let data = Fields(vec![
        ("sourceClusterId", json!(t.source_cluster_id)),
        ("timestampMs", json!(ts)),
        ("brokers", Value::Array(brokers)),
        ("topics", Value::Array(topics)),
    ]);
    Ok(MirrorState::Known {
        record_type: SOURCE_TOPOLOGY_TYPE,
        key,
        value: Some((version, data)),
    })
}

/// The version at the head of a `__mirror_state` value (types 8 and 9
/// decode it themselves before their schema's decoder).
fn value_version(value: &[u8]) -> Result<i16, StateDecodeError> {
    let version = Reader::new(value)
        .read_i16("MirrorStateValue.version")
        .map_err(|_| StateDecodeError::ShortValue)?;
    if version < 0 {
        return Err(StateDecodeError::InvalidVersion(version));
    }
    Ok(version)
}

/// Type 9 (decoded by `state_store::schema::serving`, which owns the
/// schema): which instance serves a destination partition.
fn partition_serving(key: &[u8], value: Option<&[u8]>) -> Result<MirrorState, StateDecodeError> {
    let k = MirrorPartitionServingKey::decode(key).map_err(SchemaError::from)?;
    // The key is fixed-size; anything after the partition is not ours.
    if key.len() != k.encode().len() {
        return Err(StateDecodeError::TrailingKeyBytes);
    }
    let key = Fields(topic_partition(&k.topic_id, k.partition));
    let Some(value) = value else {
        return Ok(MirrorState::Known {
            record_type: PARTITION_SERVING_TYPE,
            key,
            value: None,
        });
    };
    let version = value_version(value)?;
    let v = MirrorPartitionServingValue::decode(value)
        .map_err(SchemaError::from)?
        .ok_or(StateDecodeError::NewerServing)?;
    let data = Fields(vec![
        ("instanceId", json!(v.instance_id)),
        ("mirror", json!(v.mirror)),
        ("topicName", json!(v.topic_name)),
        ("fromOffset", json!(v.from_offset)),
        ("timestampMs", json!(v.timestamp_ms)),
    ]);
    Ok(MirrorState::Known {
        record_type: PARTITION_SERVING_TYPE,
        key,
        value: Some((version, data)),
    })
}

fn decode_mirror_state(
    key: Option<&[u8]>,
    value: Option<&[u8]>,
) -> Result<MirrorState, StateDecodeError> {
    let key = key.ok_or(StateDecodeError::MissingKey)?;
    if key.get(..2) == Some(&SOURCE_TOPOLOGY_TYPE.to_be_bytes()[..]) {
        return source_topology(key, value);
    }
    if key.get(..2) == Some(&PARTITION_SERVING_TYPE.to_be_bytes()[..]) {
        return partition_serving(key, value);
    }
    let rec = schema::decode_for_display(key, value)?;
    if let StateRecord::Unknown { record_type } = rec {
        return Ok(MirrorState::UnknownType(record_type));
    }
    let (skey, fields) = record_fields(&rec).ok_or(StateDecodeError::Undecodable)?;
    let record_type = Reader::new(key)
        .read_i16("MirrorStateKey.type")
        .map_err(SchemaError::from)?;
    let version = value
        .and_then(|v| Reader::new(v).read_i16("MirrorStateValue.version").ok())
        .unwrap_or(0);
    Ok(MirrorState::Known {
        record_type,
        key: key_fields(&skey),
        value: fields.map(|f| (version, f)),
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
        let offset = Reader::new(e).read_i64("LegacyEntry.offset").unwrap_or(-1);
        let crc = rec::read_u32(e, 12).unwrap_or(0);
        let covered = e.get(16..).unwrap_or_default();
        let magic = e.get(16).copied().unwrap_or(0);
        let attributes = e.get(17).copied().unwrap_or(0);
        let mut body = Reader::new(e.get(18..).unwrap_or_default());
        let timestamp = if magic == 1 {
            body.read_i64("LegacyEntry.timestamp").ok()
        } else {
            Some(-1)
        };
        // Legacy key and value: int32 length (negative = null), then bytes.
        let mut field = || -> Option<Option<&'a [u8]>> {
            let len = body.read_i32("LegacyEntry.field").ok()?;
            match usize::try_from(len) {
                Ok(n) => Some(Some(body.take(n, "LegacyEntry.field").ok()?)),
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

/// IEEE CRC-32 (`java.util.zip.CRC32`), the checksum of legacy v0/v1
/// messages only (v2 batches use CRC-32C).
pub fn crc32_ieee(data: &[u8]) -> u32 {
    crc32fast::hash(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot's closings (tag 0) are shown, on a type-5 record and on a
    /// type-7 chunk alike; a record without the tag shows none.
    #[test]
    fn snapshot_closings_are_shown() {
        let c = schema::SnapshotClosings {
            kept_from: 5,
            dropped_upto: -1,
            closings: vec![schema::SnapshotClosing {
                marker_offset: 9,
                producer_id: 7,
                producer_epoch: 1,
                first_offset: 6,
                coordinator_epoch: 2,
                origin_cluster_id: [0; 16],
                original_pid: 3,
            }],
        };
        let tags = vec![c.encode_tag().unwrap()];
        let shown = closings_json(&tags).unwrap();
        assert_eq!(shown["keptFrom"], 5);
        assert_eq!(shown["closings"][0]["markerOffset"], 9);
        assert_eq!(shown["closings"][0]["originalPid"], 3);
        assert!(closings_json(&[]).is_none());

        let chunk = StateRecord::ProducerSnapshotChunk {
            key: schema::MirrorProducerSnapshotChunkKey {
                topic_id: [1; 16],
                partition: 0,
                generation: 1,
                chunk: 0,
            },
            value: Some(schema::MirrorProducerSnapshotChunkValue {
                snapshot_offset: 10,
                chunk_count: 1,
                producers: Vec::new(),
                unknown_tagged_fields: tags,
            }),
        };
        let (_, fields) = record_fields(&chunk).unwrap();
        let fields = fields.unwrap();
        assert!(fields
            .0
            .iter()
            .any(|(k, v)| *k == "closings" && *v == shown));
    }
}
