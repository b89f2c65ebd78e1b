//! A structural walk over a request body before the codec crate decodes it (the walking
//! primitives are `fjord_record::walk`, shared with the client's walk over answers).
//!
//! Why: `kafka-protocol` 0.18 decodes an array by reading its count and calling
//! `Vec::with_capacity(count)` before reading any element. A frame of a few bytes that
//! claims two billion elements makes that allocation fail, and a failed allocation
//! aborts the process: one client could take the broker down. This walk follows the
//! same schemas (for exactly the API versions the broker advertises) without
//! allocating, and refuses any array longer than the bytes left in the frame, since
//! every element takes at least one byte. A body that passes is safe to decode.
//!
//! The schemas mirror the codec crate's generated decoders; the tests walk requests
//! that the crate itself encoded, for every advertised version, so a mismatch shows.

use fjord_record::walk::{Walk, Walker};
use kafka_protocol::messages::ApiKey;

/// The most array elements and tagged fields one request may hold. Each becomes a
/// value of ~100 bytes once decoded, and about as much again in the answer: a Metadata
/// request of 10 million empty topic names (a 19 MiB frame) made the broker take 2.1 GiB
/// and 7 s of CPU. A million (a Fetch of every partition of a very large cluster fits)
/// keeps one request to ~250 MiB; `queued.max.request.bytes` bounds how many such run
/// at once (`crate::request_memory`).
pub(crate) const MAX_REQUEST_ELEMENTS: u64 = 1_000_000;

