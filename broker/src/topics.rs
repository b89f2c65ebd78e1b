//! Topics: their metadata (from the [`ClusterView`]), creation with a replica assignment
//! over the live brokers, deletion, and config reloads (AlterConfigs).
//!
//! Store layout (docs/architecture.md): `/config/topics/<t>` holds the topic's config overrides,
//! `/brokers/topics/<t>` its replica assignment, and `/brokers/topics/<t>/partitions/<p>/state`
//! leader, epoch and ISR. The assignment is written after the config, so a topic whose
//! assignment exists is complete; a config without an assignment is an interrupted
//! create, overwritten by the next one.
//!
//! Any broker creates and deletes topics by writing the store; every broker's view (the
//! creating one's too) then opens or deletes the logs of its own replicas. A create or
//! delete answers once this broker's view has caught up, so a client that asks the same
//! broker next sees its own change.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::Duration;

use fjord_coord::registry::{read_json, to_json, BrokerRegistration, PartitionState, TopicAssignment};
use fjord_coord::{create_all, delete_all, paths, CreateMode, Store};
use fjord_log::LogConfig;
use fjord_record::TopicPartition;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::cluster::ClusterView;
use crate::codec::error_code;
use crate::limits::PartitionLimits;
use crate::replication::throttle::{ThrottledReplicas, TopicThrottles, FOLLOWER_REPLICAS, LEADER_REPLICAS};
use crate::replication::ReplicaManager;
use crate::Error;

/// Kafka's limit on topic name length (the partition dir name must fit a file name).
const MAX_TOPIC_NAME_LEN: usize = 249;
/// How long a create or delete waits for this broker's view to show it.
const VIEW_WAIT: Duration = Duration::from_secs(15);
/// The topic-level key the controller applies (the others belong to the log).
pub(crate) const UNCLEAN_LEADER_ELECTION: &str = "unclean.leader.election.enable";

/// `/config/topics/<t>`, as Kafka writes it.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct TopicConfigDocument {
    pub(crate) version: i32,
    #[serde(default)]
    pub(crate) config: BTreeMap<String, String>,
}

/// Broker-wide defaults of the topic-level settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TopicSettings {
    /// The log keys (`log.*` broker keys, `min.insync.replicas`).
    pub(crate) log: LogConfig,
    /// `unclean.leader.election.enable`.
    pub(crate) unclean_leader_election: bool,
}

/// A topic as the store describes it.
#[derive(Debug)]
pub(crate) struct Topic {
    pub(crate) name: String,
    /// The topic id (KIP-516); nil while a topic stored before ids existed waits for
    /// one (`crate::topic_id::assign_missing`).
    pub(crate) topic_id: Uuid,
    /// Replicas of each partition (index = partition number); the first is the preferred leader.
    pub(crate) replicas: Vec<Vec<i32>>,
    /// The effective log config (broker defaults + overrides), `min.insync.replicas` included.
    pub(crate) config: LogConfig,
    /// The topic-level overrides, as stored.
    pub(crate) overrides: BTreeMap<String, String>,
    /// Effective `unclean.leader.election.enable`.
    pub(crate) unclean_leader_election: bool,
    /// The `*.replication.throttled.replicas` lists.
    pub(crate) throttles: TopicThrottles,
}

impl Topic {
    /// Builds the topic from its stored assignment and overrides.
    pub(crate) fn from_assignment(
        name: &str,
        assignment: &TopicAssignment,
        overrides: BTreeMap<String, String>,
        settings: &TopicSettings,
    ) -> Result<Self, TopicError> {
        let count = assignment.partition_count() as i32;
        let replicas = (0..count)
            .map(|p| assignment.replicas(p).map(<[i32]>::to_vec))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| TopicError::InvalidReplicaAssignment("partitions are not numbered 0..n".into()))?;
        let topic_id = match &assignment.topic_id {
            None => Uuid::nil(),
            Some(text) => crate::topic_id::decode(text)
                .ok_or_else(|| TopicError::InvalidReplicaAssignment(format!("topic id {text:?} is not 16 bytes of base64")))?,
        };
        let (config, unclean_leader_election) = effective_config(settings, &overrides, true)?;
        let throttles = TopicThrottles::from_overrides(&overrides).map_err(TopicError::InvalidConfig)?;
        Ok(Self { name: name.to_owned(), topic_id, replicas, config, overrides, unclean_leader_election, throttles })
    }

    pub(crate) fn new(
        name: &str,
        topic_id: Uuid,
        replicas: Vec<Vec<i32>>,
        overrides: BTreeMap<String, String>,
        settings: &TopicSettings,
    ) -> Result<Self, TopicError> {
        let (config, unclean_leader_election) = effective_config(settings, &overrides, false)?;
        let throttles = TopicThrottles::from_overrides(&overrides).map_err(TopicError::InvalidConfig)?;
        Ok(Self { name: name.to_owned(), topic_id, replicas, config, overrides, unclean_leader_election, throttles })
    }

    /// Number of partitions.
    pub(crate) fn partition_count(&self) -> i32 {
        self.replicas.len() as i32
    }

    /// Replicas of `partition`, `None` when the topic has no such partition.
    pub(crate) fn partition_replicas(&self, partition: i32) -> Option<&[i32]> {
        usize::try_from(partition).ok().and_then(|p| self.replicas.get(p)).map(Vec::as_slice)
    }
}

