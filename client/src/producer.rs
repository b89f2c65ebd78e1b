//! The asynchronous producer.
//!
//! `send` appends a record to its partition's open batch (a [`BatchBuilder`], so a record
//! is encoded exactly once, straight into the bytes that go on the wire) and returns a
//! [`DeliveryFuture`]. A batch is closed when it reaches `batch.size`, when it has waited
//! `linger.ms`, or on `flush`/`close`. One sender task drains closed batches into produce
//! requests, one request per leader broker with at most one batch per partition, and keeps
//! up to `max.in.flight` requests pipelined on the broker's single connection; with
//! `linger.ms = 0` batching still happens naturally, because records accumulate while
//! all in-flight slots are taken.
//!
//! Memory: every record charges its encoded size to a `buffer.memory` budget, given back
//! when its batch completes. A full budget makes `send` wait (up to `max.block.ms`) or fail
//! at once with [`Error::BufferFull`], so a producer faster than the broker never grows
//! without bound.
//!
//! Failures: retriable errors (leadership moved, timeouts, broken connections) refresh
//! metadata and retry the batch after `retry.backoff.ms`, until `delivery.timeout.ms`.
//! MESSAGE_TOO_LARGE on a multi-record batch splits it into single-record batches, so only
//! the record that is really too large fails.
//!
//! Idempotence (`enable.idempotence`, on by default as in the Java client): `connect`
//! asks for a producer id (InitProducerId); every batch gets the id, the epoch and its
//! partition's next sequence number when it is first sent (stamped into the built batch,
//! CRC recomputed), and keeps them across retries, so a broker that already appended it
//! (the acknowledgement was lost) answers the retry with the original offset instead of
//! appending it again. Order holds with up to 5 requests in flight: a failed batch goes
//! back in front of the later ones by sequence number, and a later batch the broker
//! refuses as out of order while an earlier one is unresolved is retried too. A batch
//! that fails for good leaves a hole in its partition's sequence, so the producer then
//! waits for what is in flight and bumps its producer epoch (a newer epoch starts a new
//! sequence on every partition) before sending on.

mod batch;
mod request;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use fjord_record::{BatchBuilder, Compression, BATCH_OVERHEAD};
use kafka_protocol::messages::{InitProducerIdRequest, ProduceRequest, ProduceResponse, ProducerId};
use tokio::sync::{Notify, Semaphore};

pub use batch::{DeliveryFuture, RecordMetadata};

use self::batch::{split_batch, Completion, Outcome};
use crate::audit::AuditHook;
use crate::cluster::{ClientConfig, Cluster};
use crate::connection::BodyParts;
use crate::error::{Error, ResponseError, Result};
use crate::partitioner::{partition_for_key, Random};

/// Highest Produce version used: v9 is the first flexible one; v13 switches to topic ids.
const PRODUCE_VERSION: i16 = 9;

/// How many replicas must have a batch before the broker answers (`acks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acks {
    /// `acks=0`: no response; the record counts as sent once written to the socket.
    None,
    /// `acks=1`: the leader has appended it.
    Leader,
    /// `acks=all`: every in-sync replica has it.
    All,
}

impl Acks {
    fn wire(self) -> i16 {
        match self {
            Acks::None => 0,
            Acks::Leader => 1,
            Acks::All => -1,
        }
    }
}

impl std::str::FromStr for Acks {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "0" => Ok(Acks::None),
            "1" => Ok(Acks::Leader),
            "all" | "-1" => Ok(Acks::All),
            other => Err(Error::InvalidConfig(format!("acks must be 0, 1 or all, not {other:?}"))),
        }
    }
}

/// Producer settings (Kafka's names in the comments).
#[derive(Debug, Clone)]
pub struct ProducerConfig {
    /// Connection and metadata settings.
    pub client: ClientConfig,
    /// `acks`.
    pub acks: Acks,
    /// `batch.size`: a partition's batch is closed once it holds this many bytes.
    pub batch_size: usize,
    /// `linger.ms`: how long an open batch may wait for more records.
    pub linger: Duration,
    /// `compression.type`.
    pub compression: Compression,
    /// `max.in.flight.requests.per.connection`.
    pub max_in_flight: usize,
    /// `retries`: attempts after the first one, bounded by `delivery_timeout` too.
    pub retries: u32,
    /// `delivery.timeout.ms`: bound from `send` to success or failure.
    pub delivery_timeout: Duration,
    /// `buffer.memory`: bytes of records waiting to be sent or acknowledged.
    pub buffer_memory: usize,
    /// `max.block.ms`: how long `send` may wait for buffer space; zero fails at once.
    pub max_block: Duration,
    /// `max.request.size`: largest produce request, and so largest record.
    pub max_request_size: usize,
    /// `enable.idempotence`: retries never duplicate a batch (see the module docs).
    /// `None` is the Java client's default: on, unless `acks`, `retries` or
    /// `max_in_flight` conflict with it (acks other than all, no retries, more than 5
    /// in flight), in which case it is off; `Some(true)` with a conflict is an error.
    pub enable_idempotence: Option<bool>,
    /// Opt-in audit: told about every record once it is acknowledged (see
    /// [`crate::audit`]); `None` costs nothing.
    pub audit: Option<Arc<dyn AuditHook>>,
}

impl Default for ProducerConfig {
    fn default() -> Self {
        Self {
            client: ClientConfig::default(),
            acks: Acks::All,
            batch_size: 16 * 1024,
            linger: Duration::from_millis(5),
            compression: Compression::None,
            max_in_flight: 5,
            retries: u32::MAX,
            delivery_timeout: Duration::from_secs(120),
            buffer_memory: 32 * 1024 * 1024,
            max_block: Duration::from_secs(60),
            max_request_size: 1024 * 1024,
            enable_idempotence: None,
            audit: None,
        }
    }
}

impl ProducerConfig {
    fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(Error::InvalidConfig(m.into()));
        if self.max_in_flight == 0 {
            return bad("max.in.flight.requests.per.connection must be at least 1");
        }
        if self.buffer_memory < self.max_request_size {
            return bad("buffer.memory must be at least max.request.size");
        }
        if self.buffer_memory > Semaphore::MAX_PERMITS || self.max_request_size > u32::MAX as usize {
            return bad("buffer.memory is too large");
        }
        if self.enable_idempotence == Some(true) && self.idempotence_conflict().is_some() {
            return Err(Error::InvalidConfig(format!(
                "enable.idempotence needs {}",
                self.idempotence_conflict().unwrap_or_default()
            )));
        }
        Ok(())
    }

    /// What keeps idempotence from working with these settings, if anything.
    fn idempotence_conflict(&self) -> Option<&'static str> {
        if self.acks != Acks::All {
            Some("acks=all")
        } else if self.retries == 0 {
            Some("retries > 0")
        } else if self.max_in_flight > MAX_IN_FLIGHT_IDEMPOTENT {
            Some("max.in.flight.requests.per.connection <= 5")
        } else {
            None
        }
    }

    /// Whether the producer is idempotent (see [`ProducerConfig::enable_idempotence`]).
    pub fn idempotent(&self) -> bool {
        self.enable_idempotence.unwrap_or_else(|| self.idempotence_conflict().is_none())
    }
}

