//! What both fronts share: stamping events with their producing host and creation time,
//! the bounded buffer (429 / RESOURCE_EXHAUSTED instead of unbounded queueing), the
//! schema registry, and metrics.

use std::sync::Arc;
use std::time::Duration;

use apache_avro::Schema;
use bytes::Bytes;
use fjord_audit::AuditCounter;
use fjord_client::Acks;
use fjord_record::now_ms;
use fjord_schema_registry::RegistryClient;
use tokio::sync::{OnceCell, Semaphore};

use crate::backend::{Backend, Delivered, Event};
use crate::idempotency::KeyStore;
use crate::limits::Limiter;
use crate::metrics::Metrics;
use crate::{Error, GatewayConfig, Result};

/// Header naming the gateway host that accepted an event (counted by the audit).
pub const HOST_HEADER: &str = "fjord.host";
/// Header holding an event's creation time, ms since the epoch, as decimal text: the
/// audit's constant, so the stamp and every tier's reading of it cannot drift apart.
pub use fjord_audit::CREATED_HEADER;

/// The gateway's shared state.
pub(crate) struct Gateway {
    pub(crate) config: GatewayConfig,
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) metrics: Metrics,
    registry: Option<RegistryClient>,
    /// One permit per byte of events accepted and not yet acknowledged.
    budget: Semaphore,
    /// Request bodies being decompressed at once (see `http::encoding`).
    pub(crate) decode_slots: Semaphore,
    host: Bytes,
    /// The gateway tier's audit counter, when `audit_interval` is set.
    pub(crate) audit: Option<Arc<AuditCounter>>,
    /// The dead-letter tier's (`fjord_audit::DEAD_LETTER_TIER`): events of a topic set
    /// aside in its dead-letter topic, counted under the topic they were meant for.
    pub(crate) dead_letter_audit: Option<Arc<AuditCounter>>,
    /// The idempotency key store, opened by the first keyed request (so the gateway
    /// starts while the brokers are down, like its producers).
    keys: OnceCell<KeyStore>,
    /// TLS, authentication and ACLs of both fronts (open unless configured).
    pub(crate) security: Arc<fjord_auth::http::HttpSecurity>,
    /// Requests/s and bytes/s per client.
    pub(crate) limiter: Limiter,
}

impl Gateway {
    pub(crate) fn new(config: GatewayConfig, backend: Arc<dyn Backend>) -> Result<Self> {
        config.validate()?;
        let registry = config
            .registry_url
            .as_deref()
            .map(|url| RegistryClient::with_security(url, &config.registry_security))
            .transpose()?;
        let host = config.resolved_host_name();
        let counter = |tier: &str| -> Result<Option<Arc<AuditCounter>>> {
            match config.audit_interval {
                Some(_) => Ok(Some(Arc::new(
                    AuditCounter::new(tier, host.clone(), config.audit_cluster.clone())
                        .with_window(config.audit_window)
                        .map_err(|e| Error::Config(e.to_string()))?,
                ))),
                None => Ok(None),
            }
        };
        let (audit, dead_letter_audit) = (counter("gateway")?, counter(fjord_audit::DEAD_LETTER_TIER)?);
        Ok(Self {
            host: Bytes::from(host),
            audit,
            dead_letter_audit,
            budget: Semaphore::new(config.buffer_bytes),
            decode_slots: Semaphore::new(crate::http::encoding::DECODE_TASKS),
            keys: OnceCell::new(),
            security: fjord_auth::http::HttpSecurity::open(),
            registry,
            limiter: Limiter::new(config.client_limits.clone()),
            metrics: Metrics::default(),
            backend,
            config,
        })
    }

    /// The `fjord.host` value of this gateway.
    pub(crate) fn host(&self) -> &[u8] {
        &self.host
    }

    /// Bytes of events accepted and not acknowledged yet.
    pub(crate) fn buffer_used(&self) -> usize {
        self.config.buffer_bytes - self.budget.available_permits()
    }

    /// Adds `fjord.host` and `fjord.created_ms` where missing, and a timestamp equal to
    /// the creation time where the caller gave none. Returns the event's creation time as
    /// the audit counts it. `created` keeps the last creation time's header value: the
    /// events of a request mostly share one, and formatting it per event showed in profiles.
    fn stamp(&self, e: &mut Event, now: i64, created: &mut Option<(i64, Bytes)>) -> i64 {
        let ts = *e.timestamp_ms.get_or_insert(now);
        let (mut has_host, mut given) = (false, None);
        for (k, v) in &e.headers {
            if k == HOST_HEADER {
                has_host = true;
            } else if k == CREATED_HEADER && given.is_none() {
                given = Some(fjord_audit::record::created_ms([(CREATED_HEADER, v.as_deref())], ts));
            }
        }
        if !has_host {
            e.headers.push((HOST_HEADER.into(), Some(self.host.clone())));
        }
        match given {
            Some(created_ms) => created_ms,
            None => {
                let value = match created {
                    Some((at, value)) if *at == ts => value.clone(),
                    _ => created.insert((ts, Bytes::from(ts.to_string()))).1.clone(),
                };
                e.headers.push((CREATED_HEADER.into(), Some(value)));
                ts
            }
        }
    }

