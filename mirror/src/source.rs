//! One source cluster: a group member that copies its partitions into the target.
//!
//! The loop: poll records, send each to the target (same partition, or by key when the
//! target has fewer partitions and that was allowed), and every `commit_interval`, or
//! before the group rebalances, flush the producer, check that the target acknowledged
//! every record (acks=all), and only then commit the consumed positions in the source
//! group. So a committed offset never runs ahead of the target: a crash copies again at
//! most the records after the last commit (duplicates), never loses any.
//!
//! Exactly once ([`MirrorConfig::exactly_once`]): the producer is transactional; the
//! records sent since the last checkpoint and the source positions after them (as the
//! offsets of [`MirrorConfig::target_group`] on the target, via AddOffsetsToTxn and
//! TxnOffsetCommit) commit in one transaction, so read_committed readers of the target
//! see each copy once or not at all. A newly assigned partition resumes at the target
//! group's offset (asked with `require_stable`, so a commit still completing is waited
//! for), not at the source group's, which is only committed afterwards, for the lag. Any
//! failure aborts the open transaction and restarts the session from those offsets; a
//! kill -9 leaves it open, and the restarted mirror's InitProducerId (same transactional
//! id) aborts it.
//!
//! Gaps: the position a partition resumes at is the group's committed offset; when
//! retention has deleted data past it, the consumer restarts at the log start. The mirror
//! compares the committed offset (or, while running, the next expected offset) with the
//! source's log start and reports the deleted range as a [`Gap`] instead of skipping it.
//!
//! Failures of the source (unreachable, topic listing fails, ...) end the session; the
//! caller retries with exponential backoff while the other sources go on.
//!
//! Refused records: a record the target refuses for what it holds (too large for the
//! target topic, invalid for it, stamped outside its timestamp limits) would be refused
//! again at every retry. Its partition is held at it while the others go on
//! ([`Session::hold`]): paused there, with what precedes it committed, and the record
//! sent again alone now and then (exactly once, in a transaction of its own). With a
//! dead-letter topic ([`MirrorConfig::dead_letter_topic`]) it is written there instead
//! and the copying goes on. At least once, that happens at the checkpoint that finds the refusal, before the
//! positions past it are committed (the producer stores the rest of its batch in order).
//! Exactly once, the refusal spoils the open transaction: it is aborted, the refused
//! positions are kept in [`Shared`], and the session that starts again from the
//! committed positions writes those records to the dead-letter topic, in its transaction
//! (or, without one, holds their partitions).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use fjord_audit::record::created_ms;
use fjord_audit::{AuditCounter, PendingCounts, AUDIT_TOPIC};
use fjord_client::{
    Acks, Admin, ClientConfig, ConsumerRecord, DeliveryFuture, GroupAdmin, GroupConfig, GroupConsumer, IsolationLevel, NewTopic,
    OffsetReset, OffsetSpec, Producer, ProducerConfig, ProducerRecord, Rebalance, ResponseError, TopicMetadata, TopicPartition,
};
use fjord_record::now_ms;
use regex::Regex;
use tokio_util::sync::CancellationToken;

use crate::config::{MirrorConfig, SourceConfig};
use crate::stats::{Gap, Stats};
use crate::{Error, Result, GAPS_TOPIC, ORIGIN_HEADER};

/// The target's limits on how far a record's timestamp may be from its clock (KIP-937),
/// lifted on the topics the mirror creates.
const TIMESTAMP_LIMITS: [&str; 2] = ["message.timestamp.after.max.ms", "message.timestamp.before.max.ms"];

/// First pause after a source failed; doubled per failure up to `retry_backoff_max`.
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
/// How long one poll may wait for records before the loop looks at commits and topics.
const POLL_TIMEOUT: Duration = Duration::from_millis(200);
/// Bound on the last flush and commit at shutdown or after a failure.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// What every source task shares.
pub(crate) struct Shared {
    pub(crate) config: MirrorConfig,
    pub(crate) topics: Regex,
    pub(crate) stats: Arc<Stats>,
    pub(crate) target: Target,
    pub(crate) audit: Option<Arc<AuditCounter>>,
    /// This machine's name (or the configured one): part of the transactional ids.
    pub(crate) host: String,
    /// With exactly once: records the target refused in a transaction that was aborted
    /// for it, by source alias and position, with why; the next session writes them to
    /// the dead-letter topic, or without one holds their partitions at them.
    pub(crate) refused: Mutex<HashMap<(String, TopicPartition, i64), Refusal>>,
}

impl Shared {
    /// The refusal of the record at `offset` of `tp` from source `alias`, if one is kept.
    fn refusal(&self, alias: &str, tp: &TopicPartition, offset: i64) -> Option<Refusal> {
        // Only exactly-once transactions keep refusals: no lock per record otherwise.
        if !self.config.exactly_once {
            return None;
        }
        let refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        if refused.is_empty() {
            return None;
        }
        refused.get(&(alias.to_string(), tp.clone(), offset)).cloned()
    }

    /// Forgets the refusals of records now committed past (set aside, or taken by the target).
    fn forget_refusals(&self, alias: &str, positions: impl IntoIterator<Item = (TopicPartition, i64)>) {
        let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        for (tp, offset) in positions {
            refused.remove(&(alias.to_string(), tp, offset));
        }
    }
}

/// Whether the target refused the record for what it holds, so that sending it again
/// cannot succeed: too large (for the topic, or for the producer's request size), invalid
/// for the topic, or stamped outside its timestamp limits.
fn refused_for_itself(error: &fjord_client::Error) -> bool {
    refused_for_size(error) || matches!(error.code(), Some(ResponseError::InvalidRecord | ResponseError::InvalidTimestamp))
}

/// Whether the record was refused for its size, by the producer or by the target topic.
fn refused_for_size(error: &fjord_client::Error) -> bool {
    matches!(error, fjord_client::Error::RecordTooLarge { .. }) || error.code() == Some(ResponseError::MessageTooLarge)
}

/// Why the target refused a record, as its dead letter says.
#[derive(Debug, Clone)]
pub(crate) struct Refusal {
    reason: String,
    /// Refused for its size: the dead letter goes without the value, which the target
    /// would refuse again.
    too_large: bool,
}

impl From<&fjord_client::Error> for Refusal {
    fn from(error: &fjord_client::Error) -> Self {
        Self { reason: error.to_string(), too_large: refused_for_size(error) }
    }
}

/// Headers of a mirror's dead letter, besides the audit crate's reason and source topic
/// (the gateway's names for the same things) and the origin header the copy carries.
const DLQ_PARTITION: &str = "fjord.dlq.partition";
const DLQ_OFFSET: &str = "fjord.dlq.offset";
/// The record's own timestamp: the dead letter is stamped when it was set aside.
const DLQ_TIMESTAMP: &str = "fjord.dlq.timestamp";
/// The target topic that refused it.
const DLQ_TARGET: &str = "fjord.dlq.target";
/// The size of the value left out of a record refused for its size.
const DLQ_VALUE_BYTES: &str = "fjord.dlq.value_bytes";

