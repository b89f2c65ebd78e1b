//! Consumer groups through independent clients: librdkafka (confluent-kafka's
//! balanced consumer, and kcat -G) joins, syncs, heartbeats, commits and resumes
//! against the broker's group coordinator.

mod common;

use std::time::Duration;

use common::{kcat, run_python, TestBroker};

/// Three consumers in one group over six partitions: every partition is owned by
/// exactly one of them, every message is consumed exactly once, commits persist, and
/// a consumer that comes back later resumes after the committed offsets.
const GROUP_SCRIPT: &str = r#"
import sys, threading, time
from confluent_kafka import Consumer, TopicPartition, KafkaException

bootstrap, topic, expected = sys.argv[1], sys.argv[2], int(sys.argv[3])
conf = {'bootstrap.servers': bootstrap, 'group.id': 'g1', 'enable.auto.commit': False,
        'auto.offset.reset': 'earliest', 'session.timeout.ms': 6000, 'heartbeat.interval.ms': 500}
lock = threading.Lock()
seen = {}            # (partition, offset) -> consumer index
owners = {}          # partition -> set of consumer indexes
total = [0]
stop = threading.Event()

def run(i):
    c = Consumer(conf)
    c.subscribe([topic])
    deadline = time.time() + 90
    while not stop.is_set() and time.time() < deadline:
        m = c.poll(0.2)
        if m is None or m.error():
            continue
        with lock:
            key = (m.partition(), m.offset())
            assert key not in seen, ("consumed twice", key, seen[key], i)
            seen[key] = i
            owners.setdefault(m.partition(), set()).add(i)
            total[0] += 1
            if total[0] >= expected:
                stop.set()
        c.commit(message=m, asynchronous=False)
    c.close()

threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
for t in threads: t.start()
for t in threads: t.join()
assert total[0] == expected, ("consumed", total[0], "expected", expected)
for p, who in owners.items():
    assert len(who) == 1, ("partition owned by several members in one generation", p, who)
assert len(set().union(*owners.values())) >= 2, ("work was not shared", owners)

# The committed offsets are what a new member of the group resumes from.
c = Consumer(conf)
committed = c.committed([TopicPartition(topic, p) for p in range(6)], timeout=10)
assert sum(tp.offset for tp in committed) == expected, [(tp.partition, tp.offset) for tp in committed]
c.close()
print("ok")
"#;

const RESUME_SCRIPT: &str = r#"
import sys, time
from confluent_kafka import Consumer
bootstrap, topic, expected, prefix = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].encode()
c = Consumer({'bootstrap.servers': bootstrap, 'group.id': 'g1', 'enable.auto.commit': False,
              'auto.offset.reset': 'earliest', 'session.timeout.ms': 6000})
c.subscribe([topic])
values = set()
deadline = time.time() + 60
while len(values) < expected and time.time() < deadline:
    m = c.poll(0.2)
    if m is None or m.error():
        continue
    assert m.value().startswith(prefix), ("a committed message came back", m.value())
    values.add(m.value())
# Nothing older arrives later either (a rebalance may redeliver uncommitted new ones:
# that is at-least-once, and allowed).
end = time.time() + 2
while time.time() < end:
    m = c.poll(0.2)
    assert m is None or m.error() or m.value().startswith(prefix), ("a committed message came back", m.value())
c.commit(asynchronous=False)
c.close()
assert values == set(prefix + b'-%d' % i for i in range(expected)), sorted(values)[:5]
print("ok")
"#;

/// How long one run of a group script may take.
const PYTHON_TIMEOUT: Duration = Duration::from_secs(150);

