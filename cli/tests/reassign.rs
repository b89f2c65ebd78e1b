//! `fjord reassign` (issue #22, Kafka's `kafka-reassign-partitions`) on three in-process
//! brokers on ZooKeeper (fjord-testkit): a plan in Kafka's JSON format is executed and
//! verified, a cancel of a finished reassignment is refused, and `--decommission`
//! moves every replica off a broker, also on four brokers under an acks=all producer;
//! `--throttle` holds the catch-up of new replicas to its rate (alone, and while an
//! acks=all producer writes); `--generate` proposes a plan that executes; a plan's
//! `log_dirs` puts replicas (a new one and a moved one) in the dirs it names.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fjord_client::{Acks, Admin, ClientConfig, NewTopic, Producer, ProducerConfig, ProducerRecord};
use fjord_testkit::{read_values, wait_until, Cluster, Load, LoadProducer};

use common::{fjord, stdout};

const REACT: Duration = Duration::from_secs(30);
const TOPIC: &str = "plan";

/// Four brokers that keep their leaders where the test moves them (no preferred-leader
/// rebalancing midway) and fetch every 100 ms; a client and an admin on them.
async fn four_brokers() -> (Cluster, ClientConfig, Admin) {
    let cluster = Cluster::builder()
        .brokers(4)
        .config("auto.leader.rebalance.enable", false)
        .config("replica.fetch.wait.max.ms", 100)
        .start()
        .await
        .unwrap();
    let client = ClientConfig::new(&cluster.bootstrap());
    let admin = Admin::connect(client.clone()).await.unwrap();
    (cluster, client, admin)
}

async fn replicas_of(cluster: &Cluster, topic: &str) -> Vec<i32> {
    cluster.assignment(topic).await.unwrap().unwrap().partitions["0"].clone()
}

async fn wait_for_replicas(cluster: &Cluster, topic: &str, want: &[i32]) {
    wait_until(REACT, &format!("{topic}-0 on {want:?}"), || async {
        let assignment = cluster.assignment(topic).await?.expect("the topic exists");
        Ok((assignment.partitions["0"] == want && assignment.adding_replicas.is_empty()).then_some(()))
    })
    .await
    .unwrap();
    cluster.wait_for_isr(topic, 0, want, REACT).await.unwrap();
}

/// The cluster tests run one at a time: each runs ZooKeeper and several brokers.
async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    SERIAL.lock().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_is_executed_verified_and_a_broker_decommissioned() {
    let _serial = serial().await;
    let cluster = Cluster::builder().brokers(3).config("replica.fetch.wait.max.ms", 100).start().await.unwrap();
    let admin = Admin::connect(cluster.client_config()).await.unwrap();
    let mut topic = NewTopic::new(TOPIC, 1);
    topic.replication_factor = 2;
    admin.create_topics(&[topic]).await.unwrap();
    cluster.wait_fully_replicated(TOPIC, REACT).await.unwrap();
    let before = replicas_of(&cluster, TOPIC).await;
    let spare = *cluster.ids().iter().find(|id| !before.contains(id)).unwrap();
    let target = vec![spare, before[1]];

    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("plan.json");
    let text = format!(
        r#"{{"version":1,"partitions":[{{"topic":"{TOPIC}","partition":0,"replicas":[{},{}],"log_dirs":["any","any"]}}]}}"#,
        target[0], target[1]
    );
    std::fs::write(&plan, text).unwrap();
    let (plan, bootstrap) = (plan.to_str().unwrap(), format!("--bootstrap={}", cluster.bootstrap()));

    let out = stdout(&fjord(&["reassign", "--execute", "--plan", plan, &bootstrap]).await);
    assert!(out.contains(&format!("Successfully started partition reassignments for {TOPIC}-0")), "{out}");
    assert!(out.contains(&format!("\"replicas\":{before:?}").replace(' ', "")), "the rollback plan: {out}");
    wait_for_replicas(&cluster, TOPIC, &target).await;
    let out = stdout(&fjord(&["reassign", "--verify", "--reassignment-json-file", plan, &bootstrap]).await);
    assert!(out.contains(&format!("Reassignment of partition {TOPIC}-0 is completed.")), "{out}");

    let cancel = fjord(&["reassign", "--cancel", "--plan", plan, &bootstrap]).await;
    assert!(!cancel.status.success(), "nothing to cancel");
    assert!(String::from_utf8_lossy(&cancel.stderr).contains("no reassignment of this partition is in progress"), "{cancel:?}");

    // The spare broker goes: its replica moves to the only broker without one.
    let out = stdout(&fjord(&["reassign", "--decommission", &spare.to_string(), &bootstrap]).await);
    assert!(out.contains("Proposed partition reassignment configuration"), "{out}");
    wait_for_replicas(&cluster, TOPIC, &[before[0], before[1]]).await;
    wait_until(REACT, "the decommissioned broker drops its copy", || async {
        Ok((!cluster.data_dir(spare).join(format!("{TOPIC}-0")).exists()).then_some(()))
    })
    .await
    .unwrap();
}

