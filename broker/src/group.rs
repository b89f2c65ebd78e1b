//! The group coordinator: Kafka's broker-side consumer group protocol, with the
//! paper's registries as its storage.
//!
//! # Layout
//! - [`state`]: one group's membership state machine (join, sync, heartbeat, leave,
//!   session expiry), pure and unit-tested.
//! - this file: the coordinator that owns the groups, answers the group APIs, and
//!   keeps the registries in the metadata store (docs/architecture.md):
//!   - `/consumers/<group>/coordinator` (ephemeral): which broker coordinates it;
//!   - `/consumers/<group>/offsets/<topic>/<p>` (persistent): committed offsets, so
//!     they survive any broker and are visible to operators;
//!   - `/consumers/<group>/owners/<topic>/<p>` (ephemeral): which member owns each
//!     partition, written after each completed rebalance.
//!
//! Committed offsets are cached in memory per group, loaded from the store the first
//! time this broker touches the group, and written through on every commit. They
//! never expire while the group's registry exists.

pub(crate) mod state;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use fjord_coord::{paths, registry, CreateMode, MetadataStore, Store};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, StrBytes};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use crate::periodic::Periodic;
use state::{Group, GroupState, JoinOutcome, JoinRequest, Reply, SyncOutcome};

/// Group coordinator settings, with Kafka's names and defaults (set through
/// [`crate::BrokerConfig::set`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupConfig {
    /// `group.min.session.timeout.ms`: shortest session a member may ask for.
    pub min_session_timeout_ms: u64,
    /// `group.max.session.timeout.ms`: longest session a member may ask for.
    pub max_session_timeout_ms: u64,
    /// `group.initial.rebalance.delay.ms`: how long a new group waits for more
    /// members before its first generation, so a group starting up rebalances once.
    pub initial_rebalance_delay_ms: u64,
    /// `offset.metadata.max.bytes`: largest metadata string stored with an offset.
    pub offset_metadata_max_bytes: usize,
}

impl Default for GroupConfig {
    fn default() -> Self {
        Self {
            min_session_timeout_ms: 6_000,
            max_session_timeout_ms: 1_800_000,
            initial_rebalance_delay_ms: 3_000,
            offset_metadata_max_bytes: 4096,
        }
    }
}

/// The broker's own identity, for FindCoordinator answers: its id and where each of its
/// listeners is advertised (a client is told the address on the listener it came in on).
#[derive(Debug, Clone)]
pub(crate) struct Endpoint {
    pub(crate) broker_id: i32,
    pub(crate) listeners: Vec<crate::listener::ListenerInfo>,
}

/// A committed offset as stored in the offset registry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct CommittedOffset {
    offset: i64,
    #[serde(default = "no_epoch")]
    leader_epoch: i32,
    #[serde(default)]
    metadata: String,
    #[serde(default)]
    commit_timestamp_ms: i64,
}

fn no_epoch() -> i32 {
    -1
}

/// A group as the coordinator holds it.
struct GroupEntry {
    group: Group,
    /// Committed offsets by (topic, partition); loaded from the store on first use.
    offsets: BTreeMap<(String, i32), CommittedOffset>,
}

impl GroupEntry {
    /// Whether the group exists as Kafka sees it: it has members or committed offsets.
    /// An entry without either (a FindCoordinator or a describe of a group nobody
    /// joined) is a group that never existed: ListGroups leaves it out, DescribeGroups
    /// calls it Dead and DeleteGroups answers GROUP_ID_NOT_FOUND.
    fn exists(&self) -> bool {
        self.group.state != GroupState::Empty || !self.offsets.is_empty()
    }
}

struct Inner {
    store: Store,
    endpoint: Endpoint,
    config: GroupConfig,
    groups: std::sync::Mutex<HashMap<String, Arc<Mutex<GroupEntry>>>>,
    /// Serialises ownership-registry rewrites; the value is the last generation
    /// written per group, so a slow older rewrite never overwrites a newer one.
    owners_written: Mutex<HashMap<String, i32>>,
}

/// Owns every group this broker coordinates.
#[derive(Clone)]
pub(crate) struct GroupCoordinator {
    inner: Arc<Inner>,
}

/// How often sessions and rebalance deadlines are checked.
const TICK: Duration = Duration::from_millis(100);

/// FindCoordinator key types.
const KEY_TYPE_GROUP: i8 = 0;
const KEY_TYPE_TRANSACTION: i8 = 1;
/// The answer to a transaction coordinator lookup until transactions exist. It has to
/// be one the clients give up on at once: librdkafka's transactional producer treats
/// every other FindCoordinator error, UNSUPPORTED_VERSION and INVALID_REQUEST included,
/// as "no coordinator yet" and asks again until `init_transactions` times out
/// (COORDINATOR_NOT_AVAILABLE did exactly that); TRANSACTIONAL_ID_AUTHORIZATION_FAILED
/// is the one code it treats as fatal, and the Java client fails on it too. The error
/// message says the real reason.
const NO_TRANSACTION_COORDINATOR: ResponseError = ResponseError::TransactionalIdAuthorizationFailed;

