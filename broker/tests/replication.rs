//! Replication between in-process brokers on a real ZooKeeper: followers fetch from the
//! leader, acks=all waits for the ISR, the ISR shrinks and grows back through the
//! partition state znode, and a returning old leader truncates what the new leader
//! overwrote, so the replicas' logs end up identical byte for byte.
//!
//! The tests write the topic's assignment and partition state znodes themselves (as
//! the controller would) and restart brokers to hand them a new state. Their assertions
//! hold whoever shrinks the ISR (the leader after `replica.lag.time.max.ms`, or a
//! controller seeing a broker leave).

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use common::{produce_request, topic_name, RawClient, TestBroker, EARLIEST};
use fjord_coord::registry::{read_json, to_json, BrokerRegistration, PartitionState, TopicAssignment};
use fjord_coord::{create_all, paths, CreateMode, Store};
use fjord_record::BatchBuilder;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::offset_for_leader_epoch_request::{OffsetForLeaderPartition, OffsetForLeaderTopic};
use kafka_protocol::messages::*;

const NOT_LEADER_OR_FOLLOWER: i16 = 6;
const REQUEST_TIMED_OUT: i16 = 7;
const OFFSET_OUT_OF_RANGE: i16 = 1;
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const NOT_ENOUGH_REPLICAS: i16 = 19;
const NOT_ENOUGH_REPLICAS_AFTER_APPEND: i16 = 20;
const UNKNOWN_LEADER_EPOCH: i16 = 75;
const FENCED_LEADER_EPOCH: i16 = 74;

/// One batch of `count` records `"{tag}-{i}"`.
fn batch(tag: &str, count: usize) -> Bytes {
    let mut builder = BatchBuilder::new(1_700_000_000_000);
    for i in 0..count {
        builder.append(1_700_000_000_000 + i as i64, None, Some(format!("{tag}-{i}").as_bytes()), &[]);
    }
    builder.build()
}

async fn produce(client: &mut RawClient, topic: &str, acks: i16, timeout_ms: i32, records: Bytes) -> (i16, i64) {
    client.produce(9, &produce_request(topic, 0, acks, timeout_ms, records)).await
}

/// acks=all right after the ISR grew in ZooKeeper: the leader may not have adopted the
/// new ISR yet (NOT_ENOUGH_REPLICAS, retriable, as clients treat it); retries for 20 s.
async fn produce_acks_all_retrying(client: &mut RawClient, topic: &str, records: Bytes) -> i64 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match produce(client, topic, -1, 10_000, records.clone()).await {
            (0, offset) => return offset,
            (NOT_ENOUGH_REPLICAS, _) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (code, _) => panic!("acks=all produce failed with {code}"),
        }
    }
}

/// A Fetch of partition 0 from `offset`, as `replica_id` (-1: a consumer).
async fn fetch(
    client: &mut RawClient,
    topic: &str,
    replica_id: i32,
    offset: i64,
    current_leader_epoch: i32,
) -> (i16, i64, usize) {
    long_poll(client, topic, replica_id, offset, current_leader_epoch, 0).await
}