/// A send finding `buffer.memory` full waits for this fraction of it to be free
/// (see `Inner::reserve`)...
const REFILL_FRACTION: usize = 32;
/// ...for at most this long, then for its own record's bytes only.
const REFILL_WAIT: Duration = Duration::from_millis(50);

/// The broker remembers the last 5 batches per producer and partition: a retry of an
/// older one could not be recognised.
const MAX_IN_FLIGHT_IDEMPOTENT: usize = 5;

/// Id and epoch from InitProducerId.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ProducerIdentity {
    id: i64,
    epoch: i16,
}

/// What an idempotent producer stamped into a batch when it first sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    identity: ProducerIdentity,
    sequence: i32,
}

/// `sequence + n` in Kafka's sequence space, which wraps from `i32::MAX` to 0.
fn add_sequence(sequence: i32, n: usize) -> i32 {
    ((i64::from(sequence) + n as i64) % (i64::from(i32::MAX) + 1)) as i32
}

/// Whether a completed batch was a split one (its parts carry its sequences).
enum OutcomeKind {
    Whole,
    Split,
}

/// Whether sequence `a` comes after `b` (less than half the space ahead, across the wrap).
fn sequence_ahead(a: i32, b: i32) -> bool {
    let distance = (i64::from(a) - i64::from(b)).rem_euclid(i64::from(i32::MAX) + 1);
    distance > 0 && distance < 1 << 30
}

/// A record to send.
#[derive(Debug, Clone, Default)]
pub struct ProducerRecord {
    /// Topic.
    pub topic: String,
    /// Explicit partition; `None` lets the partitioner choose.
    pub partition: Option<i32>,
    /// Key (decides the partition when there is no explicit one).
    pub key: Option<Bytes>,
    /// Value; `None` is a null value (a tombstone).
    pub value: Option<Bytes>,
    /// Headers, in order.
    pub headers: Vec<(String, Option<Bytes>)>,
    /// Create time in ms since the epoch; `None` means now.
    pub timestamp: Option<i64>,
}

impl ProducerRecord {
    /// A record with a value and nothing else.
    pub fn new(topic: impl Into<String>, value: impl Into<Bytes>) -> Self {
        Self { topic: topic.into(), value: Some(value.into()), ..Self::default() }
    }

    /// Sets the key.
    pub fn key(mut self, key: impl Into<Bytes>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Sets an explicit partition.
    pub fn partition(mut self, partition: i32) -> Self {
        self.partition = Some(partition);
        self
    }

    /// Adds a header.
    pub fn header(mut self, key: impl Into<String>, value: Option<Bytes>) -> Self {
        self.headers.push((key.into(), value));
        self
    }

    /// Sets the timestamp.
    pub fn timestamp(mut self, timestamp: i64) -> Self {
        self.timestamp = Some(timestamp);
        self
    }

    /// Bytes this record takes inside a batch (upper bound: varints counted at 5/10 bytes).
    pub fn encoded_size(&self) -> usize {
        let nullable = |b: &Option<Bytes>| 5 + b.as_ref().map_or(0, Bytes::len);
        let headers: usize = self.headers.iter().map(|(k, v)| 5 + k.len() + nullable(v)).sum();
        5 + 1 + 10 + 5 + nullable(&self.key) + nullable(&self.value) + 5 + headers
    }
}

/// An asynchronous producer; clones share the same buffers, sender and connections.
#[derive(Clone)]
pub struct Producer {
    inner: Arc<Inner>,
    _handle: Arc<Handle>,
}

/// Dropping the last user handle closes the producer (after sending what is buffered).
struct Handle(Arc<Inner>);

impl Drop for Handle {
    fn drop(&mut self) {
        self.0.state.lock().unwrap_or_else(|e| e.into_inner()).closing = true;
        self.0.wake_sender.notify_one();
    }
}

struct Inner {
    config: ProducerConfig,
    cluster: Arc<Cluster>,
    memory: Arc<Semaphore>,
    state: Mutex<State>,
    wake_sender: Notify,
    /// Signalled whenever a batch completes (flush waits on it).
    batch_done: Notify,
}

/// Topic names are the application's own, so a fast non-keyed hash (FNV-1a) is safe
/// here; SipHash showed up in profiles of the send path.
#[derive(Clone, Copy)]
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl std::hash::Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// In-flight batches of a partition that hold its open batch back. With linger.ms=0,
/// taking every open batch whenever the leader could take a request left the size of
/// requests to the sender's timing: `fjord bench --batch 500` sent 58-135 records per
/// request, and the more requests, the less time both ends had for records. Two, not
/// one: while the broker handles one request the next is on its way, so it does not
/// idle for a round trip. Full batches are not held (up to max.in.flight).
const OPEN_BATCH_HOLD: usize = 2;

type TopicMap = HashMap<Arc<str>, TopicState, std::hash::BuildHasherDefault<Fnv>>;

#[derive(Default)]
struct State {
    topics: TopicMap,
    /// Batches created and not completed yet.
    incomplete: usize,
    flushing: usize,
    closing: bool,
    /// In-flight requests per broker id.
    in_flight: HashMap<i32, usize>,
    random: Option<Random>,
    /// The idempotent producer's id and epoch; `None` when not idempotent.
    identity: Option<ProducerIdentity>,
    /// A stamped batch failed for good: bump the producer epoch before sending more.
    reset_pending: bool,
}

struct TopicState {
    name: Arc<str>,
    /// Partition count as of metadata version `metadata_version`.
    partition_count: i32,
    metadata_version: u64,
    partitions: Vec<PartitionQueue>,
    sticky: Option<i32>,
}

#[derive(Default)]
struct PartitionQueue {
    open: Option<OpenBatch>,
    ready: VecDeque<ReadyBatch>,
    /// Idempotence: the sequence number of the next batch sent for the first time.
    next_sequence: i32,
    /// Idempotence: the sequence after the last acknowledged batch.
    acked_sequence: i32,
    /// Idempotence: the sequences of the batches numbered since the oldest one still
    /// unresolved (in flight or waiting for a retry), with whether each completed. A new
    /// batch is numbered only while this holds fewer than 5: the broker remembers a
    /// producer's last 5 batches, so a retry of the oldest one is still recognised even
    /// if every later batch was appended meanwhile.
    window: VecDeque<(i32, bool)>,
    /// Batches of this partition in requests not answered yet.
    sending: usize,
    /// The partition's leader when the sender last looked (`None` before it did).
    leader: Option<i32>,
}

impl PartitionQueue {
    /// Whether the sender may take the open (not full) batch of this partition now,
    /// linger aside: not while [`OPEN_BATCH_HOLD`] of the partition's batches are in
    /// flight. It fills up meanwhile, and the answer to one of them wakes the sender.
    fn open_sendable(&self) -> bool {
        self.sending < OPEN_BATCH_HOLD
    }
}

struct OpenBatch {
    builder: BatchBuilder,
    created: Instant,
    completion: Arc<Completion>,
    memory: usize,
    /// With an audit hook, each record's creation time as the hook gave it.
    audit: Vec<i64>,
}

/// A closed batch, waiting to be sent or retried.
pub(crate) struct ReadyBatch {
    topic: Arc<str>,
    partition: i32,
    bytes: Bytes,
    records: usize,
    completion: Arc<Completion>,
    memory: usize,
    created: Instant,
    attempts: u32,
    retry_at: Option<Instant>,
    /// Idempotence: id, epoch and sequence, from the first time it was sent.
    stamp: Option<Stamp>,
    /// With an audit hook, each record's creation time (empty for the parts of a split
    /// batch: the original batch reports its records when the parts are done).
    audit: Vec<i64>,
}

impl Producer {
    /// Connects to the cluster, gets a producer id when idempotent, and starts the
    /// sender task.
    pub async fn connect(config: ProducerConfig) -> Result<Self> {
        config.validate()?;
        let cluster = Cluster::connect(config.client.clone()).await?;
        let identity = match config.idempotent() {
            true => Some(init_producer_id(&cluster, config.delivery_timeout).await?),
            false => None,
        };
        let inner = Arc::new(Inner {
            memory: Arc::new(Semaphore::new(config.buffer_memory)),
            config,
            cluster,
            state: Mutex::new(State { random: Some(Random::new()), identity, ..State::default() }),
            wake_sender: Notify::new(),
            batch_done: Notify::new(),
        });
        tokio::spawn(sender_loop(inner.clone()));
        Ok(Self { _handle: Arc::new(Handle(inner.clone())), inner })
    }

