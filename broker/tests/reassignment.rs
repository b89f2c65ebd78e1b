//! Partition reassignment (AlterPartitionReassignments / ListPartitionReassignments,
//! `kafka-reassign-partitions`) on a real ZooKeeper with four in-process brokers, ids
//! 0-3: a partition on {0, 1, 2} moves to {1, 2, 3} while an acks=all producer runs
//! (issue #22's {1,2,3} -> {2,3,4}, shifted to the fixture's ids) and keeps every
//! acknowledged record; a reassignment that cannot complete is listed, then cancelled;
//! bad requests get Kafka's codes and change nothing. kafka-python's KafkaAdminClient
//! (an independent client) starts, lists and cancels; the raw protocol checks the rest.

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::{run_python, RawClient};
use fjord_client::{Acks, ClientConfig, Producer, ProducerConfig};
use fjord_coord::registry::TopicAssignment;
use fjord_testkit::{read_values, wait_until, Cluster, LoadProducer};
use kafka_protocol::messages::alter_partition_reassignments_request::{ReassignablePartition, ReassignableTopic};
use kafka_protocol::messages::create_topics_request::{CreatableReplicaAssignment, CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::list_partition_reassignments_request::ListPartitionReassignmentsTopics;
use kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse, ApiKey, BrokerId, CreateTopicsRequest,
    CreateTopicsResponse, ListPartitionReassignmentsRequest, ListPartitionReassignmentsResponse,
};
use kafka_protocol::protocol::StrBytes;

/// Bound on every wait for the cluster to react.
const REACT: Duration = Duration::from_secs(30);
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const INVALID_REPLICA_ASSIGNMENT: i16 = 39;
const NOT_CONTROLLER: i16 = 41;
const NO_REASSIGNMENT_IN_PROGRESS: i16 = 85;

/// The cluster tests run one at a time: each runs ZooKeeper and four brokers.
async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    SERIAL.lock().await
}

async fn four_brokers() -> Cluster {
    Cluster::builder()
        .brokers(4)
        .config("auto.leader.rebalance.enable", false)
        .config("replica.fetch.wait.max.ms", 100)
        .start()
        .await
        .unwrap()
}

fn addr(cluster: &Cluster, id: i32) -> SocketAddr {
    cluster.addr(id).parse().unwrap()
}

/// Creates `topic` with one partition on exactly `replicas` (min.insync.replicas 2) and
/// waits until they are all in sync.
async fn create(cluster: &Cluster, topic: &str, replicas: &[i32]) {
    let mut client = RawClient::connect(addr(cluster, 0)).await.unwrap();
    let request = CreateTopicsRequest::default().with_timeout_ms(10_000).with_topics(vec![CreatableTopic::default()
        .with_name(common::topic_name(topic))
        .with_num_partitions(-1)
        .with_replication_factor(-1)
        .with_assignments(vec![CreatableReplicaAssignment::default()
            .with_partition_index(0)
            .with_broker_ids(replicas.iter().map(|&b| BrokerId(b)).collect())])
        .with_configs(vec![CreatableTopicConfig::default()
            .with_name(StrBytes::from_static_str("min.insync.replicas"))
            .with_value(Some(StrBytes::from_static_str("2")))])]);
    let created: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 7, &request).await.unwrap();
    assert_eq!(created.topics[0].error_code, 0, "{created:?}");
    cluster.wait_for_isr(topic, 0, replicas, REACT).await.unwrap();
}

fn alter(asked: &[(&str, i32, Option<&[i32]>)]) -> AlterPartitionReassignmentsRequest {
    let topics = asked
        .iter()
        .map(|(topic, partition, replicas)| {
            ReassignableTopic::default().with_name(common::topic_name(topic)).with_partitions(vec![
                ReassignablePartition::default()
                    .with_partition_index(*partition)
                    .with_replicas(replicas.map(|r| r.iter().map(|&b| BrokerId(b)).collect())),
            ])
        })
        .collect();
    AlterPartitionReassignmentsRequest::default().with_topics(topics)
}

