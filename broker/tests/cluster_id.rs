//! One cluster id per cluster (issue 26, case 8): it lives in the metadata store at
//! `/cluster/id` (Kafka's path and document), created by the first broker to start;
//! Metadata and DescribeCluster answer it on every broker, and a broker whose log dir's
//! `meta.properties` names another cluster refuses to start.

mod common;

use common::{RawClient, TestBroker};
use fjord_coord::paths;
use kafka_protocol::messages::*;

/// The cluster id a broker answers in Metadata (v12) and DescribeCluster (v0 and v1),
/// checked to be the same in all three, with the broker ids DescribeCluster lists.
async fn answered_cluster_id(broker: &TestBroker) -> anyhow::Result<(String, Vec<i32>)> {
    let mut client = RawClient::connect(broker.addr).await?;
    let metadata: MetadataResponse =
        client.call(ApiKey::Metadata, 12, &MetadataRequest::default().with_topics(Some(vec![]))).await?;
    let id = metadata.cluster_id.expect("Metadata names the cluster").to_string();
    let mut brokers = Vec::new();
    for version in [0, 1] {
        let described: DescribeClusterResponse =
            client.call(ApiKey::DescribeCluster, version, &DescribeClusterRequest::default()).await?;
        assert_eq!(described.error_code, 0, "DescribeCluster v{version}");
        assert_eq!(described.cluster_id.to_string(), id, "DescribeCluster v{version} and Metadata agree");
        brokers = described.brokers.iter().map(|b| b.broker_id.0).collect();
    }
    Ok((id, brokers))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brokers_answer_the_stores_one_cluster_id_and_a_log_dir_of_another_cluster_is_refused() {
    let zk = fjord_testkit::ZooKeeper::start().unwrap();
    let connect = zk.connect_string();
    let dir = tempfile::tempdir().unwrap();
    let on_zk = |id: i32| {
        let connect = connect.clone();
        move |c: &mut fjord_broker::BrokerConfig| {
            c.broker_id = id;
            c.zookeeper_connect = Some(connect);
        }
    };
    // Started together: both race to create the id, one wins, the other reads it back.
    let (first, second) = tokio::join!(
        TestBroker::start_in(dir.path().join("b0"), on_zk(0)),
        TestBroker::start_in(dir.path().join("b1"), on_zk(1))
    );
    let (first, second) = (first.unwrap(), second.unwrap());
    let answers = fjord_testkit::wait_until(std::time::Duration::from_secs(30), "both brokers in each view", || async {
        let answers = [answered_cluster_id(&first).await?, answered_cluster_id(&second).await?];
        Ok(answers.iter().all(|(_, brokers)| *brokers == [0, 1]).then_some(answers))
    })
    .await
    .unwrap();
    let store = fjord_coord::open(Some(&connect), &dir.path().join("unused")).await.unwrap();
    let (document, _) = store.get(paths::CLUSTER_ID).await.unwrap().expect("/cluster/id created");
    let document: serde_json::Value = serde_json::from_slice(&document).unwrap();
    assert_eq!(document["version"], "1", "{document}");
    let cluster = document["id"].as_str().unwrap().to_owned();
    assert_eq!(cluster.len(), 22);
    for (id, _) in &answers {
        assert_eq!(*id, cluster, "every broker answers the store's id");
    }
    for name in ["b0", "b1"] {
        let properties = std::fs::read_to_string(dir.path().join(name).join("meta.properties")).unwrap();
        assert!(properties.contains(&format!("cluster.id={cluster}")), "{properties}");
    }

    // A log dir that belongs to another cluster: refused before anything is served or
    // any log is opened.
    let foreign = dir.path().join("b2");
    std::fs::create_dir_all(foreign.join("old-topic-0")).unwrap();
    std::fs::write(foreign.join("meta.properties"), "version=0\nbroker.id=2\ncluster.id=AnotherClustersId00000\n").unwrap();
    let refused = match TestBroker::start_in(foreign.clone(), on_zk(2)).await {
        Ok(_) => panic!("a broker on another cluster's log dir started"),
        Err(refused) => refused,
    };
    let message = format!("{refused:#}");
    assert!(message.contains("AnotherClustersId00000") && message.contains(&cluster), "{message}");
    assert!(message.contains("wrong cluster"), "{message}");
    assert!(foreign.join("old-topic-0").exists());
    assert!(store.exists(&paths::broker(2)).await.unwrap().is_none(), "the refused broker never registered");
    first.stop().await.unwrap();
    second.stop().await.unwrap();
}
