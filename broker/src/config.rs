//! `BrokerConfig`: the broker's settings under Kafka's key names.
//!
//! Every key is applied through [`BrokerConfig::set`], so the TOML file, the `FJORD_*`
//! environment and the command line all go through one parser. Broker-wide `log.*` keys
//! map onto the topic-level names of [`fjord_log::LogConfig`] (`log.segment.bytes` →
//! `segment.bytes`), as in Kafka, where the broker key is the default of the topic key.
//! The remaining `log.cleaner.*` keys configure the broker's one log cleaner
//! ([`fjord_log::CleanerConfig`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use fjord_log::{CleanerConfig, LogConfig};
use serde::Deserialize;

use crate::group::GroupConfig;
use crate::listener::{self, ListenerInfo, Listeners, SecurityProtocol};
use crate::replication::ReplicationConfig;
use crate::{Error, Result};

/// Settings of one broker. Defaults are Kafka's unless noted.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// `broker.id`, default 0.
    pub broker_id: i32,
    /// `listeners`: the named addresses to bind, `NAME://HOST:PORT,...` (a bare
    /// `HOST:PORT` is named `PLAINTEXT`); default `PLAINTEXT://127.0.0.1:9092`.
    pub listeners: Listeners,
    /// `advertised.listeners`: `NAME://HOST:PORT,...` handed to clients in Metadata (a
    /// bare `HOST:PORT` advertises the first listener); a listener not named here is
    /// advertised at its bound address.
    pub advertised_listener: Option<String>,
    /// `listener.security.protocol.map`: listener name → protocol; default Kafka's
    /// (`PLAINTEXT`, `SSL`, `SASL_PLAINTEXT`, `SASL_SSL` each map to themselves).
    pub listener_security_protocol_map: BTreeMap<String, SecurityProtocol>,
    /// `inter.broker.listener.name`: the listener replica fetchers connect to and the
    /// registration's `host`/`port` name; default the first of `listeners`.
    pub inter_broker_listener_name: Option<String>,
    /// `connections.max.idle.ms`: a connection with no request for this long is closed;
    /// default 10 minutes.
    pub connections_max_idle: Duration,
    /// `max.connections.per.ip`: more connections from one address are closed as they
    /// come in; default unlimited (Kafka's `Int.MaxValue`).
    pub max_connections_per_ip: usize,
    /// `quota.window.num` and `quota.window.size.seconds`: client quota rates are
    /// measured over this many samples of this length; default Kafka's 11 × 1 s.
    pub quota_window: crate::quota::QuotaWindow,
    /// `sasl.server.max.receive.size`: the largest frame read before a client has
    /// authenticated; default 512 KiB.
    pub sasl_server_max_receive_size: usize,
    /// `connection.authentication.timeout.ms` (Fjord): a connection that has not finished
    /// its TLS handshake and SASL exchange this long after it was accepted is closed;
    /// default 10 s.
    pub authentication_timeout: Duration,
    /// `sasl.enabled.mechanisms`: what SASL listeners offer; default
    /// `SCRAM-SHA-256,SCRAM-SHA-512` (PLAIN sends the password: enable it on SASL_SSL).
    pub sasl_enabled_mechanisms: Vec<crate::sasl::Mechanism>,
    /// `connection.failed.authentication.delay.ms`: a failed authentication is answered
    /// this much later (then closed), to slow password guessing; default 100 ms.
    pub failed_authentication_delay: Duration,
    /// `connections.max.reauth.ms` (KIP-368): a SASL session lasts this long after its
    /// authentication; the client re-authenticates on the connection before then, or the
    /// connection is closed at its next request. Zero (the default) means sessions do not
    /// expire.
    pub connections_max_reauth: Duration,
    /// `sasl.mechanism.inter.broker.protocol`: how replica fetchers authenticate on a SASL
    /// inter-broker listener; default SCRAM-SHA-256.
    pub sasl_inter_broker_mechanism: crate::sasl::Mechanism,
    /// `inter.broker.sasl.username` / `inter.broker.sasl.password` (Fjord; Kafka puts
    /// them in the listener's JAAS config): this broker's SASL identity towards the
    /// others. Replica fetches on a SASL inter-broker listener are honoured only from
    /// this principal.
    pub inter_broker_sasl_username: Option<String>,
    /// See `inter_broker_sasl_username`; never printed.
    pub inter_broker_sasl_password: Option<Secret>,
    /// TLS of SSL and SASL_SSL listeners (`ssl.*`).
    pub ssl: crate::tls::SslConfig,
    /// `log.dirs`: the first log directory (partitions, checkpoints, meta.properties, and
    /// the embedded metadata store); `--data-dir` sets it. See [`BrokerConfig::log_dirs`].
    pub log_dir: PathBuf,
    /// The other directories of a comma-separated `log.dirs` (JBOD), in order; each holds
    /// partitions, its own checkpoints and its own meta.properties. Empty by default.
    pub other_log_dirs: Vec<PathBuf>,
    /// `zookeeper.connect`: empty means the embedded metadata store under `log.dirs`.
    pub zookeeper_connect: Option<String>,
    /// `zookeeper.session.timeout.ms`, default 18 s: how long ZooKeeper keeps a silent
    /// broker's session (its registration, its controllership) before the others act.
    pub zookeeper_session_timeout: Duration,
    /// `auto.create.topics.enable`, default true.
    pub auto_create_topics: bool,
    /// `num.partitions`: partitions of an auto-created topic, default 1.
    pub num_partitions: i32,
    /// `default.replication.factor`: replicas of an auto-created topic (and of a
    /// CreateTopics that leaves it to the broker), default 1.
    pub default_replication_factor: i16,
    /// `max.partitions.per.request` (Fjord): the most partitions one topic of a
    /// CreateTopics (or an auto-create) may have; more is refused with INVALID_PARTITIONS
    /// before anything is allocated. Default 10,000.
    pub max_partitions_per_request: i32,
    /// `max.partitions.per.broker` (Fjord): the most partition replicas one broker may
    /// hold, counting every topic; a create that would pass it on any broker is refused
    /// with POLICY_VIOLATION. Default (`None`): derived at start from the open-file limit
    /// (half of it, less `log.segment.files.open.max`, three descriptors per partition),
    /// so every replica can open its log.
    pub max_partitions_per_broker: Option<usize>,
    /// `unclean.leader.election.enable`: the default of the topic key, default false.
    pub unclean_leader_election: bool,
    /// `auto.leader.rebalance.enable`: the controller moves leadership back to each
    /// partition's preferred replica (the first of its assignment); default true.
    pub auto_leader_rebalance: bool,
    /// `leader.imbalance.check.interval.seconds`: how often the controller checks, default 300 s.
    pub leader_imbalance_check_interval: Duration,
    /// `leader.imbalance.per.broker.percentage`: the share of a broker's preferred
    /// partitions that may be led elsewhere before the controller moves them back, 0..=100,
    /// default 10.
    pub leader_imbalance_per_broker_percentage: u32,
    /// `broker.rack`: this broker's rack, for rack-aware replica placement; default none.
    pub broker_rack: Option<String>,
    /// `controlled.shutdown.enable`: on shutdown in cluster mode, hand leadership over
    /// before closing (bounded by `controlled.shutdown.timeout.ms`, Fjord, default 30 s);
    /// default true.
    pub controlled_shutdown: bool,
    /// `controlled.shutdown.timeout.ms` (Fjord; Kafka bounds it by retries × backoff).
    pub controlled_shutdown_timeout: Duration,
    /// `socket.request.max.bytes`: larger frames close the connection; default 100 MiB.
    pub socket_request_max_bytes: usize,
    /// `queued.max.request.bytes`: the bytes of requests held at once across all
    /// connections (`crate::request_memory`); `None` (-1) is unbounded. Default 512 MiB,
    /// where Kafka's is unbounded: a broker's memory stays bounded whatever clients send.
    pub queued_max_request_bytes: Option<usize>,
    /// `max.connections`: connections beyond this are closed as they come in (logged
    /// once a minute, counted in metrics); default 10,000.
    pub max_connections: usize,
    /// `fetch.zero.copy` (Fjord): send fetched records with sendfile(2); default true.
    /// false copies them through user space (the fallback, and the benchmark baseline).
    pub fetch_zero_copy: bool,
    /// `log.retention.check.interval.ms`, default 5 min.
    pub retention_check_interval: Duration,
    /// `log.flush.scheduler.interval.ms`: how often `flush.ms` is checked, default 1 s
    /// (Kafka's default is "never", which makes `flush.ms` inert).
    pub flush_scheduler_interval: Duration,
    /// `log.flush.offset.checkpoint.interval.ms`, default 60 s.
    pub checkpoint_interval: Duration,
    /// `log.segment.files.open.max` (Fjord): descriptors of sealed segment files kept
    /// open, process-wide ([`fjord_log::FileCache`]); default 1024, at least 1.
    pub segment_files_open_max: usize,
    /// `log.scrub.bytes.per.second` (Fjord): the background scrubber CRC-checks this
    /// many bytes of log data a second, partition after partition, so damage is found
    /// even where no consumer reads; default 4 MiB/s, 0 turns it off.
    pub scrub_bytes_per_second: u64,
    /// Broker-wide defaults of every topic's log (`log.segment.bytes`, `log.retention.ms`, ...).
    pub log: LogConfig,
    /// The log cleaner (`log.cleaner.dedupe.buffer.size`, `log.cleaner.io.max.bytes.per.second`,
    /// `log.cleaner.backoff.ms`: how often compacted logs are checked, default 15 s).
    pub cleaner: CleanerConfig,
    /// Group coordinator settings (`group.*`, `offset.metadata.max.bytes`, `offsets.retention.*`).
    pub group: GroupConfig,
    /// Transaction coordinator settings (`transaction.*`, `transactional.id.expiration.ms`).
    pub transaction: crate::txn::TxnConfig,
    /// `metrics.listen` (Fjord): `HOST:PORT` serving the Prometheus text at `/metrics`;
    /// default none (off).
    pub metrics_listen: Option<SocketAddr>,
    /// `metrics.<key>` for each of [`fjord_auth::http::HttpSecurityConfig::KEYS`] (Fjord):
    /// TLS and HTTP Basic on the metrics endpoint, as the gateway's and the registry's
    /// (`metrics.ssl.keystore.location`, `metrics.authentication.method=BASIC`, ...).
    pub metrics_security: fjord_auth::http::HttpSecurityConfig,
    /// Replication settings (`replica.*`).
    pub replication: ReplicationConfig,
    /// The audit's broker tier (Fjord, `audit.*`): what this broker counts as partition
    /// leader and publishes to `_audit`.
    pub audit: AuditConfig,
    /// What watches this broker (not a config key): the binary sets it, e.g. to the
    /// audit's broker tier when `audit.enable` (see [`crate::observer`]).
    pub observer: Option<std::sync::Arc<dyn crate::observer::BrokerObserver>>,
    /// The keys given to [`BrokerConfig::set`] (the file, `FJORD_*`, flags): what
    /// DescribeConfigs reports as STATIC_BROKER_CONFIG, the rest as DEFAULT_CONFIG.
    pub static_keys: std::collections::BTreeSet<String>,
    /// `authorizer.enable`: check every request against the ACLs (default false, so an
    /// unsecured `fjord dev` keeps working).
    pub authorizer_enable: bool,
    /// `super.users` and `allow.everyone.if.no.acl.found`, used when `authorizer_enable`.
    pub authorizer: fjord_auth::AuthorizerConfig,
}

