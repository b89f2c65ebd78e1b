//! Produce: validate and append record batches as the partition's leader, answer with
//! the base offsets; acks=all answers once the ISR has the batches.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use fjord_log::AppendInfo;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse, RequestHeader, ResponseKind};

use crate::codec::{self, error_code, patch_length};
use crate::handler::{log_error_code, Broker};
use crate::partition::Partition;
use crate::response::Response;

/// An appended acks=all batch waiting for the ISR: where its answer goes, and what it waits for.
struct AwaitingReplication {
    topic: usize,
    partition: usize,
    replica: Arc<Partition>,
    leader_epoch: i32,
    last_offset: i64,
    min_isr: usize,
}

impl Broker {
    /// Appends every partition's batches; `None` for acks=0, which has no response.
    /// With acks=all, answers once the ISR has every batch (or the request timed out).
    pub(crate) async fn produce(&self, request: ProduceRequest, version: i16) -> Option<ResponseKind> {
        let acks = request.acks;
        let valid_acks = matches!(acks, -1..=1);
        let acks_all = acks == -1;
        let mut responses = Vec::with_capacity(request.topic_data.len());
        let mut awaiting = Vec::new();
        for topic_data in request.topic_data {
            let name = topic_data.name.0.to_string();
            let topic =
                if valid_acks { self.topic_or_auto_create(&name, true).await } else { Err(crate::topics::TopicError::Unknown) };
            let mut partition_responses = Vec::with_capacity(topic_data.partition_data.len());
            for data in topic_data.partition_data {
                let mut response = PartitionProduceResponse::default().with_index(data.index).with_base_offset(-1);
                let partition = match &topic {
                    _ if !valid_acks => Err(error_code::INVALID_REQUIRED_ACKS),
                    Err(e) => Err(e.code()),
                    Ok(topic) => self.replica(topic, data.index),
                };
                let outcome = match (partition, data.records) {
                    (Err(code), _) => Err(code),
                    (Ok(_), None) => Err(error_code::CORRUPT_MESSAGE),
                    (Ok(partition), Some(records)) => {
                        let min_isr = partition.log.config().min_insync_replicas as usize;
                        // A second handle on the bytes (no copy) for the audit count.
                        let audited = self.audit.as_ref().map(|audit| (audit, records.clone()));
                        match append(&partition, records, acks_all, min_isr).await {
                            Ok((info, leader_epoch, log_start)) => {
                                if let Some((audit, records)) = audited.filter(|_| !info.duplicate) {
                                    audit.count_appended(&name, &records);
                                }
                                if acks_all {
                                    awaiting.push(AwaitingReplication {
                                        topic: responses.len(),
                                        partition: partition_responses.len(),
                                        replica: partition.clone(),
                                        leader_epoch,
                                        last_offset: info.last_offset,
                                        min_isr,
                                    });
                                }
                                Ok((info, log_start))
                            }
                            Err(AppendError::Refused(code)) => Err(code),
                            Err(AppendError::Log(e)) => {
                                tracing::debug!(topic = %name, partition = data.index, error = %e, "produce refused");
                                Err(log_error_code(&e))
                            }
                            Err(AppendError::Task(e)) => {
                                tracing::error!(topic = %name, partition = data.index, error = %e, "append task failed");
                                Err(error_code::UNKNOWN_SERVER_ERROR)
                            }
                        }
                    }
                };
                response = match outcome {
                    Ok((info, log_start)) => {
                        let response = response.with_base_offset(info.base_offset);
                        if version >= 5 {
                            response.with_log_start_offset(log_start)
                        } else {
                            response
                        }
                    }
                    Err(code) => response.with_error_code(code),
                };
                partition_responses.push(response);
            }
            responses
                .push(TopicProduceResponse::default().with_name(topic_data.name).with_partition_responses(partition_responses));
        }
        // Every batch is appended before the first wait, so the followers fetch them all
        // in one round; the waits share the request's timeout.
        let timeout = Duration::from_millis(u64::try_from(request.timeout_ms).unwrap_or(0));
        let deadline = tokio::time::Instant::now() + timeout;
        for wait in awaiting {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if let Err(code) = wait.replica.wait_for_replication(wait.leader_epoch, wait.last_offset, wait.min_isr, left).await {
                let response = &mut responses[wait.topic].partition_responses[wait.partition];
                response.error_code = code;
                response.base_offset = -1;
            }
        }
        (acks != 0).then(|| ResponseKind::Produce(ProduceResponse::default().with_responses(responses)))
    }
}

enum AppendError {
    /// This broker cannot take the batch (not the leader, ISR too small).
    Refused(i16),
    Log(fjord_log::Error),
    Task(tokio::task::JoinError),
}

