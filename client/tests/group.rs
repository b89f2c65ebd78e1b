//! The group consumer against a real in-process `fjord-broker` (127.0.0.1:0, one temp
//! dir per test), alone and in a mixed group with librdkafka (kcat -G).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fjord_client::{
    Admin, ClientConfig, GroupConfig, GroupConsumer, NewTopic, OffsetReset, Producer, ProducerConfig, ProducerRecord,
    TopicPartition,
};
use fjord_testkit::StandaloneBroker;

/// A broker whose groups form fast and accept 1 s sessions, so tests can kill members.
async fn start_broker() -> StandaloneBroker {
    StandaloneBroker::start_for_groups().await.expect("broker starts")
}

async fn setup(addr: &str, topic: &str, partitions: i32) -> Producer {
    let client = ClientConfig { connect_timeout: Duration::from_secs(5), ..ClientConfig::new(addr) };
    Admin::connect(client.clone()).await.unwrap().create_topics(&[NewTopic::new(topic, partitions)]).await.unwrap();
    Producer::connect(ProducerConfig { client, ..ProducerConfig::default() }).await.unwrap()
}

/// `per_partition` records into every partition; values are `p:o`-unique.
async fn produce(producer: &Producer, topic: &str, partitions: i32, per_partition: usize, round: usize) {
    let mut acks = Vec::new();
    for i in 0..per_partition {
        for p in 0..partitions {
            acks.push(producer.send(ProducerRecord::new(topic, format!("r{round}-p{p}-{i}")).partition(p)).await.unwrap());
        }
    }
    for a in acks {
        a.await.unwrap();
    }
}

fn group_config(addr: &str, group: &str) -> GroupConfig {
    let mut c = GroupConfig::new(addr, group);
    c.consumer.auto_offset_reset = OffsetReset::Earliest;
    c.consumer.fetch_max_wait = Duration::from_millis(100);
    c.session_timeout = Duration::from_secs(2);
    c.heartbeat_interval = Duration::from_millis(300);
    c.max_poll_interval = Duration::from_secs(5);
    c.enable_auto_commit = false;
    c
}

#[derive(Default)]
struct Seen {
    /// (partition, offset) → members that consumed it.
    records: HashMap<(i32, i64), Vec<usize>>,
    /// generation → member → owned partitions.
    owners: BTreeMap<i32, BTreeMap<usize, Vec<TopicPartition>>>,
}

