//! A replica whose log cannot be opened, seen by the whole cluster (issue 26): three
//! brokers on a real ZooKeeper, records written with acks=all, one follower stopped and the
//! segment of its copy made unopenable (a directory where the file was), the follower
//! started again. Its partition stays offline there and it publishes that; then
//! - every other broker's Metadata lists it in `offline_replicas` (before the fix only
//!   the damaged broker itself did: a client asking any other broker saw a healthy
//!   replica set), and
//! - when the leader fails, the remaining healthy replica is elected, never the offline
//!   copy, and every acknowledged record reads back from it.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{topic_name, RawClient};
use fjord_client::{Acks, Admin, ClientConfig, Producer, ProducerConfig, ProducerRecord};
use fjord_testkit::{read_values, segments, Cluster};
use kafka_protocol::messages::{metadata_request, ApiKey, MetadataRequest, MetadataResponse};

const REACT: Duration = Duration::from_secs(30);
const TOPIC: &str = "unopenable";

/// (leader, isr, offline replicas, error code) of partition 0 as broker `addr` answers.
async fn partition_row(addr: &str) -> (i32, Vec<i32>, Vec<i32>, i16) {
    let mut client = RawClient::connect(addr.parse().unwrap()).await.unwrap();
    let request = MetadataRequest::default()
        .with_topics(Some(vec![metadata_request::MetadataRequestTopic::default().with_name(Some(topic_name(TOPIC)))]));
    let response: MetadataResponse = client.call(ApiKey::Metadata, 12, &request).await.unwrap();
    let p = &response.topics[0].partitions[0];
    let ids = |v: &[kafka_protocol::messages::BrokerId]| v.iter().map(|b| b.0).collect::<Vec<_>>();
    (p.leader_id.0, ids(&p.isr_nodes), ids(&p.offline_replicas), p.error_code)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_broker_lists_a_peers_unopenable_replica_offline_and_it_is_never_elected() {
    common::init_tracing();
    let mut cluster = Cluster::builder()
        .brokers(3)
        .config("replica.fetch.wait.max.ms", 100)
        .config("replica.lag.time.max.ms", 60_000)
        // A stopped leader is a failure to the controller, as a crash is: no handover first.
        .config("controlled.shutdown.enable", false)
        .start()
        .await
        .unwrap();
    cluster.create_topic(TOPIC, 1, &[], REACT).await.unwrap();
    let client = ClientConfig::new(&cluster.bootstrap());
    let producer =
        Producer::connect(ProducerConfig { client: client.clone(), acks: Acks::All, ..ProducerConfig::default() }).await.unwrap();
    let mut values = Vec::new();
    for i in 0..200 {
        let value = format!("record {i} {}", "x".repeat(40));
        producer.send(ProducerRecord::new(TOPIC, value.clone()).partition(0)).await.unwrap().await.unwrap();
        values.push(value);
    }
    cluster.wait_fully_replicated(TOPIC, REACT).await.unwrap();
    let leader = cluster.leader(TOPIC, 0).await.unwrap().unwrap();
    let followers: Vec<i32> = cluster.ids().into_iter().filter(|&id| id != leader).collect();
    let (damaged, healthy) = (followers[0], followers[1]);

    // The follower's segment becomes unopenable while it is stopped: a directory where
    // the file was (the copy's only segment, so the log cannot open without it).
    cluster.stop(damaged).await.unwrap();
    let logs = segments(&cluster.data_dir(damaged).join(format!("{TOPIC}-0"))).unwrap();
    assert_eq!(logs.len(), 1, "{logs:?}");
    let active = &logs[0];
    let aside = tempfile::tempdir().unwrap();
    std::fs::rename(active, aside.path().join("kept.log")).unwrap();
    std::fs::create_dir(active).unwrap();
    cluster.start(damaged).await.unwrap();

    // Every other broker lists it offline, not only the damaged broker itself.
    for other in [healthy, leader] {
        let addr = cluster.addr(other);
        // The listing and the ISR change reach each broker's view separately (two
        // watches): wait for both, then check the whole row.
        let row =
            fjord_testkit::wait_until(REACT, "another broker's Metadata to list the offline replica out of the ISR", || async {
                let row = partition_row(&addr).await;
                Ok((row.2.contains(&damaged) && !row.1.contains(&damaged)).then_some(row))
            })
            .await
            .unwrap();
        assert_eq!(row.0, leader, "broker {other}: the leader stays: {row:?}");
        assert_eq!(row.2, vec![damaged], "broker {other}: only the offline copy is listed: {row:?}");
        assert_eq!(row.3, 0, "broker {other}: a healthy leader answers no error: {row:?}");
    }
    let own = partition_row(&cluster.addr(damaged)).await;
    assert!(own.2.contains(&damaged), "the damaged broker lists itself: {own:?}");

    // The leader fails: the healthy follower is elected, never the offline copy.
    cluster.stop(leader).await.unwrap();
    let moved = cluster.wait_for_state(TOPIC, 0, REACT, "a new leader", |s| s.leader >= 0 && s.leader != leader).await.unwrap();
    assert_eq!(moved.leader, healthy, "the healthy replica leads, not the offline copy: {moved:?}");
    assert!(!moved.isr.contains(&damaged), "{moved:?}");
    // The new leader's own view follows the state node a moment after the store has it.
    let addr = cluster.addr(healthy);
    let row = fjord_testkit::wait_until(REACT, "the new leader's Metadata to name it", || async {
        let row = partition_row(&addr).await;
        Ok((row.0 == healthy).then_some(row))
    })
    .await
    .unwrap();
    assert!(row.2.contains(&damaged), "the offline copy is still listed: {row:?}");
    assert_eq!(row.3, 0, "{row:?}");
    let read_client = ClientConfig::new(&cluster.addr(healthy));
    assert_eq!(read_values(&read_client, TOPIC, 0).await.unwrap(), values, "every acknowledged record from the new leader");
    assert_eq!(cluster.leader(TOPIC, 0).await.unwrap(), Some(healthy), "and it still leads");

    // The way out of offline for a copy its broker no longer holds: the topic is
    // deleted; the unopenable directory is moved aside as it is (never deleted) and the
    // broker's listing goes. Before, it stayed listed until a restart, and a topic
    // created again under the name met the same directory.
    let admin = Admin::connect(read_client).await.unwrap();
    admin.delete_topics(&[TOPIC.to_owned()]).await.unwrap();
    let path = fjord_coord::paths::offline_replicas(damaged);
    fjord_testkit::wait_until(REACT, "the damaged broker's offline listing cleared", || async {
        Ok(cluster.store().exists(&path).await?.is_none().then_some(()))
    })
    .await
    .unwrap();
    let data_dir = cluster.data_dir(damaged);
    let orphans: Vec<PathBuf> = std::fs::read_dir(data_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(&format!("{TOPIC}-0-orphan-")))
        .collect();
    assert_eq!(orphans.len(), 1, "{orphans:?}");
    assert!(orphans[0].join(active.file_name().unwrap()).is_dir(), "moved aside as it was: {orphans:?}");
    assert!(!data_dir.join(format!("{TOPIC}-0")).exists(), "the name is free for a new topic");
}
