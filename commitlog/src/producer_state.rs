//! Idempotent producer state: per producer id, its epoch and the last five batches'
//! sequence and offset ranges, as Kafka's `ProducerStateManager` keeps them.
//!
//! A leader append checks every batch that carries a producer id (`producer_id >= 0`)
//! against it under the log's writer lock, so the check and the append are atomic:
//! - same epoch, same first and last sequence as one of the cached batches: a retry of
//!   a batch already in the log, answered with that batch's offsets, nothing appended;
//! - same epoch, first sequence not the successor of the last one: a gap
//!   ([`Error::OutOfOrderSequence`]);
//! - an older epoch: a zombie producer ([`Error::InvalidProducerEpoch`]);
//! - a newer epoch must restart at sequence 0;
//! - an unknown producer id (new, expired, or its batches deleted by retention) is
//!   accepted at any sequence, as Kafka does since the state may be gone for good
//!   reasons.
//!
//! Followers (`append_replicated`) apply the batches without checks, so a follower that
//! becomes leader already knows every producer.
//!
//! # Transactions
//! A transactional batch (attributes bit 0x10) opens the producer's transaction in this
//! partition at its base offset unless one is open already; the producer's COMMIT or
//! ABORT marker (a control batch, see [`fjord_record::control`]) closes it and yields a
//! [`CompletedTxn`]. While a transaction is open the producer may send only
//! transactional batches ([`Error::InvalidTxnState`]), and is never expired. `open`
//! keeps the first offsets of the open transactions in order: the smallest one bounds
//! the last stable offset (LSO), and an abort records the LSO after it in the
//! aborted-transactions index (`txn_index`). A marker from an older producer epoch is
//! [`Error::InvalidProducerEpoch`], from an older coordinator epoch
//! [`Error::TransactionCoordinatorFenced`] (see [`ProducerState::check_marker`]).
//!
//! # Persistence
//! The state is derived from the batch headers in the log. `<offset>.snapshot` files in
//! the partition directory hold the state as of an offset (everything below it applied);
//! they are written when a segment rolls and on close, so opening a log loads the
//! latest snapshot at or below the log end and replays only the batch headers after it.
//! Truncation reloads from a snapshot at or below the new end; retention evicts
//! producers whose last batch was deleted, and the snapshots below the log start.
//!
//! Snapshot file (the checkpoint text format, written atomically), one line per producer:
//! ```text
//! producer_id epoch last_timestamp coordinator_epoch txn_first_offset (first_seq last_seq first_offset last_offset)...
//! ```
//! `txn_first_offset` is -1 without an open transaction. Snapshots written before
//! transactions lack the two transaction fields (3 + 4n fields instead of 5 + 4n, told
//! apart by the count) and are still read.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs;
use std::path::{Path, PathBuf};

use fjord_record::batch::BatchHeader;
use fjord_record::control::{self, Control};
use fjord_record::Offset;

use crate::checkpoint;
use crate::error::IoContext;
use crate::segment::{Segment, Step, Walker, LOG_SUFFIX};
use crate::{Error, Result};

pub(crate) const SNAPSHOT_SUFFIX: &str = "snapshot";

/// Batches remembered per producer: Kafka's `max.in.flight.requests.per.connection`
/// limit for idempotence is 5, so a retry is always of one of the last five.
pub(crate) const MAX_CACHED_BATCHES: usize = 5;

/// Sequence and offset range of one appended batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchMetadata {
    pub(crate) first_seq: i32,
    pub(crate) last_seq: i32,
    pub(crate) first_offset: Offset,
    pub(crate) last_offset: Offset,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct ProducerEntry {
    epoch: i16,
    batches: VecDeque<BatchMetadata>,
    /// Largest batch timestamp seen, at most the time it was seen (`seen_at`): expiry
    /// counts inactivity from it (as Kafka).
    last_timestamp: i64,
    /// Coordinator epoch of the last marker for this producer (-1: none yet).
    coordinator_epoch: i32,
    /// First offset of the producer's open transaction in this partition.
    txn_first_offset: Option<Offset>,
}

/// A transaction that ended in this partition: its marker was appended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CompletedTxn {
    pub(crate) producer_id: i64,
    /// Offset of its first batch here.
    pub(crate) first_offset: Offset,
    /// Offset of its marker.
    pub(crate) last_offset: Offset,
    pub(crate) aborted: bool,
    /// The last stable offset once it ended: the first offset of the earliest
    /// transaction still open, else the offset after the marker (what the aborted
    /// transactions index stores, so a reader can stop searching there).
    pub(crate) last_stable_offset: Offset,
}

/// A transaction that a data batch opened in this partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TxnStarted {
    pub(crate) producer_id: i64,
    pub(crate) first_offset: Offset,
}

/// What a producer looks like to an observer (tests, tools).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerInfo {
    /// Producer id.
    pub producer_id: i64,
    /// Its current epoch.
    pub epoch: i16,
    /// Last sequence number appended.
    pub last_sequence: i32,
    /// Offset of the last record it appended.
    pub last_offset: Offset,
    /// Largest timestamp of its batches (expiry counts from here).
    pub last_timestamp: i64,
    /// Coordinator epoch of the last transaction marker for it (-1: none yet).
    pub coordinator_epoch: i32,
    /// First offset of its open transaction in this partition, if one is open.
    pub txn_start_offset: Option<Offset>,
}

