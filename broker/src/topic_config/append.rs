//! What a topic's `compression.type` and `message.timestamp.type` make of a producer's
//! batches on the leader, before the log validates and appends them (Kafka's leader
//! does the same in its log validator):
//!
//! - `compression.type=producer` (the default) keeps every batch as the producer
//!   compressed it; a codec (`uncompressed`, `gzip`, `snappy`, `lz4`, `zstd`) rewrites
//!   each batch written with another codec: its records section is decompressed
//!   (bounded by [`LogConfig::max_decompressed_bytes`]) and compressed with the
//!   topic's codec, the header kept (offsets, producer id, epoch and sequence, record
//!   count and timestamps) with the new length, codec bits and CRC;
//! - `message.timestamp.type=LogAppendTime` sets each batch's max timestamp to the
//!   append time and the timestamp-type attribute, and recomputes the CRC; consumers
//!   then read that time as every record's timestamp. The records are not touched, so
//!   a compressed batch is not decompressed for it.
//!
//! Only a batch whose framing and CRC check out, and whose records decompress within the
//! bound, is rewritten: anything else is left as it came, with the batches after it, for
//! the log's validation to refuse with its own error and message (rewriting it would
//! give a corrupt batch a valid CRC). Control batches are the broker's and are left
//! alone too (the produce path refuses them from clients).

use std::borrow::Cow;

use fjord_log::{CompressionType, LogConfig, MessageTimestampType};
use fjord_record::batch::{crc32c, set_log_append_time};
use fjord_record::compression::{compress, records_body};
use fjord_record::BatchHeader;

/// Record batch v2 fields this rewrites (Kafka's layout): the length after the first
/// 12 bytes, the CRC over everything from the attributes on, and the attributes,
/// whose low three bits are the codec.
const LENGTH: usize = 8;
const CRC: usize = 17;
const ATTRIBUTES: usize = 21;
const CODEC_BITS: i16 = 0x07;

/// Whether appends to a log with this config rewrite batches at all (the produce path
/// moves such appends off the async workers, as it does decompression).
pub(crate) fn rewrites(config: &LogConfig) -> bool {
    config.compression_type != CompressionType::Producer || config.message_timestamp_type == MessageTimestampType::LogAppendTime
}

