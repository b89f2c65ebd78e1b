//! The group consumer: members of a consumer group share the partitions of the
//! topics they subscribe to, and the group's committed offsets say where each
//! partition resumes (the paper's §3.3, with Kafka's coordinator-based protocol).
//!
//! A member finds the group's coordinator (FindCoordinator), joins (JoinGroup; a new
//! member is first handed an id with MEMBER_ID_REQUIRED and joins again), and the
//! leader the coordinator picked computes the assignment from every member's
//! `ConsumerProtocolSubscription` with the agreed [`crate::assignor`]; SyncGroup hands
//! each member its `ConsumerProtocolAssignment`. Fetching is the plain [`Consumer`],
//! started at the committed offsets (OffsetFetch), or per `auto.offset.reset` where
//! the group committed nothing.
//!
//! A background task heartbeats every `heartbeat.interval.ms`; when the coordinator
//! answers REBALANCE_IN_PROGRESS (or that the generation is gone) the next
//! [`GroupConsumer::poll`] rejoins. Eager protocols give up every partition before
//! rejoining (committing first); `cooperative-sticky` gives up only the partitions that
//! move and rejoins once more so their new owners get them.
//!
//! [`GroupAdmin`] lists and describes groups and reads or resets their committed offsets.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition as AssignedTopic;
use kafka_protocol::messages::consumer_protocol_subscription::TopicPartition as OwnedTopic;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::{
    ConsumerProtocolAssignment, ConsumerProtocolSubscription, FindCoordinatorRequest, GroupId, HeartbeatRequest,
    JoinGroupRequest, LeaveGroupRequest, OffsetCommitRequest, OffsetFetchRequest, SyncGroupRequest, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

use crate::assignor::{self, Subscription};
use crate::cluster::Cluster;
use crate::connection::Connection;
use crate::consumer::{Consumer, ConsumerConfig, ConsumerRecord, SeekTo};
use crate::error::{Error, ResponseError, Result};
use fjord_record::TopicPartition;

/// Version of the consumer protocol metadata we write (v1 carries owned partitions,
/// which the sticky assignors need); any version up to 3 is read.
const CONSUMER_PROTOCOL_VERSION: i16 = 1;

/// Group consumer settings (Kafka's names in the comments).
#[derive(Debug, Clone)]
pub struct GroupConfig {
    /// Connection, fetch and `auto.offset.reset` settings (used where the group has
    /// no committed offset).
    pub consumer: ConsumerConfig,
    /// `group.id`.
    pub group_id: String,
    /// `group.instance.id`: a static member keeps its partitions across restarts
    /// within the session timeout.
    pub group_instance_id: Option<String>,
    /// `session.timeout.ms`: without a heartbeat for this long, the member is dead.
    pub session_timeout: Duration,
    /// `heartbeat.interval.ms`.
    pub heartbeat_interval: Duration,
    /// `max.poll.interval.ms`: sent as the rebalance timeout, how long the coordinator
    /// waits for members to rejoin.
    pub max_poll_interval: Duration,
    /// `partition.assignment.strategy`, in order of preference.
    pub assignment_strategies: Vec<String>,
    /// `enable.auto.commit`: commit consumed positions every interval, and before
    /// partitions are revoked or the member leaves.
    pub enable_auto_commit: bool,
    /// `auto.commit.interval.ms`.
    pub auto_commit_interval: Duration,
}

impl GroupConfig {
    /// Defaults for `group_id` on the given bootstrap list.
    pub fn new(bootstrap: &str, group_id: &str) -> Self {
        Self {
            consumer: ConsumerConfig { client: crate::ClientConfig::new(bootstrap), ..ConsumerConfig::default() },
            group_id: group_id.to_string(),
            group_instance_id: None,
            session_timeout: Duration::from_secs(10),
            heartbeat_interval: Duration::from_secs(3),
            max_poll_interval: Duration::from_secs(300),
            assignment_strategies: vec!["range".into()],
            enable_auto_commit: true,
            auto_commit_interval: Duration::from_secs(5),
        }
    }

    fn validate(&self) -> Result<()> {
        if self.group_id.is_empty() {
            return Err(Error::InvalidConfig("group.id is empty".into()));
        }
        if self.assignment_strategies.is_empty() {
            return Err(Error::InvalidConfig("partition.assignment.strategy is empty".into()));
        }
        if let Some(bad) = self.assignment_strategies.iter().find(|s| assignor::by_name(s).is_none()) {
            return Err(Error::InvalidConfig(format!("unknown partition.assignment.strategy {bad:?}")));
        }
        if self.heartbeat_interval >= self.session_timeout {
            return Err(Error::InvalidConfig("heartbeat.interval.ms must be below session.timeout.ms".into()));
        }
        Ok(())
    }
}

/// A change of the member's partitions, as the rebalance listener sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rebalance {
    /// These partitions are taken away (their positions were committed first when
    /// auto-commit is on).
    Revoked(Vec<TopicPartition>),
    /// These partitions were added.
    Assigned(Vec<TopicPartition>),
}

/// Rebalance callback.
pub type RebalanceListener = Box<dyn FnMut(&Rebalance) + Send>;

