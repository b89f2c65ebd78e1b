//! DescribeConfigs: every config of a topic or a broker with its value and where the
//! value comes from, as Kafka reports it (`kafka-configs --describe --all`, UIs):
//! - a topic key: DYNAMIC_TOPIC_CONFIG when the topic overrides it, else
//!   STATIC_BROKER_CONFIG when the broker's own key for it (`log.retention.ms` for
//!   `retention.ms`, ...) was set in the broker's config (file, `FJORD_*`, flags), else
//!   DEFAULT_CONFIG;
//! - a broker key: DYNAMIC_BROKER_CONFIG / DYNAMIC_DEFAULT_BROKER_CONFIG for the
//!   dynamic keys stored in `/config/brokers`, STATIC_BROKER_CONFIG for a key set in the
//!   broker's config, DEFAULT_CONFIG for the rest;
//! - with `include_synonyms` (v1+), each key's synonyms in Kafka's order of precedence
//!   (the topic's override, the broker's static key, the default), each with its value
//!   and source, so a client sees what a removed override falls back to.
//!
//! The entries are built by [`topic_configs`] and [`broker_configs`], functions of the
//! configs alone, tested below without a broker.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::Duration;

use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use kafka_protocol::messages::{DescribeConfigsRequest, DescribeConfigsResponse, ResponseKind};
use kafka_protocol::protocol::StrBytes;

use fjord_auth::Operation;
use fjord_log::LogConfig;

use super::admin::{RESOURCE_BROKER, RESOURCE_TOPIC, TYPE_DOUBLE, TYPE_INT, TYPE_LIST, TYPE_LONG, TYPE_STRING};
use super::broker_configs;
use crate::codec::error_code;
use crate::config::broker_keys_of;
use crate::connection::Session;
use crate::handler::Broker;
use crate::replication::throttle::{FOLLOWER_REPLICAS, LEADER_REPLICAS};
use crate::BrokerConfig;

/// DescribeConfigs config sources.
const SOURCE_DYNAMIC_TOPIC: i8 = 1;
const SOURCE_DYNAMIC_BROKER: i8 = 2;
const SOURCE_DYNAMIC_DEFAULT_BROKER: i8 = 3;
const SOURCE_STATIC_BROKER: i8 = 4;
pub(super) const SOURCE_DEFAULT: i8 = 5;
/// DescribeConfigs config type BOOLEAN (the others are shared with AlterConfigs).
const TYPE_BOOLEAN: i8 = 1;

/// This broker's dynamic configs and the cluster default's (`/config/brokers/...`).
type DynamicConfigs = (BTreeMap<String, String>, BTreeMap<String, String>);

/// One described config: its value and source are its first synonym's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Described {
    pub(crate) name: Cow<'static, str>,
    pub(crate) config_type: i8,
    /// (name, value, source), the one in force first.
    pub(crate) synonyms: Vec<(Cow<'static, str>, String, i8)>,
}

impl Described {
    fn value(&self) -> &str {
        self.synonyms.first().map_or("", |(_, value, _)| value.as_str())
    }

    fn source(&self) -> i8 {
        self.synonyms.first().map_or(SOURCE_DEFAULT, |(_, _, source)| *source)
    }
}

