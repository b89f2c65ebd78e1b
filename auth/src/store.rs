//! Credentials and ACLs in the metadata store (ZooKeeper or the embedded store, through
//! `fjord_coord::MetadataStore`), in Kafka's JSON documents.
//!
//! # Layout (paths relative to the chroot; see `fjord_coord::paths`)
//! ```text
//! /config/users/<user>              {"version":1,"config":{"SCRAM-SHA-256":"salt=..,stored_key=..,server_key=..,iterations=4096"}}
//! /acls/<Type>/<PATTERN>/<name>     {"version":1,"acls":[{"principal":"User:a","permissionType":"Allow","operation":"Read","host":"*"}]}
//! /acl_changes/acl_change_<seq>     {"version":1,"resourceType":"Topic","patternType":"LITERAL","name":"orders"}
//! ```
//! `<Type>` and `<PATTERN>` are Kafka's names (`Topic`, `LITERAL`). User and resource
//! names are escaped into one path component ([`escape_name`]): `%`, `/`, control and
//! characters ZooKeeper refuses become `%XX`, and `.` / `..` become `%2E` / `%2E%2E`.
//!
//! Other keys in a user's `config` (quotas, as Kafka keeps them there too) are kept
//! untouched by credential updates.
//!
//! # Concurrency
//! Every write is a read-modify-write with the node's version as compare-and-set token,
//! retried when another writer got in first, so concurrent CreateAcls on several brokers
//! both land. After an ACL node changes, a change notification names its pattern;
//! [`crate::watcher::AclWatcher`] re-reads just that node. Notifications older than
//! [`NOTIFICATION_TTL`] are purged by writers, as Kafka does after 15 minutes.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use fjord_coord::{create_all, paths, CreateMode, MetadataStore};
use serde::{Deserialize, Serialize};

use crate::acl::{AccessControlEntry, AclBinding, AclBindingFilter, PatternType, Permission, ResourcePattern};
use crate::scram::{ScramCredential, ScramMechanism};
use crate::{Error, Operation, ResourceType, Result};

/// How long ACL change notifications are kept (Kafka: 15 minutes).
pub const NOTIFICATION_TTL: Duration = Duration::from_secs(15 * 60);
/// Prefix of the sequential change notification nodes.
pub(crate) const NOTIFICATION_PREFIX: &str = "acl_change_";
/// Compare-and-set attempts before a write gives up.
const MAX_ATTEMPTS: usize = 32;

