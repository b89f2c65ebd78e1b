//! DescribeTopicPartitions (API 75, KIP-966, issue #22) over the raw protocol, as Kafka's
//! admin client pages through it: with a limit of 2 partitions per response, following
//! `next_cursor` from a topic of 5 partitions into the next topic answers every partition
//! exactly once, in order, each with its leader, epoch, replicas and ISR, and ends with no
//! cursor; no topics named means every topic; a missing topic is UNKNOWN_TOPIC_OR_PARTITION
//! and is not created; a cursor naming a topic outside the list is INVALID_REQUEST.

mod common;

use common::{topic_name, RawClient, TestBroker};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::describe_topic_partitions_request::{Cursor, TopicRequest};
use kafka_protocol::messages::{
    ApiKey, CreateTopicsRequest, CreateTopicsResponse, DescribeTopicPartitionsRequest, DescribeTopicPartitionsResponse,
};

const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const INVALID_REQUEST: i16 = 42;

async fn create(client: &mut RawClient, name: &str, partitions: i32) {
    let request = CreateTopicsRequest::default().with_timeout_ms(10_000).with_topics(vec![CreatableTopic::default()
        .with_name(topic_name(name))
        .with_num_partitions(partitions)
        .with_replication_factor(1)]);
    let response: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 7, &request).await.unwrap();
    assert_eq!(response.topics[0].error_code, 0, "{:?}", response.topics[0]);
}

async fn describe(
    client: &mut RawClient,
    topics: &[&str],
    limit: i32,
    cursor: Option<Cursor>,
) -> DescribeTopicPartitionsResponse {
    let request = DescribeTopicPartitionsRequest::default()
        .with_topics(topics.iter().map(|t| TopicRequest::default().with_name(topic_name(t))).collect())
        .with_response_partition_limit(limit)
        .with_cursor(cursor);
    client.call(ApiKey::DescribeTopicPartitions, 0, &request).await.unwrap()
}

/// Every (topic, partition) of the pages from `topics` at `limit` per page, following the
/// cursor until there is none, and how many pages that took.
async fn walk(client: &mut RawClient, topics: &[&str], limit: i32) -> (Vec<(String, i32)>, usize) {
    let mut seen = Vec::new();
    let mut cursor = None;
    let mut pages = 0;
    loop {
        let page = describe(client, topics, limit, cursor).await;
        pages += 1;
        let count: usize = page.topics.iter().map(|t| t.partitions.len()).sum();
        assert!(count <= limit as usize, "page {pages} holds {count} partitions, limit {limit}: {page:?}");
        for topic in &page.topics {
            assert_eq!(topic.error_code, 0, "{topic:?}");
            assert!(!topic.topic_id.is_nil(), "{topic:?}");
            assert!(!topic.is_internal);
            for p in &topic.partitions {
                assert_eq!(p.error_code, 0, "{p:?}");
                assert_eq!(p.leader_id.0, 0, "the one broker leads every partition: {p:?}");
                assert!(p.leader_epoch >= 0, "{p:?}");
                assert_eq!(p.replica_nodes.iter().map(|b| b.0).collect::<Vec<_>>(), vec![0]);
                assert_eq!(p.isr_nodes.iter().map(|b| b.0).collect::<Vec<_>>(), vec![0]);
                assert_eq!(p.eligible_leader_replicas.as_deref(), Some(&[][..]));
                assert!(p.offline_replicas.is_empty(), "{p:?}");
                seen.push((topic.name.as_ref().unwrap().0.to_string(), p.partition_index));
            }
        }
        match page.next_cursor {
            Some(next) => {
                cursor = Some(Cursor::default().with_topic_name(next.topic_name).with_partition_index(next.partition_index))
            }
            None => return (seen, pages),
        }
        assert!(pages < 20, "the cursor does not end: {seen:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_limit_pages_through_every_partition_once_by_the_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), |_| {}).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    create(&mut client, "pages", 5).await;
    create(&mut client, "pages-other", 1).await;
    let every: Vec<(String, i32)> =
        (0..5).map(|p| ("pages".to_owned(), p)).chain(std::iter::once(("pages-other".to_owned(), 0))).collect();

    // Named (in any order) and all topics alike: 6 partitions in pages of 2, 2, 2.
    assert_eq!(walk(&mut client, &["pages-other", "pages"], 2).await, (every.clone(), 3));
    assert_eq!(walk(&mut client, &[], 2).await, (every.clone(), 3));
    // Pages of 3 end on a topic's last partition: the next page starts the next topic.
    assert_eq!(walk(&mut client, &["pages", "pages-other"], 3).await, (every.clone(), 2));
    let first = describe(&mut client, &["pages", "pages-other"], 5, None).await;
    let next = first.next_cursor.expect("a sixth partition is left");
    assert_eq!((next.topic_name.0.as_str(), next.partition_index), ("pages-other", 0));
    // Room for everything: one page, no cursor.
    assert_eq!(walk(&mut client, &["pages", "pages-other"], 100).await, (every, 1));

    let missing = describe(&mut client, &["absent"], 10, None).await;
    assert_eq!(missing.topics.len(), 1);
    assert_eq!(missing.topics[0].error_code, UNKNOWN_TOPIC_OR_PARTITION);
    assert!(missing.next_cursor.is_none());
    let again = describe(&mut client, &["absent"], 10, None).await;
    assert_eq!(again.topics[0].error_code, UNKNOWN_TOPIC_OR_PARTITION, "the topic was not auto-created");

    let stray = Cursor::default().with_topic_name(topic_name("elsewhere")).with_partition_index(0);
    let rejected = describe(&mut client, &["pages"], 10, Some(stray)).await;
    assert_eq!(rejected.topics.iter().map(|t| t.error_code).collect::<Vec<_>>(), vec![INVALID_REQUEST]);
    broker.stop().await.unwrap();
}
