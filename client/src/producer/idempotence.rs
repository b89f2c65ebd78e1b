//! The idempotent producer's identity and sequence numbers: InitProducerId, the
//! sequence arithmetic (which wraps like Kafka's), stamping a batch when it is first
//! sent, and the epoch bump after a stamped batch failed for good.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_protocol::messages::{InitProducerIdRequest, ProducerId};

use super::accumulator::{ReadyBatch, State};
use super::batch::Outcome;
use super::transaction::is_fencing;
use super::Inner;
use crate::cluster::Cluster;
use crate::error::{Error, Result};

/// The broker remembers the last 5 batches per producer and partition: a retry of an
/// older one could not be recognised.
pub(super) const MAX_IN_FLIGHT_IDEMPOTENT: usize = 5;

/// Id and epoch from InitProducerId.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ProducerIdentity {
    pub(super) id: i64,
    pub(super) epoch: i16,
}

impl ProducerIdentity {
    pub(super) fn new(id: i64, epoch: i16) -> Self {
        Self { id, epoch }
    }
}

/// What an idempotent producer stamped into a batch when it first sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    pub(super) identity: ProducerIdentity,
    pub(super) sequence: i32,
}

/// `sequence + n` in Kafka's sequence space, which wraps from `i32::MAX` to 0.
pub(super) fn add_sequence(sequence: i32, n: usize) -> i32 {
    ((i64::from(sequence) + n as i64) % (i64::from(i32::MAX) + 1)) as i32
}

/// Whether a completed batch was a split one (its parts carry its sequences).
pub(super) enum OutcomeKind {
    Whole,
    Split,
}

/// Whether sequence `a` comes after `b` (less than half the space ahead, across the wrap).
pub(super) fn sequence_ahead(a: i32, b: i32) -> bool {
    let distance = (i64::from(a) - i64::from(b)).rem_euclid(i64::from(i32::MAX) + 1);
    distance > 0 && distance < 1 << 30
}

impl ReadyBatch {
    /// Stamps the producer id, epoch and first sequence into the batch bytes.
    pub(super) fn stamp(&mut self, identity: ProducerIdentity, sequence: i32) {
        let mut bytes = std::mem::take(&mut self.bytes).try_into_mut().unwrap_or_else(|shared| shared[..].into());
        fjord_record::batch::set_producer(&mut bytes, identity.id, identity.epoch, sequence);
        self.bytes = bytes.freeze();
        self.stamp = Some(Stamp { identity, sequence });
    }
}

impl State {
    /// Whether a batch the broker refused as out of order is worth another attempt:
    /// when an earlier batch of its partition is still unresolved (the refusal may be
    /// for that one's hole only), or when its partition is on an older epoch, which it
    /// leaves once nothing numbered there may be stored (the batch is then numbered
    /// again in the current one).
    pub(super) fn out_of_order_is_retriable(&mut self, batch: &ReadyBatch) -> bool {
        let Some(stamp) = batch.stamp else {
            return false;
        };
        let current = self.identity;
        self.queue(&batch.topic, batch.partition).is_some_and(|q| {
            q.identity == Some(stamp.identity) && (Some(stamp.identity) != current || q.acked_sequence != stamp.sequence)
        })
    }
}

