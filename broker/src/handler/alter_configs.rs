//! AlterConfigs (v0-v2) and IncrementalAlterConfigs (v0-v1) for topics.
//!
//! Both compute the topic's new set of overrides, validate it as CreateTopics does
//! (INVALID_CONFIG naming the key and value), store it in `/config/topics/<t>` with a
//! compare-and-set (two alters through different brokers cannot lose each other's keys)
//! and apply it to this broker's logs; the other brokers apply it from their watch
//! ([`crate::topic_config`]). As in Kafka, AlterConfigs replaces the whole set (keys it
//! does not name go back to their defaults) while IncrementalAlterConfigs changes only
//! the keys it names. BROKER resources go to [`super::broker_configs`].

use std::collections::{BTreeMap, HashSet};

use fjord_log::LogConfig;
use kafka_protocol::messages::{
    alter_configs_response, incremental_alter_configs_response, AlterConfigsRequest, AlterConfigsResponse,
    IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse, ResponseKind,
};
use kafka_protocol::protocol::StrBytes;

use super::admin::{RESOURCE_BROKER, RESOURCE_TOPIC};
use super::broker_configs;
use crate::codec::error_code;
use crate::connection::Session;
use crate::handler::Broker;
use crate::replication::throttle::{FOLLOWER_REPLICAS, LEADER_REPLICAS};
use crate::topic_config;
use crate::topics::{validate_topic_name, TopicError, UNCLEAN_LEADER_ELECTION};
use fjord_auth::Operation;

/// IncrementalAlterConfigs operations.
const OP_SET: i8 = 0;
const OP_DELETE: i8 = 1;
const OP_APPEND: i8 = 2;
const OP_SUBTRACT: i8 = 3;
/// The topic configs whose values are lists (APPEND and SUBTRACT apply to them only).
const LIST_KEYS: &[&str] = &["cleanup.policy", LEADER_REPLICAS, FOLLOWER_REPLICAS];
/// Compare-and-set attempts before giving up on a config node that keeps changing.
const CAS_ATTEMPTS: usize = 10;

/// Why a resource was refused: the Kafka error code and a message.
pub(super) type Refusal = (i16, String);

fn invalid_request(message: impl Into<String>) -> Refusal {
    (error_code::INVALID_REQUEST, message.into())
}

/// A key no topic has: neither a log key (those accepted and ignored included) nor
/// `unclean.leader.election.enable`, which the controller applies.
fn unknown_key(name: &str) -> Option<Refusal> {
    let known = LogConfig::KEYS.contains(&name)
        || LogConfig::IGNORED_KEYS.iter().any(|(key, _)| *key == name)
        || name == UNCLEAN_LEADER_ELECTION
        || name == LEADER_REPLICAS
        || name == FOLLOWER_REPLICAS;
    (!known).then(|| (error_code::INVALID_CONFIG, format!("unknown topic config {name}")))
}

/// One requested change of IncrementalAlterConfigs.
struct Op {
    name: String,
    operation: i8,
    value: Option<String>,
}

impl Broker {
    pub(crate) async fn alter_configs(&self, request: AlterConfigsRequest, session: &Session) -> ResponseKind {
        let duplicates = duplicate_resources(request.resources.iter().map(|r| (r.resource_type, r.resource_name.as_str())));
        let mut responses = Vec::with_capacity(request.resources.len());
        for resource in request.resources {
            let (kind, name) = (resource.resource_type, resource.resource_name);
            let entries: Vec<(String, Option<String>)> =
                resource.configs.into_iter().map(|c| (c.name.to_string(), c.value.map(|v| v.to_string()))).collect();
            // The keys are checked once the topic is known to exist: a missing topic is
            // UNKNOWN_TOPIC_OR_PARTITION whatever the request sets, as in Kafka.
            // Kafka drops entries with a null value: they stay unset.
            let access = self.authorize_config(session, Operation::AlterConfigs, kind, &name);
            let outcome = match check_resource(kind, &name, &duplicates) {
                Err(refusal) => Err(refusal),
                Ok(()) if access.is_err() => access.map_err(|code| (code, "not authorized to alter these configs".to_owned())),
                Ok(()) if kind == RESOURCE_BROKER => self.alter_broker(&name, request.validate_only, &entries).await,
                Ok(()) => self.alter_topic(&name, request.validate_only, |_| replacement(&entries)).await,
            };
            let (code, message) = split(outcome);
            responses.push(
                alter_configs_response::AlterConfigsResourceResponse::default()
                    .with_resource_type(kind)
                    .with_resource_name(name)
                    .with_error_code(code)
                    .with_error_message(message),
            );
        }
        ResponseKind::AlterConfigs(AlterConfigsResponse::default().with_responses(responses))
    }

