//! One consumer group's membership state machine, without I/O: Kafka's classic group
//! protocol (JoinGroup / SyncGroup / Heartbeat / LeaveGroup) with generations.
//!
//! ```text
//!            join                    all rejoined or             leader's
//!  Empty ──────────► Preparing ───── rebalance deadline ───────► Completing ── SyncGroup ──► Stable
//!    ▲               Rebalance ◄─────────────────────────────────  Rebalance ◄─ join/leave/expiry ┘
//!    └── last member leaves or expires ─────────────────────────────────┘
//! ```
//!
//! Every transition that answers waiting members hands the answers back as
//! [`Reply`] values; the caller delivers them after releasing the group's lock.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use tokio::sync::oneshot;

/// How long a member id handed out with MEMBER_ID_REQUIRED stays valid for the JoinGroup
/// that uses it (Kafka keeps it for the session timeout; five minutes here).
const PENDING_MEMBER_ID_LIFETIME: Duration = Duration::from_secs(300);

/// Answer to a JoinGroup request that had to wait for the rebalance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct JoinResult {
    pub(crate) error: i16,
    pub(crate) generation_id: i32,
    pub(crate) protocol_type: String,
    pub(crate) protocol_name: String,
    pub(crate) leader: String,
    pub(crate) member_id: String,
    /// Only the leader gets the members and their metadata, to compute the assignment.
    pub(crate) members: Vec<(String, Option<String>, Bytes)>,
}

/// Answer to a SyncGroup request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SyncResult {
    pub(crate) error: i16,
    pub(crate) protocol_type: String,
    pub(crate) protocol_name: String,
    pub(crate) assignment: Bytes,
}

impl JoinResult {
    pub(crate) fn error(error: ResponseError, member_id: &str) -> Self {
        Self { error: error.code(), member_id: member_id.to_string(), generation_id: -1, ..Self::default() }
    }
}

impl SyncResult {
    pub(crate) fn error(error: ResponseError) -> Self {
        Self { error: error.code(), ..Self::default() }
    }
}

/// A delivery the caller makes once the lock is released.
#[derive(Debug)]
pub(crate) enum Reply {
    Join(oneshot::Sender<JoinResult>, JoinResult),
    Sync(oneshot::Sender<SyncResult>, SyncResult),
}

impl Reply {
    pub(crate) fn deliver(self) {
        // A receiver that went away (the client disconnected) does not care.
        match self {
            Reply::Join(tx, result) => drop(tx.send(result)),
            Reply::Sync(tx, result) => drop(tx.send(result)),
        }
    }
}

/// Group states, named as DescribeGroups and ListGroups report them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GroupState {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
}

impl GroupState {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Empty => "Empty",
            Self::PreparingRebalance => "PreparingRebalance",
            Self::CompletingRebalance => "CompletingRebalance",
            Self::Stable => "Stable",
        }
    }
}

/// One member of the group.
#[derive(Debug)]
pub(crate) struct Member {
    pub(crate) member_id: String,
    pub(crate) group_instance_id: Option<String>,
    pub(crate) client_id: String,
    pub(crate) client_host: String,
    pub(crate) session_timeout: Duration,
    pub(crate) rebalance_timeout: Duration,
    /// (protocol name, metadata) in the member's order of preference.
    pub(crate) protocols: Vec<(String, Bytes)>,
    pub(crate) assignment: Bytes,
    pub(crate) heartbeat_deadline: Instant,
    join_waiter: Option<oneshot::Sender<JoinResult>>,
    sync_waiter: Option<oneshot::Sender<SyncResult>>,
}

impl Member {
    fn metadata(&self, protocol: &str) -> Bytes {
        self.protocols.iter().find(|(name, _)| name == protocol).map(|(_, m)| m.clone()).unwrap_or_default()
    }
}

/// What a JoinGroup request carries, decoded.
#[derive(Debug, Clone)]
pub(crate) struct JoinRequest {
    pub(crate) member_id: String,
    pub(crate) group_instance_id: Option<String>,
    pub(crate) client_id: String,
    pub(crate) client_host: String,
    pub(crate) session_timeout: Duration,
    pub(crate) rebalance_timeout: Duration,
    pub(crate) protocol_type: String,
    pub(crate) protocols: Vec<(String, Bytes)>,
    /// JoinGroup v4+ clients accept MEMBER_ID_REQUIRED and rejoin with the id.
    pub(crate) requires_known_member_id: bool,
}

/// What the caller does with a JoinGroup.
#[derive(Debug)]
pub(crate) enum JoinOutcome {
    /// Answer now.
    Now(JoinResult),
    /// Wait on this receiver for the rebalance to complete.
    Wait(oneshot::Receiver<JoinResult>),
}

/// What the caller does with a SyncGroup.
#[derive(Debug)]
pub(crate) enum SyncOutcome {
    Now(SyncResult),
    Wait(oneshot::Receiver<SyncResult>),
}

/// A consumer group's membership.
#[derive(Debug)]
pub(crate) struct Group {
    pub(crate) group_id: String,
    pub(crate) state: GroupState,
    pub(crate) generation_id: i32,
    pub(crate) protocol_type: Option<String>,
    pub(crate) protocol_name: Option<String>,
    pub(crate) leader: Option<String>,
    pub(crate) members: BTreeMap<String, Member>,
    /// Member ids handed out with MEMBER_ID_REQUIRED and not yet used, and the same in
    /// the order they were handed out, so those past [`PENDING_MEMBER_ID_LIFETIME`] are
    /// dropped from the front when the group is next used ([`Group::drop_stale_pending`])
    /// rather than by the ticker: a group holding only such ids (a client that never
    /// came back, or made-up group ids) then costs the ticker nothing.
    pending_member_ids: HashMap<String, Instant>,
    pending_order: VecDeque<(Instant, String)>,
    /// When the current rebalance gives up on members that have not rejoined.
    pub(crate) rebalance_deadline: Option<Instant>,
    /// Until then a rebalance of an empty group waits for more members to arrive
    /// (group.initial.rebalance.delay.ms), so a group starting up rebalances once.
    initial_delay_until: Option<Instant>,
    next_member: u64,
    /// `group.max.size`: members and handed-out member ids past which a new member is
    /// refused with GROUP_MAX_SIZE_REACHED (KIP-389).
    pub(crate) max_size: usize,
}

