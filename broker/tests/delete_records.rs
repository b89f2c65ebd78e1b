//! DeleteRecords (issue #22): the leader's log start offset moves up (at most to the high
//! watermark, -1 meaning the high watermark), ListOffsets earliest and fetches follow
//! it, and it survives a restart. confluent-kafka's `delete_records` is in python_clients.rs.

mod common;

use common::{produce_request, topic_name, RawClient, TestBroker, EARLIEST};
use fjord_record::BatchBuilder;
use kafka_protocol::messages::delete_records_request::{DeleteRecordsPartition, DeleteRecordsTopic};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{ApiKey, DeleteRecordsRequest, DeleteRecordsResponse, FetchRequest, FetchResponse};

const OFFSET_OUT_OF_RANGE: i16 = 1;
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;

/// One DeleteRecords of one partition at `version`: (error code, low watermark).
async fn delete_before(client: &mut RawClient, version: i16, topic: &str, partition: i32, offset: i64) -> (i16, i64) {
    let request = DeleteRecordsRequest::default().with_timeout_ms(30_000).with_topics(vec![DeleteRecordsTopic::default()
        .with_name(topic_name(topic))
        .with_partitions(vec![DeleteRecordsPartition::default().with_partition_index(partition).with_offset(offset)])]);
    let response: DeleteRecordsResponse = client.call(ApiKey::DeleteRecords, version, &request).await.unwrap();
    let p = &response.topics[0].partitions[0];
    (p.error_code, p.low_watermark)
}

/// A Fetch (v11) of partition 0 at `offset`: (error code, log start offset, first record's offset).
async fn fetch_first(client: &mut RawClient, topic: &str, offset: i64) -> (i16, i64, Option<i64>) {
    let request = FetchRequest::default().with_max_wait_ms(0).with_min_bytes(0).with_max_bytes(1 << 20).with_topics(vec![
        FetchTopic::default().with_topic(topic_name(topic)).with_partitions(vec![FetchPartition::default()
            .with_partition(0)
            .with_fetch_offset(offset)
            .with_partition_max_bytes(1 << 20)]),
    ]);
    let response: FetchResponse = client.call(ApiKey::Fetch, 11, &request).await.unwrap();
    let p = &response.responses[0].partitions[0];
    let first = p.records.as_ref().and_then(|records| {
        let (_, bytes) = fjord_record::batch::batches(records).next()?.unwrap();
        let body = &bytes[fjord_record::BATCH_OVERHEAD..];
        let base = i64::from_be_bytes(bytes[..8].try_into().unwrap());
        fjord_record::Records::new(body, fjord_record::BATCH_OVERHEAD)
            .map(|r| base + i64::from(r.unwrap().offset_delta))
            .find(|o| *o >= offset)
    });
    (p.error_code, p.log_start_offset, first)
}

#[tokio::test]
async fn delete_records_moves_the_log_start_for_list_offsets_and_fetches_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let broker = TestBroker::start_in(data.clone(), |_| {}).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    for i in 0..10 {
        let mut builder = BatchBuilder::new(1_700_000_000_000);
        builder.append(1_700_000_000_000, None, Some(format!("v{i}").as_bytes()), &[]);
        assert_eq!(client.produce(7, &produce_request("trim", 0, -1, 5000, builder.build())).await, (0, i));
    }
    assert_eq!(client.list_offset("trim", 0, EARLIEST).await, (0, 0));

    assert_eq!(delete_before(&mut client, 0, "trim", 0, 4).await, (0, 4));
    assert_eq!(client.list_offset("trim", 0, EARLIEST).await, (0, 4));
    assert_eq!(fetch_first(&mut client, "trim", 3).await.0, OFFSET_OUT_OF_RANGE);
    assert_eq!(fetch_first(&mut client, "trim", 4).await, (0, 4, Some(4)));
    // Lower than the start changes nothing; past the high watermark is out of range.
    assert_eq!(delete_before(&mut client, 1, "trim", 0, 2).await, (0, 4));
    assert_eq!(delete_before(&mut client, 2, "trim", 0, 11).await.0, OFFSET_OUT_OF_RANGE);
    assert_eq!(delete_before(&mut client, 2, "trim", 0, -7).await.0, OFFSET_OUT_OF_RANGE);
    assert_eq!(delete_before(&mut client, 2, "trim", 1, 0).await.0, UNKNOWN_TOPIC_OR_PARTITION);
    assert_eq!(delete_before(&mut client, 2, "absent", 0, 0).await.0, UNKNOWN_TOPIC_OR_PARTITION);
    assert_eq!(delete_before(&mut client, 2, "trim", 0, 7).await, (0, 7));
    assert_eq!(client.list_offset("trim", 0, EARLIEST).await, (0, 7));
    broker.stop().await.unwrap();

    let broker = TestBroker::start_in(data.clone(), |_| {}).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    assert_eq!(client.list_offset("trim", 0, EARLIEST).await, (0, 7), "the start survives a restart");
    assert_eq!(fetch_first(&mut client, "trim", 7).await, (0, 7, Some(7)));
    // -1: everything below the high watermark.
    assert_eq!(delete_before(&mut client, 2, "trim", 0, -1).await, (0, 10));
    assert_eq!(client.list_offset("trim", 0, EARLIEST).await, (0, 10));
    broker.stop().await.unwrap();
}