/// Four brokers, a topic of four partitions with three replicas each (min.insync.replicas
/// 2), an acks=all idempotent producer sending to every partition without pause; `fjord
/// reassign --decommission` takes a broker that leads a partition out meanwhile. Every
/// acknowledged record is read back, no partition names the broker in its replicas or
/// its ISR (in ZooKeeper and in Metadata), and the broker holds no copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_is_decommissioned_under_acks_all_load_and_nothing_is_lost() {
    let _serial = serial().await;
    const TOPIC: &str = "retire";
    const PARTITIONS: i32 = 4;
    let (cluster, client, admin) = four_brokers().await;
    let mut topic = NewTopic::new(TOPIC, PARTITIONS);
    topic.replication_factor = 3;
    topic.configs.insert("min.insync.replicas".into(), "2".into());
    admin.create_topics(&[topic]).await.unwrap();
    cluster.wait_fully_replicated(TOPIC, REACT).await.unwrap();
    // A broker that leads partition 0: decommissioning it moves leadership too.
    let retired = cluster.leader(TOPIC, 0).await.unwrap().expect("a leader");
    let before = cluster.assignment(TOPIC).await.unwrap().unwrap();
    let held = before.partitions.values().filter(|r| r.contains(&retired)).count();
    assert!(held >= 2, "the broker holds several replicas: {:?}", before.partitions);

    let config =
        ProducerConfig { client: client.clone(), acks: Acks::All, enable_idempotence: Some(true), ..ProducerConfig::default() };
    let load = LoadProducer::start(Arc::new(Producer::connect(config).await.unwrap()), TOPIC, PARTITIONS);
    // Load established before the move, and kept up after it.
    load.acknowledged_over(100, REACT).await.unwrap();

    let started = Instant::now();
    let bootstrap = format!("--bootstrap={}", cluster.bootstrap());
    let out = stdout(&fjord(&["reassign", "--decommission", &retired.to_string(), &bootstrap]).await);
    assert!(out.contains("Successfully started partition reassignments"), "{out}");
    for partition in 0..PARTITIONS {
        let key = partition.to_string();
        // The only broker without a replica takes the retired one's place.
        let target: Vec<i32> = before.partitions[&key]
            .iter()
            .map(
                |&r| if r == retired { *cluster.ids().iter().find(|b| !before.partitions[&key].contains(b)).unwrap() } else { r },
            )
            .collect();
        wait_until(REACT, &format!("{TOPIC}-{partition} on {target:?}"), || async {
            let assignment = cluster.assignment(TOPIC).await?.expect("the topic exists");
            let done = assignment.partitions[&key] == target
                && assignment.adding_replicas.is_empty()
                && assignment.removing_replicas.is_empty();
            Ok(done.then_some(()))
        })
        .await
        .unwrap();
        let state = cluster.wait_for_isr(TOPIC, partition, &target, REACT).await.unwrap();
        assert_ne!(state.leader, retired);
    }
    let moved_in = started.elapsed();
    load.acknowledged_over(100, REACT).await.unwrap(); // the producer goes on with the new leaders
    let Load { acknowledged, failed } = load.stop().await.unwrap();

    let mut read = BTreeSet::new();
    for partition in 0..PARTITIONS {
        read.extend(read_values(&client, TOPIC, partition).await.unwrap().into_iter().map(|v| (partition, v)));
    }
    let lost: Vec<_> = acknowledged.iter().filter(|r| !read.contains(*r)).collect();
    assert!(lost.is_empty(), "{} of {} acknowledged records lost: {lost:?}", lost.len(), acknowledged.len());
    println!(
        "decommissioned broker {retired} ({held} replicas) in {moved_in:?}: {} acknowledged, {failed} failed, {} read back",
        acknowledged.len(),
        read.len()
    );

    // Still out a while later: nothing puts the broker back (a late ISR expansion, a
    // leader re-adding it).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let assignment = cluster.assignment(TOPIC).await.unwrap().unwrap();
    let metadata = admin.metadata().await.unwrap();
    for partition in 0..PARTITIONS {
        let replicas = &assignment.partitions[&partition.to_string()];
        let state = cluster.partition_state(TOPIC, partition).await.unwrap().unwrap();
        assert!(!replicas.contains(&retired) && !state.isr.contains(&retired), "{TOPIC}-{partition}: {replicas:?} {state:?}");
        let described = metadata.topics[TOPIC].partitions.iter().find(|p| p.partition == partition).unwrap();
        assert!(
            !described.replicas.contains(&retired) && !described.in_sync_replicas.contains(&retired),
            "Metadata of {TOPIC}-{partition}: {described:?}"
        );
    }
    wait_until(REACT, "the decommissioned broker drops every copy", || async {
        let kept = (0..PARTITIONS).any(|p| cluster.data_dir(retired).join(format!("{TOPIC}-{p}")).exists());
        Ok((!kept).then_some(()))
    })
    .await
    .unwrap();
}

