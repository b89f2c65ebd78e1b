//! kcat (librdkafka), an independent client, against the in-process broker.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{kcat, TestBroker};
use fjord_record::Compression;
use serde_json::Value;

/// One consumed message, from kcat's `-J` output.
#[derive(Debug)]
struct Consumed {
    partition: i64,
    offset: i64,
    key: String,
    payload: String,
    headers: Vec<String>,
}

fn parse_json_lines(out: &[u8]) -> Vec<Consumed> {
    String::from_utf8_lossy(out)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|line| {
            let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("bad kcat JSON {line}: {e}"));
            Consumed {
                partition: v["partition"].as_i64().unwrap(),
                offset: v["offset"].as_i64().unwrap(),
                key: v["key"].as_str().unwrap_or_default().to_owned(),
                payload: v["payload"].as_str().unwrap_or_default().to_owned(),
                headers: v["headers"]
                    .as_array()
                    .map(|a| a.iter().map(|h| h.as_str().unwrap_or_default().to_owned()).collect())
                    .unwrap_or_default(),
            }
        })
        .collect()
}

fn input(n: usize, tag: &str) -> Vec<u8> {
    let mut out = String::with_capacity(n * 64);
    for i in 0..n {
        // Repetitive values so that every codec actually shrinks the batches
        // (librdkafka sends a batch uncompressed when compression does not pay).
        out.push_str(&format!("key-{i}:{tag}-value-{i}-{}\n", "abcdefgh".repeat(4)));
    }
    out.into_bytes()
}

/// Produces `n` keyed messages with two headers and checks every one comes back once,
/// in order within its partition, offsets dense from 0.
async fn produce_and_consume(broker: &TestBroker, topic: &str, n: usize, extra: &[&str]) -> Vec<Consumed> {
    let bootstrap = broker.bootstrap();
    let mut args = vec!["-b", &bootstrap, "-P", "-t", topic, "-K:", "-H", "trace=abc", "-H", "source=kcat-test"];
    args.extend_from_slice(extra);
    kcat(&args, Some(&input(n, topic))).await.unwrap();
    let out = kcat(&["-b", &bootstrap, "-C", "-t", topic, "-o", "beginning", "-e", "-J", "-q"], None).await.unwrap();
    let consumed = parse_json_lines(&out);
    assert_eq!(consumed.len(), n, "{topic}: every message comes back once");
    let mut by_partition: BTreeMap<i64, Vec<&Consumed>> = BTreeMap::new();
    let mut seen = vec![false; n];
    for m in &consumed {
        let i: usize = m.key.strip_prefix("key-").and_then(|k| k.parse().ok()).unwrap_or_else(|| panic!("key {}", m.key));
        assert!(!seen[i], "key {i} seen twice");
        seen[i] = true;
        assert_eq!(m.payload, format!("{topic}-value-{i}-{}", "abcdefgh".repeat(4)));
        assert_eq!(m.headers, ["trace", "abc", "source", "kcat-test"]);
        by_partition.entry(m.partition).or_default().push(m);
    }
    for (partition, messages) in &by_partition {
        for (expected_offset, m) in messages.iter().enumerate() {
            assert_eq!(m.offset, expected_offset as i64, "{topic}-{partition}: offsets are dense");
        }
        let keys: Vec<usize> = messages.iter().map(|m| m.key[4..].parse().unwrap()).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "{topic}-{partition}: produce order is kept");
    }
    consumed
}

/// Every stored batch of the topic, with its codec, read straight from the segment files.
fn stored_codecs(data_dir: &Path, topic: &str) -> Vec<Compression> {
    let mut codecs = Vec::new();
    for entry in std::fs::read_dir(data_dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with(&format!("{topic}-")) {
            continue;
        }
        for file in std::fs::read_dir(&path).unwrap() {
            let file = file.unwrap().path();
            if file.extension().is_some_and(|e| e == "log") {
                let bytes = std::fs::read(&file).unwrap();
                for batch in fjord_record::batch::batches(&bytes) {
                    codecs.push(batch.unwrap().0.compression());
                }
            }
        }
    }
    codecs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kcat_produces_and_consumes_100k_keyed_messages_with_headers_on_4_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), |c| c.num_partitions = 4).await.unwrap();
    let consumed = produce_and_consume(&broker, "events", 100_000, &[]).await;
    let partitions: std::collections::BTreeSet<i64> = consumed.iter().map(|m| m.partition).collect();
    assert_eq!(partitions.len(), 4, "keys spread over all 4 partitions");
    assert!(stored_codecs(&broker.data_dir, "events").iter().all(|c| *c == Compression::None));
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kcat_round_trips_every_compression_codec_stored_compressed() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), |c| c.num_partitions = 4).await.unwrap();
    for (codec, expected) in
        [("gzip", Compression::Gzip), ("snappy", Compression::Snappy), ("lz4", Compression::Lz4), ("zstd", Compression::Zstd)]
    {
        let topic = format!("compressed-{codec}");
        produce_and_consume(&broker, &topic, 20_000, &["-z", codec]).await;
        let codecs = stored_codecs(&broker.data_dir, &topic);
        assert!(!codecs.is_empty());
        assert!(codecs.iter().all(|c| *c == expected), "{codec}: batches stored as produced: {codecs:?}");
    }
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kcat_consumes_from_an_offset_and_from_a_timestamp() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), |_| {}).await.unwrap();
    let bootstrap = broker.bootstrap();
    let lines = |range: std::ops::Range<usize>| range.map(|i| format!("m{i}\n")).collect::<String>().into_bytes();
    kcat(&["-b", &bootstrap, "-P", "-t", "timeline", "-p", "0"], Some(&lines(0..500))).await.unwrap();
    // Everything produced from here on has a timestamp >= split.
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let split = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    kcat(&["-b", &bootstrap, "-P", "-t", "timeline", "-p", "0"], Some(&lines(500..800))).await.unwrap();

    let from_offset =
        kcat(&["-b", &bootstrap, "-C", "-t", "timeline", "-p", "0", "-o", "123", "-c", "5", "-f", "%o:%s\n", "-q"], None)
            .await
            .unwrap();
    assert_eq!(String::from_utf8(from_offset).unwrap(), "123:m123\n124:m124\n125:m125\n126:m126\n127:m127\n");

    let timestamp = format!("s@{split}");
    let from_time =
        kcat(&["-b", &bootstrap, "-C", "-t", "timeline", "-p", "0", "-o", &timestamp, "-e", "-f", "%o:%s\n", "-q"], None)
            .await
            .unwrap();
    let from_time = String::from_utf8(from_time).unwrap();
    let expected: String = (500..800).map(|i| format!("{i}:m{i}\n")).collect();
    assert_eq!(from_time, expected);

    // Offsets by timestamp through kcat's query mode, and the end of the log.
    let query = kcat(&["-b", &bootstrap, "-Q", "-t", &format!("timeline:0:{split}")], None).await.unwrap();
    assert!(String::from_utf8_lossy(&query).contains("offset 500"), "{}", String::from_utf8_lossy(&query));
    let tail =
        kcat(&["-b", &bootstrap, "-C", "-t", "timeline", "-p", "0", "-o", "-2", "-e", "-f", "%o\n", "-q"], None).await.unwrap();
    assert_eq!(String::from_utf8(tail).unwrap(), "798\n799\n");
    broker.stop().await.unwrap();
}
