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
mod tests {
    use super::*;
    use crate::chaos::history::{Commit, CommitOffset, FinalRead, Poll, Produce, Rebalance, Record, TxnWrite};

    fn write(process: u32, at: u64, partition: i32, value: &str, acks: Acks, outcome: Outcome, offset: Option<i64>) -> Event {
        Event::Produce(Produce {
            process,
            invoke_us: at,
            complete_us: at + 5,
            partition,
            value: value.into(),
            acks,
            idempotent: acks == Acks::All,
            outcome,
            offset,
            error: None,
        })
    }

    fn ok_all(at: u64, partition: i32, value: &str, offset: i64) -> Event {
        write(1, at, partition, value, Acks::All, Outcome::Ok, Some(offset))
    }

    fn stored(partition: i32, values: &[&str]) -> Event {
        Event::FinalRead(FinalRead {
            partition,
            time_us: 1_000_000,
            start_offset: 0,
            end_offset: values.len() as i64,
            records: values.iter().enumerate().map(|(o, v)| rec(partition, o as i64, v)).collect(),
        })
    }

    fn rec(partition: i32, offset: i64, value: &str) -> Record {
        Record { partition, offset, value: value.into() }
    }

    fn poll(consumer: &str, generation: i32, at: u64, records: &[(i32, i64, &str)]) -> Event {
        Event::Poll(Poll {
            process: 9,
            consumer: consumer.into(),
            generation,
            invoke_us: at,
            complete_us: at + 5,
            outcome: Outcome::Ok,
            records: records.iter().map(|&(p, o, v)| rec(p, o, v)).collect(),
            error: None,
        })
    }

    fn commit(consumer: &str, generation: i32, at: u64, partition: i32, offset: i64) -> Event {
        Event::Commit(Commit {
            process: 9,
            group: "g".into(),
            consumer: consumer.into(),
            generation,
            invoke_us: at,
            complete_us: at + 5,
            offsets: vec![CommitOffset { partition, offset }],
            outcome: Outcome::Ok,
            error: None,
        })
    }

    fn rebalance(consumer: &str, generation: i32, at: u64) -> Event {
        Event::Rebalance(Rebalance {
            process: 9,
            consumer: consumer.into(),
            member_id: format!("{consumer}-m{generation}"),
            generation,
            time_us: at,
            assigned: vec![0],
        })
    }

    /// A clean history: writes acknowledged in order, consumers reading every one once,
    /// commits moving forward, a rebalance that legitimately re-reads.
    fn clean() -> Vec<Event> {
        vec![
            ok_all(10, 0, "a", 0),
            ok_all(20, 0, "b", 1),
            write(2, 25, 0, "x", Acks::All, Outcome::Unknown, None),
            ok_all(30, 0, "c", 2),
            write(3, 40, 1, "one", Acks::One, Outcome::Ok, Some(0)),
            write(3, 50, 1, "lost-before-ack", Acks::One, Outcome::Fail, None),
            poll("c1", 1, 60, &[(0, 0, "a"), (0, 1, "b")]),
            commit("c1", 1, 70, 0, 2),
            poll("c1", 1, 80, &[(0, 2, "c")]),
            rebalance("c1", 2, 90),
            poll("c1", 2, 100, &[(0, 2, "c"), (0, 3, "x")]),
            commit("c1", 2, 110, 0, 4),
            stored(0, &["a", "b", "c", "x"]),
            stored(1, &["one"]),
        ]
    }

    #[test]
    fn a_clean_history_has_no_anomaly() {
        let report = check(&clean()).unwrap();
        assert_eq!(report.anomalies, vec![], "{report:#?}");
        assert_eq!(report.operations, 11);
        assert_eq!((report.acked_all, report.acked_one, report.indeterminate), (3, 1, 1));
        assert_eq!(report.records_read, 5);
        assert_eq!(report.violations(), 0);
    }

    fn only(events: Vec<Event>, kind: AnomalyKind) -> Report {
        let report = check(&events).unwrap();
        assert!(report.count(kind) > 0, "expected {kind}: {report:#?}");
        for a in &report.anomalies {
            assert_eq!(a.kind, kind, "only {kind} expected: {report:#?}");
        }
        report
    }

    #[test]
    fn an_acknowledged_write_missing_from_the_log_is_lost() {
        let mut h = clean();
        h.push(ok_all(35, 1, "gone", 1));
        let report = only(h, AnomalyKind::LostWrite);
        assert_eq!(report.violations(), 1);
        assert!(report.anomalies[0].detail.contains("\"gone\""), "{report:#?}");
    }

    #[test]
    fn an_acks1_loss_is_counted_but_is_no_violation() {
        let mut h = clean();
        h.push(write(3, 55, 1, "one-lost", Acks::One, Outcome::Ok, Some(1)));
        let report = only(h, AnomalyKind::Acks1Lost);
        assert_eq!(report.violations(), 0);
        assert_eq!(report.count(AnomalyKind::Acks1Lost), 1);
    }

