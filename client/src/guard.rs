//! A structural walk over a broker's answer before the codec crate decodes it.
//!
//! Why: `kafka-protocol` decodes an array by reading its count and calling
//! `Vec::with_capacity(count)` before reading any element, and a failed allocation aborts
//! the process. One answer of a few bytes claiming two billion elements, from a hostile
//! or broken broker (or anyone in the middle of a plaintext link), would take down the
//! mirror, the gateway or the CLI, whatever else they were doing. Kafka's Java clients
//! refuse such an answer instead ("Tried to allocate a collection of size N, but there
//! are only M bytes remaining"); so does this walk, with `fjord_record::walk` (the
//! primitives the broker's own request guard uses), for every API this client sends, at
//! every version it may send it: from the codec crate's lowest version up to the highest
//! the client asks for (the client sends the lower of that and the broker's maximum, and
//! a broker may advertise anything). The walk starts after the response header.
//!
//! The schemas mirror the codec crate's generated decoders; the tests walk answers that
//! the crate itself encoded, populated, at every version listed in [`WALKED`], so a
//! mismatch shows. The client never asks a version above the walked ones
//! ([`highest_walked`]); an answer at a version without a walk is refused, not decoded
//! unchecked.

use fjord_record::walk::{Walk, Walker};
use kafka_protocol::messages::ApiKey;

use crate::error::Error;

/// The most array elements and tagged fields one answer may hold. The bytes-left check
/// alone bounds an answer's elements by its size, up to the 1 GiB frame the connection
/// accepts, while each element costs 4 (a replica id) to ~150 bytes (a struct with its
/// tag map) once decoded. A Metadata answer takes about 7 elements per partition at
/// replication factor 3 (the partition, its replicas, its in-sync replicas), so 8 million
/// lets through the full metadata of a cluster of a million partitions; a Fetch answer is
/// bounded by `fetch.max.bytes` and holds far fewer. A hostile answer then decodes to
/// ~1 GiB at most, the order of the frame it came in, instead of 150 times that.
pub(crate) const MAX_RESPONSE_ELEMENTS: u64 = 8_000_000;

/// The answers walked: each API the client sends, from the codec crate's lowest version
/// up to the highest the client asks for (`Connection::request`'s `preferred`, the
/// consumer's `FETCH_VERSION`, the producer's `PRODUCE_VERSION`, the SASL exchange's v1).
pub(crate) const WALKED: &[(ApiKey, i16, i16)] = &[
    (ApiKey::ApiVersions, 0, 0), // the connection asks v0 only: the one layout every broker answers
    (ApiKey::Metadata, 0, 12),
    (ApiKey::Produce, 3, 9),
    (ApiKey::Fetch, 4, 12),
    (ApiKey::ListOffsets, 1, 7),
    (ApiKey::FindCoordinator, 0, 3),
    (ApiKey::JoinGroup, 0, 7),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 4),
    (ApiKey::OffsetCommit, 2, 8),
    (ApiKey::OffsetFetch, 1, 7),
    (ApiKey::ListGroups, 0, 4),
    (ApiKey::DescribeGroups, 0, 5),
    (ApiKey::InitProducerId, 0, 4),
    (ApiKey::AddPartitionsToTxn, 0, 3),
    (ApiKey::AddOffsetsToTxn, 0, 3),
    (ApiKey::EndTxn, 0, 3),
    (ApiKey::TxnOffsetCommit, 0, 3),
    (ApiKey::WriteTxnMarkers, 1, 1),
    (ApiKey::DescribeTransactions, 0, 0),
    (ApiKey::ListTransactions, 0, 0),
    (ApiKey::DescribeProducers, 0, 0),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 6),
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::DeleteRecords, 0, 2),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::DescribeLogDirs, 1, 4),
    (ApiKey::AlterReplicaLogDirs, 1, 2),
    (ApiKey::AlterPartitionReassignments, 0, 0),
    (ApiKey::ListPartitionReassignments, 0, 0),
    (ApiKey::DescribeClientQuotas, 0, 1),
    (ApiKey::AlterClientQuotas, 0, 1),
    (ApiKey::CreateAcls, 1, 3),
    (ApiKey::DescribeAcls, 1, 3),
    (ApiKey::DeleteAcls, 1, 3),
    (ApiKey::DescribeUserScramCredentials, 0, 0),
    (ApiKey::AlterUserScramCredentials, 0, 0),
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::SaslAuthenticate, 0, 1),
];