impl Group {
    pub(crate) fn new(group_id: &str) -> Self {
        Self {
            group_id: group_id.to_string(),
            state: GroupState::Empty,
            generation_id: 0,
            protocol_type: None,
            protocol_name: None,
            leader: None,
            members: BTreeMap::new(),
            pending_member_ids: HashMap::new(),
            pending_order: VecDeque::new(),
            rebalance_deadline: None,
            initial_delay_until: None,
            next_member: 0,
            max_size: usize::MAX,
        }
    }

    /// A member id unique across this coordinator's lifetime and restarts: the
    /// client id, the wall clock in ns and a counter.
    fn new_member_id(&mut self, client_id: &str) -> String {
        self.next_member += 1;
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or_default();
        format!("{client_id}-{nanos:x}-{}", self.next_member)
    }

    /// Handles a JoinGroup. `initial_delay` is group.initial.rebalance.delay.ms.
    pub(crate) fn join(&mut self, req: JoinRequest, now: Instant, initial_delay: Duration) -> (JoinOutcome, Vec<Reply>) {
        let reject = |e: ResponseError| (JoinOutcome::Now(JoinResult::error(e, &req.member_id)), Vec::new());
        if req.protocol_type.is_empty() || req.protocols.is_empty() {
            return reject(ResponseError::InconsistentGroupProtocol);
        }
        if !self.members.is_empty() {
            let same_type = self.protocol_type.as_deref() == Some(req.protocol_type.as_str());
            let shared = req.protocols.iter().any(|(name, _)| {
                self.members.values().filter(|m| m.member_id != req.member_id).all(|m| m.protocols.iter().any(|(n, _)| n == name))
            });
            if !same_type || !shared {
                return reject(ResponseError::InconsistentGroupProtocol);
            }
        }
        self.drop_stale_pending(now);
        let mut member_id = req.member_id.clone();
        if member_id.is_empty() {
            let replaced = req.group_instance_id.as_deref().and_then(|instance| {
                self.members.values().find(|m| m.group_instance_id.as_deref() == Some(instance)).map(|m| m.member_id.clone())
            });
            // A new member or member id; a static member taking its own place is not one.
            // Handed-out ids count too: each is a member to come, and memory here.
            if replaced.is_none() && self.members.len() + self.pending_member_ids.len() >= self.max_size {
                return reject(ResponseError::GroupMaxSizeReached);
            }
            member_id = self.new_member_id(&req.client_id);
            if let Some(old) = replaced {
                return self.replace_static_member(&old, member_id, req, now, initial_delay);
            }
            if req.group_instance_id.is_none() && req.requires_known_member_id {
                self.pending_member_ids.insert(member_id.clone(), now);
                self.pending_order.push_back((now, member_id.clone()));
                return (JoinOutcome::Now(JoinResult::error(ResponseError::MemberIdRequired, &member_id)), Vec::new());
            }
            return self.add_and_rebalance(member_id, req, now, initial_delay);
        }
        if self.pending_member_ids.remove(&member_id).is_some() {
            return self.add_and_rebalance(member_id, req, now, initial_delay);
        }
        let Some(member) = self.members.get(&member_id) else {
            return reject(ResponseError::UnknownMemberId);
        };
        if member.group_instance_id.is_some() && member.group_instance_id != req.group_instance_id {
            return reject(ResponseError::FencedInstanceId);
        }
        // A known member rejoining: after a Stable group's member rejoins with the
        // same protocols, Kafka answers with the current generation without a
        // rebalance only for the leader's metadata refresh; we always rebalance, which
        // is correct and simpler (a rejoin is rare outside rebalances).
        self.add_and_rebalance(member_id, req, now, initial_delay)
    }

    /// A static member (KIP-345) that comes back with an empty member id under the
    /// instance id of a current member takes that member's place under a new member id;
    /// the old id is fenced (its waiting requests get FENCED_INSTANCE_ID). Kafka's rule
    /// for what follows: in a Stable group whose protocol choice this does not change,
    /// the member gets the current generation at once and keeps its assignment, with no
    /// rebalance, so the other members keep their partitions. The answer names the
    /// leader as it was, so a replaced leader does not compute a new assignment that a
    /// Stable group would never hand out. In CompletingRebalance the leader may already be
    /// assigning to the old id, so the group rebalances; in PreparingRebalance the member
    /// simply takes part in the rebalance under its new id.
    fn replace_static_member(
        &mut self,
        old: &str,
        member_id: String,
        req: JoinRequest,
        now: Instant,
        initial_delay: Duration,
    ) -> (JoinOutcome, Vec<Reply>) {
        let mut replies = Vec::new();
        let mut member = self.members.remove(old).expect("invariant: the caller found it");
        if let Some(tx) = member.join_waiter.take() {
            replies.push(Reply::Join(tx, JoinResult::error(ResponseError::FencedInstanceId, old)));
        }
        if let Some(tx) = member.sync_waiter.take() {
            replies.push(Reply::Sync(tx, SyncResult::error(ResponseError::FencedInstanceId)));
        }
        let leader_before = self.leader.clone().unwrap_or_default();
        if self.leader.as_deref() == Some(old) {
            self.leader = Some(member_id.clone());
        }
        member.member_id = member_id.clone();
        member.client_id = req.client_id;
        member.client_host = req.client_host;
        member.session_timeout = req.session_timeout;
        member.rebalance_timeout = req.rebalance_timeout;
        member.protocols = req.protocols;
        member.heartbeat_deadline = now + req.session_timeout;
        self.members.insert(member_id.clone(), member);
        let (tx, rx) = oneshot::channel();
        match self.state {
            GroupState::Stable if self.protocol_name.as_deref() == Some(self.select_protocol().as_str()) => {
                let result = JoinResult {
                    error: 0,
                    generation_id: self.generation_id,
                    protocol_type: self.protocol_type.clone().unwrap_or_default(),
                    protocol_name: self.protocol_name.clone().unwrap_or_default(),
                    leader: leader_before,
                    member_id,
                    members: Vec::new(),
                };
                return (JoinOutcome::Now(result), replies);
            }
            GroupState::PreparingRebalance => {}
            _ => replies.extend(self.prepare_rebalance(now, initial_delay)),
        }
        if let Some(member) = self.members.get_mut(&member_id) {
            member.join_waiter = Some(tx);
        }
        replies.extend(self.try_complete_join(now, false));
        (JoinOutcome::Wait(rx), replies)
    }

