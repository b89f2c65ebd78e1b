//! ListGroups, DescribeGroups and DeleteGroups.

use std::collections::BTreeSet;
use std::time::Instant;

use fjord_coord::paths;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use super::registry::{group_id_of, group_root};
use super::state::{GroupState, Reply};
use super::GroupCoordinator;

impl GroupCoordinator {
    /// ListGroups: the groups this broker coordinates, as Kafka lists only the groups
    /// of the offsets partitions a broker leads, so that a client asking every broker
    /// (librdkafka's list_groups, DescribeGroups after it) finds each group exactly once,
    /// at its coordinator. Groups known only from the registry (with offsets, but not in
    /// memory here) are listed as Empty by the broker that holds or takes their
    /// coordinator node, as FindCoordinator would make it, without being loaded: lag
    /// exporters list groups every few seconds, and each listing loaded every group of
    /// the registry (all its offsets) and kept it in memory for ten minutes.
    pub(crate) async fn list_groups(&self, request: ListGroupsRequest) -> ResponseKind {
        let in_memory: BTreeSet<String> = self.inner.groups.lock().expect("groups lock").keys().cloned().collect();
        let mut names = in_memory.clone();
        match self.inner.store.children(paths::CONSUMERS).await {
            Ok(nodes) => names.extend(nodes.iter().map(|node| group_id_of(node))),
            Err(fjord_coord::Error::NoNode { .. }) => {}
            Err(e) => tracing::warn!(error = %e, "cannot list the group registry"),
        }
        let mut listed: Vec<(String, String, &'static str)> = Vec::new();
        for name in names {
            if !in_memory.contains(&name) {
                // NOT_COORDINATOR (another broker's group) and store errors leave it out.
                if let Ok(true) = self.inner.registry_group_is_listed_here(&name).await {
                    listed.push((name, "consumer".to_string(), GroupState::Empty.name()));
                }
                continue;
            }
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
        let mut entry = entry.lock().await;
        // The ticker expires sessions every TICK; a member whose session ran out before
        // this request is gone now, as with Kafka's exact timers (librdkafka's 0081
        // deletes its group a session timeout after its static members close).
        let before = entry.group.state;
        entry.group.tick(Instant::now()).into_iter().for_each(Reply::deliver);
        if entry.group.state != GroupState::Empty {
            return Err(ResponseError::NonEmptyGroup);
        }
        if !entry.exists() {
            if before != GroupState::Empty {
                // Emptied just now: clear the ownership registry, as the ticker would.
                self.inner.write_owners(group_id, entry.group.generation_id, None, &[]).await;
            }
            return Err(ResponseError::GroupIdNotFound);
        }
        self.inner.groups.lock().expect("groups lock").remove(group_id);
        fjord_coord::delete_all(&*self.inner.store, &group_root(group_id))
            .await
            .map_err(|_| ResponseError::CoordinatorNotAvailable)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;

    use super::*;
    use crate::group::{Endpoint, GroupConfig};

    /// librdkafka's 0081 closes static members (they send no LeaveGroup), waits their
    /// session timeout and deletes the group; the ticker runs every TICK, so without
    /// expiring overdue members first, DeleteGroups could come between the deadline
    /// and the next tick and find the group not empty. The test blocks its only runtime
    /// thread past the deadline, so the ticker cannot run in between.
    #[tokio::test(flavor = "current_thread")]
    async fn delete_groups_expires_a_session_that_ran_out_before_the_next_tick() {
        let dir = tempfile::tempdir().unwrap();
        let store = fjord_coord::open(None, dir.path()).await.unwrap();
        let config = GroupConfig { min_session_timeout_ms: 10, initial_rebalance_delay_ms: 0, ..GroupConfig::default() };
        let coordinator = GroupCoordinator::new(store, Endpoint { broker_id: 0, listeners: Vec::new() }, config);
        let join = JoinGroupRequest::default()
            .with_group_id(GroupId(StrBytes::from_static_str("g")))
            .with_session_timeout_ms(200)
            .with_rebalance_timeout_ms(10_000)
            .with_group_instance_id(Some(StrBytes::from_static_str("static-1")))
            .with_protocol_type(StrBytes::from_static_str("consumer"))
            .with_protocols(vec![join_group_request::JoinGroupRequestProtocol::default()
                .with_name(StrBytes::from_static_str("range"))
                .with_metadata(Bytes::from_static(b"m"))]);
        let ResponseKind::JoinGroup(joined) = coordinator.join_group(join, 5, "c", "h").await else { panic!() };
        assert_eq!(joined.error_code, 0);
        let sync = SyncGroupRequest::default()
            .with_group_id(GroupId(StrBytes::from_static_str("g")))
            .with_generation_id(joined.generation_id)
            .with_member_id(joined.member_id.clone())
            .with_group_instance_id(Some(StrBytes::from_static_str("static-1")))
            .with_assignments(vec![sync_group_request::SyncGroupRequestAssignment::default()
                .with_member_id(joined.member_id.clone())
                .with_assignment(Bytes::from_static(b"a"))]);
        let ResponseKind::SyncGroup(synced) = coordinator.sync_group(sync, 3).await else { panic!() };
        assert_eq!(synced.error_code, 0);

        // The member goes silent; the session runs out while the ticker cannot run.
        std::thread::sleep(Duration::from_millis(300));
        let delete = DeleteGroupsRequest::default().with_groups_names(vec![GroupId(StrBytes::from_static_str("g"))]);
        let ResponseKind::DeleteGroups(deleted) = coordinator.delete_groups(delete).await else { panic!() };
        // No offsets were committed: once its member is gone, the group does not exist.
        assert_eq!(deleted.results[0].error_code, ResponseError::GroupIdNotFound.code(), "not NON_EMPTY_GROUP");
    }
}