    /// Queues `record` for sending. Waits only for metadata of a new topic and for buffer
    /// space; the returned future resolves when the broker acknowledged the record.
    pub async fn send(&self, record: ProducerRecord) -> Result<DeliveryFuture> {
        match self.try_append(record)? {
            Ok(future) => Ok(future),
            // Boxed: the waiting path holds a metadata fetch, kilobytes of future state,
            // which would make every `send` future that large, copied on each call (the
            // copies were ~7% of the bench client's samples).
            Err((record, size, reserved)) => Box::pin(self.append_waiting(record, size, reserved)).await,
        }
    }

    /// A send that waits for nothing: the record's memory is free and its topic's
    /// partition count is cached. Otherwise the record comes back (`Err`) with its size
    /// and whether its memory is reserved, for [`Self::append_waiting`].
    fn try_append(&self, record: ProducerRecord) -> Result<std::result::Result<DeliveryFuture, (ProducerRecord, usize, bool)>> {
        let inner = &self.inner;
        let size = record.encoded_size();
        inner.check_size(size)?;
        let Ok(permit) = inner.memory.try_acquire_many(size as u32) else {
            return Ok(Err((record, size, false)));
        };
        permit.forget();
        let timestamp = record.timestamp.unwrap_or_else(now_ms);
        match self.append_locked(record, size, timestamp, inner.cluster.metadata_version(), None) {
            Ok(Ok(future)) => Ok(Ok(future)),
            Ok(Err(record)) => Ok(Err((record, size, true))),
            Err(e) => {
                inner.memory.add_permits(size);
                Err(e)
            }
        }
    }

    /// Appends a record that has to wait for buffer memory (unless `reserved`) or for its
    /// topic's metadata.
    async fn append_waiting(&self, record: ProducerRecord, size: usize, reserved: bool) -> Result<DeliveryFuture> {
        if !reserved {
            self.inner.reserve(size).await?;
        }
        let result = self.append(record, size).await;
        if result.is_err() {
            self.inner.memory.add_permits(size);
        }
        result
    }

    /// Sends `records` in order, as many [`Self::send`] calls would, and returns their
    /// delivery futures in the same order. The records are appended under one lock for as
    /// long as buffer memory is free and their topics' partition counts are known, with
    /// one clock read for their timestamps: a caller with many records at hand (the
    /// gateway, a request at a time) pays the lock, the wake-up and the clock once, not
    /// per record, and does not contend with itself. A record that has to wait (for
    /// memory or metadata) takes the path of `send`, then the run goes on.
    ///
    /// The first error ends the call; the records before it stay queued and are
    /// delivered, as with a loop of `send`.
    pub async fn send_many(&self, records: impl IntoIterator<Item = ProducerRecord>) -> Result<Vec<DeliveryFuture>> {
        let mut records = records.into_iter();
        let mut futures = Vec::with_capacity(records.size_hint().0);
        loop {
            let (record, size, reserved) = match self.append_run(&mut records, &mut futures)? {
                None => return Ok(futures),
                Some(waiting) => waiting,
            };
            futures.push(Box::pin(self.append_waiting(record, size, reserved)).await?);
        }
    }

    /// Appends records from `records` under one lock until they run out (`None`) or one
    /// has to wait: `Some((record, size, whether its memory is reserved))`.
    fn append_run(
        &self,
        records: &mut impl Iterator<Item = ProducerRecord>,
        futures: &mut Vec<DeliveryFuture>,
    ) -> Result<Option<(ProducerRecord, usize, bool)>> {
        let inner = &self.inner;
        let version = inner.cluster.metadata_version();
        let now = now_ms();
        let mut woke = false;
        let mut state = inner.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut outcome = Ok(None);
        for record in records.by_ref() {
            let size = record.encoded_size();
            if let Err(e) = inner.check_size(size) {
                outcome = Err(e);
                break;
            }
            let Ok(permit) = inner.memory.try_acquire_many(size as u32) else {
                outcome = Ok(Some((record, size, false)));
                break;
            };
            permit.forget();
            let timestamp = record.timestamp.unwrap_or(now);
            match self.append_to(&mut state, record, size, timestamp, version, None, &mut woke) {
                Ok(Ok(future)) => futures.push(future),
                Ok(Err(back)) => {
                    outcome = Ok(Some((back, size, true)));
                    break;
                }
                Err(e) => {
                    inner.memory.add_permits(size);
                    outcome = Err(e);
                    break;
                }
            }
        }
        drop(state);
        if woke {
            inner.wake_sender.notify_one();
        }
        outcome
    }

    /// Appends a record whose `size` bytes of buffer memory are reserved.
    async fn append(&self, record: ProducerRecord, size: usize) -> Result<DeliveryFuture> {
        let timestamp = record.timestamp.unwrap_or_else(now_ms);
        let version = self.inner.cluster.metadata_version();
        let mut record = record;
        let mut known = None;
        loop {
            match self.append_locked(record, size, timestamp, version, known)? {
                Ok(future) => return Ok(future),
                Err(back) => {
                    known = Some(self.inner.partition_count(&back.topic).await?);
                    record = back;
                }
            }
        }
    }

