//! Transactions end to end with real clients: confluent-kafka (librdkafka) and
//! kafka-python transactional producers against the coordinator and the partitions'
//! markers, read by read_committed and read_uncommitted consumers; zombie fencing; a
//! transaction left open aborted at its timeout; and fjord-client's transactional
//! producer and read_committed consumer.

mod common;

use std::time::Duration;

use common::{run_python, TestBroker};
use fjord_client::{
    ClientConfig, Consumer, ConsumerConfig, Error, GroupAdmin, IsolationLevel, OffsetReset, Producer, ProducerConfig,
    ProducerRecord, TopicPartition,
};

const PYTHON_TIMEOUT: Duration = Duration::from_secs(150);

async fn start(dir: &std::path::Path) -> TestBroker {
    TestBroker::start_in(dir.join("data"), |c| {
        c.set("transaction.state.log.num.partitions", "4").unwrap();
        c.set("transaction.abort.timed.out.transaction.cleanup.interval.ms", "200").unwrap();
        c.set("num.partitions", "2").unwrap();
        c.group.initial_rebalance_delay_ms = 0;
    })
    .await
    .unwrap()
}

/// Reads `topic` partitions 0 and 1 from the start at an isolation level until `count`
/// records came (then a little longer, to see nothing more comes): the values per partition.
const CONSUME: &str = r#"
import time
from confluent_kafka import Consumer, TopicPartition

def consume(bootstrap, topic, level, count, settle=1.5, timeout=60):
    c = Consumer({'bootstrap.servers': bootstrap, 'group.id': 'reader-' + level, 'isolation.level': level,
                  'enable.auto.commit': False, 'auto.offset.reset': 'earliest'})
    c.assign([TopicPartition(topic, 0, 0), TopicPartition(topic, 1, 0)])
    got = {0: [], 1: []}
    deadline = time.time() + timeout
    quiet_until = None
    while time.time() < deadline:
        m = c.poll(0.2)
        if m is not None:
            assert m.error() is None, m.error()
            got[m.partition()].append(m.value().decode())
        n = len(got[0]) + len(got[1])
        assert n <= count, (level, got)
        if n == count:
            quiet_until = quiet_until or time.time() + settle
            if time.time() > quiet_until:
                break
    c.close()
    return got
"#;

const MIXED: &str = r#"
import sys
from confluent_kafka import Producer
bootstrap, topic = sys.argv[1], sys.argv[2]
p = Producer({'bootstrap.servers': bootstrap, 'transactional.id': 'mixed', 'linger.ms': 5})
p.init_transactions(30)
committed, everything = {0: [], 1: []}, {0: [], 1: []}
for t in range(6):
    p.begin_transaction()
    for i in range(10):
        v = "t%d-%d" % (t, i)
        p.produce(topic, value=v, partition=i % 2)
        everything[i % 2].append(v)
        if t % 3 != 1:
            committed[i % 2].append(v)
    if t % 3 != 1:
        p.commit_transaction(30)
    else:
        # Written first (abort_transaction purges what is not sent yet), then aborted.
        p.flush(30)
        p.abort_transaction(30)
got = consume(bootstrap, topic, 'read_committed', 40)
assert got == committed, ("read_committed", got, committed)
got = consume(bootstrap, topic, 'read_uncommitted', 60)
assert got == everything, ("read_uncommitted", got, everything)
print("ok")
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_and_aborted_transactions_across_two_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path()).await;
    run_python(&format!("{CONSUME}{MIXED}"), &[&broker.bootstrap(), "mixed"], PYTHON_TIMEOUT).await;
    broker.stop().await.unwrap();
}

const ZOMBIE: &str = r#"
import sys
from confluent_kafka import Producer, KafkaException
bootstrap, topic = sys.argv[1], sys.argv[2]
zombie = Producer({'bootstrap.servers': bootstrap, 'transactional.id': 'fenced'})
zombie.init_transactions(30)
zombie.begin_transaction()
for i in range(5):
    zombie.produce(topic, value="zombie-%d" % i, partition=0)
zombie.flush(30)
# The same transactional id again: its epoch fences the zombie, whose open transaction is aborted.
fresh = Producer({'bootstrap.servers': bootstrap, 'transactional.id': 'fenced'})
fresh.init_transactions(60)
fresh.begin_transaction()
for i in range(5):
    fresh.produce(topic, value="fresh-%d" % i, partition=1)
fresh.commit_transaction(30)
try:
    zombie.produce(topic, value="late", partition=0)
    zombie.commit_transaction(30)
    raise AssertionError("the zombie committed")
except KafkaException as e:
    err = e.args[0]
    assert err.fatal() or not err.retriable(), err
