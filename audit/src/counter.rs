//! [`AuditCounter`]: the counter a tier embeds. `record` is a mutex-guarded map update (no
//! I/O); [`AuditCounter::publish`] turns the counts since the last publish into audit
//! records and sends them to `_audit`; [`AuditCounter::spawn_publisher`] does that every
//! interval and once more at shutdown.
//!
//! A record that failed to send keeps its id and is sent again on the next publish, so a
//! retry after a lost acknowledgement is counted once by the report. A crash loses at most
//! the counts since the last publish: the report then shows that tier short for the
//! affected windows (loss), never silent agreement.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use fjord_client::{
    Admin, ClientConfig, ConsumerRecord, IsolationLevel, NewTopic, Producer, ProducerConfig, ProducerRecord, ResponseError,
};
use fjord_record::now_ms;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::record::{audited_topic, created_ms, window_start, AuditRecord, AUDIT_TOPIC, DEFAULT_WINDOW_MS};
use crate::{Error, Result};

/// Counts events per (topic, window of creation time) for one tier on one host.
#[derive(Debug)]
pub struct AuditCounter {
    tier: String,
    host: String,
    cluster: String,
    window_ms: i64,
    /// Distinguishes counter instances (restarts) on one host, so ids never repeat.
    instance: String,
    seq: AtomicU64,
    counts: Mutex<BTreeMap<(String, i64), u64>>,
    /// Records taken from `counts` whose send has not been acknowledged yet.
    unsent: Mutex<Vec<AuditRecord>>,
    /// The hook of a read_committed consumer: its records say so, and the report keeps
    /// them apart (see [`crate::record::READ_COMMITTED_SUFFIX`]).
    read_committed: AtomicBool,
}

impl AuditCounter {
    /// A counter for `tier` (e.g. `gateway`, `loader`) on `host` in `cluster`, with the
    /// default 10-minute windows.
    pub fn new(tier: impl Into<String>, host: impl Into<String>, cluster: impl Into<String>) -> Self {
        static INSTANCES: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        Self {
            tier: tier.into(),
            host: host.into(),
            cluster: cluster.into(),
            window_ms: DEFAULT_WINDOW_MS,
            instance: format!("{}-{nanos:x}-{}", std::process::id(), INSTANCES.fetch_add(1, Ordering::Relaxed)),
            seq: AtomicU64::new(0),
            counts: Mutex::new(BTreeMap::new()),
            unsent: Mutex::new(Vec::new()),
            read_committed: AtomicBool::new(false),
        }
    }

    /// Sets the window length (every tier and the report must agree on it).
    pub fn with_window(mut self, window: Duration) -> Result<Self> {
        self.window_ms = window_ms(window)?;
        Ok(self)
    }

    /// Sets a window length already checked by [`window_ms`].
    pub(crate) fn with_window_ms(mut self, window_ms: i64) -> Self {
        self.window_ms = window_ms;
        self
    }

    /// The tier name.
    pub fn tier(&self) -> &str {
        &self.tier
    }

    /// An empty set of counts held back until their data is committed (see
    /// [`PendingCounts`]).
    pub fn pending(&self) -> PendingCounts {
        PendingCounts { window_ms: self.window_ms, counts: BTreeMap::new() }
    }

    /// Adds counts held back by [`PendingCounts`] once their data is committed; they go
    /// out with the next publish.
    pub fn commit(&self, pending: PendingCounts) {
        debug_assert_eq!(pending.window_ms, self.window_ms, "pending counts of another counter");
        let mut counts = self.counts.lock().expect("audit counts lock");
        for (key, n) in pending.counts {
            *counts.entry(key).or_default() += n;
        }
    }

    /// Counts one event of `topic` created at `created_ms` (ms since the epoch).
    pub fn record(&self, topic: &str, created_ms: i64) {
        self.record_n(topic, created_ms, 1);
    }

