//! AlterConfigs and IncrementalAlterConfigs on a BROKER resource, and the dynamic broker
//! configs DescribeConfigs shows.
//!
//! Kafka keeps dynamic broker configs in `/config/brokers/<id>` (one broker) and
//! `/config/brokers/<default>` (every broker), and so do we, with Kafka's checks: the
//! resource names this broker or is empty (the cluster default), and a key that is not
//! dynamically updatable is INVALID_REQUEST naming it. Fjord's own broker keys are all
//! static (they are read once at start: change the config file and restart). The keys
//! taken are the replication throttle rates ([`DYNAMIC`], which every broker applies
//! live from a watch on its node and the default's: [`crate::dynamic_config`]) and the
//! dynamic Kafka keys listed in [`ACCEPTED_AND_IGNORED`], for what Fjord does not have
//! (Kerberos, Java thread pools). Those are validated by type, stored, and shown by
//! DescribeConfigs as dynamic configs, so tools that set them (and read them back)
//! work; they change nothing here. A key neither Fjord nor those lists know is
//! INVALID_CONFIG: Kafka would store it as a plugin's custom config, but Fjord has no
//! plugins, and a typo should not be stored silently.

use std::collections::BTreeMap;

use fjord_coord::registry::to_json;
use fjord_coord::{create_all, paths, CreateMode, MetadataStore};

use super::alter_configs::Refusal;
use crate::codec::error_code;
use crate::replication::throttle::{FOLLOWER_RATE, LEADER_RATE};
use crate::topics::TopicConfigDocument;
use crate::BrokerConfig;

/// The node of the cluster-wide default (`/config/brokers/<default>`, Kafka's name).
pub(crate) const DEFAULT_RESOURCE: &str = "<default>";
/// Compare-and-set attempts before giving up on a node that keeps changing.
const CAS_ATTEMPTS: usize = 10;

/// The type of an accepted key's value, checked as Kafka checks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ValueType {
    /// An int of at least this.
    Int(i32),
    /// A long of at least this.
    Long(i64),
    Double,
    Str,
    List,
}

/// Kafka's dynamically updatable broker keys that have no meaning in Fjord: taken,
/// type-checked, stored and described, and ignored, with the reason.
pub(super) const ACCEPTED_AND_IGNORED: &[(&str, ValueType, &str)] = &[
    ("background.threads", ValueType::Int(1), "Fjord's background work runs on the async runtime, not a thread pool"),
    ("num.io.threads", ValueType::Int(1), "requests are served on the async runtime, not a pool of I/O threads"),
    ("num.network.threads", ValueType::Int(1), "connections are served on the async runtime, not network threads"),
    ("num.replica.fetchers", ValueType::Int(1), "each follower runs one fetch task per leader broker"),
    ("num.recovery.threads.per.data.dir", ValueType::Int(1), "log recovery is not run on a thread pool"),
    ("sasl.kerberos.service.name", ValueType::Str, "Fjord has no GSSAPI (Kerberos) mechanism"),
    ("sasl.kerberos.kinit.cmd", ValueType::Str, "Fjord has no GSSAPI (Kerberos) mechanism"),
    ("sasl.kerberos.ticket.renew.window.factor", ValueType::Double, "Fjord has no GSSAPI (Kerberos) mechanism"),
    ("sasl.kerberos.ticket.renew.jitter", ValueType::Double, "Fjord has no GSSAPI (Kerberos) mechanism"),
    ("sasl.kerberos.min.time.before.relogin", ValueType::Long(i64::MIN), "Fjord has no GSSAPI (Kerberos) mechanism"),
    ("sasl.kerberos.principal.to.local.rules", ValueType::List, "Fjord has no GSSAPI (Kerberos) mechanism"),
];

/// Kafka's dynamically updatable broker keys that Fjord applies live: the replication
/// throttle rates, bytes per second (Long.MAX_VALUE, the default, is no throttle).
pub(super) const DYNAMIC: &[(&str, ValueType)] = &[(LEADER_RATE, ValueType::Long(0)), (FOLLOWER_RATE, ValueType::Long(0))];

/// The keys of [`DYNAMIC`] at their defaults (Long.MAX_VALUE: no throttle), for
/// DescribeConfigs of a broker that has not set them.
pub(super) fn dynamic_defaults() -> impl Iterator<Item = super::describe_configs::Described> {
    DYNAMIC.iter().map(|(key, _)| super::describe_configs::Described {
        name: std::borrow::Cow::Borrowed(*key),
        config_type: super::admin::TYPE_LONG,
        synonyms: vec![(std::borrow::Cow::Borrowed(*key), i64::MAX.to_string(), super::describe_configs::SOURCE_DEFAULT)],
    })
}

