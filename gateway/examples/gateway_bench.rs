//! Load generator for the gateway: publishes fixed-size events through HTTP bulk NDJSON or
//! gRPC `PublishStream` from several concurrent clients and prints one JSON line like
//! `fjord bench produce --json` (messages, bytes, seconds, msg_per_s, mb_per_s, p50_ms,
//! p99_ms, p999_ms), latencies being per request (NDJSON) or per batch (gRPC).
//!
//! ```text
//! cargo run --release -p fjord-gateway --example gateway_bench -- \
//!     --mode ndjson --http http://127.0.0.1:8082 --topic bench --events 1000000 \
//!     --size 200 --batch 500 --concurrency 8
//! cargo run --release -p fjord-gateway --example gateway_bench -- \
//!     --mode grpc --grpc http://127.0.0.1:50051 --topic bench --events 1000000 \
//!     --size 200 --batch 500 --concurrency 4 --window 8
//! ```

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use fjord_proto::v1::publisher_client::PublisherClient;
use fjord_proto::v1::{Event, PublishRequest};
use tokio::sync::Semaphore;

struct Args {
    mode: String,
    http: String,
    grpc: String,
    topic: String,
    events: usize,
    size: usize,
    batch: usize,
    concurrency: usize,
    window: usize,
}

fn parse() -> anyhow::Result<Args> {
    let mut map: HashMap<String, String> = HashMap::new();
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let Some(name) = flag.strip_prefix("--") else { bail!("unexpected argument {flag:?}") };
        map.insert(name.to_string(), it.next().with_context(|| format!("--{name} needs a value"))?);
    }
    let get = |k: &str, d: &str| map.get(k).cloned().unwrap_or_else(|| d.to_string());
    let num = |k: &str, d: usize| -> anyhow::Result<usize> { get(k, &d.to_string()).parse().with_context(|| format!("--{k}")) };
    Ok(Args {
        mode: get("mode", "ndjson"),
        http: get("http", "http://127.0.0.1:8082"),
        grpc: get("grpc", "http://127.0.0.1:50051"),
        topic: get("topic", "gateway-bench"),
        events: num("events", 200_000)?,
        size: num("size", 200)?,
        batch: num("batch", 500)?,
        concurrency: num("concurrency", 8)?,
        window: num("window", 8)?,
    })
}

/// One NDJSON line of exactly `size` bytes (without the newline).
fn line(size: usize, seq: usize) -> String {
    let head = format!("{{\"seq\":{seq},\"pad\":\"");
    let pad = size.saturating_sub(head.len() + 2);
    format!("{head}{}\"}}", "x".repeat(pad))
}

async fn ndjson(a: Arc<Args>, worker: usize, requests: usize) -> anyhow::Result<Vec<Duration>> {
    let http = reqwest::Client::new();
    let url = format!("{}/v1/events/{}", a.http, a.topic);
    let mut latencies = Vec::with_capacity(requests);
    for r in 0..requests {
        let mut body = String::with_capacity(a.batch * (a.size + 1));
        for e in 0..a.batch {
            body.push_str(&line(a.size, (worker * requests + r) * a.batch + e));
            body.push('\n');
        }
        let start = Instant::now();
        let resp = http.post(&url).body(body).send().await?;
        if !resp.status().is_success() {
            bail!("HTTP {}: {}", resp.status(), resp.text().await?);
        }
        resp.bytes().await?;
        latencies.push(start.elapsed());
    }
    Ok(latencies)
}

async fn grpc(a: Arc<Args>, worker: usize, batches: usize) -> anyhow::Result<Vec<Duration>> {
    let mut client = PublisherClient::connect(a.grpc.clone()).await?;
    let window = Arc::new(Semaphore::new(a.window));
    let sent: Arc<std::sync::Mutex<HashMap<u64, Instant>>> = Arc::default();
    let (tx, rx) = tokio::sync::mpsc::channel::<PublishRequest>(a.window);
    let producer = {
        let (a, window, sent) = (a.clone(), window.clone(), sent.clone());
        tokio::spawn(async move {
            for b in 0..batches {
                window.acquire().await.expect("open").forget();
                let events = (0..a.batch)
                    .map(|e| Event {
                        value: Some(line(a.size, (worker * batches + b) * a.batch + e).into()),
                        ..Default::default()
                    })
                    .collect();
                sent.lock().expect("lock").insert(b as u64, Instant::now());
                if tx
                    .send(PublishRequest { topic: a.topic.clone(), events, batch_id: b as u64, ..Default::default() })
                    .await
                    .is_err()
                {
                    return;
                }
            }
        })
    };
    let mut answers = client.publish_stream(tokio_stream::wrappers::ReceiverStream::new(rx)).await?.into_inner();
    let mut latencies = Vec::with_capacity(batches);
    while let Some(answer) = answers.message().await? {
        if let Some(e) = answer.error {
            bail!("batch {} refused: {}", answer.batch_id, e.message);
        }
        let start = sent.lock().expect("lock").remove(&answer.batch_id).context("answer to an unknown batch")?;
        latencies.push(start.elapsed());
        window.add_permits(1);
        if latencies.len() == batches {
            break;
        }
    }
    producer.await?;
    Ok(latencies)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Arc::new(parse()?);
    let per_worker = a.events / a.batch / a.concurrency;
    if per_worker == 0 {
        bail!("--events must be at least --batch x --concurrency");
    }
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..a.concurrency {
        let a = a.clone();
        tasks.push(tokio::spawn(async move {
            match a.mode.as_str() {
                "ndjson" => ndjson(a, w, per_worker).await,
                "grpc" => grpc(a, w, per_worker).await,
                other => bail!("--mode must be ndjson or grpc, not {other:?}"),
            }
        }));
    }
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await??);
    }
    let seconds = start.elapsed().as_secs_f64();
    latencies.sort();
    let q = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)].as_secs_f64() * 1000.0;
    let messages = per_worker * a.concurrency * a.batch;
    let bytes = messages * a.size;
    println!(
        "{}",
        serde_json::json!({
            "mode": a.mode, "messages": messages, "bytes": bytes, "seconds": seconds,
            "msg_per_s": messages as f64 / seconds, "mb_per_s": bytes as f64 / seconds / 1e6,
            "batch": a.batch, "concurrency": a.concurrency,
            "p50_ms": q(0.5), "p99_ms": q(0.99), "p999_ms": q(0.999),
        })
    );
    Ok(())
}