/// State the heartbeat task shares with the consumer.
struct Member {
    member_id: Mutex<String>,
    generation: Mutex<i32>,
    coordinator: Mutex<Option<Arc<Connection>>>,
    /// Set by the heartbeat (or a failed commit) when the member must rejoin.
    rejoin: AtomicBool,
    /// A join is under way: no heartbeats (the coordinator answers them with errors).
    joining: AtomicBool,
}

/// A consumer that is a member of a consumer group.
pub struct GroupConsumer {
    coord: Coordinator,
    consumer: Consumer,
    config: GroupConfig,
    topics: Vec<String>,
    member: Arc<Member>,
    heartbeat: tokio::task::JoinHandle<()>,
    listener: Option<RebalanceListener>,
    /// Agreed protocol (assignor name) of the current generation.
    protocol: Option<String>,
    owned: BTreeSet<TopicPartition>,
    /// Next offset to consume per owned partition, from the records handed out.
    consumed: HashMap<TopicPartition, i64>,
    /// What was last committed, so commits send only what changed.
    /// Shared with in-flight commits, which record what the coordinator accepted.
    committed: Arc<Mutex<HashMap<TopicPartition, i64>>>,
    last_auto_commit: Instant,
    /// With auto-commit off, a poll that finds a rebalance pending returns once without
    /// joining, so the application commits what it finished before its partitions go.
    rebalance_announced: bool,
}

impl GroupConsumer {
    /// Connects and subscribes to `topics`; the member joins at the first poll.
    pub async fn subscribe(config: GroupConfig, topics: &[&str]) -> Result<Self> {
        config.validate()?;
        let consumer = Consumer::connect(config.consumer.clone()).await?;
        let cluster =
            Cluster::connect(crate::ClientConfig { allow_auto_create_topics: false, ..config.consumer.client.clone() }).await?;
        let member = Arc::new(Member {
            member_id: Mutex::new(String::new()),
            generation: Mutex::new(-1),
            coordinator: Mutex::new(None),
            rejoin: AtomicBool::new(true),
            joining: AtomicBool::new(false),
        });
        let coord = Coordinator { cluster, member: member.clone(), group_id: config.group_id.clone() };
        let heartbeat_coord =
            Coordinator { cluster: coord.cluster.clone(), member: member.clone(), group_id: config.group_id.clone() };
        let heartbeat =
            tokio::spawn(heartbeat_loop(heartbeat_coord, config.group_instance_id.clone(), config.heartbeat_interval));
        Ok(Self {
            coord,
            consumer,
            topics: topics.iter().map(|t| t.to_string()).collect(),
            member,
            heartbeat,
            listener: None,
            protocol: None,
            owned: BTreeSet::new(),
            consumed: HashMap::new(),
            committed: Arc::default(),
            last_auto_commit: Instant::now(),
            rebalance_announced: false,
            config,
        })
    }

    /// Sets the callback told about revoked and assigned partitions.
    pub fn set_rebalance_listener(&mut self, listener: RebalanceListener) {
        self.listener = Some(listener);
    }

    /// The partitions this member owns in the current generation.
    pub fn assignment(&self) -> Vec<TopicPartition> {
        self.owned.iter().cloned().collect()
    }

    /// The current generation (-1 before the first join).
    pub fn generation(&self) -> i32 {
        *lock(&self.member.generation)
    }

    /// The member id the coordinator gave this member.
    pub fn member_id(&self) -> String {
        lock(&self.member.member_id).clone()
    }

    /// Whether the next [`GroupConsumer::poll`] rejoins the group (a rebalance started, or
    /// the member must join): an application that commits by hand (auto-commit off) flushes
    /// what it derived from the records and commits before that poll, because an eager
    /// rejoin gives up every partition first (see [`GroupConsumer::poll`]).
    pub fn rebalance_pending(&self) -> bool {
        self.member.rejoin.load(Ordering::Acquire)
    }

    /// Records available now, waiting up to `timeout`; joins or rejoins the group first
    /// when needed, and auto-commits when the interval has passed.
    ///
    /// With auto-commit off, the first poll that finds a rebalance pending while this
    /// member owns partitions returns no records at once instead of rejoining
    /// ([`GroupConsumer::rebalance_pending`] is then true): the application commits what
    /// it finished, and the next poll rejoins. So a heartbeat that flags the rebalance
    /// just after the application checked cannot take partitions with uncommitted work.
    pub async fn poll(&mut self, timeout: Duration) -> Result<Vec<ConsumerRecord>> {
        if self.member.rejoin.load(Ordering::Acquire) {
            if !self.config.enable_auto_commit && !self.rebalance_announced && !self.owned.is_empty() {
                self.rebalance_announced = true;
                return Ok(Vec::new());
            }
            self.rebalance_announced = false;
            self.join().await?;
        }
        if self.config.enable_auto_commit && self.last_auto_commit.elapsed() >= self.config.auto_commit_interval {
            self.last_auto_commit = Instant::now();
            if let Err(e) = self.commit_sync().await {
                tracing::warn!(group = %self.config.group_id, "auto-commit failed: {e}");
            }
        }
        if self.owned.is_empty() {
            // Nothing to fetch this generation; wait for a rebalance to give us some.
            tokio::time::sleep(timeout.min(Duration::from_millis(100))).await;
            return Ok(Vec::new());
        }
        let records = self.consumer.poll(timeout).await?;
        for r in &records {
            self.consumed.insert(TopicPartition::new(&*r.topic, r.partition), r.offset + 1);
        }
        Ok(records)
    }

