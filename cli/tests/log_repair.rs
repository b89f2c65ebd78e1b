//! A damaged segment as an operator meets it (issue 26): `fjord topics describe` and the
//! metrics show the partition's replica offline with the reason while the other
//! partitions are served as usual; `fjord logs repair` refuses while the broker runs,
//! says what it would do with `--dry-run` and writes nothing, then truncates at the first
//! bad batch and keeps the rest in a side directory; the broker starts again and serves
//! every record before the damage.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{free_port, metrics, start_broker, FjordProcess};
use fjord_client::{Acks, Admin, ClientConfig, NewTopic, Producer, ProducerConfig, ProducerRecord};

fn client(port: u16) -> ClientConfig {
    ClientConfig { allow_auto_create_topics: false, ..ClientConfig::new(&format!("127.0.0.1:{port}")) }
}

/// Small segments, so the damage sits in the middle of the log; metrics on `metrics`.
fn start(port: u16, data: &Path, metrics: u16) -> FjordProcess {
    let metrics = format!("127.0.0.1:{metrics}");
    let env = [
        ("FJORD_LOG_MIN_SEGMENT_BYTES", "1024"),
        ("FJORD_LOG_SEGMENT_BYTES", "4096"),
        ("FJORD_METRICS_LISTEN", metrics.as_str()),
    ];
    start_broker(port, data, &env)
}

fn stop(mut broker: FjordProcess) {
    let status = Command::new("kill").args(["-TERM", &broker.id().to_string()]).status().unwrap();
    assert!(status.success());
    let exit = broker.wait().unwrap();
    assert!(exit.success(), "fjord broker exited with {exit}");
}

/// 30 acks=all rounds of 10 records to partition 0: 30 batches or more.
async fn produce(port: u16, topic: &str) -> Vec<String> {
    let producer =
        Producer::connect(ProducerConfig { client: client(port), acks: Acks::All, ..ProducerConfig::default() }).await.unwrap();
    let mut values = Vec::new();
    for round in 0..30 {
        let mut pending = Vec::new();
        for i in 0..10 {
            let value = format!("{topic} round {round} record {i} {}", "x".repeat(40));
            pending.push(producer.send(ProducerRecord::new(topic, value.clone()).partition(0)).await.unwrap());
            values.push(value);
        }
        for delivery in pending {
            delivery.await.unwrap();
        }
    }
    values
}

/// Runs the `fjord` binary; (success, stdout, stderr).
fn fjord(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_fjord")).args(args).env("RUST_LOG", "warn").output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn describe(port: u16, topic: &str) -> String {
    let (ok, out, err) = fjord(&["topics", "--bootstrap", &format!("127.0.0.1:{port}"), "describe", topic]);
    assert!(ok, "{err}");
    out
}

fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_file()).collect();
    out.sort();
    out.into_iter().map(|p| (p.clone(), std::fs::read(&p).unwrap())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_segment_is_shown_offline_then_repaired_keeping_the_damaged_bytes_aside() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (port, metrics_port) = (free_port(), free_port());
    let broker = start(port, &data, metrics_port);
    let admin = Admin::connect(client(port)).await.unwrap();
    admin.create_topics(&[NewTopic::new("damaged", 1), NewTopic::new("healthy", 1)]).await.unwrap();
    let values = produce(port, "damaged").await;
    let healthy = produce(port, "healthy").await;
    stop(broker);

    // One flipped byte inside the second batch of a segment in the middle of the log.
    let partition_dir = data.join("damaged-0");
    let logs = fjord_testkit::segments(&partition_dir).unwrap();
    assert!(logs.len() >= 4, "{logs:?}");
    let segment = &logs[logs.len() / 2];
    let bytes = std::fs::read(segment).unwrap();
    let first = fjord_record::BatchHeader::parse(&bytes).unwrap();
    let second = fjord_record::BatchHeader::parse(&bytes[first.size()..]).unwrap();
    let mut damaged = bytes.clone();
    damaged[first.size() + 70] ^= 0x01;
    std::fs::write(segment, &damaged).unwrap();
    let mut cut = damaged[first.size()..].to_vec();
    for later in &logs[logs.len() / 2 + 1..] {
        cut.extend(std::fs::read(later).unwrap());
    }

    let broker = start(port, &data, metrics_port);
    // The scrubber finds the damage within a second or two of the start.
    let deadline = Instant::now() + Duration::from_secs(30);
    let shown = loop {
        let text = describe(port, "damaged");
        if text.contains("offline [0]") || Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(shown.contains("offline [0]") && shown.contains("error KAFKA_STORAGE_ERROR"), "{shown}");
    assert!(shown.contains("log damaged or cannot be opened"), "the reason: {shown}");
    let other = describe(port, "healthy");
    assert!(!other.contains("offline") && !other.contains("error"), "{other}");
    let text = metrics(metrics_port);
    assert!(text.contains("fjord_broker_unhealthy_partitions 1\n"), "{text}");
    assert!(text.contains("fjord_broker_partition_unhealthy{topic=\"damaged\",partition=\"0\",state=\"damaged\"} 1\n"), "{text}");
    assert_eq!(fjord_testkit::read_values(&client(port), "healthy", 0).await.unwrap(), healthy, "the other partition is served");

    let data_arg = data.to_str().unwrap();
    let repair = ["logs", "repair", "--data-dir", data_arg, "--topic", "damaged", "--partition", "0"];
    let (ok, _, err) = fjord(&repair);
    assert!(!ok && err.contains("stop the broker"), "refused while the broker runs: {err}");
    stop(broker);

    let before = files(&partition_dir);
    let (ok, dry, err) = fjord(&[&repair[..], &["--dry-run"]].concat());
    assert!(ok, "{err}");
    assert!(
        dry.contains(&format!("dry run: damaged-0: first damaged batch at byte {} of {}", first.size(), segment.display())),
        "{dry}"
    );
    assert!(dry.contains(&format!("would keep: offsets 0 to {}", second.base_offset - 1)), "{dry}");
    assert!(dry.contains("would move aside"), "{dry}");
    assert_eq!(files(&partition_dir), before, "a dry run writes nothing");

    let (ok, out, err) = fjord(&repair);
    assert!(ok, "{err}");
    assert!(out.contains(&format!("kept: offsets 0 to {}", second.base_offset - 1)), "{out}");
    assert!(out.contains("moved aside: "), "{out}");
    let side: Vec<PathBuf> = std::fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("damaged-0-damaged-"))
        .collect();
    assert_eq!(side.len(), 1, "{side:?}");
    let mut kept_aside: Vec<PathBuf> = std::fs::read_dir(&side[0])
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().contains(".log"))
        .collect();
    kept_aside.sort();
    // `<damaged segment>.log.from-<byte>` sorts before the later segments' names.
    let aside: Vec<u8> = kept_aside.iter().flat_map(|p| std::fs::read(p).unwrap()).collect();
    assert_eq!(aside, cut, "every byte cut off is on disk in the side directory");
    assert!(std::fs::read_to_string(side[0].join("repair.txt")).unwrap().contains("first bad batch"));

    let broker = start(port, &data, metrics_port);
    let read = fjord_testkit::read_values(&client(port), "damaged", 0).await.unwrap();
    assert_eq!(read, values[..second.base_offset as usize], "every record before the damage, in order");
    let shown = describe(port, "damaged");
    assert!(!shown.contains("offline") && !shown.contains("error"), "{shown}");
    assert!(metrics(metrics_port).contains("fjord_broker_unhealthy_partitions 0\n"));
    // The log goes on after the repair.
    let producer =
        Producer::connect(ProducerConfig { client: client(port), acks: Acks::All, ..ProducerConfig::default() }).await.unwrap();
    producer.send(ProducerRecord::new("damaged", "after the repair").partition(0)).await.unwrap().await.unwrap();
    let read = fjord_testkit::read_values(&client(port), "damaged", 0).await.unwrap();
    assert_eq!(read.last().map(String::as_str), Some("after the repair"));
    assert_eq!(read.len(), second.base_offset as usize + 1);
    stop(broker);
    assert!(side[0].exists(), "never deleted");
}
