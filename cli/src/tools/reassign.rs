//! `fjord reassign --generate --topics T,.. --brokers B,.. | --execute|--verify|--cancel
//! --plan FILE | --decommission BROKER`:
//! Kafka's `kafka-reassign-partitions` over AlterPartitionReassignments and
//! ListPartitionReassignments, with its reassignment JSON
//! (`{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[1,2,3]}]}`).
//!
//! A partition's optional `log_dirs` (one per replica, in the order of `replicas`:
//! `"any"` or a path among that broker's `log.dirs`) places replicas in log dirs, as
//! Kafka's tool does: after the reassignment is submitted, `--execute` sends
//! AlterReplicaLogDirs to each broker concerned, retrying while a new replica does not
//! exist yet (up to `--timeout`); `--verify` says per replica whether it is in its dir.
//!
//! `--execute --throttle BYTES_PER_SEC` throttles the catch-up of the moves as Kafka's
//! tool does: each moving partition gets `leader.replication.throttled.replicas` on its
//! current replicas and `follower.replication.throttled.replicas` on its new ones, and
//! every broker involved gets the rate as `leader.replication.throttled.rate` and
//! `follower.replication.throttled.rate`. `--verify` removes them once every move of the
//! plan is complete.
//!
//! `--generate` only prints: the current assignment of the topics and a proposed one
//! spreading their replicas over the given brokers ([`generate_plan`]), both in the plan
//! format, to save and pass to `--execute --plan`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{ArgGroup, Args};
use fjord_client::{Admin, ConfigResource, LogDirDescription, ResponseError};
use serde_json::{json, Value};

use super::ConnectArgs;

#[derive(Args, Debug)]
#[command(group(ArgGroup::new("action").required(true).args(["generate", "execute", "verify", "cancel", "decommission"])))]
pub(crate) struct ReassignArgs {
    #[command(flatten)]
    connect: ConnectArgs,
    /// Print the current assignment of --topics and a proposed one over --brokers
    /// (nothing is changed).
    #[arg(long, requires_all = ["topics", "brokers"])]
    generate: bool,
    /// With --generate: the topics to move.
    #[arg(long, value_delimiter = ',', value_name = "TOPIC,...")]
    topics: Vec<String>,
    /// With --generate: the brokers to spread their replicas over.
    #[arg(long, value_delimiter = ',', value_name = "BROKER,...", allow_hyphen_values = true)]
    brokers: Vec<i32>,
    /// Start the reassignments of the plan.
    #[arg(long, requires = "plan")]
    execute: bool,
    /// Say, per partition of the plan, whether its reassignment completed.
    #[arg(long, requires = "plan")]
    verify: bool,
    /// Cancel the reassignments of the plan that are in progress.
    #[arg(long, requires = "plan")]
    cancel: bool,
    /// The reassignment JSON file (Kafka's format).
    #[arg(long, visible_alias = "reassignment-json-file", value_name = "FILE")]
    plan: Option<PathBuf>,
    /// With --execute: throttle the replication of the moves to this many bytes per
    /// second (on every broker involved); --verify removes the throttle once done.
    #[arg(long, requires = "execute", value_name = "BYTES_PER_SEC", allow_hyphen_values = true)]
    throttle: Option<String>,
    /// With --execute: how long to wait, in ms, for each replica the plan puts in a log
    /// dir to exist on its broker (a replica the reassignment adds is created once it
    /// starts) before giving up on moving it there.
    #[arg(long, requires = "execute", value_name = "MS", default_value_t = 10_000)]
    timeout: u64,
    /// Move every replica off this broker (each to the live broker with the fewest
    /// replicas that does not hold the partition yet), so it can be retired; prints the plan.
    #[arg(long, value_name = "BROKER")]
    decommission: Option<i32>,
}

/// One partition of a plan: (topic, partition, target replicas).
type Move = (String, i32, Vec<i32>);

/// A replica a plan puts in a given log dir: (topic, partition, broker, log dir).
type ReplicaDir = (String, i32, i32, String);

/// A plan's `log_dirs` entry that leaves the replica's dir to the broker.
const ANY_LOG_DIR: &str = "any";

