//! ElectLeaders (Kafka's `kafka-leader-election.sh`, `AdminClient.electLeaders`): a real
//! client (confluent-kafka's `AdminClient.elect_leaders`, librdkafka 2.16) against two
//! in-process brokers on a real ZooKeeper moves leadership back to the preferred replica
//! on demand; the raw protocol checks who answers and what it refuses.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{run_python, RawClient, TestBroker};
use fjord_testkit::Cluster;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::elect_leaders_request::TopicPartitions;
use kafka_protocol::messages::{
    ApiKey, CreateTopicsRequest, CreateTopicsResponse, DescribeConfigsRequest, DescribeConfigsResponse, ElectLeadersRequest,
    ElectLeadersResponse,
};
use kafka_protocol::protocol::StrBytes;

/// Bound on every wait for the cluster to react.
const REACT: Duration = Duration::from_secs(20);
const NOT_CONTROLLER: i16 = 41;
const INVALID_REQUEST: i16 = 42;
const ELECTION_NOT_NEEDED: i16 = 84;

/// The cluster tests run one at a time: each runs ZooKeeper and two brokers.
async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    SERIAL.lock().await
}

fn request(election_type: i8, partitions: Option<&[(&str, i32)]>) -> ElectLeadersRequest {
    let topic_partitions = partitions.map(|partitions| {
        partitions
            .iter()
            .map(|(topic, p)| TopicPartitions::default().with_topic(common::topic_name(topic)).with_partitions(vec![*p]))
            .collect()
    });
    ElectLeadersRequest::default()
        .with_election_type(election_type)
        .with_topic_partitions(topic_partitions)
        .with_timeout_ms(10_000)
}

/// (top-level error, [(topic, partition, error)]).
fn outcome(response: &ElectLeadersResponse) -> (i16, Vec<(String, i32, i16)>) {
    let partitions = response
        .replica_election_results
        .iter()
        .flat_map(|t| t.partition_result.iter().map(|p| (t.topic.0.to_string(), p.partition_id, p.error_code)))
        .collect();
    (response.error_code, partitions)
}

const PREFERRED_SCRIPT: &str = r#"
import sys, time
from confluent_kafka import TopicPartition, KafkaError, KafkaException, ElectionType
from confluent_kafka.admin import AdminClient

bootstrap, topic, preferred = sys.argv[1], sys.argv[2], int(sys.argv[3])
admin = AdminClient({'bootstrap.servers': bootstrap})

def elect(partitions):
    # (confluent-kafka 2.16 refuses any keyword argument here: the defaults apply.)
    return admin.elect_leaders(ElectionType.PREFERRED, partitions).result()

def code(error):
    error = error.args[0] if isinstance(error, KafkaException) else error
    return error.code()

tp = TopicPartition(topic, 0)
result = elect([tp])
assert [(k.topic, k.partition) for k in result] == [(topic, 0)] and list(result.values()) == [None], result

# The answer came once the controller's view showed the new leader; any broker's
# metadata names it as soon as that broker's view has caught up.
deadline = time.time() + 20
while True:
    leader = admin.list_topics(topic, timeout=10).topics[topic].partitions[0].leader
    if leader == preferred or time.time() > deadline:
        break
    time.sleep(0.1)
assert leader == preferred, (leader, preferred)

[error] = elect([tp]).values()
assert error is not None and code(error) == KafkaError.ELECTION_NOT_NEEDED, error
for unknown in [TopicPartition(topic, 7), TopicPartition('no-such-topic', 0)]:
    [error] = elect([unknown]).values()
    assert error is not None and code(error) == KafkaError.UNKNOWN_TOPIC_OR_PART, (unknown, error)
print("ok")
"#;

/// Two brokers without automatic rebalancing: the preferred leader of a partition stops
/// (controlled) and comes back into the ISR, leadership stays on the other broker, and
/// `elect_leaders(PREFERRED)` moves it back: one leader epoch more, same ISR, in
/// ZooKeeper and in the client's metadata. A second election is not needed; an unknown
/// partition or topic is answered as such.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_moves_leadership_back_to_the_preferred_replica() {
    let _serial = serial().await;
    common::init_tracing();
    const TOPIC: &str = "elect";
    let mut cluster = Cluster::builder()
        .brokers(2)
        .config("auto.leader.rebalance.enable", false)
        .config("replica.fetch.wait.max.ms", 100)
        .config("controlled.shutdown.timeout.ms", 5000)
        .start()
        .await
        .unwrap();
    cluster.create_topic(TOPIC, 1, &[], REACT).await.unwrap();
    let assignment = cluster.assignment(TOPIC).await.unwrap().unwrap();
    let preferred = assignment.partitions["0"][0];
    let other = *cluster.ids().iter().find(|&&id| id != preferred).unwrap();

    cluster.stop(preferred).await.unwrap();
    assert_eq!(cluster.leader(TOPIC, 0).await.unwrap(), Some(other), "moved on the controlled stop");
    cluster.start(preferred).await.unwrap();
    let before = cluster.wait_for_isr(TOPIC, 0, &[preferred, other], REACT).await.unwrap();
    assert_eq!(before.leader, other, "auto.leader.rebalance.enable=false: leadership stays where it went");

    let preferred_arg = preferred.to_string();
    run_python(PREFERRED_SCRIPT, &[&cluster.bootstrap(), TOPIC, &preferred_arg], Duration::from_secs(90)).await;

    let after = cluster.partition_state(TOPIC, 0).await.unwrap().unwrap();
    assert_eq!(after.leader, preferred, "{before:?} -> {after:?}");
    assert_eq!(after.leader_epoch, before.leader_epoch + 1, "exactly one move: {before:?} -> {after:?}");
    let (mut isr_before, mut isr_after) = (before.isr.clone(), after.isr.clone());
    isr_before.sort_unstable();
    isr_after.sort_unstable();
    assert_eq!(isr_after, isr_before, "the ISR is kept");
}

