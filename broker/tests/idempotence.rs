//! The idempotent producer over the raw protocol: InitProducerId (every version, bad
//! input), and Produce answering a retry with the original offset, a gap with
//! OUT_OF_ORDER_SEQUENCE_NUMBER and an older epoch with INVALID_PRODUCER_EPOCH, before
//! and after a broker restart.

mod common;

use std::collections::HashSet;

use bytes::Bytes;
use common::{produce_request, RawClient, TestBroker};
use fjord_record::BatchBuilder;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
const INVALID_PRODUCER_EPOCH: i16 = 47;

fn batch(pid: i64, epoch: i16, seq: i32, values: &[&str]) -> Bytes {
    let mut b = BatchBuilder::new(1_700_000_000_000).producer(pid, epoch, seq);
    for v in values {
        b.append(1_700_000_000_000, None, Some(v.as_bytes()), &[]);
    }
    b.build()
}

async fn produce(client: &mut RawClient, records: Bytes) -> (i16, i64) {
    client.produce(9, &produce_request("idem", 0, -1, 5000, records)).await
}

async fn init_producer_id(client: &mut RawClient, version: i16, transactional_id: Option<&str>) -> InitProducerIdResponse {
    let request = InitProducerIdRequest::default()
        .with_transactional_id(transactional_id.map(|t| TransactionalId(StrBytes::from_string(t.to_owned()))))
        .with_transaction_timeout_ms(60_000)
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    client.call(ApiKey::InitProducerId, version, &request).await.unwrap()
}

#[tokio::test]
async fn init_producer_id_hands_out_unique_ids_and_refuses_bad_frames() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), |_| {}).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    let mut ids = HashSet::new();
    for version in 0..=4 {
        let r = init_producer_id(&mut client, version, None).await;
        assert_eq!((r.error_code, r.producer_epoch), (0, 0), "v{version}");
        assert!(r.producer_id.0 >= 0 && ids.insert(r.producer_id.0), "v{version}: {:?}", r.producer_id);
    }
    // A body that stops inside the transaction timeout: only this connection closes.
    let mut bad = RawClient::connect(broker.addr).await.unwrap();
    let frame = bad.encode(ApiKey::InitProducerId, 1, &InitProducerIdRequest::default());
    bad.send_frame(&frame[..frame.len() - 2]).await.unwrap();
    assert!(bad.is_closed_by_broker().await);
    assert_eq!(init_producer_id(&mut client, 2, None).await.error_code, 0);
    broker.stop().await.unwrap();

    // After a restart the ids continue after the claimed block: none is reused.
    let broker = TestBroker::start_in(dir.path().join("data"), |_| {}).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    let r = init_producer_id(&mut client, 4, None).await;
    assert!(!ids.contains(&r.producer_id.0) && r.producer_id.0 > *ids.iter().max().unwrap());
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn retries_gaps_and_fenced_epochs_before_and_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let broker = TestBroker::start_in(data.clone(), |_| {}).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    let pid = init_producer_id(&mut client, 4, None).await.producer_id.0;
    assert_eq!(produce(&mut client, batch(pid, 0, 0, &["a", "b"])).await, (0, 0));
    assert_eq!(produce(&mut client, batch(pid, 0, 2, &["c"])).await, (0, 2));
    // The retry of the first batch: success with its original offset, nothing appended.
    assert_eq!(produce(&mut client, batch(pid, 0, 0, &["a", "b"])).await, (0, 0));
    assert_eq!(client.latest_offset("idem").await.1, 3);
    // A gap.
    assert_eq!(produce(&mut client, batch(pid, 0, 5, &["x"])).await.0, OUT_OF_ORDER_SEQUENCE_NUMBER);
    broker.stop().await.unwrap();

    let broker = TestBroker::start_in(data, |_| {}).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    // The producer state came back: the old batch is still a duplicate.
    assert_eq!(produce(&mut client, batch(pid, 0, 2, &["c"])).await, (0, 2));
    assert_eq!(produce(&mut client, batch(pid, 0, 0, &["a", "b"])).await, (0, 0));
    assert_eq!(client.latest_offset("idem").await.1, 3);
    assert_eq!(produce(&mut client, batch(pid, 0, 4, &["x"])).await.0, OUT_OF_ORDER_SEQUENCE_NUMBER);
    assert_eq!(produce(&mut client, batch(pid, 0, 3, &["d"])).await, (0, 3));
    // A new epoch fences the old one.
    assert_eq!(produce(&mut client, batch(pid, 1, 0, &["e"])).await, (0, 4));
    assert_eq!(produce(&mut client, batch(pid, 0, 4, &["zombie"])).await.0, INVALID_PRODUCER_EPOCH);
    assert_eq!(client.latest_offset("idem").await.1, 5);
    broker.stop().await.unwrap();
}

/// How many producers the broker remembers for partition 0 of `topic` (DescribeProducers).
async fn remembered_producers(client: &mut RawClient, topic: &str) -> usize {
    let request = DescribeProducersRequest::default().with_topics(vec![describe_producers_request::TopicRequest::default()
        .with_name(TopicName(StrBytes::from_string(topic.to_owned())))
        .with_partition_indexes(vec![0])]);
    let response: DescribeProducersResponse = client.call(ApiKey::DescribeProducers, 0, &request).await.unwrap();
    let partition = &response.topics[0].partitions[0];
    assert_eq!(partition.error_code, 0);
    partition.active_producers.len()
}

/// A client making up producer ids (any id's first batch at sequence 0 is accepted, as
/// in Kafka) cannot grow a partition's producer state past `producer.id.max.per.partition`,
/// before or after a restart, and a producer active after the flood keeps its
/// retries recognized.
#[tokio::test]
async fn made_up_producer_ids_cannot_grow_the_producer_state_past_its_limit() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let limited = |c: &mut fjord_broker::BrokerConfig| c.set("producer.id.max.per.partition", "50").unwrap();
    let broker = TestBroker::start_in(data.clone(), limited).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    let pid = init_producer_id(&mut client, 4, None).await.producer_id.0;
    assert_eq!(produce(&mut client, batch(pid, 0, 0, &["a"])).await, (0, 0));
    for made_up in 0..2_000 {
        let (code, offset) = produce(&mut client, batch(1_000_000_000 + made_up, 0, 0, &["flood"])).await;
        assert_eq!((code, offset), (0, made_up + 1));
    }
    assert!(remembered_producers(&mut client, "idem").await <= 50);
    assert_eq!(produce(&mut client, batch(pid, 0, 1, &["b"])).await, (0, 2_001));
    // A retry of the latest batch: recognized, nothing appended.
    assert_eq!(produce(&mut client, batch(pid, 0, 1, &["b"])).await, (0, 2_001));
    assert_eq!(client.latest_offset("idem").await.1, 2_002);
    broker.stop().await.unwrap();

    let broker = TestBroker::start_in(data, limited).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    assert!(remembered_producers(&mut client, "idem").await <= 50);
    assert_eq!(produce(&mut client, batch(pid, 0, 1, &["b"])).await, (0, 2_001));
    assert_eq!(client.latest_offset("idem").await.1, 2_002);
    broker.stop().await.unwrap();
}
