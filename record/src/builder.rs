//! A builder for RecordBatch v2 batches.
//!
//! Records are encoded straight into one buffer that already has room for the header,
//! so building a batch is one pass over the payload plus one CRC pass. A compressed batch
//! is the same records section run through a codec once, at [`BatchBuilder::build_compressed`].

use bytes::Bytes;

use crate::batch::{Compression, BATCH_OVERHEAD, LOG_OVERHEAD, NO_PRODUCER_ID};
use crate::varint::{put_varint, put_varlong, varlong_len};

/// Builds one batch (uncompressed, or compressed at the end). Offsets start at delta 0; the broker assigns the
/// real base offset on append.
#[derive(Debug, Clone)]
pub struct BatchBuilder {
    buf: Vec<u8>,
    base_timestamp: i64,
    max_timestamp: i64,
    count: i32,
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
    /// Attribute bits besides the codec: transactional (0x10), control (0x20).
    flags: i16,
}

impl BatchBuilder {
    /// Starts a batch whose timestamps are relative to `base_timestamp` (ms since epoch).
    pub fn new(base_timestamp: i64) -> Self {
        Self::with_capacity(base_timestamp, 1024)
    }

    /// Like [`BatchBuilder::new`], reserving `capacity` bytes for records.
    pub fn with_capacity(base_timestamp: i64, capacity: usize) -> Self {
        let mut buf = Vec::with_capacity(BATCH_OVERHEAD + capacity);
        buf.resize(BATCH_OVERHEAD, 0);
        Self {
            buf,
            base_timestamp,
            max_timestamp: base_timestamp,
            count: 0,
            producer_id: NO_PRODUCER_ID,
            producer_epoch: -1,
            base_sequence: -1,
            flags: 0,
        }
    }

    /// Marks the batch as written by an idempotent producer.
    pub fn producer(mut self, producer_id: i64, producer_epoch: i16, base_sequence: i32) -> Self {
        self.producer_id = producer_id;
        self.producer_epoch = producer_epoch;
        self.base_sequence = base_sequence;
        self
    }

    /// Marks the batch as part of a transaction (attributes bit 0x10); it needs a
    /// producer id and epoch ([`BatchBuilder::producer`]) to mean anything.
    pub fn transactional(mut self) -> Self {
        self.flags |= crate::batch::TRANSACTIONAL_FLAG;
        self
    }

    /// Marks the batch as a control batch (attributes bit 0x20): only the broker writes
    /// those (see [`crate::control`]).
    pub(crate) fn control(mut self) -> Self {
        self.flags |= crate::batch::CONTROL_FLAG;
        self
    }

    /// Appends a record; `headers` are `(key, value)` pairs.
    pub fn append(&mut self, timestamp: i64, key: Option<&[u8]>, value: Option<&[u8]>, headers: &[(&str, Option<&[u8]>)]) {
        self.append_with_headers(timestamp, key, value, headers)
    }

    /// [`BatchBuilder::append`] with headers of any string and byte types, such as a
    /// producer record's own `(String, Option<Bytes>)` pairs: no borrowed copy of the
    /// header list is built per record.
    pub fn append_with_headers<K: AsRef<str>, V: AsRef<[u8]>>(
        &mut self,
        timestamp: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[(K, Option<V>)],
    ) {
        let timestamp_delta = timestamp - self.base_timestamp;
        let offset_delta = self.count;
        let nullable_len = |b: Option<&[u8]>| b.map_or(1, |b| varlong_len(b.len() as i64) + b.len());
        let mut body_len = 1
            + varlong_len(timestamp_delta)
            + varlong_len(offset_delta as i64)
            + nullable_len(key)
            + nullable_len(value)
            + varlong_len(headers.len() as i64);
        for (k, v) in headers {
            let k = k.as_ref();
            body_len += varlong_len(k.len() as i64) + k.len() + nullable_len(v.as_ref().map(AsRef::as_ref));
        }
        let buf = &mut self.buf;
        put_varint(buf, body_len as i32);
        buf.push(0); // record attributes: unused in v2
        put_varlong(buf, timestamp_delta);
        put_varint(buf, offset_delta);
        put_nullable(buf, key);
        put_nullable(buf, value);
        put_varint(buf, headers.len() as i32);
        for (k, v) in headers {
            put_nullable(buf, Some(k.as_ref().as_bytes()));
            put_nullable(buf, v.as_ref().map(AsRef::as_ref));
        }
        self.max_timestamp = self.max_timestamp.max(timestamp);
        self.count += 1;
    }

    /// Number of records appended so far.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    /// Whether no record was appended.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Size the finished batch will have.
    pub fn size(&self) -> usize {
        self.buf.len()
    }

    /// Writes the header and CRC and returns the batch bytes.
    pub fn build(self) -> Bytes {
        self.build_vec().into()
    }