    /// Counts `n` events of `topic` created in the same window as `created_ms`. Topics
    /// the audit does not count ([`audited_topic`]: its own, `_schemas`, `__` topics) are
    /// left out here, as the broker tier leaves them out: a hooked producer that also
    /// sends audit records would otherwise publish counts of `_audit` itself.
    pub fn record_n(&self, topic: &str, created_ms: i64, n: u64) {
        if n == 0 || !audited_topic(topic) {
            return;
        }
        let key = (topic.to_owned(), window_start(created_ms, self.window_ms));
        *self.counts.lock().expect("audit counts lock").entry(key).or_default() += n;
    }

    /// The counts not published yet, by topic and window start (for tests and
    /// diagnostics).
    pub fn unpublished(&self) -> BTreeMap<(String, i64), u64> {
        self.counts.lock().expect("audit counts lock").clone()
    }

    /// The window length in ms.
    pub fn window_ms(&self) -> i64 {
        self.window_ms
    }

    /// Adds `(window start, count)` pairs of `topic` under one lock; the starts are
    /// [`window_start`]s of this counter's window length (see [`AuditCounter::window_ms`]).
    pub fn record_windows(&self, topic: &str, windows: &[(i64, u64)]) {
        if windows.is_empty() || !audited_topic(topic) {
            return;
        }
        let mut counts = self.counts.lock().expect("audit counts lock");
        for &(start, n) in windows {
            *counts.entry((topic.to_owned(), start)).or_default() += n;
        }
    }

    /// Moves the counts since the last call into audit records with fresh ids, behind
    /// any records still unsent. Returns everything that is due to be sent.
    fn take(&self) -> Vec<AuditRecord> {
        let counts = std::mem::take(&mut *self.counts.lock().expect("audit counts lock"));
        let now = now_ms();
        let mut unsent = self.unsent.lock().expect("audit unsent lock");
        for ((topic, window_start_ms), count) in counts {
            let seq = self.seq.fetch_add(1, Ordering::Relaxed);
            unsent.push(AuditRecord {
                id: format!("{}/{}/{}/{seq}", self.host, self.tier, self.instance),
                tier: self.tier.clone(),
                host: self.host.clone(),
                cluster: self.cluster.clone(),
                topic,
                window_start_ms,
                window_ms: self.window_ms,
                count,
                published_ms: now,
                isolation: self.read_committed.load(Ordering::Relaxed).then(|| "read_committed".to_string()),
            });
        }
        unsent.clone()
    }