/// A password in the config: kept, never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// `audit.*` (Fjord): the broker tier of the audit (see the `fjord-audit` crate).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditConfig {
    /// `audit.enable`: count the records appended for producers per topic and window of
    /// creation time, and publish the counts to `_audit` as tier `broker`; default false.
    pub enable: bool,
    /// `audit.interval.ms`: how often the counts are published (and once more at
    /// shutdown), default 60 s.
    pub interval: Duration,
    /// `audit.window.ms`: window length, the same for every tier and the report;
    /// default 10 minutes.
    pub window: Duration,
    /// `audit.cluster`: the datacenter / cluster name in the audit records, default `default`.
    pub cluster: String,
    /// `audit.tier`: the tier name, default `broker`. The report adds up a tier over
    /// every cluster, so brokers of a cluster the mirror writes into take another name
    /// (e.g. `analytics-broker`): their appends are the same events again.
    pub tier: String,
}

impl Default for AuditConfig {
    fn default() -> Self {
        Self {
            enable: false,
            interval: Duration::from_secs(60),
            // The audit's defaults (`fjord_audit::DEFAULT_WINDOW_MS`, `BROKER_TIER`);
            // fjord-audit's tests check they agree.
            window: Duration::from_secs(10 * 60),
            cluster: "default".into(),
            tier: "broker".into(),
        }
    }
}

