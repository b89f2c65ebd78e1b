//! The transactional producer (`transactional.id`): records sent between
//! [`Producer::begin_transaction`] and [`Producer::commit_transaction`] (or
//! [`Producer::abort_transaction`]) become visible to read_committed consumers all at
//! once, or never, together with the consumer offsets given to
//! [`Producer::send_offsets_to_transaction`].
//!
//! `connect` gets the producer id from the transaction coordinator (InitProducerId with
//! the transactional id), which fences every older producer of the id and aborts what it
//! left open. Records append at once, as a non-transactional producer's do; a partition's
//! batches wait until the partition has joined the transaction (so the coordinator knows
//! where to write the markers). The sender adds every partition that holds records and
//! has not joined in one AddPartitionsToTxn, as Kafka's producer does: the records sent
//! while it is under way, which often reach other partitions, join with the next one,
//! and sending goes on meanwhile. Batches carry the transactional bit. Commit flushes,
//! then ends the transaction (EndTxn); a record that failed for good, or a partition that
//! could not join, makes the commit fail, and the transaction can only be aborted.
//!
//! A producer that a newer one of its transactional id fenced (PRODUCER_FENCED) is done,
//! as Kafka's after a `ProducerFencedException`: every later call fails with that error.
//! It never asks for a new epoch without naming its own, which would fence the newer
//! producer in turn.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::batch::Outcome;
use super::{Inner, Producer};
use crate::error::{Error, ResponseError, Result};
use crate::transaction::TransactionalId;
use crate::TopicPartition;

/// A transactional producer's own state (under the producer's state lock).
#[derive(Debug, Default)]
pub(super) struct Transaction {
    /// Between begin and commit/abort.
    pub(super) open: bool,
    /// Partitions added to the open transaction (each marked in its queue,
    /// [`super::accumulator::PartitionQueue::enlisted`]).
    pub(super) partitions: usize,
    /// Consumer offsets were added to the open transaction.
    pub(super) offsets: bool,
    /// A record of the open transaction failed for good, and the coordinator aborted it
    /// when the producer took a new epoch: it can only be aborted.
    pub(super) failed: bool,
    /// An AddPartitionsToTxn is under way (one at a time).
    pub(super) enlisting: bool,
    /// Partitions could not join the open transaction (their records failed with this):
    /// it can only be aborted, which the coordinator still has to hear of.
    pub(super) refused: Option<Error>,
    /// Acknowledged records of the open transaction for the audit hook, by topic: handed
    /// over at commit, dropped at abort.
    pub(super) audit: Vec<(String, Vec<i64>)>,
}

/// Whether a broker's answer says a newer producer of the transactional id took over:
/// PRODUCER_FENCED, from its coordinator. A partition leader's INVALID_PRODUCER_EPOCH
/// only fails the batch, as in Kafka since KIP-588: the epoch bump that follows (an
/// InitProducerId naming this producer's epoch) lets the coordinator tell a transaction
/// aborted at its timeout, which the producer survives, from a newer producer.
pub(super) fn is_fencing(e: &Error) -> bool {
    matches!(e, Error::Kafka { code: ResponseError::ProducerFenced, .. })
}

impl Inner {
    /// Fences this producer for good with `error` (see [`is_fencing`]): later calls fail
    /// with it, records not sent yet fail with it now, and no epoch bump follows.
    pub(super) fn fence(&self, error: &Error) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.fenced.is_none() {
            tracing::warn!(%error, "fenced by a newer producer of the transactional id: this producer can only be closed");
            state.fenced = Some(error.clone());
        }
        state.reset_pending = false;
        let codec = self.config.compression;
        let mut unsent = Vec::new();
        for topic in state.topics.values_mut() {
            for (p, queue) in topic.partitions.iter_mut().enumerate() {
                unsent.extend(queue.take_unsent(&topic.name, p as i32, codec));
            }
        }
        drop(state);
        for batch in &unsent {
            self.complete(batch, Outcome::Failed(error.clone()));
        }
        self.wake_sender.notify_one();
        // A commit or abort waiting for an epoch bump learns that none comes.
        self.batch_done.notify_waiters();
    }

    /// Waits until no epoch bump is pending (see [`super::idempotence::reset_if_due`]),
    /// for at most the delivery timeout. Fails when the producer was fenced meanwhile, or
    /// when time runs out: the transaction stays open, to be aborted again.
    async fn new_epoch_taken(&self) -> Result<()> {
        let taken = self.until(|state| match (&state.fenced, state.reset_pending) {
            (Some(e), _) => Some(Err(e.clone())),
            (None, false) => Some(Ok(())),
            (None, true) => None,
        });
        let deadline = tokio::time::Instant::now() + self.config.delivery_timeout;
        tokio::time::timeout_at(deadline, taken).await.unwrap_or_else(|_| {
            Err(Error::TransactionState(format!(
                "no new producer epoch after a failed record within {:?}: abort again",
                self.config.delivery_timeout
            )))
        })
    }

    /// The error this producer was fenced with, if it was.
    fn fenced(&self) -> Result<()> {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).fenced.clone().map_or(Ok(()), Err)
    }

    pub(super) fn transactional_id(&self) -> Option<TransactionalId> {
        self.config
            .transactional_id
            .as_ref()
            .map(|id| TransactionalId { id: id.clone(), timeout: self.config.transaction_timeout })
    }

    fn producer(&self) -> Result<(i64, i16)> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.identity.map(|i| (i.id, i.epoch)).ok_or_else(|| Error::TransactionState("the producer has no producer id".into()))
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.config.delivery_timeout.min(Duration::from_secs(60))
    }

    /// Adds `partitions`, which hold records of open transaction `number` and have not
    /// joined it, to it (AddPartitionsToTxn), then wakes the sender to send their
    /// batches. Run by the sender as a task of its own, with
    /// [`Transaction::enlisting`] set. When they cannot join, their records fail with
    /// the coordinator's answer, and so does the commit.
    pub(super) async fn enlist(self: Arc<Self>, number: u64, partitions: Vec<TopicPartition>) {
        let added = match (self.transactional_id(), self.producer()) {
            (Some(txn), Ok(producer)) => txn.add_partitions(&self.cluster, producer, &partitions, self.deadline()).await,
            (None, _) => Err(Error::TransactionState("the producer has no transactional.id".into())),
            (_, Err(e)) => Err(e),
        };
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut failed = Vec::new();
        if state.transactions == number {
            state.transaction.enlisting = false;
            let codec = self.config.compression;
            for tp in &partitions {
                let Some(topic) = state.topics.get_mut(tp.topic.as_str()) else { continue };
                let Some(queue) = topic.partitions.get_mut(tp.partition as usize) else { continue };
                match &added {
                    Ok(()) => queue.enlisted = number,
                    Err(_) => failed.extend(queue.take_unsent(&topic.name, tp.partition, codec)),
                }
            }
            match &added {
                Ok(()) => state.transaction.partitions += partitions.len(),
                Err(e) => state.transaction.refused = Some(e.clone()),
            }
        }
        drop(state);
        if let Err(e) = added {
            tracing::warn!(%e, ?partitions, "partitions could not join the transaction");
            for batch in &failed {
                self.complete(batch, Outcome::Failed(e.clone()));
            }
            if is_fencing(&e) {
                self.fence(&e);
            }
        }
        self.wake_sender.notify_one();
    }
}

