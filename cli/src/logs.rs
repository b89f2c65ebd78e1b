//! `fjord logs orphans`: the log directories a broker moved aside at start because the
//! metadata did not assign them to it (`<topic>-<partition>-orphan-<unix ms>`). A broker
//! never deletes those by itself; this lists them and, with `--delete`, deletes them.
//!
//! `fjord logs repair`: with the broker stopped, truncates a partition's log at its first
//! bad batch and keeps what it cuts in `<topic>-<partition>-damaged-<unix ms>/` (see
//! `fjord_log::repair_partition`); `--dry-run` says the same and writes nothing.

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
    /// Truncate a partition's log at its first damaged batch, with the broker stopped;
    /// the damaged batch and everything after it are kept in a side directory.
    Repair {
        /// The broker's data dir (`log.dirs`).
        #[arg(long)]
        data_dir: PathBuf,
        /// The topic.
        #[arg(long)]
        topic: String,
        /// The partition.
        #[arg(long)]
        partition: i32,
        /// Say what would be kept and moved aside, and write nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

pub(crate) fn run(args: LogsArgs) -> anyhow::Result<()> {
    match args.command {
        LogsCommand::Orphans { data_dir, delete } => orphans(data_dir, delete),
        LogsCommand::Repair { data_dir, topic, partition, dry_run } => repair(data_dir, topic, partition, dry_run),
    }
}

fn repair(data_dir: PathBuf, topic: String, partition: i32, dry_run: bool) -> anyhow::Result<()> {
    let tp = fjord_log::TopicPartition::new(topic, partition);
    let repair = fjord_log::repair_partition(&data_dir, &tp, dry_run, fjord_record::now_ms() as u64).map_err(|e| match e {
        fjord_log::Error::InUse { .. } => anyhow::anyhow!("{e}: stop the broker before repairing its logs"),
        e => anyhow::Error::new(e).context(format!("repairing {tp} in {}", data_dir.display())),
    })?;
    let Some(r) = repair else {
        println!("{tp}: no damaged batch found (every batch's CRC, records and offsets checked); nothing to do");
        return Ok(());
    };
    let (would, kept, moved) =
        if r.applied { ("", "kept", "moved aside") } else { ("dry run: ", "would keep", "would move aside") };
    println!("{would}{tp}: first damaged batch at byte {} of {}: {}", r.position, r.segment.display(), r.reason);
    let records = if r.truncated_to > r.log_start_offset {
        format!("offsets {} to {}", r.log_start_offset, r.truncated_to - 1)
    } else {
        "no records".to_owned()
    };
    println!("{would}{kept}: {records}, {} bytes; the log then ends at offset {}", r.kept_bytes, r.truncated_to);
    for m in &r.moved {
        println!(
            "{would}{moved}: {} bytes [{}, {}) -> {}",
            m.from.display(),
            m.from_position,
            m.from_position + m.bytes,
            m.to.display()
        );
    }
    if r.applied {
        println!(
            "the side directory {} is never deleted by Fjord; delete it yourself once its data is not needed",
            r.side_dir.display()
        );
    }
    Ok(())
}

fn orphans(data_dir: PathBuf, delete: bool) -> anyhow::Result<()> {
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
