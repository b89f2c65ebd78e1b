//! The replica manager: turns partition states from the metadata store into roles.
//!
//! The cluster view calls [`ReplicaManager::apply`] with every new state (leader,
//! leader epoch, ISR, znode version) of a partition this broker holds a replica of, in
//! order per partition, and [`ReplicaManager::remove`] when the replica goes away. The
//! broker then becomes:
//! - leader (leader == this broker, newer epoch): stops fetching the partition, records
//!   where its epoch starts, tracks each follower's log end offset from their fetches,
//!   advances the high watermark to the smallest log end offset of the ISR;
//! - follower (leader is another broker): stops leading, asks the leader where its
//!   latest epoch ended and truncates there, then fetches from the leader as a replica
//!   (`fetcher`);
//! - neither (no leader): stops both.
//!
//! As leader it also writes ISR changes to the partition state znode, by
//! compare-and-set on the version it last saw with the same leader and epoch: a
//! follower that has not caught up for `replica.lag.time.max.ms` leaves, one that
//! reached the high watermark comes back.
//!
//! Modules: `leader` (high watermark and ISR rules), `truncation` (where a follower
//! truncates), `throttle` (the replication throttles' rate limiter and replica lists),
//! all pure; `fetcher` (the replica fetcher tasks), `peer` (their connection).

mod fetcher;
pub(crate) mod leader;
mod peer;
pub(crate) mod throttle;
pub(crate) mod truncation;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use fjord_coord::registry::{read_json, to_json, PartitionState};
use fjord_coord::{paths, Store};
use fjord_log::Log;
use fjord_record::TopicPartition;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::partition::{Partition, Role};
use crate::periodic::Periodic;
use crate::replication::fetcher::{FetchContext, Fetchers};
use crate::replication::leader::FollowerProgress;
pub(crate) use crate::replication::peer::{Peer, PeerConfig, PeerSasl};
use crate::replication::throttle::ReplicationThrottles;

/// A state applied to a partition, kept until its log is opened.
#[derive(Debug, Clone)]
struct Applied {
    replicas: Vec<i32>,
    state: PartitionState,
    state_version: i32,
}

/// Replication settings (Kafka's names and defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicationConfig {
    /// `replica.lag.time.max.ms`: a follower not caught up for this long leaves the ISR. 30 s.
    pub lag_time_max: Duration,
    /// `replica.fetch.max.bytes`: per partition in a replica fetch. 1 MiB.
    pub fetch_max_bytes: i32,
    /// `replica.fetch.response.max.bytes`: per replica fetch. 10 MiB.
    pub fetch_response_max_bytes: i32,
    /// `replica.fetch.wait.max.ms`: how long the leader may hold a replica fetch. 500 ms.
    pub fetch_wait_max: Duration,
    /// `replica.fetch.backoff.ms`: pause after a failed replica fetch. 1 s.
    pub fetch_backoff: Duration,
    /// `replica.socket.timeout.ms`: connect and request timeout towards the leader. 30 s.
    pub socket_timeout: Duration,
}

impl Default for ReplicationConfig {
    fn default() -> Self {
        Self {
            lag_time_max: Duration::from_secs(30),
            fetch_max_bytes: 1 << 20,
            fetch_response_max_bytes: 10 << 20,
            fetch_wait_max: Duration::from_millis(500),
            fetch_backoff: Duration::from_secs(1),
            socket_timeout: Duration::from_secs(30),
        }
    }
}

impl ReplicationConfig {
    /// The broker keys [`ReplicationConfig::set`] understands.
    pub const KEYS: &'static [&'static str] = &[
        "replica.lag.time.max.ms",
        "replica.fetch.max.bytes",
        "replica.fetch.response.max.bytes",
        "replica.fetch.wait.max.ms",
        "replica.fetch.backoff.ms",
        "replica.socket.timeout.ms",
    ];

    /// Sets one key; `Err` carries the reason.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), &'static str> {
        let int = value.trim().parse::<i64>().map_err(|_| "not an integer")?;
        let millis = || u64::try_from(int).ok().filter(|&ms| ms > 0).map(Duration::from_millis).ok_or("must be positive");
        let bytes = || i32::try_from(int).ok().filter(|&b| b > 0).ok_or("must be between 1 and 2147483647");
        match key {
            "replica.lag.time.max.ms" => self.lag_time_max = millis()?,
            "replica.fetch.max.bytes" => self.fetch_max_bytes = bytes()?,
            "replica.fetch.response.max.bytes" => self.fetch_response_max_bytes = bytes()?,
            "replica.fetch.wait.max.ms" => self.fetch_wait_max = millis()?,
            "replica.fetch.backoff.ms" => self.fetch_backoff = millis()?,
            "replica.socket.timeout.ms" => self.socket_timeout = millis()?,
            _ => return Err("unknown replication key"),
        }
        Ok(())
    }
}

