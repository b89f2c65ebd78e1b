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

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{topic_name, RawClient};
use fjord_client::{Acks, ClientConfig, Producer, ProducerConfig, ProducerRecord};
use fjord_testkit::{read_values, Cluster};
use kafka_protocol::messages::{metadata_request, ApiKey, MetadataRequest, MetadataResponse};

const REACT: Duration = Duration::from_secs(30);
const TOPIC: &str = "unopenable";

/// `.log` entries of a partition directory, oldest first.
fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut logs: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    logs.sort();
    logs
}

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
    let logs = segments(&cluster.data_dir(damaged).join(format!("{TOPIC}-0")));
    assert_eq!(logs.len(), 1, "{logs:?}");
    let active = &logs[0];
    let aside = tempfile::tempdir().unwrap();
    std::fs::rename(active, aside.path().join("kept.log")).unwrap();
    std::fs::create_dir(active).unwrap();
    cluster.start(damaged).await.unwrap();

    // Every other broker lists it offline, not only the damaged broker itself.
    for other in [healthy, leader] {
        let addr = cluster.addr(other);
        let row = fjord_testkit::wait_until(REACT, "another broker's Metadata to list the offline replica", || async {
            let row = partition_row(&addr).await;
            Ok(row.2.contains(&damaged).then_some(row))
        })
        .await
        .unwrap();
        assert_eq!(row.0, leader, "broker {other}: the leader stays: {row:?}");
        assert_eq!(row.2, vec![damaged], "broker {other}: only the offline copy is listed: {row:?}");
        assert!(!row.1.contains(&damaged), "broker {other}: the offline copy is out of the ISR: {row:?}");
        assert_eq!(row.3, 0, "broker {other}: a healthy leader answers no error: {row:?}");
    }
    let own = partition_row(&cluster.addr(damaged)).await;
    assert!(own.2.contains(&damaged), "the damaged broker lists itself: {own:?}");

    // The leader fails: the healthy follower is elected, never the offline copy.
    cluster.stop(leader).await.unwrap();
    let moved = cluster.wait_for_state(TOPIC, 0, REACT, "a new leader", |s| s.leader >= 0 && s.leader != leader).await.unwrap();
    assert_eq!(moved.leader, healthy, "the healthy replica leads, not the offline copy: {moved:?}");
    assert!(!moved.isr.contains(&damaged), "{moved:?}");
    let row = partition_row(&cluster.addr(healthy)).await;
    assert_eq!((row.0, row.2.contains(&damaged)), (healthy, true), "{row:?}");
    let read_client = ClientConfig::new(&cluster.addr(healthy));
    assert_eq!(read_values(&read_client, TOPIC, 0).await.unwrap(), values, "every acknowledged record from the new leader");
    assert_eq!(cluster.leader(TOPIC, 0).await.unwrap(), Some(healthy), "and it still leads");
}
