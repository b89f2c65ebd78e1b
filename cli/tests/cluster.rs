//! Cluster mode end to end: three `fjord broker` processes on a real ZooKeeper
//! (fjord-testkit), killed with SIGKILL, paused with SIGSTOP and restarted on their data
//! dirs, with fjord-client and kcat as the clients. What must hold: every acknowledged
//! message survives and is read back in order, and the replicas converge byte for byte.
//!
//! The tests run one at a time (each one runs ZooKeeper and three brokers on a machine
//! that may have two cores), and the brokers use 3 s ZooKeeper sessions (testkit's
//! default), so a killed broker is noticed in seconds.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fjord_client::{
    Acks, Admin, ClientConfig, Consumer, ConsumerConfig, NewTopic, OffsetSpec, Producer, ProducerConfig, ProducerRecord,
    ResponseError, SeekTo, TopicPartition,
};
use fjord_testkit::{wait_until, Cluster};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::ChildStdout;

/// Bound on every wait for the cluster to react (a session expiry, an election, a
/// follower catching up).
const REACT: Duration = Duration::from_secs(30);

/// One cluster test at a time in this binary. An async lock, since it is held across every
/// await of a test; a test that panics releases it as it unwinds.
async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    SERIAL.lock().await
}

/// Three broker processes: replication factor 3 and `min.insync.replicas` 2 by default.
async fn start_cluster(extra: &[(&str, &str)]) -> Cluster {
    let mut builder = Cluster::builder()
        .brokers(3)
        .processes(env!("CARGO_BIN_EXE_fjord"))
        .config("default.replication.factor", 3)
        .config("min.insync.replicas", 2)
        // Followers poll at least every 100 ms, so an answered fetch is never far away.
        .config("replica.fetch.wait.max.ms", 100);
    for (key, value) in extra {
        builder = builder.config(key, value);
    }
    builder.start().await.expect("cluster starts")
}

fn client(cluster: &Cluster) -> ClientConfig {
    ClientConfig {
        connect_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(10),
        ..ClientConfig::new(&cluster.bootstrap())
    }
}

async fn create_topic(cluster: &Cluster, topic: &str, partitions: i32, configs: &[(&str, &str)]) {
    cluster.create_topic(topic, partitions, configs, REACT).await.unwrap();
}

/// A producer that keeps order per partition across retries (one request in flight).
async fn start_producer(cluster: &Cluster, acks: Acks, retries: u32) -> Producer {
    Producer::connect(ProducerConfig {
        client: client(cluster),
        acks,
        retries,
        max_in_flight: 1,
        delivery_timeout: Duration::from_secs(60),
        ..ProducerConfig::default()
    })
    .await
    .unwrap()
}

/// Every record of `topic` from offset 0 to the high watermark, per partition:
/// (offset, value).
async fn consume_all(cluster: &Cluster, topic: &str, partitions: i32) -> BTreeMap<i32, Vec<(i64, String)>> {
    let config = ClientConfig { allow_auto_create_topics: false, ..client(cluster) };
    let admin = Admin::connect(config.clone()).await.unwrap();
    let ends: Vec<i64> = wait_until(REACT, "the end offsets", || {
        let asked: Vec<_> = (0..partitions).map(|p| (topic.to_string(), p, OffsetSpec::Latest)).collect();
        let admin = &admin;
        async move { Ok(Some(admin.list_offsets(&asked).await?)) }
    })
    .await
    .unwrap();
    let mut consumer = Consumer::connect(ConsumerConfig { client: config, ..ConsumerConfig::default() }).await.unwrap();
    let tps: Vec<TopicPartition> = (0..partitions).map(|p| TopicPartition::new(topic, p)).collect();
    consumer.assign(tps.clone()).await.unwrap();
    for tp in &tps {
        consumer.seek(tp, SeekTo::Beginning).unwrap();
    }
    let mut out: BTreeMap<i32, Vec<(i64, String)>> = (0..partitions).map(|p| (p, Vec::new())).collect();
    let done = |out: &BTreeMap<i32, Vec<(i64, String)>>| {
        (0..partitions).all(|p| out[&p].last().map_or(-1, |(o, _)| *o) + 1 >= ends[p as usize])
    };
    let deadline = tokio::time::Instant::now() + REACT;
    while !done(&out) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "consumed {:?} of ends {ends:?}",
            out.values().map(Vec::len).collect::<Vec<_>>()
        );
        for r in consumer.poll(Duration::from_secs(1)).await.unwrap() {
            let value = String::from_utf8(r.value.unwrap().to_vec()).unwrap();
            out.get_mut(&r.partition).unwrap().push((r.offset, value));
        }
    }
    out
}

