//! The broker tier of the audit (`audit.enable`), as a [`BrokerObserver`] the binary hands
//! to the broker: the leader of a partition counts the records it appends for producers,
//! per topic and window of creation time, and publishes the counts to `_audit` as tier
//! `broker` (`audit.tier`) through an [`AuditCounter`] (periodically, before a controlled
//! shutdown's handover, and once more before the broker stops accepting).
//!
//! Only the Produce path counts: followers' appends (replica fetches) are not counted, so
//! a record counts once however many replicas it has; a retry the idempotent-producer
//! check recognises as a duplicate appends nothing and counts nothing; internal topics
//! (`_audit`, `__consumer_offsets`, ...) are not audited. Records of a transaction are held
//! until this broker writes the transaction's marker: counted on COMMIT, dropped on
//! ABORT, so the broker tier agrees with a read_committed consumer. A record's creation time is its
//! `fjord.created_ms` header, else its timestamp, exactly as every other tier reads it
//! ([`crate::record::created_ms`]), so the counts compare window by window.
//!
//! Cost on the produce path: nothing of its own. The leader's validation walks the
//! framing of every record it appends (decompressing a compressed batch once, to check
//! it), and shows each record to the tally as it passes; the tally reads the record's
//! timestamp delta and, for records with headers, compares header keys. One lock of the
//! counter per partition appended.
//!
//! What a held transaction can miss: its counts live in this broker's memory, so when
//! the marker is written by another leader (leadership moved mid-transaction) or after a
//! restart, its committed records are not counted by this tier (the report shows the
//! broker tier short for that window); counts held past `UNDECIDED_HORIZON` are dropped
//! with a warning.
//!
//! Wiring (what `fjord dev` and `fjord broker` do): [`BrokerTier::install`] on the
//! broker's config before `fjord_broker::run`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use fjord_broker::observer::{AppendTally, BrokerObserver, Serving};
use fjord_broker::{AuditConfig, BrokerConfig};
use fjord_record::{BatchHeader, RecordFrame, TimestampType};
use futures::future::BoxFuture;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::counter::{tally, window_ms};
use crate::record::{audited_topic, window_start};
use crate::{AuditCounter, Result, CREATED_HEADER};

/// Bound on each flush at shutdown.
const FLUSH_WAIT: Duration = Duration::from_secs(15);

/// How long counts of a transaction wait for its marker here before they are dropped:
/// well past Kafka's default `transaction.max.timeout.ms` (15 minutes), after which the
/// coordinator aborts it; a marker that has not come by then was written elsewhere.
const UNDECIDED_HORIZON: Duration = Duration::from_secs(3600);

/// Counts of transactional appends by producer id, waiting for the transaction's marker.
#[derive(Debug, Default)]
struct Undecided {
    by_producer: HashMap<i64, Held>,
    last_sweep: Option<Instant>,
}

/// One producer's open transaction as this broker counted it: `(topic, windows)`.
#[derive(Debug)]
struct Held {
    since: Instant,
    counts: Vec<(String, Vec<(i64, u64)>)>,
}

impl Undecided {
    fn hold(&mut self, producer_id: i64, topic: &str, windows: Vec<(i64, u64)>, now: Instant) {
        self.sweep(now);
        let held = self.by_producer.entry(producer_id).or_insert_with(|| Held { since: now, counts: Vec::new() });
        held.counts.push((topic.to_owned(), windows));
    }

    /// The counts of `producer_id`'s transaction, taken out (one marker per partition
    /// follows; the first decides for all, as a transaction has one outcome).
    fn end(&mut self, producer_id: i64) -> Option<Held> {
        self.by_producer.remove(&producer_id)
    }

    /// Drops, at most once a minute, what waited past [`UNDECIDED_HORIZON`].
    fn sweep(&mut self, now: Instant) {
        if self.last_sweep.is_some_and(|at| now.duration_since(at) < Duration::from_secs(60)) {
            return;
        }
        self.last_sweep = Some(now);
        self.by_producer.retain(|producer_id, held| {
            let keep = now.duration_since(held.since) < UNDECIDED_HORIZON;
            if !keep {
                let records: u64 = held.counts.iter().flat_map(|(_, w)| w.iter().map(|(_, n)| n)).sum();
                tracing::warn!(producer_id, records, "audit: no marker for this transaction here; its counts are dropped");
            }
            keep
        });
    }
}

