//! The schemas of the answers a Kafka broker sends, walked before a codec decodes them.
//!
//! Why: `kafka-protocol` decodes an array by reading its count and calling
//! `Vec::with_capacity(count)` before reading any element, and a failed allocation aborts
//! the process. One answer of a few bytes claiming two billion elements, from a hostile
//! or broken broker (or anyone in the middle of a plaintext link), would take down the
//! mirror, the gateway or the CLI, whatever else they were doing, and, on a broker's own
//! connections to its peers (replica fetchers, transaction markers, produce
//! verification), the broker itself and every partition it leads. Kafka's Java clients
//! refuse such an answer instead ("Tried to allocate a collection of size N, but there
//! are only M bytes remaining"); so does this walk, with the [`crate::walk`] primitives
//! (which the broker's own request guard uses too), for every API the client and the
//! broker's peer connections send, at every version they may send it: for the client,
//! from the codec crate's lowest version up to the highest the client asks for (the
//! client sends the lower of that and the broker's maximum, and a broker may advertise
//! anything). The walk starts after the response header.
//!
//! The schemas mirror the codec crate's generated decoders; the tests walk answers that
//! the crate itself encoded, populated, at every version listed in [`WALKED`], so a
//! mismatch shows. Neither side asks a version above the walked ones ([`highest_walked`]);
//! an answer at a version without a walk is refused, not decoded unchecked. This crate
//! does not depend on the codec crate (only its tests do), so APIs are named by their
//! numeric keys.

use crate::walk::{Walk, Walker};

/// The numeric keys of the APIs walked here, as Kafka numbers them.
mod key {
    pub(super) const PRODUCE: i16 = 0;
    pub(super) const FETCH: i16 = 1;
    pub(super) const LIST_OFFSETS: i16 = 2;
    pub(super) const METADATA: i16 = 3;
    pub(super) const OFFSET_COMMIT: i16 = 8;
    pub(super) const OFFSET_FETCH: i16 = 9;
    pub(super) const FIND_COORDINATOR: i16 = 10;
    pub(super) const JOIN_GROUP: i16 = 11;
    pub(super) const HEARTBEAT: i16 = 12;
    pub(super) const LEAVE_GROUP: i16 = 13;
    pub(super) const SYNC_GROUP: i16 = 14;
    pub(super) const DESCRIBE_GROUPS: i16 = 15;
    pub(super) const LIST_GROUPS: i16 = 16;
    pub(super) const SASL_HANDSHAKE: i16 = 17;
    pub(super) const API_VERSIONS: i16 = 18;
    pub(super) const CREATE_TOPICS: i16 = 19;
    pub(super) const DELETE_TOPICS: i16 = 20;
    pub(super) const DELETE_RECORDS: i16 = 21;
    pub(super) const INIT_PRODUCER_ID: i16 = 22;
    pub(super) const OFFSET_FOR_LEADER_EPOCH: i16 = 23;
    pub(super) const ADD_PARTITIONS_TO_TXN: i16 = 24;
    pub(super) const ADD_OFFSETS_TO_TXN: i16 = 25;
    pub(super) const END_TXN: i16 = 26;
    pub(super) const WRITE_TXN_MARKERS: i16 = 27;
    pub(super) const TXN_OFFSET_COMMIT: i16 = 28;
    pub(super) const DESCRIBE_ACLS: i16 = 29;
    pub(super) const CREATE_ACLS: i16 = 30;
    pub(super) const DELETE_ACLS: i16 = 31;
    pub(super) const DESCRIBE_CONFIGS: i16 = 32;
    pub(super) const ALTER_REPLICA_LOG_DIRS: i16 = 34;
    pub(super) const DESCRIBE_LOG_DIRS: i16 = 35;
    pub(super) const SASL_AUTHENTICATE: i16 = 36;
    pub(super) const CREATE_PARTITIONS: i16 = 37;
    pub(super) const INCREMENTAL_ALTER_CONFIGS: i16 = 44;
    pub(super) const ALTER_PARTITION_REASSIGNMENTS: i16 = 45;
    pub(super) const LIST_PARTITION_REASSIGNMENTS: i16 = 46;
    pub(super) const DESCRIBE_CLIENT_QUOTAS: i16 = 48;
    pub(super) const ALTER_CLIENT_QUOTAS: i16 = 49;
    pub(super) const DESCRIBE_USER_SCRAM_CREDENTIALS: i16 = 50;
    pub(super) const ALTER_USER_SCRAM_CREDENTIALS: i16 = 51;
    pub(super) const DESCRIBE_PRODUCERS: i16 = 61;
    pub(super) const DESCRIBE_TRANSACTIONS: i16 = 65;
    pub(super) const LIST_TRANSACTIONS: i16 = 66;
}

