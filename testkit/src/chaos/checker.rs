//! The checker: a pure function from a history to the anomalies in it.
//!
//! The ground truth is the final read of every partition, taken after every fault healed.
//! Against it, and against each other, the checker holds what the clients saw:
//!
//! | kind | what it means | a violation? |
//! |---|---|---|
//! | `lost_write` | an acks=all write was acknowledged, and its value is in no partition | yes |
//! | `duplicate` | a value of an idempotent producer is stored at two offsets | yes |
//! | `offset_conflict` | one offset was seen (acknowledged, read or stored) with two values | yes |
//! | `order` | an acks=all value is stored away from the offset it was acknowledged at, or a write acknowledged before another was even sent got the higher offset | yes |
//! | `read_vanished` | a consumer read a record the final log does not hold at that offset | yes |
//! | `consumer_skip` | a consumer jumped over offsets the log holds, within one generation | yes |
//! | `consumer_back` | a consumer went back to an offset it had passed, within one generation | yes |
//! | `commit_backwards` | a group's committed offset went down: a commit invoked after another completed committed less | yes |
//! | `txn_lost` | a transaction's commit was acknowledged, and a value it wrote is not in the final read_committed read | yes |
//! | `txn_aborted_read` | a value of a transaction whose abort was acknowledged was given to a read_committed reader | yes |
//! | `txn_partial` | read_committed readers see some values of a transaction and not the others | yes |
//! | `acks1_lost` | an acks=1 write was acknowledged and is not where it was acknowledged | no: what acks=1 risks |
//!
//! The transactions topic has its own ground truth, the final read_committed read of each
//! of its partitions. Against it, `duplicate` (a value stored twice), `read_vanished` (a
//! read_committed poll the final read does not back), `consumer_skip` and `consumer_back`
//! are checked too; their details name the transactions topic.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use anyhow::{bail, Result};
use serde::Serialize;

use super::history::{Acks, Decision, Event, Outcome, TxnWrite};

/// The kinds of anomaly, in the order reports list them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AnomalyKind {
    LostWrite,
    Duplicate,
    OffsetConflict,
    Order,
    ReadVanished,
    ConsumerSkip,
    ConsumerBack,
    CommitBackwards,
    TxnLost,
    TxnAbortedRead,
    TxnPartial,
    Acks1Lost,
}

impl AnomalyKind {
    /// Every kind, in report order.
    pub const ALL: [AnomalyKind; 12] = [
        AnomalyKind::LostWrite,
        AnomalyKind::Duplicate,
        AnomalyKind::OffsetConflict,
        AnomalyKind::Order,
        AnomalyKind::ReadVanished,
        AnomalyKind::ConsumerSkip,
        AnomalyKind::ConsumerBack,
        AnomalyKind::CommitBackwards,
        AnomalyKind::TxnLost,
        AnomalyKind::TxnAbortedRead,
        AnomalyKind::TxnPartial,
        AnomalyKind::Acks1Lost,
    ];

    /// The name in reports and JSON.
    pub fn name(self) -> &'static str {
        match self {
            AnomalyKind::LostWrite => "lost_write",
            AnomalyKind::Duplicate => "duplicate",
            AnomalyKind::OffsetConflict => "offset_conflict",
            AnomalyKind::Order => "order",
            AnomalyKind::ReadVanished => "read_vanished",
            AnomalyKind::ConsumerSkip => "consumer_skip",
            AnomalyKind::ConsumerBack => "consumer_back",
            AnomalyKind::CommitBackwards => "commit_backwards",
            AnomalyKind::TxnLost => "txn_lost",
            AnomalyKind::TxnAbortedRead => "txn_aborted_read",
            AnomalyKind::TxnPartial => "txn_partial",
            AnomalyKind::Acks1Lost => "acks1_lost",
        }
    }

    /// Whether an anomaly of this kind breaks a guarantee (everything but what acks=1
    /// documents it may lose).
    pub fn is_violation(self) -> bool {
        self != AnomalyKind::Acks1Lost
    }
}

