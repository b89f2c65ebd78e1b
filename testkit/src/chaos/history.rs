//! The history of a chaos run: one JSON object per line, one line per operation a client
//! did (with when it was invoked, when it completed and what came back), plus the final
//! read of every partition after the faults healed and the faults themselves.
//!
//! Times are microseconds since the run started, on one clock (the harness process's
//! monotonic clock), so "A completed before B was invoked" is meaningful across clients.

use std::io::{BufRead, Write};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// What the producer asked the leader to wait for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Acks {
    /// acks=all (-1): the write is acknowledged once every in-sync replica has it.
    All,
    /// acks=1: the leader alone; a leader change may lose what it acknowledged.
    One,
}

/// How an operation ended, as far as the client knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Acknowledged (a produce) or done (a commit, a poll).
    Ok,
    /// Definitely not done: the broker refused it.
    Fail,
    /// Indeterminate: a timeout or a broken connection; it may or may not have happened.
    Unknown,
}

/// One record as a consumer or the final read saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub partition: i32,
    pub offset: i64,
    pub value: String,
}

/// A single-record produce of a value no other operation writes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Produce {
    pub process: u32,
    pub invoke_us: u64,
    pub complete_us: u64,
    pub partition: i32,
    pub value: String,
    pub acks: Acks,
    pub idempotent: bool,
    pub outcome: Outcome,
    /// The offset the leader acknowledged (set when `outcome` is `ok`).
    #[serde(default)]
    pub offset: Option<i64>,
    #[serde(default)]
    pub error: Option<String>,
}

/// One poll of a group consumer. Records of a failed poll are not delivered, so only
/// `ok` polls carry records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Poll {
    pub process: u32,
    pub consumer: String,
    /// The group generation the consumer was in when the poll returned.
    pub generation: i32,
    pub invoke_us: u64,
    pub complete_us: u64,
    pub outcome: Outcome,
    #[serde(default)]
    pub records: Vec<Record>,
    #[serde(default)]
    pub error: Option<String>,
}

/// One committed position: the next offset the group will read from `partition`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitOffset {
    pub partition: i32,
    pub offset: i64,
}

/// An OffsetCommit of a group member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Commit {
    pub process: u32,
    pub group: String,
    pub consumer: String,
    pub generation: i32,
    pub invoke_us: u64,
    pub complete_us: u64,
    pub offsets: Vec<CommitOffset>,
    pub outcome: Outcome,
    #[serde(default)]
    pub error: Option<String>,
}

/// A consumer's assignment changed (a new generation): from here on, its positions may
/// legitimately start over from the group's committed offsets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rebalance {
    pub process: u32,
    pub consumer: String,
    /// The member id the coordinator gave: a new one with the same generation number is
    /// a rebalance too (a new coordinator counts generations from the start again).
    #[serde(default)]
    pub member_id: String,
    pub generation: i32,
    pub time_us: u64,
    pub assigned: Vec<i32>,
}

/// Every record of one partition, read from its log start to its end once the faults
/// were healed and every broker was back: the ground truth the checker compares to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalRead {
    pub partition: i32,
    pub time_us: u64,
    /// The log start offset the read began at (records below it were never deleted in a
    /// chaos run, so it is 0).
    pub start_offset: i64,
    /// The high watermark the read ended at.
    pub end_offset: i64,
    pub records: Vec<Record>,
}

/// What a transactional producer asked for at the end of a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Commit,
    Abort,
}

/// One value a transaction wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnWrite {
    pub partition: i32,
    pub value: String,
}

/// One transaction of a transactional producer on the transactions topic: values no other
/// operation writes, then a commit or an abort. `outcome` is `ok` when the end was
/// acknowledged (the decision holds), `unknown` when anything failed on the way (the
/// transaction may have committed or aborted, but never partly).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transaction {
    pub process: u32,
    pub transactional_id: String,
    pub invoke_us: u64,
    pub complete_us: u64,
    pub writes: Vec<TxnWrite>,
    pub decision: Decision,
    pub outcome: Outcome,
    #[serde(default)]
    pub error: Option<String>,
}

/// A fault the harness injected, with its start and heal times.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    pub kind: String,
    pub target: String,
    pub start_us: u64,
    pub end_us: u64,
}

/// One line of a history file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Event {
    Produce(Produce),
    Poll(Poll),
    Commit(Commit),
    Rebalance(Rebalance),
    FinalRead(FinalRead),
    Fault(Fault),
    /// A transaction on the transactions topic.
    Transaction(Transaction),
    /// A poll of a read_committed consumer of the transactions topic (assigned, not in a
    /// group: `generation` counts the consumer's incarnations, so a replaced consumer
    /// starting over is not a step back).
    CommittedPoll(Poll),
    /// The final read_committed read of one partition of the transactions topic, once
    /// every transaction was decided (its last stable offset reached its high watermark).
    CommittedFinalRead(FinalRead),
}

impl Event {
    /// Whether this line is a client operation (what the run's "operations" count).
    pub fn is_operation(&self) -> bool {
        matches!(self, Event::Produce(_) | Event::Poll(_) | Event::Commit(_) | Event::Transaction(_) | Event::CommittedPoll(_))
    }
}

/// Reads a JSON-lines history; blank lines are skipped, anything else that is not an
/// event is an error naming its line.
pub fn read_history(input: impl BufRead) -> Result<Vec<Event>> {
    let mut events = Vec::new();
    for (index, line) in input.lines().enumerate() {
        let line = line.with_context(|| format!("history line {}", index + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let event: Event = serde_json::from_str(&line).with_context(|| format!("history line {}: {line}", index + 1))?;
        events.push(event);
    }
    Ok(events)
}

/// Writes one event as a line.
pub fn write_event(out: &mut impl Write, event: &Event) -> Result<()> {
    serde_json::to_writer(&mut *out, event)?;
    out.write_all(b"\n")?;
    Ok(())
}
