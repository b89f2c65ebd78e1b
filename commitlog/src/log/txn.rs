//! Transactions in a partition: writing markers, the producer state's open
//! transactions, the last stable offset (LSO) and the aborted-transactions index.
//!
//! The LSO is the first offset a read_committed consumer may not read yet: the first
//! offset of the earliest transaction still undecided, never above the high watermark.
//! A transaction is undecided while it is open, and also once its marker is appended
//! until the high watermark passes the marker: before that the marker could still be
//! truncated away on a leader change (as Kafka's "unreplicated" transactions). Readers
//! compute the LSO from `Log::unstable` (first offset -> marker offset once decided)
//! without the writer lock; the writer keeps it in step with the producer state.
//!
//! A partition leader takes a transactional batch that would open its producer's
//! transaction here only once the transaction coordinator confirmed the partition is in
//! that transaction (KIP-890's verification, done by the broker): the leader first takes
//! a [`VerificationGuard`] for the producer, asks the coordinator, and appends under the
//! guard. Any transactional batch or marker of that producer appended meanwhile (an
//! abort at the transaction's timeout, say) drops the guard, so an answer that came
//! back stale cannot open a transaction the coordinator no longer knows of, whose
//! marker would never come.
//!
//! An append holding control batches works out its effect on the producer state on a
//! copy first, so the ABORT entries of the `.txnindex` are written before the log bytes
//! and taken back if those fail: the state, the index and the log change together or
//! not at all.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fjord_record::batch::{self, BatchHeader};
use fjord_record::{control, Offset};

use super::{now_ms, AppendInfo, Log, Writer};
use crate::producer_state::{read_control, CompletedTxn, ProducerState, TxnStarted};
use crate::segment::Segment;
use crate::txn_index::{self, AbortedTxn};
use crate::{lock, Error, Result};

/// Undecided transactions: first offset -> the marker's offset once one is appended.
pub(super) type Unstable = BTreeMap<Offset, Option<Offset>>;

/// A leader's claim that it asked the transaction coordinator about a producer's
/// transaction in this partition (see the module docs); unique over the process, so
/// an answer to an earlier question never passes for a later one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerificationGuard(u64);

/// How a leader append takes a transactional batch whose producer has no transaction
/// open in this log yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnVerification {
    /// As it is: verification is off (`transaction.partition.verification.enable`).
    Off,
    /// Only under this guard, if it is still the producer's (`None`: the request was
    /// not verified, so only batches continuing an open transaction pass).
    Required(Option<VerificationGuard>),
}

/// Verifications under way, by producer id.
#[derive(Debug, Default)]
pub(super) struct Verifications(HashMap<i64, Verification>);

/// One producer's verification under way.
#[derive(Debug)]
struct Verification {
    guard: VerificationGuard,
    started: Instant,
    /// Requests that took the guard and have not failed: a failed one drops the guard
    /// only when it was the last, so a request verified meanwhile still appends.
    users: u32,
}

/// Past this many verifications under way, those older than [`VERIFICATION_TTL`] go.
/// Each is a request waiting for the coordinator, or one it answered whose append
/// failed; a failed verification removes its own.
const VERIFICATIONS_SWEPT_AT: usize = 1024;
/// Longer than any request waits for a coordinator's answer.
const VERIFICATION_TTL: Duration = Duration::from_secs(120);

impl Verifications {
    /// The producer's guard: the one under way (a retry, or a second request of the
    /// same transaction), else a new one.
    fn start(&mut self, producer_id: i64) -> VerificationGuard {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        if self.0.len() >= VERIFICATIONS_SWEPT_AT {
            self.0.retain(|_, v| v.started.elapsed() < VERIFICATION_TTL);
        }
        let v = self.0.entry(producer_id).or_insert_with(|| Verification {
            guard: VerificationGuard(NEXT.fetch_add(1, Ordering::Relaxed)),
            started: Instant::now(),
            users: 0,
        });
        v.users += 1;
        v.guard
    }

    fn holds(&self, producer_id: i64, guard: Option<VerificationGuard>) -> bool {
        guard.is_some_and(|g| self.0.get(&producer_id).is_some_and(|v| v.guard == g))
    }

    /// A request's verification of `guard` failed.
    fn cancel(&mut self, producer_id: i64, guard: VerificationGuard) {
        if let Some(v) = self.0.get_mut(&producer_id).filter(|v| v.guard == guard) {
            v.users = v.users.saturating_sub(1);
            if v.users == 0 {
                self.0.remove(&producer_id);
            }
        }
    }

    /// The producer's transaction here started or ended: its verification is spent.
    fn clear(&mut self, producer_id: i64) {
        self.0.remove(&producer_id);
    }
}

/// What an append does to the producer state, worked out before its bytes are written.
pub(super) enum ProducerUpdate {
    /// Data batches only: applied to the state after the write (it cannot fail).
    Data,
    /// With control batches: the state after the append, the transactions the markers
    /// ended, and the `.txnindex` length before the ABORT entries written for them.
    Control { state: Box<ProducerState>, started: Vec<TxnStarted>, completed: Vec<CompletedTxn>, index_len: u64 },
}

