//! One transactional id's state machine, without I/O: Kafka's transaction coordinator
//! states and the checks each request makes before it may move a transaction on.
//!
//! ```text
//!                 AddPartitions/AddOffsets                EndTxn(commit)
//!  Empty ─────────────────────────────► Ongoing ────────────────────────► PrepareCommit ── markers ──► CompleteCommit
//!    ▲  ▲                                 │  │   EndTxn(abort), timeout                                     │
//!    │  │ InitProducerId                  │  └────────────────────────────► PrepareAbort ─── markers ──► CompleteAbort
//!    │  └─────────────────────────────────┼────────────────────────────────────────────────────────────────┘ │
//!    │         InitProducerId on Ongoing: └──► PrepareEpochFence ──► PrepareAbort (bumped epoch)              │
//!    └────────────────── InitProducerId (bumped epoch) ◄─────────────────────────────────────────────────────┘
//!  Empty/CompleteCommit/CompleteAbort ── transactional.id.expiration.ms ──► Dead (tombstoned)
//! ```
//!
//! Every transition is computed on a copy: the caller gets the target [`TxnMetadata`],
//! writes it to `__transaction_state`, and only then makes it current. A transition that
//! failed to be written leaves the current state as it was.
//!
//! Errors are Kafka's, as [`ResponseError`]: PRODUCER_FENCED for an older epoch (the
//! handler answers INVALID_PRODUCER_EPOCH to versions older than KIP-588),
//! INVALID_PRODUCER_ID_MAPPING for a producer id that is not the id's, CONCURRENT_TRANSACTIONS
//! while a commit or abort is being completed (clients retry), INVALID_TXN_STATE for a
//! request that makes no sense in the state (commit after abort, EndTxn with nothing begun).

use std::collections::BTreeSet;

use kafka_protocol::error::ResponseError;
use serde::{Deserialize, Serialize};

/// The largest epoch handed out; at it the next bump takes a new producer id (Kafka keeps
/// `Short.MaxValue` free so that a fencing bump is always possible).
pub(crate) const MAX_EPOCH: i16 = i16::MAX - 1;

/// A transactional id's state, named as DescribeTransactions and ListTransactions report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum TxnState {
    Empty,
    Ongoing,
    PrepareCommit,
    PrepareAbort,
    CompleteCommit,
    CompleteAbort,
    Dead,
    PrepareEpochFence,
}

impl TxnState {
    /// Kafka's name for the state (DescribeTransactions, ListTransactions filters).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Empty => "Empty",
            Self::Ongoing => "Ongoing",
            Self::PrepareCommit => "PrepareCommit",
            Self::PrepareAbort => "PrepareAbort",
            Self::CompleteCommit => "CompleteCommit",
            Self::CompleteAbort => "CompleteAbort",
            Self::Dead => "Dead",
            Self::PrepareEpochFence => "PrepareEpochFence",
        }
    }

    /// Whether a transaction may move from `self` to `target` (Kafka's valid previous states).
    pub(crate) fn may_become(self, target: TxnState) -> bool {
        use TxnState::*;
        match target {
            Empty => matches!(self, Empty | CompleteCommit | CompleteAbort),
            Ongoing => matches!(self, Ongoing | Empty | CompleteCommit | CompleteAbort),
            PrepareCommit => self == Ongoing,
            PrepareAbort => matches!(self, Ongoing | PrepareEpochFence),
            CompleteCommit => self == PrepareCommit,
            CompleteAbort => self == PrepareAbort,
            Dead => matches!(self, Empty | CompleteCommit | CompleteAbort),
            PrepareEpochFence => self == Ongoing,
        }
    }

    /// Whether markers are owed to the transaction's partitions (a coordinator that loads
    /// the state sends them).
    pub(crate) fn is_prepared(self) -> bool {
        matches!(self, Self::PrepareCommit | Self::PrepareAbort)
    }
}

