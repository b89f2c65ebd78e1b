//! The records inside an uncompressed batch.
//!
//! ```text
//! length varint, attributes i8, timestamp_delta varlong, offset_delta varint,
//! key_length varint (-1 = null), key, value_length varint (-1 = null), value,
//! header_count varint, headers [key_length varint, key, value_length varint, value]
//! ```

use crate::varint::{get_varint, get_varlong, varlong_at};
use crate::{Error, Result};

/// One record, borrowed from the batch bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<'a> {
    /// Byte position of the record inside its batch (for error messages).
    pub position: usize,
    /// Timestamp relative to the batch's base timestamp.
    pub timestamp_delta: i64,
    /// Offset relative to the batch's base offset.
    pub offset_delta: i32,
    /// Key, `None` when null.
    pub key: Option<&'a [u8]>,
    /// Value, `None` when null (a tombstone in a compacted topic).
    pub value: Option<&'a [u8]>,
    /// Headers in order.
    pub headers: Vec<Header<'a>>,
}

/// A record header: a string key and an optional value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header<'a> {
    /// Header key (UTF-8 by convention; not checked).
    pub key: &'a [u8],
    /// Header value, `None` when null.
    pub value: Option<&'a [u8]>,
}

/// Iterator over the records of an uncompressed batch body (the bytes after the
/// 61-byte header). Stops after the first error.
#[derive(Debug)]
pub struct Records<'a> {
    body: &'a [u8],
    at: usize,
    base_position: usize,
    failed: bool,
}

impl<'a> Records<'a> {
    /// Iterates over `body`; `base_position` is added to positions in errors.
    pub fn new(body: &'a [u8], base_position: usize) -> Self {
        Self { body, at: 0, base_position, failed: false }
    }

    /// Reads one record with its headers.
    fn read_record(&mut self) -> Result<Record<'a>> {
        let position = self.base_position + self.at;
        let bad = |detail| Error::MalformedRecord { position, detail };
        let (length, n) = get_varint(&self.body[self.at..]).ok_or_else(|| bad("unreadable length"))?;
        let start = self.at + n;
        let end = usize::try_from(length)
            .ok()
            .and_then(|len| start.checked_add(len))
            .filter(|&end| end <= self.body.len())
            .ok_or_else(|| bad("length runs past the batch"))?;
        let mut cursor = Cursor { buf: &self.body[start..end], at: 0 };
        let _attributes = cursor.byte().ok_or_else(|| bad("missing attributes"))?;
        let timestamp_delta = cursor.varlong().ok_or_else(|| bad("bad timestamp delta"))?;
        let offset_delta = cursor.varint().ok_or_else(|| bad("bad offset delta"))?;
        let key = cursor.nullable_bytes().ok_or_else(|| bad("bad key"))?;
        let value = cursor.nullable_bytes().ok_or_else(|| bad("bad value"))?;
        let header_count = cursor.varint().filter(|&c| c >= 0).ok_or_else(|| bad("bad header count"))?;
        let mut headers = Vec::with_capacity((header_count as usize).min(64));
        for _ in 0..header_count {
            let key = cursor.nullable_bytes().flatten().ok_or_else(|| bad("bad header key"))?;
            let value = cursor.nullable_bytes().ok_or_else(|| bad("bad header value"))?;
            headers.push(Header { key, value });
        }
        if cursor.at != cursor.buf.len() {
            return Err(bad("trailing bytes after the headers"));
        }
        self.at = end;
        Ok(Record { position, timestamp_delta, offset_delta, key, value, headers })
    }
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<Record<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.at >= self.body.len() {
            return None;
        }
        let record = self.read_record();
        self.failed = record.is_err();
        Some(record)
    }
}

/// What the framing walk saw of one well-framed record: what the append path checks
/// and counts (keys of a compacted topic, the audit's creation time) without decoding
/// the record into a [`Record`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordFrame<'a> {
    /// Index of the record in its batch, from 0.
    pub index: i32,
    /// Timestamp relative to the batch's base timestamp.
    pub timestamp_delta: i64,
    /// Offset relative to the batch's base offset.
    pub offset_delta: i32,
    /// Whether the key is present (not null).
    pub has_key: bool,
    /// Number of headers.
    pub header_count: i32,
    /// The headers (after their count), already checked to hold `header_count` of them.
    pub headers: &'a [u8],
}

impl<'a> RecordFrame<'a> {
    /// The record's headers in order, as `(key, value)`; `None` for a null value.
    pub fn headers(&self) -> impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)> + 'a {
        let (buf, mut at) = (self.headers, 0usize);
        (0..self.header_count).map_while(move |_| {
            // The walk checked this framing; a short read ends the iteration.
            let key = bytes_at(buf, &mut at)??;
            let value = bytes_at(buf, &mut at)?;
            Some((key, value))
        })
    }
}

