//! The consumer protocol's metadata: a member's `ConsumerProtocolSubscription` (JoinGroup)
//! and its `ConsumerProtocolAssignment` (SyncGroup, DescribeGroups), each behind the
//! version prefix Kafka's clients write. Any version up to 3 is read.

use std::collections::{BTreeMap, BTreeSet};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition as AssignedTopic;
use kafka_protocol::messages::consumer_protocol_subscription::TopicPartition as OwnedTopic;
use kafka_protocol::messages::{ConsumerProtocolAssignment, ConsumerProtocolSubscription};
use kafka_protocol::protocol::{Decodable, Encodable};

use super::{s, topic_name};
use crate::assignor;
use crate::error::{Error, Result};
use fjord_record::TopicPartition;

/// Version of the consumer protocol metadata we write (v1 carries owned partitions,
/// which the sticky assignors need); any version up to 3 is read.
const CONSUMER_PROTOCOL_VERSION: i16 = 1;

/// `ConsumerProtocolSubscription` with its version prefix, as Kafka's clients write it.
pub(super) fn encode_subscription(topics: &[String], owned: &BTreeSet<TopicPartition>) -> Result<Bytes> {
    let mut per_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for tp in owned {
        per_topic.entry(&tp.topic).or_default().push(tp.partition);
    }
    let message =
        ConsumerProtocolSubscription::default().with_topics(topics.iter().map(|t| s(t)).collect()).with_owned_partitions(
            per_topic.into_iter().map(|(t, p)| OwnedTopic::default().with_topic(topic_name(t)).with_partitions(p)).collect(),
        );
    versioned(|buf| message.encode(buf, CONSUMER_PROTOCOL_VERSION))
}

pub(super) fn encode_assignment(partitions: &[assignor::Partition]) -> Result<Bytes> {
    let mut per_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for (t, p) in partitions {
        per_topic.entry(t).or_default().push(*p);
    }
    let message = ConsumerProtocolAssignment::default().with_assigned_partitions(
        per_topic.into_iter().map(|(t, p)| AssignedTopic::default().with_topic(topic_name(t)).with_partitions(p)).collect(),
    );
    versioned(|buf| message.encode(buf, CONSUMER_PROTOCOL_VERSION))
}

fn versioned(encode: impl FnOnce(&mut BytesMut) -> anyhow::Result<()>) -> Result<Bytes> {
    let mut buf = BytesMut::new();
    buf.put_i16(CONSUMER_PROTOCOL_VERSION);
    encode(&mut buf).map_err(|e| Error::InvalidConfig(format!("cannot encode consumer protocol metadata: {e}")))?;
    Ok(buf.freeze())
}

/// The version prefix, capped to what we decode (newer versions only append fields).
fn read_version(buf: &mut Bytes) -> std::result::Result<i16, String> {
    if buf.remaining() < 2 {
        return Err("shorter than its version prefix".into());
    }
    let version = buf.get_i16();
    if version < 0 {
        return Err(format!("negative version {version}"));
    }
    Ok(version.min(3))
}

/// Topics and owned partitions from a member's JoinGroup metadata.
pub(crate) fn decode_subscription(metadata: &Bytes) -> std::result::Result<(Vec<String>, Vec<assignor::Partition>), String> {
    let mut buf = metadata.clone();
    let version = read_version(&mut buf)?;
    let sub = ConsumerProtocolSubscription::decode(&mut buf, version).map_err(|e| e.to_string())?;
    let owned = sub.owned_partitions.iter().flat_map(|t| t.partitions.iter().map(move |p| (t.topic.0.to_string(), *p))).collect();
    Ok((sub.topics.iter().map(|t| t.to_string()).collect(), owned))
}

/// Partitions of a SyncGroup (or DescribeGroups) assignment; empty bytes mean none.
pub fn decode_assignment_bytes(assignment: &Bytes) -> std::result::Result<BTreeSet<TopicPartition>, String> {
    if assignment.is_empty() {
        return Ok(BTreeSet::new());
    }
    let mut buf = assignment.clone();
    let version = read_version(&mut buf)?;
    let a = ConsumerProtocolAssignment::decode(&mut buf, version).map_err(|e| e.to_string())?;
    Ok(a.assigned_partitions
        .iter()
        .flat_map(|t| t.partitions.iter().map(move |p| TopicPartition::new(t.topic.0.as_str(), *p)))
        .collect())
}

pub(super) fn decode_assignment(assignment: &Bytes, broker: &str) -> Result<BTreeSet<TopicPartition>> {
    decode_assignment_bytes(assignment)
        .map_err(|detail| Error::Protocol { broker: broker.to_string(), detail: format!("assignment: {detail}") })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumer_protocol_metadata_round_trips_with_its_version_prefix() {
        let owned: BTreeSet<TopicPartition> = [TopicPartition::new("t", 2), TopicPartition::new("t", 0)].into_iter().collect();
        let bytes = encode_subscription(&["t".into(), "u".into()], &owned).unwrap();
        assert_eq!(&bytes[..2], &CONSUMER_PROTOCOL_VERSION.to_be_bytes());
        let (topics, owned) = decode_subscription(&bytes).unwrap();
        assert_eq!(topics, ["t", "u"]);
        assert_eq!(owned, [("t".to_string(), 0), ("t".to_string(), 2)]);

        let bytes = encode_assignment(&[("t".into(), 1), ("u".into(), 0)]).unwrap();
        let got: Vec<TopicPartition> = decode_assignment_bytes(&bytes).unwrap().into_iter().collect();
        assert_eq!(got, [TopicPartition::new("t", 1), TopicPartition::new("u", 0)]);
        assert!(decode_assignment_bytes(&Bytes::new()).unwrap().is_empty());
    }

    #[test]
    fn garbage_metadata_is_an_error_not_a_panic() {
        for bad in [&b"\x00"[..], b"\xff\xff", b"\x00\x01\x00\x00\x00\x09xx"] {
            assert!(decode_subscription(&Bytes::copy_from_slice(bad)).is_err());
            assert!(decode_assignment_bytes(&Bytes::copy_from_slice(bad)).is_err());
        }
    }
}
