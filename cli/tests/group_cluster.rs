//! The group consumer against 3 `fjord broker` processes on a real ZooKeeper
//! (fjord-testkit): the group's coordinator broker is killed (SIGKILL), another broker takes the
//! `/consumers/<group>/coordinator` node, and the members rejoin and resume from the
//! committed offsets: nothing skipped, re-reads only of what was not committed. The
//! same move with a group of KafkaJS members.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fjord_client::{Acks, ClientConfig, GroupConfig, GroupConsumer, OffsetReset, Producer, ProducerConfig};
use fjord_coord::paths;
use fjord_testkit::{produce_round, wait_until, Cluster};

const TOPIC: &str = "events";
const PARTITIONS: i32 = 6;
const GROUP: &str = "g";
const WAIT: Duration = Duration::from_secs(30);

/// The broker named by `group`'s coordinator node, if any.
async fn coordinator_of(cluster: &Cluster, group: &str) -> anyhow::Result<Option<i32>> {
    let Some((data, _)) = cluster.store().get(&paths::group_coordinator(group)).await? else { return Ok(None) };
    let holder: serde_json::Value = serde_json::from_slice(&data)?;
    Ok(holder["broker_id"].as_i64().map(|id| id as i32))
}

/// Three broker processes that rebalance groups without delay, [`TOPIC`] on them, a
/// client config for them and an acks=all producer.
async fn three_brokers_with_the_topic() -> (Cluster, ClientConfig, Producer) {
    let cluster = Cluster::builder()
        .brokers(3)
        .processes(env!("CARGO_BIN_EXE_fjord"))
        .config("group.initial.rebalance.delay.ms", 100)
        .config("group.min.session.timeout.ms", 1000)
        .start()
        .await
        .unwrap();
    let client = ClientConfig { connect_timeout: Duration::from_secs(2), ..ClientConfig::new(&cluster.bootstrap()) };
    cluster.create_topic(TOPIC, PARTITIONS, &[], WAIT).await.unwrap();
    let producer = Producer::connect(ProducerConfig {
        client: client.clone(),
        acks: Acks::All,
        delivery_timeout: Duration::from_secs(20),
        ..ProducerConfig::default()
    })
    .await
    .unwrap();
    (cluster, client, producer)
}

/// (partition, offset) → how many times the group consumed it.
type Seen = Arc<Mutex<HashMap<(i32, i64), usize>>>;