impl GroupCoordinator {
    /// Creates the coordinator and starts its session-expiry ticker, which stops by
    /// itself once the coordinator is dropped.
    pub(crate) fn new(store: Store, endpoint: Endpoint, config: GroupConfig) -> Self {
        let inner = Arc::new(Inner {
            store,
            endpoint,
            config,
            groups: std::sync::Mutex::new(HashMap::new()),
            owners_written: Mutex::new(HashMap::new()),
        });
        tokio::spawn(ticker(Arc::downgrade(&inner)));
        Self { inner }
    }

    /// The group's entry, loading its committed offsets and claiming coordination
    /// on first use. `Err` carries the error code to answer with.
    async fn entry(&self, group_id: &str) -> Result<Arc<Mutex<GroupEntry>>, ResponseError> {
        if group_id.is_empty() {
            return Err(ResponseError::InvalidGroupId);
        }
        if let Some(entry) = self.inner.groups.lock().expect("groups lock").get(group_id) {
            return Ok(entry.clone());
        }
        if self.inner.claim(group_id).await? != self.inner.endpoint.broker_id {
            return Err(ResponseError::NotCoordinator);
        }
        let offsets = self.inner.load_offsets(group_id).await.map_err(|e| {
            tracing::warn!(group = group_id, error = %e, "could not load committed offsets");
            ResponseError::CoordinatorLoadInProgress
        })?;
        let mut groups = self.inner.groups.lock().expect("groups lock");
        let entry = groups
            .entry(group_id.to_string())
            .or_insert_with(|| Arc::new(Mutex::new(GroupEntry { group: Group::new(group_id), offsets })));
        Ok(entry.clone())
    }

    /// The group's entry if the group exists, without creating it: a group exists while
    /// it has members or committed offsets (Kafka drops a group that has neither). A
    /// group no broker coordinates yet is claimed here, as FindCoordinator does; its
    /// entry is kept only if the registry holds offsets for it. `Err` carries the error
    /// code to answer with (NOT_COORDINATOR when another broker coordinates it).
    async fn lookup(&self, group_id: &str) -> Result<Option<Arc<Mutex<GroupEntry>>>, ResponseError> {
        if group_id.is_empty() {
            return Err(ResponseError::InvalidGroupId);
        }
        let known = self.inner.groups.lock().expect("groups lock").get(group_id).cloned();
        if let Some(entry) = known {
            let exists = entry.lock().await.exists();
            return Ok(exists.then_some(entry));
        }
        if self.inner.claim(group_id).await? != self.inner.endpoint.broker_id {
            return Err(ResponseError::NotCoordinator);
        }
        let offsets = self.inner.load_offsets(group_id).await.map_err(|e| {
            tracing::warn!(group = group_id, error = %e, "could not load committed offsets");
            ResponseError::CoordinatorLoadInProgress
        })?;
        if offsets.is_empty() {
            return Ok(None);
        }
        let mut groups = self.inner.groups.lock().expect("groups lock");
        let entry = groups
            .entry(group_id.to_string())
            .or_insert_with(|| Arc::new(Mutex::new(GroupEntry { group: Group::new(group_id), offsets })));
        Ok(Some(entry.clone()))
    }

    /// FindCoordinator, answered with the coordinators' addresses on `listener` (the one
    /// the client came in on).
    pub(crate) async fn find_coordinator(&self, request: FindCoordinatorRequest, version: i16, listener: &str) -> ResponseKind {
        let keys: Vec<StrBytes> = if version >= 4 { request.coordinator_keys.clone() } else { vec![request.key.clone()] };
        let mut coordinators = Vec::new();
        for key in keys {
            let answer = if request.key_type == KEY_TYPE_TRANSACTION {
                Err(NO_TRANSACTION_COORDINATOR)
            } else if request.key_type != KEY_TYPE_GROUP {
                Err(ResponseError::InvalidRequest)
            } else if key.is_empty() {
                Err(ResponseError::InvalidGroupId)
            } else {
                self.locate(&key, listener).await
            };
            let mut coordinator = Coordinator::default().with_key(key);
            match answer {
                Ok((broker_id, host, port)) => {
                    coordinator = coordinator
                        .with_node_id(BrokerId(broker_id))
                        .with_host(StrBytes::from_string(host))
                        .with_port(i32::from(port));
                }
                Err(e) => {
                    let message = if e == NO_TRANSACTION_COORDINATOR {
                        "this broker has no transaction coordinator: transactions are not supported; unset transactional.id"
                            .to_string()
                    } else {
                        e.to_string()
                    };
                    coordinator = coordinator
                        .with_error_code(e.code())
                        .with_node_id(BrokerId(-1))
                        .with_port(-1)
                        .with_error_message(Some(StrBytes::from_string(message)));
                }
            }
            coordinators.push(coordinator);
        }
        let mut response = FindCoordinatorResponse::default();
        if version < 4 {
            let c = coordinators.pop().unwrap_or_default();
            response = response
                .with_error_code(c.error_code)
                .with_error_message(c.error_message)
                .with_node_id(c.node_id)
                .with_host(c.host)
                .with_port(c.port);
        } else {
            response = response.with_coordinators(coordinators);
        }
        ResponseKind::FindCoordinator(response)
    }

