//! Automatic preferred-leader rebalancing (`auto.leader.rebalance.enable`) on a real
//! ZooKeeper with in-process brokers: after a broker stops and comes back, the controller
//! gives it back the leadership of the partitions it is the preferred replica of, once it
//! is in their ISR again, and no acknowledged record is lost across the moves; with the
//! key off, leadership stays where it went.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use fjord_client::{ClientConfig, Producer, ProducerConfig};
use fjord_coord::registry::PartitionState;
use fjord_testkit::{produce_round, read_values, round_value, Cluster};

/// Bound on every wait for the cluster to react.
const REACT: Duration = Duration::from_secs(20);
const TOPIC: &str = "preferred";
const PARTITIONS: i32 = 2;
const PER_ROUND: usize = 50;

/// The two tests run one at a time: each runs ZooKeeper and two brokers.
async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    SERIAL.lock().await
}

/// What the scenario leaves for the assertions: the broker that went away, the other
/// one, and the states of its preferred partitions while the other led them.
struct Bounced {
    cluster: Cluster,
    producer: Producer,
    away: i32,
    other: i32,
    /// Partition -> its state while `away` was stopped and `other` led it. Taken then,
    /// not once `away` is back in the ISR: by then the controller may already have moved
    /// the leadership back (it did, in a CI run).
    led_elsewhere: BTreeMap<i32, PartitionState>,
}

/// Two brokers with a 1 s imbalance check, a topic of two partitions replicated on both
/// (the preferred leaders are spread, so each broker prefers one), a round of records
/// (acks=all), a controlled stop of the preferred leader of partition 0, a second round
/// while it is away, its restart, and the wait until it is back in every ISR.
async fn bounce_a_preferred_leader(rebalance: bool) -> Bounced {
    common::init_tracing();
    let mut cluster = Cluster::builder()
        .brokers(2)
        .config("auto.leader.rebalance.enable", rebalance)
        .config("leader.imbalance.check.interval.seconds", 1)
        .config("replica.fetch.wait.max.ms", 100)
        .config("controlled.shutdown.timeout.ms", 5000)
        .start()
        .await
        .unwrap();
    cluster.create_topic(TOPIC, PARTITIONS, &[], REACT).await.unwrap();
    let assignment = cluster.assignment(TOPIC).await.unwrap().unwrap();
    let preferred = |p: i32| assignment.partitions[&p.to_string()][0];
    let away = preferred(0);
    let other = *cluster.ids().iter().find(|&&id| id != away).unwrap();
    let preferred_by_away: Vec<i32> = (0..PARTITIONS).filter(|&p| preferred(p) == away).collect();
    assert!(preferred_by_away.len() < PARTITIONS as usize, "both brokers are preferred leaders: {assignment:?}");
    for p in 0..PARTITIONS {
        assert_eq!(
            cluster.leader(TOPIC, p).await.unwrap(),
            Some(preferred(p)),
            "a new partition is led by its preferred replica"
        );
    }

    let client = ClientConfig::new(&cluster.bootstrap());
    let producer =
        Producer::connect(ProducerConfig { client, enable_idempotence: Some(true), ..ProducerConfig::default() }).await.unwrap();
    produce_round(&producer, TOPIC, PARTITIONS, PER_ROUND, 0).await.unwrap();

    // A controlled stop hands its leaderships over before it returns.
    cluster.stop(away).await.unwrap();
    let mut led_elsewhere = BTreeMap::new();
    for &p in &preferred_by_away {
        let state = cluster.partition_state(TOPIC, p).await.unwrap().unwrap();
        assert_eq!(state.leader, other, "{TOPIC}-{p} moved on the controlled stop");
        led_elsewhere.insert(p, state);
    }
    produce_round(&producer, TOPIC, PARTITIONS, PER_ROUND, 1).await.unwrap();

    cluster.start(away).await.unwrap();
    for p in 0..PARTITIONS {
        cluster.wait_for_isr(TOPIC, p, &[away, other], REACT).await.unwrap();
    }
    Bounced { cluster, producer, away, other, led_elsewhere }
}

/// Round 2 after the last move, then every partition read back: exactly the three rounds,
/// in order (the idempotent producer's retries add no duplicates).
async fn produce_and_read_back(bounced: &Bounced) {
    produce_round(&bounced.producer, TOPIC, PARTITIONS, PER_ROUND, 2).await.unwrap();
    let client = ClientConfig::new(&bounced.cluster.bootstrap());
    for p in 0..PARTITIONS {
        let want: Vec<String> = (0..3).flat_map(|round| (0..PER_ROUND).map(move |i| round_value(round, p, i))).collect();
        assert_eq!(read_values(&client, TOPIC, p).await.unwrap(), want, "{TOPIC}-{p}: every acknowledged record, in order");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_returns_to_the_preferred_replica_once_it_is_in_sync() {
    let _serial = serial().await;
    let bounced = bounce_a_preferred_leader(true).await;
    let started = tokio::time::Instant::now();
    for (&p, before) in &bounced.led_elsewhere {
        let after = bounced
            .cluster
            .wait_for_state(TOPIC, p, REACT, &format!("led by its preferred replica {}", bounced.away), |s| {
                s.leader == bounced.away
            })
            .await
            .unwrap();
        // Only the move back, one epoch after the move away (the ISR growing again
        // changes no leader epoch), with both replicas still in sync.
        assert_eq!(after.leader_epoch, before.leader_epoch + 1, "{TOPIC}-{p}: {before:?} -> {after:?}");
        let mut isr = after.isr.clone();
        isr.sort_unstable();
        let mut both = vec![bounced.away, bounced.other];
        both.sort_unstable();
        assert_eq!(isr, both, "{TOPIC}-{p}: both replicas stay in the ISR");
    }
    tracing::info!(elapsed = ?started.elapsed(), "leadership back on the preferred replica");
    for p in 0..PARTITIONS {
        let state = bounced.cluster.partition_state(TOPIC, p).await.unwrap().unwrap();
        let preferred = if bounced.led_elsewhere.contains_key(&p) { bounced.away } else { bounced.other };
        assert_eq!(state.leader, preferred, "{TOPIC}-{p}: every partition on its preferred replica");
    }
    produce_and_read_back(&bounced).await;
    bounced.producer.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_stays_put_with_auto_rebalance_off() {
    let _serial = serial().await;
    let bounced = bounce_a_preferred_leader(false).await;
    // Nothing to wait for but time: three check intervals and a half, during which an
    // enabled controller would have moved them (the other test sees that within ~1 s).
    tokio::time::sleep(Duration::from_millis(3500)).await;
    for (&p, before) in &bounced.led_elsewhere {
        let now = bounced.cluster.partition_state(TOPIC, p).await.unwrap().unwrap();
        assert_eq!((now.leader, now.leader_epoch), (bounced.other, before.leader_epoch), "{TOPIC}-{p} did not move back");
    }
    produce_and_read_back(&bounced).await;
    bounced.producer.close().await;
}
