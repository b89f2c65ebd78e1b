//! Metadata: the live brokers, the controller, and the topics asked for (auto-created
//! when allowed), each partition with its leader, leader epoch, replicas, ISR and
//! offline replicas, as this broker's cluster view has them. This broker's own replica
//! counts as offline when its log could not be opened or holds a damaged batch (see
//! `LogDirs::unhealthy`), and a partition it leads then answers KAFKA_STORAGE_ERROR
//! (the leader is still named: what comes before the damage is served). DescribeCluster: the live
//! brokers, the controller and the cluster id (the metadata store's, the same on every
//! broker).

use std::collections::BTreeSet;

use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::metadata_response::{MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic};
use kafka_protocol::messages::{
    BrokerId, DescribeClusterRequest, DescribeClusterResponse, MetadataRequest, MetadataResponse, ResponseKind, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use crate::codec::error_code;
use crate::connection::Session;
use crate::handler::Broker;
use crate::topics::{Topic, TopicError};
use fjord_auth::{Operation, Resource};

impl Broker {
    /// Metadata, with every broker's address on `listener` (the one the client came in
    /// on); a broker without that listener is left out, as Kafka does.
    pub(crate) async fn metadata(&self, request: MetadataRequest, version: i16, session: &Session) -> ResponseKind {
        let listener = session.listener.name.as_str();
        let describe = |name: &str| self.authorize(session, Operation::Describe, Resource::topic(name));
        // v0: an empty list means every topic; v1+: null means every topic. v10+ entries
        // carry a topic id too; v12+ may name a topic by its id alone (KIP-516).
        let requested: Option<Vec<Result<String, uuid::Uuid>>> = match request.topics {
            None => None,
            Some(topics) if topics.is_empty() && version == 0 => None,
            Some(topics) => Some(
                topics
                    .into_iter()
                    .filter_map(|t| match t.name {
                        Some(name) => Some(Ok(name.0.to_string())),
                        None if version >= 12 => Some(Err(t.topic_id)),
                        None => None,
                    })
                    .collect(),
            ),
        };
        // Clients before v4 have no opt-out of auto-creation.
        let allow_auto_create = version < 4 || request.allow_auto_topic_creation;
        let mut unknown_ids = Vec::new();
        let found: Vec<(String, Result<_, TopicError>)> = match requested {
            // Kafka: only the topics the principal may Describe are listed.
            None => self.topics.list().into_iter().filter(|t| describe(&t.name)).map(|t| (t.name.clone(), Ok(t))).collect(),
            Some(names) => {
                let mut found = Vec::with_capacity(names.len());
                for name in names {
                    let name = match name {
                        Ok(name) => name,
                        // By id: never auto-created. A topic the principal may not
                        // Describe is as unknown as a missing one (Kafka), so that ids
                        // cannot be probed.
                        Err(id) => {
                            match self.topics.view().topic_by_id(&id).filter(|t| describe(&t.name)) {
                                Some(topic) => found.push((topic.name.clone(), Ok(topic))),
                                None => unknown_ids.push(id),
                            }
                            continue;
                        }
                    };
                    if !describe(&name) {
                        found.push((name, Err(TopicError::Unauthorized)));
                        continue;
                    }
                    // Auto-creation needs Create on the cluster or on the topic; without
                    // it a missing topic answers TOPIC_AUTHORIZATION_FAILED (Kafka).
                    let topic = self.topic_or_auto_create(session, &name, allow_auto_create).await;
                    if let Err(TopicError::Internal(e)) = &topic {
                        tracing::error!(topic = %name, error = %e, "auto-creating topic failed");
                    }
                    found.push((name, topic));
                }
                found
            }
        };
        let view = self.topics.view();
        let brokers: Vec<MetadataResponseBroker> = self
            .live_brokers(listener)
            .into_iter()
            .map(|(id, host, port, rack)| {
                MetadataResponseBroker::default()
                    .with_node_id(BrokerId(id))
                    .with_host(StrBytes::from_string(host))
                    .with_port(port)
                    .with_rack(rack.map(StrBytes::from_string))
            })
            .collect();
        let live: BTreeSet<i32> = brokers.iter().map(|b| b.node_id.0).collect();
        // v8+ asks for the authorized operations (the cluster's up to v10); i32::MIN is
        // Kafka's "not asked for".
        let topic_operations = version >= 8 && request.include_topic_authorized_operations;
        let cluster_operations = (8..=10).contains(&version) && request.include_cluster_authorized_operations;
        let topics: Vec<MetadataResponseTopic> = found
            .into_iter()
            .map(|(name, topic)| match topic {
                Ok(topic) => self.topic_metadata(&topic, &live).with_topic_authorized_operations(if topic_operations {
                    self.authorized_operations(session, Resource::topic(&topic.name))
                } else {
                    i32::MIN
                }),
                Err(e) => MetadataResponseTopic::default()
                    .with_name(Some(TopicName(StrBytes::from_string(name))))
                    .with_error_code(e.code()),
            })
            // An unknown id has no name to answer with (Kafka: null, with the id).
            .chain(unknown_ids.into_iter().map(|id| {
                MetadataResponseTopic::default().with_name(None).with_topic_id(id).with_error_code(error_code::UNKNOWN_TOPIC_ID)
            }))
            .collect();
        ResponseKind::Metadata(
            MetadataResponse::default()
                .with_brokers(brokers)
                .with_cluster_id(Some(StrBytes::from_string(self.cluster_id.clone())))
                .with_controller_id(BrokerId(view.controller().unwrap_or(-1)))
                .with_cluster_authorized_operations(if cluster_operations {
                    self.authorized_operations(session, Resource::cluster())
                } else {
                    i32::MIN
                })
                .with_topics(topics),
        )
    }

    /// DescribeCluster (v0-v1): the brokers (their addresses on `listener`, as in
    /// Metadata), the controller and the cluster id. There are no KRaft controllers to
    /// describe (endpoint type 2).
    pub(crate) fn describe_cluster(&self, request: DescribeClusterRequest, session: &Session) -> ResponseKind {
        const BROKERS: i8 = 1;
        const UNSUPPORTED_ENDPOINT_TYPE: i16 = 115;
        let listener = session.listener.name.as_str();
        let response = DescribeClusterResponse::default()
            .with_endpoint_type(request.endpoint_type)
            .with_cluster_id(StrBytes::from_string(self.cluster_id.clone()))
            // i32::MIN is Kafka's "not asked for".
            .with_cluster_authorized_operations(if request.include_cluster_authorized_operations {
                self.authorized_operations(session, Resource::cluster())
            } else {
                i32::MIN
            });
        if request.endpoint_type != BROKERS {
            return ResponseKind::DescribeCluster(response.with_error_code(UNSUPPORTED_ENDPOINT_TYPE).with_error_message(Some(
                StrBytes::from_string(format!(
                    "endpoint type {} is not served: this cluster has brokers only",
                    request.endpoint_type
                )),
            )));
        }
        let brokers = self
            .live_brokers(listener)
            .into_iter()
            .map(|(id, host, port, rack)| {
                DescribeClusterBroker::default()
                    .with_broker_id(BrokerId(id))
                    .with_host(StrBytes::from_string(host))
                    .with_port(port)
                    .with_rack(rack.map(StrBytes::from_string))
            })
            .collect();
        let controller = self.topics.view().controller().unwrap_or(-1);
        ResponseKind::DescribeCluster(response.with_controller_id(BrokerId(controller)).with_brokers(brokers))
    }

    /// The live brokers with an address on `listener`, as (id, host, port, rack), sorted
    /// by id; a broker without that listener is left out, as Kafka does. Between its
    /// start and its registration reaching the view (or while stopping), this broker
    /// still answers for itself.
    fn live_brokers(&self, listener: &str) -> Vec<(i32, String, i32, Option<String>)> {
        let mut brokers: Vec<_> = self
            .topics
            .view()
            .brokers()
            .into_iter()
            .filter_map(|(id, registration)| {
                let (host, port) = registration.endpoint(listener)?;
                Some((id, host.to_owned(), i32::from(port), registration.rack.clone()))
            })
            .collect();
        let own = self.listeners.iter().find(|l| l.name == listener);
        if let Some(own) = own.filter(|_| !brokers.iter().any(|b| b.0 == self.config.broker_id)) {
            brokers.push((self.config.broker_id, own.host.clone(), i32::from(own.port), self.config.broker_rack.clone()));
            brokers.sort_by_key(|b| b.0);
        }
        brokers
    }

    /// The ids of the live brokers with an address on `listener`, as Metadata counts
    /// replicas offline by them.
    pub(super) fn live_broker_ids(&self, listener: &str) -> BTreeSet<i32> {
        self.live_brokers(listener).into_iter().map(|b| b.0).collect()
    }

    /// One topic's Metadata answer: its id and each partition's leader, leader epoch,
    /// replicas, ISR, offline replicas and error (`live`: the live brokers' ids).
    pub(super) fn topic_metadata(&self, topic: &Topic, live: &BTreeSet<i32>) -> MetadataResponseTopic {
        let view = self.topics.view();
        let unhealthy = self.topics.logs().unhealthy();
        let me = self.config.broker_id;
        let ids = |ids: &[i32]| ids.iter().copied().map(BrokerId).collect::<Vec<_>>();
        let partitions = topic
            .replicas
            .iter()
            .enumerate()
            .map(|(p, replicas)| {
                let p = p as i32;
                let state = view.partition_state(&fjord_record::TopicPartition::new(&topic.name, p));
                let (leader, leader_epoch, isr) =
                    state.map_or((-1, -1, Vec::new()), |s| (s.state.leader, s.state.leader_epoch, s.state.isr));
                let tp = fjord_record::TopicPartition::new(&topic.name, p);
                let damaged_here = unhealthy.contains_key(&tp);
                // Another broker's unhealthy replica, as it published it (this broker's own
                // is known first-hand, before its publication comes round).
                let unhealthy_peers = view.unhealthy_replicas(&tp);
                let offline: Vec<i32> = replicas
                    .iter()
                    .copied()
                    .filter(|&r| !live.contains(&r) || (r == me && damaged_here) || (r != me && unhealthy_peers.contains(&r)))
                    .collect();
                // A leader that is not live cannot be reached: the controller is about to
                // elect another; until then the client must wait, as with no leader.
                let (leader, error) = if leader >= 0 && live.contains(&leader) {
                    // The leader's copy is damaged or offline: as the leader itself answers.
                    let storage_error = if leader == me { damaged_here } else { unhealthy_peers.contains(&leader) };
                    (leader, if storage_error { error_code::KAFKA_STORAGE_ERROR } else { error_code::NONE })
                } else {
                    (-1, error_code::LEADER_NOT_AVAILABLE)
                };
                MetadataResponsePartition::default()
                    .with_error_code(error)
                    .with_partition_index(p)
                    .with_leader_id(BrokerId(leader))
                    .with_leader_epoch(leader_epoch)
                    .with_replica_nodes(ids(replicas))
                    .with_isr_nodes(ids(&isr))
                    .with_offline_replicas(ids(&offline))
            })
            .collect();
        MetadataResponseTopic::default()
            .with_name(Some(TopicName(StrBytes::from_string(topic.name.clone()))))
            .with_topic_id(topic.topic_id)
            .with_is_internal(crate::topics::is_internal(&topic.name))
            .with_partitions(partitions)
    }
}
