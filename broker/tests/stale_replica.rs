//! A topic deleted and created again while one of its replicas is down (issue #22, topic
//! ids / KIP-516): three brokers on a real ZooKeeper.
//!
//! Topic T (one partition on every broker) gets records A; broker X stops; T is deleted
//! and created again (a new topic id) and gets records B; X starts with its old log of A
//! still on disk and its `partition.metadata` naming the old id. Asserted:
//! - X stops serving the old log: once back in the ISR its log holds exactly the leader's
//!   bytes (B at B's offsets), no byte of A, and its `partition.metadata` names the new id;
//!   the old log is moved aside whole (`T-0-orphan-<ms>`, A's bytes kept for an operator),
//!   never deleted: a store that lost its ids would otherwise cost every log;
//! - a consumer from the beginning reads B only, from X alone as well;
//! - a missing `partition.metadata` (a log written before topic ids) is adopted: the id is
//!   written again and every record kept;
//! - a garbled one is damage: X does not serve the partition, publishes it offline, and
//!   leaves its directory untouched.
//!
//! How X becomes a replica of the new T while down: in-process brokers deregister when
//! they stop, and a manual assignment must name live brokers, so T is created again on
//! the two live brokers and the test then writes T's assignment node with X added (keeping
//! the id), which is what a reassignment adding X writes. X then starts as a replica of a
//! topic whose id differs from its log's, which is the case the broker has to handle.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use fjord_client::{Acks, Admin, ClientConfig, NewTopic, Producer, ProducerConfig, ProducerRecord};
use fjord_coord::paths;
use fjord_coord::registry::{read_json, to_json, TopicAssignment};
use fjord_log::partition_metadata::{self, PARTITION_METADATA};
use fjord_testkit::{read_values, wait_until, Cluster};

const REACT: Duration = Duration::from_secs(30);
const TOPIC: &str = "reborn";

async fn produce(client: &ClientConfig, values: &[String]) {
    let producer =
        Producer::connect(ProducerConfig { client: client.clone(), acks: Acks::All, ..ProducerConfig::default() }).await.unwrap();
    for value in values {
        producer.send(ProducerRecord::new(TOPIC, value.clone()).partition(0)).await.unwrap().await.unwrap();
    }
}

fn partition_dir(cluster: &Cluster, id: i32) -> PathBuf {
    cluster.data_dir(id).join(format!("{TOPIC}-0"))
}

/// The topic id in the store, in Kafka's text form.
async fn stored_id(cluster: &Cluster) -> String {
    cluster.assignment(TOPIC).await.unwrap().unwrap().topic_id.expect("topics have ids")
}