/// The state of one partition (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct ProducerState {
    dir: PathBuf,
    producers: HashMap<i64, ProducerEntry>,
    /// First offset of each open transaction -> its producer id (kept with `producers`).
    open: BTreeMap<Offset, i64>,
    /// `producer.id.max.per.partition` (see [`ProducerState::limit`]).
    max_producers: usize,
    /// Producers forgotten for the limit since the last warning, and when that was: it
    /// is logged at most once a minute, as a flood of made-up ids would repeat it.
    forgotten_unlogged: usize,
    last_warning_ms: i64,
}

/// `first + delta` in Kafka's sequence space, which wraps from `i32::MAX` to 0.
fn add_seq(first: i32, delta: i32) -> i32 {
    ((i64::from(first) + i64::from(delta)) % (i64::from(i32::MAX) + 1)) as i32
}

fn meta_of(h: &BatchHeader) -> BatchMetadata {
    BatchMetadata {
        first_seq: h.base_sequence,
        last_seq: add_seq(h.base_sequence, h.last_offset_delta),
        first_offset: h.base_offset,
        last_offset: h.last_offset(),
    }
}

/// When a producer was last active, from a batch of it: its max timestamp, as Kafka
/// counts expiry, but never later than now. A timestamp is the client's to set, and one
/// in the far future kept the producer from ever expiring: any client could then pin a
/// producer entry a request in every partition's memory for good.
fn seen_at(h: &BatchHeader) -> i64 {
    h.max_timestamp.min(fjord_record::now_ms())
}

/// Whether a batch takes part in idempotence (a data batch with a producer id; control
/// batches carry no sequence).
fn is_idempotent(h: &BatchHeader) -> bool {
    h.producer_id >= 0 && !h.is_control()
}

impl ProducerEntry {
    fn new(epoch: i16, last_timestamp: i64) -> Self {
        Self { epoch, batches: VecDeque::new(), last_timestamp, coordinator_epoch: -1, txn_first_offset: None }
    }

    /// A new epoch restarts the sequences (the coordinator or InitProducerId bumped it).
    fn set_epoch(&mut self, epoch: i16) {
        if epoch != self.epoch {
            self.epoch = epoch;
            self.batches.clear();
        }
    }

    /// Applies a data batch; `Some(first offset)` when it opened a transaction.
    fn apply(&mut self, h: &BatchHeader) -> Option<Offset> {
        self.set_epoch(h.producer_epoch);
        if self.batches.len() == MAX_CACHED_BATCHES {
            self.batches.pop_front();
        }
        self.batches.push_back(meta_of(h));
        self.last_timestamp = self.last_timestamp.max(seen_at(h));
        if h.is_transactional() && self.txn_first_offset.is_none() {
            self.txn_first_offset = Some(h.base_offset);
            return self.txn_first_offset;
        }
        None
    }

    /// Leader checks of one batch against this entry (see the module docs).
    fn check(&self, producer_id: i64, h: &BatchHeader) -> Result<Option<BatchMetadata>> {
        if h.producer_epoch < self.epoch {
            return Err(Error::InvalidProducerEpoch { producer_id, epoch: h.producer_epoch, current: self.epoch });
        }
        if let Some(first_offset) = self.txn_first_offset.filter(|_| !h.is_transactional()) {
            return Err(Error::InvalidTxnState { producer_id, first_offset });
        }
        if h.producer_epoch > self.epoch {
            if h.base_sequence != 0 {
                return Err(Error::OutOfOrderSequence {
                    producer_id,
                    epoch: h.producer_epoch,
                    expected: 0,
                    found: h.base_sequence,
                });
            }
            return Ok(None);
        }
        let m = meta_of(h);
        if let Some(dup) = self.batches.iter().find(|b| b.first_seq == m.first_seq && b.last_seq == m.last_seq) {
            return Ok(Some(*dup));
        }
        match self.batches.back() {
            Some(last) if add_seq(last.last_seq, 1) != m.first_seq => Err(Error::OutOfOrderSequence {
                producer_id,
                epoch: h.producer_epoch,
                expected: add_seq(last.last_seq, 1),
                found: m.first_seq,
            }),
            _ => Ok(None),
        }
    }
}