    /// Commits the positions of everything consumed so far, waiting for the answer.
    pub async fn commit_sync(&mut self) -> Result<()> {
        let offsets: Vec<(TopicPartition, i64)> = self.consumed.iter().map(|(tp, o)| (tp.clone(), *o)).collect();
        self.commit_offsets(&offsets).await?.await
    }

    /// Commits the given positions (per partition, the next offset to consume), waiting
    /// for the answer: for applications that commit only what they finished with, which
    /// may be less than what [`GroupConsumer::poll`] handed out.
    pub async fn commit_offsets_sync(&mut self, offsets: &[(TopicPartition, i64)]) -> Result<()> {
        self.commit_offsets(offsets).await?.await
    }

    /// Sends a commit of the positions consumed so far; the returned future resolves
    /// with the coordinator's answer (commits stay in order on the wire).
    pub async fn commit_async(&mut self) -> Result<impl Future<Output = Result<()>> + Send + 'static> {
        let offsets: Vec<(TopicPartition, i64)> = self.consumed.iter().map(|(tp, o)| (tp.clone(), *o)).collect();
        self.commit_offsets(&offsets).await
    }

    /// Commits, gives up the partitions and leaves the group, so the others rebalance
    /// at once instead of after the session timeout.
    pub async fn close(mut self) -> Result<()> {
        self.heartbeat.abort();
        let mut result = Ok(());
        if self.config.enable_auto_commit {
            result = self.commit_sync().await;
        }
        let revoked: Vec<TopicPartition> = std::mem::take(&mut self.owned).into_iter().collect();
        self.notify(Rebalance::Revoked(revoked));
        let member_id = self.member_id();
        if !member_id.is_empty() {
            if let Ok(conn) = self.coord.coordinator().await {
                let request = LeaveGroupRequest::default().with_group_id(GroupId(s(&self.config.group_id))).with_members(vec![
                    MemberIdentity::default()
                        .with_member_id(s(&member_id))
                        .with_group_instance_id(self.config.group_instance_id.as_deref().map(s)),
                ]);
                let response = conn.request(&request, 4).await?;
                if let Some(e) = Error::kafka(response.error_code, format!("leave group {}", self.config.group_id), None) {
                    return Err(e);
                }
            }
        }
        result
    }

    /// Stops without committing or leaving, as a crashed process would: the coordinator
    /// notices after `session.timeout.ms`.
    pub fn abort(self) {
        self.heartbeat.abort();
    }

    fn notify(&mut self, event: Rebalance) {
        let empty = matches!(&event, Rebalance::Revoked(p) | Rebalance::Assigned(p) if p.is_empty());
        if let (Some(listener), false) = (self.listener.as_mut(), empty) {
            listener(&event);
        }
    }
}

/// The parts the coordinator requests need; `Sync`, so futures borrowing it stay `Send`
/// (the fetcher inside [`GroupConsumer`] is not `Sync`).
struct Coordinator {
    cluster: Arc<Cluster>,
    member: Arc<Member>,
    group_id: String,
}

impl Coordinator {
    async fn coordinator(&self) -> Result<Arc<Connection>> {
        if let Some(c) = lock(&self.member.coordinator).clone().filter(|c| !c.is_closed()) {
            return Ok(c);
        }
        let request = FindCoordinatorRequest::default().with_key(s(&self.group_id)).with_key_type(0);
        let response = self.cluster.any_broker().await?.request(&request, 3).await?;
        if let Some(e) = Error::kafka(
            response.error_code,
            format!("find coordinator of {}", self.group_id),
            response.error_message.map(|m| m.to_string()),
        ) {
            return Err(e);
        }
        let conn = self.cluster.broker(response.node_id.0).await?;
        *lock(&self.member.coordinator) = Some(conn.clone());
        Ok(conn)
    }
}

impl GroupConsumer {
    async fn commit_offsets(
        &mut self,
        offsets: &[(TopicPartition, i64)],
    ) -> Result<impl Future<Output = Result<()>> + Send + 'static> {
        let changed: Vec<(TopicPartition, i64)> = {
            let committed = lock(&self.committed);
            offsets.iter().filter(|(tp, o)| committed.get(tp) != Some(o)).cloned().collect()
        };
        let mut topics: BTreeMap<&str, Vec<OffsetCommitRequestPartition>> = BTreeMap::new();
        for (tp, offset) in &changed {
            topics.entry(&tp.topic).or_default().push(
                OffsetCommitRequestPartition::default()
                    .with_partition_index(tp.partition)
                    .with_committed_offset(*offset)
                    .with_committed_leader_epoch(-1),
            );
        }
        let request = (!topics.is_empty()).then(|| {
            OffsetCommitRequest::default()
                .with_group_id(GroupId(s(&self.config.group_id)))
                .with_generation_id_or_member_epoch(self.generation())
                .with_member_id(s(&self.member_id()))
                .with_group_instance_id(self.config.group_instance_id.as_deref().map(s))
                .with_topics(
                    topics
                        .into_iter()
                        .map(|(t, p)| OffsetCommitRequestTopic::default().with_name(topic_name(t)).with_partitions(p))
                        .collect(),
                )
        });
        let pending = match request {
            Some(request) => {
                let conn = self.coord.coordinator().await?;
                Some(conn.send(&request, conn.version::<OffsetCommitRequest>(8)?).await?)
            }
            None => None,
        };
        // Only accepted offsets count as committed: after a failure the next commit resends them.
        let committed = self.committed.clone();
        let member = self.member.clone();
        let group = self.config.group_id.clone();
        Ok(async move {
            let Some(pending) = pending else { return Ok(()) };
            let response = pending.await?;
            for t in response.topics {
                for p in t.partitions {
                    if let Some(e) = Error::kafka(
                        p.error_code,
                        format!("commit {} of {}-{}", group, t.name.0.as_str(), p.partition_index),
                        None,
                    ) {
                        if matches!(
                            e.code(),
                            Some(
                                ResponseError::RebalanceInProgress
                                    | ResponseError::IllegalGeneration
                                    | ResponseError::UnknownMemberId
                            )
                        ) {
                            member.rejoin.store(true, Ordering::Release);
                        }
                        return Err(e);
                    }
                }
            }
            lock(&committed).extend(changed);
            Ok(())
        })
    }
}

