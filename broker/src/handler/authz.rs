//! Authorization of the group APIs, whose requests name groups (and OffsetCommit's
//! topics) that are checked one by one: a denied group or topic is answered with
//! Kafka's code and left out of what the coordinator sees; the rest go through.

use fjord_auth::{Operation, Resource, ResourceType};
use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::delete_acls_response::DeleteAclsFilterResult;
use kafka_protocol::messages::elect_leaders_response::{PartitionResult, ReplicaElectionResult};
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::offset_commit_response::{OffsetCommitResponsePartition, OffsetCommitResponseTopic};
use kafka_protocol::messages::offset_fetch_response::OffsetFetchResponseGroup;
use kafka_protocol::messages::{
    delete_groups_response, describe_groups_response, AlterClientQuotasResponse, AlterPartitionReassignmentsResponse,
    AlterUserScramCredentialsResponse, BrokerId, CreateAclsResponse, DeleteAclsResponse, DescribeAclsResponse,
    DescribeClientQuotasResponse, DescribeUserScramCredentialsResponse, ElectLeadersResponse, FindCoordinatorResponse, GroupId,
    HeartbeatResponse, InitProducerIdResponse, JoinGroupResponse, LeaveGroupResponse, ListPartitionReassignmentsResponse,
    OffsetCommitRequest, OffsetFetchResponse, ProducerId, RequestKind, ResponseKind, SyncGroupResponse,
};

use crate::codec::error_code::{
    CLUSTER_AUTHORIZATION_FAILED, GROUP_AUTHORIZATION_FAILED, TOPIC_AUTHORIZATION_FAILED, TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
};
use crate::connection::Session;
use crate::handler::Broker;

/// FindCoordinator's key type of a consumer group (1 is a transactional id).
const KEY_TYPE_GROUP: i8 = 0;

/// Kafka's operations per resource type (`AclEntry.supportedOperations`): what an
/// "authorized operations" answer (Metadata, DescribeGroups, DescribeCluster) may list.
fn supported_operations(resource_type: ResourceType) -> &'static [Operation] {
    use Operation::*;
    match resource_type {
        ResourceType::Topic => &[Read, Write, Create, Describe, Delete, Alter, DescribeConfigs, AlterConfigs],
        ResourceType::Group => &[Read, Describe, Delete],
        ResourceType::Cluster => &[Create, ClusterAction, DescribeConfigs, AlterConfigs, IdempotentWrite, Alter, Describe],
        ResourceType::TransactionalId => &[Describe, Write],
        // The schema registry's; no Kafka API describes one.
        ResourceType::Subject => &[Describe, Write, Delete, Alter],
    }
}

impl Broker {
    /// The operations the client may perform on `resource`, as Kafka's bit field (bit
    /// `n` for the operation with code `n`). Without an authorizer every supported
    /// operation is allowed, and all are listed, as Kafka does.
    pub(crate) fn authorized_operations(&self, session: &Session, resource: Resource<'_>) -> i32 {
        supported_operations(resource.resource_type)
            .iter()
            .filter(|op| self.authorize(session, **op, resource))
            .fold(0, |bits, op| bits | 1 << op.code())
    }

    fn may_group(&self, session: &Session, operation: Operation, group: &GroupId) -> bool {
        self.authorize(session, operation, Resource::group(group.as_str()))
    }

    /// The whole answer to a single-group request the client may not make (Kafka: Read on
    /// the group for JoinGroup, SyncGroup, Heartbeat, LeaveGroup, and OffsetCommit; Describe
    /// for OffsetFetch before v8), or `None` to handle it.
    pub(crate) fn refuse_group_request(&self, session: &Session, request: &RequestKind, version: i16) -> Option<ResponseKind> {
        let read = |group: &GroupId| self.may_group(session, Operation::Read, group);
        let describe = |group: &str| self.authorize(session, Operation::Describe, Resource::group(group));
        let code = GROUP_AUTHORIZATION_FAILED;
        Some(match request {
            RequestKind::JoinGroup(r) if !read(&r.group_id) => {
                ResponseKind::JoinGroup(JoinGroupResponse::default().with_error_code(code))
            }
            RequestKind::SyncGroup(r) if !read(&r.group_id) => {
                ResponseKind::SyncGroup(SyncGroupResponse::default().with_error_code(code))
            }
            RequestKind::Heartbeat(r) if !read(&r.group_id) => {
                ResponseKind::Heartbeat(HeartbeatResponse::default().with_error_code(code))
            }
            RequestKind::LeaveGroup(r) if !read(&r.group_id) => {
                ResponseKind::LeaveGroup(LeaveGroupResponse::default().with_error_code(code))
            }
            RequestKind::OffsetCommit(r) if !read(&r.group_id) => {
                let topics =
                    r.topics.iter().map(|t| committed(t.name.clone(), t.partitions.iter().map(|p| p.partition_index), code));
                ResponseKind::OffsetCommit(
                    kafka_protocol::messages::OffsetCommitResponse::default().with_topics(topics.collect()),
                )
            }
            RequestKind::OffsetFetch(r) if version < 8 && !self.may_group(session, Operation::Describe, &r.group_id) => {
                ResponseKind::OffsetFetch(OffsetFetchResponse::default().with_error_code(code))
            }
            RequestKind::FindCoordinator(r) if version < 4 && r.key_type == KEY_TYPE_GROUP && !describe(&r.key) => {
                ResponseKind::FindCoordinator(
                    FindCoordinatorResponse::default().with_error_code(code).with_node_id(BrokerId(-1)).with_port(-1),
                )
            }
            _ => return None,
        })
    }