    /// Where the group's coordinator is, on `listener`: this broker if it holds (or can
    /// take) the coordinator node, otherwise the registered broker that holds it (one
    /// without that listener is as good as unreachable).
    async fn locate(&self, group_id: &str, listener: &str) -> Result<(i32, String, u16), ResponseError> {
        let owner = self.inner.claim(group_id).await?;
        if owner == self.inner.endpoint.broker_id {
            let own = self.inner.endpoint.listeners.iter().find(|l| l.name == listener);
            return own.map(|l| (owner, l.host.clone(), l.port)).ok_or(ResponseError::CoordinatorNotAvailable);
        }
        match registry::read_json::<registry::BrokerRegistration>(&*self.inner.store, &paths::broker(owner)).await {
            Ok(Some((b, _))) => match b.endpoint(listener) {
                Some((host, port)) => Ok((owner, host.to_owned(), port)),
                None => Err(ResponseError::CoordinatorNotAvailable),
            },
            _ => Err(ResponseError::CoordinatorNotAvailable),
        }
    }

    pub(crate) async fn join_group(
        &self,
        request: JoinGroupRequest,
        version: i16,
        client_id: &str,
        client_host: &str,
    ) -> ResponseKind {
        let member_id = request.member_id.to_string();
        let respond = |r: state::JoinResult| {
            let members = r
                .members
                .into_iter()
                .map(|(id, instance, metadata)| {
                    join_group_response::JoinGroupResponseMember::default()
                        .with_member_id(StrBytes::from_string(id))
                        .with_group_instance_id(instance.map(StrBytes::from_string))
                        .with_metadata(metadata)
                })
                .collect();
            ResponseKind::JoinGroup(
                JoinGroupResponse::default()
                    .with_error_code(r.error)
                    .with_generation_id(r.generation_id)
                    .with_protocol_type(Some(StrBytes::from_string(r.protocol_type)))
                    .with_protocol_name(Some(StrBytes::from_string(r.protocol_name)))
                    .with_leader(StrBytes::from_string(r.leader))
                    .with_member_id(StrBytes::from_string(r.member_id))
                    .with_members(members),
            )
        };
        let session = request.session_timeout_ms.max(0) as u64;
        if session < self.inner.config.min_session_timeout_ms || session > self.inner.config.max_session_timeout_ms {
            return respond(state::JoinResult::error(ResponseError::InvalidSessionTimeout, &member_id));
        }
        let entry = match self.entry(&request.group_id).await {
            Ok(entry) => entry,
            Err(e) => return respond(state::JoinResult::error(e, &member_id)),
        };
        // v0 has no rebalance timeout: it is the session timeout.
        let rebalance = if version >= 1 { request.rebalance_timeout_ms.max(0) as u64 } else { session };
        let join = JoinRequest {
            member_id: member_id.clone(),
            group_instance_id: request.group_instance_id.as_ref().map(|s| s.to_string()),
            client_id: client_id.to_string(),
            client_host: client_host.to_string(),
            session_timeout: Duration::from_millis(session),
            rebalance_timeout: Duration::from_millis(rebalance),
            protocol_type: request.protocol_type.to_string(),
            protocols: request.protocols.iter().map(|p| (p.name.to_string(), p.metadata.clone())).collect(),
            requires_known_member_id: version >= 4,
        };
        let initial_delay = Duration::from_millis(self.inner.config.initial_rebalance_delay_ms);
        let (outcome, replaced) = {
            let mut entry = entry.lock().await;
            let (outcome, replies) = entry.group.join(join, Instant::now(), initial_delay);
            replies.into_iter().for_each(Reply::deliver);
            // Answered at once without an error: a static member took its old place in a
            // Stable group, so the ownership registry names a member id that changed.
            let group = &entry.group;
            let replaced = matches!(&outcome, JoinOutcome::Now(r) if r.error == 0)
                .then(|| (group.generation_id, group.protocol_type.clone(), group.assignments()));
            (outcome, replaced)
        };
        if let Some((generation, protocol_type, assignments)) = replaced {
            let inner = self.inner.clone();
            let group_id = request.group_id.to_string();
            tokio::spawn(async move {
                inner.write_owners(&group_id, generation, protocol_type.as_deref(), &assignments).await;
            });
        }
        let result = match outcome {
            JoinOutcome::Now(result) => result,
            // The sender is dropped only if the group itself is dropped.
            JoinOutcome::Wait(rx) => {
                rx.await.unwrap_or_else(|_| state::JoinResult::error(ResponseError::NotCoordinator, &member_id))
            }
        };
        respond(result)
    }

