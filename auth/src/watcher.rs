//! Keeps a broker's [`Authorizer`] current with the ACLs in the metadata store.
//!
//! The watcher reads every ACL once, then watches `/acl_changes`: each new change
//! notification names one pattern, whose node it re-reads; it then swaps in a new
//! [`Authorizer`] snapshot. Requests read the snapshot with one lock-free-in-practice
//! `RwLock` read and an `Arc` clone, and are never blocked by the store.
//!
//! Everything is read again in full when the watch reports a lost session, when a
//! notification vanished before it was read (purged after [`NOTIFICATION_TTL`]: this
//! broker fell that far behind), after a store error, and every [`FULL_RELOAD_INTERVAL`]
//! as a safety net, so the snapshot cannot drift from the store for longer than that.
//!
//! [`NOTIFICATION_TTL`]: crate::store::NOTIFICATION_TTL

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use fjord_coord::{create_all, paths, CreateMode, MetadataStore, Store, Watch, WatchEvent};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::acl::{AccessControlEntry, ResourcePattern};
use crate::store::{self, notification_sequence, AclChangeDocument};
use crate::{Authorizer, AuthorizerConfig, Error, Operation, Principal, Resource, Result};

/// How often everything is re-read even without notifications.
pub const FULL_RELOAD_INTERVAL: Duration = Duration::from_secs(300);
/// Pause before retrying after a store error.
const RETRY_BACKOFF: Duration = Duration::from_millis(250);

type AclMap = BTreeMap<ResourcePattern, BTreeSet<AccessControlEntry>>;

/// A live view of the stored ACLs as an [`Authorizer`]; share it as `Arc<AclWatcher>`.
#[derive(Debug)]
pub struct AclWatcher {
    current: RwLock<Arc<Authorizer>>,
    /// Bumped after every swap, for callers that wait for a change to arrive.
    generation: tokio::sync::watch::Sender<u64>,
}

/// What the watch task carries between reads.
struct Progress {
    acls: AclMap,
    /// Highest notification sequence applied.
    last_sequence: Option<u64>,
}

impl AclWatcher {
    /// Reads every ACL from `store` and returns once that first snapshot is in place;
    /// a task on `tracker` then keeps it current until `shutdown`.
    pub async fn start(
        store: Store,
        config: AuthorizerConfig,
        tracker: &TaskTracker,
        shutdown: CancellationToken,
    ) -> Result<Arc<Self>> {
        let watcher = Arc::new(Self {
            current: RwLock::new(Arc::new(Authorizer::new(config, []))),
            generation: tokio::sync::watch::Sender::new(0),
        });
        let mut progress = Progress { acls: AclMap::new(), last_sequence: None };
        let watch = watcher.refresh(&*store, &mut progress, true).await?;
        tracker.spawn(watcher.clone().run(store, progress, watch, shutdown));
        Ok(watcher)
    }

    /// The current snapshot.
    pub fn authorizer(&self) -> Arc<Authorizer> {
        self.current.read().expect("invariant: the snapshot lock is never poisoned").clone()
    }

    /// [`Authorizer::authorize`] on the current snapshot.
    pub fn authorize(&self, principal: &Principal, host: &str, operation: Operation, resource: Resource<'_>) -> bool {
        self.current
            .read()
            .expect("invariant: the snapshot lock is never poisoned")
            .authorize(principal, host, operation, resource)
    }

