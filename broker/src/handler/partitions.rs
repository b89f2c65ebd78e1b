//! CreatePartitions: raises topics' partition counts ([`crate::topics::Topics::add_partitions`]).

use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::{CreatePartitionsRequest, CreatePartitionsResponse, ResponseKind};
use kafka_protocol::protocol::StrBytes;

use crate::codec::error_code;
use crate::connection::Session;
use crate::handler::Broker;
use crate::topics::TopicError;
use fjord_auth::{Operation, Resource};

impl Broker {
    pub(crate) async fn create_partitions(&self, request: CreatePartitionsRequest, session: &Session) -> ResponseKind {
        let mut results = Vec::with_capacity(request.topics.len());
        let mut seen = std::collections::BTreeSet::new();
        for topic in request.topics {
            let result = CreatePartitionsTopicResult::default().with_name(topic.name.clone());
            // Kafka refuses a topic named twice in one request rather than applying either.
            if !seen.insert(topic.name.0.clone()) {
                results.push(
                    result
                        .with_error_code(error_code::INVALID_REQUEST)
                        .with_error_message(Some(StrBytes::from_static_str("topic named more than once"))),
                );
                continue;
            }
            let manual = topic
                .assignments
                .map(|assignments| assignments.into_iter().map(|a| a.broker_ids.into_iter().map(|b| b.0).collect()).collect());
            // Kafka: Alter on the topic.
            let outcome = match self.authorize(session, Operation::Alter, Resource::topic(&topic.name.0)) {
                true => self.topics.add_partitions(&topic.name.0, topic.count, manual, request.validate_only).await,
                false => Err(TopicError::Unauthorized),
            };
            results.push(match outcome {
                Ok(()) => result.with_error_code(error_code::NONE),
                Err(e) => {
                    if let TopicError::Internal(e) = &e {
                        tracing::error!(topic = %topic.name.0, error = %e, "adding partitions failed");
                    }
                    result.with_error_code(e.code()).with_error_message(Some(StrBytes::from_string(e.to_string())))
                }
            });
        }
        ResponseKind::CreatePartitions(CreatePartitionsResponse::default().with_results(results))
    }
}