/// Waits until the partition's log is the same bytes on every broker, and returns them.
async fn wait_identical_replicas(cluster: &Cluster, topic: &str, partition: i32) -> Vec<u8> {
    wait_until(REACT, &format!("identical replicas of {topic}-{partition}"), || async {
        let logs: Vec<Vec<u8>> =
            cluster.ids().iter().map(|&id| cluster.log_bytes(id, topic, partition)).collect::<anyhow::Result<_>>()?;
        Ok(logs.windows(2).all(|w| w[0] == w[1]).then(|| logs[0].clone()))
    })
    .await
    .unwrap_or_else(|e| {
        let sizes: Vec<_> =
            cluster.ids().iter().map(|&id| cluster.log_bytes(id, topic, partition).map(|b| b.len()).ok()).collect();
        panic!("{e:#}\nlog sizes per broker: {sizes:?}")
    })
}

/// (a) 200,000 numbered messages, acks=all, while partition leaders are killed with
/// SIGKILL and restarted: every acknowledged message is read back at its acknowledged
/// offset, in order per partition, and the three replicas end byte-identical.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_all_survives_kill_9_of_leaders_and_replicas_converge() {
    const MESSAGES: usize = 200_000;
    const PARTITIONS: i32 = 6;
    let _serial = serial().await;
    let mut cluster = start_cluster(&[]).await;
    create_topic(&cluster, "numbers", PARTITIONS, &[]).await;

    let producer = start_producer(&cluster, Acks::All, u32::MAX).await;
    let acked = Arc::new(AtomicUsize::new(0));
    // The producer sends up to a gate the chaos below opens phase by phase, so that each
    // kill falls in the middle of a stream (unopened, the producer would finish first);
    // a second task awaits the acknowledgements in send order and counts them.
    let (gate, mut allowed) = tokio::sync::watch::channel(MESSAGES / 3);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let sending = {
        let producer = producer.clone();
        tokio::spawn(async move {
            for i in 0..MESSAGES {
                allowed.wait_for(|&allowed| i < allowed).await.unwrap();
                let record = ProducerRecord::new("numbers", i.to_string()).partition((i % PARTITIONS as usize) as i32);
                tx.send((i, producer.send(record).await.unwrap())).unwrap();
            }
        })
    };
    let acknowledging = {
        let acked = acked.clone();
        tokio::spawn(async move {
            let mut results = Vec::with_capacity(MESSAGES);
            while let Some((i, delivery)) = rx.recv().await {
                results.push((i, delivery.await));
                acked.fetch_add(1, Ordering::Relaxed);
            }
            results
        })
    };

    // Two rounds: once most of a phase is acknowledged, open the next one and kill the
    // leader of one partition while the records stream; they keep coming while it is
    // dead and the others elect. Restart it and wait until it is back in every ISR before
    // the next round (with two brokers down, acks=all would rightly stall).
    for (round, partition) in [(1, 0), (2, 3)] {
        let progress = round * MESSAGES / 3 - MESSAGES / 12;
        wait_until(REACT * 2, &format!("{progress} acknowledgements"), || async {
            Ok((acked.load(Ordering::Relaxed) >= progress).then_some(()))
        })
        .await
        .unwrap();
        let victim = cluster.leader("numbers", partition).await.unwrap().expect("a leader");
        gate.send_replace((round + 1) * MESSAGES / 3);
        cluster.kill(victim).await.unwrap();
        let acked_at_kill = acked.load(Ordering::Relaxed);
        let new_leader = cluster
            .wait_for_state("numbers", partition, REACT, "a leader other than the killed one", |s| {
                s.leader >= 0 && s.leader != victim
            })
            .await
            .unwrap()
            .leader;
        eprintln!(
            "round {round}: killed leader {victim} of numbers-{partition} at {acked_at_kill} acks; new leader {new_leader}"
        );
        cluster.start(victim).await.unwrap();
        cluster.wait_fully_replicated("numbers", REACT).await.unwrap();
    }
    gate.send_replace(MESSAGES);
    sending.await.unwrap();
    producer.flush().await;
    let results = acknowledging.await.unwrap();

    let failed: Vec<_> = results.iter().filter_map(|(i, r)| r.as_ref().err().map(|e| (i, e.to_string()))).collect();
    assert!(failed.is_empty(), "{} sends failed, e.g. {:?}", failed.len(), &failed[..failed.len().min(5)]);
    let consumed = consume_all(&cluster, "numbers", PARTITIONS).await;
    for partition in 0..PARTITIONS {
        let log: BTreeMap<i64, &str> = consumed[&partition].iter().map(|(o, v)| (*o, v.as_str())).collect();
        let mut previous = -1;
        for (i, result) in results.iter().filter(|(i, _)| (*i % PARTITIONS as usize) as i32 == partition) {
            let offset = result.as_ref().unwrap().offset;
            assert_eq!(
                log.get(&offset).copied(),
                Some(i.to_string().as_str()),
                "message {i} acknowledged at {partition}:{offset}"
            );
            assert!(offset > previous, "message {i} at {offset} after an earlier message at {previous}: out of order");
            previous = offset;
        }
        wait_identical_replicas(&cluster, "numbers", partition).await;
    }
}