/// The effective log config and `unclean.leader.election.enable` of a topic with `overrides`.
/// `stored`: overrides read back from the metadata store, written before the broker's
/// `log.min.segment.bytes` floor (or under a lower one); a `segment.bytes` below it then
/// rolls at the floor instead of making the topic invalid (its partitions would vanish).
fn effective_config(
    settings: &TopicSettings,
    overrides: &BTreeMap<String, String>,
    stored: bool,
) -> Result<(LogConfig, bool), TopicError> {
    let mut config = settings.log;
    let mut unclean = settings.unclean_leader_election;
    // Every other topic key, `cleanup.policy`, `min.insync.replicas` and the compaction
    // settings included, is the log's: the cleaner and the produce path read them from
    // the log's config.
    for (key, value) in overrides {
        if key == LEADER_REPLICAS || key == FOLLOWER_REPLICAS {
            // The replication throttles' lists: INVALID_CONFIG unless Kafka's syntax.
            ThrottledReplicas::parse(value).map_err(|reason| TopicError::InvalidConfig(format!("{key}={value}: {reason}")))?;
        } else if key == UNCLEAN_LEADER_ELECTION {
            unclean =
                value.trim().parse().map_err(|_| TopicError::InvalidConfig(format!("{key}={value}: expected true or false")))?;
        } else {
            match config.set(key, value) {
                Err(fjord_log::Error::SegmentBytesBelowFloor { value, min }) if stored => {
                    tracing::warn!(
                        value,
                        min,
                        "a stored segment.bytes is below log.min.segment.bytes: segments roll at the floor"
                    );
                    config.segment_bytes = min;
                }
                other => other.map_err(|e| TopicError::InvalidConfig(e.to_string()))?,
            }
        }
    }
    config.validate().map_err(|e| TopicError::InvalidConfig(e.to_string()))?;
    Ok((config, unclean))
}

/// Why a topic operation was refused; each maps to a Kafka error code.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TopicError {
    #[error("topic already exists")]
    AlreadyExists,
    #[error("unknown topic")]
    Unknown,
    /// Named by an id (KIP-516) no topic has.
    #[error("unknown topic id")]
    UnknownId,
    /// The principal lacks the ACL the request needs on this topic.
    #[error("not authorized to access the topic")]
    Unauthorized,
    #[error("invalid topic name: {0}")]
    InvalidName(&'static str),
    #[error("number of partitions must be at least 1, got {0}")]
    InvalidPartitions(i32),
    #[error("{requested} partitions requested; at most {limit} per topic in one request (max.partitions.per.request)")]
    TooManyPartitions { requested: usize, limit: i32 },
    #[error(
        "broker {broker} holds {current} partition replicas and would get {new} more; \
         at most {limit} per broker (max.partitions.per.broker)"
    )]
    BrokerPartitionLimit { broker: i32, current: usize, new: usize, limit: usize },
    #[error("topic has {current} partitions; the new count must be higher, got {requested}")]
    PartitionsNotIncreased { current: i32, requested: i32 },
    #[error("{requested} partitions to add; at most {limit} in one request (max.partitions.per.request)")]
    TooManyNewPartitions { requested: usize, limit: i32 },
    /// Deleting a coordinator's topic ([`is_internal`]), or adding partitions to it: its
    /// records are the coordinator's state, and its partition count maps keys (a
    /// transactional id) to the partition holding their state.
    #[error("{0} is an internal topic and is not allowed to be {1}")]
    InternalTopic(String, &'static str),
    #[error("{0}")]
    InvalidReplicationFactor(String),
    #[error("invalid replica assignment: {0}")]
    InvalidReplicaAssignment(String),
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
            TopicError::UnknownId => error_code::UNKNOWN_TOPIC_ID,
            TopicError::Unauthorized => error_code::TOPIC_AUTHORIZATION_FAILED,
            TopicError::InvalidName(_) | TopicError::InternalTopic(..) => error_code::INVALID_TOPIC_EXCEPTION,
            TopicError::InvalidPartitions(_) | TopicError::TooManyPartitions { .. } => error_code::INVALID_PARTITIONS,
            TopicError::PartitionsNotIncreased { .. } => error_code::INVALID_PARTITIONS,
            TopicError::BrokerPartitionLimit { .. } | TopicError::TooManyNewPartitions { .. } => error_code::POLICY_VIOLATION,
            TopicError::InvalidReplicationFactor(_) => error_code::INVALID_REPLICATION_FACTOR,
            TopicError::InvalidReplicaAssignment(_) => error_code::INVALID_REPLICA_ASSIGNMENT,
            TopicError::InvalidConfig(_) => error_code::INVALID_CONFIG,
            TopicError::Internal(_) => error_code::UNKNOWN_SERVER_ERROR,
        }
    }
}