/// Escapes a user or resource name into one store path component (see the module docs).
pub fn escape_name(name: &str) -> String {
    match name {
        "." => return "%2E".to_string(),
        ".." => return "%2E%2E".to_string(),
        _ => {}
    }
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        // ZooKeeper refuses control characters and the private-use and specials ranges.
        let refused = c.is_control() || ('\u{e000}'..='\u{f8ff}').contains(&c) || ('\u{fff0}'..='\u{ffff}').contains(&c);
        if c == '%' || c == '/' || refused {
            let mut buf = [0u8; 4];
            for byte in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{byte:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Reverses [`escape_name`]; `None` for a component no escape produces.
pub fn unescape_name(component: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(component.len());
    let mut rest = component.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        if b == b'%' {
            let hex = tail.get(..2)?;
            bytes.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(b);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
}

fn check_user_name(user: &str) -> Result<()> {
    if user.is_empty() {
        return Err(Error::InvalidUserName(user.to_string()));
    }
    Ok(())
}

fn decode<T: serde::de::DeserializeOwned>(path: &str, data: &[u8]) -> Result<T> {
    serde_json::from_slice(data).map_err(|source| Error::Codec { path: path.to_string(), source })
}

fn encode<T: Serialize>(path: &str, value: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(|source| Error::Codec { path: path.to_string(), source })
}

// ---------------------------------------------------------------------------------------
// Users
// ---------------------------------------------------------------------------------------

/// `/config/users/<user>`, as Kafka writes it.
#[derive(Debug, Default, Serialize, Deserialize)]
struct UserConfigDocument {
    version: i32,
    #[serde(default)]
    config: BTreeMap<String, String>,
}

/// A user's SCRAM credentials by mechanism; an unreadable credential is an error.
pub async fn user_credentials(store: &dyn MetadataStore, user: &str) -> Result<BTreeMap<ScramMechanism, ScramCredential>> {
    check_user_name(user)?;
    let path = paths::user_config(&escape_name(user));
    let Some((data, _)) = store.get(&path).await? else { return Ok(BTreeMap::new()) };
    let document: UserConfigDocument = decode(&path, &data)?;
    let mut credentials = BTreeMap::new();
    for mechanism in ScramMechanism::ALL {
        if let Some(text) = document.config.get(mechanism.name()) {
            credentials.insert(mechanism, ScramCredential::from_kafka_string(mechanism, text)?);
        }
    }
    Ok(credentials)
}

/// A user's credential for `mechanism` (what a SCRAM exchange looks up), `None` when
/// the user or that credential does not exist.
pub async fn credential(store: &dyn MetadataStore, user: &str, mechanism: ScramMechanism) -> Result<Option<ScramCredential>> {
    Ok(user_credentials(store, user).await?.remove(&mechanism))
}

/// Stores (creates or replaces) a user's credential for `mechanism`.
pub async fn set_credential(
    store: &dyn MetadataStore,
    user: &str,
    mechanism: ScramMechanism,
    credential: &ScramCredential,
) -> Result<()> {
    check_user_name(user)?;
    let value = credential.to_kafka_string();
    update_user(store, user, |config| config.insert(mechanism.name().to_string(), value.clone()).as_ref() != Some(&value))
        .await
        .map(|_| ())
}

/// Deletes a user's credential for `mechanism`; `false` when there was none.
pub async fn delete_credential(store: &dyn MetadataStore, user: &str, mechanism: ScramMechanism) -> Result<bool> {
    check_user_name(user)?;
    update_user(store, user, |config| config.remove(mechanism.name()).is_some()).await
}

/// Deletes every SCRAM credential of a user; `false` when it had none.
pub async fn delete_user(store: &dyn MetadataStore, user: &str) -> Result<bool> {
    check_user_name(user)?;
    update_user(store, user, |config| {
        let before = config.len();
        config.retain(|key, _| key.parse::<ScramMechanism>().is_err());
        config.len() != before
    })
    .await
}

/// Every user with at least one SCRAM credential, with the iteration count per
/// mechanism (DescribeUserScramCredentials, `fjord users list`). A user whose document
/// is unreadable is an error naming its path, not silently left out.
pub async fn list_users(store: &dyn MetadataStore) -> Result<BTreeMap<String, BTreeMap<ScramMechanism, u32>>> {
    let names = match store.children(paths::USER_CONFIGS).await {
        Ok(names) => names,
        Err(fjord_coord::Error::NoNode { .. }) => return Ok(BTreeMap::new()),
        Err(e) => return Err(e.into()),
    };
    let mut users = BTreeMap::new();
    for component in names {
        let Some(user) = unescape_name(&component) else {
            tracing::warn!(node = component, "skipping a user config node that is not an escaped name");
            continue;
        };
        let credentials = user_credentials(store, &user).await?;
        if !credentials.is_empty() {
            users.insert(user, credentials.into_iter().map(|(m, c)| (m, c.iterations)).collect());
        }
    }
    Ok(users)
}

/// Read-modify-write of a user's config map; `change` says whether it changed anything.
/// The node is deleted when the map ends up empty.
async fn update_user(
    store: &dyn MetadataStore,
    user: &str,
    change: impl Fn(&mut BTreeMap<String, String>) -> bool,
) -> Result<bool> {
    let path = paths::user_config(&escape_name(user));
    for _ in 0..MAX_ATTEMPTS {
        let (mut document, version) = match store.get(&path).await? {
            Some((data, stat)) => (decode::<UserConfigDocument>(&path, &data)?, Some(stat.version)),
            None => (UserConfigDocument { version: 1, config: BTreeMap::new() }, None),
        };
        if !change(&mut document.config) {
            return Ok(false);
        }
        document.version = 1;
        let written = match (version, document.config.is_empty()) {
            (None, true) => return Ok(true),
            (None, false) => create_all(store, &path, &encode(&path, &document)?, CreateMode::Persistent).await.map(|_| ()),
            (Some(v), true) => match store.delete(&path, Some(v)).await {
                // The user's per-client quotas live below its node
                // (`/config/users/<user>/clients/<client-id>`): it stays, empty, while they do.
                Err(fjord_coord::Error::NotEmpty { .. }) => {
                    store.set(&path, &encode(&path, &document)?, Some(v)).await.map(|_| ())
                }
                other => other,
            },
            (Some(v), false) => store.set(&path, &encode(&path, &document)?, Some(v)).await.map(|_| ()),
        };
        match written {
            Ok(()) => return Ok(true),
            Err(
                fjord_coord::Error::BadVersion { .. } | fjord_coord::Error::NoNode { .. } | fjord_coord::Error::NodeExists { .. },
            ) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Err(Error::Contended { path })
}

// ---------------------------------------------------------------------------------------
// ACLs
// ---------------------------------------------------------------------------------------

/// One entry of an ACL document, Kafka's field names.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct AclEntryDocument {
    principal: String,
    permission_type: String,
    operation: String,
    host: String,
}

/// `/acls/<Type>/<PATTERN>/<name>`.
#[derive(Debug, Serialize, Deserialize)]
struct AclDocument {
    version: i32,
    acls: Vec<AclEntryDocument>,
}

/// `/acl_changes/acl_change_<seq>`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AclChangeDocument {
    version: i32,
    resource_type: String,
    pattern_type: String,
    name: String,
}

impl AclChangeDocument {
    pub(crate) fn pattern(&self) -> Result<ResourcePattern> {
        ResourcePattern::new(self.resource_type.parse()?, self.name.clone(), self.pattern_type.parse()?)
    }
}

/// The store path of `pattern`'s ACLs.
pub fn acl_path(pattern: &ResourcePattern) -> String {
    paths::acl(pattern.resource_type.as_str(), pattern.pattern_type.as_str(), &escape_name(&pattern.name))
}

fn parse_entries(path: &str, data: &[u8]) -> Result<BTreeSet<AccessControlEntry>> {
    let document: AclDocument = decode(path, data)?;
    document
        .acls
        .into_iter()
        .map(|e| {
            AccessControlEntry::new(
                e.principal.parse()?,
                e.host,
                e.operation.parse::<Operation>()?,
                e.permission_type.parse::<Permission>()?,
            )
        })
        .collect()
}

fn entries_document(entries: &BTreeSet<AccessControlEntry>) -> AclDocument {
    AclDocument {
        version: 1,
        acls: entries
            .iter()
            .map(|e| AclEntryDocument {
                principal: e.principal.to_string(),
                permission_type: e.permission.as_str().to_string(),
                operation: e.operation.as_str().to_string(),
                host: e.host.clone(),
            })
            .collect(),
    }
}

/// The ACLs stored for one pattern (empty when none).
pub async fn read_pattern(store: &dyn MetadataStore, pattern: &ResourcePattern) -> Result<BTreeSet<AccessControlEntry>> {
    let path = acl_path(pattern);
    match store.get(&path).await? {
        Some((data, _)) => parse_entries(&path, &data),
        None => Ok(BTreeSet::new()),
    }
}

/// Every stored ACL, by pattern. A document that does not parse is logged and left
/// out (one hand-edited node must not take every ACL down); the others load.
pub async fn read_acls(store: &dyn MetadataStore) -> Result<BTreeMap<ResourcePattern, BTreeSet<AccessControlEntry>>> {
    let mut acls = BTreeMap::new();
    for resource_type in ResourceType::ALL {
        for pattern_type in PatternType::ALL {
            let parent = format!("{}/{}/{}", paths::ACLS, resource_type.as_str(), pattern_type.as_str());
            let names = match store.children(&parent).await {
                Ok(names) => names,
                Err(fjord_coord::Error::NoNode { .. }) => continue,
                Err(e) => return Err(e.into()),
            };
            for component in names {
                let pattern = unescape_name(&component)
                    .ok_or(Error::InvalidAcl { field: "stored resource name", value: component.clone() })
                    .and_then(|name| ResourcePattern::new(*resource_type, name, *pattern_type));
                let read = match pattern {
                    Ok(pattern) => read_pattern(store, &pattern).await.map(|entries| (pattern, entries)),
                    Err(e) => Err(e),
                };
                match read {
                    Ok((pattern, entries)) if !entries.is_empty() => {
                        acls.insert(pattern, entries);
                    }
                    Ok(_) => {}
                    Err(Error::Store(e)) => return Err(e.into()),
                    Err(e) => tracing::error!(node = format!("{parent}/{component}"), error = %e, "ignoring unreadable ACL node"),
                }
            }
        }
    }
    Ok(acls)
}

/// Checks what [`ResourcePattern::new`] and [`AccessControlEntry::new`] check, for
/// bindings built field by field.
fn validate(binding: &AclBinding) -> Result<()> {
    let p = &binding.pattern;
    ResourcePattern::new(p.resource_type, p.name.clone(), p.pattern_type)?;
    let e = &binding.entry;
    AccessControlEntry::new(e.principal.clone(), e.host.clone(), e.operation, e.permission)?;
    Ok(())
}

/// Adds ACLs (CreateAcls, `fjord acls add`). Existing ones stay; duplicates are no-ops.
/// All bindings are checked before anything is written.
pub async fn create_acls(store: &dyn MetadataStore, bindings: &[AclBinding]) -> Result<()> {
    let mut by_pattern: BTreeMap<&ResourcePattern, BTreeSet<&AccessControlEntry>> = BTreeMap::new();
    for binding in bindings {
        validate(binding)?;
        by_pattern.entry(&binding.pattern).or_default().insert(&binding.entry);
    }
    for (pattern, entries) in by_pattern {
        let changed = update_pattern(store, pattern, |stored| {
            let before = stored.len();
            stored.extend(entries.iter().map(|e| (*e).clone()));
            stored.len() != before
        })
        .await?;
        if changed {
            notify(store, pattern).await?;
        }
    }
    Ok(())
}

/// Deletes the ACLs each filter selects (DeleteAcls, `fjord acls remove`) and returns,
/// per filter, the bindings it deleted. A binding several filters select is reported
/// under the first, as Kafka does.
pub async fn delete_acls(store: &dyn MetadataStore, filters: &[AclBindingFilter]) -> Result<Vec<Vec<AclBinding>>> {
    let mut deleted = vec![Vec::new(); filters.len()];
    let current = read_acls(store).await?;
    for pattern in current.keys().filter(|p| filters.iter().any(|f| f.pattern.matches(p))) {
        let mut removed = Vec::new();
        let changed = update_pattern(store, pattern, |stored| {
            removed.clear();
            stored.retain(|entry| {
                let binding = AclBinding { pattern: pattern.clone(), entry: entry.clone() };
                match filters.iter().position(|f| f.matches(&binding)) {
                    Some(i) => {
                        removed.push((i, binding));
                        false
                    }
                    None => true,
                }
            });
            !removed.is_empty()
        })
        .await?;
        if changed {
            for (i, binding) in removed.drain(..) {
                deleted[i].push(binding);
            }
            notify(store, pattern).await?;
        }
    }
    Ok(deleted)
}

/// Read-modify-write of one pattern's ACL node; `change` says whether it changed
/// anything (it may run more than once). The node is deleted when it ends up empty.
async fn update_pattern(
    store: &dyn MetadataStore,
    pattern: &ResourcePattern,
    mut change: impl FnMut(&mut BTreeSet<AccessControlEntry>) -> bool,
) -> Result<bool> {
    let path = acl_path(pattern);
    for _ in 0..MAX_ATTEMPTS {
        let (mut entries, version) = match store.get(&path).await? {
            Some((data, stat)) => (parse_entries(&path, &data)?, Some(stat.version)),
            None => (BTreeSet::new(), None),
        };
        if !change(&mut entries) {
            return Ok(false);
        }
        let written = match (version, entries.is_empty()) {
            (None, true) => return Ok(false),
            (None, false) => {
                create_all(store, &path, &encode(&path, &entries_document(&entries))?, CreateMode::Persistent).await.map(|_| ())
            }
            (Some(v), true) => store.delete(&path, Some(v)).await,
            (Some(v), false) => store.set(&path, &encode(&path, &entries_document(&entries))?, Some(v)).await.map(|_| ()),
        };
        match written {
            Ok(()) => return Ok(true),
            Err(
                fjord_coord::Error::BadVersion { .. } | fjord_coord::Error::NoNode { .. } | fjord_coord::Error::NodeExists { .. },
            ) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Err(Error::Contended { path })
}

/// Writes a change notification for `pattern`, then purges expired ones.
async fn notify(store: &dyn MetadataStore, pattern: &ResourcePattern) -> Result<()> {
    let document = AclChangeDocument {
        version: 1,
        resource_type: pattern.resource_type.as_str().to_string(),
        pattern_type: pattern.pattern_type.as_str().to_string(),
        name: pattern.name.clone(),
    };
    let path = format!("{}/{NOTIFICATION_PREFIX}", paths::ACL_CHANGES);
    create_all(store, &path, &encode(&path, &document)?, CreateMode::PersistentSequential).await?;
    purge_notifications(store).await
}

/// Deletes notifications older than [`NOTIFICATION_TTL`]. They are named in creation
/// order, so the walk stops at the first young one.
async fn purge_notifications(store: &dyn MetadataStore) -> Result<()> {
    // `fjord_record::now_ms` inline: fjord-auth sits beside the record format, not on it.
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    let ttl_ms = NOTIFICATION_TTL.as_millis() as i64;
    for name in store.children(paths::ACL_CHANGES).await? {
        let path = fjord_coord::join(paths::ACL_CHANGES, &name);
        match store.exists(&path).await? {
            Some(stat) if now_ms - stat.ctime_ms > ttl_ms => match store.delete(&path, None).await {
                Ok(()) | Err(fjord_coord::Error::NoNode { .. }) => {}
                Err(e) => return Err(e.into()),
            },
            Some(_) => break,
            None => {}
        }
    }
    Ok(())
}

/// The sequence number of a notification node's name.
pub(crate) fn notification_sequence(name: &str) -> Option<u64> {
    name.strip_prefix(NOTIFICATION_PREFIX)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acl::{AccessControlEntryFilter, PatternTypeFilter, ResourcePatternFilter};
    use crate::Principal;

    fn binding(principal: &str, op: Operation, rt: ResourceType, name: &str, pt: PatternType) -> AclBinding {
        AclBinding {
            pattern: ResourcePattern::new(rt, name, pt).unwrap(),
            entry: AccessControlEntry::new(principal.parse().unwrap(), "*", op, Permission::Allow).unwrap(),
        }
    }

    #[test]
    fn names_escape_into_one_component_and_back() {
        for name in ["orders", "a/b", "100%", ".", "..", "...", "tab\there", "\u{e000}x", "ünïcode", "=2C"] {
            let escaped = escape_name(name);
            fjord_coord::validate_path(&format!("/x/{escaped}")).unwrap();
            assert!(!escaped.contains('/'));
            assert_eq!(unescape_name(&escaped).as_deref(), Some(name), "{escaped}");
        }
        assert_eq!(escape_name("a/b"), "a%2Fb");
        assert_eq!(unescape_name("%zz"), None);
        assert_eq!(unescape_name("%C3"), None);
    }

    async fn store() -> (tempfile::TempDir, fjord_coord::EmbeddedStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = fjord_coord::EmbeddedStore::open(dir.path()).unwrap();
        (dir, store)
    }

    #[tokio::test]
    async fn credentials_are_stored_as_kafka_does_without_the_password() {
        let (_dir, store) = store().await;
        let c256 = ScramCredential::generate(ScramMechanism::Sha256, "hunter2", 4096).unwrap();
        let c512 = ScramCredential::generate(ScramMechanism::Sha512, "hunter2", 8192).unwrap();
        set_credential(&store, "alice", ScramMechanism::Sha256, &c256).await.unwrap();
        set_credential(&store, "alice", ScramMechanism::Sha512, &c512).await.unwrap();
        set_credential(&store, "b/ob", ScramMechanism::Sha256, &c256).await.unwrap();
        let (raw, _) = store.get("/config/users/alice").await.unwrap().unwrap();
        let raw = String::from_utf8(raw).unwrap();
        assert!(!raw.contains("hunter2"));
        assert!(raw.starts_with(r#"{"version":1,"config":{"SCRAM-SHA-256":"salt="#), "{raw}");
        assert_eq!(credential(&store, "alice", ScramMechanism::Sha512).await.unwrap(), Some(c512));
        assert_eq!(credential(&store, "nobody", ScramMechanism::Sha512).await.unwrap(), None);
        let users = list_users(&store).await.unwrap();
        assert_eq!(users.keys().collect::<Vec<_>>(), ["alice", "b/ob"]);
        assert_eq!(users["alice"][&ScramMechanism::Sha512], 8192);

        // Other keys in the user's config survive credential changes.
        let mut doc: serde_json::Value = serde_json::from_str(&raw).unwrap();
        doc["config"]["producer_byte_rate"] = "1024".into();
        store.set("/config/users/alice", doc.to_string().as_bytes(), None).await.unwrap();
        assert!(delete_credential(&store, "alice", ScramMechanism::Sha256).await.unwrap());
        assert!(!delete_credential(&store, "alice", ScramMechanism::Sha256).await.unwrap());
        assert!(delete_user(&store, "alice").await.unwrap());
        let (raw, _) = store.get("/config/users/alice").await.unwrap().unwrap();
        assert_eq!(String::from_utf8(raw).unwrap(), r#"{"version":1,"config":{"producer_byte_rate":"1024"}}"#);
        assert!(!list_users(&store).await.unwrap().contains_key("alice"));
        // A user with nothing else left has no node at all.
        assert!(delete_user(&store, "b/ob").await.unwrap());
        assert_eq!(store.get("/config/users/b%2Fob").await.unwrap(), None);
        // One with per-client quotas below its node keeps the node, empty, for them.
        set_credential(&store, "carol", ScramMechanism::Sha256, &c256).await.unwrap();
        let quota = br#"{"version":1,"config":{"producer_byte_rate":"1024"}}"#;
        fjord_coord::create_all(&store, "/config/users/carol/clients/app", quota, CreateMode::Persistent).await.unwrap();
        assert!(delete_user(&store, "carol").await.unwrap());
        let (raw, _) = store.get("/config/users/carol").await.unwrap().unwrap();
        assert_eq!(String::from_utf8(raw).unwrap(), r#"{"version":1,"config":{}}"#);
        assert_eq!(store.get("/config/users/carol/clients/app").await.unwrap().unwrap().0, quota);
        assert!(!list_users(&store).await.unwrap().contains_key("carol"));
        assert!(matches!(set_credential(&store, "", ScramMechanism::Sha256, &c256).await, Err(Error::InvalidUserName(_))));
    }

    #[tokio::test]
    async fn acls_round_trip_and_filters_delete_what_they_select() {
        let (_dir, store) = store().await;
        let read = binding("User:a", Operation::Read, ResourceType::Topic, "orders", PatternType::Literal);
        let write = binding("User:b", Operation::Write, ResourceType::Topic, "orders", PatternType::Literal);
        let group = binding("User:a", Operation::Read, ResourceType::Group, "team/1", PatternType::Prefixed);
        create_acls(&store, &[read.clone(), write.clone(), group.clone(), read.clone()]).await.unwrap();
        let (raw, _) = store.get("/acls/Topic/LITERAL/orders").await.unwrap().unwrap();
        assert_eq!(
            String::from_utf8(raw).unwrap(),
            r#"{"version":1,"acls":[{"principal":"User:a","permissionType":"Allow","operation":"Read","host":"*"},{"principal":"User:b","permissionType":"Allow","operation":"Write","host":"*"}]}"#
        );
        let all = read_acls(&store).await.unwrap();
        assert_eq!(all.values().map(BTreeSet::len).sum::<usize>(), 3);
        assert!(all.contains_key(&group.pattern));
        assert_eq!(store.children(paths::ACL_CHANGES).await.unwrap().len(), 2, "one notification per changed pattern");

        // An invalid binding writes nothing.
        let mut bad = read.clone();
        bad.pattern.resource_type = ResourceType::Cluster;
        assert!(create_acls(&store, &[group.clone(), bad]).await.is_err());

        let by_principal = AclBindingFilter {
            pattern: ResourcePatternFilter { resource_type: None, name: None, pattern_type: PatternTypeFilter::Any },
            entry: AccessControlEntryFilter { principal: Some(Principal::user("a")), ..Default::default() },
        };
        let mut everything = AclBindingFilter::any();
        everything.pattern.resource_type = Some(ResourceType::Topic);
        let deleted = delete_acls(&store, &[by_principal, everything]).await.unwrap();
        assert_eq!(deleted[0].len(), 2);
        assert_eq!(deleted[1], [write]);
        assert!(read_acls(&store).await.unwrap().is_empty());
        assert_eq!(store.get("/acls/Topic/LITERAL/orders").await.unwrap(), None);
        assert_eq!(delete_acls(&store, &[AclBindingFilter::any()]).await.unwrap(), [Vec::<AclBinding>::new()]);
    }

    #[tokio::test]
    async fn a_damaged_acl_node_does_not_hide_the_others() {
        let (_dir, store) = store().await;
        let good = binding("User:a", Operation::Read, ResourceType::Topic, "good", PatternType::Literal);
        create_acls(&store, std::slice::from_ref(&good)).await.unwrap();
        create_all(&store, "/acls/Topic/LITERAL/bad", b"{not json", CreateMode::Persistent).await.unwrap();
        let all = read_acls(&store).await.unwrap();
        assert_eq!(all.keys().collect::<Vec<_>>(), [&good.pattern]);
        // Writing to the damaged node is refused rather than overwriting it.
        let onto_bad = binding("User:a", Operation::Read, ResourceType::Topic, "bad", PatternType::Literal);
        assert!(matches!(create_acls(&store, &[onto_bad]).await, Err(Error::Codec { .. })));
    }
}
