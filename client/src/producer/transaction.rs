//! The transactional producer (`transactional.id`): records sent between
//! [`Producer::begin_transaction`] and [`Producer::commit_transaction`] (or
//! [`Producer::abort_transaction`]) become visible to read_committed consumers all at
//! once, or never, together with the consumer offsets given to
//! [`Producer::send_offsets_to_transaction`].
//!
//! `connect` gets the producer id from the transaction coordinator (InitProducerId with
//! the transactional id), which fences every older producer of the id and aborts what it
//! left open. Before the first record of a partition in a transaction is appended, the
//! partition is added to the transaction (AddPartitionsToTxn, one round trip per new
//! partition), so the coordinator knows where to write the markers. Batches carry the
//! transactional bit. Commit flushes, then ends the transaction (EndTxn); a record that
//! failed for good makes the commit fail, and the transaction can only be aborted.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use super::accumulator::{State, TopicsExt};
use super::{Inner, Producer, ProducerRecord};
use crate::error::{Error, Result};
use crate::partitioner::partition_for_key;
use crate::transaction::TransactionalId;
use crate::TopicPartition;

/// A transactional producer's own state (under the producer's state lock).
#[derive(Debug, Default)]
pub(super) struct Transaction {
    /// Between begin and commit/abort.
    pub(super) open: bool,
    /// Partitions added to the open transaction.
    pub(super) added: HashSet<TopicPartition>,
    /// Consumer offsets were added to the open transaction.
    pub(super) offsets: bool,
    /// A record of the open transaction failed for good, and the coordinator aborted it
    /// when the producer took a new epoch: it can only be aborted.
    pub(super) failed: bool,
    /// Acknowledged records of the open transaction for the audit hook, by topic: handed
    /// over at commit, dropped at abort.
    pub(super) audit: Vec<(String, Vec<i64>)>,
}

impl Inner {
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

    /// For a transactional producer: picks the record's partition now and adds it to the
    /// open transaction if it is not in it yet. Refused outside a transaction.
    pub(super) async fn enlist(&self, mut record: ProducerRecord) -> Result<ProducerRecord> {
        let Some(txn) = self.transactional_id() else { return Ok(record) };
        let partitions = match record.partition {
            Some(p) => self.partition_count_with(&record.topic, p).await?,
            None => self.partition_count(&record.topic).await?,
        };
        let mut wake = false;
        let enlisted = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if !state.transaction.open {
                return Err(Error::TransactionState("send outside a transaction: call begin_transaction first".into()));
            }
            let partition = match (record.partition, &record.key) {
                (Some(p), _) => p,
                (None, Some(key)) => partition_for_key(key, partitions),
                // The sticky partition, as without a transaction: a transaction's keyless
                // records then join one partition per full batch, each one more
                // AddPartitionsToTxn and one more marker, not every partition of the topic.
                (None, None) => {
                    let State { topics, random, .. } = &mut *state;
                    let topic = topics.entry_ref(&record.topic, partitions);
                    let (partition, closed) = topic.sticky_partition(random, partitions, record.encoded_size(), &self.config)?;
                    // A full batch to send (after the lock).
                    wake |= closed.is_some();
                    partition
                }
            };
            if !(0..partitions).contains(&partition) {
                return Err(Error::UnknownPartition { topic: record.topic, partition });
            }
            record.partition = Some(partition);
            let tp = TopicPartition::new(record.topic.clone(), partition);
            (!state.transaction.added.contains(&tp)).then_some(tp)
        };
        if wake {
            self.wake_sender.notify_one();
        }
        if let Some(partition) = enlisted {
            txn.add_partitions(&self.cluster, self.producer()?, std::slice::from_ref(&partition), self.deadline()).await?;
            self.state.lock().unwrap_or_else(|e| e.into_inner()).transaction.added.insert(partition);
        }
        Ok(record)
    }
}

impl Producer {
    fn transactional(&self) -> Result<TransactionalId> {
        self.inner.transactional_id().ok_or_else(|| Error::TransactionState("the producer has no transactional.id".into()))
    }

    /// Starts a transaction: the records sent from now on commit or abort together.
    pub fn begin_transaction(&self) -> Result<()> {
        self.transactional()?;
        let mut state = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.transaction.open {
            return Err(Error::TransactionState("a transaction is already open".into()));
        }
        state.transaction = Transaction { open: true, ..Default::default() };
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
        txn.send_offsets(&self.inner.cluster, self.inner.producer()?, group_id, offsets, self.inner.deadline()).await?;
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
        let (failed, begun) = {
            let state = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
            let t = &state.transaction;
            (t.failed || state.reset_pending, !t.added.is_empty() || t.offsets)
        };
        if commit && failed {
            return Err(Error::TransactionState("a record of the transaction failed: abort it".into()));
        }
        // Nothing to end at the coordinator: the transaction never began there (nothing
        // was written), or it was aborted there when the producer took a new epoch.
        let result = match begun && !failed {
            true => txn.end(&self.inner.cluster, self.inner.producer()?, commit, self.inner.deadline()).await,
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