    #[test]
    fn an_idempotent_value_stored_twice_is_a_duplicate() {
        let mut h = clean();
        h.pop();
        h.pop();
        // "x" was sent once with an unknown outcome; a retry stored it twice.
        h.push(stored(0, &["a", "b", "c", "x", "x"]));
        h.push(stored(1, &["one"]));
        let report = only(h, AnomalyKind::Duplicate);
        assert_eq!(report.count(AnomalyKind::Duplicate), 1);
        // A non-idempotent (acks=1) value twice is what retries without idempotence do.
        let mut h = clean();
        h.pop();
        h.push(stored(1, &["one", "one"]));
        assert_eq!(check(&h).unwrap().anomalies, vec![]);
    }

    #[test]
    fn one_offset_with_two_values_is_a_conflict() {
        // Two acknowledgements of the same offset, and the log keeps one of them.
        let h = vec![ok_all(10, 0, "a", 0), ok_all(20, 0, "b", 0), stored(0, &["a", "b"])];
        let report = check(&h).unwrap();
        assert_eq!(report.count(AnomalyKind::OffsetConflict), 1, "{report:#?}");
        // "b" is stored at 1, not where it was acknowledged: also an order anomaly.
        assert!(report.count(AnomalyKind::Order) >= 1, "{report:#?}");
        assert!(report.anomalies.iter().all(|a| a.kind.is_violation()));
    }

    #[test]
    fn a_value_stored_away_from_its_acknowledged_offset_is_out_of_order() {
        // Acknowledged at 1 and 0, in that real-time order; stored the other way round.
        let h = vec![ok_all(10, 0, "a", 1), ok_all(20, 0, "b", 0), stored(0, &["b", "a"])];
        let report = only(h, AnomalyKind::Order);
        assert_eq!(report.count(AnomalyKind::Order), 1, "{report:#?}");
        assert!(report.anomalies[0].detail.contains("below"), "{report:#?}");
        // Acknowledged at 0, stored at 1 behind an unacknowledged value.
        let h = vec![ok_all(10, 0, "a", 0), write(2, 5, 0, "u", Acks::All, Outcome::Unknown, None), stored(0, &["u", "a"])];
        let report = check(&h).unwrap();
        assert!(report.count(AnomalyKind::Order) == 1, "{report:#?}");
        // Concurrent writes may take either order.
        let h = vec![
            write(1, 10, 0, "a", Acks::All, Outcome::Ok, Some(1)),
            write(2, 12, 0, "b", Acks::All, Outcome::Ok, Some(0)),
            stored(0, &["b", "a"]),
        ];
        assert_eq!(check(&h).unwrap().anomalies, vec![]);
    }

    #[test]
    fn a_read_the_log_no_longer_holds_vanished() {
        let mut h = clean();
        h.push(poll("c2", 1, 95, &[(0, 4, "ghost")]));
        let report = check(&h).unwrap();
        assert_eq!(report.count(AnomalyKind::ReadVanished), 1, "{report:#?}");
        // Past the log's end there is no value to conflict with: only the vanished read.
        assert_eq!(report.anomalies.len(), 1, "{report:#?}");
        // A read of another value at a stored offset is also a conflict.
        let mut h = clean();
        h.push(poll("c2", 1, 95, &[(0, 1, "other")]));
        let report = check(&h).unwrap();
        assert_eq!(report.count(AnomalyKind::ReadVanished), 1, "{report:#?}");
        assert_eq!(report.count(AnomalyKind::OffsetConflict), 1, "{report:#?}");
    }

    #[test]
    fn a_consumer_skipping_offsets_without_a_rebalance_is_flagged() {
        let h = vec![
            ok_all(10, 0, "a", 0),
            ok_all(20, 0, "b", 1),
            ok_all(30, 0, "c", 2),
            poll("c1", 1, 40, &[(0, 0, "a")]),
            poll("c1", 1, 50, &[(0, 2, "c")]),
            stored(0, &["a", "b", "c"]),
        ];
        let report = only(h, AnomalyKind::ConsumerSkip);
        assert_eq!(report.count(AnomalyKind::ConsumerSkip), 1);
    }

