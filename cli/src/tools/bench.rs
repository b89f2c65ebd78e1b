//! `fjord bench produce|consume|e2e`: the paper's throughput experiment; `fjord bench
//! connect`: new connections per second, without and with SASL (see `connect`).
//!
//! - produce: `--messages` records of `--size` bytes, `--batch` records per batch (one
//!   batch per partition per request, so `--batch 1` sends one message per request, as the
//!   paper's unbatched run did); latency is send → acknowledgement. With
//!   `--transaction-records N` the records go out in transactions of N, each committed
//!   before the next begins (one producer's transactions are sequential), and latency is
//!   send → commit.
//! - consume: reads `--messages` records from the beginning; latency is the wait of each
//!   poll (one fetch response's worth of records).
//! - e2e: produces and consumes at once; latency is send → consumed, per record.
//!
//! With `--rate N` (produce, e2e) the producer runs open loop: message `i` is sent at
//! `start + i / N` whether or not the earlier ones were acknowledged, and its latency
//! counts from that scheduled time, so a stall is charged to every message it held up
//! (see `schedule`). Without it the producer sends as fast as it can (closed loop), which
//! gives the peak rate but latencies that hide queueing. Latencies go into an HDR
//! histogram: p50, p99, p99.9 and the maximum.
//!
//! With `--broker-pid` (Linux) the report adds the brokers' CPU time per message, read
//! from `/proc` before and after the run (see `cpu`), and this process's own.
//!
//! MB/s counts value bytes, 10^6 bytes per MB.

mod connect;
mod cpu;
mod schedule;

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use clap::{Args, ValueEnum};
use fjord_client::{
    Acks, Compression, Consumer, ConsumerConfig, DeliveryFuture, OffsetReset, Producer, ProducerConfig, ProducerRecord, SeekTo,
};
use futures::stream::{FuturesUnordered, StreamExt};
use indicatif::{ProgressBar, ProgressStyle};
use tokio::sync::mpsc;

use self::cpu::CpuMeter;
use self::schedule::{Latencies, Schedule};
use super::{parse_acks, parse_compression, ConnectArgs};

/// Largest `--batch` x `--size`: far above any broker's largest message (1 MiB by
/// default), and the bench builds one such batch to size them.
const MAX_BATCH_BYTES: usize = 256 << 20;
/// Runs shorter than this get no progress bar.
const PROGRESS_MIN_MESSAGES: u64 = 200_000;
/// A consume bench gives up when no record arrives for this long.
const IDLE_LIMIT: Duration = Duration::from_secs(10);
/// Bursts of sent records an open-loop run hands to its acknowledgement collector ahead of it.
const COLLECTOR_QUEUE: usize = 1 << 16;
/// The open-loop sender's shortest sleep: messages due meanwhile go out together at its
/// end, at most this much (plus the OS timer's slack) late. Sleeping until each next
/// message instead woke the sender every ~55 µs at 533,000 msg/s, and its CPU (1.4-1.7
/// against ~1.0 µs/msg for the whole client) came out of the brokers' share of the machine.
const SEND_TICK: Duration = Duration::from_micros(200);

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
    /// Open loop (produce, e2e): send this many messages per second on a fixed
    /// schedule, latency counted from each message's scheduled send time. Without it
    /// the producer sends as fast as it can.
    #[arg(long, value_name = "MSG_PER_S", value_parser = clap::value_parser!(u64).range(1..))]
    rate: Option<u64>,
    /// produce: a transactional producer commits every this many records (the last
    /// transaction may be shorter); latency is send → commit. Needs `--acks all`, as any
    /// transactional producer; `--acks all` alone is its idempotent reference.
    #[arg(long, value_name = "RECORDS", value_parser = clap::value_parser!(u64).range(1..))]
    transaction_records: Option<u64>,
    /// produce, closed loop: this many producers at once, each with its own connections
    /// (and transactional id), the messages shared between them. One producer's
    /// transactions follow each other; several show what the brokers sustain.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    producers: u64,
    /// Broker process ids (repeat the flag or separate with commas): the report adds
    /// their CPU time per message, from /proc (Linux).
    #[arg(long = "broker-pid", value_name = "PID", value_delimiter = ',')]
    broker_pids: Vec<u32>,
    /// connect: connections open at once (each is opened, used for ApiVersions, closed).
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Produce,
    Consume,
    E2e,
    /// `--messages` new connections (TCP, TLS, SASL, ApiVersions, close) per phase.
    Connect,
}