    /// Checks a request's events, takes their bytes from the buffer budget, publishes and
    /// waits for the acknowledgements. The request is refused whole (nothing produced)
    /// when an event is too large, the topic or a partition is unknown, or the budget is
    /// short.
    pub(crate) async fn publish(&self, topic: &str, events: Vec<Event>, acks: Acks) -> Result<Vec<Result<Delivered>>> {
        self.publish_as(topic, events, Some(acks)).await
    }

    /// [`Self::publish`] in one transaction: all events visible to read_committed
    /// consumers, or none (see [`Backend::publish_atomic`]).
    pub(crate) async fn publish_atomic(&self, topic: &str, events: Vec<Event>) -> Result<Vec<Delivered>> {
        self.publish_as(topic, events, None).await?.into_iter().collect()
    }

    /// Publishes with `acks`, or atomically (`None`).
    async fn publish_as(&self, topic: &str, mut events: Vec<Event>, acks: Option<Acks>) -> Result<Vec<Result<Delivered>>> {
        check_topic_name(topic)?;
        let now = now_ms();
        let mut total = 0usize;
        let mut last_created = None;
        let mut created = Vec::with_capacity(if self.audit.is_some() { events.len() } else { 0 });
        for (i, e) in events.iter_mut().enumerate() {
            if let Some(p) = e.partition.filter(|p| *p < 0) {
                return Err(Error::UnknownPartition { topic: topic.into(), partition: p });
            }
            let created_ms = self.stamp(e, now, &mut last_created);
            if self.audit.is_some() {
                created.push(created_ms);
            }
            let size = e.encoded_size();
            if size > self.config.max_event_bytes {
                return Err(Error::Unprocessable {
                    index: Some(i),
                    reason: format!("event is {size} bytes, larger than the limit of {} bytes", self.config.max_event_bytes),
                });
            }
            total += size;
        }
        if total > self.config.buffer_bytes {
            return Err(Error::PayloadTooLarge { limit: self.config.buffer_bytes });
        }
        let _permit = self.budget.try_acquire_many(total as u32).map_err(|_| Error::BufferFull {
            used: self.buffer_used(),
            capacity: self.config.buffer_bytes,
            retry_after: self.config.retry_after,
        })?;
        let send = async {
            match acks {
                Some(acks) => self.backend.publish(topic, events, acks).await,
                None => Ok(self.backend.publish_atomic(topic, events).await?.into_iter().map(Ok).collect()),
            }
        };
        let Some(audit) = &self.audit else {
            return send.await;
        };
        // Count by creation time, and only what the brokers acknowledged (for an atomic
        // publish: committed); a run of events created at the same time is counted at
        // once (one lock and lookup, not one each).
        let results = send.await?;
        let mut run: Option<(i64, u64)> = None;
        for (r, created) in results.iter().zip(created) {
            if r.is_err() {
                continue;
            }
            match &mut run {
                Some((at, n)) if *at == created => *n += 1,
                _ => {
                    if let Some((at, n)) = run.replace((created, 1)) {
                        audit.record_n(topic, at, n);
                    }
                }
            }
        }
        if let Some((at, n)) = run {
            audit.record_n(topic, at, n);
        }
        Ok(results)
    }

    /// The idempotency key store, opened (and the key topic read) on first use.
    pub(crate) async fn key_store(&self) -> Result<&KeyStore> {
        let client = self.config.client_config();
        let open = self.keys.get_or_try_init(|| KeyStore::open(&self.config, client));
        // Opening connects, creates the topic and reads it: a few broker round trips.
        let limit = self.config.broker_timeout * 3;
        match tokio::time::timeout(limit, open).await {
            Ok(r) => r,
            Err(_) => Err(Error::Unavailable(format!("the idempotency key store did not open within {limit:?}"))),
        }
    }

    fn registry(&self) -> Result<&RegistryClient> {
        self.registry.as_ref().ok_or(Error::NoRegistry)
    }

    /// The schema registered under `id`.
    pub(crate) async fn schema_by_id(&self, id: i32) -> Result<Arc<Schema>> {
        let registry = self.registry()?;
        bounded_registry(self.config.broker_timeout, registry.schema(id)).await
    }