/// Reads Kafka's reassignment JSON: the moves, and the replicas whose `log_dirs` entry
/// names a dir (not `"any"`).
fn parse_plan(text: &str) -> anyhow::Result<(Vec<Move>, Vec<ReplicaDir>)> {
    let document: Value = serde_json::from_str(text).context("not JSON")?;
    let partitions = document.get("partitions").and_then(Value::as_array).context("no \"partitions\" array")?;
    let mut moves = Vec::new();
    let mut dirs = Vec::new();
    for p in partitions {
        let topic = p.get("topic").and_then(Value::as_str).context("a partition without \"topic\"")?;
        let partition = p.get("partition").and_then(Value::as_i64).context("a partition without \"partition\"")?;
        let partition = i32::try_from(partition).context("partition out of range")?;
        let replicas = p
            .get("replicas")
            .and_then(Value::as_array)
            .context("a partition without \"replicas\"")?
            .iter()
            .map(|r| r.as_i64().and_then(|r| i32::try_from(r).ok()).context("a replica that is not a broker id"))
            .collect::<anyhow::Result<Vec<i32>>>()?;
        if let Some(log_dirs) = p.get("log_dirs") {
            let log_dirs = log_dirs
                .as_array()
                .with_context(|| format!("{topic}-{partition}: \"log_dirs\" is not an array"))?
                .iter()
                .map(|d| d.as_str().with_context(|| format!("{topic}-{partition}: a log dir that is not a string: {d}")))
                .collect::<anyhow::Result<Vec<&str>>>()?;
            if log_dirs.len() != replicas.len() {
                bail!(
                    "{topic}-{partition}: \"log_dirs\" has {} entries but \"replicas\" has {}: one log dir (or \"any\") per replica",
                    log_dirs.len(),
                    replicas.len()
                );
            }
            for (&broker, &dir) in replicas.iter().zip(&log_dirs) {
                if dir != ANY_LOG_DIR {
                    dirs.push((topic.to_owned(), partition, broker, dir.to_owned()));
                }
            }
        }
        moves.push((topic.to_owned(), partition, replicas));
    }
    Ok((moves, dirs))
}

/// Kafka's reassignment JSON of `moves`.
fn plan_json(moves: &[Move]) -> String {
    let partitions: Vec<Value> = moves
        .iter()
        .map(|(topic, partition, replicas)| json!({"topic": topic, "partition": partition, "replicas": replicas}))
        .collect();
    json!({"version": 1, "partitions": partitions}).to_string()
}

/// A new assignment of `topics` (each: its current replicas, by partition) over
/// `brokers`, keeping each topic's replication factor: Kafka's rack-unaware placement,
/// without its random start. Partition `p` is led by the broker after the previous
/// partition's leader (the rotation goes on across topics, so leaders spread over all
/// the brokers), and its followers come after the leader at a distance that grows by one
/// every time the leaders went once round, so followers spread as well.
fn generate_plan(topics: &[(String, Vec<Vec<i32>>)], brokers: &[i32]) -> anyhow::Result<Vec<Move>> {
    let mut brokers = brokers.to_vec();
    brokers.sort_unstable();
    if let Some(twice) = brokers.windows(2).find(|w| w[0] == w[1]) {
        bail!("--brokers names broker {} twice", twice[0]);
    }
    let n = brokers.len();
    let mut moves = Vec::new();
    let mut next_leader = 0usize;
    for (topic, partitions) in topics {
        let rf = partitions.first().map_or(0, Vec::len);
        if rf > n {
            bail!("{topic} has {rf} replicas per partition but --brokers names only {n} broker(s)");
        }
        for (p, _) in partitions.iter().enumerate() {
            let first = next_leader % n;
            let shift = next_leader / n;
            next_leader += 1;
            let mut replicas = vec![brokers[first]];
            for j in 0..rf.saturating_sub(1) {
                let distance = 1 + (shift + j) % (n - 1);
                replicas.push(brokers[(first + distance) % n]);
            }
            moves.push((topic.clone(), p as i32, replicas));
        }
    }
    Ok(moves)
}