fn lines(prefix: &str, n: usize) -> Vec<u8> {
    (0..n).map(|i| format!("k{i}:{prefix}-{i}\n")).collect::<String>().into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_librdkafka_group_shares_partitions_commits_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), |c| {
        c.num_partitions = 6;
        c.group.initial_rebalance_delay_ms = 1_500;
    })
    .await
    .unwrap();
    let bootstrap = broker.bootstrap();
    kcat(&["-b", &bootstrap, "-P", "-t", "shared", "-K:"], Some(&lines("old", 3000))).await.unwrap();
    run_python(GROUP_SCRIPT, &[&bootstrap, "shared", "3000"], PYTHON_TIMEOUT).await;
    kcat(&["-b", &bootstrap, "-P", "-t", "shared", "-K:"], Some(&lines("new", 300))).await.unwrap();
    run_python(RESUME_SCRIPT, &[&bootstrap, "shared", "300", "new"], PYTHON_TIMEOUT).await;

    // The committed offsets survive a broker restart: they live in the offset registry.
    let data_dir = broker.data_dir.clone();
    broker.stop().await.unwrap();
    let broker = TestBroker::start_in(data_dir, |c| c.num_partitions = 6).await.unwrap();
    let bootstrap = broker.bootstrap();
    kcat(&["-b", &bootstrap, "-P", "-t", "shared", "-K:"], Some(&lines("after-restart", 50))).await.unwrap();
    run_python(RESUME_SCRIPT, &[&bootstrap, "shared", "50", "after-restart"], PYTHON_TIMEOUT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kcat_balanced_consumer_reads_everything_and_commits() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), |c| {
        c.num_partitions = 4;
        c.group.initial_rebalance_delay_ms = 0;
    })
    .await
    .unwrap();
    let bootstrap = broker.bootstrap();
    kcat(&["-b", &bootstrap, "-P", "-t", "kg", "-K:"], Some(&lines("v", 1000))).await.unwrap();
    let read = |expect: usize| {
        let bootstrap = bootstrap.clone();
        async move {
            // -G: the balanced consumer (JoinGroup/SyncGroup/Heartbeat/OffsetCommit);
            // -e: exit once every assigned partition reached its end.
            let out = kcat(
                &["-b", &bootstrap, "-G", "kcat-group", "-X", "auto.offset.reset=earliest", "-e", "-q", "-f", "%s\n", "kg"],
                None,
            )
            .await
            .unwrap();
            let values: Vec<String> = String::from_utf8(out).unwrap().lines().map(str::to_owned).collect();
            assert_eq!(values.len(), expect, "{:?}", &values[..values.len().min(5)]);
            values
        }
    };
    let mut values = read(1000).await;
    values.sort();
    let mut expected: Vec<String> = (0..1000).map(|i| format!("v-{i}")).collect();
    expected.sort();
    assert_eq!(values, expected);
    // kcat committed on exit: the same group now finds only what is new.
    kcat(&["-b", &bootstrap, "-P", "-t", "kg", "-K:"], Some(&lines("w", 10))).await.unwrap();
    let again = read(10).await;
    assert!(again.iter().all(|v| v.starts_with("w-")), "{again:?}");
}

/// OffsetFetch before v8 (one group, its answer at the top level) and from v8 on (a
/// list of groups) answer the same commits the same way: offset, leader epoch and
/// metadata as committed, -1 and empty metadata for a partition never committed, and a
/// group that cannot be read here gets its error code (an empty group id is invalid).
#[tokio::test]
async fn offset_fetch_answers_the_same_before_and_from_v8() {
    use common::RawClient;
    use kafka_protocol::messages::*;
    use kafka_protocol::protocol::StrBytes;

    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), |_| {}).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    raw::create_topic(&mut client, "t", 2).await;
    let s = |v: &str| StrBytes::from_string(v.to_owned());
    let commit = OffsetCommitRequest::default()
        .with_group_id(GroupId(s("fetcher")))
        .with_generation_id_or_member_epoch(-1)
        .with_topics(vec![offset_commit_request::OffsetCommitRequestTopic::default()
            .with_name(TopicName(s("t")))
            .with_partitions(vec![offset_commit_request::OffsetCommitRequestPartition::default()
                .with_partition_index(1)
                .with_committed_offset(42)
                .with_committed_leader_epoch(3)
                .with_committed_metadata(Some(s("meta")))])]);
    let response: OffsetCommitResponse = client.call(ApiKey::OffsetCommit, 7, &commit).await.unwrap();
    assert_eq!(response.topics[0].partitions[0].error_code, 0);

    // (partition, offset, leader epoch, metadata) per topic, and the group's error code.
    type Answer = (i16, Vec<(String, Vec<(i32, i64, i32, String)>)>);
    // The two layouts carry the same fields in types of their own.
    macro_rules! topics {
        ($topics:expr) => {
            $topics
                .into_iter()
                .map(|t| {
                    let partitions = t
                        .partitions
                        .into_iter()
                        .map(|p| {
                            let metadata = p.metadata.map(|m| m.to_string()).unwrap_or_default();
                            (p.partition_index, p.committed_offset, p.committed_leader_epoch, metadata)
                        })
                        .collect();
                    (t.name.to_string(), partitions)
                })
                .collect()
        };
    }
    let before_v8 = |group: &str| {
        OffsetFetchRequest::default().with_group_id(GroupId(s(group))).with_topics(Some(vec![
            offset_fetch_request::OffsetFetchRequestTopic::default()
                .with_name(TopicName(s("t")))
                .with_partition_indexes(vec![0, 1]),
        ]))
    };
    let mut answers_before_v8 = Vec::<Answer>::new();
    for group in ["fetcher", ""] {
        let r: OffsetFetchResponse = client.call(ApiKey::OffsetFetch, 7, &before_v8(group)).await.unwrap();
        answers_before_v8.push((r.error_code, topics!(r.topics)));
    }
    let v8 = OffsetFetchRequest::default().with_groups(
        ["fetcher", ""]
            .into_iter()
            .map(|group| {
                offset_fetch_request::OffsetFetchRequestGroup::default().with_group_id(GroupId(s(group))).with_topics(Some(vec![
                    offset_fetch_request::OffsetFetchRequestTopics::default()
                        .with_name(TopicName(s("t")))
                        .with_partition_indexes(vec![0, 1]),
                ]))
            })
            .collect(),
    );
    let r: OffsetFetchResponse = client.call(ApiKey::OffsetFetch, 8, &v8).await.unwrap();
    let answers_v8: Vec<Answer> = r.groups.into_iter().map(|g| (g.error_code, topics!(g.topics))).collect();

    const INVALID_GROUP_ID: i16 = 24;
    let expected: Vec<Answer> =
        vec![(0, vec![("t".into(), vec![(0, -1, -1, String::new()), (1, 42, 3, "meta".into())])]), (INVALID_GROUP_ID, vec![])];
    assert_eq!(answers_before_v8, expected);
    assert_eq!(answers_v8, expected);
    broker.stop().await.unwrap();
}

