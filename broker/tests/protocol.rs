//! The broker over raw Kafka-protocol connections: every API, delayed fetch, and every
//! kind of bad input (each followed by a check that other connections still work).

mod common;

use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use common::{alter_incrementally, produce_request, topic_name, RawClient, TestBroker, EARLIEST};
use fjord_record::BatchBuilder;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const CORRUPT_MESSAGE: i16 = 2;
const OFFSET_OUT_OF_RANGE: i16 = 1;
const MESSAGE_TOO_LARGE: i16 = 10;
const INVALID_REQUIRED_ACKS: i16 = 21;
const UNSUPPORTED_VERSION: i16 = 35;
const TOPIC_ALREADY_EXISTS: i16 = 36;
const UNSUPPORTED_FOR_MESSAGE_FORMAT: i16 = 43;

fn batch(values: &[&str]) -> Bytes {
    let mut builder = BatchBuilder::new(1_700_000_000_000);
    for (i, v) in values.iter().enumerate() {
        builder.append(1_700_000_000_000 + i as i64, Some(b"k"), Some(v.as_bytes()), &[("h", Some(b"x"))]);
    }
    builder.build()
}

async fn produce(client: &mut RawClient, topic: &str, records: Bytes) -> (i16, i64) {
    client.produce(7, &produce_request(topic, 0, 1, 5000, records)).await
}

fn fetch_request(topic: &str, offset: i64, max_wait_ms: i32, partition_max_bytes: i32) -> FetchRequest {
    FetchRequest::default().with_max_wait_ms(max_wait_ms).with_min_bytes(1).with_topics(vec![FetchTopic::default()
        .with_topic(topic_name(topic))
        .with_partitions(vec![FetchPartition::default()
            .with_partition(0)
            .with_fetch_offset(offset)
            .with_partition_max_bytes(partition_max_bytes)])])
}

fn fetched_partition(response: &FetchResponse) -> &fetch_response::PartitionData {
    &response.responses[0].partitions[0]
}

fn record_values(records: &Bytes) -> Vec<String> {
    let mut values = Vec::new();
    for batch in fjord_record::batch::batches(records) {
        let (_, bytes) = batch.unwrap();
        let body = &bytes[fjord_record::BATCH_OVERHEAD..];
        for record in fjord_record::Records::new(body, fjord_record::BATCH_OVERHEAD) {
            values.push(String::from_utf8(record.unwrap().value.unwrap().to_vec()).unwrap());
        }
    }
    values
}

/// A fresh connection gets a normal answer: the broker is alive and well.
async fn assert_broker_serves(broker: &TestBroker) {
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    let response: ApiVersionsResponse = client.call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default()).await.unwrap();
    assert_eq!(response.error_code, 0);
}

async fn start(configure: impl FnOnce(&mut fjord_broker::BrokerConfig)) -> (TestBroker, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), configure).await.unwrap();
    (broker, dir)
}

