//! Client quotas in the metadata store (ZooKeeper or the embedded store), in Kafka's
//! layout and documents, and the watch that keeps every broker's [`ClientQuotas`] current.
//!
//! # Layout (relative to the chroot; see `fjord_coord::paths`)
//! ```text
//! /config/users/<user>                       {"version":1,"config":{"producer_byte_rate":"5242880", "SCRAM-SHA-256":"..."}}
//! /config/users/<user>/clients/<client-id>   {"version":1,"config":{"consumer_byte_rate":"1048576"}}
//! /config/clients/<client-id>                {"version":1,"config":{"request_percentage":"50.0"}}
//! /config/changes/config_change_<seq>        {"version":2,"entity_path":"users/alice/clients/app"}
//! ```
//! `<default>` stands for the default user or client id. Names are escaped into one path
//! component as fjord-auth escapes user names (`escape_name`), and a name that is
//! literally `<default>` as `%3Cdefault%3E`, so it cannot be taken for the default.
//! A user's node is shared with its SCRAM credentials: quota writes keep every other key.
//!
//! # Live changes
//! Every write adds a change notification; each broker watches `/config/changes` and
//! reads all quotas again when it fires (the quota tree is small), and every
//! [`FULL_RELOAD_INTERVAL`] as a safety net. Notifications older than
//! [`NOTIFICATION_TTL`] are deleted by writers, as Kafka does after 15 minutes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use fjord_auth::store::{escape_name, unescape_name};
use fjord_coord::registry::to_json;
use fjord_coord::{create_all, paths, CreateMode, MetadataStore, Store};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{ClientQuotas, EntityName, QuotaConfigs, QuotaEntity, QuotaKey};
use crate::topics::TopicConfigDocument;

/// The node name of the default user or client id (Kafka's).
pub(crate) const DEFAULT_NAME: &str = "<default>";
/// How a name that is literally `<default>` is stored.
const ESCAPED_DEFAULT: &str = "%3Cdefault%3E";
/// How long change notifications are kept (Kafka: 15 minutes).
const NOTIFICATION_TTL: Duration = Duration::from_secs(15 * 60);
const NOTIFICATION_PREFIX: &str = "config_change_";
/// How often everything is read again even without notifications.
const FULL_RELOAD_INTERVAL: Duration = Duration::from_secs(60);
/// Pause before retrying after a store error.
const RETRY: Duration = Duration::from_secs(1);
/// Compare-and-set attempts before a write gives up.
const CAS_ATTEMPTS: usize = 32;

/// `/config/changes/config_change_<seq>`.
#[derive(Debug, Serialize, Deserialize)]
struct ChangeNotification {
    version: i32,
    entity_path: String,
}

/// One path component for a user or client-id name.
fn component(name: &EntityName) -> String {
    match name {
        EntityName::Default => DEFAULT_NAME.to_owned(),
        EntityName::Named(name) if name == DEFAULT_NAME => ESCAPED_DEFAULT.to_owned(),
        EntityName::Named(name) => escape_name(name),
    }
}

/// Reverses [`component`]; `None` for a component no escape produces.
fn entity_name(component: &str) -> Option<EntityName> {
    if component == DEFAULT_NAME {
        return Some(EntityName::Default);
    }
    unescape_name(component).map(EntityName::Named)
}

/// The node of `entity`, and its path in a change notification (relative to `/config`).
fn entity_path(entity: &QuotaEntity) -> (String, String) {
    let path = match (&entity.user, &entity.client_id) {
        (Some(user), Some(client_id)) => paths::user_client_config(&component(user), &component(client_id)),
        (Some(user), None) => paths::user_config(&component(user)),
        (None, Some(client_id)) => paths::client_config(&component(client_id)),
        (None, None) => unreachable!("invariant: a quota entity names a user or a client id"),
    };
    let relative = path.trim_start_matches("/config/").to_owned();
    (path, relative)
}

/// The quota keys of a node's config; other keys (SCRAM credentials) and values that do
/// not parse are left out.
fn quota_values(path: &str, config: &BTreeMap<String, String>) -> BTreeMap<QuotaKey, f64> {
    let mut values = BTreeMap::new();
    for (name, value) in config {
        let Some(key) = QuotaKey::parse(name) else { continue };
        match value.trim().parse::<f64>() {
            Ok(v) if v.is_finite() => {
                values.insert(key, v);
            }
            _ => tracing::warn!(path, key = name, value, "ignoring a quota whose value is not a number"),
        }
    }
    values
}

/// How Kafka writes a quota value: a long for the byte rates, a double for the percentage.
fn format_value(key: QuotaKey, value: f64) -> String {
    if key.is_long() {
        format!("{}", value.round() as i64)
    } else {
        format!("{value:?}")
    }
}

async fn read_config(store: &dyn MetadataStore, path: &str) -> crate::Result<Option<(BTreeMap<String, String>, i32)>> {
    match store.get(path).await? {
        None => Ok(None),
        Some((data, stat)) if data.is_empty() => Ok(Some((BTreeMap::new(), stat.version))),
        Some((data, stat)) => {
            let doc: TopicConfigDocument =
                serde_json::from_slice(&data).map_err(|source| crate::Error::Metadata { path: path.to_owned(), source })?;
            Ok(Some((doc.config, stat.version)))
        }
    }
}

