//! Topic ids (KIP-516, issue #22), on one broker with the embedded store:
//! - CreateTopics v7 answers a non-nil id, which Metadata v12 shows by name and finds by
//!   id; an unknown id is UNKNOWN_TOPIC_ID;
//! - Fetch v13 reads by id, answers with the id, and answers UNKNOWN_TOPIC_ID for an
//!   unknown or nil id; Fetch v12 by name still reads;
//! - DeleteTopics v6 by a wrong id deletes nothing (UNKNOWN_TOPIC_ID), by both name and
//!   id is INVALID_REQUEST, by the right id deletes; the topic created again under the
//!   same name has another id, and a Fetch by the old id is UNKNOWN_TOPIC_ID;
//! - a topic stored without an id (before ids existed) gets one at the next start, kept
//!   in the store and the same after another restart, its records untouched, and its
//!   partition's log (without `partition.metadata`, as then) records the new id;
//! - confluent-kafka's AdminClient (`describe_topics`) and consumer (Fetch v13 through
//!   librdkafka) see the id and read by it; after a delete and re-create the id differs.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{produce_request, run_python, topic_name, RawClient, TestBroker};
use fjord_coord::paths;
use fjord_coord::registry::{read_json, to_json, TopicAssignment};
use fjord_record::BatchBuilder;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    ApiKey, BrokerId, CreateTopicsRequest, CreateTopicsResponse, DeleteTopicsRequest, DeleteTopicsResponse, FetchRequest,
    FetchResponse, MetadataRequest, MetadataResponse,
};
use uuid::Uuid;

const UNKNOWN_TOPIC_ID: i16 = 100;
const INVALID_REQUEST: i16 = 42;

fn batch(value: &str) -> Bytes {
    let mut builder = BatchBuilder::new(1_700_000_000_000);
    builder.append(1_700_000_000_000, Some(b"k"), Some(value.as_bytes()), &[]);
    builder.build()
}

async fn create(client: &mut RawClient, name: &str) -> Uuid {
    let request = CreateTopicsRequest::default().with_timeout_ms(10_000).with_topics(vec![CreatableTopic::default()
        .with_name(topic_name(name))
        .with_num_partitions(1)
        .with_replication_factor(1)]);
    let response: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 7, &request).await.unwrap();
    let result = &response.topics[0];
    assert_eq!(result.error_code, 0, "{result:?}");
    result.topic_id
}

/// Metadata v12 of one topic, by name or by id: (error code, name, id).
async fn metadata(client: &mut RawClient, topic: MetadataRequestTopic) -> (i16, Option<String>, Uuid) {
    let request = MetadataRequest::default().with_topics(Some(vec![topic])).with_allow_auto_topic_creation(false);
    let response: MetadataResponse = client.call(ApiKey::Metadata, 12, &request).await.unwrap();
    let [topic] = &response.topics[..] else { panic!("one topic asked, {} answered", response.topics.len()) };
    (topic.error_code, topic.name.as_ref().map(|n| n.0.to_string()), topic.topic_id)
}

fn by_name(name: &str) -> MetadataRequestTopic {
    MetadataRequestTopic::default().with_name(Some(topic_name(name)))
}

fn by_id(id: Uuid) -> MetadataRequestTopic {
    MetadataRequestTopic::default().with_name(None).with_topic_id(id)
}

/// Fetch of partition 0 from offset 0: v13 by `id`, v12 by `name`. Returns the topic's
/// id in the answer, the partition's error code and the bytes of records.
async fn fetch(client: &mut RawClient, version: i16, name: &str, id: Uuid) -> (Uuid, i16, usize) {
    let topic =
        if version >= 13 { FetchTopic::default().with_topic_id(id) } else { FetchTopic::default().with_topic(topic_name(name)) };
    let request =
        FetchRequest::default().with_replica_id(BrokerId(-1)).with_max_wait_ms(0).with_max_bytes(1 << 20).with_topics(vec![
            topic.with_partitions(vec![FetchPartition::default()
                .with_partition(0)
                .with_fetch_offset(0)
                .with_partition_max_bytes(1 << 20)]),
        ]);
    let response: FetchResponse = client.call(ApiKey::Fetch, version, &request).await.unwrap();
    let topic = &response.responses[0];
    if version < 13 {
        assert_eq!(topic.topic.0.as_str(), name);
    }
    let p = &topic.partitions[0];
    (topic.topic_id, p.error_code, p.records.as_ref().map_or(0, Bytes::len))
}

