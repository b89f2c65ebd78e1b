//! One chaos run: namespaces, ZooKeeper and brokers, the workload, the seeded fault
//! schedule, the final read and the checker's verdict.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use fjord_client::{Admin, NewTopic};
use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::checker::{self, Report};
use super::history::{self, Event, Fault};
use super::netns::{self, Network, Rules};
use super::nodes::{Nodes, SESSION_TIMEOUT_MS};
use super::schedule::{self, FaultKind, Planned, Target};
use super::workload::{self, Recorder, Workload};

const TOPIC: &str = "chaos";
/// The transactions topic: transactional producers and read_committed consumers.
const TXN_TOPIC: &str = "chaos-txn";
const BROKERS: i32 = 3;
const PARTITIONS: i32 = 3;
/// The broker whose data dir is a small tmpfs (the `disk` fault).
const DISK_BROKER: i32 = 2;
/// Bound on the cluster coming up, and on it recovering once every fault is healed.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(120);

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    pub seed: u64,
    /// Length of the fault phase.
    pub duration: Duration,
    pub kinds: Vec<FaultKind>,
    /// The `fjord` binary the brokers run.
    pub fjord: PathBuf,
    /// Where the history goes.
    pub history: PathBuf,
    /// Print each fault as it starts.
    pub verbose: bool,
}

/// A fault as it ran.
#[derive(Debug, Clone, Serialize)]
pub struct RanFault {
    pub kind: FaultKind,
    /// The target, resolved (a leader named by its broker id).
    pub target: String,
    pub start_s: f64,
    pub length_s: f64,
}

/// What a run found.
#[derive(Debug, Serialize)]
pub struct RunOutcome {
    pub seed: u64,
    pub faults: Vec<RanFault>,
    pub report: Report,
    /// Brokers that exited without being killed (e.g. on a full disk), as noticed.
    pub unexpected_exits: Vec<String>,
    pub history: PathBuf,
    /// Where the broker logs were kept, when kept.
    pub kept: Option<PathBuf>,
}

impl RunOutcome {
    /// Faults per kind, every kind of the run present.
    pub fn faults_by_kind(&self) -> BTreeMap<&'static str, usize> {
        let mut by = BTreeMap::new();
        for f in &self.faults {
            *by.entry(f.kind.name()).or_default() += 1;
        }
        by
    }
}

/// Broker settings of every chaos run: the durable ones the guarantees are stated for,
/// and short timeouts so faults have their effect within seconds.
fn broker_configs() -> Vec<(&'static str, String)> {
    vec![
        ("default.replication.factor", "3".into()),
        ("min.insync.replicas", "2".into()),
        ("unclean.leader.election.enable", "false".into()),
        ("auto.create.topics.enable", "false".into()),
        ("replica.lag.time.max.ms", "6000".into()),
        ("replica.socket.timeout.ms", "5000".into()),
        ("group.initial.rebalance.delay.ms", "0".into()),
        // Few transaction-state partitions (Kafka's 50 only slow a debug cluster's start),
        // and timed-out transactions aborted within seconds of their timeout.
        ("transaction.state.log.num.partitions", "3".into()),
        ("transaction.abort.timed.out.transaction.cleanup.interval.ms", "2000".into()),
    ]
}

/// Runs it. Needs root (namespaces, nftables, a tmpfs); fails with the reason when it
/// cannot set up, and cleans up everything it made, on failure too. Moves the calling
/// thread into the clients' namespace (the runtime's threads start from it).
pub fn run(options: Options) -> Result<RunOutcome> {
    let stale = netns::sweep_stale()?;
    if stale > 0 {
        eprintln!("chaos: removed {stale} namespaces a previous run left behind");
    }
    let mut labels: Vec<String> = vec!["zk".into()];
    labels.extend((0..BROKERS).map(|b| format!("b{b}")));
    labels.push("clients".into());
    let net = Network::create(&labels.iter().map(String::as_str).collect::<Vec<_>>())?;
    netns::enter(&net.node("clients")?.netns)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(run_in(options, net))
}

/// The fault schedule `options` give (what [`run`] will inject, in order).
pub fn plan(options: &Options) -> Result<Vec<Planned>> {
    let session = Duration::from_millis(SESSION_TIMEOUT_MS);
    Ok(schedule::plan(options.seed, options.duration, &options.kinds, BROKERS, PARTITIONS, DISK_BROKER, session))
}

async fn run_in(options: Options, net: Network) -> Result<RunOutcome> {
    let plan = plan(&options)?;
    let disk = options.kinds.contains(&FaultKind::Disk).then_some(DISK_BROKER);
    let mut nodes = Nodes::start(net, &options.fjord, BROKERS as usize, disk, &broker_configs())?;
    let outcome = drive(&options, &mut nodes, &plan).await;
    let failed = match &outcome {
        Ok(o) => o.report.violations() > 0,
        Err(_) => true,
    };
    let kept = (failed || std::env::var_os("FJORD_TEST_KEEP").is_some()).then(|| {
        nodes.keep();
        nodes.dir().to_path_buf()
    });
    match outcome {
        Ok(mut o) => {
            o.kept = kept;
            Ok(o)
        }
        Err(e) => {
            let mut tails = String::new();
            for id in nodes.ids() {
                tails.push_str(&format!("\n==== broker {id} (last 20 lines) ====\n{}", nodes.log_tail(id, 20)));
            }
            Err(e.context(format!("broker logs kept in {}{tails}", nodes.dir().display())))
        }
    }
}

