//! What the HTTP and gRPC fronts need from the cluster, as one small trait, and its real
//! implementation over `fjord-client`.
//!
//! [`KafkaBackend`] publishes through one shared [`Producer`] per acks level (the default,
//! `acks=all`, is the only one most gateways ever create), so events of concurrent
//! requests are batched together into large produce requests. Fetches go through a small
//! pool of [`Consumer`]s, one per partition being read, each seeked to the asked offset:
//! the HTTP/gRPC pull stays stateless for the caller, who carries the offset.
//!
//! Atomic publishes go through one transactional producer per gateway (see
//! [`Backend::publish_atomic`]), one transaction at a time.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fjord_client::{
    Acks, Admin, ClientConfig, Consumer, ConsumerConfig, OffsetReset, OffsetSpec, Producer, ProducerConfig, ProducerRecord,
    SeekTo, TopicPartition,
};
use tokio::sync::{Mutex, OnceCell};

use crate::{Error, GatewayConfig, Result};

/// One event to publish.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Event {
    /// Partitioning key.
    pub key: Option<Bytes>,
    /// Payload (`None` is a null value).
    pub value: Option<Bytes>,
    /// Headers in order.
    pub headers: Vec<(String, Option<Bytes>)>,
    /// Creation time, ms since the epoch.
    pub timestamp_ms: Option<i64>,
    /// Explicit partition.
    pub partition: Option<i32>,
}

impl Event {
    /// Bytes this event occupies in a record batch, near enough for budgeting.
    pub fn encoded_size(&self) -> usize {
        let len = |b: &Option<Bytes>| b.as_ref().map_or(0, Bytes::len);
        let headers: usize = self.headers.iter().map(|(k, v)| 10 + k.len() + len(v)).sum();
        24 + len(&self.key) + len(&self.value) + headers
    }
}

/// Where an event landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivered {
    /// Partition.
    pub partition: i32,
    /// Offset (-1 with acks=0).
    pub offset: i64,
}

/// A stateless pull: the paper's (topic, partition, offset, max bytes), plus a long poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchQuery {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: i32,
    /// First offset; -2 = earliest, -1 = the end of the log.
    pub offset: i64,
    /// Bound on the record bytes returned (one record is returned even if larger).
    pub max_bytes: usize,
    /// How long to wait for a record when there is none yet.
    pub max_wait: Duration,
}

/// One fetched record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedRecord {
    /// Offset.
    pub offset: i64,
    /// Timestamp, ms since the epoch.
    pub timestamp_ms: i64,
    /// Key.
    pub key: Option<Bytes>,
    /// Value.
    pub value: Option<Bytes>,
    /// Headers.
    pub headers: Vec<(String, Option<Bytes>)>,
}

/// The answer to a [`FetchQuery`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// Records in offset order.
    pub records: Vec<FetchedRecord>,
    /// The offset to ask for next.
    pub next_offset: i64,
    /// The partition's high watermark as last seen (-1 when unknown).
    pub high_watermark: i64,
}

/// A partition as `GET /topics/{topic}` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionDescription {
    /// Partition number.
    pub partition: i32,
    /// Leader broker id (-1: none).
    pub leader: i32,
    /// Replica broker ids.
    pub replicas: Vec<i32>,
    /// In-sync replica broker ids.
    pub in_sync_replicas: Vec<i32>,
    /// Log start offset.
    pub earliest_offset: i64,
    /// Log end offset.
    pub latest_offset: i64,
}

