//! `fjord bench produce|consume|e2e`: the paper's throughput experiment.
//!
//! - produce: `--messages` records of `--size` bytes, `--batch` records per batch (one
//!   batch per partition per request, so `--batch 1` sends one message per request, as the
//!   paper's unbatched run did); latency is send → acknowledgement.
//! - consume: reads `--messages` records from the beginning; latency is the wait of each
//!   poll (one fetch response's worth of records).
//! - e2e: produces and consumes at once; latency is send → consumed, per record.
//!
//! MB/s counts value bytes, 10^6 bytes per MB.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use clap::{Args, ValueEnum};
use fjord_client::{
    Acks, Compression, Consumer, ConsumerConfig, DeliveryFuture, OffsetReset, Producer, ProducerConfig, ProducerRecord, SeekTo,
};
use indicatif::{ProgressBar, ProgressStyle};

use super::{parse_acks, parse_compression, ConnectArgs};

/// Runs shorter than this get no progress bar.
const PROGRESS_MIN_MESSAGES: u64 = 200_000;
/// A consume bench gives up when no record arrives for this long.
const IDLE_LIMIT: Duration = Duration::from_secs(10);

#[derive(Args, Debug)]
pub(crate) struct BenchArgs {
    /// What to measure.
    #[arg(value_enum)]
    mode: Mode,
    #[command(flatten)]
    connect: ConnectArgs,
    /// Topic (auto-created with the broker's defaults when missing).
    #[arg(long, default_value = "bench")]
    topic: String,
    /// Number of messages.
    #[arg(long)]
    messages: u64,
    /// Value size in bytes.
    #[arg(long, default_value_t = 200)]
    size: usize,
    /// Messages per batch (per produce request and partition).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..))]
    batch: u64,
    /// acks: 0, 1 or all.
    #[arg(long, default_value = "1", value_parser = parse_acks)]
    acks: Acks,
    /// none, gzip, snappy, lz4 or zstd.
    #[arg(long, default_value = "none", value_parser = parse_compression)]
    compression: Compression,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Produce,
    Consume,
    E2e,
}

/// What a run measured.
struct Report {
    mode: Mode,
    messages: u64,
    bytes: u64,
    seconds: f64,
    /// Microseconds.
    latencies: Vec<u32>,
}

pub(crate) async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.messages == 0 {
        bail!("--messages must be at least 1");
    }
    let report = match args.mode {
        Mode::Produce => produce(&args, None).await?,
        Mode::Consume => consume(&args).await?,
        Mode::E2e => e2e(&args).await?,
    };
    report.print(args.json);
    Ok(())
}

