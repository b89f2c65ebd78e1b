//! Several log directories (`log.dirs = "a,b,c"`, JBOD; issue #22) on a real broker:
//! - new partitions spread over the directories (the one with the fewest partitions
//!   first), each directory gets meta.properties with the same broker and cluster id and
//!   checkpoint files of its own, and the embedded metadata store stays in the first;
//! - after a restart every record produced reads back, each partition from its directory;
//! - the same partition in two directories stops the start with an error naming both,
//!   and nothing is deleted;
//! - kafka-python's `describe_log_dirs` lists the three directories, each with its
//!   partitions and their sizes;
//! - a directory that fails (its checkpoint cannot be written: an I/O error) takes only
//!   its partitions offline: they answer KAFKA_STORAGE_ERROR, the others keep taking
//!   writes, DescribeLogDirs lists it with KAFKA_STORAGE_ERROR; repaired and restarted,
//!   every acknowledged record is there;
//! - in a cluster (two brokers on ZooKeeper, two log dirs each), a failed directory takes
//!   only its replicas offline: leadership of its partition moves to the other broker,
//!   the broker keeps leading or following its other partition, nothing acknowledged is lost;
//! - AlterReplicaLogDirs moves a replica into another directory while an acks=all
//!   producer writes to it: every acknowledged record is there after the move and after
//!   a restart, and the partition stays in its new directory;
//! - while a move copies, DescribeLogDirs lists the copy as the partition's future
//!   replica in the new dir; a broker stopped meanwhile cancels the move: the copy is
//!   deleted, and the partition comes back from its old dir with every record.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use common::{produce_request, run_python, RawClient, TestBroker};
use fjord_client::ProducerRecord;
use fjord_client::{Acks, Admin, ClientConfig, NewTopic, Producer, ProducerConfig};
use fjord_record::BatchBuilder;
use fjord_testkit::{produce_round, read_values, round_value};
use kafka_protocol::messages::alter_replica_log_dirs_request::{AlterReplicaLogDir, AlterReplicaLogDirTopic};
use kafka_protocol::messages::{
    AlterReplicaLogDirsRequest, AlterReplicaLogDirsResponse, ApiKey, DescribeLogDirsRequest, DescribeLogDirsResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;

/// Partition directories (`<topic>-<n>`) in `dir`, sorted: the test's topics' and any
/// internal topic's (the audit's).
fn partition_dirs(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().into_string().unwrap())
        .filter(|n| n.rsplit_once('-').is_some_and(|(_, p)| p.parse::<u32>().is_ok()))
        .collect();
    names.sort();
    names
}

/// The test's own partitions among them.
fn test_partitions(dir: &Path) -> Vec<String> {
    partition_dirs(dir).into_iter().filter(|n| n.starts_with("spread-") || n.starts_with("other-")).collect()
}

/// `cluster.id` of a log dir's meta.properties.
fn cluster_id(dir: &Path) -> String {
    let text = std::fs::read_to_string(dir.join("meta.properties")).unwrap();
    assert!(text.contains("broker.id=0\n"), "{text}");
    text.lines().find_map(|l| l.strip_prefix("cluster.id=")).unwrap().to_owned()
}

fn three_dirs(root: &Path) -> Vec<PathBuf> {
    ["a", "b", "c"].iter().map(|d| root.join(d)).collect()
}

async fn start(dirs: &[PathBuf]) -> anyhow::Result<TestBroker> {
    let others = dirs[1..].to_vec();
    TestBroker::start_in(dirs[0].clone(), move |config| {
        config.other_log_dirs = others;
        // No audit topic: the test places its own partitions one per directory.
        config.audit.enable = false;
    })
    .await
}

fn batch(value: &str) -> Bytes {
    let mut builder = BatchBuilder::new(1_700_000_000_000);
    builder.append(1_700_000_000_000, None, Some(value.as_bytes()), &[]);
    builder.build()
}

/// (log dir, error code) of each directory DescribeLogDirs (v4) lists.
async fn describe(client: &mut RawClient) -> Vec<(String, i16)> {
    let response: DescribeLogDirsResponse =
        client.call(ApiKey::DescribeLogDirs, 4, &DescribeLogDirsRequest::default().with_topics(None)).await.unwrap();
    response.results.iter().map(|r| (r.log_dir.to_string(), r.error_code)).collect()
}

