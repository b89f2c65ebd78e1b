//! Replica fetchers: one task per leader broker this broker follows partitions of.
//!
//! Each round, the task asks the leader where the latest epoch of every partition that
//! just became a follower ended (OffsetForLeaderEpoch) and truncates, then sends one
//! Fetch for all its partitions (replica id = this broker, from each log end offset),
//! appends what comes back with `append_replicated` and takes the leader's high
//! watermark. A partition whose local log is damaged (found by the scrubber, a read or
//! the open) is first healed: truncated below the damage, the damaged bytes moved aside,
//! and fetched again from there. Failures are retried after `replica.fetch.backoff.ms`: a partition the
//! leader answers with an error waits alone (the others keep fetching, so one stale
//! partition cannot push the rest out of the ISR); a leader that is unreachable or not
//! registered is logged and retried. Nothing here stops the broker.
//!
//! A partition this broker follows under a throttle (`follower.replication.throttled.*`,
//! see [`super::throttle`]) and that is not in the ISR is left out of a round while the
//! follower's rate is exceeded; a round left with nothing to fetch sleeps until the rate
//! is back under its limit (at most `replica.fetch.backoff.ms`, as Kafka's fetcher does
//! with an empty fetch).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fjord_coord::registry::{read_json, BrokerRegistration};
use fjord_coord::{paths, Store};
use fjord_record::TopicPartition;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::offset_for_leader_epoch_request::{OffsetForLeaderPartition, OffsetForLeaderTopic};
use kafka_protocol::messages::{BrokerId, FetchRequest, OffsetForLeaderEpochRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::codec::error_code;
use crate::partition::{FollowerStep, Partition};
use crate::replication::peer::{Peer, PeerConfig, PeerError};
use crate::replication::throttle::{ReplicationThrottles, Side};
use crate::replication::ReplicationConfig;

/// Fetch v12: the last version that names topics by name (as this broker serves).
pub(super) const FETCH_VERSION: i16 = 12;
/// OffsetForLeaderEpoch v4 (flexible).
pub(super) const OFFSET_FOR_LEADER_EPOCH_VERSION: i16 = 4;

/// What every fetcher task shares.
pub(crate) struct FetchContext {
    pub(crate) broker_id: i32,
    pub(crate) store: Store,
    pub(crate) config: ReplicationConfig,
    /// How to reach the leaders: their inter-broker listener, with this broker's
    /// credentials for it.
    pub(crate) peer: PeerConfig,
    pub(crate) tasks: TaskTracker,
    pub(crate) shutdown: CancellationToken,
    /// Notified when a repair healed a log here, so that its unhealthy listing goes at
    /// once (`crate::replica_health::publish`).
    pub(crate) health_changed: Arc<Notify>,
    /// The follower's replication throttle.
    pub(crate) throttles: Arc<ReplicationThrottles>,
    /// Notified when a follower moved its log start up to its leader's: the broker then
    /// writes the log start checkpoint, so the new start survives a restart.
    pub(crate) log_start_moved: Arc<Notify>,
}

type PartitionSet = Arc<Mutex<HashMap<TopicPartition, Arc<Partition>>>>;

struct Fetcher {
    partitions: PartitionSet,
    wake: Arc<Notify>,
    stop: CancellationToken,
}

/// The fetcher tasks, by leader broker id.
pub(crate) struct Fetchers {
    context: Arc<FetchContext>,
    by_leader: Mutex<HashMap<i32, Fetcher>>,
}

impl Fetchers {
    pub(crate) fn new(context: Arc<FetchContext>) -> Self {
        Self { context, by_leader: Mutex::new(HashMap::new()) }
    }

    /// Fetches `partition` from `leader` from now on (and from no other broker).
    pub(crate) fn follow(&self, partition: Arc<Partition>, leader: i32) {
        let mut by_leader = self.by_leader.lock().expect("invariant: fetchers lock is never poisoned");
        remove_from_all(&mut by_leader, &partition.tp, Some(leader));
        let fetcher = by_leader.entry(leader).or_insert_with(|| {
            let fetcher = Fetcher {
                partitions: Arc::new(Mutex::new(HashMap::new())),
                wake: Arc::new(Notify::new()),
                stop: self.context.shutdown.child_token(),
            };
            let task = run(self.context.clone(), leader, fetcher.partitions.clone(), fetcher.wake.clone(), fetcher.stop.clone());
            self.context.tasks.spawn(task);
            fetcher
        });
        fetcher
            .partitions
            .lock()
            .expect("invariant: fetcher partitions lock is never poisoned")
            .insert(partition.tp.clone(), partition);
        fetcher.wake.notify_one();
    }

    /// Stops fetching `tp` (it is led here now, or by nobody).
    pub(crate) fn unfollow(&self, tp: &TopicPartition) {
        let mut by_leader = self.by_leader.lock().expect("invariant: fetchers lock is never poisoned");
        remove_from_all(&mut by_leader, tp, None);
    }
}

/// Removes `tp` from every fetcher but `keep`'s; a fetcher left without partitions stops.
fn remove_from_all(by_leader: &mut HashMap<i32, Fetcher>, tp: &TopicPartition, keep: Option<i32>) {
    by_leader.retain(|&leader, fetcher| {
        if Some(leader) == keep {
            return true;
        }
        let mut partitions = fetcher.partitions.lock().expect("invariant: fetcher partitions lock is never poisoned");
        partitions.remove(tp);
        if partitions.is_empty() {
            fetcher.stop.cancel();
            return false;
        }
        true
    });
}

/// One fetcher task: rounds of truncation and fetching from `leader` until stopped.
async fn run(context: Arc<FetchContext>, leader: i32, partitions: PartitionSet, wake: Arc<Notify>, stop: CancellationToken) {
    let mut peer: Option<Peer> = None;
    let mut failing = false;
    // Partitions that failed, and when they may be tried again.
    let mut delayed: HashMap<TopicPartition, Instant> = HashMap::new();
    tracing::debug!(leader, "replica fetcher started");
    loop {
        let now = Instant::now();
        let members: Vec<Arc<Partition>> =
            partitions.lock().expect("invariant: fetcher partitions lock is never poisoned").values().cloned().collect();
        delayed.retain(|tp, until| *until > now && members.iter().any(|p| &p.tp == tp));
        let ready: Vec<Arc<Partition>> = members.into_iter().filter(|p| !delayed.contains_key(&p.tp)).collect();
        if ready.is_empty() {
            // Nothing to fetch until a partition arrives or a delay ends.
            let next = delayed.values().min().copied();
            tokio::select! {
                () = wake.notified() => {}
                () = sleep_until(next) => {}
                () = stop.cancelled() => break,
            }
            continue;
        }
        let outcome = tokio::select! {
            outcome = round(&context, leader, &mut peer, &ready) => outcome,
            () = stop.cancelled() => break,
        };
        match outcome {
            Ok(failed) => {
                if failing {
                    tracing::info!(leader, "replica fetcher recovered");
                    failing = false;
                }
                let until = Instant::now() + context.config.fetch_backoff;
                delayed.extend(failed.into_iter().map(|tp| (tp, until)));
            }
            Err(e) => {
                // The first failure of a streak is a warning; the rest would flood the log.
                if failing {
                    tracing::debug!(leader, error = %e, "replica fetch failed again");
                } else {
                    tracing::warn!(leader, error = %e, "replica fetch failed; retrying with backoff");
                    failing = true;
                }
                peer = None;
                tokio::select! {
                    () = tokio::time::sleep(context.config.fetch_backoff) => {}
                    () = stop.cancelled() => break,
                }
            }
        }
    }
    tracing::debug!(leader, "replica fetcher stopped");
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
        None => std::future::pending().await,
    }
}