/// The broker tier: counts from the first [`BrokerObserver::serving`] on (the broker
/// accepts no produce before it), publishes over a client of the broker itself.
#[derive(Debug)]
pub struct BrokerTier {
    config: AuditConfig,
    window_ms: i64,
    /// Set once the broker serves: the counter is named after its address.
    started: OnceLock<Started>,
    undecided: Arc<Mutex<Undecided>>,
}

#[derive(Debug)]
struct Started {
    counter: Arc<AuditCounter>,
    client: fjord_client::ClientConfig,
    stop: CancellationToken,
    publisher: Mutex<Option<JoinHandle<Result<()>>>>,
}

impl BrokerTier {
    /// The tier for the `audit.*` settings of `config`.
    pub fn new(config: &AuditConfig) -> Result<Self> {
        Ok(Self {
            window_ms: window_ms(config.window)?,
            config: config.clone(),
            started: OnceLock::new(),
            undecided: Arc::default(),
        })
    }

    /// Sets `config.observer` to a broker tier when `config.audit.enable`.
    pub fn install(config: &mut BrokerConfig) -> Result<()> {
        if config.audit.enable {
            config.observer = Some(Arc::new(Self::new(&config.audit)?));
        }
        Ok(())
    }

    /// The counter, once the broker serves (for tests and diagnostics).
    pub fn counter(&self) -> Option<&Arc<AuditCounter>> {
        self.started.get().map(|s| &s.counter)
    }
}

impl BrokerObserver for BrokerTier {
    fn serving(&self, at: &Serving) {
        let counter = AuditCounter::new(
            self.config.tier.clone(),
            format!("{}/{}:{}", at.broker_id, at.host, at.port),
            self.config.cluster.clone(),
        )
        .with_window_ms(self.window_ms);
        let counter = Arc::new(counter);
        let mut client = fjord_client::ClientConfig::new(&at.bootstrap);
        for (key, value) in &at.client_properties.0 {
            // The broker hands over only settings the client knows; one it does not would
            // leave the publisher failing every round, so it is said once here.
            if let Err(e) = client.set(key, value) {
                tracing::error!(error = %e, key, "audit: the broker's client setting is not usable; publishing will fail");
            }
        }
        let stop = CancellationToken::new();
        let publisher = counter.clone().spawn_publisher(client.clone(), self.config.interval, stop.clone());
        let started = Started { counter, client, stop, publisher: Mutex::new(Some(publisher)) };
        if let Err(again) = self.started.set(started) {
            // One tier serves one broker; a second start must not leave a publisher behind.
            again.stop.cancel();
            tracing::warn!("audit: this broker tier already serves a broker; counting for the first only");
        }
    }

    fn tally(&self, topic: &str) -> Option<Box<dyn AppendTally>> {
        let counter = self.started.get()?.counter.clone();
        audited_topic(topic)
            .then(|| Box::new(Tally::new(counter, self.undecided.clone(), self.window_ms)) as Box<dyn AppendTally>)
    }

    fn transaction_ended(&self, _topic: &str, producer_id: i64, committed: bool) {
        let Some(started) = self.started.get() else { return };
        let Some(held) = self.undecided.lock().expect("audit undecided lock").end(producer_id) else { return };
        if committed {
            for (topic, windows) in &held.counts {
                started.counter.record_windows(topic, windows);
            }
        }
    }

    fn before_handover(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            if let Some(started) = self.started.get() {
                flush_before_handover(&started.counter, &started.client).await;
            }
        })
    }

    fn stopping(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let Some(started) = self.started.get() else { return };
            started.stop.cancel();
            let publisher = started.publisher.lock().expect("audit publisher lock").take();
            if let Some(publisher) = publisher {
                flush(publisher).await;
            }
        })
    }
}

