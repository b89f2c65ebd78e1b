//! Log compaction through the broker: a `cleanup.policy=compact` topic filled by kcat
//! (librdkafka), cleaned by the broker's periodic cleaner, read back by kcat.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{kcat, produce_request, topic_name, RawClient, TestBroker};
use fjord_record::BatchBuilder;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use serde_json::Value;

const TOPIC: &str = "compacted";
const KEYS: usize = 1000;
const ROUNDS: usize = 100;
/// Keys `0..TOMBSTONED` get a tombstone in round `TOMBSTONE_ROUND` and no update after it.
const TOMBSTONED: usize = 50;
const TOMBSTONE_ROUND: usize = 50;
const INVALID_RECORD: i16 = 87;

fn str_bytes(s: &'static str) -> StrBytes {
    StrBytes::from_static_str(s)
}

/// kcat input (`key:value` lines; an empty value is a tombstone with `-Z`) and, per
/// produced record in order (so its index is its offset), its key and value.
fn updates() -> (Vec<u8>, Vec<(String, Option<String>)>) {
    let mut input = String::new();
    let mut produced = Vec::new();
    for round in 0..ROUNDS {
        for k in 0..KEYS {
            let key = format!("key-{k}");
            let value = match (k < TOMBSTONED, round) {
                (true, r) if r == TOMBSTONE_ROUND => None,
                (true, r) if r > TOMBSTONE_ROUND => continue,
                _ => Some(format!("v-{round}-{k}")),
            };
            input.push_str(&format!("{key}:{}\n", value.as_deref().unwrap_or_default()));
            produced.push((key, value));
        }
    }
    (input.into_bytes(), produced)
}

/// (offset, key, value) of every record kcat reads from the beginning.
async fn consume_all(broker: &TestBroker) -> Vec<(i64, String, Option<String>)> {
    let bootstrap = broker.bootstrap();
    let out = kcat(&["-b", &bootstrap, "-C", "-t", TOPIC, "-o", "beginning", "-e", "-J", "-q"], None).await.unwrap();
    String::from_utf8_lossy(&out)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|line| {
            let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("bad kcat JSON {line}: {e}"));
            (v["offset"].as_i64().unwrap(), v["key"].as_str().unwrap().to_owned(), v["payload"].as_str().map(str::to_owned))
        })
        .collect()
}

/// Base offset of the active (last) segment of partition 0.
fn active_segment_base(data_dir: &Path) -> i64 {
    std::fs::read_dir(data_dir.join(format!("{TOPIC}-0")))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.strip_suffix(".log")?.parse::<i64>().ok())
        .max()
        .expect("the partition has a segment")
}