/// One transactional id as the coordinator keeps it and writes it to `__transaction_state`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TxnMetadata {
    pub(crate) transactional_id: String,
    pub(crate) producer_id: i64,
    /// The producer id before the last one was handed out because its epochs ran out;
    /// -1 when there was none. A retried InitProducerId may still name it.
    pub(crate) last_producer_id: i64,
    pub(crate) producer_epoch: i16,
    /// The epoch before the last bump (-1 when none): a retried request names it.
    pub(crate) last_producer_epoch: i16,
    pub(crate) timeout_ms: i32,
    pub(crate) state: TxnState,
    /// Partitions written in the open transaction (topic, partition).
    pub(crate) partitions: BTreeSet<(String, i32)>,
    /// Consumer groups whose offsets the open transaction commits (AddOffsetsToTxn).
    pub(crate) groups: BTreeSet<String>,
    /// When the open transaction began (its first partition); -1 when none is open.
    pub(crate) start_ms: i64,
    pub(crate) last_update_ms: i64,
}

/// What a verification asks the open transaction about ([`TxnMetadata::holds`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Held<'a> {
    /// A partition added with AddPartitionsToTxn.
    Partition(&'a str, i32),
    /// A group added with AddOffsetsToTxn.
    Group(&'a str),
    /// Any group added whose `__consumer_offsets` partition (of that many) this is.
    OffsetsPartition(i32, i32),
}

/// InitProducerId's request, as far as the state machine cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InitRequest {
    pub(crate) timeout_ms: i32,
    /// v3+: the producer id and epoch the client had (KIP-360), when it had one.
    pub(crate) expected: Option<(i64, i16)>,
}

/// What InitProducerId does to an existing transactional id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum InitPlan {
    /// Write the target (a bumped epoch in Empty) and answer with its producer id and epoch.
    Bump(TxnMetadata),
    /// The epochs of the producer id ran out: the caller allocates a new producer id and
    /// writes [`TxnMetadata::with_new_producer_id`].
    NewProducerId,
    /// A retry of an InitProducerId that already bumped: answer with the current id and
    /// epoch, write nothing.
    Retry,
    /// A transaction is open: write the target (PrepareAbort under a bumped epoch, which
    /// fences the old producer), send its abort markers, and answer CONCURRENT_TRANSACTIONS
    /// so the client asks again once the abort is complete.
    FenceAndAbort(TxnMetadata),
}

/// What EndTxn does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EndPlan {
    /// Write the target (PrepareCommit or PrepareAbort), answer, then send the markers.
    Prepare(TxnMetadata),
    /// The same EndTxn was already completed (a client retry): answer success.
    AlreadyDone,
}

impl TxnMetadata {
    /// A transactional id seen for the first time, or one whose producer id ran out of
    /// epochs (`previous`): `producer_id` at epoch 0, Empty.
    pub(crate) fn with_new_producer_id(
        transactional_id: &str,
        producer_id: i64,
        timeout_ms: i32,
        now_ms: i64,
        previous: Option<&TxnMetadata>,
    ) -> Self {
        Self {
            transactional_id: transactional_id.to_owned(),
            producer_id,
            last_producer_id: previous.map_or(-1, |p| p.producer_id),
            producer_epoch: 0,
            last_producer_epoch: previous.map_or(-1, |p| p.producer_epoch),
            timeout_ms,
            state: TxnState::Empty,
            partitions: BTreeSet::new(),
            groups: BTreeSet::new(),
            start_ms: -1,
            last_update_ms: now_ms,
        }
    }

    /// The checks every request of a producer makes: its producer id is the id's, its
    /// epoch the current one.
    fn check_producer(&self, producer_id: i64, epoch: i16) -> Result<(), ResponseError> {
        if producer_id != self.producer_id {
            return Err(ResponseError::InvalidProducerIdMapping);
        }
        if epoch != self.producer_epoch {
            return Err(ResponseError::ProducerFenced);
        }
        Ok(())
    }

    fn to(&self, state: TxnState, now_ms: i64) -> Self {
        debug_assert!(self.state.may_become(state), "{:?} -> {state:?}", self.state);
        Self { state, last_update_ms: now_ms, ..self.clone() }
    }