    pub(crate) async fn incremental_alter_configs(
        &self,
        request: IncrementalAlterConfigsRequest,
        session: &Session,
    ) -> ResponseKind {
        let duplicates = duplicate_resources(request.resources.iter().map(|r| (r.resource_type, r.resource_name.as_str())));
        let defaults = self.topics.effective_config(&BTreeMap::new()).unwrap_or_default();
        let mut responses = Vec::with_capacity(request.resources.len());
        for resource in request.resources {
            let (kind, name) = (resource.resource_type, resource.resource_name);
            let ops: Vec<Op> = resource
                .configs
                .into_iter()
                .map(|c| Op { name: c.name.to_string(), operation: c.config_operation, value: c.value.map(|v| v.to_string()) })
                .collect();
            let access = self.authorize_config(session, Operation::AlterConfigs, kind, &name);
            let outcome = match check_resource(kind, &name, &duplicates) {
                Err(refusal) => Err(refusal),
                Ok(()) if access.is_err() => access.map_err(|code| (code, "not authorized to alter these configs".to_owned())),
                Ok(()) if kind == RESOURCE_BROKER => self.alter_broker_incrementally(&name, request.validate_only, &ops).await,
                Ok(()) => {
                    let edit = |current: &BTreeMap<String, String>| {
                        check_ops(&ops)?;
                        apply_ops(current, &defaults, &ops)
                    };
                    self.alter_topic(&name, request.validate_only, edit).await
                }
            };
            let (code, message) = split(outcome);
            responses.push(
                incremental_alter_configs_response::AlterConfigsResourceResponse::default()
                    .with_resource_type(kind)
                    .with_resource_name(name)
                    .with_error_code(code)
                    .with_error_message(message),
            );
        }
        ResponseKind::IncrementalAlterConfigs(IncrementalAlterConfigsResponse::default().with_responses(responses))
    }

    /// Legacy AlterConfigs on a broker resource: the entries with a value become its
    /// whole set of dynamic configs.
    async fn alter_broker(
        &self,
        resource: &str,
        validate_only: bool,
        entries: &[(String, Option<String>)],
    ) -> Result<(), Refusal> {
        let node = broker_configs::node_name(resource, self.config.broker_id)?;
        let mut names = HashSet::new();
        for (name, value) in entries {
            if !names.insert(name.as_str()) {
                return Err(invalid_request(format!("config {name} is named more than once")));
            }
            broker_configs::check(name, value.as_deref())?;
        }
        let next: BTreeMap<String, String> =
            entries.iter().filter_map(|(name, value)| Some((name.clone(), value.clone()?))).collect();
        broker_configs::alter(&**self.topics.store(), &node, validate_only, |_| Ok(next.clone())).await
    }

    /// IncrementalAlterConfigs on a broker resource: the named keys change, the others stay.
    async fn alter_broker_incrementally(&self, resource: &str, validate_only: bool, ops: &[Op]) -> Result<(), Refusal> {
        let node = broker_configs::node_name(resource, self.config.broker_id)?;
        let mut names = HashSet::new();
        for op in ops {
            if !names.insert(op.name.as_str()) {
                return Err(invalid_request(format!("config {} is named more than once", op.name)));
            }
            broker_configs::check(&op.name, op.value.as_deref())?;
            match op.operation {
                OP_DELETE => {}
                OP_SET | OP_APPEND | OP_SUBTRACT if op.value.is_none() => {
                    return Err(invalid_request(format!("null value for config {}", op.name)))
                }
                OP_SET => {}
                OP_APPEND | OP_SUBTRACT if !broker_configs::is_list(&op.name) => {
                    return Err(invalid_request(format!("config {} is not a list: it takes SET and DELETE only", op.name)))
                }
                OP_APPEND | OP_SUBTRACT => {}
                other => return Err(invalid_request(format!("unknown config operation {other} for {}", op.name))),
            }
        }
        // No broker-level defaults to start a list from: the dynamic value, or empty.
        let edit = |current: &BTreeMap<String, String>| apply_ops(current, &LogConfig::default(), ops);
        broker_configs::alter(&**self.topics.store(), &node, validate_only, edit).await
    }

