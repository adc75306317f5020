//! `mirrorguard map`: compute a mapped PID, or take one apart.
//!
//! The mapped PID is printed alone on the last line so scripts can use
//! `mirrorguard map ... | tail -n1`.

use std::process::ExitCode;

use super::{decode, fold, map_pid, ClusterId, ClusterIdError, Layout, MapOutcome};

/// Why `mirrorguard map` computed nothing.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    /// Neither `--decode` nor both of `--source-cluster-id` and `--pid`.
    #[error("--source-cluster-id and --pid are required (or use --decode PID)")]
    MissingArguments,
    /// The cluster id does not parse.
    #[error(transparent)]
    ClusterId(#[from] ClusterIdError),
    /// The sign-bit layout would map this PID to -1.
    #[error(
        "PID {pid} in this region maps to -1 (no producer) under the sign-bit layout; use another salt"
    )]
    ReservedValue {
        /// The source PID.
        pid: i64,
    },
}

/// `--layout` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LayoutArg {
    /// EOS-safe layout (bits 63..62 = 01).
    High,
    /// Seed layout (bit 63 set).
    SignBit,
}

impl From<LayoutArg> for Layout {
    fn from(l: LayoutArg) -> Self {
        match l {
            LayoutArg::High => Layout::High,
            LayoutArg::SignBit => Layout::SignBit,
        }
    }
}

/// Arguments of `mirrorguard map`.
#[derive(Debug, Clone, clap::Args)]
pub struct MapArgs {
    /// Source cluster id (Kafka base64 form or canonical UUID text). Kafka's
    /// base64 ids may start with '-', so values starting with '-' are taken as
    /// the id (`--source-cluster-id -tjk3...` and `--source-cluster-id=-tjk3...`).
    #[arg(long, required_unless_present = "decode", allow_hyphen_values = true)]
    pub source_cluster_id: Option<String>,
    /// Producer id on the source cluster.
    #[arg(
        long,
        required_unless_present = "decode",
        allow_negative_numbers = true
    )]
    pub pid: Option<i64>,
    /// Salt added to the cluster fold (0 unless a collision was resolved).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub salt: i64,
    /// PID layout.
    #[arg(long, value_enum, default_value_t = LayoutArg::High)]
    pub layout: LayoutArg,
    /// Decode a mapped PID instead (layout, region, original PID).
    #[arg(long, allow_negative_numbers = true, conflicts_with_all = ["source_cluster_id", "pid", "salt"])]
    pub decode: Option<i64>,
}

/// Runs `mirrorguard map`, writing to stdout/stderr.
pub fn run_map(args: &MapArgs) -> ExitCode {
    match map_lines(args) {
        Ok(lines) => {
            for l in lines {
                println!("{l}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("mirrorguard map: {e}");
            ExitCode::from(2)
        }
    }
}

/// The lines `mirrorguard map` prints (kept separate for tests).
pub fn map_lines(args: &MapArgs) -> Result<Vec<String>, MapError> {
    if let Some(pid) = args.decode {
        return Ok(match decode(pid) {
            Some(d) => vec![
                format!("layout: {}", d.layout.name()),
                format!("region: {}", d.region),
                format!("originalPid: {}", d.original),
            ],
            None => vec![format!("{pid} is not a mapped PID")],
        });
    }
    let (Some(id), Some(pid)) = (&args.source_cluster_id, args.pid) else {
        return Err(MapError::MissingArguments);
    };
    let id = ClusterId::parse(id)?;
    let layout = Layout::from(args.layout);
    let f = fold(&id);
    let mut lines = vec![format!(
        "sourceClusterId: {} ({}) fold: {} layout: {} salt: {}",
        id,
        id.to_uuid_string(),
        f,
        layout.name(),
        args.salt
    )];
    let outcome = map_pid(pid, f, args.salt, layout);
    let mapped = match outcome {
        MapOutcome::NoProducer => {
            lines.push("-1 means no producer: left untouched".into());
            pid
        }
        MapOutcome::AlreadyMapped(p) => {
            lines.push("already mapped: passes through unchanged".into());
            p
        }
        MapOutcome::Mapped(p) => p,
        MapOutcome::Oversized { mapped, folded } => {
            lines.push(format!(
                "warning: source PID {pid} is >= 2^31; folded to {folded}, the proxy routes it through collision handling"
            ));
            mapped
        }
        MapOutcome::ReservedValue => return Err(MapError::ReservedValue { pid }),
    };
    lines.push(mapped.to_string());
    Ok(lines)
}
