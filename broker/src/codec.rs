//! Request decoding and response framing: bytes in, typed requests out; typed (or
//! hand-encoded) responses in, [`Response`] chunks out.
//!
//! Frames are `i32 length | body`. A request body starts with
//! `api_key i16 | api_version i16 | correlation_id i32`, which this module reads by hand
//! so that even a request it cannot decode gets an answer carrying its correlation id.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::{Decodable, Encodable};

use crate::response::Response;

/// The Kafka error codes this broker answers with.
pub(crate) mod error_code {
    pub(crate) const NONE: i16 = 0;
    pub(crate) const UNKNOWN_SERVER_ERROR: i16 = -1;
    pub(crate) const OFFSET_OUT_OF_RANGE: i16 = 1;
    pub(crate) const CORRUPT_MESSAGE: i16 = 2;
    pub(crate) const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
    pub(crate) const LEADER_NOT_AVAILABLE: i16 = 5;
    pub(crate) const NOT_LEADER_OR_FOLLOWER: i16 = 6;
    pub(crate) const REQUEST_TIMED_OUT: i16 = 7;
    pub(crate) const REPLICA_NOT_AVAILABLE: i16 = 9;
    pub(crate) const TOPIC_AUTHORIZATION_FAILED: i16 = 29;
    pub(crate) const GROUP_AUTHORIZATION_FAILED: i16 = 30;
    pub(crate) const CLUSTER_AUTHORIZATION_FAILED: i16 = 31;
    pub(crate) const INVALID_TIMESTAMP: i16 = 32;
    pub(crate) const TRANSACTIONAL_ID_AUTHORIZATION_FAILED: i16 = 53;
    pub(crate) const ILLEGAL_SASL_STATE: i16 = 34;
    pub(crate) const SASL_AUTHENTICATION_FAILED: i16 = 58;
    pub(crate) const MESSAGE_TOO_LARGE: i16 = 10;
    pub(crate) const COORDINATOR_NOT_AVAILABLE: i16 = 15;
    pub(crate) const INVALID_TOPIC_EXCEPTION: i16 = 17;
    pub(crate) const NOT_ENOUGH_REPLICAS: i16 = 19;
    pub(crate) const NOT_ENOUGH_REPLICAS_AFTER_APPEND: i16 = 20;
    pub(crate) const INVALID_REQUIRED_ACKS: i16 = 21;
    pub(crate) const TOPIC_ALREADY_EXISTS: i16 = 36;
    pub(crate) const UNSUPPORTED_VERSION: i16 = 35;
    pub(crate) const INVALID_PARTITIONS: i16 = 37;
    pub(crate) const INVALID_REPLICATION_FACTOR: i16 = 38;
    pub(crate) const INVALID_REPLICA_ASSIGNMENT: i16 = 39;
    pub(crate) const NOT_CONTROLLER: i16 = 41;
    pub(crate) const INVALID_REQUEST: i16 = 42;
    pub(crate) const UNSUPPORTED_FOR_MESSAGE_FORMAT: i16 = 43;
    pub(crate) const POLICY_VIOLATION: i16 = 44;
    pub(crate) const INVALID_CONFIG: i16 = 40;
    pub(crate) const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
    pub(crate) const INVALID_PRODUCER_EPOCH: i16 = 47;
    pub(crate) const INVALID_TXN_STATE: i16 = 48;
    pub(crate) const TRANSACTION_COORDINATOR_FENCED: i16 = 52;
    pub(crate) const KAFKA_STORAGE_ERROR: i16 = 56;
    pub(crate) const LOG_DIR_NOT_FOUND: i16 = 57;
    pub(crate) const FETCH_SESSION_ID_NOT_FOUND: i16 = 70;
    pub(crate) const FENCED_LEADER_EPOCH: i16 = 74;
    pub(crate) const UNKNOWN_LEADER_EPOCH: i16 = 75;
    pub(crate) const OFFSET_NOT_AVAILABLE: i16 = 78;
    pub(crate) const PREFERRED_LEADER_NOT_AVAILABLE: i16 = 80;
    pub(crate) const ELIGIBLE_LEADERS_NOT_AVAILABLE: i16 = 83;
    pub(crate) const ELECTION_NOT_NEEDED: i16 = 84;
    pub(crate) const NO_REASSIGNMENT_IN_PROGRESS: i16 = 85;
    pub(crate) const INVALID_RECORD: i16 = 87;
    pub(crate) const UNSUPPORTED_SASL_MECHANISM: i16 = 33;
    pub(crate) const RESOURCE_NOT_FOUND: i16 = 91;
    pub(crate) const DUPLICATE_RESOURCE: i16 = 92;
    pub(crate) const UNACCEPTABLE_CREDENTIAL: i16 = 93;
    pub(crate) const UNKNOWN_TOPIC_ID: i16 = 100;
}