/// Only the controller elects: another broker answers NOT_CONTROLLER (top level from v1,
/// per partition in v0). An unknown election type is an INVALID_REQUEST; an unclean
/// election of a partition with a live leader is not needed; a malformed body closes
/// only its own connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_controller_elects_and_bad_requests_are_refused() {
    let _serial = serial().await;
    common::init_tracing();
    const TOPIC: &str = "raw";
    let cluster = Cluster::builder().brokers(2).config("auto.leader.rebalance.enable", false).start().await.unwrap();
    cluster.create_topic(TOPIC, 1, &[], REACT).await.unwrap();
    let controller = cluster.wait_for_controller(&[], REACT).await.unwrap();
    let follower = *cluster.ids().iter().find(|&&id| id != controller).unwrap();
    let addr = |id: i32| cluster.addr(id).parse::<SocketAddr>().unwrap();
    let asked: &[(&str, i32)] = &[(TOPIC, 0)];

    let mut elsewhere = RawClient::connect(addr(follower)).await.unwrap();
    for version in 1..=2 {
        let response: ElectLeadersResponse =
            elsewhere.call(ApiKey::ElectLeaders, version, &request(0, Some(asked))).await.unwrap();
        assert_eq!(outcome(&response), (NOT_CONTROLLER, vec![]), "v{version}");
    }
    let response: ElectLeadersResponse = elsewhere.call(ApiKey::ElectLeaders, 0, &request(0, Some(asked))).await.unwrap();
    assert_eq!(outcome(&response), (0, vec![(TOPIC.to_owned(), 0, NOT_CONTROLLER)]), "v0 has no top-level error");

    let mut client = RawClient::connect(addr(controller)).await.unwrap();
    let response: ElectLeadersResponse = client.call(ApiKey::ElectLeaders, 2, &request(5, Some(asked))).await.unwrap();
    assert_eq!(outcome(&response), (INVALID_REQUEST, vec![]));
    let response: ElectLeadersResponse = client.call(ApiKey::ElectLeaders, 2, &request(1, Some(asked))).await.unwrap();
    assert_eq!(outcome(&response), (0, vec![(TOPIC.to_owned(), 0, ELECTION_NOT_NEEDED)]), "unclean, with a live leader");
    // Every partition (null): those that need no election are left out, as in Kafka.
    let response: ElectLeadersResponse = client.call(ApiKey::ElectLeaders, 2, &request(0, None)).await.unwrap();
    assert_eq!(outcome(&response), (0, vec![]));

    // A body that stops inside the timeout: only that connection closes.
    let mut bad = RawClient::connect(addr(controller)).await.unwrap();
    let frame = bad.encode(ApiKey::ElectLeaders, 1, &request(0, Some(asked)));
    bad.send_frame(&frame[..frame.len() - 2]).await.unwrap();
    assert!(bad.is_closed_by_broker().await);
    let response: ElectLeadersResponse = client.call(ApiKey::ElectLeaders, 1, &request(0, Some(asked))).await.unwrap();
    assert_eq!(outcome(&response), (0, vec![(TOPIC.to_owned(), 0, ELECTION_NOT_NEEDED)]));
}

/// Alone on the embedded store the broker is its own controller and leads every
/// partition: no election is needed. DescribeConfigs of the broker lists the
/// rebalancing keys.
#[tokio::test]
async fn a_single_broker_needs_no_election_and_describes_the_rebalance_keys() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), |c| c.leader_imbalance_per_broker_percentage = 25).await.unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    let create = CreateTopicsRequest::default().with_timeout_ms(5000).with_topics(vec![CreatableTopic::default()
        .with_name(common::topic_name("solo"))
        .with_num_partitions(1)
        .with_replication_factor(1)]);
    let created: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 7, &create).await.unwrap();
    assert_eq!(created.topics[0].error_code, 0);
    for (election_type, version) in [(0, 0), (0, 2), (1, 2)] {
        let response: ElectLeadersResponse =
            client.call(ApiKey::ElectLeaders, version, &request(election_type, Some(&[("solo", 0)]))).await.unwrap();
        assert_eq!(outcome(&response), (0, vec![("solo".to_owned(), 0, ELECTION_NOT_NEEDED)]), "type {election_type} v{version}");
    }

    let request = DescribeConfigsRequest::default().with_resources(vec![DescribeConfigsResource::default()
        .with_resource_type(4)
        .with_resource_name(StrBytes::from_static_str("0"))
        .with_configuration_keys(Some(vec![
            StrBytes::from_static_str("auto.leader.rebalance.enable"),
            StrBytes::from_static_str("leader.imbalance.check.interval.seconds"),
            StrBytes::from_static_str("leader.imbalance.per.broker.percentage"),
        ]))]);
    let response: DescribeConfigsResponse = client.call(ApiKey::DescribeConfigs, 4, &request).await.unwrap();
    let configs: Vec<(String, Option<String>)> =
        response.results[0].configs.iter().map(|c| (c.name.to_string(), c.value.as_ref().map(|v| v.to_string()))).collect();
    assert_eq!(
        configs,
        [
            ("auto.leader.rebalance.enable".to_owned(), Some("true".to_owned())),
            ("leader.imbalance.check.interval.seconds".to_owned(), Some("300".to_owned())),
            ("leader.imbalance.per.broker.percentage".to_owned(), Some("25".to_owned())),
        ]
    );
    broker.stop().await.unwrap();
}
