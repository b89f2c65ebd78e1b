//! The topic manager: which topics exist (the metadata store is the source of truth,
//! this is its in-memory view) and their partitions' logs; the replicas' roles are the
//! [`ReplicaManager`]'s.
//!
//! Store layout (ARCHITECTURE.md): `/config/topics/<t>` holds the topic's config overrides,
//! `/brokers/topics/<t>` its replica assignment, and `/brokers/topics/<t>/partitions/<p>/state`
//! leader, epoch and ISR. The assignment is written after the config, so a topic whose
//! assignment exists is complete; a config without an assignment is an interrupted
//! create, overwritten by the next one.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use fjord_coord::registry::{read_json, to_json, PartitionState, TopicAssignment};
use fjord_coord::{create_all, delete_all, paths, CreateMode, Store};
use fjord_log::{LogConfig, LogManager};
use fjord_record::TopicPartition;
use serde::{Deserialize, Serialize};

use crate::codec::error_code;
use crate::partition::Partition;
use crate::replication::ReplicaManager;
use crate::{Error, Result};

/// Kafka's limit on topic name length (the partition dir name must fit a file name).
const MAX_TOPIC_NAME_LEN: usize = 249;

/// `/config/topics/<t>`, as Kafka writes it.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct TopicConfigDocument {
    pub(crate) version: i32,
    pub(crate) config: BTreeMap<String, String>,
}

/// A topic: its partitions (index = partition number) and its config.
#[derive(Debug)]
pub(crate) struct Topic {
    pub(crate) name: String,
    pub(crate) partitions: Vec<Arc<Partition>>,
    /// The effective log config (broker defaults + overrides).
    pub(crate) config: LogConfig,
    /// The topic-level overrides, as stored.
    pub(crate) overrides: BTreeMap<String, String>,
}