impl Default for BrokerConfig {
    fn default() -> Self {
        Self {
            broker_id: 0,
            listeners: SocketAddr::from(([127, 0, 0, 1], 9092)).into(),
            advertised_listener: None,
            listener_security_protocol_map: listener::default_protocol_map(),
            inter_broker_listener_name: None,
            connections_max_idle: Duration::from_secs(600),
            max_connections_per_ip: usize::MAX,
            quota_window: crate::quota::QuotaWindow::default(),
            sasl_server_max_receive_size: 512 * 1024,
            authentication_timeout: Duration::from_secs(10),
            ssl: crate::tls::SslConfig::default(),
            sasl_enabled_mechanisms: vec![
                crate::sasl::Mechanism::Scram(fjord_auth::ScramMechanism::Sha256),
                crate::sasl::Mechanism::Scram(fjord_auth::ScramMechanism::Sha512),
            ],
            failed_authentication_delay: Duration::from_millis(100),
            connections_max_reauth: Duration::ZERO,
            sasl_inter_broker_mechanism: crate::sasl::Mechanism::Scram(fjord_auth::ScramMechanism::Sha256),
            inter_broker_sasl_username: None,
            inter_broker_sasl_password: None,
            log_dir: PathBuf::from("./fjord-data"),
            other_log_dirs: Vec::new(),
            zookeeper_connect: None,
            zookeeper_session_timeout: fjord_coord::zookeeper::DEFAULT_SESSION_TIMEOUT,
            auto_create_topics: true,
            num_partitions: 1,
            default_replication_factor: 1,
            max_partitions_per_request: 10_000,
            max_partitions_per_broker: None,
            unclean_leader_election: false,
            auto_leader_rebalance: true,
            leader_imbalance_check_interval: Duration::from_secs(300),
            leader_imbalance_per_broker_percentage: 10,
            broker_rack: None,
            controlled_shutdown: true,
            controlled_shutdown_timeout: Duration::from_secs(30),
            socket_request_max_bytes: 100 * 1024 * 1024,
            queued_max_request_bytes: Some(512 * 1024 * 1024),
            max_connections: 10_000,
            fetch_zero_copy: true,
            retention_check_interval: Duration::from_secs(300),
            flush_scheduler_interval: Duration::from_secs(1),
            checkpoint_interval: Duration::from_secs(60),
            segment_files_open_max: fjord_log::files::DEFAULT_CAPACITY,
            scrub_bytes_per_second: 4 << 20,
            authorizer_enable: false,
            authorizer: fjord_auth::AuthorizerConfig::default(),
            log: LogConfig::default(),
            cleaner: CleanerConfig::default(),
            group: GroupConfig::default(),
            transaction: crate::txn::TxnConfig::default(),
            metrics_listen: None,
            metrics_security: fjord_auth::http::HttpSecurityConfig::default(),
            replication: ReplicationConfig::default(),
            audit: AuditConfig::default(),
            observer: None,
            static_keys: Default::default(),
        }
    }
}

/// The broker keys that set the default of topic key `topic_key`, the one Kafka
/// describes first (e.g. `log.retention.ms` for `retention.ms`) first; none for a key
/// that is no topic key.
pub(crate) fn broker_keys_of(topic_key: &str) -> Vec<&'static str> {
    let mut keys: Vec<&'static str> =
        LOG_KEYS.iter().filter(|(_, topic)| *topic == topic_key).map(|(broker, _)| *broker).collect();
    match topic_key {
        "retention.ms" => keys.extend(["log.retention.minutes", "log.retention.hours"]),
        "segment.ms" => keys.push("log.roll.hours"),
        "unclean.leader.election.enable" => keys.push("unclean.leader.election.enable"),
        _ => {}
    }
    keys
}

/// Broker keys that set a topic-level log default, with the topic key they map to.
const LOG_KEYS: &[(&str, &str)] = &[
    ("log.segment.bytes", "segment.bytes"),
    ("log.roll.ms", "segment.ms"),
    ("log.index.size.max.bytes", "segment.index.bytes"),
    ("log.index.interval.bytes", "index.interval.bytes"),
    ("log.retention.ms", "retention.ms"),
    ("log.retention.bytes", "retention.bytes"),
    ("log.flush.interval.messages", "flush.messages"),
    ("log.flush.interval.ms", "flush.ms"),
    ("message.max.bytes", "max.message.bytes"),
    ("log.segment.delete.delay.ms", "file.delete.delay.ms"),
    ("log.cleanup.policy", "cleanup.policy"),
    ("log.cleaner.delete.retention.ms", "delete.retention.ms"),
    ("log.cleaner.min.cleanable.ratio", "min.cleanable.dirty.ratio"),
    ("log.cleaner.min.compaction.lag.ms", "min.compaction.lag.ms"),
    ("min.insync.replicas", "min.insync.replicas"),
    ("log.preallocate", "preallocate"),
    ("compression.type", "compression.type"),
    ("log.message.timestamp.type", "message.timestamp.type"),
    ("log.message.timestamp.before.max.ms", "message.timestamp.before.max.ms"),
    ("log.message.timestamp.after.max.ms", "message.timestamp.after.max.ms"),
    ("log.cleaner.max.compaction.lag.ms", "max.compaction.lag.ms"),
];

impl BrokerConfig {
    /// Parses a TOML file body. Dotted Kafka keys may be written bare (`log.dirs = "..."`,
    /// which TOML reads as nested tables) or quoted (`"log.dirs" = "..."`).
    pub fn from_toml(text: &str) -> Result<Self> {
        let table: toml::Table = toml::from_str(text)?;
        let mut config = Self::default();
        config.apply_table("", &table)?;
        Ok(config)
    }

    fn apply_table(&mut self, prefix: &str, table: &toml::Table) -> Result<()> {
        for (key, value) in table {
            let key = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
            let text = match value {
                toml::Value::Table(inner) => {
                    self.apply_table(&key, inner)?;
                    continue;
                }
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                toml::Value::Float(f) => f.to_string(),
                other => {
                    return Err(Error::InvalidConfig {
                        key,
                        value: other.to_string(),
                        reason: "expected a string, number or boolean".into(),
                    })
                }
            };
            self.set(&key, &text)?;
        }
        Ok(())
    }

    /// Applies `FJORD_*` environment variables: `FJORD_LOG_RETENTION_MS=1000` sets
    /// `log.retention.ms`. Variables that name no broker key (other Fjord tools share
    /// the prefix) are skipped; a known key with a bad value is an error.
    pub fn apply_env(&mut self, vars: impl IntoIterator<Item = (String, String)>) -> Result<()> {
        for (name, value) in vars {
            let Some(rest) = name.strip_prefix("FJORD_") else { continue };
            let key = rest.to_ascii_lowercase().replace('_', ".");
            match self.set(&key, &value) {
                Err(Error::UnknownConfig { .. }) => {
                    tracing::debug!(variable = %name, "environment variable names no broker config key; skipped")
                }
                other => other?,
            }
        }
        Ok(())
    }

