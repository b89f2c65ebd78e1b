//! An independent idempotent producer across a broker crash: Python confluent-kafka
//! (librdkafka) with `enable.idempotence=True` produces 100,000 records while `fjord
//! broker` is killed with SIGKILL mid-stream and started again on the same port and data
//! dir. Requests the broker appended but never answered are retried by librdkafka after
//! the restart; the producer state the broker recovers from its log and snapshots must
//! recognise them, so every record is stored exactly once, in order.
//!
//! And the three-broker failover (cluster mode on ZooKeeper), with `fjord-client` and
//! with confluent-kafka: the partition leader is killed with SIGKILL mid-stream; the
//! controller elects a new leader from the ISR, which knows the producer from the
//! batches it replicated.
//!
//! The interpreter is `$FJORD_TEST_PYTHON` (set by `cargo xtask test`), else the
//! workspace's `target/venv/bin/python`.

mod common;

use std::net::{SocketAddr, TcpListener};
use std::path::Path;

use fjord_testkit::ClientScript;
use std::time::Duration;

/// Produces 100,000 records with `enable.idempotence=True`, says `restart` once a quarter
/// is delivered (while half is still to come), then checks every record was delivered
/// and is stored exactly once, in order.
const IDEMPOTENT_SCRIPT: &str = r#"
import sys, time
from confluent_kafka import Producer, Consumer, TopicPartition as CTP

bootstrap, n = sys.argv[1], 100000
errors, delivered = [], [0]
def on_delivery(err, msg):
    if err is not None:
        errors.append(str(err))
    else:
        delivered[0] += 1
p = Producer({'bootstrap.servers': bootstrap, 'enable.idempotence': True, 'linger.ms': 5,
              'message.timeout.ms': 120000, 'reconnect.backoff.max.ms': 200, 'retry.backoff.ms': 50})
for i in range(n):
    while True:
        try:
            p.produce('idempotent', value=b'm%d' % i, on_delivery=on_delivery)
            break
        except BufferError:
            p.poll(0.05)
    p.poll(0)
    if i == n // 2:
        while delivered[0] < n // 4:
            p.poll(0.05)
        print('restart', flush=True)
assert p.flush(120) == 0, 'confluent-kafka left messages undelivered'
assert not errors, errors[:5]
assert delivered[0] == n, delivered[0]

c = Consumer({'bootstrap.servers': bootstrap, 'group.id': 'unused', 'enable.auto.commit': False})
c.assign([CTP('idempotent', 0, 0)])
values = []
deadline = time.time() + 60
while len(values) < n and time.time() < deadline:
    for m in c.consume(10000, 0.5):
        if not m.error():
            values.append(m.value())
low, high = c.get_watermark_offsets(CTP('idempotent', 0), timeout=10)
c.close()
assert (low, high) == (0, n), ('stored', low, high, 'for', n, 'sent')
assert values == [b'm%d' % i for i in range(n)], 'records missing, duplicated or out of order'
print('ok', flush=True)
"#;

fn start_broker(addr: SocketAddr, data_dir: &Path) -> common::FjordProcess {
    // An fsync after every append widens the window between appending a batch and
    // answering for it, where SIGKILL leaves an appended batch unacknowledged.
    common::start_broker(addr.port(), data_dir, &[("FJORD_LOG_FLUSH_INTERVAL_MESSAGES", "1")])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confluent_kafka_idempotent_producer_survives_kill_9_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let addr = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let mut broker = start_broker(addr, &data);
    let mut script = ClientScript::python(IDEMPOTENT_SCRIPT, &[&addr.to_string()]).unwrap();
    let mut restarted = false;
    while let Some(line) = script.next_line().await.unwrap() {
        if line == "restart" {
            broker.kill().unwrap(); // SIGKILL: no clean shutdown, in-flight requests unanswered
            broker.wait().unwrap();
            broker = start_broker(addr, &data);
            restarted = true;
        }
    }
    let output = script.finish().await.unwrap();
    broker.kill().unwrap();
    broker.wait().unwrap();
    assert!(restarted && output.ok(), "idempotent confluent-kafka run failed {}", output.transcript());
}

/// Three `fjord broker` processes on ZooKeeper, a topic with replication factor 3 and
/// `min.insync.replicas=2`; an idempotent producer streams 20,000 records and the
/// partition's leader is killed (SIGKILL) while a quarter of them are in flight. Every
/// record is acknowledged in the end, and the new leader's log holds each exactly once,
/// in send order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_stream_survives_kill_9_of_its_leader_on_three_brokers() {
    use fjord_client::{ClientConfig, Producer, ProducerConfig};
    use fjord_testkit::{numbered, read_values, stream_across};

    let mut cluster = fjord_testkit::Cluster::builder().brokers(3).processes(env!("CARGO_BIN_EXE_fjord")).start().await.unwrap();
    let client = |bootstrap: &str| ClientConfig {
        connect_timeout: Duration::from_secs(5),
        retry_backoff: Duration::from_millis(50),
        ..ClientConfig::new(bootstrap)
    };
    let topic = "failover";
    cluster.create_topic(topic, 1, &[("min.insync.replicas", "2")], Duration::from_secs(30)).await.unwrap();
    let leader = cluster.wait_for_leader(topic, 0, Duration::from_secs(30)).await.unwrap();

    let config = ProducerConfig {
        client: client(&cluster.bootstrap()),
        batch_size: 400,
        linger: Duration::from_millis(1),
        delivery_timeout: Duration::from_secs(40),
        ..Default::default()
    };
    assert!(config.idempotent());
    let producer = Producer::connect(config).await.unwrap();
    let n = 20_000;
    stream_across(&producer, topic, n, async { cluster.kill(leader).await.unwrap() })
        .await
        .expect("every record is acknowledged by the new leader");
    producer.close().await;
    let new_leader = cluster.wait_for_leader(topic, 0, Duration::from_secs(30)).await.unwrap();
    assert_ne!(new_leader, leader);

    let values = read_values(&client(&cluster.addr(new_leader)), topic, 0).await.unwrap();
    assert_eq!(values.len(), n, "{} records stored for {n} sent", values.len());
    assert_eq!(values, numbered(n), "every record once, in send order");
}

