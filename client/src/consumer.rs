//! The pull consumer: the application assigns partitions and owns its positions, as in
//! the paper; it fetches by (offset, max bytes) and can rewind at any time.
//!
//! One fetch per leader broker is in flight at a time, and the next one is sent as soon as
//! a response arrives, before its records are decoded (the fetch offsets come from the
//! batch headers): that is the prefetch buffer, bounded to one decoded response plus one
//! in flight per broker, and the broker sends the next response while this one decodes.
//! At the end of the log the broker holds the fetch for `fetch.max.wait.ms` (long poll),
//! so [`Consumer::recv`] waits for new records instead of ending or spinning.
//!
//! Cancel safety: [`Consumer::poll`] gives up at its timeout, and a caller may drop a
//! `recv` in a `select!`. So the network round trips run as tasks of their own (each fetch,
//! with its connect; the ListOffsets of a seek) that outlive an abandoned call, and every
//! change of the consumer's state happens without an await in between: a dropped call
//! leaves a fetch in flight (its response is taken by the next call), never a broker
//! marked busy with no fetch, nor a response half handled. Metadata refreshes run in the
//! background too.
//!
//! Positions: `position` is the next offset handed to the application; the fetch offset
//! runs ahead of it by what is buffered. A seek drops buffered and in-flight data for the
//! partition: each fetch carries the partition's epoch, drawn from one counter per
//! consumer, so no later seek or assignment can reuse an epoch a stale response carries.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use fjord_record::compression::records_body;
use fjord_record::{BatchHeader, Records, TimestampType, TopicPartition, BATCH_OVERHEAD};
use futures::Stream;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{BrokerId, FetchRequest, FetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use tokio::task::{JoinHandle, JoinSet};

use crate::admin::{list_offsets_at, OffsetSpec};
use crate::audit::AuditHook;
use crate::cluster::{ClientConfig, Cluster};
use crate::error::{Error, ResponseError, Result};

/// Highest Fetch version used: v12 is flexible; v13 switches to topic ids.
const FETCH_VERSION: i16 = 12;

/// What to do when there is no valid position (`auto.offset.reset`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetReset {
    /// Start at the log start offset.
    Earliest,
    /// Start at the end (only new records).
    Latest,
    /// Fail with [`Error::OffsetOutOfRange`].
    None,
}

/// Where to move a partition's position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeekTo {
    /// The log start offset.
    Beginning,
    /// The log end offset (the next record produced).
    End,
    /// An absolute offset.
    Offset(i64),
    /// The first record whose timestamp is at or after this (ms since the epoch);
    /// the end of the log if there is none.
    Timestamp(i64),
}

/// `isolation.level`: what a consumer reads of transactional producers' records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IsolationLevel {
    /// `read_uncommitted` (the default): everything, aborted transactions included.
    #[default]
    ReadUncommitted = 0,
    /// `read_committed`: up to the last stable offset only, without the records of aborted
    /// transactions.
    ReadCommitted = 1,
}

impl std::str::FromStr for IsolationLevel {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "read_uncommitted" => Ok(Self::ReadUncommitted),
            "read_committed" => Ok(Self::ReadCommitted),
            other => {
                Err(Error::InvalidConfig(format!("isolation.level must be read_uncommitted or read_committed, not {other:?}")))
            }
        }
    }
}

/// Consumer settings (Kafka's names in the comments).
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// Connection and metadata settings.
    pub client: ClientConfig,
    /// `fetch.min.bytes`: the broker answers once it has this much (or max wait passed).
    pub fetch_min_bytes: i32,
    /// `fetch.max.wait.ms`: how long the broker may hold a fetch at the end of the log.
    pub fetch_max_wait: Duration,
    /// `fetch.max.bytes`: bound on one fetch response.
    pub fetch_max_bytes: i32,
    /// `max.partition.fetch.bytes`: bound per partition in one fetch.
    pub max_partition_fetch_bytes: i32,
    /// `auto.offset.reset`.
    pub auto_offset_reset: OffsetReset,
    /// Opt-in audit: told about every record `poll`/`recv` returns (see [`crate::audit`]).
    pub audit: Option<Arc<dyn AuditHook>>,
    /// `isolation.level`.
    pub isolation_level: IsolationLevel,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        Self {
            client: ClientConfig::default(),
            fetch_min_bytes: 1,
            fetch_max_wait: Duration::from_millis(500),
            fetch_max_bytes: 50 * 1024 * 1024,
            max_partition_fetch_bytes: 1024 * 1024,
            auto_offset_reset: OffsetReset::Latest,
            audit: None,
            isolation_level: IsolationLevel::ReadUncommitted,
        }
    }
}