impl ProducerState {
    pub(crate) fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
            producers: HashMap::new(),
            open: BTreeMap::new(),
            max_producers: usize::MAX,
            forgotten_unlogged: 0,
            last_warning_ms: i64::MIN,
        }
    }

    /// Remembers at most `max_producers` producers: past it, the longest idle ones
    /// without an open transaction are forgotten, down to nine tenths of it (so the
    /// search for them runs once per tenth of the limit of new producers, not per batch).
    pub(crate) fn limit(mut self, max_producers: usize) -> Self {
        self.max_producers = max_producers.max(1);
        self
    }

    /// Applies the limit (see [`ProducerState::limit`]).
    fn forget_beyond_limit(&mut self) {
        if self.producers.len() <= self.max_producers {
            return;
        }
        let keep = self.max_producers - self.max_producers / 10;
        let mut idle: Vec<(i64, i64)> =
            self.producers.iter().filter(|(_, e)| e.txn_first_offset.is_none()).map(|(&id, e)| (e.last_timestamp, id)).collect();
        let excess = (self.producers.len() - keep).min(idle.len());
        if excess == 0 {
            return;
        }
        idle.select_nth_unstable(excess - 1);
        for (_, id) in &idle[..excess] {
            self.producers.remove(id);
        }
        self.forgotten_unlogged += excess;
        let now = fjord_record::now_ms();
        if now.saturating_sub(self.last_warning_ms) >= 60_000 {
            tracing::warn!(
                dir = %self.dir.display(),
                forgotten = self.forgotten_unlogged,
                limit = self.max_producers,
                "more producer ids than producer.id.max.per.partition: forgot the longest idle (logged at most once a minute)"
            );
            (self.forgotten_unlogged, self.last_warning_ms) = (0, now);
        }
    }

    /// Leader checks of an append's batches, in order, as if the earlier ones were
    /// applied. `Some` when the append is a retry of a batch already in the log: its
    /// offsets (the whole append is then skipped, as Kafka does).
    pub(crate) fn check(&self, headers: &[(usize, BatchHeader)]) -> Result<Option<BatchMetadata>> {
        if let [(_, h)] = headers {
            // One batch, the common append (a produce request carries one batch per
            // partition): checked against the state itself, without the scratch copy
            // below and its allocations on every append.
            return match self.producers.get(&h.producer_id) {
                Some(entry) if is_idempotent(h) => entry.check(h.producer_id, h),
                _ => Ok(None),
            };
        }
        let mut pending: HashMap<i64, ProducerEntry> = HashMap::new();
        for (_, h) in headers.iter().filter(|(_, h)| is_idempotent(h)) {
            let entry = match pending.get(&h.producer_id).or_else(|| self.producers.get(&h.producer_id)) {
                Some(e) => e,
                None => {
                    // Unknown: any sequence starts it.
                    let mut entry = ProducerEntry::new(h.producer_epoch, 0);
                    entry.apply(h);
                    pending.insert(h.producer_id, entry);
                    continue;
                }
            };
            if let Some(dup) = entry.check(h.producer_id, h)? {
                return Ok(Some(dup));
            }
            let mut next = entry.clone();
            next.apply(h);
            pending.insert(h.producer_id, next);
        }
        Ok(None)
    }

    /// Records appended data batches (their offsets final); control batches go through
    /// [`ProducerState::apply_control`]. Returns the transactions they opened.
    pub(crate) fn apply(&mut self, headers: &[(usize, BatchHeader)]) -> Vec<TxnStarted> {
        let mut events = Vec::new();
        for (_, h) in headers.iter().filter(|(_, h)| is_idempotent(h)) {
            let entry = self.producers.entry(h.producer_id).or_insert_with(|| ProducerEntry::new(h.producer_epoch, i64::MIN));
            if let Some(first_offset) = entry.apply(h) {
                self.open.insert(first_offset, h.producer_id);
                events.push(TxnStarted { producer_id: h.producer_id, first_offset });
            }
        }
        self.forget_beyond_limit();
        events
    }

    /// A copy of what applying batches of `producer_ids` reads and changes: their
    /// entries and the open transactions, not every producer the partition knows (a
    /// partition of a busy topic may know tens of thousands, and every marker would
    /// copy them all). Applied, it goes back with [`ProducerState::merge`].
    pub(crate) fn scoped(&self, producer_ids: impl IntoIterator<Item = i64>) -> ProducerState {
        let producers =
            producer_ids.into_iter().filter_map(|id| Some((id, self.producers.get(&id)?.clone()))).collect::<HashMap<_, _>>();
        ProducerState { producers, open: self.open.clone(), ..ProducerState::new(&self.dir) }
    }

    /// Takes the entries and open transactions of `scoped`, made from this state by
    /// [`ProducerState::scoped`] (for every producer whose batches were applied to it).
    pub(crate) fn merge(&mut self, scoped: ProducerState) {
        self.producers.extend(scoped.producers);
        self.open = scoped.open;
        self.forget_beyond_limit();
    }

    /// Leader check of a marker for `producer_id` at `producer_epoch` from a coordinator
    /// at `coordinator_epoch`, before it is appended: an older producer epoch is fenced
    /// ([`Error::InvalidProducerEpoch`], Kafka's answer since 2.7), an older coordinator
    /// epoch too ([`Error::TransactionCoordinatorFenced`]). A producer this partition
    /// does not know passes: Kafka writes its marker, which records the (possibly bumped)
    /// epoch that fences the producer's older incarnations here.
    pub(crate) fn check_marker(&self, producer_id: i64, producer_epoch: i16, coordinator_epoch: i32) -> Result<()> {
        let Some(entry) = self.producers.get(&producer_id) else {
            return Ok(());
        };
        if producer_epoch < entry.epoch {
            return Err(Error::InvalidProducerEpoch { producer_id, epoch: producer_epoch, current: entry.epoch });
        }
        if coordinator_epoch < entry.coordinator_epoch {
            return Err(Error::TransactionCoordinatorFenced { producer_id, coordinator_epoch, current: entry.coordinator_epoch });
        }
        Ok(())
    }

    /// Records an appended control batch (`h`, offsets final, with what it holds). An
    /// end-transaction marker closes the producer's open transaction, if any, and
    /// returns it; other control records change nothing.
    pub(crate) fn apply_control(&mut self, h: &BatchHeader, control: Control) -> Option<CompletedTxn> {
        let Control::EndTxn { commit, coordinator_epoch } = control else {
            return None;
        };
        if h.producer_id < 0 {
            return None;
        }
        let entry = self.producers.entry(h.producer_id).or_insert_with(|| ProducerEntry::new(h.producer_epoch, i64::MIN));
        entry.set_epoch(h.producer_epoch);
        entry.coordinator_epoch = coordinator_epoch;
        entry.last_timestamp = entry.last_timestamp.max(seen_at(h));
        let first_offset = entry.txn_first_offset.take()?;
        self.open.remove(&first_offset);
        let last_stable_offset = self.open.keys().next().copied().unwrap_or(h.base_offset + 1);
        Some(CompletedTxn {
            producer_id: h.producer_id,
            first_offset,
            last_offset: h.base_offset,
            aborted: !commit,
            last_stable_offset,
        })
    }

    /// Whether `producer_id` has a transaction open in this partition.
    pub(crate) fn in_transaction(&self, producer_id: i64) -> bool {
        self.producers.get(&producer_id).is_some_and(|e| e.txn_first_offset.is_some())
    }

    /// First offsets of the open transactions, with their producer ids, in offset order.
    pub(crate) fn open_transactions(&self) -> impl Iterator<Item = (Offset, i64)> + '_ {
        self.open.iter().map(|(&offset, &pid)| (offset, pid))
    }

    /// Rebuilds `open` from the entries (after loading or pruning them).
    fn reindex_open(&mut self) {
        self.open = self.producers.iter().filter_map(|(&pid, e)| Some((e.txn_first_offset?, pid))).collect();
    }

    pub(crate) fn info(&self) -> Vec<ProducerInfo> {
        let mut out: Vec<ProducerInfo> = self
            .producers
            .iter()
            .filter_map(|(&producer_id, e)| {
                let last = e.batches.back()?;
                Some(ProducerInfo {
                    producer_id,
                    epoch: e.epoch,
                    last_sequence: last.last_seq,
                    last_offset: last.last_offset,
                    last_timestamp: e.last_timestamp,
                    coordinator_epoch: e.coordinator_epoch,
                    txn_start_offset: e.txn_first_offset,
                })
            })
            .collect();
        out.sort_by_key(|p| p.producer_id);
        out
    }

    /// Forgets producers idle (by batch timestamp) for at least `expiration_ms` at `now_ms`.
    /// Returns how many were removed.
    /// A producer with an open transaction never expires here (as Kafka): its marker
    /// still has to come, and the LSO waits for it.
    pub(crate) fn remove_expired(&mut self, now_ms: i64, expiration_ms: i64) -> usize {
        let before = self.producers.len();
        self.producers.retain(|_, e| e.txn_first_offset.is_some() || now_ms.saturating_sub(e.last_timestamp) < expiration_ms);
        before - self.producers.len()
    }

    /// After retention moved the log start: producers whose batches are all gone are
    /// forgotten (a follower rebuilding from the log could not know them either), and so
    /// are snapshots below the log start.
    pub(crate) fn on_log_start(&mut self, log_start: Offset) -> Result<()> {
        self.producers.retain(|_, e| still_in_log(e, log_start));
        self.reindex_open();
        for (offset, path) in list_snapshots(&self.dir)? {
            if offset < log_start {
                remove(&path)?;
            }
        }
        Ok(())
    }

    /// Writes `<offset>.snapshot` with the state as of `offset` (everything below it
    /// applied). Nothing to remember writes nothing.
    pub(crate) fn snapshot(&self, offset: Offset) -> Result<()> {
        if self.producers.is_empty() {
            return Ok(());
        }
        let mut lines: Vec<(i64, String)> = self
            .producers
            .iter()
            .map(|(pid, e)| {
                let txn_first_offset = e.txn_first_offset.unwrap_or(-1);
                let mut line = format!("{pid} {} {} {} {txn_first_offset}", e.epoch, e.last_timestamp, e.coordinator_epoch);
                for b in &e.batches {
                    line.push_str(&format!(" {} {} {} {}", b.first_seq, b.last_seq, b.first_offset, b.last_offset));
                }
                (*pid, line)
            })
            .collect();
        lines.sort_unstable_by_key(|(pid, _)| *pid);
        let lines: Vec<String> = lines.into_iter().map(|(_, l)| l).collect();
        checkpoint::write_lines(&snapshot_path(&self.dir, offset), &lines)
    }

    /// Rebuilds the state for a log holding `[log_start, log_end)` in `segments`: drops
    /// snapshots above `log_end` (truncated away), loads the latest readable one at or
    /// below `replay_from_at_most` (so everything from there on is replayed: after a
    /// crash, the unflushed part, whose aborted-transactions index may be incomplete),
    /// and replays the batch headers after it, reading the record of each control batch. Without a snapshot the whole log is replayed.
    /// Returns where the replay started and the transactions it saw aborted, with the
    /// base offset of the segment holding each marker: what the aborted-transactions
    /// index of those segments must hold from that offset on.
    pub(crate) fn reload<'a>(
        &mut self,
        segments: impl Iterator<Item = &'a std::sync::Arc<Segment>>,
        log_start: Offset,
        log_end: Offset,
        replay_from_at_most: Offset,
    ) -> Result<Replayed> {
        self.producers.clear();
        let mut from = log_start;
        let mut snapshots = list_snapshots(&self.dir)?;
        while let Some((offset, path)) = snapshots.pop() {
            if offset > log_end {
                remove(&path)?;
                continue;
            }
            let read = read_snapshot(&path);
            match read {
                // Kept for later opens, but the replay must start lower.
                Ok(_) if offset > replay_from_at_most => {}
                Ok(producers) => {
                    self.producers = producers;
                    from = from.max(offset);
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "removing an unreadable producer state snapshot");
                    remove(&path)?;
                }
            }
        }
        self.producers.retain(|_, e| still_in_log(e, log_start));
        // A snapshot written under a higher limit (or before there was one).
        self.forget_beyond_limit();
        self.reindex_open();
        let mut aborted = Vec::new();
        for seg in segments {
            let path = seg.path(LOG_SUFFIX);
            let size = seg.size();
            // Skip segments that end before `from`: the next segment starts at or below it.
            // Damage stops the replay there: reads fail at it too, and the state only
            // needs the producers' latest batches, which are after a snapshot.
            let position = match seg.find_batch(from, size) {
                Ok(Some((position, _))) => position,
                Ok(None) => continue,
                Err(Error::CorruptSegment { .. }) => break,
                Err(e) => return Err(e),
            };
            let file = seg.log()?;
            let mut walk = Walker::new(&file, position, size);
            while let Step::Batch { header, position } = walk.step(false).at(&path)? {
                if header.base_offset < from || header.base_offset >= log_end {
                    continue;
                }
                if !header.is_control() {
                    self.apply(&[(0, header)]);
                    continue;
                }
                let bytes = walk.batch_bytes(position, header.size()).at(&path)?;
                let Some(control) = read_control(&header, bytes) else { continue };
                if let Some(txn) = self.apply_control(&header, control).filter(|t| t.aborted) {
                    aborted.push((seg.base_offset, txn));
                }
            }
        }
        Ok(Replayed { from, aborted })
    }

    /// The log was emptied: no state, no snapshots.
    pub(crate) fn clear(&mut self) -> Result<()> {
        self.producers.clear();
        self.open.clear();
        for (_, path) in list_snapshots(&self.dir)? {
            remove(&path)?;
        }
        Ok(())
    }
}