    fn add_and_rebalance(
        &mut self,
        member_id: String,
        req: JoinRequest,
        now: Instant,
        initial_delay: Duration,
    ) -> (JoinOutcome, Vec<Reply>) {
        let (tx, rx) = oneshot::channel();
        let mut replies = Vec::new();
        let member = self.members.entry(member_id.clone()).or_insert_with(|| Member {
            member_id: member_id.clone(),
            group_instance_id: None,
            client_id: String::new(),
            client_host: String::new(),
            session_timeout: req.session_timeout,
            rebalance_timeout: req.rebalance_timeout,
            protocols: Vec::new(),
            assignment: Bytes::new(),
            heartbeat_deadline: now + req.session_timeout,
            join_waiter: None,
            sync_waiter: None,
        });
        if let Some(old) = member.join_waiter.replace(tx) {
            // The same member joined twice (a retry): the older request is superseded.
            replies.push(Reply::Join(old, JoinResult::error(ResponseError::UnknownMemberId, &member_id)));
        }
        member.group_instance_id = req.group_instance_id;
        member.client_id = req.client_id;
        member.client_host = req.client_host;
        member.session_timeout = req.session_timeout;
        member.rebalance_timeout = req.rebalance_timeout;
        member.protocols = req.protocols;
        member.heartbeat_deadline = now + req.session_timeout;
        if self.protocol_type.is_none() || self.members.len() == 1 {
            self.protocol_type = Some(req.protocol_type);
        }
        replies.extend(self.prepare_rebalance(now, initial_delay));
        replies.extend(self.try_complete_join(now, false));
        (JoinOutcome::Wait(rx), replies)
    }

    /// Moves to PreparingRebalance (if not already there): members waiting in
    /// SyncGroup are told to rejoin.
    fn prepare_rebalance(&mut self, now: Instant, initial_delay: Duration) -> Vec<Reply> {
        let mut replies = Vec::new();
        if self.state == GroupState::PreparingRebalance {
            return replies;
        }
        for member in self.members.values_mut() {
            if let Some(tx) = member.sync_waiter.take() {
                replies.push(Reply::Sync(tx, SyncResult::error(ResponseError::RebalanceInProgress)));
            }
        }
        let timeout = self.members.values().map(|m| m.rebalance_timeout).max().unwrap_or(Duration::ZERO);
        self.rebalance_deadline = Some(now + timeout);
        self.initial_delay_until = (self.state == GroupState::Empty).then(|| now + initial_delay.min(timeout));
        self.state = GroupState::PreparingRebalance;
        replies
    }

    /// Completes the join phase when every member has rejoined (and an empty group's
    /// initial delay has passed), or unconditionally when `deadline_passed`.
    fn try_complete_join(&mut self, now: Instant, deadline_passed: bool) -> Vec<Reply> {
        if self.state != GroupState::PreparingRebalance {
            return Vec::new();
        }
        let all_joined = self.members.values().all(|m| m.join_waiter.is_some());
        let delayed = self.initial_delay_until.is_some_and(|until| now < until);
        if !deadline_passed && (!all_joined || delayed) {
            return Vec::new();
        }
        // Members that did not rejoin in time are out.
        self.members.retain(|_, m| m.join_waiter.is_some());
        self.rebalance_deadline = None;
        self.initial_delay_until = None;
        self.generation_id += 1;
        if self.members.is_empty() {
            self.state = GroupState::Empty;
            self.leader = None;
            self.protocol_name = None;
            return Vec::new();
        }
        let protocol = self.select_protocol();
        self.protocol_name = Some(protocol.clone());
        if !self.leader.as_ref().is_some_and(|l| self.members.contains_key(l)) {
            self.leader = self.members.keys().next().cloned();
        }
        let leader = self.leader.clone().expect("invariant: members is not empty");
        let everyone: Vec<(String, Option<String>, Bytes)> =
            self.members.values().map(|m| (m.member_id.clone(), m.group_instance_id.clone(), m.metadata(&protocol))).collect();
        self.state = GroupState::CompletingRebalance;
        let protocol_type = self.protocol_type.clone().unwrap_or_default();
        let mut replies = Vec::new();
        for member in self.members.values_mut() {
            member.assignment = Bytes::new();
            member.heartbeat_deadline = now + member.session_timeout;
            let tx = member.join_waiter.take().expect("invariant: every remaining member is waiting");
            let result = JoinResult {
                error: 0,
                generation_id: self.generation_id,
                protocol_type: protocol_type.clone(),
                protocol_name: protocol.clone(),
                leader: leader.clone(),
                member_id: member.member_id.clone(),
                members: if member.member_id == leader { everyone.clone() } else { Vec::new() },
            };
            replies.push(Reply::Join(tx, result));
        }
        replies
    }

    /// The protocol every member supports that the members, voting by their order of
    /// preference, like best (Kafka's rule).
    fn select_protocol(&self) -> String {
        let candidates: Vec<&String> =
            self.members.values().next().map(|m| m.protocols.iter().map(|(n, _)| n).collect()).unwrap_or_default();
        let supported: Vec<&String> = candidates
            .into_iter()
            .filter(|name| self.members.values().all(|m| m.protocols.iter().any(|(n, _)| n == *name)))
            .collect();
        let mut votes: Vec<(usize, &String)> = supported.iter().map(|name| (0, *name)).collect();
        for member in self.members.values() {
            if let Some(choice) = member.protocols.iter().find(|(n, _)| supported.contains(&n)) {
                if let Some(entry) = votes.iter_mut().find(|(_, name)| *name == &choice.0) {
                    entry.0 += 1;
                }
            }
        }
        // Highest vote; ties go to the earliest in the first member's preference.
        let best =
            votes.iter().enumerate().max_by_key(|(i, (count, _))| (*count, usize::MAX - i)).map(|(_, (_, n))| (*n).clone());
        best.unwrap_or_default()
    }