/// Publishes the counts so far over a producer of its own (bounded), before a
/// controlled shutdown. Safe next to the periodic publisher: a record both of them send
/// has one id, which the report counts once.
async fn flush_before_handover(counter: &AuditCounter, client: &fjord_client::ClientConfig) {
    let flush = async {
        let producer =
            fjord_client::Producer::connect(fjord_client::ProducerConfig { client: client.clone(), ..Default::default() })
                .await
                .map_err(crate::Error::from)?;
        let published = counter.publish(&producer).await;
        producer.close().await;
        published
    };
    match tokio::time::timeout(FLUSH_WAIT, flush).await {
        Ok(Ok(records)) => tracing::info!(records, "audit: broker counts published before the handover"),
        Ok(Err(e)) => tracing::warn!(error = %e, "audit: publishing before the handover failed; retried after it"),
        Err(_) => tracing::warn!(wait = ?FLUSH_WAIT, "audit: publishing before the handover did not finish; retried after it"),
    }
}

/// Waits (bounded) for the publisher's final flush at shutdown.
async fn flush(publisher: JoinHandle<Result<()>>) {
    match tokio::time::timeout(FLUSH_WAIT, publisher).await {
        Ok(Ok(Ok(()))) => tracing::info!("audit: final broker counts published"),
        Ok(Ok(Err(e))) => tracing::warn!(error = %e, "audit: final flush failed; the report will show these counts missing"),
        Ok(Err(e)) => tracing::error!(error = %e, "audit publisher panicked"),
        Err(_) => {
            tracing::warn!(wait = ?FLUSH_WAIT, "audit: final flush did not finish; the report will show these counts missing")
        }
    }
}

/// The records of one append by window of creation time, gathered record by record from
/// the validation's walk. Control batches (transaction markers) hold no events and are
/// not counted; records of transactional batches are held for their marker.
#[derive(Debug)]
struct Tally {
    counter: Arc<AuditCounter>,
    undecided: Arc<Mutex<Undecided>>,
    window_ms: i64,
    windows: Vec<(i64, u64)>,
    /// Records of transactional batches by producer id (one, nearly always).
    transactional: Vec<(i64, Vec<(i64, u64)>)>,
    /// The current window as [start, end) and the records counted in it: consecutive
    /// records nearly always share it, so most records cost a comparison, not a division.
    start: i64,
    end: i64,
    run: u64,
}

impl Tally {
    fn new(counter: Arc<AuditCounter>, undecided: Arc<Mutex<Undecided>>, window_ms: i64) -> Self {
        Self { counter, undecided, window_ms, windows: Vec::new(), transactional: Vec::new(), start: 0, end: 0, run: 0 }
    }

    /// One record of a transactional batch of `producer_id`, created at `ms`.
    fn transactional(&mut self, producer_id: i64, ms: i64) {
        let at = match self.transactional.iter().position(|(p, _)| *p == producer_id) {
            Some(at) => at,
            None => {
                self.transactional.push((producer_id, Vec::new()));
                self.transactional.len() - 1
            }
        };
        tally(&mut self.transactional[at].1, window_start(ms, self.window_ms), 1);
    }

    fn flush_run(&mut self) {
        if self.run > 0 {
            tally(&mut self.windows, self.start, self.run);
            self.run = 0;
        }
    }

    /// `(window start, count)` pairs.
    fn finish(mut self) -> Vec<(i64, u64)> {
        self.flush_run();
        self.windows
    }
}

impl AppendTally for Tally {
    /// Counts one record of the batch `header`, by its `fjord.created_ms` header when it
    /// has one that parses (the first header of that name decides, as in
    /// [`crate::record::created_ms`]), else by its timestamp as a consumer sees it.
    #[inline]
    fn record(&mut self, header: &BatchHeader, record: &RecordFrame<'_>) {
        if header.is_control() {
            return;
        }
        let created = if record.header_count > 0 { created_ms(record) } else { None };
        let ms = created.unwrap_or_else(|| match header.timestamp_type() {
            // A consumer sees the batch's max timestamp on every record of a LogAppendTime batch.
            TimestampType::LogAppendTime => header.max_timestamp,
            TimestampType::CreateTime => header.base_timestamp.wrapping_add(record.timestamp_delta),
        });
        if header.is_transactional() {
            self.transactional(header.producer_id, ms);
            return;
        }
        if (self.start..self.end).contains(&ms) {
            self.run += 1;
            return;
        }
        self.flush_run();
        self.start = window_start(ms, self.window_ms);
        self.end = self.start.saturating_add(self.window_ms);
        self.run = 1;
    }

