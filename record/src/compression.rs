//! The four batch codecs Kafka defines, byte-compatible with the Java client and librdkafka.
//!
//! Only the records section of a batch (the bytes after the 61-byte header) is compressed;
//! the header stays readable, so the broker can validate and store a compressed batch
//! without ever decompressing it.
//!
//! - gzip: a plain gzip member (flate2).
//! - snappy: written in the xerial framing the Java client uses (an 8-byte magic, two
//!   version ints, then length-prefixed raw snappy blocks). On read both the xerial framing
//!   and a single raw snappy block are accepted, because librdkafka may send either.
//! - lz4: the LZ4 frame format (lz4_flex), independent blocks, as `KafkaLZ4BlockOutputStream`.
//! - zstd: one zstd frame.
//!
//! Decompression is bounded by a caller-given limit so that a small hostile batch cannot
//! expand into gigabytes (a "decompression bomb").

use std::borrow::Cow;
use std::io::{Read, Write};

use crate::batch::{BatchHeader, Compression, BATCH_OVERHEAD};
use crate::{Error, Result};

/// The xerial snappy stream header: magic, then version 1 and compatible version 1.
const XERIAL_MAGIC: [u8; 8] = [0x82, b'S', b'N', b'A', b'P', b'P', b'Y', 0];
const XERIAL_HEADER_LEN: usize = 16;
/// Uncompressed block size of the Java client's `SnappyOutputStream` (32 KiB).
const XERIAL_BLOCK: usize = 32 * 1024;

/// Compresses `input` with `codec`, appending to `out`. [`Compression::None`] copies.
pub fn compress(codec: Compression, input: &[u8], out: &mut Vec<u8>) -> Result<()> {
    let fail = |e: std::io::Error| Error::Compression { codec, detail: e.to_string() };
    match codec {
        Compression::None => out.extend_from_slice(input),
        Compression::Gzip => {
            let mut encoder = flate2::write::GzEncoder::new(out, flate2::Compression::default());
            encoder.write_all(input).map_err(fail)?;
            encoder.finish().map_err(fail)?;
        }
        Compression::Snappy => {
            out.extend_from_slice(&XERIAL_MAGIC);
            out.extend_from_slice(&1i32.to_be_bytes());
            out.extend_from_slice(&1i32.to_be_bytes());
            let mut encoder = snap::raw::Encoder::new();
            for chunk in input.chunks(XERIAL_BLOCK) {
                let block = encoder.compress_vec(chunk).map_err(|e| Error::Compression { codec, detail: e.to_string() })?;
                out.extend_from_slice(&(block.len() as i32).to_be_bytes());
                out.extend_from_slice(&block);
            }
        }
        Compression::Lz4 => {
            let mut encoder = lz4_flex::frame::FrameEncoder::new(out);
            encoder.write_all(input).map_err(fail)?;
            encoder.finish().map_err(|e| Error::Compression { codec, detail: e.to_string() })?;
        }
        Compression::Zstd => {
            // Level 3 is zstd's and Kafka's default.
            let compressed = zstd::bulk::compress(input, 3).map_err(fail)?;
            out.extend_from_slice(&compressed);
        }
    }
    Ok(())
}