mod raw {
    //! Group APIs driven request by request, for answers a client library hides.

    use bytes::Bytes;
    use kafka_protocol::messages::*;
    use kafka_protocol::protocol::StrBytes;

    use crate::common::RawClient;

    pub(crate) const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
    pub(crate) const ILLEGAL_GENERATION: i16 = 22;
    pub(crate) const UNKNOWN_MEMBER_ID: i16 = 25;
    pub(crate) const REBALANCE_IN_PROGRESS: i16 = 27;
    pub(crate) const GROUP_ID_NOT_FOUND: i16 = 69;
    pub(crate) const MEMBER_ID_REQUIRED: i16 = 79;

    pub(crate) fn s(v: &str) -> StrBytes {
        StrBytes::from_string(v.to_owned())
    }

    pub(crate) async fn create_topic(client: &mut RawClient, name: &str, partitions: i32) {
        let request = CreateTopicsRequest::default().with_timeout_ms(5000).with_topics(vec![
            create_topics_request::CreatableTopic::default()
                .with_name(TopicName(s(name)))
                .with_num_partitions(partitions)
                .with_replication_factor(1),
        ]);
        let response: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 5, &request).await.unwrap();
        assert_eq!(response.topics[0].error_code, 0, "{:?}", response.topics[0].error_message);
    }

    /// Commits `(topic, partition, offset)`s for `group` as `member` of `generation`;
    /// the error code of each, in order.
    pub(crate) async fn commit(
        client: &mut RawClient,
        group: &str,
        member: &str,
        generation: i32,
        offsets: &[(&str, i32, i64)],
    ) -> Vec<i16> {
        let topics = offsets
            .iter()
            .map(|(topic, p, offset)| {
                offset_commit_request::OffsetCommitRequestTopic::default().with_name(TopicName(s(topic))).with_partitions(vec![
                    offset_commit_request::OffsetCommitRequestPartition::default()
                        .with_partition_index(*p)
                        .with_committed_offset(*offset),
                ])
            })
            .collect();
        let request = OffsetCommitRequest::default()
            .with_group_id(GroupId(s(group)))
            .with_member_id(s(member))
            .with_generation_id_or_member_epoch(generation)
            .with_topics(topics);
        let response: OffsetCommitResponse = client.call(ApiKey::OffsetCommit, 8, &request).await.unwrap();
        response.topics.iter().flat_map(|t| t.partitions.iter().map(|p| p.error_code)).collect()
    }

    /// Every committed `(topic, partition, offset)` of `group` (OffsetFetch of all topics).
    pub(crate) async fn committed(client: &mut RawClient, group: &str) -> (i16, Vec<(String, i32, i64)>) {
        let request = OffsetFetchRequest::default().with_group_id(GroupId(s(group))).with_topics(None);
        let response: OffsetFetchResponse = client.call(ApiKey::OffsetFetch, 7, &request).await.unwrap();
        let offsets = response
            .topics
            .iter()
            .flat_map(|t| t.partitions.iter().map(|p| (t.name.to_string(), p.partition_index, p.committed_offset)))
            .collect();
        (response.error_code, offsets)
    }

    pub(crate) async fn join(client: &mut RawClient, group: &str, member: &str) -> JoinGroupResponse {
        let request = JoinGroupRequest::default()
            .with_group_id(GroupId(s(group)))
            .with_session_timeout_ms(10_000)
            .with_rebalance_timeout_ms(10_000)
            .with_member_id(s(member))
            .with_protocol_type(s("consumer"))
            .with_protocols(vec![join_group_request::JoinGroupRequestProtocol::default()
                .with_name(s("range"))
                .with_metadata(Bytes::from_static(b"m"))]);
        client.call(ApiKey::JoinGroup, 5, &request).await.unwrap()
    }

    /// A new member's id (JoinGroup v4+ hands it out with MEMBER_ID_REQUIRED).
    pub(crate) async fn member_id(client: &mut RawClient, group: &str) -> String {
        let first = join(client, group, "").await;
        assert_eq!(first.error_code, MEMBER_ID_REQUIRED);
        first.member_id.to_string()
    }

    pub(crate) async fn heartbeat(client: &mut RawClient, group: &str, member: &str, generation: i32) -> i16 {
        let request =
            HeartbeatRequest::default().with_group_id(GroupId(s(group))).with_member_id(s(member)).with_generation_id(generation);
        let response: HeartbeatResponse = client.call(ApiKey::Heartbeat, 3, &request).await.unwrap();
        response.error_code
    }

    pub(crate) async fn list_groups(client: &mut RawClient) -> Vec<(String, String)> {
        let response: ListGroupsResponse = client.call(ApiKey::ListGroups, 4, &ListGroupsRequest::default()).await.unwrap();
        response.groups.iter().map(|g| (g.group_id.to_string(), g.group_state.to_string())).collect()
    }
}

