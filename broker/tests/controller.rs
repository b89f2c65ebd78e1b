//! Cluster mode on a real ZooKeeper with several in-process brokers: replica placement,
//! Metadata listing every broker, leader election when a broker stops, controller
//! failover, and the errors of a topic the cluster cannot hold.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{produce_request, topic_name, RawClient, TestBroker};
use fjord_record::BatchBuilder;
use kafka_protocol::messages::create_topics_request::{CreatableReplicaAssignment, CreatableTopic};
use kafka_protocol::messages::metadata_response::MetadataResponseTopic;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

const LEADER_NOT_AVAILABLE: i16 = 5;
const NOT_LEADER_OR_FOLLOWER: i16 = 6;
const INVALID_REPLICATION_FACTOR: i16 = 38;
const INVALID_REPLICA_ASSIGNMENT: i16 = 39;
const WAIT: Duration = Duration::from_secs(30);

/// N brokers (ids 1..=N) on one ZooKeeper chroot, each with its own data dir.
struct Cluster {
    connect: String,
    dir: tempfile::TempDir,
    brokers: BTreeMap<i32, TestBroker>,
}

impl Cluster {
    async fn start(zk: &fjord_testkit::ZooKeeper, chroot: &str, n: i32, configure: fn(&mut fjord_broker::BrokerConfig)) -> Self {
        let mut cluster = Cluster {
            connect: format!("{}/{chroot}", zk.connect_string()),
            dir: tempfile::tempdir().unwrap(),
            brokers: BTreeMap::new(),
        };
        for id in 1..=n {
            cluster.start_broker(id, configure).await;
        }
        // A broker is started once its listener is bound, before it has registered: wait
        // until broker 1 sees every broker live, so a creation spread over all of them
        // does not race the registrations (INVALID_REPLICATION_FACTOR).
        let mut client = cluster.client(1).await;
        metadata_until(&mut client, Some(&[]), &format!("{n} live brokers"), |r| (r.brokers.len() == n as usize).then_some(()))
            .await;
        cluster
    }

    async fn start_broker(&mut self, id: i32, configure: fn(&mut fjord_broker::BrokerConfig)) {
        let connect = self.connect.clone();
        let broker = TestBroker::start_in(self.dir.path().join(format!("broker-{id}")), |c| {
            c.broker_id = id;
            c.zookeeper_connect = Some(connect);
            c.auto_create_topics = false;
            configure(c);
        })
        .await
        .unwrap();
        self.brokers.insert(id, broker);
    }

    async fn stop_broker(&mut self, id: i32) {
        self.brokers.remove(&id).unwrap().stop().await.unwrap();
    }

    async fn client(&self, id: i32) -> RawClient {
        RawClient::connect(self.brokers[&id].addr).await.unwrap()
    }

    async fn stop(self) {
        for (_, broker) in self.brokers {
            broker.stop().await.unwrap();
        }
    }
}

async fn metadata(client: &mut RawClient, topics: Option<&[&str]>) -> MetadataResponse {
    let request = MetadataRequest::default().with_topics(topics.map(|names| {
        names.iter().map(|n| metadata_request::MetadataRequestTopic::default().with_name(Some(topic_name(n)))).collect()
    }));
    client.call(ApiKey::Metadata, 12, &request).await.unwrap()
}

async fn create(client: &mut RawClient, topic: CreatableTopic) -> (i16, Option<String>) {
    let request = CreateTopicsRequest::default().with_timeout_ms(10_000).with_topics(vec![topic]);
    let response: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 7, &request).await.unwrap();
    let result = &response.topics[0];
    (result.error_code, result.error_message.as_ref().map(|m| m.to_string()))
}

fn spread(topic: &str, partitions: i32, replication_factor: i16) -> CreatableTopic {
    CreatableTopic::default()
        .with_name(topic_name(topic))
        .with_num_partitions(partitions)
        .with_replication_factor(replication_factor)
}

