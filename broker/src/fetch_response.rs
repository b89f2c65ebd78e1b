//! A hand-written FetchResponse encoder (v4-v13) that leaves the records as file regions.
//!
//! The codec crate wants the records of a fetch in memory; to send them with sendfile(2)
//! the response is written around them instead: every field up to a partition's records
//! length goes into a buffer, the records become a [`Chunk::File`], and encoding goes on
//! in a fresh buffer. The tests check the result byte for byte against the codec crate's
//! own encoding, for every advertised version.

use std::fs::File;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use uuid::Uuid;

use crate::response::{Chunk, Response};

/// First flexible (compact arrays, tagged fields) Fetch version.
const FIRST_FLEXIBLE: i16 = 12;
/// First Fetch version that names topics by id (KIP-516), and the last one encoded here.
const FIRST_TOPIC_ID: i16 = 13;

/// The records of one partition in a fetch response.
#[derive(Debug, Clone)]
pub(crate) enum FetchedRecords {
    /// No records (an error, or nothing new).
    Empty,
    /// Records copied into memory (the copying path).
    Memory(Bytes),
    /// Whole batches in a segment file, sent with sendfile(2).
    File {
        /// The segment.
        file: Arc<File>,
        /// First byte.
        position: u64,
        /// Byte count.
        len: usize,
    },
}

impl FetchedRecords {
    pub(crate) fn len(&self) -> usize {
        match self {
            FetchedRecords::Empty => 0,
            FetchedRecords::Memory(b) => b.len(),
            FetchedRecords::File { len, .. } => *len,
        }
    }
}

/// One partition of a fetch response.
#[derive(Debug, Clone)]
pub(crate) struct PartitionData {
    pub(crate) partition_index: i32,
    pub(crate) error_code: i16,
    pub(crate) high_watermark: i64,
    pub(crate) last_stable_offset: i64,
    pub(crate) log_start_offset: i64,
    /// read_committed: the aborted transactions in the fetched range, as
    /// `(producer_id, first_offset)`; empty otherwise.
    pub(crate) aborted_transactions: Vec<(i64, i64)>,
    pub(crate) records: FetchedRecords,
}

/// One topic of a fetch response.
#[derive(Debug, Clone)]
pub(crate) struct TopicData {
    pub(crate) topic: String,
    /// The topic's id, which v13+ answers with instead of the name.
    pub(crate) topic_id: Uuid,
    pub(crate) partitions: Vec<PartitionData>,
}

/// A whole fetch response.
#[derive(Debug, Clone, Default)]
pub(crate) struct FetchResponseData {
    pub(crate) throttle_time_ms: i32,
    pub(crate) error_code: i16,
    pub(crate) session_id: i32,
    pub(crate) topics: Vec<TopicData>,
}

impl FetchResponseData {
    /// Bytes of records in the response.
    pub(crate) fn records_bytes(&self) -> usize {
        self.topics.iter().flat_map(|t| &t.partitions).map(|p| p.records.len()).sum()
    }
}

/// Encodes `response` as a framed Fetch response of `version` (4..=13).
pub(crate) fn encode(correlation_id: i32, version: i16, response: &FetchResponseData) -> Response {
    debug_assert!((4..=FIRST_TOPIC_ID).contains(&version));
    let flexible = version >= FIRST_FLEXIBLE;
    let mut writer = Writer { chunks: Vec::new(), buf: BytesMut::with_capacity(256), flexible };
    writer.buf.put_i32(0); // frame length, patched at the end
    writer.buf.put_i32(correlation_id);
    writer.tagged_fields(); // response header v1 on flexible versions
    writer.buf.put_i32(response.throttle_time_ms);
    if version >= 7 {
        writer.buf.put_i16(response.error_code);
        writer.buf.put_i32(response.session_id);
    }
    writer.array_len(response.topics.len());
    for topic in &response.topics {
        if version >= FIRST_TOPIC_ID {
            writer.buf.put_slice(topic.topic_id.as_bytes());
        } else {
            writer.string(&topic.topic);
        }
        writer.array_len(topic.partitions.len());
        for p in &topic.partitions {
            writer.buf.put_i32(p.partition_index);
            writer.buf.put_i16(p.error_code);
            writer.buf.put_i64(p.high_watermark);
            writer.buf.put_i64(p.last_stable_offset);
            if version >= 5 {
                writer.buf.put_i64(p.log_start_offset);
            }
            writer.array_len(p.aborted_transactions.len());
            for &(producer_id, first_offset) in &p.aborted_transactions {
                writer.buf.put_i64(producer_id);
                writer.buf.put_i64(first_offset);
                writer.tagged_fields();
            }
            if version >= 11 {
                writer.buf.put_i32(-1); // preferred read replica: none
            }
            writer.records(&p.records);
            writer.tagged_fields();
        }
        writer.tagged_fields();
    }
    writer.tagged_fields();
    writer.finish()
}

struct Writer {
    chunks: Vec<Chunk>,
    buf: BytesMut,
    flexible: bool,
}

impl Writer {
    fn unsigned_varint(&mut self, mut value: u32) {
        while value >= 0x80 {
            self.buf.put_u8((value as u8 & 0x7f) | 0x80);
            value >>= 7;
        }
        self.buf.put_u8(value as u8);
    }

    fn length(&mut self, len: usize) {
        let len = u32::try_from(len).expect("invariant: fetch responses are bounded by max_bytes < 2 GiB");
        if self.flexible {
            self.unsigned_varint(len + 1);
        } else {
            self.buf.put_i32(len as i32);
        }
    }

    fn array_len(&mut self, len: usize) {
        self.length(len);
    }

