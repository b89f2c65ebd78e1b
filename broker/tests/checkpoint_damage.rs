//! Every checkpoint file of a log dir, and `meta.properties`, damaged in turn with the
//! broker stopped (issue 26): cut short, one byte flipped (a digit stays a digit, so the
//! file often still parses) and garbage. The broker starts each time and every
//! acknowledged record is served; a damaged file is rebuilt or ignored, never a reason
//! to delete data.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use fjord_client::{Acks, ClientConfig, Consumer, ConsumerConfig, OffsetReset, Producer, ProducerConfig, ProducerRecord};
use fjord_testkit::{read_values, Cluster};

const REACT: Duration = Duration::from_secs(30);

/// The files damaged, relative to the broker's data dir.
fn damaged_files(data: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = [
        "recovery-point-offset-checkpoint",
        "replication-offset-checkpoint",
        "log-start-offset-checkpoint",
        "meta.properties",
        "plain-0/leader-epoch-checkpoint",
        "compacted-0/cleaner-offset-checkpoint",
        "compacted-0/leader-epoch-checkpoint",
    ]
    .iter()
    .map(|f| data.join(f))
    .collect();
    files.retain(|f| f.exists());
    files
}

/// `bytes` damaged as `kind` says.
fn damage(kind: &str, bytes: &[u8]) -> Vec<u8> {
    match kind {
        "truncated" => bytes[..bytes.len() / 2].to_vec(),
        "flipped" => {
            // The first digit from the middle on, XOR 1: still a digit.
            let mut out = bytes.to_vec();
            let at = (out.len() / 2..out.len()).chain(0..out.len()).find(|&i| out[i].is_ascii_digit()).unwrap_or(0);
            out[at] ^= 0x01;
            out
        }
        _ => b"\xff\xfe\x00 not a checkpoint \x13\n\n".to_vec(),
    }
}

/// Latest value per key of a compacted topic, read to its end.
async fn latest_per_key(client: &ClientConfig, topic: &str) -> std::collections::BTreeMap<String, String> {
    let admin = fjord_client::Admin::connect(client.clone()).await.unwrap();
    let end = admin.list_offsets(&[(topic.to_string(), 0, fjord_client::OffsetSpec::Latest)]).await.unwrap()[0];
    let config = ConsumerConfig {
        client: client.clone(),
        auto_offset_reset: OffsetReset::Earliest,
        fetch_max_wait: Duration::from_millis(50),
        ..ConsumerConfig::default()
    };
    let mut consumer = Consumer::connect(config).await.unwrap();
    consumer.assign([fjord_client::TopicPartition::new(topic, 0)]).await.unwrap();
    let mut latest = std::collections::BTreeMap::new();
    let deadline = tokio::time::Instant::now() + REACT;
    let mut position = 0;
    while position < end {
        assert!(tokio::time::Instant::now() < deadline, "read {topic} to {position} of {end}");
        for r in consumer.poll(Duration::from_millis(200)).await.unwrap() {
            position = r.offset + 1;
            let key = String::from_utf8(r.key.unwrap().to_vec()).unwrap();
            latest.insert(key, String::from_utf8(r.value.unwrap().to_vec()).unwrap());
        }
    }
    latest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn damaged_checkpoints_and_meta_properties_never_stop_the_broker_or_lose_a_record() {
    common::init_tracing();
    let mut cluster = Cluster::builder()
        .brokers(1)
        .config("log.min.segment.bytes", 1024)
        .config("log.cleaner.backoff.ms", 100)
        .start()
        .await
        .unwrap();
    cluster.create_topic("plain", 1, &[("segment.bytes", "4096")], REACT).await.unwrap();
    let compact = [("segment.bytes", "4096"), ("cleanup.policy", "compact"), ("min.cleanable.dirty.ratio", "0.01")];
    cluster.create_topic("compacted", 1, &compact, REACT).await.unwrap();
    let client = ClientConfig::new(&cluster.bootstrap());
    let producer =
        Producer::connect(ProducerConfig { client: client.clone(), acks: Acks::All, ..ProducerConfig::default() }).await.unwrap();
    let mut values = Vec::new();
    let mut latest = std::collections::BTreeMap::new();
    for i in 0..600 {
        let value = format!("record {i} {}", "x".repeat(40));
        producer.send(ProducerRecord::new("plain", value.clone()).partition(0)).await.unwrap().await.unwrap();
        values.push(value);
        let (key, value) = (format!("key-{}", i % 20), format!("value {i} {}", "y".repeat(40)));
        producer
            .send(ProducerRecord::new("compacted", value.clone()).key(key.clone()).partition(0))
            .await
            .unwrap()
            .await
            .unwrap();
        latest.insert(key, value);
    }
    let id = cluster.ids()[0];
    let data = cluster.data_dir(id).to_path_buf();
    fjord_testkit::wait_until(REACT, "the cleaner wrote its checkpoint", || async {
        Ok(data.join("compacted-0/cleaner-offset-checkpoint").exists().then_some(()))
    })
    .await
    .unwrap();
    cluster.stop(id).await.unwrap();
    let files = damaged_files(&data);
    assert_eq!(files.len(), 7, "{files:?}");
    let good: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();

    for kind in ["truncated", "flipped", "garbage"] {
        for (file, bytes) in files.iter().zip(&good) {
            std::fs::write(file, damage(kind, bytes)).unwrap();
        }
        cluster.start(id).await.unwrap_or_else(|e| panic!("{kind}: the broker did not start: {e}"));
        cluster.wait_for_leader("plain", 0, REACT).await.unwrap();
        assert_eq!(read_values(&client, "plain", 0).await.unwrap(), values, "{kind}: every acknowledged record");
        assert_eq!(latest_per_key(&client, "compacted").await, latest, "{kind}: every key's latest value");
        cluster.stop(id).await.unwrap();
        for (file, bytes) in files.iter().zip(&good) {
            std::fs::write(file, bytes).unwrap();
        }
    }
}
