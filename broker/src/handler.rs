//! Request dispatch: one decoded request in, at most one response out (acks=0 produce
//! has none). Every failure a client can cause is answered with a Kafka error code here;
//! nothing below returns an [`crate::Error`] for client input.

pub(crate) mod acls;
pub(crate) mod admin;
pub(crate) mod alter_configs;
pub(crate) mod alter_replica_log_dirs;
pub(crate) mod authz;
pub(crate) mod broker_configs;
pub(crate) mod client_quotas;
pub(crate) mod delete_records;
pub(crate) mod describe_configs;
pub(crate) mod describe_log_dirs;
pub(crate) mod describe_producers;
pub(crate) mod describe_topic_partitions;
pub(crate) mod elect;
pub(crate) mod fetch;
pub(crate) mod leader_epoch;
pub(crate) mod list_config_resources;
pub(crate) mod metadata;
pub(crate) mod offset_delete;
pub(crate) mod offsets;
pub(crate) mod partitions;
pub(crate) mod produce;
pub(crate) mod producer_id;
pub(crate) mod reassign;
pub(crate) mod txn;
pub(crate) mod update_features;
pub(crate) mod write_txn_markers;

use kafka_protocol::messages::api_versions_response::ApiVersion;
use std::sync::Arc;

use fjord_auth::{Operation, Principal, Resource};
use fjord_record::TopicPartition;

use kafka_protocol::messages::{ApiKey, ApiVersionsResponse, RequestKind, ResponseKind};

use crate::codec::{self, error_code, Decoded, SUPPORTED_APIS};
use crate::connection::Session;
use crate::group::GroupCoordinator;
use crate::handler::producer_id::ProducerIdManager;
use crate::metrics::{fetch_errors, response_errors, Metrics};
use crate::partition::Partition;
use crate::quota::QuotaKind;
use crate::replication::ReplicaManager;
use crate::response::Reply;
use crate::topics::{Topic, Topics};
use crate::BrokerConfig;

/// What every handler needs: the config, who we are, the topics and the partitions served here.
pub(crate) struct Broker {
    pub(crate) config: BrokerConfig,
    pub(crate) cluster_id: String,
    pub(crate) topics: Topics,
    pub(crate) replicas: Arc<ReplicaManager>,
    pub(crate) groups: GroupCoordinator,
    /// Requests and errors per API, for the metrics endpoint.
    pub(crate) metrics: Metrics,
    /// Idempotent producer ids (InitProducerId).
    pub(crate) producer_ids: ProducerIdManager,
    /// The transaction coordinator's state (`crate::txn`).
    pub(crate) txns: crate::txn::TxnCoordinator,
    /// The controller epoch while this broker is the controller (ElectLeaders).
    pub(crate) controllership: Arc<crate::controller::Controllership>,
    /// Every listener, with its protocol and advertised address.
    pub(crate) listeners: Vec<crate::listener::ListenerInfo>,
    /// Connections open now, for `max.connections` and `max.connections.per.ip`.
    pub(crate) connections: crate::listener::ConnectionLimits,
    /// The bytes of requests held now, bounded by `queued.max.request.bytes`.
    pub(crate) request_memory: crate::request_memory::RequestMemory,
    /// TLS of the SSL and SASL_SSL listeners, when there are any.
    pub(crate) tls: Option<crate::tls::TlsServer>,
    /// The live ACL snapshot when `authorizer.enable`; `None` allows everything.
    pub(crate) acls: Option<Arc<fjord_auth::AclWatcher>>,
    /// Client quotas and the clients' rates (`crate::quota`).
    pub(crate) quotas: Arc<crate::quota::ClientQuotas>,
    /// The broker's background tasks: the shutdown waits for those a handler starts (a
    /// replica move between log dirs) before the logs close.
    pub(crate) tasks: tokio_util::task::TaskTracker,
    /// Fired when the broker stops serving; such a task then ends soon.
    pub(crate) stop: tokio_util::sync::CancellationToken,
}