/// A record as consumed. Key, value and header values share the fetch response's memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerRecord {
    /// Topic.
    pub topic: Arc<str>,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Timestamp, ms since the epoch.
    pub timestamp: i64,
    /// Whether the producer or the broker set the timestamp.
    pub timestamp_type: TimestampType,
    /// Key, `None` when null.
    pub key: Option<Bytes>,
    /// Value, `None` when null.
    pub value: Option<Bytes>,
    /// Headers in order.
    pub headers: Vec<(String, Option<Bytes>)>,
}

struct PartitionState {
    /// Next offset handed to the application; `None` until a pending seek resolves.
    position: Option<i64>,
    /// Next offset to fetch.
    fetch_offset: i64,
    /// A seek to resolve with ListOffsets before fetching.
    pending: Option<SeekTo>,
    /// Replaced (from [`Consumer::epochs`]) by every seek and reset: responses to older
    /// fetches are dropped.
    epoch: u64,
    high_watermark: i64,
    /// When a retriable error last hit this partition (fetches pause for a backoff).
    backoff_until: Option<Instant>,
    /// Not fetched until resumed ([`Consumer::pause`]).
    paused: bool,
}

/// (topic, partition, seek epoch, fetch offset) of one partition in a fetch.
type FetchTarget = (Arc<str>, i32, u64, i64);

struct FetchDone {
    broker: i32,
    /// (topic, partition, epoch) as sent.
    sent: Vec<(Arc<str>, i32, u64)>,
    result: Result<FetchResponse>,
}

/// One partition's records from a fetch response, not decoded yet.
struct Fetched {
    key: (Arc<str>, i32),
    /// The partition's epoch when the response arrived.
    epoch: u64,
    /// The fetch offset the records were asked from.
    from: i64,
    records: Bytes,
    /// (producer id, first offset) of the aborted transactions in range (read_committed).
    aborted: Vec<(i64, i64)>,
}

/// The ListOffsets task resolving pending seeks: (partition, epoch) in the order asked.
struct Resolving {
    task: JoinHandle<Result<Vec<i64>>>,
    partitions: Vec<((Arc<str>, i32), u64)>,
}

/// A consumer of explicitly assigned partitions.
pub struct Consumer {
    cluster: Arc<Cluster>,
    config: ConsumerConfig,
    partitions: BTreeMap<(Arc<str>, i32), PartitionState>,
    buffer: VecDeque<ConsumerRecord>,
    /// Fetch tasks (aborted when the consumer is dropped).
    in_flight: JoinSet<FetchDone>,
    busy_brokers: HashSet<i32>,
    resolving: Option<Resolving>,
    /// A metadata refresh running in the background.
    refreshing: Option<JoinHandle<()>>,
    /// The last epoch handed to a partition.
    epochs: u64,
}

impl Consumer {
    /// Connects to the cluster. A consumer never auto-creates topics: reading a topic
    /// that does not exist is an error ([`Error::UnknownTopic`]), not a new empty topic.
    pub async fn connect(config: ConsumerConfig) -> Result<Self> {
        let cluster = Cluster::connect(ClientConfig { allow_auto_create_topics: false, ..config.client.clone() }).await?;
        if let Some(audit) = &config.audit {
            audit.consumer_isolation(config.isolation_level);
        }
        Ok(Self {
            cluster,
            config,
            partitions: BTreeMap::new(),
            buffer: VecDeque::new(),
            in_flight: JoinSet::new(),
            busy_brokers: HashSet::new(),
            resolving: None,
            refreshing: None,
            epochs: 0,
        })
    }

    fn next_epoch(&mut self) -> u64 {
        self.epochs += 1;
        self.epochs
    }

    /// Replaces the assignment. Each partition starts per `auto.offset.reset` unless
    /// [`Consumer::seek`] says otherwise.
    pub async fn assign(&mut self, partitions: impl IntoIterator<Item = TopicPartition>) -> Result<()> {
        let mut next = BTreeMap::new();
        for tp in partitions {
            let topic = self.cluster.topic(&tp.topic).await?;
            if tp.partition < 0 || tp.partition as usize >= topic.partitions.len() {
                return Err(Error::UnknownPartition { topic: tp.topic, partition: tp.partition });
            }
            let topic: Arc<str> = tp.topic.into();
            let reset = match self.config.auto_offset_reset {
                OffsetReset::Earliest => Some(SeekTo::Beginning),
                OffsetReset::Latest => Some(SeekTo::End),
                OffsetReset::None => None,
            };
            let epoch = self.next_epoch();
            next.insert(
                (topic, tp.partition),
                PartitionState {
                    position: None,
                    fetch_offset: 0,
                    pending: reset,
                    epoch,
                    high_watermark: -1,
                    backoff_until: None,
                    paused: false,
                },
            );
        }
        self.partitions = next;
        self.buffer.clear();
        // Responses to fetches for the old assignment are dropped on arrival: their
        // partitions are unknown or carry an older epoch.
        Ok(())
    }