/// The APIs this broker implements, with the versions it advertises (inclusive).
///
/// Produce is advertised from v0 although only v3+ (RecordBatch v2) payloads are
/// accepted: librdkafka derives features such as compression support from the broker
/// accepting old versions, and silently disables them otherwise. Fetch starts at v4, the
/// first version that carries RecordBatch v2, and stops at v13, the first that names
/// topics by id (KIP-516); v14+ add fields for KRaft and tiered storage.
/// The group APIs are answered by the group coordinator (`crate::group`).
pub(crate) const SUPPORTED_APIS: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 0, 9),
    (ApiKey::Fetch, 4, 13),
    (ApiKey::ListOffsets, 1, 7),
    (ApiKey::OffsetForLeaderEpoch, 2, 4),
    (ApiKey::Metadata, 0, 12),
    (ApiKey::ApiVersions, 0, 3),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 6),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::AlterConfigs, 0, 2),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::FindCoordinator, 0, 4),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::OffsetCommit, 2, 9),
    (ApiKey::OffsetFetch, 1, 9),
    (ApiKey::ListGroups, 0, 5),
    (ApiKey::DescribeGroups, 0, 5),
    (ApiKey::DeleteGroups, 0, 2),
    (ApiKey::OffsetDelete, 0, 0),
    (ApiKey::InitProducerId, 0, 4),
    // Transactions (`crate::txn`): the versions before KIP-890's, whose clients expect
    // the broker to verify partitions itself; AddPartitionsToTxn v4-v5 are the brokers'
    // batched form (with verify_only).
    (ApiKey::AddPartitionsToTxn, 0, 5),
    (ApiKey::AddOffsetsToTxn, 0, 3),
    (ApiKey::EndTxn, 0, 3),
    (ApiKey::TxnOffsetCommit, 0, 3),
    (ApiKey::DescribeTransactions, 0, 0),
    (ApiKey::ListTransactions, 0, 1),
    (ApiKey::ElectLeaders, 0, 2),
    (ApiKey::CreateAcls, 1, 3),
    (ApiKey::DescribeAcls, 1, 3),
    (ApiKey::DeleteAcls, 1, 3),
    (ApiKey::DescribeUserScramCredentials, 0, 0),
    (ApiKey::AlterUserScramCredentials, 0, 0),
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::SaslAuthenticate, 0, 2),
    (ApiKey::DescribeCluster, 0, 1),
    (ApiKey::CreatePartitions, 0, 3),
    // v1 (KIP-860) adds allow_replication_factor_change.
    (ApiKey::AlterPartitionReassignments, 0, 1),
    (ApiKey::ListPartitionReassignments, 0, 0),
    (ApiKey::DeleteRecords, 0, 2),
    (ApiKey::DescribeProducers, 0, 0),
    // v0 is gone from the codec crate (and from Kafka 4); v1 differs from it only in
    // throttling semantics.
    (ApiKey::DescribeLogDirs, 1, 4),
    // v0 is gone from the codec crate, as for DescribeLogDirs; v2 is flexible.
    (ApiKey::AlterReplicaLogDirs, 1, 2),
    // Kafka's admin client (3.8+) describes topics with it, paged; v0 is the only version.
    (ApiKey::DescribeTopicPartitions, 0, 0),
    // v0 is KIP-714's ListClientMetricsResources; v1 (KIP-1142) takes resource types.
    (ApiKey::ListConfigResources, 0, 1),
    // KIP-584; Kafka 2.7-3.9 serve v0-v1 (v1 adds upgrade types and validate_only); v2
    // (Kafka 4, results left out on success) is not served.
    (ApiKey::UpdateFeatures, 0, 1),
    // Only v1: the codec crate (like Kafka 4) no longer reads v0, which differs from v1
    // in its encoding only (v1 is flexible).
    (ApiKey::WriteTxnMarkers, 1, 1),
    // Client quotas (`crate::quota`); v1 is v0 made flexible.
    (ApiKey::DescribeClientQuotas, 0, 1),
    (ApiKey::AlterClientQuotas, 0, 1),
];

