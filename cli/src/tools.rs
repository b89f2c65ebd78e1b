//! The client-side subcommands: `fjord topics`, `fjord produce`, `fjord consume`,
//! `fjord bench`. Each parses flags into a `fjord_client` config and calls the library.
//!
//! # Layout
//! - `topics`: create/list/describe/delete/alter through [`fjord_client::Admin`].
//! - `produce`: stdin lines → records (optional key separator and headers).
//! - `consume`: records → stdout, plain or JSON lines, from beginning/end/offset/time.
//! - `groups`: list/describe consumer groups (lag per partition), reset committed offsets.
//! - `transactions`: list/describe transactional ids at their coordinators.
//! - `quotas`: describe/alter client quotas (users, client ids, their defaults).
//! - `reassign`: start, verify or cancel partition reassignments (Kafka's JSON plan), or
//!   move every replica off a broker.
//! - `bench`: the paper's producer/consumer throughput experiment, with latency percentiles.

pub(crate) mod bench;
pub(crate) mod consume;
pub(crate) mod groups;
pub(crate) mod produce;
pub(crate) mod quotas;
pub(crate) mod reassign;
pub(crate) mod topics;
pub(crate) mod transactions;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use fjord_client::{Acks, ClientConfig, Compression};

/// The client settings also read from `FJORD_*` environment variables (`sasl.password`
/// → `FJORD_SASL_PASSWORD`): secrets come from a file or the environment, never from a
/// flag, where `ps` and shell history would show them.
const ENV_SETTINGS: [&str; 7] = [
    "security.protocol",
    "sasl.mechanism",
    "sasl.username",
    "sasl.password",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
];

/// Where `--bootstrap` falls back to when neither the flag nor the properties file names one.
const DEFAULT_BOOTSTRAP: &str = "127.0.0.1:9092";

/// Flags every client subcommand shares. Global: accepted before or after the action
/// (`fjord topics create --bootstrap ...`, as the README writes it).
#[derive(Args, Debug, Clone)]
pub(crate) struct ConnectArgs {
    /// Broker(s) to bootstrap from, HOST:PORT[,HOST:PORT...] (Kafka's tools call it
    /// --bootstrap-server) [default: the properties file's bootstrap.servers, else 127.0.0.1:9092].
    #[arg(long, visible_alias = "bootstrap-server", global = true, env = "FJORD_BOOTSTRAP")]
    pub(crate) bootstrap: Option<String>,
    /// Kafka client properties file (`key=value` lines, `#` comments): bootstrap.servers,
    /// security.protocol, sasl.mechanism, sasl.username, sasl.password, ssl.ca.location,
    /// ssl.certificate.location, ssl.key.location. FJORD_SECURITY_PROTOCOL,
    /// FJORD_SASL_USERNAME, FJORD_SASL_PASSWORD... override the file's values.
    #[arg(long, global = true, value_name = "FILE", env = "FJORD_COMMAND_CONFIG")]
    pub(crate) command_config: Option<PathBuf>,
    /// Give up connecting to a broker (TCP, TLS, SASL) after this many milliseconds.
    #[arg(long, global = true, default_value_t = 5000)]
    pub(crate) connect_timeout_ms: u64,
}

impl ConnectArgs {
    /// The client config: the properties file, then the environment, then the flags.
    pub(crate) fn client(&self) -> anyhow::Result<ClientConfig> {
        self.client_with(|name| std::env::var(name).ok())
    }

    fn client_with(&self, env: impl Fn(&str) -> Option<String>) -> anyhow::Result<ClientConfig> {
        let mut config = client_from(self.command_config.as_deref(), "--command-config", "FJORD_", env)?;
        if let Some(bootstrap) = &self.bootstrap {
            config.set("bootstrap.servers", bootstrap).context("--bootstrap")?;
        }
        config.connect_timeout = Duration::from_millis(self.connect_timeout_ms);
        Ok(config)
    }
}

