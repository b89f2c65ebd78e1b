//! The asynchronous producer.
//!
//! `send` appends a record to its partition's open batch (a [`BatchBuilder`](fjord_record::BatchBuilder), so a record
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
//! the record that is really too large fails; so does INVALID_RECORD or INVALID_TIMESTAMP
//! naming some of a batch's records, so only those fail and the others are stored.
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
//!
//! Transactions (`transactional.id`, see the `transaction` module): `connect` takes the
//! producer id from the transaction coordinator, and records sent between
//! `begin_transaction` and `commit_transaction`/`abort_transaction` are committed or
//! aborted together, with the consumer offsets of `send_offsets_to_transaction`.
//!
//! # Layout
//! - this file: the [`Producer`] handle, connecting, `flush` and `close`;
//! - `config`: [`ProducerConfig`] and [`Acks`];
//! - `record`: [`ProducerRecord`];
//! - `accumulator`: the per-partition queues of open and closed batches, `send` appending
//!   into them, the partitioner's choice and the `buffer.memory` budget;
//! - `sender`: the sender task that drains the queues into produce requests, and the
//!   completion, retry and splitting of batches from their answers;
//! - `idempotence`: producer id, epoch and sequence numbers (InitProducerId, the epoch bump);
//! - `transaction`: the transactional producer (begin, enlisting partitions, offsets,
//!   commit, abort);
//! - `batch`: a batch's completion and the per-record delivery futures;
//! - `request`: the Produce request body.

mod accumulator;
mod batch;
mod config;
mod idempotence;
mod record;
mod request;
mod sender;
mod transaction;

use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::{Notify, Semaphore};

use self::accumulator::State;
use self::idempotence::{init_producer_id, ProducerIdentity};
use self::sender::sender_loop;
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::partitioner::Random;

pub use batch::{DeliveryFuture, RecordMetadata};
pub use config::{Acks, ProducerConfig};
pub use record::ProducerRecord;

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
    /// Signalled whenever a batch completes (flush waits on it), an epoch bump ends, or
    /// the producer is fenced (commit and abort wait for a pending bump).
    batch_done: Notify,
}

impl Producer {
    /// Connects to the cluster, gets a producer id when idempotent, and starts the
    /// sender task.
    pub async fn connect(config: ProducerConfig) -> Result<Self> {
        config.validate()?;
        let cluster = Cluster::connect(config.client.clone()).await?;
        let identity = match (&config.transactional_id, config.idempotent()) {
            (Some(id), _) => {
                let txn = crate::transaction::TransactionalId { id: id.clone(), timeout: config.transaction_timeout };
                let deadline = std::time::Instant::now() + config.delivery_timeout;
                let (id, epoch) = txn.init_producer_id(&cluster, deadline, None).await?;
                Some(ProducerIdentity::new(id, epoch))
            }
            (None, true) => Some(init_producer_id(&cluster, config.delivery_timeout).await?),
            (None, false) => None,
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

    /// Sends everything buffered now (ignoring `linger.ms`) and waits until every batch
    /// created so far has completed, successfully or not.
    pub async fn flush(&self) {
        let inner = &self.inner;
        inner.state.lock().unwrap_or_else(|e| e.into_inner()).flushing += 1;
        inner.wake_sender.notify_one();
        inner.until(|state| (state.incomplete == 0).then_some(())).await;
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

    /// Partitions of `topic` in metadata fetched now, not the cached count: one metadata
    /// round trip, for a caller that must tell at once whether a partition exists (a
    /// partition just added with CreatePartitions is missing from the cache until
    /// `metadata.max.age.ms`). Later sends use the fresh count too.
    pub async fn fresh_partition_count(&self, topic: &str) -> Result<i32> {
        let md = self.inner.cluster.refresh(Some(&[topic.to_string()])).await?;
        match md.topics.get(topic).map_or(0, |t| t.partitions.len()) {
            0 => Err(Error::UnknownTopic(topic.to_string())),
            n => Ok(n as i32),
        }
    }
}

impl Inner {
    /// Waits until `ready` gives a value, looking at the state again each time
    /// `batch_done` is signalled (listening before looking: no signal is missed).
    async fn until<T>(&self, mut ready: impl FnMut(&State) -> Option<T>) -> T {
        loop {
            let done = self.batch_done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            if let Some(value) = ready(&self.state.lock().unwrap_or_else(|e| e.into_inner())) {
                return value;
            }
            done.await;
        }
    }

    async fn partition_count(&self, topic: &str) -> Result<i32> {
        let t = self.cluster.topic(topic).await?;
        match t.partitions.len() {
            0 => Err(Error::UnknownTopic(topic.to_string())),
            n => Ok(n as i32),
        }
    }

    /// Partitions of `topic` once its metadata shows `partition`. A partition added by
    /// CreatePartitions is missing from metadata fetched before, so, as Kafka's
    /// producer does, the metadata is fetched again (every `retry.backoff.ms`) for up to
    /// `max.block.ms` before the record fails. A negative partition fails at once.
    async fn partition_count_with(&self, topic: &str, partition: i32) -> Result<i32> {
        let started = Instant::now();
        let mut partitions = self.partition_count(topic).await?;
        if partition < 0 {
            return Err(Error::UnknownPartition { topic: topic.to_string(), partition });
        }
        let mut refreshed = false;
        while partition >= partitions {
            let waited = started.elapsed();
            if refreshed && waited >= self.config.max_block {
                return Err(Error::PartitionNotInMetadata { topic: topic.to_string(), partition, partitions, waited });
            }
            if refreshed {
                tokio::time::sleep(self.config.client.retry_backoff.min(self.config.max_block - waited)).await;
            }
            let md = self.cluster.refresh(Some(&[topic.to_string()])).await?;
            refreshed = true;
            partitions = md.topics.get(topic).map_or(0, |t| t.partitions.len() as i32);
        }
        Ok(partitions)
    }
}