impl Producer {
    /// The transactional id, unless the producer has none or was fenced.
    fn transactional(&self) -> Result<TransactionalId> {
        let txn = self
            .inner
            .transactional_id()
            .ok_or_else(|| Error::TransactionState("the producer has no transactional.id".into()))?;
        self.inner.fenced()?;
        Ok(txn)
    }

    /// `result` of a request to a coordinator, fencing the producer when it says to.
    fn fenced_by<T>(&self, result: Result<T>) -> Result<T> {
        if let Err(e) = &result {
            if is_fencing(e) {
                self.inner.fence(e);
            }
        }
        result
    }

    /// Starts a transaction: the records sent from now on commit or abort together.
    pub fn begin_transaction(&self) -> Result<()> {
        self.transactional()?;
        let mut state = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.transaction.open {
            return Err(Error::TransactionState("a transaction is already open".into()));
        }
        state.transaction = Transaction { open: true, ..Default::default() };
        state.transactions += 1;
        Ok(())
    }

    /// Commits `offsets` (the next offset to consume, per partition) of consumer group
    /// `group_id` with the open transaction (AddOffsetsToTxn, then TxnOffsetCommit to the
    /// group's coordinator): consume-transform-produce without duplicates.
    pub async fn send_offsets_to_transaction(&self, offsets: &[(TopicPartition, i64)], group_id: &str) -> Result<()> {
        let txn = self.transactional()?;
        if !self.inner.state.lock().unwrap_or_else(|e| e.into_inner()).transaction.open {
            return Err(Error::TransactionState("send_offsets_to_transaction outside a transaction".into()));
        }
        let sent = txn.send_offsets(&self.inner.cluster, self.inner.producer()?, group_id, offsets, self.inner.deadline()).await;
        self.fenced_by(sent)?;
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner()).transaction.offsets = true;
        Ok(())
    }

    /// Sends everything buffered, then commits the transaction. Fails (and the
    /// transaction must be aborted) when a record of it could not be written.
    pub async fn commit_transaction(&self) -> Result<()> {
        self.end_transaction(true).await
    }

    /// Aborts the transaction: read_committed consumers never see its records.
    pub async fn abort_transaction(&self) -> Result<()> {
        self.end_transaction(false).await
    }

    async fn end_transaction(&self, commit: bool) -> Result<()> {
        let txn = self.transactional()?;
        if !self.inner.state.lock().unwrap_or_else(|e| e.into_inner()).transaction.open {
            return Err(Error::TransactionState("no transaction is open".into()));
        }
        self.flush().await;
        // A record that failed for good has the sender take a new epoch, which aborts the
        // transaction at the coordinator; the next transaction must begin in that epoch,
        // or its partitions would join under the old one and be refused as fenced.
        self.inner.new_epoch_taken().await?;
        let (failed, refused, begun) = {
            let state = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
            let t = &state.transaction;
            (t.failed || state.reset_pending, t.refused.clone(), t.partitions > 0 || t.offsets)
        };
        if commit && failed {
            return Err(Error::TransactionState("a record of the transaction failed: abort it".into()));
        }
        if let (true, Some(e)) = (commit, refused) {
            return Err(Error::TransactionState(format!("a partition could not join the transaction ({e}): abort it")));
        }
        // Nothing to end at the coordinator: the transaction never began there (nothing
        // was written), or it was aborted there when the producer took a new epoch.
        let result = match begun && !failed {
            true => self.fenced_by(txn.end(&self.inner.cluster, self.inner.producer()?, commit, self.inner.deadline()).await),
            false => Ok(()),
        };
        if result.is_ok() || !commit {
            let ended = std::mem::take(&mut self.inner.state.lock().unwrap_or_else(|e| e.into_inner()).transaction);
            if let (true, Some(audit)) = (commit, &self.inner.config.audit) {
                for (topic, created) in ended.audit.iter().filter(|(_, c)| !c.is_empty()) {
                    audit.acknowledged(topic, created);
                }
            }
        }
        result
    }
}