impl Broker {
    pub(crate) async fn describe_configs(&self, request: DescribeConfigsRequest, session: &Session) -> ResponseKind {
        // The dynamic broker configs (this broker's and the cluster default), read once
        // and only when a broker resource is described.
        let dynamic = if request.resources.iter().any(|r| r.resource_type == RESOURCE_BROKER) {
            self.dynamic_broker_configs().await
        } else {
            Ok(Default::default())
        };
        let include_synonyms = request.include_synonyms;
        let results = request
            .resources
            .into_iter()
            .map(|resource| {
                let result = DescribeConfigsResult::default()
                    .with_resource_type(resource.resource_type)
                    .with_resource_name(resource.resource_name.clone());
                let access =
                    self.authorize_config(session, Operation::DescribeConfigs, resource.resource_type, &resource.resource_name);
                if let Err(code) = access {
                    return result.with_error_code(code);
                }
                let described = match resource.resource_type {
                    RESOURCE_TOPIC => match self.topics.get(&resource.resource_name) {
                        Some(topic) => {
                            topic_configs(&topic.config, topic.unclean_leader_election, &topic.overrides, &self.config)
                        }
                        None => return result.with_error_code(error_code::UNKNOWN_TOPIC_OR_PARTITION),
                    },
                    RESOURCE_BROKER => {
                        match (&dynamic, broker_configs::node_name(&resource.resource_name, self.config.broker_id)) {
                            (Ok((own, default)), Ok(node)) => {
                                let dynamic = |configs: &BTreeMap<String, String>, source| {
                                    configs
                                        .iter()
                                        .map(move |(k, v)| Described {
                                            name: Cow::Owned(k.clone()),
                                            config_type: broker_configs::config_type(k),
                                            synonyms: vec![(Cow::Owned(k.clone()), v.clone(), source)],
                                        })
                                        .collect::<Vec<_>>()
                                };
                                if node == broker_configs::DEFAULT_RESOURCE {
                                    // Kafka describes only the cluster-wide dynamic configs here.
                                    dynamic(default, SOURCE_DYNAMIC_DEFAULT_BROKER)
                                } else {
                                    // This broker's own dynamic value wins over the default's.
                                    let mut entries = dynamic(own, SOURCE_DYNAMIC_BROKER);
                                    entries.extend(
                                        dynamic(default, SOURCE_DYNAMIC_DEFAULT_BROKER)
                                            .into_iter()
                                            .filter(|d| !own.contains_key(d.name.as_ref())),
                                    );
                                    entries.extend(broker_configs(&self.config, self.topics.limits().per_broker));
                                    // The dynamic keys Fjord applies, at their default when unset.
                                    entries.extend(broker_configs::dynamic_defaults().filter(|d| {
                                        !own.contains_key(d.name.as_ref()) && !default.contains_key(d.name.as_ref())
                                    }));
                                    entries
                                }
                            }
                            (Err(code), Ok(_)) => return result.with_error_code(*code),
                            (_, Err((code, message))) => {
                                return result.with_error_code(code).with_error_message(Some(StrBytes::from_string(message)))
                            }
                        }
                    }
                    _ => {
                        return result
                            .with_error_code(error_code::INVALID_REQUEST)
                            .with_error_message(Some(StrBytes::from_static_str("unknown resource")))
                    }
                };
                let wanted = resource.configuration_keys;
                let configs = described
                    .into_iter()
                    .filter(|d| wanted.as_ref().is_none_or(|keys| keys.iter().any(|k| k.as_str() == d.name.as_ref())))
                    .map(|d| {
                        let synonyms = match include_synonyms {
                            true => d
                                .synonyms
                                .iter()
                                .map(|(name, value, source)| {
                                    DescribeConfigsSynonym::default()
                                        .with_name(str_bytes(name.clone()))
                                        .with_value(Some(StrBytes::from_string(value.clone())))
                                        .with_source(*source)
                                })
                                .collect(),
                            false => Vec::new(),
                        };
                        DescribeConfigsResourceResult::default()
                            .with_value(Some(StrBytes::from_string(d.value().to_owned())))
                            .with_config_source(d.source())
                            .with_config_type(d.config_type)
                            .with_synonyms(synonyms)
                            .with_name(str_bytes(d.name))
                    })
                    .collect();
                result.with_configs(configs)
            })
            .collect();
        ResponseKind::DescribeConfigs(DescribeConfigsResponse::default().with_results(results))
    }

    /// This broker's dynamic configs and the cluster default's, from the metadata store;
    /// the error code to answer when it cannot be read.
    async fn dynamic_broker_configs(&self) -> Result<DynamicConfigs, i16> {
        let store = &**self.topics.store();
        let read = |node: String| async move { broker_configs::read(store, &node).await.map(|(configs, _)| configs) };
        let own = read(self.config.broker_id.to_string()).await;
        let default = read(broker_configs::DEFAULT_RESOURCE.to_owned()).await;
        match (own, default) {
            (Ok(own), Ok(default)) => Ok((own, default)),
            (Err(e), _) | (_, Err(e)) => {
                tracing::error!(error = %e, "reading the dynamic broker configs failed");
                Err(error_code::UNKNOWN_SERVER_ERROR)
            }
        }
    }
}

fn str_bytes(s: Cow<'static, str>) -> StrBytes {
    match s {
        Cow::Borrowed(s) => StrBytes::from_static_str(s),
        Cow::Owned(s) => StrBytes::from_string(s),
    }
}