    /// FindCoordinator v4+ batches keys: each group the client may not Describe gets
    /// GROUP_AUTHORIZATION_FAILED instead of its coordinator.
    pub(crate) fn hide_coordinators(&self, session: &Session, key_type: i8, response: &mut ResponseKind) {
        let ResponseKind::FindCoordinator(r) = response else { return };
        if key_type != KEY_TYPE_GROUP {
            return;
        }
        for c in r.coordinators.iter_mut() {
            if !self.authorize(session, Operation::Describe, Resource::group(c.key.as_str())) {
                *c = Coordinator::default()
                    .with_key(c.key.clone())
                    .with_error_code(GROUP_AUTHORIZATION_FAILED)
                    .with_node_id(BrokerId(-1))
                    .with_port(-1);
            }
        }
    }

    /// The whole answer to a cluster-level request the client may not make, or `None` to
    /// handle it. Kafka: Alter on the cluster for CreateAcls, DeleteAcls,
    /// AlterUserScramCredentials and ElectLeaders; Describe for DescribeAcls and
    /// DescribeUserScramCredentials; InitProducerId without a transactional id needs
    /// IdempotentWrite on the cluster or Write on some topic, with one Write on it.
    pub(crate) fn refuse_cluster_request(&self, session: &Session, request: &RequestKind) -> Option<ResponseKind> {
        let cluster = |operation| self.authorize(session, operation, Resource::cluster());
        let code = CLUSTER_AUTHORIZATION_FAILED;
        Some(match request {
            RequestKind::CreateAcls(r) if !cluster(Operation::Alter) => ResponseKind::CreateAcls(
                CreateAclsResponse::default()
                    .with_results(r.creations.iter().map(|_| AclCreationResult::default().with_error_code(code)).collect()),
            ),
            RequestKind::DeleteAcls(r) if !cluster(Operation::Alter) => {
                ResponseKind::DeleteAcls(DeleteAclsResponse::default().with_filter_results(
                    r.filters.iter().map(|_| DeleteAclsFilterResult::default().with_error_code(code)).collect(),
                ))
            }
            RequestKind::DescribeAcls(_) if !cluster(Operation::Describe) => {
                ResponseKind::DescribeAcls(DescribeAclsResponse::default().with_error_code(code))
            }
            RequestKind::DescribeUserScramCredentials(_) if !cluster(Operation::Describe) => {
                ResponseKind::DescribeUserScramCredentials(DescribeUserScramCredentialsResponse::default().with_error_code(code))
            }
            RequestKind::AlterUserScramCredentials(r) if !cluster(Operation::Alter) => {
                let users = r.deletions.iter().map(|d| &d.name).chain(r.upsertions.iter().map(|u| &u.name));
                let results =
                    users.map(|user| AlterUserScramCredentialsResult::default().with_user(user.clone()).with_error_code(code));
                ResponseKind::AlterUserScramCredentials(
                    AlterUserScramCredentialsResponse::default().with_results(results.collect()),
                )
            }
            RequestKind::ElectLeaders(r) if !cluster(Operation::Alter) => {
                // v0 has no top-level error: every named partition carries it too.
                let results = r.topic_partitions.iter().flatten().map(|t| {
                    ReplicaElectionResult::default().with_topic(t.topic.clone()).with_partition_result(
                        t.partitions
                            .iter()
                            .map(|&p| PartitionResult::default().with_partition_id(p).with_error_code(code))
                            .collect(),
                    )
                });
                ResponseKind::ElectLeaders(
                    ElectLeadersResponse::default().with_error_code(code).with_replica_election_results(results.collect()),
                )
            }
            // Kafka: DescribeConfigs / AlterConfigs on the cluster for client quotas.
            RequestKind::DescribeClientQuotas(_) if !cluster(Operation::DescribeConfigs) => ResponseKind::DescribeClientQuotas(
                DescribeClientQuotasResponse::default().with_error_code(code).with_error_message(Some(
                    kafka_protocol::protocol::StrBytes::from_static_str("Cluster authorization failed."),
                )),
            ),
            RequestKind::AlterClientQuotas(r) if !cluster(Operation::AlterConfigs) => {
                let denied = |entry| {
                    let outcome = Err((code, "Cluster authorization failed.".to_owned()));
                    crate::handler::client_quotas::alter_result(entry, outcome)
                };
                ResponseKind::AlterClientQuotas(
                    AlterClientQuotasResponse::default().with_entries(r.entries.iter().map(denied).collect()),
                )
            }
            // Kafka: Alter on the cluster to reassign, Describe to list.
            RequestKind::AlterPartitionReassignments(_) if !cluster(Operation::Alter) => {
                ResponseKind::AlterPartitionReassignments(AlterPartitionReassignmentsResponse::default().with_error_code(code))
            }
            RequestKind::ListPartitionReassignments(_) if !cluster(Operation::Describe) => {
                ResponseKind::ListPartitionReassignments(ListPartitionReassignmentsResponse::default().with_error_code(code))
            }
            RequestKind::InitProducerId(r) => match &r.transactional_id {
                Some(id) if !self.authorize(session, Operation::Write, Resource::transactional_id(id.as_str())) => {
                    ResponseKind::InitProducerId(
                        InitProducerIdResponse::default()
                            .with_error_code(TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
                            .with_producer_id(ProducerId(-1))
                            .with_producer_epoch(-1),
                    )
                }
                None if !cluster(Operation::IdempotentWrite) && !self.may_write_some_topic(session) => {
                    ResponseKind::InitProducerId(
                        InitProducerIdResponse::default()
                            .with_error_code(code)
                            .with_producer_id(ProducerId(-1))
                            .with_producer_epoch(-1),
                    )
                }
                _ => return None,
            },
            _ => return None,
        })
    }

    /// Kafka's "Write on any topic" for idempotent producers: some topic ACL pattern
    /// (literal, wildcard or prefix) under which the principal may Write.
    fn may_write_some_topic(&self, session: &Session) -> bool {
        let Some(acls) = &self.acls else { return true };
        let snapshot = acls.authorizer();
        snapshot
            .acls()
            .keys()
            .filter(|pattern| pattern.resource_type == ResourceType::Topic)
            .any(|pattern| self.authorize(session, Operation::Write, Resource::topic(&pattern.name)))
    }

    /// OffsetCommit also needs Read on each topic: the denied topics leave the request and
    /// come back as TOPIC_AUTHORIZATION_FAILED answers to add to the response.
    pub(crate) fn take_unreadable_topics(
        &self,
        session: &Session,
        request: &mut OffsetCommitRequest,
    ) -> Vec<OffsetCommitResponseTopic> {
        let (allowed, denied) = std::mem::take(&mut request.topics)
            .into_iter()
            .partition(|t| self.authorize(session, Operation::Read, Resource::topic(t.name.as_str())));
        request.topics = allowed;
        denied
            .into_iter()
            .map(|t| committed(t.name, t.partitions.iter().map(|p| p.partition_index), TOPIC_AUTHORIZATION_FAILED))
            .collect()
    }

    /// Removes the groups the client may not `operation` from `groups` and returns them.
    pub(crate) fn take_denied_groups(&self, session: &Session, operation: Operation, groups: &mut Vec<GroupId>) -> Vec<GroupId> {
        let (allowed, denied) = std::mem::take(groups).into_iter().partition(|g| self.may_group(session, operation, g));
        *groups = allowed;
        denied
    }

    /// Adds GROUP_AUTHORIZATION_FAILED entries for `denied` to a multi-group response
    /// (DescribeGroups, DeleteGroups, OffsetFetch v8+), and keeps in ListGroups only the
    /// groups the client may Describe unless it may Describe the cluster.
    pub(crate) fn add_denied_groups(&self, session: &Session, response: &mut ResponseKind, denied: Vec<GroupId>) {
        let code = GROUP_AUTHORIZATION_FAILED;
        match response {
            ResponseKind::DescribeGroups(r) => r.groups.extend(
                denied
                    .into_iter()
                    .map(|g| describe_groups_response::DescribedGroup::default().with_group_id(g).with_error_code(code)),
            ),
            ResponseKind::DeleteGroups(r) => r.results.extend(
                denied
                    .into_iter()
                    .map(|g| delete_groups_response::DeletableGroupResult::default().with_group_id(g).with_error_code(code)),
            ),
            ResponseKind::OffsetFetch(r) => r
                .groups
                .extend(denied.into_iter().map(|g| OffsetFetchResponseGroup::default().with_group_id(g).with_error_code(code))),
            ResponseKind::ListGroups(r) if !self.authorize(session, Operation::Describe, Resource::cluster()) => {
                r.groups.retain(|g| self.may_group(session, Operation::Describe, &g.group_id))
            }
            _ => {}
        }
    }
}

fn committed(
    name: kafka_protocol::messages::TopicName,
    partitions: impl Iterator<Item = i32>,
    code: i16,
) -> OffsetCommitResponseTopic {
    OffsetCommitResponseTopic::default().with_name(name).with_partitions(
        partitions.map(|p| OffsetCommitResponsePartition::default().with_partition_index(p).with_error_code(code)).collect(),
    )
}
