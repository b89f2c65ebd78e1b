//! The accumulator: per topic and partition, the open batch records are appended to and
//! the closed batches waiting for the sender, with the `send` path that appends (the
//! partitioner's choice, the sticky partition) and the `buffer.memory` budget a send
//! waits on.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use fjord_record::{now_ms, BatchBuilder, Compression, BATCH_OVERHEAD};

use super::batch::{Completion, DeliveryFuture};
use super::idempotence::{ProducerIdentity, Stamp};
use super::{Inner, Producer, ProducerConfig, ProducerRecord};
use crate::error::{Error, Result};
use crate::partitioner::{partition_for_key, Random};

/// A send finding `buffer.memory` full waits for this fraction of it to be free
/// (see `Inner::reserve`)...
const REFILL_FRACTION: usize = 32;
/// ...for at most this long, then for its own record's bytes only.
const REFILL_WAIT: Duration = Duration::from_millis(50);

/// Topic names are the application's own, so a fast non-keyed hash (FNV-1a) is safe
/// here; SipHash showed up in profiles of the send path.
#[derive(Clone, Copy)]
pub(super) struct Fnv(u64);

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

pub(super) type TopicMap = HashMap<Arc<str>, TopicState, std::hash::BuildHasherDefault<Fnv>>;

#[derive(Default)]
pub(super) struct State {
    pub(super) topics: TopicMap,
    /// Batches created and not completed yet.
    pub(super) incomplete: usize,
    pub(super) flushing: usize,
    pub(super) closing: bool,
    /// In-flight requests per broker id.
    pub(super) in_flight: HashMap<i32, usize>,
    pub(super) random: Option<Random>,
    /// The idempotent producer's id and epoch; `None` when not idempotent.
    pub(super) identity: Option<ProducerIdentity>,
    /// A stamped batch failed for good: bump the producer epoch before sending more.
    pub(super) reset_pending: bool,
    /// A newer producer of the transactional id fenced this one (see [`Inner::fence`]):
    /// every later call fails with this error.
    pub(super) fenced: Option<Error>,
    /// A transactional producer's open transaction.
    pub(super) transaction: super::transaction::Transaction,
    /// Transactions begun so far: the open one's number, which a partition's
    /// [`PartitionQueue::enlisted`] matches once the partition joined it.
    pub(super) transactions: u64,
}

pub(super) struct TopicState {
    pub(super) name: Arc<str>,
    /// Partition count as of metadata version `metadata_version`.
    pub(super) partition_count: i32,
    pub(super) metadata_version: u64,
    pub(super) partitions: Vec<PartitionQueue>,
    pub(super) sticky: Option<i32>,
}

impl TopicState {
    /// The partition of a keyless record of `size` bytes sent without a partition: the
    /// sticky partition, unless the record does not fit in its open batch. That batch is
    /// then full: it is closed, and the record goes to the next sticky partition, not to
    /// a new batch here (KIP-480). Otherwise a batch size that records never fill exactly
    /// (the usual case) kept every keyless record on one partition for as long as the
    /// sender had no idle moment. Returns the partition, and the one whose batch this
    /// closed.
    pub(super) fn sticky_partition(
        &mut self,
        random: &mut Option<Random>,
        partitions: i32,
        size: usize,
        config: &ProducerConfig,
    ) -> Result<(i32, Option<i32>)> {
        let sticky = *self.sticky.get_or_insert_with(|| random.as_mut().map_or(0, |r| r.partition(partitions, None)));
        let queue = &mut self.partitions[sticky as usize];
        if !queue.close_if_no_room(size, config.batch_size, &self.name, sticky, config.compression)? {
            return Ok((sticky, None));
        }
        Ok((self.move_sticky(random, partitions, sticky), Some(sticky)))
    }

    /// Makes a partition other than `full` (whose batch just filled) the sticky one, and
    /// returns it.
    pub(super) fn move_sticky(&mut self, random: &mut Option<Random>, partitions: i32, full: i32) -> i32 {
        let next = random.as_mut().map_or(0, |r| r.partition(partitions, Some(full)));
        self.sticky = Some(next);
        next
    }
}