/// OffsetCommit (the admin's AlterConsumerGroupOffsets is one, with generation -1) for
/// a topic or partition the cluster does not have: UNKNOWN_TOPIC_OR_PARTITION for that
/// partition, nothing stored for it, and the known partitions of the same request are
/// committed (#27 item 2, librdkafka tests 0030 and 0081).
#[tokio::test]
async fn offset_commit_refuses_unknown_topics_and_partitions_and_stores_nothing_for_them() {
    use common::RawClient;
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), |_| {}).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    raw::create_topic(&mut client, "known", 2).await;
    let codes = raw::commit(&mut client, "admin", "", -1, &[("known", 1, 7), ("known", 2, 8), ("missing", 0, 9)]).await;
    assert_eq!(codes, vec![0, raw::UNKNOWN_TOPIC_OR_PARTITION, raw::UNKNOWN_TOPIC_OR_PARTITION]);
    assert_eq!(raw::committed(&mut client, "admin").await, (0, vec![("known".to_string(), 1, 7)]));
    // Nothing known at all: the group is not created either.
    let codes = raw::commit(&mut client, "nothing", "", -1, &[("missing", 0, 1)]).await;
    assert_eq!(codes, vec![raw::UNKNOWN_TOPIC_OR_PARTITION]);
    assert!(!raw::list_groups(&mut client).await.iter().any(|(g, _)| g == "nothing"));
    broker.stop().await.unwrap();
}