const KAFKA_STORAGE_ERROR: i16 = 56;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_dir_takes_only_its_partitions_offline() {
    let root = tempfile::tempdir().unwrap();
    let dirs = three_dirs(root.path());
    let broker = start(&dirs).await.unwrap();
    let client = ClientConfig::new(&broker.bootstrap());
    Admin::connect(client.clone()).await.unwrap().create_topics(&[NewTopic::new("f", 3)]).await.unwrap();
    let mut raw = RawClient::connect(broker.bootstrap().parse().unwrap()).await.unwrap();
    let mut acked: BTreeMap<i32, Vec<String>> = BTreeMap::new();
    let send = async |raw: &mut RawClient, p: i32, value: String, acked: &mut BTreeMap<i32, Vec<String>>| {
        let (code, _) = raw.produce(9, &produce_request("f", p, -1, 5000, batch(&value))).await;
        if code == 0 {
            acked.entry(p).or_default().push(value);
        }
        code
    };
    for i in 0..20 {
        for p in 0..3 {
            // Retried while the new partitions get their leader.
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while send(&mut raw, p, format!("before-{p}-{i}"), &mut acked).await != 0 {
                assert!(std::time::Instant::now() < deadline);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    // One partition per directory; the one in the second fails.
    let failing = (0..3).find(|p| dirs[1].join(format!("f-{p}")).is_dir()).expect("a partition in the second dir");
    let checkpoint = dirs[1].join("recovery-point-offset-checkpoint");
    std::fs::remove_file(&checkpoint).ok();
    std::fs::create_dir(&checkpoint).unwrap();
    std::fs::write(checkpoint.join("blocker"), "x").unwrap();

    // Writes go on (the next flush finds the failure); within seconds the failed
    // directory's partition answers KAFKA_STORAGE_ERROR, the others take every write.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut i = 0;
    loop {
        i += 1;
        let code = send(&mut raw, failing, format!("during-{failing}-{i}"), &mut acked).await;
        if code == KAFKA_STORAGE_ERROR {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the failed dir's partition still answers {code}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for p in (0..3).filter(|&p| p != failing) {
        for i in 0..20 {
            assert_eq!(send(&mut raw, p, format!("after-{p}-{i}"), &mut acked).await, 0, "partition {p}");
        }
    }
    assert_eq!(send(&mut raw, failing, "refused".into(), &mut acked).await, KAFKA_STORAGE_ERROR);
    let listed = describe(&mut raw).await;
    let expected: Vec<(String, i16)> =
        dirs.iter().enumerate().map(|(i, d)| (d.display().to_string(), if i == 1 { KAFKA_STORAGE_ERROR } else { 0 })).collect();
    assert_eq!(listed, expected);
    drop(raw);
    broker.stop().await.unwrap();

    // Repaired: every acknowledged record of every partition is there.
    std::fs::remove_dir_all(&checkpoint).unwrap();
    let broker = start(&dirs).await.unwrap();
    let client = ClientConfig::new(&broker.bootstrap());
    for p in 0..3 {
        let values = read_values(&client, "f", p).await.unwrap();
        assert_eq!(values, acked[&p], "partition {p}");
    }
    let mut raw = RawClient::connect(broker.bootstrap().parse().unwrap()).await.unwrap();
    assert!(describe(&mut raw).await.iter().all(|(_, code)| *code == 0));
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_spread_over_three_dirs_and_read_back_after_a_restart() {
    let root = tempfile::tempdir().unwrap();
    let dirs = three_dirs(root.path());
    let broker = start(&dirs).await.unwrap();
    let client = ClientConfig::new(&broker.bootstrap());
    let admin = Admin::connect(client.clone()).await.unwrap();
    admin.create_topics(&[NewTopic::new("spread", 6), NewTopic::new("other", 3)]).await.unwrap();
    let producer =
        Producer::connect(ProducerConfig { client: client.clone(), acks: Acks::All, ..ProducerConfig::default() }).await.unwrap();
    produce_round(&producer, "spread", 6, 50, 0).await.unwrap();
    produce_round(&producer, "other", 3, 50, 0).await.unwrap();

    // Nine partitions (and any internal topic's) over three directories: evenly, none in two.
    let mut placed: BTreeMap<String, usize> = BTreeMap::new();
    let counts: Vec<usize> = dirs.iter().map(|dir| partition_dirs(dir).len()).collect();
    assert!(counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1, "{counts:?}");
    for (i, dir) in dirs.iter().enumerate() {
        let held = test_partitions(dir);
        assert!(held.len() >= 2, "{}: {held:?}", dir.display());
        for name in held {
            assert_eq!(placed.insert(name.clone(), i), None, "{name} in two dirs");
        }
    }
    assert_eq!(placed.len(), 9);
    assert!(dirs[0].join(fjord_broker::server::METADATA_DIR).is_dir(), "the metadata store stays in the first dir");
    for dir in &dirs[1..] {
        assert!(!dir.join(fjord_broker::server::METADATA_DIR).exists());
    }
    let id = cluster_id(&dirs[0]);
    for dir in &dirs {
        assert_eq!(cluster_id(dir), id, "{}", dir.display());
    }
    drop(producer);
    broker.stop().await.unwrap();
    for dir in &dirs {
        let checkpoint = std::fs::read_to_string(dir.join("recovery-point-offset-checkpoint")).unwrap();
        // Its own partitions only: "<topic> <partition> <offset>" lines.
        let lines = checkpoint.lines().filter(|l| l.starts_with("spread ") || l.starts_with("other ")).count();
        assert_eq!(lines, test_partitions(dir).len(), "{}: {checkpoint}", dir.display());
    }

    let broker = start(&dirs).await.unwrap();
    let client = ClientConfig::new(&broker.bootstrap());
    for (topic, partitions) in [("spread", 6), ("other", 3)] {
        for p in 0..partitions {
            let values = read_values(&client, topic, p).await.unwrap();
            let expected: Vec<String> = (0..50).map(|i| round_value(0, p, i)).collect();
            assert_eq!(values, expected, "{topic}-{p}");
        }
    }
    for (i, dir) in dirs.iter().enumerate() {
        for name in test_partitions(dir) {
            assert_eq!(placed[&name], i, "{name} stayed where it was");
        }
    }
    broker.stop().await.unwrap();

    // The same partition in two directories: the start is refused, naming both; both kept.
    let copy = dirs[1].join("spread-0");
    let original = dirs.iter().map(|d| d.join("spread-0")).find(|p| p.is_dir()).unwrap();
    let copy = if original == copy { dirs[2].join("spread-0") } else { copy };
    std::fs::create_dir(&copy).unwrap();
    for entry in std::fs::read_dir(&original).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), copy.join(entry.file_name())).unwrap();
    }
    let err = match start(&dirs).await {
        Ok(_) => panic!("a broker started with spread-0 in two log dirs"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("two log dirs") && err.contains(&original.display().to_string()), "{err}");
    assert!(err.contains(&copy.display().to_string()), "{err}");
    assert!(original.join("00000000000000000000.log").is_file() && copy.join("00000000000000000000.log").is_file());
}

const SCRIPT: &str = r#"
import sys
from kafka.admin import KafkaAdminClient, NewTopic
from confluent_kafka import Producer

bootstrap, dirs = sys.argv[1], sys.argv[2].split(',')
ka = KafkaAdminClient(bootstrap_servers=bootstrap)
ka.create_topics([NewTopic('ld', 3, 1)])
p = Producer({'bootstrap.servers': bootstrap, 'linger.ms': 0})
for i in range(100):
    p.produce('ld', partition=1, value=b'x' * 1000)
assert p.flush(20) == 0

[broker] = ka.describe_log_dirs()
assert [d['log_dir'] for d in broker['log_dirs']] == dirs, broker
held = {}
for d in broker['log_dirs']:
    assert d['error_code'] == 0 and d['total_bytes'] > 0, d
    for t in d['topics']:
        for part in t['partitions']:
            key = (t['name'], part['partition_index'])
            assert key not in held, (key, broker)
            held[key] = (d['log_dir'], part['partition_size'])
# Every directory holds some partition (ld's, or an internal topic's).
assert set(dir for (dir, _) in held.values()) == set(dirs), held
assert {k for k in held if k[0] == 'ld'} == {('ld', 0), ('ld', 1), ('ld', 2)}, held
assert held[('ld', 1)][1] >= 100 * 1000 and held[('ld', 0)][1] == 0, held
print("ok")
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_python_describes_each_of_three_log_dirs() {
    let root = tempfile::tempdir().unwrap();
    let dirs = three_dirs(root.path());
    let broker = start(&dirs).await.unwrap();
    let list = dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(",");
    run_python(SCRIPT, &[&broker.bootstrap(), &list], Duration::from_secs(90)).await;
    broker.stop().await.unwrap();
}

/// The log dir DescribeLogDirs names for `topic`-`partition`, if any.
async fn dir_of(client: &mut RawClient, topic: &str, partition: i32) -> Option<String> {
    let response: DescribeLogDirsResponse =
        client.call(ApiKey::DescribeLogDirs, 4, &DescribeLogDirsRequest::default().with_topics(None)).await.unwrap();
    response.results.iter().find_map(|r| {
        let held =
            r.topics.iter().any(|t| t.name.0.as_str() == topic && t.partitions.iter().any(|p| p.partition_index == partition));
        held.then(|| r.log_dir.to_string())
    })
}

/// AlterReplicaLogDirs of one partition into `dir` (v2): its error code.
async fn alter(client: &mut RawClient, dir: &str, topic: &str, partition: i32) -> i16 {
    let request = AlterReplicaLogDirsRequest::default().with_dirs(vec![AlterReplicaLogDir::default()
        .with_path(StrBytes::from_string(dir.to_owned()))
        .with_topics(vec![AlterReplicaLogDirTopic::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_owned())))
            .with_partitions(vec![partition])])]);
    let response: AlterReplicaLogDirsResponse = client.call(ApiKey::AlterReplicaLogDirs, 2, &request).await.unwrap();
    response.results[0].partitions[0].error_code
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_moves_to_another_dir_under_a_producer_and_keeps_every_acknowledged_record() {
    let root = tempfile::tempdir().unwrap();
    let dirs: Vec<PathBuf> = ["a", "b"].iter().map(|d| root.path().join(d)).collect();
    let others = dirs[1..].to_vec();
    let start = |dirs: Vec<PathBuf>, others: Vec<PathBuf>| {
        TestBroker::start_in(dirs[0].clone(), move |config| {
            config.other_log_dirs = others;
            config.audit.enable = false;
            // Small segments: the move copies sealed ones while the partition serves.
            config.set("log.min.segment.bytes", "1024").unwrap();
            config.set("log.segment.bytes", "16384").unwrap();
        })
    };
    let broker = start(dirs.clone(), others.clone()).await.unwrap();
    let client = ClientConfig::new(&broker.bootstrap());
    Admin::connect(client.clone()).await.unwrap().create_topics(&[NewTopic::new("mv", 1)]).await.unwrap();
    let mut raw = RawClient::connect(broker.bootstrap().parse().unwrap()).await.unwrap();
    let producer =
        Producer::connect(ProducerConfig { client: client.clone(), acks: Acks::All, ..ProducerConfig::default() }).await.unwrap();
    // Before the move: enough for several sealed segments.
    let mut acked = Vec::new();
    for i in 0..2000 {
        let value = format!("before-{i:05}-{}", "x".repeat(50));
        producer.send(ProducerRecord::new("mv", value.clone()).partition(0)).await.unwrap().await.unwrap();
        acked.push(value);
    }
    let from = dir_of(&mut raw, "mv", 0).await.expect("the partition is listed");
    let to = dirs.iter().map(|d| d.display().to_string()).find(|d| *d != from).unwrap();

    // A producer keeps writing (one record in flight at a time) while the move runs.
    let stop = tokio_util::sync::CancellationToken::new();
    let writer = {
        let (producer, stop) = (producer.clone(), stop.clone());
        tokio::spawn(async move {
            let mut acked = Vec::new();
            let mut i = 0;
            while !stop.is_cancelled() {
                let value = format!("during-{i:05}");
                i += 1;
                let sent = async {
                    let delivery = producer.send(ProducerRecord::new("mv", value.clone()).partition(0)).await?;
                    delivery.await
                }
                .await;
                if sent.is_ok() {
                    acked.push(value);
                }
            }
            acked
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(alter(&mut raw, &to, "mv", 0).await, 0);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while dir_of(&mut raw, "mv", 0).await.as_deref() != Some(to.as_str()) {
        assert!(std::time::Instant::now() < deadline, "the replica did not move");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.cancel();
    let during = writer.await.unwrap();
    assert!(during.len() > 10, "the producer kept writing: {} acknowledged", during.len());
    acked.extend(during);
    assert!(!Path::new(&from).join("mv-0").exists(), "the source directory is gone");
    assert!(Path::new(&to).join("mv-0").is_dir());

    let check = |values: Vec<String>, acked: &[String], when: &str| {
        // Every acknowledged record, in order (a record whose acknowledgement was lost
        // may be there too).
        let mut rest = values.iter();
        for value in acked {
            assert!(rest.any(|v| v == value), "{when}: {value} is missing or out of order");
        }
    };
    check(read_values(&client, "mv", 0).await.unwrap(), &acked, "after the move");
    drop(producer);
    broker.stop().await.unwrap();

    let broker = start(dirs.clone(), others).await.unwrap();
    let client = ClientConfig::new(&broker.bootstrap());
    check(read_values(&client, "mv", 0).await.unwrap(), &acked, "after a restart");
    let mut raw = RawClient::connect(broker.bootstrap().parse().unwrap()).await.unwrap();
    assert_eq!(dir_of(&mut raw, "mv", 0).await.as_deref(), Some(to.as_str()), "it stays in its new dir");
    // Bad input changes nothing: an unknown directory, a partition the cluster has not.
    assert_eq!(alter(&mut raw, "/no/such/dir", "mv", 0).await, 57, "LOG_DIR_NOT_FOUND");
    assert_eq!(alter(&mut raw, &from, "absent", 0).await, 3, "UNKNOWN_TOPIC_OR_PARTITION");
    assert_eq!(dir_of(&mut raw, "mv", 0).await.as_deref(), Some(to.as_str()));
    broker.stop().await.unwrap();
}

/// A move of a partition of many small segments (each file copied is fsynced, so the
/// copy takes a while): DescribeLogDirs asked right after AlterReplicaLogDirs lists the
/// copy in the new dir as a future replica, the partition still current in its old dir;
/// the broker stopped then cancels the move (shutdown waits for it), leaving no copy, and
/// after a restart the partition is served from its old dir with every record.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_move_in_progress_is_a_future_replica_and_a_stop_cancels_it() {
    let root = tempfile::tempdir().unwrap();
    let dirs: Vec<PathBuf> = ["a", "b"].iter().map(|d| root.path().join(d)).collect();
    let start = |dirs: Vec<PathBuf>| {
        TestBroker::start_in(dirs[0].clone(), move |config| {
            config.other_log_dirs = dirs[1..].to_vec();
            config.audit.enable = false;
            // One record per segment.
            config.set("log.min.segment.bytes", "1024").unwrap();
            config.set("log.segment.bytes", "1024").unwrap();
        })
    };
    let broker = start(dirs.clone()).await.unwrap();
    let client = ClientConfig::new(&broker.bootstrap());
    Admin::connect(client.clone()).await.unwrap().create_topics(&[NewTopic::new("slow", 1)]).await.unwrap();
    let producer =
        Producer::connect(ProducerConfig { client: client.clone(), acks: Acks::All, ..ProducerConfig::default() }).await.unwrap();
    let values: Vec<String> = (0..600).map(|i| format!("{i:05}-{}", "x".repeat(1000))).collect();
    for value in &values {
        producer.send(ProducerRecord::new("slow", value.clone()).partition(0)).await.unwrap().await.unwrap();
    }
    drop(producer);
    let mut raw = RawClient::connect(broker.bootstrap().parse().unwrap()).await.unwrap();
    let from = dir_of(&mut raw, "slow", 0).await.expect("the partition is listed");
    let to = dirs.iter().map(|d| d.display().to_string()).find(|d| *d != from).unwrap();

    assert_eq!(alter(&mut raw, &to, "slow", 0).await, 0);
    // (dir, is future) of each listing of slow-0, sorted; asked until the copy shows (the
    // move starts in the background, and copying hundreds of fsynced files takes seconds).
    let mut want = vec![(from.clone(), false), (to.clone(), true)];
    want.sort();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let response: DescribeLogDirsResponse =
            raw.call(ApiKey::DescribeLogDirs, 4, &DescribeLogDirsRequest::default().with_topics(None)).await.unwrap();
        let mut listed: Vec<(String, bool)> = response
            .results
            .iter()
            .flat_map(|r| {
                r.topics.iter().filter(|t| t.name.0.as_str() == "slow").flat_map(move |t| {
                    t.partitions.iter().filter(|p| p.partition_index == 0).map(move |p| (r.log_dir.to_string(), p.is_future_key))
                })
            })
            .collect();
        listed.sort();
        if listed == want {
            break;
        }
        assert_eq!(listed, vec![(from.clone(), false)], "while the move copies, the copy is the future replica in {to}");
        assert!(std::time::Instant::now() < deadline, "no future replica listed in {to}: {listed:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    broker.stop().await.unwrap();
    assert!(!Path::new(&to).join("slow-0-future").exists(), "the cancelled move's copy is deleted");
    assert!(!Path::new(&to).join("slow-0").exists());
    assert!(Path::new(&from).join("slow-0").is_dir(), "the source stays");

    let broker = start(dirs.clone()).await.unwrap();
    let client = ClientConfig::new(&broker.bootstrap());
    let mut raw = RawClient::connect(broker.bootstrap().parse().unwrap()).await.unwrap();
    assert_eq!(dir_of(&mut raw, "slow", 0).await.as_deref(), Some(from.as_str()));
    assert_eq!(read_values(&client, "slow", 0).await.unwrap(), values);
    broker.stop().await.unwrap();
}

/// Sends `values` to `topic`-`partition` one at a time (acks=all), each retried until
/// acknowledged; returns them.
async fn produce_all(producer: &Producer, topic: &str, partition: i32, values: Vec<String>) -> Vec<String> {
    for value in &values {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let sent = async {
                let delivery = producer.send(ProducerRecord::new(topic, value.clone()).partition(partition)).await?;
                delivery.await
            }
            .await;
            match sent {
                Ok(_) => break,
                Err(e) => assert!(std::time::Instant::now() < deadline, "{topic}-{partition} {value}: {e}"),
            }
        }
    }
    values
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_a_cluster_a_failed_dir_moves_leadership_of_its_partitions_only() {
    const REACT: Duration = Duration::from_secs(30);
    common::init_tracing();
    let cluster = fjord_testkit::Cluster::builder()
        .brokers(2)
        .log_dirs_per_broker(2)
        .config("replica.fetch.wait.max.ms", 100)
        .config("replica.lag.time.max.ms", 2_000)
        .start()
        .await
        .unwrap();
    cluster.create_topic("jb", 2, &[], REACT).await.unwrap();
    // One partition per directory on each broker.
    for id in cluster.ids() {
        let held: Vec<Vec<String>> = cluster.log_dirs(id).iter().map(|d| partition_dirs(d)).collect();
        assert!(held.iter().all(|h| h.len() == 1), "broker {id}: {held:?}");
    }
    let client = cluster.client_config();
    let producer =
        Producer::connect(ProducerConfig { client: client.clone(), acks: Acks::All, ..ProducerConfig::default() }).await.unwrap();
    let mut acked: BTreeMap<i32, Vec<String>> = BTreeMap::new();
    for p in 0..2 {
        let values = (0..50).map(|i| format!("before-{p}-{i}")).collect();
        acked.entry(p).or_default().extend(produce_all(&producer, "jb", p, values).await);
    }
    let leader = cluster.leader("jb", 0).await.unwrap().unwrap();
    let failing = cluster.log_dirs(leader).into_iter().find(|d| d.join("jb-0").is_dir()).unwrap();
    let kept = cluster.log_dirs(leader).into_iter().find(|d| *d != failing).unwrap();
    assert!(kept.join("jb-1").is_dir());
    let checkpoint = failing.join("recovery-point-offset-checkpoint");
    std::fs::remove_file(&checkpoint).ok();
    std::fs::create_dir(&checkpoint).unwrap();
    std::fs::write(checkpoint.join("blocker"), "x").unwrap();

    // Writes to partition 0 go on: the leader's next checkpoint fails, its directory goes
    // offline, and the other broker takes partition 0 over.
    let values = (0..50).map(|i| format!("during-0-{i}")).collect();
    acked.entry(0).or_default().extend(produce_all(&producer, "jb", 0, values).await);
    let deadline = std::time::Instant::now() + REACT;
    while cluster.leader("jb", 0).await.unwrap() == Some(leader) {
        assert!(std::time::Instant::now() < deadline, "leadership of jb-0 stayed on broker {leader}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let values = (0..50).map(|i| format!("after-0-{i}")).collect();
    acked.entry(0).or_default().extend(produce_all(&producer, "jb", 0, values).await);
    // Partition 1, in the broker's healthy directory, keeps both replicas in sync.
    let values = (0..50).map(|i| format!("after-1-{i}")).collect();
    acked.entry(1).or_default().extend(produce_all(&producer, "jb", 1, values).await);
    cluster.wait_for_isr("jb", 1, &[0, 1], REACT).await.unwrap();
    let state = cluster.partition_state("jb", 0).await.unwrap().unwrap();
    assert!(!state.isr.contains(&leader), "the failed replica left the ISR: {state:?}");

    for p in 0..2 {
        let values = read_values(&client, "jb", p).await.unwrap();
        let mut rest = values.iter();
        for value in &acked[&p] {
            assert!(rest.any(|v| v == value), "jb-{p}: {value} is missing or out of order");
        }
    }
    assert!(failing.join("jb-0").join("00000000000000000000.log").is_file(), "the failed dir's data is kept");
}