    #[test]
    fn a_consumer_going_back_needs_a_rebalance() {
        let base = vec![ok_all(10, 0, "a", 0), ok_all(20, 0, "b", 1), stored(0, &["a", "b"])];
        let mut h = base.clone();
        h.push(poll("c1", 1, 40, &[(0, 0, "a"), (0, 1, "b")]));
        h.push(poll("c1", 1, 50, &[(0, 1, "b")]));
        only(h, AnomalyKind::ConsumerBack);
        // After a rebalance, starting over from the committed offset is fine.
        let mut h = base.clone();
        h.push(poll("c1", 1, 40, &[(0, 0, "a"), (0, 1, "b")]));
        h.push(rebalance("c1", 2, 45));
        h.push(poll("c1", 2, 50, &[(0, 1, "b")]));
        assert_eq!(check(&h).unwrap().anomalies, vec![]);
        // A rebalance keeping the generation number (a new coordinator counts from 1
        // again; the member id is new) resets the consumer's positions too.
        let mut h = base.clone();
        h.push(poll("c1", 2, 40, &[(0, 0, "a"), (0, 1, "b")]));
        h.push(rebalance("c1", 2, 45));
        h.push(poll("c1", 2, 50, &[(0, 0, "a")]));
        assert_eq!(check(&h).unwrap().anomalies, vec![]);
        // A poll in a new generation counts as one even if the rebalance was not logged.
        let mut h = base;
        h.push(poll("c1", 1, 40, &[(0, 0, "a"), (0, 1, "b")]));
        h.push(poll("c1", 3, 50, &[(0, 0, "a")]));
        assert_eq!(check(&h).unwrap().anomalies, vec![]);
    }

    #[test]
    fn a_committed_offset_going_backwards_is_flagged() {
        let mut h = clean();
        h.push(commit("c2", 3, 200, 0, 1));
        let report = only(h, AnomalyKind::CommitBackwards);
        assert_eq!(report.count(AnomalyKind::CommitBackwards), 1);
        // Two concurrent commits may complete in either order.
        let h = vec![commit("c1", 1, 10, 0, 5), commit("c2", 1, 12, 0, 3), stored(0, &[])];
        assert_eq!(check(&h).unwrap().anomalies, vec![]);
        // A failed commit does not count.
        let mut h = clean();
        let Event::Commit(mut failed) = commit("c2", 3, 200, 0, 1) else { unreachable!() };
        failed.outcome = Outcome::Fail;
        h.push(Event::Commit(failed));
        assert_eq!(check(&h).unwrap().anomalies, vec![]);
    }

    #[test]
    fn a_history_without_the_final_read_of_a_written_partition_cannot_be_judged() {
        let h = vec![ok_all(10, 2, "a", 0), stored(0, &[])];
        let error = check(&h).unwrap_err().to_string();
        assert!(error.contains("partition 2"), "{error}");
    }

    #[test]
    fn a_history_round_trips_through_json_lines() {
        let events = clean();
        let mut text = Vec::new();
        for e in &events {
            crate::chaos::history::write_event(&mut text, e).unwrap();
        }
        let back = crate::chaos::history::read_history(&text[..]).unwrap();
        assert_eq!(back, events);
        let error = crate::chaos::history::read_history(&b"{\"op\":\"produce\"}\n"[..]).unwrap_err();
        assert!(format!("{error:#}").contains("line 1"), "{error:#}");
    }

    fn txn(id: &str, at: u64, writes: &[(i32, &str)], decision: Decision, outcome: Outcome) -> Event {
        Event::Transaction(crate::chaos::history::Transaction {
            process: 7,
            transactional_id: id.into(),
            invoke_us: at,
            complete_us: at + 5,
            writes: writes.iter().map(|&(partition, v)| TxnWrite { partition, value: v.into() }).collect(),
            decision,
            outcome,
            error: None,
        })
    }

    fn committed_stored(partition: i32, records: &[(i64, &str)]) -> Event {
        Event::CommittedFinalRead(FinalRead {
            partition,
            time_us: 1_000_000,
            start_offset: 0,
            end_offset: records.last().map_or(0, |r| r.0 + 2),
            records: records.iter().map(|&(o, v)| rec(partition, o, v)).collect(),
        })
    }

    fn committed_poll(consumer: &str, incarnation: i32, at: u64, records: &[(i32, i64, &str)]) -> Event {
        match poll(consumer, incarnation, at, records) {
            Event::Poll(p) => Event::CommittedPoll(p),
            _ => unreachable!(),
        }
    }

    /// A clean transactional history: a committed transaction over two partitions, an
    /// aborted one (its records and markers take offsets read_committed skips), one whose
    /// end is unknown and that committed, and a reader that saw the committed values.
    fn clean_txn() -> Vec<Event> {
        let mut h = clean();
        h.extend([
            txn("t1", 10, &[(0, "t1-a"), (1, "t1-b")], Decision::Commit, Outcome::Ok),
            txn("t1", 20, &[(0, "t1-c")], Decision::Abort, Outcome::Ok),
            txn("t2", 30, &[(0, "t2-a"), (1, "t2-b")], Decision::Commit, Outcome::Unknown),
            txn("t2", 40, &[(1, "t2-c")], Decision::Abort, Outcome::Unknown),
            committed_poll("rc0", 0, 50, &[(0, 0, "t1-a"), (0, 4, "t2-a")]),
            committed_poll("rc0", 0, 60, &[(1, 0, "t1-b")]),
            committed_stored(0, &[(0, "t1-a"), (4, "t2-a")]),
            committed_stored(1, &[(0, "t1-b"), (2, "t2-b")]),
        ]);
        h
    }