/// A group nobody joined or committed for does not exist, whatever was asked about it:
/// after FindCoordinator and OffsetFetch for it, DescribeGroups says Dead (no error),
/// DeleteGroups answers GROUP_ID_NOT_FOUND and ListGroups leaves it out (#27 items 4
/// and 5, librdkafka test 0081).
#[tokio::test]
async fn a_group_that_never_existed_is_dead_and_cannot_be_deleted() {
    use common::RawClient;
    use kafka_protocol::messages::*;
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), |_| {}).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    raw::create_topic(&mut client, "t", 1).await;
    assert_eq!(raw::commit(&mut client, "real", "", -1, &[("t", 0, 3)]).await, vec![0]);

    let find = FindCoordinatorRequest::default().with_key(raw::s("ghost")).with_key_type(0);
    let found: FindCoordinatorResponse = client.call(ApiKey::FindCoordinator, 3, &find).await.unwrap();
    assert_eq!(found.error_code, 0);
    assert_eq!(raw::committed(&mut client, "ghost").await, (0, vec![]));

    let describe = DescribeGroupsRequest::default().with_groups(vec![GroupId(raw::s("ghost")), GroupId(raw::s("real"))]);
    let described: DescribeGroupsResponse = client.call(ApiKey::DescribeGroups, 5, &describe).await.unwrap();
    let states: Vec<(i16, String)> = described.groups.iter().map(|g| (g.error_code, g.group_state.to_string())).collect();
    assert_eq!(states, vec![(0, "Dead".to_string()), (0, "Empty".to_string())]);

    assert_eq!(raw::list_groups(&mut client).await, vec![("real".to_string(), "Empty".to_string())]);

    let delete = DeleteGroupsRequest::default().with_groups_names(vec![GroupId(raw::s("ghost")), GroupId(raw::s("real"))]);
    let deleted: DeleteGroupsResponse = client.call(ApiKey::DeleteGroups, 2, &delete).await.unwrap();
    let codes: Vec<i16> = deleted.results.iter().map(|r| r.error_code).collect();
    assert_eq!(codes, vec![raw::GROUP_ID_NOT_FOUND, 0]);
    // Deleted: now it is gone too.
    let deleted: DeleteGroupsResponse = client.call(ApiKey::DeleteGroups, 2, &delete).await.unwrap();
    let codes: Vec<i16> = deleted.results.iter().map(|r| r.error_code).collect();
    assert_eq!(codes, vec![raw::GROUP_ID_NOT_FOUND, raw::GROUP_ID_NOT_FOUND]);
    broker.stop().await.unwrap();
}

/// Kafka accepts almost any group id; one with `/` in it is one group with its own
/// registry node, not a path into another group's: it is listed under its own name,
/// its offsets come back after a restart, and the group named by its first segment
/// does not exist (#26 case 9).
#[tokio::test]
async fn a_group_id_with_a_slash_is_one_group_in_the_registry() {
    use common::RawClient;
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), |_| {}).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    raw::create_topic(&mut client, "t", 1).await;
    for group in ["team/a", "50%", ".."] {
        assert_eq!(raw::commit(&mut client, group, "", -1, &[("t", 0, 11)]).await, vec![0], "{group}");
    }
    let data_dir = broker.data_dir.clone();
    broker.stop().await.unwrap();
    let broker = TestBroker::start_in(data_dir, |_| {}).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    let mut listed: Vec<String> = raw::list_groups(&mut client).await.into_iter().map(|(g, _)| g).collect();
    listed.sort();
    assert_eq!(listed, vec!["..", "50%", "team/a"]);
    for group in ["team/a", "50%", ".."] {
        assert_eq!(raw::committed(&mut client, group).await, (0, vec![("t".to_string(), 0, 11)]), "{group}");
    }
    assert_eq!(raw::committed(&mut client, "team").await, (0, vec![]));
    broker.stop().await.unwrap();
}