/// (top-level error, [(topic, partition, error)]).
fn outcome(response: &AlterPartitionReassignmentsResponse) -> (i16, Vec<(String, i32, i16)>) {
    let partitions = response
        .responses
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| (t.name.0.to_string(), p.partition_index, p.error_code)))
        .collect();
    (response.error_code, partitions)
}

/// [(topic, partition, replicas, adding, removing)] of a ListPartitionReassignments answer.
type Listed = Vec<(String, i32, Vec<i32>, Vec<i32>, Vec<i32>)>;

async fn list(client: &mut RawClient, topics: Option<&[(&str, i32)]>) -> Listed {
    let topics = topics.map(|asked| {
        asked
            .iter()
            .map(|(t, p)| {
                ListPartitionReassignmentsTopics::default().with_name(common::topic_name(t)).with_partition_indexes(vec![*p])
            })
            .collect()
    });
    let request = ListPartitionReassignmentsRequest::default().with_topics(topics);
    let response: ListPartitionReassignmentsResponse =
        client.call(ApiKey::ListPartitionReassignments, 0, &request).await.unwrap();
    assert_eq!(response.error_code, 0);
    let ids = |v: &[BrokerId]| v.iter().map(|b| b.0).collect::<Vec<_>>();
    response
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(|p| {
                (t.name.0.to_string(), p.partition_index, ids(&p.replicas), ids(&p.adding_replicas), ids(&p.removing_replicas))
            })
        })
        .collect()
}

/// Waits until the topic's assignment is `replicas` with no reassignment recorded.
async fn wait_for_assignment(cluster: &Cluster, topic: &str, replicas: &[i32]) -> TopicAssignment {
    wait_until(REACT, &format!("{topic}-0 assigned to {replicas:?}"), || async {
        let assignment = cluster.assignment(topic).await?.expect("the topic exists");
        let done = assignment.partitions["0"] == replicas
            && assignment.adding_replicas.is_empty()
            && assignment.removing_replicas.is_empty();
        Ok(done.then_some(assignment))
    })
    .await
    .unwrap()
}

const MOVE_SCRIPT: &str = r#"
import sys, time
from kafka import KafkaAdminClient, TopicPartition

bootstrap, topic = sys.argv[1], sys.argv[2]
target = [int(b) for b in sys.argv[3].split(',')]
admin = KafkaAdminClient(bootstrap_servers=bootstrap)
tp = TopicPartition(topic, 0)
result = admin.alter_partition_reassignments({tp: target})
assert result == {tp: None}, result
# In progress until the new replica is in sync, then gone from the listing.
deadline = time.time() + 60
while True:
    listed = admin.list_partition_reassignments()
    if not listed:
        break
    assert list(listed) == [tp], listed
    assert listed[tp]['replicas'][:len(target)] == target, listed
    assert time.time() < deadline, listed
    time.sleep(0.1)
print("ok")
"#;