    /// Sets one key, Kafka name and value syntax.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let invalid =
            |reason: &str| Error::InvalidConfig { key: key.to_owned(), value: value.to_owned(), reason: reason.to_owned() };
        let int = || value.trim().parse::<i64>().map_err(|_| invalid("not an integer"));
        let millis = || -> Result<Duration> {
            let ms = int()?;
            u64::try_from(ms).map(Duration::from_millis).map_err(|_| invalid("must not be negative"))
        };
        let boolean = || value.trim().parse::<bool>().map_err(|_| invalid("expected true or false"));
        match key {
            "broker.id" => self.broker_id = i32::try_from(int()?).map_err(|_| invalid("out of range"))?,
            "log.dirs" | "log.dir" => {
                let dirs: Vec<PathBuf> = value.split(',').map(str::trim).filter(|d| !d.is_empty()).map(PathBuf::from).collect();
                let Some((first, others)) = dirs.split_first() else { return Err(invalid("no log directory")) };
                if dirs.iter().enumerate().any(|(i, d)| dirs[..i].contains(d)) {
                    return Err(invalid("a directory is listed twice"));
                }
                self.log_dir = first.clone();
                self.other_log_dirs = others.to_vec();
            }
            "zookeeper.connect" => self.zookeeper_connect = Some(value.trim().to_owned()).filter(|s| !s.is_empty()),
            "zookeeper.session.timeout.ms" => self.zookeeper_session_timeout = millis()?,
            "auto.create.topics.enable" => self.auto_create_topics = boolean()?,
            "num.partitions" => self.num_partitions = i32::try_from(int()?).map_err(|_| invalid("out of range"))?,
            "default.replication.factor" => {
                self.default_replication_factor = i16::try_from(int()?).map_err(|_| invalid("out of range"))?
            }
            "max.partitions.per.request" => {
                self.max_partitions_per_request =
                    i32::try_from(int()?).ok().filter(|n| *n >= 1).ok_or_else(|| invalid("must be between 1 and 2147483647"))?
            }
            "max.partitions.per.broker" => {
                self.max_partitions_per_broker =
                    Some(usize::try_from(int()?).ok().filter(|n| *n >= 1).ok_or_else(|| invalid("must be at least 1"))?)
            }
            "unclean.leader.election.enable" => self.unclean_leader_election = boolean()?,
            "auto.leader.rebalance.enable" => self.auto_leader_rebalance = boolean()?,
            "leader.imbalance.check.interval.seconds" => {
                let seconds = u64::try_from(int()?).ok().filter(|s| *s >= 1).ok_or_else(|| invalid("must be at least 1"))?;
                self.leader_imbalance_check_interval = Duration::from_secs(seconds);
            }
            "leader.imbalance.per.broker.percentage" => {
                self.leader_imbalance_per_broker_percentage =
                    u32::try_from(int()?).ok().filter(|p| *p <= 100).ok_or_else(|| invalid("must be between 0 and 100"))?
            }
            "broker.rack" => self.broker_rack = Some(value.trim().to_owned()).filter(|s| !s.is_empty()),
            "controlled.shutdown.enable" => self.controlled_shutdown = boolean()?,
            "controlled.shutdown.timeout.ms" => self.controlled_shutdown_timeout = millis()?,
            "socket.request.max.bytes" => {
                self.socket_request_max_bytes = usize::try_from(int()?).map_err(|_| invalid("must not be negative"))?
            }
            "queued.max.request.bytes" => {
                self.queued_max_request_bytes = match int()? {
                    -1 => None,
                    n => Some(
                        usize::try_from(n)
                            .ok()
                            .filter(|n| *n >= 1024)
                            .ok_or_else(|| invalid("must be -1 (unbounded) or at least 1024"))?,
                    ),
                }
            }
            "max.connections" => self.max_connections = usize::try_from(int()?).map_err(|_| invalid("must not be negative"))?,
            "max.connections.per.ip" => {
                self.max_connections_per_ip = usize::try_from(int()?).map_err(|_| invalid("must not be negative"))?
            }
            "connections.max.idle.ms" => self.connections_max_idle = millis()?,
            "quota.window.num" => {
                self.quota_window.samples =
                    u32::try_from(int()?).ok().filter(|n| *n >= 2).ok_or_else(|| invalid("must be at least 2"))?
            }
            "quota.window.size.seconds" => {
                self.quota_window.size = Duration::from_secs(
                    u64::try_from(int()?).ok().filter(|n| *n >= 1).ok_or_else(|| invalid("must be at least 1"))?,
                )
            }
            "sasl.server.max.receive.size" => {
                self.sasl_server_max_receive_size = usize::try_from(int()?).map_err(|_| invalid("must not be negative"))?
            }
            "connection.authentication.timeout.ms" => self.authentication_timeout = millis()?,
            "sasl.enabled.mechanisms" => {
                self.sasl_enabled_mechanisms = crate::sasl::parse_mechanisms(value).map_err(|r| invalid(&r))?
            }
            "connection.failed.authentication.delay.ms" => self.failed_authentication_delay = millis()?,
            "connections.max.reauth.ms" => self.connections_max_reauth = millis()?,
            "sasl.mechanism.inter.broker.protocol" => {
                self.sasl_inter_broker_mechanism = crate::sasl::Mechanism::parse(value.trim())
                    .ok_or_else(|| invalid("expected SCRAM-SHA-256, SCRAM-SHA-512 or PLAIN"))?
            }
            "inter.broker.sasl.username" => {
                self.inter_broker_sasl_username = Some(value.trim().to_owned()).filter(|v| !v.is_empty())
            }
            "inter.broker.sasl.password" => {
                self.inter_broker_sasl_password = Some(Secret(value.to_owned())).filter(|v| !v.0.is_empty())
            }
            "listeners" => self.listeners = value.parse()?,
            "advertised.listeners" => {
                // The names are checked against `listeners` by `validate` (either key may
                // come first); the addresses here.
                for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
                    let address = entry.split_once("://").map_or(entry, |(_, address)| address);
                    listener::split_host_port(address).ok_or_else(|| invalid("expected NAME://HOST:PORT,..."))?;
                }
                self.advertised_listener = Some(value.trim().to_owned()).filter(|s| !s.is_empty());
            }
            "listener.security.protocol.map" => {
                self.listener_security_protocol_map = listener::parse_protocol_map(value).map_err(|r| invalid(&r))?
            }
            "inter.broker.listener.name" => {
                self.inter_broker_listener_name = Some(value.trim().to_ascii_uppercase()).filter(|s| !s.is_empty())
            }
            "fetch.zero.copy" => self.fetch_zero_copy = boolean()?,
            "authorizer.enable" => self.authorizer_enable = boolean()?,
            "super.users" => {
                self.authorizer.super_users =
                    fjord_auth::AuthorizerConfig::parse_super_users(value).map_err(|e| invalid(&e.to_string()))?
            }
            "allow.everyone.if.no.acl.found" => self.authorizer.allow_everyone_if_no_acl_found = boolean()?,
            "audit.enable" => self.audit.enable = boolean()?,
            "audit.interval.ms" => self.audit.interval = millis()?,
            "audit.window.ms" => self.audit.window = millis()?,
            "audit.cluster" | "audit.tier" => {
                let name = value.trim();
                if name.is_empty() {
                    return Err(invalid("must not be empty"));
                }
                match key {
                    "audit.cluster" => self.audit.cluster = name.to_owned(),
                    _ => self.audit.tier = name.to_owned(),
                }
            }
            "metrics.listen" => {
                self.metrics_listen = match value.trim() {
                    "" => None,
                    address => Some(parse_listener(address).ok_or_else(|| invalid("expected HOST:PORT"))?),
                }
            }
            "group.min.session.timeout.ms" => self.group.min_session_timeout_ms = millis()?.as_millis() as u64,
            "group.max.session.timeout.ms" => self.group.max_session_timeout_ms = millis()?.as_millis() as u64,
            "group.initial.rebalance.delay.ms" => self.group.initial_rebalance_delay_ms = millis()?.as_millis() as u64,
            "group.max.size" => {
                self.group.max_size =
                    usize::try_from(int()?).ok().filter(|n| *n >= 1).ok_or_else(|| invalid("must be at least 1"))?
            }
            "offsets.retention.minutes" => {
                let minutes = u64::try_from(int()?).ok().filter(|m| *m >= 1).ok_or_else(|| invalid("must be at least 1"))?;
                self.group.offsets_retention = Duration::from_secs(minutes.saturating_mul(60));
            }
            "offsets.retention.check.interval.ms" => {
                self.group.offsets_retention_check_interval = millis()?.max(Duration::from_millis(1));
            }
            "offset.metadata.max.bytes" => {
                self.group.offset_metadata_max_bytes = usize::try_from(int()?).map_err(|_| invalid("must not be negative"))?
            }
            // Checked with retention, every log.retention.check.interval.ms.
            "producer.id.expiration.ms" => self.log.producer_id_expiration = millis()?,
            // Read when a partition's log opens.
            "producer.id.max.per.partition" => {
                self.log.max_producers =
                    usize::try_from(int()?).ok().filter(|n| *n >= 1).ok_or_else(|| invalid("must be at least 1"))?
            }
            "log.retention.check.interval.ms" => self.retention_check_interval = millis()?,
            "log.flush.scheduler.interval.ms" => self.flush_scheduler_interval = millis()?,
            "log.flush.offset.checkpoint.interval.ms" => self.checkpoint_interval = millis()?,
            // The floor under segment.bytes: set it before a smaller log.segment.bytes.
            "log.min.segment.bytes" => self.log.set_min_segment_bytes(value)?,
            "log.segment.files.open.max" => {
                self.segment_files_open_max =
                    usize::try_from(int()?).ok().filter(|n| *n >= 1).ok_or_else(|| invalid("must be at least 1"))?
            }
            "log.scrub.bytes.per.second" => {
                self.scrub_bytes_per_second = u64::try_from(int()?).map_err(|_| invalid("must not be negative"))?
            }
            "log.retention.minutes" | "log.retention.hours" | "log.roll.hours" => {
                let unit = if key.ends_with("minutes") { 60_000 } else { 3_600_000 };
                let n = int()?;
                let ms = if n < 0 { -1 } else { n.checked_mul(unit).ok_or_else(|| invalid("out of range"))? };
                let topic_key = if key.starts_with("log.roll") { "segment.ms" } else { "retention.ms" };
                self.log.set(topic_key, &ms.to_string())?;
            }
            _ if key.strip_prefix("metrics.").is_some_and(|k| fjord_auth::http::HttpSecurityConfig::KEYS.contains(&k)) => {
                self.metrics_security.set(&key["metrics.".len()..], value).map_err(|r| invalid(&r))?;
            }
            _ if crate::tls::SslConfig::KEYS.contains(&key) => self.ssl.set(key, value).map_err(|r| invalid(&r))?,
            _ if CleanerConfig::KEYS.contains(&key) => self.cleaner.set(key, value)?,
            _ if ReplicationConfig::KEYS.contains(&key) => self.replication.set(key, value).map_err(invalid)?,
            _ if crate::txn::TxnConfig::KEYS.contains(&key) => self.transaction.set(key, value).map_err(invalid)?,
            _ => match LOG_KEYS.iter().find(|(broker_key, _)| *broker_key == key) {
                Some((_, topic_key)) => self.log.set(topic_key, value.trim())?,
                None => return Err(Error::UnknownConfig { key: key.to_owned() }),
            },
        }
        self.static_keys.insert(if key == "log.dir" { "log.dirs".to_owned() } else { key.to_owned() });
        Ok(())
    }

    /// Every log directory of `log.dirs`, the first (`log_dir`) first.
    pub fn log_dirs(&self) -> Vec<PathBuf> {
        std::iter::once(self.log_dir.clone()).chain(self.other_log_dirs.iter().cloned()).collect()
    }

    /// Checks the combination of settings.
    pub fn validate(&self) -> Result<()> {
        let invalid = |key: &str, value: String, reason: &str| Error::InvalidConfig {
            key: key.to_owned(),
            value,
            reason: reason.to_owned(),
        };
        if self.broker_id < 0 {
            return Err(invalid("broker.id", self.broker_id.to_string(), "must not be negative"));
        }
        if self.num_partitions < 1 {
            return Err(invalid("num.partitions", self.num_partitions.to_string(), "must be at least 1"));
        }
        if self.max_partitions_per_request < 1 {
            return Err(invalid("max.partitions.per.request", self.max_partitions_per_request.to_string(), "must be at least 1"));
        }
        if self.num_partitions > self.max_partitions_per_request {
            return Err(invalid(
                "num.partitions",
                self.num_partitions.to_string(),
                "must not exceed max.partitions.per.request (every auto-create would be refused)",
            ));
        }
        if self.max_partitions_per_broker == Some(0) {
            return Err(invalid("max.partitions.per.broker", "0".into(), "must be at least 1"));
        }
        if self.default_replication_factor < 1 {
            return Err(invalid("default.replication.factor", self.default_replication_factor.to_string(), "must be at least 1"));
        }
        if self.socket_request_max_bytes < 1024 || self.socket_request_max_bytes > i32::MAX as usize {
            return Err(invalid(
                "socket.request.max.bytes",
                self.socket_request_max_bytes.to_string(),
                "must be between 1 KiB and 2 GiB",
            ));
        }
        let bound: Vec<SocketAddr> = self.listeners.iter().map(|l| l.address).collect();
        self.listener_plan(&bound)?;
        if self.max_connections == 0 {
            return Err(invalid("max.connections", "0".into(), "must be at least 1"));
        }
        if self.max_connections_per_ip == 0 {
            return Err(invalid("max.connections.per.ip", "0".into(), "must be at least 1"));
        }
        if self.connections_max_idle.is_zero() {
            return Err(invalid("connections.max.idle.ms", "0".into(), "must be at least 1"));
        }
        if self.authentication_timeout.is_zero() {
            return Err(invalid("connection.authentication.timeout.ms", "0".into(), "must be at least 1"));
        }
        if self.sasl_server_max_receive_size < 64 || self.sasl_server_max_receive_size > self.socket_request_max_bytes {
            return Err(invalid(
                "sasl.server.max.receive.size",
                self.sasl_server_max_receive_size.to_string(),
                "must be between 64 bytes and socket.request.max.bytes",
            ));
        }
        if self.audit.interval.is_zero() {
            return Err(invalid("audit.interval.ms", "0".into(), "must be at least 1"));
        }
        if self.audit.window.as_millis() == 0 {
            return Err(invalid("audit.window.ms", self.audit.window.as_millis().to_string(), "must be at least 1"));
        }
        self.log.validate()?;
        Ok(())
    }

    /// The listener brokers connect to each other on (`inter.broker.listener.name`,
    /// default the first listener).
    pub fn inter_broker_listener(&self) -> &str {
        self.inter_broker_listener_name.as_deref().unwrap_or(&self.listeners.first().name)
    }

    /// Each listener (in `listeners` order) with its protocol and advertised address,
    /// given the addresses actually bound (`bound[i]` for the i-th listener; port 0 in
    /// the config is whatever the system chose).
    pub(crate) fn listener_plan(&self, bound: &[SocketAddr]) -> Result<Vec<ListenerInfo>> {
        let invalid = |key: &str, value: &str, reason: String| Error::InvalidConfig {
            key: key.to_owned(),
            value: value.to_owned(),
            reason,
        };
        let advertised_text = self.advertised_listener.as_deref().unwrap_or_default();
        let advertised = listener::parse_advertised(advertised_text, &self.listeners)
            .map_err(|reason| invalid("advertised.listeners", advertised_text, reason))?;
        let mut plan = Vec::with_capacity(self.listeners.len());
        for (listener, bound) in self.listeners.iter().zip(bound) {
            let protocol = *self.listener_security_protocol_map.get(&listener.name).ok_or_else(|| {
                invalid(
                    "listener.security.protocol.map",
                    &listener.name,
                    format!("listener {} has no security protocol in the map", listener.name),
                )
            })?;
            let (host, port) = match advertised.get(&listener.name) {
                Some((host, port)) => (host.clone(), *port),
                None if bound.ip().is_unspecified() => {
                    return Err(invalid(
                        "advertised.listeners",
                        advertised_text,
                        format!("listener {} binds a wildcard address: advertise a host clients can reach", listener.name),
                    ))
                }
                None => (bound.ip().to_string(), bound.port()),
            };
            plan.push(ListenerInfo { name: listener.name.clone(), protocol, host, port });
        }
        let inter = self.inter_broker_listener();
        if !plan.iter().any(|l| l.name == inter) {
            return Err(invalid("inter.broker.listener.name", inter, "not one of the listeners".into()));
        }
        Ok(plan)
    }
}

