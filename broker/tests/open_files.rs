//! Issue #26, case 5: a broker started with a low soft open-file limit (1,024 is a
//! common default) could not open the logs of a large topic: partitions past the limit
//! were advertised but answered NOT_LEADER_OR_FOLLOWER forever, and a restart exited with
//! "Too many open files". The broker now raises the soft limit to the hard one at start.
//!
//! Its own test binary: the test lowers this process's soft limit, which would starve
//! any test running beside it.

mod common;

use common::{produce_request, topic_name, RawClient, TestBroker, LATEST};
use fjord_record::BatchBuilder;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::{ApiKey, CreateTopicsRequest, CreateTopicsResponse};
use nix::sys::resource::{getrlimit, setrlimit, Resource};

/// The soft limit the test starts each broker with, far below what the topic needs.
const LOW_SOFT_LIMIT: u64 = 128;
/// Partitions of the topic: each holds at least one descriptor.
const PARTITIONS: i32 = 300;

fn lower_soft_limit() {
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    // The broker's default partition limit: half the (raised) limit, less the sealed
    // segment files' cache (1,024), three descriptors per partition.
    let needed = 2 * (3 * PARTITIONS as u64 + 1024);
    assert!(hard >= needed, "this test needs a hard open-file limit of at least {needed}");
    setrlimit(Resource::RLIMIT_NOFILE, LOW_SOFT_LIMIT, hard).unwrap();
}

/// Every partition of `topic` answers ListOffsets (as the leader) without an error:
/// the log end offset of each.
async fn log_ends(client: &mut RawClient, topic: &str) -> Vec<i64> {
    let mut ends = Vec::with_capacity(PARTITIONS as usize);
    for p in 0..PARTITIONS {
        let (code, offset) = client.list_offset(topic, p, LATEST).await;
        assert_eq!(code, 0, "partition {p} of {PARTITIONS} is not served");
        ends.push(offset);
    }
    ends
}

#[tokio::test]
async fn a_broker_with_many_partitions_serves_them_all_and_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    lower_soft_limit();
    let broker = TestBroker::start_in(data.clone(), |_| {}).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    let request = CreateTopicsRequest::default().with_timeout_ms(60_000).with_topics(vec![CreatableTopic::default()
        .with_name(topic_name("many"))
        .with_num_partitions(PARTITIONS)
        .with_replication_factor(1)]);
    let response: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 5, &request).await.unwrap();
    assert_eq!(response.topics[0].error_code, 0, "{:?}", response.topics[0].error_message);
    let mut batch = BatchBuilder::new(1_700_000_000_000);
    batch.append(1_700_000_000_000, None, Some(b"last"), &[]);
    let (code, _) = client.produce(7, &produce_request("many", PARTITIONS - 1, -1, 5000, batch.build())).await;
    assert_eq!(code, 0, "produce to the last partition");
    let mut expected = vec![0; PARTITIONS as usize];
    expected[PARTITIONS as usize - 1] = 1;
    assert_eq!(log_ends(&mut client, "many").await, expected);
    drop(client);
    broker.stop().await.unwrap();

    // The restart opens every log before serving; it starts low again.
    lower_soft_limit();
    let broker = TestBroker::start_in(data, |_| {}).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    assert_eq!(log_ends(&mut client, "many").await, expected, "every partition served after the restart, nothing lost");
    drop(client);
    broker.stop().await.unwrap();
}