impl From<&CompletedTxn> for AbortedTxn {
    fn from(t: &CompletedTxn) -> Self {
        AbortedTxn {
            producer_id: t.producer_id,
            first_offset: t.first_offset,
            last_offset: t.last_offset,
            last_stable_offset: t.last_stable_offset,
        }
    }
}

impl Log {
    /// Leader append of the marker ending `producer_id`'s transaction (WriteTxnMarkers):
    /// COMMIT with `commit`, else ABORT, for the coordinator at `coordinator_epoch`. A
    /// marker at an older producer epoch than this log knows is
    /// [`Error::InvalidProducerEpoch`], from an older coordinator epoch
    /// [`Error::TransactionCoordinatorFenced`]; nothing is written then. A producer with
    /// no open transaction here still gets its marker (a retry, or a partition it never
    /// wrote to), as Kafka does. An ABORT adds the transaction to the `.txnindex` of the
    /// segment it lands in.
    pub fn append_marker(
        &self,
        producer_id: i64,
        producer_epoch: i16,
        coordinator_epoch: i32,
        commit: bool,
        leader_epoch: i32,
    ) -> Result<AppendInfo> {
        let config = self.config();
        let mut bytes = control::end_txn_marker(producer_id, producer_epoch, coordinator_epoch, commit, now_ms());
        let mut w = self.lock_writer()?;
        w.producers.check_marker(producer_id, producer_epoch, coordinator_epoch)?;
        batch::set_base_offset(&mut bytes, self.log_end_offset());
        batch::set_partition_leader_epoch(&mut bytes, leader_epoch);
        let header = BatchHeader::parse(&bytes).map_err(|source| Error::InvalidBatch { position: 0, source })?;
        self.append_validated(&mut w, &config, &bytes, &[(0, header)])
    }

    /// Starts the verification of `producer_id`'s next transactional batch: `None` when
    /// the producer has a transaction open here already (its batches need none), else
    /// the guard to append under once the coordinator confirmed the partition.
    pub fn start_txn_verification(&self, producer_id: i64) -> Result<Option<VerificationGuard>> {
        let mut w = self.lock_writer()?;
        if w.producers.in_transaction(producer_id) {
            return Ok(None);
        }
        Ok(Some(w.verifications.start(producer_id)))
    }

    /// A request's verification under `guard` failed: the guard goes unless another
    /// request took it meanwhile (or a later one replaced it).
    pub fn cancel_txn_verification(&self, producer_id: i64, guard: VerificationGuard) {
        lock::mutex(&self.writer).verifications.cancel(producer_id, guard);
    }

    /// The leader's check of an append's batches before anything is written (see
    /// [`TxnVerification`]): [`Error::TransactionNotVerified`] for a transactional batch
    /// that would open a transaction without its producer's current guard.
    pub(super) fn check_verified(w: &Writer, headers: &[(usize, BatchHeader)], verification: TxnVerification) -> Result<()> {
        let TxnVerification::Required(guard) = verification else { return Ok(()) };
        for (_, h) in headers {
            if h.is_transactional()
                && !h.is_control()
                && !w.producers.in_transaction(h.producer_id)
                && !w.verifications.holds(h.producer_id, guard)
            {
                return Err(Error::TransactionNotVerified { producer_id: h.producer_id });
            }
        }
        Ok(())
    }

    /// The last stable offset: where a read_committed consumer's data ends (see the
    /// module docs). Equal to the high watermark when no transaction is undecided.
    ///
    /// Never below the log start: DeleteRecords may move the start past the first offset
    /// of an open transaction (Kafka bounds it by the high watermark only), and then, as
    /// Kafka's first unstable offset, the LSO is the log start until the transaction is
    /// decided; its marker still ends it, and an abort still lists it for the fetches
    /// that overlap it.
    pub fn last_stable_offset(&self) -> Offset {
        let high_watermark = self.high_watermark();
        let log_start = self.log_start_offset();
        let mut unstable = lock::mutex(&self.unstable);
        // Decided and replicated: stable for good (the high watermark only goes back by
        // a truncation, which rebuilds this map).
        unstable.retain(|_, marker| marker.is_none_or(|m| m >= high_watermark));
        unstable.keys().next().map_or(high_watermark, |&first| first.max(log_start).min(high_watermark))
    }

    /// The first offsets of the transactions open in this log, with their producer ids.
    pub fn open_transactions(&self) -> Vec<(Offset, i64)> {
        lock::mutex(&self.writer).producers.open_transactions().collect()
    }

