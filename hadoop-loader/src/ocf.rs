//! Avro Object Container Files, written block by block to a [`FileWriter`].
//!
//! The format (Avro spec, "Object Container Files"): `Obj\x01`, a metadata map
//! (`avro.schema`, `avro.codec`, plus ours), a 16-byte sync marker; then blocks of
//! `count: long, size: long, data (codec-compressed datums), sync marker`. Datums are
//! appended already encoded: a registered-schema record's Avro bytes go in as they came
//! (after validation), so there is no decode/re-encode round trip per record.

use std::hash::{BuildHasher, Hasher};
use std::io::Write;

use bytes::Bytes;

use crate::fs::FileWriter;
use crate::{Error, Result};

/// Uncompressed bytes per block before it is compressed and written.
const BLOCK_BYTES: usize = 256 * 1024;

/// Block compression.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Codec {
    /// No compression.
    Null,
    /// Raw deflate (RFC 1951), the default: every Avro reader has it.
    #[default]
    Deflate,
    /// Snappy, each block followed by the CRC-32 of its uncompressed bytes.
    Snappy,
}

impl Codec {
    /// The `avro.codec` name.
    pub fn name(self) -> &'static str {
        match self {
            Codec::Null => "null",
            Codec::Deflate => "deflate",
            Codec::Snappy => "snappy",
        }
    }

    /// Parses an `avro.codec` name.
    pub fn parse(s: &str) -> Option<Self> {
        [Codec::Null, Codec::Deflate, Codec::Snappy].into_iter().find(|c| c.name() == s)
    }

    fn compress(self, data: &[u8]) -> std::io::Result<Vec<u8>> {
        match self {
            Codec::Null => Ok(data.to_vec()),
            Codec::Deflate => {
                let mut e = flate2::write::DeflateEncoder::new(Vec::with_capacity(data.len() / 2), flate2::Compression::fast());
                e.write_all(data)?;
                e.finish()
            }
            Codec::Snappy => {
                let mut out = snap::raw::Encoder::new().compress_vec(data).map_err(std::io::Error::other)?;
                out.extend_from_slice(&crc32fast::hash(data).to_be_bytes());
                Ok(out)
            }
        }
    }
}

/// Appends an Avro `long` (zig-zag varint).
pub fn put_long(out: &mut Vec<u8>, v: i64) {
    let mut n = ((v << 1) ^ (v >> 63)) as u64;
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// Appends Avro `bytes` / `string`: length, then the bytes.
pub fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_long(out, b.len() as i64);
    out.extend_from_slice(b);
}

/// Appends a `["null", "bytes"]` union value.
fn put_optional_bytes(out: &mut Vec<u8>, b: Option<&[u8]>) {
    match b {
        None => put_long(out, 0),
        Some(b) => {
            put_long(out, 1);
            put_bytes(out, b);
        }
    }
}

/// The schema of records that carry no registered schema: the Kafka record as it is.
pub const ENVELOPE_SCHEMA: &str = r#"{"type":"record","name":"FjordRecord","namespace":"io.fjord.loader","doc":"A record as stored in the log, for topics without a registered Avro schema.","fields":[{"name":"partition","type":"int"},{"name":"offset","type":"long"},{"name":"timestamp","type":"long","doc":"ms since the epoch"},{"name":"key","type":["null","bytes"]},{"name":"value","type":["null","bytes"]},{"name":"headers","type":{"type":"array","items":{"type":"record","name":"Header","fields":[{"name":"key","type":"string"},{"name":"value","type":["null","bytes"]}]}}}]}"#;

/// Encodes one record as an [`ENVELOPE_SCHEMA`] datum.
pub fn encode_envelope(
    out: &mut Vec<u8>,
    partition: i32,
    offset: i64,
    timestamp: i64,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    headers: &[(String, Option<Bytes>)],
) {
    put_long(out, i64::from(partition));
    put_long(out, offset);
    put_long(out, timestamp);
    put_optional_bytes(out, key);
    put_optional_bytes(out, value);
    if !headers.is_empty() {
        put_long(out, headers.len() as i64);
        for (k, v) in headers {
            put_bytes(out, k.as_bytes());
            put_optional_bytes(out, v.as_deref());
        }
    }
    put_long(out, 0);
}

/// An open container file.
pub struct OcfWriter {
    out: Box<dyn FileWriter>,
    path: String,
    codec: Codec,
    sync: [u8; 16],
    block: Vec<u8>,
    block_count: i64,
    /// Bytes handed to the file so far.
    pub written: u64,
    /// Datums appended so far.
    pub records: u64,
}

impl OcfWriter {
    /// Writes the header of a file with `schema_json` and extra `metadata` to `out`.
    pub async fn start(
        mut out: Box<dyn FileWriter>,
        path: &str,
        schema_json: &str,
        codec: Codec,
        metadata: &[(&str, String)],
    ) -> Result<Self> {
        // A random sync marker per file: RandomState is seeded from the OS.
        let seed = std::collections::hash_map::RandomState::new();
        let mut sync = [0u8; 16];
        for (i, half) in sync.chunks_mut(8).enumerate() {
            let mut h = seed.build_hasher();
            h.write_usize(i);
            half.copy_from_slice(&h.finish().to_le_bytes());
        }
        let mut header = b"Obj\x01".to_vec();
        put_long(&mut header, 2 + metadata.len() as i64);
        put_bytes(&mut header, b"avro.schema");
        put_bytes(&mut header, schema_json.as_bytes());
        put_bytes(&mut header, b"avro.codec");
        put_bytes(&mut header, codec.name().as_bytes());
        for (k, v) in metadata {
            put_bytes(&mut header, k.as_bytes());
            put_bytes(&mut header, v.as_bytes());
        }
        put_long(&mut header, 0);
        header.extend_from_slice(&sync);
        let written = header.len() as u64;
        out.write(Bytes::from(header)).await?;
        Ok(Self {
            out,
            path: path.to_string(),
            codec,
            sync,
            block: Vec::with_capacity(BLOCK_BYTES + 4096),
            block_count: 0,
            written,
            records: 0,
        })
    }

