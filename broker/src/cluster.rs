//! The cluster metadata view: what every broker knows about the cluster, kept current by
//! watches on the metadata store, and the hand-off of partition states to the
//! [`ReplicaManager`].
//!
//! The store is the truth (docs/architecture.md): brokers learn leadership from the
//! partition state znodes, never from controller RPCs. This view mirrors
//! - `/brokers/ids` (children, and each registration): the live brokers;
//! - `/controller`: who the controller is (Metadata answers name it);
//! - `/brokers/topics` (children), each `/brokers/topics/<t>` (the assignment) and the
//!   topic's `/config/topics/<t>` overrides, read when the assignment is;
//! - each `/brokers/topics/<t>/partitions/<p>/state`, with its znode version.
//!
//! One task per watched node: it reads the node and leaves a one-shot watch, applies what
//! it read, waits for the watch, and reads again. Any event, including
//! [`WatchEvent::SessionLost`], leads to a fresh read, so after a session loss every
//! task re-reads its node on the new session (and an error is retried with a backoff):
//! the view never stays on the dead session's data.
//!
//! Partition tasks are the only callers of [`ReplicaManager::apply`] and
//! [`ReplicaManager::remove`] for their partition, so the calls for one partition come in
//! order. A partition task opens the partition's log (with the topic's config) before
//! the first `apply` and deletes it after `remove`: a broker has logs exactly for the
//! partitions assigned to it. Logs found at start that the metadata assigns elsewhere
//! or does not know are moved aside, not deleted (see
//! `ClusterView::set_aside_stray_logs`).
//!
//! [`WatchEvent::SessionLost`]: fjord_coord::WatchEvent::SessionLost

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use fjord_coord::registry::{read_json, BrokerRegistration, PartitionState, TopicAssignment};
use fjord_coord::{paths, Store};
use fjord_log::partition_metadata::{self, Decision};
use fjord_log::LogDirs;
use fjord_record::TopicPartition;
use serde::Deserialize;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::replication::ReplicaManager;
use crate::topics::{Topic, TopicSettings};

/// Pause before a watch loop retries after a store error.
const RETRY_BACKOFF: Duration = Duration::from_millis(250);
/// The retry pause of a reader while the store cannot be reached at all.
const UNREACHABLE_BACKOFF: Duration = Duration::from_secs(1);

/// A partition's state as last read, with the znode version (the compare-and-set token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StateVersion {
    pub(crate) state: PartitionState,
    pub(crate) version: i32,
}

/// What the view holds; read through [`ClusterView::snapshot`]-style accessors.
#[derive(Debug, Default)]
struct ViewState {
    brokers: BTreeMap<i32, BrokerRegistration>,
    controller: Option<i32>,
    topics: BTreeMap<String, Arc<Topic>>,
    /// Every partition whose state node has been read at least once; `None` while the
    /// node is missing (a topic being created or deleted).
    partitions: HashMap<TopicPartition, Option<StateVersion>>,
    /// Every broker's unhealthy replicas as published under `/brokers/offline_replicas`.
    unhealthy: crate::replica_health::Published,
}

/// The `/controller` document (Kafka's layout).
#[derive(Debug, Deserialize)]
struct ControllerDocument {
    brokerid: i32,
}

/// The metadata view of one broker.
pub(crate) struct ClusterView {
    store: Store,
    broker_id: i32,
    settings: TopicSettings,
    logs: Arc<LogDirs>,
    replicas: Arc<ReplicaManager>,
    state: RwLock<ViewState>,
    /// Bumped after every change, so waiters ([`ClusterView::wait_for`]) need no polling.
    changed: watch::Sender<u64>,
}

impl std::fmt::Debug for ClusterView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterView").field("broker_id", &self.broker_id).finish_non_exhaustive()
    }
}

impl ClusterView {
    pub(crate) fn new(store: Store, settings: TopicSettings, logs: Arc<LogDirs>, replicas: Arc<ReplicaManager>) -> Arc<Self> {
        Arc::new(Self {
            store,
            broker_id: replicas.broker_id(),
            settings,
            logs,
            replicas,
            state: RwLock::new(ViewState::default()),
            changed: watch::Sender::new(0),
        })
    }