#[derive(Debug, thiserror::Error)]
enum FetchError {
    #[error("broker {0} is not registered")]
    NotRegistered(i32),
    #[error("broker {leader} has no listener {listener}")]
    NoListener { leader: i32, listener: String },
    #[error("reading the registration of broker {leader}: {source}")]
    Store { leader: i32, source: fjord_coord::Error },
    #[error(transparent)]
    Peer(#[from] PeerError),
    #[error("replica fetch answered with error {0}")]
    Response(i16),
}

async fn connect(context: &FetchContext, leader: i32) -> Result<Peer, FetchError> {
    let registration = read_json::<BrokerRegistration>(&*context.store, &paths::broker(leader))
        .await
        .map_err(|source| FetchError::Store { leader, source })?;
    let Some((registration, _)) = registration else {
        return Err(FetchError::NotRegistered(leader));
    };
    let listener = &context.peer.listener;
    let Some((host, port)) = registration.endpoint(listener) else {
        return Err(FetchError::NoListener { leader, listener: listener.clone() });
    };
    let client_id = format!("fjord-replica-fetcher-{}", context.broker_id);
    let peer = Peer::connect(host, port, client_id, &context.peer, context.config.socket_timeout).await?;
    tracing::debug!(leader, host, port, listener, "replica fetcher connected");
    Ok(peer)
}

/// One round over `partitions`; returns those that failed (answered with an error, or
/// not in a state to fetch), to be delayed.
async fn round(
    context: &FetchContext,
    leader: i32,
    peer: &mut Option<Peer>,
    partitions: &[Arc<Partition>],
) -> Result<Vec<TopicPartition>, FetchError> {
    if peer.is_none() {
        *peer = Some(connect(context, leader).await?);
    }
    let peer = peer.as_mut().expect("invariant: connected above");
    let mut failed = heal(context, leader, partitions).await;
    let (mut truncating, mut fetching) = (Vec::new(), Vec::new());
    for partition in partitions {
        match partition.next_follower_step(leader) {
            FollowerStep::Truncate { leader_epoch, latest_epoch } => truncating.push((partition, leader_epoch, latest_epoch)),
            FollowerStep::Fetch { leader_epoch, fetch_offset, log_start_offset } => {
                fetching.push((partition, leader_epoch, fetch_offset, log_start_offset))
            }
            // Its role is changing; the next state applied moves it or makes it fetchable.
            FollowerStep::Idle => failed.push(partition.tp.clone()),
        }
    }
    if !truncating.is_empty() {
        failed.extend(truncate(context, leader, peer, &truncating).await?);
    }
    // Throttled replicas outside the ISR wait while the follower's rate is exceeded.
    let throttles = &context.throttles;
    let wanted = fetching.len();
    fetching.retain(|(partition, ..)| {
        let in_sync = partition.state().isr.contains(&context.broker_id);
        !throttles.must_wait(Side::Follower, &partition.tp.topic, partition.tp.partition, in_sync)
    });
    if !fetching.is_empty() {
        failed.extend(fetch(context, leader, peer, &fetching).await?);
    } else if wanted > 0 && truncating.is_empty() {
        // Everything is throttled: wait for the rate to come down instead of spinning.
        let pause = throttles.delay(Side::Follower).clamp(Duration::from_millis(1), context.config.fetch_backoff);
        tokio::time::sleep(pause).await;
    }
    Ok(failed)
}

/// Heals the damaged logs among `partitions` (see [`Partition::heal_as_follower`]) on
/// the blocking pool; returns those that failed to heal, to be delayed.
async fn heal(context: &FetchContext, leader: i32, partitions: &[Arc<Partition>]) -> Vec<TopicPartition> {
    let mut failed = Vec::new();
    for partition in partitions.iter().filter(|p| !p.log.damage().is_empty()) {
        let p = partition.clone();
        let healed = tokio::task::spawn_blocking(move || {
            // The whole log is scrubbed first, outside the partition's lock, so the cut is
            // made at the first damage, not at the first found.
            while !p.log.scrub(u64::MAX)?.1 {}
            p.heal_as_follower(leader, fjord_record::now_ms() as u64)
        })
        .await;
        match healed {
            Ok(Ok(Some(_))) => context.health_changed.notify_one(),
            Ok(Ok(None)) => {}
            Ok(Err(e)) => {
                tracing::error!(tp = %partition.tp, leader, error = %e, "healing a damaged follower log failed");
                failed.push(partition.tp.clone());
            }
            Err(e) => {
                tracing::error!(tp = %partition.tp, leader, error = %e, "healing a damaged follower log panicked");
                failed.push(partition.tp.clone());
            }
        }
    }
    failed
}

fn topic_name(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_owned()))
}