    /// The append itself, under one lock. The partition count comes from the topic's
    /// cache, valid while the metadata stays at `version`, else from `known`; with
    /// neither, the record comes back (`Err`) for the caller to fetch the metadata. One
    /// lock per send: the sender thread takes it too, and a second one showed in profiles.
    fn append_locked(
        &self,
        record: ProducerRecord,
        size: usize,
        timestamp: i64,
        version: u64,
        known: Option<i32>,
    ) -> Result<std::result::Result<DeliveryFuture, ProducerRecord>> {
        let mut woke = false;
        let mut state = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
        let appended = self.append_to(&mut state, record, size, timestamp, version, known, &mut woke);
        drop(state);
        if woke {
            self.inner.wake_sender.notify_one();
        }
        appended
    }

    /// Appends one record to its partition's open batch in `state` (locked by the
    /// caller), as [`Self::append_locked`] describes; `woke` is set when the sender has
    /// work to wake up for (a new or a full batch).
    #[allow(clippy::too_many_arguments)]
    fn append_to(
        &self,
        state: &mut State,
        record: ProducerRecord,
        size: usize,
        timestamp: i64,
        version: u64,
        known: Option<i32>,
        woke: &mut bool,
    ) -> Result<std::result::Result<DeliveryFuture, ProducerRecord>> {
        let inner = &self.inner;
        let cached = state.topics.get(record.topic.as_str()).filter(|t| t.metadata_version == version).map(|t| t.partition_count);
        let Some(partitions) = cached.or(known) else {
            return Ok(Err(record));
        };
        if let Some(p) = record.partition {
            if !(0..partitions).contains(&p) {
                return Err(Error::UnknownPartition { topic: record.topic, partition: p });
            }
        }
        if state.closing {
            return Err(Error::ProducerClosed);
        }
        let State { topics, random, incomplete, in_flight, .. } = state;
        let topic = topics.entry_ref(&record.topic, partitions);
        topic.partition_count = partitions;
        topic.metadata_version = version;
        let partition = match (record.partition, &record.key) {
            (Some(p), _) => p,
            (None, Some(key)) => partition_for_key(key, partitions),
            (None, None) => *topic.sticky.get_or_insert_with(|| random.as_mut().map_or(0, |r| r.partition(partitions, None))),
        };
        let name = topic.name.clone();
        let queue = &mut topic.partitions[partition as usize];
        // Wake the sender only when it could send something: not while the leader has
        // max.in.flight requests out, nor for a new open batch that its partition's
        // batches in flight hold back (an answer wakes it then). At full speed, a wake-up
        // per batch was a futex wake and a context switch per batch, mostly for nothing.
        let leader_free = queue.leader.is_none_or(|l| in_flight.get(&l).is_none_or(|&n| n < inner.config.max_in_flight));
        if let Some(open) = &queue.open {
            if open.builder.size() + size > inner.config.batch_size {
                let open = queue.open.take().expect("checked above");
                queue.ready.push_back(open.close(&name, partition, inner.config.compression)?);
                *woke |= leader_free;
            }
        }
        let open_sendable = queue.open_sendable();
        let open = queue.open.get_or_insert_with(|| {
            *incomplete += 1;
            *woke |= leader_free && open_sendable;
            OpenBatch {
                builder: BatchBuilder::with_capacity(timestamp, inner.config.batch_size.min(1 << 20)),
                created: Instant::now(),
                completion: Arc::new(Completion::default()),
                memory: 0,
                audit: Vec::new(),
            }
        });
        let index = open.builder.len() as i32;
        open.builder.append_with_headers(timestamp, record.key.as_deref(), record.value.as_deref(), &record.headers);
        open.memory += size;
        if let Some(audit) = &inner.config.audit {
            open.audit.push(audit.created_ms(&record, timestamp));
        }
        let future = DeliveryFuture::new(open.completion.clone(), partition, index);
        if open.builder.size() >= inner.config.batch_size {
            let open = queue.open.take().expect("just appended");
            queue.ready.push_back(open.close(&name, partition, inner.config.compression)?);
            if record.key.is_none() && record.partition.is_none() {
                // The sticky partition's batch is full: stick to another one next.
                let next = random.as_mut().map_or(0, |r| r.partition(partitions, Some(partition)));
                topic.sticky = Some(next);
            }
            *woke |= leader_free;
        }
        Ok(Ok(future))
    }

    /// Sends everything buffered now (ignoring `linger.ms`) and waits until every batch
    /// created so far has completed, successfully or not.
    pub async fn flush(&self) {
        let inner = &self.inner;
        inner.state.lock().unwrap_or_else(|e| e.into_inner()).flushing += 1;
        inner.wake_sender.notify_one();
        loop {
            let done = inner.batch_done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            if inner.state.lock().unwrap_or_else(|e| e.into_inner()).incomplete == 0 {
                break;
            }
            done.await;
        }
        inner.state.lock().unwrap_or_else(|e| e.into_inner()).flushing -= 1;
    }

    /// Flushes, then stops the sender. Later sends fail with [`Error::ProducerClosed`].
    pub async fn close(&self) {
        self.flush().await;
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner()).closing = true;
        self.inner.wake_sender.notify_one();
    }

    /// Partitions of `topic` (fetching metadata, and so possibly auto-creating it).
    pub async fn partition_count(&self, topic: &str) -> Result<i32> {
        self.inner.partition_count(topic).await
    }
}

trait TopicsExt {
    fn entry_ref(&mut self, topic: &str, partitions: i32) -> &mut TopicState;
}

impl TopicsExt for TopicMap {
    /// The topic's state, created (or grown, when partitions were added) on demand,
    /// without allocating the name on the hot path.
    fn entry_ref(&mut self, topic: &str, partitions: i32) -> &mut TopicState {
        if self.get(topic).is_none() {
            let name: Arc<str> = topic.into();
            let state = TopicState {
                name: name.clone(),
                partition_count: 0,
                metadata_version: u64::MAX,
                partitions: Vec::new(),
                sticky: None,
            };
            self.insert(name, state);
        }
        let t = self.get_mut(topic).expect("inserted above");
        if t.partitions.len() < partitions as usize {
            t.partitions.resize_with(partitions as usize, PartitionQueue::default);
        }
        t
    }
}

impl ReadyBatch {
    /// Stamps the producer id, epoch and first sequence into the batch bytes.
    fn stamp(&mut self, identity: ProducerIdentity, sequence: i32) {
        let mut bytes = std::mem::take(&mut self.bytes).try_into_mut().unwrap_or_else(|shared| shared[..].into());
        fjord_record::batch::set_producer(&mut bytes, identity.id, identity.epoch, sequence);
        self.bytes = bytes.freeze();
        self.stamp = Some(Stamp { identity, sequence });
    }
}