    pub(crate) async fn sync_group(&self, request: SyncGroupRequest, _version: i16) -> ResponseKind {
        let respond = |r: state::SyncResult| {
            ResponseKind::SyncGroup(
                SyncGroupResponse::default()
                    .with_error_code(r.error)
                    .with_protocol_type(Some(StrBytes::from_string(r.protocol_type)))
                    .with_protocol_name(Some(StrBytes::from_string(r.protocol_name)))
                    .with_assignment(r.assignment),
            )
        };
        let entry = match self.existing(&request.group_id).await {
            Ok(entry) => entry,
            Err(e) => return respond(state::SyncResult::error(e)),
        };
        let assignments: Vec<(String, Bytes)> =
            request.assignments.iter().map(|a| (a.member_id.to_string(), a.assignment.clone())).collect();
        let (outcome, stable) = {
            let mut entry = entry.lock().await;
            let group = &mut entry.group;
            if let Some(name) = &request.protocol_name {
                if group.protocol_name.as_deref().is_some_and(|p| p != name.as_str()) {
                    return respond(state::SyncResult::error(ResponseError::InconsistentGroupProtocol));
                }
            }
            let was_stable = group.state == GroupState::Stable;
            let instance = request.group_instance_id.as_deref();
            let (outcome, replies) = group.sync(&request.member_id, instance, request.generation_id, assignments, Instant::now());
            replies.into_iter().for_each(Reply::deliver);
            let now_stable = !was_stable && group.state == GroupState::Stable;
            let snapshot = now_stable.then(|| (group.generation_id, group.protocol_type.clone(), group.assignments()));
            (outcome, snapshot)
        };
        if let Some((generation, protocol_type, assignments)) = stable {
            let inner = self.inner.clone();
            let group_id = request.group_id.to_string();
            tokio::spawn(async move {
                inner.write_owners(&group_id, generation, protocol_type.as_deref(), &assignments).await;
            });
        }
        let result = match outcome {
            SyncOutcome::Now(result) => result,
            SyncOutcome::Wait(rx) => rx.await.unwrap_or_else(|_| state::SyncResult::error(ResponseError::NotCoordinator)),
        };
        respond(result)
    }

    /// A group this broker already coordinates; requests other than JoinGroup and
    /// the offset APIs never create one.
    async fn existing(&self, group_id: &str) -> Result<Arc<Mutex<GroupEntry>>, ResponseError> {
        let entry = self.entry(group_id).await?;
        if entry.lock().await.group.state == GroupState::Empty {
            return Err(ResponseError::UnknownMemberId);
        }
        Ok(entry)
    }

    pub(crate) async fn heartbeat(&self, request: HeartbeatRequest) -> ResponseKind {
        let result = match self.existing(&request.group_id).await {
            Ok(entry) => {
                let mut entry = entry.lock().await;
                let instance = request.group_instance_id.as_deref();
                entry.group.heartbeat(&request.member_id, instance, request.generation_id, Instant::now())
            }
            Err(e) => Err(e),
        };
        ResponseKind::Heartbeat(HeartbeatResponse::default().with_error_code(result.err().map_or(0, |e| e.code())))
    }

    pub(crate) async fn leave_group(&self, request: LeaveGroupRequest, version: i16) -> ResponseKind {
        let leaving: Vec<(String, Option<String>)> = if version >= 3 {
            request
                .members
                .iter()
                .map(|m| (m.member_id.to_string(), m.group_instance_id.as_ref().map(|s| s.to_string())))
                .collect()
        } else {
            vec![(request.member_id.to_string(), None)]
        };
        let entry = match self.entry(&request.group_id).await {
            Ok(entry) => entry,
            Err(e) => return ResponseKind::LeaveGroup(LeaveGroupResponse::default().with_error_code(e.code())),
        };
        let mut members = Vec::new();
        let mut first_error = 0;
        let became_empty = {
            let mut entry = entry.lock().await;
            for (member_id, instance) in leaving {
                let code = match entry.group.leave(&member_id, instance.as_deref(), Instant::now()) {
                    Ok(replies) => {
                        replies.into_iter().for_each(Reply::deliver);
                        0
                    }
                    Err(e) => e.code(),
                };
                if first_error == 0 {
                    first_error = code;
                }
                members.push(
                    leave_group_response::MemberResponse::default()
                        .with_member_id(StrBytes::from_string(member_id))
                        .with_group_instance_id(instance.map(StrBytes::from_string))
                        .with_error_code(code),
                );
            }
            (entry.group.state == GroupState::Empty).then_some(entry.group.generation_id)
        };
        if let Some(generation) = became_empty {
            self.inner.write_owners(&request.group_id, generation, None, &[]).await;
        }
        // v3+ reports per member; before that the top-level code is the member's.
        let response = if version >= 3 {
            LeaveGroupResponse::default().with_members(members)
        } else {
            LeaveGroupResponse::default().with_error_code(first_error)
        };
        ResponseKind::LeaveGroup(response)
    }