    /// Assigns every partition of `topic`.
    pub async fn assign_topic(&mut self, topic: &str) -> Result<()> {
        let t = self.cluster.topic(topic).await?;
        self.assign(t.partitions.iter().map(|p| TopicPartition::new(topic, p.partition))).await
    }

    /// The assigned partitions.
    pub fn assignment(&self) -> Vec<TopicPartition> {
        self.partitions.keys().map(|(t, p)| TopicPartition::new(&**t, *p)).collect()
    }

    /// Moves the position of an assigned partition; takes effect at the next poll.
    pub fn seek(&mut self, tp: &TopicPartition, to: SeekTo) -> Result<()> {
        let key = (Arc::from(tp.topic.as_str()), tp.partition);
        if !self.partitions.contains_key(&key) {
            return Err(Error::NotAssigned(tp.to_string()));
        }
        let epoch = self.next_epoch();
        let state = self.partitions.get_mut(&key).expect("checked above");
        state.epoch = epoch;
        match to {
            SeekTo::Offset(offset) => {
                state.position = Some(offset);
                state.fetch_offset = offset;
                state.pending = None;
            }
            other => {
                state.position = None;
                state.pending = Some(other);
            }
        }
        self.buffer.retain(|r| !(*r.topic == *tp.topic && r.partition == tp.partition));
        Ok(())
    }

    /// Stops fetching an assigned partition until [`Consumer::resume`], as Kafka's
    /// `pause`: its position stays; records of it fetched but not handed out yet are
    /// dropped and fetched again once it is resumed. A new assignment resumes it.
    pub fn pause(&mut self, tp: &TopicPartition) -> Result<()> {
        let key = (Arc::from(tp.topic.as_str()), tp.partition);
        let epoch = self.next_epoch();
        let state = self.partitions.get_mut(&key).ok_or_else(|| Error::NotAssigned(tp.to_string()))?;
        if state.paused {
            return Ok(());
        }
        state.paused = true;
        // Responses to fetches in flight are dropped on arrival.
        state.epoch = epoch;
        if let Some(position) = state.position {
            state.fetch_offset = position;
        }
        self.buffer.retain(|r| !(*r.topic == *tp.topic && r.partition == tp.partition));
        Ok(())
    }

    /// Fetches a partition stopped by [`Consumer::pause`] again, from its position.
    pub fn resume(&mut self, tp: &TopicPartition) -> Result<()> {
        let state = self
            .partitions
            .get_mut(&(Arc::from(tp.topic.as_str()), tp.partition))
            .ok_or_else(|| Error::NotAssigned(tp.to_string()))?;
        state.paused = false;
        Ok(())
    }

    /// The offset of the next record [`Consumer::recv`]/[`Consumer::poll`] will return
    /// for the partition (resolving a pending seek first).
    ///
    /// Once every record fetched for the partition was handed out, that is the fetch
    /// offset, as Kafka's consumer reports it: a read_committed fetch passes transaction
    /// markers and aborted batches that no record shows, and the position moves past them
    /// (so a reader can tell it reached the high watermark, and a commit leaves no lag).
    pub async fn position(&mut self, tp: &TopicPartition) -> Result<i64> {
        self.resolve_pending().await?;
        let state = self
            .partitions
            .get(&(Arc::from(tp.topic.as_str()), tp.partition))
            .ok_or_else(|| Error::NotAssigned(tp.to_string()))?;
        let position = state.position.ok_or_else(|| Error::OffsetOutOfRange { partition: tp.to_string(), offset: -1 })?;
        let buffered = self.buffer.iter().any(|r| *r.topic == *tp.topic && r.partition == tp.partition);
        Ok(if buffered { position } else { position.max(state.fetch_offset) })
    }

    /// The high watermark the last fetch reported for the partition (-1 before any).
    pub fn high_watermark(&self, tp: &TopicPartition) -> Option<i64> {
        self.partitions.get(&(Arc::from(tp.topic.as_str()), tp.partition)).map(|s| s.high_watermark)
    }