/// Asks the leader where each partition's latest epoch ended, and truncates there.
async fn truncate(
    context: &FetchContext,
    leader: i32,
    peer: &mut Peer,
    partitions: &[(&Arc<Partition>, i32, Option<i32>)],
) -> Result<Vec<TopicPartition>, FetchError> {
    let mut failed = Vec::new();
    let mut by_topic: HashMap<&str, Vec<OffsetForLeaderPartition>> = HashMap::new();
    let mut asked = HashMap::new();
    for &(partition, leader_epoch, latest_epoch) in partitions {
        let Some(latest) = latest_epoch else {
            // No epochs at all (an empty log): nothing to compare, keep what is committed.
            if let Err(e) = partition.truncate_as_follower(leader, leader_epoch, None, (-1, -1)) {
                tracing::error!(tp = %partition.tp, error = %e, "follower truncation failed");
                failed.push(partition.tp.clone());
            }
            continue;
        };
        by_topic.entry(&partition.tp.topic).or_default().push(
            OffsetForLeaderPartition::default()
                .with_partition(partition.tp.partition)
                .with_current_leader_epoch(leader_epoch)
                .with_leader_epoch(latest),
        );
        asked.insert(partition.tp.clone(), (partition, leader_epoch, latest));
    }
    if by_topic.is_empty() {
        return Ok(failed);
    }
    let request = OffsetForLeaderEpochRequest::default().with_replica_id(BrokerId(context.broker_id)).with_topics(
        by_topic
            .into_iter()
            .map(|(topic, partitions)| OffsetForLeaderTopic::default().with_topic(topic_name(topic)).with_partitions(partitions))
            .collect(),
    );
    let response = peer.call(&request, OFFSET_FOR_LEADER_EPOCH_VERSION, context.config.socket_timeout).await?;
    for topic in response.topics {
        for answer in topic.partitions {
            let tp = TopicPartition::new(topic.topic.0.to_string(), answer.partition);
            let Some(&(partition, leader_epoch, latest)) = asked.get(&tp) else { continue };
            if answer.error_code != error_code::NONE {
                tracing::debug!(%tp, leader, error = answer.error_code, "OffsetForLeaderEpoch refused");
                failed.push(tp);
                continue;
            }
            if let Err(e) =
                partition.truncate_as_follower(leader, leader_epoch, Some(latest), (answer.leader_epoch, answer.end_offset))
            {
                tracing::error!(%tp, error = %e, "follower truncation failed");
                failed.push(tp);
            }
        }
    }
    Ok(failed)
}