impl Coordinator {
    /// The committed offsets of `partitions` (-1 where the group has none).
    async fn fetch_committed(&self, partitions: &[TopicPartition]) -> Result<HashMap<TopicPartition, i64>> {
        let mut topics: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
        for tp in partitions {
            topics.entry(&tp.topic).or_default().push(tp.partition);
        }
        let request = OffsetFetchRequest::default().with_group_id(GroupId(s(&self.group_id))).with_topics(Some(
            topics
                .into_iter()
                .map(|(t, p)| OffsetFetchRequestTopic::default().with_name(topic_name(t)).with_partition_indexes(p))
                .collect(),
        ));
        let response = self.coordinator().await?.request(&request, 7).await?;
        if let Some(e) = Error::kafka(response.error_code, format!("fetch offsets of {}", self.group_id), None) {
            return Err(e);
        }
        let mut out = HashMap::new();
        for t in response.topics {
            for p in t.partitions {
                if let Some(e) =
                    Error::kafka(p.error_code, format!("fetch offset of {}-{}", t.name.0.as_str(), p.partition_index), None)
                {
                    return Err(e);
                }
                out.insert(TopicPartition::new(t.name.0.as_str(), p.partition_index), p.committed_offset);
            }
        }
        Ok(out)
    }
}

impl GroupConsumer {
    /// Joins (or rejoins) the group until this member has an assignment of a stable generation.
    async fn join(&mut self) -> Result<()> {
        self.member.joining.store(true, Ordering::Release);
        let result = self.join_inner().await;
        self.member.joining.store(false, Ordering::Release);
        result
    }