/// True once everything below the active segment is compacted: each key at most once
/// and no tombstone (they are past `delete.retention.ms` after the second clean).
fn compacted_below(records: &[(i64, String, Option<String>)], active_base: i64) -> bool {
    let mut seen = std::collections::HashSet::new();
    records.iter().filter(|r| r.0 < active_base).all(|(_, key, value)| value.is_some() && seen.insert(key.as_str()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compacted_topic_keeps_the_latest_value_of_each_key_at_its_offset() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), |c| {
        c.auto_create_topics = false;
        c.set("log.cleaner.backoff.ms", "100").unwrap();
        c.retention_check_interval = Duration::from_millis(100);
        // The topic's 64 KiB segments are below the default floor of segment.bytes.
        c.set("log.min.segment.bytes", "65536").unwrap();
    })
    .await
    .unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    let config = |key: &'static str, value: &'static str| {
        CreatableTopicConfig::default().with_name(str_bytes(key)).with_value(Some(str_bytes(value)))
    };
    let create = CreateTopicsRequest::default().with_timeout_ms(5000).with_topics(vec![CreatableTopic::default()
        .with_name(topic_name(TOPIC))
        .with_num_partitions(1)
        .with_replication_factor(1)
        .with_configs(vec![
            config("cleanup.policy", "compact"),
            config("segment.bytes", "65536"),
            config("min.cleanable.dirty.ratio", "0.01"),
            config("delete.retention.ms", "500"),
            config("file.delete.delay.ms", "0"),
        ])]);
    let response: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 5, &create).await.unwrap();
    assert_eq!(response.topics[0].error_code, 0, "{:?}", response.topics[0].error_message);

    // DescribeConfigs shows the policy and the compaction settings as topic overrides.
    let describe = DescribeConfigsRequest::default().with_resources(vec![DescribeConfigsResource::default()
        .with_resource_type(2)
        .with_resource_name(str_bytes(TOPIC))
        .with_configuration_keys(None)]);
    let response: DescribeConfigsResponse = client.call(ApiKey::DescribeConfigs, 4, &describe).await.unwrap();
    let configs: HashMap<&str, (Option<&str>, i8)> =
        response.results[0].configs.iter().map(|c| (c.name.as_str(), (c.value.as_deref(), c.config_source))).collect();
    assert_eq!(configs["cleanup.policy"], (Some("compact"), 1));
    assert_eq!(configs["min.cleanable.dirty.ratio"], (Some("0.01"), 1));
    assert_eq!(configs["delete.retention.ms"], (Some("500"), 1));
    assert_eq!(configs["min.compaction.lag.ms"], (Some("0"), 5), "a default");

    // A keyless record cannot be compacted: INVALID_RECORD, nothing appended.
    let mut builder = BatchBuilder::new(1_700_000_000_000);
    builder.append(1_700_000_000_000, Some(b"k"), Some(b"keyed"), &[]);
    builder.append(1_700_000_000_001, None, Some(b"keyless"), &[]);
    let keyless = produce_request(TOPIC, 0, 1, 5000, builder.build());
    assert_eq!(client.produce(7, &keyless).await.0, INVALID_RECORD);
    assert_eq!(client.latest_offset(TOPIC).await.1, 0, "nothing of the refused batch is appended");

    // 100 rounds over 1,000 keys, small batches so that the 64 KiB segments roll often.
    let (input, produced) = updates();
    let bootstrap = broker.bootstrap();
    let produce_started = Instant::now();
    kcat(&["-b", &bootstrap, "-P", "-t", TOPIC, "-K:", "-Z", "-X", "batch.num.messages=500", "-X", "linger.ms=5"], Some(&input))
        .await
        .unwrap();
    let produced_in = produce_started.elapsed();
    assert_eq!(client.latest_offset(TOPIC).await.1, produced.len() as i64);

    // Poll until the cleaner has compacted everything below the active segment,
    // tombstones included (they go in a clean at least delete.retention.ms after the
    // first one that passed over them).
    let wait_started = Instant::now();
    let records = loop {
        let records = consume_all(&broker).await;
        let active_base = active_segment_base(&broker.data_dir);
        if compacted_below(&records, active_base) && records.first().is_some_and(|r| r.0 < active_base) {
            break records;
        }
        assert!(wait_started.elapsed() < Duration::from_secs(40), "not compacted after 40 s ({} records)", records.len());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!(
        "produced {} records in {produced_in:?}; compacted to {} records {:?} after the produce ended",
        produced.len(),
        records.len(),
        wait_started.elapsed()
    );

    // Offsets are the ones the records were produced at: strictly increasing, with gaps.
    assert!(records.windows(2).all(|w| w[0].0 < w[1].0), "offsets strictly increase");
    for (offset, key, value) in &records {
        let (produced_key, produced_value) = &produced[*offset as usize];
        assert_eq!((key, value), (produced_key, produced_value), "offset {offset} holds what was produced there");
    }
    assert!(records.len() < produced.len() / 10, "{} records left of {}", records.len(), produced.len());
    // Every key's last record is its latest value; tombstoned keys are gone.
    let mut latest: HashMap<&str, &Option<String>> = HashMap::new();
    for (_, key, value) in &records {
        latest.insert(key, value);
    }
    for k in 0..KEYS {
        let key = format!("key-{k}");
        if k < TOMBSTONED {
            assert!(!latest.contains_key(key.as_str()), "{key} was deleted by a tombstone");
        } else {
            assert_eq!(latest[key.as_str()].as_deref(), Some(format!("v-{}-{k}", ROUNDS - 1).as_str()), "{key}");
        }
    }
    assert_eq!(latest.len(), KEYS - TOMBSTONED);
    assert_eq!(client.latest_offset(TOPIC).await.1, produced.len() as i64, "compaction keeps the log end");
    drop(client);
    broker.stop().await.unwrap();

    // After a restart the topic is still compacted (its config comes back from the
    // store) and the cleaned segments read back the same.
    let broker = TestBroker::start_in(dir.path().join("data"), |c| {
        c.auto_create_topics = false;
        c.set("log.cleaner.backoff.ms", "100").unwrap();
    })
    .await
    .unwrap();
    assert_eq!(consume_all(&broker).await, records, "the compacted log survives a restart");
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    assert_eq!(client.produce(7, &keyless).await.0, INVALID_RECORD, "still compacted");
    drop(client);
    broker.stop().await.unwrap();
}