    /// Checks the member and generation of a SyncGroup/Heartbeat/OffsetCommit.
    pub(crate) fn check_member(&self, member_id: &str, instance: Option<&str>, generation_id: i32) -> Result<(), ResponseError> {
        let Some(member) = self.members.get(member_id) else {
            if let Some(instance) = instance {
                if self.members.values().any(|m| m.group_instance_id.as_deref() == Some(instance)) {
                    return Err(ResponseError::FencedInstanceId);
                }
            }
            return Err(ResponseError::UnknownMemberId);
        };
        if member.group_instance_id.is_some() && member.group_instance_id.as_deref() != instance {
            return Err(ResponseError::FencedInstanceId);
        }
        if generation_id != self.generation_id {
            return Err(ResponseError::IllegalGeneration);
        }
        Ok(())
    }

    /// Whether an OffsetCommit may store offsets now, checked in Kafka's order: a commit
    /// outside the group protocol (generation < 0, no member id, no instance id) only
    /// while the group has no members; otherwise the member and its generation first
    /// (UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID, ILLEGAL_GENERATION), and only then the
    /// state: REBALANCE_IN_PROGRESS in CompletingRebalance alone (the member has its new
    /// generation but not yet its assignment). A member of the current generation may
    /// commit while the group prepares a rebalance: it learns of the rebalance from its
    /// heartbeat, and committing what it consumed first is what a member revoking
    /// partitions does. A commit counts as a sign of life, as a heartbeat does.
    pub(crate) fn check_commit(
        &mut self,
        member_id: &str,
        instance: Option<&str>,
        generation_id: i32,
        now: Instant,
    ) -> Result<(), ResponseError> {
        if generation_id < 0 && member_id.is_empty() && instance.is_none() {
            return if self.state == GroupState::Empty { Ok(()) } else { Err(ResponseError::UnknownMemberId) };
        }
        self.check_member(member_id, instance, generation_id)?;
        if self.state == GroupState::CompletingRebalance {
            return Err(ResponseError::RebalanceInProgress);
        }
        if let Some(member) = self.members.get_mut(member_id) {
            member.heartbeat_deadline = now + member.session_timeout;
        }
        Ok(())
    }

    /// Handles a SyncGroup; the leader's call carries everyone's assignment.
    pub(crate) fn sync(
        &mut self,
        member_id: &str,
        instance: Option<&str>,
        generation_id: i32,
        assignments: Vec<(String, Bytes)>,
        now: Instant,
    ) -> (SyncOutcome, Vec<Reply>) {
        if let Err(e) = self.check_member(member_id, instance, generation_id) {
            return (SyncOutcome::Now(SyncResult::error(e)), Vec::new());
        }
        let protocol_type = self.protocol_type.clone().unwrap_or_default();
        let protocol_name = self.protocol_name.clone().unwrap_or_default();
        match self.state {
            GroupState::Empty => (SyncOutcome::Now(SyncResult::error(ResponseError::UnknownMemberId)), Vec::new()),
            GroupState::PreparingRebalance => {
                (SyncOutcome::Now(SyncResult::error(ResponseError::RebalanceInProgress)), Vec::new())
            }
            GroupState::Stable => {
                let member = self.members.get_mut(member_id).expect("invariant: checked above");
                member.heartbeat_deadline = now + member.session_timeout;
                let result = SyncResult { error: 0, protocol_type, protocol_name, assignment: member.assignment.clone() };
                (SyncOutcome::Now(result), Vec::new())
            }
            GroupState::CompletingRebalance => {
                let (tx, rx) = oneshot::channel();
                let member = self.members.get_mut(member_id).expect("invariant: checked above");
                member.heartbeat_deadline = now + member.session_timeout;
                let mut replies = Vec::new();
                if let Some(old) = member.sync_waiter.replace(tx) {
                    replies.push(Reply::Sync(old, SyncResult::error(ResponseError::UnknownMemberId)));
                }
                if self.leader.as_deref() == Some(member_id) {
                    let mut by_member: HashMap<String, Bytes> = assignments.into_iter().collect();
                    for member in self.members.values_mut() {
                        member.assignment = by_member.remove(&member.member_id).unwrap_or_default();
                    }
                    self.state = GroupState::Stable;
                    for member in self.members.values_mut() {
                        if let Some(tx) = member.sync_waiter.take() {
                            let result = SyncResult {
                                error: 0,
                                protocol_type: protocol_type.clone(),
                                protocol_name: protocol_name.clone(),
                                assignment: member.assignment.clone(),
                            };
                            replies.push(Reply::Sync(tx, result));
                        }
                    }
                }
                (SyncOutcome::Wait(rx), replies)
            }
        }
    }

    /// Handles a Heartbeat: extends the member's session, and tells it to rejoin
    /// when a rebalance is under way.
    pub(crate) fn heartbeat(
        &mut self,
        member_id: &str,
        instance: Option<&str>,
        generation_id: i32,
        now: Instant,
    ) -> Result<(), ResponseError> {
        if self.state == GroupState::Empty {
            return Err(ResponseError::UnknownMemberId);
        }
        self.check_member(member_id, instance, generation_id)?;
        let member = self.members.get_mut(member_id).expect("invariant: checked above");
        member.heartbeat_deadline = now + member.session_timeout;
        match self.state {
            GroupState::PreparingRebalance => Err(ResponseError::RebalanceInProgress),
            _ => Ok(()),
        }
    }