    /// Starts the watch tasks on `tracker` (they stop at `shutdown`) and waits until
    /// every topic present now is loaded (its partitions applied), as a single broker
    /// used to before accepting connections.
    pub(crate) async fn start(self: &Arc<Self>, tracker: &TaskTracker, shutdown: &CancellationToken) -> crate::Result<()> {
        for parent in [paths::BROKER_IDS, paths::TOPICS, paths::TOPIC_CONFIGS, paths::OFFLINE_REPLICAS] {
            ensure_path(&*self.store, parent).await?;
        }
        let initial = self.store.children(paths::TOPICS).await?;
        tracker.spawn(self.clone().watch_brokers(shutdown.clone()));
        tracker.spawn(self.clone().watch_controller(shutdown.clone()));
        tracker.spawn(self.clone().watch_unhealthy_replicas(shutdown.clone()));
        tracker.spawn(self.clone().watch_topics(shutdown.clone()));
        let loaded = self.wait_for(Duration::from_secs(60), |view| initial.iter().all(|name| view.is_loaded(name))).await;
        if loaded {
            self.set_aside_stray_logs(&initial);
        } else {
            // A topic deleted meanwhile is never loaded; anything else is a slow store.
            tracing::warn!("not every topic was loaded within 60 s of start; serving anyway");
        }
        Ok(())
    }