    fn string(&mut self, s: &str) {
        if self.flexible {
            self.length(s.len());
        } else {
            self.buf.put_i16(i16::try_from(s.len()).expect("invariant: topic names are at most 249 bytes"));
        }
        self.buf.put_slice(s.as_bytes());
    }

    fn tagged_fields(&mut self) {
        if self.flexible {
            self.buf.put_u8(0);
        }
    }

    fn records(&mut self, records: &FetchedRecords) {
        self.length(records.len());
        match records {
            FetchedRecords::Empty => {}
            FetchedRecords::Memory(bytes) => self.buf.put_slice(bytes),
            FetchedRecords::File { file, position, len } => {
                if *len > 0 {
                    let head = self.buf.split().freeze();
                    self.chunks.push(Chunk::Bytes(head));
                    self.chunks.push(Chunk::File { file: file.clone(), position: *position, len: *len });
                }
            }
        }
    }

    fn finish(mut self) -> Response {
        self.chunks.push(Chunk::Bytes(self.buf.split().freeze()));
        // Patch the frame length into the first chunk, which holds the prefix.
        let total: usize = self.chunks.iter().map(Chunk::len).sum();
        if let Some(Chunk::Bytes(first)) = self.chunks.first_mut() {
            let mut head = BytesMut::from(&first[..]);
            let len = i32::try_from(total - 4).expect("invariant: responses are smaller than 2 GiB");
            head[..4].copy_from_slice(&len.to_be_bytes());
            *first = head.freeze();
        }
        Response { chunks: self.chunks }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use kafka_protocol::messages::fetch_response::{AbortedTransaction, FetchableTopicResponse, PartitionData as KPartitionData};
    use kafka_protocol::messages::{ApiKey, FetchResponse, ProducerId, ResponseKind, TopicName};
    use kafka_protocol::protocol::StrBytes;

    use super::*;
    use crate::codec::{encode_response, response_bytes};

    fn sample(records: Vec<FetchedRecords>) -> FetchResponseData {
        let partitions = records
            .into_iter()
            .enumerate()
            .map(|(i, records)| PartitionData {
                partition_index: i as i32,
                error_code: if i == 1 { 1 } else { 0 },
                high_watermark: 1000 + i as i64,
                last_stable_offset: 1000 + i as i64,
                log_start_offset: 3,
                aborted_transactions: if i == 0 { vec![(7, 100), (9, 250)] } else { Vec::new() },
                records,
            })
            .collect();
        FetchResponseData {
            throttle_time_ms: 0,
            error_code: 0,
            session_id: 0,
            topics: vec![
                TopicData { topic: "events".into(), topic_id: Uuid::from_u128(0x0102_0304), partitions },
                TopicData { topic: "other".into(), topic_id: Uuid::from_u128(u128::MAX - 5), partitions: vec![] },
            ],
        }
    }

    fn reference(correlation_id: i32, version: i16, data: &FetchResponseData, records: &[Bytes]) -> Vec<u8> {
        let mut records = records.iter();
        let responses = data
            .topics
            .iter()
            .map(|t| {
                let named = if version >= FIRST_TOPIC_ID {
                    FetchableTopicResponse::default().with_topic_id(t.topic_id)
                } else {
                    FetchableTopicResponse::default().with_topic(TopicName(StrBytes::from_string(t.topic.clone())))
                };
                named.with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            KPartitionData::default()
                                .with_partition_index(p.partition_index)
                                .with_error_code(p.error_code)
                                .with_high_watermark(p.high_watermark)
                                .with_last_stable_offset(p.last_stable_offset)
                                .with_log_start_offset(if version >= 5 { p.log_start_offset } else { -1 })
                                .with_aborted_transactions(Some(
                                    p.aborted_transactions
                                        .iter()
                                        .map(|&(pid, first)| {
                                            AbortedTransaction::default()
                                                .with_producer_id(ProducerId(pid))
                                                .with_first_offset(first)
                                        })
                                        .collect(),
                                ))
                                .with_records(Some(records.next().unwrap().clone()))
                        })
                        .collect(),
                )
            })
            .collect();
        let body = FetchResponse::default().with_responses(responses);
        response_bytes(&encode_response(correlation_id, ApiKey::Fetch, version, &ResponseKind::Fetch(body)))
    }

    #[test]
    fn matches_the_codec_crate_for_every_version() {
        let payload: Vec<u8> = (0..300u32).map(|i| i as u8).collect();
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&[0xaa; 17]).unwrap();
        file.write_all(&payload).unwrap();
        let file = Arc::new(file);
        for version in 4..=FIRST_TOPIC_ID {
            for zero_copy in [true, false] {
                let in_file = if zero_copy {
                    FetchedRecords::File { file: file.clone(), position: 17, len: payload.len() }
                } else {
                    FetchedRecords::Memory(Bytes::from(payload.clone()))
                };
                let data = sample(vec![in_file, FetchedRecords::Empty, FetchedRecords::Memory(Bytes::from_static(b"xyz"))]);
                let ours = response_bytes(&encode(42, version, &data));
                let expected =
                    reference(42, version, &data, &[Bytes::from(payload.clone()), Bytes::new(), Bytes::from_static(b"xyz")]);
                assert_eq!(ours, expected, "fetch v{version}, zero copy {zero_copy}");
            }
        }
    }

    #[test]
    fn file_records_become_a_file_chunk() {
        let file = Arc::new(tempfile::tempfile().unwrap());
        let data = sample(vec![FetchedRecords::File { file, position: 0, len: 10 }]);
        let response = encode(1, 11, &data);
        assert_eq!(response.chunks.len(), 3);
        assert!(matches!(response.chunks[1], Chunk::File { len: 10, .. }));
        assert_eq!(data.records_bytes(), 10);
    }
}
