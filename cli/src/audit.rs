//! `fjord audit report|watch`: flags → [`fjord_audit::ReportConfig`], then
//! [`fjord_audit::collect`] and [`fjord_audit::render()`].

use std::io::Write;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use fjord_audit::{Format, ReportConfig};

use crate::tools::ConnectArgs;

#[derive(Args, Debug)]
pub(crate) struct AuditArgs {
    #[command(subcommand)]
    command: AuditCommand,
}

#[derive(Subcommand, Debug)]
enum AuditCommand {
    /// Compare the tiers' counts per topic and window, once.
    Report(ReportArgs),
    /// The same as a live table, redrawn every few seconds (Ctrl-C stops).
    Watch(WatchArgs),
}

/// What both subcommands share.
#[derive(Args, Debug)]
struct Common {
    #[command(flatten)]
    connect: ConnectArgs,
    /// Only topics matching this regular expression (unanchored).
    #[arg(long)]
    topics: Option<String>,
    /// Only windows starting at or after: @MILLIS, YYYY-MM-DDTHH:MM[:SS]Z or an age (30m, 6h, 2d).
    #[arg(long)]
    since: Option<String>,
    /// Window length in seconds; must match the tiers' counters.
    #[arg(long, default_value_t = 600)]
    window_secs: u64,
    /// Seconds after a window's end during which a mismatch is `pending`, not an error.
    #[arg(long, default_value_t = 900)]
    grace_secs: u64,
    /// Allowed |difference| as a fraction of the produced count (0 = exact).
    #[arg(long, default_value_t = 0.0)]
    tolerance: f64,
}

impl Common {
    fn config(&self, default_since_windows: Option<i64>) -> anyhow::Result<ReportConfig> {
        let now = fjord_record::now_ms();
        let window = Duration::from_secs(self.window_secs);
        let since_ms = match (&self.since, default_since_windows) {
            (Some(s), _) => Some(fjord_audit::time::parse_since(s, now)?),
            (None, Some(n)) => Some(now - n * window.as_millis() as i64),
            (None, None) => None,
        };
        let config = ReportConfig {
            since_ms,
            window,
            grace: Duration::from_secs(self.grace_secs),
            tolerance: self.tolerance,
            ..ReportConfig::new(self.connect.client()?)
        };
        Ok(match &self.topics {
            Some(pattern) => config.with_topics(pattern)?,
            None => config,
        })
    }
}

#[derive(Args, Debug)]
struct ReportArgs {
    #[command(flatten)]
    common: Common,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutFormat::Text)]
    format: OutFormat,
    /// Write to this file instead of stdout.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

#[derive(Args, Debug)]
struct WatchArgs {
    #[command(flatten)]
    common: Common,
    /// Seconds between redraws.
    #[arg(long, default_value_t = 5)]
    interval_secs: u64,
    /// Without --since, show this many recent windows.
    #[arg(long, default_value_t = 6)]
    windows: i64,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum OutFormat {
    Text,
    Json,
    Html,
}

pub(crate) async fn run(args: AuditArgs) -> anyhow::Result<()> {
    match args.command {
        AuditCommand::Report(a) => report(a).await,
        AuditCommand::Watch(a) => watch(a).await,
    }
}

async fn report(args: ReportArgs) -> anyhow::Result<()> {
    let config = args.common.config(None)?;
    let report = fjord_audit::collect(&config).await?;
    let format = match args.format {
        OutFormat::Text => Format::Text,
        OutFormat::Json => Format::Json,
        OutFormat::Html => Format::Html,
    };
    let out = fjord_audit::render(&report, format)?;
    match args.out {
        Some(path) => std::fs::write(&path, out).with_context(|| format!("writing {}", path.display()))?,
        None => std::io::stdout().write_all(out.as_bytes())?,
    }
    Ok(())
}

async fn watch(args: WatchArgs) -> anyhow::Result<()> {
    let interval = Duration::from_secs(args.interval_secs.max(1));
    loop {
        // Recomputed each round so "the last N windows" moves with the clock.
        let config = args.common.config(Some(args.windows))?;
        let screen = match fjord_audit::collect(&config).await {
            Ok(report) => fjord_audit::render::text(&report),
            Err(e) => format!("audit report failed: {e}\n"),
        };
        // Clear the screen and home the cursor, then draw the table.
        print!("\x1b[2J\x1b[H{screen}\n(redrawn every {}s; Ctrl-C to stop)\n", interval.as_secs());
        std::io::stdout().flush()?;
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}
