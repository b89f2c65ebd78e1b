//! Two more independent clients: confluent-kafka (librdkafka 2.16, which negotiates the
//! flexible Produce v9 and Fetch v12) and kafka-python 3 (which opens with ApiVersions v4,
//! a version this broker answers with the v0 fallback).
//!
//! The interpreter is `$FJORD_TEST_PYTHON` (set by `cargo xtask test`), else the
//! workspace's `target/venv/bin/python` that `cargo xtask` provisions.

mod common;

use std::time::Duration;

use common::{run_python, TestBroker};

const SCRIPT: &str = r#"
import sys, time
from confluent_kafka import Producer, Consumer, TopicPartition as CTP
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

bootstrap = sys.argv[1]
p = Producer({'bootstrap.servers': bootstrap, 'compression.type': 'zstd', 'linger.ms': 5})
for i in range(2000):
    p.produce('confluent', key=b'k%d' % i, value=b'v%d' % i, headers=[('h', b'x%d' % i)])
assert p.flush(20) == 0, "confluent-kafka left messages undelivered"

c = Consumer({'bootstrap.servers': bootstrap, 'group.id': 'unused', 'enable.auto.commit': False})
c.assign([CTP('confluent', 0, 0)])
seen = []
deadline = time.time() + 30
while len(seen) < 2000 and time.time() < deadline:
    m = c.poll(0.5)
    if m is None or m.error():
        continue
    i = len(seen)
    assert (m.key(), m.value(), m.headers(), m.offset()) == (b'k%d' % i, b'v%d' % i, [('h', b'x%d' % i)], i), m
    seen.append(m.offset())
c.close()
assert len(seen) == 2000, len(seen)

# kafka-python 3 defaults to the idempotent producer (InitProducerId, sequence numbers).
kp = KafkaProducer(bootstrap_servers=bootstrap, compression_type='gzip')
for i in range(100):
    kp.send('kafka-python', key=b'k', value=b'kp%d' % i).get(timeout=10)
kc = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=5000)
kc.assign([TopicPartition('kafka-python', 0)])
kc.seek_to_beginning()
values = [m.value for m in kc]
assert values == [b'kp%d' % i for i in range(100)], values
print("ok")
"#;

/// Topic config changes through both admin clients: kafka-python's `alter_configs`
/// (IncrementalAlterConfigs by default, legacy AlterConfigs when forced) and
/// confluent-kafka's `incremental_alter_configs` / `alter_configs` (librdkafka). kcat has
/// no admin mode, so it cannot take part here.
const ADMIN_SCRIPT: &str = r#"
import sys
from kafka.admin import KafkaAdminClient, NewTopic, ConfigResource, ConfigResourceType
from confluent_kafka.admin import AdminClient, ConfigResource as CR, ConfigEntry, AlterConfigOpType, ResourceType

bootstrap = sys.argv[1]
ka = KafkaAdminClient(bootstrap_servers=bootstrap)
ka.create_topics([NewTopic('admin', 1, 1, topic_configs={'retention.ms': '60000'})])
topic = lambda **configs: ConfigResource(ConfigResourceType.TOPIC, 'admin', configs=configs or None)
def overrides():
    return {k: v['value'] for k, v in ka.describe_configs([topic()])['topic']['admin'].items()}

assert ka.alter_configs([topic(**{'max.message.bytes': '5000'})]) == {'topic': {'admin': 'OK'}}
assert overrides() == {'retention.ms': '60000', 'max.message.bytes': '5000'}, overrides()
assert ka.alter_configs([topic(**{'segment.bytes': '1048576'})], incremental=False) == {'topic': {'admin': 'OK'}}
assert overrides() == {'retention.ms': '60000', 'max.message.bytes': '5000', 'segment.bytes': '1048576'}, overrides()
bad = ka.alter_configs([topic(**{'retention.ms': 'soon'})])['topic']['admin']
assert 'Error 40' in bad and 'retention.ms=soon' in bad, bad
broker = ka.alter_configs([ConfigResource(ConfigResourceType.BROKER, '0', configs={'log.retention.ms': '1'})], raise_on_unknown=False)
assert 'Error 42' in broker['broker']['0'], broker
assert overrides() == {'retention.ms': '60000', 'max.message.bytes': '5000', 'segment.bytes': '1048576'}, overrides()

ca = AdminClient({'bootstrap.servers': bootstrap})
def c_overrides():
    [f] = ca.describe_configs([CR(ResourceType.TOPIC, 'admin')]).values()
    return {n: c.value for n, c in f.result().items() if not c.is_default}
append = CR(ResourceType.TOPIC, 'admin', incremental_configs=[
    ConfigEntry('cleanup.policy', 'compact', incremental_operation=AlterConfigOpType.APPEND),
    ConfigEntry('segment.bytes', None, incremental_operation=AlterConfigOpType.DELETE)])