impl OpenBatch {
    fn close(self, topic: &Arc<str>, partition: i32, codec: Compression) -> Result<ReadyBatch> {
        let records = self.builder.len();
        let bytes = self.builder.build_compressed(codec)?;
        Ok(ReadyBatch {
            topic: topic.clone(),
            partition,
            bytes,
            records,
            completion: self.completion,
            memory: self.memory,
            created: self.created,
            attempts: 0,
            retry_at: None,
            stamp: None,
            audit: self.audit,
        })
    }
}

impl Inner {
    async fn partition_count(&self, topic: &str) -> Result<i32> {
        let t = self.cluster.topic(topic).await?;
        match t.partitions.len() {
            0 => Err(Error::UnknownTopic(topic.to_string())),
            n => Ok(n as i32),
        }
    }

    /// A record of `size` encoded bytes must fit in a request with its batch header.
    fn check_size(&self, size: usize) -> Result<()> {
        match size + BATCH_OVERHEAD {
            total if total > self.config.max_request_size => {
                Err(Error::RecordTooLarge { size: total, max: self.config.max_request_size })
            }
            _ => Ok(()),
        }
    }

    /// Takes `size` bytes of `buffer.memory`, waiting up to `max.block.ms`.
    async fn reserve(&self, size: usize) -> Result<()> {
        let permits = size as u32;
        if let Ok(p) = self.memory.try_acquire_many(permits) {
            p.forget();
            return Ok(());
        }
        let started = Instant::now();
        let full = || Error::BufferFull { buffer_memory: self.config.buffer_memory, waited: started.elapsed() };
        if self.config.max_block.is_zero() {
            return Err(full());
        }
        // The buffer is full: wait until a refill is free rather than just this record's
        // bytes, then hand back what is over. Waiting for one record woke the sending task
        // for every completed batch (a futex wake and two context switches per batch at
        // 50 records a batch), and it filled the buffer again at once. The wait for the
        // refill is short, then only the record's bytes are waited for: a slow broker
        // still lets a record through as soon as its bytes are free.
        let refill = u32::try_from(self.config.buffer_memory / REFILL_FRACTION).unwrap_or(u32::MAX).max(permits);
        if refill > permits {
            let wait = REFILL_WAIT.min(self.config.max_block);
            if let Ok(Ok(p)) = tokio::time::timeout(wait, self.memory.acquire_many(refill)).await {
                p.forget();
                self.memory.add_permits((refill - permits) as usize);
                return Ok(());
            }
        }
        let left = self.config.max_block.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, self.memory.acquire_many(permits)).await {
            Ok(Ok(p)) => {
                p.forget();
                Ok(())
            }
            _ => Err(full()),
        }
    }

    /// Completes a batch: wakes its record futures and gives back its memory. A stamped
    /// batch that succeeded moves its partition's acknowledged sequence; one that failed
    /// leaves a hole in the sequence, which a new producer epoch closes.
    fn complete(&self, batch: &ReadyBatch, outcome: Outcome) {
        let succeeded = !matches!(outcome, Outcome::Failed(_));
        let outcome_kind = if matches!(outcome, Outcome::PerRecord(_)) { OutcomeKind::Split } else { OutcomeKind::Whole };
        if let Some(audit) = self.config.audit.as_ref().filter(|_| !batch.audit.is_empty()) {
            match &outcome {
                Outcome::Sent { .. } => audit.acknowledged(&batch.topic, &batch.audit),
                Outcome::PerRecord(results) => {
                    let acked: Vec<i64> = batch.audit.iter().zip(results).filter(|(_, r)| r.is_ok()).map(|(c, _)| *c).collect();
                    audit.acknowledged(&batch.topic, &acked);
                }
                Outcome::Failed(_) => {}
            }
        }
        batch.completion.complete(outcome);
        self.memory.add_permits(batch.memory);
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.incomplete -= 1;
        if let Some(stamp) = batch.stamp.filter(|s| Some(s.identity) == state.identity) {
            // A split batch completes after its parts, which hold its sequence numbers now.
            let split = matches!(outcome_kind, OutcomeKind::Split);
            if let Some(queue) = state.queue(&batch.topic, batch.partition).filter(|_| !split) {
                if let Some(entry) = queue.window.iter_mut().find(|(sequence, _)| *sequence == stamp.sequence) {
                    entry.1 = true;
                }
                while queue.window.front().is_some_and(|(_, done)| *done) {
                    queue.window.pop_front();
                }
            }
            if succeeded {
                if let Some(queue) = state.queue(&batch.topic, batch.partition) {
                    // Answers of different requests may be handled out of order: only move forward.
                    let acked = add_sequence(stamp.sequence, batch.records);
                    if sequence_ahead(acked, queue.acked_sequence) {
                        queue.acked_sequence = acked;
                    }
                }
            } else {
                state.reset_pending = true;
                self.wake_sender.notify_one();
            }
        }
        drop(state);
        self.batch_done.notify_waiters();
    }

    /// Puts a batch back for another attempt, or fails it when out of attempts or time.
    fn retry_or_fail(&self, batch: ReadyBatch, error: Error) {
        let retriable = error.is_retriable();
        self.retry_or_fail_as(batch, error, retriable);
    }

    /// [`Inner::retry_or_fail`] with the caller deciding whether `error` is retriable.
    fn retry_or_fail_as(&self, mut batch: ReadyBatch, error: Error, retriable: bool) {
        let expired = batch.created.elapsed() >= self.config.delivery_timeout;
        if !retriable || batch.attempts >= self.config.retries || expired {
            let error = if expired && retriable { Error::DeliveryTimeout(self.config.delivery_timeout) } else { error };
            self.complete(&batch, Outcome::Failed(error));
            return;
        }
        tracing::debug!(topic = %batch.topic, partition = batch.partition, sequence = ?batch.stamp.map(|s| s.sequence), %error, "retrying batch");
        batch.attempts += 1;
        batch.retry_at = Some(Instant::now() + self.cluster.config().retry_backoff);
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let partitions = state.topics.get(&*batch.topic).map_or(0, |t| t.partitions.len());
        let topic = state.topics.entry_ref(&batch.topic.clone(), partitions.max(batch.partition as usize + 1) as i32);
        let ready = &mut topic.partitions[batch.partition as usize].ready;
        match batch.stamp {
            // Back in sequence order: in front of every later batch, behind earlier retries.
            Some(stamp) => {
                let at = ready
                    .iter()
                    .position(|b| b.stamp.is_none_or(|s| s.identity != stamp.identity || s.sequence > stamp.sequence))
                    .unwrap_or(ready.len());
                ready.insert(at, batch);
            }
            None => ready.push_front(batch),
        }
        drop(state);
        // The sender may be asleep with nothing else to do: it must see the retry.
        self.wake_sender.notify_one();
    }
}

impl State {
    fn queue(&mut self, topic: &str, partition: i32) -> Option<&mut PartitionQueue> {
        self.topics.get_mut(topic)?.partitions.get_mut(usize::try_from(partition).ok()?)
    }