fn progress(messages: u64) -> ProgressBar {
    if messages < PROGRESS_MIN_MESSAGES {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(messages);
    pb.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} msgs {per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb
}

fn producer_config(args: &BenchArgs) -> anyhow::Result<ProducerConfig> {
    // `--batch N` records fill a batch: N-1 records at their real encoded size plus room
    // for the producer's (upper-bound) estimate of the Nth, so the N+1th never fits.
    let mut probe = fjord_record::BatchBuilder::new(0);
    probe.append(0, None, Some(&vec![0u8; args.size]), &[]);
    let per_record = probe.size() - fjord_record::BATCH_OVERHEAD;
    let estimate = ProducerRecord { value: Some(Bytes::from(vec![0u8; args.size])), ..ProducerRecord::default() }.encoded_size();
    Ok(ProducerConfig {
        client: args.connect.client()?,
        acks: args.acks,
        compression: args.compression,
        batch_size: fjord_record::BATCH_OVERHEAD + per_record * (args.batch as usize - 1) + estimate,
        linger: Duration::ZERO,
        ..ProducerConfig::default()
    })
}

/// Produces `args.messages` records. With `stamp`, each value starts with the nanoseconds
/// since that instant (for end-to-end latency).
async fn produce(args: &BenchArgs, stamp: Option<Instant>) -> anyhow::Result<Report> {
    let producer = Producer::connect(producer_config(args)?).await?;
    producer.partition_count(&args.topic).await.with_context(|| format!("topic {}", args.topic))?;
    let payload: Bytes = (0..args.size).map(|i| (i * 31 % 251) as u8).collect::<Vec<u8>>().into();
    let pb = if stamp.is_some() { ProgressBar::hidden() } else { progress(args.messages) };
    let mut latencies = Vec::with_capacity(if stamp.is_some() { 0 } else { args.messages as usize });
    let mut pending: VecDeque<(Instant, DeliveryFuture)> = VecDeque::new();
    let started = Instant::now();
    for i in 0..args.messages {
        let value = match stamp {
            Some(epoch) if args.size >= 8 => {
                let mut v = payload.to_vec();
                v[..8].copy_from_slice(&(epoch.elapsed().as_nanos() as u64).to_be_bytes());
                Bytes::from(v)
            }
            _ => payload.clone(),
        };
        let record = ProducerRecord { topic: args.topic.clone(), value: Some(value), ..ProducerRecord::default() };
        let sent = Instant::now();
        let delivery = producer.send(record).await?;
        if stamp.is_none() {
            pending.push_back((sent, delivery));
            // One clock read for all the records found acknowledged in this pass (they
            // were, at the latest, by now): clock reads were ~10% of the sending thread.
            let mut acknowledged = None;
            while let Some(result) = pending.front().and_then(|(_, f)| f.try_result()) {
                result?;
                let (sent, _) = pending.pop_front().expect("front exists");
                let now = *acknowledged.get_or_insert_with(Instant::now);
                latencies.push(now.saturating_duration_since(sent).as_micros().min(u32::MAX as u128) as u32);
            }
        }
        if i % 65_536 == 65_535 {
            pb.inc(65_536);
        }
    }
    producer.flush().await;
    for (sent, f) in pending {
        f.await?;
        latencies.push(sent.elapsed().as_micros().min(u32::MAX as u128) as u32);
    }
    let seconds = started.elapsed().as_secs_f64();
    pb.finish_and_clear();
    producer.close().await;
    Ok(Report { mode: Mode::Produce, messages: args.messages, bytes: args.messages * args.size as u64, seconds, latencies })
}

async fn bench_consumer(args: &BenchArgs) -> anyhow::Result<Consumer> {
    let config = ConsumerConfig {
        client: args.connect.client()?,
        auto_offset_reset: OffsetReset::Earliest,
        fetch_max_wait: Duration::from_millis(100),
        ..ConsumerConfig::default()
    };
    let mut consumer = Consumer::connect(config).await?;
    consumer.assign_topic(&args.topic).await.with_context(|| format!("topic {}", args.topic))?;
    Ok(consumer)
}

async fn consume(args: &BenchArgs) -> anyhow::Result<Report> {
    let mut consumer = bench_consumer(args).await?;
    for tp in consumer.assignment() {
        consumer.seek(&tp, SeekTo::Beginning)?;
    }
    let pb = progress(args.messages);
    let (mut messages, mut bytes) = (0u64, 0u64);
    let mut latencies = Vec::new();
    let started = Instant::now();
    let mut last_record = Instant::now();
    while messages < args.messages {
        let polled = Instant::now();
        let records = consumer.poll(Duration::from_secs(1)).await?;
        if records.is_empty() {
            if last_record.elapsed() > IDLE_LIMIT {
                bail!("only {messages} of {} messages in topic {} (nothing new for {IDLE_LIMIT:?})", args.messages, args.topic);
            }
            continue;
        }
        last_record = Instant::now();
        latencies.push(polled.elapsed().as_micros().min(u32::MAX as u128) as u32);
        let take = records.len().min((args.messages - messages) as usize);
        bytes += records[..take].iter().map(|r| r.value.as_ref().map_or(0, |v| v.len()) as u64).sum::<u64>();
        messages += take as u64;
        pb.inc(take as u64);
    }
    let seconds = started.elapsed().as_secs_f64();
    pb.finish_and_clear();
    Ok(Report { mode: Mode::Consume, messages, bytes, seconds, latencies })
}

async fn e2e(args: &BenchArgs) -> anyhow::Result<Report> {
    if args.size < 8 {
        bail!("e2e needs --size of at least 8 (the send time travels in the value)");
    }
    // Learn where the log ends now, so only this run's records are measured.
    let mut consumer = bench_consumer(args).await?;
    for tp in consumer.assignment() {
        consumer.seek(&tp, SeekTo::End)?;
        consumer.position(&tp).await?;
    }
    let epoch = Instant::now();
    let pb = progress(args.messages);
    let started = Instant::now();
    let producing = {
        let args = BenchArgs { mode: Mode::Produce, connect: args.connect.clone(), topic: args.topic.clone(), ..*args };
        tokio::spawn(async move { produce(&args, Some(epoch)).await })
    };
    let (mut messages, mut bytes) = (0u64, 0u64);
    let mut latencies = Vec::with_capacity(args.messages as usize);
    let mut last_record = Instant::now();
    while messages < args.messages {
        let records = consumer.poll(Duration::from_secs(1)).await?;
        let now = epoch.elapsed().as_nanos() as u64;
        if records.is_empty() {
            if producing.is_finished() && last_record.elapsed() > IDLE_LIMIT {
                bail!("only {messages} of {} messages came back", args.messages);
            }
            continue;
        }
        last_record = Instant::now();
        for r in &records {
            let value = r.value.as_deref().unwrap_or_default();
            let Some(sent) = value.get(..8) else { continue };
            let sent = u64::from_be_bytes(sent.try_into().expect("8 bytes"));
            latencies.push((now.saturating_sub(sent) / 1000).min(u32::MAX as u64) as u32);
            bytes += value.len() as u64;
        }
        messages += records.len() as u64;
        pb.inc(records.len() as u64);
    }
    producing.await.context("producer task")??;
    let seconds = started.elapsed().as_secs_f64();
    pb.finish_and_clear();
    Ok(Report { mode: Mode::E2e, messages, bytes, seconds, latencies })
}

impl Report {
    fn percentile_ms(&self, sorted: &[u32], p: f64) -> f64 {
        if sorted.is_empty() {
            return 0.0;
        }
        let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
        sorted[i] as f64 / 1000.0
    }

    fn print(mut self, json: bool) {
        self.latencies.sort_unstable();
        let (p50, p99, p999) = (
            self.percentile_ms(&self.latencies, 0.50),
            self.percentile_ms(&self.latencies, 0.99),
            self.percentile_ms(&self.latencies, 0.999),
        );
        let msg_per_s = self.messages as f64 / self.seconds;
        let mb_per_s = self.bytes as f64 / self.seconds / 1e6;
        let mode = match self.mode {
            Mode::Produce => "produce",
            Mode::Consume => "consume",
            Mode::E2e => "e2e",
        };
        if json {
            let report = serde_json::json!({
                "mode": mode,
                "messages": self.messages,
                "bytes": self.bytes,
                "seconds": self.seconds,
                "msg_per_s": msg_per_s,
                "mb_per_s": mb_per_s,
                "p50_ms": p50,
                "p99_ms": p99,
                "p999_ms": p999,
            });
            println!("{report}");
        } else {
            println!(
                "{mode}: {} messages, {} bytes in {:.2} s: {:.0} msg/s, {:.1} MB/s; latency p50 {p50:.2} ms, p99 {p99:.2} ms, p99.9 {p999:.2} ms",
                self.messages, self.bytes, self.seconds, msg_per_s, mb_per_s
            );
        }
    }
}
