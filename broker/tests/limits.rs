//! Partition-count limits (issue #26, case 1 and the broker half of case 5): a
//! CreateTopics of 2^31-1 partitions, with or without validate_only, is refused before
//! anything is allocated, and the broker keeps answering; a create that would give a
//! broker more replicas than `max.partitions.per.broker` (by default derived from the
//! open-file limit) is refused with nothing created, and auto-creation obeys the same
//! limits.

mod common;

use common::{produce_request, topic_name, RawClient, TestBroker};
use fjord_record::BatchBuilder;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, CreateTopicsRequest, CreateTopicsResponse, DescribeConfigsRequest,
    DescribeConfigsResponse, MetadataRequest, MetadataResponse,
};
use kafka_protocol::protocol::StrBytes;

const INVALID_PARTITIONS: i16 = 37;
const POLICY_VIOLATION: i16 = 44;

/// One CreateTopics (v5, which answers the counts) of `name`: (error code, message,
/// partitions answered).
async fn create(client: &mut RawClient, name: &str, partitions: i32, validate_only: bool) -> (i16, String, i32) {
    let request = CreateTopicsRequest::default().with_timeout_ms(30_000).with_validate_only(validate_only).with_topics(vec![
        CreatableTopic::default().with_name(topic_name(name)).with_num_partitions(partitions).with_replication_factor(1),
    ]);
    let response: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 5, &request).await.unwrap();
    let topic = &response.topics[0];
    (topic.error_code, topic.error_message.as_ref().map_or_else(String::new, |m| m.to_string()), topic.num_partitions)
}

/// Metadata (v9) of `names`, auto-creating them when `auto_create`: (name, error, partitions).
async fn metadata(client: &mut RawClient, names: &[&str], auto_create: bool) -> Vec<(String, i16, usize)> {
    let request = MetadataRequest::default()
        .with_topics(Some(names.iter().map(|n| MetadataRequestTopic::default().with_name(Some(topic_name(n)))).collect()))
        .with_allow_auto_topic_creation(auto_create);
    let response: MetadataResponse = client.call(ApiKey::Metadata, 9, &request).await.unwrap();
    response
        .topics
        .iter()
        .map(|t| (t.name.as_ref().map_or_else(String::new, |n| n.to_string()), t.error_code, t.partitions.len()))
        .collect()
}

/// The partition directories of `topic` in the broker's log dir.
fn partition_dirs(broker: &TestBroker, topic: &str) -> usize {
    let prefix = format!("{topic}-");
    std::fs::read_dir(&broker.data_dir)
        .unwrap()
        .filter(|e| {
            e.as_ref().unwrap().file_name().to_string_lossy().strip_prefix(&prefix).is_some_and(|p| p.parse::<i32>().is_ok())
        })
        .count()
}

/// Reproduces case 1 of issue #26 exactly: `fjord topics create --topic boom --partitions
/// 2147483647` aborted the process ("memory allocation of 51539607528 bytes failed"),
/// with validate_only too. Now: INVALID_PARTITIONS naming the limit, and the same
/// connection's next requests are answered.
#[tokio::test]
async fn a_create_of_2147483647_partitions_is_refused_and_the_broker_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), |_| {}).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    for validate_only in [true, false] {
        let (code, message, _) = create(&mut client, "boom", i32::MAX, validate_only).await;
        assert_eq!(code, INVALID_PARTITIONS, "validate_only={validate_only}: {message}");
        assert!(message.contains("2147483647") && message.contains("max.partitions.per.request"), "{message}");
        // The broker is alive and the connection usable.
        let versions: ApiVersionsResponse = client.call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default()).await.unwrap();
        assert_eq!(versions.error_code, 0);
    }
    assert_eq!(metadata(&mut client, &["boom"], false).await, [("boom".to_owned(), 3, 0)], "nothing created");
    assert_eq!(partition_dirs(&broker, "boom"), 0);
    // A sane create still works, on a new connection too.
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    assert_eq!(create(&mut client, "boom", 2, true).await, (0, String::new(), 2), "validate_only answers the counts");
    assert_eq!(partition_dirs(&broker, "boom"), 0, "validate_only creates nothing");
    assert_eq!(create(&mut client, "boom", 2, false).await, (0, String::new(), 2));
    assert_eq!(partition_dirs(&broker, "boom"), 2);
    broker.stop().await.unwrap();
}