impl From<fjord_coord::Error> for TopicError {
    fn from(e: fjord_coord::Error) -> Self {
        TopicError::Internal(e.into())
    }
}

/// Whether Kafka marks `topic` internal (Metadata's and DescribeTopicPartitions'
/// `is_internal`): the group and transaction coordinators' logs. Admin clients leave
/// internal topics out of their listings unless asked for them.
pub(crate) fn is_internal(topic: &str) -> bool {
    topic == "__consumer_offsets" || topic == crate::txn::TOPIC
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

/// What a CreateTopics names for one topic.
#[derive(Debug)]
pub(crate) enum Layout {
    /// This many partitions with this many replicas each, placed by the broker.
    Spread { partitions: i32, replication_factor: i16 },
    /// The client's own replica lists, one per partition.
    Manual(Vec<Vec<i32>>),
}

impl Layout {
    /// (partitions, replication factor) as asked for.
    pub(crate) fn counts(&self) -> (i32, i16) {
        match self {
            Layout::Spread { partitions, replication_factor } => (*partitions, *replication_factor),
            Layout::Manual(replicas) => (
                i32::try_from(replicas.len()).unwrap_or(i32::MAX),
                replicas.first().map_or(0, |r| i16::try_from(r.len()).unwrap_or(i16::MAX)),
            ),
        }
    }
}

/// Topic creation and deletion; topic lookups go to the view.
pub(crate) struct Topics {
    store: Store,
    view: Arc<ClusterView>,
    replicas: Arc<ReplicaManager>,
    settings: TopicSettings,
    limits: PartitionLimits,
    /// Serialises this broker's creations and deletions (auto-creation races between
    /// connections); other brokers are kept off by the store's create-if-absent.
    admin: tokio::sync::Mutex<()>,
}

impl Topics {
    pub(crate) fn new(
        store: Store,
        view: Arc<ClusterView>,
        replicas: Arc<ReplicaManager>,
        settings: TopicSettings,
        limits: PartitionLimits,
    ) -> Self {
        Self { store, view, replicas, settings, limits, admin: tokio::sync::Mutex::new(()) }
    }

    /// The partition limits creations are checked against.
    pub(crate) fn limits(&self) -> PartitionLimits {
        self.limits
    }

    /// The metadata store (the config watcher and the AlterConfigs APIs write and watch
    /// `/config/topics`).
    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    /// The broker defaults with `overrides` applied, validated (CreateTopics and the
    /// AlterConfigs APIs check a new override set with this before storing it).
    pub(crate) fn effective_config(&self, overrides: &BTreeMap<String, String>) -> Result<LogConfig, TopicError> {
        effective_config(&self.settings, overrides, false).map(|(config, _)| config)
    }

    /// Applies the overrides stored in `/config/topics/<name>` to the topic in the view
    /// and to this broker's replicas' logs (after an AlterConfigs here, or a config
    /// watch firing for a change made through another broker). Reading the store under
    /// the admin lock orders the reloads, so the last one applies the latest stored
    /// config. `Ok(false)` when nothing changed; [`TopicError::Unknown`] when the view
    /// has no such topic.
    pub(crate) async fn reload_config(&self, name: &str) -> Result<bool, TopicError> {
        let _admin = self.admin.lock().await;
        let topic = self.get(name).ok_or(TopicError::Unknown)?;
        let overrides = crate::cluster::read_overrides(&*self.store, name).await?;
        if overrides == topic.overrides {
            return Ok(false);
        }
        let updated = Topic::new(name, topic.topic_id, topic.replicas.clone(), overrides, &self.settings)?;
        for p in 0..updated.partition_count() {
            if let Some(partition) = self.replicas.get(&TopicPartition::new(name, p)) {
                partition.log.update_config(updated.config).map_err(Error::from)?;
            }
        }
        tracing::info!(topic = name, overrides = ?updated.overrides, "applied topic config");
        self.view.replace_topic(Arc::new(updated));
        Ok(true)
    }

    /// The topic, if it exists.
    pub(crate) fn get(&self, name: &str) -> Option<Arc<Topic>> {
        self.view.topic(name)
    }

    /// Every topic, sorted by name.
    pub(crate) fn list(&self) -> Vec<Arc<Topic>> {
        self.view.topics()
    }

    /// The log manager (metrics).
    pub(crate) fn logs(&self) -> &Arc<fjord_log::LogDirs> {
        self.view.logs()
    }

    /// The view this broker answers from.
    pub(crate) fn view(&self) -> &Arc<ClusterView> {
        &self.view
    }

    /// The topic, created with `num_partitions`, `replication_factor` and no overrides
    /// when missing and `auto_create`.
    pub(crate) async fn get_or_auto_create(
        &self,
        name: &str,
        auto_create: bool,
        num_partitions: i32,
        replication_factor: i16,
    ) -> Result<Arc<Topic>, TopicError> {
        if let Some(topic) = self.get(name) {
            return Ok(topic);
        }
        if !auto_create {
            return Err(TopicError::Unknown);
        }
        let layout = Layout::Spread { partitions: num_partitions, replication_factor };
        match self.create(name, layout, BTreeMap::new()).await {
            Ok(topic) => Ok(topic),
            // Created by someone else between the check and the create.
            Err(TopicError::AlreadyExists) => {
                self.view.wait_for(VIEW_WAIT, |v| v.is_ready(name)).await;
                self.get(name).ok_or(TopicError::Unknown)
            }
            Err(e) => Err(e),
        }
    }

    /// Checks a CreateTopics entry as [`Topics::create`] would, creating and allocating
    /// nothing (`validate_only`).
    pub(crate) async fn validate(
        &self,
        name: &str,
        layout: &Layout,
        overrides: &BTreeMap<String, String>,
    ) -> Result<(), TopicError> {
        let brokers = self.check_request(name, layout, overrides).await?;
        if self.exists(name).await? {
            return Err(TopicError::AlreadyExists);
        }
        self.check_broker_limit(layout, &brokers, random_u64())
    }

    /// Creates a topic: config, assignment and partition states in the store; answers
    /// once this broker's view has it (and its own replicas are open). Every count in
    /// `layout` is checked against the limits before the assignment is built.
    pub(crate) async fn create(
        &self,
        name: &str,
        layout: Layout,
        overrides: BTreeMap<String, String>,
    ) -> Result<Arc<Topic>, TopicError> {
        let brokers = self.check_request(name, &layout, &overrides).await?;
        let _admin = self.admin.lock().await;
        if self.exists(name).await? {
            return Err(TopicError::AlreadyExists);
        }
        // Under the admin lock, so two creations on this broker cannot both pass it.
        let seed = random_u64();
        self.check_broker_limit(&layout, &brokers, seed)?;
        let replicas = match layout {
            Layout::Spread { partitions, replication_factor } => {
                assign_replicas(&brokers, partitions, replication_factor as usize, seed)
            }
            Layout::Manual(replicas) => replicas,
        };
        let topic = Topic::new(name, crate::topic_id::new_topic_id(), replicas, overrides, &self.settings)?;
        let store = &*self.store;
        let config_doc = to_json(&TopicConfigDocument { version: 1, config: topic.overrides.clone() });
        let config_path = paths::topic_config(name);
        match create_all(store, &config_path, &config_doc, CreateMode::Persistent).await {
            Err(fjord_coord::Error::NodeExists { .. }) => {
                store.set(&config_path, &config_doc, None).await?;
            }
            other => {
                other?;
            }
        }
        let assignment = TopicAssignment {
            partitions: topic.replicas.iter().enumerate().map(|(p, r)| (p.to_string(), r.clone())).collect(),
            topic_id: Some(crate::topic_id::encode(topic.topic_id)),
            ..TopicAssignment::default()
        };
        match create_all(store, &paths::topic(name), &to_json(&assignment), CreateMode::Persistent).await {
            // Another broker created it first.
            Err(fjord_coord::Error::NodeExists { .. }) => return Err(TopicError::AlreadyExists),
            other => {
                other?;
            }
        }
        write_new_partition_states(store, name, 0, &topic.replicas).await?;
        tracing::info!(topic = name, partitions = topic.partition_count(), replicas = ?topic.replicas, "created topic");
        if !self.view.wait_for(VIEW_WAIT, |v| v.is_ready(name)).await {
            tracing::warn!(topic = name, "created topic not yet in this broker's view");
        }
        Ok(self.get(name).unwrap_or_else(|| Arc::new(topic)))
    }

    /// The checks of a create that need no lock: the name, the counts against
    /// `max.partitions.per.request` and the live brokers, a manual assignment, the config
    /// overrides. Returns the live brokers.
    async fn check_request(
        &self,
        name: &str,
        layout: &Layout,
        overrides: &BTreeMap<String, String>,
    ) -> Result<Vec<(i32, Option<String>)>, TopicError> {
        validate_topic_name(name)?;
        let limit = self.limits.per_request;
        let brokers = live_brokers(&*self.store).await?;
        match layout {
            Layout::Spread { partitions, .. } if *partitions < 1 => return Err(TopicError::InvalidPartitions(*partitions)),
            Layout::Spread { partitions, .. } if *partitions > limit => {
                return Err(TopicError::TooManyPartitions { requested: *partitions as usize, limit })
            }
            Layout::Spread { replication_factor, .. } if *replication_factor < 1 => {
                return Err(TopicError::InvalidReplicationFactor(format!(
                    "replication factor must be at least 1, got {replication_factor}"
                )))
            }
            Layout::Spread { replication_factor, .. } if *replication_factor as usize > brokers.len() => {
                return Err(TopicError::InvalidReplicationFactor(format!(
                    "replication factor {replication_factor} is larger than the {} live brokers",
                    brokers.len()
                )))
            }
            Layout::Spread { .. } => {}
            Layout::Manual(replicas) if replicas.len() > limit as usize => {
                return Err(TopicError::TooManyPartitions { requested: replicas.len(), limit })
            }
            Layout::Manual(replicas) => check_manual_assignment(replicas, &brokers)?,
        }
        effective_config(&self.settings, overrides, false)?;
        Ok(brokers)
    }

    /// Whether the topic exists (in the view, or in the store ahead of the view).
    async fn exists(&self, name: &str) -> Result<bool, TopicError> {
        Ok(self.get(name).is_some() || self.store.exists(&paths::topic(name)).await?.is_some())
    }

    /// Refuses a layout that would give a broker more than `max.partitions.per.broker`
    /// replicas, counting those it has in the view. Counts the placement `seed` gives
    /// without building it.
    fn check_broker_limit(&self, layout: &Layout, brokers: &[(i32, Option<String>)], seed: u64) -> Result<(), TopicError> {
        let mut added: BTreeMap<i32, usize> = BTreeMap::new();
        let mut count = |replicas: &[i32]| {
            for broker in replicas {
                *added.entry(*broker).or_default() += 1;
            }
        };
        match layout {
            Layout::Spread { partitions, replication_factor } => {
                place_replicas(brokers, *partitions, *replication_factor as usize, seed, count)
            }
            Layout::Manual(replicas) => replicas.iter().for_each(|r| count(r)),
        }
        self.check_added_replicas(added)
    }

    /// Refuses `added` (new replicas per broker) when it would give a broker more than
    /// `max.partitions.per.broker` replicas, counting those it has in the view.
    fn check_added_replicas(&self, added: BTreeMap<i32, usize>) -> Result<(), TopicError> {
        let limit = self.limits.per_broker;
        // The current replicas of the brokers that get new ones.
        let mut held: BTreeMap<i32, usize> = BTreeMap::new();
        for topic in self.view.topics() {
            for broker in topic.replicas.iter().flatten() {
                if added.contains_key(broker) {
                    *held.entry(*broker).or_default() += 1;
                }
            }
        }
        for (broker, new) in added {
            let current = held.get(&broker).copied().unwrap_or(0);
            if current + new > limit {
                return Err(TopicError::BrokerPartitionLimit { broker, current, new, limit });
            }
        }
        Ok(())
    }

    /// Raises the topic's partition count to `count` (CreatePartitions): the new
    /// partitions get `manual` replica lists (one per new partition) or Kafka's placement
    /// over the live brokers at the topic's replication factor. Every limit is checked
    /// before the assignment is written; `validate_only` stops there. The assignment is
    /// replaced with a version check (a concurrent change through another broker fails
    /// this one instead of being overwritten), then the new partitions' states are written
    /// as a create writes them; answers once this broker's view has the new partitions.
    pub(crate) async fn add_partitions(
        &self,
        name: &str,
        count: i32,
        manual: Option<Vec<Vec<i32>>>,
        validate_only: bool,
    ) -> Result<(), TopicError> {
        let _admin = self.admin.lock().await;
        let store = &*self.store;
        let path = paths::topic(name);
        let Some((mut assignment, stat)) = read_json::<TopicAssignment>(store, &path).await? else {
            return Err(TopicError::Unknown);
        };
        if is_internal(name) {
            return Err(TopicError::InternalTopic(name.to_owned(), "given partitions"));
        }
        let current = Topic::from_assignment(name, &assignment, BTreeMap::new(), &self.settings)?;
        let old = current.partition_count();
        if count <= old {
            return Err(TopicError::PartitionsNotIncreased { current: old, requested: count });
        }
        let new = (count - old) as usize;
        if new > self.limits.per_request.max(0) as usize {
            return Err(TopicError::TooManyNewPartitions { requested: new, limit: self.limits.per_request });
        }
        let replication_factor = current.replicas.first().map_or(1, Vec::len);
        let brokers = live_brokers(store).await?;
        let added = match manual {
            Some(replicas) => {
                if replicas.len() != new {
                    return Err(TopicError::InvalidReplicaAssignment(format!(
                        "{} replica lists for {new} new partitions",
                        replicas.len()
                    )));
                }
                check_manual_assignment(&replicas, &brokers)?;
                if replicas[0].len() != replication_factor {
                    return Err(TopicError::InvalidReplicaAssignment(format!(
                        "{} replicas per new partition; the topic has {replication_factor}",
                        replicas[0].len()
                    )));
                }
                replicas
            }
            None => {
                if replication_factor > brokers.len() {
                    return Err(TopicError::InvalidReplicationFactor(format!(
                        "replication factor {replication_factor} is larger than the {} live brokers",
                        brokers.len()
                    )));
                }
                // Bounded by max.partitions.per.request, checked above.
                place_replicas_from(&brokers, old as usize, new, replication_factor, random_u64())
            }
        };
        let mut per_broker: BTreeMap<i32, usize> = BTreeMap::new();
        for broker in added.iter().flatten() {
            *per_broker.entry(*broker).or_default() += 1;
        }
        self.check_added_replicas(per_broker)?;
        if validate_only {
            return Ok(());
        }
        for (i, replicas) in added.iter().enumerate() {
            assignment.partitions.insert((old as usize + i).to_string(), replicas.clone());
        }
        match store.set(&path, &to_json(&assignment), Some(stat.version)).await {
            Err(fjord_coord::Error::NoNode { .. }) => return Err(TopicError::Unknown),
            other => {
                other?;
            }
        }
        write_new_partition_states(store, name, old, &added).await?;
        tracing::info!(topic = name, from = old, to = count, replicas = ?added, "added partitions");
        let ready = |v: &ClusterView| v.is_ready(name) && v.topic(name).is_some_and(|t| t.partition_count() == count);
        if !self.view.wait_for(VIEW_WAIT, ready).await {
            tracing::warn!(topic = name, "added partitions not yet in this broker's view");
        }
        Ok(())
    }

    /// Deletes a topic: its store nodes go, then every broker's view drops the topic and
    /// deletes its replicas' logs; answers once this broker's view has. With `expected_id`
    /// (DeleteTopics v6 by id) only the topic of that id: one created again under the
    /// same name since the client looked is another topic, and [`TopicError::UnknownId`].
    pub(crate) async fn delete(&self, name: &str, expected_id: Option<Uuid>) -> Result<(), TopicError> {
        let _admin = self.admin.lock().await;
        let stored = read_json::<TopicAssignment>(&*self.store, &paths::topic(name)).await?;
        if let Some(expected) = expected_id {
            let id = stored.as_ref().and_then(|(a, _)| a.topic_id.as_deref()).and_then(crate::topic_id::decode);
            if id != Some(expected) {
                return Err(TopicError::UnknownId);
            }
        }
        if self.get(name).is_none() && stored.is_none() {
            return Err(TopicError::Unknown);
        }
        if is_internal(name) {
            return Err(TopicError::InternalTopic(name.to_owned(), "deleted"));
        }
        delete_all(&*self.store, &paths::topic(name)).await?;
        delete_all(&*self.store, &paths::topic_config(name)).await?;
        if !self.view.wait_for(VIEW_WAIT, |v| !v.topic_exists(name)).await {
            tracing::warn!(topic = name, "deleted topic still in this broker's view");
        }
        tracing::info!(topic = name, "deleted topic");
        Ok(())
    }
}

/// The live brokers with their racks, sorted by id, read from the store (fresher than
/// the view, which a create must not trail).
async fn live_brokers(store: &dyn fjord_coord::MetadataStore) -> Result<Vec<(i32, Option<String>)>, TopicError> {
    let mut brokers = Vec::new();
    for id in store.children(paths::BROKER_IDS).await? {
        let Ok(id) = id.parse::<i32>() else { continue };
        if let Some((registration, _)) = read_json::<BrokerRegistration>(store, &paths::broker(id)).await? {
            brokers.push((id, registration.rack));
        }
    }
    brokers.sort();
    Ok(brokers)
}

/// Writes the state of new partitions `first..` (replicas `replicas`) as the controller
/// expects of a partition nobody has led yet: the first replica leads at epoch 0 with
/// every replica in sync (their logs are all empty).
async fn write_new_partition_states(
    store: &dyn fjord_coord::MetadataStore,
    name: &str,
    first: i32,
    replicas: &[Vec<i32>],
) -> Result<(), TopicError> {
    let controller_epoch = match read_json::<i32>(store, paths::CONTROLLER_EPOCH).await {
        Ok(found) => found.map_or(0, |(epoch, _)| epoch),
        Err(_) => 0,
    };
    for (i, replicas) in replicas.iter().enumerate() {
        let state = PartitionState { leader: replicas[0], leader_epoch: 0, isr: replicas.clone(), controller_epoch };
        create_all(store, &paths::partition_state(name, first + i as i32), &to_json(&state), CreateMode::Persistent).await?;
    }
    Ok(())
}

fn check_manual_assignment(replicas: &[Vec<i32>], brokers: &[(i32, Option<String>)]) -> Result<(), TopicError> {
    let invalid = |reason: String| Err(TopicError::InvalidReplicaAssignment(reason));
    let Some(first) = replicas.first() else { return invalid("no partitions".into()) };
    for (p, list) in replicas.iter().enumerate() {
        if list.is_empty() || list.len() != first.len() {
            return invalid(format!("partition {p} has {} replicas, partition 0 has {}", list.len(), first.len()));
        }
        if list.iter().collect::<BTreeSet<_>>().len() != list.len() {
            return invalid(format!("partition {p} names a broker twice"));
        }
        if let Some(unknown) = list.iter().find(|b| !brokers.iter().any(|(id, _)| id == *b)) {
            return invalid(format!("partition {p} names broker {unknown}, which is not live"));
        }
    }
    Ok(())
}

/// Kafka's replica placement: partition `p`'s leader is broker `(start + p) mod n`,
/// so leaders are spread evenly; the followers are the next brokers at a shift that
/// grows every `n` partitions, so the followers of one broker's partitions spread too.
/// When every broker has a rack, the brokers are first ordered rack by rack alternately
/// and followers on racks the partition has no replica on yet come first, so replicas
/// land on as many racks as there are (Kafka's rack-aware placement).
pub(crate) fn assign_replicas(
    brokers: &[(i32, Option<String>)],
    partitions: i32,
    replication_factor: usize,
    seed: u64,
) -> Vec<Vec<i32>> {
    // Bounded: the caller checked `partitions` against max.partitions.per.request.
    let mut result = Vec::with_capacity(usize::try_from(partitions).unwrap_or(0));
    place_replicas(brokers, partitions, replication_factor, seed, |replicas| result.push(replicas.to_vec()));
    result
}

/// The placement of partitions `first..first + count` of a topic laid out by
/// [`assign_replicas`] (CreatePartitions continues the same pattern).
fn place_replicas_from(
    brokers: &[(i32, Option<String>)],
    first: usize,
    count: usize,
    replication_factor: usize,
    seed: u64,
) -> Vec<Vec<i32>> {
    let mut result = Vec::with_capacity(count);
    place_partitions(brokers, first..first + count, replication_factor, seed, |replicas| result.push(replicas.to_vec()));
    result
}

/// [`assign_replicas`], handing each partition's replicas to `each` in partition order
/// instead of collecting them (the per-broker limit counts a placement without building it).
fn place_replicas(
    brokers: &[(i32, Option<String>)],
    partitions: i32,
    replication_factor: usize,
    seed: u64,
    each: impl FnMut(&[i32]),
) {
    place_partitions(brokers, 0..usize::try_from(partitions).unwrap_or(0), replication_factor, seed, each)
}

/// The placement of the partitions numbered `range`.
fn place_partitions(
    brokers: &[(i32, Option<String>)],
    range: std::ops::Range<usize>,
    replication_factor: usize,
    seed: u64,
    mut each: impl FnMut(&[i32]),
) {
    let n = brokers.len();
    assert!(n > 0 && (1..=n).contains(&replication_factor), "invariant: checked by the caller");
    let rack_aware = brokers.iter().all(|(_, rack)| rack.is_some());
    let ordered: Vec<(i32, Option<String>)> = if rack_aware { rack_alternated(brokers) } else { brokers.to_vec() };
    let start = (seed % n as u64) as usize;
    let base_shift = ((seed >> 32) % n as u64) as usize;
    let mut others: Vec<&(i32, Option<String>)> = Vec::with_capacity(n);
    let mut replicas: Vec<i32> = Vec::with_capacity(replication_factor);
    for p in range {
        // The follower shift grows every `n` partitions.
        let shift = base_shift + p / n;
        let first = (p + start) % n;
        // Every other broker once, in Kafka's follower order.
        others.clear();
        others.extend((0..n - 1).map(|k| &ordered[(first + 1 + (shift + k) % (n - 1)) % n]));
        replicas.clear();
        replicas.push(ordered[first].0);
        if rack_aware {
            let mut racks = BTreeSet::from([&ordered[first].1]);
            for (id, rack) in &others {
                if replicas.len() < replication_factor && racks.insert(rack) {
                    replicas.push(*id);
                }
            }
        }
        for (id, _) in &others {
            if replicas.len() < replication_factor && !replicas.contains(id) {
                replicas.push(*id);
            }
        }
        each(&replicas);
    }
}

/// Brokers reordered so that consecutive brokers are on different racks (rack a's
/// first, rack b's first, ..., rack a's second, ...).
fn rack_alternated(brokers: &[(i32, Option<String>)]) -> Vec<(i32, Option<String>)> {
    let mut by_rack: BTreeMap<&Option<String>, Vec<i32>> = BTreeMap::new();
    for (id, rack) in brokers {
        by_rack.entry(rack).or_default().push(*id);
    }
    let longest = by_rack.values().map(Vec::len).max().unwrap_or(0);
    let mut ordered = Vec::with_capacity(brokers.len());
    for i in 0..longest {
        for (rack, ids) in &by_rack {
            if let Some(id) = ids.get(i) {
                ordered.push((*id, (*rack).clone()));
            }
        }
    }
    ordered
}

/// A random number for the placement's starting point (no `rand` dependency: the std
/// hasher is randomly keyed per process and per instance).
fn random_u64() -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    hasher.finish()
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

    fn brokers(racks: &[Option<&str>]) -> Vec<(i32, Option<String>)> {
        racks.iter().enumerate().map(|(i, r)| (i as i32 + 1, r.map(str::to_owned))).collect()
    }

    #[test]
    fn placement_spreads_leaders_and_replicas() {
        for seed in [0, 1, 7, u64::MAX, 0x1234_5678_9abc_def0] {
            let assignment = assign_replicas(&brokers(&[None, None, None]), 6, 3, seed);
            assert_eq!(assignment.len(), 6);
            let mut leaders = BTreeMap::new();
            for replicas in &assignment {
                assert_eq!(replicas.iter().collect::<BTreeSet<_>>().len(), 3, "{assignment:?}");
                *leaders.entry(replicas[0]).or_insert(0) += 1;
            }
            assert_eq!(leaders.values().collect::<Vec<_>>(), [&2, &2, &2], "{assignment:?}");
            let assignment = assign_replicas(&brokers(&[None, None, None, None]), 8, 2, seed);
            let mut count = BTreeMap::new();
            for id in assignment.iter().flatten() {
                *count.entry(*id).or_insert(0) += 1;
            }
            assert_eq!(count.values().collect::<Vec<_>>(), [&4, &4, &4, &4], "{assignment:?}");
        }
        assert_eq!(assign_replicas(&brokers(&[None]), 3, 1, 99), vec![vec![1], vec![1], vec![1]]);
    }

    #[test]
    fn placement_with_racks_uses_every_rack() {
        let racks = brokers(&[Some("a"), Some("a"), Some("b"), Some("b"), Some("c"), Some("c")]);
        for seed in 0..20u64 {
            for replicas in assign_replicas(&racks, 12, 3, seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)) {
                let used: BTreeSet<_> = replicas.iter().map(|id| &racks[(*id - 1) as usize].1).collect();
                assert_eq!(used.len(), 3, "{replicas:?} on racks {used:?}");
            }
        }
        // Fewer racks than replicas: every rack, then any broker.
        let two_racks = brokers(&[Some("a"), Some("a"), Some("b")]);
        for replicas in assign_replicas(&two_racks, 6, 3, 5) {
            assert_eq!(replicas.iter().collect::<BTreeSet<_>>().len(), 3);
        }
    }

    #[test]
    fn manual_assignments_are_checked() {
        let live = brokers(&[None, None]);
        check_manual_assignment(&[vec![1, 2], vec![2, 1]], &live).unwrap();
        for bad in [vec![], vec![vec![1, 2], vec![1]], vec![vec![1, 1]], vec![vec![1, 3]], vec![vec![]]] {
            assert!(matches!(check_manual_assignment(&bad, &live), Err(TopicError::InvalidReplicaAssignment(_))), "{bad:?}");
        }
    }

    #[test]
    fn replication_settings_are_topic_configs() {
        let settings = TopicSettings { log: LogConfig::default(), unclean_leader_election: false };
        let overrides = BTreeMap::from([
            ("min.insync.replicas".to_owned(), "2".to_owned()),
            ("unclean.leader.election.enable".to_owned(), "true".to_owned()),
            ("retention.ms".to_owned(), "1000".to_owned()),
        ]);
        let topic = Topic::new("t", Uuid::nil(), vec![vec![1, 2]], overrides, &settings).unwrap();
        assert_eq!((topic.config.min_insync_replicas, topic.unclean_leader_election), (2, true));
        let overrides = BTreeMap::from([(LEADER_REPLICAS.to_owned(), "0:1, 0:2".to_owned())]);
        let topic = Topic::new("t", Uuid::nil(), vec![vec![1, 2]], overrides, &settings).unwrap();
        assert!(topic.throttles.leader.covers(0, 2) && !topic.throttles.follower.covers(0, 2));
        for (key, value) in [
            ("min.insync.replicas", "0"),
            ("unclean.leader.election.enable", "maybe"),
            ("nope", "1"),
            (LEADER_REPLICAS, "0-1"),
            (FOLLOWER_REPLICAS, "*,0:1"),
        ] {
            let overrides = BTreeMap::from([(key.to_owned(), value.to_owned())]);
            assert!(matches!(
                Topic::new("t", Uuid::nil(), vec![vec![1]], overrides, &settings),
                Err(TopicError::InvalidConfig(_))
            ));
        }
    }
}