    /// OffsetCommit (and the admin's AlterConsumerGroupOffsets, which is one). As in
    /// Kafka, a partition the cluster does not have (`known` says which it has) gets
    /// UNKNOWN_TOPIC_OR_PARTITION and nothing is stored for it, whatever the group's
    /// state; the others are checked against the group ([`Group::check_commit`]) and
    /// stored. A request with no known partition does not touch the group at all.
    pub(crate) async fn offset_commit(
        &self,
        request: OffsetCommitRequest,
        _version: i16,
        known: impl Fn(&str, i32) -> bool,
    ) -> ResponseKind {
        let unknown = ResponseError::UnknownTopicOrPartition.code();
        // Each partition's answer, filled in below where it is not already UNKNOWN_TOPIC_OR_PARTITION.
        let mut codes: Vec<Vec<Option<i16>>> = request
            .topics
            .iter()
            .map(|t| t.partitions.iter().map(|p| (!known(&t.name, p.partition_index)).then_some(unknown)).collect())
            .collect();
        let respond = |codes: Vec<Vec<Option<i16>>>, rest: i16| {
            let topics = request
                .topics
                .iter()
                .zip(codes)
                .map(|(t, codes)| {
                    offset_commit_response::OffsetCommitResponseTopic::default().with_name(t.name.clone()).with_partitions(
                        t.partitions
                            .iter()
                            .zip(codes)
                            .map(|(p, code)| {
                                offset_commit_response::OffsetCommitResponsePartition::default()
                                    .with_partition_index(p.partition_index)
                                    .with_error_code(code.unwrap_or(rest))
                            })
                            .collect(),
                    )
                })
                .collect();
            ResponseKind::OffsetCommit(OffsetCommitResponse::default().with_topics(topics))
        };
        if codes.iter().flatten().all(Option::is_some) {
            return respond(codes, 0);
        }
        let entry = match self.entry(&request.group_id).await {
            Ok(entry) => entry,
            Err(e) => return respond(codes, e.code()),
        };
        let mut entry = entry.lock().await;
        let generation = request.generation_id_or_member_epoch;
        let check = if !entry.exists() && generation >= 0 {
            // Kafka: a member's commit to a group that does not exist comes from a
            // generation that is gone.
            Err(ResponseError::IllegalGeneration)
        } else {
            entry.group.check_commit(&request.member_id, request.group_instance_id.as_deref(), generation, Instant::now())
        };
        if let Err(e) = check {
            return respond(codes, e.code());
        }
        let now_ms = now_ms();
        for (topic, codes) in request.topics.iter().zip(codes.iter_mut()) {
            for (p, code) in topic.partitions.iter().zip(codes.iter_mut()) {
                if code.is_some() {
                    continue;
                }
                let metadata = p.committed_metadata.as_ref().map(|m| m.to_string()).unwrap_or_default();
                *code = Some(if metadata.len() > self.inner.config.offset_metadata_max_bytes {
                    ResponseError::OffsetMetadataTooLarge.code()
                } else {
                    let committed = CommittedOffset {
                        offset: p.committed_offset,
                        leader_epoch: p.committed_leader_epoch,
                        metadata,
                        commit_timestamp_ms: now_ms,
                    };
                    match self.inner.store_offset(&request.group_id, &topic.name, p.partition_index, &committed).await {
                        Ok(()) => {
                            entry.offsets.insert((topic.name.to_string(), p.partition_index), committed);
                            0
                        }
                        Err(e) => {
                            tracing::warn!(group = %request.group_id.as_str(), error = %e, "offset commit failed");
                            ResponseError::CoordinatorNotAvailable.code()
                        }
                    }
                });
            }
        }
        respond(codes, 0)
    }

    pub(crate) async fn offset_fetch(&self, request: OffsetFetchRequest, version: i16) -> ResponseKind {
        if version >= 8 {
            let mut groups = Vec::with_capacity(request.groups.len());
            for g in &request.groups {
                let wanted =
                    g.topics.as_ref().map(|ts| ts.iter().map(|t| (t.name.clone(), t.partition_indexes.clone())).collect());
                groups.push(self.offset_fetch_group(&g.group_id, wanted).await);
            }
            return ResponseKind::OffsetFetch(OffsetFetchResponse::default().with_groups(groups));
        }
        // Before v8 a request names one group, and the answer carries that group's
        // error code and topics at the top level, in types of their own.
        let wanted = request.topics.as_ref().map(|ts| ts.iter().map(|t| (t.name.clone(), t.partition_indexes.clone())).collect());
        let group = self.offset_fetch_group(&request.group_id, wanted).await;
        let topics = group
            .topics
            .into_iter()
            .map(|t| {
                offset_fetch_response::OffsetFetchResponseTopic::default().with_name(t.name).with_partitions(
                    t.partitions
                        .into_iter()
                        .map(|p| {
                            offset_fetch_response::OffsetFetchResponsePartition::default()
                                .with_partition_index(p.partition_index)
                                .with_committed_offset(p.committed_offset)
                                .with_committed_leader_epoch(p.committed_leader_epoch)
                                .with_metadata(p.metadata)
                                .with_error_code(p.error_code)
                        })
                        .collect(),
                )
            })
            .collect();
        ResponseKind::OffsetFetch(OffsetFetchResponse::default().with_error_code(group.error_code).with_topics(topics))
    }

    /// One group's OffsetFetch answer: the committed offset, leader epoch and metadata of
    /// each requested partition (every committed one when `wanted` is `None`), -1 for a
    /// partition never committed; the group's error code and no topics when the group
    /// cannot be read here.
    async fn offset_fetch_group(
        &self,
        group_id: &GroupId,
        wanted: Option<Vec<(TopicName, Vec<i32>)>>,
    ) -> offset_fetch_response::OffsetFetchResponseGroup {
        let (code, found) = match self.committed(group_id, wanted).await {
            Ok(found) => (0, found),
            Err(e) => (e.code(), Vec::new()),
        };
        let topics = found
            .into_iter()
            .map(|(name, partitions)| {
                offset_fetch_response::OffsetFetchResponseTopics::default().with_name(name).with_partitions(
                    partitions
                        .into_iter()
                        .map(|(p, c)| {
                            offset_fetch_response::OffsetFetchResponsePartitions::default()
                                .with_partition_index(p)
                                .with_committed_offset(c.as_ref().map_or(-1, |c| c.offset))
                                .with_committed_leader_epoch(c.as_ref().map_or(-1, |c| c.leader_epoch))
                                .with_metadata(Some(StrBytes::from_string(c.map(|c| c.metadata).unwrap_or_default())))
                        })
                        .collect(),
                )
            })
            .collect();
        offset_fetch_response::OffsetFetchResponseGroup::default()
            .with_group_id(group_id.clone())
            .with_error_code(code)
            .with_topics(topics)
    }