/// The replicas this broker holds and their roles.
pub(crate) struct ReplicaManager {
    broker_id: i32,
    store: Store,
    config: ReplicationConfig,
    partitions: RwLock<HashMap<TopicPartition, Arc<Partition>>>,
    /// States applied before the partition's log was opened; applied when it is.
    pending: Mutex<HashMap<TopicPartition, Applied>>,
    fetchers: Fetchers,
    /// The replication throttles: the leader's fetch serving and the fetchers ask them.
    throttles: Arc<ReplicationThrottles>,
    /// Fetchers, ISR writes and the ISR expiry task; stopped by [`ReplicaManager::shutdown`].
    tasks: TaskTracker,
    shutdown: CancellationToken,
    /// Notified when a log here became healthy (a follower's repair, a log that opens
    /// again): `crate::replica_health::publish` then clears its listing at once.
    health_changed: Arc<Notify>,
    /// Notified when a follower moved its log start up to its leader's; the broker
    /// then writes the log start checkpoint.
    log_start_moved: Arc<Notify>,
}

impl ReplicaManager {
    pub(crate) fn new(broker_id: i32, store: Store, config: ReplicationConfig, peer: PeerConfig) -> Arc<Self> {
        let (tasks, shutdown) = (TaskTracker::new(), CancellationToken::new());
        let health_changed = Arc::new(Notify::new());
        let log_start_moved = Arc::new(Notify::new());
        let throttles = Arc::new(ReplicationThrottles::new(broker_id));
        let context = FetchContext {
            broker_id,
            throttles: throttles.clone(),
            store: store.clone(),
            config,
            peer,
            tasks: tasks.clone(),
            shutdown: shutdown.clone(),
            health_changed: health_changed.clone(),
            log_start_moved: log_start_moved.clone(),
        };
        let manager = Arc::new(Self {
            broker_id,
            store,
            config,
            partitions: RwLock::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            fetchers: Fetchers::new(Arc::new(context)),
            throttles,
            tasks,
            shutdown,
            health_changed,
            log_start_moved,
        });
        manager.spawn_isr_expiry();
        manager
    }

    /// Stops the fetchers, ISR writes and the expiry task, and waits for them (before
    /// the logs are closed).
    pub(crate) async fn shutdown(&self) {
        self.shutdown.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }

    /// See the field: what the health publisher waits on besides its timer.
    pub(crate) fn health_changed(&self) -> Arc<Notify> {
        self.health_changed.clone()
    }

    /// See the field: what the follower log start checkpoint task waits on.
    pub(crate) fn log_start_moved(&self) -> Arc<Notify> {
        self.log_start_moved.clone()
    }

    /// The replication throttles of this broker.
    pub(crate) fn throttles(&self) -> &Arc<ReplicationThrottles> {
        &self.throttles
    }

    /// This broker's id.
    pub(crate) fn broker_id(&self) -> i32 {
        self.broker_id
    }

    /// The replica of `tp` on `log`, created (with the last state applied to `tp`, if
    /// any) when this broker holds none yet.
    pub(crate) fn add_partition(&self, tp: &TopicPartition, log: Arc<Log>) -> Arc<Partition> {
        let partition = {
            let mut partitions = self.partitions.write().expect("invariant: partitions lock is never poisoned");
            if let Some(existing) = partitions.get(tp) {
                return existing.clone();
            }
            let partition = Arc::new(Partition::new(tp.clone(), log));
            partitions.insert(tp.clone(), partition.clone());
            partition
        };
        let pending = self.pending.lock().expect("invariant: pending lock is never poisoned").remove(tp);
        if let Some(applied) = pending {
            self.apply_to(&partition, &applied.replicas, &applied.state, applied.state_version);
        }
        partition
    }

    /// The replica of `tp`, if this broker holds one.
    pub(crate) fn get(&self, tp: &TopicPartition) -> Option<Arc<Partition>> {
        self.partitions.read().expect("invariant: partitions lock is never poisoned").get(tp).cloned()
    }