    /// Returns the records available now, waiting up to `timeout` for some to arrive.
    /// An empty vector means none came in time. Cancel-safe: a timeout (or dropping the
    /// call) loses no record; what is in flight is picked up by the next call.
    pub async fn poll(&mut self, timeout: Duration) -> Result<Vec<ConsumerRecord>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if !self.buffer.is_empty() {
                let records: Vec<ConsumerRecord> = self.buffer.drain(..).collect();
                // The buffer holds runs of one partition's records: one position a run.
                for run in records.chunk_by(|a, b| a.partition == b.partition && a.topic == b.topic) {
                    self.advance(run.last().expect("runs are not empty"));
                }
                if let Some(audit) = &self.config.audit {
                    audit.consumed(&records);
                }
                return Ok(records);
            }
            match tokio::time::timeout_at(deadline, self.fill()).await {
                Ok(result) => result?,
                Err(_) => return Ok(Vec::new()),
            }
        }
    }

    /// The next record; at the end of the log, waits for one to be produced. Cancel-safe,
    /// as [`Consumer::poll`].
    pub async fn recv(&mut self) -> Result<ConsumerRecord> {
        loop {
            if let Some(r) = self.buffer.pop_front() {
                self.advance(&r);
                if let Some(audit) = &self.config.audit {
                    audit.consumed(std::slice::from_ref(&r));
                }
                return Ok(r);
            }
            self.fill().await?;
        }
    }

    /// The records as an endless stream (it waits at the end of the log).
    pub fn stream(&mut self) -> impl Stream<Item = Result<ConsumerRecord>> + '_ {
        futures::stream::unfold(self, |c| async move {
            let r = c.recv().await;
            Some((r, c))
        })
    }

    fn advance(&mut self, r: &ConsumerRecord) {
        // Keyed by Arc<str>; lookup by value compares the strings.
        if let Some(s) = self.partitions.get_mut(&(r.topic.clone(), r.partition)) {
            s.position = Some(r.offset + 1);
        }
    }

    /// Sends fetches where none is in flight and waits for one response to decode into
    /// the buffer (possibly an empty one after a long poll).
    async fn fill(&mut self) -> Result<()> {
        if self.partitions.is_empty() {
            return Err(Error::InvalidConfig("no partitions assigned".into()));
        }
        self.resolve_pending().await?;
        self.send_fetches();
        let done = match self.in_flight.join_next().await {
            Some(Ok(done)) => done,
            Some(Err(e)) => match e.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                Err(e) => unreachable!("fetch tasks are aborted only with the consumer: {e}"),
            },
            None => {
                // Every partition is backing off or leaderless: wait a bit and try again.
                tokio::time::sleep(self.cluster.config().retry_backoff).await;
                return Ok(());
            }
        };
        self.busy_brokers.remove(&done.broker);
        let mut fetched = Vec::new();
        let handled = self.handle_fetch(done, &mut fetched);
        // Prefetch: the next fetch goes out before these records are even decoded, so
        // the broker sends (and the kernel receives) it while this thread decodes.
        self.send_fetches();
        // Records taken before an error are decoded too: their fetch offsets have moved.
        let mut first_error = handled.err();
        for f in fetched {
            if let Err(e) = self.decode(f) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Decodes a partition's fetched records into the buffer. A batch that does not
    /// decode (a damaged one slipped past the broker) ends it: the records before it are
    /// buffered, and the partition fetches that batch again (its fetch in flight, which
    /// asked past it, is dropped with a new epoch), so the error comes back at the same
    /// offset until the application seeks past it.
    fn decode(&mut self, f: Fetched) -> Result<()> {
        let Some(state) = self.partitions.get_mut(&f.key).filter(|s| s.epoch == f.epoch) else {
            return Ok(()); // a seek since the response arrived dropped it
        };
        let decoded = decode_records(&f.key.0, f.key.1, f.from, f.records, &f.aborted, &mut self.buffer);
        match decoded.error {
            None => Ok(()),
            Some(e) => {
                self.epochs += 1;
                state.epoch = self.epochs;
                state.fetch_offset = decoded.next;
                Err(e)
            }
        }
    }

    /// Starts a metadata refresh in the background unless one is running.
    fn refresh_in_background(&mut self) {
        if self.refreshing.as_ref().is_none_or(JoinHandle::is_finished) {
            let cluster = self.cluster.clone();
            self.refreshing = Some(tokio::spawn(async move {
                if let Err(e) = cluster.refresh(None).await {
                    tracing::debug!(error = %e, "consumer metadata refresh failed");
                }
            }));
        }
    }

    /// Resolves seeks to beginning/end/timestamp (and the initial reset) with ListOffsets,
    /// in a task: a call abandoned while it runs finds its answer on the next call.
    async fn resolve_pending(&mut self) -> Result<()> {
        loop {
            if self.resolving.is_none() {
                let partitions: Vec<((Arc<str>, i32), u64)> =
                    self.partitions.iter().filter(|(_, s)| s.pending.is_some()).map(|(k, s)| (k.clone(), s.epoch)).collect();
                if partitions.is_empty() {
                    break;
                }
                let specs: Vec<(String, i32, OffsetSpec)> = partitions
                    .iter()
                    .map(|(key, _)| {
                        let spec = match self.partitions[key].pending.expect("filtered above") {
                            SeekTo::Beginning => OffsetSpec::Earliest,
                            SeekTo::End | SeekTo::Offset(_) => OffsetSpec::Latest,
                            SeekTo::Timestamp(ts) => OffsetSpec::Timestamp(ts),
                        };
                        (key.0.to_string(), key.1, spec)
                    })
                    .collect();
                let cluster = self.cluster.clone();
                let isolation = self.config.isolation_level;
                let task = tokio::spawn(async move { list_offsets_at(&cluster, &specs, isolation).await });
                self.resolving = Some(Resolving { task, partitions });
            }
            let resolving = self.resolving.as_mut().expect("set above");
            let outcome = (&mut resolving.task).await;
            let partitions = self.resolving.take().expect("set above").partitions;
            let offsets = match outcome {
                Ok(offsets) => offsets?,
                Err(e) => std::panic::resume_unwind(e.into_panic()),
            };
            for ((key, epoch), offset) in partitions.into_iter().zip(offsets) {
                // A seek or assignment since the lookup started has its own.
                if let Some(state) = self.partitions.get_mut(&key).filter(|s| s.epoch == epoch && s.pending.is_some()) {
                    state.pending = None;
                    state.position = Some(offset);
                    state.fetch_offset = offset;
                }
            }
        }
        if let Some(((t, p), _)) = self.partitions.iter().find(|(_, s)| s.position.is_none()) {
            // auto.offset.reset=none and no seek: there is no position to fetch from.
            return Err(Error::OffsetOutOfRange { partition: format!("{t}-{p}"), offset: -1 });
        }
        Ok(())
    }

    /// Starts a fetch task for every leader that has none in flight. Synchronous, so the
    /// busy mark and the task come into being together.
    fn send_fetches(&mut self) {
        let now = Instant::now();
        let metadata = self.cluster.metadata();
        let mut refresh = self.cluster.metadata_is_stale();
        let mut per_broker: HashMap<i32, Vec<FetchTarget>> = HashMap::new();
        for ((topic, partition), s) in &self.partitions {
            if s.paused || s.pending.is_some() || s.backoff_until.is_some_and(|t| t > now) {
                continue;
            }
            let leader =
                metadata.topics.get(&**topic).and_then(|t| t.partitions.get(*partition as usize)).map_or(-1, |p| p.leader);
            if leader < 0 {
                refresh = true;
                continue;
            }
            if !self.busy_brokers.contains(&leader) {
                per_broker.entry(leader).or_default().push((topic.clone(), *partition, s.epoch, s.fetch_offset));
            }
        }
        if refresh {
            self.refresh_in_background();
        }
        for (broker, partitions) in per_broker {
            self.busy_brokers.insert(broker);
            let request = self.fetch_request(&partitions);
            let sent: Vec<(Arc<str>, i32, u64)> = partitions.into_iter().map(|(t, p, e, _)| (t, p, e)).collect();
            let cluster = self.cluster.clone();
            self.in_flight.spawn(async move {
                let result = async {
                    let conn = cluster.broker(broker).await?;
                    let version = conn.version::<FetchRequest>(FETCH_VERSION)?;
                    conn.send(&request, version).await?.await
                }
                .await;
                FetchDone { broker, sent, result }
            });
        }
    }

    fn fetch_request(&self, partitions: &[FetchTarget]) -> FetchRequest {
        let mut topics: Vec<FetchTopic> = Vec::new();
        for (topic, partition, _, offset) in partitions {
            let p = FetchPartition::default()
                .with_partition(*partition)
                .with_fetch_offset(*offset)
                .with_partition_max_bytes(self.config.max_partition_fetch_bytes)
                .with_current_leader_epoch(-1)
                .with_log_start_offset(-1);
            match topics.iter_mut().find(|t| *t.topic.0 == **topic) {
                Some(t) => t.partitions.push(p),
                None => topics.push(
                    FetchTopic::default()
                        .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
                        .with_partitions(vec![p]),
                ),
            }
        }
        FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(self.config.fetch_max_wait.as_millis() as i32)
            .with_min_bytes(self.config.fetch_min_bytes)
            .with_max_bytes(self.config.fetch_max_bytes)
            .with_session_epoch(-1)
            .with_isolation_level(self.config.isolation_level as i8)
            .with_topics(topics)
    }

    /// Takes a fetch response: errors into backoffs, resets or the returned error, and
    /// each partition's records, still encoded, into `fetched`, with its fetch offset
    /// moved past their last whole batch (so the next fetch can go out before they are
    /// decoded). On an error, `fetched` holds the partitions taken before it, which the
    /// caller must still decode; the partitions after it are fetched again. Synchronous,
    /// so a response is never half handled.
    fn handle_fetch(&mut self, done: FetchDone, fetched: &mut Vec<Fetched>) -> Result<()> {
        let response = match done.result {
            Ok(r) => r,
            Err(e) if e.is_retriable() => {
                self.back_off(&done.sent);
                self.refresh_in_background();
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        if let Some(e) = Error::kafka(response.error_code, "fetch", None) {
            if e.is_retriable() {
                self.back_off(&done.sent);
                return Ok(());
            }
            return Err(e);
        }
        let mut refresh = false;
        for topic in response.responses {
            let name: Arc<str> = Arc::from(topic.topic.0.as_str());
            for p in topic.partitions {
                let key = (name.clone(), p.partition_index);
                let sent_epoch = done.sent.iter().find(|(t, part, _)| **t == *name && *part == p.partition_index).map(|s| s.2);
                let Some(state) = self.partitions.get_mut(&key) else { continue };
                if sent_epoch != Some(state.epoch) {
                    continue; // a seek happened while this was in flight
                }
                let context = || format!("fetch from {name}-{}", p.partition_index);
                match ResponseError::try_from_code(p.error_code) {
                    None => {}
                    Some(ResponseError::OffsetOutOfRange) => {
                        self.epochs += 1;
                        state.epoch = self.epochs;
                        match self.config.auto_offset_reset {
                            OffsetReset::Earliest => state.pending = Some(SeekTo::Beginning),
                            OffsetReset::Latest => state.pending = Some(SeekTo::End),
                            OffsetReset::None => {
                                return Err(Error::OffsetOutOfRange {
                                    partition: format!("{name}-{}", p.partition_index),
                                    offset: state.fetch_offset,
                                })
                            }
                        }
                        state.position = None;
                        continue;
                    }
                    Some(code) => {
                        let e = Error::kafka(code.code(), context(), None).expect("non-zero code");
                        if e.is_retriable() {
                            refresh |= e.needs_metadata_refresh();
                            state.backoff_until = Some(Instant::now() + self.cluster.config().retry_backoff);
                            continue;
                        }
                        return Err(e);
                    }
                }
                state.backoff_until = None;
                state.high_watermark = p.high_watermark;
                if let Some(records) = p.records {
                    let aborted: Vec<(i64, i64)> =
                        p.aborted_transactions.iter().flatten().map(|a| (a.producer_id.0, a.first_offset)).collect();
                    let from = state.fetch_offset;
                    state.fetch_offset = whole_batches_end(&records, from);
                    fetched.push(Fetched { key, epoch: state.epoch, from, records, aborted });
                }
            }
        }
        if refresh {
            self.refresh_in_background();
        }
        Ok(())
    }

    fn back_off(&mut self, sent: &[(Arc<str>, i32, u64)]) {
        let until = Instant::now() + self.cluster.config().retry_backoff;
        for (t, p, _) in sent {
            if let Some(s) = self.partitions.get_mut(&(t.clone(), *p)) {
                s.backoff_until = Some(until);
            }
        }
    }
}

/// What [`decode_records`] got through.
pub(crate) struct Decoded {
    /// The next offset to fetch: past the last whole batch, or, after an error, the
    /// offset of the batch that failed.
    pub(crate) next: i64,
    /// Why decoding stopped before the end, if it did.
    pub(crate) error: Option<Error>,
}

/// Where the whole batches of a fetched partition end: the offset after the last one
/// (`fetch_offset` when there is none). Reads batch headers only, so the next fetch can
/// go out before the records are checked and decoded; [`decode_records`] agrees unless a
/// batch fails to decode, and then says where it stopped.
fn whole_batches_end(records: &[u8], fetch_offset: i64) -> i64 {
    let mut next = fetch_offset;
    let mut rest = records;
    while rest.len() >= BATCH_OVERHEAD {
        let Ok(header) = BatchHeader::parse_unchecked(rest) else { break };
        let size = header.size();
        if size > rest.len() {
            break;
        }
        next = next.max(header.next_offset());
        rest = &rest[size..];
    }
    next
}

/// Decodes the complete batches in `records` into `out`, skipping records before
/// `fetch_offset` (a fetch may start inside a batch), control batches and the batches of
/// aborted transactions. A partial batch at the end (the broker cut at max bytes) is left
/// for the next fetch. A batch that fails (CRC, compression, a malformed record) stops
/// the decoding: `out` keeps the records of the batches before it, none of its own.
///
/// `aborted` is the read_committed answer's aborted transactions, (producer id, first
/// offset): from its first offset on, a producer's transactional batches are skipped
/// until its ABORT marker (Kafka's consumer does the same).
pub(crate) fn decode_records(
    topic: &Arc<str>,
    partition: i32,
    fetch_offset: i64,
    records: Bytes,
    aborted: &[(i64, i64)],
    out: &mut VecDeque<ConsumerRecord>,
) -> Decoded {
    let mut pending_aborts: Vec<(i64, i64)> = aborted.to_vec();
    pending_aborts.sort_by_key(|a| std::cmp::Reverse(a.1));
    let mut aborting: std::collections::HashSet<i64> = std::collections::HashSet::new();
    let mut next = fetch_offset;
    let mut at = 0;
    while records.len() - at >= BATCH_OVERHEAD {
        let rest = &records[at..];
        let size = match BatchHeader::parse_unchecked(rest) {
            Ok(header) => header.size(),
            Err(e) => return Decoded { next, error: Some(e.into()) },
        };
        if size > rest.len() {
            break;
        }
        let header = match BatchHeader::parse(rest) {
            Ok(header) => header,
            Err(e) => return Decoded { next, error: Some(e.into()) },
        };
        let batch = records.slice(at..at + size);
        at += size;
        if header.next_offset() <= next {
            continue;
        }
        while pending_aborts.last().is_some_and(|a| a.1 <= header.last_offset()) {
            let (producer, _) = pending_aborts.pop().expect("checked above");
            aborting.insert(producer);
        }
        let skipped = header.is_transactional() && aborting.contains(&header.producer_id);
        if header.is_control() {
            // An ABORT marker (or COMMIT) ends the producer's transaction.
            if header.is_transactional() {
                aborting.remove(&header.producer_id);
            }
        } else if !skipped {
            let before = out.len();
            if let Err(e) = decode_batch(topic, partition, next, &header, &batch, out) {
                out.truncate(before);
                return Decoded { next, error: Some(e) };
            }
        }
        next = header.next_offset();
    }
    Decoded { next, error: None }
}

/// Appends a checked data batch's records from offset `from` on to `out`.
fn decode_batch(
    topic: &Arc<str>,
    partition: i32,
    from: i64,
    header: &BatchHeader,
    batch: &Bytes,
    out: &mut VecDeque<ConsumerRecord>,
) -> Result<()> {
    let body = match records_body(header, batch, crate::MAX_DECOMPRESSED_BATCH)? {
        std::borrow::Cow::Borrowed(_) => batch.slice(BATCH_OVERHEAD..),
        std::borrow::Cow::Owned(v) => Bytes::from(v),
    };
    let log_append = header.timestamp_type() == TimestampType::LogAppendTime;
    for record in Records::new(&body, BATCH_OVERHEAD) {
        let r = record?;
        // Saturating, as the header's offsets: the base offset is the broker's word.
        let offset = header.base_offset.saturating_add(i64::from(r.offset_delta));
        if offset < from {
            continue;
        }
        out.push_back(ConsumerRecord {
            topic: topic.clone(),
            partition,
            offset,
            timestamp: if log_append { header.max_timestamp } else { header.base_timestamp + r.timestamp_delta },
            timestamp_type: header.timestamp_type(),
            key: r.key.map(|k| body.slice_ref(k)),
            value: r.value.map(|v| body.slice_ref(v)),
            headers: r
                .headers
                .iter()
                .map(|h| (String::from_utf8_lossy(h.key).into_owned(), h.value.map(|v| body.slice_ref(v))))
                .collect(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use fjord_record::batch::set_base_offset;
    use fjord_record::{BatchBuilder, Compression};

    fn batch(base: i64, n: usize, codec: Compression) -> Vec<u8> {
        let mut b = BatchBuilder::new(1_000);
        for i in 0..n {
            let v = format!("v{}", base + i as i64);
            b.append(1_000 + i as i64, (i % 2 == 0).then_some(&b"k"[..]), Some(v.as_bytes()), &[("h", None)]);
        }
        let mut bytes = b.build_compressed(codec).unwrap().to_vec();
        set_base_offset(&mut bytes, base);
        bytes
    }

    #[test]
    fn decodes_batches_skips_before_fetch_offset_and_leaves_a_partial_tail() {
        for codec in [Compression::None, Compression::Lz4] {
            let mut data = batch(10, 5, codec);
            data.extend(batch(15, 5, codec));
            let partial = batch(20, 5, codec);
            data.extend_from_slice(&partial[..partial.len() - 3]);
            let topic: Arc<str> = "t".into();
            let mut out = VecDeque::new();
            assert_eq!(whole_batches_end(&data, 12), 20);
            let decoded = decode_records(&topic, 0, 12, Bytes::from(data), &[], &mut out);
            assert!(decoded.error.is_none());
            assert_eq!(decoded.next, 20);
            let offsets: Vec<i64> = out.iter().map(|r| r.offset).collect();
            assert_eq!(offsets, (12..20).collect::<Vec<_>>());
            assert_eq!(out[0].value.as_deref(), Some(&b"v12"[..]));
            assert_eq!(out[0].timestamp, 1_002);
            assert_eq!(out[0].key.as_deref(), Some(&b"k"[..]));
            assert_eq!(out[1].key, None);
            assert_eq!(out[0].headers, vec![("h".to_string(), None)]);
        }
    }

    fn txn_batch(producer_id: i64, base: i64, n: usize) -> Vec<u8> {
        let mut b = BatchBuilder::new(1_000).producer(producer_id, 0, base as i32).transactional();
        for i in 0..n {
            b.append(1_000, None, Some(format!("p{producer_id}-{}", base + i as i64).as_bytes()), &[]);
        }
        let mut bytes = b.build_vec();
        set_base_offset(&mut bytes, base);
        bytes
    }

    fn marker(producer_id: i64, offset: i64, commit: bool) -> Vec<u8> {
        let mut bytes = fjord_record::control::end_txn_marker(producer_id, 0, 0, commit, 1_000);
        set_base_offset(&mut bytes, offset);
        bytes
    }

    #[test]
    fn read_committed_skips_aborted_transactions_and_markers() {
        // Producer 1 commits 0-1, producer 2 aborts 2-3 (interleaved with 1's 4), then
        // producer 2 commits 7; markers at 5 (abort of 2), 6 (commit of 1), 8 (commit of 2).
        let mut data = txn_batch(1, 0, 2);
        data.extend(txn_batch(2, 2, 2));
        data.extend(txn_batch(1, 4, 1));
        data.extend(marker(2, 5, false));
        data.extend(marker(1, 6, true));
        data.extend(txn_batch(2, 7, 1));
        data.extend(marker(2, 8, true));
        let data = Bytes::from(data);
        let offsets = |aborted: &[(i64, i64)], from: i64| {
            let mut out = VecDeque::new();
            let decoded = decode_records(&"t".into(), 0, from, data.clone(), aborted, &mut out);
            assert!(decoded.error.is_none());
            assert_eq!(decoded.next, 9);
            assert_eq!(whole_batches_end(&data, from), 9);
            out.iter().map(|r| r.offset).collect::<Vec<_>>()
        };
        assert_eq!(offsets(&[(2, 2)], 0), vec![0, 1, 4, 7], "read_committed");
        assert_eq!(offsets(&[], 0), vec![0, 1, 2, 3, 4, 7], "read_uncommitted: only the markers are left out");
        // A fetch from inside the aborted transaction still knows it from the list.
        assert_eq!(offsets(&[(2, 2)], 3), vec![4, 7]);
    }

    /// A damaged batch after good ones: the good ones' records come out once, and the
    /// decoding stops at the damaged batch's offset with a typed error, so the consumer
    /// fetches that batch again instead of handing out the ones before it twice.
    #[test]
    fn a_corrupt_batch_stops_the_decoding_at_its_offset() {
        let mut data = batch(0, 3, Compression::None);
        let mut damaged = batch(3, 3, Compression::None);
        let last = damaged.len() - 1;
        damaged[last] ^= 0xff;
        data.extend(damaged);
        data.extend(batch(6, 3, Compression::None));
        // The header walk cannot see the damage: it reads past it, and the decoding says
        // where it really stopped.
        assert_eq!(whole_batches_end(&data, 0), 9);
        let mut out = VecDeque::new();
        let decoded = decode_records(&"t".into(), 0, 1, Bytes::from(data), &[], &mut out);
        assert!(matches!(decoded.error, Some(Error::Record(fjord_record::Error::CrcMismatch { .. }))));
        assert_eq!(decoded.next, 3);
        assert_eq!(out.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![1, 2]);
    }

    /// A batch whose base offset is at the top of the range (a hostile or broken broker)
    /// decodes without overflowing: its offsets stop at i64::MAX.
    #[test]
    fn a_batch_at_the_end_of_the_offset_range_does_not_overflow() {
        let mut data = batch(0, 3, Compression::None);
        set_base_offset(&mut data, i64::MAX - 1);
        let data = Bytes::from(data);
        let mut out = VecDeque::new();
        let decoded = decode_records(&"t".into(), 0, i64::MAX - 1, data, &[], &mut out);
        assert!(decoded.error.is_none());
        assert_eq!(decoded.next, i64::MAX);
        assert_eq!(out.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![i64::MAX - 1, i64::MAX, i64::MAX]);
    }

    /// A batch whose CRC holds but whose records do not parse leaves none of its records.
    #[test]
    fn a_batch_with_a_malformed_record_leaves_none_of_its_records() {
        let mut data = batch(0, 2, Compression::None);
        let mut bad = batch(2, 3, Compression::None);
        // The last record's last header value claims 8 bytes where none follow; the CRC
        // is made to match, so only the record parser can tell.
        let len = bad.len();
        bad[len - 1] = 0x10;
        let crc = fjord_record::batch::crc32c(&bad[21..]);
        bad[17..21].copy_from_slice(&crc.to_be_bytes());
        data.extend(bad);
        let mut out = VecDeque::new();
        let decoded = decode_records(&"t".into(), 0, 0, Bytes::from(data), &[], &mut out);
        let parse_error =
            matches!(&decoded.error, Some(Error::Record(e)) if !matches!(e, fjord_record::Error::CrcMismatch { .. }));
        assert!(parse_error, "{:?}", decoded.error);
        assert_eq!(decoded.next, 2);
        assert_eq!(out.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![0, 1]);
    }
}