/// What the fronts need from the cluster.
#[async_trait::async_trait]
pub trait Backend: Send + Sync + 'static {
    /// Publishes `events` to `topic` and waits until each is acknowledged as `acks` asks.
    /// One result per event, in order. Implementations must have checked the topic and
    /// every explicit partition before sending any event, so a request naming a missing
    /// one fails whole, with nothing produced.
    async fn publish(&self, topic: &str, events: Vec<Event>, acks: Acks) -> Result<Vec<Result<Delivered>>>;
    /// Publishes `events` to `topic` in one transaction (acks=all): once this returns `Ok`
    /// every event is visible to read_committed consumers, and on an error none of them
    /// ever is ([`Error::Aborted`], or an error raised before anything was sent), except
    /// an [`Error::Unavailable`] that says the commit's outcome is unknown.
    async fn publish_atomic(&self, topic: &str, events: Vec<Event>) -> Result<Vec<Delivered>>;
    /// One stateless pull.
    async fn fetch(&self, query: FetchQuery) -> Result<Fetched>;
    /// Names of the topics, sorted.
    async fn topics(&self) -> Result<Vec<String>>;
    /// Partitions of a topic with leaders and offsets.
    async fn describe(&self, topic: &str) -> Result<Vec<PartitionDescription>>;
}

/// Fetch consumers kept for partitions being read; beyond this, idle ones are dropped.
const MAX_FETCH_CONSUMERS: usize = 256;
/// How long the broker may hold one fetch at the end of the log: the granularity of the
/// gateway's own long poll loop (and the wait of a `max_wait = 0` fetch at the end).
const FETCH_HOLD: Duration = Duration::from_millis(100);

/// The real backend: `fjord-client` against a Kafka-protocol cluster.
pub struct KafkaBackend {
    config: GatewayConfig,
    /// Indexed by acks level: none, leader, all. Created on first use, so the gateway
    /// starts (and answers 503) while the brokers are still coming up.
    producers: [OnceCell<Producer>; 3],
    admin: OnceCell<Admin>,
    consumers: Mutex<HashMap<(String, i32), SharedConsumer>>,
    /// The transactional producer of atomic publishes; its lock makes them take turns (a
    /// producer has one open transaction at most). `None` until the first one, and again
    /// after a transaction could not be ended cleanly: the next one initializes the
    /// transactional id anew, which aborts whatever the last one left open.
    atomic: Mutex<Option<Producer>>,
}

/// A pooled fetch consumer; its lock serializes the fetches of one partition.
type SharedConsumer = Arc<Mutex<Consumer>>;

impl KafkaBackend {
    /// A backend for the cluster at `config.bootstrap`; connects lazily.
    pub fn new(config: GatewayConfig) -> Self {
        Self {
            config,
            producers: Default::default(),
            admin: OnceCell::new(),
            consumers: Mutex::new(HashMap::new()),
            atomic: Mutex::new(None),
        }
    }

    fn client_config(&self) -> ClientConfig {
        self.config.client_config()
    }

    async fn producer(&self, acks: Acks) -> Result<&Producer> {
        let slot = match acks {
            Acks::None => 0,
            Acks::Leader => 1,
            Acks::All => 2,
        };
        let config = ProducerConfig {
            client: self.client_config(),
            acks,
            batch_size: self.config.batch_bytes,
            linger: self.config.linger,
            delivery_timeout: self.config.broker_timeout,
            // The gateway bounds what it accepts itself (buffer_bytes, answered with 429);
            // the producer's own bound is a backstop that must not make sends wait.
            buffer_memory: (self.config.buffer_bytes * 2).max(ProducerConfig::default().max_request_size),
            max_block: self.config.broker_timeout,
            ..ProducerConfig::default()
        };
        let connect = self.producers[slot].get_or_try_init(|| Producer::connect(config));
        bounded(self.config.broker_timeout, "connecting the producer", connect).await
    }

    async fn admin(&self) -> Result<&Admin> {
        let connect = self.admin.get_or_try_init(|| Admin::connect(self.client_config()));
        bounded(self.config.broker_timeout, "connecting the admin client", connect).await
    }