/// The most array elements and tagged fields one answer may hold. The bytes-left check
/// alone bounds an answer's elements by its size, up to the 1 GiB frame the connection
/// accepts, while each element costs 4 (a replica id) to ~150 bytes (a struct with its
/// tag map) once decoded. A Metadata answer takes about 7 elements per partition at
/// replication factor 3 (the partition, its replicas, its in-sync replicas), so 8 million
/// lets through the full metadata of a cluster of a million partitions; a Fetch answer is
/// bounded by `fetch.max.bytes` and holds far fewer. A hostile answer then decodes to
/// ~1 GiB at most, the order of the frame it came in, instead of 150 times that.
pub const MAX_RESPONSE_ELEMENTS: u64 = 8_000_000;

/// The answers walked, as (api key, lowest version, highest version): each API the
/// client sends, from the codec crate's lowest version up to the highest the client asks
/// for (`Connection::request`'s `preferred`, the consumer's `FETCH_VERSION`, the
/// producer's `PRODUCE_VERSION`, the SASL exchange's v1); and the answers the broker
/// receives from its peers (a follower's OffsetForLeaderEpoch and Fetch, the markers'
/// WriteTxnMarkers, the broker-to-broker AddPartitionsToTxn of a produce's verification,
/// SASL v1).
pub const WALKED: &[(i16, i16, i16)] = &[
    (key::API_VERSIONS, 0, 0), // the connection asks v0 only: the one layout every broker answers
    (key::METADATA, 0, 12),
    (key::PRODUCE, 3, 9),
    (key::FETCH, 4, 12),
    (key::LIST_OFFSETS, 1, 7),
    (key::FIND_COORDINATOR, 0, 3),
    (key::JOIN_GROUP, 0, 7),
    (key::SYNC_GROUP, 0, 5),
    (key::HEARTBEAT, 0, 4),
    (key::LEAVE_GROUP, 0, 4),
    (key::OFFSET_COMMIT, 2, 8),
    (key::OFFSET_FETCH, 1, 7),
    (key::LIST_GROUPS, 0, 4),
    (key::DESCRIBE_GROUPS, 0, 5),
    (key::INIT_PRODUCER_ID, 0, 4),
    // v4 and v5 are the broker-to-broker form (results by transaction), which the broker
    // sends when it verifies a transactional produce; the client asks v3 at most.
    (key::ADD_PARTITIONS_TO_TXN, 0, 5),
    (key::ADD_OFFSETS_TO_TXN, 0, 3),
    (key::END_TXN, 0, 3),
    (key::TXN_OFFSET_COMMIT, 0, 3),
    (key::WRITE_TXN_MARKERS, 1, 1),
    (key::DESCRIBE_TRANSACTIONS, 0, 0),
    (key::LIST_TRANSACTIONS, 0, 0),
    (key::DESCRIBE_PRODUCERS, 0, 0),
    (key::CREATE_TOPICS, 2, 7),
    (key::DELETE_TOPICS, 1, 6),
    (key::CREATE_PARTITIONS, 0, 3),
    (key::DELETE_RECORDS, 0, 2),
    (key::DESCRIBE_CONFIGS, 1, 4),
    (key::INCREMENTAL_ALTER_CONFIGS, 0, 1),
    (key::DESCRIBE_LOG_DIRS, 1, 4),
    (key::ALTER_REPLICA_LOG_DIRS, 1, 2),
    (key::ALTER_PARTITION_REASSIGNMENTS, 0, 0),
    (key::LIST_PARTITION_REASSIGNMENTS, 0, 0),
    (key::DESCRIBE_CLIENT_QUOTAS, 0, 1),
    (key::ALTER_CLIENT_QUOTAS, 0, 1),
    (key::CREATE_ACLS, 1, 3),
    (key::DESCRIBE_ACLS, 1, 3),
    (key::DELETE_ACLS, 1, 3),
    (key::DESCRIBE_USER_SCRAM_CREDENTIALS, 0, 0),
    (key::ALTER_USER_SCRAM_CREDENTIALS, 0, 0),
    (key::SASL_HANDSHAKE, 0, 1),
    (key::SASL_AUTHENTICATE, 0, 1),
    (key::OFFSET_FOR_LEADER_EPOCH, 2, 4), // the broker's followers only
];