async fn drive(options: &Options, nodes: &mut Nodes, plan: &[Planned]) -> Result<RunOutcome> {
    let bootstrap = nodes.bootstrap();
    let admin = create_topic(&bootstrap).await?;
    if let Some(parent) = options.history.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let recorder = Recorder::create(&options.history)?;
    let w = Workload {
        bootstrap: bootstrap.clone(),
        topic: TOPIC.into(),
        partitions: PARTITIONS,
        idempotent_producers: 3,
        acks1_producers: 2,
        consumers: 2,
        txn_topic: TXN_TOPIC.into(),
        transactional_producers: 2,
        committed_consumers: 1,
        send_interval: Duration::from_millis(20),
    };
    let stop = CancellationToken::new();
    let clients = tokio::spawn(workload::run(w.clone(), recorder.clone(), stop.clone()));
    // Clients up and writing before the first fault.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let phase = Instant::now();
    let mut ran = Vec::new();
    let mut exits = Vec::new();
    for planned in plan {
        tokio::time::sleep_until(phase + planned.start).await;
        let target = resolve(&admin, nodes, &planned.target).await;
        if options.verbose {
            eprintln!(
                "chaos: {:>7.1}s {:<10} {:<22} for {:.1}s (ops so far {})",
                planned.start.as_secs_f64(),
                planned.kind.name(),
                describe(planned, &target),
                planned.length.as_secs_f64(),
                recorder.operations()
            );
        }
        let start_us = recorder.now();
        inject(nodes, planned, &target)
            .with_context(|| format!("injecting {} on {}", planned.kind, describe(planned, &target)))?;
        tokio::time::sleep(planned.length).await;
        exits.extend(heal(nodes).with_context(|| format!("healing {}", planned.kind))?);
        recorder.record(&Event::Fault(Fault {
            kind: planned.kind.name().into(),
            target: describe(planned, &target),
            start_us,
            end_us: recorder.now(),
        }))?;
        ran.push(RanFault {
            kind: planned.kind,
            target: describe(planned, &target),
            start_s: planned.start.as_secs_f64(),
            length_s: planned.length.as_secs_f64(),
        });
    }
    // Healed: the cluster must come back to every replica in sync, and the clients get
    // a few quiet seconds to finish what they were retrying.
    exits.extend(heal(nodes)?);
    wait_in_sync(&admin, SETTLE_TIMEOUT).await.context("after the faults healed, the cluster did not recover")?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(90), clients)
        .await
        .map_err(|_| anyhow!("the clients did not stop within 90 s of the end"))?
        .context("workload task")?
        .context("workload")?;
    workload::final_reads(&w, &recorder, Duration::from_secs(120)).await?;
    let decided = workload::TRANSACTION_TIMEOUT + Duration::from_secs(120);
    workload::committed_final_reads(&w, &recorder, decided).await?;
    let events = history::read_history(std::io::BufReader::new(std::fs::File::open(&options.history)?))?;
    let report = checker::check(&events)?;
    Ok(RunOutcome {
        seed: options.seed,
        faults: ran,
        report,
        unexpected_exits: exits,
        history: options.history.clone(),
        kept: None,
    })
}

