//! Topic config changes in the metadata store: the compare-and-set write of
//! `/config/topics/<t>` that the AlterConfigs APIs use, and the watcher through which
//! every broker applies a change, whichever broker took the request.
//!
//! The watcher keeps a child watch on `/config/topics` and a data watch on each
//! `/config/topics/<t>`. Every event on a topic's node re-reads it and re-arms its watch
//! (watches are one-shot), and [`Topics::reload_config`] applies the stored overrides to
//! this broker's logs. A lost session fires every watch, so everything is re-read.
//!
//! A topic this broker does not host (yet) is skipped: opening its logs reads the
//! stored config anyway.
//!
//! [`append`] applies the config keys that change what a leader appends
//! (`compression.type`, `message.timestamp.type`).

pub(crate) mod append;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use fjord_coord::registry::to_json;
use fjord_coord::{create_all, paths, CreateMode, MetadataStore, WatchEvent};
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::handler::Broker;
use crate::topics::{TopicConfigDocument, TopicError};
use crate::{Error, Result};

/// How long the watcher waits before retrying a store read that failed.
const RETRY: Duration = Duration::from_secs(1);

/// A topic's stored overrides and the version of their node, the token for
/// [`write`]'s compare-and-set (`None`: the node does not exist yet).
#[derive(Debug)]
pub(crate) struct StoredConfig {
    pub(crate) overrides: BTreeMap<String, String>,
    version: Option<i32>,
}

/// The stored config of `topic`; `None` when the topic does not exist (no assignment).
pub(crate) async fn read(store: &dyn MetadataStore, topic: &str) -> Result<Option<StoredConfig>> {
    if store.exists(&paths::topic(topic)).await?.is_none() {
        return Ok(None);
    }
    let path = paths::topic_config(topic);
    match store.get(&path).await? {
        None => Ok(Some(StoredConfig { overrides: BTreeMap::new(), version: None })),
        Some((data, stat)) => {
            let doc: TopicConfigDocument = serde_json::from_slice(&data).map_err(|source| Error::Metadata { path, source })?;
            Ok(Some(StoredConfig { overrides: doc.config, version: Some(stat.version) }))
        }
    }
}

/// Stores `overrides` as the topic's config if its node is still as `read` found it.
/// `Ok(false)`: someone changed it in between; read again and redo the change.
pub(crate) async fn write(
    store: &dyn MetadataStore,
    topic: &str,
    seen: &StoredConfig,
    overrides: &BTreeMap<String, String>,
) -> Result<bool> {
    let path = paths::topic_config(topic);
    let doc = to_json(&TopicConfigDocument { version: 1, config: overrides.clone() });
    let outcome = match seen.version {
        Some(version) => store.set(&path, &doc, Some(version)).await.map(drop),
        None => create_all(store, &path, &doc, CreateMode::Persistent).await.map(drop),
    };
    match outcome {
        Ok(()) => Ok(true),
        Err(
            fjord_coord::Error::BadVersion { .. } | fjord_coord::Error::NodeExists { .. } | fjord_coord::Error::NoNode { .. },
        ) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// What one armed watch reported: the topic (`None` for the child watch) and the event.
type Fired = (Option<String>, WatchEvent);

/// Spawns the watcher; it stops when `shutdown` fires.
pub(crate) fn spawn_watcher(tracker: &TaskTracker, broker: &Arc<Broker>, shutdown: &CancellationToken) {
    let (broker, shutdown) = (broker.clone(), shutdown.clone());
    tracker.spawn(async move {
        let mut watched: HashSet<String> = HashSet::new();
        let mut armed: FuturesUnordered<BoxFuture<'static, Fired>> = FuturesUnordered::new();
        armed.push(futures::future::ready((None, WatchEvent::ChildrenChanged)).boxed());
        loop {
            let (topic, event) = tokio::select! {
                Some(fired) = armed.next() => fired,
                () = shutdown.cancelled() => return,
            };
            match topic {
                None => {
                    for name in arm_children(&broker, &mut armed).await {
                        if watched.insert(name.clone()) {
                            armed.push(futures::future::ready((Some(name), WatchEvent::DataChanged)).boxed());
                        }
                    }
                }
                Some(name) => {
                    // A deleted node stays forgotten until the child watch lists it again;
                    // any other event (a change, a lost session) re-reads it.
                    if event == WatchEvent::Deleted || !arm_topic(&broker, &name, &mut armed).await {
                        watched.remove(&name);
                    }
                }
            }
        }
    });
}

/// Lists `/config/topics` and arms the child watch (or a retry).
async fn arm_children(broker: &Broker, armed: &mut FuturesUnordered<BoxFuture<'static, Fired>>) -> Vec<String> {
    let store = broker.topics.store();
    match store.watch_children(paths::TOPIC_CONFIGS).await {
        Ok((names, watch)) => {
            armed.push(watch.map(|event| (None, event)).boxed());
            names
        }
        Err(e) => {
            if let fjord_coord::Error::NoNode { .. } = e {
                // No topic yet: create the parent so that there is something to watch.
                match create_all(&**store, paths::TOPIC_CONFIGS, &[], CreateMode::Persistent).await {
                    Ok(_) | Err(fjord_coord::Error::NodeExists { .. }) => {}
                    Err(e) => tracing::warn!(error = %e, "cannot create {}", paths::TOPIC_CONFIGS),
                }
            } else if e.is_store_unreachable() {
                tracing::debug!(error = %e, "cannot watch topic configs; retrying");
            } else {
                tracing::warn!(error = %e, "cannot watch topic configs; retrying");
            }
            armed.push(tokio::time::sleep(RETRY).map(|()| (None, WatchEvent::SessionLost)).boxed());
            Vec::new()
        }
    }
}

/// Reads the topic's config node, arms its watch (or a retry) and applies the config.
/// `false` when the node is gone.
async fn arm_topic(broker: &Broker, name: &str, armed: &mut FuturesUnordered<BoxFuture<'static, Fired>>) -> bool {
    let topic = Some(name.to_owned());
    match broker.topics.store().watch_data(&paths::topic_config(name)).await {
        Ok((None, _)) => false,
        Ok((Some(_), watch)) => {
            armed.push(watch.map(move |event| (topic, event)).boxed());
            match broker.topics.reload_config(name).await {
                Ok(_) | Err(TopicError::Unknown) => {}
                Err(e) => tracing::warn!(topic = name, error = %e, "cannot apply the stored topic config"),
            }
            true
        }
        Err(e) => {
            // One watcher a topic: an outage of the whole store is the store's to report.
            if e.is_store_unreachable() {
                tracing::debug!(topic = name, error = %e, "cannot watch the topic config; retrying");
            } else {
                tracing::warn!(topic = name, error = %e, "cannot watch the topic config; retrying");
            }
            armed.push(tokio::time::sleep(RETRY).map(move |()| (topic, WatchEvent::SessionLost)).boxed());
            true
        }
    }
}