async fn produce(client: &mut RawClient, topic: &str, partition: i32, value: &str) -> (i16, i64) {
    let mut builder = BatchBuilder::new(1_700_000_000_000);
    builder.append(1_700_000_000_000, None, Some(value.as_bytes()), &[]);
    client.produce(9, &produce_request(topic, partition, 1, 5000, builder.build())).await
}

/// (leader, leader epoch, replicas, isr, offline, error) of each partition.
type PartitionRow = (i32, i32, Vec<i32>, Vec<i32>, Vec<i32>, i16);

fn partitions(topic: &MetadataResponseTopic) -> Vec<PartitionRow> {
    let ids = |v: &[BrokerId]| v.iter().map(|b| b.0).collect::<Vec<_>>();
    let mut rows: Vec<_> = topic.partitions.iter().map(|p| (p.partition_index, p)).collect();
    rows.sort_by_key(|(i, _)| *i);
    rows.into_iter()
        .map(|(_, p)| {
            (p.leader_id.0, p.leader_epoch, ids(&p.replica_nodes), ids(&p.isr_nodes), ids(&p.offline_replicas), p.error_code)
        })
        .collect()
}

/// Asks `client` for Metadata of `topics` every 100 ms until `check` returns `Some`, at most `WAIT`.
async fn metadata_until<T>(
    client: &mut RawClient,
    topics: Option<&[&str]>,
    what: &str,
    mut check: impl FnMut(&MetadataResponse) -> Option<T>,
) -> T {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let response = metadata(client, topics).await;
        if let Some(value) = check(&response) {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}; last answer: {response:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placement_metadata_and_replication_factor_errors() {
    let zk = fjord_testkit::ZooKeeper::start().unwrap();
    // Racks: broker 2 alone on rack "b".
    let cluster =
        Cluster::start(&zk, "placement", 3, |c| c.broker_rack = Some(if c.broker_id == 2 { "b" } else { "a" }.into())).await;
    let mut client = cluster.client(1).await;
    assert_eq!(create(&mut client, spread("spread", 6, 3)).await.0, 0);

    // Any broker answers for the whole cluster, once its view has the topic.
    let mut other = cluster.client(3).await;
    let response = metadata_until(&mut other, None, "broker 3 to see the topic", |response| {
        (response.topics.len() == 1 && partitions(&response.topics[0]).iter().all(|p| p.5 == 0)).then(|| response.clone())
    })
    .await;
    let brokers: Vec<(i32, u16, Option<&str>)> =
        response.brokers.iter().map(|b| (b.node_id.0, b.port as u16, b.rack.as_deref())).collect();
    let rack = |id: i32| Some(if id == 2 { "b" } else { "a" });
    let expected: Vec<(i32, u16, Option<&str>)> = cluster.brokers.iter().map(|(id, b)| (*id, b.addr.port(), rack(*id))).collect();
    assert_eq!(brokers, expected);
    assert!((1..=3).contains(&response.controller_id.0), "controller {:?}", response.controller_id);
    let rows = partitions(&response.topics[0]);
    assert_eq!(rows.len(), 6);
    let mut leaders = BTreeMap::new();
    for (leader, epoch, replicas, isr, offline, error) in &rows {
        let mut sorted = replicas.clone();
        sorted.sort();
        assert_eq!(sorted, [1, 2, 3], "{rows:?}");
        assert_eq!((leader, epoch, isr, offline.len(), *error), (&replicas[0], &0, replicas, 0, 0), "{rows:?}");
        *leaders.entry(*leader).or_insert(0) += 1;
    }
    assert_eq!(leaders, BTreeMap::from([(1, 2), (2, 2), (3, 2)]), "leaders are spread: {rows:?}");

    // The leader takes the write; another broker sends the client to it.
    let (leader, follower) = (rows[0].0, rows[0].2[1]);
    assert_eq!(produce(&mut cluster.client(leader).await, "spread", 0, "x").await, (0, 0));
    assert_eq!(produce(&mut cluster.client(follower).await, "spread", 0, "y").await.0, NOT_LEADER_OR_FOLLOWER);

    // Rack-aware: with two replicas, every partition has one on each rack.
    assert_eq!(create(&mut client, spread("racked", 6, 2)).await.0, 0);
    let response = metadata(&mut client, Some(&["racked"])).await;
    for (_, _, replicas, ..) in partitions(&response.topics[0]) {
        assert!(replicas.contains(&2), "rack b's only broker is in every partition: {replicas:?}");
    }

    // More replicas than live brokers.
    let (code, message) = create(&mut client, spread("too-wide", 2, 4)).await;
    assert_eq!(code, INVALID_REPLICATION_FACTOR, "{message:?}");
    assert!(message.unwrap().contains("3 live brokers"));
    // A manual assignment naming a broker that does not exist.
    let manual = CreatableTopic::default()
        .with_name(topic_name("manual"))
        .with_num_partitions(-1)
        .with_replication_factor(-1)
        .with_assignments(vec![CreatableReplicaAssignment::default()
            .with_partition_index(0)
            .with_broker_ids(vec![BrokerId(1), BrokerId(9)])]);
    assert_eq!(create(&mut client, manual.clone()).await.0, INVALID_REPLICA_ASSIGNMENT);
    // A valid one is taken as given.
    let manual = manual.with_assignments(vec![
        CreatableReplicaAssignment::default().with_partition_index(0).with_broker_ids(vec![BrokerId(3), BrokerId(1)]),
        CreatableReplicaAssignment::default().with_partition_index(1).with_broker_ids(vec![BrokerId(2), BrokerId(3)]),
    ]);
    assert_eq!(create(&mut client, manual).await.0, 0);
    let response = metadata(&mut client, Some(&["manual", "too-wide"])).await;
    let rows = partitions(&response.topics[0]);
    assert_eq!(rows.iter().map(|r| (r.0, r.2.clone())).collect::<Vec<_>>(), [(3, vec![3, 1]), (2, vec![2, 3])]);
    assert_eq!(response.topics[1].error_code, 3, "never created");
    // Replica directories exist exactly on the assigned brokers.
    assert!(cluster.brokers[&3].data_dir.join("manual-0").exists());
    assert!(cluster.brokers[&1].data_dir.join("manual-0").exists());
    assert!(!cluster.brokers[&2].data_dir.join("manual-0").exists());

    // Deleted through one broker: every broker drops its replicas' logs.
    let delete = DeleteTopicsRequest::default().with_topic_names(vec![topic_name("manual")]);
    let response: DeleteTopicsResponse = client.call(ApiKey::DeleteTopics, 4, &delete).await.unwrap();
    assert_eq!(response.responses[0].error_code, 0);
    assert!(!cluster.brokers[&1].data_dir.join("manual-0").exists(), "the deleting broker answers once its logs are gone");
    metadata_until(&mut other, Some(&["manual"]), "broker 3 to drop the topic", |r| (r.topics[0].error_code == 3).then_some(()))
        .await;
    assert!(!cluster.brokers[&3].data_dir.join("manual-0").exists());
    assert!(!cluster.brokers[&3].data_dir.join("manual-1").exists());
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaders_move_when_a_broker_stops_and_the_controller_fails_over() {
    let zk = fjord_testkit::ZooKeeper::start().unwrap();
    // No controlled shutdown: a stopping broker just disappears, as a crashed one does.
    let mut cluster = Cluster::start(&zk, "failover", 3, |c| c.controlled_shutdown = false).await;
    let mut client = cluster.client(1).await;
    assert_eq!(create(&mut client, spread("moving", 3, 3)).await.0, 0);
    let before = metadata(&mut client, Some(&["moving"])).await;
    let controller = before.controller_id.0;
    let rows_before = partitions(&before.topics[0]);

    // Stop the controller's broker: another broker becomes controller and moves the
    // leaderships of the stopped one to the next ISR member, with a new epoch.
    cluster.stop_broker(controller).await;
    let survivor = *cluster.brokers.keys().next().unwrap();
    let mut client = cluster.client(survivor).await;
    let after = metadata_until(&mut client, Some(&["moving"]), "a new controller and new leaders", |response| {
        let rows = partitions(&response.topics[0]);
        let settled = response.controller_id.0 != controller
            && response.controller_id.0 != -1
            && rows.iter().all(|r| r.0 != controller && r.0 != -1 && !r.3.contains(&controller));
        settled.then(|| response.clone())
    })
    .await;
    assert_eq!(after.brokers.len(), 2);
    for (old, new) in rows_before.iter().zip(partitions(&after.topics[0])) {
        assert_eq!(new.2, old.2, "the assignment does not change");
        assert_eq!(new.4, vec![controller], "the stopped broker is an offline replica");
        if old.0 == controller {
            let expected_leader = *old.2.iter().find(|b| **b != controller).unwrap();
            assert_eq!((new.0, new.1), (expected_leader, old.1 + 1), "next replica in the ISR leads, epoch + 1");
        } else {
            assert_eq!((new.0, new.1), (old.0, old.1), "untouched leadership keeps its epoch");
        }
    }

    // The new controller serves topic creation too.
    assert_eq!(create(&mut client, spread("after-failover", 2, 2)).await.0, 0);
    // The stopped broker comes back and is listed again.
    cluster.start_broker(controller, |c| c.controlled_shutdown = false).await;
    metadata_until(&mut client, None, "the restarted broker in Metadata", |r| (r.brokers.len() == 3).then_some(())).await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_without_live_isr_is_offline_until_its_replica_returns() {
    let zk = fjord_testkit::ZooKeeper::start().unwrap();
    let mut cluster = Cluster::start(&zk, "offline", 2, |_| {}).await;
    let mut client = cluster.client(1).await;
    let manual = CreatableTopic::default()
        .with_name(topic_name("alone"))
        .with_num_partitions(-1)
        .with_replication_factor(-1)
        .with_assignments(vec![CreatableReplicaAssignment::default().with_partition_index(0).with_broker_ids(vec![BrokerId(2)])]);
    assert_eq!(create(&mut client, manual).await.0, 0);
    let mut leader = cluster.client(2).await;
    metadata_until(&mut leader, Some(&["alone"]), "broker 2 to lead", |r| (partitions(&r.topics[0])[0].0 == 2).then_some(()))
        .await;
    assert_eq!(produce(&mut leader, "alone", 0, "kept").await, (0, 0));

    // Broker 2 stops (controlled: it waits for the controller to take its leadership).
    cluster.stop_broker(2).await;
    let rows = metadata_until(&mut client, Some(&["alone"]), "the partition offline", |r| {
        let rows = partitions(&r.topics[0]);
        (rows[0].0 == -1).then_some(rows)
    })
    .await;
    assert_eq!(rows[0], (-1, 1, vec![2], vec![2], vec![2], LEADER_NOT_AVAILABLE), "offline, ISR kept");

    // No unclean election: it comes back only with broker 2, which still has the record.
    cluster.start_broker(2, |_| {}).await;
    let rows = metadata_until(&mut client, Some(&["alone"]), "broker 2 leading again", |r| {
        let rows = partitions(&r.topics[0]);
        (rows[0].0 == 2).then_some(rows)
    })
    .await;
    assert_eq!(rows[0], (2, 2, vec![2], vec![2], vec![], 0));
    let mut leader = cluster.client(2).await;
    metadata_until(&mut leader, Some(&["alone"]), "broker 2 to lead", |r| (partitions(&r.topics[0])[0].0 == 2).then_some(()))
        .await;
    assert_eq!(produce(&mut leader, "alone", 0, "more").await, (0, 1), "the log survived");

    // Deleted while broker 2 is down: its log goes when it comes back.
    cluster.stop_broker(2).await;
    assert_eq!(delete(&mut client, "alone").await, 0);
    cluster.start_broker(2, |_| {}).await;
    metadata(&mut cluster.client(2).await, None).await; // answered once it has started
    assert!(!cluster.brokers[&2].data_dir.join("alone-0").exists(), "stray log deleted at start");

    // Deleted and created again at once: broker 2 starts the new topic from an empty log.
    let on_two = |topic: &str| {
        CreatableTopic::default()
            .with_name(topic_name(topic))
            .with_num_partitions(-1)
            .with_replication_factor(-1)
            .with_assignments(vec![CreatableReplicaAssignment::default()
                .with_partition_index(0)
                .with_broker_ids(vec![BrokerId(2)])])
    };
    assert_eq!(create(&mut client, on_two("again")).await.0, 0);
    let mut leader = cluster.client(2).await;
    metadata_until(&mut leader, Some(&["again"]), "broker 2 to lead", |r| (partitions(&r.topics[0])[0].0 == 2).then_some(()))
        .await;
    assert_eq!(produce(&mut leader, "again", 0, "old").await, (0, 0));
    assert_eq!(delete(&mut client, "again").await, 0);
    assert_eq!(create(&mut client, on_two("again")).await.0, 0);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let latest = leader.latest_offset("again").await;
        if latest == (0, 0) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "broker 2 still serves the old topic: {latest:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.stop().await;
}

async fn delete(client: &mut RawClient, topic: &str) -> i16 {
    let request = DeleteTopicsRequest::default().with_topic_names(vec![topic_name(topic)]);
    let response: DeleteTopicsResponse = client.call(ApiKey::DeleteTopics, 4, &request).await.unwrap();
    response.responses[0].error_code
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_that_finds_a_newer_epoch_steps_down_and_competes_again() {
    use fjord_coord::registry::{read_json, PartitionState};
    use fjord_coord::{paths, MetadataStore};
    let zk = fjord_testkit::ZooKeeper::start().unwrap();
    // No controlled shutdown: the stopping broker's own controller task ends before it
    // leaves, so only the fenced controller competes afterwards.
    let mut cluster = Cluster::start(&zk, "fencing", 2, |c| c.controlled_shutdown = false).await;
    let store = fjord_coord::open(Some(&cluster.connect), &cluster.dir.path().join("observer")).await.unwrap();
    async fn epoch(store: &dyn MetadataStore) -> Option<i32> {
        read_json::<i32>(store, paths::CONTROLLER_EPOCH).await.unwrap().map(|(e, _)| e)
    }
    let mut client = cluster.client(1).await;
    let controller =
        metadata_until(&mut client, None, "a controller", |r| (r.controller_id.0 > 0).then_some(r.controller_id.0)).await;
    let other = 3 - controller;
    let before = epoch(&*store).await.unwrap();
    let manual = CreatableTopic::default()
        .with_name(topic_name("fenced"))
        .with_num_partitions(-1)
        .with_replication_factor(-1)
        .with_assignments(vec![CreatableReplicaAssignment::default()
            .with_partition_index(0)
            .with_broker_ids(vec![BrokerId(other), BrokerId(controller)])]);
    assert_eq!(create(&mut client, manual).await.0, 0);

    // A newer controller epoch appears (as if another controller had been elected): the
    // controller finds it at its next pass (broker `other` leaving), steps down without
    // writing, and wins again with an epoch above it.
    store.set(paths::CONTROLLER_EPOCH, (before + 5).to_string().as_bytes(), None).await.unwrap();
    cluster.stop_broker(other).await;
    let state_path = paths::partition_state("fenced", 0);
    let deadline = tokio::time::Instant::now() + WAIT;
    let state = loop {
        let (state, _) = read_json::<PartitionState>(&*store, &state_path).await.unwrap().unwrap();
        if state.leader == controller {
            break state;
        }
        assert!(tokio::time::Instant::now() < deadline, "no new leader: {state:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let now = epoch(&*store).await.unwrap();
    assert_eq!(now, before + 6, "re-elected once, above the newer epoch");
    assert_eq!((state.leader_epoch, state.isr, state.controller_epoch), (1, vec![controller], now), "written by the new epoch");
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controlled_shutdown_hands_leadership_over_and_unclean_election_is_opt_in() {
    use fjord_coord::registry::{read_json, PartitionState};
    use fjord_coord::{paths, MetadataStore};
    let zk = fjord_testkit::ZooKeeper::start().unwrap();
    let mut cluster = Cluster::start(&zk, "handover", 3, |_| {}).await;
    let store = fjord_coord::open(Some(&cluster.connect), &cluster.dir.path().join("observer")).await.unwrap();
    async fn state(store: &dyn MetadataStore, topic: &str) -> (PartitionState, i32) {
        let (state, stat) = read_json::<PartitionState>(store, &paths::partition_state(topic, 0)).await.unwrap().unwrap();
        (state, stat.version)
    }
    let on = |topic: &str, replicas: &[i32], unclean: Option<&str>| {
        let configs = unclean.map(|v| {
            vec![create_topics_request::CreatableTopicConfig::default()
                .with_name(StrBytes::from_static_str("unclean.leader.election.enable"))
                .with_value(Some(StrBytes::from_string(v.into())))]
        });
        CreatableTopic::default()
            .with_name(topic_name(topic))
            .with_num_partitions(-1)
            .with_replication_factor(-1)
            .with_configs(configs.unwrap_or_default())
            .with_assignments(vec![CreatableReplicaAssignment::default()
                .with_partition_index(0)
                .with_broker_ids(replicas.iter().copied().map(BrokerId).collect())])
    };
    let mut client = cluster.client(3).await;
    assert_eq!(create(&mut client, on("handed", &[1, 2], None)).await.0, 0);
    assert_eq!(create(&mut client, on("clean", &[2, 1], None)).await.0, 0);
    assert_eq!(create(&mut client, on("unclean", &[2, 1], Some("true"))).await.0, 0);
    assert_eq!(create(&mut client, on("bad", &[2, 1], Some("maybe"))).await.0, 40, "INVALID_CONFIG");

    // Controlled shutdown: by the time broker 1 has stopped, broker 2 leads its partition.
    cluster.stop_broker(1).await;
    let (handed, _) = state(&*store, "handed").await;
    assert_eq!((handed.leader, handed.leader_epoch, handed.isr), (2, 1, vec![2]), "moved before broker 1 exited");

    // Broker 1 left the ISR of "clean" and "unclean" when it stopped; then their leader,
    // 2, goes too: both offline. When broker 1 returns, out of sync, only the topic that
    // allows it elects broker 1.
    for topic in ["clean", "unclean"] {
        assert_eq!(state(&*store, topic).await.0.isr, vec![2], "{topic}");
    }
    cluster.stop_broker(2).await;
    for topic in ["clean", "unclean"] {
        let (offline, _) = state(&*store, topic).await;
        assert_eq!((offline.leader, offline.leader_epoch, offline.isr), (-1, 1, vec![2]), "{topic}");
    }
    cluster.start_broker(1, |_| {}).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    let unclean = loop {
        let (unclean, _) = state(&*store, "unclean").await;
        if unclean.leader != -1 {
            break unclean;
        }
        assert!(tokio::time::Instant::now() < deadline, "no unclean election");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!((unclean.leader, unclean.leader_epoch, unclean.isr), (1, 2, vec![1]), "unclean election allowed by the topic");
    let (clean, _) = state(&*store, "clean").await;
    assert_eq!((clean.leader, clean.leader_epoch, clean.isr), (-1, 1, vec![2]), "still offline: no unclean election");
    cluster.stop().await;
}
