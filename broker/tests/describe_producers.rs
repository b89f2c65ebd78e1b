//! DescribeProducers (API key 61, issue #22) through kafka-python 3's
//! `describe_producers`, with confluent-kafka producers writing: an idempotent producer
//! and a transactional one, first with its transaction open (its start offset is
//! reported), then committed (no start offset, the marker's coordinator epoch); an
//! unknown partition gets UNKNOWN_TOPIC_OR_PARTITION. (confluent-kafka's Python
//! AdminClient has no DescribeProducers.)

mod common;

use std::time::Duration;

use common::{run_python, TestBroker};

const SCRIPT: &str = r#"
import sys, time
from kafka import TopicPartition as TP
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import UnknownTopicOrPartitionError
from confluent_kafka import Producer

bootstrap = sys.argv[1]
ka = KafkaAdminClient(bootstrap_servers=bootstrap)
ka.create_topics([NewTopic('p', 1, 1)])
tp = TP('p', 0)

def producers():
    [state] = ka.describe_producers([tp]).values()
    return sorted(state.active_producers)

assert producers() == [], producers()

idempotent = Producer({'bootstrap.servers': bootstrap, 'enable.idempotence': True})
for i in range(5):
    idempotent.produce('p', partition=0, value=b'i%d' % i)
assert idempotent.flush(20) == 0
[plain] = producers()
assert (plain.producer_epoch, plain.last_sequence, plain.current_transaction_start_offset) == (0, 4, -1), plain
assert plain.last_timestamp > 0 and plain.coordinator_epoch == -1, plain

txn = Producer({'bootstrap.servers': bootstrap, 'transactional.id': 'describe-me'})
txn.init_transactions(20)
txn.begin_transaction()
for i in range(3):
    txn.produce('p', partition=0, value=b't%d' % i)
assert txn.flush(20) == 0
# Its transaction is open from offset 5, where its first batch went.
[open_txn] = [p for p in producers() if p.producer_id != plain.producer_id]
assert (open_txn.last_sequence, open_txn.current_transaction_start_offset) == (2, 5), open_txn
txn.commit_transaction(20)
# EndTxn is answered once the commit is prepared (as Kafka does); the marker that closes
# the transaction in the partition follows.
deadline = time.time() + 20
while True:
    [done] = [p for p in producers() if p.producer_id != plain.producer_id]
    if done.current_transaction_start_offset == -1 or time.time() > deadline:
        break
    time.sleep(0.1)
assert done.current_transaction_start_offset == -1 and done.coordinator_epoch >= 0, done
assert [p for p in producers() if p.producer_id == plain.producer_id] == [plain]

# Asked of the broker directly (the client refuses unknown partitions itself).
[broker_id] = [b['broker_id'] for b in ka.describe_cluster()['brokers']]
for bad in (TP('p', 3), TP('absent', 0)):
    try:
        ka.describe_producers([bad], broker_id=broker_id)
        raise AssertionError('%s was described' % (bad,))
    except UnknownTopicOrPartitionError:
        pass
print("ok")
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_python_describes_idempotent_and_transactional_producers() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), |_| {}).await.unwrap();
    run_python(SCRIPT, &[&broker.bootstrap()], Duration::from_secs(90)).await;
    broker.stop().await.unwrap();
}
