//! `fjord mirror` end to end on loopback: in-process source and target brokers (each a
//! standalone broker with its own data dir), the mirror as a library or as the `fjord`
//! binary (so it can be killed with SIGKILL), and checks of every copied record.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use bytes::Bytes;
use fjord_client::{
    Acks, Admin, ClientConfig, Consumer, ConsumerConfig, ConsumerRecord, GroupAdmin, IsolationLevel, NewTopic, OffsetReset,
    OffsetSpec, Producer, ProducerConfig, ProducerRecord, TopicPartition,
};
use fjord_testkit::StandaloneBroker;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

async fn start_broker(retention_check: Duration) -> StandaloneBroker {
    StandaloneBroker::start_with(|c| {
        c.retention_check_interval = retention_check;
        c.group.initial_rebalance_delay_ms = 0;
        // Small segments for the retention test: below the default floor of segment.bytes.
        c.set("log.min.segment.bytes", "2048").unwrap();
    })
    .await
    .expect("broker starts")
}

async fn admin(addr: &str) -> Admin {
    Admin::connect(ClientConfig::new(addr)).await.unwrap()
}

async fn create(addr: &str, topic: &str, partitions: i32, configs: &[(&str, &str)]) {
    let mut t = NewTopic::new(topic, partitions);
    t.configs = configs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let a = admin(addr).await;
    a.create_topics(&[t]).await.unwrap();
    // Leaders are elected a moment after CreateTopics answered.
    wait_for("leaders of the new topic", Duration::from_secs(10), || async {
        a.describe_topic(topic).await.is_ok_and(|t| t.partitions.iter().all(|p| p.leader >= 0))
    })
    .await;
}

/// Produces `n` records keyed `k{i % 1000}` with value `{prefix}:{i}`; returns each
/// value's (partition, offset).
async fn produce(addr: &str, topic: &str, prefix: &str, range: std::ops::Range<usize>) -> HashMap<String, (i32, i64)> {
    produce_batched(addr, topic, prefix, range, 128 * 1024).await
}

async fn produce_batched(
    addr: &str,
    topic: &str,
    prefix: &str,
    range: std::ops::Range<usize>,
    batch_size: usize,
) -> HashMap<String, (i32, i64)> {
    let producer = Producer::connect(ProducerConfig {
        client: ClientConfig::new(addr),
        acks: Acks::Leader,
        batch_size,
        ..Default::default()
    })
    .await
    .unwrap();
    let mut pending = Vec::with_capacity(range.len());
    for i in range {
        let value = format!("{prefix}:{i}");
        let record = ProducerRecord::new(topic, value.clone())
            .key(format!("k{}", i % 1000))
            .header("trace", Some(Bytes::from(format!("t{i}"))));
        pending.push((value, producer.send(record).await.unwrap()));
    }
    let mut out = HashMap::with_capacity(pending.len());
    for (value, delivery) in pending {
        let m = delivery.await.unwrap();
        out.insert(value, (m.partition, m.offset));
    }
    producer.close().await;
    out
}

async fn offsets(addr: &str, topic: &str, spec: OffsetSpec) -> Vec<i64> {
    let a = admin(addr).await;
    let n = a.describe_topic(topic).await.unwrap().partitions.len() as i32;
    a.list_offsets(&(0..n).map(|p| (topic.to_string(), p, spec)).collect::<Vec<_>>()).await.unwrap()
}

/// Records in `topic` (sum of log end offsets); -1 while it is missing or leaderless (a
/// topic the mirror just created gets its leaders a moment later).
async fn total(addr: &str, topic: &str) -> i64 {
    let a = admin(addr).await;
    let Ok(t) = a.describe_topic(topic).await else { return -1 };
    let specs: Vec<_> = t.partitions.iter().map(|p| (topic.to_string(), p.partition, OffsetSpec::Latest)).collect();
    a.list_offsets(&specs).await.map_or(-1, |o| o.iter().sum())
}