/// Three members over 12 partitions; one dies without leaving. Its partitions move
/// within the session timeout, every record is consumed, and the only duplicates are
/// the dead member's records after its last commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_share_partitions_and_survive_a_dead_member() {
    let broker = start_broker().await;
    let (topic, partitions) = ("events", 12);
    let producer = setup(&broker.addr, topic, partitions).await;
    produce(&producer, topic, partitions, 20, 0).await;

    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let victim_commits = Arc::new(AtomicBool::new(true));
    let kill_victim = Arc::new(AtomicBool::new(false));
    // The victim's last committed position per partition, as the coordinator has it.
    let victim_committed: Arc<Mutex<HashMap<i32, i64>>> = Arc::default();
    let mut tasks = Vec::new();
    for idx in 0..3usize {
        let config = group_config(&broker.addr, "g");
        let (seen, stop, victim_commits, kill_victim, victim_committed) =
            (seen.clone(), stop.clone(), victim_commits.clone(), kill_victim.clone(), victim_committed.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = GroupConsumer::subscribe(config, &[topic]).await.unwrap();
            let mut position: HashMap<i32, i64> = HashMap::new();
            while !stop.load(Ordering::Acquire) {
                if idx == 2 && kill_victim.load(Ordering::Acquire) {
                    c.abort();
                    return;
                }
                let records = c.poll(Duration::from_millis(100)).await.unwrap();
                {
                    let mut s = seen.lock().unwrap();
                    for r in &records {
                        s.records.entry((r.partition, r.offset)).or_default().push(idx);
                        position.insert(r.partition, r.offset + 1);
                    }
                    s.owners.entry(c.generation()).or_default().insert(idx, c.assignment());
                }
                if idx != 2 || victim_commits.load(Ordering::Acquire) {
                    // A failed commit (rebalance under way) is retried after the rejoin.
                    if c.commit_sync().await.is_ok() && idx == 2 {
                        victim_committed.lock().unwrap().extend(position.iter().map(|(p, o)| (*p, *o)));
                    }
                }
            }
            c.close().await.unwrap();
        }));
    }

    let total_after = |n: usize, seen: &Arc<Mutex<Seen>>| seen.lock().unwrap().records.len() >= n;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !total_after(240, &seen) {
        assert!(Instant::now() < deadline, "first round not consumed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Now the victim consumes without committing, then dies.
    victim_commits.store(false, Ordering::Release);
    let victim_owned: Vec<i32> = {
        let s = seen.lock().unwrap();
        let (_, members) = s.owners.iter().next_back().unwrap();
        members.get(&2).map(|a| a.iter().map(|tp| tp.partition).collect()).unwrap_or_default()
    };
    assert!(!victim_owned.is_empty(), "the victim owns nothing");
    produce(&producer, topic, partitions, 20, 1).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let victim_new = {
            let s = seen.lock().unwrap();
            s.records.iter().filter(|((p, o), who)| *o >= 20 && who.contains(&2) && victim_owned.contains(p)).count()
        };
        if victim_new >= 10 {
            break;
        }
        assert!(Instant::now() < deadline, "victim consumed nothing new");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    kill_victim.store(true, Ordering::Release);
    let killed_at = Instant::now();
    tasks.pop().unwrap().await.unwrap();

    // Its partitions move to the survivors within the session timeout (plus a rejoin).
    let deadline = Instant::now() + Duration::from_secs(20);
    let moved = loop {
        {
            let s = seen.lock().unwrap();
            let (_, members) = s.owners.iter().next_back().unwrap();
            let owned: BTreeSet<i32> =
                members.iter().filter(|(m, _)| **m != 2).flat_map(|(_, a)| a.iter().map(|tp| tp.partition)).collect();
            if members.len() == 2 && owned.len() == partitions as usize {
                break killed_at.elapsed();
            }
        }
        assert!(Instant::now() < deadline, "partitions of the dead member never moved");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!("partitions of the dead member moved after {moved:?}");
    assert!(moved < Duration::from_secs(2) + Duration::from_secs(3), "moved after {moved:?}");

    let expected = (partitions * 40) as usize;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !total_after(expected, &seen) {
        assert!(Instant::now() < deadline, "not every record was consumed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Release);
    for t in tasks {
        t.await.unwrap();
    }

    let s = seen.lock().unwrap();
    assert_eq!(s.records.len(), expected, "consumed records outside the produced range");
    // Every partition has one owner per generation.
    for (generation, members) in &s.owners {
        let mut all = Vec::new();
        for a in members.values() {
            all.extend(a.iter().cloned());
        }
        let unique: BTreeSet<_> = all.iter().cloned().collect();
        assert_eq!(unique.len(), all.len(), "generation {generation}: a partition has two owners: {members:?}");
    }
    assert!(s.owners.values().any(|m| m.len() == 3 && m.values().all(|a| !a.is_empty())), "never a 3-way split: {:?}", s.owners);
    // Duplicates: exactly the dead member's records after its last commit, read again by a survivor.
    let committed = victim_committed.lock().unwrap();
    let duplicates: BTreeSet<(i32, i64)> = s.records.iter().filter(|(_, who)| who.len() > 1).map(|(k, _)| *k).collect();
    let uncommitted: BTreeSet<(i32, i64)> = s
        .records
        .iter()
        .filter(|((p, o), who)| who.contains(&2) && *o >= committed.get(p).copied().unwrap_or(0))
        .map(|(k, _)| *k)
        .collect();
    eprintln!("duplicates: {} (the dead member's uncommitted records: {})", duplicates.len(), uncommitted.len());
    assert!(uncommitted.len() >= 10);
    assert_eq!(duplicates, uncommitted);
    for k in &duplicates {
        let who = &s.records[k];
        assert_eq!(who.len(), 2, "{k:?} consumed by {who:?}");
    }
}

/// A librdkafka member (kcat -G) and a fjord member agree on the range assignor and
/// split the partitions between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_group_with_librdkafka_splits_partitions() {
    let broker = start_broker().await;
    let (topic, partitions) = ("mixed", 12);
    let producer = setup(&broker.addr, topic, partitions).await;
    let mut kcat = tokio::process::Command::new("kcat")
        .args([
            "-b",
            &broker.addr,
            "-G",
            "mixed-g",
            "-X",
            "partition.assignment.strategy=range",
            "-X",
            "auto.offset.reset=earliest",
        ])
        .args(["-X", "session.timeout.ms=6000", "-X", "heartbeat.interval.ms=300", "-q", "-u", "-f", "%p %o\n", topic])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("kcat is installed");
    let stdout = kcat.stdout.take().unwrap();
    let kcat_seen: Arc<Mutex<BTreeSet<(i32, i64)>>> = Arc::default();
    let reader = {
        let kcat_seen = kcat_seen.clone();
        tokio::spawn(async move {
            use tokio::io::AsyncBufReadExt;
            let mut lines = tokio::io::BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let mut it = line.split_whitespace().map(|n| n.parse::<i64>().unwrap());
                let (p, o) = (it.next().unwrap(), it.next().unwrap());
                kcat_seen.lock().unwrap().insert((p as i32, o));
            }
        })
    };
    // Let kcat form the group first, then join it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut c = GroupConsumer::subscribe(group_config(&broker.addr, "mixed-g"), &[topic]).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.assignment().len() != 6 {
        assert!(Instant::now() < deadline, "fjord member never got half: {:?}", c.assignment());
        c.poll(Duration::from_millis(100)).await.unwrap();
    }
    let mine: BTreeSet<i32> = c.assignment().iter().map(|tp| tp.partition).collect();
    produce(&producer, topic, partitions, 10, 0).await;
    let mut fjord_seen = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while fjord_seen.len() + kcat_seen.lock().unwrap().len() < 120 {
        assert!(Instant::now() < deadline, "fjord {} + kcat {} of 120", fjord_seen.len(), kcat_seen.lock().unwrap().len());
        for r in c.poll(Duration::from_millis(100)).await.unwrap() {
            fjord_seen.insert((r.partition, r.offset));
        }
    }
    assert_eq!(c.assignment().len(), 6, "the group rebalanced while consuming");
    let theirs = kcat_seen.lock().unwrap().clone();
    assert_eq!(fjord_seen.len(), 60);
    assert_eq!(theirs.len(), 60);
    assert!(fjord_seen.iter().all(|(p, _)| mine.contains(p)));
    assert!(theirs.iter().all(|(p, _)| !mine.contains(p)), "kcat read a partition the fjord member owns");
    c.close().await.unwrap();
    kcat.kill().await.unwrap();
    reader.abort();
}

/// cooperative-sticky: when a second member joins, the first gives up only the
/// partitions that move (never all of them), and the two end with half each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cooperative_sticky_revokes_only_what_moves() {
    let broker = start_broker().await;
    let (topic, partitions) = ("coop", 12);
    let _producer = setup(&broker.addr, topic, partitions).await;
    let mut config = group_config(&broker.addr, "coop-g");
    config.assignment_strategies = vec!["cooperative-sticky".into()];
    let events: Arc<Mutex<Vec<fjord_client::Rebalance>>> = Arc::default();
    let mut first = GroupConsumer::subscribe(config.clone(), &[topic]).await.unwrap();
    let log = events.clone();
    first.set_rebalance_listener(Box::new(move |e| log.lock().unwrap().push(e.clone())));
    let deadline = Instant::now() + Duration::from_secs(20);
    while first.assignment().len() != 12 {
        assert!(Instant::now() < deadline, "first member never got everything");
        first.poll(Duration::from_millis(100)).await.unwrap();
    }
    let second = GroupConsumer::subscribe(config, &[topic]).await.unwrap();
    // Each member polls in its own task, as applications do: a member blocked in
    // JoinGroup must not stop the other from rejoining.
    let stop = Arc::new(AtomicBool::new(false));
    let run = |mut c: GroupConsumer, view: Arc<Mutex<Vec<TopicPartition>>>, stop: Arc<AtomicBool>| {
        tokio::spawn(async move {
            while !stop.load(Ordering::Acquire) {
                c.poll(Duration::from_millis(100)).await.unwrap();
                *view.lock().unwrap() = c.assignment();
            }
            c
        })
    };
    let view1: Arc<Mutex<Vec<TopicPartition>>> = Arc::default();
    let view2: Arc<Mutex<Vec<TopicPartition>>> = Arc::default();
    let t1 = run(first, view1.clone(), stop.clone());
    let t2 = run(second, view2.clone(), stop.clone());
    let deadline = Instant::now() + Duration::from_secs(20);
    while view1.lock().unwrap().len() != 6 || view2.lock().unwrap().len() != 6 {
        assert!(Instant::now() < deadline, "no 6/6 split: {:?} / {:?}", view1.lock().unwrap(), view2.lock().unwrap());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Release);
    let (first, second) = (t1.await.unwrap(), t2.await.unwrap());
    let mine: BTreeSet<TopicPartition> = first.assignment().into_iter().collect();
    assert_eq!(mine.len(), 6);
    assert!(second.assignment().iter().all(|tp| !mine.contains(tp)));
    let events = events.lock().unwrap().clone();
    let revoked: Vec<TopicPartition> = events
        .iter()
        .flat_map(|e| match e {
            fjord_client::Rebalance::Revoked(p) => p.clone(),
            _ => Vec::new(),
        })
        .collect();
    assert_eq!(revoked.len(), 6, "revoked more than what moved: {events:?}");
    assert!(revoked.iter().all(|tp| !mine.contains(tp)), "revoked a partition it kept: {events:?}");
    first.close().await.unwrap();
    second.close().await.unwrap();
}