/// Produce versions whose payloads are old message sets; answered by hand
/// ([`crate::handler::produce::legacy`]) because the codec crate starts at v3.
pub(crate) const LEGACY_PRODUCE: std::ops::RangeInclusive<i16> = 0..=2;

/// Whether `(api_key, version)` is implemented.
pub(crate) fn is_supported(api_key: i16, version: i16) -> bool {
    SUPPORTED_APIS.iter().any(|&(key, min, max)| key as i16 == api_key && (min..=max).contains(&version))
}

/// One decoded request frame.
#[derive(Debug)]
pub(crate) enum Decoded {
    /// A request this broker implements.
    Request {
        /// Its header (correlation id, client id).
        header: RequestHeader,
        /// The API version the client used.
        version: i16,
        /// The decoded body.
        request: Box<RequestKind>,
        /// The frame's size in bytes (header and body): what a produce quota counts.
        size: usize,
    },
    /// Produce v0-v2: the header plus the undecoded body.
    LegacyProduce {
        /// Its header.
        header: RequestHeader,
        /// The version.
        version: i16,
        /// The body after the header.
        body: Bytes,
    },
    /// A well-framed request for an API key or version this broker does not implement.
    Unsupported {
        /// Its correlation id.
        correlation_id: i32,
        /// The API key as sent.
        api_key: i16,
        /// The version as sent.
        version: i16,
    },
}

/// A request frame whose header is read and whose body the guard walked (`Body`), not
/// decoded yet: the caller reserves what decoding it costs first
/// (`crate::request_memory`). Frames needing no decoding are `Ready`.
pub(crate) enum Checked {
    Ready(Decoded),
    Body {
        header: RequestHeader,
        key: ApiKey,
        version: i16,
        body: Bytes,
        size: usize,
        /// Array elements and tagged fields in the body (`guard::check_body`).
        elements: u64,
    },
}

impl Checked {
    /// Array elements and tagged fields to decode.
    pub(crate) fn elements(&self) -> u64 {
        match self {
            Checked::Ready(_) => 0,
            Checked::Body { elements, .. } => *elements,
        }
    }

    /// Decodes the body.
    pub(crate) fn decode(self) -> Result<Decoded, String> {
        match self {
            Checked::Ready(decoded) => Ok(decoded),
            Checked::Body { header, key, version, mut body, size, .. } => {
                let request = RequestKind::decode(key, &mut body, version)
                    .map_err(|e| format!("bad {key:?} v{version} request body: {e}"))?;
                Ok(Decoded::Request { header, version, request: Box::new(request), size })
            }
        }
    }
}

/// Decodes one request frame body (without the length prefix). An error means the
/// bytes are not a Kafka request; the caller closes the connection.
#[cfg(test)]
pub(crate) fn decode_request(frame: Bytes) -> Result<Decoded, String> {
    check_request(frame)?.decode()
}

/// Reads one request frame's header (without the length prefix) and walks its body. An
/// error means the bytes are not a Kafka request, or one too large to decode; the caller
/// closes the connection.
pub(crate) fn check_request(mut frame: Bytes) -> Result<Checked, String> {
    if frame.len() < 8 {
        return Err(format!("request of {} bytes is shorter than a request header", frame.len()));
    }
    let size = frame.len();
    let api_key = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let correlation_id = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
    let legacy_produce = api_key == ApiKey::Produce as i16 && LEGACY_PRODUCE.contains(&version);
    if !is_supported(api_key, version) {
        return Ok(Checked::Ready(Decoded::Unsupported { correlation_id, api_key, version }));
    }
    let key = ApiKey::try_from(api_key).map_err(|_| format!("unknown api key {api_key}"))?;
    let header_version = key.request_header_version(version);
    let header = RequestHeader::decode(&mut frame, header_version).map_err(|e| format!("bad request header: {e}"))?;
    if legacy_produce {
        return Ok(Checked::Ready(Decoded::LegacyProduce { header, version, body: frame }));
    }
    // The codec crate pre-allocates arrays by their claimed length; see `guard`.
    let elements =
        crate::guard::check_body(key, version, &frame).map_err(|e| format!("bad {key:?} v{version} request body: {e}"))?;
    Ok(Checked::Body { header, key, version, body: frame, size, elements })
}