/// A topic's configs: `config` is its effective log config (the broker's with its
/// `overrides` applied), `broker` the broker's config, for the fallbacks.
pub(crate) fn topic_configs(
    config: &LogConfig,
    unclean_leader_election: bool,
    overrides: &BTreeMap<String, String>,
    broker: &BrokerConfig,
) -> Vec<Described> {
    let defaults = BrokerConfig::default();
    let of = |log: &LogConfig, unclean: bool| {
        let mut entries = log_config_entries(log);
        entries.push(("unclean.leader.election.enable", unclean.to_string(), TYPE_BOOLEAN));
        entries
    };
    let broker_values = of(&broker.log, broker.unclean_leader_election);
    let default_values = of(&defaults.log, defaults.unclean_leader_election);
    of(config, unclean_leader_election)
        .into_iter()
        .zip(broker_values.into_iter().zip(default_values))
        .map(|((name, value, config_type), ((_, broker_value, _), (_, default_value, _)))| {
            let broker_keys = broker_keys_of(name);
            let mut synonyms = Vec::new();
            if overrides.contains_key(name) {
                synonyms.push((Cow::Borrowed(name), value, SOURCE_DYNAMIC_TOPIC));
            }
            let default_name = broker_keys.first().copied().unwrap_or(name);
            // Set in the broker's config (under any of its names), or changed in code
            // where the config was built (embedded brokers, tests): either way the value
            // in force is the broker's, not the default.
            match broker_keys.iter().find(|k| broker.static_keys.contains(**k)) {
                Some(set) => synonyms.push((Cow::Borrowed(*set), broker_value, SOURCE_STATIC_BROKER)),
                None if broker_value != default_value => {
                    synonyms.push((Cow::Borrowed(default_name), broker_value, SOURCE_STATIC_BROKER))
                }
                None => {}
            }
            synonyms.push((Cow::Borrowed(default_name), default_value, SOURCE_DEFAULT));
            Described { name: Cow::Borrowed(name), config_type, synonyms }
        })
        .chain([LEADER_REPLICAS, FOLLOWER_REPLICAS].map(|name| {
            // The replication throttles' lists: topic keys only, empty by default.
            let mut synonyms = Vec::new();
            if let Some(value) = overrides.get(name) {
                synonyms.push((Cow::Borrowed(name), value.clone(), SOURCE_DYNAMIC_TOPIC));
            }
            synonyms.push((Cow::Borrowed(name), String::new(), SOURCE_DEFAULT));
            Described { name: Cow::Borrowed(name), config_type: TYPE_LIST, synonyms }
        }))
        .collect()
}