    /// Appends one encoded datum.
    pub async fn append(&mut self, datum: &[u8]) -> Result<()> {
        self.block.extend_from_slice(datum);
        self.block_count += 1;
        self.records += 1;
        if self.block.len() >= BLOCK_BYTES {
            self.flush_block().await?;
        }
        Ok(())
    }

    /// Uncompressed bytes appended but not yet written.
    pub fn pending(&self) -> u64 {
        self.block.len() as u64
    }

    async fn flush_block(&mut self) -> Result<()> {
        if self.block_count == 0 {
            return Ok(());
        }
        let data =
            self.codec.compress(&self.block).map_err(|source| Error::Io { op: "compress", path: self.path.clone(), source })?;
        let mut out = Vec::with_capacity(data.len() + 36);
        put_long(&mut out, self.block_count);
        put_long(&mut out, data.len() as i64);
        out.extend_from_slice(&data);
        out.extend_from_slice(&self.sync);
        self.written += out.len() as u64;
        self.out.write(Bytes::from(out)).await?;
        self.block.clear();
        self.block_count = 0;
        Ok(())
    }

    /// Writes the last block and closes the file; returns the bytes written.
    pub async fn finish(mut self) -> Result<u64> {
        self.flush_block().await?;
        self.out.close().await?;
        Ok(self.written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use apache_avro::types::Value;

    #[test]
    fn longs_match_the_spec_examples() {
        for (v, enc) in [
            (0i64, vec![0u8]),
            (-1, vec![1]),
            (1, vec![2]),
            (-64, vec![0x7f]),
            (64, vec![0x80, 0x01]),
            (i64::MIN, vec![0xff; 9].into_iter().chain([1]).collect()),
        ] {
            let mut out = Vec::new();
            put_long(&mut out, v);
            assert_eq!(out, enc, "{v}");
        }
    }

    #[test]
    fn envelope_encoding_decodes_with_apache_avro() {
        let schema = apache_avro::Schema::parse_str(ENVELOPE_SCHEMA).unwrap();
        let headers = vec![("h1".to_string(), Some(Bytes::from_static(b"v"))), ("h2".to_string(), None)];
        for (key, value, headers) in [(None, None, vec![]), (Some(&b"k"[..]), Some(&b"value"[..]), headers)] {
            let mut datum = Vec::new();
            encode_envelope(&mut datum, 2, 1_000_000_000_000, -5, key, value, &headers);
            let mut r = &datum[..];
            let v = apache_avro::reader::datum::GenericDatumReader::builder(&schema).build().unwrap().read_value(&mut r).unwrap();
            assert!(r.is_empty());
            let Value::Record(fields) = v else { panic!("not a record") };
            assert_eq!(fields[0].1, Value::Int(2));
            assert_eq!(fields[1].1, Value::Long(1_000_000_000_000));
            assert_eq!(fields[2].1, Value::Long(-5));
            let opt = |b: Option<&[u8]>| match b {
                None => Value::Union(0, Box::new(Value::Null)),
                Some(b) => Value::Union(1, Box::new(Value::Bytes(b.to_vec()))),
            };
            assert_eq!(fields[3].1, opt(key));
            assert_eq!(fields[4].1, opt(value));
            let Value::Array(items) = &fields[5].1 else { panic!("headers not an array") };
            assert_eq!(items.len(), headers.len());
        }
    }

    struct Memory(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    #[async_trait::async_trait]
    impl FileWriter for Memory {
        async fn write(&mut self, data: Bytes) -> Result<()> {
            self.0.lock().unwrap().extend_from_slice(&data);
            Ok(())
        }
        async fn close(self: Box<Self>) -> Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn container_files_read_back_with_apache_avro_for_every_codec() {
        let schema = apache_avro::Schema::parse_str(ENVELOPE_SCHEMA).unwrap();
        for codec in [Codec::Null, Codec::Deflate, Codec::Snappy] {
            let buf = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
            let mut w =
                OcfWriter::start(Box::new(Memory(buf.clone())), "mem", ENVELOPE_SCHEMA, codec, &[("fjord.topic", "t".into())])
                    .await
                    .unwrap();
            // Enough records for several blocks.
            for i in 0..20_000i64 {
                let mut d = Vec::new();
                encode_envelope(&mut d, 0, i, i * 10, None, Some(format!("value-{i}").as_bytes()), &[]);
                w.append(&d).await.unwrap();
            }
            w.finish().await.unwrap();
            let bytes = buf.lock().unwrap().clone();
            let reader = apache_avro::Reader::new(&bytes[..]).unwrap();
            assert_eq!(reader.writer_schema(), &schema);
            assert_eq!(reader.user_metadata().get("fjord.topic").map(Vec::as_slice), Some(&b"t"[..]));
            let mut n = 0i64;
            for v in reader {
                let Value::Record(fields) = v.unwrap() else { panic!() };
                assert_eq!(fields[1].1, Value::Long(n), "{codec:?}");
                n += 1;
            }
            assert_eq!(n, 20_000, "{codec:?}");
        }
    }
}