/// DeleteTopics v6 of one topic: (error code, name answered, id answered).
async fn delete(client: &mut RawClient, state: DeleteTopicState) -> (i16, Option<String>, Uuid) {
    let request = DeleteTopicsRequest::default().with_timeout_ms(10_000).with_topics(vec![state]);
    let response: DeleteTopicsResponse = client.call(ApiKey::DeleteTopics, 6, &request).await.unwrap();
    let r = &response.responses[0];
    (r.error_code, r.name.as_ref().map(|n| n.0.to_string()), r.topic_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_are_named_by_id_in_metadata_fetch_and_delete_and_a_recreated_topic_has_a_new_id() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), |_| {}).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();

    let id = create(&mut client, "ids").await;
    assert!(!id.is_nil(), "CreateTopics v7 answers the new topic's id");
    assert_eq!(metadata(&mut client, by_name("ids")).await, (0, Some("ids".into()), id));
    assert_eq!(metadata(&mut client, by_id(id)).await, (0, Some("ids".into()), id), "Metadata v12 finds a topic by id");
    let stranger = Uuid::from_u128(0xdead_beef);
    assert_eq!(metadata(&mut client, by_id(stranger)).await, (UNKNOWN_TOPIC_ID, None, stranger));
    let other = create(&mut client, "ids-other").await;
    assert_ne!(other, id, "every topic has its own id");

    let (error, _) = client.produce(7, &produce_request("ids", 0, -1, 5_000, batch("first"))).await;
    assert_eq!(error, 0);
    let (answered, error, bytes) = fetch(&mut client, 13, "", id).await;
    assert_eq!((answered, error), (id, 0), "Fetch v13 reads by id and answers with it");
    assert!(bytes > 0, "the produced batch comes back by id");
    let (_, error, bytes_v12) = fetch(&mut client, 12, "ids", Uuid::nil()).await;
    assert_eq!((error, bytes_v12), (0, bytes), "Fetch v12 by name reads the same bytes");
    assert_eq!(fetch(&mut client, 13, "", stranger).await, (stranger, UNKNOWN_TOPIC_ID, 0));
    assert_eq!(fetch(&mut client, 13, "", Uuid::nil()).await, (Uuid::nil(), UNKNOWN_TOPIC_ID, 0));

    // DeleteTopics v6: a wrong id deletes nothing, both name and id is refused.
    let (error, _, _) = delete(&mut client, DeleteTopicState::default().with_topic_id(stranger)).await;
    assert_eq!(error, UNKNOWN_TOPIC_ID);
    let both = DeleteTopicState::default().with_name(Some(topic_name("ids"))).with_topic_id(id);
    assert_eq!(delete(&mut client, both).await.0, INVALID_REQUEST);
    assert_eq!(metadata(&mut client, by_name("ids")).await.0, 0, "still there");
    assert_eq!(delete(&mut client, DeleteTopicState::default().with_topic_id(id)).await, (0, Some("ids".into()), id));
    assert_eq!(metadata(&mut client, by_id(id)).await.0, UNKNOWN_TOPIC_ID);
    // By name, the answer carries the id too.
    assert_eq!(
        delete(&mut client, DeleteTopicState::default().with_name(Some(topic_name("ids-other")))).await,
        (0, Some("ids-other".into()), other)
    );

    let again = create(&mut client, "ids").await;
    assert!(!again.is_nil() && again != id, "the topic created again under the same name has a new id");
    assert_eq!(fetch(&mut client, 13, "", id).await.1, UNKNOWN_TOPIC_ID, "the old id names no topic");
    assert_eq!(fetch(&mut client, 13, "", again).await, (again, 0, 0), "the new topic is empty");
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_stored_without_an_id_gets_one_once_and_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let broker = TestBroker::start_in(data.clone(), |_| {}).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    let created = create(&mut client, "legacy").await;
    assert_eq!(client.produce(7, &produce_request("legacy", 0, -1, 5_000, batch("kept"))).await, (0, 0));
    drop(client);
    broker.stop().await.unwrap();

    // As a broker from before topic ids wrote it: no `topic_id` key, and no
    // `partition.metadata` in the partition's directory.
    let metadata_file = data.join("legacy-0").join(fjord_log::partition_metadata::PARTITION_METADATA);
    std::fs::remove_file(&metadata_file).expect("the partition recorded its topic's id");
    let config = fjord_broker::BrokerConfig { log_dir: data.clone(), ..fjord_broker::BrokerConfig::default() };
    let store = fjord_broker::server::open_store(&config).await.unwrap();
    let path = paths::topic("legacy");
    let (mut assignment, _) = read_json::<TopicAssignment>(&*store, &path).await.unwrap().unwrap();
    assert!(assignment.topic_id.is_some(), "a created topic's id is stored");
    assignment.topic_id = None;
    store.set(&path, &to_json(&assignment), None).await.unwrap();
    assert!(!String::from_utf8(store.get(&path).await.unwrap().unwrap().0).unwrap().contains("topic_id"));
    drop(store);

    let broker = TestBroker::start_in(data.clone(), |_| {}).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    // The view publishes the topic as read, then again once the id is written.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let assigned = loop {
        let (error, _, id) = metadata(&mut client, by_name("legacy")).await;
        assert_eq!(error, 0);
        if !id.is_nil() {
            break id;
        }
        assert!(tokio::time::Instant::now() < deadline, "no id was assigned within 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_ne!(assigned, created, "a new id, not the deleted key's");
    let (answered, error, bytes) = fetch(&mut client, 13, "", assigned).await;
    assert_eq!((answered, error), (assigned, 0));
    assert!(bytes > 0, "the records written before are read by the new id");
    let recorded = std::fs::read_to_string(&metadata_file).unwrap();
    let recorded = fjord_log::partition_metadata::parse(recorded.as_bytes()).unwrap();
    assert_eq!(Uuid::from_bytes(recorded), assigned, "the log adopts the assigned id");
    drop(client);
    broker.stop().await.unwrap();

    let broker = TestBroker::start_in(data, |_| {}).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    assert_eq!(metadata(&mut client, by_name("legacy")).await, (0, Some("legacy".into()), assigned), "kept across a restart");
    drop(client);
    broker.stop().await.unwrap();
}