    /// Reads the topic's overrides, computes the new ones with `edit`, validates them and
    /// (unless `validate_only`) stores them and applies them here.
    async fn alter_topic(
        &self,
        topic: &str,
        validate_only: bool,
        edit: impl Fn(&BTreeMap<String, String>) -> Result<BTreeMap<String, String>, Refusal>,
    ) -> Result<(), Refusal> {
        validate_topic_name(topic).map_err(|e| (e.code(), e.to_string()))?;
        let store = self.topics.store();
        let internal = |e: crate::Error| {
            tracing::error!(topic, error = %e, "altering topic config failed");
            (error_code::UNKNOWN_SERVER_ERROR, format!("metadata store: {e}"))
        };
        for _ in 0..CAS_ATTEMPTS {
            let stored = topic_config::read(&**store, topic).await.map_err(internal)?;
            let stored = stored.ok_or_else(|| (TopicError::Unknown.code(), format!("unknown topic {topic}")))?;
            let overrides = edit(&stored.overrides)?;
            self.topics.effective_config(&overrides).map_err(|e| (e.code(), e.to_string()))?;
            if validate_only {
                return Ok(());
            }
            if topic_config::write(&**store, topic, &stored, &overrides).await.map_err(internal)? {
                match self.topics.reload_config(topic).await {
                    // Not hosted here: the brokers that host it apply it from their watch.
                    Ok(_) | Err(TopicError::Unknown) => {}
                    Err(e) => tracing::warn!(topic, error = %e, "stored the new topic config but could not apply it here"),
                }
                return Ok(());
            }
        }
        Err((error_code::UNKNOWN_SERVER_ERROR, format!("the config of {topic} kept changing during the alter; retry")))
    }
}

/// The `(type, name)` pairs named more than once in one request: Kafka refuses each
/// occurrence, since the order they would apply in is not defined.
fn duplicate_resources<'a>(resources: impl Iterator<Item = (i8, &'a str)>) -> HashSet<(i8, String)> {
    let mut seen = HashSet::new();
    resources.filter(|&(kind, name)| !seen.insert((kind, name))).map(|(kind, name)| (kind, name.to_owned())).collect()
}

/// Refuses what is not a single topic resource.
fn check_resource(kind: i8, name: &str, duplicates: &HashSet<(i8, String)>) -> Result<(), Refusal> {
    match kind {
        _ if duplicates.contains(&(kind, name.to_owned())) => {
            Err(invalid_request(format!("resource {name} is named more than once")))
        }
        RESOURCE_TOPIC | RESOURCE_BROKER => Ok(()),
        other => Err(invalid_request(format!("unsupported resource type {other}"))),
    }
}

/// AlterConfigs: the entries with a value become the whole override set.
fn replacement(entries: &[(String, Option<String>)]) -> Result<BTreeMap<String, String>, Refusal> {
    let mut overrides = BTreeMap::new();
    let mut names = HashSet::new();
    for (name, value) in entries {
        if !names.insert(name.as_str()) {
            return Err(invalid_request(format!("config {name} is named more than once")));
        }
        if let Some(refusal) = unknown_key(name) {
            return Err(refusal);
        }
        if let Some(value) = value {
            overrides.insert(name.clone(), value.clone());
        }
    }
    Ok(overrides)
}

/// IncrementalAlterConfigs: refusals that do not depend on the current config.
fn check_ops(ops: &[Op]) -> Result<(), Refusal> {
    let mut names = HashSet::new();
    for op in ops {
        if !names.insert(op.name.as_str()) {
            return Err(invalid_request(format!("config {} is named more than once", op.name)));
        }
        if let Some(refusal) = unknown_key(&op.name) {
            return Err(refusal);
        }
        match op.operation {
            OP_DELETE => {}
            OP_SET | OP_APPEND | OP_SUBTRACT if op.value.is_none() => {
                return Err(invalid_request(format!("null value for config {}", op.name)))
            }
            OP_SET => {}
            OP_APPEND | OP_SUBTRACT if !LIST_KEYS.contains(&op.name.as_str()) => {
                return Err(invalid_request(format!("config {} is not a list: it takes SET and DELETE only", op.name)))
            }
            OP_APPEND | OP_SUBTRACT => {}
            other => return Err(invalid_request(format!("unknown config operation {other} for {}", op.name))),
        }
    }
    Ok(())
}

