//! The audit over a real pipeline on loopback: broker (`fjord_broker::run`, broker tier
//! counted at append with `audit.enable`) ← gateway (`fjord_gateway::run`, gateway tier
//! counted inside the gateway) and a direct producer (the producer tier, counted by the
//! client's audit hook at acknowledgement) → a consumer (the consumer tier, counted by the
//! client's hook at poll). A second test deletes a range with retention before the
//! consumer reads it: the broker tier, counted when the data arrived, is complete and the
//! consumer is short by exactly the deleted records in exactly that window. A third
//! checks that a send that fails is counted by neither the producer nor the broker. A
//! fourth has a transactional producer abort a transaction: a read_committed consumer's
//! tier agrees with the producer tier, which counts committed transactions only.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use fjord_audit::record::window_start;
use fjord_audit::{collect, render, AuditCounter, Format, Report, ReportConfig, Verdict, AUDIT_TOPIC};
use fjord_broker::BrokerConfig;
use fjord_client::{
    Admin, AuditHook, ClientConfig, Consumer, ConsumerConfig, ConsumerRecord, IsolationLevel, NewTopic, OffsetReset, OffsetSpec,
    Producer, ProducerConfig, ProducerRecord, SeekTo, TopicPartition,
};
use fjord_record::now_ms;
use fjord_testkit::StandaloneBroker;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

const WINDOW: Duration = Duration::from_secs(1);
const TOPICS: [&str; 2] = ["clicks", "views"];

async fn bind() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").await.expect("bind loopback")
}

/// A broker with `partitions` partitions a topic and the broker tier on (publishing every
/// 200 ms over `window`), its config then adjusted by `configure`.
async fn audited_broker(partitions: i32, window: Duration, configure: impl FnOnce(&mut BrokerConfig)) -> StandaloneBroker {
    StandaloneBroker::builder()
        .configure(|config| {
            config.num_partitions = partitions;
            config.audit = fjord_broker::AuditConfig {
                enable: true,
                interval: Duration::from_millis(200),
                window,
                cluster: "online".into(),
                ..Default::default()
            };
            configure(config);
        })
        .audit_tier()
        .start()
        .await
        .unwrap()
}

/// Reads every record of `topic` up to its current end, through a consumer with
/// `audit` as its hook (when given).
async fn read_all(
    client: &ClientConfig,
    topic: &str,
    partitions: i32,
    expect: usize,
    audit: Option<Arc<dyn AuditHook>>,
) -> Vec<ConsumerRecord> {
    let mut consumer = Consumer::connect(ConsumerConfig {
        client: client.clone(),
        auto_offset_reset: OffsetReset::Earliest,
        audit,
        ..ConsumerConfig::default()
    })
    .await
    .unwrap();
    let tps: Vec<_> = (0..partitions).map(|p| TopicPartition::new(topic, p)).collect();
    consumer.assign(tps.clone()).await.unwrap();
    for tp in &tps {
        consumer.seek(tp, SeekTo::Beginning).unwrap();
    }
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while out.len() < expect {
        assert!(Instant::now() < deadline, "read {} of {expect} records of {topic}", out.len());
        out.extend(consumer.poll(Duration::from_millis(200)).await.unwrap());
    }
    out
}

fn report_config(client: &ClientConfig) -> ReportConfig {
    ReportConfig { window: WINDOW, grace: Duration::from_millis(500), ..ReportConfig::new(client.clone()) }
}