/// Creates the topics (retrying while the brokers come up) and waits until every
/// partition of the main one has all three replicas in sync.
async fn create_topic(bootstrap: &str) -> Result<Admin> {
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    let admin = loop {
        match Admin::connect(fjord_client::ClientConfig::new(bootstrap)).await {
            Ok(a) => break a,
            Err(e) if Instant::now() >= deadline => return Err(e).context("no broker answered"),
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    };
    for name in [TOPIC, TXN_TOPIC] {
        let mut topic = NewTopic::new(name, PARTITIONS);
        topic.replication_factor = BROKERS as i16;
        loop {
            match admin.create_topics(std::slice::from_ref(&topic)).await {
                Ok(()) => break,
                Err(e) if e.to_string().to_lowercase().contains("exist") => break,
                Err(e) if Instant::now() >= deadline => return Err(e).with_context(|| format!("creating topic {name}")),
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    }
    wait_in_sync(&admin, SETTLE_TIMEOUT).await?;
    Ok(admin)
}

async fn wait_in_sync(admin: &Admin, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut last = String::from("no metadata yet");
    loop {
        if let Ok(Ok(topic)) = tokio::time::timeout(Duration::from_secs(5), admin.describe_topic(TOPIC)).await {
            let ok = topic.partitions.len() == PARTITIONS as usize
                && topic.partitions.iter().all(|p| p.leader >= 0 && p.in_sync_replicas.len() == BROKERS as usize);
            if ok {
                return Ok(());
            }
            last = topic
                .partitions
                .iter()
                .map(|p| format!("p{} leader {} isr {:?}", p.partition, p.leader, p.in_sync_replicas))
                .collect::<Vec<_>>()
                .join("; ");
        }
        if Instant::now() >= deadline {
            bail!("partitions not all in sync within {timeout:?}: {last}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The broker a target names now: `Leader(p)` is the current leader of p (by metadata;
/// a broker chosen by p when there is none or metadata does not answer).
async fn resolve(admin: &Admin, nodes: &Nodes, target: &Target) -> Option<i32> {
    match target {
        Target::Broker(id) => Some(*id),
        Target::Leader(p) => {
            let fallback = p % nodes.ids().len() as i32;
            let leader = match tokio::time::timeout(Duration::from_secs(3), admin.describe_topic(TOPIC)).await {
                Ok(Ok(topic)) => topic.partitions.iter().find(|m| m.partition == *p).map(|m| m.leader).filter(|&l| l >= 0),
                _ => None,
            };
            Some(leader.unwrap_or(fallback))
        }
        _ => None,
    }
}

fn describe(planned: &Planned, broker: &Option<i32>) -> String {
    let base = match (&planned.target, broker) {
        (Target::Leader(p), Some(b)) => format!("b{b} (leader of p{p})"),
        (_, Some(b)) => format!("b{b}"),
        (target, None) => target.to_string(),
    };
    match planned.kind {
        FaultKind::Loss => format!("{base} {}% loss", planned.amount),
        FaultKind::Latency => format!("{base} +{} ms", planned.amount),
        FaultKind::ZkExpire => format!("{base} | zk"),
        _ => base,
    }
}

fn inject(nodes: &mut Nodes, planned: &Planned, broker: &Option<i32>) -> Result<()> {
    let all: Vec<String> = std::iter::once("zk".to_string()).chain(nodes.ids().iter().map(|b| format!("b{b}"))).collect();
    let label = |b: &Option<i32>| b.map(|b| format!("b{b}"));
    match (planned.kind, &planned.target) {
        (FaultKind::Partition, Target::Side(side)) => {
            let other: Vec<&str> = all.iter().map(String::as_str).filter(|l| !side.iter().any(|s| s == l)).collect();
            let side: Vec<&str> = side.iter().map(String::as_str).collect();
            nodes.net.block(&side, &other)?;
            nodes.net.block(&other, &side)?;
        }
        (FaultKind::Isolate, target) => {
            let node = match target {
                Target::ZooKeeper => "zk".to_string(),
                _ => label(broker).ok_or_else(|| anyhow!("isolate needs a node"))?,
            };
            // Cut off from everything, the clients included.
            let mut rest: Vec<&str> = all.iter().map(String::as_str).filter(|l| *l != node).collect();
            rest.push("clients");
            nodes.net.block(&[&node], &rest)?;
            nodes.net.block(&rest, &[&node])?;
        }
        (FaultKind::OneWay, Target::Link(from, to)) => nodes.net.block(&[from], &[to])?,
        (FaultKind::ZkExpire, _) => {
            let node = label(broker).ok_or_else(|| anyhow!("zk-expire needs a broker"))?;
            nodes.net.block(&["zk"], &[&node])?;
            nodes.net.block(&[&node], &["zk"])?;
        }
        (FaultKind::Loss, _) => {
            let node = label(broker).ok_or_else(|| anyhow!("loss needs a broker"))?;
            let rules = Rules { loss_percent: planned.amount.clamp(1, 99) as u8, ..nodes.net.rules(&node) };
            nodes.net.set_rules(&node, rules)?;
        }
        (FaultKind::Latency, _) => nodes
            .set_delay(broker.ok_or_else(|| anyhow!("latency needs a broker"))?, Duration::from_millis(planned.amount.into()))?,
        (FaultKind::Kill, _) => nodes.kill(broker.ok_or_else(|| anyhow!("kill needs a broker"))?)?,
        (FaultKind::Pause, _) => nodes.pause(broker.ok_or_else(|| anyhow!("pause needs a broker"))?, true)?,
        (FaultKind::Disk, _) => nodes.fill_disk(broker.ok_or_else(|| anyhow!("disk needs a broker"))?, true)?,
        (kind, target) => bail!("{kind} cannot target {target}"),
    }
    Ok(())
}

/// Removes every fault: network rules, delays, a filled disk; paused brokers resume,
/// stopped ones restart on their data dir.
fn heal(nodes: &mut Nodes) -> Result<Vec<String>> {
    nodes.net.heal()?;
    if nodes.has_disk(DISK_BROKER) {
        nodes.fill_disk(DISK_BROKER, false)?;
    }
    nodes.restore()
}