    /// InitProducerId on an existing transactional id.
    pub(crate) fn plan_init(&self, request: InitRequest, now_ms: i64) -> Result<InitPlan, ResponseError> {
        if let Some((producer_id, epoch)) = request.expected {
            let current = producer_id == self.producer_id && epoch == self.producer_epoch;
            // A retry whose first attempt bumped the epoch (or took a new producer id).
            let retried = epoch == self.last_producer_epoch
                && (producer_id == self.producer_id || producer_id == self.last_producer_id)
                && self.last_producer_epoch >= 0;
            if retried && matches!(self.state, TxnState::Empty) {
                return Ok(InitPlan::Retry);
            }
            // KIP-588: the epoch this producer had was bumped when its transaction was
            // aborted (at its timeout), and no newer producer took the id since (its
            // InitProducerId would have bumped again): it claims the bumped epoch and
            // goes on, instead of being told it is fenced.
            let aborted_under_it = producer_id == self.producer_id
                && epoch == self.last_producer_epoch
                && self.last_producer_epoch >= 0
                && self.state == TxnState::CompleteAbort;
            if !current && !aborted_under_it {
                return Err(ResponseError::ProducerFenced);
            }
        }
        match self.state {
            TxnState::PrepareCommit | TxnState::PrepareAbort => Err(ResponseError::ConcurrentTransactions),
            TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort => {
                if self.producer_epoch >= MAX_EPOCH {
                    return Ok(InitPlan::NewProducerId);
                }
                let mut target = self.to(TxnState::Empty, now_ms);
                target.last_producer_epoch = self.producer_epoch;
                target.last_producer_id = -1;
                target.producer_epoch = self.producer_epoch + 1;
                target.timeout_ms = request.timeout_ms;
                target.partitions.clear();
                target.groups.clear();
                target.start_ms = -1;
                Ok(InitPlan::Bump(target))
            }
            TxnState::Ongoing => Ok(InitPlan::FenceAndAbort(self.fenced_abort(now_ms))),
            // Fencing is written as PrepareAbort at once; a Dead id is gone from memory.
            TxnState::PrepareEpochFence | TxnState::Dead => Err(ResponseError::ConcurrentTransactions),
        }
    }

    /// The open transaction aborted under a bumped epoch, so that the producer that
    /// opened it is fenced (a new InitProducerId, or its transaction timed out).
    pub(crate) fn fenced_abort(&self, now_ms: i64) -> Self {
        let fence = self.to(TxnState::PrepareEpochFence, now_ms);
        let mut target = fence.to(TxnState::PrepareAbort, now_ms);
        if self.producer_epoch < MAX_EPOCH {
            target.last_producer_epoch = self.producer_epoch;
            target.producer_epoch = self.producer_epoch + 1;
        }
        target
    }

    /// AddPartitionsToTxn: `None` when every partition is in the transaction already
    /// (nothing to write).
    pub(crate) fn add_partitions(
        &self,
        producer_id: i64,
        epoch: i16,
        partitions: &[(String, i32)],
        now_ms: i64,
    ) -> Result<Option<Self>, ResponseError> {
        self.check_producer(producer_id, epoch)?;
        self.check_may_add()?;
        if self.state == TxnState::Ongoing && partitions.iter().all(|p| self.partitions.contains(p)) {
            return Ok(None);
        }
        let mut target = self.begin(now_ms);
        target.partitions.extend(partitions.iter().cloned());
        Ok(Some(target))
    }

    /// AddOffsetsToTxn: `None` when the group is in the transaction already.
    pub(crate) fn add_group(
        &self,
        producer_id: i64,
        epoch: i16,
        group: &str,
        now_ms: i64,
    ) -> Result<Option<Self>, ResponseError> {
        self.check_producer(producer_id, epoch)?;
        self.check_may_add()?;
        if self.state == TxnState::Ongoing && self.groups.contains(group) {
            return Ok(None);
        }
        let mut target = self.begin(now_ms);
        target.groups.insert(group.to_owned());
        Ok(Some(target))
    }

    /// KIP-890's verification of a write (AddPartitionsToTxn v4+ with verify_only, and a
    /// TxnOffsetCommit): the producer must be the id's current one, at its epoch, and the
    /// transaction not being ended, as Kafka's coordinator checks; then [`Self::holds`]
    /// says per partition or group whether the open transaction has it.
    pub(crate) fn verify(&self, producer_id: i64, epoch: i16) -> Result<(), ResponseError> {
        self.check_producer(producer_id, epoch)?;
        if self.state.is_prepared() || self.state == TxnState::PrepareEpochFence {
            return Err(ResponseError::ConcurrentTransactions);
        }
        Ok(())
    }