/// What [`ProducerState::reload`] replayed.
#[derive(Debug, Default)]
pub(crate) struct Replayed {
    /// The replay started here: the state below came from a snapshot.
    pub(crate) from: Offset,
    /// Transactions aborted by markers at or after `from`, with the base offset of the
    /// segment holding the marker, in log order.
    pub(crate) aborted: Vec<(Offset, CompletedTxn)>,
}

/// Whether a producer's state still matters once the log starts at `log_start`: its
/// latest batch is still there, or it has a transaction open (retention never passes
/// an open transaction's first offset).
fn still_in_log(e: &ProducerEntry, log_start: Offset) -> bool {
    e.txn_first_offset.is_some() || e.batches.back().is_some_and(|b| b.last_offset >= log_start)
}

/// The control record of a control batch as written in the log; `None` (with a warning)
/// when it does not read as one, which only a broker bug or damage past the CRC could
/// make: such a batch changes no transaction.
pub(crate) fn read_control(header: &BatchHeader, batch: &[u8]) -> Option<Control> {
    match control::parse_marker(header, batch) {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!(offset = header.base_offset, error = %e, "ignoring an unreadable control batch");
            None
        }
    }
}

pub(crate) fn snapshot_path(dir: &Path, offset: Offset) -> PathBuf {
    dir.join(format!("{offset:020}.{SNAPSHOT_SUFFIX}"))
}

