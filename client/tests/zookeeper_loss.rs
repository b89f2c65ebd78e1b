//! ZooKeeper lost after start: the server is paused (SIGSTOP) for longer than the
//! brokers' session timeout, then resumed. Meanwhile leaders keep answering fetches for
//! what they lead; afterwards the brokers have re-registered, a controller is elected,
//! produce and consume work again, and nothing acknowledged before is lost.

use std::time::{Duration, Instant};

use fjord_client::{
    Acks, ClientConfig, Consumer, ConsumerConfig, Producer, ProducerConfig, ProducerRecord, SeekTo, TopicPartition,
};
use fjord_coord::paths;
use fjord_testkit::{produce_round, round_value, wait_until, Cluster, ZooKeeper};

const TOPIC: &str = "events";
const PARTITIONS: i32 = 3;
const WAIT: Duration = Duration::from_secs(30);
/// The brokers' `zookeeper.session.timeout.ms`.
const SESSION_TIMEOUT: Duration = Duration::from_secs(3);

async fn produce(client: &ClientConfig, per_partition: usize, round: usize) {
    let config = ProducerConfig {
        client: client.clone(),
        acks: Acks::All,
        delivery_timeout: Duration::from_secs(20),
        ..ProducerConfig::default()
    };
    let producer = Producer::connect(config).await.unwrap();
    produce_round(&producer, TOPIC, PARTITIONS, per_partition, round).await.unwrap();
}

/// Sends `per_partition` records to every partition (acks=all, 3 s delivery timeout)
/// and returns, per record, `(partition, value)` if acknowledged.
async fn try_produce(client: &ClientConfig, per_partition: usize, round: usize) -> Vec<Option<(i32, String)>> {
    let config = ProducerConfig {
        client: client.clone(),
        acks: Acks::All,
        delivery_timeout: Duration::from_secs(3),
        ..ProducerConfig::default()
    };
    let Ok(producer) = Producer::connect(config).await else { return vec![None; per_partition * PARTITIONS as usize] };
    let mut sent = Vec::new();
    for i in 0..per_partition {
        for p in 0..PARTITIONS {
            let value = round_value(round, p, i);
            sent.push((p, value.clone(), producer.send(ProducerRecord::new(TOPIC, value).partition(p)).await));
        }
    }
    let mut acked = Vec::new();
    for (p, value, ack) in sent {
        let ok = match ack {
            Ok(ack) => ack.await.is_ok(),
            Err(_) => false,
        };
        acked.push(ok.then_some((p, value)));
    }
    acked
}

/// Every partition's values from offset 0 up to `per_partition` records, read with a
/// fresh consumer (its own metadata, its own connections).
async fn read_all(client: &ClientConfig, per_partition: usize) -> Vec<Vec<String>> {
    let config =
        ConsumerConfig { client: client.clone(), fetch_max_wait: Duration::from_millis(100), ..ConsumerConfig::default() };
    let mut consumer = Consumer::connect(config).await.unwrap();
    let partitions: Vec<TopicPartition> = (0..PARTITIONS).map(|p| TopicPartition::new(TOPIC, p)).collect();
    consumer.assign(partitions.clone()).await.unwrap();
    for tp in &partitions {
        consumer.seek(tp, SeekTo::Offset(0)).unwrap();
    }
    let mut values = vec![Vec::new(); PARTITIONS as usize];
    let deadline = Instant::now() + WAIT;
    while values.iter().any(|v| v.len() < per_partition) {
        assert!(
            Instant::now() < deadline,
            "read only {:?} records per partition",
            values.iter().map(Vec::len).collect::<Vec<_>>()
        );
        for r in consumer.poll(Duration::from_millis(200)).await.unwrap() {
            values[r.partition as usize].push(String::from_utf8(r.value.unwrap().to_vec()).unwrap());
        }
    }
    values
}

/// The session owning each broker's registration node (`None` when not registered).
async fn registrations(cluster: &Cluster) -> Vec<Option<i64>> {
    let mut owners = Vec::new();
    for id in cluster.ids() {
        owners.push(cluster.store().get(&paths::broker(id)).await.unwrap().map(|(_, stat)| stat.ephemeral_owner));
    }
    owners
}

async fn controller_epoch(cluster: &Cluster) -> i32 {
    let (data, _) = cluster.store().get(paths::CONTROLLER_EPOCH).await.unwrap().expect("/controller_epoch");
    String::from_utf8(data).unwrap().trim().parse().unwrap()
}