    /// A receiver of the snapshot generation, bumped after every swap.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.generation.subscribe()
    }

    async fn run(self: Arc<Self>, store: Store, mut progress: Progress, mut watch: Watch, shutdown: CancellationToken) {
        loop {
            let full = tokio::select! {
                event = &mut watch => event == WatchEvent::SessionLost,
                () = tokio::time::sleep(FULL_RELOAD_INTERVAL) => true,
                () = shutdown.cancelled() => return,
            };
            let mut full = full;
            loop {
                match self.refresh(&*store, &mut progress, full).await {
                    Ok(next) => {
                        watch = next;
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "reading ACLs from the metadata store failed; retrying");
                        full = true;
                        tokio::select! {
                            () = tokio::time::sleep(RETRY_BACKOFF) => {}
                            () = shutdown.cancelled() => return,
                        }
                    }
                }
            }
        }
    }

    /// Lists the notifications (leaving the next watch), applies the new ones (or
    /// everything when `full`) and swaps in the new snapshot.
    async fn refresh(&self, store: &dyn MetadataStore, progress: &mut Progress, mut full: bool) -> Result<Watch> {
        let (children, watch) = match store.watch_children(paths::ACL_CHANGES).await {
            Ok(listed) => listed,
            Err(fjord_coord::Error::NoNode { .. }) => {
                match create_all(store, paths::ACL_CHANGES, &[], CreateMode::Persistent).await {
                    Ok(_) | Err(fjord_coord::Error::NodeExists { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
                store.watch_children(paths::ACL_CHANGES).await?
            }
            Err(e) => return Err(e.into()),
        };
        let mut notifications: Vec<(u64, String)> =
            children.into_iter().filter_map(|name| notification_sequence(&name).map(|seq| (seq, name))).collect();
        notifications.sort_unstable();
        let newest = notifications.last().map(|(seq, _)| *seq);
        // Sequence numbers only grow; going back means the node was recreated.
        if newest < progress.last_sequence {
            full = true;
        }
        if !full {
            for (_, name) in notifications.iter().filter(|(seq, _)| Some(*seq) > progress.last_sequence) {
                if !apply_notification(store, &mut progress.acls, name).await? {
                    full = true;
                    break;
                }
            }
        }
        if full {
            progress.acls = store::read_acls(store).await?;
        }
        progress.last_sequence = newest.or(progress.last_sequence);
        let next = {
            let current = self.current.read().expect("invariant: the snapshot lock is never poisoned");
            Arc::new(current.with_acls(progress.acls.clone()))
        };
        *self.current.write().expect("invariant: the snapshot lock is never poisoned") = next;
        self.generation.send_modify(|g| *g += 1);
        Ok(watch)
    }
}

/// Re-reads the pattern one notification names. `Ok(false)` when the notification is
/// gone (purged before this broker read it): the caller then reads everything.
async fn apply_notification(store: &dyn MetadataStore, acls: &mut AclMap, name: &str) -> Result<bool> {
    let path = fjord_coord::join(paths::ACL_CHANGES, name);
    let Some((data, _)) = store.get(&path).await? else { return Ok(false) };
    let pattern = serde_json::from_slice::<AclChangeDocument>(&data)
        .map_err(|source| Error::Codec { path: path.clone(), source })
        .and_then(|document| document.pattern());
    let pattern = match pattern {
        Ok(pattern) => pattern,
        Err(e) => {
            tracing::error!(node = path, error = %e, "ignoring an unreadable ACL change notification");
            return Ok(true);
        }
    };
    match store::read_pattern(store, &pattern).await {
        Ok(entries) if entries.is_empty() => {
            acls.remove(&pattern);
        }
        Ok(entries) => {
            acls.insert(pattern, entries);
        }
        Err(Error::Store(e)) => return Err(e.into()),
        // A damaged node keeps the ACLs last read for it until the next full read, which
        // leaves it out (see store::read_acls).
        Err(e) => tracing::error!(pattern = %pattern, error = %e, "ignoring an unreadable ACL node"),
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acl::{PatternType, Permission};
    use crate::ResourceType;

    fn acl(name: &str) -> crate::AclBinding {
        crate::AclBinding {
            pattern: ResourcePattern::new(ResourceType::Topic, name, PatternType::Literal).unwrap(),
            entry: AccessControlEntry::new(Principal::user("a"), "*", Operation::Read, Permission::Allow).unwrap(),
        }
    }

    /// `/acl_changes` recreated (its sequence numbers start over): the watcher cannot
    /// trust its position and reads everything instead of skipping the "old" numbers.
    #[tokio::test]
    async fn sequence_numbers_going_back_force_a_full_read() {
        let dir = tempfile::tempdir().unwrap();
        let store = fjord_coord::EmbeddedStore::open(dir.path()).unwrap();
        let watcher =
            AclWatcher { current: RwLock::new(Arc::new(Authorizer::default())), generation: tokio::sync::watch::Sender::new(0) };
        store::create_acls(&store, &[acl("t")]).await.unwrap();
        let mut progress = Progress { acls: AclMap::new(), last_sequence: Some(1_000) };
        watcher.refresh(&store, &mut progress, false).await.unwrap();
        assert!(watcher.authorize(&Principal::user("a"), "h", Operation::Read, Resource::topic("t")));
        assert_eq!(progress.last_sequence, Some(0));
        assert_eq!(*watcher.subscribe().borrow(), 1);
    }

    /// Notifications newer than the position are applied one by one, older ones skipped.
    #[tokio::test]
    async fn only_new_notifications_are_applied() {
        let dir = tempfile::tempdir().unwrap();
        let store = fjord_coord::EmbeddedStore::open(dir.path()).unwrap();
        let watcher =
            AclWatcher { current: RwLock::new(Arc::new(Authorizer::default())), generation: tokio::sync::watch::Sender::new(0) };
        let mut progress = Progress { acls: AclMap::new(), last_sequence: None };
        watcher.refresh(&store, &mut progress, true).await.unwrap();
        store::create_acls(&store, &[acl("old")]).await.unwrap();
        store::create_acls(&store, &[acl("new")]).await.unwrap();
        // Pretend "old" was already applied: only "new" is read.
        progress.last_sequence = Some(0);
        watcher.refresh(&store, &mut progress, false).await.unwrap();
        let a = Principal::user("a");
        assert!(watcher.authorize(&a, "h", Operation::Read, Resource::topic("new")));
        assert!(!watcher.authorize(&a, "h", Operation::Read, Resource::topic("old")));
    }
}
