//! The fault schedule of a chaos run: a pure function of the seed, the duration and
//! the fault kinds, so the same seed gives the same schedule (what a failing run is
//! replayed with). Faults run one at a time: each starts, lasts, heals, and a quiet gap
//! follows. The first faults cover every enabled kind once (in a seeded order), so even
//! a short run exercises each of them.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use anyhow::{bail, Result};
use serde::Serialize;

/// A kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// The nodes split into two sides that cannot reach each other.
    Partition,
    /// One node cut off from every other one.
    Isolate,
    /// Packets from one node to another dropped, the other way delivered.
    OneWay,
    /// A partition leader cut off from ZooKeeper (its session expires) while clients
    /// and the other brokers still reach it.
    ZkExpire,
    /// A share of a broker's inbound packets dropped.
    Loss,
    /// Every byte to and from a broker delayed.
    Latency,
    /// `kill -9` of a broker, restarted on the same data dir after a while.
    Kill,
    /// SIGSTOP of a broker, SIGCONT after a while (past its session timeout at times).
    Pause,
    /// The broker with the small disk finds it full.
    Disk,
}

impl FaultKind {
    pub const ALL: [FaultKind; 9] = [
        FaultKind::Partition,
        FaultKind::Isolate,
        FaultKind::OneWay,
        FaultKind::ZkExpire,
        FaultKind::Loss,
        FaultKind::Latency,
        FaultKind::Kill,
        FaultKind::Pause,
        FaultKind::Disk,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Partition => "partition",
            FaultKind::Isolate => "isolate",
            FaultKind::OneWay => "one-way",
            FaultKind::ZkExpire => "zk-expire",
            FaultKind::Loss => "loss",
            FaultKind::Latency => "latency",
            FaultKind::Kill => "kill",
            FaultKind::Pause => "pause",
            FaultKind::Disk => "disk",
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Parses `--faults`: kind names, plus `netem` (loss and latency) and `all`.
pub fn parse_kinds(list: &str) -> Result<Vec<FaultKind>> {
    let mut kinds = Vec::new();
    for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let add: Vec<FaultKind> = match name {
            "all" => FaultKind::ALL.to_vec(),
            "netem" => vec![FaultKind::Loss, FaultKind::Latency],
            "oneway" | "one-way" => vec![FaultKind::OneWay],
            "zk" | "zk-expire" | "expire" => vec![FaultKind::ZkExpire],
            other => match FaultKind::ALL.iter().find(|k| k.name() == other) {
                Some(&k) => vec![k],
                None => bail!(
                    "unknown fault {other:?}: expected a list of partition, isolate, one-way, zk-expire, loss, latency, netem, kill, pause, disk, all"
                ),
            },
        };
        for k in add {
            if !kinds.contains(&k) {
                kinds.push(k);
            }
        }
    }
    if kinds.is_empty() {
        bail!("no fault kinds given");
    }
    kinds.sort();
    Ok(kinds)
}

impl FromStr for FaultKind {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        let kinds = parse_kinds(s)?;
        match kinds.as_slice() {
            [one] => Ok(*one),
            _ => bail!("{s:?} is not one fault kind"),
        }
    }
}

/// Who a fault hits. Brokers are named by id; `Leader(p)` is whichever broker leads
/// partition `p` when the fault starts (the fault is about leaders; which broker that
/// is depends on the run).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    Broker(i32),
    Leader(i32),
    /// Node labels (`zk`, `b0`...) on one side of a partition; the rest are the other.
    Side(Vec<String>),
    /// Traffic from the first to the second node dropped.
    Link(String, String),
    /// ZooKeeper.
    ZooKeeper,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Broker(id) => write!(f, "broker {id}"),
            Target::Leader(p) => write!(f, "leader of p{p}"),
            Target::Side(side) => write!(f, "{{{}}} | rest", side.join(",")),
            Target::Link(a, b) => write!(f, "{a} -> {b}"),
            Target::ZooKeeper => f.write_str("zookeeper"),
        }
    }
}

/// One scheduled fault.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Planned {
    pub kind: FaultKind,
    pub target: Target,
    /// Offset from the start of the fault phase.
    #[serde(with = "millis")]
    pub start: Duration,
    #[serde(with = "millis")]
    pub length: Duration,
    /// Loss percentage or latency in ms, where the kind has one.
    pub amount: u32,
}

mod millis {
    pub(super) fn serialize<S: serde::Serializer>(d: &std::time::Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }
}

/// A small seeded generator (SplitMix64): the schedule must not change when a
/// dependency's generator does.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `low..=high`.
    pub fn range(&mut self, low: u64, high: u64) -> u64 {
        low + self.next_u64() % (high - low + 1)
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.next_u64() as usize % items.len()]
    }

    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.next_u64() as usize % (i + 1);
            items.swap(i, j);
        }
    }
}

