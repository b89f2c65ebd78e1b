//! Brokers asking a transaction coordinator whether an open transaction holds something
//! (KIP-890), before they act on a producer's word for it:
//! - the group coordinator, before it takes a TxnOffsetCommit: the offsets must belong to
//!   a transaction that added the group with AddOffsetsToTxn. Offsets committed without
//!   it would sit pending with no marker ever coming for them (the coordinator writes
//!   markers only to what the transaction holds), or be applied by the marker of an
//!   unrelated transaction of the same producer;
//! - a partition leader, before a transactional batch opens its producer's transaction
//!   in the partition (`handler/produce.rs`, with the log's verification guard): a batch
//!   of a partition the transaction does not hold would never get a marker, and would
//!   hold the partition's last stable offset back for good, so every read_committed
//!   consumer of it would stop there.
//!
//! The transaction coordinator of the id answers: this broker's own state when it is the
//! coordinator, else an AddPartitionsToTxn v4 with `verify_only` to the coordinator,
//! naming a group by its partition of Kafka's offsets topic as Kafka's brokers do (so
//! any group of that partition passes there, as in Kafka). A question about an id the
//! coordinator has no producer for is INVALID_PRODUCER_ID_MAPPING and leaves nothing
//! behind.

use std::time::Duration;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::add_partitions_to_txn_request::{AddPartitionsToTxnTopic, AddPartitionsToTxnTransaction};
use kafka_protocol::messages::{AddPartitionsToTxnRequest, ProducerId, TopicName, TransactionalId};
use kafka_protocol::protocol::StrBytes;

use super::state::Held;
use super::{partition_for, Loaded, GROUP_MARKER_TOPIC};
use crate::handler::Broker;

/// Partitions of Kafka's offsets topic (`offsets.topic.num.partitions`' default), by
/// which a group is named in a verification; Fjord keeps offsets elsewhere, so the count
/// only has to agree between brokers.
pub(crate) const OFFSETS_PARTITIONS: i32 = 50;

/// The version of the AddPartitionsToTxn a group coordinator sends: the first with
/// `verify_only` (its "not in the transaction" is INVALID_TXN_STATE).
pub(crate) const VERIFY_VERSION: i16 = 4;

/// Bound on the coordinator's answer; a coordinator that does not answer is retried by
/// the client (COORDINATOR_LOAD_IN_PROGRESS, as Kafka maps a failed verification).
const VERIFY_TIMEOUT: Duration = Duration::from_secs(10);

impl Broker {
    /// Whether producer `(producer_id, epoch)` of `transactional_id` has an open
    /// transaction that added `group`'s offsets. Kafka's codes: INVALID_TXN_STATE when it
    /// did not, INVALID_PRODUCER_ID_MAPPING or PRODUCER_FENCED for another producer or
    /// epoch, CONCURRENT_TRANSACTIONS while the transaction is being ended.
    pub(crate) async fn verify_txn_group(
        &self,
        transactional_id: &str,
        producer_id: i64,
        epoch: i16,
        group: &str,
    ) -> Result<(), ResponseError> {
        let asked = [(GROUP_MARKER_TOPIC, partition_for(group, OFFSETS_PARTITIONS))];
        let mut answers = self.verify_txn(transactional_id, (producer_id, epoch), &[Held::Group(group)], &asked).await;
        answers.pop().unwrap_or(Err(ResponseError::InvalidTxnState))
    }

    /// For each of `partitions` (topic, index), whether producer `(producer_id, epoch)`
    /// of `transactional_id` has an open transaction that added it, with
    /// [`Broker::verify_txn_group`]'s codes: one look, or one question to the coordinator.
    pub(crate) async fn verify_txn_partitions(
        &self,
        transactional_id: &str,
        producer_id: i64,
        epoch: i16,
        partitions: &[(&str, i32)],
    ) -> Vec<Result<(), ResponseError>> {
        let held: Vec<Held<'_>> = partitions.iter().map(|&(topic, p)| Held::Partition(topic, p)).collect();
        self.verify_txn(transactional_id, (producer_id, epoch), &held, partitions).await
    }