    /// Moves aside (never deletes) the logs in the log dir that belong to no replica of
    /// this broker by the metadata: their topic was deleted or the partition reassigned
    /// away while the broker was down, or the metadata lost them. Nothing tells these
    /// apart, and only the last loses data, so each is renamed
    /// `<topic>-<partition>-orphan-<unix ms>` and reported; it is deleted on an
    /// operator's command (`fjord logs orphans --delete`). A topic that is listed but
    /// not in the view (unreadable) keeps its logs where they are.
    ///
    /// Logs that could not be opened are among them (moved aside as they are): else they
    /// would stay listed offline, and a topic created again under the name would meet
    /// the same directory.
    fn set_aside_stray_logs(&self, listed: &[String]) {
        for tp in self.logs.partitions().into_iter().chain(self.logs.offline_partitions()) {
            let (stray, why) = match self.topic(&tp.topic) {
                Some(topic) => (
                    !topic.partition_replicas(tp.partition).is_some_and(|r| r.contains(&self.broker_id)),
                    "the metadata names other replicas for it",
                ),
                None => (!listed.contains(&tp.topic), "the metadata has no such topic"),
            };
            if !stray {
                continue;
            }
            let now_ms = fjord_record::now_ms() as u64;
            match self.logs.move_aside(&tp, now_ms) {
                Ok(Some(moved)) => tracing::warn!(
                    partition = %tp,
                    moved_to = %moved.display(),
                    reason = why,
                    "moved aside a log this broker holds no replica of, keeping its data; `fjord logs orphans --delete` deletes it"
                ),
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(partition = %tp, error = %e, "moving aside a log this broker holds no replica of failed")
                }
            }
        }
    }

    /// The log manager holding this broker's replicas' logs.
    pub(crate) fn logs(&self) -> &Arc<LogDirs> {
        &self.logs
    }

    /// This broker's id.
    pub(crate) fn broker_id(&self) -> i32 {
        self.broker_id
    }

    /// The topic, if it exists (its assignment has been read).
    pub(crate) fn topic(&self, name: &str) -> Option<Arc<Topic>> {
        self.read().topics.get(name).cloned()
    }

    /// The topic of id `id` (KIP-516); never a topic without an id (nil).
    pub(crate) fn topic_by_id(&self, id: &uuid::Uuid) -> Option<Arc<Topic>> {
        if id.is_nil() {
            return None;
        }
        // A scan: ids are looked up by Fetch v13+ and DeleteTopics v6 only, and comparing
        // 16 bytes per topic costs less than keeping a second index in step.
        self.read().topics.values().find(|t| t.topic_id == *id).cloned()
    }

    /// Every topic, sorted by name.
    pub(crate) fn topics(&self) -> Vec<Arc<Topic>> {
        self.read().topics.values().cloned().collect()
    }

    /// Replaces the topic's entry (same assignment, new config: AlterConfigs).
    pub(crate) fn replace_topic(&self, topic: Arc<Topic>) {
        self.replicas.throttles().set_topic(&topic.name, Some(&topic.throttles));
        self.update(|v| {
            if let Some(entry) = v.topics.get_mut(&topic.name) {
                *entry = topic;
            }
        });
    }

    /// The live brokers, sorted by id.
    pub(crate) fn brokers(&self) -> Vec<(i32, BrokerRegistration)> {
        self.read().brokers.iter().map(|(id, b)| (*id, b.clone())).collect()
    }

    /// The controller's broker id, if there is one.
    pub(crate) fn controller(&self) -> Option<i32> {
        self.read().controller
    }

    /// The brokers that published their replica of the partition as offline or damaged
    /// (`crate::replica_health`), this one included.
    pub(crate) fn unhealthy_replicas(&self, tp: &TopicPartition) -> BTreeSet<i32> {
        let key = (tp.topic.clone(), tp.partition);
        self.read().unhealthy.get(&key).map(|r| r.unhealthy.clone()).unwrap_or_default()
    }

    /// The partition's state as last read.
    pub(crate) fn partition_state(&self, tp: &TopicPartition) -> Option<StateVersion> {
        self.read().partitions.get(tp).cloned().flatten()
    }

    /// Partitions whose state names `broker` leader.
    pub(crate) fn led_by(&self, broker: i32) -> Vec<TopicPartition> {
        let view = self.read();
        let mut led: Vec<_> = view
            .partitions
            .iter()
            .filter(|(_, s)| s.as_ref().is_some_and(|s| s.state.leader == broker))
            .map(|(tp, _)| tp.clone())
            .collect();
        led.sort();
        led
    }

    /// Offline partitions (leader -1) whose ISR names `broker`: the controller makes it
    /// their leader as soon as it sees `broker` live.
    pub(crate) fn owed_to(&self, broker: i32) -> Vec<TopicPartition> {
        let view = self.read();
        let mut owed: Vec<_> = view
            .partitions
            .iter()
            .filter(|(_, s)| s.as_ref().is_some_and(|s| s.state.leader == -1 && s.state.isr.contains(&broker)))
            .map(|(tp, _)| tp.clone())
            .collect();
        owed.sort();
        owed
    }

    /// Waits (without polling: woken by every change) until `done` holds for the view,
    /// at most `timeout`; says whether it held.
    pub(crate) async fn wait_for(&self, timeout: Duration, done: impl Fn(&ClusterView) -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        let mut changes = self.changed.subscribe();
        loop {
            if done(self) {
                return true;
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return done(self),
            }
        }
    }

    /// Whether the topic's assignment and every partition state node have been read.
    pub(crate) fn is_loaded(&self, name: &str) -> bool {
        let view = self.read();
        view.topics.get(name).is_some_and(|topic| {
            (0..topic.partition_count()).all(|p| view.partitions.contains_key(&TopicPartition::new(name, p)))
        })
    }

    /// Whether the topic is loaded and every partition has a state (a create is complete).
    pub(crate) fn is_ready(&self, name: &str) -> bool {
        let view = self.read();
        view.topics.get(name).is_some_and(|topic| {
            (0..topic.partition_count()).all(|p| view.partitions.get(&TopicPartition::new(name, p)).is_some_and(Option::is_some))
        })
    }

    /// Whether the topic is in the view (its assignment has been read).
    pub(crate) fn topic_exists(&self, name: &str) -> bool {
        self.read().topics.contains_key(name)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, ViewState> {
        self.state.read().expect("invariant: view lock is never poisoned")
    }

    fn update(&self, change: impl FnOnce(&mut ViewState)) {
        change(&mut self.state.write().expect("invariant: view lock is never poisoned"));
        self.changed.send_modify(|generation| *generation += 1);
    }

    /// `/brokers/ids`: the live brokers and where they listen.
    async fn watch_brokers(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            let read = async {
                let (ids, watch) = self.store.watch_children(paths::BROKER_IDS).await?;
                let mut brokers = BTreeMap::new();
                for id in ids {
                    let Ok(broker_id) = id.parse::<i32>() else { continue };
                    // Gone since listed: the next child event re-reads.
                    if let Some((registration, _)) =
                        read_json::<BrokerRegistration>(&*self.store, &paths::broker(broker_id)).await?
                    {
                        brokers.insert(broker_id, registration);
                    }
                }
                Ok::<_, fjord_coord::Error>((brokers, watch))
            };
            match read.await {
                Ok((brokers, watch)) => {
                    tracing::debug!(brokers = ?brokers.keys().collect::<Vec<_>>(), "live brokers");
                    self.update(|v| v.brokers = brokers);
                    tokio::select! {
                        _ = watch => {}
                        () = shutdown.cancelled() => return,
                    }
                }
                Err(e) => {
                    if !backoff("/brokers/ids", &e, &shutdown).await {
                        return;
                    }
                }
            }
        }
    }

    /// `/controller`: who the controller is.
    async fn watch_controller(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            match self.store.watch_data(paths::CONTROLLER).await {
                Ok((data, watch)) => {
                    let controller =
                        data.and_then(|(bytes, _)| serde_json::from_slice::<ControllerDocument>(&bytes).ok()).map(|d| d.brokerid);
                    self.update(|v| v.controller = controller);
                    tokio::select! {
                        _ = watch => {}
                        () = shutdown.cancelled() => return,
                    }
                }
                Err(e) => {
                    if !backoff(paths::CONTROLLER, &e, &shutdown).await {
                        return;
                    }
                }
            }
        }
    }

    /// `/brokers/offline_replicas`: every broker's unhealthy replicas, for Metadata's
    /// `offline_replicas` (Kafka's brokers learn them from the controller's
    /// UpdateMetadata; Fjord's read what each broker publishes, as the controller does).
    /// Each broker replaces its node on every change (a delete and a create), so a
    /// children watch sees every change.
    async fn watch_unhealthy_replicas(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            let read = async {
                let (_, watch) = self.store.watch_children(paths::OFFLINE_REPLICAS).await?;
                let published = crate::replica_health::read_all(&*self.store).await?;
                Ok::<_, fjord_coord::Error>((published, watch))
            };
            match read.await {
                Ok((published, watch)) => {
                    self.update(|v| v.unhealthy = published);
                    tokio::select! {
                        _ = watch => {}
                        () = shutdown.cancelled() => return,
                    }
                }
                Err(e) => {
                    if !backoff(paths::OFFLINE_REPLICAS, &e, &shutdown).await {
                        return;
                    }
                }
            }
        }
    }

    /// `/brokers/topics`: one task per topic, started when the topic appears and
    /// cancelled (and awaited: it deletes the topic's logs) when it goes, before any new
    /// topic is started. A topic deleted and created again between two listings is its
    /// task's to notice ([`ClusterView::watch_topic`]).
    async fn watch_topics(self: Arc<Self>, shutdown: CancellationToken) {
        let mut running: HashMap<String, (CancellationToken, tokio::task::JoinHandle<()>)> = HashMap::new();
        loop {
            match self.store.watch_children(paths::TOPICS).await {
                Ok((names, watch)) => {
                    let gone: Vec<String> = running.keys().filter(|n| !names.contains(n)).cloned().collect();
                    for name in gone {
                        let (token, task) = running.remove(&name).expect("invariant: listed from the map");
                        token.cancel();
                        let _ = task.await; // quick: it removes its partitions and stops
                    }
                    for name in names {
                        if let Some((_, task)) = running.get(&name) {
                            if !task.is_finished() {
                                continue;
                            }
                        }
                        let token = shutdown.child_token();
                        let task = tokio::spawn(self.clone().watch_topic(name.clone(), token.clone(), shutdown.clone()));
                        running.insert(name, (token, task));
                    }
                    tokio::select! {
                        _ = watch => {}
                        () = shutdown.cancelled() => break,
                    }
                }
                Err(e) => {
                    if !backoff(paths::TOPICS, &e, &shutdown).await {
                        break;
                    }
                }
            }
        }
        for (_, (token, task)) in running {
            token.cancel();
            let _ = task.await;
        }
    }

    /// `/brokers/topics/<t>`: the assignment (and the config overrides with it), one
    /// task per partition. Lives while the topic is listed (until `stop`): when the
    /// assignment node is deleted, the replicas and their logs go at once, and a topic
    /// created again under the same name starts afresh.
    async fn watch_topic(self: Arc<Self>, name: String, stop: CancellationToken, shutdown: CancellationToken) {
        let mut partitions: BTreeMap<i32, (watch::Sender<Vec<i32>>, CancellationToken)> = BTreeMap::new();
        let mut tasks = JoinSet::new();
        // Creation time of the assignment node read last: tells a new topic of the same
        // name from an update of the old one.
        let mut incarnation: Option<i64> = None;
        loop {
            let read = async {
                let (data, watch) = self.store.watch_data(&paths::topic(&name)).await?;
                let Some((bytes, stat)) = data else { return Ok(Some((None, watch))) };
                let assignment: TopicAssignment = serde_json::from_slice(&bytes)
                    .map_err(|source| fjord_coord::Error::Codec { path: paths::topic(&name), source })?;
                // Stored before topic ids: give it one (once, whoever wins the
                // compare-and-set) and read it again. The topic is never loaded without
                // an id: its replicas record the id they are opened with in
                // `partition.metadata`, which is what keeps a stale replica from being
                // served after the topic is deleted and created again.
                if assignment.topic_id.is_none() {
                    if let Some(id) = crate::topic_id::assign_missing(&*self.store, &name, &assignment, stat.version).await? {
                        tracing::info!(topic = %name, topic_id = %crate::topic_id::encode(id), "assigned a topic id to a topic stored without one");
                    }
                    return Ok(None);
                }
                let overrides = read_overrides(&*self.store, &name).await?;
                Ok::<_, fjord_coord::Error>(Some((Some((assignment, overrides, stat.ctime_ms)), watch)))
            };
            match read.await.transpose() {
                // Just given an id (by this broker or another): read it again.
                None => continue,
                Some(Ok((None, watch))) => {
                    incarnation = None;
                    self.drop_partitions(&name, &mut partitions, &mut tasks, true).await;
                    tokio::select! {
                        _ = watch => {}
                        () = stop.cancelled() => break,
                    }
                }
                Some(Ok((Some((assignment, overrides, created)), watch))) => {
                    // Deleted and created again between two reads: the old replicas
                    // (and their data) must not carry over into the new topic.
                    if incarnation.is_some_and(|seen| seen != created) {
                        self.drop_partitions(&name, &mut partitions, &mut tasks, true).await;
                    }
                    incarnation = Some(created);
                    let topic = match Topic::from_assignment(&name, &assignment, overrides, &self.settings) {
                        Ok(topic) => Arc::new(topic),
                        Err(e) => {
                            // Written by something else than a broker; keep the last good view.
                            tracing::error!(topic = %name, error = %e, "topic in the store is invalid; ignored");
                            tokio::select! {
                                _ = watch => continue,
                                () = stop.cancelled() => break,
                            }
                        }
                    };
                    self.replicas.throttles().set_topic(&name, Some(&topic.throttles));
                    self.update(|v| {
                        v.topics.insert(name.clone(), topic.clone());
                    });
                    for (p, replicas) in topic.replicas.iter().enumerate() {
                        let p = p as i32;
                        match partitions.get(&p) {
                            Some((sender, _)) => {
                                sender.send_if_modified(|current| {
                                    let modified = current != replicas;
                                    *current = replicas.clone();
                                    modified
                                });
                            }
                            None => {
                                let (sender, receiver) = watch::channel(replicas.clone());
                                let token = stop.child_token();
                                let tp = TopicPartition::new(&name, p);
                                tasks.spawn(self.clone().watch_partition(tp, topic.clone(), receiver, token.clone()));
                                partitions.insert(p, (sender, token));
                            }
                        }
                    }
                    tokio::select! {
                        _ = watch => {}
                        () = stop.cancelled() => break,
                    }
                }
                Some(Err(e)) => {
                    if !backoff(&paths::topic(&name), &e, &stop).await {
                        break;
                    }
                }
            }
        }
        // No longer listed (deleted), or the broker is stopping (its logs stay).
        self.drop_partitions(&name, &mut partitions, &mut tasks, !shutdown.is_cancelled()).await;
    }

    /// Stops the topic's partition tasks, deletes the logs of the replicas they held when
    /// the topic was `deleted`, and removes the topic from the view.
    async fn drop_partitions(
        &self,
        name: &str,
        partitions: &mut BTreeMap<i32, (watch::Sender<Vec<i32>>, CancellationToken)>,
        tasks: &mut JoinSet<(TopicPartition, bool)>,
        deleted: bool,
    ) {
        for (_, token) in partitions.values() {
            token.cancel();
        }
        partitions.clear();
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok((tp, true)) if deleted => {
                    if let Err(e) = self.logs.delete(&tp) {
                        tracing::error!(partition = %tp, error = %e, "deleting the log of a deleted topic failed");
                    }
                }
                Ok((tp, false)) if deleted => self.set_aside_offline(&tp, "its topic was deleted"),
                _ => {}
            }
        }
        self.replicas.throttles().set_topic(name, None);
        self.update(|v| {
            v.topics.remove(name);
            v.partitions.retain(|tp, _| tp.topic != name);
        });
    }

    /// `/brokers/topics/<t>/partitions/<p>/state`: records it in the view and hands it to
    /// the replica manager when this broker is a replica. On `stop` (topic deleted or
    /// broker stopping) the replica is removed; returns whether there was one (the topic
    /// task deletes its log if the topic is gone).
    async fn watch_partition(
        self: Arc<Self>,
        tp: TopicPartition,
        topic: Arc<Topic>,
        mut replicas: watch::Receiver<Vec<i32>>,
        stop: CancellationToken,
    ) -> (TopicPartition, bool) {
        let path = paths::partition_state(&tp.topic, tp.partition);
        let mut applied: Option<(Vec<i32>, StateVersion)> = None;
        loop {
            let read = async {
                let (data, watch) = self.store.watch_data(&path).await?;
                let state = match data {
                    None => None,
                    Some((bytes, stat)) => Some(StateVersion {
                        state: serde_json::from_slice(&bytes)
                            .map_err(|source| fjord_coord::Error::Codec { path: path.clone(), source })?,
                        version: stat.version,
                    }),
                };
                Ok::<_, fjord_coord::Error>((state, watch))
            };
            match read.await {
                Ok((state, watch)) => {
                    let current = replicas.borrow_and_update().clone();
                    applied = self.reconcile_replica(&tp, &topic, &current, state.as_ref(), applied);
                    self.update(|v| {
                        v.partitions.insert(tp.clone(), state);
                    });
                    tokio::select! {
                        _ = watch => {}
                        _ = replicas.changed() => {}
                        () = stop.cancelled() => break,
                    }
                }
                Err(e) => {
                    if !backoff(&path, &e, &stop).await {
                        break;
                    }
                }
            }
        }
        if applied.is_some() {
            self.replicas.remove(&tp);
        }
        (tp, applied.is_some())
    }

    /// Brings the local replica in line with (replicas, state): opens the log and
    /// applies a new state when this broker is a replica, removes it when it no longer
    /// is. Returns what is applied now.
    fn reconcile_replica(
        &self,
        tp: &TopicPartition,
        topic: &Topic,
        replicas: &[i32],
        state: Option<&StateVersion>,
        applied: Option<(Vec<i32>, StateVersion)>,
    ) -> Option<(Vec<i32>, StateVersion)> {
        let assigned_here = replicas.contains(&self.broker_id);
        match state {
            Some(state) if assigned_here => {
                if applied.as_ref().is_some_and(|(r, s)| r == replicas && s == state) {
                    return applied;
                }
                if applied.is_none() {
                    let was_offline = self.logs.is_offline(tp);
                    let decision = self.check_topic_id(tp, topic)?;
                    match self.logs.get_or_create(tp, topic.config) {
                        Ok(log) => {
                            if matches!(decision, Some(Decision::Adopt | Decision::Replace { .. })) {
                                if let Err(e) = self.logs.write_topic_id(tp, topic.topic_id.as_bytes()) {
                                    // Served without it, a later delete and re-create of the
                                    // topic while this broker is down could not be told apart.
                                    tracing::error!(partition = %tp, error = %e, "recording the topic id in partition.metadata failed; the replica is not served");
                                    return None;
                                }
                            }
                            self.replicas.add_partition(tp, log);
                            if was_offline {
                                tracing::info!(partition = %tp, "the log of an assigned replica opens again: no longer offline");
                                self.replicas.health_changed().notify_one();
                            }
                        }
                        Err(e) => {
                            // Not served (NOT_LEADER_OR_FOLLOWER) until its next state change
                            // or a restart retries; the other partitions go on.
                            if crate::limits::out_of_descriptors(&e) {
                                tracing::error!(
                                    partition = %tp, error = %e,
                                    "opening the log of an assigned replica failed: out of file descriptors; \
                                     raise the open-file limit or lower max.partitions.per.broker"
                                );
                            } else {
                                tracing::error!(partition = %tp, error = %e, "opening the log of an assigned replica failed");
                            }
                            return None;
                        }
                    }
                }
                self.replicas.apply(tp, replicas, &state.state, state.version);
                Some((replicas.to_vec(), state.clone()))
            }
            // Not written yet (topic being created) or being deleted: wait.
            None if assigned_here => applied,
            _ => {
                if applied.is_some() {
                    // Reassigned away from this broker.
                    self.replicas.remove(tp);
                    if let Err(e) = self.logs.delete(tp) {
                        tracing::error!(partition = %tp, error = %e, "deleting the log of a removed replica failed");
                    }
                } else if state.is_some() {
                    self.set_aside_offline(tp, "the partition was reassigned away from this broker");
                }
                None
            }
        }
    }

    /// Compares the replica's `partition.metadata` with the topic's id (KIP-516) before
    /// the broker starts hosting it ([`partition_metadata::decide`]). A stale log (another
    /// id: the topic was deleted and created again while this broker was down) is removed
    /// as a deleted topic's is, so the replica opens empty and fetches from the leader; a
    /// damaged file takes the partition offline, deleting nothing. Returns the decision
    /// (`None` inside for a topic without an id), or `None` when the replica must not be
    /// served.
    fn check_topic_id(&self, tp: &TopicPartition, topic: &Topic) -> Option<Option<Decision>> {
        if topic.topic_id.is_nil() {
            return Some(None);
        }
        let on_disk = self.logs.topic_id(tp);
        let decision = partition_metadata::decide(topic.topic_id.as_bytes(), &on_disk);
        match &decision {
            Decision::Keep | Decision::Adopt => {}
            Decision::Offline { reason } => {
                tracing::error!(partition = %tp, reason = %reason, "the replica's partition.metadata is damaged: it is not served and nothing is deleted");
                self.logs.take_offline(tp, reason.clone());
                self.replicas.health_changed().notify_one();
                return None;
            }
            Decision::Replace { stale } => {
                let stale = crate::topic_id::encode(uuid::Uuid::from_bytes(*stale));
                let current = crate::topic_id::encode(topic.topic_id);
                if self.logs.get(tp).is_some() {
                    // Moved aside, not deleted: the ids differ also when the store lost its
                    // ids (restored from a backup taken before them: every topic is given a
                    // new one), and data is never deleted on the metadata's word alone.
                    match self.logs.move_aside(tp, fjord_record::now_ms() as u64) {
                        Ok(moved) => tracing::warn!(
                            partition = %tp, stale_topic_id = %stale, topic_id = %current, moved_to = ?moved,
                            "the local log names another topic id (a deleted topic of the same name): moved aside, kept, never served; the replica starts empty and fetches from the leader"
                        ),
                        Err(e) => {
                            tracing::error!(partition = %tp, error = %e, "moving aside the log of another topic id failed; the replica is not served");
                            return None;
                        }
                    }
                } else if self.logs.is_offline(tp) {
                    // Unopenable: moved aside as it is, as a deleted topic's unopenable log is.
                    self.set_aside_offline(tp, "its log belongs to a deleted topic of the same name");
                    if self.logs.is_offline(tp) {
                        return None;
                    }
                } else {
                    // Every partition directory is loaded (or listed offline) at start, so
                    // this is a directory written behind the broker's back: leave it.
                    tracing::error!(partition = %tp, stale_topic_id = %stale, "a log directory of another topic id that the log manager does not hold; the replica is not served");
                    return None;
                }
            }
        }
        Some(Some(decision))
    }

    /// A replica this broker no longer holds whose log could not be opened: its
    /// directory is moved aside as it is (never deleted, as nothing could read it) and it
    /// leaves the offline listing at once. No-op for any other partition.
    fn set_aside_offline(&self, tp: &TopicPartition, why: &str) {
        if !self.logs.is_offline(tp) {
            return;
        }
        match self.logs.move_aside(tp, fjord_record::now_ms() as u64) {
            Ok(moved) => {
                tracing::warn!(
                    partition = %tp,
                    moved_to = ?moved,
                    reason = why,
                    "an unopenable log this broker no longer holds a replica of is moved aside, keeping its data, and no longer offline"
                );
                self.replicas.health_changed().notify_one();
            }
            Err(e) => tracing::error!(partition = %tp, error = %e, "moving aside an unopenable log failed"),
        }
    }
}

