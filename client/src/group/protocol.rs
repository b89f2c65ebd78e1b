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
use crate::guard::MAX_RESPONSE_ELEMENTS;
use fjord_record::walk;
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
    // Another member wrote these bytes: walked first, so that they cannot abort us.
    walk::consumer_subscription(&buf, version, MAX_RESPONSE_ELEMENTS)?;
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
    // The group's leader, another client, wrote these bytes: walked first, as above.
    walk::consumer_assignment(&buf, version, MAX_RESPONSE_ELEMENTS)?;
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

    /// `ConsumerProtocolSubscription` and `ConsumerProtocolAssignment` at `version`, as
    /// another client may write them: every array with two elements, every field set.
    fn populated(version: i16) -> (Bytes, Bytes) {
        let owned = |t: &str| OwnedTopic::default().with_topic(topic_name(t)).with_partitions(vec![7001, 7002]);
        let mut subscription = ConsumerProtocolSubscription::default()
            .with_topics(vec![s("t"), s("u")])
            .with_user_data(Some(Bytes::from_static(b"user data")));
        if version >= 1 {
            subscription = subscription.with_owned_partitions(vec![owned("t"), owned("u")]);
        }
        if version >= 2 {
            subscription = subscription.with_generation_id(70_003);
        }
        if version >= 3 {
            subscription = subscription.with_rack_id(Some(s("rack-a")));
        }
        let assigned = |t: &str| AssignedTopic::default().with_topic(topic_name(t)).with_partitions(vec![7001, 7002]);
        let assignment = ConsumerProtocolAssignment::default()
            .with_assigned_partitions(vec![assigned("t"), assigned("u")])
            .with_user_data(Some(Bytes::from_static(b"user data")));
        let prefixed = |encode: &dyn Fn(&mut BytesMut) -> anyhow::Result<()>| {
            let mut buf = BytesMut::new();
            buf.put_i16(version);
            encode(&mut buf).unwrap();
            buf.freeze()
        };
        (prefixed(&|buf| subscription.encode(buf, version)), prefixed(&|buf| assignment.encode(buf, version)))
    }

    #[test]
    fn every_version_of_another_clients_metadata_is_walked_then_decoded() {
        for version in 0..=3 {
            let (subscription, assignment) = populated(version);
            let (topics, owned) = decode_subscription(&subscription).unwrap_or_else(|e| panic!("v{version}: {e}"));
            assert_eq!(topics, ["t", "u"]);
            assert_eq!(owned.len(), if version >= 1 { 4 } else { 0 }, "v{version}");
            assert_eq!(decode_assignment_bytes(&assignment).map(|a| a.len()), Ok(4), "v{version}");
            // Each strict prefix past the version ends inside a field (nothing is optional).
            for cut in 2..assignment.len() {
                assert!(decode_assignment_bytes(&assignment.slice(..cut)).is_err(), "v{version}, {cut} bytes");
            }
        }
    }

    #[test]
    fn metadata_claiming_more_elements_than_its_bytes_is_refused_not_allocated() {
        // v0 subscription whose topics claim 2^31-1 names; a leader decoding it unchecked
        // would abort on the allocation.
        let subscription = Bytes::from_static(&[0, 0, 0x7f, 0xff, 0xff, 0xff, 0, 1, b't']);
        assert_eq!(decode_subscription(&subscription), Err("array claims more elements than the message has bytes".into()));
        // v1 assignment whose topics claim 2^31-1 entries (of ~60 bytes each once decoded).
        let assignment = Bytes::from_static(&[0, 1, 0x7f, 0xff, 0xff, 0xff, 0, 1, b't', 0, 0, 0, 0]);
        assert_eq!(decode_assignment_bytes(&assignment), Err("array claims more elements than the message has bytes".into()));
    }

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