#[derive(Default)]
pub(super) struct PartitionQueue {
    pub(super) open: Option<OpenBatch>,
    pub(super) ready: VecDeque<ReadyBatch>,
    /// Idempotence: the producer id and epoch the partition's sequence numbers below
    /// belong to (`None` until its first batch is numbered). After an epoch bump it
    /// stays on the old epoch while a batch numbered in it may be stored (see
    /// [`PartitionQueue::holds_unresolved`]).
    pub(super) identity: Option<ProducerIdentity>,
    /// Idempotence: the sequence number of the next batch sent for the first time.
    pub(super) next_sequence: i32,
    /// Idempotence: the sequence after the last acknowledged batch.
    pub(super) acked_sequence: i32,
    /// Idempotence: the sequences of the batches numbered since the oldest one still
    /// unresolved (in flight or waiting for a retry), with whether each completed. A new
    /// batch is numbered only while this holds fewer than 5: the broker remembers a
    /// producer's last 5 batches, so a retry of the oldest one is still recognised even
    /// if every later batch was appended meanwhile.
    pub(super) window: VecDeque<(i32, bool)>,
    /// Batches of this partition in requests not answered yet.
    pub(super) sending: usize,
    /// The partition's leader when the sender last looked (`None` before it did).
    pub(super) leader: Option<i32>,
    /// Transactional: the number of the last transaction the partition was added to
    /// (0: none). Until it is the open transaction's, the partition's batches wait: the
    /// sender adds it (AddPartitionsToTxn, see `super::transaction`) before it sends them.
    pub(super) enlisted: u64,
}

impl PartitionQueue {
    /// Whether a batch waiting for a retry was numbered in the partition's epoch and may
    /// be stored already (its answer was lost): sent again in another epoch, the broker
    /// could not tell it from a new batch and would store it twice.
    pub(super) fn holds_unresolved(&self) -> bool {
        self.ready.iter().any(|b| b.maybe_stored && b.stamp.is_some_and(|s| Some(s.identity) == self.identity))
    }

    /// Restarts the partition's sequence numbers at 0 in the epoch of `identity`;
    /// batches numbered before are numbered again when sent.
    pub(super) fn restart_sequences(&mut self, identity: ProducerIdentity) {
        self.identity = Some(identity);
        self.next_sequence = 0;
        self.acked_sequence = 0;
        self.window.clear();
    }

    /// Whether the sender may take the open (not full) batch of this partition now,
    /// linger aside: not while [`OPEN_BATCH_HOLD`] of the partition's batches are in
    /// flight. It fills up meanwhile, and the answer to one of them wakes the sender.
    pub(super) fn open_sendable(&self) -> bool {
        self.sending < OPEN_BATCH_HOLD
    }

    /// Every batch of the partition not sent yet, the open one closed: for the caller to
    /// fail when none of them may go out.
    pub(super) fn take_unsent(&mut self, topic: &Arc<str>, partition: i32, codec: Compression) -> Vec<ReadyBatch> {
        let mut unsent: Vec<ReadyBatch> = self.ready.drain(..).collect();
        unsent.extend(self.open.take().and_then(|o| o.close(topic, partition, codec).ok()));
        unsent
    }