/// Asks any broker for a producer id, retrying retriable errors until `timeout`.
pub(super) async fn init_producer_id(cluster: &Cluster, timeout: Duration) -> Result<ProducerIdentity> {
    let deadline = Instant::now() + timeout;
    let request = InitProducerIdRequest::default()
        .with_transactional_id(None)
        .with_transaction_timeout_ms(60_000)
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    loop {
        let attempt = async {
            let conn = cluster.any_broker().await?;
            let response = conn.request(&request, 4).await?;
            match Error::kafka(response.error_code, "InitProducerId", None) {
                None => Ok(ProducerIdentity { id: response.producer_id.0, epoch: response.producer_epoch }),
                Some(e) => Err(e),
            }
        };
        match attempt.await {
            Ok(identity) => {
                tracing::debug!(producer_id = identity.id, epoch = identity.epoch, "idempotent producer id");
                return Ok(identity);
            }
            Err(e) if e.is_retriable() && Instant::now() < deadline => {
                tracing::debug!(%e, "InitProducerId failed; retrying");
                tokio::time::sleep(cluster.config().retry_backoff).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// After a stamped batch failed for good: once nothing is in flight, bumps the epoch of
/// the producer id and restarts every partition's sequence (batches already stamped are
/// stamped again when sent), except in partitions holding a batch that may be stored
/// already, which move to the new epoch later; a broker takes a newer epoch that starts
/// at sequence 0, so no InitProducerId round trip is needed (KIP-360, as the Java client
/// does for an idempotent producer). Only when the epoch would overflow is a new
/// producer id taken.
/// `None` when no reset is due now.
pub(super) async fn reset_if_due(inner: &Arc<Inner>) -> Option<Result<()>> {
    let current = {
        let state = inner.state.lock().unwrap_or_else(|e| e.into_inner());
        if !state.reset_pending || state.in_flight.values().any(|&n| n > 0) {
            return None;
        }
        state.identity
    };
    let identity = match current.filter(|c| c.epoch < i16::MAX - 1) {
        // A transactional producer's epochs are its coordinator's: a new one from it
        // aborts the open transaction there, which can then only be aborted here too.
        // It names the epoch it has (KIP-360), so that a producer a newer one fenced
        // meanwhile is told so (PRODUCER_FENCED) instead of fencing that one in turn.
        _ if inner.config.transactional_id.is_some() => {
            let txn = inner.transactional_id().expect("invariant: checked just above");
            let deadline = Instant::now() + inner.config.delivery_timeout;
            match txn.init_producer_id(&inner.cluster, deadline, current.map(|c| (c.id, c.epoch))).await {
                Ok((id, epoch)) => {
                    inner.state.lock().unwrap_or_else(|e| e.into_inner()).transaction.failed = true;
                    ProducerIdentity { id, epoch }
                }
                Err(e) if is_fencing(&e) => {
                    inner.fence(&e);
                    return None;
                }
                Err(e) => return Some(Err(e)),
            }
        }
        Some(current) => ProducerIdentity { id: current.id, epoch: current.epoch + 1 },
        None => match init_producer_id(&inner.cluster, inner.config.delivery_timeout).await {
            Ok(identity) => identity,
            Err(e) => return Some(Err(e)),
        },
    };
    tracing::info!(producer_id = identity.id, epoch = identity.epoch, "a batch failed: continuing in a new producer epoch");
    let mut state = inner.state.lock().unwrap_or_else(|e| e.into_inner());
    state.identity = Some(identity);
    state.reset_pending = false;
    let transactional = inner.config.transactional_id.is_some();
    let mut aborted = Vec::new();
    for topic in state.topics.values_mut() {
        for (p, queue) in topic.partitions.iter_mut().enumerate() {
            if !transactional && queue.holds_unresolved() {
                // Its batches go out in the old epoch until none may be stored (as
                // Kafka's producer keeps a partition with batches in flight on its
                // epoch); then the sender restarts it in this one.
                continue;
            }
            queue.restart_sequences(identity);
            if transactional {
                // The coordinator aborted the open transaction: what is left of it must
                // not go out in the new epoch, where the next transaction's commit marker
                // would commit it. Its partitions join that transaction anew.
                aborted.extend(queue.take_unsent(&topic.name, p as i32, inner.config.compression));
                queue.enlisted = 0;
            }
        }
    }
    drop(state);
    let error = Error::TransactionState("the transaction was aborted: a record of it failed".into());
    for batch in &aborted {
        inner.complete(batch, Outcome::Failed(error.clone()));
    }
    // A commit or abort waits for the new epoch (`Inner::new_epoch_taken`).
    inner.batch_done.notify_waiters();
    Some(Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_numbers_wrap_like_kafka() {
        assert_eq!(add_sequence(i32::MAX, 1), 0);
        assert_eq!(add_sequence(i32::MAX - 1, 3), 1);
        assert!(sequence_ahead(5, 3) && !sequence_ahead(3, 5) && !sequence_ahead(3, 3));
        assert!(sequence_ahead(2, i32::MAX - 1), "across the wrap");
    }
}