/// What a run measured.
struct Report {
    mode: Mode,
    messages: u64,
    bytes: u64,
    seconds: f64,
    latencies: Latencies,
}

/// CPU used during a run: the brokers' (when their pids were given) and this process's.
struct CpuUsed {
    brokers: Option<Duration>,
    client: Duration,
}

pub(crate) async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.messages == 0 {
        bail!("--messages must be at least 1");
    }
    if args.rate.is_some() && args.mode == Mode::Consume {
        bail!("--rate applies to produce and e2e: a consumer reads as fast as it can");
    }
    if args.producers > 1 && (args.mode != Mode::Produce || args.rate.is_some()) {
        bail!("--producers applies to produce without --rate");
    }
    if args.transaction_records.is_some() {
        if args.mode != Mode::Produce || args.rate.is_some() {
            bail!("--transaction-records applies to produce without --rate");
        }
        if args.acks != Acks::All {
            bail!("--transaction-records needs --acks all: a transactional producer is idempotent");
        }
    }
    let brokers = (!args.broker_pids.is_empty()).then(|| CpuMeter::start(&args.broker_pids)).transpose()?;
    let client = CpuMeter::start(&[std::process::id()])?;
    let report = match args.mode {
        Mode::Produce => produce(&args, None).await?,
        Mode::Consume => consume(&args).await?,
        Mode::E2e => e2e(&args).await?,
        // Two phases with their own report: see `connect`.
        Mode::Connect => {
            return connect::run(args.connect.client()?, args.messages, args.concurrency, &args.broker_pids, args.json).await
        }
    };
    let cpu = CpuUsed { brokers: brokers.map(|m| m.used()).transpose()?, client: client.used()? };
    report.print(args.rate, &cpu, args.json);
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

/// The configuration of producer `index` of the run.
fn producer_config(args: &BenchArgs, index: u64) -> anyhow::Result<ProducerConfig> {
    // `--batch N` records fill a batch: N-1 records at their real encoded size, built here
    // (from the 64th on, a record's offset delta takes a second byte: sizing all by the
    // first made `--batch 100` batches of 99), plus room for the producer's (upper-bound)
    // estimate of the Nth, so the N+1th never fits.
    if (args.batch as usize).saturating_mul(args.size) > MAX_BATCH_BYTES {
        bail!("--batch {} of --size {} is over {MAX_BATCH_BYTES} bytes a batch", args.batch, args.size);
    }
    let value = vec![0u8; args.size];
    let mut probe = fjord_record::BatchBuilder::with_capacity(0, (args.batch as usize) * (args.size + 8));
    for _ in 1..args.batch {
        probe.append(0, None, Some(&value), &[]);
    }
    let estimate = ProducerRecord { value: Some(Bytes::from(value)), ..ProducerRecord::default() }.encoded_size();
    Ok(ProducerConfig {
        client: args.connect.client()?,
        acks: args.acks,
        compression: args.compression,
        batch_size: probe.size() + estimate,
        linger: Duration::ZERO,
        // Unique per run: a second bench with the same id would fence this one.
        transactional_id: args
            .transaction_records
            .map(|_| format!("fjord-bench-{}-{}-{index}", std::process::id(), fjord_record::now_ms())),
        ..ProducerConfig::default()
    })
}