/// OffsetCommit during a rebalance, in Kafka's order: a member of the current
/// generation may commit while the group prepares the rebalance; once the new
/// generation is handed out, a commit from the old one is ILLEGAL_GENERATION (not
/// REBALANCE_IN_PROGRESS, which is only for the new generation before its assignment),
/// so a cooperative member revoking partitions learns that its generation is gone
/// (#27 item 6, librdkafka test 0113 manual-commit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offset_commit_checks_member_and_generation_before_the_rebalance() {
    use common::RawClient;
    use kafka_protocol::messages::*;
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), |c| c.group.initial_rebalance_delay_ms = 0).await.unwrap();
    let mut a = RawClient::connect(broker.addr).await.unwrap();
    raw::create_topic(&mut a, "t", 1).await;
    let a_id = raw::member_id(&mut a, "g").await;
    let joined = raw::join(&mut a, "g", &a_id).await;
    assert_eq!((joined.error_code, joined.generation_id), (0, 1));
    let sync = SyncGroupRequest::default()
        .with_group_id(GroupId(raw::s("g")))
        .with_member_id(raw::s(&a_id))
        .with_generation_id(1)
        .with_assignments(vec![sync_group_request::SyncGroupRequestAssignment::default().with_member_id(raw::s(&a_id))]);
    let synced: SyncGroupResponse = a.call(ApiKey::SyncGroup, 3, &sync).await.unwrap();
    assert_eq!(synced.error_code, 0);
    assert_eq!(raw::commit(&mut a, "g", &a_id, 1, &[("t", 0, 1)]).await, vec![0]);

    // b joins: the group prepares a rebalance and b's JoinGroup waits for a.
    let mut b = RawClient::connect(broker.addr).await.unwrap();
    let b_id = raw::member_id(&mut b, "g").await;
    let b_join = tokio::spawn(async move { raw::join(&mut b, "g", &b_id).await });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while raw::heartbeat(&mut a, "g", &a_id, 1).await != raw::REBALANCE_IN_PROGRESS {
        assert!(std::time::Instant::now() < deadline, "the rebalance did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(raw::commit(&mut a, "g", &a_id, 1, &[("t", 0, 2)]).await, vec![0], "allowed while preparing");

    // a rejoins: generation 2 is handed out, the group waits for the leader's assignment.
    let rejoined = raw::join(&mut a, "g", &a_id).await;
    assert_eq!((rejoined.error_code, rejoined.generation_id), (0, 2));
    assert_eq!(b_join.await.unwrap().generation_id, 2);
    assert_eq!(raw::commit(&mut a, "g", &a_id, 1, &[("t", 0, 3)]).await, vec![raw::ILLEGAL_GENERATION]);
    assert_eq!(raw::commit(&mut a, "g", &a_id, 2, &[("t", 0, 3)]).await, vec![raw::REBALANCE_IN_PROGRESS]);
    assert_eq!(raw::commit(&mut a, "g", "stranger", 2, &[("t", 0, 3)]).await, vec![raw::UNKNOWN_MEMBER_ID]);
    assert_eq!(raw::committed(&mut a, "g").await, (0, vec![("t".to_string(), 0, 2)]));
    broker.stop().await.unwrap();
}

/// On a cluster each broker lists only the groups it coordinates, as Kafka does, so a
/// client that asks every broker (librdkafka's list_groups) finds each group once, at the
/// broker that can describe it (#27 item 8, librdkafka test 0019 on three brokers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_each_broker_lists_only_the_groups_it_coordinates() {
    use common::RawClient;
    use kafka_protocol::messages::*;
    use std::collections::BTreeMap;
    let cluster = fjord_testkit::Cluster::builder().brokers(3).start().await.unwrap();
    cluster.create_topic("t", 1, &[], Duration::from_secs(30)).await.unwrap();
    let ids = cluster.ids();
    let connect = |id: i32| {
        let addr = cluster.addr(id).parse().unwrap();
        async move { RawClient::connect(addr).await.unwrap() }
    };
    let mut coordinators = BTreeMap::new();
    for (i, group) in ["g0", "g1", "g2", "g3"].into_iter().enumerate() {
        // The broker asked first takes the group, so the groups spread over the brokers.
        let mut client = connect(ids[i % ids.len()]).await;
        let find = FindCoordinatorRequest::default().with_key(raw::s(group)).with_key_type(0);
        let found: FindCoordinatorResponse = client.call(ApiKey::FindCoordinator, 3, &find).await.unwrap();
        assert_eq!(found.error_code, 0);
        let mut coordinator = connect(found.node_id.0).await;
        assert_eq!(raw::commit(&mut coordinator, group, "", -1, &[("t", 0, 1)]).await, vec![0]);
        coordinators.insert(group.to_string(), found.node_id.0);
    }
    assert!(coordinators.values().collect::<std::collections::BTreeSet<_>>().len() > 1, "{coordinators:?}");
    let mut listed = BTreeMap::new();
    for id in ids {
        for (group, state) in raw::list_groups(&mut connect(id).await).await {
            assert_eq!(state, "Empty");
            assert!(listed.insert(group.clone(), id).is_none(), "{group} listed by two brokers");
        }
    }
    assert_eq!(listed, coordinators);
}