got = consume(bootstrap, topic, 'read_committed', 5)
assert got == {0: [], 1: ["fresh-%d" % i for i in range(5)]}, got
print("ok")
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_producer_fences_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path()).await;
    run_python(&format!("{CONSUME}{ZOMBIE}"), &[&broker.bootstrap(), "fencing"], PYTHON_TIMEOUT).await;
    broker.stop().await.unwrap();
}

const TIMEOUT: &str = r#"
import sys, threading, time
from confluent_kafka import Producer
bootstrap, topic = sys.argv[1], sys.argv[2]
# A transaction left open (its producer goes silent) with a 3 s timeout.
stuck = Producer({'bootstrap.servers': bootstrap, 'transactional.id': 'stuck', 'transaction.timeout.ms': 3000})
stuck.init_transactions(30)
stuck.begin_transaction()
for i in range(5):
    stuck.produce(topic, value="stuck-%d" % i, partition=0)
stuck.flush(30)
opened = time.time()
# A committed transaction after it: read_committed waits at the open one's first offset.
other = Producer({'bootstrap.servers': bootstrap, 'transactional.id': 'other'})
other.init_transactions(30)
other.begin_transaction()
for i in range(5):
    other.produce(topic, value="other-%d" % i, partition=0)
other.commit_transaction(30)
got = consume(bootstrap, topic, 'read_committed', 5)
assert got == {0: ["other-%d" % i for i in range(5)], 1: []}, got
assert time.time() - opened >= 2.5, "read_committed saw past an open transaction"
print("ok")
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_transaction_is_aborted_at_its_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path()).await;
    run_python(&format!("{CONSUME}{TIMEOUT}"), &[&broker.bootstrap(), "timeout"], PYTHON_TIMEOUT).await;
    broker.stop().await.unwrap();
}

const KAFKA_PYTHON: &str = r#"
import sys
from kafka import KafkaProducer
bootstrap, topic = sys.argv[1], sys.argv[2]
p = KafkaProducer(bootstrap_servers=bootstrap, transactional_id='kafka-python')
p.init_transactions()
p.begin_transaction()
for i in range(4):
    p.send(topic, value=b"committed-%d" % i, partition=i % 2)
p.commit_transaction()
p.begin_transaction()
for i in range(4):
    p.send(topic, value=b"aborted-%d" % i, partition=i % 2)
p.flush()
p.abort_transaction()
p.close()
got = consume(bootstrap, topic, 'read_committed', 4)
assert got == {0: ["committed-0", "committed-2"], 1: ["committed-1", "committed-3"]}, got
print("ok")
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_python_transactional_producer() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path()).await;
    run_python(&format!("{CONSUME}{KAFKA_PYTHON}"), &[&broker.bootstrap(), "kpy"], PYTHON_TIMEOUT).await;
    broker.stop().await.unwrap();
}

/// Every value of partitions 0 and 1 of `topic` at `isolation`, read from the start until
/// `count` came (then a moment longer, to see that nothing more comes).
async fn read_all(bootstrap: &str, topic: &str, isolation: IsolationLevel, count: usize) -> Vec<Vec<String>> {
    let config = ConsumerConfig {
        client: ClientConfig::new(bootstrap),
        auto_offset_reset: OffsetReset::Earliest,
        isolation_level: isolation,
        ..ConsumerConfig::default()
    };
    let mut consumer = Consumer::connect(config).await.unwrap();
    consumer.assign([TopicPartition::new(topic, 0), TopicPartition::new(topic, 1)]).await.unwrap();
    let mut got = vec![Vec::new(), Vec::new()];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut quiet = 0;
    while tokio::time::Instant::now() < deadline && quiet < 5 {
        let records = consumer.poll(Duration::from_millis(200)).await.unwrap();
        for r in records {
            got[r.partition as usize].push(String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned());
        }
        if got.iter().map(Vec::len).sum::<usize>() >= count {
            quiet += 1;
        }
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fjord_client_transactions_commit_abort_offsets_and_read_committed() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path()).await;
    let bootstrap = broker.bootstrap();
    let config = ProducerConfig {
        client: ClientConfig::new(&bootstrap),
        transactional_id: Some("rust-tx".into()),
        ..ProducerConfig::default()
    };
    let producer = Producer::connect(config.clone()).await.unwrap();
    // Outside a transaction a transactional producer refuses to send.
    let refused = producer.send(ProducerRecord::new("rust", "x")).await;
    assert!(matches!(refused, Err(Error::TransactionState(_))), "{:?}", refused.err());
    let mut committed = vec![Vec::new(), Vec::new()];
    let mut everything = vec![Vec::new(), Vec::new()];
    for t in 0..4 {
        producer.begin_transaction().unwrap();
        let mut futures = Vec::new();
        for i in 0..10 {
            let value = format!("t{t}-{i}");
            everything[i % 2].push(value.clone());
            if t != 1 {
                committed[i % 2].push(value.clone());
            }
            futures.push(producer.send(ProducerRecord::new("rust", value).partition(i as i32 % 2)).await.unwrap());
        }
        if t == 1 {
            producer.abort_transaction().await.unwrap();
        } else {
            producer.commit_transaction().await.unwrap();
        }
        for f in futures {
            f.await.unwrap();
        }
    }
    assert!(producer.begin_transaction().is_ok());
    assert!(matches!(producer.begin_transaction(), Err(Error::TransactionState(_))), "one transaction at a time");
    // Consumer offsets commit with the transaction, not before.
    producer.send(ProducerRecord::new("rust", "with-offsets").partition(0)).await.unwrap();
    producer.send_offsets_to_transaction(&[(TopicPartition::new("rust", 1), 7)], "rust-group").await.unwrap();
    committed[0].push("with-offsets".into());
    everything[0].push("with-offsets".into());
    let groups = GroupAdmin::connect(ClientConfig::new(&bootstrap)).await.unwrap();
    assert!(groups.committed_offsets("rust-group").await.unwrap().is_empty(), "pending until the commit");
    producer.commit_transaction().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let offsets = groups.committed_offsets("rust-group").await.unwrap();
        if offsets.get(&TopicPartition::new("rust", 1)) == Some(&7) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "offsets not committed: {offsets:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(read_all(&bootstrap, "rust", IsolationLevel::ReadCommitted, 31).await, committed);
    assert_eq!(read_all(&bootstrap, "rust", IsolationLevel::ReadUncommitted, 41).await, everything);
    // A second producer of the id fences the first.
    let second = Producer::connect(config).await.unwrap();
    producer.begin_transaction().unwrap();
    let fenced = producer.send(ProducerRecord::new("rust", "zombie").partition(1)).await;
    let fenced = match fenced {
        Err(e) => Err(e),
        Ok(_) => producer.commit_transaction().await,
    };
    assert!(fenced.is_err(), "the fenced producer committed");
    second.begin_transaction().unwrap();
    second.send(ProducerRecord::new("rust", "second").partition(1)).await.unwrap();
    second.commit_transaction().await.unwrap();
    broker.stop().await.unwrap();
}