/// `/config/topics/<t>`'s overrides (Kafka's `{version, config}` document).
pub(crate) async fn read_overrides(
    store: &dyn fjord_coord::MetadataStore,
    name: &str,
) -> fjord_coord::Result<BTreeMap<String, String>> {
    #[derive(Deserialize)]
    struct Document {
        #[serde(default)]
        config: BTreeMap<String, String>,
    }
    Ok(read_json::<Document>(store, &paths::topic_config(name)).await?.map(|(d, _)| d.config).unwrap_or_default())
}

/// Creates a persistent, empty node (and its parents) unless it exists.
async fn ensure_path(store: &dyn fjord_coord::MetadataStore, path: &str) -> fjord_coord::Result<()> {
    match fjord_coord::create_all(store, path, &[], fjord_coord::CreateMode::Persistent).await {
        Ok(_) | Err(fjord_coord::Error::NodeExists { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Logs a failed read and waits before the retry; false when `stop` fired meanwhile.
/// While the store cannot be reached at all (an outage the store reports itself) each of
/// these readers, one per partition, retries quietly and less often: 400 partitions
/// logged ~1,600 lines a second without ZooKeeper.
async fn backoff(path: &str, error: &fjord_coord::Error, stop: &CancellationToken) -> bool {
    let pause = if error.is_store_unreachable() {
        tracing::debug!(path, %error, "reading the metadata store failed; retrying");
        UNREACHABLE_BACKOFF
    } else {
        tracing::warn!(path, %error, "reading the metadata store failed; retrying");
        RETRY_BACKOFF
    };
    tokio::select! {
        () = tokio::time::sleep(pause) => true,
        () = stop.cancelled() => false,
    }
}