/// Produces `args.messages` records, closed loop or at `--rate`. With `stamp`, each value
/// starts with the nanoseconds since that instant at which it was sent (closed loop) or
/// due (open loop), for end-to-end latency; the producer's own latencies are then not
/// kept.
async fn produce(args: &BenchArgs, stamp: Option<Instant>) -> anyhow::Result<Report> {
    // All connected (and, transactional, given their producer ids) before the clock starts.
    let mut producers = Vec::new();
    for index in 0..args.producers {
        producers.push(Producer::connect(producer_config(args, index)?).await?);
    }
    let producer = producers[0].clone();
    producer.partition_count(&args.topic).await.with_context(|| format!("topic {}", args.topic))?;
    let payload: Bytes = (0..args.size).map(|i| (i * 31 % 251) as u8).collect::<Vec<u8>>().into();
    let (topic, size) = (args.topic.clone(), args.size);
    // The record sent (closed loop) or due (open loop) at `at`.
    let record = move |at: Instant| {
        let value = match stamp {
            Some(epoch) if size >= 8 => {
                let mut v = payload.to_vec();
                v[..8].copy_from_slice(&(at.saturating_duration_since(epoch).as_nanos() as u64).to_be_bytes());
                Bytes::from(v)
            }
            _ => payload.clone(),
        };
        ProducerRecord { topic: topic.clone(), value: Some(value), ..ProducerRecord::default() }
    };
    let pb = if stamp.is_some() { ProgressBar::hidden() } else { progress(args.messages) };
    let started = Instant::now();
    let latencies = match args.rate {
        None => {
            let mut runs = tokio::task::JoinSet::new();
            for (index, producer) in (0..).zip(&producers) {
                // The first producers take one more each when the messages do not divide.
                let messages = args.messages / args.producers + u64::from(index < args.messages % args.producers);
                let (producer, record, pb) = (producer.clone(), record.clone(), pb.clone());
                match args.transaction_records {
                    Some(per_transaction) => runs.spawn(transactions(producer, record, messages, per_transaction, pb)),
                    None => runs.spawn(closed_loop(producer, record, messages, stamp.is_none(), pb)),
                };
            }
            let mut latencies = Latencies::new();
            while let Some(run) = runs.join_next().await {
                latencies.merge(&run.context("producer task")??);
            }
            latencies
        }
        Some(rate) => {
            let (acks, collector) = collect_acknowledgements();
            let schedule = Schedule::new(started, rate);
            // The schedule runs on a thread of its own that sleeps with the OS timer, in
            // steps of SEND_TICK, not on tokio's timer, which wakes on whole milliseconds:
            // every message due within a millisecond went out at its end, up to 1 ms
            // late, and that lateness counted in every latency.
            let (runtime, sender, messages, progress) =
                (tokio::runtime::Handle::current(), producer.clone(), args.messages, pb.clone());
            tokio::task::spawn_blocking(move || {
                runtime.block_on(async {
                    let mut next = 0;
                    while next < messages {
                        let due = schedule.due_by(Instant::now()).min(messages);
                        if due <= next {
                            std::thread::sleep(schedule.due_at(next).saturating_duration_since(Instant::now()).max(SEND_TICK));
                            continue;
                        }
                        // Everything due goes out now, each with its own scheduled time: a
                        // send that blocked (a full buffer, a slow broker) delays the next
                        // ones, and their latencies count that delay.
                        let mut sent = Vec::with_capacity((due - next) as usize);
                        for i in next..due {
                            let due_at = schedule.due_at(i);
                            sent.push((due_at, sender.send(record(due_at)).await?));
                        }
                        // One hand-over per burst, not per record. A closed collector
                        // stopped on an error, which is returned below.
                        let _ = acks.send(sent).await;
                        progress.inc(due - next);
                        next = due;
                    }
                    anyhow::Ok(())
                })
            })
            .await
            .context("open-loop sender")??;
            producer.flush().await;
            collector.await.context("acknowledgement collector")??
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    pb.finish_and_clear();
    for producer in producers {
        producer.close().await;
    }
    Ok(Report { mode: Mode::Produce, messages: args.messages, bytes: args.messages * args.size as u64, seconds, latencies })
}

/// One producer's share of a closed-loop run: sends as fast as the producer takes
/// records; with `keep_latencies`, each send → acknowledgement.
async fn closed_loop(
    producer: Producer,
    record: impl Fn(Instant) -> ProducerRecord,
    messages: u64,
    keep_latencies: bool,
    pb: ProgressBar,
) -> anyhow::Result<Latencies> {
    let mut latencies = Latencies::new();
    let mut pending: VecDeque<(Instant, DeliveryFuture)> = VecDeque::new();
    for i in 0..messages {
        let sent = Instant::now();
        let delivery = producer.send(record(sent)).await?;
        if keep_latencies {
            pending.push_back((sent, delivery));
            // One clock read for all the records found acknowledged in this pass (they
            // were, at the latest, by now): clock reads were ~10% of the sending thread.
            let mut acknowledged = None;
            while let Some(result) = pending.front().and_then(|(_, f)| f.try_result()) {
                result?;
                let (sent, _) = pending.pop_front().expect("front exists");
                latencies.record_since(sent, *acknowledged.get_or_insert_with(Instant::now));
            }
        }
        if i % 65_536 == 65_535 {
            pb.inc(65_536);
        }
    }
    producer.flush().await;
    for (sent, f) in pending {
        f.await?;
        latencies.record_since(sent, Instant::now());
    }
    Ok(latencies)
}

/// One producer's share of a transactional run: transactions of `per_transaction`
/// records, each committed before the next begins; latency is send → commit.
async fn transactions(
    producer: Producer,
    record: impl Fn(Instant) -> ProducerRecord,
    messages: u64,
    per_transaction: u64,
    pb: ProgressBar,
) -> anyhow::Result<Latencies> {
    let mut latencies = Latencies::new();
    let mut sent = Vec::with_capacity(per_transaction as usize);
    let mut i = 0;
    while i < messages {
        producer.begin_transaction()?;
        let end = (i + per_transaction).min(messages);
        for _ in i..end {
            let at = Instant::now();
            // The commit below flushes these records and fails if any failed: their own
            // acknowledgements are not needed.
            drop(producer.send(record(at)).await?);
            sent.push(at);
        }
        producer.commit_transaction().await?;
        let committed = Instant::now();
        for at in sent.drain(..) {
            latencies.record_since(at, committed);
        }
        pb.inc(end - i);
        i = end;
    }
    Ok(latencies)
}

/// Records sent together in an open-loop run, each with its scheduled time.
type Burst = Vec<(Instant, DeliveryFuture)>;

/// An open-loop run's acknowledgement collector: a task that records each latency, from
/// the record's scheduled time, when its acknowledgement arrives (not when the sender
/// next looks). Stops at the first failed record.
///
/// A partition's records are acknowledged in the order they were sent, so the collector
/// waits on one record per partition, the oldest, and when it resolves takes every later
/// record of that partition already acknowledged (a batch completes all its records at
/// once) at the same instant. Waiting on each record instead cost a waker and a wake-up
/// per record: at half a million records a second, most of a core of the client's own,
/// which then delayed the sends being measured.
fn collect_acknowledgements() -> (mpsc::Sender<Burst>, tokio::task::JoinHandle<anyhow::Result<Latencies>>) {
    let (tx, mut rx) = mpsc::channel::<Burst>(COLLECTOR_QUEUE);
    let task = tokio::spawn(async move {
        let mut latencies = Latencies::new();
        // Per partition, the records after the one being waited on, oldest first; and
        // the partitions whose oldest record is being waited on.
        let mut queued: HashMap<i32, VecDeque<(Instant, DeliveryFuture)>> = HashMap::new();
        let mut waited: HashSet<i32> = HashSet::new();
        let mut oldest = FuturesUnordered::new();
        let watch = |(due, delivery): (Instant, DeliveryFuture)| async move {
            let partition = delivery.partition();
            let result = delivery.await;
            (partition, due, result, Instant::now())
        };
        let mut open = true;
        loop {
            tokio::select! {
                Some((partition, due, result, done)) = oldest.next(), if !oldest.is_empty() => {
                    result?;
                    latencies.record_since(due, done);
                    let queue = queued.entry(partition).or_default();
                    while let Some(result) = queue.front().and_then(|(_, d)| d.try_result()) {
                        result?;
                        let (due, _) = queue.pop_front().expect("front exists");
                        latencies.record_since(due, done);
                    }
                    match queue.pop_front() {
                        Some(next) => oldest.push(watch(next)),
                        None => {
                            waited.remove(&partition);
                        }
                    }
                }
                sent = rx.recv(), if open => match sent {
                    Some(sent) => {
                        for (due, delivery) in sent {
                            let partition = delivery.partition();
                            if waited.insert(partition) {
                                oldest.push(watch((due, delivery)));
                            } else {
                                queued.entry(partition).or_default().push_back((due, delivery));
                            }
                        }
                    }
                    None => open = false,
                },
                else => break,
            }
        }
        Ok(latencies)
    });
    (tx, task)
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
    let mut latencies = Latencies::new();
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
        latencies.record(polled.elapsed());
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
        let args = BenchArgs {
            mode: Mode::Produce,
            connect: args.connect.clone(),
            topic: args.topic.clone(),
            broker_pids: Vec::new(),
            ..*args
        };
        tokio::spawn(async move { produce(&args, Some(epoch)).await })
    };
    let (mut messages, mut bytes) = (0u64, 0u64);
    let mut latencies = Latencies::new();
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
            latencies.record_micros(now.saturating_sub(sent) / 1000);
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
    fn print(self, rate: Option<u64>, cpu: &CpuUsed, json: bool) {
        let l = &self.latencies;
        let (p50, p99, p999, max) = (l.quantile_ms(0.50), l.quantile_ms(0.99), l.quantile_ms(0.999), l.max_ms());
        let msg_per_s = self.messages as f64 / self.seconds;
        let mb_per_s = self.bytes as f64 / self.seconds / 1e6;
        let mode = match self.mode {
            Mode::Produce => "produce",
            Mode::Consume => "consume",
            Mode::E2e => "e2e",
            Mode::Connect => "connect",
        };
        let broker_us = cpu.brokers.map(|c| cpu::micros_per_message(c, self.messages));
        let client_us = cpu::micros_per_message(cpu.client, self.messages);
        if json {
            let mut report = serde_json::json!({
                "mode": mode,
                "messages": self.messages,
                "bytes": self.bytes,
                "seconds": self.seconds,
                "msg_per_s": msg_per_s,
                "mb_per_s": mb_per_s,
                "p50_ms": p50,
                "p99_ms": p99,
                "p999_ms": p999,
                "max_ms": max,
                "latency_samples": l.count(),
                "open_loop": rate.is_some(),
                "client_cpu_us_per_msg": client_us,
            });
            if let Some(rate) = rate {
                report["target_msg_per_s"] = rate.into();
            }
            if let (Some(cpu), Some(us)) = (cpu.brokers, broker_us) {
                report["broker_cpu_s"] = cpu.as_secs_f64().into();
                report["broker_cpu_us_per_msg"] = us.into();
            }
            println!("{report}");
        } else {
            let target = rate.map(|r| format!(" (open loop at {r} msg/s)")).unwrap_or_default();
            let brokers = broker_us.map(|us| format!("; broker CPU {us:.2} µs/msg")).unwrap_or_default();
            println!(
                "{mode}{target}: {} messages, {} bytes in {:.2} s: {:.0} msg/s, {:.1} MB/s; latency p50 {p50:.2} ms, p99 {p99:.2} ms, p99.9 {p999:.2} ms, max {max:.2} ms{brokers}; client CPU {client_us:.2} µs/msg",
                self.messages, self.bytes, self.seconds, msg_per_s, mb_per_s
            );
        }
    }
}
