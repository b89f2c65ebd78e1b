//! The metrics endpoint (`metrics.listen`) scraped over HTTP after produces (one of them
//! refused), a clean of a compacted topic, and a malformed frame.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{produce_request, RawClient, TestBroker};
use fjord_record::BatchBuilder;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TOPIC: &str = "scraped";
const CORRUPT_MESSAGE: i16 = 2;

/// One HTTP/1.1 request; the status line and the body.
async fn http(addr: SocketAddr, method: &str, path: &str) -> (String, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(format!("{method} {path} HTTP/1.1\r\nHost: test\r\n\r\n").as_bytes()).await.unwrap();
    let mut response = String::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut response)).await.unwrap().unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_owned(), body.to_owned())
}

/// The value of one sample, `None` when it is not exposed.
fn sample(text: &str, name: &str, labels: &str) -> Option<f64> {
    let prefix = if labels.is_empty() { format!("{name} ") } else { format!("{name}{{{labels}}} ") };
    text.lines().find_map(|l| l.strip_prefix(&prefix)).map(|v| v.parse().unwrap())
}

fn batch(first: usize, n: usize) -> Bytes {
    let mut builder = BatchBuilder::new(1_700_000_000_000);
    for i in first..first + n {
        let key = format!("k{}", i % 5);
        builder.append(1_700_000_000_000 + i as i64, Some(key.as_bytes()), Some(format!("value {i}").as_bytes()), &[]);
    }
    builder.build()
}

async fn produce(client: &mut RawClient, records: Bytes) -> i16 {
    client.produce(7, &produce_request(TOPIC, 0, 1, 5000, records)).await.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_partitions_the_cleaner_and_requests_per_api() {
    // A free port for the endpoint (the broker binds it itself).
    let metrics = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start_in(dir.path().join("data"), |c| {
        c.auto_create_topics = false;
        c.metrics_listen = Some(metrics);
        c.set("log.cleaner.backoff.ms", "100").unwrap();
        // The topic's 1 KiB segments are below the default floor of segment.bytes.
        c.set("log.min.segment.bytes", "1024").unwrap();
    })
    .await
    .unwrap();
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    let config = |k: &'static str, v: &'static str| {
        CreatableTopicConfig::default().with_name(StrBytes::from_static_str(k)).with_value(Some(StrBytes::from_static_str(v)))
    };
    let create = CreateTopicsRequest::default().with_timeout_ms(5000).with_topics(vec![CreatableTopic::default()
        .with_name(TopicName(StrBytes::from_static_str(TOPIC)))
        .with_num_partitions(1)
        .with_replication_factor(1)
        .with_configs(vec![
            config("cleanup.policy", "compact"),
            config("segment.bytes", "1024"),
            config("min.cleanable.dirty.ratio", "0.01"),
            config("file.delete.delay.ms", "0"),
        ])]);
    let response: CreateTopicsResponse = client.call(ApiKey::CreateTopics, 5, &create).await.unwrap();
    assert_eq!(response.topics[0].error_code, 0);
    // 500 updates of 5 keys, in batches of 10: many 1 KiB segments, mostly dead records.
    for b in 0..50 {
        assert_eq!(produce(&mut client, batch(b * 10, 10)).await, 0);
    }
    let mut bad = batch(500, 1).to_vec();
    let last = bad.len() - 1;
    bad[last] ^= 0xff;
    assert_eq!(produce(&mut client, Bytes::from(bad)).await, CORRUPT_MESSAGE);
    // A frame that is no request closes its connection and is counted.
    let mut garbage = RawClient::connect(broker.addr).await.unwrap();
    garbage.send_frame(&[0, 18]).await.unwrap();
    assert!(garbage.is_closed_by_broker().await);

    let tp = format!("topic=\"{TOPIC}\",partition=\"0\"");
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let (status, text) = http(metrics, "GET", "/metrics").await;
        assert_eq!(status, "HTTP/1.1 200 OK");
        if sample(&text, "fjord_broker_cleaner_last_run_timestamp_seconds", &tp).is_some() {
            break text;
        }
        assert!(Instant::now() < deadline, "the cleaner never ran:\n{text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let value = |name: &str| sample(&text, name, &tp).unwrap_or_else(|| panic!("{name} missing:\n{text}"));
    assert_eq!(value("fjord_broker_log_end_offset"), 500.0);
    assert_eq!(value("fjord_broker_high_watermark"), 500.0);
    assert_eq!(value("fjord_broker_log_start_offset"), 0.0);
    assert!(value("fjord_broker_log_segments") >= 2.0, "{text}");
    assert!(value("fjord_broker_log_size_bytes") > 0.0);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    assert!((now - value("fjord_broker_cleaner_last_run_timestamp_seconds")).abs() < 60.0);
    let (before, after) = (value("fjord_broker_cleaner_last_bytes_before"), value("fjord_broker_cleaner_last_bytes_after"));
    assert!(after < before, "{text}");
    assert!((value("fjord_broker_cleaner_last_ratio") - after / before).abs() < 1e-9);
    assert!(value("fjord_broker_cleaner_last_records_removed") > 0.0, "{text}");
    assert_eq!(sample(&text, "fjord_broker_requests_total", "api=\"Produce\""), Some(51.0));
    assert_eq!(sample(&text, "fjord_broker_requests_total", "api=\"CreateTopics\""), Some(1.0));
    assert_eq!(
        sample(&text, "fjord_broker_request_errors_total", "api=\"Produce\",error=\"CorruptMessage\",code=\"2\""),
        Some(1.0)
    );
    assert_eq!(sample(&text, "fjord_broker_malformed_requests_total", ""), Some(1.0));

    assert_eq!(http(metrics, "GET", "/elsewhere").await.0, "HTTP/1.1 404 Not Found");
    assert_eq!(http(metrics, "POST", "/metrics").await.0, "HTTP/1.1 405 Method Not Allowed");
    broker.stop().await.unwrap();
}
