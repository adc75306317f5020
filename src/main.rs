//! The `mirrorguard` command line: `run` (the proxy), `dump`, `map`, `ctl`.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "mirrorguard",
    version,
    about = "Kafka-protocol sidecar proxy for safe cross-cluster mirroring"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Dump Kafka log segments (kafka-dump-log layout).
    Dump(mirrorguard::dump::DumpArgs),
    /// Map a PID into a region, or decode a mapped PID.
    Map(mirrorguard::pid::MapArgs),
    /// Call the admin API (partitions, stop, pause, resume, protect, producers, collisions, anomalies).
    Ctl(mirrorguard::ctl::CtlArgs),
    /// Print a `[[mirror]].listener_sasl` credential-file line (salted
    /// SCRAM credential) for a user whose password is read from stdin.
    SaslCredential(mirrorguard::sasl::server::CredentialArgs),
    /// Run the proxy.
    Run {
        /// Path of proxy.toml.
        #[arg(long, short = 'c', env = "MIRRORGUARD_CONFIG")]
        config: std::path::PathBuf,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Dump(args) => mirrorguard::dump::run(&args),
        Command::Map(args) => mirrorguard::pid::run_map(&args),
        Command::Ctl(args) => mirrorguard::ctl::run(&args),
        Command::SaslCredential(args) => mirrorguard::sasl::server::run_credential(&args),
        Command::Run { config } => match mirrorguard::run::run(&config) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("mirrorguard: {e:#}");
                std::process::ExitCode::from(2)
            }
        },
    }
}