/// Appends `records` as the leader; returns what was appended, in which leader epoch,
/// and the log start offset.
///
/// Without a `flush.messages` policy an append is a write into the page cache, which
/// does not block for long: it runs right here, because handing it to the blocking pool
/// costs two thread switches per request, which measured as most of the CPU of an
/// unbatched producer. Appends that may fsync go to the blocking pool.
async fn append(
    partition: &Arc<Partition>,
    records: Bytes,
    acks_all: bool,
    min_isr: usize,
) -> Result<(AppendInfo, i32, i64), AppendError> {
    fn run(partition: &Partition, records: &[u8], acks_all: bool, min_isr: usize) -> Result<(AppendInfo, i32, i64), AppendError> {
        let (info, epoch) =
            partition.append_as_leader(records, acks_all, min_isr).map_err(AppendError::Refused)?.map_err(AppendError::Log)?;
        Ok((info, epoch, partition.log.log_start_offset()))
    }
    if partition.log.config().flush_messages.is_none() {
        return run(partition, &records, acks_all, min_isr);
    }
    let partition = partition.clone();
    tokio::task::spawn_blocking(move || run(&partition, &records, acks_all, min_isr)).await.map_err(AppendError::Task)?
}

/// Produce v0-v2 carry old message sets (magic 0/1), which this broker does not store.
/// They are still advertised (see [`codec::SUPPORTED_APIS`]), so answer them properly:
/// every partition gets UNSUPPORTED_FOR_MESSAGE_FORMAT, nothing is appended.
pub(crate) fn legacy(header: &RequestHeader, version: i16, mut body: Bytes) -> Option<Response> {
    let correlation_id = header.correlation_id;
    let Some((acks, topics)) = parse_legacy(&mut body) else {
        return Some(codec::error_response(correlation_id, error_code::INVALID_REQUEST));
    };
    if acks == 0 {
        return None;
    }
    let mut buf = BytesMut::with_capacity(64);
    buf.put_i32(0);
    buf.put_i32(correlation_id);
    buf.put_i32(topics.len() as i32);
    for (name, partitions) in &topics {
        buf.put_i16(name.len() as i16);
        buf.put_slice(name);
        buf.put_i32(partitions.len() as i32);
        for &partition in partitions {
            buf.put_i32(partition);
            buf.put_i16(error_code::UNSUPPORTED_FOR_MESSAGE_FORMAT);
            buf.put_i64(-1); // base offset
            if version >= 2 {
                buf.put_i64(-1); // log append time
            }
        }
    }
    if version >= 1 {
        buf.put_i32(0); // throttle time
    }
    patch_length(&mut buf);
    Some(Response::from(buf.freeze()))
}

/// Topic names with their partition numbers, as a legacy produce request lists them.
type LegacyTopics = Vec<(Bytes, Vec<i32>)>;

/// `acks | timeout | [topic name | [partition | message set]]`, bounds-checked.
fn parse_legacy(body: &mut Bytes) -> Option<(i16, LegacyTopics)> {
    fn take_bytes(body: &mut Bytes, len: usize) -> Option<Bytes> {
        (body.remaining() >= len).then(|| body.split_to(len))
    }
    let acks = body.try_get_i16().ok()?;
    let _timeout = body.try_get_i32().ok()?;
    let topic_count = usize::try_from(body.try_get_i32().ok()?).ok()?;
    let mut topics = Vec::new();
    for _ in 0..topic_count {
        let name_len = usize::try_from(body.try_get_i16().ok()?).ok()?;
        let name = take_bytes(body, name_len)?;
        let partition_count = usize::try_from(body.try_get_i32().ok()?).ok()?;
        let mut partitions = Vec::new();
        for _ in 0..partition_count {
            partitions.push(body.try_get_i32().ok()?);
            let set_len = body.try_get_i32().ok()?;
            if set_len > 0 {
                take_bytes(body, set_len as usize)?;
            }
        }
        topics.push((name, partitions));
    }
    Some((acks, topics))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_produce_is_answered_with_unsupported_format() {
        let mut body = BytesMut::new();
        body.put_i16(1);
        body.put_i32(1000);
        body.put_i32(1);
        body.put_i16(1);
        body.put_slice(b"t");
        body.put_i32(1);
        body.put_i32(0);
        body.put_i32(3);
        body.put_slice(b"abc");
        let header = RequestHeader::default().with_correlation_id(9);
        let response = legacy(&header, 2, body.clone().freeze()).unwrap();
        let bytes = codec::response_bytes(&response);
        let mut expected = BytesMut::new();
        for v in [9i32, 1] {
            expected.put_i32(v);
        }
        expected.put_i16(1);
        expected.put_slice(b"t");
        expected.put_i32(1);
        expected.put_i32(0);
        expected.put_i16(error_code::UNSUPPORTED_FOR_MESSAGE_FORMAT);
        expected.put_i64(-1);
        expected.put_i64(-1);
        expected.put_i32(0);
        assert_eq!(&bytes[4..], &expected[..]);
        assert_eq!(i32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize, expected.len());
        // Truncated: INVALID_REQUEST, never a panic.
        let truncated = legacy(&header, 2, body.freeze().slice(..12)).unwrap();
        assert_eq!(&codec::response_bytes(&truncated)[8..], &error_code::INVALID_REQUEST.to_be_bytes());
    }
}