/// Builds the schedule for `brokers` brokers over `duration` of faults.
/// `disk_broker` is the broker with the small disk; `session` the ZooKeeper session
/// timeout (a ZooKeeper cut-off lasts past it, so the session does expire).
pub fn plan(
    seed: u64,
    duration: Duration,
    kinds: &[FaultKind],
    brokers: i32,
    partitions: i32,
    disk_broker: i32,
    session: Duration,
) -> Vec<Planned> {
    let mut rng = Rng::new(seed);
    let mut first: Vec<FaultKind> = kinds.to_vec();
    rng.shuffle(&mut first);
    let mut out = Vec::new();
    let mut at = Duration::ZERO;
    let mut index = 0;
    loop {
        let kind = if index < first.len() { first[index] } else { *rng.pick(kinds) };
        index += 1;
        let secs = |rng: &mut Rng, low: u64, high: u64| Duration::from_millis(rng.range(low * 1000, high * 1000));
        let mut labels: Vec<String> = (0..brokers).map(|b| format!("b{b}")).collect();
        labels.push("zk".into());
        let (target, length, amount) = match kind {
            FaultKind::Partition => {
                let mut nodes = labels.clone();
                rng.shuffle(&mut nodes);
                let cut = rng.range(1, nodes.len() as u64 - 1) as usize;
                let mut side = nodes[..cut].to_vec();
                side.sort();
                (Target::Side(side), secs(&mut rng, 3, 8), 0)
            }
            FaultKind::Isolate => {
                let target = if rng.range(0, 3) == 0 {
                    Target::ZooKeeper
                } else {
                    Target::Leader(rng.range(0, partitions as u64 - 1) as i32)
                };
                (target, secs(&mut rng, 3, 8), 0)
            }
            FaultKind::OneWay => {
                let from = rng.pick(&labels).clone();
                let to = loop {
                    let to = rng.pick(&labels).clone();
                    if to != from {
                        break to;
                    }
                };
                (Target::Link(from, to), secs(&mut rng, 3, 8), 0)
            }
            FaultKind::ZkExpire => {
                let p = rng.range(0, partitions as u64 - 1) as i32;
                (Target::Leader(p), session + secs(&mut rng, 2, 5), 0)
            }
            FaultKind::Loss => {
                (Target::Broker(rng.range(0, brokers as u64 - 1) as i32), secs(&mut rng, 3, 8), rng.range(5, 40) as u32)
            }
            FaultKind::Latency => {
                (Target::Broker(rng.range(0, brokers as u64 - 1) as i32), secs(&mut rng, 3, 8), rng.range(20, 500) as u32)
            }
            FaultKind::Kill => {
                let target = if rng.range(0, 1) == 0 {
                    Target::Leader(rng.range(0, partitions as u64 - 1) as i32)
                } else {
                    Target::Broker(rng.range(0, brokers as u64 - 1) as i32)
                };
                (target, secs(&mut rng, 2, 8), 0)
            }
            FaultKind::Pause => {
                let target = Target::Leader(rng.range(0, partitions as u64 - 1) as i32);
                (target, secs(&mut rng, 1, 8), 0)
            }
            FaultKind::Disk => (Target::Broker(disk_broker), secs(&mut rng, 3, 8), 0),
        };
        // Past the end: stop, unless this is one of the first round, which every run
        // has in full (a short run may run over by a fault or so).
        if at + length > duration && index > first.len() {
            break;
        }
        out.push(Planned { kind, target, start: at, length, amount });
        at += length + secs(&mut rng, 1, 2);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SESSION: Duration = Duration::from_secs(3);

    #[test]
    fn the_same_seed_gives_the_same_schedule_and_another_seed_another() {
        let a = plan(7, Duration::from_secs(600), &FaultKind::ALL, 3, 3, 2, SESSION);
        let b = plan(7, Duration::from_secs(600), &FaultKind::ALL, 3, 3, 2, SESSION);
        let c = plan(8, Duration::from_secs(600), &FaultKind::ALL, 3, 3, 2, SESSION);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn a_short_schedule_covers_every_kind_once_and_fits() {
        // What `cargo xtask test` runs (seed 1, 90 s).
        let plan = plan(1, Duration::from_secs(90), &FaultKind::ALL, 3, 3, 2, SESSION);
        for kind in FaultKind::ALL {
            assert!(plan.iter().any(|p| p.kind == kind), "{kind} missing from {plan:#?}");
        }
        let end = plan.last().map(|p| p.start + p.length).unwrap();
        assert!(end <= Duration::from_secs(100), "{end:?}");
        // Even a schedule too short for one round has every kind once.
        let short = super::plan(1, Duration::from_secs(10), &FaultKind::ALL, 3, 3, 2, SESSION);
        assert_eq!(short.len(), FaultKind::ALL.len(), "{short:#?}");
        for p in &plan {
            if p.kind == FaultKind::ZkExpire {
                assert!(p.length > SESSION, "a ZooKeeper cut-off must outlast the session: {p:?}");
            }
        }
    }

    #[test]
    fn a_long_schedule_has_hundreds_of_faults() {
        let plan = plan(3, Duration::from_secs(1800), &FaultKind::ALL, 3, 3, 2, SESSION);
        assert!(plan.len() >= 200, "{}", plan.len());
    }

    #[test]
    fn fault_lists_parse() {
        assert_eq!(parse_kinds("partition,netem").unwrap(), vec![FaultKind::Partition, FaultKind::Loss, FaultKind::Latency]);
        assert_eq!(parse_kinds("all").unwrap().len(), 9);
        assert!(parse_kinds("partition,flood").unwrap_err().to_string().contains("flood"));
    }
}