/// Collects reports until `done` holds for one (the brokers publish every 200 ms).
async fn report_when(cfg: &ReportConfig, what: &str, done: impl Fn(&Report) -> bool) -> Report {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let report = collect(cfg).await.unwrap();
        if done(&report) {
            return report;
        }
        assert!(Instant::now() < deadline, "{what}: {}", fjord_audit::render::text(&report));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The sum of `tier` over the windows of `topic`.
fn tier_total(r: &Report, topic: &str, tier: &str) -> u64 {
    r.windows.iter().filter(|w| w.topic == topic).map(|w| w.counts.get(tier).copied().unwrap_or(0)).sum()
}

fn windows_of(r: &Report) -> Vec<(String, i64, BTreeMap<String, u64>, Verdict)> {
    r.windows.iter().map(|w| (w.topic.clone(), w.window_start, w.counts.clone(), w.verdict)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipeline_is_complete_at_every_tier_and_a_replayed_audit_record_counts_once() {
    let dir = tempfile::tempdir().unwrap();
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();

    let broker = audited_broker(2, WINDOW, |_| {}).await;
    let broker_addr = broker.addr.clone();
    let client = ClientConfig::new(&broker_addr);
    let admin = Admin::connect(client.clone()).await.unwrap();
    admin.create_topics(&TOPICS.map(|t| NewTopic::new(t, 2))).await.unwrap();

    // Gateway with its audit counter on (the gateway tier).
    let gateway_stop = CancellationToken::new();
    let http = bind().await;
    let http_addr = http.local_addr().unwrap();
    let gw_config = fjord_gateway::GatewayConfig {
        host_name: Some("gw-1".into()),
        audit_interval: Some(Duration::from_millis(200)),
        audit_window: WINDOW,
        audit_cluster: "online".into(),
        ..fjord_gateway::GatewayConfig::new(broker_addr.clone())
    };
    let gateway = tokio::spawn(fjord_gateway::run(gw_config, http, bind().await, gateway_stop.clone()));

    // A direct producer with the opt-in producer tier (its audit hook), also feeding "clicks".
    let producer_tier = Arc::new(AuditCounter::new("producer", "app-1", "online").with_window(WINDOW).unwrap());
    let producer = Producer::connect(ProducerConfig {
        client: client.clone(),
        audit: Some(producer_tier.clone()),
        ..ProducerConfig::default()
    })
    .await
    .unwrap();
    let producer_publisher = producer_tier.clone().spawn_publisher(client.clone(), Duration::from_millis(200), shutdown.clone());

    // Publish for ~3.5 windows: a batch every 250 ms over HTTP, and a few direct records.
    let http_client = reqwest::Client::new();
    let mut sent: BTreeMap<&str, usize> = BTreeMap::new();
    let start = Instant::now();
    let mut round = 0;
    while start.elapsed() < Duration::from_millis(3500) {
        for (i, topic) in TOPICS.iter().enumerate() {
            let n = 10 + 3 * i + round % 4;
            let body: String = (0..n).map(|k| format!("{{\"round\":{round},\"k\":{k}}}\n")).collect();
            let r = http_client
                .post(format!("http://{http_addr}/v1/events/{topic}"))
                .header("content-type", "application/x-ndjson")
                .body(body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
            *sent.entry(topic).or_default() += n;
        }
        for k in 0..3 {
            let created = now_ms();
            let record = ProducerRecord::new("clicks", Bytes::from(format!("direct {round} {k}")))
                .header(fjord_audit::CREATED_HEADER, Some(Bytes::from(created.to_string())));
            producer.send(record).await.unwrap().await.unwrap();
            *sent.entry("clicks").or_default() += 1;
        }
        round += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Stopping the gateway flushes its last counts; run returns after the flush.
    gateway_stop.cancel();
    gateway.await.unwrap().unwrap();
    producer_tier.publish(&producer).await.unwrap();

    // 1. Gateway + producer tiers against the broker tier (the broker's own counts of its
    // appends): complete everywhere, once the broker's last publish is in.
    let cfg = report_config(&client);
    let report = report_when(&cfg, "the broker tier never reached what was sent", |r| {
        TOPICS.iter().all(|t| tier_total(r, t, "broker") == sent[t] as u64)
    })
    .await;
    assert!(report.all_complete(), "{}", fjord_audit::render::text(&report));
    for topic in TOPICS {
        let rows = report.windows.iter().filter(|w| w.topic == topic).count();
        assert!(rows >= 3, "{topic} spans only {rows} windows");
    }
    assert_eq!(
        tier_total(&report, "clicks", "producer"),
        3 * round as u64,
        "the producer hook counted each acknowledged record once"
    );
    assert_eq!(report.topics.iter().find(|t| t.topic == "clicks").unwrap().producing, ["producer", "gateway"]);
    assert_eq!(report.malformed_skipped, 0);

    // 2. A consumer with the opt-in consumer tier (its audit hook) reads everything.
    let consumer_tier = Arc::new(AuditCounter::new("consumer", "reader-1", "online").with_window(WINDOW).unwrap());
    for topic in TOPICS {
        read_all(&client, topic, 2, sent[topic], Some(consumer_tier.clone())).await;
    }
    consumer_tier.publish(&producer).await.unwrap();
    let report = collect(&cfg).await.unwrap();
    assert!(report.all_complete(), "{}", fjord_audit::render::text(&report));
    for w in &report.windows {
        assert_eq!((w.counts["broker"], w.counts["consumer"]), (w.produced, w.produced), "{} {}", w.topic, w.window_start_utc);
    }
    let before = windows_of(&report);

    // 3. Replaying an audit record (the same value again) changes nothing.
    let audit = read_all(&client, AUDIT_TOPIC, 1, report.audit_records as usize, None).await;
    let last = audit.last().unwrap().value.clone().unwrap();
    producer.send(ProducerRecord::new(AUDIT_TOPIC, last)).await.unwrap().await.unwrap();
    // 4. Malformed records are skipped and counted.
    for bad in [Some(Bytes::from_static(b"garbage")), Some(Bytes::from_static(b"{\"tier\":\"x\"}")), None] {
        let record = ProducerRecord { topic: AUDIT_TOPIC.into(), value: bad, ..ProducerRecord::default() };
        producer.send(record).await.unwrap().await.unwrap();
    }
    let after = collect(&cfg).await.unwrap();
    assert_eq!((after.replays_ignored, after.malformed_skipped), (1, 3));
    assert_eq!(
        after.audit_records,
        report.audit_records,
        "{}\n---\n{}",
        fjord_audit::render::text(&report),
        fjord_audit::render::text(&after)
    );
    assert_eq!(windows_of(&after), before);

    // The JSON contract.
    let json: serde_json::Value = serde_json::from_str(&render(&after, Format::Json).unwrap()).unwrap();
    let w = &json["windows"][0];
    assert!(
        w["topic"].is_string() && w["window_start"].is_i64() && w["counts"]["broker"].is_u64() && w["verdict"] == "complete",
        "{w}"
    );
    let text = render(&after, Format::Text).unwrap();
    assert!(text.contains("3 malformed skipped"), "{text}");
    println!("{text}");

    // 5. The HTML page in headless Chromium: parses, one chart per topic, a screenshot.
    let html_path = dir.path().join("report.html");
    std::fs::write(&html_path, render(&after, Format::Html).unwrap()).unwrap();
    let lines: usize = after.topics.iter().map(|t| t.tiers.len()).sum();
    assert_eq!(lines, 7, "clicks: producer, gateway, broker, consumer; views: gateway, broker, consumer");
    check_in_chromium(&html_path, dir.path(), TOPICS.len(), lines);

    shutdown.cancel();
    producer_publisher.await.unwrap().unwrap();
}

const CHROMIUM: &str = "/usr/bin/chromium";

fn chromium(dir: &Path, args: &[String]) -> std::process::Output {
    assert!(
        Path::new(CHROMIUM).exists(),
        "{CHROMIUM} is missing: the HTML report test needs Debian's chromium (apt-get install -y chromium)"
    );
    let profile = tempfile::tempdir_in(dir).unwrap();
    let out = Command::new(CHROMIUM)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .output()
        .expect("run chromium");
    assert!(out.status.success(), "chromium failed: {}", String::from_utf8_lossy(&out.stderr));
    out
}

fn check_in_chromium(html: &Path, dir: &Path, topics: usize, lines: usize) {
    let url = format!("file://{}", html.display());
    // The DOM as Chromium parsed it: one chart per topic survived parsing.
    let dom = chromium(dir, &["--dump-dom".into(), url.clone()]);
    let dom_text = String::from_utf8_lossy(&dom.stdout);
    assert_eq!(dom_text.matches("<svg class=\"chart\"").count(), topics, "{dom_text}");
    assert_eq!(dom_text.matches("<polyline").count(), lines, "one line per tier");
    let log = String::from_utf8_lossy(&dom.stderr);
    for bad in ["Uncaught", "Failed to load", "ERR_FILE_NOT_FOUND", "Refused to"] {
        assert!(!log.contains(bad), "chromium reported {bad:?}: {log}");
    }
    let shot = dir.join("report.png");
    chromium(dir, &[format!("--screenshot={}", shot.display()), "--window-size=1000,1400".into(), url]);
    let size = std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0);
    assert!(size > 8 * 1024, "screenshot is only {size} bytes");
    let png = std::fs::read(&shot).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
}

/// Data deleted by retention before anyone read it: the brokers counted it when it
/// arrived, so the broker tier is complete, and the consumer (which read what is left)
/// is short by exactly the deleted records, in exactly their topic and window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deleting_a_range_shows_as_consumer_loss_in_that_window_only() {
    let window = Duration::from_millis(fjord_audit::DEFAULT_WINDOW_MS as u64);
    let broker = audited_broker(1, window, |config| {
        config.retention_check_interval = Duration::from_millis(50);
        config.set("log.segment.delete.delay.ms", "0").unwrap();
        // The topic's 1 KiB segments are below the default floor of segment.bytes.
        config.set("log.min.segment.bytes", "1024").unwrap();
    })
    .await;
    let client = ClientConfig::new(&broker.addr);
    let admin = Admin::connect(client.clone()).await.unwrap();
    let mut expiring = NewTopic::new("expiring", 1);
    // One ~700-byte batch per 1 KiB segment, so every old batch sits in a segment of its own.
    expiring.configs.insert("segment.bytes".into(), "1024".into());
    expiring.configs.insert("retention.ms".into(), "3600000".into());
    admin.create_topics(&[expiring, NewTopic::new("kept", 1)]).await.unwrap();

    let tier = Arc::new(AuditCounter::new("producer", "app-1", "online"));
    let producer =
        Producer::connect(ProducerConfig { client: client.clone(), audit: Some(tier.clone()), ..ProducerConfig::default() })
            .await
            .unwrap();
    let old = now_ms() - 3 * 3_600_000;
    let send = |topic: &'static str, created: i64| {
        let record = ProducerRecord::new(topic, Bytes::from("x".repeat(600)))
            .timestamp(created)
            .header(fjord_audit::CREATED_HEADER, Some(Bytes::from(created.to_string())));
        let producer = &producer;
        async move { producer.send(record).await.unwrap().await.unwrap() }
    };
    for _ in 0..6 {
        send("expiring", old).await;
        send("kept", old).await;
    }
    for _ in 0..3 {
        send("expiring", now_ms()).await;
        send("kept", now_ms()).await;
    }
    tier.publish(&producer).await.unwrap();
    // Retention removes the six old segments (three hours old, retention one hour).
    let deadline = Instant::now() + Duration::from_secs(15);
    while admin.list_offsets(&[("expiring".into(), 0, fjord_client::OffsetSpec::Earliest)]).await.unwrap()[0] < 6 {
        assert!(Instant::now() < deadline, "retention never deleted the old segments");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Only now does the consumer read: "expiring" has its 3 recent records left.
    let consumer_tier = Arc::new(AuditCounter::new("consumer", "reader-1", "online"));
    read_all(&client, "expiring", 1, 3, Some(consumer_tier.clone())).await;
    read_all(&client, "kept", 1, 9, Some(consumer_tier.clone())).await;
    consumer_tier.publish(&producer).await.unwrap();

    let cfg = ReportConfig::new(client.clone());
    let report = report_when(&cfg, "the broker tier never reached what was sent", |r| {
        ["expiring", "kept"].iter().all(|t| tier_total(r, t, "broker") == 9)
    })
    .await;
    let text = render(&report, Format::Text).unwrap();
    let old_window = window_start(old, fjord_audit::DEFAULT_WINDOW_MS);
    let bad: Vec<_> = report.windows.iter().filter(|w| w.verdict != Verdict::Complete).collect();
    assert_eq!(bad.len(), 1, "{text}");
    assert_eq!((bad[0].topic.as_str(), bad[0].window_start, bad[0].verdict), ("expiring", old_window, Verdict::Loss), "{text}");
    assert_eq!(bad[0].problems, ["consumer"], "{text}");
    assert_eq!(
        (bad[0].produced, bad[0].counts["broker"], bad[0].differences["broker"], bad[0].differences["consumer"]),
        (6, 6, 0, -6),
        "{text}"
    );
    let old_windows: Vec<_> =
        report.windows.iter().filter(|w| w.window_start == old_window).map(|w| (w.topic.as_str(), w.produced)).collect();
    assert_eq!(old_windows, [("expiring", 6), ("kept", 6)], "{text}");
    let json: serde_json::Value = serde_json::from_str(&render(&report, Format::Json).unwrap()).unwrap();
    assert_eq!(json["windows"].as_array().unwrap().iter().filter(|w| w["verdict"] == "loss").count(), 1);
    assert!(text.contains("loss (consumer)"), "{text}");
    println!("{text}");

    // --since an hour ago: only the recent windows.
    let recent =
        collect(&ReportConfig { since_ms: Some(now_ms() - 3_600_000), ..ReportConfig::new(client.clone()) }).await.unwrap();
    assert!(
        recent.all_complete() && recent.windows.iter().all(|w| w.window_start > old_window),
        "{}",
        render(&recent, Format::Text).unwrap()
    );
    assert_eq!(recent.windows.iter().map(|w| w.produced).sum::<u64>(), 6);
}

/// A send that fails is counted by neither the producer's hook nor the broker: of three
/// records to a topic taking at most 1 KiB per batch, the 2 KiB one fails (the producer
/// splits a refused multi-record batch and retries each record alone) and the other two
/// are counted at both tiers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_send_is_not_counted() {
    let broker = audited_broker(1, WINDOW, |_| {}).await;
    let client = ClientConfig::new(&broker.addr);
    let admin = Admin::connect(client.clone()).await.unwrap();
    let mut limited = NewTopic::new("limited", 1);
    limited.configs.insert("max.message.bytes".into(), "1024".into());
    admin.create_topics(&[limited]).await.unwrap();

    let tier = Arc::new(AuditCounter::new("producer", "app-1", "online").with_window(WINDOW).unwrap());
    let producer =
        Producer::connect(ProducerConfig { client: client.clone(), audit: Some(tier.clone()), ..ProducerConfig::default() })
            .await
            .unwrap();
    // Sent without waiting in between, so they share a batch (linger.ms).
    let mut deliveries = Vec::new();
    for size in [10, 2048, 10] {
        deliveries.push(producer.send(ProducerRecord::new("limited", Bytes::from("y".repeat(size)))).await.unwrap());
    }
    let results: Vec<bool> = futures_join(deliveries).await;
    assert_eq!(results, [true, false, true]);
    assert_eq!(tier.unpublished().values().sum::<u64>(), 2, "the failed record was counted");
    tier.publish(&producer).await.unwrap();

    let report = report_when(&report_config(&client), "the broker tier never counted the two records", |r| {
        tier_total(r, "limited", "broker") == 2
    })
    .await;
    assert_eq!(tier_total(&report, "limited", "producer"), 2);
    assert!(report.all_complete(), "{}", render(&report, Format::Text).unwrap());
}

/// Awaits every delivery in order: whether each succeeded.
async fn futures_join(deliveries: Vec<fjord_client::DeliveryFuture>) -> Vec<bool> {
    let mut out = Vec::new();
    for d in deliveries {
        out.push(d.await.is_ok());
    }
    out
}

/// Transactions: 20 records committed and 10 aborted by a transactional producer with the
/// producer tier. The producer tier counts the 20 only (its hook gets a transaction's
/// records at commit); so does the broker tier (it holds a transaction's appends until
/// the marker); a read_committed consumer's tier, reported as
/// `consumer (read_committed)`, counts the 20 and agrees with both; a read_uncommitted
/// consumer of the same data counts all 30, under `consumer`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_committed_consumer_tier_agrees_with_a_transactional_producer_and_skips_aborted_records() {
    let broker = audited_broker(2, WINDOW, |config| {
        config.set("transaction.state.log.num.partitions", "1").unwrap();
    })
    .await;
    let broker_addr = broker.listener("PLAINTEXT");
    let client = ClientConfig::new(&broker_addr.to_string());
    Admin::connect(client.clone()).await.unwrap().create_topics(&[NewTopic::new("orders", 2)]).await.unwrap();

    let producer_tier = Arc::new(AuditCounter::new("producer", "app-1", "online").with_window(WINDOW).unwrap());
    let producer = Producer::connect(ProducerConfig {
        client: client.clone(),
        audit: Some(producer_tier.clone()),
        transactional_id: Some("audited".into()),
        ..ProducerConfig::default()
    })
    .await
    .unwrap();
    // Every record in one window, long past (so the verdict is final).
    let created = window_start(now_ms() - 10_000, WINDOW.as_millis() as i64);
    for (round, commit) in [(0, true), (1, false), (2, true)] {
        producer.begin_transaction().unwrap();
        for i in 0..10 {
            let record = ProducerRecord::new("orders", format!("{round}:{i}"))
                .key(format!("k{i}"))
                .header(fjord_audit::CREATED_HEADER, Some(Bytes::from(created.to_string())));
            drop(producer.send(record).await.unwrap());
        }
        match commit {
            true => producer.commit_transaction().await.unwrap(),
            false => producer.abort_transaction().await.unwrap(),
        }
        let counted: u64 = producer_tier.unpublished().values().sum();
        assert_eq!(counted, 10 * [1, 1, 2][round], "round {round}: the producer tier counts committed transactions only");
    }

    let consume = |isolation: IsolationLevel, counter: Arc<AuditCounter>| {
        let client = client.clone();
        async move {
            let mut consumer = Consumer::connect(ConsumerConfig {
                client,
                auto_offset_reset: OffsetReset::Earliest,
                isolation_level: isolation,
                fetch_max_wait: Duration::from_millis(50),
                audit: Some(counter),
                ..ConsumerConfig::default()
            })
            .await
            .unwrap();
            consumer.assign_topic("orders").await.unwrap();
            // Up to the end of both partitions (the positions pass markers and aborted batches).
            let ends = Admin::connect(ClientConfig::new(&broker_addr.to_string()))
                .await
                .unwrap()
                .list_offsets(&[("orders".into(), 0, OffsetSpec::Latest), ("orders".into(), 1, OffsetSpec::Latest)])
                .await
                .unwrap();
            let mut values = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                for r in consumer.poll(Duration::from_millis(100)).await.unwrap() {
                    values.push(String::from_utf8(r.value.unwrap().to_vec()).unwrap());
                }
                let mut done = true;
                for (p, end) in ends.iter().enumerate() {
                    done &= consumer.position(&TopicPartition::new("orders", p as i32)).await.unwrap() >= *end;
                }
                if done {
                    return values;
                }
                assert!(Instant::now() < deadline, "{isolation:?} read {} records, not to the log ends {ends:?}", values.len());
            }
        }
    };
    let committed_tier = Arc::new(AuditCounter::new("consumer", "reader-rc", "online").with_window(WINDOW).unwrap());
    let uncommitted_tier = Arc::new(AuditCounter::new("consumer", "reader-ru", "online").with_window(WINDOW).unwrap());
    let committed = consume(IsolationLevel::ReadCommitted, committed_tier.clone()).await;
    assert_eq!(committed.len(), 20);
    assert!(committed.iter().all(|v| !v.starts_with("1:")), "an aborted record was returned: {committed:?}");
    assert_eq!(consume(IsolationLevel::ReadUncommitted, uncommitted_tier.clone()).await.len(), 30);

    let publisher = Producer::connect(ProducerConfig { client: client.clone(), ..ProducerConfig::default() }).await.unwrap();
    fjord_audit::ensure_audit_topic(&client).await.unwrap();
    for tier in [&producer_tier, &committed_tier, &uncommitted_tier] {
        tier.publish(&publisher).await.unwrap();
    }
    let cfg = ReportConfig { topics: Some(regex::Regex::new("^orders$").unwrap()), ..report_config(&client) };
    // The broker tier publishes every 200 ms; what it counted is all in once it shows 20.
    let report = report_when(&cfg, "all four tiers in the report", |r| {
        r.windows.first().is_some_and(|w| w.counts.len() == 4 && w.counts["broker"] >= 20)
    })
    .await;
    assert_eq!(report.topics[0].tiers, ["producer", "broker", "consumer", "consumer (read_committed)"]);
    let w = &report.windows[0];
    let counts = (w.produced, w.counts["broker"], w.counts["consumer"], w.counts["consumer (read_committed)"]);
    assert_eq!(counts, (20, 20, 30, 20), "{}", fjord_audit::render::text(&report));
    assert_eq!(w.differences["broker"], 0, "the broker tier counts no aborted record");
    assert_eq!(w.differences["consumer (read_committed)"], 0, "{}", fjord_audit::render::text(&report));
    assert_eq!(w.problems, ["consumer"], "only the read_uncommitted consumer differs (+10: the aborted records)");
}
