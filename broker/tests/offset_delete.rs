//! OffsetDelete (API key 47, issue #22) through kafka-python 3's `delete_group_offsets`,
//! with a confluent-kafka consumer as the live member: the offsets asked for go, the
//! others stay, a subscribed topic's stay while its consumer lives and go once it left;
//! an unknown group, topic or partition gets Kafka's error and changes nothing.
//! (confluent-kafka's Python AdminClient has no DeleteConsumerGroupOffsets; librdkafka's
//! own is exercised by `cargo xtask conformance 0081`. The permissions are in
//! tests/authorization.rs.)

mod common;

use std::time::Duration;

use common::{run_python, TestBroker};

const SCRIPT: &str = r#"
import sys, time
from kafka import TopicPartition as TP
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import NoError, GroupIdNotFoundError, UnknownTopicOrPartitionError, GroupSubscribedToTopicError
from kafka.structs import OffsetAndMetadata
from confluent_kafka import Consumer

bootstrap = sys.argv[1]
ka = KafkaAdminClient(bootstrap_servers=bootstrap)
ka.create_topics([NewTopic('a', 2, 1), NewTopic('b', 1, 1)])
a0, a1, b0 = TP('a', 0), TP('a', 1), TP('b', 0)

def commit(group, tps):
    ka.alter_group_offsets(group, {tp: OffsetAndMetadata(10 + tp.partition, '', -1) for tp in tps})

def committed(group):
    return {tp: o.offset for tp, o in ka.list_group_offsets({group: None})[group].items() if o.offset >= 0}

# An empty group: the offsets asked for go, the rest stay.
commit('g', [a0, a1, b0])
assert committed('g') == {a0: 10, a1: 11, b0: 10}, committed('g')
assert ka.delete_group_offsets('g', [a0, b0]) == {a0: NoError, b0: NoError}
assert committed('g') == {a1: 11}, committed('g')

# Bad input: Kafka's errors, nothing changes.
try:
    ka.delete_group_offsets('nobody', [a1])
    raise AssertionError('an unknown group was accepted')
except GroupIdNotFoundError:
    pass
result = ka.delete_group_offsets('g', [TP('absent', 0), TP('a', 9)])
assert result == {TP('absent', 0): UnknownTopicOrPartitionError, TP('a', 9): UnknownTopicOrPartitionError}, result
assert committed('g') == {a1: 11}, committed('g')

# A live consumer subscribed to 'a': a's offsets stay (GROUP_SUBSCRIBED_TO_TOPIC), b's go.
# (Committed before it joins: Kafka takes commits from outside the group only while it
# has no members.)
commit('live', [a0, b0])
c = Consumer({'bootstrap.servers': bootstrap, 'group.id': 'live', 'enable.auto.commit': False,
              'session.timeout.ms': 6000})
c.subscribe(['a'])
deadline = time.time() + 30
while not c.assignment() and time.time() < deadline:
    c.poll(0.2)
assert c.assignment(), 'the consumer never got its partitions'
result = ka.delete_group_offsets('live', [a0, b0])
assert result == {a0: GroupSubscribedToTopicError, b0: NoError}, result
assert committed('live') == {a0: 10}, committed('live')
c.close()
# Once it left, the group is empty and a's offsets may go; with them the group is gone.
assert ka.delete_group_offsets('live', [a0]) == {a0: NoError}
assert committed('live') == {}, committed('live')
try:
    ka.delete_group_offsets('live', [a0])
    raise AssertionError('a group without members or offsets still exists')
except GroupIdNotFoundError:
    pass
print("ok")
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_python_deletes_group_offsets_except_a_live_consumers_topics() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), |c| c.group.initial_rebalance_delay_ms = 0).await.unwrap();
    run_python(SCRIPT, &[&broker.bootstrap()], Duration::from_secs(90)).await;
    broker.stop().await.unwrap();
}
