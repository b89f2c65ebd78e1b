//! DescribeLogDirs (API 35, issue #22) through kafka-python 3's `describe_log_dirs`:
//! the broker's one log dir by its path, with the file system's total and usable bytes;
//! every replica's size on disk (a partition written to holds at least the bytes
//! produced, an empty one 0), offset lag 0 and never a future replica; asking for some
//! partitions answers only those, and a partition the broker does not hold is left out.
//! AlterReplicaLogDirs (API 34) through kafka-python's `alter_replica_log_dirs`: with one
//! log dir, a replica asked into it is already there (no error), another path is
//! LOG_DIR_NOT_FOUND, a partition the cluster does not have UNKNOWN_TOPIC_OR_PARTITION, and
//! nothing moves.

mod common;

use std::time::Duration;

use common::{run_python, TestBroker};

const SCRIPT: &str = r#"
import sys
from kafka.admin import KafkaAdminClient, NewTopic
from confluent_kafka import Producer

bootstrap, log_dir = sys.argv[1], sys.argv[2]
ka = KafkaAdminClient(bootstrap_servers=bootstrap)
ka.create_topics([NewTopic('ld', 2, 1), NewTopic('ld-other', 1, 1)])
p = Producer({'bootstrap.servers': bootstrap, 'linger.ms': 0})
for i in range(200):
    p.produce('ld', partition=0, value=b'x' * 1000)
assert p.flush(20) == 0

def sizes(answer):
    [broker] = answer
    [d] = broker['log_dirs']
    assert d['error_code'] == 0 and d['log_dir'] == log_dir, d
    out = {}
    for t in d['topics']:
        for part in t['partitions']:
            assert part['offset_lag'] == 0 and part['is_future_key'] is False, part
            out[(t['name'], part['partition_index'])] = part['partition_size']
    return d, out

d, every = sizes(ka.describe_log_dirs())
assert d['total_bytes'] > 0 and 0 <= d['usable_bytes'] <= d['total_bytes'], d
assert set(every) >= {('ld', 0), ('ld', 1), ('ld-other', 0)}, every
assert every[('ld', 0)] >= 200 * 1000, every
assert every[('ld', 1)] == 0 and every[('ld-other', 0)] == 0, every

_, some = sizes(ka.describe_log_dirs(topic_partitions={'ld': [0, 7], 'absent': [0]}))
assert some == {('ld', 0): every[('ld', 0)]}, some
print("ok")
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_python_describes_the_log_dir_and_each_replicas_size() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let broker = TestBroker::start_in(data.clone(), |_| {}).await.unwrap();
    run_python(SCRIPT, &[&broker.bootstrap(), &data.display().to_string()], Duration::from_secs(90)).await;
    broker.stop().await.unwrap();
}

const ALTER_SCRIPT: &str = r#"
import sys
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import NoError, LogDirNotFoundError, UnknownTopicOrPartitionError
from confluent_kafka import Producer

bootstrap, log_dir = sys.argv[1], sys.argv[2]
ka = KafkaAdminClient(bootstrap_servers=bootstrap)
ka.create_topics([NewTopic('moved', 2, 1)])
p = Producer({'bootstrap.servers': bootstrap, 'linger.ms': 0})
for i in range(50):
    p.produce('moved', partition=0, value=b'x' * 1000)
assert p.flush(20) == 0

def sizes():
    [broker] = ka.describe_log_dirs()
    [d] = broker['log_dirs']
    assert d['log_dir'] == log_dir, d
    return {(t['name'], p['partition_index']): p['partition_size'] for t in d['topics'] for p in t['partitions']}

before = sizes()
answer = ka.alter_replica_log_dirs({
    ('moved', 0, 0): log_dir,
    ('moved', 1, 0): log_dir + '/',
    ('moved', 7, 0): log_dir,
    ('absent', 0, 0): log_dir,
})
assert {(r.topic, r.partition): e for r, e in answer.items()} == {
    ('moved', 0): NoError, ('moved', 1): NoError,
    ('moved', 7): UnknownTopicOrPartitionError, ('absent', 0): UnknownTopicOrPartitionError}, answer
answer = ka.alter_replica_log_dirs({('moved', 0, 0): log_dir + '-other', ('absent', 0, 0): '/nowhere'})
assert {(r.topic, r.partition): e for r, e in answer.items()} == {
    ('moved', 0): LogDirNotFoundError, ('absent', 0): LogDirNotFoundError}, answer
assert sizes() == before, (before, sizes())
print("ok")
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_python_alters_replica_log_dirs_within_the_one_log_dir() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let broker = TestBroker::start_in(data.clone(), |_| {}).await.unwrap();
    run_python(ALTER_SCRIPT, &[&broker.bootstrap(), &data.display().to_string()], Duration::from_secs(90)).await;
    broker.stop().await.unwrap();
}