/// `len` pseudo-random letters (seeded): record values that do not compress.
fn noise(len: usize, seed: u64) -> String {
    let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ seed.wrapping_mul(0x2545_f491_4f6c_dd1d);
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            char::from(b'a' + (state % 26) as u8)
        })
        .collect()
}

/// A thread of its own watching a replica's directory until `stop`: when its `.log` files
/// first hold bytes, and how many. (A look from the async test loop can come late under
/// load, which would shorten the measured time; a late look here only moves the start.)
fn watch_first_bytes(copy: std::path::PathBuf, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Option<(Instant, u64)>> {
    std::thread::spawn(move || {
        let copied = || -> u64 {
            std::fs::read_dir(&copy)
                .map(|entries| {
                    entries
                        .filter_map(|e| e.ok())
                        .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
                        .map(|e| e.metadata().map_or(0, |m| m.len()))
                        .sum()
                })
                .unwrap_or(0)
        };
        while !stop.load(Ordering::Relaxed) {
            let bytes = copied();
            if bytes > 0 {
                return Some((Instant::now(), bytes));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        None
    })
}

/// Issue #22: `fjord reassign --execute --throttle` holds the catch-up of a new replica to
/// the rate. A partition of ~9 MB on one broker gets a second replica under a 2 MB/s
/// throttle: from the new replica's first byte until it is in the ISR, the bytes it
/// copied over that time are at most 1.2x the limit (unthrottled, a local copy runs at
/// several times that). `--verify` then removes the throttle, and every record is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_reassignment_catches_up_at_the_throttle_rate() {
    let _serial = serial().await;
    const TOPIC: &str = "throttled";
    const LIMIT: f64 = 2_000_000.0;
    const RECORDS: usize = 900;
    let cluster = Cluster::builder().brokers(2).config("replica.fetch.wait.max.ms", 100).start().await.unwrap();
    let client = ClientConfig::new(&cluster.bootstrap());
    let admin = Admin::connect(client.clone()).await.unwrap();
    admin.create_topics(&[NewTopic::new(TOPIC, 1)]).await.unwrap();
    cluster.wait_fully_replicated(TOPIC, REACT).await.unwrap();
    let source = replicas_of(&cluster, TOPIC).await;
    let (from, to) = (source[0], *cluster.ids().iter().find(|id| !source.contains(id)).unwrap());

    // ~10 KB records that do not compress: ~9 MB in all.
    let producer =
        Producer::connect(ProducerConfig { client: client.clone(), acks: Acks::All, ..ProducerConfig::default() }).await.unwrap();
    let sent: Vec<String> = (0..RECORDS).map(|i| format!("{i:06}-{}", noise(10_000, i as u64))).collect();
    let mut acks = Vec::new();
    for value in &sent {
        acks.push(producer.send(ProducerRecord::new(TOPIC, value.clone())).await.unwrap());
    }
    for ack in acks {
        ack.await.unwrap();
    }
    let size = cluster.log_bytes(from, TOPIC, 0).unwrap().len();
    assert!(size > 8_000_000, "{size} bytes");

    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("plan.json");
    std::fs::write(
        &plan,
        format!(r#"{{"version":1,"partitions":[{{"topic":"{TOPIC}","partition":0,"replicas":[{from},{to}]}}]}}"#),
    )
    .unwrap();
    let (plan, bootstrap) = (plan.to_str().unwrap(), format!("--bootstrap={}", cluster.bootstrap()));
    let args: Vec<String> =
        ["reassign", "--execute", "--plan", plan, "--throttle", "2000000", &bootstrap].iter().map(|s| s.to_string()).collect();
    let execute = tokio::spawn(async move { fjord(&args.iter().map(String::as_str).collect::<Vec<_>>()).await });

    // From the new replica's first bytes ([`watch_first_bytes`]) until it is in the ISR
    // (read from ZooKeeper: a late look there only makes the time longer).
    let stop = Arc::new(AtomicBool::new(false));
    let first_bytes = watch_first_bytes(cluster.data_dir(to).join(format!("{TOPIC}-0")), stop.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "the new replica did not catch up within 60 s");
        let state = cluster.partition_state(TOPIC, 0).await.unwrap().unwrap();
        if state.isr.contains(&to) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let in_sync = Instant::now();
    stop.store(true, Ordering::Relaxed);
    let (start, already) = first_bytes.join().unwrap().expect("the new replica got bytes");
    let out = stdout(&execute.await.unwrap());
    assert!(out.contains("The inter-broker throttle limit was set to 2000000 B/s"), "{out}");
    // Caught in the middle of its copy, not after it: else there is nothing to measure.
    assert!(already < size as u64 / 2, "{already} of {size} bytes were there at the first look: not throttled");
    // Strict: every byte of the log counts, the ones already there at the first look too
    // (a fetch is never cut, so the first ones arrive in a burst).
    let took = in_sync - start;
    let rate = size as f64 / took.as_secs_f64();
    let after_first_look = (size as u64 - already) as f64 / took.as_secs_f64();
    println!(
        "throttled catch-up: {size} bytes in {took:?} = {rate:.0} B/s against a limit of {LIMIT:.0} B/s ({:.2}x); \
         {after_first_look:.0} B/s ({:.2}x) without the {already} bytes there at the first look",
        rate / LIMIT,
        after_first_look / LIMIT
    );
    assert!(rate <= 1.2 * LIMIT, "catch-up at {rate:.0} B/s, above 1.2x the {LIMIT:.0} B/s throttle");

    let throttle_keys = ["leader.replication.throttled.replicas", "follower.replication.throttled.replicas"];
    let described = admin.describe_configs(TOPIC).await.unwrap();
    let value = |entries: &[fjord_client::ConfigEntry], key: &str| {
        entries.iter().find(|e| e.name == key).and_then(|e| e.value.clone()).unwrap_or_default()
    };
    assert_eq!(value(&described, throttle_keys[0]), format!("0:{from}"));
    assert_eq!(value(&described, throttle_keys[1]), format!("0:{to}"));
    wait_for_replicas(&cluster, TOPIC, &[from, to]).await;
    let out = stdout(&fjord(&["reassign", "--verify", "--plan", plan, &bootstrap]).await);
    assert!(out.contains("is completed.") && out.contains("Throttle was removed."), "{out}");
    let described = admin.describe_configs(TOPIC).await.unwrap();
    for key in throttle_keys {
        assert_eq!(value(&described, key), "", "{key} removed");
    }
    assert_eq!(read_values(&client, TOPIC, 0).await.unwrap(), sent, "every record, in order");
    assert_eq!(cluster.log_bytes(to, TOPIC, 0).unwrap().len(), size, "the new replica holds the whole log");
}

/// `fjord reassign --generate` (Kafka's `--generate`): the current assignment and a
/// proposal over the given brokers, both in the plan format; the proposal executes as
/// printed. Bad input (an unknown topic or broker, a negative or non-numeric throttle, a
/// plan naming a dead broker) is refused with the reason and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generated_plan_executes_and_bad_input_changes_nothing() {
    let _serial = serial().await;
    let cluster = Cluster::builder().brokers(3).config("replica.fetch.wait.max.ms", 100).start().await.unwrap();
    let admin = Admin::connect(cluster.client_config()).await.unwrap();
    let mut one = NewTopic::new("gen-a", 3);
    one.replication_factor = 2;
    admin.create_topics(&[one, NewTopic::new("gen-b", 2)]).await.unwrap();
    for topic in ["gen-a", "gen-b"] {
        cluster.wait_fully_replicated(topic, REACT).await.unwrap();
    }
    let bootstrap = format!("--bootstrap={}", cluster.bootstrap());
    let ids = cluster.ids();
    let brokers = ids.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(",");
    let out = stdout(&fjord(&["reassign", "--generate", "--topics", "gen-a,gen-b", "--brokers", &brokers, &bootstrap]).await);
    let (current, proposed) =
        out.split_once("Proposed partition reassignment configuration\n").unwrap_or_else(|| panic!("no proposal: {out}"));
    assert!(current.starts_with("Current partition replica assignment\n"), "{out}");
    let plan: serde_json::Value = serde_json::from_str(proposed.trim()).unwrap();
    let partitions = plan["partitions"].as_array().unwrap();
    assert_eq!(partitions.len(), 5, "{plan}");
    let mut leaders = BTreeSet::new();
    for p in partitions {
        let replicas: Vec<i32> = p["replicas"].as_array().unwrap().iter().map(|r| r.as_i64().unwrap() as i32).collect();
        let factor = if p["topic"] == "gen-a" { 2 } else { 1 };
        assert_eq!(replicas.len(), factor, "{p}");
        assert!(replicas.iter().all(|r| ids.contains(r)), "{p}");
        leaders.insert(replicas[0]);
    }
    assert_eq!(leaders.len(), ids.len(), "leaders spread over every broker: {plan}");
    let current_plan: serde_json::Value =
        serde_json::from_str(current.trim_start_matches("Current partition replica assignment\n").trim()).unwrap();
    assert_eq!(current_plan["partitions"].as_array().unwrap().len(), 5, "{current}");

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("generated.json");
    std::fs::write(&path, proposed.trim()).unwrap();
    let path = path.to_str().unwrap();

    // Bad input first: each refused, nothing changed.
    let before = (cluster.assignment("gen-a").await.unwrap(), cluster.assignment("gen-b").await.unwrap());
    let refused = |o: Output, reason: &str| {
        assert!(!o.status.success(), "accepted: {o:?}");
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(stderr.contains(reason), "{reason:?} not in {stderr}");
    };
    refused(
        fjord(&["reassign", "--generate", "--topics", "gen-a", "--brokers", "1,2,99", &bootstrap]).await,
        "broker 99 is not a live broker",
    );
    refused(
        fjord(&["reassign", "--generate", "--topics", "nope", "--brokers", &brokers, &bootstrap]).await,
        "topic nope does not exist",
    );
    refused(fjord(&["reassign", "--execute", "--plan", path, "--throttle", "-5", &bootstrap]).await, "must not be negative");
    refused(fjord(&["reassign", "--execute", "--plan", path, "--throttle", "fast", &bootstrap]).await, "not a number");
    let dead = dir.path().join("dead.json");
    std::fs::write(&dead, r#"{"version":1,"partitions":[{"topic":"gen-a","partition":0,"replicas":[1,99]}]}"#).unwrap();
    refused(
        fjord(&["reassign", "--execute", "--plan", dead.to_str().unwrap(), "--throttle", "1000", &bootstrap]).await,
        "broker 99 is not a live broker",
    );
    assert_eq!((cluster.assignment("gen-a").await.unwrap(), cluster.assignment("gen-b").await.unwrap()), before);
    let configs = admin.describe_configs("gen-a").await.unwrap();
    assert!(
        configs.iter().filter(|e| e.name.contains("throttled")).all(|e| e.value.as_deref().unwrap_or_default().is_empty()),
        "{configs:?}"
    );

    let out = stdout(&fjord(&["reassign", "--execute", "--plan", path, &bootstrap]).await);
    assert!(out.contains("Successfully started partition reassignments"), "{out}");
    for p in partitions {
        let (topic, partition) = (p["topic"].as_str().unwrap(), p["partition"].as_i64().unwrap() as i32);
        let want: Vec<i32> = p["replicas"].as_array().unwrap().iter().map(|r| r.as_i64().unwrap() as i32).collect();
        wait_until(REACT, &format!("{topic}-{partition} on {want:?}"), || async {
            let assignment = cluster.assignment(topic).await?.expect("the topic exists");
            Ok((assignment.partitions[&partition.to_string()] == want && assignment.adding_replicas.is_empty()).then_some(()))
        })
        .await
        .unwrap();
    }
    let out = stdout(&fjord(&["reassign", "--verify", "--plan", path, &bootstrap]).await);
    assert_eq!(out.matches("is completed.").count(), 5, "{out}");
}

/// Issue #22's scenario: a partition moves from three brokers to three others with one in
/// common less ({a,b,c} -> {b,c,d}, four brokers on ZooKeeper) under a 2 MB/s throttle
/// while an acks=all producer keeps writing: the new replica's catch-up stays within
/// 1.2x the limit (the leader's rate counts what its in-sync followers fetch too, so the
/// copy gets less), and every acknowledged record is there afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_throttled_move_under_acks_all_load_holds_the_rate_and_loses_nothing() {
    let _serial = serial().await;
    const TOPIC: &str = "throttled-load";
    const LIMIT: f64 = 2_000_000.0;
    let (cluster, client, admin) = four_brokers().await;
    let mut topic = NewTopic::new(TOPIC, 1);
    topic.replication_factor = 3;
    topic.configs.insert("min.insync.replicas".into(), "2".into());
    admin.create_topics(&[topic]).await.unwrap();
    cluster.wait_fully_replicated(TOPIC, REACT).await.unwrap();
    let before = replicas_of(&cluster, TOPIC).await;
    let spare = *cluster.ids().iter().find(|id| !before.contains(id)).unwrap();
    let target = vec![before[1], before[2], spare];

    let config = ProducerConfig { client: client.clone(), acks: Acks::All, ..ProducerConfig::default() };
    let producer = Arc::new(Producer::connect(config).await.unwrap());
    // ~6 MB to copy before the move starts.
    let mut acks = Vec::new();
    for i in 0..600u64 {
        acks.push(producer.send(ProducerRecord::new(TOPIC, format!("fill-{i:06}-{}", noise(10_000, i)))).await.unwrap());
    }
    let mut acknowledged: Vec<String> = Vec::new();
    for (i, ack) in acks.into_iter().enumerate() {
        ack.await.unwrap();
        acknowledged.push(format!("fill-{i:06}"));
    }
    // Then ~100 KB/s of 1 KB records, acks=all, for the whole move.
    let stop = Arc::new(AtomicBool::new(false));
    let sending = {
        let (producer, stop) = (producer.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut acknowledged, mut failed, mut next) = (Vec::new(), 0usize, 0u64);
            while !stop.load(Ordering::Relaxed) {
                let value = format!("load-{next:06}-{}", noise(1_000, 1_000_000 + next));
                next += 1;
                match producer.send(ProducerRecord::new(TOPIC, value.clone())).await.unwrap().await {
                    Ok(_) => acknowledged.push(value[..11].to_owned()),
                    Err(_) => failed += 1,
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            (acknowledged, failed)
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;

    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("plan.json");
    std::fs::write(
        &plan,
        format!(r#"{{"version":1,"partitions":[{{"topic":"{TOPIC}","partition":0,"replicas":{target:?}}}]}}"#).replace(' ', ""),
    )
    .unwrap();
    let (plan, bootstrap) = (plan.to_str().unwrap(), format!("--bootstrap={}", cluster.bootstrap()));
    let watching = Arc::new(AtomicBool::new(false));
    let first_bytes = watch_first_bytes(cluster.data_dir(spare).join(format!("{TOPIC}-0")), watching.clone());
    let out = stdout(&fjord(&["reassign", "--execute", "--plan", plan, "--throttle", "2000000", &bootstrap]).await);
    assert!(out.contains("Successfully started partition reassignments"), "{out}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "the new replica did not catch up within 60 s");
        if cluster.partition_state(TOPIC, 0).await.unwrap().unwrap().isr.contains(&spare) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let in_sync = Instant::now();
    watching.store(true, Ordering::Relaxed);
    let (start, already) = first_bytes.join().unwrap().expect("the new replica got bytes");
    let copied = cluster.log_bytes(spare, TOPIC, 0).unwrap().len() as u64;
    assert!(already < copied / 2, "{already} of {copied} bytes were there at the first look: not throttled");
    let took = in_sync - start;
    let rate = copied as f64 / took.as_secs_f64();
    println!("throttled catch-up under load: {copied} bytes in {took:?} = {rate:.0} B/s ({:.2}x the limit)", rate / LIMIT);
    assert!(rate <= 1.2 * LIMIT, "catch-up at {rate:.0} B/s, above 1.2x the {LIMIT:.0} B/s throttle");

    wait_for_replicas(&cluster, TOPIC, &target).await;
    let out = stdout(&fjord(&["reassign", "--verify", "--plan", plan, &bootstrap]).await);
    assert!(out.contains("Throttle was removed."), "{out}");
    tokio::time::sleep(Duration::from_millis(300)).await; // the producer goes on with the new replicas
    stop.store(true, Ordering::Relaxed);
    let (loaded, failed) = sending.await.unwrap();
    assert!(loaded.len() > 50, "the producer kept writing during the move: {}", loaded.len());
    acknowledged.extend(loaded);
    let read: BTreeSet<String> = read_values(&client, TOPIC, 0).await.unwrap().into_iter().map(|v| v[..11].to_owned()).collect();
    let lost: Vec<&String> = acknowledged.iter().filter(|v| !read.contains(*v)).collect();
    assert!(lost.is_empty(), "{} of {} acknowledged records lost: {lost:?}", lost.len(), acknowledged.len());
    println!("{} acknowledged, {failed} failed, {} read back", acknowledged.len(), read.len());
}

/// The one of `dirs` holding `<topic>-0`, if any.
fn holding(dirs: &[PathBuf], topic: &str) -> Option<PathBuf> {
    dirs.iter().find(|d| d.join(format!("{topic}-0")).is_dir()).cloned()
}

/// Three brokers with two log dirs each; a partition on two of them moves to the spare
/// broker and one of its old ones with a plan whose `log_dirs` names the spare's second
/// dir and the other dir of the replica that stays on its broker. `--execute` and
/// `--verify` put both replicas there (the files are there and nowhere else on their
/// brokers), every record reads back; a plan whose `log_dirs` does not match its
/// replicas, or names a dir the broker lacks, is refused before anything is submitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plans_log_dirs_put_each_replica_in_its_dir() {
    let _serial = serial().await;
    const TOPIC: &str = "placed";
    let cluster =
        Cluster::builder().brokers(3).log_dirs_per_broker(2).config("replica.fetch.wait.max.ms", 100).start().await.unwrap();
    let client = cluster.client_config();
    let admin = Admin::connect(client.clone()).await.unwrap();
    let mut topic = NewTopic::new(TOPIC, 1);
    topic.replication_factor = 2;
    admin.create_topics(&[topic]).await.unwrap();
    cluster.wait_fully_replicated(TOPIC, REACT).await.unwrap();
    let producer =
        Producer::connect(ProducerConfig { client: client.clone(), acks: Acks::All, ..ProducerConfig::default() }).await.unwrap();
    let values: Vec<String> = (0..200).map(|i| format!("record-{i:03}")).collect();
    for v in &values {
        producer.send(ProducerRecord::new(TOPIC, v.clone()).partition(0)).await.unwrap().await.unwrap();
    }

    let before = replicas_of(&cluster, TOPIC).await;
    let spare = *cluster.ids().iter().find(|id| !before.contains(id)).unwrap();
    let stays = before[1];
    let stays_dirs = cluster.log_dirs(stays);
    let stays_from = holding(&stays_dirs, TOPIC).expect("the replica is in one of its dirs");
    let stays_to = stays_dirs.iter().find(|d| **d != stays_from).unwrap().clone();
    let spare_to = cluster.log_dirs(spare)[1].clone();
    let target = [spare, stays];
    let plan_with = |dirs: &[&Path]| {
        let dirs: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        serde_json::json!({"version": 1, "partitions": [{"topic": TOPIC, "partition": 0, "replicas": target, "log_dirs": dirs}]})
            .to_string()
    };
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let bootstrap = format!("--bootstrap={}", cluster.bootstrap());

    // Bad plans first: refused, nothing submitted.
    let refused = |o: Output, reason: &str| {
        assert!(!o.status.success(), "accepted: {o:?}");
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(stderr.contains(reason), "{reason:?} not in {stderr}");
    };
    let short = write("short.json", plan_with(&[&spare_to]));
    refused(
        fjord(&["reassign", "--execute", "--plan", &short, &bootstrap]).await,
        "\"log_dirs\" has 1 entries but \"replicas\" has 2",
    );
    let nowhere = write("nowhere.json", plan_with(&[Path::new("/no/such/dir"), &stays_to]));
    refused(
        fjord(&["reassign", "--execute", "--plan", &nowhere, &bootstrap]).await,
        &format!("broker {spare} has no log dir /no/such/dir"),
    );
    assert!(admin.list_partition_reassignments().await.unwrap().is_empty());
    assert_eq!(replicas_of(&cluster, TOPIC).await, before);

    let plan = write("plan.json", plan_with(&[&spare_to, &stays_to]));
    let out = stdout(&fjord(&["reassign", "--execute", "--plan", &plan, &bootstrap]).await);
    assert!(out.contains(&format!("Successfully started partition reassignments for {TOPIC}-0")), "{out}");
    for (broker, to) in [(spare, &spare_to), (stays, &stays_to)] {
        let line = format!("Moving the replica of {TOPIC}-0 on broker {broker} to log dir {}", to.display());
        assert!(out.contains(&line), "{line:?} not in {out}");
    }
    wait_for_replicas(&cluster, TOPIC, &target).await;
    let deadline = Instant::now() + REACT;
    let last = loop {
        let out = stdout(&fjord(&["reassign", "--verify", "--plan", &plan, &bootstrap]).await);
        if out.matches(": completed.").count() == 2 {
            break out;
        }
        assert!(Instant::now() < deadline, "--verify never said that every replica is in its dir: {out}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(last.contains(&format!("Reassignment of partition {TOPIC}-0 is completed.")), "{last}");
    for (broker, to) in [(spare, &spare_to), (stays, &stays_to)] {
        let line = format!("The replica of {TOPIC}-0 on broker {broker} is in log dir {}: completed.", to.display());
        assert!(last.contains(&line), "{line:?} not in {last}");
        assert!(to.join(format!("{TOPIC}-0")).is_dir(), "broker {broker}'s replica is in {}", to.display());
        let others: Vec<PathBuf> = cluster.log_dirs(broker).into_iter().filter(|d| d != to).collect();
        wait_until(REACT, "the source of the move is deleted", || async { Ok(holding(&others, TOPIC).is_none().then_some(())) })
            .await
            .unwrap();
    }
    assert_eq!(read_values(&client, TOPIC, 0).await.unwrap(), values, "every record reads back");
}