/// The topic and broker keys of the replication throttles.
const LEADER_REPLICAS: &str = "leader.replication.throttled.replicas";
const FOLLOWER_REPLICAS: &str = "follower.replication.throttled.replicas";
const LEADER_RATE: &str = "leader.replication.throttled.rate";
const FOLLOWER_RATE: &str = "follower.replication.throttled.rate";

/// `--throttle`: a non-negative whole number of bytes per second.
fn parse_throttle(text: &str) -> anyhow::Result<u64> {
    match text.trim().parse::<i64>() {
        Ok(rate) if rate >= 0 => Ok(rate as u64),
        Ok(_) => bail!("--throttle {text}: the rate must not be negative (bytes per second)"),
        Err(_) => bail!("--throttle {text}: not a number of bytes per second"),
    }
}

/// The throttles of `moves` (Kafka's rule): per topic, its
/// `leader.replication.throttled.replicas` (every current replica of each moving
/// partition: whichever leads it sends) and `follower.replication.throttled.replicas`
/// (each new replica: it fetches), and the brokers involved, which get the rates.
/// A partition whose replicas do not change is no move.
fn throttles(moves: &[Move], current: &[Move]) -> (BTreeMap<String, (String, String)>, BTreeSet<i32>) {
    let mut lists: BTreeMap<String, (Vec<String>, Vec<String>)> = BTreeMap::new();
    let mut brokers = BTreeSet::new();
    for (topic, partition, target) in moves {
        let Some((_, _, now)) = current.iter().find(|(t, p, _)| t == topic && p == partition) else { continue };
        if now == target {
            continue;
        }
        let (leader, follower) = lists.entry(topic.clone()).or_default();
        leader.extend(now.iter().map(|b| format!("{partition}:{b}")));
        follower.extend(target.iter().filter(|b| !now.contains(b)).map(|b| format!("{partition}:{b}")));
        brokers.extend(now.iter().chain(target));
    }
    let lists = lists.into_iter().map(|(topic, (leader, follower))| (topic, (leader.join(","), follower.join(",")))).collect();
    (lists, brokers)
}

/// Refuses a plan naming a partition that does not exist or a broker that is not live,
/// before anything is changed.
fn check_plan(moves: &[Move], current: &[Move], live: &[i32]) -> anyhow::Result<()> {
    for (topic, partition, replicas) in moves {
        if !current.iter().any(|(t, p, _)| t == topic && p == partition) {
            bail!("{topic}-{partition} does not exist");
        }
        if let Some(unknown) = replicas.iter().find(|b| !live.contains(b)) {
            bail!("{topic}-{partition}: broker {unknown} is not a live broker (live: {live:?})");
        }
    }
    Ok(())
}

/// A log dir path as compared with the broker's: without trailing slashes.
fn dir_key(path: &str) -> &str {
    match path.trim_end_matches('/') {
        "" => "/",
        trimmed => trimmed,
    }
}

/// Refuses replica dirs naming a replica that is not in the plan's replicas of its
/// partition (the plan format rules this out; a decommission has none) or a dir that is
/// not one of its broker's log dirs (`broker_dirs`), before anything is changed.
fn check_dirs(dirs: &[ReplicaDir], broker_dirs: &BTreeMap<i32, Vec<LogDirDescription>>) -> anyhow::Result<()> {
    for (topic, partition, broker, dir) in dirs {
        let known = broker_dirs.get(broker).map(Vec::as_slice).unwrap_or_default();
        if !known.iter().any(|d| dir_key(&d.path) == dir_key(dir)) {
            let paths: Vec<&str> = known.iter().map(|d| d.path.as_str()).collect();
            bail!("{topic}-{partition}: broker {broker} has no log dir {dir} (its log dirs: {paths:?})");
        }
    }
    Ok(())
}

/// The log dirs of every broker `dirs` names, each with its replicas of their partitions.
async fn describe_dirs(admin: &Admin, dirs: &[ReplicaDir]) -> anyhow::Result<BTreeMap<i32, Vec<LogDirDescription>>> {
    let mut partitions: BTreeMap<i32, Vec<(String, i32)>> = BTreeMap::new();
    for (topic, partition, broker, _) in dirs {
        partitions.entry(*broker).or_default().push((topic.clone(), *partition));
    }
    let mut described = BTreeMap::new();
    for (broker, partitions) in partitions {
        let dirs = admin.describe_log_dirs(broker, &partitions).await.with_context(|| format!("broker {broker}"))?;
        described.insert(broker, dirs);
    }
    Ok(described)
}