    async fn consumer(&self, topic: &str, partition: i32) -> Result<SharedConsumer> {
        let key = (topic.to_string(), partition);
        if let Some(c) = self.consumers.lock().await.get(&key) {
            return Ok(c.clone());
        }
        let config = ConsumerConfig {
            client: ClientConfig { allow_auto_create_topics: false, ..self.client_config() },
            fetch_max_wait: FETCH_HOLD,
            max_partition_fetch_bytes: self.config.max_fetch_bytes as i32,
            fetch_max_bytes: self.config.max_fetch_bytes as i32,
            auto_offset_reset: OffsetReset::None,
            ..ConsumerConfig::default()
        };
        let connect = async {
            let mut c = Consumer::connect(config).await?;
            c.assign([TopicPartition::new(topic, partition)]).await?;
            Ok::<_, fjord_client::Error>(c)
        };
        let consumer = Arc::new(Mutex::new(bounded(self.config.broker_timeout, "connecting a consumer", connect).await?));
        let mut pool = self.consumers.lock().await;
        if pool.len() >= MAX_FETCH_CONSUMERS {
            // Drop idle consumers (nobody holds their lock); busy ones stay.
            pool.retain(|_, c| Arc::strong_count(c) > 1 || c.try_lock().is_err());
        }
        Ok(pool.entry(key).or_insert(consumer).clone())
    }
}

/// Runs `f` with the bound on broker waits: past it the answer is 503, never a hang.
pub(crate) async fn bounded<T>(
    limit: Duration,
    what: &str,
    f: impl std::future::Future<Output = fjord_client::Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(limit, f).await {
        Ok(r) => r.map_err(Error::from),
        Err(_) => Err(Error::Unavailable(format!("{what} took longer than {limit:?}"))),
    }
}

/// Checks the topic (auto-creating it where the broker does) and every explicit
/// partition before the first send, so a bad request produces nothing.
///
/// A partition beyond the cached count may just have been added with CreatePartitions,
/// so the metadata is fetched once more before the request is refused: a partition that
/// exists is accepted at once, one that does not is refused after one round trip (not
/// after the producer's `max.block.ms` of waiting for it to appear).
pub(crate) async fn check_partitions(limit: Duration, producer: &Producer, topic: &str, events: &[Event]) -> Result<()> {
    let beyond = |partitions: i32| events.iter().filter_map(|e| e.partition).find(|p| !(0..partitions).contains(p));
    let cached = bounded(limit, "fetching metadata", producer.partition_count(topic)).await?;
    if beyond(cached).is_none() {
        return Ok(());
    }
    let fresh = bounded(limit, "fetching metadata", producer.fresh_partition_count(topic)).await?;
    match beyond(fresh) {
        Some(partition) => Err(Error::UnknownPartition { topic: topic.to_string(), partition }),
        None => Ok(()),
    }
}

pub(crate) fn record(topic: &str, e: Event) -> ProducerRecord {
    ProducerRecord {
        topic: topic.to_string(),
        partition: e.partition,
        key: e.key,
        value: e.value,
        headers: e.headers,
        timestamp: e.timestamp_ms,
    }
}

#[async_trait::async_trait]
impl Backend for KafkaBackend {
    async fn publish(&self, topic: &str, events: Vec<Event>, acks: Acks) -> Result<Vec<Result<Delivered>>> {
        let producer = self.producer(acks).await?;
        check_partitions(self.config.broker_timeout, producer, topic, &events).await?;
        // One bound for queueing and acknowledgement together (a timer per event would
        // cost more than the send).
        let send_all = async {
            // One send for the request: the producer appends the run under one lock.
            let futures = producer.send_many(events.into_iter().map(|e| record(topic, e))).await?;
            // Awaited in order rather than with `join_all`: the events share a few batches,
            // and `join_all` would register a waker per event on each batch (profiled: the
            // gRPC stream spent ~20% of its time there); in order, one waits and the rest
            // of its batch is then ready.
            let mut results = Vec::with_capacity(futures.len());
            for f in futures {
                results.push(f.await);
            }
            Ok::<_, fjord_client::Error>(results)
        };
        let results = match tokio::time::timeout(self.config.broker_timeout, send_all).await {
            Ok(results) => results?,
            Err(_) => return Err(Error::Unavailable(format!("no acknowledgement within {:?}", self.config.broker_timeout))),
        };
        Ok(results
            .into_iter()
            .map(|r| r.map(|m| Delivered { partition: m.partition, offset: m.offset }).map_err(Error::from))
            .collect())
    }