/// The confluent-kafka run above against three brokers: the partition leader is killed
/// (SIGKILL) when the script says `restart`, and the controller elects another one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confluent_kafka_idempotent_producer_survives_kill_9_of_its_leader_on_three_brokers() {
    leader_killed_mid_stream("idempotent", |bootstrap| ClientScript::python(IDEMPOTENT_SCRIPT, &[bootstrap])).await;
}

/// Three brokers, `topic` (one partition, `min.insync.replicas=2`), the script `spawn`
/// starts with the bootstrap: its partition leader is killed (SIGKILL) when it says
/// `restart`; it must end with `ok`, and another broker leads the partition.
async fn leader_killed_mid_stream(topic: &str, spawn: impl FnOnce(&str) -> anyhow::Result<ClientScript>) {
    let mut cluster = fjord_testkit::Cluster::builder().brokers(3).processes(env!("CARGO_BIN_EXE_fjord")).start().await.unwrap();
    cluster.create_topic(topic, 1, &[("min.insync.replicas", "2")], Duration::from_secs(30)).await.unwrap();
    let leader = cluster.wait_for_leader(topic, 0, Duration::from_secs(30)).await.unwrap();
    let mut script = spawn(&cluster.bootstrap()).unwrap();
    let mut restarted = false;
    let run = async {
        while let Some(line) = script.next_line().await.unwrap() {
            if line == "restart" {
                cluster.kill(leader).await.unwrap();
                restarted = true;
            }
        }
        script.finish().await.unwrap()
    };
    let output = tokio::time::timeout(Duration::from_secs(240), run).await.expect("the script finished");
    assert!(restarted && output.ok(), "the idempotent run failed {}", output.transcript());
    assert_ne!(cluster.wait_for_leader(topic, 0, Duration::from_secs(30)).await.unwrap(), leader);
}

/// KafkaJS's idempotent producer (the protocol written again in JavaScript) streams
/// 20,000 records in sends of 100, one in flight, and says `restart` a quarter of the
/// way; then it reads the partition back: every record once, in send order.
const KAFKAJS_SCRIPT: &str = r#"
const assert = require('assert');
const { Kafka, logLevel } = require('kafkajs');
const [bootstrap] = process.argv.slice(1);
const kafka = new Kafka({ clientId: 'fjord-kafkajs-failover', brokers: bootstrap.split(','), logLevel: logLevel.NOTHING,
                          retry: { retries: 30, initialRetryTime: 100, maxRetryTime: 2000 } });
const n = 20000, per = 100;
(async () => {
    const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1 });
    await producer.connect();
    for (let i = 0; i < n; i += per) {
        if (i === n / 4) console.log('restart');
        const messages = Array.from({ length: per }, (_, j) => ({ value: `m${i + j}` }));
        const answers = await producer.send({ topic: 'kafkajs', acks: -1, messages });
        assert(answers.every(a => a.errorCode === 0), JSON.stringify(answers));
    }
    await producer.disconnect();
    const consumer = kafka.consumer({ groupId: 'kafkajs-reader', maxWaitTimeInMs: 200 });
    await consumer.connect();
    await consumer.subscribe({ topic: 'kafkajs', fromBeginning: true });
    const values = [];
    await consumer.run({ eachMessage: async ({ message }) => { values.push(message.value.toString()); } });
    const deadline = Date.now() + 60000;
    while (values.length < n && Date.now() < deadline) await new Promise(r => setTimeout(r, 100));
    await new Promise(r => setTimeout(r, 1000)); // a duplicate would come after the last
    await consumer.disconnect();
    assert.strictEqual(values.length, n, `${values.length} records stored for ${n} sent`);
    values.forEach((v, i) => assert.strictEqual(v, `m${i}`, `record ${i} is ${v}: missing, duplicated or out of order`));
})().then(() => { console.log('ok'); process.exit(0); }, e => { console.error('FAILED', e); process.exit(1); });
"#;

/// The three-broker failover above with KafkaJS: the leader is killed (SIGKILL) when the
/// script says `restart`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafkajs_idempotent_producer_survives_kill_9_of_its_leader_on_three_brokers() {
    leader_killed_mid_stream("kafkajs", |bootstrap| ClientScript::node(KAFKAJS_SCRIPT, &[bootstrap])).await;
}