    /// Removes a member that left (LeaveGroup) and starts a rebalance for the rest.
    pub(crate) fn leave(&mut self, member_id: &str, instance: Option<&str>, now: Instant) -> Result<Vec<Reply>, ResponseError> {
        let id = match (member_id.is_empty(), instance) {
            // v3+ may name a static member by instance id alone.
            (true, Some(instance)) => self
                .members
                .values()
                .find(|m| m.group_instance_id.as_deref() == Some(instance))
                .map(|m| m.member_id.clone())
                .ok_or(ResponseError::UnknownMemberId)?,
            _ => {
                let member = self.members.get(member_id).ok_or(ResponseError::UnknownMemberId)?;
                if instance.is_some() && member.group_instance_id.as_deref() != instance {
                    return Err(ResponseError::FencedInstanceId);
                }
                member_id.to_string()
            }
        };
        Ok(self.remove_member(&id, now))
    }

    fn remove_member(&mut self, member_id: &str, now: Instant) -> Vec<Reply> {
        let mut replies = Vec::new();
        if let Some(mut member) = self.members.remove(member_id) {
            if let Some(tx) = member.join_waiter.take() {
                replies.push(Reply::Join(tx, JoinResult::error(ResponseError::UnknownMemberId, member_id)));
            }
            if let Some(tx) = member.sync_waiter.take() {
                replies.push(Reply::Sync(tx, SyncResult::error(ResponseError::UnknownMemberId)));
            }
        }
        match self.state {
            GroupState::PreparingRebalance => replies.extend(self.try_complete_join(now, false)),
            _ if self.members.is_empty() => {
                self.state = GroupState::Empty;
                self.generation_id += 1;
                self.leader = None;
                self.protocol_name = None;
            }
            _ => {
                replies.extend(self.prepare_rebalance(now, Duration::ZERO));
                replies.extend(self.try_complete_join(now, false));
            }
        }
        replies
    }

    /// Periodic work: expire members whose session ran out, complete a rebalance
    /// whose deadline (or initial delay) passed, forget unused pending member ids.
    pub(crate) fn tick(&mut self, now: Instant) -> Vec<Reply> {
        let mut replies = Vec::new();
        let expired: Vec<String> = self
            .members
            .values()
            // A member waiting in JoinGroup is not heartbeating, by design.
            .filter(|m| m.join_waiter.is_none() && m.heartbeat_deadline <= now)
            .map(|m| m.member_id.clone())
            .collect();
        for member_id in expired {
            tracing::info!(group = %self.group_id, member = %member_id, "member session expired");
            replies.extend(self.remove_member(&member_id, now));
        }
        if self.state == GroupState::PreparingRebalance {
            let deadline_passed = self.rebalance_deadline.is_some_and(|d| d <= now);
            replies.extend(self.try_complete_join(now, deadline_passed));
        }
        self.drop_stale_pending(now);
        replies
    }

    /// Forgets the pending member ids handed out [`PENDING_MEMBER_ID_LIFETIME`] or more
    /// before `now`: amortised O(1), from the front of the hand-out order.
    fn drop_stale_pending(&mut self, now: Instant) {
        while let Some((created, _)) = self.pending_order.front() {
            if now.duration_since(*created) < PENDING_MEMBER_ID_LIFETIME {
                break;
            }
            let (created, id) = self.pending_order.pop_front().expect("front exists");
            // Used since (and removed), or handed out again later: not this entry's to drop.
            if self.pending_member_ids.get(&id) == Some(&created) {
                self.pending_member_ids.remove(&id);
            }
        }
    }

    /// Whether the ticker has anything to do for the group: sessions to expire, a
    /// rebalance to complete. Pending member ids expire when the group is next used.
    pub(crate) fn needs_ticks(&self) -> bool {
        !self.members.is_empty() || self.state != GroupState::Empty
    }

    /// Each member's id and assignment, once Stable (for the ownership registry).
    pub(crate) fn assignments(&self) -> Vec<(String, Bytes)> {
        self.members.values().map(|m| (m.member_id.clone(), m.assignment.clone())).collect()
    }

    /// Metadata the member sent for the chosen protocol.
    pub(crate) fn member_metadata(&self, member: &Member) -> Bytes {
        member.metadata(self.protocol_name.as_deref().unwrap_or_default())
    }

    /// Whether a live member of the group may be consuming `topic`, so that its
    /// committed offsets must stay (OffsetDelete answers GROUP_SUBSCRIBED_TO_TOPIC). As
    /// Kafka decides it: the topics of the members' consumer-protocol subscriptions for
    /// the chosen protocol; when that is not known (another protocol type, no protocol
    /// chosen yet, metadata that does not decode), every topic counts as subscribed, so
    /// nothing a member may be reading loses its offsets.
    pub(crate) fn is_subscribed_to(&self, topic: &str) -> bool {
        let protocol = match (self.protocol_type.as_deref(), self.protocol_name.as_deref()) {
            (Some("consumer"), Some(protocol)) if !self.members.is_empty() => protocol,
            _ => return true,
        };
        let mut any_undecodable = false;
        let subscribed = self.members.values().any(|m| match subscription_topics(&m.metadata(protocol)) {
            Some(topics) => topics.iter().any(|t| t == topic),
            None => {
                any_undecodable = true;
                false
            }
        });
        subscribed || any_undecodable
    }
}

/// The topics of a consumer-protocol subscription (the member metadata of a `consumer`
/// group). Every version starts with version 0's fields, so it is read as version 0,
/// as Kafka reads it; `None` when the bytes are not a subscription.
fn subscription_topics(metadata: &Bytes) -> Option<Vec<String>> {
    use kafka_protocol::messages::consumer_protocol_subscription::ConsumerProtocolSubscription;
    use kafka_protocol::protocol::Decodable;
    let mut buf = metadata.clone();
    if buf.len() < 2 {
        return None;
    }
    let _version = bytes::Buf::get_i16(&mut buf);
    // A client wrote these bytes: walked first, or an array count could abort the broker.
    fjord_record::walk::consumer_subscription(&buf, 0, crate::guard::MAX_REQUEST_ELEMENTS).ok()?;
    let subscription = ConsumerProtocolSubscription::decode(&mut buf, 0).ok()?;
    Some(subscription.topics.iter().map(|t| t.to_string()).collect())
}

