//! Server time of the console's list pages on a larger cluster: an in-process broker with
//! 1,000 topics (2 partitions each, a few records in some) and 100 consumer groups with
//! committed offsets, and the console's router on loopback. Prints p50 / p99 / max of
//! `/ui/topics` and `/ui/groups` over `ROUNDS` requests each (the target: p99 ≤
//! 200 ms). Run with `cargo run --release -p fjord-console --example bench [ROUNDS]`.
//!
//! Release build on the shared 2-core machine (load 2-7), median of 3 runs of 50 requests:
//! `/ui/topics` p50 30 ms, p99 69 ms (427 KiB page); `/ui/groups` p50 8 ms, p99 23 ms, with
//! the console's rate sampler running (the same as without it: 80 ms and 28 ms p99).
//! With each topic's size (DescribeLogDirs from every broker, concurrent with the configs)
//! and messages/s, 3 runs alternated with the build before them (load 2.7-3.2): `/ui/topics`
//! p50 28 ms, p99 48 ms (528 KiB page) against p50 29 ms, p99 47 ms before.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use fjord_client::{Admin, ClientConfig, GroupAdmin, NewTopic, Producer, ProducerConfig, ProducerRecord, TopicPartition};
use fjord_console::{Console, ConsoleConfig};
use tokio_util::sync::CancellationToken;

const TOPICS: usize = 1000;
const GROUPS: usize = 100;
// Two partitions a topic: 2,000 replicas stay under a default broker's max.partitions.per.broker.
const PARTITIONS: i32 = 2;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let rounds: usize = std::env::args().nth(1).map(|a| a.parse()).transpose()?.unwrap_or(50);
    let dir = tempfile::tempdir()?;
    let shutdown = CancellationToken::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let broker = listener.local_addr()?.to_string();
    let config = fjord_broker::BrokerConfig {
        log_dir: dir.path().join("broker"),
        listeners: listener.local_addr()?.into(),
        ..fjord_broker::BrokerConfig::default()
    };
    tokio::spawn(fjord_broker::run(config, listener, shutdown.clone()));

    let client = ClientConfig::new(&broker);
    let admin = Admin::connect(client.clone()).await.context("admin")?;
    let names: Vec<String> = (0..TOPICS).map(|i| format!("bench-topic-{i:04}")).collect();
    let started = Instant::now();
    for chunk in names.chunks(50) {
        let topics: Vec<NewTopic> = chunk.iter().map(|n| NewTopic::new(n.clone(), PARTITIONS)).collect();
        if let Err(e) = admin.create_topics(&topics).await {
            anyhow::bail!("create topics: {e:?}");
        }
    }
    // Records in the topics the groups read, so their lag is not zero.
    let producer = Producer::connect(ProducerConfig { client: client.clone(), ..ProducerConfig::default() }).await?;
    let mut acks = Vec::new();
    for (i, name) in names.iter().take(GROUPS * 2).enumerate() {
        for n in 0..10 {
            acks.extend(
                producer
                    .send_many([ProducerRecord {
                        topic: name.clone(),
                        partition: Some((i as i32 + n) % PARTITIONS),
                        key: None,
                        value: Some(format!("record {n}").into_bytes().into()),
                        headers: Vec::new(),
                        timestamp: None,
                    }])
                    .await?,
            );
        }
    }
    for a in acks {
        a.await?;
    }
    let groups = GroupAdmin::connect(client.clone()).await?;
    for g in 0..GROUPS {
        // Each group has committed offsets on the partitions of two topics.
        let offsets: Vec<(TopicPartition, i64)> = (0..2)
            .flat_map(|t| (0..PARTITIONS).map(move |p| (TopicPartition::new(format!("bench-topic-{:04}", g * 2 + t), p), 1)))
            .collect();
        groups.reset_offsets(&format!("bench-group-{g:03}"), &offsets).await.context("commit offsets")?;
    }
    println!("setup: {TOPICS} topics x {PARTITIONS} partitions, {GROUPS} groups, in {:.1} s", started.elapsed().as_secs_f64());

    let console = Console::new(ConsoleConfig::new(&broker), fjord_auth::http::HttpSecurity::open());
    let app = fjord_console::router(console);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    let http = reqwest::Client::new();
    for (path, must_contain) in [("/ui/topics", "bench-topic-0999"), ("/ui/groups", "bench-group-099")] {
        let mut times = Vec::with_capacity(rounds);
        // One warm-up request (connections, metadata).
        let body = http.get(format!("{url}{path}")).send().await?.text().await?;
        anyhow::ensure!(body.contains(must_contain), "{path} does not list {must_contain}");
        for _ in 0..rounds {
            let t = Instant::now();
            let r = http.get(format!("{url}{path}")).send().await?;
            anyhow::ensure!(r.status() == 200, "{path}: {}", r.status());
            let bytes = r.bytes().await?;
            times.push(t.elapsed());
            anyhow::ensure!(!bytes.is_empty());
        }
        times.sort();
        let pct = |q: f64| times[((times.len() as f64 * q).ceil() as usize).clamp(1, times.len()) - 1];
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        println!(
            "{path}: {rounds} requests, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms, page {} KiB",
            ms(pct(0.50)),
            ms(pct(0.99)),
            ms(*times.last().unwrap()),
            body.len() / 1024
        );
    }
    shutdown.cancel();
    Ok(())
}