/// `max.partitions.per.request` is a config key: a create just above it is refused, one
/// at it passes.
#[tokio::test]
async fn the_per_request_limit_is_configurable() {
    let dir = tempfile::tempdir().unwrap();
    let broker =
        TestBroker::start_in(dir.path().join("data"), |c| c.set("max.partitions.per.request", "8").unwrap()).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    let (code, message, _) = create(&mut client, "wide", 9, false).await;
    assert_eq!(code, INVALID_PARTITIONS, "{message}");
    assert_eq!(partition_dirs(&broker, "wide"), 0);
    assert_eq!(create(&mut client, "wide", 8, false).await.0, 0);
    broker.stop().await.unwrap();
}

/// A create that would take the broker past `max.partitions.per.broker` is refused with
/// POLICY_VIOLATION (validate_only too) and creates nothing: no store entry, no log
/// directory. Auto-creation meets the same limit.
#[tokio::test]
async fn a_create_above_the_per_broker_limit_is_refused_with_nothing_created() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), |c| {
        c.set("max.partitions.per.broker", "50").unwrap();
        c.set("num.partitions", "10").unwrap();
    })
    .await
    .unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    assert_eq!(create(&mut client, "first", 30, false).await.0, 0);
    for validate_only in [true, false] {
        let (code, message, _) = create(&mut client, "second", 30, validate_only).await;
        assert_eq!(code, POLICY_VIOLATION, "validate_only={validate_only}: {message}");
        assert!(message.contains("holds 30") && message.contains("max.partitions.per.broker"), "{message}");
    }
    assert_eq!(metadata(&mut client, &["second"], false).await, [("second".to_owned(), 3, 0)], "not created");
    assert_eq!(partition_dirs(&broker, "second"), 0);
    // Up to the limit exactly is fine; then an auto-create (num.partitions = 10) is refused.
    assert_eq!(create(&mut client, "second", 20, false).await.0, 0);
    assert_eq!(metadata(&mut client, &["third"], true).await, [("third".to_owned(), POLICY_VIOLATION, 0)]);
    let mut batch = BatchBuilder::new(1_700_000_000_000);
    batch.append(1_700_000_000_000, None, Some(b"v"), &[]);
    assert_eq!(client.produce(7, &produce_request("third", 0, 1, 5000, batch.build())).await.0, POLICY_VIOLATION);
    assert_eq!(partition_dirs(&broker, "third"), 0);
    assert_eq!(metadata(&mut client, &["third"], false).await, [("third".to_owned(), 3, 0)]);
    broker.stop().await.unwrap();
}

/// Without `max.partitions.per.broker`, the limit follows the process's open-file limit,
/// which the broker raised to its hard limit at start: DescribeConfigs shows it, and one
/// partition more is refused (validate_only, so nothing is built either way).
#[tokio::test]
async fn the_default_per_broker_limit_follows_the_open_file_limit() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), |c| c.set("max.partitions.per.request", "2147483647").unwrap())
        .await
        .unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    let request = DescribeConfigsRequest::default().with_resources(vec![DescribeConfigsResource::default()
        .with_resource_type(4)
        .with_resource_name(StrBytes::from_static_str("0"))
        .with_configuration_keys(Some(vec![StrBytes::from_static_str("max.partitions.per.broker")]))]);
    let response: DescribeConfigsResponse = client.call(ApiKey::DescribeConfigs, 4, &request).await.unwrap();
    let limit: i32 = response.results[0].configs[0].value.as_ref().unwrap().parse().unwrap();
    let (_, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
    if hard != nix::sys::resource::RLIM_INFINITY {
        let expected = ((hard / 2).saturating_sub(1024) / 3).clamp(1, 174_762);
        assert_eq!(limit as u64, expected, "half the raised limit less the segment file cache, three descriptors per partition");
    }
    let (code, message, _) = create(&mut client, "huge", limit + 1, true).await;
    assert_eq!(code, POLICY_VIOLATION, "{message}");
    assert_eq!(create(&mut client, "huge", limit.min(1000), true).await.0, 0);
    broker.stop().await.unwrap();
}
