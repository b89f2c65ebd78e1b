//! Telling the cluster which replicas here are unhealthy, so the controller moves
//! leadership off them (Kafka's log dir failure handling).
//!
//! In Kafka a broker whose log dir fails takes its replicas offline and tells the
//! controller (`/log_dir_event_notification`); the controller then elects leaders for
//! them from the rest of the ISR and drops them from the ISR, and never elects an offline
//! replica. Fjord's brokers follow partition states from the metadata store rather than
//! LeaderAndIsr requests, so each broker publishes its unhealthy replicas itself: the
//! ephemeral `/brokers/offline_replicas/<id>` lists the partitions whose log here could
//! not be opened or holds a damaged batch ([`fjord_log::LogDirs::unhealthy`]), and is
//! absent when there are none. The controller watches that directory and treats a listed
//! replica as unusable for its partition ([`crate::controller::decide_avoiding`]), and
//! every broker watches it too ([`crate::cluster::ClusterView`]) so that its Metadata
//! answers list a peer's unhealthy replica in `offline_replicas`, as Kafka's brokers do
//! from the controller's UpdateMetadata. A
//! damaged leader thus loses leadership to a healthy in-sync replica, becomes a follower
//! and heals from it (truncating below the damage, the damaged bytes kept aside); once
//! healthy, it is no longer listed and rejoins the ISR as any follower does.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use fjord_coord::registry::{read_json, to_json};
use fjord_coord::{create_all, paths, CreateMode, MetadataStore, Store};
use fjord_log::{LogDirs, TopicPartition, Unhealthy};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::periodic::Periodic;

/// How often the health is compared with what was published (the scrubber refreshes it
/// every second).
const EVERY: Duration = Duration::from_secs(1);

/// [`OfflineReplica::state`] of a replica whose log could not be opened.
const OFFLINE: &str = "offline";
/// [`OfflineReplica::state`] of a replica whose log holds a damaged batch.
const DAMAGED: &str = "damaged";

/// `/brokers/offline_replicas/<id>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct OfflineReplicas {
    pub(crate) version: i32,
    pub(crate) partitions: Vec<OfflineReplica>,
}

/// One unhealthy replica: its partition and why (`offline` or `damaged`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) struct OfflineReplica {
    pub(crate) topic: String,
    pub(crate) partition: i32,
    pub(crate) state: String,
}

/// The document for a health map (sorted, so an unchanged health gives an equal one).
fn document(unhealthy: &BTreeMap<TopicPartition, Unhealthy>) -> OfflineReplicas {
    let partitions = unhealthy
        .iter()
        .map(|(tp, why)| OfflineReplica {
            topic: tp.topic.clone(),
            partition: tp.partition,
            state: match why {
                Unhealthy::Offline { .. } => OFFLINE,
                Unhealthy::Damaged { .. } => DAMAGED,
            }
            .to_owned(),
        })
        .collect();
    OfflineReplicas { version: 1, partitions }
}

/// What one publishing round does with the current document, given the one last
/// published (`None`: nothing yet in this run).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Round {
    /// Replace the node: the health changed, or this is the first round (which also
    /// clears a node a previous run of this broker left, should its session still be
    /// alive: a restart with healthy logs takes them out of the listing).
    Write,
    /// Unchanged and listing something: write again only if the node went missing (a
    /// new session after an expired one).
    Recreate,
    /// Unchanged and healthy: nothing to do.
    Nothing,
}

fn round(published: Option<&OfflineReplicas>, current: &OfflineReplicas) -> Round {
    match published {
        Some(p) if p == current && current.partitions.is_empty() => Round::Nothing,
        Some(p) if p == current => Round::Recreate,
        _ => Round::Write,
    }
}

/// Until `shutdown`, publishes this broker's unhealthy replicas whenever they change,
/// and again when the node went missing (a new session after an expired one). Each
/// round reads the health afresh rather than the scrubber's last reading, and
/// `changed` (a repair, a log that opens again) starts a round at once: a listing that
/// outlived the repair would keep the healed copy out of the ISR and out of elections
/// (`crate::controller::decide_avoiding`) for up to two more seconds.
pub(crate) async fn publish(store: Store, broker_id: i32, logs: Arc<LogDirs>, changed: Arc<Notify>, shutdown: CancellationToken) {
    let path = paths::offline_replicas(broker_id);
    let mut published: Option<OfflineReplicas> = None;
    let mut periodic = Periodic::new(EVERY);
    loop {
        let fresh = {
            let logs = logs.clone();
            // Walks every partition's segment list: off the async workers.
            tokio::task::spawn_blocking(move || {
                logs.refresh_health();
                logs.unhealthy()
            })
            .await
        };
        let current = document(&fresh.unwrap_or_else(|_| logs.unhealthy()));
        let write = match round(published.as_ref(), &current) {
            Round::Write => true,
            Round::Recreate => matches!(store.exists(&path).await, Ok(None)),
            Round::Nothing => false,
        };
        if write {
            match replace(&*store, &path, &current).await {
                Ok(()) => {
                    if !current.partitions.is_empty() || published.as_ref().is_some_and(|p| !p.partitions.is_empty()) {
                        tracing::warn!(
                            broker_id,
                            unhealthy = ?current.partitions.iter().map(|r| format!("{}-{} {}", r.topic, r.partition, r.state)).collect::<Vec<_>>(),
                            "published this broker's unhealthy replicas: the controller moves leadership off them"
                        );
                    }
                    published = Some(current);
                }
                // Tried again next round.
                Err(e) => tracing::warn!(broker_id, error = %e, "publishing this broker's unhealthy replicas failed"),
            }
        }
        tokio::select! {
            more = periodic.tick_until(&shutdown) => if !more { return },
            () = changed.notified() => {}
        }
    }
}

