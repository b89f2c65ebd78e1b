//! The clients of a chaos run, all fjord-client, all in the clients' namespace:
//! idempotent acks=all producers and acks=1 producers writing values no one else
//! writes to chosen partitions, and group members that poll and commit; on a second
//! topic, transactional producers committing and aborting transactions over several
//! partitions, and read_committed consumers. Every operation goes to the history with
//! its invocation and completion times and result.

use std::collections::BTreeMap;
use std::io::BufWriter;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use fjord_client::{
    Acks as ClientAcks, Admin, ClientConfig, Consumer, ConsumerConfig, GroupConfig, GroupConsumer, IsolationLevel, OffsetReset,
    OffsetSpec, Producer, ProducerConfig, ProducerRecord, TopicPartition,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::history::{
    self, Acks, Commit, CommitOffset, Decision, Event, FinalRead, Outcome, Poll, Produce, Rebalance, Record, Transaction,
    TxnWrite,
};

/// Where every event of a run goes, with the run's clock.
#[derive(Clone)]
pub struct Recorder {
    start: Instant,
    out: Arc<Mutex<BufWriter<std::fs::File>>>,
    operations: Arc<std::sync::atomic::AtomicU64>,
}

impl Recorder {
    pub fn create(path: &std::path::Path) -> Result<Self> {
        let file = std::fs::File::create(path).with_context(|| format!("history file {}", path.display()))?;
        Ok(Self {
            start: Instant::now(),
            out: Arc::new(Mutex::new(BufWriter::new(file))),
            operations: Arc::new(std::sync::atomic::AtomicU64::new(0)),
        })
    }

    /// Microseconds since the run started.
    pub fn now(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }

    pub fn record(&self, event: &Event) -> Result<()> {
        if event.is_operation() {
            self.operations.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let mut out = self.out.lock().map_err(|_| anyhow::anyhow!("history writer poisoned"))?;
        history::write_event(&mut *out, event)
    }

    pub fn operations(&self) -> u64 {
        self.operations.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn flush(&self) -> Result<()> {
        use std::io::Write;
        self.out.lock().map_err(|_| anyhow::anyhow!("history writer poisoned"))?.flush()?;
        Ok(())
    }
}

/// What the workload writes to and how.
#[derive(Debug, Clone)]
pub struct Workload {
    pub bootstrap: String,
    pub topic: String,
    pub partitions: i32,
    pub idempotent_producers: u32,
    pub acks1_producers: u32,
    pub consumers: u32,
    /// The transactions topic (as many partitions as `topic`), its transactional
    /// producers and its read_committed consumers.
    pub txn_topic: String,
    pub transactional_producers: u32,
    pub committed_consumers: u32,
    /// Pause between one producer's sends (each waits for its acknowledgement first).
    pub send_interval: Duration,
}

/// How long a transaction may stay open before its coordinator aborts it: short, so the
/// ones a fault left open are decided soon and the final read can wait for them.
pub const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(10);

fn client(bootstrap: &str, id: &str) -> ClientConfig {
    let mut client = ClientConfig::new(bootstrap);
    client.client_id = id.to_owned();
    client.connect_timeout = Duration::from_secs(3);
    client.request_timeout = Duration::from_secs(8);
    client.metadata_max_age = Duration::from_secs(5);
    client.retry_backoff = Duration::from_millis(200);
    client
}

/// Runs every client until `stop`, then lets in-flight produces finish (bounded by
/// their delivery timeout) and returns.
pub async fn run(workload: Workload, recorder: Recorder, stop: CancellationToken) -> Result<()> {
    let mut tasks = tokio::task::JoinSet::new();
    let mut process = 0u32;
    for (count, acks) in [(workload.idempotent_producers, Acks::All), (workload.acks1_producers, Acks::One)] {
        for _ in 0..count {
            let (w, r, s) = (workload.clone(), recorder.clone(), stop.clone());
            let p = process;
            tasks.spawn(async move { produce_loop(w, r, s, p, acks).await });
            process += 1;
        }
    }
    for _ in 0..workload.consumers {
        let (w, r, s) = (workload.clone(), recorder.clone(), stop.clone());
        let p = process;
        tasks.spawn(async move { consume_loop(w, r, s, p).await });
        process += 1;
    }
    for _ in 0..workload.transactional_producers {
        let (w, r, s) = (workload.clone(), recorder.clone(), stop.clone());
        let p = process;
        tasks.spawn(async move { transaction_loop(w, r, s, p).await });
        process += 1;
    }
    for _ in 0..workload.committed_consumers {
        let (w, r, s) = (workload.clone(), recorder.clone(), stop.clone());
        let p = process;
        tasks.spawn(async move { committed_consume_loop(w, r, s, p).await });
        process += 1;
    }
    while let Some(joined) = tasks.join_next().await {
        joined.context("a workload task panicked")??;
    }
    Ok(())
}

async fn produce_loop(w: Workload, recorder: Recorder, stop: CancellationToken, process: u32, acks: Acks) -> Result<()> {
    let config = ProducerConfig {
        client: client(&w.bootstrap, &format!("chaos-producer-{process}")),
        acks: match acks {
            Acks::All => ClientAcks::All,
            Acks::One => ClientAcks::Leader,
        },
        linger: Duration::from_millis(1),
        delivery_timeout: Duration::from_secs(30),
        max_block: Duration::from_secs(30),
        enable_idempotence: Some(acks == Acks::All),
        ..ProducerConfig::default()
    };
    let idempotent = config.idempotent();
    // The first connection can fail while a fault is on; keep trying until stopped.
    let producer = loop {
        match Producer::connect(config.clone()).await {
            Ok(p) => break p,
            Err(_) if !stop.is_cancelled() => tokio::time::sleep(Duration::from_millis(500)).await,
            Err(e) => return Err(e).context("producer connect"),
        }
    };
    let prefix = if acks == Acks::All { "a" } else { "o" };
    let mut seq = 0u64;
    while !stop.is_cancelled() {
        let partition = ((seq + u64::from(process)) % w.partitions as u64) as i32;
        let value = format!("{prefix}{process}-{seq}");
        seq += 1;
        let invoke_us = recorder.now();
        let sent = producer.send(ProducerRecord::new(&w.topic, value.clone().into_bytes()).partition(partition)).await;
        let result = match sent {
            Ok(delivery) => delivery.await,
            Err(e) => Err(e),
        };
        let complete_us = recorder.now();
        let (outcome, offset, error) = match result {
            Ok(meta) => (Outcome::Ok, Some(meta.offset), None),
            // Timed out or refused after retries: whether it was written is unknown.
            Err(e) => (Outcome::Unknown, None, Some(e.to_string())),
        };
        recorder.record(&Event::Produce(Produce {
            process,
            invoke_us,
            complete_us,
            partition,
            value,
            acks,
            idempotent,
            outcome,
            offset,
            error,
        }))?;
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::time::sleep(w.send_interval) => {}
        }
    }
    producer.close().await;
    Ok(())
}

const GROUP: &str = "chaos-group";

async fn consume_loop(w: Workload, recorder: Recorder, stop: CancellationToken, process: u32) -> Result<()> {
    let mut incarnation = 0;
    while !stop.is_cancelled() {
        // A member that keeps failing is replaced by a new one (a new name in the
        // history: its positions start over, as after a rebalance).
        let name = format!("c{process}.{incarnation}");
        incarnation += 1;
        let mut config = GroupConfig::new(&w.bootstrap, GROUP);
        config.consumer.client = client(&w.bootstrap, &name);
        config.consumer.auto_offset_reset = OffsetReset::Earliest;
        config.consumer.fetch_max_wait = Duration::from_millis(200);
        config.enable_auto_commit = false;
        config.session_timeout = Duration::from_secs(6);
        config.heartbeat_interval = Duration::from_secs(1);
        config.max_poll_interval = Duration::from_secs(20);
        let topics = [w.topic.as_str()];
        let subscribed = tokio::select! {
            _ = stop.cancelled() => break,
            s = GroupConsumer::subscribe(config, &topics) => s,
        };
        let Ok(mut consumer) = subscribed else {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        member_loop(&mut consumer, &w.topic, &name, &recorder, &stop, process).await?;
        // Leave cleanly if it can; a broken member is just dropped.
        let _ = tokio::time::timeout(Duration::from_secs(5), consumer.close()).await;
    }
    Ok(())
}

/// Polls and commits until stopped or until the member fails five times in a row.
async fn member_loop(
    consumer: &mut GroupConsumer,
    topic: &str,
    name: &str,
    recorder: &Recorder,
    stop: &CancellationToken,
    process: u32,
) -> Result<()> {
    // (member id, generation): a coordinator that took the group over (its broker
    // failed) starts generations from 1 again, so the number alone can repeat across a
    // rebalance; the member id the member rejoined with does not.
    let mut member = (String::new(), -1);
    let mut positions: BTreeMap<i32, i64> = BTreeMap::new();
    let mut failures = 0;
    let mut last_commit = Instant::now();
    while !stop.is_cancelled() && failures < 5 {
        let invoke_us = recorder.now();
        let polled = consumer.poll(Duration::from_millis(500)).await;
        let complete_us = recorder.now();
        let now = (consumer.member_id(), consumer.generation());
        if now != member {
            member = now;
            positions.clear();
            let assigned = consumer.assignment().iter().map(|tp| tp.partition).collect();
            recorder.record(&Event::Rebalance(Rebalance {
                process,
                consumer: name.to_owned(),
                member_id: member.0.clone(),
                generation: member.1,
                time_us: invoke_us,
                assigned,
            }))?;
        }
        match polled {
            Ok(records) => {
                failures = 0;
                let mut seen = Vec::with_capacity(records.len());
                for r in records {
                    let value = String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned();
                    positions.insert(r.partition, r.offset + 1);
                    seen.push(Record { partition: r.partition, offset: r.offset, value });
                }
                if !seen.is_empty() {
                    recorder.record(&Event::Poll(Poll {
                        process,
                        consumer: name.to_owned(),
                        generation: member.1,
                        invoke_us,
                        complete_us,
                        outcome: Outcome::Ok,
                        records: seen,
                        error: None,
                    }))?;
                }
            }
            Err(e) => {
                failures += 1;
                recorder.record(&Event::Poll(Poll {
                    process,
                    consumer: name.to_owned(),
                    generation: member.1,
                    invoke_us,
                    complete_us,
                    outcome: Outcome::Unknown,
                    records: Vec::new(),
                    error: Some(e.to_string()),
                }))?;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        // Commit what this generation consumed, every second and before a rebalance.
        if !positions.is_empty() && (last_commit.elapsed() >= Duration::from_secs(1) || consumer.rebalance_pending()) {
            last_commit = Instant::now();
            let offsets: Vec<(TopicPartition, i64)> =
                positions.iter().map(|(&p, &o)| (TopicPartition::new(topic, p), o)).collect();
            let invoke_us = recorder.now();
            let committed = consumer.commit_offsets_sync(&offsets).await;
            let complete_us = recorder.now();
            let (outcome, error) = match committed {
                Ok(()) => (Outcome::Ok, None),
                Err(e) => (Outcome::Unknown, Some(e.to_string())),
            };
            recorder.record(&Event::Commit(Commit {
                process,
                group: GROUP.to_owned(),
                consumer: name.to_owned(),
                generation: member.1,
                invoke_us,
                complete_us,
                offsets: positions.iter().map(|(&partition, &offset)| CommitOffset { partition, offset }).collect(),
                outcome,
                error,
            }))?;
        }
    }
    Ok(())
}

/// One transactional producer: transactions of one to three values over the partitions
/// of the transactions topic, every fourth one aborted. After any error the transaction's
/// outcome is unknown, and the producer is replaced by a new one with the same
/// transactional id (which fences the old one and completes or aborts what it left).
async fn transaction_loop(w: Workload, recorder: Recorder, stop: CancellationToken, process: u32) -> Result<()> {
    let id = format!("chaos-txn-{process}");
    let config = ProducerConfig {
        client: client(&w.bootstrap, &id),
        acks: ClientAcks::All,
        linger: Duration::from_millis(1),
        delivery_timeout: Duration::from_secs(30),
        max_block: Duration::from_secs(30),
        enable_idempotence: Some(true),
        transactional_id: Some(id.clone()),
        transaction_timeout: TRANSACTION_TIMEOUT,
        ..ProducerConfig::default()
    };
    let mut seq = 0u64;
    while !stop.is_cancelled() {
        let producer = tokio::select! {
            _ = stop.cancelled() => break,
            p = Producer::connect(config.clone()) => p,
        };
        let Ok(producer) = producer else {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        while !stop.is_cancelled() {
            let size = 1 + (seq % 3) as i32;
            let decision = if seq % 4 == 3 { Decision::Abort } else { Decision::Commit };
            let writes: Vec<TxnWrite> = (0..size)
                .map(|i| TxnWrite { partition: ((seq as i32 + i) % w.partitions).abs(), value: format!("t{process}-{seq}-{i}") })
                .collect();
            seq += 1;
            let invoke_us = recorder.now();
            let ended = one_transaction(&producer, &w.txn_topic, &writes, decision).await;
            let (outcome, error) = match ended {
                Ok(()) => (Outcome::Ok, None),
                Err(e) => (Outcome::Unknown, Some(e.to_string())),
            };
            recorder.record(&Event::Transaction(Transaction {
                process,
                transactional_id: id.clone(),
                invoke_us,
                complete_us: recorder.now(),
                writes,
                decision,
                outcome,
                error,
            }))?;
            if outcome != Outcome::Ok {
                break;
            }
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = tokio::time::sleep(w.send_interval * 5) => {}
            }
        }
        producer.close().await;
    }
    Ok(())
}

/// Begin, send every value, then commit or abort as decided.
async fn one_transaction(producer: &Producer, topic: &str, writes: &[TxnWrite], decision: Decision) -> fjord_client::Result<()> {
    producer.begin_transaction()?;
    for w in writes {
        // The delivery is checked by the commit, which fails when a record failed.
        drop(producer.send(ProducerRecord::new(topic, w.value.clone().into_bytes()).partition(w.partition)).await?);
    }
    match decision {
        Decision::Commit => producer.commit_transaction().await,
        Decision::Abort => producer.abort_transaction().await,
    }
}

/// One read_committed consumer of every partition of the transactions topic, from the
/// start. A consumer that keeps failing is replaced (a new incarnation starts over).
async fn committed_consume_loop(w: Workload, recorder: Recorder, stop: CancellationToken, process: u32) -> Result<()> {
    let name = format!("rc{process}");
    let mut incarnation = 0;
    while !stop.is_cancelled() {
        let config = ConsumerConfig {
            client: client(&w.bootstrap, &name),
            auto_offset_reset: OffsetReset::Earliest,
            fetch_max_wait: Duration::from_millis(200),
            isolation_level: IsolationLevel::ReadCommitted,
            ..ConsumerConfig::default()
        };
        let partitions: Vec<TopicPartition> = (0..w.partitions).map(|p| TopicPartition::new(&w.txn_topic, p)).collect();
        let connected = async {
            let mut consumer = Consumer::connect(config).await?;
            consumer.assign(partitions).await?;
            Ok::<_, fjord_client::Error>(consumer)
        };
        let mut consumer = tokio::select! {
            _ = stop.cancelled() => break,
            c = connected => match c {
                Ok(c) => c,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            },
        };
        let mut failures = 0;
        while !stop.is_cancelled() && failures < 5 {
            let invoke_us = recorder.now();
            let polled = consumer.poll(Duration::from_millis(500)).await;
            let complete_us = recorder.now();
            let (outcome, records, error) = match polled {
                Ok(records) if records.is_empty() => continue,
                Ok(records) => {
                    failures = 0;
                    let records = records
                        .into_iter()
                        .map(|r| Record {
                            partition: r.partition,
                            offset: r.offset,
                            value: String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned(),
                        })
                        .collect();
                    (Outcome::Ok, records, None)
                }
                Err(e) => {
                    failures += 1;
                    (Outcome::Unknown, Vec::new(), Some(e.to_string()))
                }
            };
            recorder.record(&Event::CommittedPoll(Poll {
                process,
                consumer: name.clone(),
                generation: incarnation,
                invoke_us,
                complete_us,
                outcome,
                records,
                error,
            }))?;
            if outcome != Outcome::Ok {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        incarnation += 1;
    }
    Ok(())
}

/// Reads every partition of the transactions topic with read_committed, once its last
/// stable offset reached its high watermark (every transaction decided; the coordinator
/// aborts one a fault left open after [`TRANSACTION_TIMEOUT`]), and records each as a
/// final read.
pub async fn committed_final_reads(w: &Workload, recorder: &Recorder, timeout: Duration) -> Result<()> {
    let config = client(&w.bootstrap, "chaos-final-read-committed");
    let admin = Admin::connect(config.clone()).await.context("admin client for the final read_committed read")?;
    for partition in 0..w.partitions {
        let deadline = Instant::now() + timeout;
        let spec = |s| vec![(w.txn_topic.clone(), partition, s)];
        let end = loop {
            let stable = admin.list_offsets_at(&spec(OffsetSpec::Latest), IsolationLevel::ReadCommitted).await;
            let high = admin.list_offsets(&spec(OffsetSpec::Latest)).await;
            let last = match (stable, high) {
                (Ok(s), Ok(h)) if s[0] == h[0] => break h[0],
                (Ok(s), Ok(h)) => format!("last stable offset {} below high watermark {}", s[0], h[0]),
                (Err(e), _) | (_, Err(e)) => e.to_string(),
            };
            if Instant::now() >= deadline {
                bail!("transactions topic partition {partition}: not every transaction decided in {timeout:?}: {last}");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        let mut consumer = Consumer::connect(ConsumerConfig {
            client: config.clone(),
            auto_offset_reset: OffsetReset::Earliest,
            fetch_max_wait: Duration::from_millis(50),
            isolation_level: IsolationLevel::ReadCommitted,
            ..ConsumerConfig::default()
        })
        .await?;
        let tp = TopicPartition::new(&w.txn_topic, partition);
        consumer.assign([tp.clone()]).await?;
        let mut records = Vec::new();
        // The position passes aborted records and markers, which no record shows.
        while consumer.position(&tp).await.unwrap_or(0) < end {
            if Instant::now() >= deadline {
                bail!("final read_committed read of partition {partition}: not at {end} in {timeout:?}");
            }
            let Ok(polled) = consumer.poll(Duration::from_millis(500)).await else {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            for r in polled.into_iter().filter(|r| r.offset < end) {
                let value = String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned();
                records.push(Record { partition, offset: r.offset, value });
            }
        }
        recorder.record(&Event::CommittedFinalRead(FinalRead {
            partition,
            time_us: recorder.now(),
            start_offset: 0,
            end_offset: end,
            records,
        }))?;
    }
    recorder.flush()
}

/// Reads every partition from its start to its high watermark (asked once every
/// produce has completed) and records each as a final read.
pub async fn final_reads(w: &Workload, recorder: &Recorder, timeout: Duration) -> Result<()> {
    let config = client(&w.bootstrap, "chaos-final-read");
    let admin = Admin::connect(config.clone()).await.context("admin client for the final read")?;
    for partition in 0..w.partitions {
        let deadline = Instant::now() + timeout;
        let spec = |s| vec![(w.topic.clone(), partition, s)];
        let (start, end) = loop {
            let start = admin.list_offsets(&spec(OffsetSpec::Earliest)).await;
            let end = admin.list_offsets(&spec(OffsetSpec::Latest)).await;
            match (start, end) {
                (Ok(s), Ok(e)) => break (s[0], e[0]),
                (Err(e), _) | (_, Err(e)) if Instant::now() >= deadline => {
                    return Err(e).with_context(|| format!("offsets of partition {partition} for the final read"))
                }
                _ => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        };
        let mut consumer = Consumer::connect(ConsumerConfig {
            client: config.clone(),
            auto_offset_reset: OffsetReset::Earliest,
            fetch_max_wait: Duration::from_millis(50),
            ..ConsumerConfig::default()
        })
        .await?;
        consumer.assign([TopicPartition::new(&w.topic, partition)]).await?;
        let mut records = Vec::new();
        let mut next = start;
        while next < end {
            if Instant::now() >= deadline {
                bail!("final read of partition {partition}: reached offset {next} of {start}..{end} in {timeout:?}");
            }
            let polled = match consumer.poll(Duration::from_millis(500)).await {
                Ok(polled) => polled,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            for r in polled {
                if r.offset >= end {
                    continue;
                }
                next = r.offset + 1;
                let value = String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned();
                records.push(Record { partition, offset: r.offset, value });
            }
        }
        recorder.record(&Event::FinalRead(FinalRead {
            partition,
            time_us: recorder.now(),
            start_offset: start,
            end_offset: end,
            records,
        }))?;
    }
    recorder.flush()
}