    /// Applies a partition state read from the store (znode version `state_version`) to
    /// this broker's replica of `tp`: become leader, follower or neither. Cheap; states
    /// older than the one applied last are ignored.
    pub(crate) fn apply(&self, tp: &TopicPartition, replicas: &[i32], state: &PartitionState, state_version: i32) {
        match self.get(tp) {
            Some(partition) => self.apply_to(&partition, replicas, state, state_version),
            None => {
                let applied = Applied { replicas: replicas.to_vec(), state: state.clone(), state_version };
                self.pending.lock().expect("invariant: pending lock is never poisoned").insert(tp.clone(), applied);
            }
        }
    }

    /// Serves the replica of `tp` from `log` from now on (its log moved to another log
    /// dir): a new replica on `log` takes the old one's state (role, epoch, ISR), as if
    /// that state had just been applied to it. No-op when `tp` has no replica here.
    pub(crate) fn replace_log(&self, tp: &TopicPartition, log: Arc<Log>) {
        let Some(old) = self.get(tp) else { return };
        let (replicas, state, version) = {
            let s = old.state();
            let leader = match s.role {
                Role::Leader => self.broker_id,
                Role::Follower { leader } => leader,
                Role::None => -1,
            };
            let state =
                PartitionState { leader, leader_epoch: s.leader_epoch, isr: s.isr.clone(), controller_epoch: s.controller_epoch };
            (s.replicas.clone(), state, s.state_version)
        };
        self.remove(tp);
        let partition = self.add_partition(tp, log);
        if version >= 0 {
            self.apply_to(&partition, &replicas, &state, version);
        }
    }

    /// Forgets the replica of `tp` (unassigned or deleted): it stops leading and
    /// following. The log itself is the topic manager's to delete.
    pub(crate) fn remove(&self, tp: &TopicPartition) {
        self.pending.lock().expect("invariant: pending lock is never poisoned").remove(tp);
        let removed = self.partitions.write().expect("invariant: partitions lock is never poisoned").remove(tp);
        self.fetchers.unfollow(tp);
        if let Some(partition) = removed {
            partition.state().role = Role::None;
            partition.notify_changed();
        }
    }

    fn apply_to(&self, partition: &Arc<Partition>, replicas: &[i32], state: &PartitionState, state_version: i32) {
        let me = self.broker_id;
        let role = match state.leader {
            leader if leader == me => Role::Leader,
            leader if leader >= 0 && replicas.contains(&me) => Role::Follower { leader },
            _ => Role::None,
        };
        let new_term = {
            let mut s = partition.state();
            if state.leader_epoch < s.leader_epoch || (state.leader_epoch == s.leader_epoch && state_version < s.state_version) {
                tracing::debug!(tp = %partition.tp, epoch = state.leader_epoch, state_version, "ignoring an older partition state");
                return;
            }
            let same_term = s.role == role && s.leader_epoch == state.leader_epoch;
            if same_term && role == Role::Leader && s.replicas != replicas {
                // Reassigned within the term (same leader epoch): the followers follow the
                // new replica list, or an added replica would never be tracked nor join
                // the ISR. A removed one leaves the ISR below.
                leader::follow_assignment(&mut s.followers, me, replicas, Instant::now());
                tracing::info!(tp = %partition.tp, from = ?s.replicas, to = ?replicas, "replicas reassigned; following the new list");
            }
            s.replicas = replicas.to_vec();
            s.isr = state.isr.clone();
            s.controller_epoch = state.controller_epoch;
            s.state_version = state_version;
            if !same_term {
                s.role = role;
                s.leader_epoch = state.leader_epoch;
                s.followers.clear();
                s.isr_in_flight = None;
                s.truncation_pending = false;
                match role {
                    Role::Leader => {
                        let now = Instant::now();
                        s.epoch_start_offset = partition.log.log_end_offset();
                        s.followers = replicas.iter().filter(|&&r| r != me).map(|&r| (r, FollowerProgress::new(now))).collect();
                    }
                    Role::Follower { .. } => s.truncation_pending = true,
                    Role::None => {}
                }
                tracing::info!(
                    tp = %partition.tp,
                    ?role,
                    leader_epoch = state.leader_epoch,
                    isr = ?state.isr,
                    log_end_offset = partition.log.log_end_offset(),
                    high_watermark = partition.log.high_watermark(),
                    "partition role"
                );
            }
            !same_term
        };
        if new_term {
            match role {
                Role::Follower { leader } => self.fetchers.follow(partition.clone(), leader),
                Role::Leader | Role::None => self.fetchers.unfollow(&partition.tp),
            }
        }
        if role == Role::Leader {
            // Replicas no longer assigned leave the ISR at once, through the leader's own
            // ISR write (while another write is in flight, that write proposes again
            // once it is done).
            if let Some(isr) = partition.shrunk_isr(me, self.config.lag_time_max, Instant::now()) {
                self.propose_isr(partition, isr);
            }
        }
        // A new ISR (or leadership) may let the high watermark move; acks=all produces
        // re-check the role and the ISR either way.
        if !partition.maybe_advance_high_watermark() {
            partition.notify_changed();
        }
    }

