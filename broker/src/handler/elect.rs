//! ElectLeaders (v0-v2): preferred and unclean leader elections on demand
//! (`kafka-leader-election.sh`, `AdminClient.electLeaders`), answered by the controller.
//!
//! The controller writes the new partition states ([`controller::elect_leaders`]) and
//! the answer waits, at most the request's `timeout_ms`, until this broker's own view
//! shows each new leader; a partition still not visible by then is answered
//! REQUEST_TIMED_OUT, as Kafka does: its new state is written and takes effect anyway.
//!
//! Alone on the embedded store (`fjord dev`) the broker is its own controller and the
//! same path answers: every partition has this broker as its only replica and leader,
//! so a preferred or unclean election answers ELECTION_NOT_NEEDED because it is not
//! needed, not because the request is ignored.

use std::collections::BTreeMap;
use std::time::Duration;

use fjord_record::TopicPartition;
use kafka_protocol::messages::elect_leaders_response::{PartitionResult, ReplicaElectionResult};
use kafka_protocol::messages::{ElectLeadersRequest, ElectLeadersResponse, ResponseKind, TopicName};
use kafka_protocol::protocol::StrBytes;

use crate::codec::error_code;
use crate::controller::{self, Election, NoElection, Stop};
use crate::handler::Broker;

/// ElectLeaders election types.
const PREFERRED: i8 = 0;
const UNCLEAN: i8 = 1;

impl Broker {
    pub(crate) async fn elect_leaders(&self, request: ElectLeadersRequest, version: i16) -> ResponseKind {
        // v0 has no election type on the wire: it is always preferred (0, the default).
        let election = match request.election_type {
            PREFERRED => Some(Election::Preferred),
            UNCLEAN => Some(Election::Unclean),
            _ => None,
        };
        let asked: Option<Vec<(String, i32)>> = request.topic_partitions.map(|topics| {
            topics.into_iter().flat_map(|t| t.partitions.into_iter().map(move |p| (t.topic.0.to_string(), p))).collect()
        });
        let Some(election) = election else {
            let message = format!("unknown election type {}", request.election_type);
            return self.refuse(version, asked, error_code::INVALID_REQUEST, &message);
        };
        let Some(epoch) = self.controllership.epoch() else {
            return self.refuse(version, asked, error_code::NOT_CONTROLLER, "this broker is not the controller");
        };
        let every = asked.is_none();
        let elected = match controller::elect_leaders(&**self.topics.store(), epoch, election, asked.clone()).await {
            Ok(elected) => elected,
            Err(Stop::Fenced(why)) => {
                tracing::info!(why, "ElectLeaders: no longer the controller");
                return self.refuse(version, asked, error_code::NOT_CONTROLLER, "this broker is no longer the controller");
            }
            Err(e) => {
                tracing::warn!(error = ?e, "ElectLeaders: the election failed");
                return self.refuse(version, asked, error_code::UNKNOWN_SERVER_ERROR, "the metadata store failed");
            }
        };
        // Answered once this broker's view shows every new leader, or at the deadline.
        let timeout = Duration::from_millis(u64::try_from(request.timeout_ms).unwrap_or(0));
        let visible = |tp: &TopicPartition, epoch: i32| {
            self.topics.view().partition_state(tp).is_some_and(|s| s.state.leader_epoch >= epoch)
        };
        let written: Vec<(TopicPartition, i32)> = elected
            .iter()
            .filter_map(|((topic, partition), outcome)| {
                outcome.as_ref().ok().map(|s| (TopicPartition::new(topic, *partition), s.leader_epoch))
            })
            .collect();
        self.topics.view().wait_for(timeout, |_| written.iter().all(|(tp, epoch)| visible(tp, *epoch))).await;
        let results = elected
            .into_iter()
            .filter_map(|((topic, partition), outcome)| {
                let (code, message) = match outcome {
                    Ok(state) if visible(&TopicPartition::new(&topic, partition), state.leader_epoch) => (error_code::NONE, None),
                    Ok(_) => (error_code::REQUEST_TIMED_OUT, Some("elected; not yet visible on the controller")),
                    // Kafka leaves these out of an answer for every partition.
                    Err(NoElection::NotNeeded) if every => return None,
                    Err(NoElection::NotNeeded) => (error_code::ELECTION_NOT_NEEDED, Some("the leader needs no election")),
                    Err(NoElection::PreferredNotAvailable) => (
                        error_code::PREFERRED_LEADER_NOT_AVAILABLE,
                        Some("the preferred replica is not live and in the ISR, or the partition has no live leader"),
                    ),
                    Err(NoElection::NoEligibleLeader) => {
                        (error_code::ELIGIBLE_LEADERS_NOT_AVAILABLE, Some("no replica of the partition is live"))
                    }
                    Err(NoElection::UnknownPartition) => (error_code::UNKNOWN_TOPIC_OR_PARTITION, None),
                };
                Some(((topic, partition), code, message.map(StrBytes::from_static_str)))
            })
            .collect();
        respond(error_code::NONE, results)
    }

    /// The answer refusing the whole request: a top-level error from v1, and for v0
    /// (which has none) the same error on every partition asked for (`None`: every
    /// partition this broker knows of).
    fn refuse(&self, version: i16, asked: Option<Vec<(String, i32)>>, code: i16, message: &str) -> ResponseKind {
        if version >= 1 {
            return respond(code, Vec::new());
        }
        let partitions = asked.unwrap_or_else(|| {
            self.topics.list().iter().flat_map(|t| (0..t.partition_count()).map(|p| (t.name.clone(), p))).collect()
        });
        let message = StrBytes::from_string(message.to_owned());
        respond(error_code::NONE, partitions.into_iter().map(|tp| (tp, code, Some(message.clone()))).collect())
    }
}

/// The response, per-partition results grouped by topic (in the order first asked).
fn respond(code: i16, results: Vec<((String, i32), i16, Option<StrBytes>)>) -> ResponseKind {
    let mut order = Vec::new();
    let mut topics: BTreeMap<String, Vec<PartitionResult>> = BTreeMap::new();
    for ((topic, partition), code, message) in results {
        let result = PartitionResult::default().with_partition_id(partition).with_error_code(code).with_error_message(message);
        if !topics.contains_key(&topic) {
            order.push(topic.clone());
        }
        topics.entry(topic).or_default().push(result);
    }
    let results = order
        .into_iter()
        .map(|topic| {
            let partitions = topics.remove(&topic).unwrap_or_default();
            ReplicaElectionResult::default().with_topic(TopicName(StrBytes::from_string(topic))).with_partition_result(partitions)
        })
        .collect();
    ResponseKind::ElectLeaders(ElectLeadersResponse::default().with_error_code(code).with_replica_election_results(results))
}