/// The broker's own (static) configs; `partitions_per_broker` is the limit in force
/// (derived from the open-file limit unless `max.partitions.per.broker` is set).
pub(crate) fn broker_configs(c: &BrokerConfig, partitions_per_broker: usize) -> Vec<Described> {
    let defaults = BrokerConfig::default();
    let entries = |c: &BrokerConfig, per_broker: String| {
        let mut entries = vec![
            ("broker.id", c.broker_id.to_string(), TYPE_INT),
            ("num.partitions", c.num_partitions.to_string(), TYPE_INT),
            ("default.replication.factor", c.default_replication_factor.to_string(), TYPE_INT),
            ("unclean.leader.election.enable", c.unclean_leader_election.to_string(), TYPE_BOOLEAN),
            ("controlled.shutdown.enable", c.controlled_shutdown.to_string(), TYPE_BOOLEAN),
            ("auto.leader.rebalance.enable", c.auto_leader_rebalance.to_string(), TYPE_BOOLEAN),
            ("leader.imbalance.check.interval.seconds", c.leader_imbalance_check_interval.as_secs().to_string(), TYPE_LONG),
            ("leader.imbalance.per.broker.percentage", c.leader_imbalance_per_broker_percentage.to_string(), TYPE_INT),
            ("auto.create.topics.enable", c.auto_create_topics.to_string(), TYPE_BOOLEAN),
            ("max.partitions.per.request", c.max_partitions_per_request.to_string(), TYPE_INT),
            ("max.partitions.per.broker", per_broker, TYPE_INT),
            ("socket.request.max.bytes", c.socket_request_max_bytes.to_string(), TYPE_INT),
            ("queued.max.request.bytes", c.queued_max_request_bytes.map_or("-1".into(), |n| n.to_string()), TYPE_LONG),
            ("log.dirs", c.log_dirs().iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(","), TYPE_STRING),
            // Clients read it to learn whether sessions expire (librdkafka's test 0142).
            ("connections.max.reauth.ms", c.connections_max_reauth.as_millis().to_string(), TYPE_LONG),
        ];
        // The topic defaults, under the broker's names for them.
        entries.extend(log_config_entries(&c.log).into_iter().map(|(topic_key, value, config_type)| {
            (broker_keys_of(topic_key).first().copied().unwrap_or(topic_key), value, config_type)
        }));
        entries
    };
    // The limit in force is also the default shown: without `max.partitions.per.broker`
    // it is derived from the open-file limit, which this function does not know.
    let default_per_broker = partitions_per_broker.to_string();
    entries(c, partitions_per_broker.to_string())
        .into_iter()
        .zip(entries(&defaults, default_per_broker))
        .map(|((name, value, config_type), (_, default_value, _))| {
            let mut synonyms = Vec::new();
            // A key set under another name counts too (`log.retention.hours` for `log.retention.ms`).
            // A value changed in code where the config was built counts as set too: what is
            // shown is always the value in force.
            let set = c.static_keys.contains(name)
                || LOG_KEY_ALIASES.iter().any(|(alias, key)| *key == name && c.static_keys.contains(*alias))
                || value != default_value;
            if set {
                synonyms.push((Cow::Borrowed(name), value, SOURCE_STATIC_BROKER));
            }
            synonyms.push((Cow::Borrowed(name), default_value, SOURCE_DEFAULT));
            Described { name: Cow::Borrowed(name), config_type, synonyms }
        })
        .collect()
}

/// Broker keys that set the same value as another broker key, in other units.
const LOG_KEY_ALIASES: &[(&str, &str)] = &[
    ("log.retention.minutes", "log.retention.ms"),
    ("log.retention.hours", "log.retention.ms"),
    ("log.roll.hours", "log.roll.ms"),
];