    /// Whether the broker may have refused `batch` as out of order only because an
    /// earlier batch of its partition is still unresolved (then it is worth a retry).
    fn earlier_batch_pending(&mut self, batch: &ReadyBatch) -> bool {
        let Some(stamp) = batch.stamp else {
            return false;
        };
        Some(stamp.identity) == self.identity
            && self.queue(&batch.topic, batch.partition).is_some_and(|q| q.acked_sequence != stamp.sequence)
    }
}

/// Asks any broker for a producer id, retrying retriable errors until `timeout`.
async fn init_producer_id(cluster: &Cluster, timeout: Duration) -> Result<ProducerIdentity> {
    let deadline = Instant::now() + timeout;
    let request = InitProducerIdRequest::default()
        .with_transactional_id(None)
        .with_transaction_timeout_ms(60_000)
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    loop {
        let attempt = async {
            let conn = cluster.any_broker().await?;
            let response = conn.request(&request, 4).await?;
            match Error::kafka(response.error_code, "InitProducerId", None) {
                None => Ok(ProducerIdentity { id: response.producer_id.0, epoch: response.producer_epoch }),
                Some(e) => Err(e),
            }
        };
        match attempt.await {
            Ok(identity) => {
                tracing::debug!(producer_id = identity.id, epoch = identity.epoch, "idempotent producer id");
                return Ok(identity);
            }
            Err(e) if e.is_retriable() && Instant::now() < deadline => {
                tracing::debug!(%e, "InitProducerId failed; retrying");
                tokio::time::sleep(cluster.config().retry_backoff).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Drains ready batches into produce requests until the producer is closed and empty.
async fn sender_loop(inner: Arc<Inner>) {
    let mut refresh_due = false;
    loop {
        let woken = inner.wake_sender.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        if refresh_due {
            refresh_due = false;
            // Errors here surface as retries of the batches themselves.
            let _ = inner.cluster.refresh(None).await;
        }
        if let Some(Err(e)) = reset_if_due(&inner).await {
            // Nothing can be sent without an id: try again after the backoff.
            tracing::warn!(%e, "could not get a new producer id");
            tokio::time::sleep(inner.cluster.config().retry_backoff).await;
            continue;
        }
        let metadata = inner.cluster.fresh_metadata().await;
        let Drained { requests, expired, next_deadline, finished } = {
            let mut state = inner.state.lock().unwrap_or_else(|e| e.into_inner());
            drain(&inner.config, &mut state, &metadata, &mut refresh_due)
        };
        for batch in expired {
            inner.complete(&batch, Outcome::Failed(Error::DeliveryTimeout(inner.config.delivery_timeout)));
        }
        let sent_any = !requests.is_empty();
        for (broker, batches) in requests {
            send_request(&inner, broker, batches).await;
        }
        if finished {
            return;
        }
        if sent_any {
            // More may be sendable right away (a partition sends one batch per request).
            continue;
        }
        let sleep = next_deadline.map(|d| tokio::time::sleep_until(d.into()));
        match sleep {
            _ if refresh_due => tokio::time::sleep(inner.cluster.config().retry_backoff).await,
            Some(sleep) => {
                tokio::select! {
                    _ = &mut woken => {}
                    _ = sleep => {}
                }
            }
            None => woken.await,
        }
    }
}

/// After a stamped batch failed for good: once nothing is in flight, bumps the epoch of
/// the producer id and restarts every partition's sequence (batches already stamped are
/// stamped again when sent); a broker takes a newer epoch that starts at sequence 0, so
/// no InitProducerId round trip is needed (KIP-360, as the Java client does for an
/// idempotent producer). Only when the epoch would overflow is a new producer id taken.
/// `None` when no reset is due now.
async fn reset_if_due(inner: &Arc<Inner>) -> Option<Result<()>> {
    let current = {
        let state = inner.state.lock().unwrap_or_else(|e| e.into_inner());
        if !state.reset_pending || state.in_flight.values().any(|&n| n > 0) {
            return None;
        }
        state.identity
    };
    let identity = match current.filter(|c| c.epoch < i16::MAX - 1) {
        Some(current) => ProducerIdentity { id: current.id, epoch: current.epoch + 1 },
        None => match init_producer_id(&inner.cluster, inner.config.delivery_timeout).await {
            Ok(identity) => identity,
            Err(e) => return Some(Err(e)),
        },
    };
    tracing::info!(producer_id = identity.id, epoch = identity.epoch, "a batch failed: continuing in a new producer epoch");
    let mut state = inner.state.lock().unwrap_or_else(|e| e.into_inner());
    state.identity = Some(identity);
    state.reset_pending = false;
    for topic in state.topics.values_mut() {
        for queue in &mut topic.partitions {
            queue.next_sequence = 0;
            queue.acked_sequence = 0;
            queue.window.clear();
        }
    }
    Some(Ok(()))
}

/// What one pass of the sender found to do.
struct Drained {
    /// Produce requests to send: leader broker id and its batches.
    requests: Vec<(i32, Vec<ReadyBatch>)>,
    /// Batches past `delivery.timeout.ms` that were never sent (no leader, say).
    expired: Vec<ReadyBatch>,
    /// The earliest time something else becomes sendable.
    next_deadline: Option<Instant>,
    /// Closed, with nothing left.
    finished: bool,
}

/// Takes every batch that may be sent now, grouped by leader, respecting the in-flight
/// limit and one batch per partition per request.
fn drain(config: &ProducerConfig, state: &mut State, metadata: &crate::cluster::Metadata, refresh_due: &mut bool) -> Drained {
    let now = Instant::now();
    let mut expired = Vec::new();
    let force = state.flushing > 0 || state.closing;
    let mut next_deadline: Option<Instant> = None;
    let mut per_broker: HashMap<i32, Vec<Vec<ReadyBatch>>> = HashMap::new();
    let mut request_sizes: HashMap<i32, usize> = HashMap::new();
    let State { topics, in_flight, identity, reset_pending, .. } = state;
    // A hole in a sequence: nothing goes out until the producer has a new id.
    let stalled = *reset_pending;
    for topic in topics.values_mut() {
        let leaders = metadata.topics.get(&*topic.name);
        for (p, queue) in topic.partitions.iter_mut().enumerate() {
            while queue.ready.front().is_some_and(|b| b.created.elapsed() >= config.delivery_timeout) {
                expired.extend(queue.ready.pop_front());
            }
            if queue.open.as_ref().is_some_and(|o| o.created.elapsed() >= config.delivery_timeout) {
                expired.extend(queue.open.take().and_then(|o| o.close(&topic.name, p as i32, config.compression).ok()));
            }
            let linger_over = |o: &OpenBatch| force || o.created + config.linger <= now;
            let open_sendable = force || queue.open_sendable();
            if let Some(open) = &queue.open {
                if !linger_over(open) {
                    let deadline = open.created + config.linger;
                    next_deadline = Some(next_deadline.map_or(deadline, |d| d.min(deadline)));
                }
            }
            let has_ready = queue.ready.front().is_some() || (open_sendable && queue.open.as_ref().is_some_and(linger_over));
            if !has_ready || stalled {
                continue;
            }
            if let Some(retry_at) = queue.ready.front().and_then(|b| b.retry_at).filter(|&t| t > now) {
                next_deadline = Some(next_deadline.map_or(retry_at, |d| d.min(retry_at)));
                continue;
            }
            // Idempotence: a new batch waits while 5 numbered ones are unresolved (see
            // `PartitionQueue::outstanding`); retries go first anyway, in sequence order.
            if let Some(id) = *identity {
                let front_is_new = queue.ready.front().is_none_or(|b| b.stamp.is_none_or(|s| s.identity != id));
                if front_is_new && queue.window.len() >= MAX_IN_FLIGHT_IDEMPOTENT {
                    continue;
                }
            }
            let leader = leaders.and_then(|t| t.partitions.get(p)).map_or(-1, |pm| pm.leader);
            queue.leader = (leader >= 0).then_some(leader);
            if leader < 0 || !metadata.brokers.contains_key(&leader) {
                *refresh_due = true;
                continue;
            }
            let requests = per_broker.entry(leader).or_default();
            let used = in_flight.get(&leader).copied().unwrap_or(0) + requests.len();
            let size = request_sizes.entry(leader).or_insert(usize::MAX);
            let next_size =
                queue.ready.front().map_or_else(|| queue.open.as_ref().map_or(0, |o| o.builder.size()), |b| b.bytes.len());
            let fits = size.saturating_add(next_size) <= config.max_request_size;
            if !fits && used >= config.max_in_flight {
                continue;
            }
            let mut batch = match queue.ready.pop_front() {
                Some(b) => b,
                None => match queue.open.take().map(|o| o.close(&topic.name, p as i32, config.compression)) {
                    Some(Ok(b)) => {
                        if topic.sticky == Some(p as i32) {
                            topic.sticky = None;
                        }
                        b
                    }
                    Some(Err(e)) => {
                        // Compression into memory does not fail in practice; if it does,
                        // the batch's records fail with the reason.
                        tracing::error!(%e, "could not build batch");
                        continue;
                    }
                    None => continue,
                },
            };
            if let Some(identity) = *identity {
                if batch.stamp.is_none_or(|s| s.identity != identity) {
                    let sequence = queue.next_sequence;
                    queue.next_sequence = add_sequence(sequence, batch.records);
                    queue.window.push_back((sequence, false));
                    batch.stamp(identity, sequence);
                }
            }
            queue.sending += 1;
            if fits {
                *size += batch.bytes.len();
                requests.last_mut().expect("size is MAX until a request exists").push(batch);
            } else {
                *size = batch.bytes.len();
                requests.push(vec![batch]);
            }
        }
    }
    let mut out = Vec::new();
    for (broker, requests) in per_broker {
        for batches in requests {
            *in_flight.entry(broker).or_default() += 1;
            out.push((broker, batches));
        }
    }
    let finished = state.closing && state.incomplete == 0;
    Drained { requests: out, expired, next_deadline, finished }
}

async fn send_request(inner: &Arc<Inner>, broker: i32, batches: Vec<ReadyBatch>) {
    let release = move |inner: &Inner, batches: &[ReadyBatch]| {
        let mut state = inner.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = state.in_flight.get_mut(&broker) {
            *n = n.saturating_sub(1);
        }
        for b in batches {
            if let Some(queue) = state.queue(&b.topic, b.partition) {
                queue.sending = queue.sending.saturating_sub(1);
            }
        }
        drop(state);
        inner.wake_sender.notify_one();
    };
    let conn = match inner.cluster.broker(broker).await {
        Ok(c) => c,
        Err(e) => {
            release(inner, &batches);
            // A leader that refuses connections has usually died: until the metadata
            // names its successor, every retry would go to it again.
            let refresh = e.needs_metadata_refresh();
            for b in batches {
                inner.retry_or_fail(b, e.clone());
            }
            if refresh {
                refresh_in_background(inner);
            }
            return;
        }
    };
    let version = match conn.version::<ProduceRequest>(PRODUCE_VERSION) {
        Ok(v) => v,
        Err(e) => {
            release(inner, &batches);
            for b in batches {
                inner.complete(&b, Outcome::Failed(e.clone()));
            }
            return;
        }
    };
    let body = produce_body(inner.config.acks, inner.config.client.request_timeout, version, &batches);
    if inner.config.acks == Acks::None {
        let written = conn.send_parts_oneway::<ProduceRequest>(body, version).await;
        let inner = inner.clone();
        tokio::spawn(async move {
            let result = match written {
                Ok(w) => w.await,
                Err(e) => Err(e),
            };
            release(&inner, &batches);
            for b in batches {
                match &result {
                    Ok(()) => inner.complete(&b, Outcome::Sent { base_offset: -1 }),
                    Err(e) => inner.retry_or_fail(b, e.clone()),
                }
            }
        });
        return;
    }
    // The response is handled on the connection's reader task, as it arrives: no task
    // and no timer per request (each cost more than the handling itself).
    let then = {
        let inner = inner.clone();
        let addr = conn.shared_addr();
        move |result: Result<ProduceResponse>| {
            release(&inner, &batches);
            match result {
                Ok(response) => handle_response(&inner, &addr, batches, response),
                Err(e) => {
                    let refresh = e.needs_metadata_refresh();
                    for b in batches {
                        inner.retry_or_fail(b, e.clone());
                    }
                    if refresh {
                        refresh_in_background(&inner);
                    }
                }
            }
        }
    };
    conn.send_parts_then::<ProduceRequest>(body, version, then).await;
}

/// A Produce request's body for `batches`, grouped by topic in order of appearance.
fn produce_body(acks: Acks, timeout: Duration, version: i16, batches: &[ReadyBatch]) -> BodyParts {
    let mut topics: Vec<request::TopicBatches<'_>> = Vec::new();
    for b in batches {
        match topics.iter_mut().find(|(name, _)| **name == *b.topic) {
            Some((_, partitions)) => partitions.push((b.partition, &b.bytes)),
            None => topics.push((&b.topic, vec![(b.partition, &b.bytes)])),
        }
    }
    request::produce_body(version, acks.wire(), timeout.as_millis() as i32, &topics)
}

fn handle_response(inner: &Arc<Inner>, broker: &str, batches: Vec<ReadyBatch>, response: ProduceResponse) {
    let mut refresh = false;
    for batch in batches {
        let result = response
            .responses
            .iter()
            .filter(|t| *t.name.0 == *batch.topic)
            .flat_map(|t| &t.partition_responses)
            .find(|p| p.index == batch.partition);
        let Some(result) = result else {
            let detail = format!("no produce result for {}-{}", batch.topic, batch.partition);
            inner.complete(&batch, Outcome::Failed(Error::Protocol { broker: broker.to_string(), detail }));
            continue;
        };
        let context = || format!("produce to {}-{}", batch.topic, batch.partition);
        match Error::kafka(result.error_code, context(), result.error_message.as_ref().map(|m| m.to_string())) {
            None => inner.complete(&batch, Outcome::Sent { base_offset: result.base_offset }),
            // Older brokers answer a retry of an appended batch this way: it is stored.
            Some(e) if e.code() == Some(ResponseError::DuplicateSequenceNumber) => {
                inner.complete(&batch, Outcome::Sent { base_offset: result.base_offset })
            }
            Some(e) if e.code() == Some(ResponseError::OutOfOrderSequenceNumber) => {
                let retriable = inner.state.lock().unwrap_or_else(|e| e.into_inner()).earlier_batch_pending(&batch);
                inner.retry_or_fail_as(batch, e, retriable);
            }
            Some(e) if e.code() == Some(ResponseError::MessageTooLarge) && batch.records > 1 => {
                split_and_resend(inner, batch);
            }
            Some(e) => {
                refresh |= e.needs_metadata_refresh();
                inner.retry_or_fail(batch, e);
            }
        }
    }
    if refresh {
        refresh_in_background(inner);
    } else {
        inner.wake_sender.notify_one();
    }
}

/// Refreshes the metadata off the sender task, then wakes the sender to retry on it.
fn refresh_in_background(inner: &Arc<Inner>) {
    let inner = inner.clone();
    tokio::spawn(async move {
        let _ = inner.cluster.refresh(None).await;
        inner.wake_sender.notify_one();
    });
}

/// Replaces a batch the broker found too large by one batch per record; the original
/// batch completes record by record when they do.
fn split_and_resend(inner: &Arc<Inner>, batch: ReadyBatch) {
    let parts = match split_batch(&batch.bytes, inner.config.compression) {
        Ok(parts) => parts,
        Err(e) => {
            inner.complete(&batch, Outcome::Failed(e));
            return;
        }
    };
    let completions: Vec<Arc<Completion>> = parts.iter().map(|_| Arc::new(Completion::default())).collect();
    {
        let mut state = inner.state.lock().unwrap_or_else(|e| e.into_inner());
        state.incomplete += parts.len();
        let partitions = state.topics.get(&*batch.topic).map_or(0, |t| t.partitions.len()) as i32;
        let queue = &mut state.topics.entry_ref(&batch.topic.clone(), partitions).partitions[batch.partition as usize];
        if let Some(stamp) = batch.stamp {
            // The parts take the original's place in the window, one sequence each.
            if let Some(at) = queue.window.iter().position(|(sequence, _)| *sequence == stamp.sequence) {
                queue.window.remove(at);
                for i in (0..parts.len()).rev() {
                    queue.window.insert(at, (add_sequence(stamp.sequence, i), false));
                }
            }
        }
        for (i, (bytes, completion)) in parts.into_iter().zip(&completions).enumerate().rev() {
            let mut part = ReadyBatch {
                topic: batch.topic.clone(),
                partition: batch.partition,
                bytes,
                records: 1,
                completion: completion.clone(),
                memory: 0,
                created: batch.created,
                attempts: batch.attempts,
                retry_at: None,
                stamp: None,
                audit: Vec::new(),
            };
            // The parts take the original batch's sequence numbers, one each.
            if let Some(stamp) = batch.stamp {
                part.stamp(stamp.identity, add_sequence(stamp.sequence, i));
            }
            queue.ready.push_front(part);
        }
    }
    inner.wake_sender.notify_one();
    let inner = inner.clone();
    tokio::spawn(async move {
        let mut results = Vec::with_capacity(completions.len());
        for c in &completions {
            results.push(c.wait().await);
        }
        inner.complete(&batch, Outcome::PerRecord(results));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acks_parse_like_kafka() {
        assert_eq!("0".parse::<Acks>().unwrap(), Acks::None);
        assert_eq!("1".parse::<Acks>().unwrap(), Acks::Leader);
        assert_eq!("all".parse::<Acks>().unwrap(), Acks::All);
        assert_eq!("-1".parse::<Acks>().unwrap(), Acks::All);
        assert!("2".parse::<Acks>().is_err());
    }

    #[test]
    fn encoded_size_is_an_upper_bound() {
        let r = ProducerRecord::new("t", vec![1u8; 200]).key(&b"k"[..]).header("h", Some(Bytes::from_static(b"v")));
        let mut b = BatchBuilder::new(0);
        b.append(0, Some(b"k"), Some(&[1u8; 200]), &[("h", Some(b"v"))]);
        assert!(r.encoded_size() >= b.size() - BATCH_OVERHEAD);
        assert!(r.encoded_size() <= b.size() - BATCH_OVERHEAD + 40);
    }

    #[test]
    fn the_send_future_stays_small() {
        // It is moved (copied) on every send: the waiting path must stay boxed.
        fn size_of_send<'a, F>(_: fn(&'a Producer, ProducerRecord) -> F) -> usize {
            std::mem::size_of::<F>()
        }
        let size = size_of_send(|p, r| p.send(r));
        assert!(size <= 1024, "send future is {size} bytes (it was 2.5 KB with the waiting path inline)");
    }

    #[test]
    fn config_is_validated() {
        let c = ProducerConfig { max_in_flight: 0, ..ProducerConfig::default() };
        assert!(matches!(c.validate(), Err(Error::InvalidConfig(_))));
        let c = ProducerConfig { buffer_memory: 10, ..ProducerConfig::default() };
        assert!(matches!(c.validate(), Err(Error::InvalidConfig(_))));
        assert!(ProducerConfig::default().validate().is_ok());
    }

    #[test]
    fn idempotence_is_on_by_default_unless_settings_conflict() {
        assert!(ProducerConfig::default().idempotent());
        for c in [
            ProducerConfig { acks: Acks::Leader, ..ProducerConfig::default() },
            ProducerConfig { retries: 0, ..ProducerConfig::default() },
            ProducerConfig { max_in_flight: 6, ..ProducerConfig::default() },
        ] {
            assert!(!c.idempotent());
            assert!(c.validate().is_ok());
            let explicit = ProducerConfig { enable_idempotence: Some(true), ..c };
            assert!(matches!(explicit.validate(), Err(Error::InvalidConfig(_))));
        }
        assert!(!ProducerConfig { enable_idempotence: Some(false), ..ProducerConfig::default() }.idempotent());
        assert_eq!(add_sequence(i32::MAX, 1), 0);
        assert_eq!(add_sequence(i32::MAX - 1, 3), 1);
        assert!(sequence_ahead(5, 3) && !sequence_ahead(3, 5) && !sequence_ahead(3, 3));
        assert!(sequence_ahead(2, i32::MAX - 1), "across the wrap");
    }
}