fn remove(path: &Path) -> Result<()> {
    crate::recovery::remove_if_exists(&path.to_path_buf())
}

/// Snapshot files of `dir`, by offset.
fn list_snapshots(dir: &Path) -> Result<Vec<(Offset, PathBuf)>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).at(dir)? {
        let entry = entry.at(dir)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".snapshot") else {
            continue;
        };
        if stem.len() == 20 && stem.bytes().all(|b| b.is_ascii_digit()) {
            if let Ok(offset) = stem.parse() {
                out.push((offset, entry.path()));
            }
        }
    }
    out.sort_unstable();
    Ok(out)
}

fn read_snapshot(path: &Path) -> Result<HashMap<i64, ProducerEntry>> {
    let mut out = HashMap::new();
    for (i, fields) in checkpoint::read_lines(path)?.unwrap_or_default().into_iter().enumerate() {
        let bad = |detail| Error::MalformedCheckpoint { path: path.to_path_buf(), line: i + 3, detail };
        let nums: Vec<i64> =
            fields.iter().map(|f| f.parse::<i64>()).collect::<std::result::Result<_, _>>().map_err(|_| bad("not a number"))?;
        // 5 + 4n fields since transactions, 3 + 4n before (no coordinator epoch, no
        // open transaction): the counts never coincide.
        let (pid, epoch, last_timestamp, coordinator_epoch, txn_first_offset, rest) = match nums.as_slice() {
            [pid, epoch, ts, cepoch, txn, rest @ ..] if rest.len() % 4 == 0 => (pid, epoch, ts, *cepoch, *txn, rest),
            [pid, epoch, ts, rest @ ..] if rest.len() % 4 == 0 => (pid, epoch, ts, -1, -1, rest),
            _ => return Err(bad("expected `producer_id epoch last_timestamp [coordinator_epoch txn_first_offset] batches...`")),
        };
        if rest.len() / 4 > MAX_CACHED_BATCHES {
            return Err(bad("at most five batches"));
        }
        let epoch = i16::try_from(*epoch).map_err(|_| bad("epoch out of range"))?;
        let coordinator_epoch = i32::try_from(coordinator_epoch).map_err(|_| bad("coordinator epoch out of range"))?;
        let txn_first_offset = match txn_first_offset {
            -1 => None,
            o if o >= 0 => Some(o),
            _ => return Err(bad("negative transaction offset")),
        };
        let seq = |v: i64| i32::try_from(v).map_err(|_| bad("sequence out of range"));
        let mut batches = VecDeque::new();
        for b in rest.chunks_exact(4) {
            batches.push_back(BatchMetadata {
                first_seq: seq(b[0])?,
                last_seq: seq(b[1])?,
                first_offset: b[2],
                last_offset: b[3],
            });
        }
        out.insert(*pid, ProducerEntry { epoch, batches, last_timestamp: *last_timestamp, coordinator_epoch, txn_first_offset });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(pid: i64, epoch: i16, seq: i32, records: i32, offset: Offset) -> (usize, BatchHeader) {
        stamped_header(pid, epoch, seq, records, offset, 1_000)
    }

    fn stamped_header(pid: i64, epoch: i16, seq: i32, records: i32, offset: Offset, timestamp: i64) -> (usize, BatchHeader) {
        let mut b = fjord_record::BatchBuilder::new(timestamp).producer(pid, epoch, seq);
        for _ in 0..records {
            b.append(timestamp, None, Some(b"v"), &[]);
        }
        let mut bytes = b.build_vec();
        fjord_record::batch::set_base_offset(&mut bytes, offset);
        (0, BatchHeader::parse(&bytes).unwrap())
    }

    #[test]
    fn duplicates_gaps_and_epochs() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = ProducerState::new(dir.path());
        // Unknown producer: any sequence is accepted.
        assert_eq!(s.check(&[header(7, 0, 42, 3, 0)]).unwrap(), None);
        s.apply(&[header(7, 0, 42, 3, 0)]);
        // The same batch again is a duplicate with its original offsets.
        let dup = s.check(&[header(7, 0, 42, 3, 99)]).unwrap().unwrap();
        assert_eq!((dup.first_offset, dup.last_offset), (0, 2));
        // A gap, and a batch overlapping but not equal to a cached one.
        assert!(matches!(s.check(&[header(7, 0, 46, 1, 3)]), Err(Error::OutOfOrderSequence { expected: 45, found: 46, .. })));
        assert!(matches!(s.check(&[header(7, 0, 43, 2, 3)]), Err(Error::OutOfOrderSequence { .. })));
        // In sequence, and two batches in one append.
        assert_eq!(s.check(&[header(7, 0, 45, 1, 3), header(7, 0, 46, 1, 4)]).unwrap(), None);
        assert!(s.check(&[header(7, 0, 45, 1, 3), header(7, 0, 47, 1, 4)]).is_err());
        // Older epoch: fenced; newer epoch must start at 0.
        s.apply(&[header(7, 2, 0, 1, 3)]);
        assert!(matches!(s.check(&[header(7, 1, 1, 1, 4)]), Err(Error::InvalidProducerEpoch { current: 2, .. })));
        assert!(matches!(s.check(&[header(7, 3, 5, 1, 4)]), Err(Error::OutOfOrderSequence { expected: 0, .. })));
        assert_eq!(s.check(&[header(7, 3, 0, 1, 4)]).unwrap(), None);
        // Other producers and non-idempotent batches are independent.
        assert_eq!(s.check(&[header(8, 0, 0, 1, 4), header(-1, -1, -1, 1, 5)]).unwrap(), None);
    }

    /// A batch of producer `pid` at sequence 0 stamped `timestamp`.
    fn header_at(pid: i64, timestamp: i64, offset: Offset) -> (usize, BatchHeader) {
        stamped_header(pid, 0, 0, 1, offset, timestamp)
    }

    #[test]
    fn past_the_limit_the_longest_idle_producers_are_forgotten_never_one_in_a_transaction() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = ProducerState::new(dir.path()).limit(100);
        // The oldest of all, but in a transaction.
        s.apply(&[txn_header(1, 0, 0, 1, 0)]);
        for pid in 2..=1_000 {
            s.apply(&[header_at(pid, 10_000 + pid, pid)]);
            assert!(s.producers.len() <= 100, "{} producers after {pid}", s.producers.len());
        }
        assert!(s.in_transaction(1));
        assert_eq!(s.open_transactions().collect::<Vec<_>>(), [(0, 1)]);
        // The most recently active are all remembered: a retry of each is recognized.
        for pid in 950..=1_000 {
            assert!(s.check(&[header_at(pid, 10_000 + pid, 5_000)]).unwrap().is_some(), "producer {pid} forgotten");
        }
        // The longest idle were forgotten, and start again at any sequence.
        assert!(!s.producers.contains_key(&2));
        assert_eq!(s.check(&[header(2, 0, 17, 1, 5_000)]).unwrap(), None);
        // A snapshot taken under a higher limit is cut to the limit when loaded.
        s.snapshot(1_001).unwrap();
        let mut lower = ProducerState::new(dir.path()).limit(10);
        lower.reload(std::iter::empty(), 0, 1_001, 1_001).unwrap();
        assert!(lower.producers.len() <= 10 && lower.in_transaction(1), "{}", lower.producers.len());
    }

    #[test]
    fn a_flood_of_made_up_producer_ids_stays_within_the_default_limit() {
        let dir = tempfile::tempdir().unwrap();
        let limit = crate::LogConfig::default().max_producers;
        let mut s = ProducerState::new(dir.path()).limit(limit);
        for pid in 0..20 * limit as i64 {
            s.apply(&[header_at(pid, 1_000, pid)]);
        }
        assert!(s.producers.len() <= limit && s.producers.len() >= limit * 9 / 10, "{}", s.producers.len());
    }

    #[test]
    fn only_the_last_five_batches_are_remembered_and_sequences_wrap() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = ProducerState::new(dir.path());
        for i in 0..7 {
            s.apply(&[header(1, 0, i, 1, i64::from(i))]);
        }
        assert!(s.check(&[header(1, 0, 2, 1, 9)]).unwrap().is_some());
        // Seq 1 fell out of the cache: it is no longer a duplicate but a gap.
        assert!(matches!(s.check(&[header(1, 0, 1, 1, 9)]), Err(Error::OutOfOrderSequence { .. })));
        s.apply(&[header(2, 0, i32::MAX - 1, 2, 10)]);
        assert_eq!(s.info()[1].last_sequence, i32::MAX);
        assert_eq!(s.check(&[header(2, 0, 0, 1, 12)]).unwrap(), None);
    }

    fn txn_header(pid: i64, epoch: i16, seq: i32, records: i32, offset: Offset) -> (usize, BatchHeader) {
        let mut b = fjord_record::BatchBuilder::new(1_000).producer(pid, epoch, seq).transactional();
        for _ in 0..records {
            b.append(1_000, None, Some(b"v"), &[]);
        }
        let mut bytes = b.build_vec();
        fjord_record::batch::set_base_offset(&mut bytes, offset);
        (0, BatchHeader::parse(&bytes).unwrap())
    }

    fn marker(pid: i64, epoch: i16, offset: Offset) -> BatchHeader {
        let mut bytes = control::end_txn_marker(pid, epoch, 0, true, 1_000);
        fjord_record::batch::set_base_offset(&mut bytes, offset);
        BatchHeader::parse(&bytes).unwrap()
    }

    fn end(commit: bool, coordinator_epoch: i32) -> Control {
        Control::EndTxn { commit, coordinator_epoch }
    }

    #[test]
    fn transactions_open_at_their_first_batch_and_close_at_their_marker() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = ProducerState::new(dir.path());
        // Producer 1 opens at 0, producer 2 at 2; producer 1's second batch keeps 0.
        assert_eq!(s.apply(&[txn_header(1, 0, 0, 2, 0)]), vec![TxnStarted { producer_id: 1, first_offset: 0 }]);
        assert_eq!(s.apply(&[txn_header(2, 0, 0, 1, 2)]), vec![TxnStarted { producer_id: 2, first_offset: 2 }]);
        assert!(s.apply(&[txn_header(1, 0, 2, 1, 3)]).is_empty());
        assert_eq!(s.open_transactions().collect::<Vec<_>>(), vec![(0, 1), (2, 2)]);
        // Inside its transaction a producer may not write outside it.
        assert!(matches!(s.check(&[header(1, 0, 3, 1, 4)]), Err(Error::InvalidTxnState { producer_id: 1, first_offset: 0 })));
        assert_eq!(s.check(&[txn_header(1, 0, 3, 1, 4)]).unwrap(), None);
        // Producer 1 aborts at 4: the LSO after it is producer 2's first offset.
        let done = s.apply_control(&marker(1, 0, 4), end(false, 5)).unwrap();
        assert_eq!(done, CompletedTxn { producer_id: 1, first_offset: 0, last_offset: 4, aborted: true, last_stable_offset: 2 });
        // Producer 2 commits at 5: nothing open, the LSO is past the marker.
        let done = s.apply_control(&marker(2, 0, 5), end(true, 5)).unwrap();
        assert_eq!((done.aborted, done.last_stable_offset), (false, 6));
        assert_eq!(s.open_transactions().count(), 0);
        // A retried marker closes nothing; plain batches are fine again.
        assert_eq!(s.apply_control(&marker(2, 0, 6), end(true, 5)), None);
        assert_eq!(s.check(&[header(1, 0, 3, 1, 7)]).unwrap(), None);
        // Other control records change nothing.
        assert_eq!(s.apply_control(&marker(1, 0, 7), Control::Other { control_type: 3 }), None);
    }

    #[test]
    fn markers_from_fenced_producers_or_coordinators_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = ProducerState::new(dir.path());
        // Unknown producer: Kafka writes the marker, which records its epoch.
        s.check_marker(9, 0, 0).unwrap();
        s.apply(&[txn_header(9, 2, 0, 1, 0)]);
        s.apply_control(&marker(9, 2, 1), end(false, 4)).unwrap();
        assert!(matches!(s.check_marker(9, 1, 4), Err(Error::InvalidProducerEpoch { epoch: 1, current: 2, .. })));
        assert!(matches!(
            s.check_marker(9, 2, 3),
            Err(Error::TransactionCoordinatorFenced { coordinator_epoch: 3, current: 4, .. })
        ));
        s.check_marker(9, 3, 4).unwrap();
        // A marker at a bumped epoch fences the producer's older batches here.
        s.apply_control(&marker(9, 3, 2), end(false, 4));
        assert!(matches!(s.check(&[txn_header(9, 2, 1, 1, 3)]), Err(Error::InvalidProducerEpoch { current: 3, .. })));
        assert_eq!(s.check(&[txn_header(9, 3, 0, 1, 3)]).unwrap(), None);
    }

    #[test]
    fn open_transactions_survive_snapshots_expiry_and_retention() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = ProducerState::new(dir.path());
        s.apply(&[txn_header(1, 0, 0, 1, 10)]);
        s.apply(&[header(2, 0, 0, 1, 11)]);
        s.apply_control(&marker(2, 0, 12), end(true, 7));
        s.snapshot(13).unwrap();
        let loaded = read_snapshot(&snapshot_path(dir.path(), 13)).unwrap();
        assert_eq!(loaded, s.producers);
        assert_eq!(loaded[&1].txn_first_offset, Some(10));
        assert_eq!(loaded[&2].coordinator_epoch, 7);
        // Expiry and a log start past its batches keep a producer with an open transaction.
        assert_eq!(s.remove_expired(i64::MAX, 1), 1);
        s.on_log_start(12).unwrap();
        assert_eq!(s.open_transactions().collect::<Vec<_>>(), vec![(10, 1)]);
        // Snapshots written before transactions (3 + 4n fields) still read.
        checkpoint::write_lines(&snapshot_path(dir.path(), 20), &["5 1 1000 0 0 3 3".to_owned()]).unwrap();
        let old = read_snapshot(&snapshot_path(dir.path(), 20)).unwrap();
        assert_eq!((old[&5].epoch, old[&5].coordinator_epoch, old[&5].txn_first_offset), (1, -1, None));
        checkpoint::write_lines(&snapshot_path(dir.path(), 21), &["5 1 1000 0 0 3".to_owned()]).unwrap();
        assert!(read_snapshot(&snapshot_path(dir.path(), 21)).is_err());
    }

    #[test]
    fn a_batch_stamped_in_the_future_does_not_keep_its_producer_from_expiring() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = ProducerState::new(dir.path());
        let mut b = fjord_record::BatchBuilder::new(i64::MAX / 2).producer(1, 0, 0);
        b.append(i64::MAX / 2, None, Some(b"v"), &[]);
        let bytes = b.build_vec();
        s.apply(&[(0, BatchHeader::parse(&bytes).unwrap())]);
        let now = fjord_record::now_ms();
        assert_eq!(s.remove_expired(now + 60_000, 3_600_000), 0);
        assert_eq!(s.remove_expired(now + 3_600_000 + 60_000, 3_600_000), 1);
    }

    #[test]
    fn snapshots_round_trip_expiry_and_eviction() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = ProducerState::new(dir.path());
        s.apply(&[header(1, 0, 0, 2, 0), header(2, 4, 10, 1, 2)]);
        s.snapshot(3).unwrap();
        let loaded = read_snapshot(&snapshot_path(dir.path(), 3)).unwrap();
        assert_eq!(loaded, s.producers);
        fs::write(snapshot_path(dir.path(), 5), "0\n1\n1 x\n").unwrap();
        assert!(matches!(read_snapshot(&snapshot_path(dir.path(), 5)), Err(Error::MalformedCheckpoint { .. })));
        s.on_log_start(2).unwrap();
        assert_eq!(s.info().iter().map(|p| p.producer_id).collect::<Vec<_>>(), vec![2]);
        assert_eq!(list_snapshots(dir.path()).unwrap().len(), 2);
        assert_eq!(s.remove_expired(1_000 + 999, 1_000), 0);
        assert_eq!(s.remove_expired(1_000 + 1_000, 1_000), 1);
        s.on_log_start(4).unwrap();
        assert_eq!(list_snapshots(dir.path()).unwrap().len(), 1);
        s.clear().unwrap();
        assert!(list_snapshots(dir.path()).unwrap().is_empty());
    }
}
