//! ListConfigResources (API 74, v0-v1): the resources a client can describe configs of.
//! v0 was KIP-714's ListClientMetricsResources (client-metrics resources only); v1
//! (KIP-1142, Kafka 4.1) takes resource types, none meaning every type v1 knows: topic,
//! broker, broker logger, client metrics and group. Needs DescribeConfigs on the cluster
//! (Kafka); a type outside the version's set is UNSUPPORTED_VERSION, as in Kafka.
//!
//! What Fjord has of each: every topic, every live broker (DescribeConfigs serves both),
//! and nothing of the other three: no broker-logger configs, no client-metrics
//! subscriptions (KIP-714 telemetry is not served) and no group configs (KIP-848's
//! `group.*` overrides), so those types answer no resources rather than an error.

use kafka_protocol::messages::list_config_resources_response::ConfigResource;
use kafka_protocol::messages::{ListConfigResourcesRequest, ListConfigResourcesResponse, ResponseKind};
use kafka_protocol::protocol::StrBytes;

use super::admin::{RESOURCE_BROKER, RESOURCE_TOPIC};
use crate::codec::error_code;
use crate::connection::Session;
use crate::handler::Broker;
use fjord_auth::{Operation, Resource};

const RESOURCE_BROKER_LOGGER: i8 = 8;
const RESOURCE_CLIENT_METRICS: i8 = 16;
const RESOURCE_GROUP: i8 = 32;

/// The resource types version `version` lists (Kafka's `supportedResourceTypes`).
fn supported_types(version: i16) -> &'static [i8] {
    if version == 0 {
        &[RESOURCE_CLIENT_METRICS]
    } else {
        &[RESOURCE_TOPIC, RESOURCE_BROKER, RESOURCE_BROKER_LOGGER, RESOURCE_CLIENT_METRICS, RESOURCE_GROUP]
    }
}

/// The (name, type) of each resource of the types asked for (`requested`, none meaning
/// every type the version knows), from the cluster's `topics` and live `brokers`; Err with
/// the error code when a type is not one the version knows.
fn list(version: i16, requested: &[i8], topics: &[String], brokers: &[i32]) -> Result<Vec<(String, i8)>, i16> {
    let supported = supported_types(version);
    let types = if requested.is_empty() { supported } else { requested };
    if types.iter().any(|t| !supported.contains(t)) {
        return Err(error_code::UNSUPPORTED_VERSION);
    }
    let mut resources = Vec::new();
    if types.contains(&RESOURCE_TOPIC) {
        resources.extend(topics.iter().map(|t| (t.clone(), RESOURCE_TOPIC)));
    }
    if types.contains(&RESOURCE_BROKER) {
        resources.extend(brokers.iter().map(|b| (b.to_string(), RESOURCE_BROKER)));
    }
    Ok(resources)
}

impl Broker {
    pub(crate) fn list_config_resources(
        &self,
        request: ListConfigResourcesRequest,
        version: i16,
        session: &Session,
    ) -> ResponseKind {
        let response = ListConfigResourcesResponse::default();
        if !self.authorize(session, Operation::DescribeConfigs, Resource::cluster()) {
            return ResponseKind::ListConfigResources(response.with_error_code(error_code::CLUSTER_AUTHORIZATION_FAILED));
        }
        let topics: Vec<String> = self.topics.list().iter().map(|t| t.name.clone()).collect();
        let brokers: Vec<i32> = self.live_broker_ids(session.listener.name.as_str()).into_iter().collect();
        let response = match list(version, &request.resource_types, &topics, &brokers) {
            Ok(resources) => response.with_config_resources(
                resources
                    .into_iter()
                    .map(|(name, resource_type)| {
                        ConfigResource::default()
                            .with_resource_name(StrBytes::from_string(name))
                            .with_resource_type(resource_type)
                    })
                    .collect(),
            ),
            Err(code) => response.with_error_code(code),
        };
        ResponseKind::ListConfigResources(response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topics() -> Vec<String> {
        vec!["a".to_owned(), "b".to_owned()]
    }

    #[test]
    fn no_types_means_every_type_the_version_knows() {
        let every = list(1, &[], &topics(), &[0, 2]).unwrap();
        assert_eq!(
            every,
            [("a", RESOURCE_TOPIC), ("b", RESOURCE_TOPIC), ("0", RESOURCE_BROKER), ("2", RESOURCE_BROKER)]
                .map(|(n, t)| (n.to_owned(), t))
        );
        // v0 knows client-metrics resources only, and Fjord has none.
        assert_eq!(list(0, &[], &topics(), &[0]).unwrap(), []);
    }

    #[test]
    fn each_type_lists_its_own_resources_and_unknown_types_are_unsupported() {
        assert_eq!(list(1, &[RESOURCE_BROKER], &topics(), &[1]).unwrap(), [("1".to_owned(), RESOURCE_BROKER)]);
        assert_eq!(list(1, &[RESOURCE_TOPIC], &topics(), &[1]).unwrap().len(), 2);
        assert_eq!(list(1, &[RESOURCE_GROUP, RESOURCE_CLIENT_METRICS, RESOURCE_BROKER_LOGGER], &topics(), &[1]).unwrap(), []);
        assert_eq!(list(1, &[RESOURCE_TOPIC, 3], &topics(), &[1]), Err(error_code::UNSUPPORTED_VERSION));
        assert_eq!(list(0, &[RESOURCE_TOPIC], &topics(), &[1]), Err(error_code::UNSUPPORTED_VERSION));
    }
}
