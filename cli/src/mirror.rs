//! `fjord mirror`: flags → [`fjord_mirror::MirrorConfig`] → [`fjord_mirror::run`] until
//! Ctrl-C/SIGTERM; `fjord mirror status` prints a running mirror's per-partition lag.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use fjord_mirror::{AuditConfig, MirrorConfig, SourceConfig, SourceState, Status};

use crate::load::parse_duration;

/// Flags of `fjord mirror`.
#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub(crate) struct MirrorArgs {
    #[command(subcommand)]
    command: Option<MirrorCommand>,
    /// A source cluster, `[ALIAS=]HOST:PORT[,HOST:PORT...]`; repeat for several.
    #[arg(long = "source", value_name = "ALIAS=HOST:PORT", required = true)]
    sources: Vec<String>,
    /// The target (analytics) cluster, HOST:PORT[,HOST:PORT...].
    #[arg(long, value_name = "HOST:PORT", required = true)]
    target: Option<String>,
    /// Kafka client properties of the source clusters (security.protocol, sasl.*, ssl.*),
    /// as MirrorMaker's consumer config: `ALIAS=FILE` for one source, a bare `FILE` for
    /// every source without its own; repeat for several. FJORD_SOURCE_SASL_USERNAME,
    /// FJORD_SOURCE_SASL_PASSWORD... override every source's file. A bootstrap.servers in
    /// the file is not used: --source names the brokers.
    #[arg(long = "source-config", value_name = "[ALIAS=]FILE", env = "FJORD_SOURCE_CONFIG")]
    source_configs: Vec<String>,
    /// Kafka client properties of the target cluster, as MirrorMaker's producer config;
    /// FJORD_TARGET_SASL_USERNAME, FJORD_TARGET_SASL_PASSWORD... override it. A
    /// bootstrap.servers in the file is not used: --target names the brokers.
    #[arg(long = "target-config", value_name = "FILE", env = "FJORD_TARGET_CONFIG")]
    target_config: Option<PathBuf>,
    /// Topics to mirror: a regex that must match the whole name; new matching topics are
    /// picked up while running.
    #[arg(long, value_name = "REGEX", required = true)]
    topics: Option<String>,
    /// Consumer group in each source cluster (mirrors with the same group share partitions).
    #[arg(long, default_value = "fjord-mirror")]
    group: String,
    /// Target topic names, e.g. '{alias}.{topic}'; by default names are kept.
    #[arg(long, value_name = "TEMPLATE")]
    rename: Option<String>,
    /// Keep target topics with fewer partitions than the source (by default they grow
    /// to match) and place records by key hash.
    #[arg(long)]
    repartition_by_key: bool,
    /// Serve /metrics (Prometheus) and /status on this address, e.g. 127.0.0.1:9400.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// The metrics endpoint's security, a properties file with the broker's `metrics.*`
    /// keys: `metrics.ssl.keystore.location` (TLS only), `metrics.authentication.method=BASIC`
    /// (users from --zookeeper), `metrics.ssl.client.auth`, ...
    #[arg(long, value_name = "FILE", env = "FJORD_MIRROR_METRICS_CONFIG")]
    metrics_config: Option<PathBuf>,
    /// ZooKeeper connect string of the metadata store whose users may scrape the metrics
    /// endpoint with Basic (the target cluster's).
    #[arg(long, value_name = "CONNECT", env = "FJORD_ZOOKEEPER_CONNECT")]
    zookeeper: Option<String>,
    /// Flush the target and commit source offsets this often (the duplicate window after a crash).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    commit_interval: Duration,
    /// Look for new matching topics this often.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    topic_refresh: Duration,
    /// Static group membership id: a restarted mirror with the same id gets its partitions back at once.
    #[arg(long, value_name = "ID")]
    instance_id: Option<String>,
    /// Exactly once on the target (as MirrorMaker 2's exactly.once.support): copies and
    /// source positions commit in one transaction there, the positions as the offsets of
    /// group GROUP.ALIAS on the target; read_committed readers see no duplicates after a
    /// crash. Mirrors sharing a group need distinct --instance-id values (or hosts).
    #[arg(long)]
    exactly_once: bool,
    /// A topic on the target for the records it refuses (too large for the target topic,
    /// invalid for it, stamped outside its timestamp limits), as MirrorMaker 2's
    /// errors.tolerance=all with a dead-letter queue: each goes there with headers saying
    /// where it came from and why (fjord.dlq.*), and copying goes on. Without it such a
    /// record holds its partition, retried alone, shown in `mirror status`, while the
    /// other partitions go on.
    #[arg(long, value_name = "TOPIC")]
    dead_letter_topic: Option<String>,
    /// The target producer's max.request.size: the largest record copied (a larger one is
    /// held, or set aside with --dead-letter-topic), and how much one request holds.
    #[arg(long, value_name = "BYTES", default_value_t = 1024 * 1024)]
    max_request_size: usize,
    /// Publish the mirror tier's audit counts to the target's `_audit` under this cluster name.
    #[arg(long, value_name = "NAME")]
    audit_cluster: Option<String>,
    /// How often audit counts are published.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    audit_interval: Duration,
    /// Audit window length (the same for every tier and the report).
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = parse_duration)]
    audit_window: Duration,
}

#[derive(clap::Subcommand)]
enum MirrorCommand {
    /// Per source partition: mirrored position, source log end and lag, and the gaps found,
    /// read from a running mirror's --metrics endpoint.
    Status(StatusArgs),
}