    /// Like [`BatchBuilder::build`], as a `Vec`.
    pub fn build_vec(mut self) -> Vec<u8> {
        self.write_header(Compression::None);
        self.buf
    }

    /// Compresses the records section with `codec` and returns the finished batch. The
    /// header (offsets, timestamps, count) describes the records as appended.
    pub fn build_compressed(mut self, codec: Compression) -> crate::Result<Bytes> {
        if codec == Compression::None {
            return Ok(self.build());
        }
        let mut out = Vec::with_capacity(BATCH_OVERHEAD + self.buf.len() / 2);
        out.resize(BATCH_OVERHEAD, 0);
        crate::compression::compress(codec, &self.buf[BATCH_OVERHEAD..], &mut out)?;
        self.buf = out;
        self.write_header(codec);
        Ok(self.buf.into())
    }

    /// Fills in the header of `self.buf`, whose records section is final, and the CRC.
    fn write_header(&mut self, codec: Compression) {
        let batch_length = (self.buf.len() - LOG_OVERHEAD) as i32;
        let last_offset_delta = (self.count - 1).max(0);
        let mut h = Vec::with_capacity(BATCH_OVERHEAD);
        h.extend_from_slice(&0i64.to_be_bytes()); // base offset: assigned by the broker
        h.extend_from_slice(&batch_length.to_be_bytes());
        h.extend_from_slice(&(-1i32).to_be_bytes()); // partition leader epoch
        h.push(2); // magic
        h.extend_from_slice(&[0; 4]); // crc, below
        h.extend_from_slice(&(codec as i16 | self.flags).to_be_bytes()); // attributes: codec, create time, flags
        h.extend_from_slice(&last_offset_delta.to_be_bytes());
        h.extend_from_slice(&self.base_timestamp.to_be_bytes());
        h.extend_from_slice(&self.max_timestamp.to_be_bytes());
        h.extend_from_slice(&self.producer_id.to_be_bytes());
        h.extend_from_slice(&self.producer_epoch.to_be_bytes());
        h.extend_from_slice(&self.base_sequence.to_be_bytes());
        h.extend_from_slice(&self.count.to_be_bytes());
        self.buf[..BATCH_OVERHEAD].copy_from_slice(&h);
        let crc = crate::batch::crc32c(&self.buf[21..]);
        self.buf[17..21].copy_from_slice(&crc.to_be_bytes());
    }
}

fn put_nullable(buf: &mut Vec<u8>, bytes: Option<&[u8]>) {
    match bytes {
        None => put_varint(buf, -1),
        Some(b) => {
            put_varint(buf, b.len() as i32);
            buf.extend_from_slice(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BatchHeader, Records};
    use proptest::prelude::*;

    type TestRecord = (i64, Option<Vec<u8>>, Option<Vec<u8>>, Vec<(String, Option<Vec<u8>>)>);

    proptest! {
        #[test]
        fn built_batches_decode_to_what_was_appended(
            records in prop::collection::vec(
                (0i64..1_000_000,
                 prop::option::of(prop::collection::vec(any::<u8>(), 0..40)),
                 prop::option::of(prop::collection::vec(any::<u8>(), 0..300)),
                 prop::collection::vec(("[a-z]{0,8}", prop::option::of(prop::collection::vec(any::<u8>(), 0..10))), 0..3)),
                0..20)
        ) {
            let records: Vec<TestRecord> = records;
            let mut b = BatchBuilder::new(5_000);
            for (ts, k, v, h) in &records {
                let headers: Vec<(&str, Option<&[u8]>)> = h.iter().map(|(k, v)| (k.as_str(), v.as_deref())).collect();
                b.append(5_000 + ts, k.as_deref(), v.as_deref(), &headers);
            }
            let bytes = b.build();
            let header = BatchHeader::parse(&bytes).unwrap();
            header.validate_records(&bytes).unwrap();
            prop_assert_eq!(header.size(), bytes.len());
            prop_assert_eq!(header.record_count as usize, records.len());
            let decoded: Vec<_> = Records::new(&bytes[BATCH_OVERHEAD..], BATCH_OVERHEAD).map(|r| r.unwrap()).collect();
            for (i, (r, (ts, k, v, h))) in decoded.iter().zip(&records).enumerate() {
                prop_assert_eq!(r.offset_delta as usize, i);
                prop_assert_eq!(r.timestamp_delta, *ts);
                prop_assert_eq!(r.key, k.as_deref());
                prop_assert_eq!(r.value, v.as_deref());
                prop_assert_eq!(r.headers.len(), h.len());
            }
        }

        #[test]
        fn parsing_random_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(h) = BatchHeader::parse_unchecked(&bytes) {
                if bytes.len() >= h.size() {
                    let _ = h.validate_records(&bytes);
                }
            }
            let _ = crate::batch::batches(&bytes).count();
        }
    }
}