    /// The questions answered here when this broker coordinates the id (`what`), else
    /// asked of its coordinator (about the partitions `asked`, one for each of `what`).
    async fn verify_txn(
        &self,
        transactional_id: &str,
        (producer_id, epoch): (i64, i16),
        what: &[Held<'_>],
        asked: &[(&str, i32)],
    ) -> Vec<Result<(), ResponseError>> {
        match self.txn_loaded_for(transactional_id).await {
            Ok(loaded) => holds(&loaded, transactional_id, producer_id, epoch, what).await,
            Err(ResponseError::NotCoordinator) => match self.verify_remotely(transactional_id, producer_id, epoch, asked).await {
                Ok(answers) => answers,
                Err(e) => vec![Err(e); asked.len()],
            },
            Err(e) => vec![Err(e); asked.len()],
        }
    }

    /// The same question to the coordinator on another broker, about `partitions` (a
    /// group by its partition of Kafka's offsets topic), in one request: the answer for
    /// each, or the error of the whole question.
    async fn verify_remotely(
        &self,
        transactional_id: &str,
        producer_id: i64,
        epoch: i16,
        partitions: &[(&str, i32)],
    ) -> Result<Vec<Result<(), ResponseError>>, ResponseError> {
        let (broker, _, _) = self.locate_txn_coordinator(transactional_id, &self.txns.peer.listener)?;
        if broker == self.config.broker_id {
            // Leadership moved here between the two looks: the client asks again.
            return Err(ResponseError::CoordinatorLoadInProgress);
        }
        let request = AddPartitionsToTxnRequest::default().with_transactions(vec![AddPartitionsToTxnTransaction::default()
            .with_transactional_id(TransactionalId(StrBytes::from_string(transactional_id.to_owned())))
            .with_producer_id(ProducerId(producer_id))
            .with_producer_epoch(epoch)
            .with_verify_only(true)
            .with_topics(
                partitions
                    .iter()
                    .map(|&(topic, p)| {
                        AddPartitionsToTxnTopic::default()
                            .with_name(TopicName(StrBytes::from_string(topic.to_owned())))
                            .with_partitions(vec![p])
                    })
                    .collect(),
            )]);
        // This broker's verification connection to that coordinator, not the markers'.
        let response =
            self.call_peer(&self.txns.verify_peers, broker, &request, VERIFY_VERSION, VERIFY_TIMEOUT).await.map_err(|e| {
                tracing::debug!(broker, error = %e, "transaction verification not answered");
                ResponseError::CoordinatorLoadInProgress
            })?;
        if let Some(e) = ResponseError::try_from_code(response.error_code) {
            return Err(e);
        }
        let answered: Vec<(&str, i32, i16)> = response
            .results_by_transaction
            .iter()
            .flat_map(|t| t.topic_results.iter())
            .flat_map(|t| {
                t.results_by_partition.iter().map(move |p| (t.name.as_str(), p.partition_index, p.partition_error_code))
            })
            .collect();
        Ok(partitions
            .iter()
            .map(|&(topic, p)| {
                // A partition the answer leaves out: not verified.
                let code = answered
                    .iter()
                    .find(|(t, q, _)| *t == topic && *q == p)
                    .map_or(ResponseError::InvalidTxnState.code(), |a| a.2);
                match ResponseError::try_from_code(code) {
                    None => Ok(()),
                    // The coordinator moved: the client finds it again and retries.
                    Some(ResponseError::NotCoordinator | ResponseError::CoordinatorNotAvailable) => {
                        Err(ResponseError::CoordinatorLoadInProgress)
                    }
                    Some(e) => Err(e),
                }
            })
            .collect())
    }
}

/// The coordinator's own answers, from the id's state as `loaded` holds it.
pub(crate) async fn holds(
    loaded: &Loaded,
    transactional_id: &str,
    producer_id: i64,
    epoch: i16,
    what: &[Held<'_>],
) -> Vec<Result<(), ResponseError>> {
    let Some(slot) = loaded.existing(transactional_id) else {
        return vec![Err(ResponseError::InvalidProducerIdMapping); what.len()];
    };
    let current = slot.lock().await;
    let checked =
        current.as_ref().ok_or(ResponseError::InvalidProducerIdMapping).and_then(|m| m.verify(producer_id, epoch).map(|_| m));
    match checked {
        Ok(m) => what.iter().map(|&w| if m.holds(w) { Ok(()) } else { Err(ResponseError::InvalidTxnState) }).collect(),
        Err(e) => vec![Err(e); what.len()],
    }
}
