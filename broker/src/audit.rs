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
//! Cost on the produce path: one walk over the varint framing of each appended record
//! (no allocation; header keys are compared only for records that have headers), and
//! one lock of the counter per partition appended. Compressed batches are decompressed
//! once more, since a header could be inside any record.

use std::sync::Arc;

use fjord_audit::record::{audited_topic, window_start};
use fjord_audit::{counter::tally, AuditCounter, CREATED_HEADER};
use fjord_record::compression::records_body;
use fjord_record::varint::varlong_at;
use fjord_record::{BatchHeader, TimestampType, BATCH_OVERHEAD};

use crate::config::AuditConfig;

/// Largest records section a compressed batch is expanded to for counting (the client's
/// guard against decompression bombs).
const MAX_DECOMPRESSED_BATCH: usize = 256 * 1024 * 1024;

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

    /// Counts the records of `batches`, just appended to `topic` by this broker as its
    /// leader for a producer (validated by the append; not a duplicate).
    pub(crate) fn count_appended(&self, topic: &str, batches: &[u8]) {
        if !audited_topic(topic) {
            return;
        }
        let mut windows = Vec::new();
        count_batches(batches, self.window_ms, &mut windows);
        self.counter.record_windows(topic, &windows);
    }
}

/// Adds the records of the (validated) `batches` to `windows` as `(window start, count)`.
/// Control batches (transaction markers) hold no events and are skipped.
pub(crate) fn count_batches(mut buf: &[u8], window_ms: i64, windows: &mut Vec<(i64, u64)>) {
    while buf.len() >= BATCH_OVERHEAD {
        let Ok(header) = BatchHeader::parse_unchecked(buf) else { return };
        let (batch, rest) = buf.split_at(header.size().min(buf.len()));
        buf = rest;
        if !header.is_control() {
            count_batch(&header, batch, window_ms, windows);
        }
    }
}

fn count_batch(header: &BatchHeader, batch: &[u8], window_ms: i64, windows: &mut Vec<(i64, u64)>) {
    let records = u64::try_from(header.record_count).unwrap_or(0);
    let body = match records_body(header, batch, MAX_DECOMPRESSED_BATCH) {
        Ok(body) => body,
        Err(e) => {
            // The log stored it, so the broker holds these records; no consumer can read
            // them either. Counted by the batch's first timestamp.
            tracing::debug!(error = %e, "audit: a stored compressed batch does not decompress; counted by its base timestamp");
            tally(windows, window_start(header.base_timestamp, window_ms), records);
            return;
        }
    };
    // A consumer sees the batch's max timestamp on every record of a LogAppendTime batch.
    let log_append = (header.timestamp_type() == TimestampType::LogAppendTime).then_some(header.max_timestamp);
    // The current window as [start, end): consecutive records nearly always share it,
    // so most records cost a comparison, not a division.
    let (mut start, mut end, mut run) = (0i64, 0i64, 0u64);
    let mut counted = 0u64;
    let mut at = 0;
    while at < body.len() {
        let Some((delta, created)) = next_record(&body, &mut at) else { break };
        let ms = created.or(log_append).unwrap_or_else(|| header.base_timestamp.wrapping_add(delta));
        counted += 1;
        if (start..end).contains(&ms) {
            run += 1;
            continue;
        }
        if run > 0 {
            tally(windows, start, run);
        }
        start = window_start(ms, window_ms);
        end = start.saturating_add(window_ms);
        run = 1;
    }
    if run > 0 {
        tally(windows, start, run);
    }
    if counted < records {
        // Only a compressed body can be malformed here (the append checked the framing
        // of uncompressed ones): the rest counts by the base timestamp, as above.
        tally(windows, window_start(header.base_timestamp, window_ms), records - counted);
    }
}

/// Reads the record at `*at` of an uncompressed records section: its timestamp delta
/// and its `fjord.created_ms` header value when it has one that parses (the first header
/// of that name decides, as in `fjord_audit::record::created_ms`). Moves `*at` past it.
///
/// The walk of the append path's framing check (`fjord_record`'s `check_framing`): one-
/// and two-byte varints without a loop, keys and values skipped by their lengths. With
/// `get_varint` calls instead it cost 2.7 times that check (perf, bench produce).
#[inline]
fn next_record(body: &[u8], at: &mut usize) -> Option<(i64, Option<i64>)> {
    let mut p = *at;
    let len = usize::try_from(varlong_at(body, &mut p)?).ok()?;
    let end = p.checked_add(len).filter(|&end| end <= body.len())?;
    let record = &body[..end];
    *at = end;
    p += 1; // attributes
    let delta = varlong_at(record, &mut p)?;
    varlong_at(record, &mut p)?; // offset delta
    skip_bytes(record, &mut p)?; // key
    skip_bytes(record, &mut p)?; // value
    let headers = varlong_at(record, &mut p)?;
    for _ in 0..headers {
        let key = bytes_at(record, &mut p)?;
        let value = bytes_at(record, &mut p)?;
        if key == Some(CREATED_HEADER.as_bytes()) {
            let created = value.and_then(|v| std::str::from_utf8(v).ok()?.trim().parse().ok());
            return Some((delta, created));
        }
    }
    Some((delta, None))
}

/// Skips a length-prefixed byte string (-1 = null) at `*at`.
#[inline(always)]
fn skip_bytes(buf: &[u8], at: &mut usize) -> Option<()> {
    let len = varlong_at(buf, at)?;
    if len >= 0 {
        *at = at.checked_add(usize::try_from(len).ok()?).filter(|&end| end <= buf.len())?;
    }
    Some(())
}

/// A length-prefixed byte string at `*at` (`None` inside for a null).
fn bytes_at<'a>(buf: &'a [u8], at: &mut usize) -> Option<Option<&'a [u8]>> {
    let len = varlong_at(buf, at)?;
    if len < 0 {
        return Some(None);
    }
    let end = at.checked_add(usize::try_from(len).ok()?)?;
    let b = buf.get(*at..end)?;
    *at = end;
    Some(Some(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fjord_record::{BatchBuilder, Compression};

    /// The reference: every record decoded, windowed by `fjord_audit::record::created_ms`.
    fn reference(batches: &[u8], window_ms: i64) -> Vec<(i64, u64)> {
        let mut out = Vec::new();
        for b in fjord_record::batch::batches(batches) {
            let (h, bytes) = b.unwrap();
            let body = records_body(&h, bytes, MAX_DECOMPRESSED_BATCH).unwrap();
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
        let mut got = Vec::new();
        count_batches(&all, 5_000, &mut got);
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
            audit.count_appended(topic, &batch);
        }
        audit.count_appended("events", &batch);
        assert_eq!(audit.counter.unpublished().into_iter().collect::<Vec<_>>(), [(("events".to_string(), 0), 1)]);
    }
}