[f] = ca.incremental_alter_configs([append]).values()
f.result()
assert c_overrides() == {'retention.ms': '60000', 'max.message.bytes': '5000', 'cleanup.policy': 'compact,delete'}, c_overrides()
[f] = ca.alter_configs([CR(ResourceType.TOPIC, 'admin', set_config={'retention.ms': '1000'})]).values()
f.result()
assert c_overrides() == {'retention.ms': '1000'}, c_overrides()
not_a_list = CR(ResourceType.TOPIC, 'admin', incremental_configs=[ConfigEntry('retention.ms', '5', incremental_operation=AlterConfigOpType.APPEND)])
[f] = ca.incremental_alter_configs([not_a_list]).values()
try:
    f.result()
    raise AssertionError('APPEND to a non-list config was accepted')
except Exception as e:
    assert 'INVALID_REQUEST' in str(e), e
print("ok")
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confluent_kafka_and_kafka_python_produce_and_consume() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), |_| {}).await.unwrap();
    run_python(SCRIPT, &[&broker.bootstrap()], Duration::from_secs(120)).await;
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_python_and_confluent_kafka_alter_topic_configs() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), |_| {}).await.unwrap();
    run_python(ADMIN_SCRIPT, &[&broker.bootstrap()], Duration::from_secs(60)).await;
    broker.stop().await.unwrap();
}

/// CreatePartitions through confluent-kafka's AdminClient (librdkafka): validate_only,
/// the real raise, Kafka's error for a lower count; then a producer writes into a new
/// partition and a consumer reads it back; then `delete_records` (DeleteRecords) moves
/// that partition's start and a consumer from the beginning starts there.
const PARTITIONS_SCRIPT: &str = r#"
import sys, time
from confluent_kafka import Producer, Consumer, TopicPartition as CTP, KafkaError, OFFSET_BEGINNING
from confluent_kafka.admin import AdminClient, NewTopic, NewPartitions

bootstrap = sys.argv[1]
ca = AdminClient({'bootstrap.servers': bootstrap})
[f] = ca.create_topics([NewTopic('grown', 1, 1)]).values()
f.result()
def count():
    return len(ca.list_topics('grown', timeout=10).topics['grown'].partitions)

[f] = ca.create_partitions([NewPartitions('grown', 3)], validate_only=True).values()
f.result()
assert count() == 1, count()
[f] = ca.create_partitions([NewPartitions('grown', 3)]).values()
f.result()
assert count() == 3, count()
[f] = ca.create_partitions([NewPartitions('grown', 2)]).values()
try:
    f.result()
    raise AssertionError('a lower partition count was accepted')
except Exception as e:
    assert e.args[0].code() == KafkaError.INVALID_PARTITIONS, e
[f] = ca.create_partitions([NewPartitions('absent', 2)]).values()
try:
    f.result()
    raise AssertionError('an unknown topic was accepted')
except Exception as e:
    assert e.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART, e

p = Producer({'bootstrap.servers': bootstrap})
for i in range(10):
    p.produce('grown', partition=2, value=b'new%d' % i)
assert p.flush(20) == 0, "undelivered"
c = Consumer({'bootstrap.servers': bootstrap, 'group.id': 'unused', 'enable.auto.commit': False})
c.assign([CTP('grown', 2, 0)])
seen = []
deadline = time.time() + 30
while len(seen) < 10 and time.time() < deadline:
    m = c.poll(0.5)
    if m is None or m.error():
        continue
    seen.append(m.value())
c.close()
assert seen == [b'new%d' % i for i in range(10)], seen

# DeleteRecords: a consumer from the beginning then starts at the new log start.
[f] = ca.delete_records([CTP('grown', 2, 5)]).values()
assert f.result().low_watermark == 5, f.result()
c = Consumer({'bootstrap.servers': bootstrap, 'group.id': 'unused', 'enable.auto.commit': False})
c.assign([CTP('grown', 2, OFFSET_BEGINNING)])
seen = []
deadline = time.time() + 30
while len(seen) < 5 and time.time() < deadline:
    m = c.poll(0.5)
    if m is None or m.error():
        continue
    seen.append((m.offset(), m.value()))
c.close()
assert seen == [(i, b'new%d' % i) for i in range(5, 10)], seen
print("ok")
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confluent_kafka_create_partitions_then_produce_and_consume_the_new_partition_then_delete_records() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), |_| {}).await.unwrap();
    run_python(PARTITIONS_SCRIPT, &[&broker.bootstrap()], Duration::from_secs(90)).await;
    broker.stop().await.unwrap();
}