#[derive(clap::Args)]
struct StatusArgs {
    /// The running mirror's --metrics address.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9400")]
    metrics: String,
    /// Print the status as JSON.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(args: MirrorArgs) -> anyhow::Result<()> {
    if let Some(MirrorCommand::Status(s)) = args.command {
        return status(s).await;
    }
    let env = |name: &str| std::env::var(name).ok();
    let mut sources = args.sources.iter().map(|s| SourceConfig::parse(s)).collect::<Result<Vec<_>, _>>()?;
    let files = source_config_files(&args.source_configs, &sources)?;
    for source in &mut sources {
        let file = files.get(source.alias.as_str()).or(files.get("")).map(|f| f.as_path());
        source.security = crate::tools::client_from(file, "--source-config", "FJORD_SOURCE_", env)?.security;
    }
    let mut config = MirrorConfig::new(sources, args.target.unwrap_or_default(), args.topics.unwrap_or_default());
    config.target_security =
        crate::tools::client_from(args.target_config.as_deref(), "--target-config", "FJORD_TARGET_", env)?.security;
    config.group = args.group;
    config.rename = args.rename;
    config.repartition_by_key = args.repartition_by_key;
    config.commit_interval = args.commit_interval;
    config.topic_refresh = args.topic_refresh;
    config.instance_id = args.instance_id;
    config.exactly_once = args.exactly_once;
    config.dead_letter_topic = args.dead_letter_topic;
    config.max_request_size = args.max_request_size;
    config.audit =
        args.audit_cluster.map(|cluster| AuditConfig { cluster, interval: args.audit_interval, window: args.audit_window });
    if let Some(path) = &args.metrics_config {
        let context = || format!("--metrics-config {}", path.display());
        let text = std::fs::read_to_string(path).with_context(context)?;
        for (key, value) in fjord_client::parse_properties(&text).with_context(context)? {
            config.set(&key, &value).with_context(context)?;
        }
    }
    // Bad flags fail here, before anything binds or connects.
    config.validate()?;
    let store = match &args.zookeeper {
        Some(connect) => Some(
            fjord_coord::open(Some(connect), std::path::Path::new("")).await.with_context(|| format!("ZooKeeper {connect}"))?,
        ),
        None if config.metrics_security.needs_store() => {
            anyhow::bail!("metrics.authentication.method=BASIC reads the users from the metadata store: give --zookeeper")
        }
        None => None,
    };
    let listener = match &args.metrics {
        Some(addr) => {
            let l = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("cannot listen on --metrics {addr}"))?;
            let scheme = if config.metrics_security.tls_enabled() { "https" } else { "http" };
            eprintln!("mirror metrics on {scheme}://{}/metrics, status on /status", l.local_addr()?);
            Some(l)
        }
        None => None,
    };
    fjord_mirror::run_with_store(config, listener, store, crate::server::shutdown_on_signal()?).await?;
    Ok(())
}

/// `--source-config` values by alias (`""` for the bare `FILE` every other source uses);
/// an alias no `--source` has, or one given twice, is an error.
fn source_config_files<'a>(
    values: &'a [String],
    sources: &[SourceConfig],
) -> anyhow::Result<std::collections::HashMap<&'a str, PathBuf>> {
    let mut files = std::collections::HashMap::new();
    for value in values {
        let (alias, file) = match value.split_once('=') {
            Some((alias, file)) => (alias.trim(), file.trim()),
            None => ("", value.trim()),
        };
        if !alias.is_empty() && !sources.iter().any(|s| s.alias == alias) {
            anyhow::bail!("--source-config {value}: no --source has the alias {alias:?}");
        }
        if files.insert(alias, PathBuf::from(file)).is_some() {
            match alias {
                "" => anyhow::bail!("--source-config FILE (for every source) is given twice"),
                _ => anyhow::bail!("--source-config {alias}=FILE is given twice"),
            }
        }
    }
    Ok(files)
}

async fn status(args: StatusArgs) -> anyhow::Result<()> {
    let status = fjord_mirror::fetch_status(&args.metrics).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        print!("{}", render(&status));
    }
    Ok(())
}

fn render(status: &Status) -> String {
    let mut out = String::new();
    for s in &status.sources {
        let state = match s.state {
            SourceState::Up => "up".to_string(),
            SourceState::Connecting => "connecting".to_string(),
            SourceState::Retrying => format!("RETRYING: {}", s.last_error.as_deref().unwrap_or("?")),
        };
        out += &format!(
            "source {} ({}): {state}; {} records mirrored, {} commits, {} failures{}\n",
            s.alias,
            s.bootstrap,
            s.records,
            s.commits,
            s.failures,
            match s.dead_letters {
                0 => String::new(),
                n => format!(", {n} refused by the target and dead-lettered"),
            }
        );
        out += &format!("  {:<30} {:>5} {:<30} {:>12} {:>12} {:>10}\n", "TOPIC", "PART", "TARGET", "MIRRORED", "LOG-END", "LAG");
        for p in &s.partitions {
            let lag = p.lag.map_or_else(|| "-".to_string(), |l| l.to_string());
            out += &format!(
                "  {:<30} {:>5} {:<30} {:>12} {:>12} {:>10}\n",
                p.topic, p.partition, p.target_topic, p.mirrored, p.log_end, lag
            );
            if let Some(refused) = &p.refused {
                out += &format!("    HELD: {refused}; retried now and then (--dead-letter-topic sets such records aside)\n");
            }
        }
    }
    if status.gaps.is_empty() {
        out += "no gaps\n";
    }
    for g in &status.gaps {
        out += &format!(
            "GAP {} {}-{}: offsets {}..={} ({} records) deleted by retention before they were mirrored\n",
            g.source, g.topic, g.partition, g.first_offset, g.last_offset, g.records
        );
    }
    out
}