    async fn publish_atomic(&self, topic: &str, events: Vec<Event>) -> Result<Vec<Delivered>> {
        crate::atomic::publish(&self.config, &self.atomic, topic, events).await
    }

    async fn fetch(&self, query: FetchQuery) -> Result<Fetched> {
        let consumer = self.consumer(&query.topic, query.partition).await?;
        let mut consumer = consumer.lock().await;
        let tp = TopicPartition::new(&query.topic, query.partition);
        let to = match query.offset {
            -2 => SeekTo::Beginning,
            -1 => SeekTo::End,
            o => SeekTo::Offset(o),
        };
        consumer.seek(&tp, to)?;
        let start = bounded(self.config.broker_timeout, "resolving the offset", consumer.position(&tp)).await?;
        let deadline = tokio::time::Instant::now() + query.max_wait;
        let mut records = Vec::new();
        let mut bytes = 0usize;
        let mut first = true;
        'poll: loop {
            // At least one round trip, so a zero wait still returns what is there.
            let wait = deadline.saturating_duration_since(tokio::time::Instant::now()).max(if first {
                FETCH_HOLD * 2
            } else {
                Duration::ZERO
            });
            first = false;
            let polled = match consumer.poll(wait).await {
                Err(fjord_client::Error::OffsetOutOfRange { offset, .. }) => {
                    return Err(Error::OffsetOutOfRange { topic: query.topic, partition: query.partition, offset });
                }
                other => other?,
            };
            for r in polled {
                let size = r.key.as_ref().map_or(0, Bytes::len) + r.value.as_ref().map_or(0, Bytes::len);
                if !records.is_empty() && bytes + size > query.max_bytes {
                    break 'poll;
                }
                bytes += size;
                records.push(FetchedRecord {
                    offset: r.offset,
                    timestamp_ms: r.timestamp,
                    key: r.key,
                    value: r.value,
                    headers: r.headers,
                });
            }
            if !records.is_empty() || tokio::time::Instant::now() >= deadline {
                break;
            }
        }
        let next_offset = records.last().map_or(start, |r| r.offset + 1);
        let high_watermark = consumer.high_watermark(&tp).unwrap_or(-1);
        Ok(Fetched { records, next_offset, high_watermark })
    }

    async fn topics(&self) -> Result<Vec<String>> {
        let admin = self.admin().await?;
        let mut names: Vec<String> = bounded(self.config.broker_timeout, "listing topics", admin.list_topics())
            .await?
            .iter()
            .map(|t| t.name.clone())
            .collect();
        names.sort();
        Ok(names)
    }

    async fn describe(&self, topic: &str) -> Result<Vec<PartitionDescription>> {
        let admin = self.admin().await?;
        let t = bounded(self.config.broker_timeout, "describing the topic", admin.describe_topic(topic)).await?;
        // One ListOffsets per spec: a request names each partition once.
        let specs = |spec: OffsetSpec| -> Vec<(String, i32, OffsetSpec)> {
            t.partitions.iter().map(|p| (topic.to_string(), p.partition, spec)).collect()
        };
        let earliest =
            bounded(self.config.broker_timeout, "listing offsets", admin.list_offsets(&specs(OffsetSpec::Earliest))).await?;
        let latest =
            bounded(self.config.broker_timeout, "listing offsets", admin.list_offsets(&specs(OffsetSpec::Latest))).await?;
        Ok(t.partitions
            .iter()
            .zip(earliest.into_iter().zip(latest))
            .map(|(p, (earliest_offset, latest_offset))| PartitionDescription {
                partition: p.partition,
                leader: p.leader,
                replicas: p.replicas.clone(),
                in_sync_replicas: p.in_sync_replicas.clone(),
                earliest_offset,
                latest_offset,
            })
            .collect())
    }
}
