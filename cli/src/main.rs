//! `fjord`: one thin binary over the Fjord libraries.
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "fjord", version, about = "Fjord: a partitioned, replicated commit log for event data")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the whole system on this machine (not available yet: the broker is being built).
    Dev {
        /// Where data lives.
        #[arg(long, default_value = "./fjord-data")]
        data_dir: std::path::PathBuf,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Dev { .. } => {
            anyhow::bail!("`fjord dev` needs the broker, which is not built yet (see the open issues)")
        }
    }
}
