//! The broker tier of the audit (`audit.enable`), as a [`BrokerObserver`] the binary hands
//! to the broker: the leader of a partition counts the records it appends for producers,
//! per topic and window of creation time, and publishes the counts to `_audit` as tier
//! `broker` (`audit.tier`) through an [`AuditCounter`] (periodically, before a controlled
//! shutdown's handover, and once more before the broker stops accepting).
//!
//! Only the Produce path counts: followers' appends (replica fetches) are not counted, so
//! a record counts once however many replicas it has; a retry the idempotent-producer
//! check recognises as a duplicate appends nothing and counts nothing; internal topics
//! (`_audit`, `__consumer_offsets`, ...) are not audited. A record's creation time is its
//! `fjord.created_ms` header, else its timestamp, exactly as every other tier reads it
//! ([`crate::record::created_ms`]), so the counts compare window by window.
//!
//! Cost on the produce path: nothing of its own. The leader's validation walks the
//! framing of every record it appends (decompressing a compressed batch once, to check
//! it), and shows each record to the tally as it passes; the tally reads the record's
//! timestamp delta and, for records with headers, compares header keys. One lock of the
//! counter per partition appended.
//!
//! Wiring (what `fjord dev` and `fjord broker` do): [`BrokerTier::install`] on the
//! broker's config before `fjord_broker::run`.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

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

/// The broker tier: counts from the first [`BrokerObserver::serving`] on (the broker
/// accepts no produce before it), publishes over a client of the broker itself.
#[derive(Debug)]
pub struct BrokerTier {
    config: AuditConfig,
    window_ms: i64,
    /// Set once the broker serves: the counter is named after its address.
    started: OnceLock<Started>,
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
        Ok(Self { window_ms: window_ms(config.window)?, config: config.clone(), started: OnceLock::new() })
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
        audited_topic(topic).then(|| Box::new(Tally::new(counter, self.window_ms)) as Box<dyn AppendTally>)
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
/// not counted.
#[derive(Debug)]
struct Tally {
    counter: Arc<AuditCounter>,
    window_ms: i64,
    windows: Vec<(i64, u64)>,
    /// The current window as [start, end) and the records counted in it: consecutive
    /// records nearly always share it, so most records cost a comparison, not a division.
    start: i64,
    end: i64,
    run: u64,
}

impl Tally {
    fn new(counter: Arc<AuditCounter>, window_ms: i64) -> Self {
        Self { counter, window_ms, windows: Vec::new(), start: 0, end: 0, run: 0 }
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
        if (self.start..self.end).contains(&ms) {
            self.run += 1;
            return;
        }
        self.flush_run();
        self.start = window_start(ms, self.window_ms);
        self.end = self.start.saturating_add(self.window_ms);
        self.run = 1;
    }

    fn appended(self: Box<Self>, topic: &str) {
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
        let mut tally = Tally::new(counter(5_000), 5_000);
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
        // Nothing listens there: the publisher only retries in the background.
        tier.serving(&Serving {
            broker_id: 1,
            host: "h".into(),
            port: 9092,
            bootstrap: "127.0.0.1:1".into(),
            client_properties: Default::default(),
        });
        let mut b = BatchBuilder::new(0);
        b.append(0, None, Some(b"a"), &[]);
        let batch = b.build_vec();
        for topic in ["_audit", "__consumer_offsets", "_schemas", "_mirror_gaps"] {
            assert!(tier.tally(topic).is_none(), "{topic}");
        }
        let mut tally = tier.tally("events").unwrap();
        BatchHeader::parse_walked(&batch, 1 << 20, |r| tally.record(&BatchHeader::parse_unchecked(&batch).unwrap(), r)).unwrap();
        tally.appended("events");
        let failed = tier.tally("events").unwrap();
        drop(failed);
        let counts: Vec<_> = tier.counter().unwrap().unpublished().into_iter().collect();
        assert_eq!(counts, [(("events".to_string(), 0), 1)]);
        tier.started.get().unwrap().stop.cancel();
    }

    #[test]
    fn the_broker_defaults_are_the_audit_defaults() {
        let config = AuditConfig::default();
        assert_eq!((config.window.as_millis() as i64, config.tier.as_str()), (crate::DEFAULT_WINDOW_MS, crate::BROKER_TIER));
    }
}