/// The type of an accepted key, `None` for any other key.
fn accepted(name: &str) -> Option<ValueType> {
    DYNAMIC
        .iter()
        .find(|(key, _)| *key == name)
        .map(|(_, kind)| *kind)
        .or_else(|| ACCEPTED_AND_IGNORED.iter().find(|(key, ..)| *key == name).map(|(_, kind, _)| *kind))
}

/// The node name of a broker resource: this broker's id or the cluster default.
pub(super) fn node_name(resource: &str, broker_id: i32) -> Result<String, Refusal> {
    if resource.is_empty() {
        return Ok(DEFAULT_RESOURCE.to_owned());
    }
    match resource.parse::<i32>() {
        Ok(id) if id == broker_id => Ok(id.to_string()),
        Ok(_) => Err((
            error_code::INVALID_REQUEST,
            format!("unexpected broker id {resource}: this is broker {broker_id} (send it to that broker, or use \"\" for the cluster default)"),
        )),
        Err(_) => Err((error_code::INVALID_REQUEST, format!("broker resource {resource:?} is not a broker id"))),
    }
}

/// Refuses a key that cannot be set dynamically, or a bad value for one that can.
/// `value` is `None` for a deletion.
pub(super) fn check(name: &str, value: Option<&str>) -> Result<(), Refusal> {
    let Some(kind) = accepted(name) else {
        let mut probe = BrokerConfig::default();
        return Err(match probe.set(name, "") {
            Err(crate::Error::UnknownConfig { .. }) => (error_code::INVALID_CONFIG, format!("unknown broker config {name}")),
            _ => (
                error_code::INVALID_REQUEST,
                format!("static broker configs cannot be altered dynamically: {name} (change the config file and restart)"),
            ),
        });
    };
    let Some(value) = value else { return Ok(()) };
    let bad = |reason: &str| Err((error_code::INVALID_CONFIG, format!("invalid value {value:?} for {name}: {reason}")));
    match kind {
        ValueType::Int(min) => match value.trim().parse::<i32>() {
            Ok(n) if n >= min => Ok(()),
            Ok(_) => bad(&format!("must be at least {min}")),
            Err(_) => bad("not an int"),
        },
        ValueType::Long(min) => match value.trim().parse::<i64>() {
            Ok(n) if n >= min => Ok(()),
            Ok(_) => bad(&format!("must be at least {min}")),
            Err(_) => bad("not a long"),
        },
        ValueType::Double => match value.trim().parse::<f64>() {
            Ok(v) if v.is_finite() => Ok(()),
            _ => bad("not a number"),
        },
        ValueType::Str | ValueType::List => Ok(()),
    }
}

/// The DescribeConfigs type of a stored dynamic key.
pub(super) fn config_type(name: &str) -> i8 {
    use super::admin::{TYPE_DOUBLE, TYPE_INT, TYPE_LIST, TYPE_LONG, TYPE_STRING};
    match accepted(name) {
        Some(ValueType::Int(_)) => TYPE_INT,
        Some(ValueType::Long(_)) => TYPE_LONG,
        Some(ValueType::Double) => TYPE_DOUBLE,
        Some(ValueType::List) => TYPE_LIST,
        Some(ValueType::Str) | None => TYPE_STRING,
    }
}

/// Whether APPEND and SUBTRACT apply to `name`.
pub(super) fn is_list(name: &str) -> bool {
    accepted(name) == Some(ValueType::List)
}

/// The dynamic configs stored for `node` and the version of its node (`None`: no node).
pub(crate) async fn read(store: &dyn MetadataStore, node: &str) -> crate::Result<(BTreeMap<String, String>, Option<i32>)> {
    let path = paths::broker_config(node);
    match store.get(&path).await? {
        None => Ok((BTreeMap::new(), None)),
        Some((data, stat)) => {
            let doc: TopicConfigDocument =
                serde_json::from_slice(&data).map_err(|source| crate::Error::Metadata { path, source })?;
            Ok((doc.config, Some(stat.version)))
        }
    }
}