/// {0, 1, 2} -> {1, 2, 3} while an acks=all idempotent producer sends without pause:
/// every acknowledged record is read back afterwards, the assignment ends {1, 2, 3}
/// with leadership on 1 (the first of the target: the old leader 0 left), and broker 0
/// no longer hosts the partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partition_moves_under_acks_all_load_and_keeps_every_acknowledged_record() {
    let _serial = serial().await;
    common::init_tracing();
    const TOPIC: &str = "moved";
    let cluster = four_brokers().await;
    create(&cluster, TOPIC, &[0, 1, 2]).await;
    let before = cluster.partition_state(TOPIC, 0).await.unwrap().unwrap();
    assert_eq!(before.leader, 0, "the preferred replica leads a new partition");

    let client = ClientConfig::new(&cluster.bootstrap());
    let config =
        ProducerConfig { client: client.clone(), acks: Acks::All, enable_idempotence: Some(true), ..ProducerConfig::default() };
    let load = LoadProducer::start(Arc::new(Producer::connect(config).await.unwrap()), TOPIC, 1);
    // Load established before the move, and kept up after it.
    load.acknowledged_over(100, REACT).await.unwrap();

    run_python(MOVE_SCRIPT, &[&cluster.bootstrap(), TOPIC, "1,2,3"], Duration::from_secs(120)).await;
    wait_for_assignment(&cluster, TOPIC, &[1, 2, 3]).await;
    let after = cluster.wait_for_isr(TOPIC, 0, &[1, 2, 3], REACT).await.unwrap();
    assert_eq!(after.leader, 1, "leadership moved to the first target replica: {before:?} -> {after:?}");
    assert!(after.leader_epoch > before.leader_epoch);
    load.acknowledged_over(100, REACT).await.unwrap(); // the producer goes on with the new leader
    let load = load.stop().await.unwrap();
    let acknowledged = load.values_of(0);
    assert!(acknowledged.len() >= 200, "the producer kept going: {} acknowledged, {} failed", acknowledged.len(), load.failed);

    let read: BTreeSet<String> = read_values(&client, TOPIC, 0).await.unwrap().into_iter().collect();
    let lost: Vec<&&str> = acknowledged.iter().filter(|v| !read.contains(**v)).collect();
    assert!(lost.is_empty(), "{} of {} acknowledged records lost: {lost:?}", lost.len(), acknowledged.len());
    tracing::info!(acknowledged = acknowledged.len(), failed = load.failed, "every acknowledged record read back");

    let hosted = |id: i32| cluster.data_dir(id).join(format!("{TOPIC}-0")).exists();
    wait_until(REACT, "broker 0 drops its replica", || async { Ok((!hosted(0)).then_some(())) }).await.unwrap();
    assert!(hosted(1) && hosted(2) && hosted(3));
}

const CANCEL_SCRIPT: &str = r#"
import sys, time
from kafka import KafkaAdminClient, TopicPartition
from kafka.errors import NoReassignmentInProgressError

bootstrap, topic = sys.argv[1], sys.argv[2]
admin = KafkaAdminClient(bootstrap_servers=bootstrap)
tp = TopicPartition(topic, 0)
listed = admin.list_partition_reassignments([tp])
want = {'replicas': [1, 2, 3, 0], 'adding_replicas': [3], 'removing_replicas': [0]}
assert listed == {tp: want}, listed
assert admin.alter_partition_reassignments({tp: None}) == {tp: None}
deadline = time.time() + 30
while admin.list_partition_reassignments():
    assert time.time() < deadline, "the cancel never completed"
    time.sleep(0.1)
assert admin.alter_partition_reassignments({tp: None}) == {tp: NoReassignmentInProgressError}
print("ok")
"#;

