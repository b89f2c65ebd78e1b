//! The group coordinator: Kafka's broker-side consumer group protocol, with the
//! paper's registries as its storage.
//!
//! # Layout
//! - [`state`]: one group's membership state machine (join, sync, heartbeat, leave,
//!   session expiry), pure and unit-tested.
//! - this file: the coordinator that owns the groups (finding or creating a group's
//!   entry) and the ticker that expires sessions and rebalance deadlines;
//! - `find_coordinator`: FindCoordinator, which claims a group's coordinator node;
//! - `membership`: JoinGroup, SyncGroup, Heartbeat, LeaveGroup, the I/O shell around
//!   [`state`];
//! - `offsets`: OffsetCommit and OffsetFetch;
//! - `offset_delete`: OffsetDelete;
//! - `retention`: committed offsets expire (`offsets.retention.minutes`);
//! - `admin`: ListGroups, DescribeGroups, DeleteGroups;
//! - `registry`: the registries in the metadata store (docs/architecture.md) and the
//!   group-id-to-node-name encoding:
//!   - `/consumers/<group>` (persistent): its data says whether the group has members
//!     and since when (`retention`);
//!   - `/consumers/<group>/coordinator` (ephemeral): which broker coordinates it;
//!   - `/consumers/<group>/offsets/<topic>/<p>` (persistent): committed offsets, so
//!     they survive any broker and are visible to operators;
//!   - `/consumers/<group>/owners/<topic>/<p>` (ephemeral): which member owns each
//!     partition, written after each completed rebalance.
//!
//! Committed offsets are cached in memory per group, loaded from the store the first
//! time this broker touches the group, and written through on every commit. They
//! expire as Kafka's do (`offsets.retention.minutes`, see `retention`); a group without
//! members that no request touched for [`IDLE_EVICTION`] leaves memory, and loads again
//! on its next use.
//! The ticker visits only the groups with members, a rebalance or handed-out member ids,
//! so thousands of groups that only commit offsets cost it nothing.

pub(crate) mod state;
mod txn_offsets;

mod admin;
mod find_coordinator;
pub(crate) use find_coordinator::coordinators_response;
mod membership;
mod offset_delete;
mod offsets;
mod registry;
mod retention;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use fjord_coord::Store;
use fjord_record::now_ms;
use kafka_protocol::error::ResponseError;
use tokio::sync::Mutex;

use crate::periodic::Periodic;
use offsets::CommittedOffset;
use state::{Group, GroupState, Reply};

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
    /// `group.max.size`: the most members (with member ids handed out and not used yet) a
    /// group takes; a new one past it is refused with GROUP_MAX_SIZE_REACHED. Kafka's
    /// default is unlimited; Fjord's is 1000, so one group's members cannot take the
    /// coordinator's memory (a group with more members than its topics have partitions
    /// leaves the rest idle anyway).
    pub max_size: usize,
    /// `offsets.retention.minutes`: how long a group without members keeps its committed
    /// offsets, and an offset no member may be reading stays after its commit.
    pub offsets_retention: Duration,
    /// `offsets.retention.check.interval.ms`: how often offsets are checked for expiry.
    pub offsets_retention_check_interval: Duration,
}