    /// Publishes the counts since the last publish to `_audit` and waits for the
    /// acknowledgements. Records that failed stay queued (same ids) for the next call.
    /// Returns how many records were acknowledged.
    pub async fn publish(&self, producer: &Producer) -> Result<usize> {
        let due = self.take();
        let mut pending = Vec::with_capacity(due.len());
        let mut first_error = None;
        for r in &due {
            let record = ProducerRecord::new(AUDIT_TOPIC, Bytes::from(r.encode())).key(Bytes::from(r.topic.clone()));
            match producer.send(record).await {
                Ok(delivery) => pending.push((r.id.clone(), delivery)),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        let mut acked = std::collections::HashSet::new();
        for (id, delivery) in pending {
            match delivery.await {
                Ok(_) => {
                    acked.insert(id);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        self.unsent.lock().expect("audit unsent lock").retain(|r| !acked.contains(&r.id));
        match first_error {
            Some(e) => Err(e.into()),
            None => Ok(acked.len()),
        }
    }

    /// Publishes every `interval` until `shutdown`, then once more (the flush at
    /// shutdown), over a producer of its own to the cluster of `client`. Creates `_audit`
    /// if missing. Publish failures are logged and retried on the next tick.
    pub fn spawn_publisher(
        self: Arc<Self>,
        client: ClientConfig,
        interval: Duration,
        shutdown: CancellationToken,
    ) -> JoinHandle<Result<()>> {
        tokio::spawn(async move {
            let producer = Producer::connect(ProducerConfig { client: client.clone(), ..ProducerConfig::default() }).await?;
            if let Err(e) = ensure_audit_topic(&client).await {
                tracing::warn!(error = %e, "could not create {AUDIT_TOPIC}; relying on auto-creation");
            }
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        if let Err(e) = self.publish(&producer).await {
                            tracing::warn!(tier = %self.tier, error = %e, "audit publish failed; retrying next interval");
                        }
                    }
                    () = shutdown.cancelled() => break,
                }
            }
            let flushed = self.publish(&producer).await;
            producer.close().await;
            flushed.map(drop)
        })
    }
}

/// `(window start, count)` pairs: a batch's records nearly always fall in one or two
/// windows, so a linear scan beats a map.
pub fn tally(windows: &mut Vec<(i64, u64)>, start: i64, n: u64) {
    match windows.iter_mut().find(|(w, _)| *w == start) {
        Some((_, c)) => *c += n,
        None => windows.push((start, n)),
    }
}

/// The opt-in producer and consumer tiers: give the counter to
/// [`ProducerConfig::audit`] (it counts each record when acknowledged, never a failed
/// one; a transactional producer's when their transaction commits) or
/// [`fjord_client::ConsumerConfig::audit`] (it counts each record `poll` returns; with
/// `isolation.level=read_committed` its records say so, and the report shows them as
/// the tier `consumer (read_committed)`), and run its publisher. Give each consumer tier
/// a counter of its own: one counter is one tier.
impl fjord_client::AuditHook for AuditCounter {
    fn created_ms(&self, record: &ProducerRecord, timestamp: i64) -> i64 {
        created_ms(record.headers.iter().map(|(k, v)| (k.as_str(), v.as_deref())), timestamp)
    }

    fn acknowledged(&self, topic: &str, created: &[i64]) {
        let mut windows = Vec::new();
        for &ms in created {
            tally(&mut windows, window_start(ms, self.window_ms), 1);
        }
        self.record_windows(topic, &windows);
    }

    fn consumer_isolation(&self, level: IsolationLevel) {
        self.read_committed.store(level == IsolationLevel::ReadCommitted, Ordering::Relaxed);
    }

    fn consumed(&self, records: &[ConsumerRecord]) {
        // Usually one topic per poll: group runs of one topic.
        let mut at = 0;
        while at < records.len() {
            let topic = &records[at].topic;
            let mut windows = Vec::new();
            while let Some(r) = records.get(at).filter(|r| r.topic == *topic) {
                let headers = r.headers.iter().map(|(k, v)| (k.as_str(), v.as_deref()));
                tally(&mut windows, window_start(created_ms(headers, r.timestamp), self.window_ms), 1);
                at += 1;
            }
            self.record_windows(topic, &windows);
        }
    }
}

/// Counts of a tier that may only report committed data (the loader): collected while a
/// run reads, handed to [`AuditCounter::commit`] after the commit, dropped if the run fails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingCounts {
    window_ms: i64,
    counts: BTreeMap<(String, i64), u64>,
}

impl PendingCounts {
    /// Counts one event of `topic` created at `created_ms` (not the audit's own or
    /// internal topics, as [`AuditCounter::record_n`]).
    pub fn record(&mut self, topic: &str, created_ms: i64) {
        if !audited_topic(topic) {
            return;
        }
        *self.counts.entry((topic.to_owned(), window_start(created_ms, self.window_ms))).or_default() += 1;
    }

    /// Counts a consumed record by its `fjord.created_ms` header or else its timestamp.
    pub fn record_consumed(&mut self, r: &ConsumerRecord) {
        let headers = r.headers.iter().map(|(k, v)| (k.as_str(), v.as_deref()));
        self.record(&r.topic, created_ms(headers, r.timestamp));
    }

