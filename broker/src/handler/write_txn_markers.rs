//! WriteTxnMarkers (v1): a transaction coordinator, on this broker or another, ends a
//! transaction in the partitions this broker leads by appending a COMMIT or ABORT
//! marker (a control batch, see [`fjord_record::control`]) for the producer.
//!
//! As Kafka answers it:
//! - with `authorizer.enable`, only a principal with Alter (an admin aborting a hanging
//!   transaction, `TransactionAdmin::abort_transaction`) or ClusterAction (the
//!   inter-broker principal always has it) on the cluster may send one; anyone else gets
//!   CLUSTER_AUTHORIZATION_FAILED for every partition, nothing written;
//! - an unknown topic or partition is UNKNOWN_TOPIC_OR_PARTITION, a replica that is not
//!   the leader NOT_LEADER_OR_FOLLOWER (the coordinator retries at the new leader);
//! - a marker at a producer epoch older than the partition knows is
//!   INVALID_PRODUCER_EPOCH, from an older coordinator epoch
//!   TRANSACTION_COORDINATOR_FENCED: the log is untouched;
//! - a producer the partition does not know gets its marker written, as Kafka does:
//!   nothing is open to end, but the marker records the producer's (possibly bumped)
//!   epoch, which fences its older incarnations here;
//! - the topic `__consumer_offsets` ([`crate::txn::GROUP_MARKER_TOPIC`]) stands for
//!   the consumer groups this broker coordinates: their offsets pending for the producer
//!   (TxnOffsetCommit) are applied on commit, dropped on abort, once per marker whatever
//!   partition indexes it names (the group coordinator's error code if the store fails);
//! - markers are written with acks=all: the answer waits until the ISR (at least
//!   `min.insync.replicas` of it) has the marker, or the request times out
//!   (REQUEST_TIMED_OUT; the coordinator retries, and a repeated marker is harmless).

use std::time::Duration;

use kafka_protocol::messages::write_txn_markers_response::{
    WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
};
use kafka_protocol::messages::{ResponseKind, WriteTxnMarkersRequest, WriteTxnMarkersResponse};

use crate::codec::error_code;
use crate::connection::Session;
use crate::handler::{log_error_code, Broker};
use fjord_auth::{Operation, Resource};

/// How long a marker waits for the ISR (the request carries no timeout; Kafka uses its
/// `request.timeout.ms`, 30 s by default).
const REPLICATION_TIMEOUT: Duration = Duration::from_secs(30);

impl Broker {
    pub(crate) async fn write_txn_markers(&self, request: WriteTxnMarkersRequest, session: &Session) -> ResponseKind {
        // Kafka: Alter on the cluster (an admin aborting a hanging transaction, KIP-664),
        // else ClusterAction (a coordinator on another broker).
        let allowed = self.authorize(session, Operation::Alter, Resource::cluster())
            || self.authorize(session, Operation::ClusterAction, Resource::cluster());
        ResponseKind::WriteTxnMarkers(self.append_txn_markers(request, allowed).await)
    }

    /// Appends the request's markers (`allowed`: the sender may, else every partition is
    /// refused) and answers as WriteTxnMarkers does. The transaction coordinator calls it
    /// directly for the partitions this broker leads, the same work without a connection
    /// to itself.
    pub(crate) async fn append_txn_markers(&self, request: WriteTxnMarkersRequest, allowed: bool) -> WriteTxnMarkersResponse {
        let mut markers = Vec::with_capacity(request.markers.len());
        // Every marker is appended before the first wait, so followers fetch them together.
        let mut awaiting = Vec::new();
        for marker in request.markers {
            let mut topics = Vec::with_capacity(marker.topics.len());
            for t in marker.topics {
                if t.name.0.as_str() == crate::txn::GROUP_MARKER_TOPIC {
                    let code = if !allowed {
                        error_code::CLUSTER_AUTHORIZATION_FAILED
                    } else {
                        match self.groups.complete_txn_offsets(marker.producer_id.0, marker.transaction_result).await {
                            Ok(()) => error_code::NONE,
                            Err(e) => e.code(),
                        }
                    };
                    let partitions = t
                        .partition_indexes
                        .iter()
                        .map(|&index| {
                            WritableTxnMarkerPartitionResult::default().with_partition_index(index).with_error_code(code)
                        })
                        .collect();
                    topics.push(WritableTxnMarkerTopicResult::default().with_name(t.name).with_partitions(partitions));
                    continue;
                }
                let topic = self.topics.get(&t.name.0);
                let mut partitions = Vec::with_capacity(t.partition_indexes.len());
                for index in t.partition_indexes {
                    let partition = match &topic {
                        _ if !allowed => Err(error_code::CLUSTER_AUTHORIZATION_FAILED),
                        Some(topic) => self.replica(topic, index),
                        None => Err(error_code::UNKNOWN_TOPIC_OR_PARTITION),
                    };
                    let code = match partition {
                        Err(code) => code,
                        Ok(partition) => {
                            let min_isr = partition.log.config().min_insync_replicas as usize;
                            let appended = partition.append_marker_as_leader(
                                marker.producer_id.0,
                                marker.producer_epoch,
                                marker.coordinator_epoch,
                                marker.transaction_result,
                                min_isr,
                            );
                            match appended {
                                Err(code) => code,
                                Ok(Err(e)) => {
                                    tracing::debug!(
                                        topic = %t.name.0, partition = index, producer_id = marker.producer_id.0,
                                        error = %e, "transaction marker refused"
                                    );
                                    log_error_code(&e)
                                }
                                Ok(Ok((info, leader_epoch))) => {
                                    if let Some(observer) = &self.config.observer {
                                        observer.transaction_ended(&t.name.0, marker.producer_id.0, marker.transaction_result);
                                    }
                                    awaiting.push((
                                        markers.len(),
                                        topics.len(),
                                        partitions.len(),
                                        partition,
                                        leader_epoch,
                                        info.last_offset,
                                        min_isr,
                                    ));
                                    error_code::NONE
                                }
                            }
                        }
                    };
                    partitions
                        .push(WritableTxnMarkerPartitionResult::default().with_partition_index(index).with_error_code(code));
                }
                topics.push(WritableTxnMarkerTopicResult::default().with_name(t.name).with_partitions(partitions));
            }
            markers.push(WritableTxnMarkerResult::default().with_producer_id(marker.producer_id).with_topics(topics));
        }
        let deadline = tokio::time::Instant::now() + REPLICATION_TIMEOUT;
        for (m, t, p, partition, leader_epoch, last_offset, min_isr) in awaiting {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if let Err(code) = partition.wait_for_replication(leader_epoch, last_offset, min_isr, left).await {
                markers[m].topics[t].partitions[p].error_code = code;
            }
        }
        WriteTxnMarkersResponse::default().with_markers(markers)
    }
}
