//! Metadata: this broker, and the topics asked for (auto-created when allowed).

use kafka_protocol::messages::metadata_response::{MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic};
use kafka_protocol::messages::{BrokerId, MetadataRequest, MetadataResponse, ResponseKind, TopicName};
use kafka_protocol::protocol::StrBytes;

use crate::handler::Broker;
use crate::topics::{Topic, TopicError};

impl Broker {
    pub(crate) async fn metadata(&self, request: MetadataRequest, version: i16) -> ResponseKind {
        // v0: an empty list means every topic; v1+: null means every topic.
        let requested: Option<Vec<String>> = match request.topics {
            None => None,
            Some(topics) if topics.is_empty() && version == 0 => None,
            Some(topics) => Some(topics.into_iter().filter_map(|t| t.name).map(|n| n.0.to_string()).collect()),
        };
        // Clients before v4 have no opt-out of auto-creation.
        let allow_auto_create = version < 4 || request.allow_auto_topic_creation;
        let mut topics = Vec::new();
        match requested {
            None => topics.extend(self.topics.list().iter().map(|t| self.topic_metadata(t))),
            Some(names) => {
                for name in names {
                    let auto = self.config.auto_create_topics && allow_auto_create;
                    let entry = match self.topics.get_or_auto_create(&name, auto, self.config.num_partitions).await {
                        Ok(topic) => self.topic_metadata(&topic),
                        Err(e) => {
                            if let TopicError::Internal(e) = &e {
                                tracing::error!(topic = %name, error = %e, "auto-creating topic failed");
                            }
                            MetadataResponseTopic::default()
                                .with_name(Some(TopicName(StrBytes::from_string(name))))
                                .with_error_code(e.code())
                        }
                    };
                    topics.push(entry);
                }
            }
        }
        let broker = MetadataResponseBroker::default()
            .with_node_id(BrokerId(self.config.broker_id))
            .with_host(StrBytes::from_string(self.host.clone()))
            .with_port(self.port);
        ResponseKind::Metadata(
            MetadataResponse::default()
                .with_brokers(vec![broker])
                .with_cluster_id(Some(StrBytes::from_string(self.cluster_id.clone())))
                .with_controller_id(BrokerId(self.config.broker_id))
                .with_topics(topics),
        )
    }

    fn topic_metadata(&self, topic: &Topic) -> MetadataResponseTopic {
        let me = BrokerId(self.config.broker_id);
        let partitions = topic
            .partitions
            .iter()
            .map(|p| {
                MetadataResponsePartition::default()
                    .with_partition_index(p.tp.partition)
                    .with_leader_id(me)
                    .with_leader_epoch(0)
                    .with_replica_nodes(vec![me])
                    .with_isr_nodes(vec![me])
            })
            .collect();
        MetadataResponseTopic::default()
            .with_name(Some(TopicName(StrBytes::from_string(topic.name.clone()))))
            .with_partitions(partitions)
    }
}