/// Deletes the node and creates it with `doc` when it lists anything: a delete and a
/// create change the directory's children, which is what the controller watches.
async fn replace(store: &dyn MetadataStore, path: &str, doc: &OfflineReplicas) -> fjord_coord::Result<()> {
    match store.delete(path, None).await {
        Ok(()) | Err(fjord_coord::Error::NoNode { .. }) => {}
        Err(e) => return Err(e),
    }
    if doc.partitions.is_empty() {
        return Ok(());
    }
    create_all(store, path, &to_json(doc), CreateMode::Ephemeral).await.map(drop)
}

/// The brokers whose replica of one partition is unhealthy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct UnhealthyReplicas {
    /// Offline or damaged: not elected over a healthy in-sync replica, listed in every
    /// broker's Metadata `offline_replicas`.
    pub(crate) unhealthy: BTreeSet<i32>,
    /// Of those, the ones whose log could not be opened: they serve nothing, so they
    /// are never elected (Kafka never elects a replica on an offline log dir).
    pub(crate) offline: BTreeSet<i32>,
}

/// Partition (topic, index) → its unhealthy replicas, as every broker published them.
pub(crate) type Published = BTreeMap<(String, i32), UnhealthyReplicas>;

/// Every broker's published unhealthy replicas. A node that vanished between listing
/// and reading is skipped.
pub(crate) async fn read_all(store: &dyn MetadataStore) -> fjord_coord::Result<Published> {
    let children = match store.children(paths::OFFLINE_REPLICAS).await {
        Ok(children) => children,
        Err(fjord_coord::Error::NoNode { .. }) => return Ok(BTreeMap::new()),
        Err(e) => return Err(e),
    };
    let mut out = Published::new();
    for child in children {
        let Ok(broker) = child.parse::<i32>() else { continue };
        let doc = match read_json::<OfflineReplicas>(store, &paths::offline_replicas(broker)).await {
            Ok(Some((doc, _))) => doc,
            Ok(None) => continue,
            // One broker's unreadable document must not stop the controller.
            Err(fjord_coord::Error::Codec { .. }) => {
                tracing::warn!(broker, "ignoring an unreadable offline replicas document");
                continue;
            }
            Err(e) => return Err(e),
        };
        for r in doc.partitions {
            let replicas = out.entry((r.topic, r.partition)).or_default();
            replicas.unhealthy.insert(broker);
            if r.state == OFFLINE {
                replicas.offline.insert(broker);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_writes_on_start_and_on_change_and_rechecks_a_listing_node() {
        let healthy = document(&BTreeMap::new());
        let damaged = document(&BTreeMap::from([(
            TopicPartition::new("t", 0),
            Unhealthy::Damaged { segment: "x.log".into(), position: 3 },
        )]));
        assert_eq!(round(None, &healthy), Round::Write, "first round: clear what a previous run left");
        assert_eq!(round(None, &damaged), Round::Write);
        assert_eq!(round(Some(&healthy), &damaged), Round::Write, "damage found");
        assert_eq!(round(Some(&damaged), &healthy), Round::Write, "healed: the listing goes");
        assert_eq!(round(Some(&damaged), &damaged), Round::Recreate, "unchanged listing: recreated if its node went");
        assert_eq!(round(Some(&healthy), &healthy), Round::Nothing);
    }

    #[tokio::test]
    async fn published_replicas_are_read_back_per_partition_and_cleared() {
        let dir = tempfile::tempdir().unwrap();
        let store: Store = Arc::new(fjord_coord::EmbeddedStore::open(&dir.path().join("meta")).unwrap());
        assert!(read_all(&*store).await.unwrap().is_empty(), "no directory yet");
        let health = BTreeMap::from([
            (TopicPartition::new("t", 0), Unhealthy::Damaged { segment: "x.log".into(), position: 3 }),
            (TopicPartition::new("u", 2), Unhealthy::Offline { reason: "EMFILE".into() }),
        ]);
        replace(&*store, &paths::offline_replicas(2), &document(&health)).await.unwrap();
        replace(&*store, &paths::offline_replicas(3), &document(&health)).await.unwrap();
        let read = read_all(&*store).await.unwrap();
        let both = BTreeSet::from([2, 3]);
        let damaged = UnhealthyReplicas { unhealthy: both.clone(), offline: BTreeSet::new() };
        assert_eq!(read.get(&("t".to_owned(), 0)), Some(&damaged));
        let offline = UnhealthyReplicas { unhealthy: both.clone(), offline: both };
        assert_eq!(read.get(&("u".to_owned(), 2)), Some(&offline), "an unopenable log is offline");
        replace(&*store, &paths::offline_replicas(3), &document(&BTreeMap::new())).await.unwrap();
        assert!(store.exists(&paths::offline_replicas(3)).await.unwrap().is_none(), "healthy: no node");
        let read = read_all(&*store).await.unwrap();
        assert_eq!(read.get(&("t".to_owned(), 0)).map(|r| &r.unhealthy), Some(&BTreeSet::from([2])));
    }
}