    /// Whether the open transaction holds `what`, added before (a partition, or a group's
    /// offsets by name or, as a broker asks Kafka's coordinator, by its partition of
    /// `__consumer_offsets`).
    pub(crate) fn holds(&self, what: Held<'_>) -> bool {
        self.state == TxnState::Ongoing
            && match what {
                Held::Partition(topic, p) => self.partitions.iter().any(|(t, q)| t == topic && *q == p),
                Held::Group(group) => self.groups.contains(group),
                Held::OffsetsPartition(p, count) => self.groups.iter().any(|g| super::partition_for(g, count) == p),
            }
    }

    fn check_may_add(&self) -> Result<(), ResponseError> {
        match self.state {
            TxnState::Empty | TxnState::Ongoing | TxnState::CompleteCommit | TxnState::CompleteAbort => Ok(()),
            TxnState::PrepareCommit | TxnState::PrepareAbort | TxnState::PrepareEpochFence => {
                Err(ResponseError::ConcurrentTransactions)
            }
            TxnState::Dead => Err(ResponseError::InvalidTxnState),
        }
    }

    /// The transaction as Ongoing: a new one starts now with nothing in it.
    fn begin(&self, now_ms: i64) -> Self {
        let mut target = self.to(TxnState::Ongoing, now_ms);
        if self.state != TxnState::Ongoing {
            target.partitions.clear();
            target.groups.clear();
            target.start_ms = now_ms;
        }
        target
    }

    /// EndTxn with `commit` (true) or abort.
    pub(crate) fn plan_end(&self, producer_id: i64, epoch: i16, commit: bool, now_ms: i64) -> Result<EndPlan, ResponseError> {
        if producer_id != self.producer_id {
            return Err(ResponseError::InvalidProducerIdMapping);
        }
        // A timed-out transaction was aborted under a bumped epoch: its producer is fenced.
        if epoch != self.producer_epoch {
            return Err(ResponseError::ProducerFenced);
        }
        match (self.state, commit) {
            (TxnState::Ongoing, true) => Ok(EndPlan::Prepare(self.to(TxnState::PrepareCommit, now_ms))),
            (TxnState::Ongoing, false) => Ok(EndPlan::Prepare(self.to(TxnState::PrepareAbort, now_ms))),
            (TxnState::CompleteCommit, true) | (TxnState::CompleteAbort, false) => Ok(EndPlan::AlreadyDone),
            (TxnState::PrepareCommit, true) | (TxnState::PrepareAbort, false) => Err(ResponseError::ConcurrentTransactions),
            (TxnState::PrepareEpochFence, _) => Err(ResponseError::ProducerFenced),
            _ => Err(ResponseError::InvalidTxnState),
        }
    }

    /// The transaction after its markers were written: CompleteCommit or CompleteAbort,
    /// with nothing in it. `None` unless it is prepared.
    pub(crate) fn complete(&self, now_ms: i64) -> Option<Self> {
        let state = match self.state {
            TxnState::PrepareCommit => TxnState::CompleteCommit,
            TxnState::PrepareAbort => TxnState::CompleteAbort,
            _ => return None,
        };
        let mut target = self.to(state, now_ms);
        target.partitions.clear();
        target.groups.clear();
        target.start_ms = -1;
        Some(target)
    }

    /// An open transaction past its timeout at `now_ms`: aborted under a bumped epoch (Kafka
    /// fences the producer that left it open).
    pub(crate) fn time_out(&self, now_ms: i64) -> Option<Self> {
        let timed_out = self.state == TxnState::Ongoing && now_ms.saturating_sub(self.start_ms) > i64::from(self.timeout_ms);
        timed_out.then(|| self.fenced_abort(now_ms))
    }

    /// Whether the id may be forgotten at `now_ms`: no transaction open or being completed
    /// for `expiration_ms` (`transactional.id.expiration.ms`).
    pub(crate) fn expired(&self, now_ms: i64, expiration_ms: i64) -> bool {
        self.idle() && now_ms.saturating_sub(self.last_update_ms) > expiration_ms
    }

