//! `fjord load`: one run of a Hadoop load job (for cron or a scheduler), or a run every
//! `--every` until Ctrl-C/SIGTERM. Exit status 0 means everything read was committed.

use std::io::IsTerminal;
use std::time::Duration;

use fjord_hadoop_loader::{run_once, BadRecordPolicy, Codec, LoaderConfig, Progress, RunSummary, Until};
use indicatif::{ProgressBar, ProgressStyle};

/// Flags of `fjord load`.
#[derive(clap::Args)]
pub(crate) struct LoadArgs {
    #[command(flatten)]
    connect: crate::tools::ConnectArgs,
    /// Topics to load: a regex that must match the whole topic name.
    #[arg(long, value_name = "REGEX")]
    topics: String,
    /// Destination: file:///path or hdfs://namenode:port/path.
    #[arg(long, value_name = "URL")]
    dest: String,
    /// Schema registry; Confluent-framed values are then written with their registered
    /// schema (others in the generic envelope schema).
    #[arg(long, value_name = "URL")]
    registry: Option<String>,
    /// Job name: its offsets live in <dest>/_fjord/offsets/<job>/.
    #[arg(long, default_value = "default")]
    job: String,
    /// Where to stop: each partition's high watermark at start (`latest`), or the first
    /// record at or after a time (`2024-03-05T07:00Z` or ms since the epoch).
    #[arg(long, value_name = "latest|TIMESTAMP", default_value = "latest", value_parser = parse_until)]
    until: Until,
    /// Stop after this many records in total; the next run goes on from there.
    #[arg(long, value_name = "N")]
    max_records: Option<u64>,
    /// Run again this long after each run ends (e.g. 15m, 1h) until Ctrl-C/SIGTERM.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    every: Option<Duration>,
    /// Avro block codec: deflate, snappy or null.
    #[arg(long, default_value = "deflate", value_parser = parse_codec)]
    codec: Codec,
    /// Bad records (unknown schema id, undecodable): quarantine to _fjord/errors, or fail.
    #[arg(long, value_name = "quarantine|fail", default_value = "quarantine", value_parser = parse_policy)]
    on_bad_record: BadRecordPolicy,
    /// Bound on every HDFS call; an unreachable namenode fails the run after this.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    hdfs_timeout: Duration,
    /// Publish the loader tier's counts of committed records to `_audit`, under this
    /// cluster name (e.g. the analytics cluster's).
    #[arg(long, value_name = "NAME")]
    audit_cluster: Option<String>,
}

fn parse_until(s: &str) -> Result<Until, String> {
    if s == "latest" {
        return Ok(Until::Latest);
    }
    fjord_hadoop_loader::layout::parse_timestamp(s)
        .map(Until::Timestamp)
        .ok_or_else(|| format!("{s:?} is neither `latest`, YYYY-MM-DDTHH:MM[:SS]Z nor ms since the epoch"))
}

fn parse_codec(s: &str) -> Result<Codec, String> {
    Codec::parse(s).ok_or_else(|| format!("unknown codec {s:?} (deflate, snappy, null)"))
}

fn parse_policy(s: &str) -> Result<BadRecordPolicy, String> {
    match s {
        "quarantine" => Ok(BadRecordPolicy::Quarantine),
        "fail" => Ok(BadRecordPolicy::Fail),
        _ => Err(format!("{s:?} is not quarantine or fail")),
    }
}

/// `500ms`, `30s`, `15m`, `2h`, `1d`.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| format!("{s:?} is not a duration like 30s, 15m or 1h"))?;
    let ms = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("{s:?}: the unit must be ms, s, m, h or d")),
    };
    n.checked_mul(ms).map(Duration::from_millis).ok_or_else(|| format!("{s:?} is too long"))
}

/// The progress bar on a terminal.
struct Bar(ProgressBar);

impl Progress for Bar {
    fn start(&self, partitions: usize, records: u64) {
        self.0.set_length(records);
        self.0.set_message(format!("0/{partitions} partitions done"));
        self.0.reset_elapsed();
    }

    fn advance(&self, records: u64, _bytes: u64) {
        self.0.inc(records);
    }

    fn partition_done(&self) {
        // The message holds "done/total partitions done".
        let msg = self.0.message();
        if let Some((done, rest)) = msg.split_once('/') {
            let done: usize = done.parse().unwrap_or(0);
            self.0.set_message(format!("{}/{rest}", done + 1));
        }
    }
}

async fn once(config: &LoaderConfig) -> anyhow::Result<RunSummary> {
    let summary = if std::io::stderr().is_terminal() {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:40} {human_pos}/{human_len} records ({per_sec}) {msg}",
            )
            .expect("invariant: the template is valid"),
        );
        let bar = Bar(bar);
        let result = run_once(config, &bar).await;
        bar.0.finish_and_clear();
        result?
    } else {
        run_once(config, &()).await?
    };
    println!("{summary}");
    Ok(summary)
}

/// Runs `fjord load`.
pub(crate) async fn load(args: LoadArgs) -> anyhow::Result<()> {
    // --bootstrap, --command-config and FJORD_* as every client tool takes them.
    let client = args.connect.client()?;
    let config = LoaderConfig {
        bootstrap: client.bootstrap_servers.join(","),
        security: client.security,
        topics: args.topics,
        dest: args.dest,
        registry: args.registry,
        job: args.job,
        until: args.until,
        max_records: args.max_records,
        codec: args.codec,
        on_bad_record: args.on_bad_record,
        hdfs_timeout: args.hdfs_timeout,
        // One counter for every run of this process, so counts a failed publish kept are
        // retried by the next run's publish.
        audit: args.audit_cluster.map(|cluster| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_owned());
            std::sync::Arc::new(fjord_audit::AuditCounter::new("loader", host.unwrap_or_else(|_| "unknown".into()), cluster))
        }),
        ..LoaderConfig::default()
    };
    tracing::debug!(?config, "load job");
    let Some(every) = args.every else {
        once(&config).await?;
        return Ok(());
    };
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        // A failed run commits nothing; the next one retries from the same offsets.
        if let Err(e) = once(&config).await {
            eprintln!("load run failed: {e:#}");
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
            _ = terminate.recv() => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse() {
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert!(parse_duration("15").is_err() && parse_duration("m").is_err() && parse_duration("1w").is_err());
        assert_eq!(parse_until("latest"), Ok(Until::Latest));
        assert_eq!(parse_until("1970-01-01T01:00Z"), Ok(Until::Timestamp(3_600_000)));
        assert!(parse_until("yesterday").is_err());
        assert_eq!(parse_codec("snappy"), Ok(Codec::Snappy));
        assert!(parse_policy("ignore").is_err());
    }
}
