//! DescribeConfigs with every key, its value and its source (issue #22), through
//! confluent-kafka's `describe_configs` with synonyms: a topic override is
//! DYNAMIC_TOPIC_CONFIG, a topic key whose broker key is in the broker's config is
//! STATIC_BROKER_CONFIG, an untouched key DEFAULT_CONFIG; the broker resource shows its
//! own keys the same way; an unknown topic gets Kafka's error.

mod common;

use std::time::Duration;

use common::{run_python, TestBroker};

const SCRIPT: &str = r#"
import sys
from confluent_kafka import KafkaError
from confluent_kafka.admin import AdminClient, NewTopic, ConfigResource, ResourceType, ConfigSource

bootstrap = sys.argv[1]
ca = AdminClient({'bootstrap.servers': bootstrap})
[f] = ca.create_topics([NewTopic('t', 1, 1, config={'max.message.bytes': '5000'})]).values()
f.result()

def describe(kind, name):
    # librdkafka asks for the synonyms itself.
    [f] = ca.describe_configs([ConfigResource(kind, name)]).values()
    return f.result()

topic = describe(ResourceType.TOPIC, 't')
assert len(topic) >= 19, sorted(topic)
m = topic['max.message.bytes']
assert (m.value, m.source) == ('5000', ConfigSource.DYNAMIC_TOPIC_CONFIG.value), m
assert m.synonyms['message.max.bytes'].source == ConfigSource.DEFAULT_CONFIG.value, m.synonyms
s = topic['segment.bytes']
assert s.source == ConfigSource.DEFAULT_CONFIG.value and s.is_default, s
r = topic['retention.ms']
assert (r.value, r.source) == (str(48 * 3600000), ConfigSource.STATIC_BROKER_CONFIG.value), r
assert r.synonyms['log.retention.hours'].source == ConfigSource.STATIC_BROKER_CONFIG.value, r.synonyms
assert r.synonyms['log.retention.ms'].value == str(7 * 24 * 3600000), r.synonyms

broker = describe(ResourceType.BROKER, '0')
n = broker['num.partitions']
assert (n.value, n.source) == ('2', ConfigSource.STATIC_BROKER_CONFIG.value), n
assert broker['default.replication.factor'].source == ConfigSource.DEFAULT_CONFIG.value
assert broker['log.retention.ms'].source == ConfigSource.STATIC_BROKER_CONFIG.value
assert broker['log.segment.bytes'].source == ConfigSource.DEFAULT_CONFIG.value

# (librdkafka sends a broker resource to that broker itself, so another id never
# reaches this one: tests/broker_configs covers it over the raw protocol.)
try:
    describe(ResourceType.TOPIC, 'absent')
    raise AssertionError('an unknown topic was described')
except Exception as e:
    assert e.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART, e
print("ok")
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confluent_kafka_describes_every_config_with_its_source_and_synonyms() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), |c| {
        c.set("log.retention.hours", "48").unwrap();
        c.set("num.partitions", "2").unwrap();
    })
    .await
    .unwrap();
    run_python(SCRIPT, &[&broker.bootstrap()], Duration::from_secs(60)).await;
    broker.stop().await.unwrap();
}