/// The highest version of API `key` whose answer is walked (`None`: no walk at all).
/// `Connection::version` never picks a higher one, so a version raised at a call site
/// without its walk here stays at the last walked version instead of being refused.
pub(crate) fn highest_walked(api_key: i16) -> Option<i16> {
    let key = ApiKey::try_from(api_key).ok()?;
    WALKED.iter().filter(|&&(walked, _, _)| walked == key).map(|&(_, _, max)| max).max()
}

/// Checks the body (after the response header) of an answer to a request of API
/// `api_key` at `version`: `Ok` means decoding it allocates no more than its bytes
/// justify. Bytes after the walked body are left to the caller, as the decoder leaves them.
pub(crate) fn check_response(api_key: i16, version: i16, body: &[u8]) -> Walk {
    walk(api_key, version, body, MAX_RESPONSE_ELEMENTS).map(|_| ())
}

/// The error for an answer [`check_response`] refused.
pub(crate) fn refused(broker: &str, api_key: i16, version: i16, reason: &str) -> Error {
    let api = ApiKey::try_from(api_key).map_or_else(|()| format!("api {api_key}"), |key| format!("{key:?}"));
    Error::Protocol { broker: broker.to_owned(), detail: format!("refused the {api} v{version} answer: {reason}") }
}