/// A topic's effective config under Kafka's names and value syntax ("none" is -1 for
/// retention, Long.MAX for flush and roll settings, as Kafka shows them).
fn log_config_entries(c: &LogConfig) -> Vec<(&'static str, String, i8)> {
    fn ms(d: Option<Duration>, none: i64) -> String {
        d.map_or(none, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)).to_string()
    }
    vec![
        ("cleanup.policy", c.cleanup_policy.as_str().to_owned(), TYPE_LIST),
        ("segment.bytes", c.segment_bytes.to_string(), TYPE_INT),
        ("segment.ms", ms(c.segment_ms, i64::MAX), TYPE_LONG),
        ("segment.index.bytes", c.segment_index_bytes.to_string(), TYPE_INT),
        ("index.interval.bytes", c.index_interval_bytes.to_string(), TYPE_INT),
        ("retention.ms", ms(c.retention_ms, -1), TYPE_LONG),
        ("retention.bytes", c.retention_bytes.map_or(-1, |b| b as i64).to_string(), TYPE_LONG),
        ("flush.messages", c.flush_messages.map_or(i64::MAX, |m| m as i64).to_string(), TYPE_LONG),
        ("flush.ms", ms(c.flush_ms, i64::MAX), TYPE_LONG),
        ("max.message.bytes", c.max_message_bytes.to_string(), TYPE_INT),
        ("file.delete.delay.ms", ms(Some(c.file_delete_delay), 0), TYPE_LONG),
        ("delete.retention.ms", ms(Some(c.delete_retention), 0), TYPE_LONG),
        ("min.cleanable.dirty.ratio", c.min_cleanable_dirty_ratio.to_string(), TYPE_DOUBLE),
        ("min.compaction.lag.ms", ms(Some(c.min_compaction_lag), 0), TYPE_LONG),
        ("min.insync.replicas", c.min_insync_replicas.to_string(), TYPE_INT),
        ("compression.type", c.compression_type.as_str().to_owned(), TYPE_STRING),
        ("message.timestamp.type", c.message_timestamp_type.as_str().to_owned(), TYPE_STRING),
        ("message.timestamp.before.max.ms", ms(c.message_timestamp_before_max, i64::MAX), TYPE_LONG),
        ("message.timestamp.after.max.ms", ms(c.message_timestamp_after_max, i64::MAX), TYPE_LONG),
        ("max.compaction.lag.ms", ms(c.max_compaction_lag, i64::MAX), TYPE_LONG),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find<'a>(described: &'a [Described], name: &str) -> &'a Described {
        described.iter().find(|d| d.name == name).unwrap_or_else(|| panic!("{name} not described"))
    }

    fn synonyms(d: &Described) -> Vec<(&str, &str, i8)> {
        d.synonyms.iter().map(|(n, v, s)| (n.as_ref(), v.as_str(), *s)).collect()
    }

    #[test]
    fn brokers_report_connections_max_reauth_ms_with_its_source() {
        let default = broker_configs(&BrokerConfig::default(), 1000);
        let reauth = find(&default, "connections.max.reauth.ms");
        assert_eq!((reauth.value(), reauth.source()), ("0", SOURCE_DEFAULT));
        let mut broker = BrokerConfig::default();
        broker.set("connections.max.reauth.ms", "10000").unwrap();
        let described = broker_configs(&broker, 1000);
        let reauth = find(&described, "connections.max.reauth.ms");
        assert_eq!((reauth.value(), reauth.source()), ("10000", SOURCE_STATIC_BROKER));
        assert!(BrokerConfig::default().set("connections.max.reauth.ms", "-1").is_err(), "negative is refused");
    }

    #[test]
    fn topic_keys_come_from_the_override_the_broker_file_or_the_default() {
        let mut broker = BrokerConfig::default();
        broker.set("log.retention.hours", "1").unwrap();
        broker.set("num.partitions", "3").unwrap();
        let mut config = broker.log;
        config.set("max.message.bytes", "5000").unwrap();
        let overrides = BTreeMap::from([("max.message.bytes".to_owned(), "5000".to_owned())]);
        let described = topic_configs(&config, false, &overrides, &broker);

        let max = find(&described, "max.message.bytes");
        assert_eq!((max.value(), max.source()), ("5000", SOURCE_DYNAMIC_TOPIC));
        let default_max = LogConfig::default().max_message_bytes.to_string();
        assert_eq!(
            synonyms(max),
            [("max.message.bytes", "5000", SOURCE_DYNAMIC_TOPIC), ("message.max.bytes", default_max.as_str(), SOURCE_DEFAULT)]
        );
        let retention = find(&described, "retention.ms");
        assert_eq!((retention.value(), retention.source()), ("3600000", SOURCE_STATIC_BROKER));
        assert_eq!(synonyms(retention)[0], ("log.retention.hours", "3600000", SOURCE_STATIC_BROKER));
        assert_eq!(synonyms(retention)[1], ("log.retention.ms", "604800000", SOURCE_DEFAULT));
        let segment = find(&described, "segment.bytes");
        assert_eq!(segment.source(), SOURCE_DEFAULT);
        assert_eq!(described.len(), log_config_entries(&config).len() + 3, "every key, not only the overrides");
        let throttled = find(&described, LEADER_REPLICAS);
        assert_eq!((throttled.value(), throttled.source(), throttled.config_type), ("", SOURCE_DEFAULT, TYPE_LIST));
        let overrides = [(FOLLOWER_REPLICAS.to_owned(), "0:2".to_owned())].into_iter().collect();
        let described = topic_configs(&config, false, &overrides, &broker);
        let throttled = find(&described, FOLLOWER_REPLICAS);
        assert_eq!((throttled.value(), throttled.source()), ("0:2", SOURCE_DYNAMIC_TOPIC));

        let broker_side = broker_configs(&broker, 1000);
        assert_eq!(find(&broker_side, "num.partitions").source(), SOURCE_STATIC_BROKER);
        assert_eq!(synonyms(find(&broker_side, "num.partitions"))[1], ("num.partitions", "1", SOURCE_DEFAULT));
        assert_eq!(find(&broker_side, "log.retention.ms").source(), SOURCE_STATIC_BROKER);
        assert_eq!(find(&broker_side, "broker.id").source(), SOURCE_DEFAULT);
        assert_eq!(find(&broker_side, "message.max.bytes").source(), SOURCE_DEFAULT);
    }
}
