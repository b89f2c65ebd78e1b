//! [`MirrorConfig`]: sources, target, which topics, how to name and partition them, and the
//! intervals of commits, topic discovery and lag refresh.

use std::collections::HashSet;
use std::time::Duration;

use regex::Regex;

use crate::{Error, Result};

/// One source cluster: an alias (the origin header's value, `{alias}` in renames, the
/// `source` label of metrics) and its bootstrap list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceConfig {
    /// Short name of the cluster, e.g. `dc1`.
    pub alias: String,
    /// `HOST:PORT[,HOST:PORT...]`.
    pub bootstrap: String,
    /// How to reach it (`security.protocol`, `sasl.*`, `ssl.*`): each source cluster has
    /// its own identity, as MirrorMaker's consumer config.
    pub security: fjord_client::SecurityConfig,
}

impl SourceConfig {
    /// Parses `[ALIAS=]HOST:PORT[,HOST:PORT...]`; without an alias the bootstrap list is
    /// the alias.
    pub fn parse(s: &str) -> Result<Self> {
        let (alias, bootstrap) = match s.split_once('=') {
            Some((alias, bootstrap)) => (alias.trim(), bootstrap.trim()),
            None => (s.trim(), s.trim()),
        };
        if alias.is_empty() {
            return Err(Error::InvalidConfig(format!("source {s:?}: the alias before '=' is empty")));
        }
        check_bootstrap(bootstrap, &format!("source {alias}"))?;
        Ok(Self { alias: alias.to_string(), bootstrap: bootstrap.to_string(), security: Default::default() })
    }
}

/// The mirror tier of the audit: counts of records the target acknowledged, per source
/// topic and window of creation time, published to the target's `_audit`. The sources'
/// `_audit` topics are then mirrored into the target's `_audit` too (whatever the topic
/// regex), so one report on the analytics cluster compares every tier.
#[derive(Debug, Clone)]
pub struct AuditConfig {
    /// Cluster name written into the audit records (e.g. `analytics`).
    pub cluster: String,
    /// How often counts are published (and once more at shutdown).
    pub interval: Duration,
    /// Window length; every tier and the report must agree on it.
    pub window: Duration,
}

/// Everything one mirror process needs.
#[derive(Debug, Clone)]
pub struct MirrorConfig {
    /// Source clusters, each consumed by its own group member.
    pub sources: Vec<SourceConfig>,
    /// Target (analytics) cluster bootstrap list.
    pub target: String,
    /// How to reach the target (MirrorMaker's producer config): its own identity, apart
    /// from the sources'.
    pub target_security: fjord_client::SecurityConfig,
    /// Topics to mirror: a regex that must match the whole name. Internal topics
    /// (`__*`) never match.
    pub topics: String,
    /// Consumer group, in each source cluster, whose committed offsets are the mirror's
    /// positions; several mirror processes with the same group share the partitions.
    pub group: String,
    /// Target topic name template with `{alias}` and `{topic}`; `None` keeps the name
    /// (the analytics cluster aggregates every datacenter under one name).
    pub rename: Option<String>,
    /// Keep a target topic with fewer partitions than its source as it is and place
    /// records by key hash (records without a key: source partition modulo the target's
    /// count). Without it such a target grows to the source's count.
    pub repartition_by_key: bool,
    /// Flush the target and commit the source offsets at least this often; the window
    /// of possible duplicates after a crash.
    pub commit_interval: Duration,
    /// How often each source's topic list is read to pick up new matching topics.
    pub topic_refresh: Duration,
    /// How often each source's log end offsets are read for the lag.
    pub lag_interval: Duration,
    /// Longest pause between attempts to reach an unreachable source.
    pub retry_backoff_max: Duration,
    /// `session.timeout.ms` of the group members.
    pub session_timeout: Duration,
    /// `group.instance.id` (static membership): a restarted mirror with the same id takes
    /// its partitions back at once instead of after the session timeout.
    pub instance_id: Option<String>,
    /// The audit tier, when wanted.
    pub audit: Option<AuditConfig>,
    /// Host name for audit records; `None` = this machine's.
    pub host: Option<String>,
    /// Exactly once (MirrorMaker 2's `exactly.once.support`): each source's copies and
    /// its positions commit in one transaction on the target cluster, the positions as
    /// the offsets of group [`MirrorConfig::target_group`] there, read back from there when
    /// a partition is assigned; so a crash leaves no duplicates for read_committed readers
    /// of the target. The transactional id is [`MirrorConfig::transactional_id`]: mirror
    /// processes sharing a group need distinct `instance_id`s (or hosts).
    pub exactly_once: bool,
    /// The target producer's `max.request.size`: the largest record it sends, and how
    /// much one produce request holds. Default 1 MiB, as Kafka's producer (larger packs
    /// fewer, smaller batches into each request, which measured 7% more CPU per record
    /// here). A larger record is held like one the target refuses (or set aside with a
    /// dead-letter topic); raise it with the target topics' `max.message.bytes`.
    pub max_request_size: usize,
    /// Where records the target refuses for themselves go, a topic on the target (MirrorMaker
    /// 2's `errors.tolerance=all` with a dead-letter queue): a record too large for the
    /// target topic, one it finds invalid (a record without a key for a compacted topic),
    /// or one stamped outside its timestamp limits is written there instead, with headers
    /// saying where it came from and why, and copying goes on. `None` (the default): such
    /// a record holds its partition, retried alone with backoff and shown in `/status`,
    /// until the target takes it, while the other partitions go on.
    pub dead_letter_topic: Option<String>,
    /// The metrics endpoint's security, the broker's `metrics.*` keys (see
    /// [`MirrorConfig::set`]): TLS with `metrics.ssl.keystore.location`, HTTP Basic with
    /// `metrics.authentication.method=BASIC` (users read from the metadata store given to
    /// [`crate::run_with_store`]). Default: plain HTTP, open.
    pub metrics_security: fjord_auth::http::HttpSecurityConfig,
}