/// A length-prefixed byte string at `*at`: `Some(None)` for a null, `None` when malformed.
fn bytes_at<'a>(buf: &'a [u8], at: &mut usize) -> Option<Option<&'a [u8]>> {
    let len = varint_at(buf, at)?;
    if len == -1 {
        return Some(None);
    }
    let end = at.checked_add(usize::try_from(len).ok()?)?;
    let bytes = buf.get(*at..end)?;
    *at = end;
    Some(Some(bytes))
}

/// Checks the framing of every record in the uncompressed batch body `body` exactly as
/// [`Records`] reads it (lengths, every field, headers, no trailing bytes), that each
/// offset delta lies in `0..=last_offset_delta`, and that there are exactly
/// `record_count` records. Errors name positions offset by `base_position`.
///
/// The append path's validation: a tight walk over the varints that skips keys,
/// values and headers without building records, so it costs a few nanoseconds per
/// record instead of a decode.
pub(crate) fn check_framing(body: &[u8], base_position: usize, last_offset_delta: i32, record_count: i32) -> Result<()> {
    let mut walk = FramingWalk::new(base_position, last_offset_delta, record_count);
    walk.advance(body, body.len())?;
    walk.finish()
}

/// [`check_framing`] in steps, so a caller can interleave it with another pass over
/// the same bytes (the CRC, see `BatchHeader::parse_validated`).
#[derive(Debug)]
pub(crate) struct FramingWalk {
    at: usize,
    seen: i32,
    base_position: usize,
    last_offset_delta: i32,
    record_count: i32,
}

impl FramingWalk {
    pub(crate) fn new(base_position: usize, last_offset_delta: i32, record_count: i32) -> Self {
        Self { at: 0, seen: 0, base_position, last_offset_delta, record_count }
    }

    /// Checks the records of `body` that start before `until` (`<= body.len()`); the
    /// last of them may end past it. Calls must pass the same `body`.
    pub(crate) fn advance(&mut self, body: &[u8], until: usize) -> Result<()> {
        self.advance_with(body, until, &mut |_| {})
    }

    /// [`FramingWalk::advance`], showing `visit` each record once it passed its checks.
    /// With a visitor that does nothing this compiles to the same loop.
    #[inline(always)]
    pub(crate) fn advance_with<F: FnMut(&RecordFrame<'_>)>(&mut self, body: &[u8], until: usize, visit: &mut F) -> Result<()> {
        let (last_offset_delta, record_count) = (self.last_offset_delta, self.record_count);
        let mut at = self.at;
        let mut seen = self.seen;
        while at < until {
            let position = self.base_position + at;
            let bad = |detail| Error::MalformedRecord { position, detail };
            let length = varint_at(body, &mut at).ok_or_else(|| bad("unreadable length"))?;
            let end = usize::try_from(length)
                .ok()
                .and_then(|len| at.checked_add(len))
                .filter(|&end| end <= body.len())
                .ok_or_else(|| bad("length runs past the batch"))?;
            let record = &body[..end];
            if at == end {
                return Err(bad("missing attributes"));
            }
            at += 1;
            let timestamp_delta = varlong_at(record, &mut at).ok_or_else(|| bad("bad timestamp delta"))?;
            let offset_delta = varint_at(record, &mut at).ok_or_else(|| bad("bad offset delta"))?;
            let key_null = skip_nullable(record, &mut at).ok_or_else(|| bad("bad key"))?;
            skip_nullable(record, &mut at).ok_or_else(|| bad("bad value"))?;
            let header_count = varint_at(record, &mut at).filter(|&c| c >= 0).ok_or_else(|| bad("bad header count"))?;
            let headers_start = at;
            for _ in 0..header_count {
                skip_nullable(record, &mut at).filter(|&null| !null).ok_or_else(|| bad("bad header key"))?;
                skip_nullable(record, &mut at).ok_or_else(|| bad("bad header value"))?;
            }
            if at != end {
                return Err(bad("trailing bytes after the headers"));
            }
            if offset_delta < 0 || offset_delta > last_offset_delta {
                return Err(bad("offset delta outside the batch"));
            }
            if seen >= record_count {
                return Err(Error::RecordCountMismatch { count: record_count, detail: "batch holds more records" });
            }
            visit(&RecordFrame {
                index: seen,
                timestamp_delta,
                offset_delta,
                has_key: !key_null,
                header_count,
                headers: &record[headers_start..],
            });
            seen += 1;
        }
        self.at = at;
        self.seen = seen;
        Ok(())
    }

    /// The verdict once [`FramingWalk::advance`] reached the end of the body.
    pub(crate) fn finish(&self) -> Result<()> {
        if self.seen != self.record_count {
            return Err(Error::RecordCountMismatch { count: self.record_count, detail: "batch holds fewer records" });
        }
        Ok(())
    }
}

/// [`varlong_at`] for a value that must fit an `i32`, as [`get_varint`].
#[inline(always)]
fn varint_at(buf: &[u8], at: &mut usize) -> Option<i32> {
    i32::try_from(varlong_at(buf, at)?).ok()
}