    /// Events counted so far.
    pub fn total(&self) -> u64 {
        self.counts.values().sum()
    }
}

/// Creates `_audit` (one partition) unless it exists.
pub async fn ensure_audit_topic(client: &ClientConfig) -> Result<()> {
    let admin = Admin::connect(client.clone()).await?;
    match admin.create_topics(&[NewTopic::new(AUDIT_TOPIC, 1)]).await {
        Err(e) if e.code() == Some(ResponseError::TopicAlreadyExists) => Ok(()),
        other => Ok(other?),
    }
}

/// A window length in ms, refusing zero and sub-millisecond lengths.
pub(crate) fn window_ms(window: Duration) -> Result<i64> {
    let ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
    if ms <= 0 {
        return Err(Error::InvalidConfig(format!("window length {window:?} must be at least 1 ms")));
    }
    Ok(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A producer with the audit hook that also publishes audit records (or writes
    /// offsets) counted those too, and its next publish added records about `_audit`.
    #[test]
    fn the_audits_own_and_internal_topics_are_not_counted() {
        let c = AuditCounter::new("producer", "h1", "online").with_window(Duration::from_secs(60)).unwrap();
        c.record(AUDIT_TOPIC, 1_000);
        c.record_n("__consumer_offsets", 1_000, 3);
        c.record_windows("_schemas", &[(0, 2)]);
        assert!(c.take().is_empty());
        c.record("events", 1_000);
        assert_eq!(c.take().len(), 1);
    }

    #[test]
    fn counts_by_window_and_takes_deltas_with_fresh_ids() {
        let c = AuditCounter::new("gateway", "h1", "online").with_window(Duration::from_secs(60)).unwrap();
        c.record("a", 1_000);
        c.record("a", 59_999);
        c.record("a", 60_000);
        c.record_n("b", 5, 4);
        c.record_n("b", 5, 0);
        let first = c.take();
        let got: Vec<_> = first.iter().map(|r| (r.topic.as_str(), r.window_start_ms, r.count)).collect();
        assert_eq!(got, [("a", 0, 2), ("a", 60_000, 1), ("b", 0, 4)]);
        // Unacknowledged records are offered again with the same ids, new counts get new ids.
        c.record("a", 2);
        let second = c.take();
        assert_eq!(second.len(), 4);
        assert_eq!(second[..3], first[..]);
        assert!(first.iter().all(|r| r.id != second[3].id));
        assert!(AuditCounter::new("t", "h", "c").with_window(Duration::from_micros(10)).is_err());
    }

    #[test]
    fn as_a_client_hook_it_counts_by_creation_header_else_timestamp() {
        use fjord_client::AuditHook;
        let c = AuditCounter::new("producer", "h1", "online").with_window(Duration::from_secs(60)).unwrap();
        let stamped =
            ProducerRecord::new("a", Bytes::from_static(b"v")).header(crate::CREATED_HEADER, Some(Bytes::from_static(b"61000")));
        let plain = ProducerRecord::new("a", Bytes::from_static(b"v"));
        assert_eq!((c.created_ms(&stamped, 5), c.created_ms(&plain, 5)), (61_000, 5));
        c.acknowledged("a", &[61_000, 5, 7, 59_999]);
        c.acknowledged("b", &[]);
        let record = |topic: &str, timestamp: i64, created: Option<&'static [u8]>| ConsumerRecord {
            topic: topic.into(),
            partition: 0,
            offset: 0,
            timestamp,
            timestamp_type: fjord_record::TimestampType::CreateTime,
            key: None,
            value: None,
            headers: created.map(|v| vec![(crate::CREATED_HEADER.to_string(), Some(Bytes::from_static(v)))]).unwrap_or_default(),
        };
        c.consumed(&[record("a", 1, None), record("a", 1, Some(b"120000")), record("b", 2, None), record("a", 3, None)]);
        let got: Vec<_> = c.unpublished().into_iter().collect();
        assert_eq!(got, [(("a".into(), 0), 5), (("a".into(), 60_000), 1), (("a".into(), 120_000), 1), (("b".into(), 0), 1)]);
    }

    #[test]
    fn pending_counts_reach_the_counter_only_when_committed() {
        let c = AuditCounter::new("loader", "h1", "analytics").with_window(Duration::from_secs(60)).unwrap();
        let mut failed_run = c.pending();
        failed_run.record("a", 1);
        drop(failed_run);
        let mut run = c.pending();
        run.record("a", 1);
        run.record("a", 61_000);
        assert_eq!(run.total(), 2);
        assert!(c.take().is_empty());
        c.commit(run);
        let got: Vec<_> = c.take().iter().map(|r| (r.window_start_ms, r.count)).collect();
        assert_eq!(got, [(0, 1), (60_000, 1)]);
    }
}