impl MirrorConfig {
    /// Defaults for the given sources, target and topic regex.
    pub fn new(sources: Vec<SourceConfig>, target: impl Into<String>, topics: impl Into<String>) -> Self {
        Self {
            sources,
            target: target.into(),
            target_security: Default::default(),
            topics: topics.into(),
            group: "fjord-mirror".into(),
            rename: None,
            repartition_by_key: false,
            commit_interval: Duration::from_secs(1),
            topic_refresh: Duration::from_secs(10),
            lag_interval: Duration::from_secs(1),
            retry_backoff_max: Duration::from_secs(30),
            session_timeout: Duration::from_secs(10),
            instance_id: None,
            audit: None,
            host: None,
            exactly_once: false,
            max_request_size: 1024 * 1024,
            dead_letter_topic: None,
            metrics_security: fjord_auth::http::HttpSecurityConfig::default(),
        }
    }

    /// Sets one `metrics.<key>` (as the broker's: `metrics.` and one of
    /// [`fjord_auth::http::HttpSecurityConfig::KEYS`], e.g. `metrics.ssl.keystore.location`,
    /// `metrics.authentication.method`); an unknown key or an unusable value is an error.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let known = key.strip_prefix("metrics.").filter(|k| fjord_auth::http::HttpSecurityConfig::KEYS.contains(k));
        let Some(security_key) = known else {
            return Err(Error::InvalidConfig(format!(
                "unknown key {key:?}: the mirror's config file takes the metrics endpoint's metrics.ssl.*, metrics.authentication.* keys"
            )));
        };
        match self.metrics_security.set(security_key, value) {
            Ok(_) => Ok(()),
            Err(reason) => Err(Error::InvalidConfig(format!("{key}={value}: {reason}"))),
        }
    }

    /// Checks everything that can be checked without a network, and compiles the topic
    /// regex (anchored: it must match the whole topic name).
    pub fn validate(&self) -> Result<Regex> {
        let bad = |m: String| Err(Error::InvalidConfig(m));
        if self.sources.is_empty() {
            return bad("at least one --source ALIAS=HOST:PORT is required".into());
        }
        let mut aliases = HashSet::new();
        for s in &self.sources {
            if !aliases.insert(s.alias.as_str()) {
                return bad(format!("source alias {:?} is given twice", s.alias));
            }
            check_bootstrap(&s.bootstrap, &format!("source {}", s.alias))?;
        }
        check_bootstrap(&self.target, "target")?;
        if self.group.is_empty() {
            return bad("the group name is empty".into());
        }
        for (name, d) in [
            ("commit interval", self.commit_interval),
            ("topic refresh", self.topic_refresh),
            ("lag interval", self.lag_interval),
        ] {
            if d.is_zero() {
                return bad(format!("the {name} must be above zero"));
            }
        }
        if let Some(template) = &self.rename {
            if !template.contains("{topic}") {
                return bad(format!(
                    "rename template {template:?} lacks {{topic}}: every source topic would land in one target topic"
                ));
            }
            let rest = template.replace("{alias}", "").replace("{topic}", "");
            if rest.contains('{') || rest.contains('}') {
                return bad(format!("rename template {template:?}: only {{alias}} and {{topic}} can be substituted"));
            }
        }
        for s in &self.sources {
            let sample = self.target_topic(&s.alias, "topic");
            if !is_legal_topic(&sample) {
                return bad(format!(
                    "rename template {:?} makes the illegal topic name {sample:?} for source {:?} (legal: ASCII letters, digits, '.', '_', '-'; \
                     give the source a short alias: --source NAME=HOST:PORT)",
                    self.rename.as_deref().unwrap_or_default(),
                    s.alias
                ));
            }
            // Copying a cluster into itself under the same names would copy the copies forever.
            if self.rename.is_none() && same_cluster(&s.bootstrap, &self.target) {
                return bad(format!("source {} is the target cluster and topics keep their names: the mirror would copy its own output; pass --rename", s.alias));
            }
        }
        if self.max_request_size == 0 || self.max_request_size > u32::MAX as usize {
            return bad(format!("max request size {} is not between 1 byte and 4 GiB", self.max_request_size));
        }
        if let Some(topic) = &self.dead_letter_topic {
            if !is_legal_topic(topic) || !fjord_audit::record::audited_topic(topic) {
                return bad(format!(
                    "dead-letter topic {topic:?} is not a name the mirror can write to (legal: ASCII letters, digits, '.', '_', '-'; \
                     not internal (__*), nor {}, {} or _schemas)",
                    fjord_audit::AUDIT_TOPIC,
                    fjord_audit::GAPS_TOPIC
                ));
            }
        }
        self.metrics_security.validate().map_err(|e| Error::InvalidConfig(format!("metrics endpoint: {e}")))?;
        let invalid = |e: regex::Error| Error::InvalidRegex { regex: self.topics.clone(), detail: e.to_string() };
        // Compiled alone first, so an error points into the text the user wrote.
        Regex::new(&self.topics).map_err(invalid)?;
        Regex::new(&format!("^(?:{})$", self.topics)).map_err(invalid)
    }

    /// The group on the target cluster whose offsets are source `alias`'s positions with
    /// [`MirrorConfig::exactly_once`]: one per source, since two sources may have topics
    /// of the same name.
    pub fn target_group(&self, alias: &str) -> String {
        format!("{}.{alias}", self.group)
    }

    /// The transactional id of source `alias`'s copies with [`MirrorConfig::exactly_once`]:
    /// stable across restarts, so a restarted mirror fences the killed one and aborts the
    /// transaction it left open at once instead of after the transaction timeout; distinct
    /// per process of a group through the instance id (else the host name).
    pub fn transactional_id(&self, alias: &str, host: &str) -> String {
        format!("fjord-mirror.{}.{alias}.{}", self.group, self.instance_id.as_deref().unwrap_or(host))
    }

    /// The target topic of `topic` from source `alias`.
    pub fn target_topic(&self, alias: &str, topic: &str) -> String {
        match &self.rename {
            Some(template) => template.replace("{alias}", alias).replace("{topic}", topic),
            None => topic.to_string(),
        }
    }
}