/// The highest version of API `api` whose answer is walked (`None`: no walk at all).
/// The client's `Connection::version` never picks a higher one, so a version raised at
/// a call site without its walk here stays at the last walked version instead of being
/// refused; the broker's peer calls are checked against it by a test.
pub fn highest_walked(api: i16) -> Option<i16> {
    WALKED.iter().filter(|&&(walked, _, _)| walked == api).map(|&(_, _, max)| max).max()
}

/// Walks the body (after the response header) of an answer to a request of API `api` at
/// version `v`, with an element limit of `max_elements`: `Ok` means decoding it allocates
/// no more than its bytes justify. On success, the walker at the end of the body (what is
/// left of it, how many elements it held); bytes after the walked body are left to the
/// caller, as the decoder leaves them. An API or version without a walk is refused.
pub fn walk_answer(api: i16, v: i16, body: &[u8], max_elements: u64) -> Walk<Walker<'_>> {
    if !WALKED.iter().any(|&(walked, _, _)| walked == api) {
        return Err("no walk for this API");
    }
    if !WALKED.iter().any(|&(walked, min, max)| walked == api && (min..=max).contains(&v)) {
        return Err("no walk for this API version");
    }
    let flexible = match api {
        key::API_VERSIONS => v >= 3,
        key::METADATA => v >= 9,
        key::PRODUCE => v >= 9,
        key::FETCH => v >= 12,
        key::LIST_OFFSETS => v >= 6,
        key::FIND_COORDINATOR => v >= 3,
        key::JOIN_GROUP => v >= 6,
        key::SYNC_GROUP | key::HEARTBEAT | key::LEAVE_GROUP => v >= 4,
        key::OFFSET_COMMIT => v >= 8,
        key::OFFSET_FETCH => v >= 6,
        key::LIST_GROUPS => v >= 3,
        key::DESCRIBE_GROUPS => v >= 5,
        key::INIT_PRODUCER_ID => v >= 2,
        key::OFFSET_FOR_LEADER_EPOCH => v >= 4,
        key::ADD_PARTITIONS_TO_TXN | key::ADD_OFFSETS_TO_TXN | key::END_TXN | key::TXN_OFFSET_COMMIT => v >= 3,
        key::WRITE_TXN_MARKERS => v >= 1,
        key::DESCRIBE_TRANSACTIONS | key::LIST_TRANSACTIONS | key::DESCRIBE_PRODUCERS => true,
        key::CREATE_TOPICS => v >= 5,
        key::DELETE_TOPICS => v >= 4,
        key::CREATE_PARTITIONS | key::DELETE_RECORDS => v >= 2,
        key::DESCRIBE_CONFIGS => v >= 4,
        key::INCREMENTAL_ALTER_CONFIGS => v >= 1,
        key::DESCRIBE_LOG_DIRS | key::ALTER_REPLICA_LOG_DIRS => v >= 2,
        key::ALTER_PARTITION_REASSIGNMENTS | key::LIST_PARTITION_REASSIGNMENTS => true,
        key::DESCRIBE_CLIENT_QUOTAS | key::ALTER_CLIENT_QUOTAS => v >= 1,
        key::CREATE_ACLS | key::DESCRIBE_ACLS | key::DELETE_ACLS => v >= 2,
        key::DESCRIBE_USER_SCRAM_CREDENTIALS | key::ALTER_USER_SCRAM_CREDENTIALS => true,
        key::SASL_HANDSHAKE => false,
        key::SASL_AUTHENTICATE => v >= 2,
        _ => unreachable!("every api in WALKED has its flexible versions listed"),
    };
    let mut walker = Walker::new(body, flexible, max_elements);
    let w = &mut walker;
    match api {
        key::API_VERSIONS => {
            w.int16()?; // error code
            w.array(|w| {
                w.int16()?; // api key
                w.int16()?; // min version
                w.int16() // max version
            })?;
        }
        key::METADATA => {
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
        key::PRODUCE => {
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
        key::FETCH => {
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
        key::LIST_OFFSETS => {
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
        key::FIND_COORDINATOR => {
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
        key::JOIN_GROUP => {
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
        key::SYNC_GROUP => {
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
        key::HEARTBEAT | key::ADD_OFFSETS_TO_TXN | key::END_TXN => {
            // Heartbeat's throttle time came in v1, the others always had one.
            if api != key::HEARTBEAT || v >= 1 {
                w.int32()?; // throttle time
            }
            w.int16()?; // error code
        }
        key::LEAVE_GROUP => {
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
        key::ADD_PARTITIONS_TO_TXN if v >= 4 => {
            // The broker-to-broker form: an error code, then results by transaction.
            w.int32()?; // throttle time
            w.int16()?; // error code
            w.array(|w| {
                w.string()?; // transactional id
                topic_partition_errors(w)?;
                w.tagged_fields()
            })?;
        }
        key::OFFSET_FOR_LEADER_EPOCH => {
            w.int32()?; // throttle time
            w.array(|w| {
                w.string()?; // topic name
                w.array(|w| {
                    w.int16()?; // error code
                    w.int32()?; // partition index
                    w.int32()?; // leader epoch
                    w.int64()?; // end offset
                    w.tagged_fields()
                })?;
                w.tagged_fields()
            })?;
        }
        key::OFFSET_COMMIT | key::ADD_PARTITIONS_TO_TXN | key::TXN_OFFSET_COMMIT | key::ALTER_REPLICA_LOG_DIRS => {
            // Topics, each with partitions of (index, error code); OffsetCommit's throttle
            // time came in v3, the others always had one.
            if api != key::OFFSET_COMMIT || v >= 3 {
                w.int32()?; // throttle time
            }
            topic_partition_errors(w)?;
        }
        key::OFFSET_FETCH => {
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
        key::LIST_GROUPS => {
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
        key::DESCRIBE_GROUPS => {
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
        key::INIT_PRODUCER_ID => {
            w.int32()?; // throttle time
            w.int16()?; // error code
            w.int64()?; // producer id
            w.int16()?; // producer epoch
        }
        key::WRITE_TXN_MARKERS => {
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
        key::DESCRIBE_TRANSACTIONS => {
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
        key::LIST_TRANSACTIONS => {
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
        key::DESCRIBE_PRODUCERS => {
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
        key::CREATE_TOPICS => {
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
        key::DELETE_TOPICS => {
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
        key::CREATE_PARTITIONS | key::CREATE_ACLS => {
            w.int32()?; // throttle time
            w.array(|w| {
                if api == key::CREATE_PARTITIONS {
                    w.string()?; // topic name
                }
                w.int16()?; // error code
                w.string()?; // error message
                w.tagged_fields()
            })?;
        }
        key::DELETE_RECORDS => {
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
        key::DESCRIBE_CONFIGS => {
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
        key::INCREMENTAL_ALTER_CONFIGS => {
            w.int32()?; // throttle time
            w.array(|w| {
                w.int16()?; // error code
                w.string()?; // error message
                w.int8()?; // resource type
                w.string()?; // resource name
                w.tagged_fields()
            })?;
        }
        key::DESCRIBE_LOG_DIRS => {
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
        key::ALTER_PARTITION_REASSIGNMENTS => {
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
        key::LIST_PARTITION_REASSIGNMENTS => {
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
        key::DESCRIBE_CLIENT_QUOTAS => {
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
        key::ALTER_CLIENT_QUOTAS => {
            w.int32()?; // throttle time
            w.array(|w| {
                w.int16()?; // error code
                w.string()?; // error message
                quota_entity(w)?;
                w.tagged_fields()
            })?;
        }
        key::DESCRIBE_ACLS => {
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
        key::DELETE_ACLS => {
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
        key::DESCRIBE_USER_SCRAM_CREDENTIALS => {
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
        key::ALTER_USER_SCRAM_CREDENTIALS => {
            w.int32()?; // throttle time
            w.array(|w| {
                w.string()?; // user
                w.int16()?; // error code
                w.string()?; // error message
                w.tagged_fields()
            })?;
        }
        key::SASL_HANDSHAKE => {
            w.int16()?; // error code
            w.array(Walker::string)?; // enabled mechanisms
        }
        key::SASL_AUTHENTICATE => {
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

/// Topics, each with partitions of (index, error code).
fn topic_partition_errors(w: &mut Walker<'_>) -> Walk {
    w.array(|w| {
        w.string()?; // topic name
        w.array(|w| {
            w.int32()?; // partition index
            w.int16()?; // error code
            w.tagged_fields()
        })?;
        w.tagged_fields()
    })
}

#[cfg(test)]
mod tests;