/// [`fetch`] waiting up to `max_wait_ms` for at least one byte.
async fn long_poll(
    client: &mut RawClient,
    topic: &str,
    replica_id: i32,
    offset: i64,
    current_leader_epoch: i32,
    max_wait_ms: i32,
) -> (i16, i64, usize) {
    let request = FetchRequest::default()
        .with_replica_id(BrokerId(replica_id))
        .with_max_wait_ms(max_wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_session_epoch(-1)
        .with_topics(vec![FetchTopic::default().with_topic(topic_name(topic)).with_partitions(vec![FetchPartition::default()
            .with_partition(0)
            .with_fetch_offset(offset)
            .with_current_leader_epoch(current_leader_epoch)
            .with_partition_max_bytes(1 << 20)])]);
    let response: FetchResponse = client.call(ApiKey::Fetch, 12, &request).await.unwrap();
    let p = &response.responses[0].partitions[0];
    (p.error_code, p.high_watermark, p.records.as_ref().map_or(0, |r| r.len()))
}

async fn end_offset_for_epoch(client: &mut RawClient, topic: &str, current: i32, epoch: i32) -> (i16, i32, i64) {
    let request =
        OffsetForLeaderEpochRequest::default().with_replica_id(BrokerId(-1)).with_topics(vec![OffsetForLeaderTopic::default()
            .with_topic(topic_name(topic))
            .with_partitions(vec![OffsetForLeaderPartition::default()
                .with_partition(0)
                .with_current_leader_epoch(current)
                .with_leader_epoch(epoch)])]);
    let response: OffsetForLeaderEpochResponse = client.call(ApiKey::OffsetForLeaderEpoch, 4, &request).await.unwrap();
    let p = &response.topics[0].partitions[0];
    (p.error_code, p.leader_epoch, p.end_offset)
}

/// Writes what topic creation writes: config (with `min.insync.replicas`), one
/// partition on `replicas`, and its state.
async fn create_topic(store: &Store, topic: &str, replicas: &[i32], min_isr: u32) {
    let config = format!(r#"{{"version":1,"config":{{"min.insync.replicas":"{min_isr}"}}}}"#);
    create_all(&**store, &paths::topic_config(topic), config.as_bytes(), CreateMode::Persistent).await.unwrap();
    let assignment =
        TopicAssignment { partitions: [("0".to_string(), replicas.to_vec())].into(), topic_id: None, ..Default::default() };
    create_all(&**store, &paths::topic(topic), &to_json(&assignment), CreateMode::Persistent).await.unwrap();
    let state = PartitionState { leader: replicas[0], leader_epoch: 0, isr: replicas.to_vec(), controller_epoch: 0 };
    create_all(&**store, &paths::partition_state(topic, 0), &to_json(&state), CreateMode::Persistent).await.unwrap();
}

async fn state(store: &Store, topic: &str) -> (PartitionState, i32) {
    let (state, stat) = read_json::<PartitionState>(&**store, &paths::partition_state(topic, 0)).await.unwrap().unwrap();
    (state, stat.version)
}

/// Waits (at most 20 s) until the partition state in ZooKeeper satisfies `check`.
async fn wait_for_state(store: &Store, topic: &str, what: &str, check: impl Fn(&PartitionState) -> bool) {
    fjord_testkit::wait_until(Duration::from_secs(20), what, || async {
        let (current, _) = state(store, topic).await;
        Ok(check(&current).then_some(()))
    })
    .await
    .unwrap();
}

/// Waits (at most 20 s) until the replicas' logs on disk are identical.
async fn wait_for_identical_logs(topic: &str, dirs: &[&Path]) {
    fjord_testkit::wait_until(Duration::from_secs(20), "identical logs", || async {
        let first = log_bytes(dirs[0], topic);
        Ok(dirs.iter().all(|d| log_bytes(d, topic) == first).then_some(()))
    })
    .await
    .unwrap();
}

/// The partition's log bytes on disk (its segments in order).
fn log_bytes(data_dir: &Path, topic: &str) -> Vec<u8> {
    let dir = data_dir.join(format!("{topic}-0"));
    let mut segments: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    segments.sort();
    segments.iter().flat_map(|p| std::fs::read(p).unwrap()).collect()
}

struct Cluster {
    zk: fjord_testkit::ZooKeeper,
    store: Store,
    dir: tempfile::TempDir,
}

impl Cluster {
    async fn new() -> Self {
        let zk = fjord_testkit::ZooKeeper::start().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = fjord_coord::open(Some(&zk.connect_string()), &dir.path().join("unused")).await.unwrap();
        Self { zk, store, dir }
    }

    fn data_dir(&self, id: i32) -> PathBuf {
        self.dir.path().join(format!("broker-{id}"))
    }

    async fn start(&self, id: i32, lag: Duration) -> TestBroker {
        self.start_with_backoff(id, lag, Duration::from_millis(100)).await
    }

    /// Broker `id` with `replica.lag.time.max.ms` = `lag`, `replica.fetch.backoff.ms` = `backoff`.
    async fn start_with_backoff(&self, id: i32, lag: Duration, backoff: Duration) -> TestBroker {
        let connect = self.zk.connect_string();
        TestBroker::start_in(self.data_dir(id), |c| {
            c.broker_id = id;
            c.zookeeper_connect = Some(connect);
            c.auto_create_topics = false;
            c.replication.lag_time_max = lag;
            c.replication.fetch_backoff = backoff;
        })
        .await
        .unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_replicate_byte_for_byte_and_acks_all_follows_the_isr() {
    let cluster = Cluster::new().await;
    let store = &cluster.store;
    create_topic(store, "r", &[0, 1], 2).await;
    let lag = Duration::from_millis(1_500);
    let leader = cluster.start(0, lag).await;
    let follower = cluster.start(1, lag).await;
    let mut client = RawClient::connect(leader.addr).await.unwrap();

    // acks=all answers once the follower has the batch: its log equals the leader's then.
    // The first may be refused: the follower is in the ISR if it fetched within `lag` of the
    // leader taking over, and a loaded machine can start it later; it joins once caught up.
    assert_eq!(produce_acks_all_retrying(&mut client, "r", batch("a0", 5)).await, 0);
    assert_eq!(log_bytes(&follower.data_dir, "r"), log_bytes(&leader.data_dir, "r"), "after batch 0");
    for i in 1..10 {
        assert_eq!(produce(&mut client, "r", -1, 10_000, batch(&format!("a{i}"), 5)).await, (0, i * 5));
        assert_eq!(log_bytes(&follower.data_dir, "r"), log_bytes(&leader.data_dir, "r"), "after batch {i}");
    }
    assert_eq!(client.latest_offset("r").await, (0, 50), "the high watermark covers every acknowledged batch");

    // A consumer waiting at the high watermark wakes when it moves (the follower fetched
    // the batch), not at the append and not at its 20 s deadline.
    let mut consumer = RawClient::connect(leader.addr).await.unwrap();
    let started = std::time::Instant::now();
    let poll = tokio::spawn(async move { long_poll(&mut consumer, "r", -1, 50, 0, 20_000).await });
    tokio::time::sleep(Duration::from_millis(100)).await; // let the fetch start waiting
    assert_eq!(produce(&mut client, "r", 1, 10_000, batch("w", 2)).await, (0, 50));
    let (error, high_watermark, bytes) = poll.await.unwrap();
    assert_eq!((error, high_watermark), (0, 52));
    assert!(bytes > 0 && started.elapsed() < Duration::from_secs(10), "{bytes} bytes after {:?}", started.elapsed());

    // The follower serves no clients; epochs are checked; OffsetForLeaderEpoch answers.
    let mut to_follower = RawClient::connect(follower.addr).await.unwrap();
    assert_eq!(produce(&mut to_follower, "r", 1, 1_000, batch("x", 1)).await.0, NOT_LEADER_OR_FOLLOWER);
    assert_eq!(fetch(&mut to_follower, "r", -1, 0, -1).await.0, NOT_LEADER_OR_FOLLOWER);
    assert_eq!(fetch(&mut client, "r", -1, 0, 1).await.0, UNKNOWN_LEADER_EPOCH);
    assert_eq!(end_offset_for_epoch(&mut client, "r", 0, 0).await, (0, 0, 52));
    assert_eq!(end_offset_for_epoch(&mut client, "r", -1, 7).await, (0, 0, 52), "a later epoch: the latest one's end");
    assert_eq!(end_offset_for_epoch(&mut client, "r", 3, 0).await, (UNKNOWN_LEADER_EPOCH, -1, -1));
    assert_eq!(end_offset_for_epoch(&mut client, "nope", -1, 0).await, (UNKNOWN_TOPIC_OR_PARTITION, -1, -1));
    assert_eq!(end_offset_for_epoch(&mut to_follower, "r", -1, 0).await, (NOT_LEADER_OR_FOLLOWER, -1, -1));
    // A follower asking for an offset the leader does not have gets the protocol's error.
    assert_eq!(fetch(&mut client, "r", 1, 1_000, 0).await.0, OFFSET_OUT_OF_RANGE);
    assert_eq!(fetch(&mut client, "r", -1, 0, 0).await.0, 0, "the leader still serves");

    // Follower gone: the ISR shrinks in ZooKeeper (same leader and epoch), then acks=all
    // is refused before appending; acks=1 still works. (Without the ISR change acks=all
    // would time out: see the unit test of `replication`.)
    follower.stop().await.unwrap();
    wait_for_state(store, "r", "the ISR to shrink", |s| s.isr == vec![0]).await;
    let (shrunk, version) = state(store, "r").await;
    assert_eq!((shrunk.leader, shrunk.leader_epoch), (0, 0));
    assert!(version > 0, "written by compare-and-set over the created state");
    let end_before = log_bytes(&leader.data_dir, "r").len();
    // The leader may still be applying the new ISR: wait for the refusal.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (code, _) = produce(&mut client, "r", -1, 1_000, batch("c", 1)).await;
        if code == NOT_ENOUGH_REPLICAS {
            break;
        }
        assert!(code == NOT_ENOUGH_REPLICAS_AFTER_APPEND || code == REQUEST_TIMED_OUT, "{code}");
        assert!(tokio::time::Instant::now() < deadline, "acks=all never refused");
    }
    let end_refused = log_bytes(&leader.data_dir, "r").len();
    assert_eq!(produce(&mut client, "r", -1, 1_000, batch("c", 1)).await.0, NOT_ENOUGH_REPLICAS);
    assert_eq!(log_bytes(&leader.data_dir, "r").len(), end_refused, "nothing appended");
    assert!(end_refused >= end_before);
    assert_eq!(produce(&mut client, "r", 1, 1_000, batch("d", 1)).await.0, 0);

    // Back: it catches up, rejoins the ISR, and acks=all works again.
    let follower = cluster.start(1, lag).await;
    wait_for_state(store, "r", "the follower to rejoin the ISR", |s| s.isr.len() == 2).await;
    produce_acks_all_retrying(&mut client, "r", batch("e", 3)).await;
    assert_eq!(log_bytes(&follower.data_dir, "r"), log_bytes(&leader.data_dir, "r"));
    follower.stop().await.unwrap();
    leader.stop().await.unwrap();
}

/// An acks=all produce waiting for the ISR does not hold up its connection: the requests
/// after it are read and appended meanwhile, in order (the followers then fetch them in
/// the same rounds), and the answers still go out in request order, each once the whole
/// ISR has its batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_all_answers_keep_request_order_while_the_next_requests_are_appended() {
    let cluster = Cluster::new().await;
    create_topic(&cluster.store, "p", &[0, 1], 2).await;
    // Follower 1 is registered (so it stays in the ISR) but never runs: this test fetches
    // in its name, from 127.0.0.1 where it is registered.
    let registration = BrokerRegistration {
        host: "127.0.0.1".into(),
        port: 1,
        rack: None,
        endpoints: vec![],
        listener_security_protocol_map: Default::default(),
    };
    create_all(&*cluster.store, &paths::broker(1), &to_json(&registration), CreateMode::Ephemeral).await.unwrap();
    let leader = cluster.start(0, Duration::from_secs(60)).await;
    fjord_testkit::wait_until(Duration::from_secs(20), "the leader to lead", || async {
        let mut probe = RawClient::connect(leader.addr).await?;
        Ok((produce(&mut probe, "p", 1, 1_000, batch("warm", 1)).await == (0, 0)).then_some(()))
    })
    .await
    .unwrap();

    let mut client = RawClient::connect(leader.addr).await.unwrap();
    let requests = [(-1, batch("a", 2)), (1, batch("b", 3)), (-1, batch("c", 1))];
    let mut ids = Vec::new();
    for (acks, records) in requests {
        let frame = client.encode(ApiKey::Produce, 9, &produce_request("p", 0, acks, 30_000, records));
        client.send_frame(&frame).await.unwrap();
        ids.push(i32::from_be_bytes(frame[4..8].try_into().unwrap()));
    }
    // All three are appended while the first waits for follower 1.
    fjord_testkit::wait_until(Duration::from_secs(10), "the third request to be appended", || async {
        Ok(log_bytes(&leader.data_dir, "p").windows(3).any(|w| w == b"c-0").then_some(()))
    })
    .await
    .unwrap();
    // Nothing is answered yet: the first answer waits for the ISR, the others behind it.
    assert!(tokio::time::timeout(Duration::from_millis(300), client.stream.readable()).await.is_err(), "an early answer");

    // Follower 1 fetches from the log end: every batch is on the ISR.
    let mut follower = RawClient::connect(leader.addr).await.unwrap();
    assert_eq!(fetch(&mut follower, "p", 1, 7, 0).await, (0, 7, 0));
    for (id, expected) in ids.into_iter().zip([1, 3, 6]) {
        let response: ProduceResponse = client.read_response(ApiKey::Produce, 9, id).await.unwrap();
        let p = &response.responses[0].partition_responses[0];
        assert_eq!((p.error_code, p.base_offset), (0, expected), "request {id}");
    }
    leader.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returning_old_leader_drops_what_the_new_leader_overwrote() {
    let cluster = Cluster::new().await;
    let store = &cluster.store;
    create_topic(store, "t", &[0, 1], 1).await;
    let lag = Duration::from_secs(60);
    let a = cluster.start(0, lag).await;
    let b = cluster.start(1, lag).await;
    let mut client = RawClient::connect(a.addr).await.unwrap();
    for i in 0..9 {
        assert_eq!(produce(&mut client, "t", -1, 10_000, batch(&format!("common{i}"), 10)).await, (0, i * 10));
    }
    b.stop().await.unwrap();
    a.stop().await.unwrap();
    // While both are down, A's log gets the 90..100 an old leader took in epoch 0 and
    // never replicated (written here directly: nothing a controller does can change it).
    // Its high watermark stays at 90.
    {
        let log = fjord_log::Log::open(cluster.data_dir(0).join("t-0"), fjord_log::LogConfig::default()).unwrap();
        assert_eq!(log.log_end_offset(), 90);
        log.append(&mut batch("lost", 10).to_vec(), 0).unwrap();
        log.close().unwrap();
    }
    let checkpoint = std::fs::read_to_string(cluster.data_dir(0).join("replication-offset-checkpoint")).unwrap();
    assert!(checkpoint.contains("t 0 90\n"), "A's high watermark is 90: {checkpoint:?}");
    let a_before = log_bytes(&cluster.data_dir(0), "t");

    // The controller moves leadership to B (epoch 1, ISR [1]); B writes its own 90..100.
    let (_, version) = state(store, "t").await;
    let moved = PartitionState { leader: 1, leader_epoch: 1, isr: vec![1], controller_epoch: 0 };
    store.set(&paths::partition_state("t", 0), &to_json(&moved), Some(version)).await.unwrap();
    let b = cluster.start(1, lag).await;
    let mut client = RawClient::connect(b.addr).await.unwrap();
    assert_eq!(client.latest_offset("t").await, (0, 90), "B leads from its log end");
    assert_eq!(produce(&mut client, "t", 1, 1_000, batch("kept", 10)).await, (0, 90));
    assert_eq!(end_offset_for_epoch(&mut client, "t", 1, 0).await, (0, 0, 90), "epoch 0 ended at 90 on B");
    assert_eq!(fetch(&mut client, "t", -1, 0, 0).await.0, FENCED_LEADER_EPOCH);

    // A returns as a follower: it truncates to 90 and fetches B's 90..100.
    let a = cluster.start(0, lag).await;
    let b_log = log_bytes(&b.data_dir, "t");
    assert_eq!(b_log.len(), a_before.len(), "same sizes, different records: the test sets up a real divergence");
    assert_ne!(b_log, a_before);
    wait_for_identical_logs("t", &[&a.data_dir, &b.data_dir]).await;
    wait_for_state(store, "t", "A to rejoin the ISR", |s| s.isr.len() == 2).await;
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_with_min_isr_two_survive_one_loss_and_refuse_two() {
    let cluster = Cluster::new().await;
    let store = &cluster.store;
    create_topic(store, "m", &[0, 1, 2], 2).await;
    let lag = Duration::from_millis(1_000);
    let leader = cluster.start(0, lag).await;
    let one = cluster.start(1, lag).await;
    let two = cluster.start(2, lag).await;
    let mut client = RawClient::connect(leader.addr).await.unwrap();
    assert_eq!(produce(&mut client, "m", -1, 10_000, batch("a", 4)).await, (0, 0));

    // One follower lost: acks=all completes once the ISR dropped it (two remain).
    two.stop().await.unwrap();
    assert_eq!(produce(&mut client, "m", -1, 10_000, batch("b", 4)).await, (0, 4));
    assert_eq!(state(store, "m").await.0.isr, vec![0, 1]);

    // The second one lost: a batch appended while the ISR still had two members is
    // answered NOT_ENOUGH_REPLICAS_AFTER_APPEND once the ISR is down to the leader alone
    // (or, if the ISR shrank first, NOT_ENOUGH_REPLICAS); after that, refused up front.
    one.stop().await.unwrap();
    let first = produce(&mut client, "m", -1, 10_000, batch("c", 4)).await.0;
    assert!(first == NOT_ENOUGH_REPLICAS_AFTER_APPEND || first == NOT_ENOUGH_REPLICAS, "{first}");
    assert_eq!(state(store, "m").await.0.isr, vec![0]);
    assert_eq!(produce(&mut client, "m", -1, 10_000, batch("d", 4)).await.0, NOT_ENOUGH_REPLICAS);

    // Both return, catch up and rejoin; the three logs are identical.
    let one = cluster.start(1, lag).await;
    let two = cluster.start(2, lag).await;
    wait_for_state(store, "m", "both followers to rejoin", |s| s.isr.len() == 3).await;
    produce_acks_all_retrying(&mut client, "m", batch("e", 4)).await;
    // acks=all answered: both followers have everything the leader has.
    let leader_log = log_bytes(&leader.data_dir, "m");
    assert_eq!(log_bytes(&one.data_dir, "m"), leader_log);
    assert_eq!(log_bytes(&two.data_dir, "m"), leader_log);
    for broker in [one, two, leader] {
        broker.stop().await.unwrap();
    }
}

/// Whether broker `data_dir`'s `log-start-offset-checkpoint` records `offset` as the start
/// of `topic` partition 0.
fn checkpointed_log_start(data_dir: &Path, topic: &str, offset: i64) -> bool {
    std::fs::read_to_string(data_dir.join("log-start-offset-checkpoint"))
        .is_ok_and(|checkpoint| checkpoint.lines().any(|line| line == format!("{topic} 0 {offset}")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_follow_the_leaders_log_start_after_delete_records_and_a_new_leader_keeps_it() {
    use kafka_protocol::messages::delete_records_request::{DeleteRecordsPartition, DeleteRecordsTopic};
    let cluster = Cluster::new().await;
    let store = &cluster.store;
    create_topic(store, "d", &[0, 1, 2], 1).await;
    let lag = Duration::from_secs(60);
    let leader = cluster.start(0, lag).await;
    let one = cluster.start(1, lag).await;
    let two = cluster.start(2, lag).await;
    let mut client = RawClient::connect(leader.addr).await.unwrap();
    for i in 0..10 {
        assert_eq!(produce(&mut client, "d", -1, 10_000, batch(&format!("b{i}"), 10)).await, (0, i * 10));
    }
    let request = DeleteRecordsRequest::default().with_timeout_ms(30_000).with_topics(vec![DeleteRecordsTopic::default()
        .with_name(topic_name("d"))
        .with_partitions(vec![DeleteRecordsPartition::default().with_partition_index(0).with_offset(60)])]);
    let response: DeleteRecordsResponse = client.call(ApiKey::DeleteRecords, 2, &request).await.unwrap();
    let p = &response.topics[0].partitions[0];
    assert_eq!((p.error_code, p.low_watermark), (0, 60));

    // Each follower moves its start to the leader's and checkpoints it while running.
    fjord_testkit::wait_until(Duration::from_secs(20), "both followers to checkpoint log start 60", || async {
        Ok([&one, &two].iter().all(|b| checkpointed_log_start(&b.data_dir, "d", 60)).then_some(()))
    })
    .await
    .unwrap();

    // The leader goes; broker 1 leads (epoch 1) after a restart, broker 2 follows it.
    for broker in [leader, one, two] {
        broker.stop().await.unwrap();
    }
    let (_, version) = state(store, "d").await;
    let moved = PartitionState { leader: 1, leader_epoch: 1, isr: vec![1, 2], controller_epoch: 0 };
    store.set(&paths::partition_state("d", 0), &to_json(&moved), Some(version)).await.unwrap();
    let one = cluster.start(1, lag).await;
    let two = cluster.start(2, lag).await;
    let mut client = RawClient::connect(one.addr).await.unwrap();
    assert_eq!(client.list_offset("d", 0, EARLIEST).await, (0, 60), "the new leader starts where the old one did");
    assert_eq!(fetch(&mut client, "d", -1, 0, 1).await.0, OFFSET_OUT_OF_RANGE, "the deleted records are gone");
    assert_eq!(fetch(&mut client, "d", -1, 60, 1).await.0, 0);
    assert!(checkpointed_log_start(&two.data_dir, "d", 60), "the restarted follower keeps its start");
    one.stop().await.unwrap();
    two.stop().await.unwrap();
}