    /// Leader: writes `isr` to the partition state znode (compare-and-set on the version
    /// last seen, same leader and epoch), then adopts it. On a version conflict the
    /// znode is re-read: if this broker still leads in the same epoch, its ISR and
    /// version are taken and the next check proposes again. One write per partition
    /// at a time; while it is in flight the high watermark also waits for the proposed
    /// members ([`ReplicaState::maximal_isr`](crate::partition::ReplicaState::maximal_isr)).
    /// When the ISR it adopts names replicas no longer assigned (an expansion written
    /// while a reassignment removed the replica), it writes again without them at once.
    pub(crate) fn propose_isr(&self, partition: &Arc<Partition>, isr: Vec<i32>) {
        let (leader_epoch, expected_version, controller_epoch) = {
            let mut s = partition.state();
            if s.role != Role::Leader || s.isr_in_flight.is_some() || s.isr == isr {
                return;
            }
            s.isr_in_flight = Some(isr.clone());
            (s.leader_epoch, s.state_version, s.controller_epoch)
        };
        let (store, partition, me, shutdown) = (self.store.clone(), partition.clone(), self.broker_id, self.shutdown.clone());
        self.tasks.spawn(async move {
            let (mut isr, mut expected_version, mut controller_epoch) = (isr, expected_version, controller_epoch);
            loop {
                let path = paths::partition_state(&partition.tp.topic, partition.tp.partition);
                let proposed = to_json(&PartitionState { leader: me, leader_epoch, isr: isr.clone(), controller_epoch });
                // A store that stopped answering must not hold up the broker's shutdown.
                let written = tokio::select! {
                    written = store.set(&path, &proposed, Some(expected_version)) => written,
                    () = shutdown.cancelled() => return,
                };
                // After a conflict, or a failure that may still have been written (a lost
                // connection), the store's own state says which ISR holds.
                let adopted = match written {
                    Ok(stat) => Some((isr, stat.version)),
                    Err(e) => {
                        if !matches!(e, fjord_coord::Error::BadVersion { .. }) {
                            tracing::warn!(tp = %partition.tp, error = %e, "writing the ISR failed; reading back what the store holds");
                        }
                        match read_json::<PartitionState>(&*store, &path).await {
                            Ok(Some((current, stat))) if current.leader == me && current.leader_epoch == leader_epoch => {
                                tracing::info!(tp = %partition.tp, isr = ?current.isr, "re-read the partition state");
                                Some((current.isr, stat.version))
                            }
                            Ok(_) => None, // a new leader or epoch: the next applied state says what we are
                            Err(e) => {
                                tracing::warn!(tp = %partition.tp, error = %e, "re-reading the partition state failed; retried at the next change");
                                None
                            }
                        }
                    }
                };
                let again = {
                    let mut s = partition.state();
                    s.isr_in_flight = None;
                    let mut adopted_now = false;
                    if let Some((isr, version)) = adopted {
                        if s.role == Role::Leader && s.leader_epoch == leader_epoch && version > s.state_version {
                            adopted_now = true;
                            tracing::info!(tp = %partition.tp, from = ?s.isr, to = ?isr, leader_epoch, "ISR changed");
                            s.isr = isr;
                            s.state_version = version;
                        }
                    }
                    // Nothing else would write again before the expiry task's next
                    // pass, replica.lag.time.max.ms / 2 away. Only after a write that
                    // took: a failing store is left to that pass, not retried hot.
                    let unassigned = leader::unassigned_isr_members(me, &s.isr, &s.replicas);
                    let again = adopted_now && !unassigned.is_empty();
                    again.then(|| {
                        let next: Vec<i32> = s.isr.iter().copied().filter(|r| !unassigned.contains(r)).collect();
                        s.isr_in_flight = Some(next.clone());
                        (next, s.state_version, s.controller_epoch)
                    })
                };
                // A smaller ISR may let the high watermark move; acks=all waits re-check the ISR.
                if !partition.maybe_advance_high_watermark() {
                    partition.notify_changed();
                }
                match again {
                    Some(next) => (isr, expected_version, controller_epoch) = next,
                    None => return,
                }
            }
        });
    }