/// Why a topic operation was refused; each maps to a Kafka error code.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TopicError {
    #[error("topic already exists")]
    AlreadyExists,
    #[error("unknown topic")]
    Unknown,
    #[error("invalid topic name: {0}")]
    InvalidName(&'static str),
    #[error("number of partitions must be at least 1, got {0}")]
    InvalidPartitions(i32),
    #[error("replication factor must be 1 on a single broker, got {0}")]
    InvalidReplicationFactor(i16),
    #[error("invalid topic config: {0}")]
    InvalidConfig(String),
    #[error(transparent)]
    Internal(#[from] Error),
}

impl TopicError {
    pub(crate) fn code(&self) -> i16 {
        match self {
            TopicError::AlreadyExists => error_code::TOPIC_ALREADY_EXISTS,
            TopicError::Unknown => error_code::UNKNOWN_TOPIC_OR_PARTITION,
            TopicError::InvalidName(_) => error_code::INVALID_TOPIC_EXCEPTION,
            TopicError::InvalidPartitions(_) => error_code::INVALID_PARTITIONS,
            TopicError::InvalidReplicationFactor(_) => error_code::INVALID_REPLICATION_FACTOR,
            TopicError::InvalidConfig(_) => error_code::INVALID_CONFIG,
            TopicError::Internal(_) => error_code::UNKNOWN_SERVER_ERROR,
        }
    }
}

/// Checks Kafka's topic name rules: 1-249 characters of `[a-zA-Z0-9._-]`, not `.` or `..`.
pub(crate) fn validate_topic_name(name: &str) -> Result<(), TopicError> {
    if name.is_empty() {
        return Err(TopicError::InvalidName("empty"));
    }
    if name == "." || name == ".." {
        return Err(TopicError::InvalidName("`.` and `..` are reserved"));
    }
    if name.len() > MAX_TOPIC_NAME_LEN {
        return Err(TopicError::InvalidName("longer than 249 characters"));
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-') {
        return Err(TopicError::InvalidName("only ASCII letters, digits, '.', '_' and '-' are allowed"));
    }
    Ok(())
}

/// All topics of this broker.
pub(crate) struct Topics {
    store: Store,
    logs: Arc<LogManager>,
    replicas: Arc<ReplicaManager>,
    broker_id: i32,
    defaults: LogConfig,
    topics: RwLock<HashMap<String, Arc<Topic>>>,
    /// Serialises creations and deletions (auto-creation races between connections).
    admin: tokio::sync::Mutex<()>,
}

impl Topics {
    /// Loads every topic of the store and opens its logs.
    pub(crate) async fn open(store: Store, logs: Arc<LogManager>, replicas: Arc<ReplicaManager>, defaults: LogConfig) -> Result<Self> {
        let topics = Self {
            store,
            logs,
            broker_id: replicas.broker_id(),
            replicas,
            defaults,
            topics: RwLock::new(HashMap::new()),
            admin: tokio::sync::Mutex::new(()),
        };
        let names = match topics.store.children(paths::TOPICS).await {
            Ok(names) => names,
            Err(fjord_coord::Error::NoNode { .. }) => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        for name in names {
            let Some((assignment, _)) = read_json::<TopicAssignment>(&*topics.store, &paths::topic(&name)).await? else {
                continue; // deleted since listed
            };
            let overrides = topics.read_overrides(&name).await?;
            let config = topics.effective_config(&overrides).map_err(|e| {
                Error::Metadata { path: paths::topic_config(&name), source: serde::de::Error::custom(e) }
            })?;
            let count = assignment.partition_count() as i32;
            let topic = topics.open_topic(&name, count, config, overrides)?;
            // The roles come from the partition states as they are now.
            for partition in &topic.partitions {
                let path = paths::partition_state(&name, partition.tp.partition);
                if let Some((state, stat)) = read_json::<PartitionState>(&*topics.store, &path).await? {
                    let replicas = assignment.replicas(partition.tp.partition).unwrap_or_default();
                    topics.replicas.apply(&partition.tp, replicas, &state, stat.version);
                }
            }
            topics.topics.write().expect("invariant: topics lock is never poisoned").insert(name, topic);
        }
        Ok(topics)
    }

    async fn read_overrides(&self, name: &str) -> Result<BTreeMap<String, String>> {
        let path = paths::topic_config(name);
        match self.store.get(&path).await? {
            None => Ok(BTreeMap::new()),
            Some((data, _)) => serde_json::from_slice::<TopicConfigDocument>(&data)
                .map(|doc| doc.config)
                .map_err(|source| Error::Metadata { path, source }),
        }
    }

    /// The broker defaults with `overrides` applied, validated (CreateTopics and the
    /// AlterConfigs APIs check a new override set with this before storing it).
    pub(crate) fn effective_config(&self, overrides: &BTreeMap<String, String>) -> Result<LogConfig, TopicError> {
        let mut config = self.defaults;
        // Every topic key, `cleanup.policy` and the compaction settings included, is the
        // log's: the cleaner reads them from the log's config on each pass.
        for (key, value) in overrides {
            config.set(key, value).map_err(|e| TopicError::InvalidConfig(e.to_string()))?;
        }
        config.validate().map_err(|e| TopicError::InvalidConfig(e.to_string()))?;
        Ok(config)
    }

    fn open_topic(
        &self,
        name: &str,
        partitions: i32,
        config: LogConfig,
        overrides: BTreeMap<String, String>,
    ) -> Result<Arc<Topic>> {
        let mut opened = Vec::with_capacity(partitions as usize);
        for p in 0..partitions {
            let tp = TopicPartition::new(name, p);
            let log = self.logs.get_or_create(&tp, config)?;
            log.update_config(config)?;
            opened.push(self.replicas.add_partition(&tp, log));
        }
        Ok(Arc::new(Topic { name: name.to_owned(), partitions: opened, config, overrides }))
    }

    /// The topic, if it exists.
    pub(crate) fn get(&self, name: &str) -> Option<Arc<Topic>> {
        self.topics.read().expect("invariant: topics lock is never poisoned").get(name).cloned()
    }

    /// Every topic, sorted by name.
    pub(crate) fn list(&self) -> Vec<Arc<Topic>> {
        let mut all: Vec<_> = self.topics.read().expect("invariant: topics lock is never poisoned").values().cloned().collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// The topic, created with `num_partitions` and no overrides when missing and `auto_create`.
    pub(crate) async fn get_or_auto_create(
        &self,
        name: &str,
        auto_create: bool,
        num_partitions: i32,
    ) -> Result<Arc<Topic>, TopicError> {
        if let Some(topic) = self.get(name) {
            return Ok(topic);
        }
        if !auto_create {
            return Err(TopicError::Unknown);
        }
        match self.create(name, num_partitions, 1, BTreeMap::new(), false).await {
            Ok(topic) => Ok(topic),
            // Created by someone else between the check and the create.
            Err(TopicError::AlreadyExists) => self.get(name).ok_or(TopicError::Unknown),
            Err(e) => Err(e),
        }
    }

    /// Creates a topic: config, assignment and partition states in the store, then the logs.
    /// With `validate_only`, checks everything and creates nothing.
    pub(crate) async fn create(
        &self,
        name: &str,
        partitions: i32,
        replication_factor: i16,
        overrides: BTreeMap<String, String>,
        validate_only: bool,
    ) -> Result<Arc<Topic>, TopicError> {
        validate_topic_name(name)?;
        if partitions < 1 {
            return Err(TopicError::InvalidPartitions(partitions));
        }
        if replication_factor != 1 {
            return Err(TopicError::InvalidReplicationFactor(replication_factor));
        }
        let config = self.effective_config(&overrides)?;
        let _admin = self.admin.lock().await;
        if self.get(name).is_some() {
            return Err(TopicError::AlreadyExists);
        }
        let store = &*self.store;
        if store.exists(&paths::topic(name)).await.map_err(Error::from)?.is_some() {
            return Err(TopicError::AlreadyExists);
        }
        if validate_only {
            return Ok(Arc::new(Topic { name: name.to_owned(), partitions: Vec::new(), config, overrides }));
        }
        let config_doc = to_json(&TopicConfigDocument { version: 1, config: overrides.clone() });
        let config_path = paths::topic_config(name);
        match create_all(store, &config_path, &config_doc, CreateMode::Persistent).await {
            Err(fjord_coord::Error::NodeExists { .. }) => {
                store.set(&config_path, &config_doc, None).await.map_err(Error::from)?;
            }
            other => {
                other.map_err(Error::from)?;
            }
        }
        let assignment = TopicAssignment {
            partitions: (0..partitions).map(|p| (p.to_string(), vec![self.broker_id])).collect(),
        };
        create_all(store, &paths::topic(name), &to_json(&assignment), CreateMode::Persistent)
            .await
            .map_err(Error::from)?;
        let state = PartitionState { leader: self.broker_id, leader_epoch: 0, isr: vec![self.broker_id], controller_epoch: 0 };
        for p in 0..partitions {
            create_all(store, &paths::partition_state(name, p), &to_json(&state), CreateMode::Persistent)
                .await
                .map_err(Error::from)?;
        }
        let topic = self.open_topic(name, partitions, config, overrides)?;
        for partition in &topic.partitions {
            self.replicas.apply(&partition.tp, &[self.broker_id], &state, 0);
        }
        self.topics.write().expect("invariant: topics lock is never poisoned").insert(name.to_owned(), topic.clone());
        tracing::info!(topic = name, partitions, "created topic");
        Ok(topic)
    }

    /// Deletes a topic: it disappears for clients first, then its logs and store nodes go.
    pub(crate) async fn delete(&self, name: &str) -> Result<(), TopicError> {
        let _admin = self.admin.lock().await;
        let topic = self
            .topics
            .write()
            .expect("invariant: topics lock is never poisoned")
            .remove(name)
            .ok_or(TopicError::Unknown)?;
        for partition in &topic.partitions {
            self.replicas.remove(&partition.tp);
            self.logs.delete(&partition.tp).map_err(Error::from)?;
            partition.notify_appended(); // delayed fetches re-check and see the topic gone
        }
        delete_all(&*self.store, &paths::topic(name)).await.map_err(Error::from)?;
        delete_all(&*self.store, &paths::topic_config(name)).await.map_err(Error::from)?;
        tracing::info!(topic = name, "deleted topic");
        Ok(())
    }

    /// Applies the overrides stored in `/config/topics/<name>` to the topic's live logs
    /// (after an AlterConfigs here, or a config watch firing for a change made through
    /// another broker). Reading the store under the admin lock orders the reloads, so the
    /// last one applies the latest stored config. `Ok(false)` when nothing changed;
    /// [`TopicError::Unknown`] when this broker has no such topic.
    pub(crate) async fn reload_config(&self, name: &str) -> Result<bool, TopicError> {
        let _admin = self.admin.lock().await;
        let topic = self.get(name).ok_or(TopicError::Unknown)?;
        let overrides = self.read_overrides(name).await?;
        if overrides == topic.overrides {
            return Ok(false);
        }
        let config = self.effective_config(&overrides)?;
        for partition in &topic.partitions {
            partition.log.update_config(config).map_err(Error::from)?;
        }
        tracing::info!(topic = name, ?overrides, "applied topic config");
        let updated = Topic { name: topic.name.clone(), partitions: topic.partitions.clone(), config, overrides };
        self.topics.write().expect("invariant: topics lock is never poisoned").insert(name.to_owned(), Arc::new(updated));
        Ok(true)
    }

    /// The metadata store (the config watcher and the AlterConfigs APIs write and watch
    /// `/config/topics`).
    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    /// The log manager (periodic tasks, shutdown).
    pub(crate) fn logs(&self) -> &Arc<LogManager> {
        &self.logs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names_follow_kafka_rules() {
        validate_topic_name("events.v1_a-b").unwrap();
        assert!(validate_topic_name("").is_err());
        assert!(validate_topic_name("..").is_err());
        assert!(validate_topic_name("a/b").is_err());
        assert!(validate_topic_name(&"x".repeat(250)).is_err());
    }
}