/// `records` as the topic's config has them appended; borrowed when nothing changes.
pub(crate) fn apply<'a>(records: &'a [u8], config: &LogConfig, now_ms: i64) -> Cow<'a, [u8]> {
    if !rewrites(config) {
        return Cow::Borrowed(records);
    }
    let target = config.compression_type.codec();
    let append_time = config.message_timestamp_type == MessageTimestampType::LogAppendTime;
    let mut out: Vec<u8> = Vec::with_capacity(records.len());
    let mut position = 0;
    while position < records.len() {
        let rest = &records[position..];
        let Ok(header) = BatchHeader::parse(rest) else {
            // Not a valid batch: the rest goes to the log's validation as it came.
            out.extend_from_slice(rest);
            break;
        };
        let batch = &rest[..header.size()];
        let start = out.len();
        match target {
            Some(codec) if codec != header.compression() && !header.is_control() => {
                let Ok(body) = records_body(&header, batch, config.max_decompressed_bytes()) else {
                    out.extend_from_slice(rest);
                    break;
                };
                out.extend_from_slice(&batch[..fjord_record::BATCH_OVERHEAD]);
                if compress(codec, &body, &mut out).is_err() {
                    out.truncate(start);
                    out.extend_from_slice(rest);
                    break;
                }
                let length = i32::try_from(out.len() - start - 12).unwrap_or(i32::MAX);
                out[start + LENGTH..start + LENGTH + 4].copy_from_slice(&length.to_be_bytes());
                let attributes = (header.attributes & !CODEC_BITS) | codec as i16;
                out[start + ATTRIBUTES..start + ATTRIBUTES + 2].copy_from_slice(&attributes.to_be_bytes());
                let crc = crc32c(&out[start + ATTRIBUTES..]);
                out[start + CRC..start + CRC + 4].copy_from_slice(&crc.to_be_bytes());
            }
            _ => out.extend_from_slice(batch),
        }
        if append_time && !header.is_control() {
            set_log_append_time(&mut out[start..], now_ms);
        }
        position += header.size();
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fjord_record::{BatchBuilder, Compression, Records, TimestampType};

    fn batch(codec: Compression) -> Vec<u8> {
        let mut builder = BatchBuilder::new(1_000).producer(7, 1, 5);
        for i in 0..20 {
            builder.append(1_000 + i, Some(format!("k{i}").as_bytes()), Some(b"value value value"), &[]);
        }
        builder.build_compressed(codec).unwrap().to_vec()
    }

    fn config(compression: &str, timestamps: &str) -> LogConfig {
        let mut c = LogConfig::default();
        c.set("compression.type", compression).unwrap();
        c.set("message.timestamp.type", timestamps).unwrap();
        c
    }

    fn values(batch: &[u8]) -> Vec<(i64, Vec<u8>)> {
        let header = BatchHeader::parse_validated(batch).unwrap();
        let body = records_body(&header, batch, 1 << 20).unwrap();
        Records::new(&body, 0).map(|r| r.unwrap()).map(|r| (r.offset_delta as i64, r.key.unwrap().to_vec())).collect()
    }

    #[test]
    fn producer_and_create_time_change_nothing() {
        let input = batch(Compression::Gzip);
        assert!(matches!(apply(&input, &config("producer", "CreateTime"), 5), Cow::Borrowed(_)));
    }

    #[test]
    fn batches_are_recompressed_to_the_topic_codec_keeping_header_and_records() {
        let mut input = batch(Compression::None);
        input.extend_from_slice(&batch(Compression::Snappy));
        for (name, codec) in [("zstd", Compression::Zstd), ("uncompressed", Compression::None), ("lz4", Compression::Lz4)] {
            let out = apply(&input, &config(name, "CreateTime"), 5);
            let first = BatchHeader::parse_validated(&out).unwrap();
            let second = BatchHeader::parse_validated(&out[first.size()..]).unwrap();
            assert_eq!(first.size() + second.size(), out.len());
            for (header, original) in [(first, &input[..]), (second, &input[batch(Compression::None).len()..])] {
                let was = BatchHeader::parse(original).unwrap();
                assert_eq!(header.compression(), codec, "{name}");
                assert_eq!((header.producer_id, header.base_sequence, header.record_count), (7, 5, 20));
                assert_eq!((header.base_timestamp, header.max_timestamp), (was.base_timestamp, was.max_timestamp));
                assert_eq!(header.timestamp_type(), TimestampType::CreateTime);
            }
            let off = first.size();
            assert_eq!(values(&out[..off]), values(&input[..BatchHeader::parse(&input).unwrap().size()]));
            assert_eq!(values(&out[off..]).len(), 20);
        }
    }

    #[test]
    fn log_append_time_sets_the_max_timestamp_and_type_without_decompressing() {
        let input = batch(Compression::Zstd);
        let out = apply(&input, &config("producer", "LogAppendTime"), 123_456);
        let header = BatchHeader::parse_validated(&out).unwrap();
        assert_eq!((header.max_timestamp, header.timestamp_type()), (123_456, TimestampType::LogAppendTime));
        assert_eq!(header.compression(), Compression::Zstd);
        assert_eq!(out.len(), input.len());
    }

    #[test]
    fn a_batch_with_a_bad_crc_is_passed_on_untouched() {
        let mut input = batch(Compression::None);
        let last = input.len() - 1;
        input[last] ^= 0xff;
        let out = apply(&input, &config("gzip", "LogAppendTime"), 9);
        assert_eq!(&out[..], &input[..]);
    }
}