    /// Committed offsets of the requested partitions (all committed ones when
    /// `wanted` is `None`), grouped by topic; `None` for a partition never committed.
    async fn committed(
        &self,
        group_id: &GroupId,
        wanted: Option<Vec<(TopicName, Vec<i32>)>>,
    ) -> Result<Vec<(TopicName, Vec<(i32, Option<CommittedOffset>)>)>, ResponseError> {
        // A group that does not exist has nothing committed; looking does not create it.
        let Some(entry) = self.lookup(group_id).await? else {
            return Ok(wanted
                .unwrap_or_default()
                .into_iter()
                .map(|(topic, partitions)| (topic, partitions.into_iter().map(|p| (p, None)).collect()))
                .collect());
        };
        let entry = entry.lock().await;
        Ok(match wanted {
            Some(wanted) => wanted
                .into_iter()
                .map(|(topic, partitions)| {
                    let found =
                        partitions.into_iter().map(|p| (p, entry.offsets.get(&(topic.to_string(), p)).cloned())).collect();
                    (topic, found)
                })
                .collect(),
            None => {
                let mut by_topic: BTreeMap<String, Vec<(i32, Option<CommittedOffset>)>> = BTreeMap::new();
                for ((topic, p), c) in &entry.offsets {
                    by_topic.entry(topic.clone()).or_default().push((*p, Some(c.clone())));
                }
                by_topic.into_iter().map(|(t, ps)| (TopicName(StrBytes::from_string(t)), ps)).collect()
            }
        })
    }

    /// ListGroups: the groups this broker coordinates, as Kafka lists only the groups
    /// of the offsets partitions a broker leads, so that a client asking every broker
    /// (librdkafka's list_groups, DescribeGroups after it) finds each group exactly once,
    /// at its coordinator. Groups known only from the registry (with offsets, but not
    /// touched since this broker started) are listed as Empty by the broker that holds
    /// or takes their coordinator node, as FindCoordinator would make it.
    pub(crate) async fn list_groups(&self, request: ListGroupsRequest) -> ResponseKind {
        let mut names: BTreeSet<String> = self.inner.groups.lock().expect("groups lock").keys().cloned().collect();
        match self.inner.store.children(paths::CONSUMERS).await {
            Ok(nodes) => names.extend(nodes.iter().map(|node| group_id_of(node))),
            Err(fjord_coord::Error::NoNode { .. }) => {}
            Err(e) => tracing::warn!(error = %e, "cannot list the group registry"),
        }
        let mut listed: Vec<(String, String, &'static str)> = Vec::new();
        for name in names {
            // NOT_COORDINATOR (another broker's group) and store errors leave it out here.
            let Ok(Some(entry)) = self.lookup(&name).await else { continue };
            let entry = entry.lock().await;
            let protocol_type = entry.group.protocol_type.clone().unwrap_or_else(|| "consumer".to_string());
            listed.push((name, protocol_type, entry.group.state.name()));
        }
        let states: Vec<String> = request.states_filter.iter().map(|s| s.to_lowercase()).collect();
        let types: Vec<String> = request.types_filter.iter().map(|s| s.to_lowercase()).collect();
        let groups = listed
            .into_iter()
            .filter(|(_, _, state)| states.is_empty() || states.contains(&state.to_lowercase()))
            .filter(|_| types.is_empty() || types.contains(&"classic".to_string()))
            .map(|(name, protocol_type, state)| {
                list_groups_response::ListedGroup::default()
                    .with_group_id(GroupId(StrBytes::from_string(name)))
                    .with_protocol_type(StrBytes::from_string(protocol_type))
                    .with_group_state(StrBytes::from_static_str(state))
                    .with_group_type(StrBytes::from_static_str("classic"))
            })
            .collect();
        ResponseKind::ListGroups(ListGroupsResponse::default().with_groups(groups))
    }

    pub(crate) async fn describe_groups(&self, request: DescribeGroupsRequest) -> ResponseKind {
        let mut described = Vec::new();
        for group_id in request.groups {
            let mut out = describe_groups_response::DescribedGroup::default().with_group_id(group_id.clone());
            match self.lookup(&group_id).await {
                Err(e) => out = out.with_error_code(e.code()).with_group_state(StrBytes::from_static_str("Dead")),
                // Kafka's answer for a group that does not exist: no error, state Dead.
                Ok(None) => out = out.with_group_state(StrBytes::from_static_str("Dead")),
                Ok(Some(entry)) => {
                    let entry = entry.lock().await;
                    let group = &entry.group;
                    let members = group
                        .members
                        .values()
                        .map(|m| {
                            describe_groups_response::DescribedGroupMember::default()
                                .with_member_id(StrBytes::from_string(m.member_id.clone()))
                                .with_group_instance_id(m.group_instance_id.clone().map(StrBytes::from_string))
                                .with_client_id(StrBytes::from_string(m.client_id.clone()))
                                .with_client_host(StrBytes::from_string(m.client_host.clone()))
                                .with_member_metadata(group.member_metadata(m))
                                .with_member_assignment(m.assignment.clone())
                        })
                        .collect();
                    out = out
                        .with_group_state(StrBytes::from_static_str(group.state.name()))
                        .with_protocol_type(StrBytes::from_string(group.protocol_type.clone().unwrap_or_default()))
                        .with_protocol_data(StrBytes::from_string(group.protocol_name.clone().unwrap_or_default()))
                        .with_members(members);
                }
            }
            described.push(out);
        }
        ResponseKind::DescribeGroups(DescribeGroupsResponse::default().with_groups(described))
    }

    pub(crate) async fn delete_groups(&self, request: DeleteGroupsRequest) -> ResponseKind {
        let mut results = Vec::new();
        for group_id in request.groups_names {
            let code = match self.delete_group(&group_id).await {
                Ok(()) => 0,
                Err(e) => e.code(),
            };
            results.push(delete_groups_response::DeletableGroupResult::default().with_group_id(group_id).with_error_code(code));
        }
        ResponseKind::DeleteGroups(DeleteGroupsResponse::default().with_results(results))
    }

    async fn delete_group(&self, group_id: &str) -> Result<(), ResponseError> {
        let entry = self.lookup(group_id).await?.ok_or(ResponseError::GroupIdNotFound)?;
        let entry = entry.lock().await;
        if entry.group.state != GroupState::Empty {
            return Err(ResponseError::NonEmptyGroup);
        }
        if !entry.exists() {
            return Err(ResponseError::GroupIdNotFound);
        }
        self.inner.groups.lock().expect("groups lock").remove(group_id);
        fjord_coord::delete_all(&*self.inner.store, &group_root(group_id))
            .await
            .map_err(|_| ResponseError::CoordinatorNotAvailable)
    }
}

impl Inner {
    /// Makes sure `/consumers/<group>/coordinator` names a broker, taking it for this
    /// broker if nobody holds it. Returns the holder's broker id.
    async fn claim(&self, group_id: &str) -> Result<i32, ResponseError> {
        #[derive(Serialize, Deserialize)]
        struct Holder {
            broker_id: i32,
        }
        let path = paths::group_coordinator(&group_node(group_id));
        let store: &dyn MetadataStore = &*self.store;
        let unavailable = |e: fjord_coord::Error| {
            tracing::warn!(group = group_id, error = %e, "coordinator registry unavailable");
            ResponseError::CoordinatorNotAvailable
        };
        loop {
            if let Some((holder, _)) = registry::read_json::<Holder>(store, &path).await.map_err(unavailable)? {
                return Ok(holder.broker_id);
            }
            let me = registry::to_json(&Holder { broker_id: self.endpoint.broker_id });
            match fjord_coord::create_all(store, &path, &me, CreateMode::Ephemeral).await {
                Ok(_) => return Ok(self.endpoint.broker_id),
                Err(fjord_coord::Error::NodeExists { .. }) => continue, // someone else won: read who
                Err(e) => return Err(unavailable(e)),
            }
        }
    }