#[tokio::test]
async fn api_versions_lists_what_is_implemented_and_answers_unknown_versions_with_v0() {
    let (broker, _dir) = start(|_| {}).await;
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    let response: ApiVersionsResponse = client.call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default()).await.unwrap();
    let ranges: Vec<(i16, i16, i16)> = response.api_keys.iter().map(|k| (k.api_key, k.min_version, k.max_version)).collect();
    assert!(ranges.contains(&(ApiKey::Produce as i16, 0, 9)));
    assert!(ranges.contains(&(ApiKey::Fetch as i16, 4, 13)));
    assert!(ranges.contains(&(ApiKey::JoinGroup as i16, 0, 9)));
    assert!(ranges.contains(&(ApiKey::InitProducerId as i16, 0, 4)));
    assert!(ranges.contains(&(ApiKey::AddPartitionsToTxn as i16, 0, 5)));
    assert!(ranges.contains(&(ApiKey::EndTxn as i16, 0, 3)));
    assert!(ranges.contains(&(ApiKey::ElectLeaders as i16, 0, 2)));
    assert!(ranges.contains(&(ApiKey::CreateAcls as i16, 1, 3)));
    assert!(ranges.contains(&(ApiKey::AlterUserScramCredentials as i16, 0, 0)));
    assert!(ranges.contains(&(ApiKey::AlterPartitionReassignments as i16, 0, 1)));
    assert!(ranges.contains(&(ApiKey::ListPartitionReassignments as i16, 0, 0)));
    assert!(!ranges.iter().any(|r| r.0 == ApiKey::BrokerHeartbeat as i16), "KRaft's broker APIs are not served");

    // kafka-python opens with v4: a v0 body with UNSUPPORTED_VERSION and the ranges.
    let frame = client.encode(ApiKey::ApiVersions, 4, &ApiVersionsRequest::default());
    client.send_frame(&frame).await.unwrap();
    let mut raw = client.read_frame().await.unwrap();
    let _correlation_id = bytes::Buf::get_i32(&mut raw);
    let v0 = <ApiVersionsResponse as kafka_protocol::protocol::Decodable>::decode(&mut raw, 0).unwrap();
    assert_eq!(v0.error_code, UNSUPPORTED_VERSION);
    assert_eq!(v0.api_keys.len(), response.api_keys.len());
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn unknown_api_keys_and_versions_get_unsupported_version_and_the_connection_lives_on() {
    let (broker, _dir) = start(|_| {}).await;
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    for (key, version) in [(ApiKey::BrokerHeartbeat as i16, 0), (ApiKey::Metadata as i16, 99), (999, 0)] {
        let mut frame = BytesMut::new();
        frame.put_i16(key);
        frame.put_i16(version);
        frame.put_i32(77);
        frame.put_i16(-1); // null client id
        frame.put_slice(b"whatever follows");
        client.send_frame(&frame).await.unwrap();
        let answer = client.read_frame().await.unwrap();
        assert_eq!(&answer[..], &[0, 0, 0, 77, 0, UNSUPPORTED_VERSION as u8], "api key {key} v{version}");
    }
    let metadata: MetadataResponse =
        client.call(ApiKey::Metadata, 9, &MetadataRequest::default().with_topics(Some(vec![]))).await.unwrap();
    assert_eq!(metadata.brokers.len(), 1);
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn metadata_auto_creates_and_describes_this_broker() {
    let (broker, _dir) = start(|c| c.num_partitions = 3).await;
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    for version in [0, 1, 4, 9, 12] {
        let topic = MetadataRequestTopic::default().with_name(Some(topic_name("auto")));
        let request = MetadataRequest::default().with_topics(Some(vec![topic])).with_allow_auto_topic_creation(true);
        let response: MetadataResponse = client.call(ApiKey::Metadata, version, &request).await.unwrap();
        assert_eq!(response.brokers[0].port, i32::from(broker.addr.port()), "v{version}");
        assert_eq!(response.topics[0].error_code, 0);
        assert_eq!(response.topics[0].partitions.len(), 3);
    }
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn produce_fetch_and_list_offsets_round_trip_zero_copy_and_copying() {
    for zero_copy in [true, false] {
        produce_fetch_and_list_offsets_round_trip(zero_copy).await;
    }
}

async fn produce_fetch_and_list_offsets_round_trip(zero_copy: bool) {
    let (broker, _dir) = start(|c| c.fetch_zero_copy = zero_copy).await;
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    assert_eq!(produce(&mut client, "t", batch(&["a", "b"])).await, (0, 0));
    assert_eq!(produce(&mut client, "t", batch(&["c"])).await, (0, 2));
    for version in [4, 7, 11, 12] {
        let response: FetchResponse = client.call(ApiKey::Fetch, version, &fetch_request("t", 1, 0, 1 << 20)).await.unwrap();
        let p = fetched_partition(&response);
        assert_eq!((p.error_code, p.high_watermark), (0, 3), "fetch v{version}");
        // Whole batches: the batch holding offset 1 starts at 0.
        assert_eq!(record_values(p.records.as_ref().unwrap()), ["a", "b", "c"], "fetch v{version}");
    }
    assert_eq!(client.latest_offset("t").await, (0, 3));
    let response: FetchResponse = client.call(ApiKey::Fetch, 11, &fetch_request("t", 42, 0, 1 << 20)).await.unwrap();
    assert_eq!(fetched_partition(&response).error_code, OFFSET_OUT_OF_RANGE);
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn fetch_returns_whole_batches_within_partition_max_bytes_but_at_least_one() {
    let (broker, _dir) = start(|_| {}).await;
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    let big = "x".repeat(1000);
    for _ in 0..5 {
        produce(&mut client, "sized", batch(&[&big])).await;
    }
    let one_batch = batch(&[&big]).len() as i32;
    let response: FetchResponse =
        client.call(ApiKey::Fetch, 11, &fetch_request("sized", 0, 0, one_batch * 2 + 10)).await.unwrap();
    assert_eq!(record_values(fetched_partition(&response).records.as_ref().unwrap()).len(), 2);
    // KIP-74: a limit below one batch still returns the first batch whole.
    let response: FetchResponse = client.call(ApiKey::Fetch, 11, &fetch_request("sized", 0, 0, 10)).await.unwrap();
    assert_eq!(record_values(fetched_partition(&response).records.as_ref().unwrap()).len(), 1);
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_fetch_wakes_on_append_well_before_max_wait() {
    let (broker, _dir) = start(|_| {}).await;
    let mut producer = RawClient::connect(broker.addr).await.unwrap();
    produce(&mut producer, "poll", batch(&["before"])).await;
    let mut consumer = RawClient::connect(broker.addr).await.unwrap();
    let started = Instant::now();
    let fetch = tokio::spawn(async move {
        let response: FetchResponse = consumer.call(ApiKey::Fetch, 11, &fetch_request("poll", 1, 20_000, 1 << 20)).await.unwrap();
        (response, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!fetch.is_finished(), "the fetch waits while there is nothing new");
    produce(&mut producer, "poll", batch(&["after"])).await;
    let (response, elapsed) = tokio::time::timeout(Duration::from_secs(5), fetch).await.unwrap().unwrap();
    assert_eq!(record_values(fetched_partition(&response).records.as_ref().unwrap()), ["after"]);
    assert!(elapsed >= Duration::from_millis(300) && elapsed < Duration::from_secs(5), "{elapsed:?}");

    // With nothing appended, the wait ends at max_wait with an empty answer.
    let mut consumer = RawClient::connect(broker.addr).await.unwrap();
    let started = Instant::now();
    let response: FetchResponse = consumer.call(ApiKey::Fetch, 11, &fetch_request("poll", 2, 400, 1 << 20)).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(390));
    assert!(fetched_partition(&response).records.as_ref().is_none_or(|r| r.is_empty()));
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn requests_on_one_connection_are_answered_in_order() {
    let (broker, _dir) = start(|_| {}).await;
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    let mut frames = Vec::new();
    for i in 0..20 {
        frames.push(client.encode(ApiKey::Produce, 7, &produce_request("ordered", 0, 1, 5000, batch(&[&format!("m{i}")]))));
        frames.push(client.encode(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default()));
    }
    for frame in &frames {
        client.send_frame(frame).await.unwrap(); // all sent before reading anything
    }
    for expected in 1..=frames.len() as i32 {
        let frame = client.read_frame().await.unwrap();
        assert_eq!(i32::from_be_bytes(frame[..4].try_into().unwrap()), expected);
    }
    let response: FetchResponse = client.call(ApiKey::Fetch, 11, &fetch_request("ordered", 0, 0, 1 << 20)).await.unwrap();
    let expected: Vec<String> = (0..20).map(|i| format!("m{i}")).collect();
    assert_eq!(record_values(fetched_partition(&response).records.as_ref().unwrap()), expected);
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn a_batch_with_a_bad_crc_is_refused_and_nothing_is_appended() {
    let (broker, _dir) = start(|_| {}).await;
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    produce(&mut client, "crc", batch(&["good"])).await;
    let mut bad = batch(&["evil"]).to_vec();
    let last = bad.len() - 1;
    bad[last] ^= 0xff;
    assert_eq!(produce(&mut client, "crc", Bytes::from(bad)).await.0, CORRUPT_MESSAGE);
    assert_eq!(client.latest_offset("crc").await, (0, 1));
    assert_broker_serves(&broker).await;
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn oversized_batches_get_message_too_large() {
    let (broker, _dir) = start(|_| {}).await;
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    let request = CreateTopicsRequest::default().with_timeout_ms(5000).with_topics(vec![CreatableTopic::default()
        .with_name(topic_name("small"))
        .with_num_partitions(1)
        .with_replication_factor(1)
        .with_configs(vec![CreatableTopicConfig::default()
            .with_name(StrBytes::from_static_str("max.message.bytes"))
            .with_value(Some(StrBytes::from_static_str("1000")))])]);
    let created: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 5, &request).await.unwrap();
    assert_eq!(created.topics[0].error_code, 0, "{:?}", created.topics[0].error_message);
    assert_eq!(produce(&mut client, "small", batch(&[&"y".repeat(2000)])).await.0, MESSAGE_TOO_LARGE);
    assert_eq!(produce(&mut client, "small", batch(&["fits"])).await, (0, 0));
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn unknown_topics_without_auto_create_are_unknown_topic_or_partition() {
    let (broker, _dir) = start(|c| c.auto_create_topics = false).await;
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    assert_eq!(produce(&mut client, "nope", batch(&["x"])).await.0, UNKNOWN_TOPIC_OR_PARTITION);
    let request =
        MetadataRequest::default().with_topics(Some(vec![MetadataRequestTopic::default().with_name(Some(topic_name("nope")))]));
    let metadata: MetadataResponse = client.call(ApiKey::Metadata, 9, &request).await.unwrap();
    assert_eq!(metadata.topics[0].error_code, UNKNOWN_TOPIC_OR_PARTITION);
    let response: FetchResponse = client.call(ApiKey::Fetch, 11, &fetch_request("nope", 0, 0, 100)).await.unwrap();
    assert_eq!(fetched_partition(&response).error_code, UNKNOWN_TOPIC_OR_PARTITION);
    assert_eq!(client.latest_offset("nope").await.0, UNKNOWN_TOPIC_OR_PARTITION);
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn invalid_acks_and_old_message_formats_are_refused() {
    let (broker, _dir) = start(|_| {}).await;
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    let response: ProduceResponse =
        client.call(ApiKey::Produce, 7, &produce_request("acks", 0, 5, 5000, batch(&["x"]))).await.unwrap();
    assert_eq!(response.responses[0].partition_responses[0].error_code, INVALID_REQUIRED_ACKS);
    // A message-format-v1 payload in a v7 request: not corrupt, just not stored here.
    let mut old_format = batch(&["x"]).to_vec();
    old_format[16] = 1; // magic
    let response: ProduceResponse =
        client.call(ApiKey::Produce, 7, &produce_request("acks", 0, 1, 5000, old_format.into())).await.unwrap();
    assert_eq!(response.responses[0].partition_responses[0].error_code, UNSUPPORTED_FOR_MESSAGE_FORMAT);
    // Produce v2 (message format v1): answered by hand, nothing appended.
    let mut body = BytesMut::new();
    body.put_i16(1); // acks
    body.put_i32(1000);
    body.put_i32(1);
    body.put_i16(4);
    body.put_slice(b"acks");
    body.put_i32(1);
    body.put_i32(0);
    body.put_i32(4);
    body.put_slice(b"junk");
    let mut frame = BytesMut::new();
    frame.put_i16(0);
    frame.put_i16(2);
    frame.put_i32(99);
    frame.put_i16(-1);
    frame.put_slice(&body);
    client.send_frame(&frame).await.unwrap();
    let answer = client.read_frame().await.unwrap();
    assert_eq!(&answer[..4], &99i32.to_be_bytes());
    assert_eq!(&answer[4 + 4 + 2 + 4 + 4 + 4..][..2], &UNSUPPORTED_FOR_MESSAGE_FORMAT.to_be_bytes());
    // The v7 request auto-created the topic; nothing was appended to it.
    assert_eq!(client.latest_offset("acks").await, (0, 0));
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn acks_zero_gets_no_response_but_is_appended() {
    let (broker, _dir) = start(|_| {}).await;
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    let frame = client.encode(ApiKey::Produce, 7, &produce_request("quiet", 0, 0, 5000, batch(&["x"])));
    client.send_frame(&frame).await.unwrap();
    // The next answer on the connection belongs to the next request.
    assert_eq!(client.latest_offset("quiet").await, (0, 1));
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn create_describe_and_delete_topics() {
    let (broker, _dir) = start(|c| c.auto_create_topics = false).await;
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    let create = |topic: &str, partitions: i32| {
        CreateTopicsRequest::default().with_timeout_ms(5000).with_topics(vec![CreatableTopic::default()
            .with_name(topic_name(topic))
            .with_num_partitions(partitions)
            .with_replication_factor(-1)
            .with_configs(vec![CreatableTopicConfig::default()
                .with_name(StrBytes::from_static_str("retention.ms"))
                .with_value(Some(StrBytes::from_static_str("3600000")))])])
    };
    let response: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 7, &create("made", 2)).await.unwrap();
    assert_eq!((response.topics[0].error_code, response.topics[0].num_partitions), (0, 2));
    let response: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 2, &create("made", 2)).await.unwrap();
    assert_eq!(response.topics[0].error_code, TOPIC_ALREADY_EXISTS);
    let response: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 2, &create("bad/name", 1)).await.unwrap();
    assert_ne!(response.topics[0].error_code, 0);

    let describe = DescribeConfigsRequest::default().with_resources(vec![DescribeConfigsResource::default()
        .with_resource_type(2)
        .with_resource_name(StrBytes::from_static_str("made"))
        .with_configuration_keys(None)]);
    let response: DescribeConfigsResponse = client.call(ApiKey::DescribeConfigs, 4, &describe).await.unwrap();
    let configs = &response.results[0].configs;
    let retention = configs.iter().find(|c| c.name.as_str() == "retention.ms").unwrap();
    assert_eq!((retention.value.as_deref(), retention.config_source), (Some("3600000"), 1));
    let segment = configs.iter().find(|c| c.name.as_str() == "segment.bytes").unwrap();
    assert_eq!(segment.config_source, 5, "defaults are reported as such");

    let delete = DeleteTopicsRequest::default().with_topic_names(vec![topic_name("made"), topic_name("never")]);
    let response: DeleteTopicsResponse = client.call(ApiKey::DeleteTopics, 4, &delete).await.unwrap();
    assert_eq!(response.responses[0].error_code, 0);
    assert_eq!(response.responses[1].error_code, UNKNOWN_TOPIC_OR_PARTITION);
    let delete =
        DeleteTopicsRequest::default().with_topics(vec![DeleteTopicState::default().with_name(Some(topic_name("made")))]);
    let response: DeleteTopicsResponse = client.call(ApiKey::DeleteTopics, 6, &delete).await.unwrap();
    assert_eq!(response.responses[0].error_code, UNKNOWN_TOPIC_OR_PARTITION);
    assert_eq!(client.latest_offset("made").await.0, UNKNOWN_TOPIC_OR_PARTITION);
    assert!(!broker.data_dir.join("made-0").exists());
    // The name is free again.
    let response: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 7, &create("made", 1)).await.unwrap();
    assert_eq!(response.topics[0].error_code, 0);
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn oversized_garbage_and_truncated_frames_close_only_that_connection() {
    let (broker, _dir) = start(|c| c.socket_request_max_bytes = 1 << 20).await;
    let mut bystander = RawClient::connect(broker.addr).await.unwrap();
    produce(&mut bystander, "calm", batch(&["still here"])).await;

    // A frame announcing more than socket.request.max.bytes.
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut client.stream, &((1 << 20) + 1i32).to_be_bytes()).await.unwrap();
    assert!(client.is_closed_by_broker().await);
    // A negative length.
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut client.stream, &(-5i32).to_be_bytes()).await.unwrap();
    assert!(client.is_closed_by_broker().await);
    // A supported header followed by garbage.
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    client.send_frame(&[0, 3, 0, 9, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0x13, 0x37]).await.unwrap();
    assert!(client.is_closed_by_broker().await);
    // A well-framed request whose body stops short.
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    let frame = client.encode(ApiKey::Produce, 7, &produce_request("calm", 0, 1, 5000, batch(&["cut"])));
    client.send_frame(&frame[..frame.len() - 20]).await.unwrap();
    assert!(client.is_closed_by_broker().await);
    // Fewer bytes than a header.
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    client.send_frame(&[0, 18]).await.unwrap();
    assert!(client.is_closed_by_broker().await);

    // The bystander's connection is untouched, and new ones work.
    let response: FetchResponse = bystander.call(ApiKey::Fetch, 11, &fetch_request("calm", 0, 0, 1 << 20)).await.unwrap();
    assert_eq!(record_values(fetched_partition(&response).records.as_ref().unwrap()), ["still here"]);
    assert_eq!(bystander.latest_offset("calm").await, (0, 1));
    assert_broker_serves(&broker).await;
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn topics_and_data_survive_a_clean_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let broker = TestBroker::start_in(data.clone(), |c| c.num_partitions = 2).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    for i in 0..10 {
        produce(&mut client, "durable", batch(&[&format!("v{i}")])).await;
    }
    broker.stop().await.unwrap();

    let broker = TestBroker::start_in(data, |c| c.auto_create_topics = false).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    assert_eq!(client.latest_offset("durable").await, (0, 10));
    assert_eq!(produce(&mut client, "durable", batch(&["v10"])).await, (0, 10));
    let request = MetadataRequest::default()
        .with_topics(Some(vec![MetadataRequestTopic::default().with_name(Some(topic_name("durable")))]));
    let metadata: MetadataResponse = client.call(ApiKey::Metadata, 9, &request).await.unwrap();
    assert_eq!(metadata.topics[0].partitions.len(), 2);
    broker.stop().await.unwrap();
}

#[tokio::test]
async fn cleanup_policies_delete_and_compact_are_accepted_and_others_refused() {
    let (broker, _dir) = start(|_| {}).await;
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    let create = |topic: &str, policy: &'static str| {
        CreateTopicsRequest::default().with_timeout_ms(5000).with_topics(vec![CreatableTopic::default()
            .with_name(topic_name(topic))
            .with_num_partitions(1)
            .with_replication_factor(1)
            .with_configs(vec![CreatableTopicConfig::default()
                .with_name(StrBytes::from_static_str("cleanup.policy"))
                .with_value(Some(StrBytes::from_static_str(policy)))])])
    };
    for (topic, policy) in [("deleting", "delete"), ("compacted", "compact"), ("both", "compact,delete")] {
        let response: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 5, &create(topic, policy)).await.unwrap();
        assert_eq!(response.topics[0].error_code, 0, "{policy}");
    }
    let response: CreateTopicsResponse =
        client.call(ApiKey::CreateTopics, 5, &create("shredded", "compact,shred")).await.unwrap();
    assert_eq!(response.topics[0].error_code, 40, "INVALID_CONFIG");
    assert!(response.topics[0].error_message.as_deref().unwrap_or_default().contains("cleanup.policy"));
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retention_task_deletes_old_segments_and_moves_the_log_start() {
    let (broker, _dir) = start(|c| {
        c.retention_check_interval = Duration::from_millis(50);
        // Tiny segments for the test: below the 1 MiB floor, so the broker lowers it first.
        c.set("log.min.segment.bytes", "1024").unwrap();
        c.set("log.segment.bytes", "1024").unwrap();
        c.set("log.retention.ms", "60000").unwrap();
        c.set("log.segment.delete.delay.ms", "0").unwrap();
    })
    .await;
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    // Batches stamped in 2023: far older than retention.ms, so every sealed segment expires.
    let value = "r".repeat(600);
    for _ in 0..6 {
        produce(&mut client, "old", batch(&[&value])).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.list_offset("old", 0, EARLIEST).await.1 < 5 {
        assert!(Instant::now() < deadline, "retention never ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Only the active segment is left; reading below the log start is out of range.
    let response: FetchResponse = client.call(ApiKey::Fetch, 11, &fetch_request("old", 0, 0, 1 << 20)).await.unwrap();
    let p = fetched_partition(&response);
    assert_eq!((p.error_code, p.log_start_offset, p.high_watermark), (OFFSET_OUT_OF_RANGE, 5, 6));
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_that_fsync_run_on_the_blocking_pool_and_still_answer() {
    let (broker, _dir) = start(|c| c.set("log.flush.interval.messages", "1").unwrap()).await;
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    for i in 0..5 {
        assert_eq!(produce(&mut client, "synced", batch(&[&format!("s{i}")])).await, (0, i));
    }
    let response: FetchResponse = client.call(ApiKey::Fetch, 11, &fetch_request("synced", 0, 0, 1 << 20)).await.unwrap();
    assert_eq!(record_values(fetched_partition(&response).records.as_ref().unwrap()), ["s0", "s1", "s2", "s3", "s4"]);
    broker.stop().await.unwrap();
}

const INVALID_TOPIC_EXCEPTION: i16 = 17;
const INVALID_CONFIG: i16 = 40;
const INVALID_REQUEST: i16 = 42;
/// IncrementalAlterConfigs operations.
const SET: i8 = 0;
const DELETE: i8 = 1;
const APPEND: i8 = 2;

/// One legacy AlterConfigs of one topic at `version`: (error code, error message).
async fn alter_replacing(
    client: &mut RawClient,
    version: i16,
    topic: &str,
    configs: &[(&str, Option<&str>)],
) -> (i16, Option<String>) {
    common::alter_replacing(client, version, 2, topic, configs).await
}

/// A topic's configs as DescribeConfigs reports them: name → (value, config source).
async fn topic_configs(client: &mut RawClient, topic: &str) -> std::collections::BTreeMap<String, (String, i8)> {
    common::describe_configs(client, 2, topic).await
}

#[tokio::test]
async fn alter_configs_change_live_topics_and_refuse_bad_input_precisely() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let broker = TestBroker::start_in(data.clone(), |c| c.auto_create_topics = false).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    let create = CreateTopicsRequest::default().with_timeout_ms(5000).with_topics(vec![CreatableTopic::default()
        .with_name(topic_name("tunable"))
        .with_num_partitions(1)
        .with_replication_factor(1)
        .with_configs(vec![CreatableTopicConfig::default()
            .with_name(StrBytes::from_static_str("retention.ms"))
            .with_value(Some(StrBytes::from_static_str("3600000")))])]);
    let response: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 7, &create).await.unwrap();
    assert_eq!(response.topics[0].error_code, 0);
    let big = || batch(&[&"x".repeat(200)]);

    // SET, DELETE and APPEND at once; the live log applies the new max.message.bytes.
    let ops =
        [("max.message.bytes", SET, Some("100")), ("retention.ms", DELETE, None), ("cleanup.policy", APPEND, Some("compact"))];
    assert_eq!(alter_incrementally(&mut client, 2, "tunable", &ops, false).await, (0, None));
    let configs = topic_configs(&mut client, "tunable").await;
    assert_eq!(configs["max.message.bytes"], ("100".to_owned(), 1));
    assert_eq!(configs["retention.ms"].1, 5, "deleted: back to the default");
    assert_eq!(configs["cleanup.policy"], ("compact,delete".to_owned(), 1));
    assert_eq!(produce(&mut client, "tunable", big()).await.0, MESSAGE_TOO_LARGE);

    // validate_only checks and changes nothing.
    let ops = [("max.message.bytes", SET, Some("100000"))];
    assert_eq!(alter_incrementally(&mut client, 2, "tunable", &ops, true).await, (0, None));
    assert_eq!(topic_configs(&mut client, "tunable").await["max.message.bytes"].0, "100");
    assert_eq!(produce(&mut client, "tunable", big()).await.0, MESSAGE_TOO_LARGE);

    // Legacy AlterConfigs replaces the whole set; a null value leaves its key unset.
    assert_eq!(
        alter_replacing(&mut client, 0, "tunable", &[("segment.bytes", Some("1048576")), ("flush.ms", None)]).await,
        (0, None)
    );
    let configs = topic_configs(&mut client, "tunable").await;
    assert_eq!(configs["segment.bytes"], ("1048576".to_owned(), 1));
    assert_eq!(configs["max.message.bytes"].1, 5);
    assert_eq!(configs["cleanup.policy"], ("delete".to_owned(), 5));
    assert_eq!(configs["flush.ms"].1, 5);
    assert_eq!(produce(&mut client, "tunable", big()).await.0, 0);
    // The flexible version.
    let keep = [("segment.bytes", Some("1048576")), ("retention.ms", Some("60000"))];
    assert_eq!(alter_replacing(&mut client, 2, "tunable", &keep).await, (0, None));

    // Bad input: a precise code, a message naming what is wrong, and no change.
    let before = topic_configs(&mut client, "tunable").await;
    let (code, message) = alter_incrementally(&mut client, 2, "tunable", &[("retention.ms", SET, Some("soon"))], false).await;
    assert_eq!(code, INVALID_CONFIG);
    let message = message.unwrap();
    assert!(message.contains("retention.ms") && message.contains("soon"), "{message}");
    let (code, message) = alter_incrementally(&mut client, 2, "tunable", &[("no.such.config", SET, Some("1"))], false).await;
    assert_eq!(code, INVALID_CONFIG);
    assert!(message.unwrap().contains("no.such.config"));
    let (code, message) = alter_replacing(&mut client, 1, "tunable", &[("segment.bytes", Some("-5"))]).await;
    assert_eq!(code, INVALID_CONFIG);
    assert!(message.unwrap().contains("segment.bytes"));
    for ops in [
        &[("retention.ms", APPEND, Some("1"))][..],
        &[("retention.ms", 9, Some("1"))],
        &[("retention.ms", SET, None)],
        &[("retention.ms", SET, Some("1")), ("retention.ms", DELETE, None)],
    ] {
        assert_eq!(alter_incrementally(&mut client, 2, "tunable", ops, false).await.0, INVALID_REQUEST, "{ops:?}");
    }
    let set = [("retention.ms", SET, Some("1"))];
    assert_eq!(alter_incrementally(&mut client, 2, "nope", &set, false).await.0, UNKNOWN_TOPIC_OR_PARTITION);
    assert_eq!(alter_incrementally(&mut client, 2, "a/b", &set, false).await.0, INVALID_TOPIC_EXCEPTION);
    let (code, message) = alter_incrementally(&mut client, 4, "0", &[("log.retention.ms", SET, Some("1"))], false).await;
    assert_eq!(code, INVALID_REQUEST, "broker configs are static");
    assert!(message.unwrap().contains("broker configs"));
    // The same resource twice: both refused.
    let twice = alter_configs_request::AlterConfigsResource::default()
        .with_resource_type(2)
        .with_resource_name(StrBytes::from_static_str("tunable"));
    let request = AlterConfigsRequest::default().with_resources(vec![twice.clone(), twice]);
    let response: AlterConfigsResponse = client.call(ApiKey::AlterConfigs, 1, &request).await.unwrap();
    assert_eq!(response.responses.iter().map(|r| r.error_code).collect::<Vec<_>>(), [INVALID_REQUEST, INVALID_REQUEST]);
    assert_eq!(topic_configs(&mut client, "tunable").await, before);

    // A body whose configs array claims 2^31-1 entries closes only that connection.
    let mut bad = RawClient::connect(broker.addr).await.unwrap();
    let empty = bad.encode(ApiKey::IncrementalAlterConfigs, 0, &IncrementalAlterConfigsRequest::default());
    let mut frame = empty[..empty.len() - 5].to_vec(); // the header: drop `resources: []` and `validate_only`
    frame.extend(1i32.to_be_bytes());
    frame.extend([2, 0, 1, b't']);
    frame.extend(i32::MAX.to_be_bytes());
    frame.push(0);
    bad.send_frame(&frame).await.unwrap();
    assert!(bad.is_closed_by_broker().await);
    assert_eq!(topic_configs(&mut client, "tunable").await, before);

    // The new config is stored: a restart finds it.
    broker.stop().await.unwrap();
    let broker = TestBroker::start_in(data, |c| c.auto_create_topics = false).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    assert_eq!(topic_configs(&mut client, "tunable").await, before);
    assert_eq!(before["retention.ms"], ("60000".to_owned(), 1));
    broker.stop().await.unwrap();
}

/// The standard topic configs tools send on create are taken and do what Kafka does
/// (#27 item 7, librdkafka tests 0081, 0052, 0077): `compression.type=zstd` stores a
/// producer's uncompressed batch recompressed with zstd, records unchanged;
/// `message.timestamp.type=LogAppendTime` stamps it with the append time;
/// `max.compaction.lag.ms` is kept and described; the defaults (`producer`,
/// `CreateTime`) and the keys accepted and ignored (`message.format.version`) are taken.
/// AlterConfigs of either kind on a missing topic is UNKNOWN_TOPIC_OR_PARTITION, whatever
/// keys it names.
#[tokio::test]
async fn standard_topic_configs_recompress_stamp_append_time_and_alter_on_a_missing_topic_is_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), |c| c.auto_create_topics = false).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    let create = |topic: &str, configs: &[(&str, &str)]| {
        CreateTopicsRequest::default().with_timeout_ms(5000).with_topics(vec![CreatableTopic::default()
            .with_name(topic_name(topic))
            .with_num_partitions(1)
            .with_replication_factor(1)
            .with_configs(
                configs
                    .iter()
                    .map(|(k, v)| {
                        CreatableTopicConfig::default()
                            .with_name(StrBytes::from_string(k.to_string()))
                            .with_value(Some(StrBytes::from_string(v.to_string())))
                    })
                    .collect(),
            )])
    };
    let stamped = [("compression.type", "zstd"), ("message.timestamp.type", "LogAppendTime"), ("max.compaction.lag.ms", "60000")];
    let defaults =
        [("compression.type", "producer"), ("message.timestamp.type", "CreateTime"), ("message.format.version", "3.0")];
    for (topic, configs) in [("stamped", &stamped), ("defaults", &defaults)] {
        let response: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 5, &create(topic, configs)).await.unwrap();
        assert_eq!(response.topics[0].error_code, 0, "{topic}: {:?}", response.topics[0].error_message);
    }
    let configs = topic_configs(&mut client, "stamped").await;
    for (key, value) in stamped {
        assert_eq!(configs[key], (value.to_owned(), 1), "{key}");
    }
    assert_eq!(topic_configs(&mut client, "defaults").await["max.compaction.lag.ms"].0, i64::MAX.to_string());

    let before = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    for topic in ["stamped", "defaults"] {
        assert_eq!(produce(&mut client, topic, batch(&["a", "b", "c"])).await, (0, 0), "{topic}");
    }
    let after = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let stored = |response: &FetchResponse| {
        let records = fetched_partition(response).records.clone().unwrap();
        let header = fjord_record::BatchHeader::parse_validated(&records).unwrap();
        let body = fjord_record::compression::records_body(&header, &records, 1 << 20).unwrap();
        let values: Vec<String> = fjord_record::Records::new(&body, 0)
            .map(|r| String::from_utf8(r.unwrap().value.unwrap().to_vec()).unwrap())
            .collect();
        (header, values)
    };
    let response: FetchResponse = client.call(ApiKey::Fetch, 11, &fetch_request("stamped", 0, 0, 1 << 20)).await.unwrap();
    let (header, values) = stored(&response);
    assert_eq!(values, ["a", "b", "c"]);
    assert_eq!(header.compression(), fjord_record::Compression::Zstd);
    assert_eq!(header.timestamp_type(), fjord_record::TimestampType::LogAppendTime);
    assert!((before..=after).contains(&header.max_timestamp), "{} not in {before}..={after}", header.max_timestamp);
    let response: FetchResponse = client.call(ApiKey::Fetch, 11, &fetch_request("defaults", 0, 0, 1 << 20)).await.unwrap();
    let (header, values) = stored(&response);
    assert_eq!(values, ["a", "b", "c"]);
    assert_eq!(header.compression(), fjord_record::Compression::None);
    assert_eq!((header.timestamp_type(), header.max_timestamp), (fjord_record::TimestampType::CreateTime, 1_700_000_000_002));

    for configs in [&[("compression.type", Some("gzip"))][..], &[("no.such.key", Some("1"))]] {
        assert_eq!(alter_replacing(&mut client, 1, "missing", configs).await.0, UNKNOWN_TOPIC_OR_PARTITION, "{configs:?}");
    }
    for ops in [&[("compression.type", SET, Some("gzip"))][..], &[("no.such.key", SET, Some("1"))]] {
        assert_eq!(alter_incrementally(&mut client, 2, "missing", ops, false).await.0, UNKNOWN_TOPIC_OR_PARTITION, "{ops:?}");
    }
    // On a topic that exists the keys are checked as before.
    assert_eq!(
        alter_incrementally(&mut client, 2, "stamped", &[("compression.type", SET, Some("brotli"))], false).await.0,
        INVALID_CONFIG
    );
    assert_eq!(alter_incrementally(&mut client, 2, "stamped", &[("compression.type", SET, Some("gzip"))], false).await.0, 0);
    broker.stop().await.unwrap();
}