/// A client config from the Kafka properties file `file` (named `flag` in errors), then
/// the variables `<env_prefix>SECURITY_PROTOCOL`, `<env_prefix>SASL_PASSWORD`... of
/// [`ENV_SETTINGS`] read through `env`, which override the file.
pub(crate) fn client_from(
    file: Option<&std::path::Path>,
    flag: &str,
    env_prefix: &str,
    env: impl Fn(&str) -> Option<String>,
) -> anyhow::Result<ClientConfig> {
    let mut config = ClientConfig::new(DEFAULT_BOOTSTRAP);
    if let Some(path) = file {
        let context = || format!("{flag} {}", path.display());
        let text = std::fs::read_to_string(path).with_context(context)?;
        for (key, value) in fjord_client::parse_properties(&text).with_context(context)? {
            config.set(&key, &value).with_context(context)?;
        }
    }
    for key in ENV_SETTINGS {
        let name = format!("{env_prefix}{}", key.replace('.', "_").to_ascii_uppercase());
        if let Some(value) = env(&name) {
            config.set(key, &value).with_context(|| name)?;
        }
    }
    Ok(config)
}

/// `--audit CLUSTER`: the opt-in producer or consumer tier of the audit.
#[derive(Args, Debug, Clone)]
pub(crate) struct AuditFlag {
    /// Count the records (produced: once acknowledged; consumed: as read) per topic and
    /// 10-minute window and publish the counts to `_audit` every 30 s and at the end,
    /// under this cluster name.
    #[arg(long = "audit", value_name = "CLUSTER")]
    pub(crate) cluster: Option<String>,
}

/// A running audit tier: its counter (to hand to the client config) and its publisher.
pub(crate) struct AuditTier {
    pub(crate) counter: std::sync::Arc<fjord_audit::AuditCounter>,
    stop: tokio_util::sync::CancellationToken,
    publisher: tokio::task::JoinHandle<fjord_audit::Result<()>>,
}

impl AuditFlag {
    /// Starts the tier `tier` when `--audit` was given.
    pub(crate) fn start(&self, tier: &str, client: &ClientConfig) -> Option<AuditTier> {
        let cluster = self.cluster.as_ref()?;
        let host =
            std::fs::read_to_string("/proc/sys/kernel/hostname").map_or_else(|_| "unknown".into(), |h| h.trim().to_owned());
        let counter = std::sync::Arc::new(fjord_audit::AuditCounter::new(tier, host, cluster.clone()));
        let stop = tokio_util::sync::CancellationToken::new();
        let publisher = counter.clone().spawn_publisher(client.clone(), Duration::from_secs(30), stop.clone());
        Some(AuditTier { counter, stop, publisher })
    }
}

impl AuditTier {
    /// The hook for a producer or consumer config.
    pub(crate) fn hook(&self) -> std::sync::Arc<dyn fjord_client::AuditHook> {
        self.counter.clone()
    }

    /// Publishes the last counts and stops.
    pub(crate) async fn finish(self) -> anyhow::Result<()> {
        self.stop.cancel();
        self.publisher.await?.context("publishing the final audit counts")?;
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_overrides_the_file_and_the_flag_the_bootstrap() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("client.properties");
        std::fs::write(&file, "bootstrap.servers=h:1\nsecurity.protocol=SASL_PLAINTEXT\nsasl.username=a\nsasl.password=file\n")
            .unwrap();
        let args = ConnectArgs { bootstrap: None, command_config: Some(file.clone()), connect_timeout_ms: 7 };
        let env = |name: &str| (name == "FJORD_SASL_PASSWORD").then(|| "env".to_owned());
        let config = args.client_with(env).unwrap();
        assert_eq!(config.bootstrap_servers, ["h:1"]);
        assert_eq!(config.security.sasl_password.as_deref(), Some("env"));
        assert_eq!(config.connect_timeout, Duration::from_millis(7));
        let args = ConnectArgs { bootstrap: Some("b:2".into()), ..args };
        assert_eq!(args.client_with(|_| None).unwrap().bootstrap_servers, ["b:2"]);
        std::fs::write(&file, "sasl.pasword=x\n").unwrap();
        let err = format!("{:#}", args.client_with(|_| None).unwrap_err());
        assert!(err.contains("unknown client setting \"sasl.pasword\""), "{err}");
    }
}