    async fn load_offsets(&self, group_id: &str) -> fjord_coord::Result<BTreeMap<(String, i32), CommittedOffset>> {
        let store: &dyn MetadataStore = &*self.store;
        let root = format!("{}/offsets", group_root(group_id));
        let mut offsets = BTreeMap::new();
        let topics = match store.children(&root).await {
            Ok(topics) => topics,
            Err(fjord_coord::Error::NoNode { .. }) => return Ok(offsets),
            Err(e) => return Err(e),
        };
        for topic in topics {
            for partition in store.children(&format!("{root}/{topic}")).await? {
                let Ok(p) = partition.parse::<i32>() else { continue };
                let path = paths::group_offset(&group_node(group_id), &topic, p);
                if let Some((committed, _)) = registry::read_json::<CommittedOffset>(store, &path).await? {
                    offsets.insert((topic.clone(), p), committed);
                }
            }
        }
        Ok(offsets)
    }

    async fn store_offset(
        &self,
        group_id: &str,
        topic: &str,
        partition: i32,
        committed: &CommittedOffset,
    ) -> fjord_coord::Result<()> {
        let store: &dyn MetadataStore = &*self.store;
        let path = paths::group_offset(&group_node(group_id), topic, partition);
        let data = registry::to_json(committed);
        match store.set(&path, &data, None).await {
            Err(fjord_coord::Error::NoNode { .. }) => {
                match fjord_coord::create_all(store, &path, &data, CreateMode::Persistent).await {
                    Err(fjord_coord::Error::NodeExists { .. }) => store.set(&path, &data, None).await.map(drop),
                    other => other.map(drop),
                }
            }
            other => other.map(drop),
        }
    }

    /// Rewrites `/consumers/<group>/owners` to show who owns each partition in
    /// `generation` (nothing when `assignments` is empty). Errors are logged: the
    /// registry is informational, the group protocol does not depend on it.
    async fn write_owners(&self, group_id: &str, generation: i32, protocol_type: Option<&str>, assignments: &[(String, Bytes)]) {
        let mut written = self.owners_written.lock().await;
        if written.get(group_id).is_some_and(|&g| g > generation) {
            return;
        }
        written.insert(group_id.to_string(), generation);
        let store: &dyn MetadataStore = &*self.store;
        let root = format!("{}/owners", group_root(group_id));
        if let Err(e) = fjord_coord::delete_all(store, &root).await {
            tracing::warn!(group = group_id, error = %e, "could not clear the ownership registry");
            return;
        }
        if protocol_type != Some("consumer") {
            return;
        }
        for (member_id, assignment) in assignments {
            let Some(partitions) = decode_assignment(assignment) else {
                tracing::debug!(group = group_id, member = %member_id, "assignment is not in the consumer protocol format");
                continue;
            };
            for (topic, partition) in partitions {
                // The assignment is the leader's bytes: a name that is no topic name
                // would be a path of its own making.
                if crate::topics::validate_topic_name(&topic).is_err() {
                    continue;
                }
                let path = paths::group_owner(&group_node(group_id), &topic, partition);
                if let Err(e) = fjord_coord::create_all(store, &path, member_id.as_bytes(), CreateMode::Ephemeral).await {
                    tracing::warn!(group = group_id, path, error = %e, "could not write the ownership registry");
                }
            }
        }
    }