    /// Registers `schema` under `subject` (cached per gateway) and returns its id and schema.
    pub(crate) async fn register(&self, subject: &str, schema: &str) -> Result<(i32, Arc<Schema>)> {
        let registry = self.registry()?;
        let id = bounded_registry(self.config.broker_timeout, registry.register(subject, schema)).await?;
        Ok((id, bounded_registry(self.config.broker_timeout, registry.schema(id)).await?))
    }
}

async fn bounded_registry<T>(
    limit: Duration,
    f: impl std::future::Future<Output = fjord_schema_registry::Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(limit, f).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(Error::Unavailable(format!("schema registry did not answer within {limit:?}"))),
    }
}

/// Kafka's topic name rule: 1..=249 characters of `[a-zA-Z0-9._-]`, not `.` or `..`.
pub(crate) fn check_topic_name(topic: &str) -> Result<()> {
    let ok = !topic.is_empty()
        && topic.len() <= 249
        && topic != "."
        && topic != ".."
        && topic.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Error::BadRequest {
            index: None,
            reason: format!("invalid topic name {topic:?}: use 1-249 characters of [a-zA-Z0-9._-]"),
        })
    }
}

/// Parses an `acks` parameter: `0`, `1`, `all`/`-1`; absent means all.
pub(crate) fn parse_acks(s: Option<&str>) -> Result<Acks> {
    match s {
        None => Ok(Acks::All),
        Some(s) => {
            s.parse().map_err(|_| Error::BadRequest { index: None, reason: format!("acks must be 0, 1 or all, not {s:?}") })
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use super::*;
    use crate::backend::{FetchQuery, Fetched, FetchedRecord, PartitionDescription};

    /// An in-memory log per topic-partition, for unit tests of the fronts (the integration
    /// tests run the real broker).
    #[derive(Default)]
    pub(crate) struct MemoryBackend {
        pub(crate) partitions: i32,
        pub(crate) log: Mutex<HashMap<(String, i32), Vec<Event>>>,
        /// When set, publish waits on it: lets tests hold events "in flight".
        pub(crate) gate: Option<Arc<tokio::sync::Notify>>,
    }

    #[async_trait::async_trait]
    impl Backend for MemoryBackend {
        async fn publish(&self, topic: &str, events: Vec<Event>, _acks: Acks) -> Result<Vec<Result<Delivered>>> {
            if topic.starts_with("missing") {
                return Err(Error::UnknownTopic(topic.into()));
            }
            if let Some(p) = events.iter().filter_map(|e| e.partition).find(|p| *p >= self.partitions) {
                return Err(Error::UnknownPartition { topic: topic.into(), partition: p });
            }
            if let Some(gate) = &self.gate {
                gate.notified().await;
            }
            let mut log = self.log.lock().unwrap();
            Ok(events
                .into_iter()
                .map(|e| {
                    let partition = e.partition.unwrap_or_else(|| {
                        e.key.as_ref().map_or(0, |k| fjord_client::partitioner::partition_for_key(k, self.partitions))
                    });
                    let entries = log.entry((topic.to_string(), partition)).or_default();
                    entries.push(e);
                    Ok(Delivered { partition, offset: entries.len() as i64 - 1 })
                })
                .collect())
        }

        async fn publish_atomic(&self, topic: &str, events: Vec<Event>) -> Result<Vec<Delivered>> {
            // `publish` checks before it writes anything, so it is all or nothing already.
            self.publish(topic, events, Acks::All).await?.into_iter().collect()
        }

        async fn fetch(&self, q: FetchQuery) -> Result<Fetched> {
            let entries = self.log.lock().unwrap().get(&(q.topic.clone(), q.partition)).cloned().unwrap_or_default();
            let end = entries.len() as i64;
            let start = match q.offset {
                -2 => 0,
                -1 => end,
                o if o > end => return Err(Error::OffsetOutOfRange { topic: q.topic, partition: q.partition, offset: o }),
                o => o,
            };
            let mut records = Vec::new();
            let mut bytes = 0;
            for (offset, e) in entries.iter().enumerate().skip(start as usize) {
                let size = e.value.as_ref().map_or(0, Bytes::len);
                if !records.is_empty() && bytes + size > q.max_bytes {
                    break;
                }
                bytes += size;
                records.push(FetchedRecord {
                    offset: offset as i64,
                    timestamp_ms: e.timestamp_ms.unwrap_or(0),
                    key: e.key.clone(),
                    value: e.value.clone(),
                    headers: e.headers.clone(),
                });
            }
            if records.is_empty() {
                // The long poll, as a broker does it (without waking early).
                tokio::time::sleep(q.max_wait).await;
            }
            let next_offset = records.last().map_or(start, |r| r.offset + 1);
            Ok(Fetched { records, next_offset, high_watermark: end })
        }

        async fn topics(&self) -> Result<Vec<String>> {
            let mut names: Vec<String> = self.log.lock().unwrap().keys().map(|(t, _)| t.clone()).collect();
            names.sort();
            names.dedup();
            Ok(names)
        }

        async fn describe(&self, topic: &str) -> Result<Vec<PartitionDescription>> {
            let log = self.log.lock().unwrap();
            Ok((0..self.partitions)
                .map(|p| PartitionDescription {
                    partition: p,
                    leader: 0,
                    replicas: vec![0],
                    in_sync_replicas: vec![0],
                    earliest_offset: 0,
                    latest_offset: log.get(&(topic.to_string(), p)).map_or(0, |v| v.len() as i64),
                })
                .collect())
        }
    }

    pub(crate) fn gateway(backend: MemoryBackend, config: GatewayConfig) -> Arc<Gateway> {
        let config = GatewayConfig { host_name: Some("gw-test".into()), ..config };
        Arc::new(Gateway::new(config, Arc::new(backend)).unwrap())
    }

    fn ev(value: &str) -> Event {
        Event { value: Some(Bytes::from(value.to_string())), ..Event::default() }
    }

    #[tokio::test]
    async fn stamps_host_and_creation_time_unless_present() {
        let g = gateway(MemoryBackend { partitions: 1, ..Default::default() }, GatewayConfig::default());
        let mut given = ev("b");
        given.headers = vec![(HOST_HEADER.into(), Some(Bytes::from("elsewhere")))];
        given.timestamp_ms = Some(42);
        g.publish("t", vec![ev("a"), given], Acks::All).await.unwrap();
        let fetched = g
            .backend
            .fetch(FetchQuery { topic: "t".into(), partition: 0, offset: -2, max_bytes: 1 << 20, max_wait: Duration::ZERO })
            .await
            .unwrap();
        let h = |r: &FetchedRecord, k: &str| r.headers.iter().find(|(n, _)| n == k).and_then(|(_, v)| v.clone()).unwrap();
        let (a, b) = (&fetched.records[0], &fetched.records[1]);
        assert_eq!(h(a, HOST_HEADER), "gw-test");
        assert_eq!(h(a, CREATED_HEADER), a.timestamp_ms.to_string());
        assert!(a.timestamp_ms > 1_600_000_000_000);
        assert_eq!((h(b, HOST_HEADER), h(b, CREATED_HEADER)), (Bytes::from("elsewhere"), Bytes::from("42")));
        assert_eq!(b.headers.len(), 2);
    }

    #[tokio::test]
    async fn a_full_buffer_refuses_with_retry_after_and_frees_on_acknowledgement() {
        let gate = Arc::new(tokio::sync::Notify::new());
        let config = GatewayConfig {
            max_body_bytes: 1000,
            buffer_bytes: 1000,
            retry_after: Duration::from_millis(250),
            ..GatewayConfig::default()
        };
        let g = gateway(MemoryBackend { partitions: 1, gate: Some(gate.clone()), ..Default::default() }, config);
        let big = "x".repeat(600);
        let first = tokio::spawn({
            let g = g.clone();
            let big = big.clone();
            async move { g.publish("t", vec![ev(&big)], Acks::All).await }
        });
        while g.buffer_used() == 0 {
            tokio::task::yield_now().await;
        }
        match g.publish("t", vec![ev(&big)], Acks::All).await {
            Err(e @ Error::BufferFull { .. }) => {
                assert_eq!((e.http_status(), e.retry_after()), (429, Some(Duration::from_millis(250))))
            }
            other => panic!("expected BufferFull, got {other:?}"),
        }
        gate.notify_one();
        first.await.unwrap().unwrap();
        assert_eq!(g.buffer_used(), 0);
        gate.notify_one();
        g.publish("t", vec![ev(&big)], Acks::All).await.unwrap();
    }

    #[tokio::test]
    async fn refuses_oversized_events_and_bad_names_before_publishing() {
        let config = GatewayConfig { max_event_bytes: 100, ..GatewayConfig::default() };
        let g = gateway(MemoryBackend { partitions: 1, ..Default::default() }, config);
        let e = g.publish("t", vec![ev("ok"), ev(&"x".repeat(200))], Acks::All).await.unwrap_err();
        assert_eq!((e.http_status(), e.record_index()), (422, Some(1)));
        assert_eq!(g.publish("bad/name", vec![ev("a")], Acks::All).await.unwrap_err().http_status(), 400);
        assert!(g.backend.topics().await.unwrap().is_empty(), "nothing was produced");
        assert_eq!(parse_acks(Some("1")).unwrap(), Acks::Leader);
        assert_eq!(parse_acks(None).unwrap(), Acks::All);
        assert_eq!(parse_acks(Some("2")).unwrap_err().http_status(), 400);
    }
}
