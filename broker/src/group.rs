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
//! - `admin`: ListGroups, DescribeGroups, DeleteGroups;
//! - `registry`: the registries in the metadata store (docs/architecture.md) and the
//!   group-id-to-node-name encoding:
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
mod txn_offsets;

mod admin;
mod find_coordinator;
pub(crate) use find_coordinator::coordinators_response;
mod membership;
mod offset_delete;
mod offsets;
mod registry;

use std::collections::{BTreeMap, HashMap};
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
    /// Whether the group exists as Kafka sees it: it has members or committed offsets.
    /// An entry without either (a FindCoordinator or a describe of a group nobody
    /// joined) is a group that never existed: ListGroups leaves it out, DescribeGroups
    /// calls it Dead and DeleteGroups answers GROUP_ID_NOT_FOUND.
    fn exists(&self) -> bool {
        self.group.state != GroupState::Empty || !self.offsets.is_empty() || !self.pending_txn.is_empty()
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
        let known = self.inner.groups.lock().expect("groups lock").get(group_id).cloned();
        if let Some(entry) = known {
            self.still_coordinator(group_id).await?;
            return Ok(entry);
        }
        if self.inner.claim(group_id).await? != self.inner.endpoint.broker_id {
            return Err(ResponseError::NotCoordinator);
        }
        let (offsets, pending_txn) = self.inner.load_group_offsets(group_id).await?;
        let mut groups = self.inner.groups.lock().expect("groups lock");
        let entry = groups
            .entry(group_id.to_string())
            .or_insert_with(|| Arc::new(Mutex::new(GroupEntry { group: Group::new(group_id), offsets, pending_txn })));
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
            self.still_coordinator(group_id).await?;
            let exists = entry.lock().await.exists();
            return Ok(exists.then_some(entry));
        }
        if self.inner.claim(group_id).await? != self.inner.endpoint.broker_id {
            return Err(ResponseError::NotCoordinator);
        }
        let (offsets, pending_txn) = self.inner.load_group_offsets(group_id).await?;
        if offsets.is_empty() && pending_txn.is_empty() {
            return Ok(None);
        }
        let mut groups = self.inner.groups.lock().expect("groups lock");
        let entry = groups
            .entry(group_id.to_string())
            .or_insert_with(|| Arc::new(Mutex::new(GroupEntry { group: Group::new(group_id), offsets, pending_txn })));
        Ok(Some(entry.clone()))
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

    /// A group this broker already coordinates; requests other than JoinGroup and
    /// the offset APIs never create one.
    async fn existing(&self, group_id: &str) -> Result<Arc<Mutex<GroupEntry>>, ResponseError> {
        let entry = self.entry(group_id).await?;
        if entry.lock().await.group.state == GroupState::Empty {
            return Err(ResponseError::UnknownMemberId);
        }
        Ok(entry)
    }
}

impl Inner {
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