impl fmt::Display for AnomalyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One anomaly, with what shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Anomaly {
    pub kind: AnomalyKind,
    pub partition: i32,
    pub detail: String,
}

/// What the checker found in a history.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Client operations (produces, polls, commits).
    pub operations: usize,
    /// Acknowledged acks=all writes and acks=1 writes.
    pub acked_all: usize,
    pub acked_one: usize,
    /// Produces whose outcome the client could not know.
    pub indeterminate: usize,
    /// Records delivered to consumers (read_committed ones included).
    pub records_read: usize,
    /// Transactions whose commit, and whose abort, was acknowledged.
    pub committed: usize,
    pub aborted: usize,
    pub faults: usize,
    pub anomalies: Vec<Anomaly>,
}

impl Report {
    /// How many anomalies of `kind`.
    pub fn count(&self, kind: AnomalyKind) -> usize {
        self.anomalies.iter().filter(|a| a.kind == kind).count()
    }

    /// Anomalies that break a guarantee.
    pub fn violations(&self) -> usize {
        self.anomalies.iter().filter(|a| a.kind.is_violation()).count()
    }

    /// Counts per kind, every kind present (zeros included).
    pub fn counts(&self) -> BTreeMap<&'static str, usize> {
        AnomalyKind::ALL.iter().map(|&k| (k.name(), self.count(k))).collect()
    }
}

/// Where an observation of an offset's value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Acked,
    Read,
    Stored,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Source::Acked => "acknowledged",
            Source::Read => "read",
            Source::Stored => "stored",
        })
    }
}

/// Checks a history. Fails (rather than report a clean run) when the history cannot be
/// judged: a partition that was written to has no final read.
pub fn check(events: &[Event]) -> Result<Report> {
    let mut report = Report::default();
    // partition -> offset -> value, from the final reads.
    let mut stored: BTreeMap<i32, BTreeMap<i64, &str>> = BTreeMap::new();
    // value -> every (partition, offset) holding it.
    let mut positions: HashMap<&str, Vec<(i32, i64)>> = HashMap::new();
    for event in events {
        if let Event::FinalRead(read) = event {
            if stored.contains_key(&read.partition) {
                bail!("two final reads of partition {}", read.partition);
            }
            let log = stored.entry(read.partition).or_default();
            for r in &read.records {
                if r.partition != read.partition {
                    bail!("the final read of partition {} holds a record of partition {}", read.partition, r.partition);
                }
                if let Some(previous) = log.insert(r.offset, &r.value) {
                    bail!(
                        "the final read of partition {} has offset {} twice ({previous:?}, {:?})",
                        read.partition,
                        r.offset,
                        r.value
                    );
                }
                positions.entry(&r.value).or_default().push((r.partition, r.offset));
            }
        }
    }
    let final_at = |partition: i32, offset: i64| stored.get(&partition).and_then(|log| log.get(&offset)).copied();

    for event in events {
        if event.is_operation() {
            report.operations += 1;
        }
        match event {
            Event::Produce(p) => {
                if !stored.contains_key(&p.partition) {
                    bail!("partition {} was written to and has no final read", p.partition);
                }
                if p.outcome == Outcome::Unknown {
                    report.indeterminate += 1;
                }
            }
            Event::Poll(poll) | Event::CommittedPoll(poll) => report.records_read += poll.records.len(),
            Event::Fault(_) => report.faults += 1,
            _ => {}
        }
    }

    check_acknowledged(events, &positions, &final_at, &mut report);
    check_duplicates(events, &positions, &mut report);
    check_offset_values(events, &stored, &mut report);
    check_ack_order(events, &mut report);
    check_reads(events, &stored, &mut report);
    check_consumers(events, &stored, &mut report);
    check_commits(events, &mut report);
    check_transactions(events, &mut report)?;
    report.anomalies.sort_by_key(|a| (a.kind, a.partition));
    Ok(report)
}

