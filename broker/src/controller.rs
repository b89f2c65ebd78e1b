//! The controller: one broker at a time moves partition leadership when brokers come
//! and go (docs/architecture.md).
//!
//! # Election and fencing
//! Every broker tries to create the ephemeral `/controller` ({brokerid}); the winner
//! increments `/controller_epoch` by compare-and-set and acts; the others watch
//! `/controller` and try again when it goes. Every partition state the controller writes
//! carries its epoch and is a compare-and-set on the znode version it read. A controller
//! stops acting (and competes again) when `/controller_epoch` has moved past its own,
//! when a state carries a newer controller epoch, when `/controller` is no longer its
//! node, or when its session is lost.
//!
//! # What it does
//! On taking over and on every change to `/brokers/ids` or `/brokers/topics`, it brings
//! every partition state in line with the live brokers ([`decide`]):
//! - leader dead: the first live replica (in assignment order) that is in the ISR leads,
//!   the ISR loses its dead members, the leader epoch grows by one; with no live ISR
//!   member, the first live replica only with `unclean.leader.election.enable`, else
//!   leader -1 (offline) with the ISR left as it was (the last members stay recorded);
//! - leader live: dead followers leave the ISR (same leader, same leader epoch);
//! - leader -1: a live ISR member (or, unclean, any live replica) leads again.
//!
//! Every `leader.imbalance.check.interval.seconds` (with `auto.leader.rebalance.enable`)
//! it also moves leadership back to preferred replicas ([`rebalance`]): a broker whose
//! preferred partitions (those it is the first replica of) are led elsewhere for more
//! than `leader.imbalance.per.broker.percentage` of them gets them back, each one only
//! while the broker is live and in the partition's ISR (same ISR, leader epoch + 1). The
//! brokers follow such a state as they follow a failover election: it is the same
//! partition-state write.
//!
//! It also carries partition reassignments forward ([`reassignment`]): every pass
//! completes those whose target replicas are all in the ISR, and while one waits the
//! pass repeats every `REASSIGNMENT_POLL`.
//!
//! A broker whose registration was replaced by a new session (it restarted between two
//! watch events) is handled as a failure followed by a return, so its leaderships get a
//! new epoch.
//!
//! Every pass is level-triggered (it reads the whole state), so a missed event or a new
//! controller after a failover converges all the same.

pub(crate) mod reassignment;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fjord_coord::registry::{read_json, to_json, PartitionState, TopicAssignment};
use fjord_coord::{create_all, paths, CreateMode, MetadataStore, Store, Watch, WatchEvent};
use fjord_record::now_ms;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::cluster::read_overrides;
use crate::replica_health::UnhealthyReplicas;

/// Pause before competing again after a store error.
const RETRY_BACKOFF: Duration = Duration::from_millis(500);

/// How often a pass runs while a reassignment waits for its target replicas to be in sync.
const REASSIGNMENT_POLL: Duration = Duration::from_millis(250);

/// `/controller` (Kafka's layout).
#[derive(Debug, Serialize, Deserialize)]
struct ControllerDocument {
    version: i32,
    brokerid: i32,
    timestamp: String,
}

/// Why a controller stopped acting (or an election asked for through ElectLeaders failed).
#[derive(Debug)]
pub(crate) enum Stop {
    /// Shutdown was requested.
    Shutdown,
    /// Another controller (a newer epoch) took over, or our node is gone.
    Fenced(String),
    /// The store failed; compete again after a backoff.
    Store(fjord_coord::Error),
}

impl From<fjord_coord::Error> for Stop {
    fn from(e: fjord_coord::Error) -> Self {
        Stop::Store(e)
    }
}

/// What the controller is configured to do (from the broker's config).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ControllerConfig {
    /// `unclean.leader.election.enable`, the default of the topic key.
    pub(crate) unclean_default: bool,
    /// Preferred-leader rebalancing, `None` without `auto.leader.rebalance.enable`.
    pub(crate) rebalance: Option<RebalanceConfig>,
}

/// `leader.imbalance.check.interval.seconds` and `leader.imbalance.per.broker.percentage`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RebalanceConfig {
    pub(crate) interval: Duration,
    pub(crate) percentage: u32,
}

/// The epoch this broker acts under while it is the controller, published for the
/// ElectLeaders handler.
///
/// The handler writes its elections itself with this epoch rather than asking the
/// controller task over a channel: every partition-state write, the controller's passes
/// and these, is a compare-and-set on the znode version carrying the controller epoch,
/// so the store already orders them (a conflict re-reads and decides again) and fences a
/// stale controller ([`elect_leaders`] checks `/controller_epoch` first, as every pass
/// does). A channel would only add a second way to reach the same writes and make the
/// request wait behind a whole reconciling pass.
#[derive(Debug, Default)]
pub(crate) struct Controllership {
    /// 0 while not the controller (controller epochs start at 1).
    epoch: AtomicI32,
    /// Woken when AlterPartitionReassignments wrote a reassignment: the controller's
    /// next pass starts at once (the topic node's data is not watched).
    reassignment_asked: tokio::sync::Notify,
}

impl Controllership {
    /// The controller epoch, if this broker is the controller.
    pub(crate) fn epoch(&self) -> Option<i32> {
        Some(self.epoch.load(Ordering::Acquire)).filter(|&e| e > 0)
    }