/// The dead letter of `copy`, the record from `source` at `offset` that the target
/// refused: its key, headers and (unless it was refused for its size) value, with
/// headers saying where it came from, where it was going and why.
fn dead_letter(topic: &str, copy: ProducerRecord, source: &TopicPartition, offset: i64, refusal: &Refusal) -> ProducerRecord {
    let mut headers = copy.headers;
    let mut add = |name: &str, value: String| headers.push((name.to_string(), Some(Bytes::from(value))));
    add(fjord_audit::DEAD_LETTER_REASON_HEADER, refusal.reason.clone());
    add(fjord_audit::DEAD_LETTER_TOPIC_HEADER, source.topic.clone());
    add(DLQ_PARTITION, source.partition.to_string());
    add(DLQ_OFFSET, offset.to_string());
    add(DLQ_TARGET, copy.topic);
    if let Some(ts) = copy.timestamp {
        add(DLQ_TIMESTAMP, ts.to_string());
    }
    let value = match (refusal.too_large, copy.value) {
        (true, Some(value)) => {
            add(DLQ_VALUE_BYTES, value.len().to_string());
            None
        }
        (_, value) => value,
    };
    ProducerRecord { topic: topic.to_string(), partition: None, key: copy.key, value, headers, timestamp: None }
}

/// A record sent to the target (or to the dead-letter topic) since the last checkpoint.
/// Small: a checkpoint holds one per record copied within a commit interval.
struct Copy {
    /// The source partition and offset it came from (the topic's name shared with the
    /// consumer's records: no allocation per copy).
    topic: Arc<str>,
    partition: i32,
    offset: i64,
    /// Its creation time, as the audit counts it.
    created: i64,
    /// A dead letter, not a copy.
    dead_letter: bool,
    /// With a dead-letter topic, the copy itself, to set aside if the target refuses it;
    /// `None` for a dead letter (whose refusal stops the source).
    record: Option<Box<ProducerRecord>>,
}

impl Copy {
    fn source(&self) -> TopicPartition {
        TopicPartition::new(&*self.topic, self.partition)
    }
}

/// The target cluster: its admin client and the partition counts of its topics, created
/// on demand (one creation at a time, so two sources never race on one topic).
pub(crate) struct Target {
    client: ClientConfig,
    admin: Admin,
    partitions: tokio::sync::Mutex<HashMap<String, i32>>,
}

impl Target {
    pub(crate) async fn connect(client: ClientConfig) -> fjord_client::Result<Self> {
        Ok(Self { admin: Admin::connect(client.clone()).await?, client, partitions: tokio::sync::Mutex::default() })
    }