/// `lost_write`, `acks1_lost` and the "stored away from its acknowledged offset" half of
/// `order`.
fn check_acknowledged<'a>(
    events: &'a [Event],
    positions: &HashMap<&str, Vec<(i32, i64)>>,
    final_at: &impl Fn(i32, i64) -> Option<&'a str>,
    report: &mut Report,
) {
    for event in events {
        let Event::Produce(p) = event else { continue };
        if p.outcome != Outcome::Ok {
            continue;
        }
        let found = positions.get(p.value.as_str()).map(Vec::as_slice).unwrap_or_default();
        match p.acks {
            Acks::All => {
                report.acked_all += 1;
                if found.is_empty() {
                    report.anomalies.push(Anomaly {
                        kind: AnomalyKind::LostWrite,
                        partition: p.partition,
                        detail: format!(
                            "{:?} (process {}) acknowledged at offset {:?} at {} us, absent from the final log",
                            p.value, p.process, p.offset, p.complete_us
                        ),
                    });
                } else if let Some(offset) = p.offset {
                    if !found.contains(&(p.partition, offset)) {
                        report.anomalies.push(Anomaly {
                            kind: AnomalyKind::Order,
                            partition: p.partition,
                            detail: format!(
                                "{:?} acknowledged at {}:{offset}, stored at {found:?} (the final log holds {:?} there)",
                                p.value,
                                p.partition,
                                final_at(p.partition, offset)
                            ),
                        });
                    }
                }
            }
            Acks::One => {
                report.acked_one += 1;
                let in_place = match p.offset {
                    Some(offset) => found.contains(&(p.partition, offset)),
                    None => !found.is_empty(),
                };
                if !in_place {
                    report.anomalies.push(Anomaly {
                        kind: AnomalyKind::Acks1Lost,
                        partition: p.partition,
                        detail: format!("acks=1 {:?} acknowledged at offset {:?}, stored at {found:?}", p.value, p.offset),
                    });
                }
            }
        }
    }
}

/// `duplicate`: a value of an idempotent producer at more than one offset. Every value
/// is sent once by the workload, so two copies can only come from a retry the broker
/// failed to deduplicate.
fn check_duplicates(events: &[Event], positions: &HashMap<&str, Vec<(i32, i64)>>, report: &mut Report) {
    for event in events {
        let Event::Produce(p) = event else { continue };
        if !p.idempotent {
            continue;
        }
        if let Some(found) = positions.get(p.value.as_str()).filter(|f| f.len() > 1) {
            report.anomalies.push(Anomaly {
                kind: AnomalyKind::Duplicate,
                partition: p.partition,
                detail: format!("{:?} (idempotent, outcome {:?}) stored at {found:?}", p.value, p.outcome),
            });
        }
    }
}

/// `offset_conflict`: one (partition, offset) with two values among what acks=all
/// acknowledgements, consumers and the final log say. acks=1 acknowledgements are left
/// out: an offset reused after an acks=1 loss is `acks1_lost`, already counted.
fn check_offset_values(events: &[Event], stored: &BTreeMap<i32, BTreeMap<i64, &str>>, report: &mut Report) {
    let mut seen: BTreeMap<(i32, i64), Vec<(&str, Source)>> = BTreeMap::new();
    for (&partition, log) in stored {
        for (&offset, &value) in log {
            seen.entry((partition, offset)).or_default().push((value, Source::Stored));
        }
    }
    for event in events {
        match event {
            Event::Produce(p) if p.outcome == Outcome::Ok && p.acks == Acks::All => {
                if let Some(offset) = p.offset {
                    seen.entry((p.partition, offset)).or_default().push((&p.value, Source::Acked));
                }
            }
            Event::Poll(poll) => {
                for r in &poll.records {
                    seen.entry((r.partition, r.offset)).or_default().push((&r.value, Source::Read));
                }
            }
            _ => {}
        }
    }
    for ((partition, offset), values) in seen {
        let first = values[0].0;
        if values.iter().any(|(v, _)| *v != first) {
            let mut distinct: Vec<String> = Vec::new();
            for (value, source) in &values {
                let text = format!("{value:?} ({source})");
                if !distinct.contains(&text) {
                    distinct.push(text);
                }
            }
            report.anomalies.push(Anomaly {
                kind: AnomalyKind::OffsetConflict,
                partition,
                detail: format!("offset {partition}:{offset} has {}", distinct.join(", ")),
            });
        }
    }
}

