//! `fjord topics describe --under-replicated | --offline` (issue #22, Kafka's
//! `kafka-topics --describe --under-replicated-partitions | --unavailable-partitions`)
//! on three in-process brokers on ZooKeeper (fjord-testkit), one of them stopped: the
//! replicated topic's partitions lack it in their ISR, the partition whose only replica
//! it held has no leader; a healthy cluster lists nothing.

mod common;

use std::time::Duration;

use fjord_client::{Admin, NewTopic};
use fjord_testkit::{wait_until, Cluster};

use common::{fjord, stdout};

const REACT: Duration = Duration::from_secs(30);

/// The (topic, partition) pairs `fjord topics describe FLAG` lists, through `bootstrap`.
async fn listed(bootstrap: &str, flag: &str) -> Vec<(String, i32)> {
    let out = stdout(&fjord(&["topics", "describe", flag, &format!("--bootstrap={bootstrap}")]).await);
    out.lines()
        .map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(words.get(1), Some(&"partition"), "unexpected line {line:?} in\n{out}");
            (words[0].to_owned(), words[2].parse().unwrap())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_replicated_and_offline_partitions_with_one_broker_stopped() {
    let mut cluster = Cluster::builder().brokers(3).config("replica.fetch.wait.max.ms", 100).start().await.unwrap();
    cluster.create_topic("replicated", 2, &[], REACT).await.unwrap();
    let admin = Admin::connect(cluster.client_config()).await.unwrap();
    let mut single = NewTopic::new("single", 3);
    single.replication_factor = 1;
    admin.create_topics(&[single]).await.unwrap();
    for p in 0..3 {
        cluster.wait_for_leader("single", p, REACT).await.unwrap();
    }

    // Healthy: nothing to list.
    let bootstrap = cluster.bootstrap();
    assert_eq!(listed(&bootstrap, "--under-replicated").await, []);
    assert_eq!(listed(&bootstrap, "--offline").await, []);

    // Stop the broker holding single-0; ask one of the others.
    let stopped = cluster.leader("single", 0).await.unwrap().unwrap();
    let others: Vec<i32> = cluster.ids().into_iter().filter(|&id| id != stopped).collect();
    let held_by_stopped: Vec<(String, i32)> = {
        let assignment = cluster.assignment("single").await.unwrap().unwrap();
        (0..3).filter(|p| assignment.partitions[&p.to_string()] == [stopped]).map(|p| ("single".to_owned(), p)).collect()
    };
    cluster.stop(stopped).await.unwrap();
    for p in 0..2 {
        cluster.wait_for_isr("replicated", p, &others, REACT).await.unwrap();
    }
    let bootstrap = cluster.addr(others[0]);
    let under_replicated = [("replicated".to_owned(), 0), ("replicated".to_owned(), 1)];
    wait_until(REACT, "the replicated topic's partitions listed as under-replicated", || async {
        Ok((listed(&bootstrap, "--under-replicated").await == under_replicated).then_some(()))
    })
    .await
    .unwrap();
    wait_until(REACT, "the partitions whose only replica is stopped listed as offline", || async {
        Ok((listed(&bootstrap, "--offline").await == held_by_stopped).then_some(()))
    })
    .await
    .unwrap();

    // The two filters are alternatives, as in Kafka's tool.
    let both = fjord(&["topics", "describe", "--under-replicated", "--offline", &format!("--bootstrap={bootstrap}")]).await;
    assert!(!both.status.success());
    // One topic only.
    let one = stdout(&fjord(&["topics", "describe", "single", "--offline", &format!("--bootstrap={bootstrap}")]).await);
    assert_eq!(one.lines().count(), held_by_stopped.len(), "{one}");
}