/// enable.auto.commit: positions are committed every interval while polling and at
/// close; a commit_async is answered; a new member resumes after the committed offsets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_commit_and_resume_after_committed_offsets() {
    let broker = start_broker().await;
    let (topic, partitions) = ("auto", 4);
    let producer = setup(&broker.addr, topic, partitions).await;
    produce(&producer, topic, partitions, 10, 0).await;
    let mut config = group_config(&broker.addr, "auto-g");
    config.enable_auto_commit = true;
    config.auto_commit_interval = Duration::from_millis(200);
    let mut c = GroupConsumer::subscribe(config.clone(), &[topic]).await.unwrap();
    let (mut consumed, deadline) = (0, Instant::now() + Duration::from_secs(20));
    while consumed < 40 {
        assert!(Instant::now() < deadline, "consumed only {consumed}");
        consumed += c.poll(Duration::from_millis(100)).await.unwrap().len();
    }
    let admin = fjord_client::GroupAdmin::connect(ClientConfig::new(&broker.addr)).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        c.poll(Duration::from_millis(100)).await.unwrap();
        let committed: i64 = admin.committed_offsets("auto-g").await.unwrap().values().sum();
        if committed == 40 {
            break;
        }
        assert!(Instant::now() < deadline, "auto-commit committed {committed} of 40");
    }
    c.commit_async().await.unwrap().await.unwrap();
    produce(&producer, topic, partitions, 1, 1).await;
    while consumed < 44 {
        consumed += c.poll(Duration::from_millis(100)).await.unwrap().len();
    }
    c.close().await.unwrap();
    assert_eq!(admin.committed_offsets("auto-g").await.unwrap().values().sum::<i64>(), 44, "close commits");
    // A new member of the group starts where the group left off: nothing to read.
    produce(&producer, topic, partitions, 1, 2).await;
    let mut c = GroupConsumer::subscribe(config, &[topic]).await.unwrap();
    let mut offsets = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while offsets.len() < 4 {
        assert!(Instant::now() < deadline, "resumed member read {offsets:?}");
        offsets.extend(c.poll(Duration::from_millis(100)).await.unwrap().iter().map(|r| r.offset));
    }
    assert!(offsets.iter().all(|o| *o == 11), "re-read committed records: {offsets:?}");
    c.close().await.unwrap();
}

