//! The records inside an uncompressed batch.
//!
//! ```text
//! length varint, attributes i8, timestamp_delta varlong, offset_delta varint,
//! key_length varint (-1 = null), key, value_length varint (-1 = null), value,
//! header_count varint, headers [key_length varint, key, value_length varint, value]
//! ```

use crate::varint::{get_varint, get_varlong};
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

    /// Reads the next record, checking its framing exactly as the iterator does, but
    /// skipping over the headers instead of collecting them: the append path's
    /// validation, which must not allocate per record. `None` at the end.
    pub fn next_skipping_headers(&mut self) -> Option<Result<Record<'a>>> {
        if self.failed || self.at >= self.body.len() {
            return None;
        }
        let record = self.read_record(false);
        self.failed = record.is_err();
        Some(record)
    }

    /// Reads one record; headers are collected only when `collect_headers`.
    fn read_record(&mut self, collect_headers: bool) -> Result<Record<'a>> {
        let position = self.base_position + self.at;
        let bad = |detail| Error::MalformedRecord { position, detail };
        let (length, n) = get_varint(&self.body[self.at..]).ok_or(bad("unreadable length"))?;
        let start = self.at + n;
        let end = usize::try_from(length)
            .ok()
            .and_then(|len| start.checked_add(len))
            .filter(|&end| end <= self.body.len())
            .ok_or(bad("length runs past the batch"))?;
        let mut cursor = Cursor { buf: &self.body[start..end], at: 0 };
        let _attributes = cursor.byte().ok_or(bad("missing attributes"))?;
        let timestamp_delta = cursor.varlong().ok_or(bad("bad timestamp delta"))?;
        let offset_delta = cursor.varint().ok_or(bad("bad offset delta"))?;
        let key = cursor.nullable_bytes().ok_or(bad("bad key"))?;
        let value = cursor.nullable_bytes().ok_or(bad("bad value"))?;
        let header_count = cursor.varint().filter(|&c| c >= 0).ok_or(bad("bad header count"))?;
        let mut headers = Vec::new();
        if collect_headers {
            headers.reserve((header_count as usize).min(64));
        }
        for _ in 0..header_count {
            let key = cursor.nullable_bytes().flatten().ok_or(bad("bad header key"))?;
            let value = cursor.nullable_bytes().ok_or(bad("bad header value"))?;
            if collect_headers {
                headers.push(Header { key, value });
            }
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
        let record = self.read_record(true);
        self.failed = record.is_err();
        Some(record)
    }
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
