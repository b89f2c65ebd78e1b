//! JoinGroup, SyncGroup, Heartbeat and LeaveGroup: the I/O shell around the pure
//! state machine of [`super::state`] (decode the request, run the transition under the
//! group's lock, deliver the replies after releasing it, update the ownership
//! registry).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use tokio::sync::Mutex;

use super::state::{self, GroupState, JoinOutcome, JoinRequest, Reply, SyncOutcome};
use super::{GroupCoordinator, GroupEntry};

impl GroupCoordinator {
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
            let had_members = !entry.group.members.is_empty();
            let (outcome, replies) = entry.group.join(join, Instant::now(), initial_delay);
            replies.into_iter().for_each(Reply::deliver);
            self.inner.tick_group(&entry);
            if !had_members && !entry.group.members.is_empty() {
                self.inner.write_membership(&request.group_id, true).await;
            }
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
        // A group that does not exist is not made for the answer: its members are as
        // unknown as they would be in a new group (UNKNOWN_MEMBER_ID).
        let (entry, known) = match self.lookup(&request.group_id).await {
            Ok(Some(entry)) => (entry, true),
            Ok(None) => (Arc::new(Mutex::new(GroupEntry::new(&request.group_id))), false),
            Err(e) => return ResponseKind::LeaveGroup(LeaveGroupResponse::default().with_error_code(e.code())),
        };
        let mut members = Vec::new();
        let mut first_error = 0;
        let became_empty = {
            let mut entry = entry.lock().await;
            let had_members = !entry.group.members.is_empty();
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
            if known && had_members && entry.group.members.is_empty() {
                self.inner.write_membership(&request.group_id, false).await;
            }
            (known && entry.group.state == GroupState::Empty).then_some(entry.group.generation_id)
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
}