/// How often `--execute` asks again to move a replica its broker does not hold yet.
const REPLICA_WAIT_BACKOFF: Duration = Duration::from_millis(200);

/// Asks each broker of `dirs` to move its replicas into their dirs (AlterReplicaLogDirs),
/// again every [`REPLICA_WAIT_BACKOFF`] for a replica the broker does not hold yet (one
/// the reassignment adds), for up to `timeout`, as Kafka's tool does.
async fn place_replicas(admin: &Admin, dirs: &[ReplicaDir], timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    let mut pending = dirs.to_vec();
    loop {
        let mut by_broker: BTreeMap<i32, Vec<(String, i32, String)>> = BTreeMap::new();
        for (topic, partition, broker, dir) in &pending {
            by_broker.entry(*broker).or_default().push((topic.clone(), *partition, dir.clone()));
        }
        let mut waiting = Vec::new();
        for (broker, asked) in by_broker {
            for ((topic, partition), outcome) in admin.alter_replica_log_dirs(broker, &asked).await? {
                let dir = asked.iter().find(|(t, p, _)| *t == topic && *p == partition).map(|(_, _, d)| d.clone());
                let dir = dir.context("the broker answered for a partition not asked")?;
                match outcome {
                    Ok(()) => println!("Moving the replica of {topic}-{partition} on broker {broker} to log dir {dir}"),
                    Err(e) if e.code() == Some(ResponseError::ReplicaNotAvailable) => {
                        waiting.push((topic, partition, broker, dir))
                    }
                    Err(e) => return Err(e).context("moving a replica to its log dir"),
                }
            }
        }
        if waiting.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let names: Vec<String> = waiting.iter().map(|(t, p, b, _)| format!("{t}-{p} on broker {b}")).collect();
            bail!(
                "the replicas of {} did not exist within {timeout:?} (--timeout), so they were not moved to their log dirs; \
                 run --execute again once the reassignment has created them",
                names.join(", ")
            );
        }
        tokio::time::sleep(REPLICA_WAIT_BACKOFF).await;
        pending = waiting;
    }
}

/// Where a replica of a plan's `log_dirs` is, against where the plan wants it.
#[derive(Debug, PartialEq, Eq)]
enum DirState {
    /// In the dir asked for.
    Done,
    /// Elsewhere (`current`, `None` while the broker holds no replica yet), with a copy
    /// being written into the dir asked for, or not (`copying`).
    Pending { current: Option<String>, copying: bool },
}

/// Where `topic`-`partition` is among a broker's `dirs`, against `wanted`.
fn dir_state(dirs: &[LogDirDescription], topic: &str, partition: i32, wanted: &str) -> DirState {
    let holds = |d: &&LogDirDescription, future: bool| {
        d.replicas.iter().any(|r| r.topic == topic && r.partition == partition && r.is_future == future)
    };
    let current = dirs.iter().find(|d| holds(d, false)).map(|d| d.path.clone());
    if current.as_deref().is_some_and(|c| dir_key(c) == dir_key(wanted)) {
        return DirState::Done;
    }
    let copying = dirs.iter().any(|d| holds(&d, true) && dir_key(&d.path) == dir_key(wanted));
    DirState::Pending { current, copying }
}

/// Sets the throttles of `moves` to `rate` bytes per second.
async fn set_throttles(admin: &Admin, moves: &[Move], current: &[Move], rate: u64) -> anyhow::Result<()> {
    let (lists, brokers) = throttles(moves, current);
    for (topic, (leader, follower)) in &lists {
        let changes =
            [(LEADER_REPLICAS.to_owned(), Some(leader.clone())), (FOLLOWER_REPLICAS.to_owned(), Some(follower.clone()))];
        admin.incremental_alter_configs(&ConfigResource::Topic(topic.clone()), &changes).await?;
    }
    for &broker in &brokers {
        let changes = [(LEADER_RATE.to_owned(), Some(rate.to_string())), (FOLLOWER_RATE.to_owned(), Some(rate.to_string()))];
        admin.incremental_alter_configs(&ConfigResource::Broker(broker), &changes).await?;
    }
    println!("The inter-broker throttle limit was set to {rate} B/s on brokers {brokers:?}");
    Ok(())
}

