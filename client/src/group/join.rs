//! The rebalance as a member lives it: JoinGroup (a new member learns its id first),
//! the leader's assignment with the agreed assignor, SyncGroup, then giving up the
//! partitions that move (committing first) and starting to fetch the new ones at their
//! committed offsets.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::Ordering;

use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::{GroupId, JoinGroupRequest, OffsetFetchRequest, SyncGroupRequest};

use super::protocol::{decode_assignment, decode_subscription, encode_assignment, encode_subscription};
use super::{lock, s, topic_name, AssignmentSnapshot, Coordinator, GroupConsumer, Rebalance};
use crate::assignor::{self, Subscription};
use crate::consumer::SeekTo;
use crate::error::{Error, ResponseError, Result};
use fjord_record::TopicPartition;

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
    pub(super) async fn join(&mut self) -> Result<()> {
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
            // Only the leader watches for partition count changes; it sets this again below.
            *lock(&self.member.assigned_from) = None;
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
        let topics = subscriptions.iter().flat_map(|s| s.topics.iter().cloned()).collect();
        *lock(&self.member.assigned_from) = Some(AssignmentSnapshot { topics, counts });
        plan.into_iter()
            .map(|(member, partitions)| {
                Ok(SyncGroupRequestAssignment::default()
                    .with_member_id(s(&member))
                    .with_assignment(encode_assignment(&partitions)?))
            })
            .collect()
    }
}