/// Waits until `f` is true, polling every 50 ms, failing after `limit`.
async fn wait_for<F, Fut>(what: &str, limit: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !f().await {
        assert!(Instant::now() < deadline, "timed out after {limit:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every record of `topic` from the log start to the end, per partition in order.
async fn read_all(addr: &str, topic: &str) -> BTreeMap<i32, Vec<ConsumerRecord>> {
    let ends = offsets(addr, topic, OffsetSpec::Latest).await;
    let starts = offsets(addr, topic, OffsetSpec::Earliest).await;
    let mut consumer = Consumer::connect(ConsumerConfig {
        client: ClientConfig::new(addr),
        auto_offset_reset: OffsetReset::Earliest,
        fetch_max_wait: Duration::from_millis(50),
        ..Default::default()
    })
    .await
    .unwrap();
    consumer.assign_topic(topic).await.unwrap();
    let want: i64 = ends.iter().zip(&starts).map(|(e, s)| e - s).sum();
    let mut out: BTreeMap<i32, Vec<ConsumerRecord>> = BTreeMap::new();
    let mut got = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while got < want {
        assert!(Instant::now() < deadline, "read {got} of {want} records of {topic}");
        for r in consumer.poll(Duration::from_millis(200)).await.unwrap() {
            if r.offset < ends[r.partition as usize] {
                got += 1;
                out.entry(r.partition).or_default().push(r);
            }
        }
    }
    out
}

fn value(r: &ConsumerRecord) -> String {
    String::from_utf8(r.value.as_deref().unwrap().to_vec()).unwrap()
}

fn header<'a>(r: &'a ConsumerRecord, name: &str) -> Option<&'a [u8]> {
    r.headers.iter().find(|(k, _)| k == name).and_then(|(_, v)| v.as_deref())
}

fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

async fn http_get(addr: &str, path: &str) -> String {
    let (addr, path) = (addr.to_string(), path.to_string());
    tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sources_are_mirrored_completely_in_per_key_order_while_a_dead_source_is_retried() {
    const N: usize = 100_000;
    let (dc1, dc2, target) = (
        start_broker(Duration::from_secs(300)).await,
        start_broker(Duration::from_secs(300)).await,
        start_broker(Duration::from_secs(300)).await,
    );
    for dc in [&dc1, &dc2] {
        create(&dc.addr, "events", 8, &[("retention.ms", "86400000")]).await;
    }
    let (p1, p2) = tokio::join!(produce(&dc1.addr, "events", "dc1", 0..N), produce(&dc2.addr, "events", "dc2", 0..N));
    let dead = free_addr();
    let sources = vec![
        fjord_mirror::SourceConfig::parse(&format!("dc1={}", dc1.addr)).unwrap(),
        fjord_mirror::SourceConfig::parse(&format!("dc2={}", dc2.addr)).unwrap(),
        fjord_mirror::SourceConfig::parse(&format!("dc3={dead}")).unwrap(),
    ];
    let mut config = fjord_mirror::MirrorConfig::new(sources, target.addr.clone(), "ev.*");
    config.commit_interval = Duration::from_millis(500);
    let metrics = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics_addr = metrics.local_addr().unwrap().to_string();
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let mirror = tokio::spawn(fjord_mirror::run(config, Some(metrics), shutdown.clone()));

    wait_for("200,000 records in the target", Duration::from_secs(50), || async {
        total(&target.addr, "events").await >= 2 * N as i64
    })
    .await;
    eprintln!("mirrored {} records in {:?}", 2 * N, started.elapsed());
    // The target topic got the source's partition count and configs.
    let t = admin(&target.addr).await;
    assert_eq!(t.describe_topic("events").await.unwrap().partitions.len(), 8);
    let retention = t.describe_configs("events").await.unwrap().into_iter().find(|c| c.name == "retention.ms").unwrap();
    assert_eq!(retention.value.as_deref(), Some("86400000"));

    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut last_per_key: HashMap<(String, String), usize> = HashMap::new();
    for (partition, records) in read_all(&target.addr, "events").await {
        for r in records {
            let v = value(&r);
            let origin =
                std::str::from_utf8(header(&r, fjord_mirror::ORIGIN_HEADER).expect("origin header")).unwrap().to_string();
            let (prefix, i) = v.split_once(':').unwrap();
            assert_eq!(prefix, origin, "{v} has origin {origin}");
            let i: usize = i.parse().unwrap();
            let source = if origin == "dc1" { &p1 } else { &p2 };
            assert_eq!(source[&v].0, partition, "{v} left its partition");
            let key = std::str::from_utf8(r.key.as_deref().unwrap()).unwrap().to_string();
            assert_eq!(key, format!("k{}", i % 1000));
            assert_eq!(header(&r, "trace"), Some(format!("t{i}").as_bytes()), "headers are copied");
            // Per key and origin, the target holds the records in the order produced.
            if let Some(prev) = last_per_key.insert((origin, key), i) {
                assert!(prev < i, "{v} after {prev}: per-key order broken");
            }
            *seen.entry(v).or_default() += 1;
        }
    }
    assert_eq!(seen.len(), 2 * N, "every message is in the target");
    assert!(seen.values().all(|n| *n == 1), "no duplicates without a crash");

    // The dead source is retried and reported, the others are up with zero lag.
    wait_for("zero lag reported", Duration::from_secs(20), || async {
        let s = fjord_mirror::fetch_status(&metrics_addr).await.unwrap();
        s.sources[..2].iter().all(|s| s.partitions.len() == 8 && s.partitions.iter().all(|p| p.lag == Some(0)))
    })
    .await;
    let status = fjord_mirror::fetch_status(&metrics_addr).await.unwrap();
    assert_eq!(status.sources[0].state, fjord_mirror::SourceState::Up);
    assert_eq!(status.sources[0].records, N as u64);
    assert_eq!(status.sources[2].state, fjord_mirror::SourceState::Retrying);
    assert!(status.sources[2].failures >= 2, "{:?}", status.sources[2]);
    assert!(status.sources[2].last_error.as_deref().unwrap().contains(&dead));
    assert!(status.gaps.is_empty());
    let metrics = http_get(&metrics_addr, "/metrics").await;
    assert!(metrics.contains("fjord_mirror_source_up{source=\"dc3\"} 0"), "{metrics}");
    assert!(metrics.contains("fjord_mirror_lag{source=\"dc1\",topic=\"events\",partition=\"7\"} 0"), "{metrics}");
    assert!(metrics.contains(&format!("fjord_mirror_records_total{{source=\"dc2\",topic=\"events\"}} {N}")), "{metrics}");

    // A new matching topic is picked up while running.
    create(&dc1.addr, "everything-else", 2, &[]).await;
    produce(&dc1.addr, "everything-else", "dc1", 0..10).await;
    wait_for("the new topic mirrored", Duration::from_secs(30), || async { total(&target.addr, "everything-else").await == 10 })
        .await;

    shutdown.cancel();
    mirror.await.unwrap().unwrap();
}

/// The `fjord mirror` binary as a child, its output (the log) to a file the test reads.
struct MirrorProcess {
    child: Child,
    log: std::path::PathBuf,
}

impl MirrorProcess {
    fn start(args: &[&str], log: std::path::PathBuf) -> Self {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_fjord"))
            .arg("mirror")
            .args(args)
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap();
        Self { child, log }
    }

    fn kill9(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Sends a signal with kill(1), e.g. `-STOP` or `-CONT`.
    fn signal(&self, signal: &str) {
        let status = Command::new("kill").arg(signal).arg(self.child.id().to_string()).status().unwrap();
        assert!(status.success(), "kill {signal} {}", self.child.id());
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap()
    }
}

impl Drop for MirrorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn committed(addr: &str, group: &str) -> BTreeMap<TopicPartition, i64> {
    GroupAdmin::connect(ClientConfig::new(addr)).await.unwrap().committed_offsets(group).await.unwrap()
}

async fn all_committed(addr: &str, group: &str, topic: &str) -> bool {
    let ends = offsets(addr, topic, OffsetSpec::Latest).await;
    let c = committed(addr, group).await;
    ends.iter().enumerate().all(|(p, end)| c.get(&TopicPartition::new(topic, p as i32)) == Some(end))
}

/// Records in `events` on the source across a kill -9 run: half before the kill, half after
/// (on a fast machine the mirror could otherwise copy everything between two checks and
/// leave no kill to test).
const N: usize = 100_000;

/// The start of a kill -9 run: a source and a target broker, `events` on the source with
/// its first `N / 2` records, and the mirror's arguments (group `g`, source alias `dc1`,
/// commits every 300 ms, then `extra`).
struct KillRun {
    source: StandaloneBroker,
    target: StandaloneBroker,
    produced: HashMap<String, (i32, i64)>,
    dir: tempfile::TempDir,
    args: Vec<String>,
}

impl KillRun {
    async fn start(partitions: i32, extra: &[&str]) -> Self {
        let (source, target) = (start_broker(Duration::from_secs(300)).await, start_broker(Duration::from_secs(300)).await);
        create(&source.addr, "events", partitions, &[]).await;
        let produced = produce(&source.addr, "events", "dc1", 0..N / 2).await;
        let src = format!("dc1={}", source.addr);
        let common = ["--source", &src, "--target", &target.addr, "--topics", "events", "--group", "g"];
        let args = common
            .iter()
            .chain(&["--instance-id", "m1", "--commit-interval", "300ms"])
            .chain(extra)
            .map(|a| a.to_string())
            .collect();
        KillRun { source, target, produced, dir: tempfile::tempdir().unwrap(), args }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_midway_loses_nothing_and_duplicates_only_what_followed_the_last_commit() {
    let KillRun { source, target, mut produced, dir, args } = KillRun::start(8, &[]).await;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut first = MirrorProcess::start(&args, dir.path().join("first.log"));
    wait_for("the copy under way", Duration::from_secs(40), || async { total(&target.addr, "events").await >= N as i64 / 20 })
        .await;
    first.kill9();
    // Produce requests already on the wire still land: wait until the target stops growing.
    let mut at_kill: i64 = -1;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now: i64 = offsets(&target.addr, "events", OffsetSpec::Latest).await.iter().sum();
        if now == at_kill {
            break;
        }
        assert!(Instant::now() < deadline, "the target kept growing after the kill");
        at_kill = now;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(at_kill >= N as i64 / 20, "{}", first.log());
    let commits = committed(&source.addr, "g").await;
    let committed_at_kill: Vec<i64> =
        (0..8).map(|p| commits.get(&TopicPartition::new("events", p)).copied().unwrap_or(0)).collect();
    eprintln!("killed with {at_kill} records in the target, {} committed", committed_at_kill.iter().sum::<i64>());

    produced.extend(produce(&source.addr, "events", "dc1", N / 2..N).await);
    let _second = MirrorProcess::start(&args, dir.path().join("second.log"));
    wait_for("everything committed after the restart", Duration::from_secs(40), || all_committed(&source.addr, "g", "events"))
        .await;

    // Per target partition (= source partition), the source offsets copied must read
    // 0, 1, ..., m-1, c, c+1, ..., end-1 with c the offset committed at the kill and
    // c <= m: the first run's copies, then the second run from the commit on.
    let mut duplicates = 0i64;
    let mut present = 0usize;
    for (partition, records) in read_all(&target.addr, "events").await {
        let sources: Vec<i64> = records
            .iter()
            .map(|r| {
                let (p, o) = produced[&value(r)];
                assert_eq!(p, partition);
                o
            })
            .collect();
        let c = committed_at_kill[partition as usize];
        // m: where the second run's copies start (no step back: it started at m = c).
        let m = sources.windows(2).position(|w| w[1] <= w[0]).map_or(c, |i| i as i64 + 1);
        let expected: Vec<i64> = (0..m).chain(c..*sources.iter().max().unwrap() + 1).collect();
        assert!(
            c <= m,
            "partition {partition}: committed {c} but only {m} copied before the kill: a commit ran ahead of the target"
        );
        assert_eq!(sources, expected, "partition {partition}: copies are not 0..{m} then {c}..: loss or duplicates outside the window after the last commit");
        duplicates += m - c;
        present += sources.iter().collect::<std::collections::HashSet<_>>().len();
    }
    assert_eq!(present, N, "every message is in the target");
    let total: i64 = offsets(&target.addr, "events", OffsetSpec::Latest).await.iter().sum();
    assert_eq!(total, N as i64 + duplicates);
    // Exactly the records the killed mirror copied after its last commit came twice.
    assert_eq!(
        duplicates,
        at_kill - committed_at_kill.iter().sum::<i64>(),
        "duplicates beyond the records copied after the last commit"
    );
    eprintln!("duplicates after kill -9: {duplicates} (records copied after the last commit)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_past_the_committed_offset_is_reported_as_a_gap_with_exact_offsets() {
    let (source, target) = (start_broker(Duration::from_millis(100)).await, start_broker(Duration::from_secs(300)).await);
    // Small batches in small segments; retention keeps about 10 KB, more than the first
    // 200 records, far less than all 700.
    create(&source.addr, "r", 1, &[("segment.bytes", "2048"), ("retention.bytes", "10000")]).await;
    produce_batched(&source.addr, "r", "a", 0..200, 512).await;
    let dir = tempfile::tempdir().unwrap();
    let (src, metrics) = (format!("dc1={}", source.addr), free_addr());
    let args = [
        "--source",
        &src,
        "--target",
        &target.addr,
        "--topics",
        "r",
        "--group",
        "g",
        "--instance-id",
        "m1",
        "--commit-interval",
        "200ms",
        "--metrics",
        &metrics,
    ];
    let mut first = MirrorProcess::start(&args, dir.path().join("first.log"));
    wait_for("the first 200 records committed", Duration::from_secs(30), || all_committed(&source.addr, "g", "r")).await;
    first.kill9();
    assert_eq!(offsets(&source.addr, "r", OffsetSpec::Earliest).await[0], 0, "retention ran too early");

    // While the mirror is down: 500 more records, and retention deletes segments past
    // the committed offset 200.
    produce_batched(&source.addr, "r", "a", 200..700, 512).await;
    wait_for("retention past offset 200", Duration::from_secs(20), || async {
        offsets(&source.addr, "r", OffsetSpec::Earliest).await[0] > 200
    })
    .await;
    // Retention deletes a segment at a time until the log fits: the gap the restarted
    // mirror meets starts where the log start settles (a loaded machine showed it move
    // from 304 to 364 after the first check).
    let mut log_start = offsets(&source.addr, "r", OffsetSpec::Earliest).await[0];
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = offsets(&source.addr, "r", OffsetSpec::Earliest).await[0];
        if now == log_start {
            break;
        }
        assert!(Instant::now() < deadline, "the log start kept moving: {log_start} then {now}");
        log_start = now;
    }

    let second = MirrorProcess::start(&args, dir.path().join("second.log"));
    wait_for("the rest committed", Duration::from_secs(30), || all_committed(&source.addr, "g", "r")).await;
    let status = fjord_mirror::fetch_status(&metrics).await.unwrap();
    assert_eq!(status.gaps.len(), 1, "{:?}", status.gaps);
    let gap = &status.gaps[0];
    assert_eq!(
        (gap.source.as_str(), gap.topic.as_str(), gap.partition, gap.first_offset, gap.last_offset, gap.records),
        ("dc1", "r", 0, 200, log_start - 1, log_start - 200)
    );
    let text = http_get(&metrics, "/metrics").await;
    assert!(
        text.contains(&format!(
            "fjord_mirror_gap_records_total{{source=\"dc1\",topic=\"r\",partition=\"0\"}} {}",
            log_start - 200
        )),
        "{text}"
    );
    assert!(second.log().contains(&format!("offsets 200..={} of r-0", log_start - 1)), "{}", second.log());
    // `fjord mirror status` shows it.
    let out = Command::new(env!("CARGO_BIN_EXE_fjord")).args(["mirror", "status", "--metrics", &metrics]).output().unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        printed.contains(&format!("GAP dc1 r-0: offsets 200..={} ({} records)", log_start - 1, log_start - 200)),
        "{printed}"
    );
    assert!(printed.contains("source dc1 (") && printed.contains(": up;"), "{printed}");
    // On record in the analytics cluster too.
    let recorded = read_all(&target.addr, fjord_mirror::GAPS_TOPIC).await;
    let recorded: Vec<fjord_mirror::Gap> =
        recorded[&0].iter().map(|r| serde_json::from_slice(r.value.as_deref().unwrap()).unwrap()).collect();
    assert_eq!(&recorded, &status.gaps);
    // And `fjord audit report` on the analytics cluster lists it.
    let report = fjord_audit::collect(&fjord_audit::ReportConfig::new(ClientConfig::new(&target.addr))).await.unwrap();
    assert_eq!(report.gaps, status.gaps);
    let text = fjord_audit::render::text(&report);
    assert!(
        text.contains(&format!("known loss: mirror gap dc1 r-0 offsets 200..={} ({} records)", log_start - 1, log_start - 200)),
        "{text}"
    );
    // The target holds exactly what survived: 0..200, then log_start..700.
    let copied: Vec<String> = read_all(&target.addr, "r").await[&0].iter().map(value).collect();
    let expected: Vec<String> = (0..200).chain(log_start as usize..700).map(|i| format!("a:{i}")).collect();
    assert_eq!(copied, expected);
}

/// A target topic with fewer partitions than its source takes records by key hash with
/// --repartition-by-key. A later run without it is refused: growing the target (as the
/// mirror does for a target that holds each record in its source's partition) would move
/// the keys already spread over it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_spread_by_key_is_not_grown_and_a_run_without_repartitioning_by_key_is_refused() {
    let (source, target) = (start_broker(Duration::from_secs(300)).await, start_broker(Duration::from_secs(300)).await);
    create(&source.addr, "t", 4, &[]).await;
    create(&target.addr, "t", 2, &[]).await;
    produce(&source.addr, "t", "a", 0..100).await;
    let src = format!("dc1={}", source.addr);

    let dir = tempfile::tempdir().unwrap();
    let args = ["--source", &src, "--target", &target.addr, "--topics", "t", "--group", "g", "--repartition-by-key"];
    let mut mirror = MirrorProcess::start(&args, dir.path().join("mirror.log"));
    wait_for("everything committed", Duration::from_secs(30), || all_committed(&source.addr, "g", "t")).await;
    mirror.kill9();
    for (partition, records) in read_all(&target.addr, "t").await {
        for r in records {
            assert_eq!(fjord_client::partitioner::partition_for_key(r.key.as_deref().unwrap(), 2), partition);
        }
    }
    assert_eq!(offsets(&target.addr, "t", OffsetSpec::Latest).await.iter().sum::<i64>(), 100);

    produce(&source.addr, "t", "b", 0..100).await;
    let args = ["--source", &src, "--target", &target.addr, "--topics", "t", "--group", "g"];
    let mut mirror = MirrorProcess::start(&args, dir.path().join("refused.log"));
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = mirror.child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the mirror was not refused: {}", mirror.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.code(), Some(1));
    let stderr = mirror.log();
    assert!(
        stderr.contains("target topic \"t\" has 2 partitions, fewer than the 4") && stderr.contains("--repartition-by-key"),
        "{stderr}"
    );
    assert_eq!(admin(&target.addr).await.describe_topic("t").await.unwrap().partitions.len(), 2, "target not grown");
    assert_eq!(offsets(&target.addr, "t", OffsetSpec::Latest).await.iter().sum::<i64>(), 100, "nothing more copied");
}

/// Issue #22: the source topic grown 2 -> 4 with CreatePartitions while the mirror was
/// stopped. The restarted mirror finds the target with fewer partitions than the source
/// and, nothing having been spread over it by key, grows it to 4 (as MirrorMaker 2 does)
/// and copies on: every record exactly once, in its source partition's number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_topic_grown_while_the_mirror_was_stopped_grows_the_target_at_restart() {
    let (source, target) = (start_broker(Duration::from_secs(300)).await, start_broker(Duration::from_secs(300)).await);
    create(&source.addr, "grown", 2, &[]).await;
    let mut produced = produce(&source.addr, "grown", "a", 0..2_000).await;
    let config = || {
        let mut config = fjord_mirror::MirrorConfig::new(
            vec![fjord_mirror::SourceConfig::parse(&format!("dc1={}", source.addr)).unwrap()],
            target.addr.clone(),
            "grown",
        );
        config.group = "g".into();
        config
    };
    let shutdown = CancellationToken::new();
    let mirror = tokio::spawn(fjord_mirror::run(config(), None, shutdown.clone()));
    wait_for("the first records committed", Duration::from_secs(30), || all_committed(&source.addr, "g", "grown")).await;
    shutdown.cancel();
    mirror.await.unwrap().unwrap();
    assert_eq!(admin(&target.addr).await.describe_topic("grown").await.unwrap().partitions.len(), 2);

    admin(&source.addr).await.create_partitions("grown", 4).await.unwrap();
    wait_for("leaders of the new partitions", Duration::from_secs(10), || async {
        admin(&source.addr).await.describe_topic("grown").await.is_ok_and(|t| t.partitions.iter().all(|p| p.leader >= 0))
    })
    .await;
    let more = produce(&source.addr, "grown", "b", 0..4_000).await;
    assert_eq!(more.values().map(|(p, _)| *p).collect::<std::collections::BTreeSet<i32>>(), (0..4).collect());
    produced.extend(more);

    let shutdown = CancellationToken::new();
    let mirror = tokio::spawn(fjord_mirror::run(config(), None, shutdown.clone()));
    wait_for("everything committed", Duration::from_secs(60), || async {
        assert!(!mirror.is_finished(), "the restarted mirror stopped");
        all_committed(&source.addr, "g", "grown").await
    })
    .await;
    assert_copied_to_four_partitions(&target.addr, &produced).await;
    shutdown.cancel();
    mirror.await.unwrap().unwrap();
}

/// A record stamped a day ahead, which the source took (its topic allowed it then, as
/// any Kafka before 4.0 does), is copied with its timestamp: the topic the mirror
/// creates does not refuse it with the target's one-hour default, which would stop the
/// copying of that source for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_stamped_ahead_that_the_source_took_is_copied_with_its_timestamp() {
    let (source, target) = (start_broker(Duration::from_secs(300)).await, start_broker(Duration::from_secs(300)).await);
    create(&source.addr, "stamped", 1, &[("message.timestamp.after.max.ms", "172800000")]).await;
    let ahead = fjord_record::now_ms() + 86_400_000;
    let producer =
        Producer::connect(ProducerConfig { client: ClientConfig::new(&source.addr), ..Default::default() }).await.unwrap();
    for (value, timestamp) in [("before", None), ("ahead", Some(ahead)), ("after", None)] {
        let mut record = ProducerRecord::new("stamped", value);
        record.timestamp = timestamp;
        producer.send(record).await.unwrap().await.unwrap();
    }
    producer.close().await;
    // Back to the default: the source topic reports no limit of its own.
    admin(&source.addr)
        .await
        .incremental_alter_configs(
            &fjord_client::ConfigResource::Topic("stamped".into()),
            &[("message.timestamp.after.max.ms".into(), None)],
        )
        .await
        .unwrap();

    let mut config = fjord_mirror::MirrorConfig::new(
        vec![fjord_mirror::SourceConfig::parse(&format!("dc1={}", source.addr)).unwrap()],
        target.addr.clone(),
        "stamped",
    );
    config.group = "g".into();
    let shutdown = CancellationToken::new();
    let mirror = tokio::spawn(fjord_mirror::run(config, None, shutdown.clone()));
    wait_for("the three records committed", Duration::from_secs(30), || all_committed(&source.addr, "g", "stamped")).await;
    shutdown.cancel();
    mirror.await.unwrap().unwrap();
    let copied: Vec<(String, i64)> =
        read_all(&target.addr, "stamped").await.remove(&0).unwrap().iter().map(|r| (value(r), r.timestamp)).collect();
    assert_eq!(copied.iter().map(|(v, _)| v.as_str()).collect::<Vec<_>>(), ["before", "ahead", "after"]);
    assert_eq!(copied[1].1, ahead);
    let limit = admin(&target.addr).await.describe_configs("stamped").await.unwrap();
    let limit = limit.iter().find(|c| c.name == "message.timestamp.after.max.ms").unwrap();
    assert_eq!(limit.value.as_deref(), Some("9223372036854775807"));
}

/// A source topic holding records its target topic refuses for themselves, between good
/// ones: two too large for the target topic (5 kB and 1.5 MB, where it takes 2 kB; the
/// latter also past the 1 MiB request size of a producer by default) and one stamped a day ahead (the
/// target topic keeps the one-hour default). The target topic is made first, so the
/// mirror does not make it in the source's image; all in partition 0 of two. Returns the
/// source and target brokers
/// and the mirror's config (group `g`, source alias `dc1`).
async fn refusing_target() -> (StandaloneBroker, StandaloneBroker, fjord_mirror::MirrorConfig) {
    let (source, target) = (start_broker(Duration::from_secs(300)).await, start_broker(Duration::from_secs(300)).await);
    create(&source.addr, "orders", 2, &[("max.message.bytes", "4000000"), ("message.timestamp.after.max.ms", "172800000")]).await;
    create(&target.addr, "orders", 2, &[("max.message.bytes", "2000")]).await;
    let producer = Producer::connect(ProducerConfig {
        client: ClientConfig::new(&source.addr),
        max_request_size: 4_000_000,
        buffer_memory: 16_000_000,
        linger: Duration::ZERO,
        ..Default::default()
    })
    .await
    .unwrap();
    let ahead = fjord_record::now_ms() + 86_400_000;
    let records = [
        ProducerRecord::new("orders", "a").key("1"),
        ProducerRecord::new("orders", vec![b'x'; 5_000]).key("2"),
        ProducerRecord::new("orders", "b").key("3"),
        ProducerRecord::new("orders", "c").key("4").timestamp(ahead),
        ProducerRecord::new("orders", vec![b'y'; 1_500_000]).key("5"),
        ProducerRecord::new("orders", "d").key("6"),
    ];
    for r in records {
        producer.send(r.partition(0)).await.unwrap().await.unwrap();
    }
    producer.close().await;
    let mut config = fjord_mirror::MirrorConfig::new(
        vec![fjord_mirror::SourceConfig::parse(&format!("dc1={}", source.addr)).unwrap()],
        target.addr.clone(),
        "orders",
    );
    config.group = "g".into();
    // The 1.5 MB record is the target's to take or refuse, not the producer's.
    config.max_request_size = 4_000_000;
    (source, target, config)
}

/// Runs the mirror with `config` and a metrics endpoint; returns the endpoint's address,
/// the mirror's shutdown token and its task.
async fn run_mirror(
    config: fjord_mirror::MirrorConfig,
) -> (String, CancellationToken, tokio::task::JoinHandle<fjord_mirror::Result<()>>) {
    let metrics = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics_addr = metrics.local_addr().unwrap().to_string();
    let shutdown = CancellationToken::new();
    let mirror = tokio::spawn(fjord_mirror::run(config, Some(metrics), shutdown.clone()));
    (metrics_addr, shutdown, mirror)
}

/// With `--dead-letter-topic`, the three refused records go there (each once, named by
/// source position and reason; the two too large without their value), the others reach
/// the target topic once each in source order, and the mirror goes on past them: at
/// least once (refusals found at the checkpoint) and exactly once (the transaction
/// aborted, and the next one sets them aside), read with read_committed.
async fn refused_records_are_set_aside(exactly_once: bool) {
    let (source, target, mut config) = refusing_target().await;
    config.exactly_once = exactly_once;
    config.dead_letter_topic = Some("mirror.dead".into());
    if exactly_once {
        config.max_request_size = fjord_mirror::MirrorConfig::new(Vec::new(), "", "").max_request_size;
    }
    let (metrics_addr, shutdown, mirror) = run_mirror(config).await;
    // Exactly once, the positions are the target group's.
    let (cluster, group) = if exactly_once { (&target.addr, "g.dc1") } else { (&source.addr, "g") };
    wait_for("every source position committed", Duration::from_secs(60), || async {
        committed(cluster, group).await.get(&TopicPartition::new("orders", 0)) == Some(&6)
    })
    .await;
    let status = fjord_mirror::fetch_status(&metrics_addr).await.unwrap();
    let metrics = http_get(&metrics_addr, "/metrics").await;
    shutdown.cancel();
    mirror.await.unwrap().unwrap();

    let copied: Vec<String> =
        read_at(&target.addr, "orders", IsolationLevel::ReadCommitted).await.remove(&0).unwrap().iter().map(value).collect();
    assert_eq!(copied, ["a", "b", "d"]);
    let dead = read_at(&target.addr, "mirror.dead", IsolationLevel::ReadCommitted).await.remove(&0).unwrap();
    let text = |r: &ConsumerRecord, name: &str| {
        String::from_utf8(header(r, name).unwrap_or_else(|| panic!("no {name}")).to_vec()).unwrap()
    };
    let letters: Vec<(String, String, Option<usize>, Option<String>)> = dead
        .iter()
        .map(|r| {
            assert_eq!((text(r, "fjord.dlq.topic"), text(r, "fjord.dlq.partition")), ("orders".into(), "0".into()));
            assert_eq!((text(r, "fjord.dlq.target"), text(r, "fjord.origin")), ("orders".into(), "dc1".into()));
            let value_bytes = header(r, "fjord.dlq.value_bytes").map(|v| std::str::from_utf8(v).unwrap().parse().unwrap());
            (
                text(r, "fjord.dlq.offset"),
                String::from_utf8(r.key.as_deref().unwrap().to_vec()).unwrap(),
                value_bytes,
                r.value.as_ref().map(|v| String::from_utf8(v.to_vec()).unwrap()),
            )
        })
        .collect();
    assert_eq!(
        letters,
        [
            ("1".into(), "2".into(), Some(5_000), None),
            ("3".into(), "4".into(), None, Some("c".into())),
            ("4".into(), "5".into(), Some(1_500_000), None),
        ]
    );
    let reasons: Vec<String> = dead.iter().map(|r| text(r, "fjord.dlq.reason")).collect();
    assert!(reasons[0].contains("MessageTooLarge"), "{reasons:?}");
    assert!(reasons[1].contains("InvalidTimestamp"), "{reasons:?}");
    // Exactly once the producer keeps its default request size: the 1.5 MB record is
    // refused before it is sent.
    let too_large = if exactly_once { "larger than the limit of 1048576 bytes" } else { "MessageTooLarge" };
    assert!(reasons[2].contains(too_large), "{reasons:?}");
    let ahead: i64 = text(&dead[1], "fjord.dlq.timestamp").parse().unwrap();
    assert!(ahead > fjord_record::now_ms() + 80_000_000, "the record's own timestamp is kept in a header");
    assert_eq!((status.sources[0].records, status.sources[0].dead_letters), (3, 3), "{status:?}");
    assert!(metrics.contains("fjord_mirror_dead_letters_total{source=\"dc1\",topic=\"orders\"} 3"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_the_target_refuses_go_to_the_dead_letter_topic_and_copying_goes_on() {
    refused_records_are_set_aside(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_records_the_target_refuses_go_to_the_dead_letter_topic_once() {
    refused_records_are_set_aside(true).await;
}

/// The state of partition `partition` of `orders` in a running mirror's `/status`:
/// (mirrored position, why it is held).
async fn orders_partition(metrics: &str, partition: i32) -> (i64, Option<String>) {
    let status = fjord_mirror::fetch_status(metrics).await.unwrap();
    let p = status.sources[0].partitions.iter().find(|p| p.topic == "orders" && p.partition == partition);
    p.map_or((-1, None), |p| (p.mirrored, p.refused.clone()))
}

/// Without a dead-letter topic, a record the target refuses holds its partition there:
/// what precedes it is committed, the status names it, the source's other partitions go
/// on, and once the target takes it (its topic's limits raised) the partition goes on
/// with it: nothing is lost, nothing before it is copied twice, and the last copies are
/// in source order; exactly once (read_committed), every record is there once, in order.
async fn a_refused_record_holds_its_partition(exactly_once: bool) {
    let (source, target, mut config) = refusing_target().await;
    config.retry_backoff_max = Duration::from_millis(500);
    config.exactly_once = exactly_once;
    // At least once, the producer starts with its default request size, so the 1.5 MB
    // record is also held before it is sent, until the mirror restarts with a larger one.
    let large_requests = config.max_request_size;
    if !exactly_once {
        config.max_request_size = fjord_mirror::MirrorConfig::new(Vec::new(), "", "").max_request_size;
    }
    let (metrics_addr, mut shutdown, mut mirror) = run_mirror(config.clone()).await;
    let orders = |p| TopicPartition::new("orders", p);
    // Exactly once, the positions are the target group's.
    let (cluster, group) = if exactly_once { (&target.addr, "g.dc1") } else { (&source.addr, "g") };
    wait_for("the status naming the refused record", Duration::from_secs(30), || async {
        let (mirrored, refused) = orders_partition(&metrics_addr, 0).await;
        mirrored == 1 && refused.is_some_and(|r| r.contains("offset 1") && r.contains("MessageTooLarge"))
    })
    .await;
    assert_eq!(committed(cluster, group).await.get(&orders(0)), Some(&1));
    // The other partition goes on meanwhile.
    let producer =
        Producer::connect(ProducerConfig { client: ClientConfig::new(&source.addr), ..Default::default() }).await.unwrap();
    for value in ["p1-a", "p1-b"] {
        producer.send(ProducerRecord::new("orders", value).partition(1)).await.unwrap().await.unwrap();
    }
    producer.close().await;
    wait_for("partition 1 copied", Duration::from_secs(30), || async {
        committed(cluster, group).await.get(&orders(1)) == Some(&2)
    })
    .await;
    assert!(orders_partition(&metrics_addr, 0).await.1.is_some(), "partition 0 is still held");
    let metrics = http_get(&metrics_addr, "/metrics").await;
    assert!(metrics.contains("fjord_mirror_partition_held{source=\"dc1\",topic=\"orders\",partition=\"0\"} 1"), "{metrics}");
    // The target now takes every record but the one stamped ahead, then that one too.
    let alter = |key: &str, value: &str| {
        let (addr, key, value) = (target.addr.clone(), key.to_string(), value.to_string());
        async move {
            admin(&addr)
                .await
                .incremental_alter_configs(&fjord_client::ConfigResource::Topic("orders".into()), &[(key, Some(value))])
                .await
                .unwrap()
        }
    };
    alter("max.message.bytes", "4000000").await;
    wait_for("the status naming the record stamped ahead", Duration::from_secs(30), || async {
        let (mirrored, refused) = orders_partition(&metrics_addr, 0).await;
        mirrored == 3 && refused.is_some_and(|r| r.contains("offset 3") && r.contains("InvalidTimestamp"))
    })
    .await;
    alter("message.timestamp.after.max.ms", "172800000").await;
    let mut metrics_addr = metrics_addr;
    if !exactly_once {
        wait_for("the status naming the record larger than a request", Duration::from_secs(30), || async {
            let (mirrored, refused) = orders_partition(&metrics_addr, 0).await;
            mirrored == 4 && refused.is_some_and(|r| r.contains("offset 4") && r.contains("larger than the limit of 1048576"))
        })
        .await;
        shutdown.cancel();
        mirror.await.unwrap().unwrap();
        config.max_request_size = large_requests;
        (metrics_addr, shutdown, mirror) = run_mirror(config).await;
    }
    wait_for("every source position committed", Duration::from_secs(60), || async {
        committed(cluster, group).await.get(&orders(0)) == Some(&6)
    })
    .await;
    assert_eq!(orders_partition(&metrics_addr, 0).await.1, None, "no longer held");
    shutdown.cancel();
    mirror.await.unwrap().unwrap();
    let copied: Vec<String> = read_at(&target.addr, "orders", IsolationLevel::ReadCommitted)
        .await
        .remove(&0)
        .unwrap()
        .iter()
        .map(|r| String::from_utf8(r.key.as_deref().unwrap().to_vec()).unwrap())
        .collect();
    if exactly_once {
        assert_eq!(copied, ["1", "2", "3", "4", "5", "6"]);
    }
    assert_eq!(copied.iter().filter(|k| *k == "1").count(), 1, "{copied:?}");
    // Each refusal copies again what was sent after the refused record before the
    // refusal was known, after it: the last copies of the records are in source order.
    let mut last_copies: Vec<&str> = Vec::new();
    for key in copied.iter().rev() {
        if !last_copies.contains(&key.as_str()) {
            last_copies.insert(0, key);
        }
    }
    assert_eq!(last_copies, ["1", "2", "3", "4", "5", "6"], "{copied:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_dead_letter_topic_a_refused_record_holds_its_partition_until_the_target_takes_it() {
    a_refused_record_holds_its_partition(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_without_a_dead_letter_topic_a_refused_record_holds_its_partition() {
    a_refused_record_holds_its_partition(true).await;
}

/// Issue #22: a source topic grown 2 -> 4 with CreatePartitions while the mirror copies.
/// The mirror grows the target to 4 (as MirrorMaker 2 does) and copies the new
/// partitions' records to the same partitions; nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_topic_grown_while_mirrored_grows_the_target_and_loses_nothing() {
    let (source, target) = (start_broker(Duration::from_secs(300)).await, start_broker(Duration::from_secs(300)).await);
    create(&source.addr, "grown", 2, &[]).await;
    let mut produced = produce(&source.addr, "grown", "a", 0..2_000).await;
    let mut config = fjord_mirror::MirrorConfig::new(
        vec![fjord_mirror::SourceConfig::parse(&format!("dc1={}", source.addr)).unwrap()],
        target.addr.clone(),
        "grown",
    );
    config.group = "g".into();
    config.topic_refresh = Duration::from_millis(500);
    let shutdown = CancellationToken::new();
    let mirror = tokio::spawn(fjord_mirror::run(config, None, shutdown.clone()));
    wait_for("the first records committed", Duration::from_secs(30), || all_committed(&source.addr, "g", "grown")).await;
    // Records flow while the topic grows; those after the growth land on all 4 partitions.
    let more = tokio::spawn({
        let addr = source.addr.clone();
        async move { produce(&addr, "grown", "b", 0..2_000).await }
    });
    admin(&source.addr).await.create_partitions("grown", 4).await.unwrap();
    produced.extend(more.await.unwrap());
    wait_for("leaders of the new partitions", Duration::from_secs(10), || async {
        admin(&source.addr).await.describe_topic("grown").await.is_ok_and(|t| t.partitions.iter().all(|p| p.leader >= 0))
    })
    .await;
    produced.extend(produce(&source.addr, "grown", "c", 0..4_000).await);
    assert!(produced.values().any(|(p, _)| *p >= 2), "no record on a new source partition");
    wait_for("everything committed", Duration::from_secs(60), || all_committed(&source.addr, "g", "grown")).await;
    assert_copied_to_four_partitions(&target.addr, &produced).await;
    shutdown.cancel();
    mirror.await.unwrap().unwrap();
}

/// The grown tests' end state: the target "grown" has 4 partitions and holds every
/// produced record exactly once, in the partition it had at the source.
async fn assert_copied_to_four_partitions(target: &str, produced: &HashMap<String, (i32, i64)>) {
    assert_eq!(admin(target).await.describe_topic("grown").await.unwrap().partitions.len(), 4);
    let mut copied = 0;
    for (partition, records) in read_all(target, "grown").await {
        for r in records {
            assert_eq!(produced[&value(&r)].0, partition, "{} copied to another partition", value(&r));
            copied += 1;
        }
    }
    assert_eq!(copied, produced.len(), "every source record copied exactly once");
}

async fn http_post_ndjson(addr: &str, path: &str, body: &str) -> String {
    let (addr, path, body) = (addr.to_string(), path.to_string(), body.to_string());
    tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        write!(s, "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-ndjson\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    })
    .await
    .unwrap()
}

/// gateway → online cluster → mirror → analytics cluster → loader, each tier counting:
/// `fjord audit report` on the analytics cluster (whose `_audit` the mirror fed with the
/// online cluster's) compares gateway, broker (the online broker's counts of its
/// appends), mirror and loader window by window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_report_on_the_analytics_cluster_shows_gateway_mirror_and_loader_tiers() {
    const WINDOW: Duration = Duration::from_secs(1);
    let online = StandaloneBroker::start_with(|c| {
        c.group.initial_rebalance_delay_ms = 0;
        c.audit = fjord_broker::AuditConfig {
            enable: true,
            interval: Duration::from_millis(200),
            window: WINDOW,
            cluster: "online".into(),
            ..Default::default()
        };
    })
    .await
    .expect("broker starts");
    let analytics = start_broker(Duration::from_secs(300)).await;
    create(&online.addr, "views", 2, &[]).await;

    let gateway_stop = CancellationToken::new();
    let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http_addr = http.local_addr().unwrap().to_string();
    let gw = fjord_gateway::GatewayConfig {
        host_name: Some("gw-1".into()),
        audit_interval: Some(Duration::from_millis(200)),
        audit_window: WINDOW,
        audit_cluster: "online".into(),
        ..fjord_gateway::GatewayConfig::new(online.addr.clone())
    };
    let gateway =
        tokio::spawn(fjord_gateway::run(gw, http, TcpListener::bind("127.0.0.1:0").await.unwrap(), gateway_stop.clone()));
    // Events over about three windows.
    let mut sent = 0;
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(2500) {
        let body: String = (0..20).map(|k| format!("{{\"n\":{sent},\"k\":{k}}}\n")).collect();
        let response = http_post_ndjson(&http_addr, "/v1/events/views", &body).await;
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        sent += 20;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    gateway_stop.cancel();
    gateway.await.unwrap().unwrap();
    // The online broker's counts are in its `_audit` before the mirror copies it.
    let online_report =
        fjord_audit::ReportConfig { window: WINDOW, ..fjord_audit::ReportConfig::new(ClientConfig::new(&online.addr)) };
    wait_for("the online broker's counts in _audit", Duration::from_secs(20), || async {
        let report = fjord_audit::collect(&online_report).await.unwrap();
        report.windows.iter().map(|w| w.counts.get("broker").copied().unwrap_or(0)).sum::<u64>() == sent as u64
    })
    .await;

    let mut config = fjord_mirror::MirrorConfig::new(
        vec![fjord_mirror::SourceConfig::parse(&format!("online={}", online.addr)).unwrap()],
        analytics.addr.clone(),
        "views",
    );
    config.commit_interval = Duration::from_millis(200);
    config.topic_refresh = Duration::from_millis(500);
    config.audit =
        Some(fjord_mirror::AuditConfig { cluster: "analytics".into(), interval: Duration::from_millis(200), window: WINDOW });
    let shutdown = CancellationToken::new();
    let mirror = tokio::spawn(fjord_mirror::run(config, None, shutdown.clone()));
    wait_for("views and _audit mirrored", Duration::from_secs(30), || async {
        all_committed(&online.addr, "fjord-mirror", "views").await
            && all_committed(&online.addr, "fjord-mirror", fjord_audit::AUDIT_TOPIC).await
    })
    .await;
    // Stopping publishes the mirror tier's last counts.
    shutdown.cancel();
    mirror.await.unwrap().unwrap();

    let dest = tempfile::tempdir().unwrap();
    let loader_tier =
        std::sync::Arc::new(fjord_audit::AuditCounter::new("loader", "loader-1", "analytics").with_window(WINDOW).unwrap());
    let load = fjord_hadoop_loader::LoaderConfig {
        bootstrap: analytics.addr.clone(),
        topics: "views".into(),
        dest: format!("file://{}", dest.path().display()),
        audit: Some(loader_tier),
        ..Default::default()
    };
    let summary = fjord_hadoop_loader::run_once(&load, &()).await.unwrap();
    assert_eq!(summary.records, sent as u64);

    let report_config = fjord_audit::ReportConfig {
        window: WINDOW,
        grace: Duration::from_millis(500),
        ..fjord_audit::ReportConfig::new(ClientConfig::new(&analytics.addr))
    };
    let report = fjord_audit::collect(&report_config).await.unwrap();
    let text = fjord_audit::render::text(&report);
    let views = report.topics.iter().find(|t| t.topic == "views").unwrap_or_else(|| panic!("{text}"));
    assert_eq!(views.tiers, ["gateway", "broker", "mirror", "loader"], "{text}");
    assert!(report.windows.len() >= 3, "{text}");
    assert!(report.all_complete(), "{text}");
    for tier in ["gateway", "broker", "mirror", "loader"] {
        let total: u64 = report.windows.iter().map(|w| w.counts[tier]).sum();
        assert_eq!(total, sent as u64, "{tier}: {text}");
    }
    eprintln!("{text}");
}

/// A second mirror process joining the group takes over half the partitions: the first
/// flushes and commits before it gives them up, so the target holds every partition's
/// records exactly once, in source order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_mirror_joining_the_group_causes_no_duplicates() {
    const N: usize = 50_000;
    let (source, target) = (start_broker(Duration::from_secs(300)).await, start_broker(Duration::from_secs(300)).await);
    create(&source.addr, "events", 8, &[]).await;
    let mut produced = produce(&source.addr, "events", "dc1", 0..N).await;
    let config = |id: &str| {
        let mut c = fjord_mirror::MirrorConfig::new(
            vec![fjord_mirror::SourceConfig::parse(&format!("dc1={}", source.addr)).unwrap()],
            target.addr.clone(),
            "events",
        );
        c.group = "shared".into();
        c.instance_id = Some(id.into());
        c
    };
    let shutdown = CancellationToken::new();
    let first = tokio::spawn(fjord_mirror::run(config("a"), None, shutdown.clone()));
    wait_for("the first half committed", Duration::from_secs(40), || all_committed(&source.addr, "shared", "events")).await;
    // The second mirror joins while the first copies the second half.
    let more = tokio::spawn({
        let addr = source.addr.clone();
        async move { produce(&addr, "events", "dc1", N..2 * N).await }
    });
    let second = tokio::spawn(fjord_mirror::run(config("b"), None, shutdown.clone()));
    produced.extend(more.await.unwrap());
    let groups = GroupAdmin::connect(ClientConfig::new(&source.addr)).await.unwrap();
    wait_for("both mirrors owning partitions", Duration::from_secs(30), || async {
        let members = groups.describe_group("shared").await.unwrap().members;
        members.len() == 2 && members.iter().all(|m| !m.assignment.is_empty())
    })
    .await;
    wait_for("everything committed", Duration::from_secs(40), || all_committed(&source.addr, "shared", "events")).await;
    shutdown.cancel();
    first.await.unwrap().unwrap();
    second.await.unwrap().unwrap();
    for (partition, records) in read_all(&target.addr, "events").await {
        let sources: Vec<i64> = records.iter().map(|r| produced[&value(r)].1).collect();
        let expected: Vec<i64> = (0..sources.len() as i64).collect();
        assert_eq!(sources, expected, "partition {partition}: duplicates or reordering across the rebalance");
    }
    assert_eq!(offsets(&target.addr, "events", OffsetSpec::Latest).await.iter().sum::<i64>(), 2 * N as i64);
}

/// Every record of `topic` a consumer at `isolation` sees, per partition in order, read
/// until each position reaches the log end offset (positions pass the markers, and with
/// read_committed the aborted batches, that no record shows).
async fn read_at(addr: &str, topic: &str, isolation: IsolationLevel) -> BTreeMap<i32, Vec<ConsumerRecord>> {
    let ends = offsets(addr, topic, OffsetSpec::Latest).await;
    let mut consumer = Consumer::connect(ConsumerConfig {
        client: ClientConfig::new(addr),
        auto_offset_reset: OffsetReset::Earliest,
        isolation_level: isolation,
        fetch_max_wait: Duration::from_millis(50),
        ..Default::default()
    })
    .await
    .unwrap();
    consumer.assign_topic(topic).await.unwrap();
    let mut out: BTreeMap<i32, Vec<ConsumerRecord>> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        for r in consumer.poll(Duration::from_millis(200)).await.unwrap() {
            out.entry(r.partition).or_default().push(r);
        }
        let mut done = true;
        for (p, end) in ends.iter().enumerate() {
            done &= consumer.position(&TopicPartition::new(topic, p as i32)).await.unwrap() >= *end;
        }
        if done {
            return out;
        }
        assert!(Instant::now() < deadline, "{isolation:?} did not reach the log ends {ends:?} of {topic}");
    }
}

/// Whether a transaction holds records in `topic` that it has not committed: some
/// partition's last stable offset (ListOffsets read_committed) is below its high watermark.
async fn open_transaction(addr: &str, topic: &str) -> bool {
    let a = admin(addr).await;
    let n = a.describe_topic(topic).await.unwrap().partitions.len() as i32;
    let specs: Vec<_> = (0..n).map(|p| (topic.to_string(), p, OffsetSpec::Latest)).collect();
    let high_watermarks = a.list_offsets(&specs).await.unwrap();
    let stable = a.list_offsets_at(&specs, IsolationLevel::ReadCommitted).await.unwrap();
    stable.iter().zip(&high_watermarks).any(|(lso, hw)| lso < hw)
}

/// `fjord mirror --exactly-once` killed with kill -9 while a transaction holds copies in
/// the target (after several committed ones), then restarted: a read_committed reader of
/// the target sees every source record exactly once, in source order per partition
/// (without the flag the records copied after the last commit come twice, see
/// kill_9_midway_loses_nothing_and_duplicates_only_what_followed_the_last_commit), while
/// a read_uncommitted one also sees the killed run's uncommitted copies, aborted by the
/// restarted mirror. The positions are the target group's offsets, which end at the
/// source's log ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_mirror_killed_with_kill_9_leaves_no_duplicates_and_no_loss() {
    let KillRun { source, target, mut produced, dir, args } = KillRun::start(4, &["--exactly-once"]).await;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let target_positions = || async { committed(&target.addr, "g.dc1").await.values().sum::<i64>() };
    let mut first = MirrorProcess::start(&args, dir.path().join("first.log"));
    wait_for("several transactions committed", Duration::from_secs(60), || async { target_positions().await >= N as i64 / 20 })
        .await;
    // The second half trickles in meanwhile: a mirror that caught up with the first half
    // sits between transactions and can never be stopped inside one (a CI run copied it
    // all before the first stop).
    let trickle = {
        let addr = source.addr.clone();
        tokio::spawn(async move {
            let mut produced = HashMap::new();
            for from in (N / 2..N).step_by(500) {
                produced.extend(produce(&addr, "events", "dc1", from..(from + 500).min(N)).await);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            produced
        })
    };
    // The kill must land inside a transaction that already wrote copies: the mirror is
    // stopped (SIGSTOP; the requests it sent still land) and killed if the target shows an
    // open transaction, else (stopped between two transactions) it runs on a moment. That
    // moment varies: after each 300 ms stop the mirror's commit interval has passed, so it
    // commits first, and on a loaded machine a fixed 20 ms was all spent committing, 50
    // times in a row in one CI run, before a new transaction could write anything.
    let mut stops = 0;
    loop {
        first.signal("-STOP");
        tokio::time::sleep(Duration::from_millis(300)).await;
        if open_transaction(&target.addr, "events").await {
            break;
        }
        stops += 1;
        assert!(stops < 50, "never stopped the mirror inside a transaction\n{}", first.log());
        first.signal("-CONT");
        tokio::time::sleep(Duration::from_millis(20 + (stops * 37) % 230)).await;
    }
    first.kill9();
    let committed_at_kill = target_positions().await;
    let written_at_kill = total(&target.addr, "events").await;
    eprintln!("killed with {written_at_kill} offsets written in the target, source positions {committed_at_kill} committed");
    assert!(committed_at_kill < N as i64, "the first run finished before the kill: nothing tested\n{}", first.log());

    produced.extend(trickle.await.unwrap());
    let second = MirrorProcess::start(&args, dir.path().join("second.log"));
    let ends = offsets(&source.addr, "events", OffsetSpec::Latest).await;
    wait_for("the target group's offsets at the source's log ends", Duration::from_secs(90), || async {
        let c = committed(&target.addr, "g.dc1").await;
        ends.iter().enumerate().all(|(p, end)| c.get(&TopicPartition::new("events", p as i32)) == Some(end))
    })
    .await;

    let mut seen = 0;
    for (partition, records) in read_at(&target.addr, "events", IsolationLevel::ReadCommitted).await {
        let sources: Vec<i64> = records
            .iter()
            .map(|r| {
                let (p, o) = produced[&value(r)];
                assert_eq!(p, partition, "a record changed partition");
                o
            })
            .collect();
        let expected: Vec<i64> = (0..ends[partition as usize]).collect();
        assert_eq!(
            sources,
            expected,
            "partition {partition}: read_committed must see source offsets 0..{} once each, in order\n{}",
            ends[partition as usize],
            second.log()
        );
        seen += sources.len();
    }
    assert_eq!(seen, N, "every source record is in the target exactly once");
    assert!(!open_transaction(&target.addr, "events").await, "the killed run's transaction is still open");
    // The killed run's uncommitted copies are in the log, aborted: read_uncommitted sees
    // them, so read_committed's single copies are the transactions' doing.
    let uncommitted: usize = read_at(&target.addr, "events", IsolationLevel::ReadUncommitted).await.values().map(Vec::len).sum();
    eprintln!("read_uncommitted: {uncommitted} records for {N} (aborted copies of the killed run: {})", uncommitted - N);
    assert!(uncommitted > N, "no aborted copy in the target: the kill did not land inside a transaction");
}

/// `curl -s` with `args`: (HTTP status, body); status 0 when no HTTP answer came.
fn curl(args: &[&str]) -> (u16, String) {
    let out = Command::new("curl").args(["-s", "-m", "10", "-o", "-", "-w", "\n%{http_code}"]).args(args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
    (status.trim().parse().unwrap_or(0), body.to_owned())
}

/// The mirror's metrics endpoint takes the broker's `metrics.*` security keys (#19): with
/// `metrics.ssl.keystore.location` and `metrics.authentication.method=BASIC` (users from
/// the metadata store given to `run_with_store`, here an embedded one holding `scraper`),
/// `/metrics` and `/status` answer 401 with `WWW-Authenticate` without credentials or
/// with a wrong password, 200 with the user's (the Prometheus text, the JSON status), and
/// plain HTTP gets no HTTP answer at all. The CLI refuses a `--metrics-config` key it does
/// not know, and Basic without `--zookeeper`, before binding anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_endpoint_serves_https_with_basic_auth() {
    let target = start_broker(Duration::from_secs(300)).await;
    let dir = tempfile::tempdir().unwrap();
    let certs = fjord_testkit::Certs::create(dir.path()).unwrap();
    let store = fjord_coord::open(None, &dir.path().join("store")).await.unwrap();
    let credential = fjord_auth::ScramCredential::generate(fjord_auth::ScramMechanism::Sha256, "scrape-secret", 4096).unwrap();
    fjord_auth::store::set_credential(&*store, "scraper", fjord_auth::ScramMechanism::Sha256, &credential).await.unwrap();

    let sources = vec![fjord_mirror::SourceConfig::parse(&format!("dc1={}", free_addr())).unwrap()];
    let mut config = fjord_mirror::MirrorConfig::new(sources, target.addr.clone(), "events");
    let keystore = certs.dir.join("server-keystore.pem");
    config.set("metrics.ssl.keystore.location", keystore.to_str().unwrap()).unwrap();
    config.set("metrics.authentication.method", "BASIC").unwrap();
    assert!(config.set("metrics.listen", "127.0.0.1:1").is_err(), "not a mirror key");
    assert!(config.set("metrics.authentication.method", "DIGEST").is_err());
    let metrics = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = metrics.local_addr().unwrap().port();
    let shutdown = CancellationToken::new();
    let mirror = tokio::spawn(fjord_mirror::run_with_store(config, Some(metrics), Some(store), shutdown.clone()));

    let ca = certs.dir.join("ca.pem");
    let ca = ca.to_str().unwrap();
    let url = format!("https://127.0.0.1:{port}/metrics");
    wait_for("the metrics endpoint", Duration::from_secs(20), || async { curl(&["--cacert", ca, &url]).0 != 0 }).await;
    let (status, body) = curl(&["--cacert", ca, "-D", "-", &url]);
    assert_eq!(status, 401, "no credentials: {body}");
    assert!(body.contains("WWW-Authenticate: Basic realm="), "{body}");
    assert_eq!(curl(&["--cacert", ca, "-u", "scraper:wrong", &url]).0, 401, "wrong password");
    let (status, body) = curl(&["--cacert", ca, "-u", "scraper:scrape-secret", &url]);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("# TYPE fjord_mirror_"), "{body}");
    let status_url = format!("https://127.0.0.1:{port}/status");
    assert_eq!(curl(&["--cacert", ca, &status_url]).0, 401);
    let (status, body) = curl(&["--cacert", ca, "-u", "scraper:scrape-secret", &status_url]);
    assert_eq!(status, 200, "{body}");
    assert!(serde_json::from_str::<fjord_mirror::Status>(&body).is_ok(), "{body}");
    let (status, body) = curl(&["-u", "scraper:scrape-secret", &url.replace("https", "http")]);
    assert_eq!(status, 0, "plain HTTP on a TLS endpoint got an HTTP answer: {body}");
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), mirror).await.unwrap().unwrap().unwrap();

    let fjord = |extra: &[&str]| {
        let mut args = vec!["mirror", "--source", "dc1=127.0.0.1:1", "--target", "127.0.0.1:2", "--topics", "t"];
        args.extend(extra);
        let out = Command::new(env!("CARGO_BIN_EXE_fjord")).args(&args).env_remove("FJORD_ZOOKEEPER_CONNECT").output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let file = dir.path().join("metrics.properties");
    std::fs::write(&file, "metrics.sssl.keystore.location=/nowhere\n").unwrap();
    let (ok, stderr) = fjord(&["--metrics", "127.0.0.1:0", "--metrics-config", file.to_str().unwrap()]);
    assert!(!ok && stderr.contains("metrics.sssl.keystore.location"), "{stderr}");
    std::fs::write(&file, "metrics.authentication.method=BASIC\n").unwrap();
    let (ok, stderr) = fjord(&["--metrics", "127.0.0.1:0", "--metrics-config", file.to_str().unwrap()]);
    assert!(!ok && stderr.contains("--zookeeper"), "{stderr}");
}