/// The replica a per-partition answer works on, or the code to answer instead:
/// TOPIC_AUTHORIZATION_FAILED when the client may not act on the topic (without asking
/// where the partition is, so a denied client learns nothing of it), else `locate`'s.
pub(crate) fn authorized_replica(
    allowed: bool,
    locate: impl FnOnce() -> Result<Arc<Partition>, i16>,
) -> Result<Arc<Partition>, i16> {
    if allowed {
        locate()
    } else {
        Err(error_code::TOPIC_AUTHORIZATION_FAILED)
    }
}

impl Broker {
    /// This broker's replica of partition `index` of `topic`: UNKNOWN_TOPIC_OR_PARTITION
    /// when the topic has no such partition, KAFKA_STORAGE_ERROR when its log here could
    /// not be opened (as Kafka answers for a replica on an offline log dir),
    /// NOT_LEADER_OR_FOLLOWER when this broker holds no replica of it (the client
    /// refreshes its metadata and goes to the leader). The replica's role is checked by
    /// whoever uses it.
    pub(crate) fn replica(&self, topic: &Topic, index: i32) -> Result<Arc<Partition>, i16> {
        if topic.partition_replicas(index).is_none() {
            return Err(error_code::UNKNOWN_TOPIC_OR_PARTITION);
        }
        let tp = TopicPartition::new(&topic.name, index);
        self.replicas.get(&tp).ok_or_else(|| match self.topics.logs().unhealthy().get(&tp) {
            Some(fjord_log::Unhealthy::Offline { .. }) => error_code::KAFKA_STORAGE_ERROR,
            _ => error_code::NOT_LEADER_OR_FOLLOWER,
        })
    }

    /// [`Broker::replica`] of a topic by name: UNKNOWN_TOPIC_OR_PARTITION for a topic
    /// this broker does not know. What the per-partition handlers pass as their `replica`
    /// dependency.
    pub(crate) fn replica_named(&self, topic: &str, index: i32) -> Result<Arc<Partition>, i16> {
        match self.topics.get(topic) {
            Some(topic) => self.replica(&topic, index),
            None => Err(error_code::UNKNOWN_TOPIC_OR_PARTITION),
        }
    }

    /// The topic, auto-created when missing if the request asks for it (`requested`),
    /// `auto.create.topics.enable` is on, and the principal may Create it (Kafka's rule
    /// for auto-creation: Create on the cluster or the topic; always so without an
    /// authorizer), with the broker's `num.partitions` and `default.replication.factor`.
    /// A missing topic that was asked for but may not be created is `Unauthorized` (what
    /// Kafka's Metadata answers); one not asked for, or with auto-creation off, `Unknown`.
    pub(crate) async fn topic_or_auto_create(
        &self,
        session: &Session,
        name: &str,
        requested: bool,
    ) -> Result<Arc<Topic>, crate::topics::TopicError> {
        if let Some(topic) = self.topics.get(name) {
            return Ok(topic);
        }
        let c = &self.config;
        // The coordinators create their own logs, with their own layout and config
        // (`crate::txn`); one a client made first would have the defaults.
        if !(requested && c.auto_create_topics) || crate::topics::is_internal(name) {
            return Err(crate::topics::TopicError::Unknown);
        }
        // Checked only for a missing topic: the ACL lookups stay off the produce path.
        if !self.may_create_topic(session, name) {
            return Err(crate::topics::TopicError::Unauthorized);
        }
        self.topics.get_or_auto_create(name, true, c.num_partitions, c.default_replication_factor).await
    }