/// IncrementalAlterConfigs: the current overrides with `ops` applied (checked by
/// [`check_ops`]). APPEND and SUBTRACT start from the effective value: the override, or
/// the broker default.
fn apply_ops(current: &BTreeMap<String, String>, defaults: &LogConfig, ops: &[Op]) -> Result<BTreeMap<String, String>, Refusal> {
    let mut next = current.clone();
    for op in ops {
        let value = op.value.as_deref().unwrap_or_default();
        match op.operation {
            OP_SET => {
                next.insert(op.name.clone(), value.to_owned());
            }
            OP_DELETE => {
                next.remove(&op.name);
            }
            list_op => {
                let effective = match next.get(&op.name) {
                    Some(v) => v.clone(),
                    None => defaults.entries().into_iter().find(|(k, _)| *k == op.name).map(|(_, v)| v).unwrap_or_default(),
                };
                let mut items: Vec<&str> = effective.split(',').map(str::trim).filter(|i| !i.is_empty()).collect();
                for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
                    if list_op == OP_APPEND && !items.contains(&item) {
                        items.push(item);
                    } else if list_op == OP_SUBTRACT {
                        items.retain(|i| *i != item);
                    }
                }
                next.insert(op.name.clone(), items.join(","));
            }
        }
    }
    Ok(next)
}

fn split(outcome: Result<(), Refusal>) -> (i16, Option<StrBytes>) {
    match outcome {
        Ok(()) => (error_code::NONE, None),
        Err((code, message)) => (code, Some(StrBytes::from_string(message))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(name: &str, operation: i8, value: Option<&str>) -> Op {
        Op { name: name.into(), operation, value: value.map(Into::into) }
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn set_delete_append_and_subtract() {
        let current = map(&[("retention.ms", "1000"), ("segment.bytes", "4096")]);
        let ops = [
            op("retention.ms", OP_DELETE, None),
            op("max.message.bytes", OP_SET, Some("2000")),
            op("cleanup.policy", OP_APPEND, Some("compact")),
        ];
        check_ops(&ops).unwrap();
        let next = apply_ops(&current, &LogConfig::default(), &ops).unwrap();
        assert_eq!(next, map(&[("segment.bytes", "4096"), ("max.message.bytes", "2000"), ("cleanup.policy", "delete,compact")]));
        let next = apply_ops(&next, &LogConfig::default(), &[op("cleanup.policy", OP_SUBTRACT, Some("delete"))]).unwrap();
        assert_eq!(next["cleanup.policy"], "compact");
        // Appending what is there already changes nothing.
        let again = apply_ops(&next, &LogConfig::default(), &[op("cleanup.policy", OP_APPEND, Some("compact"))]).unwrap();
        assert_eq!(again, next);
    }

    #[test]
    fn bad_operations_are_refused_with_the_reason() {
        let code = |ops: &[Op]| check_ops(ops).unwrap_err().0;
        assert_eq!(code(&[op("retention.ms", OP_APPEND, Some("1"))]), error_code::INVALID_REQUEST);
        assert_eq!(code(&[op("retention.ms", OP_SET, None)]), error_code::INVALID_REQUEST);
        assert_eq!(code(&[op("retention.ms", 9, Some("1"))]), error_code::INVALID_REQUEST);
        assert_eq!(
            code(&[op("retention.ms", OP_SET, Some("1")), op("retention.ms", OP_DELETE, None)]),
            error_code::INVALID_REQUEST
        );
        let (c, message) = check_ops(&[op("no.such.key", OP_DELETE, None)]).unwrap_err();
        assert_eq!(c, error_code::INVALID_CONFIG);
        assert!(message.contains("no.such.key"), "{message}");
        assert_eq!(replacement(&[("a.b".into(), Some("1".into()))]).unwrap_err().0, error_code::INVALID_CONFIG);
        assert_eq!(replacement(&[("retention.ms".into(), None)]).unwrap(), BTreeMap::new());
    }

    #[test]
    fn duplicate_and_non_topic_resources_are_refused() {
        let dups = duplicate_resources([(2, "a"), (2, "b"), (2, "a"), (4, "a")].into_iter());
        assert_eq!(dups, HashSet::from([(2, "a".to_owned())]));
        assert_eq!(check_resource(2, "a", &dups).unwrap_err().0, error_code::INVALID_REQUEST);
        check_resource(2, "b", &dups).unwrap();
        check_resource(4, "0", &dups).unwrap();
        assert_eq!(check_resource(8, "0", &dups).unwrap_err().0, error_code::INVALID_REQUEST);
    }
}