fn check_bootstrap(bootstrap: &str, what: &str) -> Result<()> {
    let servers: Vec<&str> = bootstrap.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    if servers.is_empty() {
        return Err(Error::InvalidConfig(format!("{what}: no HOST:PORT given")));
    }
    if let Some(bad) = servers.iter().find(|s| s.rsplit_once(':').is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err()))
    {
        return Err(Error::InvalidConfig(format!("{what}: {bad:?} is not HOST:PORT")));
    }
    Ok(())
}

fn same_cluster(a: &str, b: &str) -> bool {
    let set = |s: &str| s.split(',').map(|x| x.trim().to_string()).collect::<HashSet<_>>();
    !set(a).is_disjoint(&set(b))
}

/// Kafka's rule for topic names.
pub(crate) fn is_legal_topic(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 249
        && name != "."
        && name != ".."
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> MirrorConfig {
        MirrorConfig::new(
            vec![
                SourceConfig::parse("dc1=127.0.0.1:9092").unwrap(),
                SourceConfig::parse("dc2=127.0.0.1:9093,127.0.0.1:9094").unwrap(),
            ],
            "127.0.0.1:9095",
            "events|clicks-.*",
        )
    }

    #[test]
    fn the_regex_matches_whole_names_and_names_are_kept_or_renamed() {
        let mut c = config();
        let re = c.validate().unwrap();
        assert!(re.is_match("events") && re.is_match("clicks-eu"));
        assert!(!re.is_match("events2") && !re.is_match("old-events"));
        assert_eq!(c.target_topic("dc1", "events"), "events");
        c.rename = Some("{alias}.{topic}".into());
        c.validate().unwrap();
        assert_eq!(c.target_topic("dc2", "events"), "dc2.events");
    }

    #[test]
    fn exactly_once_names_are_per_source_and_per_process() {
        let mut c = config();
        assert_eq!(c.target_group("dc1"), "fjord-mirror.dc1");
        assert_ne!(c.target_group("dc1"), c.target_group("dc2"));
        assert_eq!(c.transactional_id("dc1", "host-a"), "fjord-mirror.fjord-mirror.dc1.host-a");
        c.instance_id = Some("m1".into());
        assert_eq!(c.transactional_id("dc1", "host-a"), "fjord-mirror.fjord-mirror.dc1.m1");
        assert_ne!(c.transactional_id("dc1", "h"), c.transactional_id("dc2", "h"));
    }

    #[test]
    fn bad_input_is_a_clear_error() {
        let mut c = config();
        c.topics = "events(".into();
        assert!(matches!(c.validate(), Err(Error::InvalidRegex { .. })), "{:?}", c.validate());
        for (rename, needle) in [
            ("{alias}", "lacks {topic}"),
            ("{dc}.{topic}", "only {alias} and {topic}"),
            ("{alias}/{topic}", "illegal topic name"),
        ] {
            let mut c = config();
            c.rename = Some(rename.into());
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(needle), "{rename}: {e}");
        }
        let mut c = config();
        c.sources.push(SourceConfig::parse("dc1=127.0.0.1:1").unwrap());
        assert!(c.validate().unwrap_err().to_string().contains("given twice"));
        let mut c = config();
        c.sources.clear();
        assert!(c.validate().unwrap_err().to_string().contains("at least one --source"));
        let mut c = config();
        c.target = "127.0.0.1:9093".into();
        assert!(c.validate().unwrap_err().to_string().contains("copy its own output"));
        for bad in ["=h:1", "dc1=nohost", "dc1=h:99999", "dc1="] {
            assert!(SourceConfig::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(SourceConfig::parse("h:1").unwrap().alias, "h:1");
        // An alias with ':' cannot go into a topic name.
        let mut c = config();
        c.sources = vec![SourceConfig::parse("h:1").unwrap()];
        c.rename = Some("{alias}.{topic}".into());
        assert!(c.validate().unwrap_err().to_string().contains("short alias"));
        for topic in ["", "a/b", "__dead", "_audit", "_mirror_gaps", &"x".repeat(250)] {
            let mut c = config();
            c.dead_letter_topic = Some(topic.to_string());
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains("dead-letter topic"), "{topic}: {e}");
        }
        let mut c = config();
        c.dead_letter_topic = Some("mirror.dead-letters".into());
        c.validate().unwrap();
        for size in [0, u32::MAX as usize + 1] {
            let mut c = config();
            c.max_request_size = size;
            assert!(c.validate().unwrap_err().to_string().contains("max request size"), "{size}");
        }
    }
}