    /// The aborted transactions a read_committed fetch of the records in
    /// `[fetch_offset, upper)` must be told about: those with a marker at or after
    /// `fetch_offset` and a first offset below `upper`, from the `.txnindex` of the
    /// segment holding `fetch_offset` and the ones after it (see `crate::txn_index`).
    pub fn aborted_transactions(&self, fetch_offset: Offset, upper: Offset) -> Result<Vec<AbortedTxn>> {
        let view = self.view();
        let mut out = Vec::new();
        let floor = view.range(..=fetch_offset).next_back().map_or(Offset::MIN, |(&base, _)| base);
        for (_, seg) in view.range(floor..) {
            if txn_index::collect(seg, fetch_offset, upper, &mut out)? {
                break;
            }
        }
        Ok(out)
    }

    /// Before an append's bytes are written to `segment`: for an append with control
    /// batches, the producer state after it (on a copy of its producers' part) and the
    /// ABORT entries written to the segment's `.txnindex` (see the module docs).
    pub(super) fn prepare_producers(
        &self,
        w: &Writer,
        segment: &Segment,
        batches: &[u8],
        headers: &[(usize, BatchHeader)],
    ) -> Result<ProducerUpdate> {
        if !headers.iter().any(|(_, h)| h.is_control()) {
            return Ok(ProducerUpdate::Data);
        }
        let mut state = Box::new(w.producers.scoped(headers.iter().map(|(_, h)| h.producer_id)));
        let (mut started, mut completed) = (Vec::new(), Vec::new());
        for (at, h) in headers {
            if !h.is_control() {
                started.extend(state.apply(&[(*at, *h)]));
                continue;
            }
            let Some(control) = read_control(h, &batches[*at..]) else { continue };
            completed.extend(state.apply_control(h, control));
        }
        let index_len = segment.aborted_count();
        let aborted: Vec<AbortedTxn> = completed.iter().filter(|t| t.aborted).map(AbortedTxn::from).collect();
        if let Err(e) = txn_index::append(segment, &aborted) {
            // Whatever part of the entries reached the file goes again.
            let _ = txn_index::truncate(segment, index_len);
            return Err(e);
        }
        Ok(ProducerUpdate::Control { state, started, completed, index_len })
    }

    /// The append's bytes could not be written: the `.txnindex` entries go again.
    pub(super) fn undo_producers(&self, segment: &Segment, update: &ProducerUpdate) {
        if let ProducerUpdate::Control { index_len, .. } = update {
            if let Err(e) = txn_index::truncate(segment, *index_len) {
                // Derived data: the next open rebuilds it for this unflushed segment.
                tracing::warn!(dir = %self.dir.display(), error = %e, "could not take back aborted-transaction entries");
            }
        }
    }

    /// After the append's bytes are written: the producer state and the undecided
    /// transactions follow.
    pub(super) fn apply_producers(&self, w: &mut Writer, headers: &[(usize, BatchHeader)], update: ProducerUpdate) {
        for (_, h) in headers.iter().filter(|(_, h)| h.is_transactional()) {
            w.verifications.clear(h.producer_id);
        }
        let (started, completed) = match update {
            ProducerUpdate::Data => (w.producers.apply(headers), Vec::new()),
            ProducerUpdate::Control { state, started, completed, .. } => {
                w.producers.merge(*state);
                (started, completed)
            }
        };
        if started.is_empty() && completed.is_empty() {
            return;
        }
        let mut unstable = lock::mutex(&self.unstable);
        for s in started {
            unstable.insert(s.first_offset, None);
        }
        for c in completed {
            unstable.insert(c.first_offset, Some(c.last_offset));
        }
    }

    /// The undecided transactions are the open ones (after opening or truncating the log).
    pub(super) fn reset_unstable(&self, producers: &ProducerState) {
        *lock::mutex(&self.unstable) = producers.open_transactions().map(|(first, _)| (first, None)).collect();
    }
}

/// The `.txnindex` of `segments` after `ProducerState::reload` replayed them from
/// `replayed.from`: each file keeps its entries for markers below `from` and gets the
/// replayed aborts; the rest are set to what their files hold.
pub(super) fn rebuild_indexes<'a>(
    segments: impl Iterator<Item = &'a Arc<Segment>>,
    replayed: &crate::producer_state::Replayed,
) -> Result<()> {
    let mut aborted: BTreeMap<Offset, Vec<AbortedTxn>> = BTreeMap::new();
    for (base, txn) in &replayed.aborted {
        aborted.entry(*base).or_default().push(AbortedTxn::from(txn));
    }
    let segments: Vec<&Arc<Segment>> = segments.collect();
    for (i, seg) in segments.iter().enumerate() {
        let next_base = segments.get(i + 1).map_or(Offset::MAX, |s| s.base_offset);
        if next_base <= replayed.from {
            // Not replayed: the file is as flushed (its length was checked at open).
            seg.set_aborted(txn_index::entries_on_disk(seg)?.unwrap_or(0));
            continue;
        }
        let mut entries: Vec<AbortedTxn> =
            txn_index::read_all(seg)?.into_iter().filter(|e| e.last_offset < replayed.from).collect();
        entries.extend(aborted.remove(&seg.base_offset).unwrap_or_default());
        txn_index::rewrite(seg, &entries)?;
    }
    Ok(())
}
