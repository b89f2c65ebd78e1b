//! The broker tier of the audit (`audit.enable`): the leader of a partition counts the
//! records it appends for producers, per topic and window of creation time, and
//! publishes the counts to `_audit` as tier `broker` (`audit.tier`) through `fjord-audit`'s
//! [`AuditCounter`] publisher (periodically and once more at shutdown).
//!
//! Only the Produce path counts: followers' appends (replica fetches) are not counted, so
//! a record counts once however many replicas it has; a retry the idempotent-producer
//! check recognises as a duplicate appends nothing and counts nothing; internal topics
//! (`_audit`, `__consumer_offsets`, ...) are not audited. A record's creation time is its
//! `fjord.created_ms` header, else its timestamp, exactly as every other tier reads it
//! (`fjord_audit::record::created_ms`), so the counts compare window by window.
//!
//! Cost on the produce path: nothing of its own. The leader's validation walks the
//! framing of every record it appends (decompressing a compressed batch once, to check
//! it), and shows each record to an [`AuditTally`] as it passes (see
//! `fjord_log::Log::append_visiting`); the tally reads the record's timestamp delta and,
//! for records with headers, compares header keys. One lock of the counter per
//! partition appended.

use std::sync::Arc;

use fjord_audit::record::{audited_topic, window_start};
use fjord_audit::{counter::tally, AuditCounter, CREATED_HEADER};
use fjord_record::{BatchHeader, RecordFrame, TimestampType};

use crate::config::AuditConfig;

/// The broker's counter.
#[derive(Debug)]
pub(crate) struct BrokerAudit {
    pub(crate) counter: Arc<AuditCounter>,
    window_ms: i64,
}

impl BrokerAudit {
    /// A counter for broker `broker_id` advertised as `host:port`, with the `audit.*`
    /// settings of `config`.
    pub(crate) fn new(broker_id: i32, host: &str, port: i32, config: &AuditConfig) -> crate::Result<Self> {
        let window = config.window;
        let counter = AuditCounter::new(config.tier.clone(), format!("{broker_id}/{host}:{port}"), config.cluster.clone())
            .with_window(window)
            .map_err(|e| crate::Error::InvalidConfig {
                key: "audit.window.ms".into(),
                value: window.as_millis().to_string(),
                reason: e.to_string(),
            })?;
        Ok(Self { window_ms: counter.window_ms(), counter: Arc::new(counter) })
    }

    /// A tally for an append to `topic`, `None` when the topic is not audited.
    pub(crate) fn tally(&self, topic: &str) -> Option<AuditTally> {
        audited_topic(topic).then(|| AuditTally::new(self.window_ms))
    }

    /// Counts `tally`, gathered while this broker appended to `topic` as its leader for
    /// a producer (the append succeeded and was not a duplicate).
    pub(crate) fn count_appended(&self, topic: &str, tally: AuditTally) {
        self.counter.record_windows(topic, &tally.finish());
    }
}

/// The records of one append by window of creation time, gathered record by record from
/// the validation's walk. Control batches (transaction markers) hold no events and are
/// not counted.
#[derive(Debug)]
pub(crate) struct AuditTally {
    window_ms: i64,
    windows: Vec<(i64, u64)>,
    /// The current window as [start, end) and the records counted in it: consecutive
    /// records nearly always share it, so most records cost a comparison, not a division.
    start: i64,
    end: i64,
    run: u64,
}

impl AuditTally {
    fn new(window_ms: i64) -> Self {
        Self { window_ms, windows: Vec::new(), start: 0, end: 0, run: 0 }
    }

    /// Counts one record of the batch `header`, by its `fjord.created_ms` header when it
    /// has one that parses (the first header of that name decides, as in
    /// `fjord_audit::record::created_ms`), else by its timestamp as a consumer sees it.
    #[inline]
    pub(crate) fn record(&mut self, header: &BatchHeader, record: &RecordFrame<'_>) {
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

/// The value of the record's first `fjord.created_ms` header, when it parses.
fn created_ms(record: &RecordFrame<'_>) -> Option<i64> {
    let (_, value) = record.headers().find(|(key, _)| *key == CREATED_HEADER.as_bytes())?;
    std::str::from_utf8(value?).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use fjord_record::{BatchBuilder, Compression, BATCH_OVERHEAD};

    /// The reference: every record decoded, windowed by `fjord_audit::record::created_ms`.
    fn reference(batches: &[u8], window_ms: i64) -> Vec<(i64, u64)> {
        let mut out = Vec::new();
        for b in fjord_record::batch::batches(batches) {
            let (h, bytes) = b.unwrap();
            let body = fjord_record::compression::records_body(&h, bytes, 1 << 30).unwrap();
            for r in fjord_record::Records::new(&body, BATCH_OVERHEAD) {
                let r = r.unwrap();
                let headers = r.headers.iter().map(|h| (std::str::from_utf8(h.key).unwrap(), h.value));
                let ms = fjord_audit::record::created_ms(headers, h.base_timestamp + r.timestamp_delta);
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
        let mut tally = AuditTally::new(5_000);
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

    #[test]
    fn internal_topics_are_not_counted() {
        let config = AuditConfig { window: std::time::Duration::from_secs(1), ..AuditConfig::default() };
        let audit = BrokerAudit::new(1, "h", 9092, &config).unwrap();
        let mut b = BatchBuilder::new(0);
        b.append(0, None, Some(b"a"), &[]);
        let batch = b.build_vec();
        for topic in ["_audit", "__consumer_offsets", "_schemas", "_mirror_gaps"] {
            assert!(audit.tally(topic).is_none(), "{topic}");
        }
        let mut tally = audit.tally("events").unwrap();
        BatchHeader::parse_walked(&batch, 1 << 20, |r| tally.record(&BatchHeader::parse_unchecked(&batch).unwrap(), r)).unwrap();
        audit.count_appended("events", tally);
        assert_eq!(audit.counter.unpublished().into_iter().collect::<Vec<_>>(), [(("events".to_string(), 0), 1)]);
    }
}