    /// Whether the client of `session` may perform `operation` on `resource`: always with
    /// `authorizer.enable` off; always for the inter-broker principal (replication and the
    /// controller act for the cluster); else the ACLs decide (super users included).
    pub(crate) fn authorize(&self, session: &Session, operation: Operation, resource: Resource<'_>) -> bool {
        let Some(acls) = &self.acls else { return true };
        let inter_broker = self.config.inter_broker_sasl_username.as_deref();
        if session.authenticated && inter_broker.is_some_and(|name| session.principal == Principal::user(name)) {
            return true;
        }
        acls.authorize(&session.principal, &session.peer.ip().to_string(), operation, resource)
    }

    /// Kafka's rule for creating a topic (CreateTopics, auto-creation): Create on the
    /// cluster, or on the topic.
    pub(crate) fn may_create_topic(&self, session: &Session, topic: &str) -> bool {
        self.authorize(session, Operation::Create, Resource::cluster())
            || self.authorize(session, Operation::Create, Resource::topic(topic))
    }

    /// Whether the handling time of `decoded` counts against a request quota: Kafka
    /// exempts the brokers' own requests (replica fetches, transaction markers, the
    /// inter-broker principal) and what a client needs before it can be throttled
    /// (ApiVersions and SASL). Kafka counts only a request thread's time, never the time
    /// a request waits in purgatory; Fjord measures a handler from start to answer, so the
    /// requests whose handlers wait for other clients or for the cluster (a rebalance, a
    /// topic's creation, followers, transaction markers) are not counted either: their
    /// wait is not handling, and would throttle a consumer for joining its group. A
    /// fetch's long poll is subtracted instead (`Session::waited`).
    pub(crate) fn request_quota_applies(&self, decoded: &Decoded, session: &Session) -> bool {
        let Decoded::Request { request, .. } = decoded else { return false };
        let inter_broker = self.config.inter_broker_sasl_username.as_deref();
        if !session.authenticated || inter_broker.is_some_and(|name| session.principal == Principal::user(name)) {
            return false;
        }
        !matches!(
            **request,
            RequestKind::ApiVersions(_)
                | RequestKind::SaslHandshake(_)
                | RequestKind::SaslAuthenticate(_)
                | RequestKind::WriteTxnMarkers(_)
                | RequestKind::JoinGroup(_)
                | RequestKind::SyncGroup(_)
                | RequestKind::CreateTopics(_)
                | RequestKind::DeleteTopics(_)
                | RequestKind::CreatePartitions(_)
                | RequestKind::DeleteRecords(_)
                | RequestKind::ElectLeaders(_)
                | RequestKind::AlterPartitionReassignments(_)
                | RequestKind::InitProducerId(_)
                | RequestKind::AddPartitionsToTxn(_)
                | RequestKind::EndTxn(_)
        ) && !matches!(&**request, RequestKind::Fetch(fetch) if fetch.replica_id.0 >= 0)
    }

