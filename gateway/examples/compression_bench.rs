//! gzip vs plain NDJSON, and a key vs none, through one gateway, side by side in one run:
//! starts a broker and a gateway in this process on loopback, then posts the same
//! clickstream-like events (about 200 bytes of JSON each, in batches) in rounds that
//! alternate plain, gzip-compressed (`Content-Encoding: gzip`, compressed by the client
//! before timing starts) and plain with an `Idempotency-Key` per request (the key's cost:
//! a claim and an answer appended to the key topic per request), and prints events/s and
//! bytes on the wire (request bodies) for each round, then the median of each kind. Each
//! round also prints the process's CPU time per event (`cpu_us_per_event`): the broker,
//! the gateway and the clients run in this one process, so it tells a kind that costs CPU
//! from one that only waits longer. `FJORD_BENCH_KINDS=plain+key` runs only the named
//! kinds (comma-separated), e.g. to profile one alone under `perf record`.
//! `FJORD_BENCH_BROKER=host:port` uses a running broker instead of one in this process
//! (give it 3 partitions a topic, as the in-process one has). `FJORD_BENCH_LINGER_MS=N`
//! sets the gateway's linger (default: the gateway's, 0): keyed by user, a request's events
//! fill no batch, so each request waits the whole linger (5 ms gave 243k-258k plain
//! events/s where 0 gave 746k-861k).
//!
//! ```text
//! cargo run --release -p fjord-gateway --example compression_bench -- 200000 500 4 3
//! ```
//! (arguments: events per round, events per request, concurrent clients, rounds of each
//! kind)

use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// A page view as a web collector would see it: repeated field names, URLs, a user agent.
fn event(seq: usize) -> String {
    format!(
        "{{\"seq\":{seq},\"user\":\"u{:05}\",\"event\":\"page_view\",\"page\":\"/products/{}\",\"ref\":\"https://www.example.com/search?q=item{}\",\"ua\":\"Mozilla/5.0 (X11; Linux x86_64) Chrome/120.0\",\"ts\":{}}}\n",
        seq % 10_000,
        seq % 500,
        seq % 97,
        1_700_000_000_000u64 + seq as u64 * 13
    )
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).expect("in-memory write");
    e.finish().expect("in-memory write")
}

/// CPU time this process has used (user + system), from /proc/self/stat; `None` off Linux.
/// Per round it shows whether a kind costs CPU or only waiting: the broker, the gateway
/// and the clients all run in this process.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are the 14th and 15th.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // USER_HZ is 100 on every Linux this runs on.
    Some(ticks / 100.0)
}

