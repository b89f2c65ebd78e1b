//! What an append is checked for before anything is written: framing, CRC, sizes,
//! record counts, and for a leader's append the records inside compressed batches,
//! the keys of a compacted log and the producers' timestamps. Pure functions over the
//! bytes (and the leader's clock, passed in).

use fjord_record::batch::BatchHeader;
use fjord_record::{Compression, RecordFrame, BATCH_OVERHEAD};

use crate::{Error, LogConfig, Result};

/// Kafka's RecordBatch.NO_TIMESTAMP: a producer that sets none; never out of range.
const NO_TIMESTAMP: i64 = -1;

/// An append holds at least one batch header and fits the `i32` positions of the index.
fn check_append_size(buf: &[u8]) -> Result<()> {
    if buf.is_empty() {
        let source = fjord_record::Error::Truncated { needed: BATCH_OVERHEAD, available: 0 };
        return Err(Error::InvalidBatch { position: 0, source });
    }
    if buf.len() > i32::MAX as usize {
        return Err(Error::MessageTooLarge { size: buf.len(), max: i32::MAX as usize });
    }
    Ok(())
}

/// Checks every batch of an append before anything is written: framing, magic, CRC,
/// records of uncompressed batches, a non-zero record count, and the size limit.
/// Returns each batch's position in `buf` and header.
pub(super) fn validate(buf: &[u8], max_message_bytes: u32) -> Result<Vec<(usize, BatchHeader)>> {
    validate_each(buf, max_message_bytes, BatchHeader::parse_validated)
}

/// [`validate`] with `parse` validating each batch (it returns the header).
fn validate_each(
    buf: &[u8],
    max_message_bytes: u32,
    mut parse: impl FnMut(&[u8]) -> fjord_record::Result<BatchHeader>,
) -> Result<Vec<(usize, BatchHeader)>> {
    check_append_size(buf)?;
    let mut out = Vec::new();
    let mut position = 0;
    while position < buf.len() {
        let rest = &buf[position..];
        let invalid = |source| Error::InvalidBatch { position, source };
        let header = BatchHeader::parse_unchecked(rest).map_err(invalid)?;
        if header.size() > max_message_bytes as usize {
            return Err(Error::MessageTooLarge { size: header.size(), max: max_message_bytes as usize });
        }
        let header = parse(rest).map_err(invalid)?;
        if header.record_count == 0 {
            return Err(invalid(fjord_record::Error::RecordCountMismatch { count: 0, detail: "empty batch" }));
        }
        out.push((position, header));
        position += header.size();
    }
    Ok(out)
}