/// A reassignment to {1, 2, 3} whose new replica cannot open its log (a file stands
/// where broker 3's partition directory would be) never completes: it is listed with
/// what it adds and removes, and a cancel (kafka-python, a null target) brings the
/// partition back to its replicas, the leader and every original replica's data kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reassignment_that_cannot_complete_is_listed_and_cancelled() {
    let _serial = serial().await;
    common::init_tracing();
    const TOPIC: &str = "stuck";
    let cluster = four_brokers().await;
    create(&cluster, TOPIC, &[0, 1, 2]).await;
    std::fs::write(cluster.data_dir(3).join(format!("{TOPIC}-0")), b"not a directory").unwrap();
    let controller = cluster.wait_for_controller(&[], REACT).await.unwrap();
    let mut client = RawClient::connect(addr(&cluster, controller)).await.unwrap();

    let response: AlterPartitionReassignmentsResponse =
        client.call(ApiKey::AlterPartitionReassignments, 0, &alter(&[(TOPIC, 0, Some(&[1, 2, 3]))])).await.unwrap();
    assert_eq!(outcome(&response), (0, vec![(TOPIC.to_owned(), 0, 0)]));
    let moving = (TOPIC.to_owned(), 0, vec![1, 2, 3, 0], vec![3], vec![0]);
    assert_eq!(list(&mut client, None).await, vec![moving.clone()]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(list(&mut client, Some(&[(TOPIC, 0)])).await, vec![moving], "still waiting for broker 3");
    assert!(list(&mut client, Some(&[(TOPIC, 5), ("other", 0)])).await.is_empty(), "only what was asked for");
    let mut elsewhere = RawClient::connect(addr(&cluster, (controller + 1) % 4)).await.unwrap();
    assert_eq!(list(&mut elsewhere, None).await.len(), 1, "any broker lists");

    run_python(CANCEL_SCRIPT, &[&cluster.bootstrap(), TOPIC], Duration::from_secs(90)).await;
    // Kafka's original replicas: those not being added, in the reassignment's order.
    let assignment = wait_for_assignment(&cluster, TOPIC, &[1, 2, 0]).await;
    assert!(assignment.topic_id.is_some());
    let state = cluster.wait_for_isr(TOPIC, 0, &[0, 1, 2], REACT).await.unwrap();
    assert_eq!(state.leader, 0, "the leader was an original replica: it stays");
    for id in [0, 1, 2] {
        assert!(cluster.data_dir(id).join(format!("{TOPIC}-0")).is_dir(), "broker {id} keeps its replica");
    }
}

/// Bad requests get Kafka's codes and change nothing: an unknown topic or partition, an
/// empty list, a broker named twice, an unknown or stopped broker, a cancel without a
/// reassignment; a broker that is not the controller answers NOT_CONTROLLER.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_reassignments_are_refused_and_change_nothing() {
    let _serial = serial().await;
    common::init_tracing();
    const TOPIC: &str = "kept";
    let mut cluster = four_brokers().await;
    create(&cluster, TOPIC, &[0, 1, 2]).await;
    let before = cluster.assignment(TOPIC).await.unwrap().unwrap();
    let state_before = cluster.partition_state(TOPIC, 0).await.unwrap().unwrap();
    let controller = cluster.wait_for_controller(&[], REACT).await.unwrap();
    let mut client = RawClient::connect(addr(&cluster, controller)).await.unwrap();

    let cases: &[(&str, i32, Option<&[i32]>, i16)] = &[
        ("no-such-topic", 0, Some(&[1, 2, 3]), UNKNOWN_TOPIC_OR_PARTITION),
        (TOPIC, 7, Some(&[1, 2, 3]), UNKNOWN_TOPIC_OR_PARTITION),
        (TOPIC, 0, Some(&[]), INVALID_REPLICA_ASSIGNMENT),
        (TOPIC, 0, Some(&[1, 1, 2]), INVALID_REPLICA_ASSIGNMENT),
        (TOPIC, 0, Some(&[1, 2, 9]), INVALID_REPLICA_ASSIGNMENT),
        (TOPIC, 0, None, NO_REASSIGNMENT_IN_PROGRESS),
    ];
    for version in 0..=1 {
        for &(topic, partition, replicas, code) in cases {
            let response: AlterPartitionReassignmentsResponse =
                client.call(ApiKey::AlterPartitionReassignments, version, &alter(&[(topic, partition, replicas)])).await.unwrap();
            assert_eq!(outcome(&response), (0, vec![(topic.to_owned(), partition, code)]), "{topic}-{partition} {replicas:?}");
        }
    }
    let response: AlterPartitionReassignmentsResponse = client
        .call(
            ApiKey::AlterPartitionReassignments,
            1,
            &alter(&[(TOPIC, 0, Some(&[1, 2]))]).with_allow_replication_factor_change(false),
        )
        .await
        .unwrap();
    assert_eq!(outcome(&response).1[0].2, 38, "INVALID_REPLICATION_FACTOR when v1 does not allow the change");

    let other = *cluster.ids().iter().find(|&&id| id != controller).unwrap();
    let mut elsewhere = RawClient::connect(addr(&cluster, other)).await.unwrap();
    let response: AlterPartitionReassignmentsResponse =
        elsewhere.call(ApiKey::AlterPartitionReassignments, 0, &alter(&[(TOPIC, 0, Some(&[1, 2, 3]))])).await.unwrap();
    assert_eq!(outcome(&response), (NOT_CONTROLLER, vec![]));

    // A stopped broker is not live: refused like an unknown one.
    let stopped = *cluster.ids().iter().rev().find(|&&id| id != controller && id != 0).unwrap();
    cluster.stop(stopped).await.unwrap();
    cluster.wait_for_registered(&cluster.ids().into_iter().filter(|&id| id != stopped).collect::<Vec<_>>(), REACT).await.unwrap();
    let target: Vec<i32> = vec![0, stopped];
    let response: AlterPartitionReassignmentsResponse =
        client.call(ApiKey::AlterPartitionReassignments, 0, &alter(&[(TOPIC, 0, Some(&target))])).await.unwrap();
    assert_eq!(outcome(&response), (0, vec![(TOPIC.to_owned(), 0, INVALID_REPLICA_ASSIGNMENT)]), "stopped broker {stopped}");

    assert_eq!(cluster.assignment(TOPIC).await.unwrap().unwrap(), before, "nothing changed");
    assert!(list(&mut client, None).await.is_empty());
    let state = cluster.partition_state(TOPIC, 0).await.unwrap().unwrap();
    assert_eq!((state.leader, state.leader_epoch), (state_before.leader, state_before.leader_epoch));
}

