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