fn expected(rounds: &[(usize, usize)]) -> Vec<Vec<String>> {
    (0..PARTITIONS)
        .map(|p| rounds.iter().flat_map(|&(round, n)| (0..n).map(move |i| round_value(round, p, i))).collect())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brokers_recover_after_zookeeper_was_silent_longer_than_the_session_timeout() {
    let zk = tokio::task::spawn_blocking(ZooKeeper::start).await.unwrap().unwrap();
    let cluster = Cluster::builder()
        .brokers(3)
        .zookeeper(zk.connect_string())
        .config("zookeeper.session.timeout.ms", SESSION_TIMEOUT.as_millis())
        .start()
        .await
        .unwrap();
    let client = ClientConfig { connect_timeout: Duration::from_secs(2), ..ClientConfig::new(&cluster.bootstrap()) };
    cluster.create_topic(TOPIC, PARTITIONS, &[], WAIT).await.unwrap();
    produce(&client, 20, 0).await;
    let before = cluster.controller().await.unwrap();
    let epoch_before = controller_epoch(&cluster).await;
    let sessions_before = registrations(&cluster).await;

    zk.pause().unwrap();
    let paused = Instant::now();
    // While ZooKeeper is silent, the leaders still serve what they have.
    assert_eq!(read_all(&client, 20).await, expected(&[(0, 20)]), "fetches while ZooKeeper is paused");
    // Writes meanwhile are not specified (the ISR cannot change without ZooKeeper; today
    // the leaders keep taking acks=all writes while every replica fetches): whatever is
    // acknowledged must survive, and is counted.
    let during = try_produce(&client, 5, 9).await;
    eprintln!("acknowledged while ZooKeeper was paused: {} of {}", during.iter().filter(|a| a.is_some()).count(), during.len());
    // The pause must outlast the session timeout: this is the fault itself, not a wait
    // for a condition.
    tokio::time::sleep((SESSION_TIMEOUT * 2).saturating_sub(paused.elapsed())).await;
    zk.resume().unwrap();
    eprintln!("ZooKeeper paused for {:?} (controller before: {before:?})", paused.elapsed());

    // Every broker registers again, in a new session (the old ones expired).
    wait_until(WAIT, "every broker registered in a new session", || async {
        let now = registrations(&cluster).await;
        Ok(now.iter().zip(&sessions_before).all(|(now, before)| now.is_some_and(|s| Some(s) != *before)).then_some(()))
    })
    .await
    .unwrap();
    // A controller is elected again: the old one's node went with its session, and
    // the epoch that fences a stale controller moved on.
    let epoch_after = wait_until(WAIT, "a newer controller epoch", || async {
        let epoch = controller_epoch(&cluster).await;
        Ok((epoch > epoch_before).then_some(epoch))
    })
    .await
    .unwrap();
    let after = cluster.wait_for_controller(&[], WAIT).await.unwrap();
    eprintln!("controller after: {after} (epoch {epoch_before} -> {epoch_after})");
    cluster.wait_fully_replicated(TOPIC, WAIT).await.unwrap();
    produce(&client, 10, 1).await;
    // Per partition: the first round, then what the pause let through (a write may have
    // landed without its acknowledgement), then the last round.
    let acked_during: Vec<Vec<String>> =
        (0..PARTITIONS).map(|p| during.iter().flatten().filter(|(q, _)| *q == p).map(|(_, v)| v.clone()).collect()).collect();
    let min_len = 30 + acked_during.iter().map(Vec::len).min().unwrap_or(0);
    let logs = read_all(&client, min_len).await;
    for (p, log) in logs.iter().enumerate() {
        let (first, rest) = log.split_at(20);
        assert_eq!(first, &expected(&[(0, 20)])[p][..], "partition {p}: the first round");
        let (middle, last) = rest.split_at(rest.len() - 10);
        assert_eq!(last, &expected(&[(1, 10)])[p][..], "partition {p}: the last round, right after the pause's writes");
        assert!(middle.iter().all(|v| v.starts_with("r9-")), "partition {p}: {middle:?}");
        for v in &acked_during[p] {
            assert!(middle.contains(v), "partition {p}: {v} was acknowledged during the pause and is lost: {middle:?}");
        }
    }
}