/// A controller that stops while a reassignment waits leaves it recorded in ZooKeeper: the
/// next controller finishes it once the new replica can catch up (here: broker 3's
/// partition directory, blocked by a file, is freed and broker 3 restarted).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_controller_finishes_a_reassignment_its_predecessor_started() {
    let _serial = serial().await;
    common::init_tracing();
    const TOPIC: &str = "handover";
    let mut cluster = four_brokers().await;
    create(&cluster, TOPIC, &[0, 1, 2]).await;
    let blocker = cluster.data_dir(3).join(format!("{TOPIC}-0"));
    std::fs::write(&blocker, b"not a directory").unwrap();
    let controller = cluster.wait_for_controller(&[], REACT).await.unwrap();
    let mut client = RawClient::connect(addr(&cluster, controller)).await.unwrap();
    let response: AlterPartitionReassignmentsResponse =
        client.call(ApiKey::AlterPartitionReassignments, 0, &alter(&[(TOPIC, 0, Some(&[1, 2, 3]))])).await.unwrap();
    assert_eq!(outcome(&response), (0, vec![(TOPIC.to_owned(), 0, 0)]));
    drop(client);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let waiting = cluster.assignment(TOPIC).await.unwrap().unwrap();
    assert_eq!(waiting.adding_replicas["0"], [3], "still waiting for broker 3: {waiting:?}");

    cluster.stop(controller).await.unwrap();
    let successor = cluster.wait_for_controller(&[controller], REACT).await.unwrap();
    tracing::info!(controller, successor, "the controller moved");
    if controller != 3 {
        cluster.start(controller).await.unwrap();
        cluster.stop(3).await.unwrap();
    }
    if blocker.is_file() {
        std::fs::remove_file(&blocker).unwrap();
    }
    cluster.start(3).await.unwrap();

    wait_for_assignment(&cluster, TOPIC, &[1, 2, 3]).await;
    let state = cluster.wait_for_isr(TOPIC, 0, &[1, 2, 3], REACT).await.unwrap();
    assert!([1, 2, 3].contains(&state.leader), "{state:?}");
    wait_until(REACT, "broker 0 drops its replica", || async {
        Ok((!cluster.data_dir(0).join(format!("{TOPIC}-0")).exists()).then_some(()))
    })
    .await
    .unwrap();
}