/// Walks the body (after the header) of a request of an advertised API and version.
/// `Err` says why the body is malformed or too large; `Ok` means decoding it allocates no
/// more than the frame's size justifies, and holds how many array elements and tagged
/// fields it has (what its decoded form costs, see `crate::request_memory`).
pub(crate) fn check_body(api_key: ApiKey, v: i16, body: &[u8]) -> Walk<u64> {
    let flexible = match api_key {
        ApiKey::Produce => v >= 9,
        ApiKey::Fetch => v >= 12,
        ApiKey::ListOffsets => v >= 6,
        ApiKey::OffsetForLeaderEpoch => v >= 4,
        ApiKey::Metadata => v >= 9,
        ApiKey::ApiVersions => v >= 3,
        ApiKey::CreateTopics => v >= 5,
        ApiKey::DeleteTopics => v >= 4,
        ApiKey::DescribeConfigs => v >= 4,
        ApiKey::AlterConfigs => v >= 2,
        ApiKey::IncrementalAlterConfigs => v >= 1,
        ApiKey::FindCoordinator => v >= 3,
        ApiKey::JoinGroup => v >= 6,
        ApiKey::SyncGroup => v >= 4,
        ApiKey::Heartbeat => v >= 4,
        ApiKey::LeaveGroup => v >= 4,
        ApiKey::OffsetCommit => v >= 8,
        ApiKey::OffsetFetch => v >= 6,
        ApiKey::ListGroups => v >= 3,
        ApiKey::DescribeGroups => v >= 5,
        ApiKey::DeleteGroups => v >= 2,
        ApiKey::OffsetDelete => false,
        ApiKey::DescribeProducers => true,
        ApiKey::DescribeLogDirs => v >= 2,
        ApiKey::AlterReplicaLogDirs => v >= 2,
        ApiKey::DescribeTopicPartitions => true,
        ApiKey::ListConfigResources => true,
        ApiKey::UpdateFeatures => true,
        ApiKey::InitProducerId => v >= 2,
        ApiKey::ElectLeaders => v >= 2,
        ApiKey::CreateAcls | ApiKey::DescribeAcls | ApiKey::DeleteAcls => v >= 2,
        ApiKey::DescribeUserScramCredentials | ApiKey::AlterUserScramCredentials => true,
        ApiKey::SaslHandshake => false,
        ApiKey::SaslAuthenticate => v >= 2,
        ApiKey::DescribeCluster => true,
        ApiKey::CreatePartitions | ApiKey::DeleteRecords => v >= 2,
        ApiKey::AlterPartitionReassignments | ApiKey::ListPartitionReassignments => true,
        ApiKey::AddPartitionsToTxn | ApiKey::AddOffsetsToTxn | ApiKey::EndTxn | ApiKey::TxnOffsetCommit => v >= 3,
        ApiKey::DescribeTransactions | ApiKey::ListTransactions => true,
        ApiKey::WriteTxnMarkers => v >= 1,
        ApiKey::DescribeClientQuotas | ApiKey::AlterClientQuotas => v >= 1,
        _ => return Err("no schema for this api"),
    };
    let w = &mut Walker::new(body, flexible, MAX_REQUEST_ELEMENTS);
    match api_key {
        ApiKey::Produce => {
            w.string()?; // transactional id
            w.int16()?;
            w.int32()?;
            w.array(|w| {
                w.string()?;
                w.array(|w| {
                    w.int32()?;
                    w.bytes()?;
                    w.tagged_fields()
                })?;
                w.tagged_fields()
            })?;
        }
        ApiKey::Fetch => {
            w.int32()?; // replica id
            w.int32()?;
            w.int32()?;
            w.int32()?; // max bytes
            w.int8()?; // isolation level
            if v >= 7 {
                w.int32()?;
                w.int32()?;
            }
            w.array(|w| {
                if v >= 13 {
                    w.uuid()?; // topic id
                } else {
                    w.string()?;
                }
                w.array(|w| {
                    w.int32()?;
                    if v >= 9 {
                        w.int32()?; // current leader epoch
                    }
                    w.int64()?;
                    if v >= 12 {
                        w.int32()?; // last fetched epoch
                    }
                    if v >= 5 {
                        w.int64()?; // log start offset
                    }
                    w.int32()?;
                    w.tagged_fields()
                })?;
                w.tagged_fields()
            })?;
            if v >= 7 {
                w.array(|w| {
                    if v >= 13 {
                        w.uuid()?;
                    } else {
                        w.string()?;
                    }
                    w.array(Walker::int32)?;
                    w.tagged_fields()
                })?;
            }
            if v >= 11 {
                w.string()?; // rack id
            }
        }
        ApiKey::ListOffsets => {
            w.int32()?;
            if v >= 2 {
                w.int8()?;
            }
            w.array(|w| {
                w.string()?;
                w.array(|w| {
                    w.int32()?;
                    if v >= 4 {
                        w.int32()?;
                    }
                    w.int64()?;
                    w.tagged_fields()
                })?;
                w.tagged_fields()
            })?;
        }
        ApiKey::Metadata => {
            w.array(|w| {
                if v >= 10 {
                    w.uuid()?;
                }
                w.string()?;
                w.tagged_fields()
            })?;
            if v >= 4 {
                w.int8()?; // allow auto topic creation (boolean)
            }
            if (8..=10).contains(&v) {
                w.int8()?;
            }
            if v >= 8 {
                w.int8()?;
            }
        }
        ApiKey::ApiVersions => {
            if v >= 3 {
                w.string()?;
                w.string()?;
            }
        }
        ApiKey::CreateTopics => {
            w.array(|w| {
                w.string()?;
                w.int32()?;
                w.int16()?;
                w.array(|w| {
                    w.int32()?;
                    w.array(Walker::int32)?;
                    w.tagged_fields()
                })?;
                w.array(|w| {
                    w.string()?;
                    w.string()?;
                    w.tagged_fields()
                })?;
                w.tagged_fields()
            })?;
            w.int32()?;
            w.int8()?; // validate only (boolean)
        }
        ApiKey::DeleteTopics => {
            if v >= 6 {
                w.array(|w| {
                    w.string()?;
                    w.uuid()?;
                    w.tagged_fields()
                })?;
            } else {
                w.array(Walker::string)?;
            }
            w.int32()?;
        }
        ApiKey::DescribeConfigs => {
            w.array(|w| {
                w.int8()?;
                w.string()?;
                w.array(Walker::string)?;
                w.tagged_fields()
            })?;
            w.int8()?; // include synonyms
            if v >= 3 {
                w.int8()?;
            }
        }
        ApiKey::AlterConfigs | ApiKey::IncrementalAlterConfigs => {
            let incremental = api_key == ApiKey::IncrementalAlterConfigs;
            w.array(|w| {
                w.int8()?; // resource type
                w.string()?; // resource name
                w.array(|w| {
                    w.string()?; // name
                    if incremental {
                        w.int8()?; // operation
                    }
                    w.string()?; // value (nullable)
                    w.tagged_fields()
                })?;
                w.tagged_fields()
            })?;
            w.int8()?; // validate only
        }
        ApiKey::FindCoordinator => {
            if v <= 3 {
                w.string()?; // key
            }
            if v >= 1 {
                w.int8()?; // key type
            }
            if v >= 4 {
                w.array(Walker::string)?; // coordinator keys
            }
        }
        ApiKey::JoinGroup => {
            w.string()?; // group id
            w.int32()?; // session timeout
            if v >= 1 {
                w.int32()?; // rebalance timeout
            }
            w.string()?; // member id
            if v >= 5 {
                w.string()?; // group instance id
            }
            w.string()?; // protocol type
            w.array(|w| {
                w.string()?;
                w.bytes()?;
                w.tagged_fields()
            })?;
            if v >= 8 {
                w.string()?; // reason
            }
        }
        ApiKey::SyncGroup => {
            w.string()?;
            w.int32()?;
            w.string()?;
            if v >= 3 {
                w.string()?;
            }
            if v >= 5 {
                w.string()?; // protocol type
                w.string()?; // protocol name
            }
            w.array(|w| {
                w.string()?;
                w.bytes()?;
                w.tagged_fields()
            })?;
        }
        ApiKey::Heartbeat => {
            w.string()?;
            w.int32()?;
            w.string()?;
            if v >= 3 {
                w.string()?;
            }
        }
        ApiKey::LeaveGroup => {
            w.string()?;
            if v <= 2 {
                w.string()?;
            } else {
                w.array(|w| {
                    w.string()?;
                    w.string()?;
                    if v >= 5 {
                        w.string()?; // reason
                    }
                    w.tagged_fields()
                })?;
            }
        }
        ApiKey::OffsetCommit => {
            w.string()?;
            w.int32()?; // generation id or member epoch
            w.string()?; // member id
            if v >= 7 {
                w.string()?; // group instance id
            }
            if (2..=4).contains(&v) {
                w.int64()?; // retention time
            }
            w.array(|w| {
                w.string()?;
                w.array(|w| {
                    w.int32()?;
                    w.int64()?;
                    if v >= 6 {
                        w.int32()?; // committed leader epoch
                    }
                    w.string()?; // metadata
                    w.tagged_fields()
                })?;
                w.tagged_fields()
            })?;
        }
        ApiKey::OffsetFetch => {
            let topics = |w: &mut Walker<'_>| {
                w.array(|w| {
                    w.string()?;
                    w.array(Walker::int32)?;
                    w.tagged_fields()
                })
            };
            if v <= 7 {
                w.string()?;
                topics(w)?;
            } else {
                w.array(|w| {
                    w.string()?;
                    if v >= 9 {
                        w.string()?; // member id
                        w.int32()?; // member epoch
                    }
                    topics(w)?;
                    w.tagged_fields()
                })?;
            }
            if v >= 7 {
                w.int8()?; // require stable
            }
        }
        ApiKey::ListGroups => {
            if v >= 4 {
                w.array(Walker::string)?;
            }
            if v >= 5 {
                w.array(Walker::string)?;
            }
        }
        ApiKey::DescribeGroups => {
            w.array(Walker::string)?;
            if v >= 3 {
                w.int8()?;
            }
        }
        ApiKey::DeleteGroups => {
            w.array(Walker::string)?;
        }
        ApiKey::InitProducerId => {
            w.string()?; // transactional id
            w.int32()?; // transaction timeout
            if v >= 3 {
                w.int64()?; // producer id
                w.int16()?; // producer epoch
            }
        }
        ApiKey::OffsetForLeaderEpoch => {
            if v >= 3 {
                w.int32()?; // replica id
            }
            w.array(|w| {
                w.string()?;
                w.array(|w| {
                    w.int32()?;
                    if v >= 2 {
                        w.int32()?; // current leader epoch
                    }
                    w.int32()?; // leader epoch
                    w.tagged_fields()
                })?;
                w.tagged_fields()
            })?;
        }
        ApiKey::WriteTxnMarkers => {
            w.array(|w| {
                w.int64()?; // producer id
                w.int16()?; // producer epoch
                w.int8()?; // transaction result
                w.array(|w| {
                    w.string()?; // name
                    w.array(Walker::int32)?; // partition indexes
                    w.tagged_fields()
                })?;
                w.int32()?; // coordinator epoch
                w.tagged_fields()
            })?;
        }
        ApiKey::DescribeProducers => {
            w.array(|w| {
                w.string()?; // name
                w.array(Walker::int32)?; // partition indexes
                w.tagged_fields()
            })?;
        }
        ApiKey::AlterReplicaLogDirs => {
            w.array(|w| {
                w.string()?; // path
                w.array(|w| {
                    w.string()?; // topic
                    w.array(Walker::int32)?; // partitions
                    w.tagged_fields()
                })?;
                w.tagged_fields()
            })?;
        }
        ApiKey::DescribeLogDirs => {
            w.array(|w| {
                w.string()?; // topic
                w.array(Walker::int32)?; // partitions
                w.tagged_fields()
            })?;
        }
        ApiKey::DescribeTopicPartitions => {
            w.array(|w| {
                w.string()?; // topic
                w.tagged_fields()
            })?;
            w.int32()?; // response partition limit
                        // The cursor, a nullable struct: its marker byte is 1 when present.
            if w.byte()? == 1 {
                w.string()?; // topic
                w.int32()?; // partition
                w.tagged_fields()?;
            }
        }
        ApiKey::ListConfigResources => {
            if v >= 1 {
                w.array(Walker::int8)?; // resource types
            }
        }
        ApiKey::UpdateFeatures => {
            w.int32()?; // timeout
            w.array(|w| {
                w.string()?; // feature
                w.int16()?; // max version level
                w.int8()?; // v0: allow downgrade (boolean); v1+: upgrade type
                w.tagged_fields()
            })?;
            if v >= 1 {
                w.int8()?; // validate only
            }
        }
        ApiKey::OffsetDelete => {
            w.string()?; // group id
            w.array(|w| {
                w.string()?; // name
                w.array(Walker::int32) // partition indexes
            })?;
        }
        ApiKey::DeleteRecords => {
            w.array(|w| {
                w.string()?; // name
                w.array(|w| {
                    w.int32()?; // partition
                    w.int64()?; // offset
                    w.tagged_fields()
                })?;
                w.tagged_fields()
            })?;
            w.int32()?; // timeout
        }
        ApiKey::CreatePartitions => {
            w.array(|w| {
                w.string()?; // name
                w.int32()?; // count
                w.array(|w| {
                    w.array(Walker::int32)?; // broker ids
                    w.tagged_fields()
                })?; // assignments (nullable)
                w.tagged_fields()
            })?;
            w.int32()?; // timeout
            w.int8()?; // validate only
        }
        ApiKey::AlterPartitionReassignments => {
            w.int32()?; // timeout
            if v >= 1 {
                w.int8()?; // allow replication factor change
            }
            w.array(|w| {
                w.string()?; // name
                w.array(|w| {
                    w.int32()?; // partition index
                    w.array(Walker::int32)?; // replicas (null: cancel)
                    w.tagged_fields()
                })?;
                w.tagged_fields()
            })?;
        }
        ApiKey::ListPartitionReassignments => {
            w.int32()?; // timeout
            w.array(|w| {
                w.string()?; // name
                w.array(Walker::int32)?; // partition indexes
                w.tagged_fields()
            })?; // topics (null: every one)
        }
        ApiKey::ElectLeaders => {
            if v >= 1 {
                w.int8()?; // election type
            }
            w.array(|w| {
                w.string()?;
                w.array(Walker::int32)?;
                w.tagged_fields()
            })?;
            w.int32()?; // timeout
        }
        ApiKey::CreateAcls => {
            w.array(|w| {
                w.int8()?; // resource type
                w.string()?; // resource name
                w.int8()?; // pattern type
                w.string()?; // principal
                w.string()?; // host
                w.int8()?; // operation
                w.int8()?; // permission
                w.tagged_fields()
            })?;
        }
        ApiKey::DescribeAcls => acl_filter(w)?,
        ApiKey::DeleteAcls => {
            w.array(|w| {
                acl_filter(w)?;
                w.tagged_fields()
            })?;
        }
        ApiKey::DescribeUserScramCredentials => {
            w.array(|w| {
                w.string()?;
                w.tagged_fields()
            })?;
        }
        ApiKey::AlterUserScramCredentials => {
            w.array(|w| {
                w.string()?; // name
                w.int8()?; // mechanism
                w.tagged_fields()
            })?;
            w.array(|w| {
                w.string()?; // name
                w.int8()?; // mechanism
                w.int32()?; // iterations
                w.bytes()?; // salt
                w.bytes()?; // salted password
                w.tagged_fields()
            })?;
        }
        ApiKey::SaslHandshake => w.string()?,   // mechanism
        ApiKey::SaslAuthenticate => w.bytes()?, // auth bytes
        ApiKey::DescribeCluster => {
            w.int8()?; // include cluster authorized operations
            if v >= 1 {
                w.int8()?; // endpoint type
            }
            if v >= 2 {
                w.int8()?; // include fenced brokers
            }
        }
        ApiKey::AddPartitionsToTxn if v >= 4 => {
            // KIP-890's batch: transactions, each with its partitions.
            w.array(|w| {
                w.string()?; // transactional id
                w.int64()?; // producer id
                w.int16()?; // producer epoch
                w.int8()?; // verify only
                w.array(|w| {
                    w.string()?;
                    w.array(Walker::int32)?;
                    w.tagged_fields()
                })?;
                w.tagged_fields()
            })?;
        }
        ApiKey::AddPartitionsToTxn => {
            w.string()?; // transactional id
            w.int64()?; // producer id
            w.int16()?; // producer epoch
            w.array(|w| {
                w.string()?;
                w.array(Walker::int32)?;
                w.tagged_fields()
            })?;
        }
        ApiKey::AddOffsetsToTxn => {
            w.string()?; // transactional id
            w.int64()?;
            w.int16()?;
            w.string()?; // group id
        }
        ApiKey::EndTxn => {
            w.string()?; // transactional id
            w.int64()?;
            w.int16()?;
            w.int8()?; // committed
        }
        ApiKey::TxnOffsetCommit => {
            w.string()?; // transactional id
            w.string()?; // group id
            w.int64()?;
            w.int16()?;
            if v >= 3 {
                w.int32()?; // generation id
                w.string()?; // member id
                w.string()?; // group instance id
            }
            w.array(|w| {
                w.string()?;
                w.array(|w| {
                    w.int32()?;
                    w.int64()?;
                    if v >= 2 {
                        w.int32()?; // committed leader epoch
                    }
                    w.string()?; // metadata
                    w.tagged_fields()
                })?;
                w.tagged_fields()
            })?;
        }
        ApiKey::DescribeTransactions => w.array(Walker::string)?,
        ApiKey::ListTransactions => {
            w.array(Walker::string)?; // state filters
            w.array(Walker::int64)?; // producer id filters
            if v >= 1 {
                w.int64()?; // duration filter
            }
        }
        ApiKey::DescribeClientQuotas => {
            w.array(|w| {
                w.string()?; // entity type
                w.int8()?; // match type
                w.string()?; // match (nullable)
                w.tagged_fields()
            })?;
            w.int8()?; // strict
        }
        ApiKey::AlterClientQuotas => {
            w.array(|w| {
                w.array(|w| {
                    w.string()?; // entity type
                    w.string()?; // entity name (nullable)
                    w.tagged_fields()
                })?;
                w.array(|w| {
                    w.string()?; // key
                    w.int64()?; // value (float64)
                    w.int8()?; // remove
                    w.tagged_fields()
                })?;
                w.tagged_fields()
            })?;
            w.int8()?; // validate only
        }
        _ => unreachable!("flexible versions are listed for every api walked above"),
    }
    w.tagged_fields()?;
    Ok(w.elements())
}

/// DescribeAcls' body and each DeleteAcls filter (v1+: the pattern type is always there).
fn acl_filter(w: &mut Walker<'_>) -> Walk {
    w.int8()?; // resource type
    w.string()?; // resource name (nullable)
    w.int8()?; // pattern type
    w.string()?; // principal (nullable)
    w.string()?; // host (nullable)
    w.int8()?; // operation
    w.int8() // permission
}

#[cfg(test)]
mod tests;