/// (b) With two of three brokers down the ISR is one replica, below
/// `min.insync.replicas` = 2: acks=all is refused with NOT_ENOUGH_REPLICAS and nothing is
/// appended. Once they return, everything acknowledged before is still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_brokers_down_refuses_acks_all_and_loses_nothing() {
    let _serial = serial().await;
    let mut cluster = start_cluster(&[]).await;
    create_topic(&cluster, "few", 1, &[]).await;
    let producer = start_producer(&cluster, Acks::All, u32::MAX).await;
    for i in 0..100 {
        producer.send(ProducerRecord::new("few", format!("before-{i}")).partition(0)).await.unwrap().await.unwrap();
    }

    // The leader and one follower go: the survivor is elected and alone in the ISR.
    let leader = cluster.leader("few", 0).await.unwrap().unwrap();
    let survivor = *cluster.ids().iter().find(|&&id| id != leader).unwrap();
    let down: Vec<i32> = cluster.ids().into_iter().filter(|&id| id != survivor).collect();
    for &id in &down {
        cluster.kill(id).await.unwrap();
    }
    cluster.wait_for_isr("few", 0, &[survivor], REACT).await.unwrap();
    let before = cluster.log_bytes(survivor, "few", 0).unwrap();

    // A producer that does not retry, to see the broker's answer; a fresh one per try,
    // until its metadata names the survivor as leader (the dead leader refuses connections).
    wait_until(REACT, "NOT_ENOUGH_REPLICAS from the survivor", || async {
        let strict = start_producer(&cluster, Acks::All, 0).await;
        match strict.send(ProducerRecord::new("few", "refused").partition(0)).await?.await {
            Ok(written) => anyhow::bail!("acks=all succeeded with one replica in sync: {written:?}"),
            Err(e) if e.code() == Some(ResponseError::NotEnoughReplicas) => Ok(Some(e)),
            Err(e) => Err(e.into()),
        }
    })
    .await
    .unwrap();
    assert_eq!(cluster.log_bytes(survivor, "few", 0).unwrap(), before, "a refused batch is not appended");

    for &id in &down {
        cluster.start(id).await.unwrap();
    }
    cluster.wait_for_isr("few", 0, &cluster.ids(), REACT).await.unwrap();
    for i in 0..10 {
        producer.send(ProducerRecord::new("few", format!("after-{i}")).partition(0)).await.unwrap().await.unwrap();
    }
    let values: Vec<String> = consume_all(&cluster, "few", 1).await.remove(&0).unwrap().into_iter().map(|(_, v)| v).collect();
    let expected: Vec<String> = (0..100).map(|i| format!("before-{i}")).chain((0..10).map(|i| format!("after-{i}"))).collect();
    assert_eq!(values, expected);
    wait_identical_replicas(&cluster, "few", 0).await;
}

