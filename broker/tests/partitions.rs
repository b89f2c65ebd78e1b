//! CreatePartitions (issue #22): a topic's partition count raised over the Kafka
//! protocol, with validate_only, manual assignments, Kafka's error codes for bad input
//! and the partition limits; the new partitions take produces and fetches, and survive a
//! restart. The Python half (confluent-kafka's AdminClient) is in python_clients.rs.

mod common;

use common::{produce_request, topic_name, RawClient, TestBroker, EARLIEST, LATEST};
use fjord_record::BatchBuilder;
use kafka_protocol::messages::create_partitions_request::{CreatePartitionsAssignment, CreatePartitionsTopic};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    ApiKey, BrokerId, CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest, CreateTopicsResponse,
    MetadataRequest, MetadataResponse,
};

const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const INVALID_PARTITIONS: i16 = 37;
const INVALID_REPLICA_ASSIGNMENT: i16 = 39;
const POLICY_VIOLATION: i16 = 44;

/// A manual assignment: one broker list per new partition.
type Assignment = Vec<Vec<i32>>;

async fn create_topic(client: &mut RawClient, name: &str, partitions: i32) {
    let request = CreateTopicsRequest::default().with_timeout_ms(30_000).with_topics(vec![CreatableTopic::default()
        .with_name(topic_name(name))
        .with_num_partitions(partitions)
        .with_replication_factor(1)]);
    let response: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 5, &request).await.unwrap();
    assert_eq!(response.topics[0].error_code, 0, "{:?}", response.topics[0].error_message);
}

/// One CreatePartitions of one topic at `version`: (error code, message).
async fn add(
    client: &mut RawClient,
    version: i16,
    name: &str,
    count: i32,
    assignments: Option<Vec<Vec<i32>>>,
    validate_only: bool,
) -> (i16, String) {
    let assignments = assignments.map(|lists| {
        lists
            .into_iter()
            .map(|ids| CreatePartitionsAssignment::default().with_broker_ids(ids.into_iter().map(BrokerId).collect()))
            .collect()
    });
    let request = CreatePartitionsRequest::default().with_timeout_ms(30_000).with_validate_only(validate_only).with_topics(vec![
        CreatePartitionsTopic::default().with_name(topic_name(name)).with_count(count).with_assignments(assignments),
    ]);
    let response: CreatePartitionsResponse = client.call(ApiKey::CreatePartitions, version, &request).await.unwrap();
    let result = &response.results[0];
    assert_eq!(result.name, topic_name(name));
    (result.error_code, result.error_message.as_ref().map_or_else(String::new, |m| m.to_string()))
}

/// (this broker's id, the topic's partition count) from Metadata v9.
async fn partitions(client: &mut RawClient, name: &str) -> (i32, usize) {
    let request = MetadataRequest::default()
        .with_topics(Some(vec![MetadataRequestTopic::default().with_name(Some(topic_name(name)))]))
        .with_allow_auto_topic_creation(false);
    let response: MetadataResponse = client.call(ApiKey::Metadata, 9, &request).await.unwrap();
    (response.brokers[0].node_id.0, response.topics[0].partitions.len())
}

fn batch(value: &str) -> bytes::Bytes {
    let mut builder = BatchBuilder::new(1_700_000_000_000);
    builder.append(1_700_000_000_000, None, Some(value.as_bytes()), &[]);
    builder.build()
}

#[tokio::test]
async fn create_partitions_grows_a_topic_whose_new_partitions_serve_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let broker = TestBroker::start_in(data.clone(), |c| c.auto_create_topics = false).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    create_topic(&mut client, "grow", 1).await;
    let (me, count) = partitions(&mut client, "grow").await;
    assert_eq!(count, 1);

    // validate_only checks and changes nothing.
    assert_eq!(add(&mut client, 0, "grow", 3, None, true).await.0, 0);
    assert_eq!(partitions(&mut client, "grow").await.1, 1);
    // Every version raises the count.
    for (version, count) in [(0, 2), (1, 3), (2, 4), (3, 5)] {
        let (code, message) = add(&mut client, version, "grow", count, None, false).await;
        assert_eq!(code, 0, "v{version}: {message}");
        assert_eq!(partitions(&mut client, "grow").await.1, count as usize, "v{version}");
    }
    // A manual assignment names one broker list per new partition.
    assert_eq!(add(&mut client, 3, "grow", 6, Some(vec![vec![me]]), false).await.0, 0);
    assert_eq!(partitions(&mut client, "grow").await.1, 6);

    // The new partitions take writes and serve them.
    for p in [1, 5] {
        let value = format!("into {p}");
        let (code, base) = client.produce(7, &produce_request("grow", p, 1, 5000, batch(&value))).await;
        assert_eq!((code, base), (0, 0), "partition {p}");
        assert_eq!(client.list_offset("grow", p, LATEST).await, (0, 1));
    }
    broker.stop().await.unwrap();

    let broker = TestBroker::start_in(data, |c| c.auto_create_topics = false).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    assert_eq!(partitions(&mut client, "grow").await.1, 6, "the count survives a restart");
    assert_eq!(client.list_offset("grow", 5, LATEST).await, (0, 1));
    assert_eq!(client.list_offset("grow", 5, EARLIEST).await, (0, 0));
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn bad_create_partitions_get_kafkas_error_codes_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), |c| {
        c.auto_create_topics = false;
        c.set("max.partitions.per.request", "8").unwrap();
        c.set("max.partitions.per.broker", "10").unwrap();
    })
    .await
    .unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    create_topic(&mut client, "fixed", 3).await;
    let (me, _) = partitions(&mut client, "fixed").await;

    let cases: Vec<(i32, Option<Assignment>, bool, i16)> = vec![
        (3, None, false, INVALID_PARTITIONS),
        (2, None, false, INVALID_PARTITIONS),
        (-1, None, true, INVALID_PARTITIONS),
        // Past max.partitions.per.request (8 new), with validate_only too.
        (12, None, false, POLICY_VIOLATION),
        (i32::MAX, None, true, POLICY_VIOLATION),
        // 3 held + 8 new > max.partitions.per.broker (10).
        (11, None, false, POLICY_VIOLATION),
        (11, None, true, POLICY_VIOLATION),
        // Manual assignments: wrong count, unknown broker, a broker twice, wrong replication factor.
        (5, Some(vec![vec![me]]), false, INVALID_REPLICA_ASSIGNMENT),
        (4, Some(vec![vec![me + 1]]), false, INVALID_REPLICA_ASSIGNMENT),
        (4, Some(vec![vec![me, me]]), false, INVALID_REPLICA_ASSIGNMENT),
        (4, Some(vec![vec![]]), false, INVALID_REPLICA_ASSIGNMENT),
    ];
    for (count, assignments, validate_only, expected) in cases {
        let (code, message) = add(&mut client, 3, "fixed", count, assignments.clone(), validate_only).await;
        assert_eq!(code, expected, "count {count}, {assignments:?}: {message}");
        assert!(!message.is_empty(), "count {count}: an error says why");
        assert_eq!(partitions(&mut client, "fixed").await.1, 3, "count {count}: nothing changed");
    }
    assert_eq!(add(&mut client, 3, "absent", 4, None, false).await.0, UNKNOWN_TOPIC_OR_PARTITION);
    assert_eq!(add(&mut client, 0, "absent", 4, None, true).await.0, UNKNOWN_TOPIC_OR_PARTITION);
    // Within both limits it works.
    assert_eq!(add(&mut client, 3, "fixed", 10, None, false).await.0, 0);
    assert_eq!(partitions(&mut client, "fixed").await.1, 10);
    broker.stop().await.unwrap();
}