/// What [`crate::Log::append_visiting`] shows a caller of each record: the batch's header (as
/// parsed; its offsets are not assigned yet) and the record's framing.
pub type RecordVisitor<'a> = &'a mut dyn FnMut(&BatchHeader, &RecordFrame<'_>);

/// [`validate`] for a leader's append, where the bytes come from a client: the records
/// of compressed batches are decompressed (all batches together into at most
/// [`LogConfig::max_decompressed_bytes`]) and walked like an uncompressed batch's; in a
/// compacted log every record needs a key (control batches aside: the cleaner could
/// never tell which value is the latest); and every record's timestamp, and each
/// batch's max timestamp, which time retention and the time index go by, must be in
/// [`LogConfig::accepted_timestamps`] at `now_ms` (Kafka's check, which also passes
/// the "no timestamp" -1). One walk per batch serves the framing check, the key and
/// timestamp checks and `visit`.
pub(super) fn validate_leader(
    buf: &[u8],
    config: &LogConfig,
    now_ms: i64,
    mut visit: Option<RecordVisitor<'_>>,
) -> Result<Vec<(usize, BatchHeader)>> {
    let compacts = config.cleanup_policy.compacts();
    let accepted = config.accepted_timestamps(now_ms);
    let (earliest, latest) = accepted.as_ref().map_or((i64::MIN, i64::MAX), |a| (*a.start(), *a.end()));
    let in_range = |timestamp: i64| (earliest <= timestamp && timestamp <= latest) || timestamp == NO_TIMESTAMP;
    // A batch's timestamps are all in range when its smallest and largest are (strictly:
    // the exemption of -1 would hide a record between -1 and the earliest accepted).
    let all_in_range = |header: &BatchHeader, (min_delta, max_delta): (i64, i64)| {
        header.is_control()
            || (earliest <= header.base_timestamp.saturating_add(min_delta)
                && header.base_timestamp.saturating_add(max_delta) <= latest
                && in_range(header.max_timestamp))
    };
    if visit.is_none() && !compacts && batch_headers(buf).all(|h| h.compression() == Compression::None) {
        if accepted.is_none() {
            return validate(buf, config.max_message_bytes);
        }
        // The common case needs nothing but the framing walk that CRC checking
        // interleaves, keeping the extremes of each batch's timestamp deltas: the
        // general walk below cost 5-8% more per append (50-record batches of 200 bytes,
        // appended to a log on tmpfs), this one no measurable difference.
        let mut timestamps_in_range = true;
        let headers = validate_each(buf, config.max_message_bytes, |rest| {
            let mut deltas = (i64::MAX, i64::MIN);
            let (header, _) = BatchHeader::parse_walked(rest, 0, |record| {
                deltas = (deltas.0.min(record.timestamp_delta), deltas.1.max(record.timestamp_delta));
            })?;
            timestamps_in_range &= all_in_range(&header, deltas);
            Ok(header)
        })?;
        if timestamps_in_range {
            return Ok(headers);
        }
        // Out of range: the walk below names the records.
    }
    check_append_size(buf)?;
    let limit = config.max_decompressed_bytes();
    let mut budget = limit;
    // KIP-467: the index of each keyless record among the append's records, and the
    // first batch holding one.
    let mut keyless: Vec<i32> = Vec::new();
    let mut first_keyless = None;
    // The same for timestamps out of range, with the first one seen.
    let mut out_of_range: Vec<i32> = Vec::new();
    let mut first_out_of_range: Option<(usize, i64)> = None;
    let mut records_before = 0i32;
    let mut out = Vec::new();
    let mut position = 0;
    while position < buf.len() {
        let rest = &buf[position..];
        let invalid = |source| Error::InvalidBatch { position, source };
        let unchecked = BatchHeader::parse_unchecked(rest).map_err(invalid)?;
        if unchecked.size() > config.max_message_bytes as usize {
            return Err(Error::MessageTooLarge { size: unchecked.size(), max: config.max_message_bytes as usize });
        }
        let check_keys = compacts && !unchecked.is_control();
        // Control batches from clients are refused after validation anyway.
        let check_timestamps = accepted.is_some() && !unchecked.is_control();
        let keyless_before = keyless.len();
        let walked = BatchHeader::parse_walked(rest, budget, |record| {
            if check_keys && !record.has_key {
                keyless.push(records_before.saturating_add(record.index));
            }
            if check_timestamps {
                let timestamp = unchecked.base_timestamp.saturating_add(record.timestamp_delta);
                if !in_range(timestamp) {
                    out_of_range.push(records_before.saturating_add(record.index));
                    first_out_of_range.get_or_insert((position, timestamp));
                }
            }
            if let Some(visit) = visit.as_mut() {
                visit(&unchecked, record);
            }
        });
        let (header, expanded) = match walked {
            Ok(walked) => walked,
            Err(fjord_record::Error::DecompressedTooLarge { codec, .. }) => {
                return Err(Error::DecompressedTooLarge { position, codec, limit })
            }
            Err(source) => return Err(invalid(source)),
        };
        budget -= expanded;
        if header.record_count == 0 {
            return Err(invalid(fjord_record::Error::RecordCountMismatch { count: 0, detail: "empty batch" }));
        }
        if keyless.len() > keyless_before && first_keyless.is_none() {
            first_keyless = Some(position);
        }
        if check_timestamps && !in_range(header.max_timestamp) {
            first_out_of_range.get_or_insert((position, header.max_timestamp));
        }
        records_before = records_before.saturating_add(header.record_count);
        out.push((position, header));
        position += header.size();
    }
    if let Some(position) = first_keyless {
        return Err(Error::MissingKey { position, record_indexes: keyless });
    }
    // Set only where timestamps were checked, which needs limits (`accepted`).
    if let Some((position, timestamp)) = first_out_of_range {
        return Err(Error::TimestampOutOfRange { position, timestamp, min: earliest, max: latest, record_indexes: out_of_range });
    }
    Ok(out)
}

/// The headers of the batches in `buf`, read without any check, until one does not parse:
/// enough to see which codecs an append holds before choosing how to validate it.
fn batch_headers(mut buf: &[u8]) -> impl Iterator<Item = BatchHeader> + '_ {
    std::iter::from_fn(move || {
        let header = BatchHeader::parse_unchecked(buf).ok()?;
        buf = buf.get(header.size()..).unwrap_or_default();
        Some(header)
    })
}