    /// Leader: records a replica fetch from `replica` at `fetch_offset`; proposes the
    /// ISR with it when it just caught up, without it when it lost committed records.
    pub(crate) fn follower_fetched(&self, partition: &Arc<Partition>, replica: i32, fetch_offset: i64) {
        if let Some(isr) = partition.record_follower_fetch(replica, fetch_offset, Instant::now()) {
            self.propose_isr(partition, isr);
        }
    }

    /// Every `replica.lag.time.max.ms / 2` (as Kafka), drops the followers that have not
    /// caught up for `replica.lag.time.max.ms` from the ISR of every partition led here.
    fn spawn_isr_expiry(self: &Arc<Self>) {
        let manager = Arc::downgrade(self);
        let (every, shutdown) = (self.config.lag_time_max / 2, self.shutdown.clone());
        self.tasks.spawn(async move {
            let mut periodic = Periodic::new(every);
            while periodic.tick_until(&shutdown).await {
                let Some(manager) = manager.upgrade() else { return };
                let partitions: Vec<_> =
                    manager.partitions.read().expect("invariant: partitions lock is never poisoned").values().cloned().collect();
                let now = Instant::now();
                for partition in partitions {
                    if let Some(isr) = partition.shrunk_isr(manager.broker_id, manager.config.lag_time_max, now) {
                        tracing::info!(tp = %partition.tp, isr = ?isr, "followers fell behind; shrinking the ISR");
                        manager.propose_isr(&partition, isr);
                    }
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use fjord_log::LogConfig;
    use fjord_record::BatchBuilder;

    use super::*;
    use crate::codec::error_code;

    fn batch() -> Vec<u8> {
        let mut builder = BatchBuilder::new(1_000);
        builder.append(1_000, None, Some(b"v"), &[]);
        builder.build_vec()
    }

    fn state(leader: i32, leader_epoch: i32, isr: &[i32]) -> PartitionState {
        PartitionState { leader, leader_epoch, isr: isr.to_vec(), controller_epoch: 0 }
    }

    /// Broker 1's replica manager (its store embedded in `dir`) with partition t-0 added,
    /// its log in `dir` too; no leader or ISR applied yet.
    fn replica_of_t0(dir: &std::path::Path) -> (Arc<ReplicaManager>, TopicPartition, Arc<Log>, Arc<Partition>) {
        let store: Store = Arc::new(fjord_coord::EmbeddedStore::open(&dir.join("meta")).unwrap());
        let manager = ReplicaManager::new(1, store, ReplicationConfig::default(), PeerConfig::plaintext("PLAINTEXT"));
        let tp = TopicPartition::new("t", 0);
        let log = Arc::new(Log::open(dir.join("t-0"), LogConfig::default()).unwrap());
        let partition = manager.add_partition(&tp, log.clone());
        (manager, tp, log, partition)
    }

    /// While the ISR expansion that adds follower 2 is being written, the high watermark
    /// waits for 2: once the store holds it, 2 may be elected, so nothing 2 lacks may
    /// count as committed. (A chaos run, seed 8, saw a read record vanish when the leader
    /// advanced on its old ISR and the joining follower was elected.)
    #[tokio::test]
    async fn the_high_watermark_waits_for_a_follower_whose_isr_expansion_is_in_flight() {
        let dir = tempfile::tempdir().unwrap();
        let (manager, tp, log, partition) = replica_of_t0(dir.path());
        manager.apply(&tp, &[1, 2], &state(1, 0, &[1]), 0);
        partition.append_as_leader(&batch(), false, 1, None, fjord_log::TxnVerification::Off).unwrap().unwrap();
        assert_eq!(log.high_watermark(), 1, "the leader alone is the ISR");

        let proposed = partition.record_follower_fetch(2, 1, Instant::now()).expect("2 caught up");
        assert_eq!(proposed, vec![1, 2]);
        partition.state().isr_in_flight = Some(proposed); // what propose_isr sets before writing
        partition.append_as_leader(&batch(), false, 1, None, fjord_log::TxnVerification::Off).unwrap().unwrap();
        assert_eq!(log.high_watermark(), 1, "2 has not fetched offset 1 yet");
        partition.record_follower_fetch(2, 2, Instant::now());
        assert_eq!(log.high_watermark(), 2);

        // A shrink in flight counts only once written: the leaving member still holds it back.
        manager.apply(&tp, &[1, 2], &state(1, 0, &[1, 2]), 1);
        partition.state().isr_in_flight = Some(vec![1]);
        partition.append_as_leader(&batch(), false, 1, None, fjord_log::TxnVerification::Off).unwrap().unwrap();
        assert_eq!(log.high_watermark(), 2);
        manager.shutdown().await;
    }

    /// A follower in the ISR that fetches below the high watermark (it cut its log short,
    /// as a healed follower does) is proposed out of the ISR at once, not after
    /// `replica.lag.time.max.ms`; it is proposed in again once it reaches the high watermark.
    #[tokio::test]
    async fn an_in_sync_follower_fetching_below_the_high_watermark_leaves_the_isr_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let (manager, tp, log, partition) = replica_of_t0(dir.path());
        manager.apply(&tp, &[1, 2, 3], &state(1, 0, &[1, 2, 3]), 0);
        for _ in 0..3 {
            partition.append_as_leader(&batch(), false, 1, None, fjord_log::TxnVerification::Off).unwrap().unwrap();
        }
        let now = Instant::now();
        assert_eq!(partition.record_follower_fetch(2, 3, now), None);
        assert_eq!(partition.record_follower_fetch(3, 3, now), None);
        assert_eq!(log.high_watermark(), 3);
        assert_eq!(partition.record_follower_fetch(2, 1, now), Some(vec![1, 3]), "2 lost committed records");
        assert_eq!(log.high_watermark(), 3, "the high watermark never goes back");
        manager.apply(&tp, &[1, 2, 3], &state(1, 0, &[1, 3]), 1);
        assert_eq!(partition.record_follower_fetch(2, 2, now), None, "still behind");
        assert_eq!(partition.record_follower_fetch(2, 3, now), Some(vec![1, 3, 2]), "caught up again");
        manager.shutdown().await;
    }

    /// A replica added to the assignment within the leader's term (no new leader epoch,
    /// as a reassignment adds it) is tracked and joins the ISR once caught up; a replica
    /// removed is dropped and proposed out of the ISR at once.
    #[tokio::test]
    async fn a_replica_added_within_the_term_joins_the_isr_and_a_removed_one_leaves_it() {
        let dir = tempfile::tempdir().unwrap();
        let (manager, tp, log, partition) = replica_of_t0(dir.path());
        manager.apply(&tp, &[1, 2], &state(1, 0, &[1, 2]), 0);
        partition.append_as_leader(&batch(), false, 1, None, fjord_log::TxnVerification::Off).unwrap().unwrap();
        assert_eq!(partition.record_follower_fetch(2, 1, Instant::now()), None);
        assert_eq!(log.high_watermark(), 1);

        // The controller adds 3: same state, new replica list.
        manager.apply(&tp, &[1, 2, 3], &state(1, 0, &[1, 2]), 0);
        assert_eq!(partition.record_follower_fetch(3, 0, Instant::now()), None, "3 is behind");
        assert_eq!(partition.record_follower_fetch(3, 1, Instant::now()), Some(vec![1, 2, 3]), "3 caught up: it joins");
        manager.apply(&tp, &[1, 2, 3], &state(1, 0, &[1, 2, 3]), 1);

        // The controller drops 2: it is forgotten and proposed out of the ISR.
        manager.apply(&tp, &[1, 3], &state(1, 0, &[1, 2, 3]), 1);
        assert_eq!(partition.state().isr_in_flight, Some(vec![1, 3]), "the shrink is being written");
        assert!(!partition.state().followers.contains_key(&2));
        assert_eq!(partition.record_follower_fetch(2, 1, Instant::now()), None, "2's fetches no longer count");
        manager.shutdown().await;
    }

    /// An ISR expansion written while a reassignment removed the joining replica (the
    /// issue #22 race: the controller's state write, then the leader re-adds the caught-up
    /// old replica, then the assignment drops it) does not keep it in the ISR until the
    /// expiry task's next pass (15 s by default): the write, once done, removes it.
    #[tokio::test]
    async fn an_expansion_that_lands_after_the_replica_was_unassigned_is_undone_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let store: Store = Arc::new(fjord_coord::EmbeddedStore::open(&dir.path().join("meta")).unwrap());
        let path = paths::partition_state("t", 0);
        fjord_coord::create_all(&*store, &path, &to_json(&state(1, 0, &[1, 2])), fjord_coord::CreateMode::Persistent)
            .await
            .unwrap();
        let manager = ReplicaManager::new(1, store.clone(), ReplicationConfig::default(), PeerConfig::plaintext("PLAINTEXT"));
        let tp = TopicPartition::new("t", 0);
        let log = Arc::new(Log::open(dir.path().join("t-0"), LogConfig::default()).unwrap());
        let partition = manager.add_partition(&tp, log.clone());
        manager.apply(&tp, &[1, 2, 3], &state(1, 0, &[1, 2]), 0);
        partition.append_as_leader(&batch(), false, 1, None, fjord_log::TxnVerification::Off).unwrap().unwrap();
        partition.record_follower_fetch(2, 1, Instant::now());
        manager.follower_fetched(&partition, 3, 0);
        manager.follower_fetched(&partition, 3, 1); // 3 caught up: [1, 2, 3] is being written
        assert_eq!(partition.state().isr_in_flight, Some(vec![1, 2, 3]));
        manager.apply(&tp, &[1, 2], &state(1, 0, &[1, 2]), 0); // 3 unassigned meanwhile

        let isr = async {
            loop {
                let (current, _) = read_json::<PartitionState>(&*store, &path).await.unwrap().unwrap();
                if current.isr == [1, 2] && partition.state().isr == [1, 2] && partition.state().isr_in_flight.is_none() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), isr).await.expect("3 leaves the ISR without waiting for the expiry");
        manager.shutdown().await;
    }

    /// acks=all on leader 1 of replicas [1, 2]: refused below min ISR, answered when the
    /// follower's fetch moves the high watermark, timed out without it, refused after
    /// the append when the ISR shrank meanwhile, and NOT_LEADER once leadership moved.
    #[tokio::test]
    async fn acks_all_waits_for_the_isr_without_polling() {
        let dir = tempfile::tempdir().unwrap();
        let (manager, tp, log, partition) = replica_of_t0(dir.path());
        assert_eq!(
            partition.append_as_leader(&batch(), false, 1, None, fjord_log::TxnVerification::Off).unwrap_err(),
            error_code::NOT_LEADER_OR_FOLLOWER
        );
        manager.apply(&tp, &[1, 2], &state(1, 0, &[1, 2]), 0);

        assert_eq!(
            partition.append_as_leader(&batch(), true, 3, None, fjord_log::TxnVerification::Off).unwrap_err(),
            error_code::NOT_ENOUGH_REPLICAS
        );
        assert_eq!(log.log_end_offset(), 0, "nothing appended");
        let (info, epoch) =
            partition.append_as_leader(&batch(), true, 2, None, fjord_log::TxnVerification::Off).unwrap().unwrap();
        assert_eq!(epoch, 0);
        assert_eq!((info.last_offset, log.high_watermark()), (0, 0), "the follower has not fetched it yet");
        let waiting = {
            let partition = partition.clone();
            tokio::spawn(async move { partition.wait_for_replication(0, 0, 2, Duration::from_secs(30)).await })
        };
        tokio::task::yield_now().await;
        manager.follower_fetched(&partition, 2, 1);
        assert_eq!(log.high_watermark(), 1);
        assert_eq!(waiting.await.unwrap(), Ok(()));

        partition.append_as_leader(&batch(), true, 2, None, fjord_log::TxnVerification::Off).unwrap().unwrap();
        let timed_out = partition.wait_for_replication(0, 1, 2, Duration::from_millis(20)).await;
        assert_eq!(timed_out, Err(error_code::REQUEST_TIMED_OUT));

        let waiting = {
            let partition = partition.clone();
            tokio::spawn(async move { partition.wait_for_replication(0, 1, 2, Duration::from_secs(30)).await })
        };
        tokio::task::yield_now().await;
        // The controller takes 2 out of the ISR: the high watermark moves to the log end,
        // but the batch is on one replica only.
        manager.apply(&tp, &[1, 2], &state(1, 0, &[1]), 1);
        assert_eq!(waiting.await.unwrap(), Err(error_code::NOT_ENOUGH_REPLICAS_AFTER_APPEND));
        assert_eq!(log.high_watermark(), 2);

        // An older state is ignored; a new epoch led by 2 makes this broker a follower.
        manager.apply(&tp, &[1, 2], &state(1, 0, &[1, 2]), 0);
        assert_eq!(partition.state().isr, vec![1]);
        partition.append_as_leader(&batch(), true, 1, None, fjord_log::TxnVerification::Off).unwrap().unwrap();
        let waiting = {
            let partition = partition.clone();
            tokio::spawn(async move { partition.wait_for_replication(0, 10, 1, Duration::from_secs(30)).await })
        };
        tokio::task::yield_now().await;
        manager.apply(&tp, &[1, 2], &state(2, 1, &[2]), 2);
        assert_eq!(waiting.await.unwrap(), Err(error_code::NOT_LEADER_OR_FOLLOWER));
        // Leading again in a later epoch does not answer a wait from an earlier one.
        manager.apply(&tp, &[1, 2], &state(1, 2, &[1]), 3);
        assert_eq!(log.high_watermark(), 3);
        assert_eq!(
            partition.wait_for_replication(0, 2, 1, Duration::from_secs(30)).await,
            Err(error_code::NOT_LEADER_OR_FOLLOWER)
        );
        assert_eq!(partition.wait_for_replication(2, 2, 1, Duration::from_secs(30)).await, Ok(()));
        manager.apply(&tp, &[1, 2], &state(2, 3, &[2]), 4);
        assert_eq!(
            partition.append_as_leader(&batch(), false, 1, None, fjord_log::TxnVerification::Off).unwrap_err(),
            error_code::NOT_LEADER_OR_FOLLOWER
        );
        manager.shutdown().await;
    }

    /// Markers (WriteTxnMarkers) go through the leader only, and the last stable offset
    /// passes a decided transaction only once its marker is on the ISR: until then a
    /// leader change could still lose the marker.
    #[tokio::test]
    async fn markers_are_the_leaders_and_the_lso_waits_for_them_to_replicate() {
        let dir = tempfile::tempdir().unwrap();
        let (manager, tp, log, partition) = replica_of_t0(dir.path());
        assert_eq!(partition.append_marker_as_leader(9, 0, 0, true, 1).unwrap_err(), error_code::NOT_LEADER_OR_FOLLOWER);
        manager.apply(&tp, &[1, 2], &state(1, 0, &[1, 2]), 0);
        let mut txn = fjord_record::BatchBuilder::new(1_000).producer(9, 0, 0).transactional();
        txn.append(1_000, None, Some(b"v"), &[]);
        partition.append_as_leader(&txn.build_vec(), false, 1, None, fjord_log::TxnVerification::Off).unwrap().unwrap();
        manager.follower_fetched(&partition, 2, 1);
        assert_eq!((log.high_watermark(), log.last_stable_offset()), (1, 0));
        assert_eq!(partition.latest_offset(true), Ok(0));
        assert_eq!(partition.append_marker_as_leader(9, 0, 0, true, 3).unwrap_err(), error_code::NOT_ENOUGH_REPLICAS);
        let (info, epoch) = partition.append_marker_as_leader(9, 0, 0, true, 2).unwrap().unwrap();
        assert_eq!((info.base_offset, epoch), (1, 0));
        assert_eq!(log.last_stable_offset(), 0, "the commit is not on the follower yet");
        manager.follower_fetched(&partition, 2, 2);
        assert_eq!((log.high_watermark(), log.last_stable_offset()), (2, 2));
        assert_eq!(partition.latest_offset(true), Ok(2));
        // A follower now: markers go to the new leader.
        manager.apply(&tp, &[1, 2], &state(2, 1, &[2]), 1);
        assert_eq!(partition.append_marker_as_leader(9, 0, 0, false, 1).unwrap_err(), error_code::NOT_LEADER_OR_FOLLOWER);
        assert_eq!(log.log_end_offset(), 2);
        manager.shutdown().await;
    }

    /// A leader whose high watermark is below the log end at the start of its epoch
    /// (it has not heard from its followers yet) answers OFFSET_NOT_AVAILABLE for the
    /// latest offset until a follower's fetch moves the high watermark up.
    #[tokio::test]
    async fn the_latest_offset_is_not_available_while_a_new_leaders_high_watermark_lags() {
        let dir = tempfile::tempdir().unwrap();
        let (manager, tp, log, partition) = replica_of_t0(dir.path());
        manager.apply(&tp, &[1, 2], &state(1, 0, &[1, 2]), 0);
        partition.append_as_leader(&batch(), false, 1, None, fjord_log::TxnVerification::Off).unwrap().unwrap();
        partition.append_as_leader(&batch(), false, 1, None, fjord_log::TxnVerification::Off).unwrap().unwrap();
        assert_eq!(partition.latest_offset(false), Ok(0), "this epoch began at 0: the high watermark is current");

        // A new epoch begins at the log end, 2, above the high watermark.
        manager.apply(&tp, &[1, 2], &state(1, 1, &[1, 2]), 1);
        assert_eq!(log.high_watermark(), 0);
        assert_eq!(partition.latest_offset(false), Err(error_code::OFFSET_NOT_AVAILABLE));
        manager.follower_fetched(&partition, 2, 1);
        assert_eq!(partition.latest_offset(false), Err(error_code::OFFSET_NOT_AVAILABLE), "high watermark 1, epoch start 2");
        manager.follower_fetched(&partition, 2, 2);
        assert_eq!(partition.latest_offset(false), Ok(2));
        manager.shutdown().await;
    }
}