/// Computes the new configs of `node` with `edit` from the stored ones, checks each key
/// and value, and (unless `validate_only`) stores them with a compare-and-set.
pub(super) async fn alter(
    store: &dyn MetadataStore,
    node: &str,
    validate_only: bool,
    edit: impl Fn(&BTreeMap<String, String>) -> Result<BTreeMap<String, String>, Refusal>,
) -> Result<(), Refusal> {
    let internal = |e: crate::Error| {
        tracing::error!(node, error = %e, "altering dynamic broker configs failed");
        (error_code::UNKNOWN_SERVER_ERROR, format!("metadata store: {e}"))
    };
    let path = paths::broker_config(node);
    for _ in 0..CAS_ATTEMPTS {
        let (current, version) = read(store, node).await.map_err(internal)?;
        let next = edit(&current)?;
        for (name, value) in &next {
            check(name, Some(value))?;
        }
        if validate_only {
            return Ok(());
        }
        let doc = to_json(&TopicConfigDocument { version: 1, config: next.clone() });
        let outcome = match version {
            Some(version) => store.set(&path, &doc, Some(version)).await.map(drop),
            None => create_all(store, &path, &doc, CreateMode::Persistent).await.map(drop),
        };
        match outcome {
            Ok(()) => {
                tracing::info!(node, configs = ?next, "stored dynamic broker configs");
                return Ok(());
            }
            Err(
                fjord_coord::Error::BadVersion { .. } | fjord_coord::Error::NodeExists { .. } | fjord_coord::Error::NoNode { .. },
            ) => continue,
            Err(e) => return Err(internal(e.into())),
        }
    }
    Err((error_code::UNKNOWN_SERVER_ERROR, format!("the dynamic configs of broker {node} kept changing; retry")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_listed_kafka_keys_are_dynamic() {
        assert_eq!(check("sasl.kerberos.min.time.before.relogin", Some("58000")), Ok(()));
        assert_eq!(check("background.threads", Some("9")), Ok(()));
        assert_eq!(check("background.threads", None), Ok(()));
        assert_eq!(check("background.threads", Some("0")).unwrap_err().0, error_code::INVALID_CONFIG);
        assert_eq!(check("sasl.kerberos.min.time.before.relogin", Some("soon")).unwrap_err().0, error_code::INVALID_CONFIG);
        assert_eq!(check("sasl.kerberos.ticket.renew.jitter", Some("NaN")).unwrap_err().0, error_code::INVALID_CONFIG);
        // Fjord's own keys are static: Kafka's answer for a key it cannot update.
        let (code, message) = check("log.retention.ms", Some("1")).unwrap_err();
        assert_eq!(code, error_code::INVALID_REQUEST);
        assert!(message.contains("log.retention.ms"), "{message}");
        assert_eq!(check("num.partitions", None).unwrap_err().0, error_code::INVALID_REQUEST);
        assert_eq!(check("no.such.key", Some("1")).unwrap_err().0, error_code::INVALID_CONFIG);
        assert!(is_list("sasl.kerberos.principal.to.local.rules") && !is_list("background.threads"));
        // The replication throttle rates: non-negative longs.
        assert_eq!(check(LEADER_RATE, Some("2000000")), Ok(()));
        assert_eq!(check(FOLLOWER_RATE, Some(&i64::MAX.to_string())), Ok(()));
        assert_eq!(check(FOLLOWER_RATE, None), Ok(()));
        assert_eq!(check(LEADER_RATE, Some("-1")).unwrap_err().0, error_code::INVALID_CONFIG);
        assert_eq!(check(LEADER_RATE, Some("fast")).unwrap_err().0, error_code::INVALID_CONFIG);
        assert_eq!(config_type(LEADER_RATE), super::super::admin::TYPE_LONG);
    }

    #[test]
    fn no_accepted_key_is_one_of_fjords_own() {
        for key in ACCEPTED_AND_IGNORED.iter().map(|(key, ..)| key).chain(DYNAMIC.iter().map(|(key, _)| key)) {
            let mut probe = BrokerConfig::default();
            assert!(
                matches!(probe.set(key, ""), Err(crate::Error::UnknownConfig { .. })),
                "{key} is a Fjord broker key: it would be ignored although Fjord reads it"
            );
        }
    }

    #[test]
    fn the_resource_is_this_broker_or_the_default() {
        assert_eq!(node_name("", 3), Ok(DEFAULT_RESOURCE.to_owned()));
        assert_eq!(node_name("3", 3), Ok("3".to_owned()));
        assert_eq!(node_name("4", 3).unwrap_err().0, error_code::INVALID_REQUEST);
        assert_eq!(node_name("x", 3).unwrap_err().0, error_code::INVALID_REQUEST);
    }
}
