//! The embedded metadata store and the log dir under damage (issue 26, case 2): a full
//! disk, a flipped bit in the journal, a torn journal tail, a log dir the metadata does not
//! know. `fjord broker` runs as a process on the same data dir each time, stopped with
//! SIGTERM and started again as an operator would.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, start_broker, FjordProcess};
use fjord_client::{Acks, Admin, ClientConfig, GroupAdmin, NewTopic, Producer, ProducerConfig, ProducerRecord, TopicPartition};

/// The embedded store's journal inside a data dir.
fn journal(data: &Path) -> PathBuf {
    data.join("__metadata").join("metadata.journal")
}

fn client(port: u16) -> ClientConfig {
    ClientConfig { allow_auto_create_topics: false, ..ClientConfig::new(&format!("127.0.0.1:{port}")) }
}

fn start(port: u16, data: &Path) -> FjordProcess {
    start_broker(port, data, &[])
}

/// SIGTERM, then waits for a clean exit.
fn stop(mut broker: FjordProcess) {
    let status = Command::new("kill").args(["-TERM", &broker.id().to_string()]).status().unwrap();
    assert!(status.success());
    let exit = broker.wait().unwrap();
    assert!(exit.success(), "fjord broker exited with {exit}");
}

async fn create_topic(port: u16, topic: &str) {
    Admin::connect(client(port)).await.unwrap().create_topics(&[NewTopic::new(topic, 1)]).await.unwrap();
}

/// `{topic}-{i}` for i in 0..n.
fn values(topic: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{topic}-{i}")).collect()
}

/// Sends every value to partition 0 with acks=all and waits until each is acknowledged.
async fn produce(port: u16, topic: &str, values: &[String]) {
    let producer =
        Producer::connect(ProducerConfig { client: client(port), acks: Acks::All, ..ProducerConfig::default() }).await.unwrap();
    let mut pending = Vec::with_capacity(values.len());
    for value in values {
        pending.push(producer.send(ProducerRecord::new(topic, value.clone()).partition(0)).await.unwrap());
    }
    for delivery in pending {
        delivery.await.unwrap();
    }
}

async fn read(port: u16, topic: &str) -> Vec<String> {
    fjord_testkit::read_values(&client(port), topic, 0).await.unwrap()
}

/// Every file below `dir` with its bytes.
fn contents(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        files.insert(entry.file_name().to_string_lossy().into_owned(), std::fs::read(entry.path()).unwrap());
    }
    assert!(!files.is_empty(), "{} is empty", dir.display());
    files
}