fn recorded_id(dir: &Path) -> String {
    let text = std::fs::read_to_string(dir.join(PARTITION_METADATA)).unwrap();
    let id = partition_metadata::parse(text.as_bytes()).unwrap();
    assert_eq!(text, partition_metadata::format(&id), "Kafka's text");
    text.rsplit(' ').next().unwrap().to_owned()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Every file of a directory with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .map(|e| (e.file_name().into_string().unwrap(), std::fs::read(e.path()).unwrap()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_returning_to_a_recreated_topic_sets_its_old_log_aside() {
    common::init_tracing();
    let mut cluster = Cluster::builder().brokers(3).config("replica.fetch.wait.max.ms", 100).start().await.unwrap();
    cluster.create_topic(TOPIC, 1, &[], REACT).await.unwrap();
    let client = cluster.client_config();
    let old: Vec<String> = (0..50).map(|i| format!("old-record-{i:03}")).collect();
    produce(&client, &old).await;
    cluster.wait_fully_replicated(TOPIC, REACT).await.unwrap();
    let old_id = stored_id(&cluster).await;
    let leader = cluster.leader(TOPIC, 0).await.unwrap().unwrap();
    // X: a follower, and not the controller if another follower can be picked (fewer
    // moving parts while it is down).
    let controller = cluster.controller().await.unwrap();
    let mut followers: Vec<i32> = cluster.ids().into_iter().filter(|&id| id != leader).collect();
    followers.sort_by_key(|&id| Some(id) == controller);
    let x = followers[0];
    assert_eq!(recorded_id(&partition_dir(&cluster, x)), old_id, "every replica records its topic's id");
    assert!(contains(&cluster.log_bytes(x, TOPIC, 0).unwrap(), b"old-record-049"));

    cluster.stop(x).await.unwrap();
    let admin = Admin::connect(client.clone()).await.unwrap();
    admin.delete_topics(&[TOPIC.to_owned()]).await.unwrap();
    wait_until(REACT, "the topic gone from the store", || async { Ok(cluster.assignment(TOPIC).await?.is_none().then_some(())) })
        .await
        .unwrap();
    let mut new = NewTopic::new(TOPIC, 1);
    new.replication_factor = 2;
    wait_until(REACT, "the topic created again", || async { Ok(admin.create_topics(std::slice::from_ref(&new)).await.ok()) })
        .await
        .unwrap();
    cluster.wait_fully_replicated(TOPIC, REACT).await.unwrap();
    let new_id = stored_id(&cluster).await;
    assert_ne!(new_id, old_id, "a topic created again has a new id");
    let fresh: Vec<String> = (0..20).map(|i| format!("new-record-{i:03}")).collect();
    produce(&client, &fresh).await;

    // X becomes a replica of the new topic while it is down (see the module docs).
    let path = paths::topic(TOPIC);
    let (mut assignment, stat) = read_json::<TopicAssignment>(&**cluster.store(), &path).await.unwrap().unwrap();
    let replicas = assignment.partitions.get_mut("0").unwrap();
    assert!(!replicas.contains(&x), "{replicas:?}");
    replicas.push(x);
    let all = replicas.clone();
    cluster.store().set(&path, &to_json(&assignment), Some(stat.version)).await.unwrap();
    assert_eq!(recorded_id(&partition_dir(&cluster, x)), old_id, "X's old log is still on disk");
    // A leader tracks the followers named when its term starts, not ones added to the
    // assignment during it (reassignment is not built yet): a new term on the other live
    // broker makes the leader of the new topic follow X's progress.
    let first = cluster.leader(TOPIC, 0).await.unwrap().unwrap();
    cluster.stop(first).await.unwrap();
    cluster.wait_for_state(TOPIC, 0, REACT, "another leader", |s| s.leader >= 0 && s.leader != first).await.unwrap();
    cluster.start(first).await.unwrap();

    cluster.start(x).await.unwrap();
    let state = cluster.wait_for_isr(TOPIC, 0, &all, REACT).await.unwrap();
    let new_leader = state.leader;
    assert_ne!(new_leader, x);
    let dir = partition_dir(&cluster, x);
    assert_eq!(recorded_id(&dir), new_id, "X records the new topic's id");
    let leader_bytes = cluster.log_bytes(new_leader, TOPIC, 0).unwrap();
    wait_until(REACT, "X's log to equal the leader's", || async {
        Ok((cluster.log_bytes(x, TOPIC, 0)? == leader_bytes).then_some(()))
    })
    .await
    .unwrap();
    let x_bytes = cluster.log_bytes(x, TOPIC, 0).unwrap();
    assert!(contains(&x_bytes, b"new-record-019"), "X holds B");
    assert!(!contains(&x_bytes, b"old-record"), "X holds nothing of A");
    let leftovers: Vec<_> = std::fs::read_dir(cluster.data_dir(x))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with(TOPIC) && n != &format!("{TOPIC}-0"))
        .collect();
    assert_eq!(leftovers.len(), 1, "the stale log is moved aside once: {leftovers:?}");
    assert!(leftovers[0].starts_with(&format!("{TOPIC}-0-orphan-")), "{leftovers:?}");
    let aside: Vec<u8> = snapshot(&cluster.data_dir(x).join(&leftovers[0]))
        .into_iter()
        .filter(|(name, _)| name.ends_with(".log"))
        .flat_map(|(_, bytes)| bytes)
        .collect();
    assert!(contains(&aside, b"old-record-049"), "A's records are kept aside, not deleted");
    assert_eq!(read_values(&client, TOPIC, 0).await.unwrap(), fresh, "consumers from the beginning see B only");
    assert_eq!(read_values(&ClientConfig::new(&cluster.addr(x)), TOPIC, 0).await.unwrap(), fresh, "through X too");

    // A log written before topic ids (no file): adopted, nothing deleted.
    cluster.stop(x).await.unwrap();
    std::fs::remove_file(dir.join(PARTITION_METADATA)).unwrap();
    cluster.start(x).await.unwrap();
    wait_until(REACT, "X to record the id again", || async { Ok(dir.join(PARTITION_METADATA).exists().then_some(())) })
        .await
        .unwrap();
    assert_eq!(recorded_id(&dir), new_id);
    cluster.wait_for_isr(TOPIC, 0, &all, REACT).await.unwrap();
    assert_eq!(cluster.log_bytes(x, TOPIC, 0).unwrap(), x_bytes, "every record kept");

    // A garbled file: damage. Not served, published offline, nothing in the directory changed.
    cluster.stop(x).await.unwrap();
    std::fs::write(dir.join(PARTITION_METADATA), "version: 0\ntopic_id: not-an-id").unwrap();
    let before = snapshot(&dir);
    cluster.start(x).await.unwrap();
    let offline = paths::offline_replicas(x);
    wait_until(REACT, "X to publish its replica offline", || async { Ok(cluster.store().exists(&offline).await?.map(|_| ())) })
        .await
        .unwrap();
    let (published, _) = cluster.store().get(&offline).await.unwrap().unwrap();
    let published = String::from_utf8_lossy(&published);
    assert!(published.contains(&format!("\"topic\":\"{TOPIC}\"")) && published.contains("\"offline\""), "{published}");
    let state = cluster.wait_for_state(TOPIC, 0, REACT, "X out of the ISR", |s| !s.isr.contains(&x)).await.unwrap();
    assert_ne!(state.leader, x, "{state:?}");
    assert_eq!(snapshot(&dir), before, "nothing in the damaged partition's directory changed");
    assert_eq!(read_values(&client, TOPIC, 0).await.unwrap(), fresh, "the healthy replicas go on serving B");
}