/// Skips a length-prefixed byte string (-1 = null) at `*at`; `Some(true)` when null,
/// `None` when malformed (as [`Cursor::nullable_bytes`]).
#[inline(always)]
fn skip_nullable(buf: &[u8], at: &mut usize) -> Option<bool> {
    let len = varint_at(buf, at)?;
    if len == -1 {
        return Some(true);
    }
    let end = at.checked_add(usize::try_from(len).ok()?)?;
    if end > buf.len() {
        return None;
    }
    *at = end;
    Some(false)
}

struct Cursor<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn byte(&mut self) -> Option<u8> {
        let b = *self.buf.get(self.at)?;
        self.at += 1;
        Some(b)
    }

    fn varint(&mut self) -> Option<i32> {
        let (v, n) = get_varint(&self.buf[self.at..])?;
        self.at += n;
        Some(v)
    }

    fn varlong(&mut self) -> Option<i64> {
        let (v, n) = get_varlong(&self.buf[self.at..])?;
        self.at += n;
        Some(v)
    }

    /// `Some(None)` for a null (-1 length), `None` when malformed.
    fn nullable_bytes(&mut self) -> Option<Option<&'a [u8]>> {
        let len = self.varint()?;
        if len == -1 {
            return Some(None);
        }
        let len = usize::try_from(len).ok()?;
        let bytes = self.buf.get(self.at..self.at.checked_add(len)?)?;
        self.at += len;
        Some(Some(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BatchBuilder, BATCH_OVERHEAD};
    use proptest::prelude::*;

    /// The verdict of the decoding iterator (what the append path used before
    /// [`check_framing`]): the reference the fast walk must match exactly.
    fn reference(body: &[u8], last_offset_delta: i32, record_count: i32) -> Result<()> {
        let mut seen = 0i32;
        for record in Records::new(body, BATCH_OVERHEAD) {
            let record = record?;
            if record.offset_delta < 0 || record.offset_delta > last_offset_delta {
                return Err(Error::MalformedRecord { position: record.position, detail: "offset delta outside the batch" });
            }
            seen += 1;
            if seen > record_count {
                return Err(Error::RecordCountMismatch { count: record_count, detail: "batch holds more records" });
            }
        }
        if seen != record_count {
            return Err(Error::RecordCountMismatch { count: record_count, detail: "batch holds fewer records" });
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn fast_walk_refuses_exactly_what_decoding_refuses(
            records in prop::collection::vec(
                (0i64..100_000,
                 prop::option::of(prop::collection::vec(any::<u8>(), 0..20)),
                 prop::option::of(prop::collection::vec(any::<u8>(), 0..200)),
                 prop::collection::vec(("[a-z]{0,4}", prop::option::of(prop::collection::vec(any::<u8>(), 0..4))), 0..3)),
                1..12),
            flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
            cut in any::<prop::sample::Index>(),
            cut_it in any::<bool>(),
            count_lie in -1i32..2,
            delta_lie in -1i32..2,
        ) {
            let mut b = BatchBuilder::new(0);
            for (ts, k, v, h) in &records {
                let headers: Vec<(&str, Option<&[u8]>)> = h.iter().map(|(k, v)| (k.as_str(), v.as_deref())).collect();
                b.append(*ts, k.as_deref(), v.as_deref(), &headers);
            }
            let bytes = b.build_vec();
            let mut body = bytes[BATCH_OVERHEAD..].to_vec();
            for (at, value) in &flips {
                let i = at.index(body.len());
                body[i] = *value;
            }
            if cut_it {
                body.truncate(cut.index(body.len() + 1));
            }
            let count = records.len() as i32 + count_lie;
            let last_delta = records.len() as i32 - 1 + delta_lie;
            prop_assert_eq!(check_framing(&body, BATCH_OVERHEAD, last_delta, count), reference(&body, last_delta, count));
        }

        #[test]
        fn fast_varints_read_as_the_reference(value in any::<i64>(), tail in prop::collection::vec(any::<u8>(), 0..3)) {
            let mut buf = Vec::new();
            crate::varint::put_varlong(&mut buf, value);
            let full = buf.len();
            buf.extend(&tail);
            for len in 0..=buf.len() {
                let mut at = 0;
                let fast = varlong_at(&buf[..len], &mut at).map(|v| (v, at));
                prop_assert_eq!(fast, get_varlong(&buf[..len]));
                prop_assert_eq!(fast.is_some(), len >= full);
            }
        }

        #[test]
        fn fast_varints_read_random_bytes_as_the_reference(bytes in prop::collection::vec(any::<u8>(), 0..12)) {
            let mut at = 0;
            let fast = varlong_at(&bytes, &mut at).map(|v| (v, at));
            prop_assert_eq!(fast, get_varlong(&bytes));
        }
    }
}