    /// The partition count of `name`, creating it with `partitions` and `configs` if missing.
    async fn ensure(&self, name: &str, partitions: i32, configs: BTreeMap<String, String>) -> Result<i32> {
        let mut known = self.partitions.lock().await;
        if let Some(n) = known.get(name) {
            return Ok(*n);
        }
        let n = match self.admin.describe_topic(name).await {
            Ok(t) => t.partitions.len() as i32,
            Err(fjord_client::Error::UnknownTopic(_)) => {
                let topic = NewTopic { configs: configs.clone(), ..NewTopic::new(name, partitions) };
                match self.admin.create_topics(&[topic]).await {
                    Ok(()) => {
                        tracing::info!(topic = name, partitions, ?configs, "created target topic");
                        self.wait_for_leaders(name).await?;
                        partitions
                    }
                    Err(e) if e.code() == Some(ResponseError::TopicAlreadyExists) => {
                        self.admin.describe_topic(name).await?.partitions.len() as i32
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) => return Err(e.into()),
        };
        known.insert(name.to_string(), n);
        Ok(n)
    }
}

impl Target {
    /// Raises `name` to `partitions` partitions if it has fewer (CreatePartitions, as
    /// MirrorMaker 2 does when a source topic grew); returns its count afterwards.
    async fn grow(&self, name: &str, partitions: i32) -> Result<i32> {
        let mut known = self.partitions.lock().await;
        let current = self.admin.describe_topic(name).await?.partitions.len() as i32;
        let n = if current < partitions {
            match self.admin.create_partitions(name, partitions).await {
                Ok(()) => tracing::info!(topic = name, from = current, to = partitions, "grew target topic"),
                // Another mirror grew it first: its count is read below.
                Err(e) if e.code() == Some(ResponseError::InvalidPartitions) => {}
                Err(e) => return Err(e.into()),
            }
            self.wait_for_leaders(name).await?;
            self.admin.describe_topic(name).await?.partitions.len() as i32
        } else {
            current
        };
        known.insert(name.to_string(), n);
        Ok(n)
    }

    /// A new topic's partitions get their leaders a moment after CreateTopics answered:
    /// copying starts once they have them, not with a burst of failed sends.
    async fn wait_for_leaders(&self, name: &str) -> Result<()> {
        let deadline = Instant::now() + self.client.request_timeout;
        loop {
            match self.admin.describe_topic(name).await {
                Ok(t) if t.partitions.iter().all(|p| p.leader >= 0) => return Ok(()),
                Ok(_) | Err(fjord_client::Error::UnknownTopic(_) | fjord_client::Error::LeaderNotAvailable(_))
                    if Instant::now() < deadline =>
                {
                    tokio::time::sleep(self.client.retry_backoff).await;
                }
                Ok(_) => return Err(fjord_client::Error::LeaderNotAvailable(name.to_string()).into()),
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// Runs one source until `shutdown`, retrying failed sessions with backoff. Only a
/// configuration problem found on the clusters (a target topic with too few partitions)
/// ends it with an error.
pub(crate) async fn run_source(shared: Arc<Shared>, source: SourceConfig, shutdown: CancellationToken) -> Result<()> {
    let mut backoff = FIRST_BACKOFF;
    loop {
        let started = Instant::now();
        let result = Session::run(&shared, &source, &shutdown).await;
        shared.stats.revoke_all(&source.alias);
        match result {
            Ok(()) => return Ok(()),
            Err(e @ Error::FewerTargetPartitions { .. }) => return Err(e),
            // Nothing is wrong with the source: the next session, at once, sets the
            // records aside or holds their partitions.
            Err(e @ Error::RefusedInTransaction { .. }) => tracing::info!(source = %source.alias, "{e}"),
            Err(e) => {
                // A session that ran healthily for a while starts the backoff over.
                if started.elapsed() > shared.config.retry_backoff_max {
                    backoff = FIRST_BACKOFF;
                }
                shared.stats.failed(&source.alias, &e.to_string());
                tracing::warn!(source = %source.alias, bootstrap = %source.bootstrap, error = %e, retry_in = ?backoff, "source failed; retrying (other sources go on)");
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = shutdown.cancelled() => return Ok(()),
                }
                backoff = (backoff * 2).min(shared.config.retry_backoff_max);
            }
        }
    }
}

/// Where a source topic's records go.
struct Route {
    target: String,
    source_partitions: i32,
    target_partitions: i32,
}

impl Route {
    /// Same partition when the target has enough (so a key stays on its partition, and
    /// per-key order holds); else by key hash (or the source partition modulo the count
    /// for records without a key), which also keeps each key on one partition.
    fn partition(&self, source_partition: i32, key: Option<&[u8]>) -> i32 {
        if self.target_partitions >= self.source_partitions {
            return source_partition;
        }
        match key {
            Some(k) => fjord_client::partitioner::partition_for_key(k, self.target_partitions),
            None => source_partition % self.target_partitions,
        }
    }
}

struct Session<'a> {
    shared: &'a Shared,
    alias: &'a str,
    source_client: ClientConfig,
    admin: Admin,
    groups: GroupAdmin,
    producer: Producer,
    routes: BTreeMap<String, Route>,
    /// Next source offset expected per owned partition (absent until known).
    next: HashMap<TopicPartition, i64>,
    /// Copies sent since the last commit, with their deliveries.
    sent: Vec<(Copy, DeliveryFuture)>,
    /// Those the target stored, from the checkpoint under way (both kept for their
    /// capacity: a commit interval holds a few hundred thousand).
    stored: Vec<Copy>,
    /// Next source offset per partition after the records sent since the last commit.
    sent_next: HashMap<TopicPartition, i64>,
    /// Next source offset per owned partition up to which the target acknowledged
    /// everything: what is committed (a failed commit is sent again with the next).
    acked: HashMap<TopicPartition, i64>,
    /// The last commit failed: the next checkpoint commits even with nothing new sent.
    commit_failed: bool,
    sent_counts: BTreeMap<String, u64>,
    /// Records set aside in the dead-letter topic since the last commit, per source topic.
    dead_counts: BTreeMap<String, u64>,
    audit_pending: Option<PendingCounts>,
    rebalances: Arc<Mutex<Vec<Rebalance>>>,
    last_commit: Instant,
    /// With exactly once: the target cluster's groups, where the positions are.
    target_groups: Option<GroupAdmin>,
    /// With exactly once: a transaction is open on the target.
    txn_open: bool,
    /// Partitions moved to the target's position since the last poll: the records of
    /// them that poll returned came from elsewhere and are fetched again.
    moved: HashSet<TopicPartition>,
    /// Without a dead-letter topic: partitions waiting at a record the target refuses
    /// (paused), which is sent again alone now and then.
    held: HashMap<TopicPartition, Held>,
}

/// A partition waiting at a record the target refuses (see [`Session::hold`]).
struct Held {
    /// The refused record's offset.
    offset: i64,
    /// When it is sent again, and the pause before the attempt after that.
    retry_at: Instant,
    backoff: Duration,
    /// Resumed to send the record again: the first record of it polled is that one.
    probing: bool,
    /// Sent again; the next checkpoint tells whether the target took it.
    probe_sent: bool,
}

impl<'a> Session<'a> {
    async fn run(shared: &'a Shared, source: &'a SourceConfig, shutdown: &CancellationToken) -> Result<()> {
        let source_client = ClientConfig {
            client_id: "fjord-mirror".into(),
            connect_timeout: Duration::from_secs(5),
            security: source.security.clone(),
            ..ClientConfig::new(&source.bootstrap)
        };
        let admin = Admin::connect(source_client.clone()).await?;
        let groups = GroupAdmin::connect(source_client.clone()).await?;
        let exactly_once = shared.config.exactly_once;
        // InitProducerId: fences a killed predecessor and aborts what it left open.
        let producer = Producer::connect(ProducerConfig {
            client: ClientConfig { client_id: "fjord-mirror".into(), ..shared.target.client.clone() },
            transactional_id: exactly_once.then(|| shared.config.transactional_id(&source.alias, &shared.host)),
            acks: Acks::All,
            // One request in flight per broker: a retried batch can never overtake the
            // next one, so per-key order survives retries.
            max_in_flight: 1,
            batch_size: 256 * 1024,
            linger: Duration::from_millis(10),
            max_request_size: shared.config.max_request_size,
            buffer_memory: ProducerConfig::default().buffer_memory.max(shared.config.max_request_size),
            ..ProducerConfig::default()
        })
        .await?;
        let target_groups = match exactly_once {
            true => Some(GroupAdmin::connect(shared.target.client.clone()).await?),
            false => None,
        };
        if let Some(topic) = &shared.config.dead_letter_topic {
            // Made before any refusal, so a target that cannot have it says so at once.
            shared.target.ensure(topic, 1, BTreeMap::new()).await?;
        }
        let mut session = Session {
            shared,
            alias: &source.alias,
            source_client,
            admin,
            groups,
            producer,
            routes: BTreeMap::new(),
            next: HashMap::new(),
            sent: Vec::new(),
            stored: Vec::new(),
            sent_next: HashMap::new(),
            acked: HashMap::new(),
            commit_failed: false,
            sent_counts: BTreeMap::new(),
            dead_counts: BTreeMap::new(),
            audit_pending: shared.audit.as_ref().map(|a| a.pending()),
            rebalances: Arc::default(),
            last_commit: Instant::now(),
            target_groups,
            txn_open: false,
            moved: HashSet::new(),
            held: HashMap::new(),
        };
        let lag = tokio::spawn(lag_loop(
            shared.stats.clone(),
            source.alias.clone(),
            session.source_client.clone(),
            shared.config.lag_interval,
        ));
        let result = session.mirror(shutdown).await;
        lag.abort();
        result
    }

    /// Subscribes to the matching topics and copies until shutdown; resubscribes when the
    /// set of matching topics changes.
    async fn mirror(&mut self, shutdown: &CancellationToken) -> Result<()> {
        let mut topics = self.discover().await?;
        self.shared.stats.up(self.alias);
        loop {
            let names: Vec<&str> = topics.iter().map(String::as_str).collect();
            tracing::info!(source = %self.alias, topics = ?names, "subscribing");
            let mut consumer = self.subscribe(&names).await?;
            let result = self.copy(&mut consumer, &topics, shutdown).await;
            // Flush and commit what was copied (bounded: the source may be the problem),
            // then leave the group so the partitions move at once.
            match tokio::time::timeout(CLOSE_TIMEOUT, self.finish(consumer, result.is_ok())).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(source = %self.alias, error = %e, "the last flush and commit failed; the records since the previous commit will be copied again")
                }
                Err(_) => {
                    tracing::warn!(source = %self.alias, "the last flush and commit did not finish within {CLOSE_TIMEOUT:?}; the records since the previous commit will be copied again")
                }
            }
            self.next.clear();
            self.acked.clear();
            match result? {
                None => return Ok(()),
                Some(changed) => topics = changed,
            }
        }
    }

    async fn finish(&mut self, mut consumer: GroupConsumer, checkpoint: bool) -> Result<()> {
        if checkpoint {
            self.checkpoint(&mut consumer).await?;
        }
        if self.txn_open {
            // Its copies were never committed: abort now rather than at the next InitProducerId.
            self.txn_open = false;
            if let Err(e) = self.producer.abort_transaction().await {
                tracing::warn!(source = %self.alias, error = %e, "aborting the mirror's transaction failed");
            }
        }
        self.sent.clear();
        self.stored.clear();
        self.sent_next.clear();
        self.sent_counts.clear();
        self.dead_counts.clear();
        if let (Some(audit), Some(pending)) = (&self.shared.audit, self.audit_pending.as_mut()) {
            // Counts of records that were never acknowledged do not reach the audit.
            *pending = audit.pending();
        }
        consumer.close().await?;
        Ok(())
    }

    async fn subscribe(&mut self, topics: &[&str]) -> Result<GroupConsumer> {
        let config = &self.shared.config;
        let mut group = GroupConfig::new("", &config.group);
        group.consumer.client = self.source_client.clone();
        // A partition the group never committed starts at the log start: a new mirror
        // copies what the source holds.
        group.consumer.auto_offset_reset = OffsetReset::Earliest;
        // Exactly-once copies carry only what the source committed: an aborted source
        // transaction must not become a committed one on the target.
        if config.exactly_once {
            group.consumer.isolation_level = IsolationLevel::ReadCommitted;
        }
        // Commits happen here, only after the target acknowledged.
        group.enable_auto_commit = false;
        group.group_instance_id = config.instance_id.clone();
        group.session_timeout = config.session_timeout;
        group.heartbeat_interval = config.session_timeout / 3;
        // The group follows a source topic's new partitions once its metadata shows them:
        // as soon as the mirror would notice a new topic.
        group.consumer.client.metadata_max_age = group.consumer.client.metadata_max_age.min(config.topic_refresh);
        let mut consumer = GroupConsumer::subscribe(group, topics).await?;
        let events = self.rebalances.clone();
        events.lock().unwrap_or_else(|p| p.into_inner()).clear();
        consumer.set_rebalance_listener(Box::new(move |e| events.lock().unwrap_or_else(|p| p.into_inner()).push(e.clone())));
        Ok(consumer)
    }

    /// Copies until shutdown (`None`) or until the matching topics change (`Some(new set)`).
    async fn copy(
        &mut self,
        consumer: &mut GroupConsumer,
        topics: &BTreeSet<String>,
        shutdown: &CancellationToken,
    ) -> Result<Option<BTreeSet<String>>> {
        let mut last_discovery = Instant::now();
        loop {
            if shutdown.is_cancelled() {
                return Ok(None);
            }
            if last_discovery.elapsed() >= self.shared.config.topic_refresh {
                last_discovery = Instant::now();
                let now = self.discover().await?;
                if &now != topics {
                    return Ok(Some(now));
                }
            }
            // An eager rejoin gives up every partition: what was copied is committed first
            // (a poll that finds a rebalance flagged after this check returns empty
            // instead of rejoining, so the next round commits first).
            if consumer.rebalance_pending() || self.last_commit.elapsed() >= self.shared.config.commit_interval {
                self.checkpoint(consumer).await?;
            }
            let records = tokio::select! {
                r = consumer.poll(POLL_TIMEOUT) => r?,
                () = shutdown.cancelled() => return Ok(None),
            };
            self.handle_rebalances(consumer).await?;
            let moved = std::mem::take(&mut self.moved);
            // Exactly once, records refused in a transaction aborted for them: without a
            // dead-letter topic their partitions wait at them.
            let holds_refused = self.shared.config.dead_letter_topic.is_none() && self.shared.config.exactly_once;
            for r in records {
                // The common case, nothing moved or held: no lookup per record.
                if !moved.is_empty() || !self.held.is_empty() || holds_refused {
                    let tp = TopicPartition::new(&*r.topic, r.partition);
                    if moved.contains(&tp) {
                        continue;
                    }
                    let probe = match self.held.get(&tp) {
                        None => false,
                        Some(held) if held.probing && !held.probe_sent => true,
                        Some(_) => continue,
                    };
                    if probe {
                        self.probe(consumer, r).await?;
                        continue;
                    }
                    if let Some(refusal) = self.shared.refusal(self.alias, &tp, r.offset).filter(|_| holds_refused) {
                        self.hold(consumer, tp, r.offset, &refusal.reason)?;
                        continue;
                    }
                }
                self.forward_or_hold(consumer, r).await?;
                // One poll can hand out megabytes: commits go on within it, so the
                // duplicate window after a crash stays about one commit interval.
                if self.last_commit.elapsed() >= self.shared.config.commit_interval {
                    self.checkpoint(consumer).await?;
                }
            }
            self.retry_held(consumer)?;
        }
    }

    /// Sends `r`, the record its held partition waits at, again alone: what was sent
    /// before it is checkpointed first, and it right after (exactly once, in a
    /// transaction of its own, so that a refusal aborts nothing else). The partition is
    /// paused past it meanwhile; the checkpoint releases or holds it again.
    async fn probe(&mut self, consumer: &mut GroupConsumer, r: ConsumerRecord) -> Result<()> {
        let tp = TopicPartition::new(&*r.topic, r.partition);
        if self.target_groups.is_some() {
            self.checkpoint(consumer).await?;
        }
        if let Some(held) = self.held.get_mut(&tp) {
            (held.offset, held.probe_sent) = (r.offset, true);
        }
        consumer.seek(&tp, r.offset + 1)?;
        consumer.pause(&tp)?;
        self.forward_or_hold(consumer, r).await?;
        self.checkpoint(consumer).await
    }

    /// [`Session::forward`], holding the record's partition when the producer refuses
    /// the record before sending it (larger than `max_request_size`): nothing else is
    /// harmed, and the record is retried like one the target refused.
    async fn forward_or_hold(&mut self, consumer: &mut GroupConsumer, r: ConsumerRecord) -> Result<()> {
        let (topic, partition, offset) = (r.topic.clone(), r.partition, r.offset);
        match self.forward(r).await {
            Err(Error::Refused { error, .. }) => {
                self.hold(consumer, TopicPartition::new(&*topic, partition), offset, &error.to_string())
            }
            other => other,
        }
    }

    /// Holds `tp` at `offset`, whose record the target refuses (`error` says why): what
    /// precedes it is committed, the partition is paused there, and the record is sent
    /// again alone after a pause that doubles with each refusal (up to
    /// `retry_backoff_max`), while the source's other partitions go on. A record sent
    /// after it before the refusal was known is copied again once the target takes it
    /// (at least once).
    fn hold(&mut self, consumer: &mut GroupConsumer, tp: TopicPartition, offset: i64, error: &str) -> Result<()> {
        consumer.seek(&tp, offset)?;
        consumer.pause(&tp)?;
        self.next.insert(tp.clone(), offset);
        let backoff = match self.held.get(&tp) {
            Some(held) => (held.backoff * 2).min(self.shared.config.retry_backoff_max),
            None => FIRST_BACKOFF,
        };
        let reason = format!("the target refuses the record at offset {offset}: {error}");
        tracing::error!(
            source = %self.alias, topic = %tp.topic, partition = tp.partition, offset, %error, retry_in = ?backoff,
            "the target refuses a record: its partition waits at it, retried alone, while the others go on (--dead-letter-topic sets such records aside)"
        );
        self.shared.stats.held(self.alias, &tp, Some(reason));
        let held = Held { offset, retry_at: Instant::now() + backoff, backoff, probing: false, probe_sent: false };
        self.held.insert(tp, held);
        Ok(())
    }

    /// Releases the held partitions whose record, sent again, the target took (those in
    /// `refused` it refused again): they go on from past it.
    fn release_taken(&mut self, consumer: &mut GroupConsumer, refused: &HashSet<TopicPartition>) -> Result<()> {
        let taken: Vec<TopicPartition> =
            self.held.iter().filter(|(tp, held)| held.probe_sent && !refused.contains(*tp)).map(|(tp, _)| tp.clone()).collect();
        for tp in taken {
            if let Some(held) = self.held.remove(&tp) {
                self.shared.forget_refusals(self.alias, [(tp.clone(), held.offset)]);
            }
            consumer.resume(&tp)?;
            self.shared.stats.held(self.alias, &tp, None);
            tracing::info!(source = %self.alias, topic = %tp.topic, partition = tp.partition, "the target took the refused record: its partition goes on");
        }
        Ok(())
    }

    /// Resumes the held partitions whose pause is over, to send their record again.
    fn retry_held(&mut self, consumer: &mut GroupConsumer) -> Result<()> {
        let now = Instant::now();
        for (tp, held) in &mut self.held {
            if !held.probing && held.retry_at <= now {
                held.probing = true;
                consumer.resume(tp)?;
            }
        }
        Ok(())
    }

    /// The source topics to mirror now, each with its target topic ready.
    async fn discover(&mut self) -> Result<BTreeSet<String>> {
        let mut out = BTreeSet::new();
        for t in self.admin.list_topics().await? {
            // With the audit tier on, the sources' `_audit` joins the target's, so a report
            // on the analytics cluster sees every tier (the gateway's counts included).
            let audit_feed = self.shared.audit.is_some() && t.name == AUDIT_TOPIC;
            if t.is_internal || t.name.starts_with("__") || !(audit_feed || self.shared.topics.is_match(&t.name)) {
                continue;
            }
            let partitions = t.partitions.len() as i32;
            match self.routes.get(&t.name).map(|r| r.source_partitions) {
                None => {
                    let route = self.route(&t).await?;
                    self.routes.insert(t.name.clone(), route);
                }
                // Grown (CreatePartitions): the target follows before the first record of
                // the new partitions arrives.
                Some(known) if partitions > known => self.follow_growth(&t.name, partitions - 1).await?,
                Some(_) => {}
            }
            out.insert(t.name.clone());
        }
        Ok(out)
    }

    async fn route(&self, t: &TopicMetadata) -> Result<Route> {
        let audit_feed = self.shared.audit.is_some() && t.name == AUDIT_TOPIC;
        let target = if audit_feed { AUDIT_TOPIC.to_string() } else { self.shared.config.target_topic(self.alias, &t.name) };
        let source_partitions = t.partitions.len() as i32;
        let mut configs: BTreeMap<String, String> = self
            .admin
            .describe_configs(&t.name)
            .await?
            .into_iter()
            .filter(|c| !c.is_default)
            .filter_map(|c| c.value.map(|v| (c.name, v)))
            .collect();
        // Copies keep their timestamps, which the source checked when it took them: a
        // target refusing one (its default allows an hour ahead; a Kafka source before
        // 4.0 allowed any) would stop this source's copying for good, retried forever.
        // So the target topic takes any, unless the source topic sets a limit itself.
        let lifted: Vec<&str> = TIMESTAMP_LIMITS.into_iter().filter(|key| !configs.contains_key(*key)).collect();
        configs.extend(lifted.iter().map(|key| (key.to_string(), i64::MAX.to_string())));
        let mut target_partitions = match self.shared.target.ensure(&target, source_partitions, configs.clone()).await {
            // A target before KIP-937 (Kafka 3.5 and older) knows no such keys, nor limits.
            Err(Error::Client(e)) if e.code() == Some(ResponseError::InvalidConfig) && !lifted.is_empty() => {
                tracing::debug!(topic = target, error = %e, "target refused the timestamp limits; creating it without");
                configs.retain(|key, _| !lifted.contains(&key.as_str()));
                self.shared.target.ensure(&target, source_partitions, configs).await?
            }
            ensured => ensured?,
        };
        // Audit records need no order: `_audit` of any size takes them by key.
        if target_partitions < source_partitions && !self.shared.config.repartition_by_key && !audit_feed {
            // Typically the source grew (CreatePartitions) while the mirror was stopped.
            // The target grows to match, as it does while running and as MirrorMaker 2
            // does: each source partition keeps its number, old keys stay where they are.
            // Unsafe only when records were spread over the target by key hash before
            // (an earlier run with --repartition-by-key, seen as committed positions on
            // source partitions the target lacks): growing it would move those keys.
            let committed = self.groups.committed_offsets(&self.shared.config.group).await?;
            if committed.keys().any(|tp| tp.topic == t.name && tp.partition >= target_partitions) {
                return Err(Error::FewerTargetPartitions {
                    alias: self.alias.to_string(),
                    source_topic: t.name.clone(),
                    source_partitions,
                    target_topic: target,
                    target_partitions,
                });
            }
            tracing::info!(
                alias = self.alias,
                source_topic = t.name,
                source_partitions,
                target_topic = target,
                target_partitions,
                "target topic has fewer partitions than its source: growing it"
            );
            target_partitions = self.shared.target.grow(&target, source_partitions).await?;
        }
        Ok(Route { target, source_partitions, target_partitions })
    }

    /// Applies the group's assignment changes: new partitions resume at the committed
    /// offset, and a committed offset below the log start is a gap.
    async fn handle_rebalances(&mut self, consumer: &mut GroupConsumer) -> Result<()> {
        let events = std::mem::take(&mut *self.rebalances.lock().unwrap_or_else(|p| p.into_inner()));
        for event in events {
            match event {
                Rebalance::Revoked(partitions) => {
                    for tp in partitions {
                        self.held.remove(&tp);
                        self.next.remove(&tp);
                        self.acked.remove(&tp);
                        self.shared.stats.revoked(self.alias, &tp);
                    }
                }
                Rebalance::Assigned(partitions) => {
                    if partitions.is_empty() {
                        continue;
                    }
                    let mut committed = self.groups.committed_offsets(&self.shared.config.group).await?;
                    if let Some(target) = &self.target_groups {
                        // The target's positions are the ones that commit with the copies;
                        // the source group's (committed after them) serve where the target
                        // has none, e.g. the first exactly-once run after at-least-once ones.
                        let group = self.shared.config.target_group(self.alias);
                        committed.extend(target.stable_committed_offsets(&group, &partitions).await?);
                    }
                    let specs: Vec<(String, i32, OffsetSpec)> =
                        partitions.iter().map(|tp| (tp.topic.clone(), tp.partition, OffsetSpec::Earliest)).collect();
                    let starts = self.admin.list_offsets(&specs).await?;
                    for (tp, log_start) in partitions.into_iter().zip(starts) {
                        let target = self.routes.get(&tp.topic).map_or_else(String::new, |r| r.target.clone());
                        let position = match committed.get(&tp).copied() {
                            Some(c) if c < log_start => {
                                self.report_gap(&tp, c, log_start - 1).await;
                                log_start
                            }
                            Some(c) => c,
                            None => log_start,
                        };
                        if committed.contains_key(&tp) {
                            self.next.insert(tp.clone(), position);
                            if self.target_groups.is_some() {
                                consumer.seek(&tp, position)?;
                                self.moved.insert(tp.clone());
                            }
                        }
                        self.shared.stats.assigned(self.alias, &tp, &target, position);
                    }
                }
            }
        }
        Ok(())
    }

    async fn forward(&mut self, r: ConsumerRecord) -> Result<()> {
        let tp = TopicPartition::new(&*r.topic, r.partition);
        if let Some(&expected) = self.next.get(&tp) {
            if r.offset > expected {
                // Offsets jump at compacted or transaction-marker holes too; only data
                // below the log start is a loss.
                let log_start = self.admin.list_offsets(&[(tp.topic.clone(), tp.partition, OffsetSpec::Earliest)]).await?[0];
                if log_start > expected {
                    self.report_gap(&tp, expected, log_start.min(r.offset) - 1).await;
                }
            }
        }
        match self.next.get_mut(&tp) {
            Some(next) => *next = r.offset + 1,
            None => drop(self.next.insert(tp.clone(), r.offset + 1)),
        }
        if self.routes.get(&*r.topic).is_some_and(|route| r.partition >= route.source_partitions) {
            self.follow_growth(&r.topic, r.partition).await?;
        }
        let Some(route) = self.routes.get(&*r.topic) else {
            return Err(Error::InvalidConfig(format!("a record of {} arrived, which is not subscribed", r.topic)));
        };
        // The audit counts it by creation time once the target acknowledged it.
        let created = match self.audit_pending {
            Some(_) => created_ms(r.headers.iter().map(|(k, v)| (k.as_str(), v.as_deref())), r.timestamp),
            None => r.timestamp,
        };
        let partition = route.partition(r.partition, r.key.as_deref());
        let mut headers = r.headers;
        // The first mirror stamps the origin; a mirror of a mirror keeps it.
        if !headers.iter().any(|(k, _)| k == ORIGIN_HEADER) {
            headers.push((ORIGIN_HEADER.to_string(), Some(Bytes::copy_from_slice(self.alias.as_bytes()))));
        }
        let record = ProducerRecord {
            topic: route.target.clone(),
            partition: Some(partition),
            key: r.key,
            value: r.value,
            headers,
            timestamp: Some(r.timestamp),
        };
        self.begin()?;
        // Refused in an exactly-once transaction aborted for it: set aside this time
        // (without a dead-letter topic, sent again: the caller held its partition).
        let refusal = self.shared.config.dead_letter_topic.as_ref().and_then(|_| self.shared.refusal(self.alias, &tp, r.offset));
        match self.sent_next.get_mut(&tp) {
            Some(next) => *next = r.offset + 1,
            None => drop(self.sent_next.insert(tp.clone(), r.offset + 1)),
        }
        if let Some(refusal) = refusal {
            return self.set_aside(record, tp, r.offset, &refusal).await;
        }
        let kept = self.shared.config.dead_letter_topic.is_some().then(|| Box::new(record.clone()));
        match self.producer.send(record).await {
            Ok(delivery) => {
                let (topic, partition) = (r.topic.clone(), r.partition);
                let copy = Copy { topic, partition, offset: r.offset, created, dead_letter: false, record: kept };
                self.sent.push((copy, delivery));
            }
            // Refused before it was sent (larger than a request may be): the
            // transaction, if any, is unharmed.
            Err(error) if kept.is_some() && refused_for_itself(&error) => {
                self.set_aside(*kept.expect("checked"), tp, r.offset, &Refusal::from(&error)).await?;
            }
            Err(error) => {
                // Not sent: the position stays before it.
                self.sent_next.insert(tp.clone(), r.offset);
                let (topic, partition) = (r.topic.clone(), r.partition);
                let copy = Copy { topic, partition, offset: r.offset, created, dead_letter: false, record: None };
                return Err(self.refusal_error(&copy, error));
            }
        }
        Ok(())
    }

    /// Sends the dead letter of `copy`, which the target refused.
    async fn set_aside(&mut self, copy: ProducerRecord, source: TopicPartition, offset: i64, refusal: &Refusal) -> Result<()> {
        let topic = self.shared.config.dead_letter_topic.clone().expect("set aside only with a dead-letter topic");
        tracing::error!(
            source = %self.alias, topic = %source.topic, partition = source.partition, offset, target = %copy.topic, reason = %refusal.reason,
            "the target refused a record; writing it to the dead-letter topic {topic}"
        );
        let letter = dead_letter(&topic, copy, &source, offset, refusal);
        let delivery = self.producer.send(letter).await.map_err(|error| Error::NotAcknowledged { topic, error })?;
        let (topic, partition) = (Arc::from(source.topic.as_str()), source.partition);
        self.sent.push((Copy { topic, partition, offset, created: 0, dead_letter: true, record: None }, delivery));
        Ok(())
    }

    /// Waits for the target's answer to every copy sent since the last checkpoint: those
    /// it stored go to `stored`; those it did not come back, with why.
    async fn settle(&mut self) -> Vec<(Copy, fjord_client::Error)> {
        self.producer.flush().await;
        let mut failed = Vec::new();
        for (copy, delivery) in self.sent.drain(..) {
            match delivery.await {
                Ok(_) => self.stored.push(copy),
                Err(error) => failed.push((copy, error)),
            }
        }
        failed
    }

    /// Counts the copies the target stored (and empties `stored`), for the stats and the
    /// audit, leaving out those at or past `stop_at` of their partition (to be copied again).
    fn count(&mut self, stop_at: &HashMap<TopicPartition, i64>) {
        // Per record: no allocation once a topic is counted.
        fn add(counts: &mut BTreeMap<String, u64>, topic: &str) {
            match counts.get_mut(topic) {
                Some(n) => *n += 1,
                None => drop(counts.insert(topic.to_string(), 1)),
            }
        }
        let mut stored = std::mem::take(&mut self.stored);
        for copy in &stored {
            if !stop_at.is_empty() && stop_at.get(&copy.source()).is_some_and(|stop| copy.offset >= *stop) {
                continue;
            }
            if copy.dead_letter {
                add(&mut self.dead_counts, &copy.topic);
                continue;
            }
            add(&mut self.sent_counts, &copy.topic);
            if let Some(pending) = self.audit_pending.as_mut().filter(|_| &*copy.topic != AUDIT_TOPIC) {
                pending.record(&copy.topic, copy.created);
            }
        }
        stored.clear();
        self.stored = stored;
    }

    /// The error that stops this source for a copy the target did not take: a refusal of
    /// the record itself names it, since only the target (or a dead-letter topic) can
    /// get the source going again.
    fn refusal_error(&self, copy: &Copy, error: fjord_client::Error) -> Error {
        // Where it was sent: the dead-letter topic, or its source topic's target.
        let topic = match copy.dead_letter {
            true => self.shared.config.dead_letter_topic.clone().unwrap_or_default(),
            false => self.routes.get(&*copy.topic).map_or_else(String::new, |r| r.target.clone()),
        };
        if !refused_for_itself(&error) {
            return Error::NotAcknowledged { topic, error };
        }
        Error::Refused {
            alias: self.alias.to_string(),
            topic: copy.topic.to_string(),
            partition: copy.partition,
            offset: copy.offset,
            target: topic,
            error: Box::new(error),
        }
    }

    /// A record came from a partition the route was not built with: the source topic grew
    /// (CreatePartitions). A target that took each record to its source's partition grows
    /// to match, so that keeps holding for the new partitions; one spreading by key hash
    /// (fewer partitions, `--repartition-by-key`) keeps its count, so keys stay put.
    async fn follow_growth(&mut self, topic: &str, seen_partition: i32) -> Result<()> {
        let described = self.admin.describe_topic(topic).await?.partitions.len() as i32;
        // Metadata a moment behind the fetch still counts the partition the record came from.
        let source_partitions = described.max(seen_partition + 1);
        let Some(route) = self.routes.get_mut(topic) else { return Ok(()) };
        if route.target_partitions >= route.source_partitions {
            // The producer's metadata predates the growth: a send to a new partition
            // fetches it again (up to max.block.ms), as Kafka's producer does.
            route.target_partitions = self.shared.target.grow(&route.target, source_partitions).await?;
        }
        tracing::info!(alias = self.alias, topic, from = route.source_partitions, to = source_partitions, "source topic grew");
        route.source_partitions = source_partitions;
        Ok(())
    }

    /// With exactly once: opens a transaction unless one is open.
    fn begin(&mut self) -> Result<()> {
        if self.target_groups.is_some() && !self.txn_open {
            self.producer.begin_transaction()?;
            self.txn_open = true;
        }
        Ok(())
    }

    /// Flushes the target, checks every acknowledgement, then commits the source offsets
    /// (with exactly once: commits the transaction with them).
    async fn checkpoint(&mut self, consumer: &mut GroupConsumer) -> Result<()> {
        self.last_commit = Instant::now();
        if self.target_groups.is_some() {
            return self.commit_transaction(consumer).await;
        }
        if self.sent.is_empty() && !self.commit_failed {
            return Ok(());
        }
        let failed = self.settle().await;
        // The producer stored the rest of a refused record's batch in order: with a
        // dead-letter topic the refused ones go there before the positions past them
        // are committed.
        let mut failures = Vec::new();
        let mut set_aside = false;
        for (mut copy, error) in failed {
            match copy.record.take() {
                Some(record) if refused_for_itself(&error) => {
                    self.set_aside(*record, copy.source(), copy.offset, &Refusal::from(&error)).await?;
                    set_aside = true;
                }
                _ => failures.push((copy, error)),
            }
        }
        if set_aside {
            failures.extend(self.settle().await);
        }
        // What precedes a failure on its partition (all acknowledged) is committed, so
        // that a retry does not copy it again. A refused record (without a dead-letter
        // topic) then holds its partition; any other failure stops the source.
        let mut stop_at: HashMap<TopicPartition, i64> = HashMap::new();
        for (copy, _) in &failures {
            let stop = stop_at.entry(copy.source()).or_insert(copy.offset);
            *stop = (*stop).min(copy.offset);
        }
        for (tp, stop) in &stop_at {
            if let Some(next) = self.sent_next.get_mut(tp) {
                *next = (*next).min(*stop);
            }
        }
        self.count(&stop_at);
        self.record_acknowledged(consumer);
        // Exactly what the target acknowledged, which may be less than what was polled.
        let offsets: Vec<(TopicPartition, i64)> = self.acked.iter().map(|(tp, o)| (tp.clone(), *o)).collect();
        let stops = self.shared.config.dead_letter_topic.is_some() || failures.iter().any(|(_, e)| !refused_for_itself(e));
        if stops && !failures.is_empty() {
            let (copy, error) = failures.into_iter().min_by_key(|(copy, _)| copy.offset).expect("not empty");
            if let Err(e) = consumer.commit_offsets_sync(&offsets).await {
                tracing::warn!(source = %self.alias, error = %e, "offset commit before stopping failed");
            }
            return Err(self.refusal_error(&copy, error));
        }
        // Each held partition's first refused record.
        let mut refused: HashMap<TopicPartition, (i64, fjord_client::Error)> = HashMap::new();
        for (copy, error) in failures {
            if refused.get(&copy.source()).is_none_or(|(offset, _)| copy.offset < *offset) {
                refused.insert(copy.source(), (copy.offset, error));
            }
        }
        // A record sent again alone that the target took: its partition goes on.
        self.release_taken(consumer, &refused.keys().cloned().collect())?;
        for (tp, (offset, error)) in refused {
            self.hold(consumer, tp, offset, &error.to_string())?;
        }
        match consumer.commit_offsets_sync(&offsets).await {
            Ok(()) => {
                self.commit_failed = false;
                self.shared.stats.committed(self.alias);
            }
            // The group is rebalancing, or the coordinator is away: the commit is sent
            // again at the next checkpoint (even without new records); partitions that
            // move meanwhile are copied again from the previous commit (duplicates).
            Err(e) => {
                self.commit_failed = true;
                tracing::warn!(source = %self.alias, error = %e, "offset commit failed; retried at the next checkpoint");
            }
        }
        Ok(())
    }

    /// Takes in what the target acknowledged since the last checkpoint: the mirrored
    /// positions and counts for the stats, the audit's pending counts, and the next
    /// position of each partition this consumer still owns.
    fn record_acknowledged(&mut self, consumer: &GroupConsumer) {
        let owned: HashSet<TopicPartition> = consumer.assignment().into_iter().collect();
        for (tp, next) in self.sent_next.drain() {
            self.shared.stats.mirrored(self.alias, &tp, next);
            // A partition revoked meanwhile is its new owner's to commit.
            if owned.contains(&tp) {
                self.acked.insert(tp, next);
            }
        }
        self.shared.stats.acknowledged(self.alias, &std::mem::take(&mut self.sent_counts));
        self.shared.stats.dead_lettered(self.alias, &std::mem::take(&mut self.dead_counts));
        if let (Some(audit), Some(pending)) = (&self.shared.audit, self.audit_pending.as_mut()) {
            audit.commit(std::mem::replace(pending, audit.pending()));
        }
    }

    /// Commits the open transaction: the copies sent since the last one and the source
    /// positions after them, as the target group's offsets. On failure the transaction is
    /// aborted and the error ends the session, which starts again from the target's offsets.
    async fn commit_transaction(&mut self, consumer: &mut GroupConsumer) -> Result<()> {
        if !self.txn_open {
            return Ok(());
        }
        let committed = self.try_commit_transaction().await;
        self.txn_open = false;
        let refused = match committed {
            Ok(refused) => refused,
            Err(e) => {
                if let Err(abort) = self.producer.abort_transaction().await {
                    // The restarted session's InitProducerId aborts it, or its timeout does.
                    tracing::warn!(source = %self.alias, error = %abort, "aborting the mirror's transaction failed");
                }
                return Err(e);
            }
        };
        if !refused.is_empty() {
            // The transaction held only records sent again alone, refused again: aborted,
            // it changes nothing, and their partitions wait on.
            self.producer.abort_transaction().await?;
            self.sent_next.clear();
            for (tp, offset, reason) in refused {
                self.hold(consumer, tp, offset, &reason)?;
            }
            return Ok(());
        }
        self.release_taken(consumer, &HashSet::new())?;
        self.record_acknowledged(consumer);
        self.shared.stats.committed(self.alias);
        // The source group gets the same positions afterwards, only so that its lag reads
        // right on the source cluster: positions are read from the target.
        let offsets: Vec<(TopicPartition, i64)> = self.acked.iter().map(|(tp, o)| (tp.clone(), *o)).collect();
        if let Err(e) = consumer.commit_offsets_sync(&offsets).await {
            tracing::debug!(source = %self.alias, error = %e, "source group commit failed (informational only with exactly once)");
        }
        Ok(())
    }

    /// Commits the open transaction, or says which records it held that the target
    /// refused when it held nothing else (records sent again alone): the caller aborts
    /// it and holds their partitions.
    async fn try_commit_transaction(&mut self) -> Result<Vec<(TopicPartition, i64, String)>> {
        let failed = self.settle().await;
        let mut failure = None;
        let mut refused = Vec::new();
        for (copy, error) in failed {
            // Without a dead-letter topic, every copy (not a dead letter) is kept for it.
            let keepable = copy.record.is_some() || (self.shared.config.dead_letter_topic.is_none() && !copy.dead_letter);
            if keepable && refused_for_itself(&error) {
                // Set aside or held by the next session, in the transaction that commits.
                let key = (self.alias.to_string(), copy.source(), copy.offset);
                let refusal = Refusal::from(&error);
                refused.push((copy.source(), copy.offset, refusal.reason.clone()));
                self.shared.refused.lock().unwrap_or_else(|e| e.into_inner()).insert(key, refusal);
            } else if failure.is_none() {
                failure = Some(self.refusal_error(&copy, error));
            }
        }
        if !refused.is_empty() && failure.is_none() && self.stored.is_empty() && self.shared.config.dead_letter_topic.is_none() {
            return Ok(refused);
        }
        // The records after a refused one failed with it (the transaction could only
        // abort): the next session, started at once, copies them.
        if !refused.is_empty() {
            return Err(Error::RefusedInTransaction { alias: self.alias.to_string(), records: refused.len() });
        }
        if let Some(e) = failure {
            return Err(e);
        }
        let letters: Vec<(TopicPartition, i64)> =
            self.stored.iter().filter(|copy| copy.dead_letter).map(|copy| (copy.source(), copy.offset)).collect();
        self.count(&HashMap::new());
        let offsets: Vec<(TopicPartition, i64)> = self.sent_next.iter().map(|(tp, o)| (tp.clone(), *o)).collect();
        if !offsets.is_empty() {
            let group = self.shared.config.target_group(self.alias);
            self.producer.send_offsets_to_transaction(&offsets, &group).await?;
        }
        self.producer.commit_transaction().await?;
        // Their dead letters are committed: the positions are past them for good.
        self.shared.forget_refusals(self.alias, letters);
        Ok(Vec::new())
    }

    async fn report_gap(&mut self, tp: &TopicPartition, first: i64, last: i64) {
        let gap = Gap {
            source: self.alias.to_string(),
            topic: tp.topic.clone(),
            partition: tp.partition,
            first_offset: first,
            last_offset: last,
            records: last - first + 1,
            detected_ms: now_ms(),
        };
        tracing::error!(
            source = %gap.source, topic = %gap.topic, partition = gap.partition, first_offset = first, last_offset = last, records = gap.records,
            "LOSS: source retention deleted offsets {first}..={last} of {}-{} before they were mirrored", gap.topic, gap.partition
        );
        if let Err(e) = self.begin() {
            tracing::warn!(error = %e, "cannot open a transaction for the gap record; the gap is only logged");
        } else {
            self.record_gap(&gap).await;
        }
        self.shared.stats.gap(gap);
    }

    /// Writes the gap to the target's gap topic, next to `_audit`, so the loss is on
    /// record in the analytics cluster and not only in this process's log.
    async fn record_gap(&self, gap: &Gap) {
        let topic = NewTopic::new(GAPS_TOPIC, 1);
        match self.shared.target.admin.create_topics(&[topic]).await {
            Err(e) if e.code() != Some(ResponseError::TopicAlreadyExists) => {
                tracing::warn!(error = %e, "cannot create {GAPS_TOPIC}; the gap is only logged");
                return;
            }
            _ => {}
        }
        let value = serde_json::to_vec(gap).expect("a gap always serializes");
        let key = format!("{}/{}-{}", gap.source, gap.topic, gap.partition);
        let record = ProducerRecord::new(GAPS_TOPIC, value).key(key);
        match self.producer.send(record).await {
            Ok(delivery) => {
                if let Err(e) = delivery.await {
                    tracing::warn!(error = %e, "writing the gap to {GAPS_TOPIC} failed; the gap is only logged");
                }
            }
            Err(e) => tracing::warn!(error = %e, "writing the gap to {GAPS_TOPIC} failed; the gap is only logged"),
        }
    }
}

/// Reads the source's log end offsets of the owned partitions every `interval` (the lag),
/// and says whether the source answers, even while the copy loop waits on it.
async fn lag_loop(stats: Arc<Stats>, alias: String, client: ClientConfig, interval: Duration) {
    let mut admin = None;
    loop {
        tokio::time::sleep(interval).await;
        let owned = stats.owned(&alias);
        if owned.is_empty() {
            continue;
        }
        if admin.is_none() {
            match Admin::connect(client.clone()).await {
                Ok(a) => admin = Some(a),
                Err(e) => {
                    stats.failed(&alias, &e.to_string());
                    continue;
                }
            }
        }
        let specs: Vec<(String, i32, OffsetSpec)> =
            owned.iter().map(|tp| (tp.topic.clone(), tp.partition, OffsetSpec::Latest)).collect();
        match admin.as_ref().expect("connected above").list_offsets(&specs).await {
            Ok(ends) => {
                let ends: Vec<(TopicPartition, i64)> = owned.into_iter().zip(ends).collect();
                stats.log_ends(&alias, &ends);
                stats.up(&alias);
            }
            Err(e) => stats.failed(&alias, &e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_keep_their_partition_or_hash_when_the_target_is_smaller() {
        let same = Route { target: "t".into(), source_partitions: 8, target_partitions: 8 };
        let more = Route { target: "t".into(), source_partitions: 8, target_partitions: 12 };
        for p in 0..8 {
            assert_eq!(same.partition(p, Some(b"k")), p);
            assert_eq!(more.partition(p, None), p);
        }
        let fewer = Route { target: "t".into(), source_partitions: 8, target_partitions: 3 };
        let k = fjord_client::partitioner::partition_for_key(b"user-7", 3);
        assert_eq!(fewer.partition(5, Some(b"user-7")), k);
        assert_eq!(fewer.partition(1, Some(b"user-7")), k);
        assert_eq!(fewer.partition(5, None), 2);
    }
}