/// Decompresses `input` written with `codec`. Fails with [`Error::Decompression`] on
/// corrupt input and with [`Error::DecompressedTooLarge`] as soon as the output would
/// exceed `max_size` bytes: the codecs stream into a buffer that never grows past
/// `max_size` (plus one byte to tell "exactly at the limit" from "beyond").
pub fn decompress(codec: Compression, input: &[u8], max_size: usize) -> Result<Vec<u8>> {
    let fail = |detail: String| Error::Decompression { codec, detail };
    let too_large = || Error::DecompressedTooLarge { codec, limit: max_size };
    let bounded = |read: std::io::Result<bool>| match read {
        Ok(true) => Ok(()),
        Ok(false) => Err(too_large()),
        Err(e) => Err(fail(e.to_string())),
    };
    let mut out = Vec::new();
    match codec {
        Compression::None => {
            if input.len() > max_size {
                return Err(too_large());
            }
            out.extend_from_slice(input);
        }
        Compression::Gzip => bounded(read_bounded(flate2::read::GzDecoder::new(input), max_size, &mut out))?,
        Compression::Lz4 => bounded(read_bounded(lz4_flex::frame::FrameDecoder::new(input), max_size, &mut out))?,
        Compression::Zstd => {
            let decoder = zstd::stream::read::Decoder::new(input).map_err(|e| fail(e.to_string()))?;
            bounded(read_bounded(decoder, max_size, &mut out))?
        }
        Compression::Snappy => {
            if input.len() >= XERIAL_HEADER_LEN && input[..8] == XERIAL_MAGIC {
                let mut rest = &input[XERIAL_HEADER_LEN..];
                while !rest.is_empty() {
                    let Some((len, tail)) = rest.split_first_chunk::<4>() else {
                        return Err(fail("truncated xerial block length".into()));
                    };
                    let len =
                        usize::try_from(i32::from_be_bytes(*len)).map_err(|_| fail("negative xerial block length".into()))?;
                    let block = tail.get(..len).ok_or_else(|| fail("xerial block runs past the input".into()))?;
                    if !snappy_raw(block, max_size, &mut out).map_err(fail)? {
                        return Err(too_large());
                    }
                    rest = &tail[len..];
                }
            } else if !snappy_raw(input, max_size, &mut out).map_err(fail)? {
                return Err(too_large());
            }
        }
    }
    Ok(out)
}

/// The records section of a validated batch, decompressed if the batch is compressed.
/// Feed the result to [`crate::Records::new`]. Uncompressed batches are borrowed, not copied.
pub fn records_body<'a>(header: &BatchHeader, batch: &'a [u8], max_size: usize) -> Result<Cow<'a, [u8]>> {
    let body = &batch[BATCH_OVERHEAD..header.size()];
    match header.compression() {
        Compression::None => Ok(Cow::Borrowed(body)),
        codec => Ok(Cow::Owned(decompress(codec, body, max_size)?)),
    }
}

/// Reads `reader` to its end into `out`; `Ok(false)` when it holds more than `max_size`
/// bytes (reading stops one byte past the limit). The buffer grows by doubling but never
/// past the limit, so a bomb costs at most `max_size + 1` bytes of memory, where
/// `read_to_end`'s doubling could reach twice that.
fn read_bounded(mut reader: impl Read, max_size: usize, out: &mut Vec<u8>) -> std::io::Result<bool> {
    const FIRST: usize = 16 << 10;
    let limit = max_size.saturating_add(1);
    let mut filled = out.len();
    loop {
        if filled == out.len() {
            if out.len() >= limit {
                break;
            }
            let grown = out.len().saturating_mul(2).max(FIRST).min(limit);
            out.resize(grown, 0);
        }
        match reader.read(&mut out[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                out.truncate(filled);
                return Err(e);
            }
        }
    }
    out.truncate(filled);
    Ok(filled <= max_size)
}