    /// Answers one request from the client of `session`: a response now, or (an acks=all
    /// produce, appended already) one that completes once the ISR has the batches.
    pub(crate) async fn handle(self: &Arc<Self>, decoded: Decoded, session: &mut Session) -> Option<Reply> {
        let (header, version, request, size) = match decoded {
            Decoded::Unsupported { correlation_id, api_key, version } => {
                tracing::debug!(api_key, version, "unsupported api key or version");
                self.metrics.request(api_key);
                self.metrics.errors(api_key, [error_code::UNSUPPORTED_VERSION]);
                if api_key == ApiKey::ApiVersions as i16 {
                    // KIP-511: a v0 body with the error and our ranges, so the client can retry
                    // with a version we both know.
                    let body = api_versions(error_code::UNSUPPORTED_VERSION);
                    return Some(codec::encode_response(correlation_id, ApiKey::ApiVersions, 0, &body).into());
                }
                return Some(codec::error_response(correlation_id, error_code::UNSUPPORTED_VERSION).into());
            }
            Decoded::LegacyProduce { header, version, body } => {
                self.metrics.request(header.request_api_key);
                return produce::legacy(&header, version, body, &self.metrics).map(Reply::from);
            }
            Decoded::Request { header, version, request, size } => (header, version, request, size),
        };
        let correlation_id = header.correlation_id;
        session.set_client_id(header.client_id.as_deref());
        self.metrics.request(header.request_api_key);
        // Requests denied as a whole are answered before they reach their handler.
        let refusal =
            self.refuse_group_request(session, &request, version).or_else(|| self.refuse_cluster_request(session, &request));
        if let (Some(body), Ok(key)) = (refusal, ApiKey::try_from(header.request_api_key)) {
            self.metrics.errors(key as i16, response_errors(&body));
            return Some(codec::encode_response(correlation_id, key, version, &body).into());
        }
        let (key, body) = match *request {
            RequestKind::ApiVersions(_) => (ApiKey::ApiVersions, api_versions(error_code::NONE)),
            RequestKind::Metadata(req) => (ApiKey::Metadata, self.metadata(req, version, session).await),
            RequestKind::Produce(req) => {
                // Kafka counts the whole request against the producer quota, and appends
                // it either way: the throttle slows the next one.
                let user = session.principal.name();
                let byte_throttle = self.quotas.record(QuotaKind::Produce, user, &session.client_id, size as f64);
                self.metrics.throttled(QuotaKind::Produce, byte_throttle);
                let throttle = byte_throttle.max(self.quotas.throttle(QuotaKind::Request, user, &session.client_id));
                session.throttle(throttle);
                let throttle_time_ms = i32::try_from(throttle.as_millis()).unwrap_or(i32::MAX);
                match self.produce(req, version, session).await? {
                    produce::Produced::Answered(body) => {
                        (ApiKey::Produce, ResponseKind::Produce(body.with_throttle_time_ms(throttle_time_ms)))
                    }
                    produce::Produced::Replicating(replicated) => {
                        let broker = self.clone();
                        let (answered, done) = tokio::sync::oneshot::channel();
                        if !throttle.is_zero() {
                            session.answered = Some(done);
                        }
                        return Some(Reply::Later(Box::pin(async move {
                            let body = ResponseKind::Produce(replicated.await.with_throttle_time_ms(throttle_time_ms));
                            let _ = answered.send(());
                            broker.metrics.errors(ApiKey::Produce as i16, response_errors(&body));
                            Some(codec::encode_response(correlation_id, ApiKey::Produce, version, &body))
                        })));
                    }
                }
            }
            RequestKind::Fetch(mut req) => {
                let consumer = req.replica_id.0 < 0;
                if consumer {
                    // Kafka caps a fetch under a consumer quota at what the quota allows
                    // in one measurement window.
                    if let Some(cap) = self.quotas.max_fetch_bytes(session.principal.name(), &session.client_id) {
                        req.max_bytes = req.max_bytes.min(i32::try_from(cap).unwrap_or(i32::MAX));
                    }
                }
                let mut data = self.fetch(req, version, session).await;
                if consumer {
                    let user = session.principal.name();
                    let bytes = data.records_bytes() as f64;
                    let fetch_throttle = self.quotas.record(QuotaKind::Fetch, user, &session.client_id, bytes);
                    self.metrics.throttled(QuotaKind::Fetch, fetch_throttle);
                    if !fetch_throttle.is_zero() {
                        // Kafka answers a throttled fetch with no records, which then do
                        // not count: the client fetches them again after the throttle.
                        self.quotas.unrecord(QuotaKind::Fetch, user, &session.client_id, bytes);
                        data.topics.clear();
                    }
                    let throttle = fetch_throttle.max(self.quotas.throttle(QuotaKind::Request, user, &session.client_id));
                    session.throttle(throttle);
                    data.throttle_time_ms = i32::try_from(throttle.as_millis()).unwrap_or(i32::MAX);
                }
                self.metrics.errors(ApiKey::Fetch as i16, fetch_errors(&data));
                return Some(crate::fetch_response::encode(correlation_id, version, &data).into());
            }
            RequestKind::OffsetForLeaderEpoch(req) => {
                (ApiKey::OffsetForLeaderEpoch, self.offset_for_leader_epoch(req, session).await)
            }
            RequestKind::ListOffsets(req) => (ApiKey::ListOffsets, self.list_offsets(req, version, session)),
            RequestKind::CreateTopics(req) => (ApiKey::CreateTopics, self.create_topics(req, version, session).await),
            RequestKind::DeleteTopics(req) => (ApiKey::DeleteTopics, self.delete_topics(req, version, session).await),
            RequestKind::DescribeConfigs(req) => (ApiKey::DescribeConfigs, self.describe_configs(req, session).await),
            RequestKind::AlterConfigs(req) => (ApiKey::AlterConfigs, self.alter_configs(req, session).await),
            RequestKind::IncrementalAlterConfigs(req) => {
                (ApiKey::IncrementalAlterConfigs, self.incremental_alter_configs(req, session).await)
            }
            RequestKind::FindCoordinator(req) if req.key_type == crate::txn::KEY_TYPE_TRANSACTION => {
                (ApiKey::FindCoordinator, self.find_txn_coordinator(req, version, session).await)
            }
            RequestKind::FindCoordinator(req) => {
                let key_type = req.key_type;
                let mut body = self.groups.find_coordinator(req, version, &session.listener.name).await;
                self.hide_coordinators(session, key_type, &mut body);
                (ApiKey::FindCoordinator, body)
            }
            RequestKind::JoinGroup(req) => {
                let client_id = header.client_id.as_deref().unwrap_or_default();
                let client_host = format!("/{}", session.peer.ip());
                (ApiKey::JoinGroup, self.groups.join_group(req, version, client_id, &client_host).await)
            }
            RequestKind::SyncGroup(req) => (ApiKey::SyncGroup, self.groups.sync_group(req, version).await),
            RequestKind::Heartbeat(req) => (ApiKey::Heartbeat, self.groups.heartbeat(req).await),
            RequestKind::LeaveGroup(req) => (ApiKey::LeaveGroup, self.groups.leave_group(req, version).await),
            RequestKind::OffsetCommit(mut req) => {
                let denied = self.take_unreadable_topics(session, &mut req);
                let known = |topic: &str, p: i32| self.topics.get(topic).is_some_and(|t| t.partition_replicas(p).is_some());
                let mut body = self.groups.offset_commit(req, version, known).await;
                if let ResponseKind::OffsetCommit(response) = &mut body {
                    response.topics.extend(denied);
                }
                (ApiKey::OffsetCommit, body)
            }
            RequestKind::OffsetFetch(mut req) => {
                let mut ids: Vec<_> = req.groups.iter().map(|g| g.group_id.clone()).collect();
                let denied = self.take_denied_groups(session, Operation::Describe, &mut ids);
                req.groups.retain(|g| !denied.contains(&g.group_id));
                let mut body = self.groups.offset_fetch(req, version).await;
                self.add_denied_groups(session, &mut body, denied);
                (ApiKey::OffsetFetch, body)
            }
            RequestKind::ListGroups(req) => {
                let mut body = self.groups.list_groups(req).await;
                self.add_denied_groups(session, &mut body, Vec::new());
                (ApiKey::ListGroups, body)
            }
            RequestKind::DescribeGroups(mut req) => {
                let denied = self.take_denied_groups(session, Operation::Describe, &mut req.groups);
                let include_operations = req.include_authorized_operations;
                let mut body = self.groups.describe_groups(req).await;
                if let (true, ResponseKind::DescribeGroups(r)) = (include_operations, &mut body) {
                    for g in r.groups.iter_mut().filter(|g| g.error_code == 0) {
                        g.authorized_operations = self.authorized_operations(session, Resource::group(&g.group_id));
                    }
                }
                self.add_denied_groups(session, &mut body, denied);
                (ApiKey::DescribeGroups, body)
            }
            RequestKind::OffsetDelete(req) => (ApiKey::OffsetDelete, self.offset_delete(req, session).await),
            RequestKind::DeleteGroups(mut req) => {
                let denied = self.take_denied_groups(session, Operation::Delete, &mut req.groups_names);
                let mut body = self.groups.delete_groups(req).await;
                self.add_denied_groups(session, &mut body, denied);
                (ApiKey::DeleteGroups, body)
            }
            RequestKind::InitProducerId(req) => (ApiKey::InitProducerId, self.init_producer_id(req, version).await),
            RequestKind::AddPartitionsToTxn(req) => {
                (ApiKey::AddPartitionsToTxn, self.add_partitions_to_txn(req, version, session).await)
            }
            RequestKind::AddOffsetsToTxn(req) => (ApiKey::AddOffsetsToTxn, self.add_offsets_to_txn(req, version, session).await),
            RequestKind::EndTxn(req) => (ApiKey::EndTxn, self.end_txn(req, version, session).await),
            RequestKind::TxnOffsetCommit(mut req) => {
                (ApiKey::TxnOffsetCommit, self.txn_offset_commit(&mut req, version, session).await)
            }
            RequestKind::DescribeTransactions(req) => {
                (ApiKey::DescribeTransactions, self.describe_transactions(req, session).await)
            }
            RequestKind::ListTransactions(req) => (ApiKey::ListTransactions, self.list_transactions(req, session).await),
            RequestKind::SaslHandshake(req) => (ApiKey::SaslHandshake, self.sasl_handshake(req, version, session)),
            RequestKind::SaslAuthenticate(req) => (ApiKey::SaslAuthenticate, self.sasl_authenticate(req, version, session).await),
            RequestKind::ElectLeaders(req) => (ApiKey::ElectLeaders, self.elect_leaders(req, version).await),
            RequestKind::CreateAcls(req) => (ApiKey::CreateAcls, self.create_acls(req).await),
            RequestKind::DescribeAcls(req) => (ApiKey::DescribeAcls, self.describe_acls(req).await),
            RequestKind::DeleteAcls(req) => (ApiKey::DeleteAcls, self.delete_acls(req).await),
            RequestKind::DescribeUserScramCredentials(req) => {
                (ApiKey::DescribeUserScramCredentials, self.describe_user_scram_credentials(req).await)
            }
            RequestKind::AlterUserScramCredentials(req) => {
                (ApiKey::AlterUserScramCredentials, self.alter_user_scram_credentials(req).await)
            }
            RequestKind::DeleteRecords(req) => (ApiKey::DeleteRecords, self.delete_records(req, session)),
            RequestKind::DescribeProducers(req) => (ApiKey::DescribeProducers, self.describe_producers(req, session)),
            RequestKind::DescribeLogDirs(req) => (ApiKey::DescribeLogDirs, self.describe_log_dirs(req, version, session)),
            RequestKind::AlterReplicaLogDirs(req) => (ApiKey::AlterReplicaLogDirs, self.alter_replica_log_dirs(req, session)),
            RequestKind::DescribeTopicPartitions(req) => {
                (ApiKey::DescribeTopicPartitions, self.describe_topic_partitions(req, session))
            }
            RequestKind::ListConfigResources(req) => {
                (ApiKey::ListConfigResources, self.list_config_resources(req, version, session))
            }
            RequestKind::UpdateFeatures(req) => (ApiKey::UpdateFeatures, self.update_features(req, version, session)),
            RequestKind::WriteTxnMarkers(req) => (ApiKey::WriteTxnMarkers, self.write_txn_markers(req, session).await),
            RequestKind::CreatePartitions(req) => (ApiKey::CreatePartitions, self.create_partitions(req, session).await),
            RequestKind::AlterPartitionReassignments(req) => {
                (ApiKey::AlterPartitionReassignments, self.alter_partition_reassignments(req, version).await)
            }
            RequestKind::ListPartitionReassignments(req) => {
                (ApiKey::ListPartitionReassignments, self.list_partition_reassignments(req).await)
            }
            RequestKind::DescribeCluster(req) => (ApiKey::DescribeCluster, self.describe_cluster(req, session)),
            RequestKind::DescribeClientQuotas(req) => (ApiKey::DescribeClientQuotas, self.describe_client_quotas(req).await),
            RequestKind::AlterClientQuotas(req) => (ApiKey::AlterClientQuotas, self.alter_client_quotas(req).await),
            other => {
                // decode_request only decodes what SUPPORTED_APIS lists, and every entry is matched above.
                tracing::error!(request = ?other, "decoded a request without a handler");
                return Some(codec::error_response(correlation_id, error_code::UNSUPPORTED_VERSION).into());
            }
        };
        self.metrics.errors(key as i16, response_errors(&body));
        Some(codec::encode_response(correlation_id, key, version, &body).into())
    }
}

