//! Consume-transform-produce with transactions across a broker crash: confluent-kafka
//! reads `ctp-in`, writes each record transformed to `ctp-out` and commits its consumer
//! offsets with `send_offsets_to_transaction`, one transaction per batch, while the single
//! `fjord broker` is killed with SIGKILL and started again on the same port and data dir.
//! The broker dies with a transaction open (its records written, its offsets pending);
//! the application restarts too: its new producer fences the old one, the restarted
//! coordinator (which read `__transaction_state` back) aborts the open transaction and
//! drops its offsets, and the loop goes on from the committed offsets: read_committed,
//! `ctp-out` holds exactly one copy of each input record, in order.
//!
//! The interpreter is `$FJORD_TEST_PYTHON` (set by `cargo xtask test`), else the
//! workspace's `target/venv/bin/python`.

mod common;

use std::net::{SocketAddr, TcpListener};
use std::path::Path;

use fjord_testkit::ClientScript;

const SCRIPT: &str = r#"
import os, sys, time
from confluent_kafka import Producer, Consumer, TopicPartition as TP, KafkaException

bootstrap, n = sys.argv[1], 2000
seed = Producer({'bootstrap.servers': bootstrap, 'enable.idempotence': True})
for i in range(n):
    seed.produce('ctp-in', value=b'r%d' % i, partition=0)
assert seed.flush(60) == 0

common = {'bootstrap.servers': bootstrap, 'reconnect.backoff.max.ms': 200, 'retry.backoff.ms': 50}
consumer = Consumer(dict(common, **{'group.id': 'ctp', 'enable.auto.commit': False, 'isolation.level': 'read_committed',
                                    'auto.offset.reset': 'earliest'}))
consumer.assign([TP('ctp-in', 0)])

def new_producer():
    p = Producer(dict(common, **{'transactional.id': 'ctp-tx', 'transaction.timeout.ms': 10000}))
    while True:
        try:
            p.init_transactions(30)
            return p
        except KafkaException as e:
            if not e.args[0].retriable():
                raise
            time.sleep(0.2)

def rewind():
    while True:
        try:
            committed = consumer.committed([TP('ctp-in', 0)], timeout=10)[0].offset
            consumer.seek(TP('ctp-in', 0, committed if committed >= 0 else 0))
            return committed
        except KafkaException:
            time.sleep(0.2)

def transform(producer, msgs):
    producer.begin_transaction()
    for m in msgs:
        producer.produce('ctp-out', value=m.value().upper(), partition=0)
    position = msgs[-1].offset() + 1
    producer.send_offsets_to_transaction([TP('ctp-in', 0, position)], consumer.consumer_group_metadata(), 30)
    return position

def run(producer, until, deadline):
    done = max(rewind(), 0)
    while done < until and time.time() < deadline:
        msgs = [m for m in consumer.consume(100, 0.5) if m.error() is None]
        if not msgs:
            continue
        try:
            position = transform(producer, msgs)
            producer.commit_transaction(30)
            done = position
        except KafkaException as e:
            if e.args[0].txn_requires_abort():
                producer.abort_transaction(30)
            else:
                raise
            done = max(rewind(), 0)
    return done

deadline = time.time() + 120
producer = new_producer()
done = run(producer, n // 4, deadline)
# A transaction left open when the broker dies: records written, offsets pending.
msgs = [m for m in consumer.consume(100, 5) if m.error() is None]
transform(producer, msgs)
assert producer.flush(30) == 0
print('restart', flush=True)
sys.stdin.readline()
# The application restarts too: a new producer of the id fences the old one, whose open
# transaction the coordinator aborts; the consumer goes back to the committed offsets.
zombies = [producer]
producer = new_producer()
done = run(producer, n, deadline)
assert done == n, ('processed', done, 'of', n)

check = Consumer({'bootstrap.servers': bootstrap, 'group.id': 'check', 'enable.auto.commit': False,
                  'isolation.level': 'read_committed'})
check.assign([TP('ctp-out', 0, 0)])
values, deadline = [], time.time() + 60
low, high = check.get_watermark_offsets(TP('ctp-out', 0), timeout=10)
while time.time() < deadline:
    batch = [m for m in check.consume(10000, 1.0) if m.error() is None]
    values += [m.value() for m in batch]
    if not batch and len(values) >= n:
        break
check.close()
assert sorted(values) == sorted(b'R%d' % i for i in range(n)), ('copies', len(values), 'distinct', len(set(values)))
assert values == [b'R%d' % i for i in range(n)], 'out of order'
print('ok', flush=True)
# Leave without the librdkafka handles' teardown (the zombie's still thinks it is in a transaction).
os._exit(0)
"#;

fn start_broker(addr: SocketAddr, data_dir: &Path) -> common::FjordProcess {
    common::start_broker(
        addr.port(),
        data_dir,
        &[
            ("FJORD_TRANSACTION_STATE_LOG_NUM_PARTITIONS", "4"),
            ("FJORD_TRANSACTION_ABORT_TIMED_OUT_TRANSACTION_CLEANUP_INTERVAL_MS", "500"),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_transform_produce_survives_kill_9_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let addr = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let mut broker = start_broker(addr, &data);
    let mut script = ClientScript::python(SCRIPT, &[&addr.to_string()]).unwrap();
    let mut restarted = false;
    while let Some(line) = script.next_line().await.unwrap() {
        if line == "restart" {
            broker.kill().unwrap(); // SIGKILL: the open transaction and its requests cut off
            broker.wait().unwrap();
            broker = start_broker(addr, &data);
            script.answer("go").await.unwrap();
            restarted = true;
        }
    }
    let output = script.finish().await.unwrap();
    broker.kill().unwrap();
    broker.wait().unwrap();
    assert!(restarted && output.ok(), "consume-transform-produce run failed {}", output.transcript());
}