/// (c) The truncation case: the old leader has records 90..100 that only it wrote
/// (acks=1, followers paused), the new leader writes different records at 90..100, and
/// the old leader, back as a follower, must drop its own and take the new leader's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returning_leader_truncates_what_the_new_leader_never_had() {
    let _serial = serial().await;
    // 6 s sessions: the paused followers must keep theirs (ZooKeeper pings stop too).
    let mut cluster = start_cluster(&[("zookeeper.session.timeout.ms", "6000")]).await;
    create_topic(&cluster, "diverge", 1, &[]).await;
    let all = start_producer(&cluster, Acks::All, u32::MAX).await;
    for i in 0..90 {
        all.send(ProducerRecord::new("diverge", format!("same-{i:03}")).partition(0)).await.unwrap().await.unwrap();
    }
    wait_identical_replicas(&cluster, "diverge", 0).await;
    // Connected and with metadata now: a client bootstrapping while brokers are paused
    // would wait out its request timeout on them.
    let one = start_producer(&cluster, Acks::Leader, 0).await;
    one.partition_count("diverge").await.unwrap();

    let old_leader = cluster.leader("diverge", 0).await.unwrap().unwrap();
    let followers: Vec<i32> = cluster.ids().into_iter().filter(|&id| id != old_leader).collect();
    for &id in &followers {
        cluster.pause(id).unwrap();
    }
    // A fetch a follower sent before it stopped may still wait at the leader
    // (replica.fetch.wait.max.ms = 100) and would carry the new records into the stopped
    // follower's socket. Past that bound every such fetch has been answered empty; the
    // stopped followers cannot send another. This is the protocol's bound, not a guess.
    tokio::time::sleep(Duration::from_millis(400)).await;
    for i in 90..100 {
        one.send(ProducerRecord::new("diverge", format!("lost-{i:03}")).partition(0)).await.unwrap().await.unwrap();
    }
    let old_log = cluster.log_bytes(old_leader, "diverge", 0).unwrap();
    assert!(contains(&old_log, b"lost-099"), "the old leader wrote 90..100");
    cluster.kill(old_leader).await.unwrap();
    for &id in &followers {
        cluster.resume(id).unwrap();
    }
    let new_leader = cluster
        .wait_for_state("diverge", 0, REACT, "a new leader", |s| s.leader >= 0 && s.leader != old_leader)
        .await
        .unwrap()
        .leader;
    assert!(followers.contains(&new_leader));
    let fresh = start_producer(&cluster, Acks::All, u32::MAX).await;
    for i in 90..100 {
        let written =
            fresh.send(ProducerRecord::new("diverge", format!("kept-{i:03}")).partition(0)).await.unwrap().await.unwrap();
        assert_eq!(written.offset, i, "the new leader continues at 90: it never had the old leader's 90..100");
    }

    cluster.start(old_leader).await.unwrap();
    cluster.wait_for_isr("diverge", 0, &cluster.ids(), REACT).await.unwrap();
    let log = wait_identical_replicas(&cluster, "diverge", 0).await;
    assert!(!contains(&log, b"lost-"), "the old leader dropped its 90..100");
    let values: Vec<String> = consume_all(&cluster, "diverge", 1).await.remove(&0).unwrap().into_iter().map(|(_, v)| v).collect();
    let expected: Vec<String> =
        (0..90).map(|i| format!("same-{i:03}")).chain((90..100).map(|i| format!("kept-{i:03}"))).collect();
    assert_eq!(values, expected);
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// kcat's `-L` line for a partition: `partition 0, leader 2, replicas: ...`.
async fn kcat_leader(bootstrap: &str, topic: &str, partition: i32) -> Option<i32> {
    let out = tokio::process::Command::new("kcat").args(["-b", bootstrap, "-L", "-t", topic]).output().await.ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = text.lines().find(|l| l.trim_start().starts_with(&format!("partition {partition},")))?;
    line.split(',').find_map(|part| part.trim().strip_prefix("leader ")).and_then(|id| id.trim().parse().ok())
}