    fn appended(mut self: Box<Self>, topic: &str) {
        if !self.transactional.is_empty() {
            let now = Instant::now();
            let mut undecided = self.undecided.lock().expect("audit undecided lock");
            for (producer_id, windows) in std::mem::take(&mut self.transactional) {
                undecided.hold(producer_id, topic, windows, now);
            }
        }
        let counter = self.counter.clone();
        counter.record_windows(topic, &self.finish());
    }
}

/// The value of the record's first `fjord.created_ms` header, when it parses.
fn created_ms(record: &RecordFrame<'_>) -> Option<i64> {
    let (_, value) = record.headers().find(|(key, _)| *key == CREATED_HEADER.as_bytes())?;
    std::str::from_utf8(value?).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use fjord_record::{BatchBuilder, Compression, BATCH_OVERHEAD};

    fn counter(window_ms: i64) -> Arc<AuditCounter> {
        Arc::new(AuditCounter::new("broker", "h", "c").with_window_ms(window_ms))
    }

    /// The reference: every record decoded, windowed by `crate::record::created_ms`.
    fn reference(batches: &[u8], window_ms: i64) -> Vec<(i64, u64)> {
        let mut out = Vec::new();
        for b in fjord_record::batch::batches(batches) {
            let (h, bytes) = b.unwrap();
            let body = fjord_record::compression::records_body(&h, bytes, 1 << 30).unwrap();
            for r in fjord_record::Records::new(&body, BATCH_OVERHEAD) {
                let r = r.unwrap();
                let headers = r.headers.iter().map(|h| (std::str::from_utf8(h.key).unwrap(), h.value));
                let ms = crate::record::created_ms(headers, h.base_timestamp + r.timestamp_delta);
                tally(&mut out, window_start(ms, window_ms), 1);
            }
        }
        out.sort();
        out
    }

    #[test]
    fn counts_by_header_else_timestamp_like_every_tier() {
        let mut all = Vec::new();
        for codec in [Compression::None, Compression::Lz4, Compression::Gzip] {
            let mut b = BatchBuilder::new(5_000);
            b.append(5_000, None, Some(b"a"), &[]);
            b.append(4_999, Some(b"k"), Some(b"b"), &[("x", Some(b"1"))]);
            b.append(12_000, None, None, &[(CREATED_HEADER, Some(b" 21000 ")), (CREATED_HEADER, Some(b"1"))]);
            b.append(12_000, None, Some(b"c"), &[(CREATED_HEADER, Some(b"nope"))]);
            b.append(12_000, None, Some(b"d"), &[(CREATED_HEADER, None), ("y", None)]);
            b.append(9_999, None, Some(b"e"), &[("y", None), (CREATED_HEADER, Some(b"-1"))]);
            // Lengths beyond two varint bytes take the general path.
            b.append(12_000, None, Some(&[7u8; 20_000]), &[(CREATED_HEADER, Some(b"26000"))]);
            all.extend_from_slice(&b.build_compressed(codec).unwrap());
        }
        let mut tally = Tally::new(counter(5_000), Arc::default(), 5_000);
        let mut rest = &all[..];
        while !rest.is_empty() {
            let (h, _) =
                BatchHeader::parse_walked(rest, 1 << 30, |r| tally.record(&BatchHeader::parse_unchecked(rest).unwrap(), r))
                    .unwrap();
            rest = &rest[h.size()..];
        }
        let mut got = tally.finish();
        got.sort();
        assert_eq!(got, reference(&all, 5_000));
        assert_eq!(got, [(-5_000, 3), (0, 3), (5_000, 3), (10_000, 6), (20_000, 3), (25_000, 3)]);
    }

    #[tokio::test]
    async fn internal_topics_are_not_counted_and_nothing_before_serving() {
        let config = AuditConfig { window: Duration::from_secs(1), ..AuditConfig::default() };
        let tier = BrokerTier::new(&config).unwrap();
        assert!(tier.tally("events").is_none(), "no counter before the broker serves");
        serve_unreachable(&tier);
        let mut b = BatchBuilder::new(0);
        b.append(0, None, Some(b"a"), &[]);
        let batch = b.build_vec();
        for topic in ["_audit", "__consumer_offsets", "_schemas", "_mirror_gaps"] {
            assert!(tier.tally(topic).is_none(), "{topic}");
        }
        append(&tier, "events", &batch);
        let failed = tier.tally("events").unwrap();
        drop(failed);
        let counts: Vec<_> = tier.counter().unwrap().unpublished().into_iter().collect();
        assert_eq!(counts, [(("events".to_string(), 0), 1)]);
        tier.started.get().unwrap().stop.cancel();
    }

    /// Starts the tier's publisher towards an address where nothing listens: it only
    /// retries in the background, and the counts stay unpublished for the test to read.
    fn serve_unreachable(tier: &BrokerTier) {
        tier.serving(&Serving {
            broker_id: 1,
            host: "h".into(),
            port: 9092,
            bootstrap: "127.0.0.1:1".into(),
            client_properties: Default::default(),
        });
    }

    /// The tier as the broker drives it: a tally per append, then maybe a marker.
    fn append(tier: &BrokerTier, topic: &str, batch: &[u8]) {
        let mut tally = tier.tally(topic).unwrap();
        BatchHeader::parse_walked(batch, 1 << 20, |r| tally.record(&BatchHeader::parse_unchecked(batch).unwrap(), r)).unwrap();
        tally.appended(topic);
    }

    fn batch(producer_id: Option<i64>, records: usize) -> Vec<u8> {
        let mut b = BatchBuilder::new(0);
        if let Some(id) = producer_id {
            b = b.producer(id, 0, 0).transactional();
        }
        for _ in 0..records {
            b.append(0, None, Some(b"v"), &[]);
        }
        b.build_vec()
    }

    #[tokio::test]
    async fn transactional_records_count_at_their_commit_marker_and_never_when_aborted() {
        let tier = BrokerTier::new(&AuditConfig { window: Duration::from_secs(1), ..AuditConfig::default() }).unwrap();
        serve_unreachable(&tier);
        let counted = || -> u64 { tier.counter().unwrap().unpublished().values().sum() };
        append(&tier, "events", &batch(None, 1));
        // Producer 7's transaction spans two topics (two partitions each); producer 8's is aborted.
        for topic in ["events", "events", "orders", "orders"] {
            append(&tier, topic, &batch(Some(7), 2));
        }
        append(&tier, "events", &batch(Some(8), 5));
        assert_eq!(counted(), 1, "transactional records wait for their marker");
        tier.transaction_ended("events", 8, false);
        tier.transaction_ended("events", 7, true);
        assert_eq!(counted(), 9);
        let per_topic: Vec<_> = tier.counter().unwrap().unpublished().into_iter().collect();
        assert_eq!(per_topic, [(("events".to_string(), 0), 5), (("orders".to_string(), 0), 4)]);
        // The markers of the transaction's other partitions find nothing more to count.
        for topic in ["events", "orders", "orders"] {
            tier.transaction_ended(topic, 7, true);
        }
        tier.transaction_ended("events", 8, true);
        assert_eq!(counted(), 9, "a transaction counts once, and never after its abort");
        // The producer's next transaction starts empty.
        append(&tier, "events", &batch(Some(7), 3));
        tier.transaction_ended("events", 7, true);
        assert_eq!(counted(), 12);
        tier.started.get().unwrap().stop.cancel();
    }

    #[test]
    fn held_counts_are_dropped_past_the_horizon() {
        let start = Instant::now();
        let mut undecided = Undecided::default();
        undecided.hold(1, "events", vec![(0, 3)], start);
        undecided.hold(2, "events", vec![(0, 4)], start + UNDECIDED_HORIZON / 2);
        undecided.hold(3, "events", vec![(0, 5)], start + UNDECIDED_HORIZON + Duration::from_secs(61));
        assert!(undecided.end(1).is_none(), "held past the horizon");
        assert_eq!(undecided.end(2).unwrap().counts, [("events".to_string(), vec![(0, 4)])]);
        assert!(undecided.end(3).is_some());
    }

    #[test]
    fn the_broker_defaults_are_the_audit_defaults() {
        let config = AuditConfig::default();
        assert_eq!((config.window.as_millis() as i64, config.tier.as_str()), (crate::DEFAULT_WINDOW_MS, crate::BROKER_TIER));
    }
}