/// Static membership (KIP-345) through librdkafka: two members with
/// `group.instance.id`; one closes (a static member sends no LeaveGroup) and a new
/// process comes back under the same instance id within the session timeout. It gets
/// the partitions it had, and the other member sees no rebalance at all: nothing
/// revoked, nothing reassigned (#27 item 3, librdkafka test 0102).
const STATIC_SCRIPT: &str = r#"
import sys, time
from confluent_kafka import Consumer
bootstrap, topic = sys.argv[1], sys.argv[2]
events = []
def make(name, instance):
    c = Consumer({'bootstrap.servers': bootstrap, 'group.id': 'static', 'group.instance.id': instance,
                  'session.timeout.ms': 30000, 'heartbeat.interval.ms': 300,
                  'auto.offset.reset': 'earliest', 'enable.auto.commit': False})
    c.subscribe([topic],
                on_assign=lambda _, ps: events.append((name, 'assign', sorted(p.partition for p in ps))),
                on_revoke=lambda _, ps: events.append((name, 'revoke', sorted(p.partition for p in ps))))
    return c
def assignment(name):
    owned = None
    for who, kind, ps in events:
        if who == name:
            owned = ps if kind == 'assign' else []
    return owned or []
def poll_until(consumers, done, secs, what):
    deadline = time.time() + secs
    while time.time() < deadline:
        for c in consumers:
            c.poll(0.05)
        if done():
            return
    raise AssertionError((what, events))
def poll_for(consumers, secs):
    deadline = time.time() + secs
    while time.time() < deadline:
        for c in consumers:
            c.poll(0.05)
a, b = make('a', 'instance-a'), make('b', 'instance-b')
poll_until([a, b], lambda: assignment('a') and assignment('b') and sorted(assignment('a') + assignment('b')) == [0, 1, 2, 3],
           60, 'both members assigned')
# Let the group settle, then remember where it is.
poll_for([a, b], 2)
before_a, before_b, seen = assignment('a'), assignment('b'), len(events)
a.close()
a2 = make('a2', 'instance-a')
poll_until([a2, b], lambda: assignment('a2'), 20, 'the returning member assigned')
poll_for([a2, b], 3)
assert assignment('a2') == before_a, ('a different assignment', before_a, events)
later_b = [e for e in events[seen:] if e[0] == 'b']
assert later_b == [], ('the other member was rebalanced', later_b, events)
assert assignment('b') == before_b
a2.close(); b.close()
print("ok")
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_member_that_comes_back_keeps_its_partitions_and_nobody_rebalances() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), |c| {
        c.num_partitions = 4;
        c.group.initial_rebalance_delay_ms = 500;
    })
    .await
    .unwrap();
    let bootstrap = broker.bootstrap();
    kcat(&["-b", &bootstrap, "-P", "-t", "statics", "-K:"], Some(&lines("v", 40))).await.unwrap();
    run_python(STATIC_SCRIPT, &[&bootstrap, "statics"], PYTHON_TIMEOUT).await;
    broker.stop().await.unwrap();
}