    fn set(&self, epoch: Option<i32>) {
        self.epoch.store(epoch.unwrap_or(0), Ordering::Release);
    }

    /// A reassignment was written: the controller should act on it now.
    pub(crate) fn reassignment_asked(&self) {
        self.reassignment_asked.notify_one();
    }
}

/// Competes for the controller role until `shutdown`, acting while it holds it (and
/// publishing its epoch in `controllership` meanwhile).
pub(crate) async fn run(
    store: Store,
    broker_id: i32,
    config: ControllerConfig,
    controllership: Arc<Controllership>,
    shutdown: CancellationToken,
) {
    loop {
        if shutdown.is_cancelled() {
            return;
        }
        match elect(&*store, broker_id, &shutdown).await {
            Ok(Some(epoch)) => {
                tracing::info!(broker_id, controller_epoch = epoch, "became the controller");
                controllership.set(Some(epoch));
                let stop = act(&*store, broker_id, epoch, config, &controllership, &shutdown).await;
                controllership.set(None);
                resign(&*store, broker_id).await;
                match stop {
                    Stop::Shutdown => {
                        tracing::info!(broker_id, controller_epoch = epoch, "controller resigned: broker stopping");
                        return;
                    }
                    Stop::Fenced(why) => tracing::warn!(broker_id, controller_epoch = epoch, why, "no longer the controller"),
                    Stop::Store(e) => {
                        tracing::warn!(broker_id, controller_epoch = epoch, error = %e, "controller lost the store; competing again");
                        if !pause(&shutdown).await {
                            return;
                        }
                    }
                }
            }
            Ok(None) => return, // shutdown while waiting
            Err(e) => {
                tracing::warn!(broker_id, error = %e, "controller election failed; retrying");
                if !pause(&shutdown).await {
                    return;
                }
            }
        }
    }
}

/// Waits until this broker holds `/controller`, then bumps the epoch; `None` at shutdown.
async fn elect(store: &dyn MetadataStore, broker_id: i32, shutdown: &CancellationToken) -> fjord_coord::Result<Option<i32>> {
    loop {
        let document = ControllerDocument { version: 1, brokerid: broker_id, timestamp: now_ms().to_string() };
        match store.create(paths::CONTROLLER, &to_json(&document), CreateMode::Ephemeral).await {
            Ok(_) => return bump_epoch(store).await.map(Some),
            Err(fjord_coord::Error::NodeExists { .. }) => {}
            Err(e) => return Err(e),
        }
        let (current, watch) = store.watch_data(paths::CONTROLLER).await?;
        if current.is_some() {
            tokio::select! {
                _ = watch => {}
                () = shutdown.cancelled() => return Ok(None),
            }
        }
    }
}

/// `/controller_epoch` + 1 by compare-and-set (created at 1).
async fn bump_epoch(store: &dyn MetadataStore) -> fjord_coord::Result<i32> {
    loop {
        match read_json::<i32>(store, paths::CONTROLLER_EPOCH).await? {
            None => match create_all(store, paths::CONTROLLER_EPOCH, b"1", CreateMode::Persistent).await {
                Ok(_) => return Ok(1),
                Err(fjord_coord::Error::NodeExists { .. }) => continue,
                Err(e) => return Err(e),
            },
            Some((epoch, stat)) => {
                match store.set(paths::CONTROLLER_EPOCH, (epoch + 1).to_string().as_bytes(), Some(stat.version)).await {
                    Ok(_) => return Ok(epoch + 1),
                    Err(fjord_coord::Error::BadVersion { .. }) => continue,
                    Err(e) => return Err(e),
                }
            }
        }
    }
}

/// Deletes `/controller` if it is still this broker's (same session), so another
/// broker takes over at once instead of after the session timeout.
async fn resign(store: &dyn MetadataStore, broker_id: i32) {
    if let Ok(Some((data, stat))) = store.get(paths::CONTROLLER).await {
        let ours = stat.ephemeral_owner == store.session_id()
            && serde_json::from_slice::<ControllerDocument>(&data).is_ok_and(|d| d.brokerid == broker_id);
        if ours {
            if let Err(e) = store.delete(paths::CONTROLLER, Some(stat.version)).await {
                tracing::debug!(error = %e, "could not delete /controller on resigning");
            }
        }
    }
}