/// The ApiVersions answer: exactly the implemented APIs and versions.
fn api_versions(error: i16) -> ResponseKind {
    let api_keys = SUPPORTED_APIS
        .iter()
        .map(|&(key, min, max)| ApiVersion::default().with_api_key(key as i16).with_min_version(min).with_max_version(max))
        .collect();
    ResponseKind::ApiVersions(ApiVersionsResponse::default().with_error_code(error).with_api_keys(api_keys))
}

/// The Kafka error code for a storage failure: the one place log errors meet the wire.
pub(crate) fn log_error_code(error: &fjord_log::Error) -> i16 {
    use fjord_log::Error as E;
    match error {
        // Message format v0/v1 (magic 0 or 1) is well-formed, just not stored here.
        E::InvalidBatch { source: fjord_record::Error::UnsupportedMagic(_), .. } => error_code::UNSUPPORTED_FOR_MESSAGE_FORMAT,
        E::InvalidBatch { .. } => error_code::CORRUPT_MESSAGE,
        E::MessageTooLarge { .. } | E::DecompressedTooLarge { .. } => error_code::MESSAGE_TOO_LARGE,
        // A keyless record on a compacted topic: the cleaner could never deduplicate it.
        E::MissingKey { .. } => error_code::INVALID_RECORD,
        // A producer's clock (or a forged batch) too far from the leader's.
        E::TimestampOutOfRange { .. } => error_code::INVALID_TIMESTAMP,
        // Idempotent producers: a gap in the sequence, or a fenced (older) epoch.
        E::OutOfOrderSequence { .. } => error_code::OUT_OF_ORDER_SEQUENCE_NUMBER,
        E::InvalidProducerEpoch { .. } => error_code::INVALID_PRODUCER_EPOCH,
        // Transactions: a plain batch inside an open transaction, a fenced coordinator's marker.
        E::InvalidTxnState { .. } | E::TransactionNotVerified { .. } => error_code::INVALID_TXN_STATE,
        E::TransactionCoordinatorFenced { .. } => error_code::TRANSACTION_COORDINATOR_FENCED,
        E::OffsetOutOfRange { .. } => error_code::OFFSET_OUT_OF_RANGE,
        // Damaged data on disk: never served, never skipped (the log reports it once).
        E::CorruptSegment { .. } => error_code::CORRUPT_MESSAGE,
        E::Io { .. } | E::LogDirOffline { .. } => error_code::KAFKA_STORAGE_ERROR,
        // The log was closed under the request (its replica moved to another log dir, or
        // removed): retriable, the client refreshes its metadata and tries again.
        E::Closed { .. } => error_code::NOT_LEADER_OR_FOLLOWER,
        _ => error_code::UNKNOWN_SERVER_ERROR,
    }
}