    /// No transaction open or being completed: the id may be forgotten without leaving
    /// anything unfinished (at its expiry, or for the coordinator's limit on ids).
    pub(crate) fn idle(&self) -> bool {
        matches!(self.state, TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh() -> TxnMetadata {
        TxnMetadata::with_new_producer_id("t", 7, 60_000, 1_000, None)
    }

    fn tp(topic: &str, p: i32) -> (String, i32) {
        (topic.to_owned(), p)
    }

    fn ongoing() -> TxnMetadata {
        fresh().add_partitions(7, 0, &[tp("a", 0)], 2_000).unwrap().unwrap()
    }

    #[test]
    fn valid_previous_states_are_kafkas() {
        use TxnState::*;
        let all = [Empty, Ongoing, PrepareCommit, PrepareAbort, CompleteCommit, CompleteAbort, Dead, PrepareEpochFence];
        let allowed: Vec<(TxnState, TxnState)> =
            all.iter().flat_map(|&from| all.iter().map(move |&to| (from, to))).filter(|(f, t)| f.may_become(*t)).collect();
        let expected = vec![
            (Empty, Empty),
            (Empty, Ongoing),
            (Empty, Dead),
            (Ongoing, Ongoing),
            (Ongoing, PrepareCommit),
            (Ongoing, PrepareAbort),
            (Ongoing, PrepareEpochFence),
            (PrepareCommit, CompleteCommit),
            (PrepareAbort, CompleteAbort),
            (CompleteCommit, Empty),
            (CompleteCommit, Ongoing),
            (CompleteCommit, Dead),
            (CompleteAbort, Empty),
            (CompleteAbort, Ongoing),
            (CompleteAbort, Dead),
            (PrepareEpochFence, PrepareAbort),
        ];
        assert_eq!(allowed, expected);
    }

    #[test]
    fn commit_goes_through_prepare_to_complete_and_empties_the_transaction() {
        let t = ongoing().add_group(7, 0, "g", 2_500).unwrap().unwrap();
        assert_eq!(t.state, TxnState::Ongoing);
        assert_eq!(t.start_ms, 2_000, "adding to an open transaction keeps its start");
        let EndPlan::Prepare(prepared) = t.plan_end(7, 0, true, 3_000).unwrap() else { panic!("not prepared") };
        assert_eq!(prepared.state, TxnState::PrepareCommit);
        assert!(prepared.state.is_prepared());
        assert_eq!(prepared.partitions.len(), 1);
        assert_eq!(prepared.groups.len(), 1);
        let done = prepared.complete(3_100).unwrap();
        assert_eq!(done.state, TxnState::CompleteCommit);
        assert!(done.partitions.is_empty() && done.groups.is_empty());
        assert_eq!(done.start_ms, -1);
        assert_eq!(done.complete(3_200), None, "only a prepared transaction completes");
        // A retried commit is answered as done; an abort now makes no sense.
        assert_eq!(done.plan_end(7, 0, true, 3_300), Ok(EndPlan::AlreadyDone));
        assert_eq!(done.plan_end(7, 0, false, 3_300), Err(ResponseError::InvalidTxnState));
        // The next transaction starts afresh.
        let next = done.add_partitions(7, 0, &[tp("b", 1)], 4_000).unwrap().unwrap();
        assert_eq!(next.partitions.iter().cloned().collect::<Vec<_>>(), vec![tp("b", 1)]);
        assert_eq!(next.start_ms, 4_000);
    }

    #[test]
    fn abort_goes_through_prepare_to_complete() {
        let EndPlan::Prepare(prepared) = ongoing().plan_end(7, 0, false, 3_000).unwrap() else { panic!("not prepared") };
        assert_eq!(prepared.state, TxnState::PrepareAbort);
        let done = prepared.complete(3_100).unwrap();
        assert_eq!(done.state, TxnState::CompleteAbort);
        assert_eq!(done.plan_end(7, 0, false, 3_200), Ok(EndPlan::AlreadyDone));
        assert_eq!(done.plan_end(7, 0, true, 3_200), Err(ResponseError::InvalidTxnState));
    }

    #[test]
    fn end_txn_out_of_order_is_refused_with_kafkas_errors() {
        // Nothing begun.
        assert_eq!(fresh().plan_end(7, 0, true, 2_000), Err(ResponseError::InvalidTxnState));
        assert_eq!(fresh().plan_end(7, 0, false, 2_000), Err(ResponseError::InvalidTxnState));
        let EndPlan::Prepare(committing) = ongoing().plan_end(7, 0, true, 3_000).unwrap() else { panic!() };
        // The same EndTxn again while the markers are out: retry later; the other one: never.
        assert_eq!(committing.plan_end(7, 0, true, 3_000), Err(ResponseError::ConcurrentTransactions));
        assert_eq!(committing.plan_end(7, 0, false, 3_000), Err(ResponseError::InvalidTxnState));
        let EndPlan::Prepare(aborting) = ongoing().plan_end(7, 0, false, 3_000).unwrap() else { panic!() };
        assert_eq!(aborting.plan_end(7, 0, false, 3_000), Err(ResponseError::ConcurrentTransactions));
        assert_eq!(aborting.plan_end(7, 0, true, 3_000), Err(ResponseError::InvalidTxnState));
        // Adding to a transaction being completed: retry later.
        assert_eq!(committing.add_partitions(7, 0, &[tp("a", 1)], 3_000), Err(ResponseError::ConcurrentTransactions));
        assert_eq!(aborting.add_group(7, 0, "g", 3_000), Err(ResponseError::ConcurrentTransactions));
    }

    #[test]
    fn wrong_producer_id_or_epoch_is_refused() {
        let t = ongoing();
        assert_eq!(t.add_partitions(8, 0, &[tp("a", 1)], 0), Err(ResponseError::InvalidProducerIdMapping));
        assert_eq!(t.add_partitions(7, 1, &[tp("a", 1)], 0), Err(ResponseError::ProducerFenced));
        assert_eq!(t.add_group(8, 0, "g", 0), Err(ResponseError::InvalidProducerIdMapping));
        assert_eq!(t.plan_end(8, 0, true, 0), Err(ResponseError::InvalidProducerIdMapping));
        assert_eq!(t.plan_end(7, 3, true, 0), Err(ResponseError::ProducerFenced));
    }

    #[test]
    fn adding_what_is_already_in_the_transaction_writes_nothing() {
        let t = ongoing();
        assert_eq!(t.add_partitions(7, 0, &[tp("a", 0)], 5_000), Ok(None));
        let with_group = t.add_group(7, 0, "g", 5_000).unwrap().unwrap();
        assert_eq!(with_group.add_group(7, 0, "g", 5_000), Ok(None));
        // On an Empty id the same partitions begin a transaction.
        assert!(fresh().add_partitions(7, 0, &[], 5_000).unwrap().is_some());
    }

    #[test]
    fn init_bumps_the_epoch_of_a_finished_transaction() {
        let request = InitRequest { timeout_ms: 30_000, expected: None };
        let InitPlan::Bump(bumped) = fresh().plan_init(request, 5_000).unwrap() else { panic!() };
        assert_eq!((bumped.producer_id, bumped.producer_epoch, bumped.last_producer_epoch), (7, 1, 0));
        assert_eq!((bumped.state, bumped.timeout_ms), (TxnState::Empty, 30_000));
        let EndPlan::Prepare(p) = ongoing().plan_end(7, 0, true, 3_000).unwrap() else { panic!() };
        let InitPlan::Bump(after_commit) = p.complete(3_000).unwrap().plan_init(request, 5_000).unwrap() else { panic!() };
        assert_eq!((after_commit.producer_epoch, after_commit.state), (1, TxnState::Empty));
        // The old epoch is fenced from then on.
        assert_eq!(after_commit.add_partitions(7, 0, &[tp("a", 0)], 6_000), Err(ResponseError::ProducerFenced));
        // While markers are out the client must retry.
        assert_eq!(p.plan_init(request, 5_000), Err(ResponseError::ConcurrentTransactions));
    }

    #[test]
    fn init_on_an_open_transaction_fences_and_aborts_it() {
        let request = InitRequest { timeout_ms: 60_000, expected: None };
        let InitPlan::FenceAndAbort(target) = ongoing().plan_init(request, 5_000).unwrap() else { panic!() };
        assert_eq!(target.state, TxnState::PrepareAbort);
        assert_eq!((target.producer_epoch, target.last_producer_epoch), (1, 0));
        assert_eq!(target.partitions.len(), 1, "the abort markers go to the open transaction's partitions");
        // The zombie's commit is refused as fenced.
        assert_eq!(target.plan_end(7, 0, true, 5_000), Err(ResponseError::ProducerFenced));
        // Once aborted, the new producer's retry bumps again to an epoch of its own.
        let InitPlan::Bump(next) = target.complete(5_100).unwrap().plan_init(request, 5_200).unwrap() else { panic!() };
        assert_eq!(next.producer_epoch, 2);
    }

    #[test]
    fn a_producer_whose_transaction_was_aborted_under_it_takes_the_bumped_epoch() {
        let with = |expected| InitRequest { timeout_ms: 60_000, expected: Some(expected) };
        // Aborted at its timeout: the epoch went 0 -> 1, and the producer, still at 0,
        // claims it (KIP-588).
        let aborted = ongoing().fenced_abort(5_000).complete(5_100).unwrap();
        let InitPlan::Bump(recovered) = aborted.plan_init(with((7, 0)), 6_000).unwrap() else { panic!() };
        assert_eq!((recovered.producer_epoch, recovered.state), (2, TxnState::Empty));
        // Once a newer producer took the id (its InitProducerId bumped again), the old
        // epoch is fenced for good.
        let newer = InitRequest { timeout_ms: 60_000, expected: None };
        let InitPlan::Bump(taken) = aborted.plan_init(newer, 6_000).unwrap() else { panic!() };
        assert_eq!(taken.plan_init(with((7, 0)), 7_000), Err(ResponseError::ProducerFenced));
        // Nor any other epoch.
        assert_eq!(aborted.plan_init(with((7, 5)), 6_000), Err(ResponseError::ProducerFenced));
    }

    #[test]
    fn init_with_an_exhausted_epoch_takes_a_new_producer_id() {
        let mut t = fresh();
        t.producer_epoch = MAX_EPOCH;
        let request = InitRequest { timeout_ms: 60_000, expected: None };
        assert_eq!(t.plan_init(request, 5_000), Ok(InitPlan::NewProducerId));
        let renewed = TxnMetadata::with_new_producer_id("t", 99, 60_000, 5_000, Some(&t));
        assert_eq!((renewed.producer_id, renewed.producer_epoch, renewed.last_producer_id), (99, 0, 7));
        assert_eq!(renewed.last_producer_epoch, MAX_EPOCH);
    }

    #[test]
    fn init_with_an_expected_producer_checks_it() {
        let t = fresh();
        let with = |expected| InitRequest { timeout_ms: 60_000, expected: Some(expected) };
        assert!(matches!(t.plan_init(with((7, 0)), 5_000), Ok(InitPlan::Bump(_))));
        assert_eq!(t.plan_init(with((7, 5)), 5_000), Err(ResponseError::ProducerFenced));
        assert_eq!(t.plan_init(with((8, 0)), 5_000), Err(ResponseError::ProducerFenced));
        // A retry of an InitProducerId that bumped 0 -> 1 gets the current epoch back.
        let InitPlan::Bump(bumped) = t.plan_init(with((7, 0)), 5_000).unwrap() else { panic!() };
        assert_eq!(bumped.plan_init(with((7, 0)), 5_100), Ok(InitPlan::Retry));
    }

    #[test]
    fn an_open_transaction_times_out_into_a_fenced_abort() {
        let t = ongoing(); // started at 2_000 with a 60 s timeout
        assert_eq!(t.time_out(62_000), None);
        let aborted = t.time_out(62_001).unwrap();
        assert_eq!(aborted.state, TxnState::PrepareAbort);
        assert_eq!(aborted.producer_epoch, 1);
        assert_eq!(fresh().time_out(i64::MAX), None, "only open transactions time out");
        assert_eq!(aborted.time_out(i64::MAX), None);
    }

    #[test]
    fn only_idle_ids_expire() {
        let week = 7 * 24 * 3_600_000;
        assert!(!fresh().expired(1_000 + week, week));
        assert!(fresh().expired(1_001 + week, week));
        assert!(!ongoing().expired(i64::MAX, week), "an open transaction never expires");
        let EndPlan::Prepare(p) = ongoing().plan_end(7, 0, false, 3_000).unwrap() else { panic!() };
        assert!(!p.expired(i64::MAX, week));
        assert!(p.complete(3_000).unwrap().expired(i64::MAX, week));
    }

    #[test]
    fn metadata_round_trips_through_its_log_form() {
        let t = ongoing().add_group(7, 0, "g", 2_500).unwrap().unwrap();
        let bytes = serde_json::to_vec(&t).unwrap();
        assert_eq!(serde_json::from_slice::<TxnMetadata>(&bytes).unwrap(), t);
    }
}