/// One Fetch for every partition ready to fetch; appends what comes back.
async fn fetch(
    context: &FetchContext,
    leader: i32,
    peer: &mut Peer,
    partitions: &[(&Arc<Partition>, i32, i64, i64)],
) -> Result<Vec<TopicPartition>, FetchError> {
    let config = &context.config;
    let mut by_topic: HashMap<&str, Vec<FetchPartition>> = HashMap::new();
    let mut sent = HashMap::new();
    for &(partition, leader_epoch, fetch_offset, log_start_offset) in partitions {
        by_topic.entry(&partition.tp.topic).or_default().push(
            FetchPartition::default()
                .with_partition(partition.tp.partition)
                .with_current_leader_epoch(leader_epoch)
                .with_fetch_offset(fetch_offset)
                .with_last_fetched_epoch(-1)
                .with_log_start_offset(log_start_offset)
                .with_partition_max_bytes(config.fetch_max_bytes),
        );
        sent.insert(partition.tp.clone(), (partition, leader_epoch, fetch_offset));
    }
    let wait_ms = i32::try_from(config.fetch_wait_max.as_millis()).unwrap_or(i32::MAX);
    let request = FetchRequest::default()
        .with_replica_id(BrokerId(context.broker_id))
        .with_max_wait_ms(wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(config.fetch_response_max_bytes)
        .with_session_id(0)
        .with_session_epoch(-1)
        .with_topics(
            by_topic
                .into_iter()
                .map(|(topic, partitions)| FetchTopic::default().with_topic(topic_name(topic)).with_partitions(partitions))
                .collect(),
        );
    // The leader may hold the request for max_wait before answering.
    let response = peer.call(&request, FETCH_VERSION, config.socket_timeout + config.fetch_wait_max).await?;
    if response.error_code != error_code::NONE {
        return Err(FetchError::Response(response.error_code));
    }
    let mut failed = Vec::new();
    for topic in response.responses {
        for data in topic.partitions {
            let tp = TopicPartition::new(topic.topic.0.to_string(), data.partition_index);
            let Some(&(partition, leader_epoch, fetch_offset)) = sent.get(&tp) else { continue };
            let result = match data.error_code {
                error_code::NONE => {
                    let records = data.records.as_deref().unwrap_or_default();
                    if context.throttles.is_throttled(Side::Follower, &tp.topic, tp.partition) {
                        context.throttles.record(Side::Follower, records.len() as u64);
                    }
                    partition.append_as_follower(leader, leader_epoch, fetch_offset, records, data.high_watermark).map(drop)
                }
                error_code::OFFSET_OUT_OF_RANGE => {
                    partition.follower_out_of_range(leader, leader_epoch, fetch_offset, data.log_start_offset)
                }
                code => {
                    // NOT_LEADER_OR_FOLLOWER, FENCED/UNKNOWN_LEADER_EPOCH: the leader and we
                    // disagree on the state; the next state applied sorts it out.
                    tracing::debug!(%tp, leader, error = code, "replica fetch refused");
                    failed.push(tp);
                    continue;
                }
            };
            if let Err(e) = result {
                tracing::error!(%tp, leader, error = %e, "appending replicated records failed");
                failed.push(tp);
                continue;
            }
            if data.error_code != error_code::NONE {
                continue;
            }
            // After the append, so the start can follow the leader's up to the new log end.
            match partition.follow_log_start(leader, data.log_start_offset) {
                Ok(true) => context.log_start_moved.notify_one(),
                Ok(false) => {}
                Err(e) => tracing::error!(%tp, leader, error = %e, "moving the log start up to the leader's failed"),
            }
        }
    }
    Ok(failed)
}
