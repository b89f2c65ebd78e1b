//! AlterPartitionReassignments (v0-v1) and ListPartitionReassignments (v0): Kafka's
//! partition reassignment (`kafka-reassign-partitions.sh`, `Admin.alterPartitionReassignments`),
//! run by the controller ([`crate::controller::reassignment`]).
//!
//! Alter answers once the reassignment is recorded, as Kafka does: the replicas move
//! afterwards, and ListPartitionReassignments shows it until it completes. Only the
//! controller alters (NOT_CONTROLLER elsewhere: clients send it to the controller that
//! Metadata names); any broker lists, from the metadata store.

use std::collections::BTreeMap;

use kafka_protocol::messages::alter_partition_reassignments_response::{
    ReassignablePartitionResponse, ReassignableTopicResponse,
};
use kafka_protocol::messages::list_partition_reassignments_response::{OngoingPartitionReassignment, OngoingTopicReassignment};
use kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse, BrokerId, ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse, ResponseKind, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use crate::codec::error_code;
use crate::controller::reassignment::{self, Refused};
use crate::controller::Stop;
use crate::handler::Broker;

/// The one place a refused reassignment meets the wire: Kafka's code and a message.
fn refusal_code(refused: &Refused) -> (i16, String) {
    match refused {
        Refused::UnknownPartition => (error_code::UNKNOWN_TOPIC_OR_PARTITION, "no such topic or partition".into()),
        Refused::InvalidAssignment(why) => (error_code::INVALID_REPLICA_ASSIGNMENT, why.clone()),
        Refused::NoReassignmentInProgress => {
            (error_code::NO_REASSIGNMENT_IN_PROGRESS, "no reassignment of this partition is in progress".into())
        }
        Refused::ReplicationFactorChange => (
            error_code::INVALID_REPLICATION_FACTOR,
            "the target changes the replica count and the request does not allow it".into(),
        ),
    }
}

fn brokers(ids: &[i32]) -> Vec<BrokerId> {
    ids.iter().map(|&id| BrokerId(id)).collect()
}

impl Broker {
    pub(crate) async fn alter_partition_reassignments(
        &self,
        request: AlterPartitionReassignmentsRequest,
        version: i16,
    ) -> ResponseKind {
        // v0 has no such flag: Kafka allowed any replica count then.
        let allow_replication_factor_change = version == 0 || request.allow_replication_factor_change;
        let response =
            AlterPartitionReassignmentsResponse::default().with_allow_replication_factor_change(allow_replication_factor_change);
        let refuse = |code: i16, message: &'static str| {
            ResponseKind::AlterPartitionReassignments(
                response.clone().with_error_code(code).with_error_message(Some(StrBytes::from_static_str(message))),
            )
        };
        let Some(epoch) = self.controllership.epoch() else {
            return refuse(error_code::NOT_CONTROLLER, "this broker is not the controller");
        };
        let mut responses = Vec::with_capacity(request.topics.len());
        let mut started = false;
        for topic in request.topics {
            let partitions: Vec<(i32, Option<Vec<i32>>)> = topic
                .partitions
                .iter()
                .map(|p| (p.partition_index, p.replicas.as_ref().map(|r| r.iter().map(|b| b.0).collect())))
                .collect();
            let outcomes = match reassignment::alter(
                &**self.topics.store(),
                epoch,
                &topic.name.0,
                &partitions,
                allow_replication_factor_change,
            )
            .await
            {
                Ok(outcomes) => outcomes,
                Err(Stop::Fenced(why)) => {
                    tracing::info!(why, "AlterPartitionReassignments: no longer the controller");
                    return refuse(error_code::NOT_CONTROLLER, "this broker is no longer the controller");
                }
                Err(e) => {
                    tracing::warn!(error = ?e, "AlterPartitionReassignments: the metadata store failed");
                    return refuse(error_code::UNKNOWN_SERVER_ERROR, "the metadata store failed");
                }
            };
            started |= outcomes.iter().any(|(_, o)| o.is_ok());
            let results = outcomes
                .into_iter()
                .map(|(partition, outcome)| {
                    let (code, message) = match outcome {
                        Ok(()) => (error_code::NONE, None),
                        Err(refused) => {
                            let (code, message) = refusal_code(&refused);
                            (code, Some(StrBytes::from_string(message)))
                        }
                    };
                    ReassignablePartitionResponse::default()
                        .with_partition_index(partition)
                        .with_error_code(code)
                        .with_error_message(message)
                })
                .collect();
            responses.push(ReassignableTopicResponse::default().with_name(topic.name).with_partitions(results));
        }
        if started {
            self.controllership.reassignment_asked();
        }
        ResponseKind::AlterPartitionReassignments(response.with_error_code(error_code::NONE).with_responses(responses))
    }

    pub(crate) async fn list_partition_reassignments(&self, request: ListPartitionReassignmentsRequest) -> ResponseKind {
        let response = ListPartitionReassignmentsResponse::default();
        let mut ongoing = match reassignment::in_progress(&**self.topics.store()).await {
            Ok(ongoing) => ongoing,
            Err(e) => {
                tracing::warn!(error = ?e, "ListPartitionReassignments: the metadata store failed");
                return ResponseKind::ListPartitionReassignments(
                    response
                        .with_error_code(error_code::UNKNOWN_SERVER_ERROR)
                        .with_error_message(Some(StrBytes::from_static_str("the metadata store failed"))),
                );
            }
        };
        // Only what was asked for (null: every partition); a partition asked for without a
        // reassignment in progress, or unknown, is left out, as in Kafka.
        if let Some(asked) = request.topics {
            let mut wanted: BTreeMap<String, _> = BTreeMap::new();
            for topic in asked {
                let Some(mut partitions) = ongoing.remove(topic.name.0.as_str()) else { continue };
                partitions.retain(|p, _| topic.partition_indexes.contains(p));
                wanted.insert(topic.name.0.to_string(), partitions);
            }
            ongoing = wanted;
        }
        let topics = ongoing
            .into_iter()
            .filter(|(_, partitions)| !partitions.is_empty())
            .map(|(name, partitions)| {
                let partitions = partitions
                    .into_iter()
                    .map(|(index, r)| {
                        OngoingPartitionReassignment::default()
                            .with_partition_index(index)
                            .with_replicas(brokers(&r.replicas))
                            .with_adding_replicas(brokers(&r.adding))
                            .with_removing_replicas(brokers(&r.removing))
                    })
                    .collect();
                OngoingTopicReassignment::default().with_name(TopicName(StrBytes::from_string(name))).with_partitions(partitions)
            })
            .collect();
        ResponseKind::ListPartitionReassignments(response.with_error_code(error_code::NONE).with_topics(topics))
    }
}