async fn children(store: &dyn MetadataStore, path: &str) -> crate::Result<Vec<String>> {
    match store.children(path).await {
        Ok(names) => Ok(names),
        Err(fjord_coord::Error::NoNode { .. }) => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

/// Every stored quota.
pub(crate) async fn read_all(store: &dyn MetadataStore) -> crate::Result<QuotaConfigs> {
    let mut configs = QuotaConfigs::default();
    let mut add = |entity: QuotaEntity, path: &str, config: &BTreeMap<String, String>| {
        let values = quota_values(path, config);
        if !values.is_empty() {
            configs.entities.insert(entity, values);
        }
    };
    for user_component in children(store, paths::USER_CONFIGS).await? {
        let Some(user) = entity_name(&user_component) else { continue };
        let path = paths::user_config(&user_component);
        if let Some((config, _)) = read_config(store, &path).await? {
            add(QuotaEntity { user: Some(user.clone()), client_id: None }, &path, &config);
        }
        for client_component in children(store, &format!("{path}/clients")).await? {
            let Some(client_id) = entity_name(&client_component) else { continue };
            let path = paths::user_client_config(&user_component, &client_component);
            if let Some((config, _)) = read_config(store, &path).await? {
                add(QuotaEntity { user: Some(user.clone()), client_id: Some(client_id) }, &path, &config);
            }
        }
    }
    for client_component in children(store, paths::CLIENT_CONFIGS).await? {
        let Some(client_id) = entity_name(&client_component) else { continue };
        let path = paths::client_config(&client_component);
        if let Some((config, _)) = read_config(store, &path).await? {
            add(QuotaEntity { user: None, client_id: Some(client_id) }, &path, &config);
        }
    }
    Ok(configs)
}

/// Sets (`Some`) and removes (`None`) quota keys of `entity`, keeping every other key of
/// its node, then tells every broker. A node left without keys stays (as Kafka leaves
/// it): a user's node may have per-client nodes below it.
pub(crate) async fn alter(
    store: &dyn MetadataStore,
    entity: &QuotaEntity,
    changes: &BTreeMap<QuotaKey, Option<f64>>,
) -> crate::Result<()> {
    let (path, relative) = entity_path(entity);
    for _ in 0..CAS_ATTEMPTS {
        let current = read_config(store, &path).await?;
        let mut config = current.as_ref().map(|(config, _)| config.clone()).unwrap_or_default();
        for (key, value) in changes {
            match value {
                Some(value) => config.insert(key.name().to_owned(), format_value(*key, *value)),
                None => config.remove(key.name()),
            };
        }
        if current.as_ref().is_some_and(|(before, _)| *before == config) {
            return Ok(());
        }
        let doc = to_json(&TopicConfigDocument { version: 1, config });
        let written = match current {
            Some((_, version)) => store.set(&path, &doc, Some(version)).await.map(drop),
            None => create_all(store, &path, &doc, CreateMode::Persistent).await.map(drop),
        };
        match written {
            Ok(()) => return notify(store, &relative).await,
            Err(
                fjord_coord::Error::BadVersion { .. } | fjord_coord::Error::NodeExists { .. } | fjord_coord::Error::NoNode { .. },
            ) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(crate::Error::Contended { path })
}

/// Adds a change notification for `entity_path`, and deletes the expired ones.
async fn notify(store: &dyn MetadataStore, entity_path: &str) -> crate::Result<()> {
    let doc = to_json(&ChangeNotification { version: 2, entity_path: entity_path.to_owned() });
    let path = format!("{}/{NOTIFICATION_PREFIX}", paths::CONFIG_CHANGES);
    create_all(store, &path, &doc, CreateMode::PersistentSequential).await?;
    let now_ms = fjord_record::now_ms();
    for name in children(store, paths::CONFIG_CHANGES).await? {
        let path = fjord_coord::join(paths::CONFIG_CHANGES, &name);
        match store.exists(&path).await? {
            // Named in creation order: the walk stops at the first young one.
            Some(stat) if now_ms - stat.ctime_ms > NOTIFICATION_TTL.as_millis() as i64 => match store.delete(&path, None).await {
                Ok(()) | Err(fjord_coord::Error::NoNode { .. }) => {}
                Err(e) => return Err(e.into()),
            },
            Some(_) => break,
            None => {}
        }
    }
    Ok(())
}

/// Reads every quota into `quotas` once, then keeps them current from a task on
/// `tracker` until `shutdown`.
pub(crate) async fn start_watcher(quotas: Arc<ClientQuotas>, store: Store, tracker: &TaskTracker, shutdown: CancellationToken) {
    match read_all(&*store).await {
        Ok(configs) => quotas.set_configs(configs),
        Err(e) => tracing::warn!(error = %e, "cannot read the client quotas; retrying in the background"),
    }
    tracker.spawn(async move {
        loop {
            let watch = match store.watch_children(paths::CONFIG_CHANGES).await {
                Ok((_, watch)) => Some(watch),
                Err(fjord_coord::Error::NoNode { .. }) => {
                    match create_all(&*store, paths::CONFIG_CHANGES, &[], CreateMode::Persistent).await {
                        Ok(_) | Err(fjord_coord::Error::NodeExists { .. }) => continue,
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot create {}", paths::CONFIG_CHANGES);
                            None
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot watch the config changes; retrying");
                    None
                }
            };
            let wait = match read_all(&*store).await {
                Ok(configs) => {
                    quotas.set_configs(configs);
                    if watch.is_some() {
                        FULL_RELOAD_INTERVAL
                    } else {
                        RETRY
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the client quotas; retrying");
                    RETRY
                }
            };
            let fired = async {
                match watch {
                    Some(watch) => drop(watch.await),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = fired => {}
                () = tokio::time::sleep(wait) => {}
                () = shutdown.cancelled() => return,
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(name: &str) -> Option<EntityName> {
        Some(EntityName::Named(name.to_owned()))
    }

    #[test]
    fn entities_map_to_kafkas_nodes() {
        let path = |user, client_id| entity_path(&QuotaEntity { user, client_id });
        assert_eq!(path(named("alice"), None), ("/config/users/alice".into(), "users/alice".into()));
        assert_eq!(
            path(named("alice"), Some(EntityName::Default)),
            ("/config/users/alice/clients/<default>".into(), "users/alice/clients/<default>".into())
        );
        assert_eq!(path(None, named("a/b")).0, "/config/clients/a%2Fb");
        // A client id that is literally "<default>" is not the default.
        assert_eq!(path(None, named("<default>")).0, "/config/clients/%3Cdefault%3E");
        assert_eq!(entity_name("%3Cdefault%3E"), named("<default>"));
        assert_eq!(entity_name("<default>"), Some(EntityName::Default));
        assert_eq!(entity_name("a%2Fb"), named("a/b"));
    }

    #[test]
    fn values_are_written_as_kafka_writes_them() {
        assert_eq!(format_value(QuotaKey::ProducerByteRate, 5242880.0), "5242880");
        assert_eq!(format_value(QuotaKey::RequestPercentage, 50.0), "50.0");
        assert_eq!(format_value(QuotaKey::RequestPercentage, 12.5), "12.5");
    }

    #[tokio::test]
    async fn quotas_round_trip_and_keep_credentials() {
        let dir = tempfile::tempdir().unwrap();
        let store = fjord_coord::EmbeddedStore::open(dir.path()).unwrap();
        // A user with a SCRAM credential already.
        let credential = br#"{"version":1,"config":{"SCRAM-SHA-256":"salt=abc"}}"#;
        create_all(&store, "/config/users/alice", credential, CreateMode::Persistent).await.unwrap();
        let alice = QuotaEntity { user: named("alice"), client_id: None };
        let alice_app = QuotaEntity { user: named("alice"), client_id: named("app") };
        let default_client = QuotaEntity { user: None, client_id: Some(EntityName::Default) };
        let set = |key, value| BTreeMap::from([(key, Some(value))]);
        alter(&store, &alice, &set(QuotaKey::ProducerByteRate, 1000.0)).await.unwrap();
        alter(&store, &alice_app, &set(QuotaKey::ConsumerByteRate, 2000.0)).await.unwrap();
        alter(&store, &default_client, &set(QuotaKey::RequestPercentage, 25.5)).await.unwrap();
        let configs = read_all(&store).await.unwrap();
        assert_eq!(configs.entities.len(), 3);
        assert_eq!(configs.entities[&alice], BTreeMap::from([(QuotaKey::ProducerByteRate, 1000.0)]));
        assert_eq!(configs.entities[&alice_app], BTreeMap::from([(QuotaKey::ConsumerByteRate, 2000.0)]));
        assert_eq!(configs.entities[&default_client], BTreeMap::from([(QuotaKey::RequestPercentage, 25.5)]));
        // The credential is still there, beside the quota.
        let (data, _) = store.get("/config/users/alice").await.unwrap().unwrap();
        let doc: TopicConfigDocument = serde_json::from_slice(&data).unwrap();
        assert_eq!(doc.config.get("SCRAM-SHA-256").map(String::as_str), Some("salt=abc"));
        assert_eq!(doc.config.get("producer_byte_rate").map(String::as_str), Some("1000"));
        // Removing the quota keeps the credential; the entity has no quota any more.
        alter(&store, &alice, &BTreeMap::from([(QuotaKey::ProducerByteRate, None)])).await.unwrap();
        let configs = read_all(&store).await.unwrap();
        assert!(!configs.entities.contains_key(&alice));
        let (data, _) = store.get("/config/users/alice").await.unwrap().unwrap();
        assert!(String::from_utf8_lossy(&data).contains("SCRAM-SHA-256"));
        // Each write left a notification.
        assert_eq!(store.children(paths::CONFIG_CHANGES).await.unwrap().len(), 4);
    }
}