const SCRIPT: &str = r#"
import sys, time
from confluent_kafka import Consumer, Producer, TopicCollection
from confluent_kafka.admin import AdminClient, NewTopic

bootstrap = sys.argv[1]
admin = AdminClient({'bootstrap.servers': bootstrap})

def create():
    for f in admin.create_topics([NewTopic('cids', 2, 1)]).values():
        f.result(20)

def topic_id():
    [d] = admin.describe_topics(TopicCollection(['cids'])).values()
    return str(d.result(20).topic_id)

create()
first = topic_id()
assert first and first != 'AAAAAAAAAAAAAAAAAAAAAA', first
assert topic_id() == first

p = Producer({'bootstrap.servers': bootstrap})
for i in range(10):
    p.produce('cids', value=b'v%d' % i, partition=i % 2)
assert p.flush(20) == 0

# librdkafka fetches by topic id (Fetch v13) from this broker.
c = Consumer({'bootstrap.servers': bootstrap, 'group.id': 'cids', 'auto.offset.reset': 'earliest'})
c.subscribe(['cids'])
got = set()
deadline = time.time() + 30
while len(got) < 10 and time.time() < deadline:
    m = c.poll(1)
    if m is not None and m.error() is None:
        got.add(m.value())
c.close()
assert got == {b'v%d' % i for i in range(10)}, got

for f in admin.delete_topics(['cids']).values():
    f.result(20)
deadline = time.time() + 20
while True:
    try:
        create()
        break
    except Exception:
        assert time.time() < deadline
        time.sleep(0.2)
second = topic_id()
assert second != first, (first, second)
print("ok")
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confluent_kafka_sees_topic_ids_and_consumes_by_them() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), |_| {}).await.unwrap();
    run_python(SCRIPT, &[&broker.bootstrap()], Duration::from_secs(120)).await;
    broker.stop().await.unwrap();
}