/// Runs `fjord broker` on `data` expecting it to refuse to start: its stderr.
fn refused_start(data: &Path) -> String {
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_fjord"))
        .args(["broker", "--id", "0", "--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
        .arg(data)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(30);
    let waiter = std::thread::spawn(move || child.wait_with_output().unwrap());
    while !waiter.is_finished() {
        if Instant::now() > deadline {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            panic!("fjord broker started on a damaged journal instead of refusing");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = waiter.join().unwrap();
    assert!(!output.status.success(), "fjord broker exited cleanly on a damaged journal");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Registers `schema` (Avro JSON) under `subject` on the registry at `port`: status, body.
fn register_schema(port: u16, subject: &str, schema: &str) -> (u16, String) {
    let body = serde_json::json!({ "schema": schema }).to_string();
    common::http(port, "POST", &format!("/subjects/{subject}/versions"), Some(&body))
}

/// The exact sequence of issue 26, case 2, on a 16 MiB tmpfs as the data dir of `fjord
/// dev` (broker and schema registry on the same embedded store): a schema registration and
/// a topic creation on the full disk fail (and used to leave a partial journal record),
/// then with space freed a topic is created, 5,000 records are acknowledged with acks=all,
/// a schema is registered and a group offset is committed; after a restart all of it is
/// there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_after_a_full_disk_survive_a_restart() {
    let disk = fjord_testkit::Tmpfs::mount(16).unwrap();
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("dev.log");
    let data = disk.path().join("data");
    let (port, registry) = (free_port(), free_port());
    let dev = common::start_dev(port, registry, &data, &log);
    create_topic(port, "before").await;
    produce(port, "before", &values("before", 100)).await;
    let (status, body) = register_schema(registry, "before-value", r#"{"type":"string"}"#);
    assert_eq!(status, 200, "{body}");

    disk.fill("filler").unwrap();
    // A schema large enough that its journal record is cut short by the full disk rather
    // than refused whole (the registry's write of case 2).
    let fields: Vec<String> = (0..200).map(|i| format!(r#"{{"name":"field_{i}_{}","type":"long"}}"#, "x".repeat(20))).collect();
    let big = format!(r#"{{"type":"record","name":"WhileFull","fields":[{}]}}"#, fields.join(","));
    let (status, body) = register_schema(registry, "while-full-value", &big);
    assert!(status >= 500, "a registration on a full disk fails: {status} {body}");
    // 500 partitions: an assignment document larger than a page, so the append is cut
    // short by the full disk rather than refused whole.
    let admin = Admin::connect(client(port)).await.unwrap();
    let refused = admin.create_topics(&[NewTopic::new("while-full", 500)]).await.unwrap_err();
    assert!(refused.to_string().contains("No space left on device"), "{refused}");
    std::fs::remove_file(disk.path().join("filler")).unwrap();

    create_topic(port, "acked").await;
    let acked = values("acked", 5000);
    produce(port, "acked", &acked).await;
    let (status, body) =
        register_schema(registry, "acked-value", r#"{"type":"record","name":"Acked","fields":[{"name":"n","type":"long"}]}"#);
    assert_eq!(status, 200, "{body}");
    let id: serde_json::Value = serde_json::from_str(&body).unwrap();
    let id = id["id"].as_i64().unwrap();
    let groups = GroupAdmin::connect(client(port)).await.unwrap();
    groups.reset_offsets("readers", &[(TopicPartition::new("acked", 0), 4321)]).await.unwrap();
    stop(dev);

    let dev = common::start_dev(port, registry, &data, &log);
    assert_eq!(read(port, "acked").await, acked, "every acknowledged record after the full disk");
    assert_eq!(read(port, "before").await, values("before", 100));
    let committed = GroupAdmin::connect(client(port)).await.unwrap().committed_offsets("readers").await.unwrap();
    assert_eq!(committed.get(&TopicPartition::new("acked", 0)), Some(&4321));
    let (status, body) = common::http(registry, "GET", "/subjects/acked-value/versions/latest", None);
    assert_eq!(status, 200, "the schema registered after the full disk: {body}");
    assert!(body.contains(r#"\"name\":\"Acked\""#) && body.contains(&format!(r#""id":{id}"#)), "{body}");
    let (status, body) = common::http(registry, "GET", &format!("/schemas/ids/{id}"), None);
    assert_eq!(status, 200, "{body}");
    let (status, _) = common::http(registry, "GET", "/subjects/before-value/versions/latest", None);
    assert_eq!(status, 200, "the schema registered before the full disk");
    stop(dev);
}

/// The log on a full disk: a produce that does not fit fails with an error (never an
/// acknowledgement), nothing acknowledged before is lost, writes resume once space is freed
/// without a restart, and after a restart every acknowledged record is there, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_on_a_full_disk_refuses_writes_and_keeps_every_acknowledged_one() {
    let disk = fjord_testkit::Tmpfs::mount(24).unwrap();
    let data = disk.path().join("data");
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("dev.log");
    let (port, registry) = (free_port(), free_port());
    let broker = common::start_dev(port, registry, &data, &log);
    create_topic(port, "log").await;
    let mut acked = values("before", 100);
    produce(port, "log", &acked).await;

    disk.fill("filler").unwrap();
    // The active segment keeps blocks reserved ahead of its end (preallocate), so some
    // writes still fit; 10 KB records one at a time until one does not, at most 16 MB.
    let producer = Producer::connect(ProducerConfig {
        client: client(port),
        acks: Acks::All,
        retries: 0,
        delivery_timeout: Duration::from_secs(10),
        ..ProducerConfig::default()
    })
    .await
    .unwrap();
    let mut refused = None;
    for i in 0..1600 {
        let value = format!("full-{i}-{}", "x".repeat(10_000));
        let sent = producer.send(ProducerRecord::new("log", value.clone()).partition(0)).await.unwrap();
        match sent.await {
            Ok(_) => acked.push(value),
            Err(e) => {
                refused = Some(e.to_string());
                break;
            }
        }
    }
    let refused = refused.expect("a full disk refuses a write");
    assert!(refused.to_lowercase().contains("storage"), "the error says why: {refused}");
    // Issue 26 case 9: KAFKA_STORAGE_ERROR produce failures were not logged. The broker's
    // log names the partition and the cause.
    let text = std::fs::read_to_string(&log).unwrap();
    let line = text.lines().find(|l| l.contains("produce failed: storage error"));
    let line = line.unwrap_or_else(|| panic!("no storage error logged:\n{text}"));
    assert!(line.contains("ERROR"), "{line}");
    assert!(line.contains(r#"topic="log""#) && line.contains("partition=0"), "names the partition: {line}");
    assert!(line.contains("No space left on device"), "names the cause: {line}");
    assert_eq!(read(port, "log").await, acked, "nothing acknowledged is lost while the disk is full");

    std::fs::remove_file(disk.path().join("filler")).unwrap();
    let after = values("after", 100);
    produce(port, "log", &after).await;
    acked.extend(after);
    assert_eq!(read(port, "log").await, acked, "writes resume once space is freed");
    stop(broker);

    let broker = common::start_dev(port, registry, &data, &log);
    assert_eq!(read(port, "log").await, acked, "every acknowledged record across a restart");
    stop(broker);
}

/// One flipped bit in the middle of the journal: the broker refuses to start, naming the
/// file and the byte offset, and touches neither the journal nor the topic's log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_bit_in_the_middle_of_the_journal_refuses_start_and_leaves_the_logs_alone() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let port = free_port();
    let broker = start(port, &data);
    create_topic(port, "kept").await;
    produce(port, "kept", &values("kept", 1000)).await;
    for topic in ["second", "third"] {
        create_topic(port, topic).await;
    }
    stop(broker);

    let journal = journal(&data);
    let mut bytes = std::fs::read(&journal).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x04;
    std::fs::write(&journal, &bytes).unwrap();
    let log_before = contents(&data.join("kept-0"));

    let stderr = refused_start(&data);
    assert!(stderr.contains(&journal.display().to_string()), "{stderr}");
    assert!(stderr.contains("byte offset"), "{stderr}");
    assert_eq!(std::fs::read(&journal).unwrap(), bytes, "the damaged journal is left as it is");
    assert_eq!(contents(&data.join("kept-0")), log_before, "the topic's log is untouched");
}

/// A journal whose last record was cut short (a crash mid-append): the broker starts with
/// everything before it. The log of the topic whose creation the cut lost is moved
/// aside, not deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_journal_tail_is_cut_and_everything_before_it_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let port = free_port();
    let broker = start(port, &data);
    create_topic(port, "kept").await;
    produce(port, "kept", &values("kept", 1000)).await;
    let journal = journal(&data);
    let before_last = std::fs::metadata(&journal).unwrap().len();
    create_topic(port, "last").await;
    stop(broker);

    // Five bytes into the first record after `before_last`: its length, cut short.
    let file = std::fs::OpenOptions::new().write(true).open(&journal).unwrap();
    file.set_len(before_last + 5).unwrap();
    drop(file);
    let kept = std::fs::read(&journal).unwrap()[..before_last as usize].to_vec();

    let broker = start(port, &data);
    assert_eq!(read(port, "kept").await, values("kept", 1000));
    stop(broker);
    // The torn bytes were cut off: what the broker appended since follows the kept
    // records directly, and the journal opens again.
    let journal_now = std::fs::read(&journal).unwrap();
    assert_eq!(&journal_now[..kept.len()], kept);
    let broker = start(port, &data);
    assert_eq!(read(port, "kept").await, values("kept", 1000));
    let orphans = fjord_log::orphans(&data).unwrap();
    assert_eq!(orphans.iter().map(|o| o.partition.clone()).collect::<Vec<_>>(), [TopicPartition::new("last", 0)]);
    stop(broker);
}

/// A log dir the metadata does not know is renamed aside (not deleted), the broker
/// starts, and only `fjord logs orphans --delete` deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_log_dir_is_moved_aside_and_deleted_only_on_command() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let port = free_port();
    let broker = start(port, &data);
    create_topic(port, "known").await;
    produce(port, "known", &values("known", 50)).await;
    stop(broker);
    // A partition's log the metadata has never heard of.
    let unknown = data.join("unknown-0");
    std::fs::create_dir(&unknown).unwrap();
    for (name, bytes) in contents(&data.join("known-0")) {
        std::fs::write(unknown.join(name), bytes).unwrap();
    }
    let unknown_files = contents(&unknown);

    let broker = start(port, &data);
    assert_eq!(read(port, "known").await, values("known", 50));
    assert!(!unknown.exists(), "moved out of the way");
    let orphans = fjord_log::orphans(&data).unwrap();
    assert_eq!(orphans.len(), 1, "{orphans:?}");
    let name = orphans[0].path.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("unknown-0-orphan-") && name.len() >= "unknown-0-orphan-".len() + 13, "{name}");
    assert_eq!(contents(&orphans[0].path), unknown_files, "every byte kept");
    let topics = Admin::connect(client(port)).await.unwrap().list_topics().await.unwrap();
    assert_eq!(topics.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["known"], "an orphan is no partition");
    stop(broker);

    let fjord = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_fjord")).args(args).arg(&data).output().unwrap();
        assert!(output.status.success(), "fjord {args:?}: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap()
    };
    let listed = fjord(&["logs", "orphans", "--data-dir"]);
    assert!(listed.contains(&name) && listed.contains("partition unknown-0"), "{listed}");
    assert!(orphans[0].path.exists(), "listing deletes nothing");
    let deleted = fjord(&["logs", "orphans", "--delete", "--data-dir"]);
    assert!(deleted.contains(&format!("deleted {}", orphans[0].path.display())), "{deleted}");
    assert!(!orphans[0].path.exists());
    assert!(fjord(&["logs", "orphans", "--data-dir"]).starts_with("no orphaned log directories"));
    assert!(data.join("known-0").exists(), "a live partition is never an orphan");
}