/// Removes the throttles of the plan's topics and the rates of every live broker.
async fn clear_throttles(admin: &Admin, moves: &[Move], live: &[i32]) -> anyhow::Result<()> {
    let topics: BTreeSet<&String> = moves.iter().map(|(t, _, _)| t).collect();
    for topic in topics {
        let changes = [(LEADER_REPLICAS.to_owned(), None), (FOLLOWER_REPLICAS.to_owned(), None)];
        admin.incremental_alter_configs(&ConfigResource::Topic(topic.clone()), &changes).await?;
    }
    for &broker in live {
        let changes = [(LEADER_RATE.to_owned(), None), (FOLLOWER_RATE.to_owned(), None)];
        admin.incremental_alter_configs(&ConfigResource::Broker(broker), &changes).await?;
    }
    println!("Throttle was removed.");
    Ok(())
}

/// The moves that take every replica off `broker`: each partition holding it gets, in its
/// place, the live broker with the fewest replicas that does not hold the partition yet.
fn decommission_plan(broker: i32, live: &[i32], current: &[Move]) -> anyhow::Result<Vec<Move>> {
    let mut load: BTreeMap<i32, usize> = live.iter().filter(|&&b| b != broker).map(|&b| (b, 0)).collect();
    for (_, _, replicas) in current {
        for r in replicas {
            if let Some(n) = load.get_mut(r) {
                *n += 1;
            }
        }
    }
    let mut moves = Vec::new();
    for (topic, partition, replicas) in current.iter().filter(|(_, _, r)| r.contains(&broker)) {
        let Some((&to, _)) = load.iter().filter(|(b, _)| !replicas.contains(b)).min_by_key(|(b, n)| (**n, **b)) else {
            bail!("no live broker can take {topic}-{partition} off broker {broker} (it is on {replicas:?})");
        };
        *load.entry(to).or_default() += 1;
        let target = replicas.iter().map(|&r| if r == broker { to } else { r }).collect();
        moves.push((topic.clone(), *partition, target));
    }
    Ok(moves)
}