async fn round(
    url: &str,
    bodies: Arc<Vec<Vec<u8>>>,
    gzip: bool,
    key_prefix: Option<&str>,
    concurrency: usize,
    per_request: usize,
) -> anyhow::Result<(f64, usize)> {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..concurrency {
        let (url, bodies) = (url.to_string(), bodies.clone());
        let key_prefix = key_prefix.map(str::to_string);
        tasks.push(tokio::spawn(async move {
            let http = reqwest::Client::new();
            for (i, body) in bodies.iter().enumerate().skip(w).step_by(concurrency) {
                let mut r = http.post(&url).body(body.clone());
                if gzip {
                    r = r.header("content-encoding", "gzip");
                }
                if let Some(prefix) = &key_prefix {
                    r = r.header("idempotency-key", format!("{prefix}-{i}"));
                }
                let resp = r.send().await?;
                if !resp.status().is_success() {
                    bail!("HTTP {}: {}", resp.status(), resp.text().await?);
                }
                resp.bytes().await?;
            }
            Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let secs = start.elapsed().as_secs_f64();
    let events = bodies.len() * per_request;
    Ok((events as f64 / secs, bodies.iter().map(Vec::len).sum()))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().context("numeric arguments")).collect::<Result<_, _>>()?;
    let arg = |i: usize, default: usize| args.get(i).copied().unwrap_or(default);
    let (events, per_request, concurrency, repeats) = (arg(0, 200_000), arg(1, 500), arg(2, 4), arg(3, 3).max(1));
    // Profiling one kind alone: FJORD_BENCH_KINDS=plain+key (comma-separated names).
    let only = std::env::var("FJORD_BENCH_KINDS").ok();
    let wanted = |name: &str| only.as_deref().is_none_or(|o| o.split(',').any(|k| k == name));
    let dir = tempfile::tempdir()?;
    let shutdown = CancellationToken::new();
    // FJORD_BENCH_BROKER=host:port uses a broker of its own process (as deployed, e.g. a
    // release `fjord broker --config FILE` with `"num.partitions" = 3` in FILE) instead of
    // one in this process, so the broker's work does not share this process's runtime with
    // the gateway and clients.
    let broker = match std::env::var("FJORD_BENCH_BROKER") {
        Ok(external) => external,
        Err(_) => {
            let broker_listener = TcpListener::bind("127.0.0.1:0").await?;
            let broker = broker_listener.local_addr()?;
            let config = fjord_broker::BrokerConfig {
                log_dir: dir.path().join("broker"),
                listeners: broker.into(),
                num_partitions: 3,
                ..fjord_broker::BrokerConfig::default()
            };
            tokio::spawn(fjord_broker::run(config, broker_listener, shutdown.clone()));
            broker.to_string()
        }
    };
    let http = TcpListener::bind("127.0.0.1:0").await?;
    let grpc = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/v1/events/bench?key=user", http.local_addr()?);
    let mut gateway = fjord_gateway::GatewayConfig::new(broker);
    if let Ok(ms) = std::env::var("FJORD_BENCH_LINGER_MS") {
        gateway.linger = std::time::Duration::from_millis(ms.parse().context("FJORD_BENCH_LINGER_MS")?);
    }
    tokio::spawn(fjord_gateway::run(gateway, http, grpc, shutdown.clone()));

    let run =
        format!("{}-{}", std::process::id(), std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis());
    let plain: Vec<Vec<u8>> = (0..events / per_request)
        .map(|r| (0..per_request).flat_map(|e| event(r * per_request + e).into_bytes()).collect())
        .collect();
    let gzipped: Vec<Vec<u8>> = plain.iter().map(|b| gzip(b)).collect();
    let (plain, gzipped) = (Arc::new(plain), Arc::new(gzipped));
    // Warm-up: topic creation and connections are not part of either figure.
    round(&url, Arc::new(plain[..1].to_vec()), false, None, 1, per_request).await?;
    round(&url, Arc::new(plain[..1].to_vec()), false, Some("warm"), 1, per_request).await?;
    // Each kind once per repeat, in turn, so drift in the machine's load hits all alike.
    let kinds = [("plain", &plain, false), ("gzip", &gzipped, true), ("plain+key", &plain, false)];
    let mut results: Vec<(&str, Vec<f64>, usize)> = kinds.iter().map(|(name, _, _)| (*name, Vec::new(), 0)).collect();
    for repeat in 0..repeats {
        for (i, (name, bodies, gz)) in kinds.iter().enumerate() {
            if !wanted(name) {
                continue;
            }
            // Keys unique to this run: an external broker keeps the key topic between runs,
            // and a repeated key would be answered from it without writing.
            let key = (*name == "plain+key").then(|| format!("{run}-r{repeat}"));
            let cpu_before = cpu_seconds();
            let (eps, wire) = round(&url, (*bodies).clone(), *gz, key.as_deref(), concurrency, per_request).await?;
            let cpu_us_per_event = match (cpu_before, cpu_seconds()) {
                (Some(b), Some(a)) => format!("{:.2}", (a - b) * 1e6 / events as f64),
                _ => "null".into(),
            };
            println!(
                "{{\"body\":\"{name}\",\"round\":{repeat},\"events\":{events},\"batch\":{per_request},\"concurrency\":{concurrency},\"events_per_s\":{eps:.0},\"cpu_us_per_event\":{cpu_us_per_event},\"wire_bytes\":{wire},\"bytes_per_event\":{:.1}}}",
                wire as f64 / events as f64
            );
            results[i].1.push(eps);
            results[i].2 = wire;
        }
    }
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    // Without plain rounds (FJORD_BENCH_KINDS) there is nothing to compare with: null.
    let plain_median = (!results[0].1.is_empty()).then(|| median(&results[0].1));
    for (name, eps, wire) in results.iter().filter(|(_, eps, _)| !eps.is_empty()) {
        let m = median(eps);
        let vs_plain = plain_median.map_or_else(|| "null".to_string(), |p| format!("{:.3}", m / p));
        println!(
            "{{\"median\":\"{name}\",\"rounds\":{},\"events_per_s\":{m:.0},\"vs_plain\":{vs_plain},\"wire_bytes\":{wire},\"bytes_per_event\":{:.1}}}",
            eps.len(),
            *wire as f64 / events as f64
        );
    }
    shutdown.cancel();
    Ok(())
}