async fn wait_consumed(seen: &Seen, n: usize, what: &str) {
    wait_until(WAIT, what, || async { Ok((seen.lock().unwrap().len() >= n).then_some(())) }).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_group_moves_to_a_new_coordinator_and_resumes_from_committed_offsets() {
    let (mut cluster, client, producer) = three_brokers_with_the_topic().await;
    produce_round(&producer, TOPIC, PARTITIONS, 20, 0).await.unwrap();

    let seen: Seen = Arc::default();
    let commit = Arc::new(AtomicBool::new(true));
    let stop = Arc::new(AtomicBool::new(false));
    // Per partition, the highest offset a member's successful commit covered.
    let committed_max: Arc<Mutex<HashMap<i32, i64>>> = Arc::default();
    // Records read again although a commit already covered them: must stay empty.
    let rereads: Arc<Mutex<Vec<(i32, i64)>>> = Arc::default();
    let mut members = Vec::new();
    for _ in 0..2 {
        let mut config = GroupConfig::new(&cluster.bootstrap(), GROUP);
        config.consumer.client.connect_timeout = Duration::from_secs(2);
        config.consumer.auto_offset_reset = OffsetReset::Earliest;
        config.consumer.fetch_max_wait = Duration::from_millis(100);
        config.session_timeout = Duration::from_secs(3);
        config.heartbeat_interval = Duration::from_millis(300);
        config.enable_auto_commit = false;
        let (seen, commit, stop, committed_max, rereads) =
            (seen.clone(), commit.clone(), stop.clone(), committed_max.clone(), rereads.clone());
        members.push(tokio::spawn(async move {
            let mut c = GroupConsumer::subscribe(config, &[TOPIC]).await.unwrap();
            let mut errors = Vec::new();
            // What this member would commit: per owned partition, the next offset after its last read.
            // The eager protocol gives up every partition on a rejoin (and the client forgets
            // their positions): a new generation starts from an empty map. The member id is
            // part of it: a new coordinator numbers the generations from 1 again.
            let mut position: HashMap<i32, i64> = HashMap::new();
            let mut generation = (-1, String::new());
            while !stop.load(Ordering::Acquire) {
                let polled = c.poll(Duration::from_millis(100)).await;
                if (c.generation(), c.member_id()) != generation {
                    generation = (c.generation(), c.member_id());
                    position.clear();
                }
                match polled {
                    Ok(records) => {
                        let mut s = seen.lock().unwrap();
                        let committed = committed_max.lock().unwrap();
                        for r in records {
                            let n = s.entry((r.partition, r.offset)).or_default();
                            *n += 1;
                            if *n > 1 && r.offset < committed.get(&r.partition).copied().unwrap_or(0) {
                                rereads.lock().unwrap().push((r.partition, r.offset));
                            }
                            position.insert(r.partition, r.offset + 1);
                        }
                    }
                    Err(e) => errors.push(format!("poll: {e}")),
                }
                let owned: BTreeSet<i32> = c.assignment().iter().map(|tp| tp.partition).collect();
                position.retain(|p, _| owned.contains(p));
                // A commit during a rebalance or a coordinator move fails; the next one retries.
                if commit.load(Ordering::Acquire) && c.commit_sync().await.is_ok() {
                    let mut committed = committed_max.lock().unwrap();
                    for (&p, &o) in &position {
                        let max = committed.entry(p).or_default();
                        *max = (*max).max(o);
                    }
                }
            }
            c.close().await.unwrap();
            errors
        }));
    }
    wait_consumed(&seen, 20 * PARTITIONS as usize, "the first round consumed").await;
    let old = wait_until(WAIT, "a coordinator node", || coordinator_of(&cluster, GROUP)).await.unwrap();

    // Stop committing, read a second round: those records are consumed but not committed.
    commit.store(false, Ordering::Release);
    // The commits in flight land; then the first round, all of it, is what is committed.
    let admin = fjord_client::GroupAdmin::connect(client.clone()).await.unwrap();
    let committed: BTreeMap<i32, i64> = wait_until(WAIT, "the first round committed", || async {
        let c: BTreeMap<i32, i64> = admin.committed_offsets(GROUP).await?.into_iter().map(|(tp, o)| (tp.partition, o)).collect();
        Ok((c.len() == PARTITIONS as usize && c.values().all(|&o| o == 20)).then_some(c))
    })
    .await
    .unwrap();
    produce_round(&producer, TOPIC, PARTITIONS, 10, 1).await.unwrap();
    wait_consumed(&seen, 30 * PARTITIONS as usize, "the second round consumed").await;

    cluster.kill(old).await.unwrap();
    for p in 0..PARTITIONS {
        let state = cluster
            .wait_for_state(TOPIC, p, WAIT, "a leader on a running broker", |s| s.leader >= 0 && s.leader != old)
            .await
            .unwrap();
        eprintln!("{TOPIC}-{p} after the kill: {state:?}");
    }
    let moved = wait_until(WAIT, "another broker's coordinator node", || async {
        Ok(coordinator_of(&cluster, GROUP).await?.filter(|&id| id != old))
    })
    .await;
    let new = match moved {
        Ok(new) => new,
        Err(e) => panic!("{e:#}; the coordinator node now names {:?}", coordinator_of(&cluster, GROUP).await),
    };
    eprintln!("coordinator moved from broker {old} to broker {new}");
    commit.store(true, Ordering::Release);
    produce_round(&producer, TOPIC, PARTITIONS, 10, 2).await.unwrap();
    wait_consumed(&seen, 40 * PARTITIONS as usize, "the third round consumed after the move").await;

    // The killed broker comes back and catches up; the group keeps consuming.
    cluster.start(old).await.unwrap();
    cluster.wait_fully_replicated(TOPIC, WAIT).await.unwrap();
    produce_round(&producer, TOPIC, PARTITIONS, 10, 3).await.unwrap();
    wait_consumed(&seen, 50 * PARTITIONS as usize, "the fourth round consumed after the restart").await;
    // Wait for the final commits to reach the end of every partition.
    wait_until(WAIT, "commits at the log end", || async {
        let c = admin.committed_offsets(GROUP).await?;
        Ok((c.len() == PARTITIONS as usize && c.values().all(|&o| o == 50)).then_some(()))
    })
    .await
    .unwrap();
    stop.store(true, Ordering::Release);
    for m in members {
        let errors = m.await.unwrap();
        eprintln!("member poll errors: {errors:?}");
    }

    let seen = seen.lock().unwrap();
    let all: BTreeSet<(i32, i64)> = (0..PARTITIONS).flat_map(|p| (0..50).map(move |o| (p, o))).collect();
    assert_eq!(seen.keys().copied().collect::<BTreeSet<_>>(), all, "every record consumed, nothing else");
    // Re-reads (at-least-once): only of records no successful commit covered when they
    // were read again, each at most once more. The second round, consumed but not
    // committed when the coordinator was killed, is the bulk of them; a commit that failed
    // in a rebalance adds a few.
    let duplicates: BTreeMap<(i32, i64), usize> = seen.iter().filter(|(_, &n)| n > 1).map(|(k, &n)| (*k, n)).collect();
    let uncommitted_at_kill = duplicates.keys().filter(|(p, o)| *o >= committed[p] && *o < 30).count();
    eprintln!(
        "records consumed twice: {} ({uncommitted_at_kill} of them uncommitted when the coordinator was killed)",
        duplicates.len()
    );
    assert_eq!(
        uncommitted_at_kill,
        10 * PARTITIONS as usize,
        "the group resumed from the committed offsets, so it read the second round again"
    );
    assert_eq!(*rereads.lock().unwrap(), [], "records read again after a commit covered them");
    for (&(p, o), &n) in &duplicates {
        assert_eq!(n, 2, "{p}:{o} consumed {n} times");
        assert!(o >= committed[&p], "{p}:{o} was committed before the coordinator was killed, then read again");
    }
}

/// Two KafkaJS members of the group named by the third argument (auto-commit after each
/// batch); each time the set of (partition, offset) it consumed grows, at most every
/// 100 ms, prints `seen N`. A line on stdin ends it: the members leave and it prints `ok`.
const KAFKAJS_GROUP_SCRIPT: &str = r#"
const { Kafka, logLevel } = require('kafkajs');
const [bootstrap, topic, group] = process.argv.slice(1);
const kafka = new Kafka({ clientId: 'fjord-kafkajs-group', brokers: bootstrap.split(','), logLevel: logLevel.ERROR,
                          retry: { retries: 30, initialRetryTime: 100, maxRetryTime: 2000 } });
const seen = new Set();
let said = 0;
setInterval(() => { if (seen.size !== said) { said = seen.size; console.log(`seen ${said}`); } }, 100);
(async () => {
    const members = [];
    for (let i = 0; i < 2; i++) {
        const consumer = kafka.consumer({ groupId: group, sessionTimeout: 6000, heartbeatInterval: 300, maxWaitTimeInMs: 100 });
        await consumer.connect();
        await consumer.subscribe({ topic, fromBeginning: true });
        await consumer.run({ eachMessage: async ({ partition, message }) => { seen.add(`${partition}/${message.offset}`); } });
        members.push(consumer);
    }
    await new Promise(resolve => process.stdin.once('data', resolve));
    for (const m of members) await m.disconnect();
})().then(() => { console.log('ok'); process.exit(0); }, e => { console.error('FAILED', e); process.exit(1); });
"#;

/// KafkaJS's group (its own JoinGroup/SyncGroup/Heartbeat/OffsetCommit code) across a
/// kill -9 of the group's coordinator: it finds the new coordinator, consumes what comes
/// after, and commits to the end of every partition on the new coordinator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafkajs_group_moves_to_a_new_coordinator_and_commits_there() {
    const KAFKAJS_GROUP: &str = "kjs";
    let (mut cluster, client, producer) = three_brokers_with_the_topic().await;
    let admin = fjord_client::GroupAdmin::connect(client.clone()).await.unwrap();
    let committed_to = |end: i64| {
        let admin = &admin;
        move || async move {
            let c = admin.committed_offsets(KAFKAJS_GROUP).await?;
            Ok((c.len() == PARTITIONS as usize && c.values().all(|&o| o == end)).then_some(()))
        }
    };
    let mut script =
        fjord_testkit::ClientScript::node(KAFKAJS_GROUP_SCRIPT, &[&cluster.bootstrap(), TOPIC, KAFKAJS_GROUP]).unwrap();
    let mut seen_at_least = async |n: usize, what: &str| {
        let read = async {
            while let Some(line) = script.next_line().await.unwrap() {
                if line.strip_prefix("seen ").and_then(|s| s.parse::<usize>().ok()).is_some_and(|seen| seen >= n) {
                    return;
                }
            }
            panic!("the KafkaJS script ended before {what}: {}", script.transcript());
        };
        if tokio::time::timeout(Duration::from_secs(60), read).await.is_err() {
            panic!("KafkaJS did not consume {what} within 60 s: {}", script.transcript());
        }
    };

    produce_round(&producer, TOPIC, PARTITIONS, 20, 0).await.unwrap();
    seen_at_least(20 * PARTITIONS as usize, "the first round").await;
    wait_until(WAIT, "the first round committed", committed_to(20)).await.unwrap();
    let old = wait_until(WAIT, "a coordinator node", || coordinator_of(&cluster, KAFKAJS_GROUP)).await.unwrap();

    cluster.kill(old).await.unwrap();
    let new = wait_until(WAIT, "another broker's coordinator node", || async {
        Ok(coordinator_of(&cluster, KAFKAJS_GROUP).await?.filter(|&id| id != old))
    })
    .await
    .unwrap();
    eprintln!("coordinator moved from broker {old} to broker {new}");
    produce_round(&producer, TOPIC, PARTITIONS, 10, 1).await.unwrap();
    seen_at_least(30 * PARTITIONS as usize, "the round after the move").await;
    wait_until(WAIT, "commits at the log end on the new coordinator", committed_to(30)).await.unwrap();

    script.answer("done").await.unwrap();
    let output = tokio::time::timeout(WAIT, script.finish()).await.expect("the KafkaJS members left").unwrap();
    assert!(output.ok(), "the KafkaJS group failed {}", output.transcript());
}