/// The real-time half of `order`: among acknowledged acks=all writes to one partition,
/// one that completed before another was invoked must have the lower offset.
fn check_ack_order(events: &[Event], report: &mut Report) {
    let mut by_partition: BTreeMap<i32, Vec<(u64, u64, i64, &str)>> = BTreeMap::new();
    for event in events {
        if let Event::Produce(p) = event {
            if let (Outcome::Ok, Acks::All, Some(offset)) = (p.outcome, p.acks, p.offset) {
                by_partition.entry(p.partition).or_default().push((p.invoke_us, p.complete_us, offset, &p.value));
            }
        }
    }
    for (partition, writes) in by_partition {
        let mut by_complete = writes.clone();
        by_complete.sort_by_key(|w| w.1);
        let mut by_invoke = writes;
        by_invoke.sort_by_key(|w| w.0);
        // Sweep: the highest offset among writes completed before the current invoke.
        let mut done = 0;
        let mut highest: Option<(i64, &str, u64)> = None;
        for (invoke, _, offset, value) in by_invoke {
            while done < by_complete.len() && by_complete[done].1 < invoke {
                let (_, complete, o, v) = by_complete[done];
                if highest.is_none_or(|(h, _, _)| o > h) {
                    highest = Some((o, v, complete));
                }
                done += 1;
            }
            if let Some((h, earlier, complete)) = highest {
                if offset <= h {
                    report.anomalies.push(Anomaly {
                        kind: AnomalyKind::Order,
                        partition,
                        detail: format!(
                            "{value:?} invoked at {invoke} us got offset {offset}, below {earlier:?} at offset {h} acknowledged at {complete} us"
                        ),
                    });
                }
            }
        }
    }
}

/// `read_vanished`: what a consumer was given must be what the log keeps.
fn check_reads(events: &[Event], stored: &BTreeMap<i32, BTreeMap<i64, &str>>, report: &mut Report) {
    for event in events {
        let Event::Poll(poll) = event else { continue };
        for r in &poll.records {
            let kept = stored.get(&r.partition).and_then(|log| log.get(&r.offset)).copied();
            if kept != Some(r.value.as_str()) {
                report.anomalies.push(Anomaly {
                    kind: AnomalyKind::ReadVanished,
                    partition: r.partition,
                    detail: format!(
                        "{} read {:?} at {}:{} at {} us; the final log holds {kept:?} there",
                        poll.consumer, r.value, r.partition, r.offset, poll.complete_us
                    ),
                });
            }
        }
    }
}

/// `consumer_skip` and `consumer_back`, per consumer and partition, reset by a rebalance
/// (or any change of generation).
fn check_consumers(events: &[Event], stored: &BTreeMap<i32, BTreeMap<i64, &str>>, report: &mut Report) {
    // consumer -> (generation, partition -> last offset read).
    let mut state: HashMap<&str, (i32, BTreeMap<i32, i64>)> = HashMap::new();
    for event in events {
        match event {
            Event::Rebalance(r) => {
                state.insert(&r.consumer, (r.generation, BTreeMap::new()));
            }
            Event::Poll(poll) => {
                let entry = state.entry(&poll.consumer).or_insert_with(|| (poll.generation, BTreeMap::new()));
                if entry.0 != poll.generation {
                    *entry = (poll.generation, BTreeMap::new());
                }
                for r in &poll.records {
                    if let Some(&last) = entry.1.get(&r.partition) {
                        if r.offset <= last {
                            report.anomalies.push(Anomaly {
                                kind: AnomalyKind::ConsumerBack,
                                partition: r.partition,
                                detail: format!(
                                    "{} (generation {}) read offset {} after {last} without a rebalance, at {} us",
                                    poll.consumer, poll.generation, r.offset, poll.complete_us
                                ),
                            });
                        } else if r.offset > last + 1 {
                            let between = stored.get(&r.partition).map_or(0, |log| log.range(last + 1..r.offset).count());
                            if between > 0 {
                                report.anomalies.push(Anomaly {
                                    kind: AnomalyKind::ConsumerSkip,
                                    partition: r.partition,
                                    detail: format!(
                                        "{} (generation {}) read offset {} right after {last}, skipping {between} stored records, at {} us",
                                        poll.consumer, poll.generation, r.offset, poll.complete_us
                                    ),
                                });
                            }
                        }
                    }
                    entry.1.insert(r.partition, r.offset);
                }
            }
            _ => {}
        }
    }
}