/// The controller's work loop: a reconciling pass at start and after every change of
/// the live brokers or the topics, until fenced, failed or shut down; with rebalancing,
/// every check interval a pass that also moves leaders back to preferred replicas.
async fn act(
    store: &dyn MetadataStore,
    broker_id: i32,
    epoch: i32,
    config: ControllerConfig,
    controllership: &Controllership,
    shutdown: &CancellationToken,
) -> Stop {
    let unclean_default = config.unclean_default;
    // Whether a reassignment waits for its target replicas to join the ISR: the pass is
    // then repeated every REASSIGNMENT_POLL (partition states are not watched).
    let mut reassigning = false;
    // Session owner of each registration seen in the previous pass.
    let mut sessions: BTreeMap<i32, i64> = BTreeMap::new();
    // As in Kafka, the first check comes one interval after taking over, not at once:
    // a controller that just took over has brokers still rejoining ISRs.
    let mut next_check = config.rebalance.map(|r| tokio::time::Instant::now() + r.interval);
    let mut check_due = false;
    // One outstanding watch per node: a pass re-arms only those that fired.
    let (mut brokers_changed, mut topics_changed, mut controller_changed): (Option<Watch>, Option<Watch>, Option<Watch>) =
        (None, None, None);
    // Brokers' unhealthy replicas (crate::replica_health): a change moves leadership off them.
    let mut offline_changed: Option<Watch> = None;
    loop {
        let pass = async {
            if offline_changed.is_none() {
                match create_all(store, paths::OFFLINE_REPLICAS, &[], CreateMode::Persistent).await {
                    Ok(_) | Err(fjord_coord::Error::NodeExists { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
                offline_changed = Some(store.watch_children(paths::OFFLINE_REPLICAS).await?.1);
            }
            let unhealthy = crate::replica_health::read_all(store).await?;
            let ids = match brokers_changed {
                Some(_) => store.children(paths::BROKER_IDS).await?,
                None => {
                    let (ids, watch) = store.watch_children(paths::BROKER_IDS).await?;
                    brokers_changed = Some(watch);
                    ids
                }
            };
            if topics_changed.is_none() {
                topics_changed = Some(store.watch_children(paths::TOPICS).await?.1);
            }
            let node = match controller_changed {
                Some(_) => store.get(paths::CONTROLLER).await?,
                None => {
                    let (node, watch) = store.watch_data(paths::CONTROLLER).await?;
                    controller_changed = Some(watch);
                    node
                }
            };
            let ours = node.as_ref().is_some_and(|(data, stat)| {
                stat.ephemeral_owner == store.session_id()
                    && serde_json::from_slice::<ControllerDocument>(data).is_ok_and(|d| d.brokerid == broker_id)
            });
            if !ours {
                return Err(Stop::Fenced("/controller is not this broker's node".into()));
            }
            check_epoch(store, epoch).await?;
            let mut live = BTreeMap::new();
            for id in ids {
                let Ok(id) = id.parse::<i32>() else { continue };
                if let Some(stat) = store.exists(&paths::broker(id)).await? {
                    live.insert(id, stat.ephemeral_owner);
                }
            }
            // Restarted since the last pass: fail it first, so its leaderships move on
            // to a new epoch even if it leads again right after.
            let bounced: BTreeSet<i32> =
                live.iter().filter(|(id, owner)| sessions.get(id).is_some_and(|old| old != *owner)).map(|(id, _)| *id).collect();
            let alive: BTreeSet<i32> = live.keys().copied().collect();
            if !bounced.is_empty() {
                tracing::info!(brokers = ?bounced, "brokers restarted since the last pass");
                let without: BTreeSet<i32> = alive.difference(&bounced).copied().collect();
                reconcile(store, epoch, &without, &unhealthy, unclean_default).await?;
            }
            reconcile(store, epoch, &alive, &unhealthy, unclean_default).await?;
            reassigning = reassignment::advance(store, epoch, &alive).await?;
            sessions = live;
            if let (true, Some(r)) = (check_due, config.rebalance) {
                restore_preferred(store, epoch, &alive, &unhealthy, r.percentage).await?;
                check_due = false;
                next_check = Some(tokio::time::Instant::now() + r.interval);
            }
            Ok::<_, Stop>(())
        };
        if let Err(stop) = pass.await {
            return stop;
        }
        let (Some(brokers), Some(topics), Some(controller), Some(offline)) =
            (brokers_changed.as_mut(), topics_changed.as_mut(), controller_changed.as_mut(), offline_changed.as_mut())
        else {
            unreachable!("invariant: every watch is armed after a successful pass")
        };
        // A check that is due is a timer, not a watch: every watch stays armed across it.
        let check_at = next_check.unwrap_or_else(tokio::time::Instant::now);
        let event = tokio::select! {
            () = tokio::time::sleep_until(check_at), if next_check.is_some() => { check_due = true; continue }
            () = tokio::time::sleep(REASSIGNMENT_POLL), if reassigning => continue,
            () = controllership.reassignment_asked.notified() => continue,
            event = brokers => { brokers_changed = None; event }
            event = topics => { topics_changed = None; event }
            event = offline => { offline_changed = None; event }
            // Deleted (session lost) or replaced: the next pass finds out which.
            event = controller => { controller_changed = None; event }
            () = shutdown.cancelled() => return Stop::Shutdown,
        };
        if event == WatchEvent::SessionLost {
            return Stop::Fenced("session lost".into());
        }
    }
}

/// Fails when `/controller_epoch` has moved past `epoch`.
async fn check_epoch(store: &dyn MetadataStore, epoch: i32) -> Result<(), Stop> {
    match read_json::<i32>(store, paths::CONTROLLER_EPOCH).await? {
        Some((current, _)) if current != epoch => Err(Stop::Fenced(format!("controller epoch is now {current}"))),
        _ => Ok(()),
    }
}

/// Every topic with its replica assignment; none before the first topic, and a topic
/// deleted while this reads is left out.
async fn topic_assignments(store: &dyn MetadataStore) -> Result<Vec<(String, TopicAssignment)>, Stop> {
    let topics = match store.children(paths::TOPICS).await {
        Ok(topics) => topics,
        Err(fjord_coord::Error::NoNode { .. }) => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let mut all = Vec::with_capacity(topics.len());
    for topic in topics {
        if let Some((assignment, _)) = read_json::<TopicAssignment>(store, &paths::topic(&topic)).await? {
            all.push((topic, assignment));
        }
    }
    Ok(all)
}

/// An assignment's partitions by index, with their replicas (keys that are not partition
/// numbers are skipped).
fn numbered_partitions(assignment: &TopicAssignment) -> impl Iterator<Item = (i32, &Vec<i32>)> {
    assignment.partitions.iter().filter_map(|(p, replicas)| Some((p.parse().ok()?, replicas)))
}

/// Partition → its replicas that are offline or damaged (`crate::replica_health`).
type Unhealthy = crate::replica_health::Published;

/// One pass over every partition: writes the states [`decide_avoiding`] changes.
async fn reconcile(
    store: &dyn MetadataStore,
    epoch: i32,
    live: &BTreeSet<i32>,
    unhealthy: &Unhealthy,
    unclean_default: bool,
) -> Result<(), Stop> {
    let none = UnhealthyReplicas::default();
    for (topic, assignment) in topic_assignments(store).await? {
        // The topic's own `unclean.leader.election.enable`, read once per topic (write_state
        // decides without awaiting, so it cannot be read only when an election needs it).
        let overrides = read_overrides(store, &topic).await?;
        let unclean = overrides.get("unclean.leader.election.enable").map_or(unclean_default, |v| v.trim() == "true");
        for (partition, replicas) in numbered_partitions(&assignment) {
            let what = "controller changed partition state";
            let bad = unhealthy.get(&(topic.clone(), partition)).unwrap_or(&none);
            write_state(store, epoch, &topic, partition, what, |state| {
                decide_avoiding(state, replicas, live, bad, unclean).ok_or(())
            })
            .await?;
        }
    }
    Ok(())
}

/// The rebalancing pass: reads every partition, asks [`rebalance`] which ones go back to
/// their preferred replica, and writes each (compare-and-set; on a conflict the state is
/// read again and [`prefer`] decides again).
async fn restore_preferred(
    store: &dyn MetadataStore,
    epoch: i32,
    live: &BTreeSet<i32>,
    unhealthy: &Unhealthy,
    percentage: u32,
) -> Result<(), Stop> {
    let mut states = Vec::new();
    for (topic, assignment) in topic_assignments(store).await? {
        for (partition, replicas) in numbered_partitions(&assignment) {
            let Some((state, _)) = read_json::<PartitionState>(store, &paths::partition_state(&topic, partition)).await? else {
                continue;
            };
            states.push(((topic.clone(), partition), replicas.clone(), state));
        }
    }
    for ((topic, partition), replicas, _) in rebalance(&states, live, percentage) {
        // Never back to a preferred replica whose copy is unhealthy.
        if unhealthy
            .get(&(topic.clone(), *partition))
            .is_some_and(|bad| replicas.first().is_some_and(|p| bad.unhealthy.contains(p)))
        {
            continue;
        }
        let what = "controller moved leadership back to the preferred replica";
        write_state(store, epoch, topic, *partition, what, |state| prefer(state, replicas, live).ok_or(())).await?;
    }
    Ok(())
}

/// Writes the state `next` derives from a partition's current one: compare-and-set on
/// the znode version read, carrying the controller epoch `epoch`. On a conflict (the
/// leader changed its ISR meanwhile, or another write won) the state is read again and
/// `next` decides again. `Ok(None)` when the state node is missing (the partition is
/// being created or deleted); `Ok(Some(Err(_)))` when `next` declined; `what` is the
/// log line of a write.
async fn write_state<E>(
    store: &dyn MetadataStore,
    epoch: i32,
    topic: &str,
    partition: i32,
    what: &str,
    mut next: impl FnMut(&PartitionState) -> Result<PartitionState, E>,
) -> Result<Option<Result<PartitionState, E>>, Stop> {
    let path = paths::partition_state(topic, partition);
    loop {
        let Some((state, stat)) = read_json::<PartitionState>(store, &path).await? else { return Ok(None) };
        if state.controller_epoch > epoch {
            return Err(Stop::Fenced(format!("{path} was written by controller epoch {}", state.controller_epoch)));
        }
        let mut next = match next(&state) {
            Ok(next) => next,
            Err(declined) => return Ok(Some(Err(declined))),
        };
        next.controller_epoch = epoch;
        match store.set(&path, &to_json(&next), Some(stat.version)).await {
            Ok(_) => {
                tracing::info!(
                    partition = %format!("{topic}-{partition}"),
                    leader = next.leader,
                    leader_epoch = next.leader_epoch,
                    isr = ?next.isr,
                    previous_leader = state.leader,
                    previous_isr = ?state.isr,
                    "{what}"
                );
                return Ok(Some(Ok(next)));
            }
            Err(fjord_coord::Error::BadVersion { .. }) => continue,
            Err(fjord_coord::Error::NoNode { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Kafka's ElectLeaders election types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Election {
    /// Leadership to the preferred replica (the first of the assignment).
    Preferred,
    /// A leader for a partition without a live one, from outside the ISR if need be.
    Unclean,
}

/// Why an asked-for election gives a partition no new leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoElection {
    /// The preferred replica leads already (preferred), or a live broker leads (unclean).
    NotNeeded,
    /// The preferred replica is dead or out of the ISR, or the partition has no live
    /// leader (electing one is [`decide`]'s: the controller does it on its own).
    PreferredNotAvailable,
    /// No replica is live.
    NoEligibleLeader,
    /// No such topic or partition (or its state is not written yet).
    UnknownPartition,
}

/// The state an asked-for election gives the partition: [`prefer`]'s rule for a
/// preferred election, [`decide`]'s with unclean election allowed for an unclean one.
/// The controller epoch of the result is the caller's to set.
pub(crate) fn elect_leader(
    election: Election,
    state: &PartitionState,
    replicas: &[i32],
    live: &BTreeSet<i32>,
) -> Result<PartitionState, NoElection> {
    match election {
        Election::Preferred => {
            if replicas.first() == Some(&state.leader) && live.contains(&state.leader) {
                return Err(NoElection::NotNeeded);
            }
            prefer(state, replicas, live).ok_or(NoElection::PreferredNotAvailable)
        }
        Election::Unclean => {
            if !needs_election(state, live) {
                return Err(NoElection::NotNeeded);
            }
            decide(state, replicas, live, true).filter(|next| next.leader != -1).ok_or(NoElection::NoEligibleLeader)
        }
    }
}

/// One partition's outcome of [`elect_leaders`]: its new state, or why there is none.
pub(crate) type Elected = ((String, i32), Result<PartitionState, NoElection>);

/// Runs the `election` ElectLeaders asked for on `partitions` (`None`: every partition)
/// as the controller of epoch `epoch`, writing each new state as the controller's passes
/// do ([`write_state`]). Fails (nothing more written) when the epoch is no longer the
/// store's or the store fails.
pub(crate) async fn elect_leaders(
    store: &dyn MetadataStore,
    epoch: i32,
    election: Election,
    partitions: Option<Vec<(String, i32)>>,
) -> Result<Vec<Elected>, Stop> {
    check_epoch(store, epoch).await?;
    let live: BTreeSet<i32> = store.children(paths::BROKER_IDS).await?.iter().filter_map(|id| id.parse().ok()).collect();
    let mut assignments: BTreeMap<String, Option<TopicAssignment>> = BTreeMap::new();
    let partitions = match partitions {
        Some(partitions) => partitions,
        None => {
            let mut all = Vec::new();
            for (topic, assignment) in topic_assignments(store).await? {
                let mut indexes: Vec<i32> = numbered_partitions(&assignment).map(|(p, _)| p).collect();
                indexes.sort_unstable();
                all.extend(indexes.into_iter().map(|p| (topic.clone(), p)));
                assignments.insert(topic, Some(assignment));
            }
            all
        }
    };
    let mut results = Vec::with_capacity(partitions.len());
    for (topic, partition) in partitions {
        if !assignments.contains_key(&topic) {
            let assignment = read_json::<TopicAssignment>(store, &paths::topic(&topic)).await?.map(|(a, _)| a);
            assignments.insert(topic.clone(), assignment);
        }
        let replicas = assignments[&topic].as_ref().and_then(|a| a.partitions.get(&partition.to_string()));
        let outcome = match replicas {
            None => Err(NoElection::UnknownPartition),
            Some(replicas) => {
                let what = match election {
                    Election::Preferred => "preferred leader election asked for (ElectLeaders)",
                    Election::Unclean => "unclean leader election asked for (ElectLeaders); records may be lost",
                };
                let elected =
                    write_state(store, epoch, &topic, partition, what, |state| elect_leader(election, state, replicas, &live))
                        .await?;
                elected.unwrap_or(Err(NoElection::UnknownPartition))
            }
        };
        results.push(((topic, partition), outcome));
    }
    Ok(results)
}

/// Whether the partition needs a leader elected (where unclean election may matter).
fn needs_election(state: &PartitionState, live: &BTreeSet<i32>) -> bool {
    state.leader == -1 || !live.contains(&state.leader)
}

/// The state a partition should have, given the live brokers; `None` when it is right
/// as it is. The controller epoch of the result is the caller's to set.
pub(crate) fn decide(state: &PartitionState, replicas: &[i32], live: &BTreeSet<i32>, unclean: bool) -> Option<PartitionState> {
    let is_live = |b: &i32| live.contains(b);
    if !needs_election(state, live) {
        let isr: Vec<i32> = state.isr.iter().copied().filter(|b| is_live(b) || *b == state.leader).collect();
        return (isr != state.isr).then(|| PartitionState { isr, ..state.clone() });
    }
    let clean = replicas.iter().copied().find(|b| is_live(b) && state.isr.contains(b));
    let (leader, isr) = match clean {
        Some(leader) => (leader, state.isr.iter().copied().filter(is_live).collect()),
        None => match replicas.iter().copied().find(is_live).filter(|_| unclean) {
            Some(leader) => {
                tracing::warn!(leader, isr = ?state.isr, "unclean leader election: a replica outside the ISR leads; records may be lost");
                (leader, vec![leader])
            }
            // Offline: nobody may lead. The ISR stays as the record of who has it all.
            None if state.leader == -1 => return None,
            None => (-1, state.isr.clone()),
        },
    };
    Some(PartitionState { leader, leader_epoch: state.leader_epoch + 1, isr, controller_epoch: state.controller_epoch })
}

/// [`decide`], keeping leadership and ISR membership off the replicas in `bad`
/// (offline or damaged copies, `crate::replica_health`):
/// - an offline copy (its log could not be opened) serves nothing, so it counts as not
///   live at all: it is never elected, not even by an unclean election, and leaves the
///   ISR (Kafka never elects a replica on an offline log dir); with nobody else the
///   partition goes offline (leader -1, the ISR kept) until the copy opens again;
/// - a damaged copy, when another in-sync replica is usable: a leader listed there gives
///   leadership to the first usable in-sync replica and leaves the ISR, as does a listed
///   follower, and it is never elected. When no usable in-sync replica exists, the state
///   is decided as if it were healthy: a damaged leader still serves everything before
///   its damage, and a damaged last in-sync replica is a better leader than none.
pub(crate) fn decide_avoiding(
    state: &PartitionState,
    replicas: &[i32],
    live: &BTreeSet<i32>,
    bad: &UnhealthyReplicas,
    unclean: bool,
) -> Option<PartitionState> {
    if bad.offline.contains(&state.leader) && live.contains(&state.leader) {
        tracing::warn!(leader = state.leader, isr = ?state.isr, "the leader's log cannot be opened: it gives up leadership");
    }
    let live: BTreeSet<i32> = live.difference(&bad.offline).copied().collect();
    let live = &live;
    let usable: BTreeSet<i32> = live.difference(&bad.unhealthy).copied().collect();
    let other_in_sync = replicas.iter().any(|b| usable.contains(b) && state.isr.contains(b));
    if bad.unhealthy.is_empty() || !other_in_sync {
        return decide(state, replicas, live, unclean);
    }
    if bad.unhealthy.contains(&state.leader) && live.contains(&state.leader) {
        tracing::warn!(
            leader = state.leader, isr = ?state.isr,
            "the leader's copy is offline or damaged: leadership moves to a healthy in-sync replica"
        );
    }
    decide(state, replicas, &usable, unclean)
}

/// Kafka's automatic preferred-leader rebalancing over `(key, replicas, state)` of every
/// partition: per broker, the share of the partitions it is the preferred replica of (the
/// first of the assignment) that another broker leads; for each broker above `percentage`
/// percent, those of its partitions [`prefer`] may move, with their new states. Nothing
/// else moves: a broker at or under the threshold keeps its imbalance (moving leaders
/// costs clients a metadata refresh).
pub(crate) fn rebalance<'a, K>(
    partitions: &'a [(K, Vec<i32>, PartitionState)],
    live: &BTreeSet<i32>,
    percentage: u32,
) -> Vec<(&'a K, &'a [i32], PartitionState)> {
    // Preferred broker -> (its partitions, those of them led elsewhere).
    let mut shares: BTreeMap<i32, (u64, u64)> = BTreeMap::new();
    for (_, replicas, state) in partitions {
        let Some(&preferred) = replicas.first() else { continue };
        let share = shares.entry(preferred).or_default();
        share.0 += 1;
        share.1 += u64::from(state.leader != preferred);
    }
    // imbalanced / total > percentage / 100, in integers.
    let over =
        |broker: i32| shares.get(&broker).is_some_and(|&(total, elsewhere)| elsewhere * 100 > total * u64::from(percentage));
    partitions
        .iter()
        .filter(|(_, replicas, _)| replicas.first().is_some_and(|&preferred| over(preferred)))
        .filter_map(|(key, replicas, state)| prefer(state, replicas, live).map(|next| (key, replicas.as_slice(), next)))
        .collect()
}

/// The state that gives a partition's leadership to its preferred replica, if that is
/// allowed now: the preferred replica is live and in the ISR, and the partition has a
/// live leader that is another broker (a partition without one is [`decide`]'s to
/// elect). Same ISR, leader epoch + 1; the controller epoch is the caller's to set.
pub(crate) fn prefer(state: &PartitionState, replicas: &[i32], live: &BTreeSet<i32>) -> Option<PartitionState> {
    let &preferred = replicas.first()?;
    let movable =
        state.leader != preferred && !needs_election(state, live) && live.contains(&preferred) && state.isr.contains(&preferred);
    movable.then(|| PartitionState { leader: preferred, leader_epoch: state.leader_epoch + 1, ..state.clone() })
}

/// Backoff before competing again; false when shut down meanwhile.
async fn pause(shutdown: &CancellationToken) -> bool {
    tokio::select! {
        () = tokio::time::sleep(RETRY_BACKOFF) => true,
        () = shutdown.cancelled() => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asked_for_elections_follow_prefer_and_decide() {
        let replicas = [1, 2, 3];
        let preferred = |s: &PartitionState, l: &[i32]| elect_leader(Election::Preferred, s, &replicas, &live(l));
        assert_eq!(preferred(&state(2, 4, &[2, 1]), &[1, 2]), Ok(state(1, 5, &[2, 1])));
        assert_eq!(preferred(&state(1, 4, &[1, 2]), &[1, 2]), Err(NoElection::NotNeeded));
        assert_eq!(preferred(&state(2, 4, &[2]), &[1, 2]), Err(NoElection::PreferredNotAvailable), "out of the ISR");
        assert_eq!(preferred(&state(2, 4, &[2, 1]), &[2]), Err(NoElection::PreferredNotAvailable), "dead");
        assert_eq!(preferred(&state(1, 4, &[1, 2]), &[2]), Err(NoElection::PreferredNotAvailable), "leads, but dead");
        let unclean = |s: &PartitionState, l: &[i32]| elect_leader(Election::Unclean, s, &replicas, &live(l));
        assert_eq!(unclean(&state(2, 4, &[2]), &[1, 2]), Err(NoElection::NotNeeded), "a live leader");
        assert_eq!(unclean(&state(-1, 4, &[1]), &[3]), Ok(state(3, 5, &[3])), "offline: any live replica");
        assert_eq!(unclean(&state(1, 4, &[1]), &[2, 3]), Ok(state(2, 5, &[2])), "dead leader: the first live replica");
        assert_eq!(unclean(&state(1, 4, &[1, 3]), &[2, 3]), Ok(state(3, 5, &[3])), "a live ISR member first");
        assert_eq!(unclean(&state(-1, 4, &[1]), &[4]), Err(NoElection::NoEligibleLeader));
        assert_eq!(unclean(&state(1, 4, &[1]), &[]), Err(NoElection::NoEligibleLeader));
    }

    fn state(leader: i32, epoch: i32, isr: &[i32]) -> PartitionState {
        PartitionState { leader, leader_epoch: epoch, isr: isr.to_vec(), controller_epoch: 1 }
    }

    #[test]
    fn unhealthy_replicas_lose_leadership_and_isr_membership_when_a_healthy_one_can_take_over() {
        let replicas = [1, 2, 3];
        let all = live(&[1, 2, 3]);
        let decide = |s: &PartitionState, l: &BTreeSet<i32>, bad: &[i32]| {
            decide_avoiding(s, &replicas, l, &UnhealthyReplicas { unhealthy: live(bad), offline: BTreeSet::new() }, false)
        };
        assert_eq!(decide(&state(1, 4, &[1, 2, 3]), &all, &[]), None, "nothing listed: nothing changes");
        assert_eq!(decide(&state(1, 4, &[1, 2, 3]), &all, &[1]), Some(state(2, 5, &[2, 3])), "a damaged leader gives way");
        assert_eq!(decide(&state(1, 4, &[1, 2, 3]), &all, &[2]), Some(state(1, 4, &[1, 3])), "a damaged follower leaves the ISR");
        assert_eq!(decide(&state(1, 4, &[1, 3]), &all, &[1]), Some(state(3, 5, &[3])), "only in-sync replicas take over");
        assert_eq!(
            decide(&state(1, 4, &[1, 2, 3]), &live(&[2, 3]), &[2]),
            Some(state(3, 5, &[3])),
            "never elected over a healthy one"
        );
        assert_eq!(decide(&state(1, 4, &[1]), &all, &[1]), None, "no other in-sync replica: the damaged leader stays");
        assert_eq!(decide(&state(1, 4, &[1, 2]), &all, &[1, 2]), None, "nobody healthy in sync: as if nothing were listed");
        assert_eq!(decide(&state(1, 4, &[1, 2]), &live(&[2]), &[2]), Some(state(2, 5, &[2])), "a damaged last replica over none");
    }

    #[test]
    fn offline_replicas_are_never_elected_and_leave_the_isr() {
        let replicas = [1, 2, 3];
        let offline = |ids: &[i32]| UnhealthyReplicas { unhealthy: live(ids), offline: live(ids) };
        let decide = |s: &PartitionState, l: &[i32], off: &[i32], unclean: bool| {
            decide_avoiding(s, &replicas, &live(l), &offline(off), unclean)
        };
        // Leader 1 dies; 2's log cannot be opened: 3 leads, not 2 (first in assignment order).
        assert_eq!(decide(&state(1, 4, &[1, 2, 3]), &[2, 3], &[2], false), Some(state(3, 5, &[3])));
        // 2 is the only other in-sync replica: the partition goes offline rather than to a
        // copy that serves nothing (a damaged copy would lead here, see above).
        assert_eq!(decide(&state(1, 4, &[1, 2]), &[2, 3], &[2], false), Some(state(-1, 5, &[1, 2])));
        // Unclean election picks a live out-of-sync replica, never the offline one...
        assert_eq!(decide(&state(1, 4, &[1, 2]), &[2, 3], &[2], true), Some(state(3, 5, &[3])));
        // ... and with nobody else, nobody.
        assert_eq!(decide(&state(1, 4, &[1, 2]), &[2], &[2], true), Some(state(-1, 5, &[1, 2])));
        // An offline follower leaves the ISR even when no other replica is healthy.
        assert_eq!(decide(&state(1, 4, &[1, 2]), &[1, 2, 3], &[2], false), Some(state(1, 4, &[1])));
        // An offline leader gives up leadership to an in-sync replica, or to nobody.
        assert_eq!(decide(&state(1, 4, &[1, 2]), &[1, 2, 3], &[1], false), Some(state(2, 5, &[2])));
        assert_eq!(decide(&state(1, 4, &[1]), &[1, 2, 3], &[1], false), Some(state(-1, 5, &[1])));
        // Once its log opens again (no longer listed), the last in-sync replica leads again.
        assert_eq!(decide(&state(-1, 5, &[1]), &[1, 2, 3], &[], false), Some(state(1, 6, &[1])));
    }

    fn live(ids: &[i32]) -> BTreeSet<i32> {
        ids.iter().copied().collect()
    }

    #[test]
    fn leader_failure_elects_from_the_isr_in_assignment_order() {
        let replicas = [1, 2, 3];
        // Leader 1 dies; 3 precedes 2 in the ISR but 2 precedes 3 in the assignment.
        assert_eq!(decide(&state(1, 4, &[1, 3, 2]), &replicas, &live(&[2, 3]), false), Some(state(2, 5, &[3, 2])));
        // Only an out-of-sync replica is live: offline, ISR kept.
        assert_eq!(decide(&state(1, 4, &[1]), &replicas, &live(&[2, 3]), false), Some(state(-1, 5, &[1])));
        // ... unless unclean election is allowed.
        assert_eq!(decide(&state(1, 4, &[1]), &replicas, &live(&[3]), true), Some(state(3, 5, &[3])));
        // Already offline and still nobody: nothing to write.
        assert_eq!(decide(&state(-1, 5, &[1]), &replicas, &live(&[2]), false), None);
    }

    #[test]
    fn followers_leave_the_isr_and_leaders_return() {
        let replicas = [1, 2, 3];
        assert_eq!(decide(&state(1, 4, &[1, 2, 3]), &replicas, &live(&[1, 3]), false), Some(state(1, 4, &[1, 3])));
        assert_eq!(decide(&state(1, 4, &[1, 3]), &replicas, &live(&[1, 3]), false), None);
        // An offline partition gets its last ISR member back as leader.
        assert_eq!(decide(&state(-1, 5, &[1]), &replicas, &live(&[1, 2]), false), Some(state(1, 6, &[1])));
        // The leader alone stays in its own ISR even if it were not listed live.
        assert_eq!(decide(&state(2, 1, &[2]), &replicas, &live(&[2]), false), None);
    }

    /// `(name, replicas, state)` rows as the rebalancing pass reads them.
    fn rows(rows: &[(&'static str, &[i32], PartitionState)]) -> Vec<(&'static str, Vec<i32>, PartitionState)> {
        rows.iter().map(|(name, replicas, state)| (*name, replicas.to_vec(), state.clone())).collect()
    }

    fn moved(
        partitions: &[(&'static str, Vec<i32>, PartitionState)],
        live: &BTreeSet<i32>,
        pct: u32,
    ) -> Vec<(&'static str, PartitionState)> {
        rebalance(partitions, live, pct).into_iter().map(|(name, _, state)| (*name, state)).collect()
    }

    #[test]
    fn leadership_returns_to_a_live_in_sync_preferred_replica() {
        // Broker 1 prefers "a" and "b"; 2 leads both since 1 restarted; 1 is back in sync.
        let partitions = rows(&[("a", &[1, 2], state(2, 3, &[2, 1])), ("b", &[1, 2], state(2, 7, &[1, 2]))]);
        assert_eq!(
            moved(&partitions, &live(&[1, 2]), 10),
            [("a", state(1, 4, &[2, 1])), ("b", state(1, 8, &[1, 2]))],
            "same ISR, next leader epoch"
        );
    }

    #[test]
    fn no_move_to_a_preferred_replica_out_of_the_isr_or_dead() {
        let partitions = rows(&[("a", &[1, 2], state(2, 3, &[2]))]);
        assert_eq!(moved(&partitions, &live(&[1, 2]), 10), [], "preferred replica not in the ISR");
        let partitions = rows(&[("a", &[1, 2], state(2, 3, &[2, 1]))]);
        assert_eq!(moved(&partitions, &live(&[2]), 10), [], "preferred replica dead (still listed in the ISR)");
        // A partition without a live leader is an election (decide), not a rebalance.
        assert_eq!(prefer(&state(3, 3, &[3, 1]), &[1, 2, 3], &live(&[1, 2])), None);
        assert_eq!(prefer(&state(-1, 3, &[1]), &[1, 2], &live(&[1, 2])), None);
    }

    #[test]
    fn no_move_under_the_threshold_or_when_already_preferred() {
        // Broker 1 prefers 10 partitions; 1 of them (10 %) is led by 2: not above 10 %.
        let mut partitions: Vec<(&'static str, Vec<i32>, PartitionState)> =
            (0..9).map(|_| ("led", vec![1, 2], state(1, 1, &[1, 2]))).collect();
        partitions.push(("elsewhere", vec![1, 2], state(2, 2, &[2, 1])));
        assert_eq!(moved(&partitions, &live(&[1, 2]), 10), [], "10 % is not above 10 %");
        assert_eq!(moved(&partitions, &live(&[1, 2]), 9), [("elsewhere", state(1, 3, &[2, 1]))], "above 9 %");
        // Every partition already led by its preferred replica: nothing at any threshold.
        let balanced = rows(&[("a", &[1, 2], state(1, 1, &[1, 2])), ("b", &[2, 1], state(2, 1, &[1, 2]))]);
        assert_eq!(moved(&balanced, &live(&[1, 2]), 0), []);
        assert_eq!(prefer(&state(1, 1, &[1, 2]), &[1, 2], &live(&[1, 2])), None);
        // The share is per preferred broker: broker 2's balance does not hide broker 1's.
        let mixed = rows(&[
            ("a", &[1, 2], state(2, 1, &[1, 2])),
            ("b", &[2, 1], state(2, 1, &[1, 2])),
            ("c", &[2, 1], state(2, 1, &[1, 2])),
        ]);
        assert_eq!(moved(&mixed, &live(&[1, 2]), 50), [("a", state(1, 2, &[1, 2]))]);
    }
}