/// CreatePartitions while a keyed producer and a two-member group run (issue #22): the
/// topic grows from 2 to 4 partitions. Both clients refresh metadata every second; within
/// a few seconds the producer's keys spread over all 4 partitions and the group leader
/// notices the new count and rebalances, so the group's assignment covers all 4. Every
/// acknowledged record is consumed (at least once: the eager rebalance commits before it
/// revokes, so duplicates can only be records a member fetched but had not committed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn added_partitions_reach_a_keyed_producer_and_a_running_group() {
    let broker = start_broker().await;
    let topic = "grow";
    let client = ClientConfig {
        metadata_max_age: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(5),
        ..ClientConfig::new(&broker.addr)
    };
    let admin = Admin::connect(client.clone()).await.unwrap();
    admin.create_topics(&[NewTopic::new(topic, 2)]).await.unwrap();
    let producer = Producer::connect(ProducerConfig { client: client.clone(), ..ProducerConfig::default() }).await.unwrap();

    let stop_producing = Arc::new(AtomicBool::new(false));
    let acked: Arc<Mutex<Vec<(i32, i64)>>> = Arc::default();
    let sending = {
        let (stop, acked) = (stop_producing.clone(), acked.clone());
        tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Acquire) {
                let record = ProducerRecord::new(topic, format!("v{i}")).key(format!("key-{}", i % 64));
                let md = producer.send(record).await.unwrap().await.unwrap();
                acked.lock().unwrap().push((md.partition, md.offset));
                i += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            producer.close().await;
        })
    };

    let stop_consuming = Arc::new(AtomicBool::new(false));
    let consumed: Arc<Mutex<HashMap<(i32, i64), usize>>> = Arc::default();
    let assignments: Arc<Mutex<Vec<BTreeSet<i32>>>> = Arc::new(Mutex::new(vec![BTreeSet::new(); 2]));
    let mut members = Vec::new();
    for idx in 0..2usize {
        let mut config = group_config(&broker.addr, "grow-group");
        config.consumer.client.metadata_max_age = Duration::from_secs(1);
        config.enable_auto_commit = true;
        config.auto_commit_interval = Duration::from_millis(200);
        let (stop, consumed, assignments) = (stop_consuming.clone(), consumed.clone(), assignments.clone());
        members.push(tokio::spawn(async move {
            let mut c = GroupConsumer::subscribe(config, &[topic]).await.unwrap();
            while !stop.load(Ordering::Acquire) {
                let records = c.poll(Duration::from_millis(200)).await.unwrap();
                let mut seen = consumed.lock().unwrap();
                for r in records {
                    *seen.entry((r.partition, r.offset)).or_default() += 1;
                }
                drop(seen);
                assignments.lock().unwrap()[idx] = c.assignment().iter().map(|tp| tp.partition).collect();
            }
            c.close().await.unwrap();
        }));
    }
    let covered = |want: &BTreeSet<i32>| {
        let a = assignments.lock().unwrap();
        !a.iter().any(BTreeSet::is_empty) && a.iter().flatten().copied().collect::<BTreeSet<i32>>() == *want
    };

    // Both members own a share of the 2 partitions and records flow.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !covered(&(0..2).collect()) || consumed.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the group never settled on 2 partitions: {:?}", assignments.lock().unwrap());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    admin.create_partitions(topic, 4).await.unwrap();
    let grown = Instant::now();
    let all: BTreeSet<i32> = (0..4).collect();
    let on_new = || acked.lock().unwrap().iter().map(|(p, _)| *p).filter(|p| *p >= 2).collect::<BTreeSet<i32>>();
    // When each side first covered the new partitions.
    let (mut group_took, mut producer_took) = (None, None);
    while group_took.is_none() || producer_took.is_none() {
        if group_took.is_none() && covered(&all) {
            group_took = Some(grown.elapsed());
        }
        if producer_took.is_none() && on_new() == (2..4).collect() {
            producer_took = Some(grown.elapsed());
        }
        assert!(
            grown.elapsed() < Duration::from_secs(10),
            "10 s after CreatePartitions the group owns only {:?} and the producer wrote to new partitions {:?}",
            assignments.lock().unwrap(),
            on_new()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (group_took, producer_took) = (group_took.unwrap(), producer_took.unwrap());
    // Keep producing a little on the grown topic, then let the group drain.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop_producing.store(true, Ordering::Release);
    sending.await.unwrap();

    let acked = acked.lock().unwrap().clone();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let missing = acked.iter().filter(|k| !consumed.lock().unwrap().contains_key(k)).count();
        if missing == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{missing} of {} acknowledged records were never consumed", acked.len());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop_consuming.store(true, Ordering::Release);
    for m in members {
        m.await.unwrap();
    }
    let duplicates: usize = consumed.lock().unwrap().values().map(|n| n - 1).sum();
    let per_partition = acked.iter().fold(BTreeMap::<i32, usize>::new(), |mut m, (p, _)| {
        *m.entry(*p).or_default() += 1;
        m
    });
    eprintln!(
        "grew 2 -> 4: group assignment covered 4 partitions after {group_took:?}, producer wrote to 2 and 3 after \
         {producer_took:?}; {} records acknowledged {per_partition:?}, all consumed, {duplicates} duplicates",
        acked.len()
    );
}