/// `commit_backwards`: per group and partition, a successful commit invoked after
/// another completed may not commit a lower offset.
fn check_commits(events: &[Event], report: &mut Report) {
    // (invoke, complete, offset, consumer, generation) per (group, partition).
    type Committed<'a> = (u64, u64, i64, &'a str, i32);
    let mut commits: BTreeMap<(&str, i32), Vec<Committed<'_>>> = BTreeMap::new();
    for event in events {
        let Event::Commit(c) = event else { continue };
        if c.outcome != Outcome::Ok {
            continue;
        }
        for o in &c.offsets {
            commits.entry((&c.group, o.partition)).or_default().push((
                c.invoke_us,
                c.complete_us,
                o.offset,
                &c.consumer,
                c.generation,
            ));
        }
    }
    for ((group, partition), list) in commits {
        let mut by_complete = list.clone();
        by_complete.sort_by_key(|c| c.1);
        let mut by_invoke = list;
        by_invoke.sort_by_key(|c| c.0);
        let mut done = 0;
        let mut highest: Option<(i64, &str, i32)> = None;
        for (invoke, _, offset, consumer, generation) in by_invoke {
            while done < by_complete.len() && by_complete[done].1 < invoke {
                let (_, _, o, who, g) = by_complete[done];
                if highest.is_none_or(|(h, _, _)| o > h) {
                    highest = Some((o, who, g));
                }
                done += 1;
            }
            if let Some((h, who, g)) = highest {
                if offset < h {
                    report.anomalies.push(Anomaly {
                        kind: AnomalyKind::CommitBackwards,
                        partition,
                        detail: format!(
                            "group {group}: {consumer} (generation {generation}) committed {offset} at {invoke} us, after {who} (generation {g}) had committed {h}"
                        ),
                    });
                }
            }
        }
    }
}

/// The final read_committed read of the transactions topic: partition -> offset ->
/// value, and value -> every place holding it. Fails when one partition was read twice
/// or a read holds one offset twice (the history cannot be judged).
type Stored<'a> = (BTreeMap<i32, BTreeMap<i64, &'a str>>, HashMap<&'a str, Vec<(i32, i64)>>);

fn committed_log(events: &[Event]) -> Result<Stored<'_>> {
    let (mut stored, mut positions): Stored<'_> = Default::default();
    for event in events {
        let Event::CommittedFinalRead(read) = event else { continue };
        if stored.contains_key(&read.partition) {
            bail!("two final read_committed reads of partition {}", read.partition);
        }
        let log = stored.entry(read.partition).or_default();
        for r in &read.records {
            if r.partition != read.partition || log.insert(r.offset, &r.value).is_some() {
                bail!(
                    "the final read_committed read of partition {} holds {}:{} twice or misplaced",
                    read.partition,
                    r.partition,
                    r.offset
                );
            }
            positions.entry(&r.value).or_default().push((r.partition, r.offset));
        }
    }
    Ok((stored, positions))
}

