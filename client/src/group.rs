//! The group consumer: members of a consumer group share the partitions of the
//! topics they subscribe to, and the group's committed offsets say where each
//! partition resumes (the paper's §3.3, with Kafka's coordinator-based protocol).
//!
//! A member finds the group's coordinator (FindCoordinator), joins (JoinGroup; a new
//! member is first handed an id with MEMBER_ID_REQUIRED and joins again), and the
//! leader the coordinator picked computes the assignment from every member's
//! `ConsumerProtocolSubscription` with the agreed [`crate::assignor`]; SyncGroup hands
//! each member its `ConsumerProtocolAssignment`. Fetching is the plain [`crate::Consumer`],
//! started at the committed offsets (OffsetFetch), or per `auto.offset.reset` where
//! the group committed nothing.
//!
//! A background task heartbeats every `heartbeat.interval.ms`; when the coordinator
//! answers REBALANCE_IN_PROGRESS (or that the generation is gone) the next
//! [`GroupConsumer::poll`] rejoins. The leader's heartbeat task also watches the partition
//! counts it assigned from (metadata refreshed at least every `metadata.max.age.ms`): when
//! a subscribed topic gains partitions (CreatePartitions), is created or is deleted, the
//! leader rejoins, so the new assignment covers the new partitions (as Kafka's leader does;
//! other members do not watch, so one change causes one rebalance, not one per member). Eager protocols give up every partition before
//! rejoining (committing first); `cooperative-sticky` gives up only the partitions that
//! move and rejoins once more so their new owners get them.
//!
//! [`GroupAdmin`] lists and describes groups and reads or resets their committed offsets.
//!
//! # Layout
//! - this file: [`GroupConfig`], [`Rebalance`], and the member state and coordinator
//!   lookup (FindCoordinator) that the consumer, its heartbeat and the admin share;
//! - `member`: [`GroupConsumer`]: subscribe, poll, commit, close, and the heartbeat task;
//! - `join`: the rebalance: JoinGroup and SyncGroup, the leader's assignment, giving up
//!   and taking over partitions;
//! - `admin`: [`GroupAdmin`];
//! - `protocol`: the consumer protocol's subscription and assignment codec.

mod admin;
mod join;
mod member;
mod protocol;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kafka_protocol::messages::{FindCoordinatorRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

use crate::assignor;
use crate::cluster::Cluster;
use crate::connection::Connection;
use crate::consumer::ConsumerConfig;
use crate::error::{Error, Result};
use fjord_record::TopicPartition;

pub use admin::{GroupAdmin, GroupDescription, MemberDescription};
pub use member::GroupConsumer;
pub use protocol::decode_assignment_bytes;

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
    /// Set while this member leads the generation: the partition counts its assignment
    /// was computed from, which the heartbeat task compares with fresh metadata.
    assigned_from: Mutex<Option<AssignmentSnapshot>>,
}

/// The partition counts a leader's assignment was computed from.
#[derive(Debug, Clone, PartialEq, Eq)]
struct AssignmentSnapshot {
    /// Every topic some member subscribes to.
    topics: BTreeSet<String>,
    /// Partition count per subscribed topic; a topic that did not exist is absent.
    counts: BTreeMap<String, i32>,
}

impl AssignmentSnapshot {
    /// Whether `now` (partition counts from fresher metadata; absent: the topic does not
    /// exist) differs for a subscribed topic, so the assignment misses partitions or hands
    /// out ones that are gone, and the group must rebalance.
    fn outdated_by(&self, now: &BTreeMap<String, i32>) -> bool {
        self.topics.iter().any(|t| self.counts.get(t) != now.get(t))
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn topic_name(t: &str) -> TopicName {
    TopicName(s(t))
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn counts(pairs: &[(&str, i32)]) -> BTreeMap<String, i32> {
        pairs.iter().map(|(t, n)| (t.to_string(), *n)).collect()
    }

    #[test]
    fn an_assignment_is_outdated_when_a_subscribed_topic_changes_its_partition_count() {
        let snapshot = AssignmentSnapshot {
            topics: ["a", "b", "later"].iter().map(|t| t.to_string()).collect(),
            counts: counts(&[("a", 2), ("b", 3)]),
        };
        // Same counts; topics nobody subscribes to do not matter.
        assert!(!snapshot.outdated_by(&counts(&[("a", 2), ("b", 3), ("other", 9)])));
        // CreatePartitions raised a's count.
        assert!(snapshot.outdated_by(&counts(&[("a", 4), ("b", 3)])));
        // A subscribed topic that did not exist was created.
        assert!(snapshot.outdated_by(&counts(&[("a", 2), ("b", 3), ("later", 1)])));
        // A subscribed topic was deleted.
        assert!(snapshot.outdated_by(&counts(&[("a", 2)])));
    }
}
