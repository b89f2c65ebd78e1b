//! [`GroupConsumer`]: a member of a consumer group as the application uses it (subscribe,
//! poll, commit, close), and the heartbeat task that tells it when to rejoin.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
use kafka_protocol::messages::{GroupId, HeartbeatRequest, LeaveGroupRequest, OffsetCommitRequest};

use super::{lock, s, topic_name, Coordinator, GroupConfig, Member, Rebalance, RebalanceListener};
use crate::cluster::Cluster;
use crate::consumer::{Consumer, ConsumerRecord, SeekTo};
use crate::error::{Error, ResponseError, Result};
use fjord_record::TopicPartition;

/// A consumer that is a member of a consumer group.
pub struct GroupConsumer {
    pub(super) coord: Coordinator,
    pub(super) consumer: Consumer,
    pub(super) config: GroupConfig,
    pub(super) topics: Vec<String>,
    pub(super) member: Arc<Member>,
    pub(super) heartbeat: tokio::task::JoinHandle<()>,
    pub(super) listener: Option<RebalanceListener>,
    /// Agreed protocol (assignor name) of the current generation.
    pub(super) protocol: Option<String>,
    pub(super) owned: BTreeSet<TopicPartition>,
    /// Next offset to consume per owned partition, from the records handed out.
    pub(super) consumed: HashMap<TopicPartition, i64>,
    /// What was last committed, so commits send only what changed.
    /// Shared with in-flight commits, which record what the coordinator accepted.
    pub(super) committed: Arc<Mutex<HashMap<TopicPartition, i64>>>,
    pub(super) last_auto_commit: Instant,
    /// With auto-commit off, a poll that finds a rebalance pending returns once without
    /// joining, so the application commits what it finished before its partitions go.
    pub(super) rebalance_announced: bool,
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
            assigned_from: Mutex::new(None),
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

    /// Moves an owned partition's position: the next poll fetches from `offset`, and
    /// records of it fetched before are dropped. For applications that keep their
    /// positions elsewhere than in this group (Kafka's `seek` in the rebalance listener).
    pub fn seek(&mut self, tp: &TopicPartition, offset: i64) -> Result<()> {
        if !self.owned.contains(tp) {
            return Err(Error::NotAssigned(tp.to_string()));
        }
        self.consumer.seek(tp, SeekTo::Offset(offset))?;
        self.consumed.insert(tp.clone(), offset);
        Ok(())
    }

    /// Stops fetching an owned partition until [`GroupConsumer::resume`] (or until the
    /// next rebalance assigns it again); its position stays (see [`Consumer::pause`]).
    pub fn pause(&mut self, tp: &TopicPartition) -> Result<()> {
        if !self.owned.contains(tp) {
            return Err(Error::NotAssigned(tp.to_string()));
        }
        self.consumer.pause(tp)
    }

    /// Fetches a paused partition again, from its position.
    pub fn resume(&mut self, tp: &TopicPartition) -> Result<()> {
        if !self.owned.contains(tp) {
            return Err(Error::NotAssigned(tp.to_string()));
        }
        self.consumer.resume(tp)
    }

    /// Stops without committing or leaving, as a crashed process would: the coordinator
    /// notices after `session.timeout.ms`.
    pub fn abort(self) {
        self.heartbeat.abort();
    }

    pub(super) fn notify(&mut self, event: Rebalance) {
        let empty = matches!(&event, Rebalance::Revoked(p) | Rebalance::Assigned(p) if p.is_empty());
        if let (Some(listener), false) = (self.listener.as_mut(), empty) {
            listener(&event);
        }
    }
}

impl GroupConsumer {
    pub(super) async fn commit_offsets(
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
///
/// While this member leads the generation, each beat also compares the partition counts
/// the assignment was computed from with the metadata (refreshed when older than
/// `metadata.max.age.ms`), and asks for a rejoin when a subscribed topic changed.
async fn heartbeat_loop(coord: Coordinator, instance: Option<String>, interval: Duration) {
    let (member, group) = (&coord.member, &coord.group_id);
    loop {
        tokio::time::sleep(interval).await;
        if member.joining.load(Ordering::Acquire) || member.rejoin.load(Ordering::Acquire) {
            continue;
        }
        if assignment_outdated(&coord).await {
            tracing::info!(group = %group, "a subscribed topic's partition count changed: rejoining");
            member.rejoin.store(true, Ordering::Release);
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

/// Whether this member leads the generation and the metadata (refreshed when older than
/// `metadata.max.age.ms`) shows a subscribed topic with another partition count than the
/// assignment was computed from. A failed metadata refresh answers no: the next beat asks again.
async fn assignment_outdated(coord: &Coordinator) -> bool {
    let Some(snapshot) = lock(&coord.member.assigned_from).clone() else {
        return false;
    };
    let mut now = BTreeMap::new();
    for topic in &snapshot.topics {
        match coord.cluster.topic(topic).await {
            Ok(t) => {
                now.insert(topic.clone(), t.partitions.len() as i32);
            }
            Err(Error::UnknownTopic(_)) => {}
            Err(e) => {
                tracing::debug!(group = %coord.group_id, "metadata refresh for the assignment check failed: {e}");
                return false;
            }
        }
    }
    snapshot.outdated_by(&now)
}