/// Walks an answer with an element limit of `max_elements`; on success, the walker at
/// the end of the body (what is left of it, how many elements it held).
fn walk(api_key: i16, v: i16, body: &[u8], max_elements: u64) -> Walk<Walker<'_>> {
    let key = ApiKey::try_from(api_key).map_err(|()| "no walk for this API")?;
    if !WALKED.iter().any(|&(walked, min, max)| walked == key && (min..=max).contains(&v)) {
        return Err("no walk for this API version");
    }
    let flexible = match key {
        ApiKey::ApiVersions => v >= 3,
        ApiKey::Metadata => v >= 9,
        ApiKey::Produce => v >= 9,
        ApiKey::Fetch => v >= 12,
        ApiKey::ListOffsets => v >= 6,
        ApiKey::FindCoordinator => v >= 3,
        ApiKey::JoinGroup => v >= 6,
        ApiKey::SyncGroup | ApiKey::Heartbeat | ApiKey::LeaveGroup => v >= 4,
        ApiKey::OffsetCommit => v >= 8,
        ApiKey::OffsetFetch => v >= 6,
        ApiKey::ListGroups => v >= 3,
        ApiKey::DescribeGroups => v >= 5,
        ApiKey::InitProducerId => v >= 2,
        ApiKey::AddPartitionsToTxn | ApiKey::AddOffsetsToTxn | ApiKey::EndTxn | ApiKey::TxnOffsetCommit => v >= 3,
        ApiKey::WriteTxnMarkers => v >= 1,
        ApiKey::DescribeTransactions | ApiKey::ListTransactions | ApiKey::DescribeProducers => true,
        ApiKey::CreateTopics => v >= 5,
        ApiKey::DeleteTopics => v >= 4,
        ApiKey::CreatePartitions | ApiKey::DeleteRecords => v >= 2,
        ApiKey::DescribeConfigs => v >= 4,
        ApiKey::IncrementalAlterConfigs => v >= 1,
        ApiKey::DescribeLogDirs | ApiKey::AlterReplicaLogDirs => v >= 2,
        ApiKey::AlterPartitionReassignments | ApiKey::ListPartitionReassignments => true,
        ApiKey::DescribeClientQuotas | ApiKey::AlterClientQuotas => v >= 1,
        ApiKey::CreateAcls | ApiKey::DescribeAcls | ApiKey::DeleteAcls => v >= 2,
        ApiKey::DescribeUserScramCredentials | ApiKey::AlterUserScramCredentials => true,
        ApiKey::SaslHandshake => false,
        ApiKey::SaslAuthenticate => v >= 2,
        _ => unreachable!("every api in WALKED has its flexible versions listed"),
    };
    let mut walker = Walker::new(body, flexible, max_elements);
    let w = &mut walker;
    match key {
        ApiKey::ApiVersions => {
            w.int16()?; // error code
            w.array(|w| {
                w.int16()?; // api key
                w.int16()?; // min version
                w.int16() // max version
            })?;
        }
        ApiKey::Metadata => {
            if v >= 3 {
                w.int32()?; // throttle time
            }
            w.array(|w| {
                w.int32()?; // node id
                w.string()?; // host
                w.int32()?; // port
                if v >= 1 {
                    w.string()?; // rack
                }
                w.tagged_fields()
            })?;
            if v >= 2 {
                w.string()?; // cluster id
            }
            if v >= 1 {
                w.int32()?; // controller id
            }
            w.array(|w| {
                w.int16()?; // error code
                w.string()?; // name
                if v >= 10 {
                    w.uuid()?; // topic id
                }
                if v >= 1 {
                    w.int8()?; // is internal
                }
                w.array(|w| {
                    w.int16()?; // error code
                    w.int32()?; // partition index
                    w.int32()?; // leader id
                    if v >= 7 {
                        w.int32()?; // leader epoch
                    }
                    w.array(Walker::int32)?; // replicas
                    w.array(Walker::int32)?; // in-sync replicas
                    if v >= 5 {
                        w.array(Walker::int32)?; // offline replicas
                    }
                    w.tagged_fields()
                })?;
                if v >= 8 {
                    w.int32()?; // topic authorized operations
                }
                w.tagged_fields()
            })?;
            if (8..=10).contains(&v) {
                w.int32()?; // cluster authorized operations
            }
        }
        ApiKey::Produce => {
            w.array(|w| {
                w.string()?; // topic name
                w.array(|w| {
                    w.int32()?; // partition index
                    w.int16()?; // error code
                    w.int64()?; // base offset
                    w.int64()?; // log append time
                    if v >= 5 {
                        w.int64()?; // log start offset
                    }
                    if v >= 8 {
                        w.array(|w| {
                            w.int32()?; // batch index
                            w.string()?; // its error message
                            w.tagged_fields()
                        })?;
                        w.string()?; // error message
                    }
                    // Tag 0 (the current leader) only exists from v10; the decoder refuses it before.
                    w.tagged_fields()
                })?;
                w.tagged_fields()
            })?;
            w.int32()?; // throttle time
        }
        ApiKey::Fetch => {
            w.int32()?; // throttle time
            if v >= 7 {
                w.int16()?; // error code
                w.int32()?; // session id
            }
            w.array(|w| {
                w.string()?; // topic name
                w.array(|w| {
                    w.int32()?; // partition index
                    w.int16()?; // error code
                    w.int64()?; // high watermark
                    w.int64()?; // last stable offset
                    if v >= 5 {
                        w.int64()?; // log start offset
                    }
                    w.array(|w| {
                        w.int64()?; // producer id
                        w.int64()?; // first offset
                        w.tagged_fields()
                    })?; // aborted transactions
                    if v >= 11 {
                        w.int32()?; // preferred read replica
                    }
                    // The record batches: opaque here, validated by `fjord_record` when read.
                    w.bytes()?;
                    w.tagged_fields_with(|tag, w| {
                        match tag {
                            0 => {
                                w.int32()?; // diverging epoch: epoch
                                w.int64()?; // and end offset
                            }
                            1 => {
                                w.int32()?; // current leader: id
                                w.int32()?; // and epoch
                            }
                            2 => {
                                w.int64()?; // snapshot id: end offset
                                w.int32()?; // and epoch
                            }
                            _ => return Ok(false),
                        }
                        w.tagged_fields().map(|()| true)
                    })
                })?;
                w.tagged_fields()
            })?;
            // Tag 0 (node endpoints) only exists from v16; the decoder refuses it before.
        }
        ApiKey::ListOffsets => {
            if v >= 2 {
                w.int32()?; // throttle time
            }
            w.array(|w| {
                w.string()?; // topic name
                w.array(|w| {
                    w.int32()?; // partition index
                    w.int16()?; // error code
                    w.int64()?; // timestamp
                    w.int64()?; // offset
                    if v >= 4 {
                        w.int32()?; // leader epoch
                    }
                    w.tagged_fields()
                })?;
                w.tagged_fields()
            })?;
        }
        ApiKey::FindCoordinator => {
            if v >= 1 {
                w.int32()?; // throttle time
            }
            w.int16()?; // error code
            if v >= 1 {
                w.string()?; // error message
            }
            w.int32()?; // node id
            w.string()?; // host
            w.int32()?; // port
        }
        ApiKey::JoinGroup => {
            if v >= 2 {
                w.int32()?; // throttle time
            }
            w.int16()?; // error code
            w.int32()?; // generation id
            if v >= 7 {
                w.string()?; // protocol type
            }
            w.string()?; // protocol name
            w.string()?; // leader
            w.string()?; // member id
            w.array(|w| {
                w.string()?; // member id
                if v >= 5 {
                    w.string()?; // group instance id
                }
                w.bytes()?; // metadata
                w.tagged_fields()
            })?;
        }
        ApiKey::SyncGroup => {
            if v >= 1 {
                w.int32()?; // throttle time
            }
            w.int16()?; // error code
            if v >= 5 {
                w.string()?; // protocol type
                w.string()?; // protocol name
            }
            w.bytes()?; // assignment
        }
        ApiKey::Heartbeat | ApiKey::AddOffsetsToTxn | ApiKey::EndTxn => {
            // Heartbeat's throttle time came in v1, the others always had one.
            if key != ApiKey::Heartbeat || v >= 1 {
                w.int32()?; // throttle time
            }
            w.int16()?; // error code
        }
        ApiKey::LeaveGroup => {
            if v >= 1 {
                w.int32()?; // throttle time
            }
            w.int16()?; // error code
            if v >= 3 {
                w.array(|w| {
                    w.string()?; // member id
                    w.string()?; // group instance id
                    w.int16()?; // error code
                    w.tagged_fields()
                })?;
            }
        }
        ApiKey::OffsetCommit | ApiKey::AddPartitionsToTxn | ApiKey::TxnOffsetCommit | ApiKey::AlterReplicaLogDirs => {
            // Topics, each with partitions of (index, error code); OffsetCommit's throttle
            // time came in v3, the others always had one.
            if key != ApiKey::OffsetCommit || v >= 3 {
                w.int32()?; // throttle time
            }
            w.array(|w| {
                w.string()?; // topic name
                w.array(|w| {
                    w.int32()?; // partition index
                    w.int16()?; // error code
                    w.tagged_fields()
                })?;
                w.tagged_fields()
            })?;
        }
        ApiKey::OffsetFetch => {
            if v >= 3 {
                w.int32()?; // throttle time
            }
            w.array(|w| {
                w.string()?; // topic name
                w.array(|w| {
                    w.int32()?; // partition index
                    w.int64()?; // committed offset
                    if v >= 5 {
                        w.int32()?; // committed leader epoch
                    }
                    w.string()?; // metadata
                    w.int16()?; // error code
                    w.tagged_fields()
                })?;
                w.tagged_fields()
            })?;
            if v >= 2 {
                w.int16()?; // error code
            }
        }
        ApiKey::ListGroups => {
            if v >= 1 {
                w.int32()?; // throttle time
            }
            w.int16()?; // error code
            w.array(|w| {
                w.string()?; // group id
                w.string()?; // protocol type
                if v >= 4 {
                    w.string()?; // group state
                }
                w.tagged_fields()
            })?;
        }
        ApiKey::DescribeGroups => {
            if v >= 1 {
                w.int32()?; // throttle time
            }
            w.array(|w| {
                w.int16()?; // error code
                w.string()?; // group id
                w.string()?; // group state
                w.string()?; // protocol type
                w.string()?; // protocol data
                w.array(|w| {
                    w.string()?; // member id
                    if v >= 4 {
                        w.string()?; // group instance id
                    }
                    w.string()?; // client id
                    w.string()?; // client host
                    w.bytes()?; // member metadata
                    w.bytes()?; // member assignment
                    w.tagged_fields()
                })?;
                if v >= 3 {
                    w.int32()?; // authorized operations
                }
                w.tagged_fields()
            })?;
        }
        ApiKey::InitProducerId => {
            w.int32()?; // throttle time
            w.int16()?; // error code
            w.int64()?; // producer id
            w.int16()?; // producer epoch
        }
        ApiKey::WriteTxnMarkers => {
            w.array(|w| {
                w.int64()?; // producer id
                w.array(|w| {
                    w.string()?; // topic name
                    w.array(|w| {
                        w.int32()?; // partition index
                        w.int16()?; // error code
                        w.tagged_fields()
                    })?;
                    w.tagged_fields()
                })?;
                w.tagged_fields()
            })?;
        }
        ApiKey::DescribeTransactions => {
            w.int32()?; // throttle time
            w.array(|w| {
                w.int16()?; // error code
                w.string()?; // transactional id
                w.string()?; // state
                w.int32()?; // timeout
                w.int64()?; // start time
                w.int64()?; // producer id
                w.int16()?; // producer epoch
                w.array(|w| {
                    w.string()?; // topic name
                    w.array(Walker::int32)?; // partitions
                    w.tagged_fields()
                })?;
                w.tagged_fields()
            })?;
        }
        ApiKey::ListTransactions => {
            w.int32()?; // throttle time
            w.int16()?; // error code
            w.array(Walker::string)?; // unknown state filters
            w.array(|w| {
                w.string()?; // transactional id
                w.int64()?; // producer id
                w.string()?; // state
                w.tagged_fields()
            })?;
        }
        ApiKey::DescribeProducers => {
            w.int32()?; // throttle time
            w.array(|w| {
                w.string()?; // topic name
                w.array(|w| {
                    w.int32()?; // partition index
                    w.int16()?; // error code
                    w.string()?; // error message
                    w.array(|w| {
                        w.int64()?; // producer id
                        w.int32()?; // producer epoch
                        w.int32()?; // last sequence
                        w.int64()?; // last timestamp
                        w.int32()?; // coordinator epoch
                        w.int64()?; // current transaction start offset
                        w.tagged_fields()
                    })?;
                    w.tagged_fields()
                })?;
                w.tagged_fields()
            })?;
        }
        ApiKey::CreateTopics => {
            w.int32()?; // throttle time
            w.array(|w| {
                w.string()?; // name
                if v >= 7 {
                    w.uuid()?; // topic id
                }
                w.int16()?; // error code
                w.string()?; // error message
                if v >= 5 {
                    w.int32()?; // partitions
                    w.int16()?; // replication factor
                    w.array(|w| {
                        w.string()?; // name
                        w.string()?; // value
                        w.int8()?; // read only
                        w.int8()?; // source
                        w.int8()?; // is sensitive
                        w.tagged_fields()
                    })?;
                }
                // Tag 0: the error code of the topic's configs.
                w.tagged_fields_with(|tag, w| if tag == 0 { w.int16().map(|()| true) } else { Ok(false) })
            })?;
        }
        ApiKey::DeleteTopics => {
            w.int32()?; // throttle time
            w.array(|w| {
                w.string()?; // name
                if v >= 6 {
                    w.uuid()?; // topic id
                }
                w.int16()?; // error code
                if v >= 5 {
                    w.string()?; // error message
                }
                w.tagged_fields()
            })?;
        }
        ApiKey::CreatePartitions | ApiKey::CreateAcls => {
            w.int32()?; // throttle time
            w.array(|w| {
                if key == ApiKey::CreatePartitions {
                    w.string()?; // topic name
                }
                w.int16()?; // error code
                w.string()?; // error message
                w.tagged_fields()
            })?;
        }
        ApiKey::DeleteRecords => {
            w.int32()?; // throttle time
            w.array(|w| {
                w.string()?; // topic name
                w.array(|w| {
                    w.int32()?; // partition index
                    w.int64()?; // low watermark
                    w.int16()?; // error code
                    w.tagged_fields()
                })?;
                w.tagged_fields()
            })?;
        }
        ApiKey::DescribeConfigs => {
            w.int32()?; // throttle time
            w.array(|w| {
                w.int16()?; // error code
                w.string()?; // error message
                w.int8()?; // resource type
                w.string()?; // resource name
                w.array(|w| {
                    w.string()?; // name
                    w.string()?; // value
                    w.int8()?; // read only
                    w.int8()?; // source
                    w.int8()?; // is sensitive
                    w.array(|w| {
                        w.string()?; // synonym name
                        w.string()?; // its value
                        w.int8()?; // its source
                        w.tagged_fields()
                    })?;
                    if v >= 3 {
                        w.int8()?; // config type
                        w.string()?; // documentation
                    }
                    w.tagged_fields()
                })?;
                w.tagged_fields()
            })?;
        }
        ApiKey::IncrementalAlterConfigs => {
            w.int32()?; // throttle time
            w.array(|w| {
                w.int16()?; // error code
                w.string()?; // error message
                w.int8()?; // resource type
                w.string()?; // resource name
                w.tagged_fields()
            })?;
        }
        ApiKey::DescribeLogDirs => {
            w.int32()?; // throttle time
            if v >= 3 {
                w.int16()?; // error code
            }
            w.array(|w| {
                w.int16()?; // error code
                w.string()?; // log dir
                w.array(|w| {
                    w.string()?; // topic name
                    w.array(|w| {
                        w.int32()?; // partition index
                        w.int64()?; // size
                        w.int64()?; // offset lag
                        w.int8()?; // is future
                        w.tagged_fields()
                    })?;
                    w.tagged_fields()
                })?;
                if v >= 4 {
                    w.int64()?; // total bytes
                    w.int64()?; // usable bytes
                }
                w.tagged_fields()
            })?;
        }
        ApiKey::AlterPartitionReassignments => {
            w.int32()?; // throttle time
            w.int16()?; // error code
            w.string()?; // error message
            w.array(|w| {
                w.string()?; // topic name
                w.array(|w| {
                    w.int32()?; // partition index
                    w.int16()?; // error code
                    w.string()?; // error message
                    w.tagged_fields()
                })?;
                w.tagged_fields()
            })?;
        }
        ApiKey::ListPartitionReassignments => {
            w.int32()?; // throttle time
            w.int16()?; // error code
            w.string()?; // error message
            w.array(|w| {
                w.string()?; // topic name
                w.array(|w| {
                    w.int32()?; // partition index
                    w.array(Walker::int32)?; // replicas
                    w.array(Walker::int32)?; // adding
                    w.array(Walker::int32)?; // removing
                    w.tagged_fields()
                })?;
                w.tagged_fields()
            })?;
        }
        ApiKey::DescribeClientQuotas => {
            w.int32()?; // throttle time
            w.int16()?; // error code
            w.string()?; // error message
            w.array(|w| {
                quota_entity(w)?;
                w.array(|w| {
                    w.string()?; // key
                    w.int64()?; // value (float64)
                    w.tagged_fields()
                })?;
                w.tagged_fields()
            })?;
        }
        ApiKey::AlterClientQuotas => {
            w.int32()?; // throttle time
            w.array(|w| {
                w.int16()?; // error code
                w.string()?; // error message
                quota_entity(w)?;
                w.tagged_fields()
            })?;
        }
        ApiKey::DescribeAcls => {
            w.int32()?; // throttle time
            w.int16()?; // error code
            w.string()?; // error message
            w.array(|w| {
                w.int8()?; // resource type
                w.string()?; // resource name
                w.int8()?; // pattern type
                w.array(|w| {
                    w.string()?; // principal
                    w.string()?; // host
                    w.int8()?; // operation
                    w.int8()?; // permission
                    w.tagged_fields()
                })?;
                w.tagged_fields()
            })?;
        }
        ApiKey::DeleteAcls => {
            w.int32()?; // throttle time
            w.array(|w| {
                w.int16()?; // error code
                w.string()?; // error message
                w.array(|w| {
                    w.int16()?; // error code
                    w.string()?; // error message
                    w.int8()?; // resource type
                    w.string()?; // resource name
                    w.int8()?; // pattern type
                    w.string()?; // principal
                    w.string()?; // host
                    w.int8()?; // operation
                    w.int8()?; // permission
                    w.tagged_fields()
                })?;
                w.tagged_fields()
            })?;
        }
        ApiKey::DescribeUserScramCredentials => {
            w.int32()?; // throttle time
            w.int16()?; // error code
            w.string()?; // error message
            w.array(|w| {
                w.string()?; // user
                w.int16()?; // error code
                w.string()?; // error message
                w.array(|w| {
                    w.int8()?; // mechanism
                    w.int32()?; // iterations
                    w.tagged_fields()
                })?;
                w.tagged_fields()
            })?;
        }
        ApiKey::AlterUserScramCredentials => {
            w.int32()?; // throttle time
            w.array(|w| {
                w.string()?; // user
                w.int16()?; // error code
                w.string()?; // error message
                w.tagged_fields()
            })?;
        }
        ApiKey::SaslHandshake => {
            w.int16()?; // error code
            w.array(Walker::string)?; // enabled mechanisms
        }
        ApiKey::SaslAuthenticate => {
            w.int16()?; // error code
            w.string()?; // error message
            w.bytes()?; // auth bytes
            if v >= 1 {
                w.int64()?; // session lifetime
            }
        }
        _ => unreachable!("every api in WALKED has a walk above"),
    }
    w.tagged_fields()?;
    Ok(walker)
}

/// A client quota entity: its (type, name) parts.
fn quota_entity(w: &mut Walker<'_>) -> Walk {
    w.array(|w| {
        w.string()?; // entity type
        w.string()?; // entity name
        w.tagged_fields()
    })
}

#[cfg(test)]
mod tests;
