//! Telling the cluster which replicas here are unhealthy, so the controller moves
//! leadership off them (Kafka's log dir failure handling).
//!
//! In Kafka a broker whose log dir fails takes its replicas offline and tells the
//! controller (`/log_dir_event_notification`); the controller then elects leaders for
//! them from the rest of the ISR and drops them from the ISR, and never elects an offline
//! replica. Fjord's brokers follow partition states from the metadata store rather than
//! LeaderAndIsr requests, so each broker publishes its unhealthy replicas itself: the
//! ephemeral `/brokers/offline_replicas/<id>` lists the partitions whose log here could
//! not be opened or holds a damaged batch ([`fjord_log::LogManager::unhealthy`]), and is
//! absent when there are none. The controller watches that directory and treats a listed
//! replica as unusable for its partition ([`crate::controller::decide_avoiding`]). A
//! damaged leader thus loses leadership to a healthy in-sync replica, becomes a follower
//! and heals from it (truncating below the damage, the damaged bytes kept aside); once
//! healthy, it is no longer listed and rejoins the ISR as any follower does.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use fjord_coord::registry::{read_json, to_json};
use fjord_coord::{create_all, paths, CreateMode, MetadataStore, Store};
use fjord_log::{LogManager, TopicPartition, Unhealthy};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::periodic::Periodic;

/// How often the health is compared with what was published (the scrubber refreshes it
/// every second).
const EVERY: Duration = Duration::from_secs(1);

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
                Unhealthy::Offline { .. } => "offline",
                Unhealthy::Damaged { .. } => "damaged",
            }
            .to_owned(),
        })
        .collect();
    OfflineReplicas { version: 1, partitions }
}

/// Until `shutdown`, publishes this broker's unhealthy replicas whenever they change,
/// and again when the node went missing (a new session after an expired one).
pub(crate) async fn publish(store: Store, broker_id: i32, logs: Arc<LogManager>, shutdown: CancellationToken) {
    let path = paths::offline_replicas(broker_id);
    // None: unknown, so the first round writes (and clears a node a previous run of
    // this broker left, should its session still be alive).
    let mut published: Option<OfflineReplicas> = None;
    let mut periodic = Periodic::new(EVERY);
    loop {
        let current = document(&logs.unhealthy());
        let missing = !current.partitions.is_empty()
            && published.as_ref() == Some(&current)
            && matches!(store.exists(&path).await, Ok(None));
        if published.as_ref() != Some(&current) || missing {
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
        if !periodic.tick_until(&shutdown).await {
            return;
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

/// Every broker's published unhealthy replicas: partition → the brokers whose replica of
/// it is unhealthy. A node that vanished between listing and reading is skipped.
pub(crate) async fn read_all(store: &dyn MetadataStore) -> fjord_coord::Result<BTreeMap<(String, i32), BTreeSet<i32>>> {
    let children = match store.children(paths::OFFLINE_REPLICAS).await {
        Ok(children) => children,
        Err(fjord_coord::Error::NoNode { .. }) => return Ok(BTreeMap::new()),
        Err(e) => return Err(e),
    };
    let mut out: BTreeMap<(String, i32), BTreeSet<i32>> = BTreeMap::new();
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
            out.entry((r.topic, r.partition)).or_default().insert(broker);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(read.get(&("t".to_owned(), 0)), Some(&BTreeSet::from([2, 3])));
        assert_eq!(read.get(&("u".to_owned(), 2)), Some(&BTreeSet::from([2, 3])));
        replace(&*store, &paths::offline_replicas(3), &document(&BTreeMap::new())).await.unwrap();
        assert!(store.exists(&paths::offline_replicas(3)).await.unwrap().is_none(), "healthy: no node");
        assert_eq!(read_all(&*store).await.unwrap().get(&("t".to_owned(), 0)), Some(&BTreeSet::from([2])));
    }
}