/// Frames a typed response: length, response header (v0 or flexible v1), body.
pub(crate) fn encode_response(correlation_id: i32, api_key: ApiKey, version: i16, body: &ResponseKind) -> Response {
    let mut buf = BytesMut::with_capacity(128);
    buf.put_i32(0); // length, patched below
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    let header_version = api_key.response_header_version(version);
    // Encoding only fails on a value that does not fit the version (a broker bug); an
    // empty, well-framed error answer is better than a dropped connection then.
    if let Err(e) = header.encode(&mut buf, header_version).and_then(|()| body.encode(&mut buf, version)) {
        tracing::error!(?api_key, version, error = %e, "response does not encode; answering with UNKNOWN_SERVER_ERROR");
        return error_response(correlation_id, error_code::UNKNOWN_SERVER_ERROR);
    }
    patch_length(&mut buf);
    Response::from(buf.freeze())
}

/// Kafka's name of an API key (`Produce`, `Fetch`, ...), or its number when the codec
/// does not know it: for metrics labels, logs and error messages.
pub(crate) fn api_name(key: i16) -> String {
    ApiKey::try_from(key).map_or_else(|_| key.to_string(), |k| format!("{k:?}"))
}

/// The answer to a request this broker cannot decode by version: the correlation id and
/// an error code, which is how every response schema that starts with `error_code`
/// (ApiVersions v0 among them) reads an error.
pub(crate) fn error_response(correlation_id: i32, code: i16) -> Response {
    let mut buf = BytesMut::with_capacity(10);
    buf.put_i32(6);
    buf.put_i32(correlation_id);
    buf.put_i16(code);
    Response::from(buf.freeze())
}

/// Writes the frame length (everything after the 4-byte prefix) into the prefix.
pub(crate) fn patch_length(buf: &mut BytesMut) {
    let len = i32::try_from(buf.len() - 4).expect("invariant: responses are smaller than 2 GiB");
    buf[..4].copy_from_slice(&len.to_be_bytes());
}

/// Concatenates a response into one buffer (tests, and the copying path).
#[cfg(test)]
pub(crate) fn response_bytes(response: &Response) -> Vec<u8> {
    use crate::response::Chunk;
    let mut out = Vec::new();
    for chunk in &response.chunks {
        match chunk {
            Chunk::Bytes(b) => out.extend_from_slice(b),
            Chunk::File { file, position, len } => {
                let mut buf = vec![0; *len];
                std::os::unix::fs::FileExt::read_exact_at(file.as_ref(), &mut buf, *position).unwrap();
                out.extend_from_slice(&buf);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::{ApiVersionsRequest, MetadataRequest};
    use kafka_protocol::protocol::StrBytes;

    fn frame<T: Encodable>(key: ApiKey, version: i16, body: &T) -> Bytes {
        let mut buf = BytesMut::new();
        RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(7)
            .with_client_id(Some(StrBytes::from_static_str("t")))
            .encode(&mut buf, key.request_header_version(version))
            .unwrap();
        body.encode(&mut buf, version).unwrap();
        buf.freeze()
    }

    #[test]
    fn decodes_supported_versions_and_flags_the_rest() {
        let ok = decode_request(frame(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())).unwrap();
        assert!(matches!(ok, Decoded::Request { version: 3, .. }));
        let v4 = decode_request(frame(ApiKey::ApiVersions, 4, &ApiVersionsRequest::default())).unwrap();
        assert!(matches!(v4, Decoded::Unsupported { correlation_id: 7, version: 4, .. }));
        let meta = decode_request(frame(ApiKey::Metadata, 13, &MetadataRequest::default())).unwrap();
        assert!(matches!(meta, Decoded::Unsupported { .. }));
        let mut unknown = frame(ApiKey::Metadata, 1, &MetadataRequest::default()).to_vec();
        unknown[..2].copy_from_slice(&999i16.to_be_bytes());
        assert!(matches!(decode_request(unknown.into()).unwrap(), Decoded::Unsupported { api_key: 999, .. }));
    }

    #[test]
    fn short_and_truncated_frames_are_errors() {
        assert!(decode_request(Bytes::from_static(&[0, 18, 0])).is_err());
        let full = frame(ApiKey::Metadata, 1, &MetadataRequest::default().with_topics(Some(vec![])));
        assert!(decode_request(full.slice(..full.len() - 2)).is_err());
    }

    #[test]
    fn supported_versions_are_within_what_the_codec_crate_knows() {
        for &(key, min, max) in SUPPORTED_APIS {
            let crate_range = key.valid_versions();
            let min = if key == ApiKey::Produce { *LEGACY_PRODUCE.end() + 1 } else { min };
            assert!(crate_range.min <= min && max <= crate_range.max, "{key:?}");
        }
    }
}
