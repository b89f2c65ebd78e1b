//! The client-side subcommands: `fjord topics`, `fjord produce`, `fjord consume`,
//! `fjord bench`. Each parses flags into a `fjord_client` config and calls the library.
//!
//! # Layout
//! - `topics`: create/list/describe/delete/alter through [`fjord_client::Admin`].
//! - `produce`: stdin lines → records (optional key separator and headers).
//! - `consume`: records → stdout, plain or JSON lines, from beginning/end/offset/time.
//! - `groups`: list/describe consumer groups (lag per partition), reset committed offsets.
//! - `bench`: the paper's producer/consumer throughput experiment, with latency percentiles.

pub(crate) mod bench;
pub(crate) mod consume;
pub(crate) mod groups;
pub(crate) mod produce;
pub(crate) mod topics;

use std::time::Duration;

use clap::Args;
use fjord_client::{Acks, ClientConfig, Compression};

/// Flags every client subcommand shares.
#[derive(Args, Debug, Clone)]
pub(crate) struct ConnectArgs {
    /// Broker(s) to bootstrap from, HOST:PORT[,HOST:PORT...].
    #[arg(long, default_value = "127.0.0.1:9092", env = "FJORD_BOOTSTRAP")]
    pub(crate) bootstrap: String,
    /// Give up connecting to a broker after this many milliseconds.
    #[arg(long, default_value_t = 5000)]
    pub(crate) connect_timeout_ms: u64,
}

impl ConnectArgs {
    pub(crate) fn client(&self) -> ClientConfig {
        ClientConfig { connect_timeout: Duration::from_millis(self.connect_timeout_ms), ..ClientConfig::new(&self.bootstrap) }
    }
}

/// Runs a subcommand; on failure prints one line to stderr and exits with status 1
/// (instead of anyhow's multi-line report).
pub(crate) async fn run_or_exit(f: impl std::future::Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    if let Err(e) = f.await {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
    Ok(())
}

pub(crate) fn parse_acks(s: &str) -> Result<Acks, String> {
    s.parse::<Acks>().map_err(|e| e.to_string())
}

pub(crate) fn parse_compression(s: &str) -> Result<Compression, String> {
    Ok(match s {
        "none" => Compression::None,
        "gzip" => Compression::Gzip,
        "snappy" => Compression::Snappy,
        "lz4" => Compression::Lz4,
        "zstd" => Compression::Zstd,
        other => return Err(format!("unknown compression {other:?} (none, gzip, snappy, lz4, zstd)")),
    })
}

/// `K=V` as a pair.
pub(crate) fn parse_key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}