/// Committed offsets expire (`offsets.retention.minutes`), over real ZooKeeper, from
/// registry state as other coordinators leave it: a group nobody holds whose offset is a
/// retention old loses it; one whose record says it emptied two days ago loses a
/// three-day-old offset, one emptied an hour ago keeps it; one whose record says it had
/// members (its coordinator died with them) keeps everything and is recorded empty from
/// now; another broker's group is left to that broker; a fresh commit stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_offsets_expire_a_retention_after_their_commit_or_their_group_emptied() {
    use common::RawClient;
    use fjord_coord::{create_all, CreateMode};
    let cluster = fjord_testkit::Cluster::builder()
        .brokers(1)
        .config("offsets.retention.minutes", 1440)
        .config("offsets.retention.check.interval.ms", 200)
        .start()
        .await
        .unwrap();
    cluster.create_topic("t", 1, &[], Duration::from_secs(30)).await.unwrap();
    let store = cluster.store();
    let now = fjord_record::now_ms();
    let days = |n: i64| now - n * 86_400_000;
    let offset = |at: i64| format!(r#"{{"offset":7,"leader_epoch":-1,"metadata":"","commit_timestamp_ms":{at}}}"#);
    let membership = |members: bool, since: i64| format!(r#"{{"members":{members},"since_ms":{since}}}"#);
    let groups: [(&str, Option<String>, i64, Option<&str>); 6] = [
        ("old", None, days(2), None),
        ("emptied", Some(membership(false, days(2))), days(3), None),
        ("just-emptied", Some(membership(false, now - 3_600_000)), days(3), None),
        ("moved", Some(membership(true, days(30))), days(30), None),
        ("elsewhere", None, days(30), Some(r#"{"broker_id":7}"#)),
        ("young", None, now - 3_600_000, None),
    ];
    for (group, record, committed_at, holder) in &groups {
        let path = format!("/consumers/{group}/offsets/t/0");
        create_all(&**store, &path, offset(*committed_at).as_bytes(), CreateMode::Persistent).await.unwrap();
        if let Some(record) = record {
            store.set(&format!("/consumers/{group}"), record.as_bytes(), None).await.unwrap();
        }
        if let Some(holder) = holder {
            // Ephemeral of the test's own session: another broker holding the group.
            store.create(&format!("/consumers/{group}/coordinator"), holder.as_bytes(), CreateMode::Ephemeral).await.unwrap();
        }
    }
    let mut client = RawClient::connect(cluster.addr(cluster.ids()[0]).parse().unwrap()).await.unwrap();
    assert_eq!(raw::commit(&mut client, "fresh", "", -1, &[("t", 0, 3)]).await, vec![0]);

    let present =
        |group: &'static str| async move { store.get(&format!("/consumers/{group}/offsets/t/0")).await.unwrap().is_some() };
    let moved_record = || async {
        let (record, _) = store.get("/consumers/moved").await.unwrap().unwrap();
        serde_json::from_slice::<serde_json::Value>(&record).unwrap()
    };
    // One sweep does all of it, group after group: wait for its last step as well as
    // its first (a loaded machine once showed "moved" not yet rewritten).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while present("old").await || present("emptied").await || moved_record().await["members"] != false {
        assert!(std::time::Instant::now() < deadline, "the due offsets never expired: moved is {}", moved_record().await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for group in ["just-emptied", "moved", "elsewhere", "young"] {
        assert!(present(group).await, "{group} lost an offset not due");
    }
    let record = moved_record().await;
    assert!(record["since_ms"].as_i64().unwrap() >= now, "{record}");
    assert_eq!(raw::committed(&mut client, "fresh").await, (0, vec![("t".to_string(), 0, 3)]));
    assert_eq!(raw::committed(&mut client, "old").await, (0, vec![]));
}

/// `group.max.size` through librdkafka: with room for one member, a second consumer of
/// the group gets GROUP_MAX_SIZE_REACHED (KIP-389) and the first keeps every partition.
const MAX_SIZE_SCRIPT: &str = r#"
import sys, time
from confluent_kafka import Consumer, KafkaError

bootstrap, topic = sys.argv[1], sys.argv[2]
errors = []
conf = {'bootstrap.servers': bootstrap, 'group.id': 'capped', 'session.timeout.ms': 6000,
        'auto.offset.reset': 'earliest', 'error_cb': lambda e: errors.append(e)}
first = Consumer(conf)
first.subscribe([topic])
deadline = time.time() + 30
while not first.assignment() and time.time() < deadline:
    first.poll(0.2)
assert len(first.assignment()) == 3, first.assignment()

second = Consumer(conf)
second.subscribe([topic])
refused = None
deadline = time.time() + 30
while refused is None and time.time() < deadline:
    m = second.poll(0.2)
    first.poll(0)
    if m is not None and m.error() and m.error().code() == KafkaError.GROUP_MAX_SIZE_REACHED:
        refused = m.error()
    for e in errors:
        if e.code() == KafkaError.GROUP_MAX_SIZE_REACHED:
            refused = e
assert refused is not None, ("no GROUP_MAX_SIZE_REACHED", [str(e) for e in errors])
assert not second.assignment(), second.assignment()
for _ in range(10):
    first.poll(0.1)
assert len(first.assignment()) == 3, first.assignment()
second.close()
first.close()
print("ok")
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_at_its_max_size_refuses_another_librdkafka_consumer() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), |c| {
        c.num_partitions = 3;
        c.group.initial_rebalance_delay_ms = 0;
        c.group.max_size = 1;
    })
    .await
    .unwrap();
    let bootstrap = broker.bootstrap();
    kcat(&["-b", &bootstrap, "-P", "-t", "capped", "-K:"], Some(&lines("x", 30))).await.unwrap();
    run_python(MAX_SIZE_SCRIPT, &[&bootstrap, "capped"], PYTHON_TIMEOUT).await;
}
