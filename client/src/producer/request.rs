//! The Produce request body, encoded here rather than through kafka-protocol's
//! `ProduceRequest`: that copies every record batch into the request frame (2.9% of the
//! bench client's samples at 50 records a batch), while here each batch is a slice of its
//! own in the connection's vectored write, and only the few bytes around it are written.

use bytes::{BufMut, Bytes, BytesMut};

use crate::connection::BodyParts;

/// The first flexible version of Produce (compact strings, arrays and bytes, tagged fields).
const FIRST_FLEXIBLE: i16 = 9;
/// The versions laid out as below (kafka-protocol's lowest is 3; v13 names topics by id).
const VERSIONS: std::ops::RangeInclusive<i16> = 3..=12;

/// One topic's batches: (partition, record batch bytes), in request order.
pub(crate) type TopicBatches<'a> = (&'a str, Vec<(i32, &'a Bytes)>);

/// The body of a Produce request at `version` (3 to 12).
pub(crate) fn produce_body(
    version: i16,
    transactional_id: Option<&str>,
    acks: i16,
    timeout_ms: i32,
    topics: &[TopicBatches<'_>],
) -> BodyParts {
    debug_assert!(VERSIONS.contains(&version), "Produce v{version}");
    let flexible = version >= FIRST_FLEXIBLE;
    let partitions: usize = topics.iter().map(|(_, p)| p.len()).sum();
    let names: usize = topics.iter().map(|(name, _)| name.len()).sum();
    // Everything but the batches: one allocation that the slices between them share.
    let id_len = transactional_id.map_or(0, str::len);
    let mut head = BytesMut::with_capacity(16 + id_len + topics.len() * 8 + names + partitions * 12);
    let mut parts = Vec::with_capacity(2 * partitions + 1);
    let put_length = |buf: &mut BytesMut, n: usize| match flexible {
        true => put_uvarint(buf, n as u64 + 1),
        false => buf.put_i32(n as i32),
    };
    match (transactional_id, flexible) {
        (None, true) => put_uvarint(&mut head, 0),
        (None, false) => head.put_i16(-1),
        (Some(id), true) => {
            put_uvarint(&mut head, id.len() as u64 + 1);
            head.put_slice(id.as_bytes());
        }
        (Some(id), false) => {
            head.put_i16(id.len() as i16);
            head.put_slice(id.as_bytes());
        }
    }
    head.put_i16(acks);
    head.put_i32(timeout_ms);
    put_length(&mut head, topics.len());
    for (name, batches) in topics {
        match flexible {
            true => put_uvarint(&mut head, name.len() as u64 + 1),
            false => head.put_i16(name.len() as i16),
        }
        head.put_slice(name.as_bytes());
        put_length(&mut head, batches.len());
        for (partition, records) in batches {
            head.put_i32(*partition);
            put_length(&mut head, records.len());
            parts.push(head.split().freeze());
            parts.push(Bytes::clone(records));
            if flexible {
                head.put_u8(0); // the partition's tagged fields
            }
        }
        if flexible {
            head.put_u8(0); // the topic's tagged fields
        }
    }
    if flexible {
        head.put_u8(0); // the request's tagged fields
    }
    parts.push(head.freeze());
    BodyParts(parts)
}

fn put_uvarint(buf: &mut BytesMut, mut n: u64) {
    while n >= 0x80 {
        buf.put_u8(n as u8 | 0x80);
        n >>= 7;
    }
    buf.put_u8(n as u8);
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::{ProduceRequest, TopicName, TransactionalId};
    use kafka_protocol::protocol::{Encodable, StrBytes};

    use super::*;

    #[test]
    fn the_body_is_what_kafka_protocol_encodes_at_every_version() {
        let big = Bytes::from(vec![7u8; 300]); // a length that takes two varint bytes
        let small = Bytes::from_static(b"batch");
        let empty = Bytes::new();
        let long_name = "x".repeat(200); // a name length that takes two varint bytes
        let topics: Vec<TopicBatches<'_>> =
            vec![("orders", vec![(0, &big), (3, &small)]), ("t", vec![(1, &empty)]), (&long_name, vec![(2, &small)])];
        let request = ProduceRequest::default().with_acks(-1).with_timeout_ms(30_000).with_topic_data(
            topics
                .iter()
                .map(|(name, batches)| {
                    TopicProduceData::default().with_name(TopicName(StrBytes::from_string(name.to_string()))).with_partition_data(
                        batches
                            .iter()
                            .map(|(p, r)| PartitionProduceData::default().with_index(*p).with_records(Some(Bytes::clone(r))))
                            .collect(),
                    )
                })
                .collect(),
        );
        let named = request.clone().with_transactional_id(Some(TransactionalId(StrBytes::from_static_str("orders-txn"))));
        for version in VERSIONS {
            for (request, id) in [(&request, None), (&named, Some("orders-txn"))] {
                let mut expected = BytesMut::new();
                request.encode(&mut expected, version).unwrap();
                let parts = produce_body(version, id, -1, 30_000, &topics).0;
                let body: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
                assert_eq!(body, expected[..], "v{version}, transactional id {id:?}");
                assert!(parts.iter().any(|p| p.as_ptr() == big.as_ptr()), "v{version}: the batch is not copied");
            }
        }
    }
}