/// Everything about the transactions topic: `txn_lost`, `txn_aborted_read`,
/// `txn_partial`, and `duplicate`, `read_vanished`, `consumer_skip` and `consumer_back`
/// of its read_committed readers.
fn check_transactions(events: &[Event], report: &mut Report) -> Result<()> {
    let (stored, positions) = committed_log(events)?;
    let mut aborted: HashMap<&str, &str> = HashMap::new();
    for event in events {
        let Event::Transaction(t) = event else { continue };
        if let Some(w) = t.writes.iter().find(|w| !stored.contains_key(&w.partition)) {
            bail!("partition {} of the transactions topic was written to and has no final read", w.partition);
        }
        let held: Vec<&TxnWrite> = t.writes.iter().filter(|w| positions.contains_key(w.value.as_str())).collect();
        let partition = t.writes.first().map_or(-1, |w| w.partition);
        let name = || format!("transaction of {} ({} us..{} us)", t.transactional_id, t.invoke_us, t.complete_us);
        match (t.outcome, t.decision) {
            (Outcome::Ok, Decision::Commit) => {
                report.committed += 1;
                for w in t.writes.iter().filter(|w| !positions.contains_key(w.value.as_str())) {
                    report.anomalies.push(Anomaly {
                        kind: AnomalyKind::TxnLost,
                        partition: w.partition,
                        detail: format!("{:?} of the committed {} is not in the final read_committed read", w.value, name()),
                    });
                }
            }
            (Outcome::Ok, Decision::Abort) => {
                report.aborted += 1;
                for w in &t.writes {
                    aborted.insert(&w.value, &t.transactional_id);
                }
            }
            _ => {}
        }
        if !held.is_empty() && held.len() < t.writes.len() {
            report.anomalies.push(Anomaly {
                kind: AnomalyKind::TxnPartial,
                partition,
                detail: format!(
                    "{} ({:?}, outcome {:?}): read_committed holds {} of its {} values: {:?}",
                    name(),
                    t.decision,
                    t.outcome,
                    held.len(),
                    t.writes.len(),
                    held.iter().map(|w| &w.value).collect::<Vec<_>>()
                ),
            });
        }
    }
    for (value, found) in &positions {
        if found.len() > 1 {
            report.anomalies.push(Anomaly {
                kind: AnomalyKind::Duplicate,
                partition: found[0].0,
                detail: format!("transactions topic: {value:?} (transactional) stored at {found:?}"),
            });
        }
        if let Some(id) = aborted.get(value) {
            report.anomalies.push(Anomaly {
                kind: AnomalyKind::TxnAbortedRead,
                partition: found[0].0,
                detail: format!("{value:?} of an aborted transaction of {id} is in the final read_committed read at {found:?}"),
            });
        }
    }
    // consumer -> (incarnation, partition -> last offset read).
    let mut readers: HashMap<&str, (i32, BTreeMap<i32, i64>)> = HashMap::new();
    for event in events {
        let Event::CommittedPoll(poll) = event else { continue };
        let reader = readers.entry(&poll.consumer).or_insert_with(|| (poll.generation, BTreeMap::new()));
        if reader.0 != poll.generation {
            *reader = (poll.generation, BTreeMap::new());
        }
        for r in &poll.records {
            let at = format!("{} read {:?} at {}:{} at {} us", poll.consumer, r.value, r.partition, r.offset, poll.complete_us);
            if let Some(id) = aborted.get(r.value.as_str()) {
                report.anomalies.push(Anomaly {
                    kind: AnomalyKind::TxnAbortedRead,
                    partition: r.partition,
                    detail: format!("transactions topic: {at}, a value of an aborted transaction of {id}"),
                });
            }
            let kept = stored.get(&r.partition).and_then(|log| log.get(&r.offset)).copied();
            if kept != Some(r.value.as_str()) {
                report.anomalies.push(Anomaly {
                    kind: AnomalyKind::ReadVanished,
                    partition: r.partition,
                    detail: format!("transactions topic: {at}; the final read_committed read holds {kept:?} there"),
                });
            }
            if let Some(&last) = reader.1.get(&r.partition) {
                let between = || stored.get(&r.partition).map_or(0, |log| log.range(last + 1..r.offset).count());
                if r.offset <= last {
                    report.anomalies.push(Anomaly {
                        kind: AnomalyKind::ConsumerBack,
                        partition: r.partition,
                        detail: format!("transactions topic: {at}, after offset {last}"),
                    });
                } else if let between @ 1.. = between() {
                    report.anomalies.push(Anomaly {
                        kind: AnomalyKind::ConsumerSkip,
                        partition: r.partition,
                        detail: format!("transactions topic: {at} right after {last}, skipping {between} committed records"),
                    });
                }
            }
            reader.1.insert(r.partition, r.offset);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