    async fn tick(&self) {
        let entries: Vec<(String, Arc<Mutex<GroupEntry>>)> =
            self.groups.lock().expect("groups lock").iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        for (group_id, entry) in entries {
            let emptied = {
                let mut entry = entry.lock().await;
                let before = entry.group.state;
                let replies = entry.group.tick(Instant::now());
                replies.into_iter().for_each(Reply::deliver);
                (before != GroupState::Empty && entry.group.state == GroupState::Empty).then_some(entry.group.generation_id)
            };
            if let Some(generation) = emptied {
                self.write_owners(&group_id, generation, None, &[]).await;
            }
        }
    }
}

async fn ticker(inner: Weak<Inner>) {
    let mut periodic = Periodic::new(TICK);
    loop {
        periodic.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        inner.tick().await;
    }
}

/// The (topic, partition) pairs of a consumer-protocol assignment.
fn decode_assignment(bytes: &Bytes) -> Option<Vec<(String, i32)>> {
    let mut buf = bytes.clone();
    if buf.len() < 2 {
        return None;
    }
    let version = i16::from_be_bytes([buf[0], buf[1]]);
    let _ = bytes::Buf::get_i16(&mut buf);
    let assignment = consumer_protocol_assignment::ConsumerProtocolAssignment::decode(&mut buf, version.clamp(0, 3)).ok()?;
    Some(
        assignment
            .assigned_partitions
            .into_iter()
            .flat_map(|tp| {
                let topic = tp.topic.to_string();
                tp.partitions.into_iter().map(move |p| (topic.clone(), p))
            })
            .collect(),
    )
}

/// `/consumers/<group>`, with the group id as [`group_node`] names it.
fn group_root(group_id: &str) -> String {
    format!("{}/{}", paths::CONSUMERS, group_node(group_id))
}

/// The registry node name of a group id. Kafka takes almost any string as a group id,
/// and the store's node names cannot be any string: a `/` would make nested nodes (group
/// `a/offsets/t` would write inside group `a`'s offsets), `.` and `..` are not node names,
/// and ZooKeeper refuses control characters and two Unicode ranges. Those characters,
/// and `%` itself so that the name can be read back, are percent-encoded (UTF-8 bytes);
/// every other group id is its own node name, as before. (A group committed before this
/// encoding under a name with `%` in it is read back as the decoded name: see
/// [`group_id_of`].)
fn group_node(group_id: &str) -> String {
    if group_id == "." || group_id == ".." {
        return group_id.replace('.', "%2E");
    }
    let escaped = |c: char| {
        c == '/' || c == '%' || c.is_control() || ('\u{E000}'..='\u{F8FF}').contains(&c) || ('\u{FFF0}'..='\u{FFFF}').contains(&c)
    };
    if !group_id.chars().any(escaped) {
        return group_id.to_string();
    }
    let mut node = String::with_capacity(group_id.len() + 8);
    for c in group_id.chars() {
        if escaped(c) {
            let mut utf8 = [0u8; 4];
            for b in c.encode_utf8(&mut utf8).bytes() {
                node.push_str(&format!("%{b:02X}"));
            }
        } else {
            node.push(c);
        }
    }
    node
}

/// The group id a registry node names ([`group_node`] undone). A node whose `%`
/// escapes do not decode is taken as written.
fn group_id_of(node: &str) -> String {
    if !node.contains('%') {
        return node.to_string();
    }
    let bytes = node.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex =
                bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok()).and_then(|h| u8::from_str_radix(h, 16).ok());
            match hex {
                Some(b) => {
                    out.push(b);
                    i += 3;
                    continue;
                }
                None => return node.to_string(),
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap_or_else(|_| node.to_string())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_ids_become_single_node_names_and_back() {
        for (id, node) in [
            ("plain-group.1", "plain-group.1"),
            ("team/a", "team%2Fa"),
            ("50%", "50%25"),
            (".", "%2E"),
            ("..", "%2E%2E"),
            ("a..b", "a..b"),
            ("tab\there", "tab%09here"),
            ("é ü", "é ü"),
            ("\u{E000}", "%EE%80%80"),
        ] {
            assert_eq!(group_node(id), node, "{id:?}");
            assert_eq!(group_id_of(node), id, "{node:?}");
            assert!(fjord_coord::validate_path(&group_root(id)).is_ok(), "{id:?}");
        }
        // Not written by group_node: taken as it is.
        assert_eq!(group_id_of("100%"), "100%");
        assert_eq!(group_id_of("%zz"), "%zz");
    }
}