/// Reads lines into `seen` until it holds `count`.
async fn read_lines(lines: &mut Lines<BufReader<ChildStdout>>, seen: &mut Vec<String>, count: usize) {
    tokio::time::timeout(REACT, async {
        while seen.len() < count {
            seen.push(lines.next_line().await.unwrap().expect("kcat exited"));
        }
    })
    .await
    .unwrap_or_else(|_| panic!("kcat printed {} of {count} records", seen.len()));
}

/// (d) kcat (librdkafka) consuming from the cluster follows a leader change: its
/// metadata shows the new leader and it keeps consuming without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kcat_follows_a_leader_change_and_keeps_consuming() {
    let _serial = serial().await;
    let mut cluster = start_cluster(&[]).await;
    create_topic(&cluster, "watched", 1, &[]).await;
    let bootstrap = cluster.bootstrap();
    let mut kcat = tokio::process::Command::new("kcat")
        .args(["-b", &bootstrap, "-C", "-t", "watched", "-p", "0", "-o", "beginning", "-u", "-f", "%o:%s\n"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("kcat must be installed (cargo xtask test installs it)");
    let mut lines = BufReader::new(kcat.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    let producer = start_producer(&cluster, Acks::All, u32::MAX).await;
    for i in 0..50 {
        producer.send(ProducerRecord::new("watched", format!("v{i}")).partition(0)).await.unwrap().await.unwrap();
    }
    read_lines(&mut lines, &mut seen, 50).await;

    let leader = cluster.leader("watched", 0).await.unwrap().unwrap();
    assert_eq!(kcat_leader(&bootstrap, "watched", 0).await, Some(leader));
    cluster.kill(leader).await.unwrap();
    let new_leader = cluster
        .wait_for_state("watched", 0, REACT, "a new leader", |s| s.leader >= 0 && s.leader != leader)
        .await
        .unwrap()
        .leader;
    wait_until(REACT, "kcat -L shows the new leader", || async {
        Ok((kcat_leader(&bootstrap, "watched", 0).await == Some(new_leader)).then_some(()))
    })
    .await
    .unwrap();
    for i in 50..100 {
        producer.send(ProducerRecord::new("watched", format!("v{i}")).partition(0)).await.unwrap().await.unwrap();
    }
    read_lines(&mut lines, &mut seen, 100).await;
    let expected: Vec<String> = (0..100).map(|i| format!("{i}:v{i}")).collect();
    assert_eq!(seen, expected, "kcat read every record once, in order, across the leader change");
    kcat.kill().await.unwrap();
}

/// (e) Controller failover: kill the controller; another broker takes over (a higher
/// controller epoch), moves the dead broker's leaderships, and creates topics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_controller_takes_over_and_creates_topics() {
    let _serial = serial().await;
    let mut cluster = start_cluster(&[]).await;
    create_topic(&cluster, "spread", 3, &[]).await;
    let controller = cluster.wait_for_controller(&[], REACT).await.unwrap();
    let epoch_before = controller_epoch(&cluster).await;

    cluster.kill(controller).await.unwrap();
    let successor = cluster.wait_for_controller(&[controller], REACT).await.unwrap();
    // It wins /controller first, then bumps the epoch (before it acts).
    wait_until(REACT, "the new controller's epoch", || async {
        Ok((controller_epoch(&cluster).await > epoch_before).then_some(()))
    })
    .await
    .unwrap();
    for partition in 0..3 {
        let state = cluster
            .wait_for_state("spread", partition, REACT, "a live leader and no dead ISR member", |s| {
                s.leader >= 0 && s.leader != controller && !s.isr.contains(&controller)
            })
            .await
            .unwrap();
        assert!(state.isr.len() == 2, "{state:?}");
    }

    // Two live brokers: replication factor 2 is possible, 3 is not.
    let admin = Admin::connect(client(&cluster)).await.unwrap();
    let mut new = NewTopic::new("after-failover", 4);
    new.replication_factor = 2;
    admin.create_topics(&[new]).await.unwrap();
    cluster.wait_fully_replicated("after-failover", REACT).await.unwrap();
    let assignment = cluster.assignment("after-failover").await.unwrap().unwrap();
    assert!(assignment.partitions.values().all(|r| r.len() == 2 && !r.contains(&controller)), "{assignment:?}");
    let mut too_many = NewTopic::new("too-replicated", 1);
    too_many.replication_factor = 3;
    let error = admin.create_topics(&[too_many]).await.unwrap_err();
    assert_eq!(error.code(), Some(ResponseError::InvalidReplicationFactor), "{error}");

    let producer = start_producer(&cluster, Acks::All, u32::MAX).await;
    for p in 0..4 {
        producer.send(ProducerRecord::new("after-failover", format!("p{p}")).partition(p)).await.unwrap().await.unwrap();
    }
    let consumed = consume_all(&cluster, "after-failover", 4).await;
    for p in 0..4 {
        assert_eq!(consumed[&p], vec![(0, format!("p{p}"))]);
    }

    // The old controller returns as an ordinary broker.
    cluster.start(controller).await.unwrap();
    cluster.wait_fully_replicated("spread", REACT).await.unwrap();
    assert_eq!(cluster.controller().await.unwrap(), Some(successor));
}

async fn controller_epoch(cluster: &Cluster) -> i64 {
    let (data, _) = cluster.store().get(fjord_coord::paths::CONTROLLER_EPOCH).await.unwrap().expect("/controller_epoch");
    String::from_utf8(data).unwrap().trim().parse().expect("/controller_epoch is a number")
}

/// A broker whose ZooKeeper is gone stops on SIGTERM within seconds: its controlled
/// shutdown cannot deregister it, and no controller could move its leaderships while the
/// store is unreachable, so it does not wait for them (it waited out its whole 30 s
/// handover, 43 s in all with 400 partitions, before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_without_its_zookeeper_stops_promptly_on_sigterm() {
    let _serial = serial().await;
    let mut zk = fjord_testkit::ZooKeeper::start().unwrap();
    let mut cluster = Cluster::builder()
        .brokers(1)
        .processes(env!("CARGO_BIN_EXE_fjord"))
        .zookeeper(zk.connect_string())
        .start()
        .await
        .unwrap();
    cluster.create_topic("led", 8, &[], REACT).await.unwrap();
    for p in 0..8 {
        cluster.wait_for_leader("led", p, REACT).await.unwrap();
    }
    zk.kill().unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let started = std::time::Instant::now();
    cluster.stop(0).await.unwrap(); // SIGTERM; it must exit 0
    let took = started.elapsed();
    let log = cluster.log_tail(0, 40);
    assert!(took < Duration::from_secs(20), "stopped {took:?} after SIGTERM:\n{log}");
    assert!(log.contains("broker stopped: logs flushed and checkpointed"), "{log}");
}