    /// Closes the open batch into `ready` when a record of `size` bytes would take it
    /// past `batch_size`; says whether it did.
    fn close_if_no_room(
        &mut self,
        size: usize,
        batch_size: usize,
        topic: &Arc<str>,
        partition: i32,
        codec: Compression,
    ) -> Result<bool> {
        match self.open.take_if(|open| open.builder.size() + size > batch_size) {
            Some(full) => {
                self.ready.push_back(full.close(topic, partition, codec)?);
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

pub(super) struct OpenBatch {
    pub(super) builder: BatchBuilder,
    pub(super) created: Instant,
    pub(super) completion: Arc<Completion>,
    pub(super) memory: usize,
    /// With an audit hook, each record's creation time as the hook gave it.
    pub(super) audit: Vec<i64>,
}

/// A closed batch, waiting to be sent or retried.
pub(crate) struct ReadyBatch {
    pub(super) topic: Arc<str>,
    pub(super) partition: i32,
    pub(super) bytes: Bytes,
    pub(super) records: usize,
    pub(super) completion: Arc<Completion>,
    pub(super) memory: usize,
    pub(super) created: Instant,
    pub(super) attempts: u32,
    pub(super) retry_at: Option<Instant>,
    /// Idempotence: id, epoch and sequence, from the first time it was sent.
    pub(super) stamp: Option<Stamp>,
    /// An attempt ended without an answer saying what became of the batch (the
    /// connection broke, the request timed out): the broker may have stored it.
    pub(super) maybe_stored: bool,
    /// With an audit hook, each record's creation time (empty for the parts of a split
    /// batch: the original batch reports its records when the parts are done).
    pub(super) audit: Vec<i64>,
}

impl Producer {
    /// Queues `record` for sending. Waits only for metadata (of a new topic, or of an
    /// explicit partition beyond the partitions known, which may just have been added:
    /// up to `max.block.ms`) and for buffer space; the returned future resolves when the
    /// broker acknowledged the record.
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

    /// Appends a record whose `size` bytes of buffer memory are reserved, after its
    /// topic's metadata when it has to wait for it.
    async fn append(&self, record: ProducerRecord, size: usize) -> Result<DeliveryFuture> {
        let timestamp = record.timestamp.unwrap_or_else(now_ms);
        let mut record = record;
        let mut known = None;
        loop {
            let version = self.inner.cluster.metadata_version();
            match self.append_locked(record, size, timestamp, version, known)? {
                Ok(future) => return Ok(future),
                Err(back) => {
                    known = Some(match back.partition {
                        Some(p) => self.inner.partition_count_with(&back.topic, p).await?,
                        None => self.inner.partition_count(&back.topic).await?,
                    });
                    record = back;
                }
            }
        }
    }

    /// The append itself, under one lock. The partition count comes from `known`
    /// (fetched for this record), else from the topic's cache, valid while the metadata
    /// stays at `version`; with neither, or with an explicit partition beyond the cached
    /// count, the record comes back (`Err`) for the caller to fetch the metadata. One
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
        // `known` was fetched for this record, so it is at least as new as the cache.
        let Some(partitions) = known.or(cached) else {
            return Ok(Err(record));
        };
        if let Some(p) = record.partition {
            if !(0..partitions).contains(&p) {
                // The partition may have been added since the metadata was fetched: the
                // caller fetches it again (up to max.block.ms) before giving up.
                if known.is_none() {
                    return Ok(Err(record));
                }
                return Err(Error::UnknownPartition { topic: record.topic, partition: p });
            }
        }
        if state.closing {
            return Err(Error::ProducerClosed);
        }
        let transactional = inner.config.transactional_id.is_some();
        if let Some(e) = &state.fenced {
            return Err(e.clone());
        }
        if transactional && !state.transaction.open {
            return Err(Error::TransactionState("send outside a transaction: call begin_transaction first".into()));
        }
        if transactional && state.transaction.failed {
            // The coordinator aborted it: a record sent now would join a transaction of
            // the new epoch that nobody ends.
            return Err(Error::TransactionState("the transaction was aborted: a record of it failed: abort it".into()));
        }
        let State { topics, random, incomplete, in_flight, .. } = state;
        let topic = topics.entry_ref(&record.topic, partitions);
        topic.partition_count = partitions;
        topic.metadata_version = version;
        let name = topic.name.clone();
        // Wake the sender only when it could send something: not while the leader has
        // max.in.flight requests out, nor for a new open batch that its partition's
        // batches in flight hold back (an answer wakes it then). At full speed, a wake-up
        // per batch was a futex wake and a context switch per batch, mostly for nothing.
        let leader_free = |queue: &PartitionQueue| {
            queue.leader.is_none_or(|l| in_flight.get(&l).is_none_or(|&n| n < inner.config.max_in_flight))
        };
        let partition = match (record.partition, &record.key) {
            (Some(p), _) => p,
            (None, Some(key)) => partition_for_key(key, partitions),
            (None, None) => {
                let (partition, closed) = topic.sticky_partition(random, partitions, size, &inner.config)?;
                if let Some(full) = closed {
                    *woke |= leader_free(&topic.partitions[full as usize]);
                }
                partition
            }
        };
        let queue = &mut topic.partitions[partition as usize];
        let leader_free = leader_free(queue);
        if queue.close_if_no_room(size, inner.config.batch_size, &name, partition, inner.config.compression)? {
            *woke |= leader_free;
        }
        let open_sendable = queue.open_sendable();
        let open = queue.open.get_or_insert_with(|| {
            *incomplete += 1;
            *woke |= leader_free && open_sendable;
            OpenBatch {
                builder: match inner.config.transactional_id {
                    None => BatchBuilder::with_capacity(timestamp, inner.config.batch_size.min(1 << 20)),
                    Some(_) => BatchBuilder::with_capacity(timestamp, inner.config.batch_size.min(1 << 20)).transactional(),
                },
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
            if record.key.is_none() && topic.sticky == Some(partition) {
                // The sticky partition's batch is full: stick to another one next. (Keyless
                // records of a transaction that waited for their partition to join it
                // come back with the sticky one set.)
                topic.move_sticky(random, partitions, partition);
            }
            *woke |= leader_free;
        }
        Ok(Ok(future))
    }
}

pub(super) trait TopicsExt {
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

impl OpenBatch {
    pub(super) fn close(self, topic: &Arc<str>, partition: i32, codec: Compression) -> Result<ReadyBatch> {
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
            maybe_stored: false,
            audit: self.audit,
        })
    }
}

impl Inner {
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
}

impl State {
    pub(super) fn queue(&mut self, topic: &str, partition: i32) -> Option<&mut PartitionQueue> {
        self.topics.get_mut(topic)?.partitions.get_mut(usize::try_from(partition).ok()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_send_future_stays_small() {
        // It is moved (copied) on every send: the waiting path must stay boxed.
        fn size_of_send<'a, F>(_: fn(&'a Producer, ProducerRecord) -> F) -> usize {
            std::mem::size_of::<F>()
        }
        let size = size_of_send(|p, r| p.send(r));
        assert!(size <= 1024, "send future is {size} bytes (it was 2.5 KB with the waiting path inline)");
    }
}