    #[test]
    fn a_clean_transactional_history_has_no_anomaly() {
        let report = check(&clean_txn()).unwrap();
        assert_eq!(report.anomalies, vec![], "{report:#?}");
        assert_eq!((report.committed, report.aborted), (1, 1));
        assert_eq!(report.operations, 11 + 6);
        assert_eq!(report.records_read, 5 + 3);
    }

    #[test]
    fn a_committed_transactions_value_missing_from_read_committed_is_lost() {
        let mut h = clean_txn();
        h.push(txn("t3", 70, &[(1, "t3-a")], Decision::Commit, Outcome::Ok));
        let report = only(h, AnomalyKind::TxnLost);
        assert!(report.anomalies[0].detail.contains("t3-a"), "{report:#?}");
    }

    #[test]
    fn a_value_of_an_acknowledged_abort_read_by_read_committed_is_an_aborted_read() {
        let mut h = clean_txn();
        h.push(committed_poll("rc1", 0, 70, &[(0, 2, "t1-c")]));
        let report = check(&h).unwrap();
        assert_eq!(report.count(AnomalyKind::TxnAbortedRead), 1, "{report:#?}");
        // The final log does not hold it either: the read also vanished.
        assert_eq!(report.count(AnomalyKind::ReadVanished), 1, "{report:#?}");
        assert_eq!(report.anomalies.len(), 2, "{report:#?}");

        let mut h = clean_txn();
        h.retain(|e| !matches!(e, Event::CommittedFinalRead(r) if r.partition == 0));
        h.push(committed_stored(0, &[(0, "t1-a"), (2, "t1-c"), (4, "t2-a")]));
        let report = check(&h).unwrap();
        let aborted: Vec<_> = report.anomalies.iter().filter(|a| a.kind == AnomalyKind::TxnAbortedRead).collect();
        assert_eq!(aborted.len(), 1, "{report:#?}");
        assert!(aborted[0].detail.contains("final read_committed read"), "{report:#?}");
        // rc0 went from offset 0 to 4 past what the final read holds at 2: also a skip.
        assert_eq!(report.count(AnomalyKind::ConsumerSkip), 1, "{report:#?}");
    }

    #[test]
    fn a_transaction_seen_in_part_is_partial_whatever_its_outcome() {
        let mut h = clean_txn();
        h.retain(|e| !matches!(e, Event::CommittedFinalRead(r) if r.partition == 1));
        h.push(committed_stored(1, &[(0, "t1-b")]));
        let report = only(h, AnomalyKind::TxnPartial);
        assert!(report.anomalies[0].detail.contains("t2"), "the unknown-outcome transaction: {report:#?}");
    }

    #[test]
    fn transactional_duplicates_skips_and_steps_back_are_found() {
        let mut h = clean_txn();
        h.retain(|e| !matches!(e, Event::CommittedFinalRead(r) if r.partition == 1));
        h.push(committed_stored(1, &[(0, "t1-b"), (2, "t2-b"), (3, "t2-b")]));
        only(h, AnomalyKind::Duplicate);

        let mut h = clean_txn();
        h.push(committed_poll("rc1", 0, 70, &[(0, 4, "t2-a")]));
        h.push(committed_poll("rc2", 0, 70, &[(1, 2, "t2-b"), (1, 0, "t1-b")]));
        only(h, AnomalyKind::ConsumerBack);

        let mut h = clean_txn();
        h.push(committed_poll("rc1", 0, 70, &[(0, 0, "t1-a")]));
        h.push(committed_poll("rc1", 1, 80, &[(0, 0, "t1-a")]));
        assert_eq!(check(&h).unwrap().anomalies, vec![], "a new incarnation may start over");

        let mut h = clean_txn();
        h.retain(|e| !matches!(e, Event::CommittedFinalRead(r) if r.partition == 0));
        h.push(committed_stored(0, &[(0, "t1-a"), (1, "t9"), (4, "t2-a")]));
        h.push(txn("t9", 45, &[(0, "t9")], Decision::Commit, Outcome::Ok));
        only(h, AnomalyKind::ConsumerSkip);
    }

    #[test]
    fn a_transaction_on_a_partition_without_a_final_read_cannot_be_judged() {
        let mut h = clean_txn();
        h.push(txn("t3", 70, &[(2, "t3-a")], Decision::Commit, Outcome::Ok));
        assert!(check(&h).is_err());
    }
}
