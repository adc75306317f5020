//! The `mirrorguard` command line: `run` (the proxy), `dump`, `map`, `ctl`.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "mirrorguard", version, about = "Kafka-protocol sidecar proxy for safe cross-cluster mirroring")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
    }
}