    async fn join_inner(&mut self) -> Result<()> {
        let backoff = self.config.consumer.client.retry_backoff;
        loop {
            self.member.rejoin.store(false, Ordering::Release);
            let cooperative = self.protocol.as_deref() == Some("cooperative-sticky");
            if !cooperative && !self.owned.is_empty() {
                // Eager protocols give up everything before joining; commit what was consumed first.
                self.revoke(self.owned.clone()).await;
            }
            let conn = match self.coord.coordinator().await {
                Ok(c) => c,
                Err(e) if e.is_retriable() || matches!(e.code(), Some(ResponseError::CoordinatorNotAvailable)) => {
                    tokio::time::sleep(backoff).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let metadata = encode_subscription(&self.topics, &self.owned)?;
            let member_id = self.member_id();
            let request = JoinGroupRequest::default()
                .with_group_id(GroupId(s(&self.config.group_id)))
                .with_session_timeout_ms(self.config.session_timeout.as_millis() as i32)
                .with_rebalance_timeout_ms(self.config.max_poll_interval.as_millis() as i32)
                .with_member_id(s(&member_id))
                .with_group_instance_id(self.config.group_instance_id.as_deref().map(s))
                .with_protocol_type(s("consumer"))
                .with_protocols(
                    self.config
                        .assignment_strategies
                        .iter()
                        .map(|name| JoinGroupRequestProtocol::default().with_name(s(name)).with_metadata(metadata.clone()))
                        .collect(),
                );
            let response = match conn.request(&request, 7).await {
                Ok(r) => r,
                Err(e) if e.is_retriable() => {
                    *lock(&self.member.coordinator) = None;
                    tokio::time::sleep(backoff).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if let Some(e) = Error::kafka(response.error_code, format!("join group {}", self.config.group_id), None) {
                match e.code() {
                    // A new member learns its id first and joins again with it.
                    Some(ResponseError::MemberIdRequired) => *lock(&self.member.member_id) = response.member_id.to_string(),
                    Some(ResponseError::UnknownMemberId) => lock(&self.member.member_id).clear(),
                    Some(
                        ResponseError::NotCoordinator
                        | ResponseError::CoordinatorNotAvailable
                        | ResponseError::CoordinatorLoadInProgress,
                    ) => {
                        *lock(&self.member.coordinator) = None;
                        tokio::time::sleep(backoff).await;
                    }
                    Some(ResponseError::RebalanceInProgress) => tokio::time::sleep(backoff).await,
                    _ => return Err(e),
                }
                continue;
            }
            let member_id = response.member_id.to_string();
            *lock(&self.member.member_id) = member_id.clone();
            *lock(&self.member.generation) = response.generation_id;
            let protocol = response.protocol_name.as_ref().map(|p| p.to_string()).unwrap_or_default();
            let assignments = if response.leader.as_str() == member_id {
                self.coord.assign_as_leader(&protocol, &response.members).await?
            } else {
                Vec::new()
            };
            self.protocol = Some(protocol.clone());
            let request = SyncGroupRequest::default()
                .with_group_id(GroupId(s(&self.config.group_id)))
                .with_generation_id(response.generation_id)
                .with_member_id(s(&member_id))
                .with_group_instance_id(self.config.group_instance_id.as_deref().map(s))
                .with_protocol_type(Some(s("consumer")))
                .with_protocol_name(Some(s(&protocol)))
                .with_assignments(assignments);
            let response = match conn.request(&request, 5).await {
                Ok(r) => r,
                Err(e) if e.is_retriable() => {
                    *lock(&self.member.coordinator) = None;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if let Some(e) = Error::kafka(response.error_code, format!("sync group {}", self.config.group_id), None) {
                match e.code() {
                    Some(ResponseError::RebalanceInProgress | ResponseError::IllegalGeneration) => {}
                    Some(ResponseError::UnknownMemberId) => lock(&self.member.member_id).clear(),
                    Some(ResponseError::NotCoordinator | ResponseError::CoordinatorNotAvailable) => {
                        *lock(&self.member.coordinator) = None
                    }
                    _ => return Err(e),
                }
                continue;
            }
            let assigned = decode_assignment(&response.assignment, conn.addr())?;
            let revoked: BTreeSet<TopicPartition> = self.owned.difference(&assigned).cloned().collect();
            let added: Vec<TopicPartition> = assigned.difference(&self.owned).cloned().collect();
            if !revoked.is_empty() {
                self.revoke(revoked.clone()).await;
            }
            self.start_fetching(&assigned).await?;
            self.notify(Rebalance::Assigned(added));
            if protocol == "cooperative-sticky" && !revoked.is_empty() {
                // Partitions we let go of go to their new owners in a follow-up rebalance.
                continue;
            }
            return Ok(());
        }
    }

    /// Commits (when auto-commit is on) and gives up `partitions`.
    async fn revoke(&mut self, partitions: BTreeSet<TopicPartition>) {
        if self.config.enable_auto_commit {
            let offsets: Vec<(TopicPartition, i64)> =
                partitions.iter().filter_map(|tp| self.consumed.get(tp).map(|o| (tp.clone(), *o))).collect();
            let result = match self.commit_offsets(&offsets).await {
                Ok(f) => f.await,
                Err(e) => Err(e),
            };
            if let Err(e) = result {
                tracing::warn!(group = %self.config.group_id, "commit before revoke failed: {e}");
            }
        }
        for tp in &partitions {
            self.owned.remove(tp);
            self.consumed.remove(tp);
            lock(&self.committed).remove(tp);
        }
        self.notify(Rebalance::Revoked(partitions.into_iter().collect()));
    }

    /// Points the fetcher at `assigned`: kept partitions where they were, new ones at
    /// the committed offset (or per `auto.offset.reset`).
    async fn start_fetching(&mut self, assigned: &BTreeSet<TopicPartition>) -> Result<()> {
        let partitions: Vec<TopicPartition> = assigned.iter().cloned().collect();
        self.consumer.assign(partitions.clone()).await?;
        let fresh: Vec<TopicPartition> = partitions.iter().filter(|tp| !self.consumed.contains_key(tp)).cloned().collect();
        let committed = if fresh.is_empty() { HashMap::new() } else { self.coord.fetch_committed(&fresh).await? };
        for tp in &partitions {
            let start = self.consumed.get(tp).or_else(|| committed.get(tp)).copied().filter(|o| *o >= 0);
            if let Some(offset) = start {
                self.consumer.seek(tp, SeekTo::Offset(offset))?;
                lock(&self.committed).entry(tp.clone()).or_insert(offset);
            }
        }
        self.owned = assigned.clone();
        Ok(())
    }
}

impl Coordinator {
    /// The leader's job: run the agreed assignor over every member's subscription.
    async fn assign_as_leader(
        &self,
        protocol: &str,
        members: &[kafka_protocol::messages::join_group_response::JoinGroupResponseMember],
    ) -> Result<Vec<SyncGroupRequestAssignment>> {
        let assignor = assignor::by_name(protocol)
            .ok_or_else(|| Error::InvalidConfig(format!("the group agreed on unknown assignor {protocol:?}")))?;
        let mut subscriptions = Vec::with_capacity(members.len());
        for m in members {
            let (topics, owned) = decode_subscription(&m.metadata).map_err(|detail| Error::Protocol {
                broker: "group leader".into(),
                detail: format!("subscription of member {}: {detail}", m.member_id.as_str()),
            })?;
            subscriptions.push(Subscription { member_id: m.member_id.to_string(), topics, owned });
        }
        let mut counts = BTreeMap::new();
        for topic in subscriptions.iter().flat_map(|s| s.topics.iter()).collect::<BTreeSet<_>>() {
            // A subscribed topic that does not exist (yet) simply has no partitions to hand out.
            match self.cluster.topic(topic).await {
                Ok(t) => {
                    counts.insert(topic.clone(), t.partitions.len() as i32);
                }
                Err(Error::UnknownTopic(_)) => {}
                Err(e) => return Err(e),
            }
        }
        let plan = assignor.assign(&subscriptions, &counts);
        plan.into_iter()
            .map(|(member, partitions)| {
                Ok(SyncGroupRequestAssignment::default()
                    .with_member_id(s(&member))
                    .with_assignment(encode_assignment(&partitions)?))
            })
            .collect()
    }
}

/// One member as DescribeGroups reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberDescription {
    /// Member id.
    pub member_id: String,
    /// `group.instance.id` of a static member.
    pub group_instance_id: Option<String>,
    /// `client.id` it sent.
    pub client_id: String,
    /// Host it connected from.
    pub client_host: String,
    /// Partitions decoded from its assignment (empty for non-consumer groups).
    pub assignment: Vec<TopicPartition>,
}

/// A group as DescribeGroups reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDescription {
    /// Group id.
    pub group_id: String,
    /// `Empty`, `PreparingRebalance`, `CompletingRebalance`, `Stable` or `Dead`.
    pub state: String,
    /// The agreed assignor.
    pub protocol: String,
    /// Members.
    pub members: Vec<MemberDescription>,
}

/// Group administration: list, describe, read and reset committed offsets.
pub struct GroupAdmin {
    cluster: Arc<Cluster>,
}

impl GroupAdmin {
    /// Connects to the cluster.
    pub async fn connect(config: crate::ClientConfig) -> Result<Self> {
        Ok(Self { cluster: Cluster::connect(crate::ClientConfig { allow_auto_create_topics: false, ..config }).await? })
    }

    fn coordinator_of(&self, group: &str) -> Coordinator {
        let member = Arc::new(Member {
            member_id: Mutex::new(String::new()),
            generation: Mutex::new(-1),
            coordinator: Mutex::new(None),
            rejoin: AtomicBool::new(false),
            joining: AtomicBool::new(false),
        });
        Coordinator { cluster: self.cluster.clone(), member, group_id: group.to_string() }
    }

    /// (group id, state) of every group, sorted (one broker answers for the groups it coordinates;
    /// every broker is asked).
    pub async fn list_groups(&self) -> Result<Vec<(String, String)>> {
        let md = self.cluster.refresh(None).await?;
        let mut out = Vec::new();
        for id in md.brokers.keys() {
            let response =
                self.cluster.broker(*id).await?.request(&kafka_protocol::messages::ListGroupsRequest::default(), 4).await?;
            if let Some(e) = Error::kafka(response.error_code, "list groups", None) {
                return Err(e);
            }
            out.extend(response.groups.into_iter().map(|g| (g.group_id.0.to_string(), g.group_state.to_string())));
        }
        out.sort();
        Ok(out)
    }

    /// Members, state and assignments of `group`.
    pub async fn describe_group(&self, group: &str) -> Result<GroupDescription> {
        let conn = self.coordinator_of(group).coordinator().await?;
        let request = kafka_protocol::messages::DescribeGroupsRequest::default().with_groups(vec![GroupId(s(group))]);
        let response = conn.request(&request, 5).await?;
        let g = response.groups.into_iter().next().ok_or_else(|| Error::Protocol {
            broker: conn.addr().to_string(),
            detail: "DescribeGroups answered no group".into(),
        })?;
        if let Some(e) = Error::kafka(g.error_code, format!("describe group {group}"), g.error_message.map(|m| m.to_string())) {
            return Err(e);
        }
        let consumer = g.protocol_type.as_str() == "consumer";
        let members = g
            .members
            .into_iter()
            .map(|m| MemberDescription {
                assignment: if consumer {
                    decode_assignment_bytes(&m.member_assignment).map(|a| a.into_iter().collect()).unwrap_or_default()
                } else {
                    Vec::new()
                },
                member_id: m.member_id.to_string(),
                group_instance_id: m.group_instance_id.map(|i| i.to_string()),
                client_id: m.client_id.to_string(),
                client_host: m.client_host.to_string(),
            })
            .collect();
        Ok(GroupDescription {
            group_id: group.to_string(),
            state: g.group_state.to_string(),
            protocol: g.protocol_data.to_string(),
            members,
        })
    }

    /// Every committed offset of `group`.
    pub async fn committed_offsets(&self, group: &str) -> Result<BTreeMap<TopicPartition, i64>> {
        let request = OffsetFetchRequest::default().with_group_id(GroupId(s(group))).with_topics(None);
        let response = self.coordinator_of(group).coordinator().await?.request(&request, 7).await?;
        if let Some(e) = Error::kafka(response.error_code, format!("fetch offsets of {group}"), None) {
            return Err(e);
        }
        Ok(response
            .topics
            .into_iter()
            .flat_map(|t| {
                let name = t.name.0.to_string();
                t.partitions
                    .into_iter()
                    .filter(|p| p.committed_offset >= 0)
                    .map(move |p| (TopicPartition::new(&name, p.partition_index), p.committed_offset))
            })
            .collect())
    }

    /// Log end offsets (the high watermark) of `partitions`, in order.
    pub async fn log_end_offsets(&self, partitions: &[TopicPartition]) -> Result<Vec<i64>> {
        let specs: Vec<(String, i32, crate::OffsetSpec)> =
            partitions.iter().map(|tp| (tp.topic.clone(), tp.partition, crate::OffsetSpec::Latest)).collect();
        crate::admin::list_offsets(&self.cluster, &specs).await
    }

    /// Offsets of `topic`'s partitions per `spec` (earliest, latest or by timestamp).
    pub async fn topic_offsets(&self, topic: &str, spec: crate::OffsetSpec) -> Result<Vec<(TopicPartition, i64)>> {
        let t = self.cluster.topic(topic).await?;
        let specs: Vec<(String, i32, crate::OffsetSpec)> =
            t.partitions.iter().map(|p| (topic.to_string(), p.partition, spec)).collect();
        let offsets = crate::admin::list_offsets(&self.cluster, &specs).await?;
        Ok(t.partitions.iter().map(|p| TopicPartition::new(topic, p.partition)).zip(offsets).collect())
    }

    /// Overwrites `group`'s committed offsets. Only for an empty group: with live
    /// members the coordinator would reject the commit, and the members would
    /// overwrite it anyway, so this refuses with [`Error::InvalidConfig`] first.
    pub async fn reset_offsets(&self, group: &str, offsets: &[(TopicPartition, i64)]) -> Result<()> {
        let description = self.describe_group(group).await?;
        if !description.members.is_empty() {
            return Err(Error::InvalidConfig(format!(
                "group {group} has {} active member(s) (state {}); stop its consumers before resetting offsets",
                description.members.len(),
                description.state
            )));
        }
        let mut topics: BTreeMap<&str, Vec<OffsetCommitRequestPartition>> = BTreeMap::new();
        for (tp, offset) in offsets {
            topics.entry(&tp.topic).or_default().push(
                OffsetCommitRequestPartition::default()
                    .with_partition_index(tp.partition)
                    .with_committed_offset(*offset)
                    .with_committed_leader_epoch(-1),
            );
        }
        // Generation -1 and no member id: an admin commit, accepted only while the group is empty.
        let request =
            OffsetCommitRequest::default().with_group_id(GroupId(s(group))).with_generation_id_or_member_epoch(-1).with_topics(
                topics
                    .into_iter()
                    .map(|(t, p)| OffsetCommitRequestTopic::default().with_name(topic_name(t)).with_partitions(p))
                    .collect(),
            );
        let response = self.coordinator_of(group).coordinator().await?.request(&request, 8).await?;
        for t in response.topics {
            for p in t.partitions {
                if let Some(e) = Error::kafka(
                    p.error_code,
                    format!("reset offset of {group} on {}-{}", t.name.0.as_str(), p.partition_index),
                    None,
                ) {
                    return Err(e);
                }
            }
        }
        Ok(())
    }
}

impl Drop for GroupConsumer {
    fn drop(&mut self) {
        self.heartbeat.abort();
    }
}

/// Heartbeats while the member is in a generation. When the coordinator is lost (its
/// broker died or handed the group over), the next beat finds the new one: the member
/// may be idle (no commits, nothing to fetch) and the heartbeat is then its only
/// request to the coordinator, the one that learns (UNKNOWN_MEMBER_ID from the new
/// coordinator) that it must rejoin.
async fn heartbeat_loop(coord: Coordinator, instance: Option<String>, interval: Duration) {
    let (member, group) = (&coord.member, &coord.group_id);
    loop {
        tokio::time::sleep(interval).await;
        if member.joining.load(Ordering::Acquire) || member.rejoin.load(Ordering::Acquire) {
            continue;
        }
        let conn = match coord.coordinator().await {
            Ok(conn) => conn,
            Err(e) => {
                tracing::debug!(group = %group, "heartbeat: no coordinator: {e}");
                continue;
            }
        };
        let request = HeartbeatRequest::default()
            .with_group_id(GroupId(s(group)))
            .with_generation_id(*lock(&member.generation))
            .with_member_id(s(&lock(&member.member_id)))
            .with_group_instance_id(instance.as_deref().map(s));
        match conn.request(&request, 4).await {
            Ok(r) => match ResponseError::try_from_code(r.error_code) {
                None => {}
                Some(ResponseError::NotCoordinator | ResponseError::CoordinatorNotAvailable) => *lock(&member.coordinator) = None,
                Some(code) => {
                    if code == ResponseError::UnknownMemberId {
                        lock(&member.member_id).clear();
                    }
                    member.rejoin.store(true, Ordering::Release);
                }
            },
            Err(e) => {
                tracing::debug!(group = %group, "heartbeat failed: {e}");
                *lock(&member.coordinator) = None;
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn topic_name(t: &str) -> TopicName {
    TopicName(s(t))
}

/// `ConsumerProtocolSubscription` with its version prefix, as Kafka's clients write it.
fn encode_subscription(topics: &[String], owned: &BTreeSet<TopicPartition>) -> Result<Bytes> {
    let mut per_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for tp in owned {
        per_topic.entry(&tp.topic).or_default().push(tp.partition);
    }
    let message =
        ConsumerProtocolSubscription::default().with_topics(topics.iter().map(|t| s(t)).collect()).with_owned_partitions(
            per_topic.into_iter().map(|(t, p)| OwnedTopic::default().with_topic(topic_name(t)).with_partitions(p)).collect(),
        );
    versioned(|buf| message.encode(buf, CONSUMER_PROTOCOL_VERSION))
}

fn encode_assignment(partitions: &[assignor::Partition]) -> Result<Bytes> {
    let mut per_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for (t, p) in partitions {
        per_topic.entry(t).or_default().push(*p);
    }
    let message = ConsumerProtocolAssignment::default().with_assigned_partitions(
        per_topic.into_iter().map(|(t, p)| AssignedTopic::default().with_topic(topic_name(t)).with_partitions(p)).collect(),
    );
    versioned(|buf| message.encode(buf, CONSUMER_PROTOCOL_VERSION))
}

fn versioned(encode: impl FnOnce(&mut BytesMut) -> anyhow::Result<()>) -> Result<Bytes> {
    let mut buf = BytesMut::new();
    buf.put_i16(CONSUMER_PROTOCOL_VERSION);
    encode(&mut buf).map_err(|e| Error::InvalidConfig(format!("cannot encode consumer protocol metadata: {e}")))?;
    Ok(buf.freeze())
}

/// The version prefix, capped to what we decode (newer versions only append fields).
fn read_version(buf: &mut Bytes) -> std::result::Result<i16, String> {
    if buf.remaining() < 2 {
        return Err("shorter than its version prefix".into());
    }
    let version = buf.get_i16();
    if version < 0 {
        return Err(format!("negative version {version}"));
    }
    Ok(version.min(3))
}

/// Topics and owned partitions from a member's JoinGroup metadata.
pub(crate) fn decode_subscription(metadata: &Bytes) -> std::result::Result<(Vec<String>, Vec<assignor::Partition>), String> {
    let mut buf = metadata.clone();
    let version = read_version(&mut buf)?;
    let sub = ConsumerProtocolSubscription::decode(&mut buf, version).map_err(|e| e.to_string())?;
    let owned = sub.owned_partitions.iter().flat_map(|t| t.partitions.iter().map(move |p| (t.topic.0.to_string(), *p))).collect();
    Ok((sub.topics.iter().map(|t| t.to_string()).collect(), owned))
}

/// Partitions of a SyncGroup (or DescribeGroups) assignment; empty bytes mean none.
pub fn decode_assignment_bytes(assignment: &Bytes) -> std::result::Result<BTreeSet<TopicPartition>, String> {
    if assignment.is_empty() {
        return Ok(BTreeSet::new());
    }
    let mut buf = assignment.clone();
    let version = read_version(&mut buf)?;
    let a = ConsumerProtocolAssignment::decode(&mut buf, version).map_err(|e| e.to_string())?;
    Ok(a.assigned_partitions
        .iter()
        .flat_map(|t| t.partitions.iter().map(move |p| TopicPartition::new(t.topic.0.as_str(), *p)))
        .collect())
}

fn decode_assignment(assignment: &Bytes, broker: &str) -> Result<BTreeSet<TopicPartition>> {
    decode_assignment_bytes(assignment)
        .map_err(|detail| Error::Protocol { broker: broker.to_string(), detail: format!("assignment: {detail}") })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumer_protocol_metadata_round_trips_with_its_version_prefix() {
        let owned: BTreeSet<TopicPartition> = [TopicPartition::new("t", 2), TopicPartition::new("t", 0)].into_iter().collect();
        let bytes = encode_subscription(&["t".into(), "u".into()], &owned).unwrap();
        assert_eq!(&bytes[..2], &CONSUMER_PROTOCOL_VERSION.to_be_bytes());
        let (topics, owned) = decode_subscription(&bytes).unwrap();
        assert_eq!(topics, ["t", "u"]);
        assert_eq!(owned, [("t".to_string(), 0), ("t".to_string(), 2)]);

        let bytes = encode_assignment(&[("t".into(), 1), ("u".into(), 0)]).unwrap();
        let got: Vec<TopicPartition> = decode_assignment_bytes(&bytes).unwrap().into_iter().collect();
        assert_eq!(got, [TopicPartition::new("t", 1), TopicPartition::new("u", 0)]);
        assert!(decode_assignment_bytes(&Bytes::new()).unwrap().is_empty());
    }

    #[test]
    fn garbage_metadata_is_an_error_not_a_panic() {
        for bad in [&b"\x00"[..], b"\xff\xff", b"\x00\x01\x00\x00\x00\x09xx"] {
            assert!(decode_subscription(&Bytes::copy_from_slice(bad)).is_err());
            assert!(decode_assignment_bytes(&Bytes::copy_from_slice(bad)).is_err());
        }
    }

    #[test]
    fn unknown_strategies_and_bad_timeouts_are_rejected() {
        let mut c = GroupConfig::new("h:1", "g");
        assert!(c.validate().is_ok());
        c.assignment_strategies = vec!["nope".into()];
        assert!(matches!(c.validate(), Err(Error::InvalidConfig(_))));
        let mut c = GroupConfig::new("h:1", "g");
        c.heartbeat_interval = c.session_timeout;
        assert!(matches!(c.validate(), Err(Error::InvalidConfig(_))));
        assert!(matches!(GroupConfig::new("h:1", "").validate(), Err(Error::InvalidConfig(_))));
    }
}