/// Appends one raw snappy block; `Ok(false)` when `out` would pass `max_size` (the block
/// announces its decompressed length first, so nothing is decompressed then).
fn snappy_raw(block: &[u8], max_size: usize, out: &mut Vec<u8>) -> std::result::Result<bool, String> {
    let len = snap::raw::decompress_len(block).map_err(|e| e.to_string())?;
    if out.len().saturating_add(len) > max_size {
        return Ok(false);
    }
    let start = out.len();
    out.resize(start + len, 0);
    snap::raw::Decoder::new().decompress(block, &mut out[start..]).map_err(|e| e.to_string())?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BatchBuilder, Records};
    use proptest::prelude::*;

    const CODECS: [Compression; 5] =
        [Compression::None, Compression::Gzip, Compression::Snappy, Compression::Lz4, Compression::Zstd];

    #[test]
    fn every_codec_round_trips_empty_small_and_multi_block_inputs() {
        let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8 ^ (i / 1000) as u8).collect();
        for codec in CODECS {
            for input in [&b""[..], b"hello hello hello", &big] {
                let mut out = Vec::new();
                compress(codec, input, &mut out).unwrap();
                assert_eq!(decompress(codec, &out, input.len()).unwrap(), input, "{codec:?}");
            }
        }
    }

    #[test]
    fn snappy_is_written_with_xerial_framing_in_32k_blocks() {
        let input = vec![7u8; 70_000];
        let mut out = Vec::new();
        compress(Compression::Snappy, &input, &mut out).unwrap();
        assert_eq!(out[..8], XERIAL_MAGIC);
        assert_eq!(out[8..16], [0, 0, 0, 1, 0, 0, 0, 1]);
        // 70,000 bytes = three blocks of at most 32 KiB.
        let mut rest = &out[16..];
        let mut blocks = 0;
        while !rest.is_empty() {
            let len = i32::from_be_bytes(rest[..4].try_into().unwrap()) as usize;
            rest = &rest[4 + len..];
            blocks += 1;
        }
        assert_eq!(blocks, 3);
    }

    #[test]
    fn raw_snappy_without_framing_is_accepted() {
        let input = b"librdkafka may send a bare snappy block".repeat(10);
        let raw = snap::raw::Encoder::new().compress_vec(&input).unwrap();
        assert_eq!(decompress(Compression::Snappy, &raw, 1 << 20).unwrap(), input);
    }

    #[test]
    fn decompression_is_bounded() {
        let input = vec![0u8; 100_000];
        for codec in CODECS {
            let mut out = Vec::new();
            compress(codec, &input, &mut out).unwrap();
            let err = decompress(codec, &out, 99_999).unwrap_err();
            assert_eq!(err, Error::DecompressedTooLarge { codec, limit: 99_999 }, "{codec:?}");
            assert_eq!(decompress(codec, &out, 100_000).unwrap().len(), 100_000);
            assert_eq!(decompress(codec, &out, usize::MAX).unwrap().len(), 100_000);
        }
    }

    #[test]
    fn corrupt_input_is_an_error_not_a_panic() {
        for codec in [Compression::Gzip, Compression::Snappy, Compression::Lz4, Compression::Zstd] {
            let mut out = Vec::new();
            compress(codec, &b"some records some records some records".repeat(20), &mut out).unwrap();
            let mid = out.len() / 2;
            out.truncate(mid);
            assert!(decompress(codec, &out, 1 << 20).is_err(), "{codec:?}");
        }
        let mut xerial = XERIAL_MAGIC.to_vec();
        xerial.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 1, 0x7f, 0xff, 0xff, 0xff, 1]);
        assert!(decompress(Compression::Snappy, &xerial, 1 << 20).is_err());
    }

    #[test]
    fn compressed_batches_decode_with_keys_headers_nulls_and_timestamps() {
        for codec in CODECS {
            let mut b = BatchBuilder::new(1_000);
            for i in 0..100u32 {
                let key = (i % 3 != 0).then(|| i.to_be_bytes());
                let value = (i % 7 != 0).then(|| format!("value-{i}").repeat(5));
                b.append(
                    1_000 + i as i64,
                    key.as_ref().map(|k| &k[..]),
                    value.as_deref().map(str::as_bytes),
                    &[("h", Some(b"v")), ("n", None)],
                );
            }
            let bytes = b.build_compressed(codec).unwrap();
            let header = BatchHeader::parse(&bytes).unwrap();
            assert_eq!(header.compression(), codec);
            assert_eq!(header.record_count, 100);
            assert_eq!(header.last_offset_delta, 99);
            assert_eq!(header.max_timestamp, 1_099);
            let body = records_body(&header, &bytes, 1 << 20).unwrap();
            let records: Vec<_> = Records::new(&body, BATCH_OVERHEAD).map(|r| r.unwrap()).collect();
            assert_eq!(records.len(), 100);
            for (i, r) in records.iter().enumerate() {
                assert_eq!(r.offset_delta as usize, i);
                assert_eq!(r.timestamp_delta, i as i64);
                assert_eq!(r.key.is_some(), i % 3 != 0);
                assert_eq!(r.value.map(|v| v.to_vec()), (i % 7 != 0).then(|| format!("value-{i}").repeat(5).into_bytes()));
                assert_eq!(r.headers.len(), 2);
                assert_eq!(r.headers[1].value, None);
            }
        }
    }

    proptest! {
        #[test]
        fn decompressing_random_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..300), codec in 1usize..5) {
            let _ = decompress(CODECS[codec], &bytes, 1 << 16);
        }
    }
}
