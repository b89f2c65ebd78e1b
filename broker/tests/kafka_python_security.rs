//! kafka-python (an independent, pure-Python client) against a broker with nothing
//! plaintext (#19): SASL_SSL with PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512, each producing
//! and consuming in a group under the ACLs its user has. kafka-python's
//! TopicAuthorizationFailedError reaches the producer for a topic the user may not see
//! (refused by Metadata) and for one it may only describe (refused by Produce), and the
//! consumer of the latter (ListOffsets/Fetch); a group without an ACL gives
//! GroupAuthorizationFailedError, and a wrong password shows SASL_AUTHENTICATION_FAILED
//! with each mechanism.

mod common;

use std::time::Duration;

use fjord_testkit::Cluster;

const CAROL_PASSWORD: &str = "carol-secret";

const SCRIPT: &str = r#"
import logging, sys, time
from kafka import KafkaProducer, KafkaConsumer, TopicPartition
from kafka.errors import TopicAuthorizationFailedError, GroupAuthorizationFailedError, KafkaTimeoutError

bootstrap, ca, password = sys.argv[1], sys.argv[2], sys.argv[3]
def carol(mechanism, **extra):
    conf = dict(bootstrap_servers=bootstrap, security_protocol='SASL_SSL', sasl_mechanism=mechanism,
                sasl_plain_username='carol', sasl_plain_password=password, ssl_cafile=ca,
                request_timeout_ms=15000)
    conf.update(extra)
    return conf

mechanisms = ['PLAIN', 'SCRAM-SHA-256', 'SCRAM-SHA-512']
for mechanism in mechanisms:
    producer = KafkaProducer(**carol(mechanism, acks='all'))
    for i in range(10):
        producer.send('granted', value=('%s-%d' % (mechanism, i)).encode()).get(timeout=30)
    producer.flush()

    # Not allowed to write to `refused` (refused by Metadata) nor to `visible` (by
    # Produce): kafka-python's authorization error, nothing written.
    for topic in ['refused', 'visible']:
        try:
            producer.send(topic, value=b'x').get(timeout=30)
            raise AssertionError('%s: a write to %s was accepted' % (mechanism, topic))
        except TopicAuthorizationFailedError:
            pass
    producer.close()

# Every mechanism's records, read back in a group carol may use.
expected = ['%s-%d' % (m, i) for m in mechanisms for i in range(10)]
for mechanism in mechanisms:
    consumer = KafkaConsumer('granted', **carol(mechanism, group_id='carol-%s' % mechanism, auto_offset_reset='earliest',
                                                enable_auto_commit=False))
    seen = []
    deadline = time.time() + 60
    while len(seen) < len(expected) and time.time() < deadline:
        for records in consumer.poll(timeout_ms=1000).values():
            seen.extend(r.value.decode() for r in records)
    assert seen == expected, (mechanism, seen)
    consumer.commit()
    consumer.close()

# Reading `visible` (Describe only): the consumer's authorization error. (kafka-python
# raises a Metadata refusal, as for `refused`, inside a callback that only logs it, and
# then waits for a leader forever: only a refused ListOffsets or Fetch reaches poll.)
consumer = KafkaConsumer(**carol('SCRAM-SHA-512', auto_offset_reset='earliest'))
consumer.assign([TopicPartition('visible', 0)])
try:
    deadline = time.time() + 30
    while time.time() < deadline:
        consumer.poll(timeout_ms=1000)
    raise AssertionError('reading visible raised nothing')
except TopicAuthorizationFailedError:
    pass
consumer.close()

# A group carol has no ACL on: the group's authorization error.
consumer = KafkaConsumer('granted', **carol('PLAIN', group_id='not-hers', auto_offset_reset='earliest'))
try:
    deadline = time.time() + 30
    while time.time() < deadline:
        consumer.poll(timeout_ms=1000)
    raise AssertionError('joining not-hers raised nothing')
except GroupAuthorizationFailedError:
    pass
consumer.close()

# A wrong password: the producer cannot bootstrap (kafka-python 3 raises a timeout) and
# logs the broker's SASL_AUTHENTICATION_FAILED (58), with every mechanism. (kafka-python
# drops an answer that arrives in the same read as the end of the stream: the broker
# keeps the connection open behind its answer until the client closes it.)
class Failures(logging.Handler):
    def __init__(self):
        super().__init__(logging.ERROR)
        self.messages = []
    def emit(self, record):
        self.messages.append(record.getMessage())
for mechanism in mechanisms:
    failures = Failures()
    logging.getLogger('kafka').addHandler(failures)
    try:
        KafkaProducer(**carol(mechanism, sasl_plain_password='wrong', bootstrap_timeout_ms=10000))
        raise AssertionError('%s: a wrong password was accepted' % mechanism)
    except KafkaTimeoutError:
        pass
    logging.getLogger('kafka').removeHandler(failures)
    assert any('SaslAuthenticationFailedError' in m for m in failures.messages), (mechanism, failures.messages)
print('ok')
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_python_over_sasl_ssl_with_plain_and_scram_under_acls() {
    common::init_tracing();
    let cluster = Cluster::builder().brokers(1).sasl_ssl().scram_user("carol", CAROL_PASSWORD).start().await.unwrap();
    for topic in ["granted", "visible", "refused"] {
        cluster.create_topic(topic, 1, &[], Duration::from_secs(30)).await.unwrap();
    }
    common::grant_carol(&cluster).await;
    let ca = cluster.secure().unwrap().ca.to_str().unwrap().to_owned();
    common::run_python(SCRIPT, &[&cluster.bootstrap(), &ca, CAROL_PASSWORD], Duration::from_secs(300)).await;
}