/// The TOML body deserializes through [`BrokerConfig::set`], so serde users get the same
/// key names and validation as the file loader.
impl<'de> Deserialize<'de> for BrokerConfig {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let table = toml::Table::deserialize(deserializer)?;
        let mut config = Self::default();
        config.apply_table("", &table).map_err(serde::de::Error::custom)?;
        Ok(config)
    }
}

fn parse_listener(value: &str) -> Option<SocketAddr> {
    let value = value.trim();
    let address = value.split_once("://").map_or(value, |(_, rest)| rest);
    if address.contains(',') {
        return None;
    }
    listener::resolve(address)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_with_kafka_keys_bare_and_quoted() {
        let config = BrokerConfig::from_toml(
            r#"
            broker.id = 3
            listeners = "PLAINTEXT://127.0.0.1:19092"
            "log.dirs" = "/tmp/x"
            num.partitions = 4
            auto.create.topics.enable = false
            log.retention.hours = 2
            log.segment.bytes = 1048576
            zookeeper.session.timeout.ms = 6000
            auto.leader.rebalance.enable = false
            leader.imbalance.check.interval.seconds = 30
            leader.imbalance.per.broker.percentage = 0
            "#,
        )
        .unwrap();
        assert_eq!(config.broker_id, 3);
        assert_eq!(config.zookeeper_session_timeout, Duration::from_secs(6));
        assert!(!config.auto_leader_rebalance);
        assert_eq!(config.leader_imbalance_check_interval, Duration::from_secs(30));
        assert_eq!(config.leader_imbalance_per_broker_percentage, 0);
        assert_eq!(config.listeners, "127.0.0.1:19092".parse::<SocketAddr>().unwrap().into());
        assert_eq!(config.log_dir, PathBuf::from("/tmp/x"));
        assert!(config.other_log_dirs.is_empty());
        assert_eq!(config.num_partitions, 4);
        assert!(!config.auto_create_topics);
        assert_eq!(config.log.retention_ms, Some(Duration::from_secs(7200)));
        assert_eq!(config.log.segment_bytes, 1 << 20);
        config.validate().unwrap();
    }

    #[test]
    fn group_size_and_offsets_retention_keys() {
        let mut config = BrokerConfig::default();
        assert_eq!(config.group.offsets_retention, Duration::from_secs(7 * 24 * 3600), "Kafka's week");
        assert_eq!(config.group.max_size, 1000);
        config.set("group.max.size", "5").unwrap();
        assert_eq!(config.group.max_size, 5);
        assert!(matches!(config.set("group.max.size", "0"), Err(Error::InvalidConfig { .. })));
        config.set("offsets.retention.minutes", "90").unwrap();
        config.set("offsets.retention.check.interval.ms", "1500").unwrap();
        assert_eq!(config.group.offsets_retention, Duration::from_secs(90 * 60));
        assert_eq!(config.group.offsets_retention_check_interval, Duration::from_millis(1500));
        for bad in ["0", "-1", "x"] {
            assert!(matches!(config.set("offsets.retention.minutes", bad), Err(Error::InvalidConfig { .. })), "{bad:?}");
        }
        assert!(matches!(config.set("offsets.retention.check.interval.ms", "-5"), Err(Error::InvalidConfig { .. })));
    }

    #[test]
    fn log_dirs_takes_several_comma_separated_directories() {
        let mut config = BrokerConfig::default();
        config.set("log.dirs", " /d/a, /d/b ,/d/c").unwrap();
        assert_eq!(config.log_dir, PathBuf::from("/d/a"), "the first holds the metadata store");
        assert_eq!(config.log_dirs(), ["/d/a", "/d/b", "/d/c"].map(PathBuf::from));
        config.set("log.dir", "/d/one").unwrap();
        assert_eq!(config.log_dirs(), [PathBuf::from("/d/one")]);
        for bad in ["", " , ", "/d/a,/d/b,/d/a"] {
            assert!(matches!(config.set("log.dirs", bad), Err(Error::InvalidConfig { .. })), "{bad:?}");
        }
    }

    #[test]
    fn unknown_keys_and_bad_values_are_typed_errors() {
        assert!(matches!(BrokerConfig::from_toml("no.such.key = 1"), Err(Error::UnknownConfig { .. })));
        assert!(matches!(BrokerConfig::from_toml("broker.id = \"x\""), Err(Error::InvalidConfig { .. })));
        assert!(matches!(BrokerConfig::from_toml("listeners = \"nope\""), Err(Error::InvalidConfig { .. })));
        for (key, value) in [
            ("auto.leader.rebalance.enable", "yes"),
            ("leader.imbalance.check.interval.seconds", "0"),
            ("leader.imbalance.check.interval.seconds", "-5"),
            ("leader.imbalance.check.interval.seconds", "1s"),
            ("leader.imbalance.per.broker.percentage", "101"),
            ("leader.imbalance.per.broker.percentage", "-1"),
        ] {
            let mut config = BrokerConfig::default();
            assert!(matches!(config.set(key, value), Err(Error::InvalidConfig { .. })), "{key}={value}");
            assert_eq!(
                (
                    config.auto_leader_rebalance,
                    config.leader_imbalance_check_interval,
                    config.leader_imbalance_per_broker_percentage
                ),
                (true, Duration::from_secs(300), 10),
                "a refused value changes nothing"
            );
        }
        for value in ["0", "-1", "many", "1e3"] {
            let mut config = BrokerConfig::default();
            let refused = config.set("producer.id.max.per.partition", value);
            assert!(matches!(refused, Err(Error::InvalidConfig { .. })), "producer.id.max.per.partition={value}");
            assert_eq!(config.log.max_producers, 10_000, "a refused value changes nothing");
        }
        let config = BrokerConfig::from_toml("producer.id.max.per.partition = 100000").unwrap();
        assert_eq!(config.log.max_producers, 100_000);
        let mut config = BrokerConfig { num_partitions: 0, ..BrokerConfig::default() };
        assert!(config.validate().is_err());
        config.num_partitions = 1;
        config.validate().unwrap();
    }

    #[test]
    fn cleaner_keys_set_the_cleaner_and_the_compaction_defaults() {
        let config = BrokerConfig::from_toml(
            r#"
            log.cleaner.backoff.ms = 250
            log.cleaner.dedupe.buffer.size = 1048576
            log.cleaner.io.max.bytes.per.second = 1e6
            log.cleanup.policy = "compact"
            log.cleaner.delete.retention.ms = 1000
            log.cleaner.min.cleanable.ratio = 0.1
            log.cleaner.min.compaction.lag.ms = 5
            "#,
        )
        .unwrap();
        assert_eq!(config.cleaner.backoff, Duration::from_millis(250));
        assert_eq!(config.cleaner.dedupe_buffer_size, 1 << 20);
        assert_eq!(config.cleaner.io_max_bytes_per_second, Some(1e6));
        assert_eq!(config.log.cleanup_policy, fjord_log::CleanupPolicy::Compact);
        assert_eq!(config.log.delete_retention, Duration::from_secs(1));
        assert_eq!(config.log.min_cleanable_dirty_ratio, 0.1);
        assert_eq!(config.log.min_compaction_lag, Duration::from_millis(5));
        for (key, value) in [
            ("log.cleaner.backoff.ms", "-1"),
            ("log.cleaner.dedupe.buffer.size", "10"),
            ("log.cleanup.policy", "shred"),
            ("log.cleaner.min.cleanable.ratio", "1.5"),
        ] {
            let mut config = BrokerConfig::default();
            assert!(config.set(key, value).is_err(), "{key}={value} is refused");
            assert_eq!(config.cleaner, CleanerConfig::default(), "a refused value changes nothing");
            assert_eq!(config.log, LogConfig::default());
        }
    }

    #[test]
    fn env_overrides_and_skips_foreign_variables() {
        let mut config = BrokerConfig::default();
        config
            .apply_env([
                ("FJORD_NUM_PARTITIONS".to_owned(), "7".to_owned()),
                ("FJORD_TEST_HDFS".to_owned(), "hdfs://x".to_owned()),
                ("PATH".to_owned(), "/bin".to_owned()),
            ])
            .unwrap();
        assert_eq!(config.num_partitions, 7);
        assert!(config.apply_env([("FJORD_BROKER_ID".to_owned(), "x".to_owned())]).is_err());
    }

    #[test]
    fn partition_limits_are_checked_keys() {
        let config = BrokerConfig::default();
        assert_eq!((config.max_partitions_per_request, config.max_partitions_per_broker), (10_000, None));
        let config = BrokerConfig::from_toml("max.partitions.per.request = 500\nmax.partitions.per.broker = 2000").unwrap();
        assert_eq!((config.max_partitions_per_request, config.max_partitions_per_broker), (500, Some(2000)));
        config.validate().unwrap();
        for (key, value) in [
            ("max.partitions.per.request", "0"),
            ("max.partitions.per.request", "-1"),
            ("max.partitions.per.request", "2147483648"),
            ("max.partitions.per.request", "many"),
            ("max.partitions.per.broker", "0"),
            ("max.partitions.per.broker", "-5"),
        ] {
            let mut config = BrokerConfig::default();
            assert!(matches!(config.set(key, value), Err(Error::InvalidConfig { .. })), "{key}={value}");
            assert_eq!((config.max_partitions_per_request, config.max_partitions_per_broker), (10_000, None), "unchanged");
        }
        let config = BrokerConfig { max_partitions_per_request: 0, ..BrokerConfig::default() };
        assert!(matches!(config.validate(), Err(Error::InvalidConfig { .. })));
        let config = BrokerConfig { max_partitions_per_broker: Some(0), ..BrokerConfig::default() };
        assert!(matches!(config.validate(), Err(Error::InvalidConfig { .. })));
        let config = BrokerConfig { num_partitions: 20, max_partitions_per_request: 10, ..BrokerConfig::default() };
        assert!(matches!(config.validate(), Err(Error::InvalidConfig { .. })), "auto-creates could never pass");
    }

    #[test]
    fn a_wildcard_listener_needs_an_advertised_address() {
        let mut config = BrokerConfig::default();
        config.set("listeners", "PLAINTEXT://0.0.0.0:9092").unwrap();
        assert!(matches!(config.validate(), Err(Error::InvalidConfig { .. })));
        config.set("advertised.listeners", "broker1.example:9092").unwrap();
        config.validate().unwrap();
    }

    #[test]
    fn metrics_are_off_unless_an_address_is_given() {
        let mut config = BrokerConfig::default();
        assert_eq!(config.metrics_listen, None);
        config.set("metrics.listen", "127.0.0.1:9094").unwrap();
        assert_eq!(config.metrics_listen, Some("127.0.0.1:9094".parse().unwrap()));
        assert!(matches!(config.set("metrics.listen", "nowhere"), Err(Error::InvalidConfig { .. })));
        config.set("metrics.listen", "").unwrap();
        assert_eq!(config.metrics_listen, None);
    }

    #[test]
    fn audit_keys_set_the_broker_tier() {
        let config = BrokerConfig::from_toml(
            r#"
            audit.enable = true
            audit.interval.ms = 5000
            audit.window.ms = 60000
            audit.cluster = "online"
            audit.tier = "analytics-broker"
            "#,
        )
        .unwrap();
        let expected = AuditConfig {
            enable: true,
            interval: Duration::from_secs(5),
            window: Duration::from_secs(60),
            cluster: "online".into(),
            tier: "analytics-broker".into(),
        };
        assert_eq!(config.audit, expected);
        config.validate().unwrap();
        assert!(!BrokerConfig::default().audit.enable, "off unless enabled");
        for (key, value) in [("audit.enable", "yes"), ("audit.interval.ms", "-1"), ("audit.cluster", " "), ("audit.tier", "")] {
            assert!(matches!(BrokerConfig::default().set(key, value), Err(Error::InvalidConfig { .. })), "{key}={value}");
        }
        for key in ["audit.interval.ms", "audit.window.ms"] {
            let mut config = BrokerConfig::default();
            config.set(key, "0").unwrap();
            assert!(matches!(config.validate(), Err(Error::InvalidConfig { .. })), "{key}=0");
        }
    }

    #[test]
    fn advertised_defaults_to_the_bound_address() {
        let mut config = BrokerConfig::default();
        let bound: SocketAddr = "127.0.0.1:4242".parse().unwrap();
        let advertised = |config: &BrokerConfig| {
            let plan = config.listener_plan(&[bound]).unwrap();
            (plan[0].host.clone(), plan[0].port)
        };
        assert_eq!(advertised(&config), ("127.0.0.1".to_owned(), 4242));
        config.set("advertised.listeners", "PLAINTEXT://kafka.example:9093").unwrap();
        assert_eq!(advertised(&config), ("kafka.example".to_owned(), 9093));
        config.set("advertised.listeners", "kafka.example:9095").unwrap();
        assert_eq!(advertised(&config), ("kafka.example".to_owned(), 9095));
    }

    #[test]
    fn named_listeners_with_their_protocols() {
        let config = BrokerConfig::from_toml(
            r#"
            listeners = "INTERNAL://127.0.0.1:9093,EXTERNAL://0.0.0.0:9094"
            listener.security.protocol.map = "INTERNAL:SSL,EXTERNAL:SASL_SSL"
            advertised.listeners = "EXTERNAL://kafka.example:9094"
            inter.broker.listener.name = "internal"
            "#,
        )
        .unwrap();
        config.validate().unwrap();
        assert_eq!(config.inter_broker_listener(), "INTERNAL");
        let bound: Vec<SocketAddr> = vec!["127.0.0.1:9093".parse().unwrap(), "0.0.0.0:9094".parse().unwrap()];
        let plan = config.listener_plan(&bound).unwrap();
        assert_eq!((plan[0].protocol, plan[0].endpoint()), (SecurityProtocol::Ssl, "INTERNAL://127.0.0.1:9093".to_owned()));
        assert_eq!(
            (plan[1].protocol, plan[1].endpoint()),
            (SecurityProtocol::SaslSsl, "EXTERNAL://kafka.example:9094".to_owned())
        );
        // Every listener needs a protocol, the inter-broker listener must exist, and a
        // wildcard listener must be advertised.
        for (key, value) in [
            ("listener.security.protocol.map", "INTERNAL:SSL"),
            ("inter.broker.listener.name", "REPLICATION"),
            ("advertised.listeners", "INTERNAL://h:1"),
            ("advertised.listeners", "OTHER://h:1"),
        ] {
            let mut broken = config.clone();
            broken.set(key, value).unwrap();
            assert!(matches!(broken.validate(), Err(Error::InvalidConfig { .. })), "{key}={value}");
        }
        assert!(BrokerConfig::default().set("advertised.listeners", "EXTERNAL://nohost").is_err());
    }

    #[test]
    fn the_readme_secured_listener_config_parses() {
        let config = BrokerConfig::from_toml(
            r#"
            listeners = "INTERNAL://10.0.0.1:9093,EXTERNAL://0.0.0.0:9094"
            listener.security.protocol.map = "INTERNAL:SASL_SSL,EXTERNAL:SASL_SSL"
            advertised.listeners = "INTERNAL://10.0.0.1:9093,EXTERNAL://kafka1.example.com:9094"
            inter.broker.listener.name = "INTERNAL"
            ssl.keystore.type = "PEM"
            ssl.keystore.location = "/etc/fjord/broker.pem"
            ssl.truststore.location = "/etc/fjord/ca.pem"
            ssl.client.auth = "none"
            sasl.enabled.mechanisms = "SCRAM-SHA-256,SCRAM-SHA-512"
            sasl.mechanism.inter.broker.protocol = "SCRAM-SHA-512"
            inter.broker.sasl.username = "broker"
            inter.broker.sasl.password = "..."
            "#,
        );
        // 10.0.0.1 need not exist to parse; binding is run's business.
        let config = config.unwrap();
        assert_eq!(config.inter_broker_sasl_username.as_deref(), Some("broker"));
        assert!(!format!("{config:?}").contains("\"...\""), "the password is never printed");
        let mut env = BrokerConfig::default();
        env.apply_env([("FJORD_INTER_BROKER_SASL_PASSWORD".to_owned(), "s3cret".to_owned())]).unwrap();
        assert_eq!(env.inter_broker_sasl_password, Some(Secret("s3cret".into())));
    }

    #[test]
    fn connection_limits() {
        let mut config = BrokerConfig::default();
        assert_eq!(config.connections_max_idle, Duration::from_secs(600));
        assert_eq!(config.max_connections_per_ip, usize::MAX);
        config.set("connections.max.idle.ms", "5000").unwrap();
        config.set("max.connections.per.ip", "3").unwrap();
        assert_eq!((config.connections_max_idle, config.max_connections_per_ip), (Duration::from_secs(5), 3));
        assert!(config.set("max.connections.per.ip", "-1").is_err());
    }

    #[test]
    fn request_memory_bound() {
        let mut config = BrokerConfig::default();
        assert_eq!(config.queued_max_request_bytes, Some(512 << 20), "bounded by default, unlike Kafka");
        config.set("queued.max.request.bytes", "-1").unwrap();
        assert_eq!(config.queued_max_request_bytes, None);
        config.set("queued.max.request.bytes", "1048576").unwrap();
        assert_eq!(config.queued_max_request_bytes, Some(1 << 20));
        for bad in ["0", "-2", "1023", "lots"] {
            assert!(config.set("queued.max.request.bytes", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn authorizer_keys() {
        let config = BrokerConfig::default();
        assert!(!config.authorizer_enable, "off by default: fjord dev allows everything");
        assert!(!config.authorizer.allow_everyone_if_no_acl_found);
        let text = "authorizer.enable = true\nsuper.users = \"User:admin; User:broker\"\nallow.everyone.if.no.acl.found = true\n";
        let config = BrokerConfig::from_toml(text).unwrap();
        assert!(config.authorizer_enable && config.authorizer.allow_everyone_if_no_acl_found);
        let names: Vec<String> = config.authorizer.super_users.iter().map(ToString::to_string).collect();
        assert_eq!(names, ["User:admin", "User:broker"]);
        let mut config = BrokerConfig::default();
        let error = config.set("super.users", "admin").unwrap_err();
        assert!(matches!(&error, Error::InvalidConfig { key, .. } if key == "super.users"), "{error}");
        assert!(config.set("authorizer.enable", "yes").is_err());
    }
}
