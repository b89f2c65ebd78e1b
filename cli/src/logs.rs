//! `fjord logs orphans`: the log directories a broker moved aside at start because the
//! metadata did not assign them to it (`<topic>-<partition>-orphan-<unix ms>`). A broker
//! never deletes those by itself; this lists them and, with `--delete`, deletes them.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};

#[derive(Args, Debug)]
pub(crate) struct LogsArgs {
    #[command(subcommand)]
    command: LogsCommand,
}

#[derive(Subcommand, Debug)]
enum LogsCommand {
    /// List the log directories moved aside as unknown to the metadata; `--delete`
    /// deletes them (their data is gone for good).
    Orphans {
        /// The broker's data dir (`log.dirs`), as given to `fjord broker` or `fjord dev`.
        #[arg(long)]
        data_dir: PathBuf,
        /// Delete every listed directory.
        #[arg(long)]
        delete: bool,
    },
}

pub(crate) fn run(args: LogsArgs) -> anyhow::Result<()> {
    let LogsCommand::Orphans { data_dir, delete } = args.command;
    let orphans =
        fjord_log::orphans(&data_dir).with_context(|| format!("listing orphaned log directories in {}", data_dir.display()))?;
    if orphans.is_empty() {
        println!("no orphaned log directories in {}", data_dir.display());
    }
    for orphan in &orphans {
        println!(
            "{}\tpartition {}\tmoved aside at {} ms since the epoch\t{} bytes",
            orphan.path.display(),
            orphan.partition,
            orphan.moved_at_ms,
            orphan.bytes
        );
        if delete {
            fjord_log::delete_orphan(&orphan.path)?;
            println!("deleted {}", orphan.path.display());
        }
    }
    Ok(())
}