/// A consumer-protocol subscription (version 1) to `topics`, as a client sends it: what
/// [`subscription_topics`] reads.
#[cfg(test)]
pub(crate) fn subscription(topics: &[&str]) -> Bytes {
    use kafka_protocol::messages::consumer_protocol_subscription::ConsumerProtocolSubscription;
    use kafka_protocol::protocol::{Encodable, StrBytes};
    let mut buf = bytes::BytesMut::new();
    bytes::BufMut::put_i16(&mut buf, 1);
    ConsumerProtocolSubscription::default()
        .with_topics(topics.iter().map(|t| StrBytes::from_string(t.to_string())).collect())
        .encode(&mut buf, 1)
        .expect("a subscription encodes");
    buf.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SESSION: Duration = Duration::from_secs(10);

    fn request(member_id: &str) -> JoinRequest {
        JoinRequest {
            member_id: member_id.to_string(),
            group_instance_id: None,
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            session_timeout: SESSION,
            rebalance_timeout: Duration::from_secs(30),
            protocol_type: "consumer".into(),
            protocols: vec![("range".into(), Bytes::from_static(b"meta"))],
            requires_known_member_id: true,
        }
    }

    fn deliver(replies: Vec<Reply>) {
        replies.into_iter().for_each(Reply::deliver);
    }

    /// Joins with MEMBER_ID_REQUIRED handled; returns the member id and the waiter.
    fn join(group: &mut Group, now: Instant) -> (String, oneshot::Receiver<JoinResult>) {
        let (outcome, replies) = group.join(request(""), now, Duration::ZERO);
        deliver(replies);
        let JoinOutcome::Now(first) = outcome else { panic!("expected MEMBER_ID_REQUIRED") };
        assert_eq!(first.error, ResponseError::MemberIdRequired.code());
        let (outcome, replies) = group.join(request(&first.member_id), now, Duration::ZERO);
        deliver(replies);
        let JoinOutcome::Wait(rx) = outcome else { panic!("expected to wait") };
        (first.member_id, rx)
    }

    #[test]
    fn two_members_join_sync_and_become_stable() {
        let now = Instant::now();
        let mut group = Group::new("g");
        let (a, mut rx_a) = join(&mut group, now);
        // A single member completes the join at once (no initial delay here).
        let ja = rx_a.try_recv().unwrap();
        assert_eq!((ja.generation_id, ja.leader.as_str(), ja.members.len()), (1, a.as_str(), 1));
        let (b, mut rx_b) = join(&mut group, now);
        assert_eq!(group.state, GroupState::PreparingRebalance);
        // a must rejoin before generation 2 completes.
        assert!(rx_b.try_recv().is_err());
        assert_eq!(group.heartbeat(&a, None, 1, now), Err(ResponseError::RebalanceInProgress));
        let (outcome, replies) = group.join(request(&a), now, Duration::ZERO);
        deliver(replies);
        let JoinOutcome::Wait(mut rx_a) = outcome else { panic!() };
        let (ja, jb) = (rx_a.try_recv().unwrap(), rx_b.try_recv().unwrap());
        assert_eq!((ja.generation_id, jb.generation_id), (2, 2));
        assert_eq!(ja.leader, a, "the leader is kept across rebalances");
        assert_eq!((ja.members.len(), jb.members.len()), (2, 0), "only the leader gets the member list");
        // follower syncs first and waits; leader's sync completes both
        let (outcome, _) = group.sync(&b, None, 2, vec![], now);
        let SyncOutcome::Wait(mut sync_b) = outcome else { panic!() };
        let assignments = vec![(a.clone(), Bytes::from_static(b"A")), (b.clone(), Bytes::from_static(b"B"))];
        let (outcome, replies) = group.sync(&a, None, 2, assignments, now);
        deliver(replies);
        let SyncOutcome::Wait(mut sync_a) = outcome else { panic!() };
        assert_eq!(sync_a.try_recv().unwrap().assignment, Bytes::from_static(b"A"));
        assert_eq!(sync_b.try_recv().unwrap().assignment, Bytes::from_static(b"B"));
        assert_eq!(group.state, GroupState::Stable);
        assert_eq!(group.heartbeat(&b, None, 2, now), Ok(()));
    }

    #[test]
    fn stale_generation_and_unknown_member_are_refused() {
        let now = Instant::now();
        let mut group = Group::new("g");
        let (a, _rx) = join(&mut group, now);
        assert_eq!(group.heartbeat(&a, None, 0, now), Err(ResponseError::IllegalGeneration));
        assert_eq!(group.heartbeat("nobody", None, 1, now), Err(ResponseError::UnknownMemberId));
        let (outcome, _) = group.sync(&a, None, 7, vec![], now);
        let SyncOutcome::Now(result) = outcome else { panic!() };
        assert_eq!(result.error, ResponseError::IllegalGeneration.code());
    }

    #[test]
    fn a_silent_member_expires_and_the_rest_rebalance() {
        let now = Instant::now();
        let mut group = Group::new("g");
        let (a, _) = join(&mut group, now);
        let (b, rx_b) = join(&mut group, now);
        let (outcome, replies) = group.join(request(&a), now, Duration::ZERO);
        deliver(replies);
        drop((outcome, rx_b));
        let assignments = vec![(a.clone(), Bytes::new()), (b.clone(), Bytes::new())];
        deliver(group.sync(&a, None, 2, assignments, now).1);
        assert_eq!(group.state, GroupState::Stable);
        // a keeps heartbeating, b goes silent
        let later = now + SESSION / 2;
        group.heartbeat(&a, None, 2, later).unwrap();
        deliver(group.tick(now + SESSION + Duration::from_millis(1)));
        assert!(!group.members.contains_key(&b));
        assert_eq!(group.state, GroupState::PreparingRebalance);
        assert_eq!(group.heartbeat(&a, None, 2, later), Err(ResponseError::RebalanceInProgress));
    }

    #[test]
    fn a_member_that_does_not_rejoin_is_dropped_at_the_rebalance_deadline() {
        let now = Instant::now();
        let mut group = Group::new("g");
        let (a, _) = join(&mut group, now);
        let (_b, mut rx_b) = join(&mut group, now);
        // a never rejoins
        let deadline = group.rebalance_deadline.unwrap();
        let replies = group.tick(deadline);
        deliver(replies);
        let jb = rx_b.try_recv().unwrap();
        assert_eq!(jb.generation_id, 2);
        assert!(!group.members.contains_key(&a));
        assert_eq!(group.members.len(), 1);
    }

    #[test]
    fn leaving_last_member_empties_the_group() {
        let now = Instant::now();
        let mut group = Group::new("g");
        let (a, _) = join(&mut group, now);
        deliver(group.leave(&a, None, now).unwrap());
        assert_eq!(group.state, GroupState::Empty);
        assert_eq!(group.leave(&a, None, now).unwrap_err(), ResponseError::UnknownMemberId);
    }

    #[test]
    fn static_member_rejoining_fences_its_old_id() {
        let now = Instant::now();
        let mut group = Group::new("g");
        let mut req = request("");
        req.group_instance_id = Some("instance-1".into());
        let (outcome, replies) = group.join(req.clone(), now, Duration::ZERO);
        deliver(replies);
        let JoinOutcome::Wait(mut rx) = outcome else { panic!("static members need no MEMBER_ID_REQUIRED") };
        let old = rx.try_recv().unwrap().member_id;
        let (outcome, replies) = group.join(req, now, Duration::ZERO);
        deliver(replies);
        let JoinOutcome::Wait(mut rx) = outcome else { panic!() };
        let new = rx.try_recv().unwrap().member_id;
        assert_ne!(old, new);
        assert_eq!(group.members.len(), 1);
        assert_eq!(group.heartbeat(&old, Some("instance-1"), 2, now), Err(ResponseError::FencedInstanceId));
    }

    /// Two static members in a Stable group with assignments "A" and "B".
    fn stable_static_pair(now: Instant) -> (Group, String, String) {
        let mut group = Group::new("g");
        let mut ids = Vec::new();
        let mut waiters = Vec::new();
        for instance in ["instance-a", "instance-b"] {
            let mut req = request("");
            req.group_instance_id = Some(instance.into());
            let (outcome, replies) = group.join(req, now, Duration::ZERO);
            deliver(replies);
            let JoinOutcome::Wait(rx) = outcome else { panic!("static members need no MEMBER_ID_REQUIRED") };
            waiters.push(rx);
        }
        // The first join completed generation 1 alone; b's join started generation 2,
        // which completes when a rejoins.
        let first = waiters[0].try_recv().unwrap();
        let mut again = request(&first.member_id);
        again.group_instance_id = Some("instance-a".into());
        let (outcome, replies) = group.join(again, now, Duration::ZERO);
        deliver(replies);
        let JoinOutcome::Wait(mut rx_a) = outcome else { panic!() };
        let (ja, jb) = (rx_a.try_recv().unwrap(), waiters[1].try_recv().unwrap());
        assert_eq!((ja.generation_id, jb.generation_id), (2, 2));
        ids.push(ja.member_id.clone());
        ids.push(jb.member_id.clone());
        let assignments = vec![(ids[0].clone(), Bytes::from_static(b"A")), (ids[1].clone(), Bytes::from_static(b"B"))];
        let leader = ja.leader.clone();
        let follower = if leader == ids[0] { &ids[1] } else { &ids[0] };
        let follower_instance = if leader == ids[0] { "instance-b" } else { "instance-a" };
        let leader_instance = if leader == ids[0] { "instance-a" } else { "instance-b" };
        let (_, replies) = group.sync(follower, Some(follower_instance), 2, vec![], now);
        deliver(replies);
        deliver(group.sync(&leader, Some(leader_instance), 2, assignments, now).1);
        assert_eq!(group.state, GroupState::Stable);
        (group, ids[0].clone(), ids[1].clone())
    }

    #[test]
    fn a_static_member_back_in_a_stable_group_keeps_its_assignment_without_a_rebalance() {
        let now = Instant::now();
        let (mut group, a, b) = stable_static_pair(now);
        // a's process restarts: no LeaveGroup (static members send none), a new JoinGroup
        // with an empty member id under the same instance id.
        let mut back = request("");
        back.group_instance_id = Some("instance-a".into());
        let (outcome, replies) = group.join(back, now, Duration::ZERO);
        deliver(replies);
        let JoinOutcome::Now(joined) = outcome else { panic!("answered at once, without a rebalance") };
        assert_eq!(joined.error, 0);
        assert_eq!(joined.generation_id, 2, "same generation");
        assert_ne!(joined.member_id, a, "a new member id");
        assert_ne!(joined.leader, joined.member_id, "the returning member does not compute an assignment");
        assert!(joined.members.is_empty());
        assert_eq!(group.state, GroupState::Stable);
        // b goes on as it was: no rebalance to join, its generation still current.
        assert_eq!(group.heartbeat(&b, Some("instance-b"), 2, now), Ok(()));
        // The new member id syncs and gets a's old assignment.
        let (outcome, _) = group.sync(&joined.member_id, Some("instance-a"), 2, vec![], now);
        let SyncOutcome::Now(synced) = outcome else { panic!() };
        assert_eq!((synced.error, synced.assignment), (0, Bytes::from_static(b"A")));
        // The old id is fenced.
        assert_eq!(group.heartbeat(&a, Some("instance-a"), 2, now), Err(ResponseError::FencedInstanceId));
    }

    #[test]
    fn commits_check_member_and_generation_before_the_rebalance_state() {
        let now = Instant::now();
        let mut group = Group::new("g");
        let (a, _) = join(&mut group, now);
        deliver(group.sync(&a, None, 1, vec![(a.clone(), Bytes::new())], now).1);
        assert_eq!(group.state, GroupState::Stable);
        assert_eq!(group.check_commit(&a, None, 1, now), Ok(()));
        // b joins: PreparingRebalance, still generation 1. a may commit for generation 1.
        let (_b, _rx_b) = join(&mut group, now);
        assert_eq!(group.state, GroupState::PreparingRebalance);
        assert_eq!(group.check_commit(&a, None, 1, now), Ok(()));
        assert_eq!(group.check_commit(&a, None, 0, now), Err(ResponseError::IllegalGeneration));
        assert_eq!(group.check_commit("nobody", None, 1, now), Err(ResponseError::UnknownMemberId));
        // a rejoins: generation 2, CompletingRebalance. A commit from generation 1 is
        // stale (ILLEGAL_GENERATION, not REBALANCE_IN_PROGRESS); one from generation 2
        // waits for the assignment.
        let (outcome, replies) = group.join(request(&a), now, Duration::ZERO);
        deliver(replies);
        drop(outcome);
        assert_eq!(group.state, GroupState::CompletingRebalance);
        assert_eq!(group.check_commit(&a, None, 1, now), Err(ResponseError::IllegalGeneration));
        assert_eq!(group.check_commit(&a, None, 2, now), Err(ResponseError::RebalanceInProgress));
        // Outside the group protocol: only while the group has no members.
        assert_eq!(group.check_commit("", None, -1, now), Err(ResponseError::UnknownMemberId));
        assert_eq!(Group::new("h").check_commit("", None, -1, now), Ok(()));
    }

    #[test]
    fn incompatible_protocols_are_refused() {
        let now = Instant::now();
        let mut group = Group::new("g");
        join(&mut group, now);
        let mut other = request("");
        other.protocols = vec![("roundrobin".into(), Bytes::new())];
        let (outcome, _) = group.join(other, now, Duration::ZERO);
        let JoinOutcome::Now(result) = outcome else { panic!() };
        assert_eq!(result.error, ResponseError::InconsistentGroupProtocol.code());
    }

    #[test]
    fn initial_delay_lets_a_starting_group_gather_before_the_first_generation() {
        let now = Instant::now();
        let mut group = Group::new("g");
        let delay = Duration::from_secs(3);
        let (outcome, _) = group.join(request(""), now, delay);
        let JoinOutcome::Now(first) = outcome else { panic!() };
        let (outcome, _) = group.join(request(&first.member_id), now, delay);
        let JoinOutcome::Wait(mut rx) = outcome else { panic!() };
        assert!(rx.try_recv().is_err(), "waits for the initial delay");
        deliver(group.tick(now + delay));
        assert_eq!(rx.try_recv().unwrap().generation_id, 1);
    }

    /// A member id handed out with MEMBER_ID_REQUIRED is good for five minutes without
    /// the ticker: the group does not need ticks for it, and a JoinGroup after that
    /// finds it forgotten.
    #[test]
    fn pending_member_ids_expire_without_ticks() {
        let now = Instant::now();
        let mut group = Group::new("g");
        let (outcome, _) = group.join(request(""), now, Duration::ZERO);
        let JoinOutcome::Now(first) = outcome else { panic!() };
        assert_eq!(first.error, ResponseError::MemberIdRequired.code());
        assert!(!group.needs_ticks());
        let later = now + PENDING_MEMBER_ID_LIFETIME + Duration::from_secs(1);
        let (outcome, _) = group.join(request(&first.member_id), later, Duration::ZERO);
        let JoinOutcome::Now(refused) = outcome else { panic!("a stale pending id was taken") };
        assert_eq!(refused.error, ResponseError::UnknownMemberId.code());
        assert!(group.pending_member_ids.is_empty() && group.pending_order.is_empty());
        // Within the lifetime it is taken.
        let (outcome, _) = group.join(request(""), later, Duration::ZERO);
        let JoinOutcome::Now(second) = outcome else { panic!() };
        let (outcome, _) = group.join(request(&second.member_id), later + Duration::from_secs(299), Duration::ZERO);
        assert!(matches!(outcome, JoinOutcome::Wait(_)), "a fresh pending id was refused");
        assert!(group.needs_ticks());
    }

    /// group.max.size counts members and handed-out member ids: past it a new one is
    /// GROUP_MAX_SIZE_REACHED, while a handed-out id is still taken, a member rejoins,
    /// and a static member takes its own place. A slot frees when a member leaves.
    #[test]
    fn a_full_group_refuses_new_members_only() {
        let now = Instant::now();
        let mut group = Group::new("g");
        group.max_size = 3;
        let (a, _rx_a) = join(&mut group, now);
        let mut static_member = request("");
        static_member.group_instance_id = Some("i-1".into());
        let (outcome, _) = group.join(static_member.clone(), now, Duration::ZERO);
        assert!(matches!(outcome, JoinOutcome::Wait(_)), "the static member joins");
        let (outcome, _) = group.join(request(""), now, Duration::ZERO);
        let JoinOutcome::Now(handed) = outcome else { panic!() };
        assert_eq!(handed.error, ResponseError::MemberIdRequired.code(), "the third slot: an id handed out");

        let refused = |outcome: JoinOutcome| match outcome {
            JoinOutcome::Now(r) => r.error == ResponseError::GroupMaxSizeReached.code(),
            JoinOutcome::Wait(_) => false,
        };
        assert!(refused(group.join(request(""), now, Duration::ZERO).0), "a fourth id");
        let mut another_static = request("");
        another_static.group_instance_id = Some("i-2".into());
        assert!(refused(group.join(another_static, now, Duration::ZERO).0), "a new static member");
        assert!(!refused(group.join(static_member, now, Duration::ZERO).0), "the static member takes its own place");
        assert!(!refused(group.join(request(&handed.member_id), now, Duration::ZERO).0), "the handed-out id is taken");
        assert!(!refused(group.join(request(&a), now, Duration::ZERO).0), "a member rejoins");
        assert_eq!(group.members.len(), 3);

        deliver(group.leave(&a, None, now).unwrap());
        let (outcome, _) = group.join(request(""), now, Duration::ZERO);
        let JoinOutcome::Now(freed) = outcome else { panic!() };
        assert_eq!(freed.error, ResponseError::MemberIdRequired.code(), "a member left: room for one");
    }

    #[test]
    fn a_subscription_claiming_more_topics_than_its_bytes_is_undecodable_not_allocated() {
        // Version 1, then topics claiming 2^31-1 names in a few bytes.
        let hostile = Bytes::from_static(&[0, 1, 0x7f, 0xff, 0xff, 0xff, 0, 1, b't']);
        assert_eq!(subscription_topics(&hostile), None);
        assert_eq!(subscription_topics(&subscription(&["a", "b"])), Some(vec!["a".to_string(), "b".to_string()]));
    }
}