pub(crate) async fn run(args: ReassignArgs) -> anyhow::Result<()> {
    let throttle = args.throttle.as_deref().map(parse_throttle).transpose()?;
    let admin = Admin::connect(args.connect.client()?).await?;
    let metadata = admin.metadata().await?;
    let mut current: Vec<Move> = metadata
        .topics
        .values()
        .flat_map(|t| t.partitions.iter().map(|p| (t.name.clone(), p.partition, p.replicas.clone())))
        .collect();
    current.sort();
    let mut live: Vec<i32> = metadata.brokers.keys().copied().collect();
    live.sort_unstable();
    if args.generate {
        let mut topics = Vec::new();
        for topic in &args.topics {
            let Some(described) = metadata.topics.get(topic) else { bail!("--topics: topic {topic} does not exist") };
            let mut partitions: Vec<(i32, Vec<i32>)> =
                described.partitions.iter().map(|p| (p.partition, p.replicas.clone())).collect();
            partitions.sort();
            topics.push((topic.clone(), partitions.into_iter().map(|(_, r)| r).collect::<Vec<_>>()));
        }
        if let Some(unknown) = args.brokers.iter().find(|b| !live.contains(b)) {
            bail!("--brokers: broker {unknown} is not a live broker (live: {live:?})");
        }
        let proposed = generate_plan(&topics, &args.brokers)?;
        let named: Vec<Move> = current.iter().filter(|(t, _, _)| args.topics.contains(t)).cloned().collect();
        println!("Current partition replica assignment\n{}\n", plan_json(&named));
        println!("Proposed partition reassignment configuration\n{}", plan_json(&proposed));
        return Ok(());
    }
    let (moves, dirs) = match (&args.plan, args.decommission) {
        (_, Some(broker)) => {
            let moves = decommission_plan(broker, &live, &current)?;
            println!("Proposed partition reassignment configuration\n{}", plan_json(&moves));
            (moves, Vec::new())
        }
        (Some(path), None) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("--plan {}", path.display()))?;
            parse_plan(&text).with_context(|| format!("--plan {}", path.display()))?
        }
        (None, None) => bail!("--plan FILE is required"),
    };
    let names = |moves: &[Move]| moves.iter().map(|(t, p, _)| format!("{t}-{p}")).collect::<Vec<_>>().join(",");
    if args.verify {
        let in_progress = admin.list_partition_reassignments().await?;
        println!("Status of partition reassignment:");
        let mut mismatched = 0;
        for (topic, partition, target) in &moves {
            let replicas = current.iter().find(|(t, p, _)| t == topic && p == partition).map(|(_, _, r)| r);
            if in_progress.iter().any(|r| &r.topic == topic && r.partition == *partition) {
                println!("Reassignment of partition {topic}-{partition} is still in progress.");
            } else if replicas == Some(target) {
                println!("Reassignment of partition {topic}-{partition} is completed.");
            } else {
                mismatched += 1;
                println!(
                    "There is no active reassignment of partition {topic}-{partition}, but replica set is {replicas:?} rather than {target:?}."
                );
            }
        }
        let mut dirs_pending = false;
        if !dirs.is_empty() {
            println!("Status of replica log dir movement:");
            let described = describe_dirs(&admin, &dirs).await?;
            for (topic, partition, broker, dir) in &dirs {
                let broker_dirs = described.get(broker).map(Vec::as_slice).unwrap_or_default();
                let replica = format!("{topic}-{partition} on broker {broker}");
                match dir_state(broker_dirs, topic, *partition, dir) {
                    DirState::Done => println!("The replica of {replica} is in log dir {dir}: completed."),
                    DirState::Pending { current, copying } => {
                        dirs_pending = true;
                        let now = match (current, copying) {
                            (None, _) => "the broker holds no replica yet".to_owned(),
                            (Some(c), true) => format!("it is in {c}, its copy in {dir} is being written"),
                            (Some(c), false) => format!("it is in {c}"),
                        };
                        println!("The move of the replica of {replica} to log dir {dir} is still in progress ({now}).");
                    }
                }
            }
        }
        if mismatched > 0 {
            bail!("{mismatched} partition(s) of the plan are not on their target replicas");
        }
        // Kafka's tool keeps the throttle while any move is still under way.
        if !dirs_pending && !moves.iter().any(|(t, p, _)| in_progress.iter().any(|r| &r.topic == t && r.partition == *p)) {
            clear_throttles(&admin, &moves, &live).await?;
        }
        return Ok(());
    }
    if moves.is_empty() {
        println!("Nothing to reassign.");
        return Ok(());
    }
    let cancel = args.cancel;
    if !cancel {
        check_plan(&moves, &current, &live)?;
        check_dirs(&dirs, &describe_dirs(&admin, &dirs).await?)?;
    }
    if !cancel {
        // Kafka prints what to roll back to.
        let rollback: Vec<Move> =
            current.iter().filter(|(t, p, _)| moves.iter().any(|(mt, mp, _)| mt == t && mp == p)).cloned().collect();
        println!("Current partition replica assignment\n\n{}\n", plan_json(&rollback));
        println!("Save this to use as the --plan FILE during rollback");
    }
    if let Some(rate) = throttle {
        set_throttles(&admin, &moves, &current, rate).await?;
    }
    let asked: Vec<(String, i32, Option<Vec<i32>>)> =
        moves.iter().map(|(t, p, r)| (t.clone(), *p, (!cancel).then(|| r.clone()))).collect();
    let outcomes = admin.alter_partition_reassignments(&asked).await?;
    let mut failed = 0;
    for ((topic, partition), outcome) in &outcomes {
        if let Err(e) = outcome {
            failed += 1;
            eprintln!("{topic}-{partition}: {e}");
        }
    }
    if failed > 0 {
        bail!("{failed} of {} partition reassignment(s) refused", outcomes.len());
    }
    match cancel {
        true => println!("Successfully cancelled partition reassignments for: {}", names(&moves)),
        false => println!("Successfully started partition reassignments for {}", names(&moves)),
    }
    if !cancel && !dirs.is_empty() {
        place_replicas(&admin, &dirs, Duration::from_millis(args.timeout)).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kafkas_plan_format_round_trips() {
        let text =
            r#"{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[2,3,4],"log_dirs":["any","any","any"]}]}"#;
        let (moves, dirs) = parse_plan(text).unwrap();
        assert_eq!(moves, vec![("t".to_owned(), 0, vec![2, 3, 4])]);
        assert!(dirs.is_empty(), "\"any\" leaves the dir to the broker");
        assert_eq!(parse_plan(&plan_json(&moves)).unwrap(), (moves, Vec::new()));
        assert!(parse_plan(r#"{"version":1}"#).is_err());
        assert!(parse_plan(r#"{"partitions":[{"topic":"t","partition":0,"replicas":["a"]}]}"#).is_err());
    }

    #[test]
    fn log_dirs_name_the_dir_of_each_replica_in_the_order_of_the_replicas() {
        let text = r#"{"version":1,"partitions":[
            {"topic":"t","partition":0,"replicas":[2,3],"log_dirs":["any","/d/b"]},
            {"topic":"t","partition":1,"replicas":[3,1]}]}"#;
        let (moves, dirs) = parse_plan(text).unwrap();
        assert_eq!(moves.len(), 2);
        assert_eq!(dirs, vec![("t".to_owned(), 0, 3, "/d/b".to_owned())]);
        // One entry per replica, or the plan is refused before anything is submitted.
        let short = r#"{"partitions":[{"topic":"t","partition":0,"replicas":[2,3],"log_dirs":["/d/b"]}]}"#;
        let e = parse_plan(short).unwrap_err().to_string();
        assert!(e.contains("t-0: \"log_dirs\" has 1 entries but \"replicas\" has 2"), "{e}");
        let not_text = r#"{"partitions":[{"topic":"t","partition":0,"replicas":[2],"log_dirs":[7]}]}"#;
        assert!(parse_plan(not_text).unwrap_err().to_string().contains("not a string"));
    }

    fn log_dir(path: &str, replicas: &[(&str, i32, bool)]) -> LogDirDescription {
        LogDirDescription {
            path: path.to_owned(),
            offline: false,
            replicas: replicas
                .iter()
                .map(|&(topic, partition, is_future)| fjord_client::ReplicaLogDir {
                    topic: topic.to_owned(),
                    partition,
                    size: 0,
                    is_future,
                })
                .collect(),
        }
    }

    #[test]
    fn a_replica_is_done_only_once_it_serves_from_its_dir() {
        let moving = [log_dir("/a", &[("t", 0, false)]), log_dir("/b/", &[("t", 0, true)])];
        assert_eq!(dir_state(&moving, "t", 0, "/b"), DirState::Pending { current: Some("/a".into()), copying: true });
        let moved = [log_dir("/a", &[]), log_dir("/b/", &[("t", 0, false)])];
        assert_eq!(dir_state(&moved, "t", 0, "/b"), DirState::Done, "a trailing slash names the same dir");
        assert_eq!(dir_state(&moved, "t", 1, "/b"), DirState::Pending { current: None, copying: false });
        assert_eq!(dir_state(&moved, "t", 0, "/a"), DirState::Pending { current: Some("/b/".into()), copying: false });

        let dirs = vec![("t".to_owned(), 0, 1, "/b".to_owned())];
        assert!(check_dirs(&dirs, &BTreeMap::from([(1, moved.to_vec())])).is_ok());
        let e = check_dirs(&dirs, &BTreeMap::from([(1, vec![log_dir("/a", &[])])])).unwrap_err().to_string();
        assert!(e.contains("broker 1 has no log dir /b"), "{e}");
    }

    #[test]
    fn throttles_go_on_the_current_replicas_as_leaders_and_the_new_ones_as_followers() {
        let current = vec![("a".to_owned(), 0, vec![1, 2]), ("a".to_owned(), 1, vec![2, 3]), ("b".to_owned(), 0, vec![1])];
        let moves = vec![("a".to_owned(), 0, vec![2, 4]), ("a".to_owned(), 1, vec![2, 3]), ("b".to_owned(), 0, vec![1, 3])];
        let (lists, brokers) = throttles(&moves, &current);
        // a-1 does not move: no entries for it.
        assert_eq!(lists["a"], ("0:1,0:2".to_owned(), "0:4".to_owned()));
        assert_eq!(lists["b"], ("0:1".to_owned(), "0:3".to_owned()));
        assert_eq!(brokers, [1, 2, 3, 4].into());
        assert!(throttles(&current, &current).0.is_empty(), "nothing moves: nothing throttled");
    }

    #[test]
    fn bad_throttles_and_plans_are_refused_before_anything_changes() {
        assert_eq!(parse_throttle("2000000").unwrap(), 2_000_000);
        assert!(parse_throttle("-1").unwrap_err().to_string().contains("must not be negative"));
        assert!(parse_throttle("2MB").unwrap_err().to_string().contains("not a number"));
        let current = vec![("a".to_owned(), 0, vec![1, 2])];
        assert!(check_plan(&[("a".to_owned(), 0, vec![2, 3])], &current, &[1, 2, 3]).is_ok());
        let e = check_plan(&[("a".to_owned(), 0, vec![2, 9])], &current, &[1, 2, 3]).unwrap_err();
        assert!(e.to_string().contains("broker 9 is not a live broker"), "{e}");
        let e = check_plan(&[("a".to_owned(), 1, vec![2])], &current, &[1, 2, 3]).unwrap_err();
        assert!(e.to_string().contains("a-1 does not exist"), "{e}");
    }

    #[test]
    fn generated_plans_rotate_leaders_and_spread_followers_keeping_the_replication_factor() {
        let topics = vec![("a".to_owned(), vec![vec![1, 2]; 4]), ("b".to_owned(), vec![vec![1]; 2])];
        let moves = generate_plan(&topics, &[3, 1, 2]).unwrap();
        let replicas: Vec<(&str, i32, &[i32])> = moves.iter().map(|(t, p, r)| (t.as_str(), *p, r.as_slice())).collect();
        assert_eq!(
            replicas,
            vec![
                ("a", 0, &[1, 2][..]),
                ("a", 1, &[2, 3][..]),
                ("a", 2, &[3, 1][..]),
                // Round two: the followers move one further.
                ("a", 3, &[1, 3][..]),
                // The leader rotation goes on into the next topic; its factor is 1.
                ("b", 0, &[2][..]),
                ("b", 1, &[3][..]),
            ]
        );
        // Three partitions of factor 3 on three brokers: each broker leads one and
        // holds all three.
        let full = generate_plan(&[("c".to_owned(), vec![vec![1, 2, 3]; 3])], &[1, 2, 3]).unwrap();
        let leaders: BTreeSet<i32> = full.iter().map(|(_, _, r)| r[0]).collect();
        assert_eq!(leaders, [1, 2, 3].into());
        assert!(full.iter().all(|(_, _, r)| r.iter().collect::<BTreeSet<_>>().len() == 3));
        assert!(generate_plan(&topics, &[1]).unwrap_err().to_string().contains("only 1 broker"));
        assert!(generate_plan(&topics, &[1, 2, 2]).unwrap_err().to_string().contains("twice"));
    }

    #[test]
    fn decommissioning_replaces_the_broker_with_the_least_loaded_one_not_holding_the_partition() {
        let current =
            vec![("a".to_owned(), 0, vec![1, 2, 3]), ("a".to_owned(), 1, vec![2, 3, 4]), ("b".to_owned(), 0, vec![1, 4])];
        let moves = decommission_plan(1, &[1, 2, 3, 4], &current).unwrap();
        // Loads without 1: 2 -> 2, 3 -> 2, 4 -> 2. a-0 takes 4 (the only one free); b-0 then
        // takes 2 (2 and 3 tie at 2, 4 holds b-0): the lowest id wins a tie.
        assert_eq!(moves, vec![("a".to_owned(), 0, vec![4, 2, 3]), ("b".to_owned(), 0, vec![2, 4])]);
        assert!(decommission_plan(1, &[1, 2, 3], &current[..1]).is_err(), "nowhere to go");
        assert!(decommission_plan(9, &[1, 2, 3, 4], &current).unwrap().is_empty());
    }
}