/// The coordinator appends the markers of the partitions its own broker leads through the
/// WriteTxnMarkers handler directly, not in a request to itself: a transaction costs no
/// WriteTxnMarkers request on a single broker, and read_committed still sees exactly the
/// committed records, the position past every marker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_marks_its_own_partitions_without_a_request_to_itself() {
    let metrics = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), |c| {
        c.set("transaction.state.log.num.partitions", "1").unwrap();
        c.set("num.partitions", "1").unwrap();
        c.metrics_listen = Some(metrics);
    })
    .await
    .unwrap();
    let bootstrap = broker.bootstrap();
    let producer = Producer::connect(ProducerConfig {
        client: ClientConfig::new(&bootstrap),
        transactional_id: Some("own-markers".into()),
        ..ProducerConfig::default()
    })
    .await
    .unwrap();
    // Offsets 0-1 committed (marker 2), 3-4 aborted (marker 5), 6 committed (marker 7).
    for (values, commit) in [(&["a", "b"][..], true), (&["x", "y"][..], false), (&["c"][..], true)] {
        producer.begin_transaction().unwrap();
        for v in values {
            drop(producer.send(ProducerRecord::new("own", *v)).await.unwrap());
        }
        match commit {
            true => producer.commit_transaction().await.unwrap(),
            false => producer.abort_transaction().await.unwrap(),
        }
    }
    let mut consumer = Consumer::connect(ConsumerConfig {
        client: ClientConfig::new(&bootstrap),
        auto_offset_reset: OffsetReset::Earliest,
        isolation_level: IsolationLevel::ReadCommitted,
        fetch_max_wait: Duration::from_millis(50),
        ..ConsumerConfig::default()
    })
    .await
    .unwrap();
    let tp = TopicPartition::new("own", 0);
    consumer.assign([tp.clone()]).await.unwrap();
    let mut values = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while consumer.position(&tp).await.unwrap() < 8 {
        assert!(tokio::time::Instant::now() < deadline, "position stuck, read {values:?}");
        for r in consumer.poll(Duration::from_millis(200)).await.unwrap() {
            values.push(String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned());
        }
    }
    assert_eq!(values, ["a", "b", "c"]);
    let text = fjord_testkit::scrape_metrics(metrics).await.unwrap();
    let requests = |api: &str| {
        let prefix = format!("fjord_broker_requests_total{{api=\"{api}\"}} ");
        text.lines().find_map(|l| l.strip_prefix(&prefix)).map_or(0.0, |v| v.parse::<f64>().unwrap())
    };
    assert_eq!(requests("EndTxn"), 3.0, "{text}");
    assert_eq!(requests("WriteTxnMarkers"), 0.0, "{text}");
}
