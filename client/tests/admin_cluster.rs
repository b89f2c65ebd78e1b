//! The admin client across leader changes, on 3 brokers on a real ZooKeeper
//! (fjord-testkit): `Admin::list_offsets` asks the leader its metadata names; when that
//! broker is no longer the leader (it answers NOT_LEADER_OR_FOLLOWER) or is gone (its
//! connection breaks), the call refreshes the metadata and asks the new leader, well
//! before `metadata.max.age.ms` (5 min) would have refreshed it. A new leader that has
//! not yet learned the high watermark from its followers answers OFFSET_NOT_AVAILABLE
//! (not a stale offset), and the call waits that out too.

use std::time::Duration;

use fjord_client::{Acks, Admin, ClientConfig, OffsetSpec, Producer, ProducerConfig, ProducerRecord};
use fjord_testkit::Cluster;

const TOPIC: &str = "offsets";
const WAIT: Duration = Duration::from_secs(30);

async fn produce(client: &ClientConfig, n: usize) {
    let config = ProducerConfig { client: client.clone(), acks: Acks::All, ..ProducerConfig::default() };
    let producer = Producer::connect(config).await.unwrap();
    let mut acks = Vec::new();
    for i in 0..n {
        acks.push(producer.send(ProducerRecord::new(TOPIC, format!("m{i}")).partition(0)).await.unwrap());
    }
    for a in acks {
        a.await.unwrap();
    }
    producer.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_offsets_finds_the_new_leader_after_a_leader_change() {
    let mut cluster = Cluster::builder().brokers(3).config("replica.fetch.wait.max.ms", 50).start().await.unwrap();
    let client = ClientConfig { connect_timeout: Duration::from_secs(2), ..ClientConfig::new(&cluster.bootstrap()) };
    cluster.create_topic(TOPIC, 1, &[], WAIT).await.unwrap();
    let admin = Admin::connect(client.clone()).await.unwrap();
    produce(&client, 10).await;
    let latest = [(TOPIC.to_string(), 0, OffsetSpec::Latest)];
    // The admin's metadata now names the first leader.
    assert_eq!(admin.list_offsets(&latest).await.unwrap(), [10]);
    let first = cluster.leader(TOPIC, 0).await.unwrap().expect("a leader");

    // The first leader stops (the controller moves its leadership) and comes back as a
    // follower: asked as the leader, it answers NOT_LEADER_OR_FOLLOWER.
    cluster.stop(first).await.unwrap();
    cluster.start(first).await.unwrap();
    cluster.wait_fully_replicated(TOPIC, WAIT).await.unwrap();
    let second = cluster.leader(TOPIC, 0).await.unwrap().expect("a leader");
    assert_ne!(second, first, "nothing moves a leadership back to a returning broker");
    assert_eq!(admin.list_offsets(&latest).await.unwrap(), [10], "asked of broker {first}, a follower now");

    // The second leader stops and stays down: its connection is gone.
    produce(&client, 5).await;
    cluster.stop(second).await.unwrap();
    let third =
        cluster.wait_for_state(TOPIC, 0, WAIT, "a new leader", |s| s.leader >= 0 && s.leader != second).await.unwrap().leader;
    let earliest = [(TOPIC.to_string(), 0, OffsetSpec::Earliest)];
    assert_eq!(admin.list_offsets(&earliest).await.unwrap(), [0], "asked of broker {second}, stopped; {third} leads");
    assert_eq!(admin.list_offsets(&latest).await.unwrap(), [15]);
}
