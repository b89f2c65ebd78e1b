//! The broker on a real ZooKeeper (`zookeeper.connect`): topics land in the registry paths
//! of docs/architecture.md, the broker registers and deregisters itself, and a restart on the
//! same ZooKeeper and log dir finds its topics and data again.

mod common;

use bytes::Bytes;
use common::{produce_request, RawClient, TestBroker, LATEST};
use fjord_coord::paths;
use fjord_coord::registry::{read_json, BrokerRegistration, PartitionState, TopicAssignment};
use fjord_record::BatchBuilder;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

fn batch(value: &str) -> Bytes {
    let mut builder = BatchBuilder::new(1_700_000_000_000);
    builder.append(1_700_000_000_000, None, Some(value.as_bytes()), &[]);
    builder.build()
}

async fn produce(client: &mut RawClient, topic: &str, partition: i32, value: &str) -> (i16, i64) {
    client.produce(7, &produce_request(topic, partition, -1, 5000, batch(value))).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_live_in_zookeeper_and_survive_a_restart() {
    let zk = fjord_testkit::ZooKeeper::start().unwrap();
    let connect = zk.connect_string();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let with_zk = |c: &mut fjord_broker::BrokerConfig| {
        c.zookeeper_connect = Some(connect.clone());
        c.num_partitions = 2;
    };
    let broker = TestBroker::start_in(data.clone(), with_zk).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    assert_eq!(produce(&mut client, "zk-topic", 1, "one").await, (0, 0));
    assert_eq!(produce(&mut client, "zk-topic", 1, "two").await, (0, 1));

    let store = fjord_coord::open(Some(&connect), &dir.path().join("unused")).await.unwrap();
    let (assignment, _) = read_json::<TopicAssignment>(&*store, &paths::topic("zk-topic")).await.unwrap().unwrap();
    assert_eq!(assignment.partition_count(), 2);
    assert_eq!(assignment.replicas(1), Some(&[0][..]));
    let (state, _) = read_json::<PartitionState>(&*store, &paths::partition_state("zk-topic", 1)).await.unwrap().unwrap();
    assert_eq!((state.leader, state.isr), (0, vec![0]));
    assert!(store.exists(&paths::topic_config("zk-topic")).await.unwrap().is_some());
    let (registration, _) = read_json::<BrokerRegistration>(&*store, &paths::broker(0)).await.unwrap().unwrap();
    assert_eq!(registration.port, broker.addr.port());

    broker.stop().await.unwrap();
    assert!(store.exists(&paths::broker(0)).await.unwrap().is_none(), "a clean stop deregisters at once");

    let broker = TestBroker::start_in(data, |c| {
        with_zk(c);
        c.auto_create_topics = false;
    })
    .await
    .unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    assert_eq!(client.list_offset("zk-topic", 1, LATEST).await, (0, 2));
    assert_eq!(produce(&mut client, "zk-topic", 1, "three").await, (0, 2));
    broker.stop().await.unwrap();
}

/// `retention.ms` of `topic` as `broker` reports it (DescribeConfigs answers from the
/// broker's live topic config).
async fn retention_ms(client: &mut RawClient, topic: &str) -> String {
    use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
    let describe = DescribeConfigsRequest::default().with_resources(vec![DescribeConfigsResource::default()
        .with_resource_type(2)
        .with_resource_name(StrBytes::from_string(topic.into()))
        .with_configuration_keys(Some(vec![StrBytes::from_static_str("retention.ms")]))]);
    let response: DescribeConfigsResponse = client.call(ApiKey::DescribeConfigs, 4, &describe).await.unwrap();
    assert_eq!(response.results[0].error_code, 0);
    response.results[0].configs[0].value.as_deref().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_change_through_one_broker_reaches_the_broker_hosting_the_topic() {
    use kafka_protocol::messages::incremental_alter_configs_request::{AlterConfigsResource, AlterableConfig};
    let zk = fjord_testkit::ZooKeeper::start().unwrap();
    let connect = zk.connect_string();
    let dir = tempfile::tempdir().unwrap();
    let host = TestBroker::start_in(dir.path().join("b0"), |c| c.zookeeper_connect = Some(connect.clone())).await.unwrap();
    let mut to_host = RawClient::connect(host.addr).await.unwrap();
    // Auto-created while broker 0 is the only live broker, so its one replica is there.
    assert_eq!(produce(&mut to_host, "shared", 0, "one").await, (0, 0));
    assert_eq!(retention_ms(&mut to_host, "shared").await, "604800000");
    let other = TestBroker::start_in(dir.path().join("b1"), |c| {
        c.zookeeper_connect = Some(connect.clone());
        c.broker_id = 1;
    })
    .await
    .unwrap();

    let alter = |value: &'static str| {
        IncrementalAlterConfigsRequest::default().with_resources(vec![AlterConfigsResource::default()
            .with_resource_type(2)
            .with_resource_name(StrBytes::from_static_str("shared"))
            .with_configs(vec![AlterableConfig::default()
                .with_name(StrBytes::from_static_str("retention.ms"))
                .with_config_operation(0)
                .with_value(Some(StrBytes::from_static_str(value)))])])
    };
    let mut to_other = RawClient::connect(other.addr).await.unwrap();
    for value in ["60000", "120000"] {
        let response: IncrementalAlterConfigsResponse =
            to_other.call(ApiKey::IncrementalAlterConfigs, 1, &alter(value)).await.unwrap();
        assert_eq!(response.responses[0].error_code, 0, "{:?}", response.responses[0].error_message);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while retention_ms(&mut to_host, "shared").await != value {
            assert!(std::time::Instant::now() < deadline, "the hosting broker never applied retention.ms={value}");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
    other.stop().await.unwrap();
    host.stop().await.unwrap();
}
