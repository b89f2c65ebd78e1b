//! A corrupt batch in a sealed segment (issue 26, case 6): a Fetch that reaches it is
//! answered with CORRUPT_MESSAGE for the partition (no records, never the data after
//! it as if nothing were missing), the batches before it are fetched as usual, and the
//! metrics count it.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use common::{produce_request, topic_name, RawClient, TestBroker};
use fjord_record::BatchBuilder;
use fjord_testkit::segments;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::*;

const TOPIC: &str = "damaged";
const CORRUPT_MESSAGE: i16 = 2;

fn batch(i: usize) -> Bytes {
    let mut builder = BatchBuilder::new(1_700_000_000_000);
    for r in 0..4 {
        builder.append(1_700_000_000_000, Some(b"k"), Some(format!("value {i}.{r} {}", "x".repeat(60)).as_bytes()), &[]);
    }
    builder.build()
}

async fn fetch(client: &mut RawClient, offset: i64) -> fetch_response::PartitionData {
    let request = FetchRequest::default().with_max_wait_ms(0).with_min_bytes(1).with_topics(vec![FetchTopic::default()
        .with_topic(topic_name(TOPIC))
        .with_partitions(vec![FetchPartition::default()
            .with_partition(0)
            .with_fetch_offset(offset)
            .with_partition_max_bytes(700)])]);
    let response: FetchResponse = client.call(ApiKey::Fetch, 11, &request).await.unwrap();
    response.responses[0].partitions[0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_over_a_corrupt_sealed_batch_answers_corrupt_message() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let configure = |metrics: SocketAddr| {
        move |c: &mut fjord_broker::BrokerConfig| {
            c.set("log.min.segment.bytes", "1024").unwrap();
            c.set("log.segment.bytes", "1024").unwrap();
            c.metrics_listen = Some(metrics);
        }
    };
    let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let broker = TestBroker::start_in(data.clone(), configure(free())).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    for i in 0..12 {
        assert_eq!(client.produce(7, &produce_request(TOPIC, 0, 1, 5000, batch(i))).await.0, 0);
    }
    broker.stop().await.unwrap();

    // One flipped byte inside the second batch of the second segment.
    let logs = segments(&data.join(format!("{TOPIC}-0"))).unwrap();
    assert!(logs.len() >= 4, "{logs:?}");
    let bytes = std::fs::read(&logs[1]).unwrap();
    let first = fjord_record::BatchHeader::parse(&bytes).unwrap();
    let second = fjord_record::BatchHeader::parse(&bytes[first.size()..]).unwrap();
    let mut damaged = bytes.clone();
    damaged[first.size() + 100] ^= 0x01;
    std::fs::write(&logs[1], damaged).unwrap();

    let metrics_addr = free();
    let broker = TestBroker::start_in(data, configure(metrics_addr)).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    // A consumer from the start: everything before the damaged batch, then the error.
    let mut offset = 0;
    let mut records = 0;
    let error = loop {
        let p = fetch(&mut client, offset).await;
        if p.error_code != 0 {
            assert!(p.records.as_ref().is_none_or(Bytes::is_empty), "no records with the error");
            break p.error_code;
        }
        let fetched = p.records.unwrap();
        assert!(!fetched.is_empty(), "no data at {offset} and no error: skipped?");
        for b in fjord_record::batch::batches(&fetched) {
            let (h, _) = b.expect("only valid batches are served");
            assert_eq!(h.base_offset, offset, "offsets follow on: nothing skipped");
            offset = h.next_offset();
            records += h.record_count;
        }
    };
    assert_eq!(error, CORRUPT_MESSAGE);
    assert_eq!(offset, second.base_offset, "stopped exactly at the damaged batch");
    assert_eq!(i64::from(records), second.base_offset);
    // The same answer again, and for an offset inside the damaged batch.
    assert_eq!(fetch(&mut client, offset).await.error_code, CORRUPT_MESSAGE);
    assert_eq!(fetch(&mut client, offset + 2).await.error_code, CORRUPT_MESSAGE);
    let text = fjord_testkit::scrape_metrics(metrics_addr).await.unwrap();
    assert!(
        text.contains(&format!("fjord_broker_log_corrupt_batches{{topic=\"{TOPIC}\",partition=\"0\"}} 1")),
        "corrupt batch counted once: {text}"
    );
    broker.stop().await.unwrap();
}

async fn metadata(client: &mut RawClient, topics: &[&str]) -> MetadataResponse {
    let request = MetadataRequest::default().with_topics(Some(
        topics.iter().map(|t| metadata_request::MetadataRequestTopic::default().with_name(Some(topic_name(t)))).collect(),
    ));
    client.call(ApiKey::Metadata, 9, &request).await.unwrap()
}

/// A partition whose log cannot be opened stays offline while the others are served, and
/// says so: Metadata lists the replica in offline_replicas with no leader (the controller
/// never elects an unopenable copy, and there is no other),
/// Produce and Fetch answer KAFKA_STORAGE_ERROR (not NOT_LEADER_OR_FOLLOWER, which sends a
/// client looking for another leader forever), and the metrics name it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_whose_log_cannot_be_opened_is_reported_offline_and_the_others_are_served() {
    const STORAGE_ERROR: i16 = 56;
    const LEADER_NOT_AVAILABLE: i16 = 5;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let broker = TestBroker::start_in(data.clone(), |_| {}).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    for topic in ["unreadable", "fine"] {
        assert_eq!(client.produce(7, &produce_request(topic, 0, 1, 5000, batch(0))).await.0, 0);
    }
    let healthy = metadata(&mut client, &["unreadable", "fine"]).await;
    assert!(healthy.topics.iter().all(|t| t.partitions[0].error_code == 0 && t.partitions[0].offline_replicas.is_empty()));
    broker.stop().await.unwrap();

    // The segment becomes unreadable: a directory where its file was.
    let segment = data.join("unreadable-0").join("00000000000000000000.log");
    std::fs::remove_file(&segment).unwrap();
    std::fs::create_dir(&segment).unwrap();

    let metrics_addr = free();
    let broker = TestBroker::start_in(data, |c| c.metrics_listen = Some(metrics_addr)).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    // The controller moves leadership off the unopenable copy; with no other replica the
    // partition has no leader (Kafka's LEADER_NOT_AVAILABLE), its copy listed offline.
    // Until the controller has acted it answers KAFKA_STORAGE_ERROR.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let response = loop {
        let response = metadata(&mut client, &["unreadable", "fine"]).await;
        let settled = response.topics.iter().any(|t| {
            t.name.as_ref().is_some_and(|n| n.0.as_str() == "unreadable") && t.partitions[0].error_code == LEADER_NOT_AVAILABLE
        });
        if settled {
            break response;
        }
        assert!(tokio::time::Instant::now() < deadline, "leadership never moved off the unopenable copy: {response:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let partition = |name: &str| {
        let t = response.topics.iter().find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == name)).unwrap();
        t.partitions[0].clone()
    };
    let offline = partition("unreadable");
    assert_eq!((offline.leader_id, offline.offline_replicas.clone()), (BrokerId(-1), vec![BrokerId(0)]));
    let fine = partition("fine");
    assert_eq!((fine.error_code, fine.offline_replicas.len()), (0, 0));

    assert_eq!(client.produce(7, &produce_request("unreadable", 0, 1, 5000, batch(1))).await.0, STORAGE_ERROR);
    assert_eq!(client.produce(7, &produce_request("fine", 0, 1, 5000, batch(1))).await.0, 0);
    let request = FetchRequest::default().with_max_wait_ms(0).with_min_bytes(1).with_topics(vec![FetchTopic::default()
        .with_topic(topic_name("unreadable"))
        .with_partitions(vec![FetchPartition::default().with_partition(0).with_fetch_offset(0).with_partition_max_bytes(700)])]);
    let response: FetchResponse = client.call(ApiKey::Fetch, 11, &request).await.unwrap();
    assert_eq!(response.responses[0].partitions[0].error_code, STORAGE_ERROR);

    let text = fjord_testkit::scrape_metrics(metrics_addr).await.unwrap();
    assert!(text.contains("fjord_broker_unhealthy_partitions 1\n"), "{text}");
    assert!(
        text.contains("fjord_broker_partition_unhealthy{topic=\"unreadable\",partition=\"0\",state=\"offline\"} 1\n"),
        "{text}"
    );
    broker.stop().await.unwrap();
}