impl Default for GroupConfig {
    fn default() -> Self {
        Self {
            min_session_timeout_ms: 6_000,
            max_session_timeout_ms: 1_800_000,
            initial_rebalance_delay_ms: 3_000,
            offset_metadata_max_bytes: 4096,
            max_size: 1000,
            offsets_retention: Duration::from_secs(7 * 24 * 3600),
            offsets_retention_check_interval: Duration::from_secs(600),
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

/// A group as the coordinator holds it.
struct GroupEntry {
    group: Group,
    /// Committed offsets by (topic, partition); loaded from the store on first use.
    offsets: BTreeMap<(String, i32), CommittedOffset>,
    /// Partitions with transactional offsets pending (TxnOffsetCommit, no marker yet), by
    /// producer id; loaded with the offsets. OffsetFetch with `require_stable` answers
    /// UNSTABLE_OFFSET_COMMIT for them.
    pending_txn: txn_offsets::PendingPartitions,
}

impl GroupEntry {
    /// A group nobody joined, with no offsets.
    fn new(group_id: &str) -> Self {
        Self { group: Group::new(group_id), offsets: BTreeMap::new(), pending_txn: Default::default() }
    }

    /// Whether the group exists as Kafka sees it: it has members or committed offsets.
    /// An entry without either (a FindCoordinator or a describe of a group nobody
    /// joined) is a group that never existed: ListGroups leaves it out, DescribeGroups
    /// calls it Dead and DeleteGroups answers GROUP_ID_NOT_FOUND.
    fn exists(&self) -> bool {
        self.group.state != GroupState::Empty || !self.offsets.is_empty() || !self.pending_txn.is_empty()
    }
}

/// A group's entry in memory, with when a request last took it.
struct Held {
    entry: Arc<Mutex<GroupEntry>>,
    used: Instant,
}

struct Inner {
    store: Store,
    endpoint: Endpoint,
    config: GroupConfig,
    groups: std::sync::Mutex<HashMap<String, Held>>,
    /// The groups the ticker visits ([`Group::needs_ticks`]): added by JoinGroup, under
    /// the entry's lock, and dropped by the ticker, under it too, once the group has
    /// nothing left to expire. Lock order: `groups`, then `ticking`.
    ticking: std::sync::Mutex<HashSet<String>>,
    /// Groups FindCoordinator took for this broker, with when: given up after
    /// [`FOUND_RELEASE`] unless a request brought them into memory (see
    /// [`Inner::found_due`]).
    found: std::sync::Mutex<HashMap<String, Instant>>,
    /// Gone groups whose registry nodes are to be given up ([`Inner::release`]), by the
    /// one release task at a time ([`Inner::releasing`]): each node is a store round
    /// trip, and thousands of them must not hold up the ticker (sessions, rebalances).
    to_release: std::sync::Mutex<Vec<String>>,
    releasing: std::sync::atomic::AtomicBool,
    /// Whether an offset-expiry sweep is running ([`Inner::expire_offsets`]).
    expiring: std::sync::atomic::AtomicBool,
    /// Committed offsets expired since the broker started (`/metrics`).
    offsets_expired: std::sync::atomic::AtomicU64,
    /// Serialises ownership-registry rewrites; the value is the last generation
    /// written per group, so a slow older rewrite never overwrites a newer one.
    owners_written: Mutex<HashMap<String, i32>>,
}

/// The coordinator's figures for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct GroupStats {
    /// Groups in memory (used within the idle period, or with members).
    pub(crate) in_memory: usize,
    /// Groups with members, a rebalance or handed-out member ids (the ticker's list).
    pub(crate) ticked: usize,
    /// Committed offsets expired (`offsets.retention.minutes`) since the broker started.
    pub(crate) offsets_expired: u64,
}

/// Owns every group this broker coordinates.
#[derive(Clone)]
pub(crate) struct GroupCoordinator {
    inner: Arc<Inner>,
}

/// How often sessions and rebalance deadlines are checked.
const TICK: Duration = Duration::from_millis(100);
/// A group with nothing to tick that no request took for this long leaves memory (its
/// offsets are in the registry): groups that commit once and are gone (a tool, a test,
/// a client making up group ids) would otherwise stay in every coordinator's memory.
const IDLE_EVICTION: Duration = Duration::from_secs(600);
/// Ticks between two looks for idle groups to evict (a minute).
const EVICTION_TICKS: u32 = 600;
/// How long a group FindCoordinator took waits for the JoinGroup or commit that brings
/// it into memory before its node is given up: clients send those right after.
const FOUND_RELEASE: Duration = Duration::from_secs(60);

impl GroupCoordinator {
    /// Creates the coordinator and starts its session-expiry ticker, which stops by
    /// itself once the coordinator is dropped.
    pub(crate) fn new(store: Store, endpoint: Endpoint, config: GroupConfig) -> Self {
        let inner = Arc::new(Inner {
            store,
            endpoint,
            config,
            groups: std::sync::Mutex::new(HashMap::new()),
            ticking: std::sync::Mutex::new(HashSet::new()),
            found: std::sync::Mutex::new(HashMap::new()),
            to_release: std::sync::Mutex::new(Vec::new()),
            releasing: std::sync::atomic::AtomicBool::new(false),
            expiring: std::sync::atomic::AtomicBool::new(false),
            offsets_expired: std::sync::atomic::AtomicU64::new(0),
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
        if let Some(entry) = self.inner.take(group_id) {
            self.still_coordinator(group_id).await?;
            return Ok(entry);
        }
        if self.inner.claim(group_id).await? != self.inner.endpoint.broker_id {
            return Err(ResponseError::NotCoordinator);
        }
        let (offsets, pending_txn) = self.inner.load_group_offsets(group_id).await?;
        Ok(self.inner.hold(group_id, offsets, pending_txn))
    }

    /// The group's entry if the group exists, without creating it: a group exists while
    /// it has members or committed offsets (Kafka drops a group that has neither). A
    /// group no broker coordinates yet is claimed here only if the registry holds
    /// offsets for it, so asking about made-up groups (DescribeGroups, OffsetFetch,
    /// Heartbeat, ...) writes nothing. `Err` carries the error code to answer with
    /// (NOT_COORDINATOR when another broker coordinates it).
    async fn lookup(&self, group_id: &str) -> Result<Option<Arc<Mutex<GroupEntry>>>, ResponseError> {
        if group_id.is_empty() {
            return Err(ResponseError::InvalidGroupId);
        }
        if let Some(entry) = self.inner.take(group_id) {
            self.still_coordinator(group_id).await?;
            let exists = entry.lock().await.exists();
            return Ok(exists.then_some(entry));
        }
        let me = self.inner.endpoint.broker_id;
        let holder = self.inner.holder(group_id).await?;
        if holder.is_some_and(|h| h != me) {
            return Err(ResponseError::NotCoordinator);
        }
        let (offsets, pending_txn) = self.inner.load_group_offsets(group_id).await?;
        if offsets.is_empty() && pending_txn.is_empty() {
            return Ok(None);
        }
        if holder.is_none() && self.inner.claim(group_id).await? != me {
            return Err(ResponseError::NotCoordinator);
        }
        Ok(Some(self.inner.hold(group_id, offsets, pending_txn)))
    }

    /// Checks that this broker still holds the group's coordinator node before serving
    /// a group it has in memory. The node is ephemeral: once this broker's metadata
    /// session expired (a partition from ZooKeeper, a long pause), another broker may
    /// have claimed the group and be running it. Serving the in-memory group regardless
    /// was a split brain: two coordinators, two generations whose members each owned
    /// every partition, and commits from both, so committed offsets went backwards (found
    /// by the chaos runs of #21). The group is dropped here and its members told
    /// NOT_COORDINATOR, so they find the new coordinator and rejoin there.
    async fn still_coordinator(&self, group_id: &str) -> Result<(), ResponseError> {
        if self.inner.claim(group_id).await? == self.inner.endpoint.broker_id {
            return Ok(());
        }
        tracing::warn!(group = group_id, "another broker coordinates the group now; dropping its state here");
        self.inner.groups.lock().expect("groups lock").remove(group_id);
        Err(ResponseError::NotCoordinator)
    }

    /// What `/metrics` shows of the groups.
    pub(crate) fn stats(&self) -> GroupStats {
        GroupStats {
            in_memory: self.inner.groups.lock().expect("groups lock").len(),
            ticked: self.inner.ticking.lock().expect("ticking lock").len(),
            offsets_expired: self.inner.offsets_expired.load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// A group this broker already coordinates, with members; requests other than
    /// JoinGroup and the offset APIs never create one (nor claim it).
    async fn existing(&self, group_id: &str) -> Result<Arc<Mutex<GroupEntry>>, ResponseError> {
        let entry = self.lookup(group_id).await?.ok_or(ResponseError::UnknownMemberId)?;
        if entry.lock().await.group.state == GroupState::Empty {
            return Err(ResponseError::UnknownMemberId);
        }
        Ok(entry)
    }
}

impl Inner {
    /// The group's entry when it is in memory, marked used now.
    fn take(&self, group_id: &str) -> Option<Arc<Mutex<GroupEntry>>> {
        let mut groups = self.groups.lock().expect("groups lock");
        let held = groups.get_mut(group_id)?;
        held.used = Instant::now();
        Some(held.entry.clone())
    }

    /// The group's entry, made from what was loaded unless another request made it
    /// meanwhile.
    fn hold(
        &self,
        group_id: &str,
        offsets: BTreeMap<(String, i32), CommittedOffset>,
        pending_txn: txn_offsets::PendingPartitions,
    ) -> Arc<Mutex<GroupEntry>> {
        let mut groups = self.groups.lock().expect("groups lock");
        let held = groups.entry(group_id.to_string()).or_insert_with(|| {
            let mut group = Group::new(group_id);
            group.max_size = self.config.max_size;
            Held { entry: Arc::new(Mutex::new(GroupEntry { group, offsets, pending_txn })), used: Instant::now() }
        });
        held.used = Instant::now();
        held.entry.clone()
    }

    /// Has the ticker visit the group from now on; called under the entry's lock after a
    /// JoinGroup, the one request that gives a group members or member ids.
    fn tick_group(&self, entry: &GroupEntry) {
        if entry.group.needs_ticks() {
            self.ticking.lock().expect("ticking lock").insert(entry.group.group_id.clone());
        }
    }

    /// A group's committed offsets and its pending transactional ones, read from the
    /// store when this broker takes the group on.
    async fn load_group_offsets(
        &self,
        group_id: &str,
    ) -> Result<(BTreeMap<(String, i32), CommittedOffset>, txn_offsets::PendingPartitions), ResponseError> {
        let unavailable = |e: fjord_coord::Error| {
            tracing::warn!(group = group_id, error = %e, "could not load committed offsets");
            ResponseError::CoordinatorLoadInProgress
        };
        let offsets = self.load_offsets(group_id).await.map_err(unavailable)?;
        let pending = self.load_pending_txn(group_id).await.map_err(unavailable)?;
        Ok((offsets, pending))
    }

    async fn tick(&self) {
        let ticking: Vec<String> = self.ticking.lock().expect("ticking lock").iter().cloned().collect();
        for group_id in ticking {
            let entry = {
                let groups = self.groups.lock().expect("groups lock");
                match groups.get(&group_id) {
                    Some(held) => held.entry.clone(),
                    // Dropped (deleted, or coordinated elsewhere now). Under the groups
                    // lock, so a new entry of the same id, and the JoinGroup that would
                    // add it here, come after this.
                    None => {
                        self.ticking.lock().expect("ticking lock").remove(&group_id);
                        continue;
                    }
                }
            };
            let emptied = {
                let mut entry = entry.lock().await;
                let (before, had_members) = (entry.group.state, !entry.group.members.is_empty());
                let replies = entry.group.tick(Instant::now());
                replies.into_iter().for_each(Reply::deliver);
                if !entry.group.needs_ticks() {
                    self.ticking.lock().expect("ticking lock").remove(&group_id);
                }
                if had_members && entry.group.members.is_empty() {
                    self.write_membership(&group_id, false).await;
                }
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
    let mut ticks = 0u32;
    let mut last_expiry = Instant::now();
    loop {
        periodic.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        inner.tick().await;
        if last_expiry.elapsed() >= inner.config.offsets_retention_check_interval {
            last_expiry = Instant::now();
            if !inner.expiring.swap(true, std::sync::atomic::Ordering::AcqRel) {
                tokio::spawn(inner.clone().expire_offsets_task());
            }
        }
        ticks = ticks.wrapping_add(1);
        if ticks.is_multiple_of(EVICTION_TICKS) {
            let now = Instant::now();
            let gone = inner.evict_idle(now);
            let due = inner.found_due(now);
            inner.to_release.lock().expect("release lock").extend(gone.into_iter().chain(due));
            if !inner.releasing.swap(true, std::sync::atomic::Ordering::AcqRel) {
                tokio::spawn(inner.clone().release_all());
            }
        }
    }
}

impl Inner {
    /// Takes the groups FindCoordinator took at least [`FOUND_RELEASE`] before `now`: those
    /// no request brought into memory since (made-up ids, or a client that went away)
    /// are to be given up, since each claim left a node in the registry for good before.
    /// [`Inner::release`] leaves a group in memory alone, and a group with offsets keeps
    /// them (the next request claims it again).
    fn found_due(&self, now: Instant) -> Vec<String> {
        let mut found = self.found.lock().expect("found lock");
        let due = found.iter().filter(|(_, at)| now.duration_since(**at) >= FOUND_RELEASE).map(|(id, _)| id.clone()).collect();
        found.retain(|_, at| now.duration_since(*at) < FOUND_RELEASE);
        due
    }

    /// The release task: gives up every group in `to_release`, including those added
    /// while it runs, then ends.
    async fn release_all(self: Arc<Self>) {
        loop {
            let batch = std::mem::take(&mut *self.to_release.lock().expect("release lock"));
            for group_id in &batch {
                self.release(group_id).await;
            }
            if batch.is_empty() {
                self.releasing.store(false, std::sync::atomic::Ordering::Release);
                // One added between the take and the store would wait for the next sweep
                // otherwise: go on if this task can take the role back.
                if self.to_release.lock().expect("release lock").is_empty()
                    || self.releasing.swap(true, std::sync::atomic::Ordering::AcqRel)
                {
                    return;
                }
            }
        }
    }

    /// Drops from memory the groups with nothing to tick, no pending transactional
    /// offsets and no request for [`IDLE_EVICTION`]; a group some request holds is kept.
    /// Their committed offsets are in the registry, and their coordinator node stays
    /// this broker's, so the next request loads them again, as after a restart. Returns
    /// the groups dropped that do not exist (no offsets either), for
    /// [`Inner::release`].
    fn evict_idle(&self, now: Instant) -> Vec<String> {
        let mut groups = self.groups.lock().expect("groups lock");
        let before = groups.len();
        let mut gone = Vec::new();
        groups.retain(|id, held| {
            if now.duration_since(held.used) < IDLE_EVICTION {
                return true;
            }
            let Ok(entry) = held.entry.try_lock() else { return true };
            let keep = entry.group.needs_ticks() || !entry.pending_txn.is_empty();
            if !keep && !entry.exists() {
                gone.push(id.clone());
            }
            keep
        });
        let evicted = before - groups.len();
        if evicted > 0 {
            tracing::debug!(evicted, gone = gone.len(), kept = groups.len(), "idle groups left memory");
        }
        gone
    }
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::*;
    use kafka_protocol::protocol::StrBytes;

    use super::*;

    async fn coordinator(dir: &std::path::Path) -> GroupCoordinator {
        let store = fjord_coord::open(None, dir).await.unwrap();
        let config = GroupConfig { initial_rebalance_delay_ms: 0, ..GroupConfig::default() };
        GroupCoordinator::new(store, Endpoint { broker_id: 0, listeners: Vec::new() }, config)
    }

    fn group(name: &str) -> GroupId {
        GroupId(StrBytes::from_string(name.to_owned()))
    }

    /// Commits `offset` for partition 0 of `t` outside the group protocol.
    async fn commit(groups: &GroupCoordinator, group_id: &str, offset: i64) {
        let request = OffsetCommitRequest::default()
            .with_group_id(group(group_id))
            .with_generation_id_or_member_epoch(-1)
            .with_topics(vec![offset_commit_request::OffsetCommitRequestTopic::default()
                .with_name(TopicName(StrBytes::from_static_str("t")))
                .with_partitions(vec![
                    offset_commit_request::OffsetCommitRequestPartition::default().with_committed_offset(offset)
                ])]);
        let ResponseKind::OffsetCommit(r) = groups.offset_commit(request, 8, |_, _| true).await else { panic!() };
        assert_eq!(r.topics[0].partitions[0].error_code, 0);
    }

    async fn committed(groups: &GroupCoordinator, group_id: &str) -> i64 {
        let request = OffsetFetchRequest::default().with_groups(vec![offset_fetch_request::OffsetFetchRequestGroup::default()
            .with_group_id(group(group_id))
            .with_topics(Some(vec![offset_fetch_request::OffsetFetchRequestTopics::default()
                .with_name(TopicName(StrBytes::from_static_str("t")))
                .with_partition_indexes(vec![0])]))]);
        let ResponseKind::OffsetFetch(r) = groups.offset_fetch(request, 8).await else { panic!() };
        r.groups[0].topics[0].partitions[0].committed_offset
    }

    fn ticking(groups: &GroupCoordinator) -> Vec<String> {
        groups.inner.ticking.lock().unwrap().iter().cloned().collect()
    }

    fn in_memory(groups: &GroupCoordinator) -> usize {
        groups.inner.groups.lock().unwrap().len()
    }

    /// Groups that only commit offsets cost the ticker nothing (it visited every group
    /// in memory ten times a second: 65k such groups took a third of a core, idle); a
    /// group with a member is ticked until it is empty; idle groups leave memory and
    /// their offsets load again from the registry.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_groups_with_members_are_ticked_and_idle_groups_leave_memory() {
        let dir = tempfile::tempdir().unwrap();
        let groups = coordinator(dir.path()).await;
        for n in 0..100 {
            commit(&groups, &format!("g{n}"), n).await;
        }
        assert!(ticking(&groups).is_empty());

        // The ticker completes the join (initial delay 0): it must visit the group.
        let join = JoinGroupRequest::default()
            .with_group_id(group("live"))
            .with_session_timeout_ms(10_000)
            .with_protocol_type(StrBytes::from_static_str("consumer"))
            .with_protocols(vec![join_group_request::JoinGroupRequestProtocol::default()
                .with_name(StrBytes::from_static_str("range"))
                .with_metadata(bytes::Bytes::from_static(b"m"))]);
        let joined = tokio::time::timeout(Duration::from_secs(10), groups.join_group(join, 0, "c", "h")).await.unwrap();
        let ResponseKind::JoinGroup(joined) = joined else { panic!() };
        assert_eq!(joined.error_code, 0);
        assert_eq!(ticking(&groups), vec!["live".to_string()]);
        let leave = LeaveGroupRequest::default().with_group_id(group("live")).with_member_id(joined.member_id);
        let ResponseKind::LeaveGroup(left) = groups.leave_group(leave, 0).await else { panic!() };
        assert_eq!(left.error_code, 0);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !ticking(&groups).is_empty() {
            assert!(Instant::now() < deadline, "an empty group is still ticked");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        // Used just now: kept. Idle past IDLE_EVICTION: gone, offsets still there; the
        // group that came and went without offsets leaves nothing in the registry.
        assert_eq!(in_memory(&groups), 101);
        assert!(groups.inner.evict_idle(Instant::now()).is_empty());
        assert_eq!(in_memory(&groups), 101);
        let live = fjord_coord::paths::group_coordinator("live");
        assert!(groups.inner.store.get(&live).await.unwrap().is_some());
        let gone = groups.inner.evict_idle(Instant::now() + IDLE_EVICTION + Duration::from_secs(1));
        assert_eq!(gone, vec!["live".to_string()]);
        assert_eq!(in_memory(&groups), 0);
        groups.inner.release("live").await;
        let mut left = groups.inner.store.children(fjord_coord::paths::CONSUMERS).await.unwrap();
        left.sort();
        assert_eq!(left.len(), 100, "{left:?}");
        assert!(!left.contains(&"live".to_string()), "{left:?}");
        // ListGroups names them from the registry without bringing them back into memory.
        let ResponseKind::ListGroups(listed) = groups.list_groups(ListGroupsRequest::default()).await else { panic!() };
        assert_eq!(listed.groups.len(), 100);
        assert!(listed.groups.iter().all(|g| g.group_state.as_str() == "Empty" && g.protocol_type.as_str() == "consumer"));
        assert_eq!(in_memory(&groups), 0, "listing loaded the groups");
        assert_eq!(committed(&groups, "g7").await, 7);
        assert_eq!(in_memory(&groups), 1);
        // Releasing a group that has offsets leaves them, even when asked to.
        groups.inner.release("g8").await;
        assert_eq!(committed(&groups, "g8").await, 8);

        // FindCoordinator takes a group nobody holds; given up a while later unless a
        // request brought it into memory.
        for key in ["asked", "g9"] {
            let find = FindCoordinatorRequest::default().with_key(StrBytes::from_static_str(key));
            groups.find_coordinator(find, 3, "PLAINTEXT").await;
        }
        let asked = fjord_coord::paths::group_coordinator("asked");
        assert!(groups.inner.store.get(&asked).await.unwrap().is_some());
        assert!(groups.inner.found_due(Instant::now()).is_empty(), "given up at once");
        assert_eq!(committed(&groups, "g9").await, 9);
        // g9 was held already (its commit took it): not FindCoordinator's to give up.
        let due = groups.inner.found_due(Instant::now() + FOUND_RELEASE + Duration::from_secs(1));
        assert_eq!(due, ["asked"]);
        groups.inner.to_release.lock().unwrap().extend(due);
        groups.inner.releasing.store(true, std::sync::atomic::Ordering::Release);
        groups.inner.clone().release_all().await;
        assert!(!groups.inner.releasing.load(std::sync::atomic::Ordering::Acquire));
        assert!(groups.inner.store.get(&asked).await.unwrap().is_none());
        assert!(groups.inner.store.children(fjord_coord::paths::CONSUMERS).await.unwrap().iter().all(|g| g != "asked"));
        assert!(groups.inner.store.get(&fjord_coord::paths::group_coordinator("g9")).await.unwrap().is_some());
    }
}
