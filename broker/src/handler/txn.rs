//! The transaction coordinator's APIs: FindCoordinator for transactional ids,
//! InitProducerId with a transactional id, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn,
//! DescribeTransactions and ListTransactions. The state machine is `crate::txn::state`,
//! the storage and the markers `crate::txn`.
//!
//! Authorization (with the authorizer on), as Kafka: Write on the transactional id for
//! every request of a producer (TRANSACTIONAL_ID_AUTHORIZATION_FAILED), Write on each
//! topic added (TOPIC_AUTHORIZATION_FAILED), Read on the group added
//! (GROUP_AUTHORIZATION_FAILED), Describe on the id to find its coordinator or describe
//! it, and ListTransactions lists only the ids the client may Describe.

use fjord_auth::{Operation, Resource};
use fjord_record::now_ms;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::describe_transactions_response::{TopicData, TransactionState};
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::list_transactions_response::TransactionState as ListedTransaction;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use crate::connection::Session;
use crate::handler::Broker;
use crate::txn::state::{EndPlan, InitPlan, InitRequest, TxnMetadata, TxnState};

/// KIP-588: PRODUCER_FENCED exists from these versions on; older clients are told
/// INVALID_PRODUCER_EPOCH, which they also treat as fatal.
const FENCED_SINCE_INIT: i16 = 4;
const FENCED_SINCE: i16 = 2;
/// TxnOffsetCommit knows PRODUCER_FENCED from v3 on.
const TXN_OFFSET_FENCED_SINCE: i16 = 3;

fn fenced_for(error: ResponseError, version: i16, since: i16) -> ResponseError {
    if error == ResponseError::ProducerFenced && version < since {
        ResponseError::InvalidProducerEpoch
    } else {
        error
    }
}

/// The same code for every partition of `topics`.
fn answer_all(
    topics: &[add_partitions_to_txn_request::AddPartitionsToTxnTopic],
    code: i16,
) -> Vec<AddPartitionsToTxnTopicResult> {
    topics
        .iter()
        .map(|t| {
            AddPartitionsToTxnTopicResult::default().with_name(t.name.clone()).with_results_by_partition(
                t.partitions
                    .iter()
                    .map(|&p| {
                        AddPartitionsToTxnPartitionResult::default().with_partition_index(p).with_partition_error_code(code)
                    })
                    .collect(),
            )
        })
        .collect()
}

fn text(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_owned())
}

impl Broker {
    fn may_transact(&self, session: &Session, operation: Operation, transactional_id: &str) -> bool {
        self.authorize(session, operation, Resource::transactional_id(transactional_id))
    }

    /// FindCoordinator with key type 1: the leader of the id's `__transaction_state`
    /// partition, the topic created first if need be.
    pub(crate) async fn find_txn_coordinator(
        &self,
        request: FindCoordinatorRequest,
        version: i16,
        session: &Session,
    ) -> ResponseKind {
        let keys = if version >= 4 { request.coordinator_keys } else { vec![request.key] };
        let mut coordinators = Vec::with_capacity(keys.len());
        for key in keys {
            let answer = if key.is_empty() {
                Err(ResponseError::InvalidRequest)
            } else if !self.may_transact(session, Operation::Describe, &key) {
                Err(ResponseError::TransactionalIdAuthorizationFailed)
            } else {
                match self.ensure_txn_topic().await {
                    Ok(()) => self.locate_txn_coordinator(&key, &session.listener.name),
                    Err(e) => Err(e),
                }
            };
            let coordinator = match answer {
                Ok((id, host, port)) => Coordinator::default()
                    .with_key(key)
                    .with_node_id(BrokerId(id))
                    .with_host(text(&host))
                    .with_port(i32::from(port)),
                Err(e) => Coordinator::default()
                    .with_key(key)
                    .with_error_code(e.code())
                    .with_error_message(Some(text(&e.to_string())))
                    .with_node_id(BrokerId(-1))
                    .with_port(-1),
            };
            coordinators.push(coordinator);
        }
        ResponseKind::FindCoordinator(crate::group::coordinators_response(version, coordinators))
    }

    /// InitProducerId with a transactional id: a new id at epoch 0, or the id's producer
    /// with a bumped epoch (fencing older producers). An open transaction of the id is
    /// aborted first: the answer is CONCURRENT_TRANSACTIONS until the abort is complete.
    pub(crate) async fn init_txn_producer_id(&self, request: InitProducerIdRequest, version: i16, id: &str) -> ResponseKind {
        let respond = |result: Result<(i64, i16), ResponseError>| {
            let response = InitProducerIdResponse::default();
            ResponseKind::InitProducerId(match result {
                Ok((producer_id, epoch)) => response.with_producer_id(ProducerId(producer_id)).with_producer_epoch(epoch),
                Err(e) => response
                    .with_error_code(fenced_for(e, version, FENCED_SINCE_INIT).code())
                    .with_producer_id(ProducerId(-1))
                    .with_producer_epoch(-1),
            })
        };
        if id.is_empty() {
            return respond(Err(ResponseError::InvalidRequest));
        }
        let timeout_ms = request.transaction_timeout_ms;
        if timeout_ms <= 0 || timeout_ms > self.txns.config.max_timeout_ms {
            return respond(Err(ResponseError::InvalidTransactionTimeout));
        }
        let (loaded, slot) = match self.txn_slot(id).await {
            Ok(found) => found,
            Err(e) => return respond(Err(e)),
        };
        let expected = (version >= 3 && request.producer_id.0 >= 0).then_some((request.producer_id.0, request.producer_epoch));
        let mut current = slot.lock().await;
        if current.is_none() {
            // A new id: under the coordinator's limit on ids.
            if let Err(e) = self.make_room_for_txn_id(&loaded, id).await {
                return respond(Err(e));
            }
        }
        let now = now_ms();
        let plan = match current.as_ref() {
            None => Ok(InitPlan::NewProducerId),
            Some(metadata) => metadata.plan_init(InitRequest { timeout_ms, expected }, now),
        };
        let target = match plan {
            Err(e) => return respond(Err(e)),
            Ok(InitPlan::Retry) => {
                let m = current.as_ref().expect("invariant: a retry has a state");
                return respond(Ok((m.producer_id, m.producer_epoch)));
            }
            Ok(InitPlan::Bump(target)) => target,
            Ok(InitPlan::NewProducerId) => match self.producer_ids.next_id().await {
                Ok(producer_id) => TxnMetadata::with_new_producer_id(id, producer_id, timeout_ms, now, current.as_ref()),
                Err(e) => {
                    tracing::warn!(error = %e, "could not allocate a producer id");
                    return respond(Err(ResponseError::CoordinatorNotAvailable));
                }
            },
            Ok(InitPlan::FenceAndAbort(target)) => {
                if let Err(e) = self.write_txn_state(&loaded, id, Some(&target)).await {
                    return respond(Err(e));
                }
                tracing::info!(
                    transactional_id = id,
                    epoch = target.producer_epoch,
                    "fencing the producer of an open transaction"
                );
                *current = Some(target);
                self.txns.complete_later(loaded.partition, id);
                return respond(Err(ResponseError::ConcurrentTransactions));
            }
        };
        if let Err(e) = self.write_txn_state(&loaded, id, Some(&target)).await {
            return respond(Err(e));
        }
        let answer = (target.producer_id, target.producer_epoch);
        *current = Some(target);
        respond(Ok(answer))
    }

    /// AddPartitionsToTxn. v0-v3 (a producer's): every named partition joins the
    /// transaction, or none does. v4+ (KIP-890, the brokers' own: ClusterAction on the
    /// cluster, else CLUSTER_AUTHORIZATION_FAILED for the whole request): a batch of
    /// transactions, each added the same way, or with `verify_only` checked without
    /// adding anything: NONE for a partition the open transaction holds, else
    /// TRANSACTION_ABORTABLE (v5) or INVALID_TXN_STATE (v4, which predates that code).
    pub(crate) async fn add_partitions_to_txn(
        &self,
        request: AddPartitionsToTxnRequest,
        version: i16,
        session: &Session,
    ) -> ResponseKind {
        if version <= 3 {
            let id = request.v3_and_below_transactional_id.to_string();
            let producer = (request.v3_and_below_producer_id.0, request.v3_and_below_producer_epoch);
            let results = self.add_partitions_of(&id, producer, &request.v3_and_below_topics, false, version, session).await;
            return ResponseKind::AddPartitionsToTxn(
                AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(results),
            );
        }
        if !self.authorize(session, Operation::ClusterAction, Resource::cluster()) {
            return ResponseKind::AddPartitionsToTxn(
                AddPartitionsToTxnResponse::default().with_error_code(ResponseError::ClusterAuthorizationFailed.code()),
            );
        }
        let mut seen = std::collections::HashSet::new();
        let mut results = Vec::with_capacity(request.transactions.len());
        for txn in &request.transactions {
            let id = txn.transactional_id.to_string();
            let topic_results = if seen.insert(id.clone()) {
                let producer = (txn.producer_id.0, txn.producer_epoch);
                self.add_partitions_of(&id, producer, &txn.topics, txn.verify_only, version, session).await
            } else {
                // Kafka: one id twice in a batch is a malformed request; the first counts.
                answer_all(&txn.topics, ResponseError::InvalidRequest.code())
            };
            results.push(
                add_partitions_to_txn_response::AddPartitionsToTxnResult::default()
                    .with_transactional_id(txn.transactional_id.clone())
                    .with_topic_results(topic_results),
            );
        }
        ResponseKind::AddPartitionsToTxn(AddPartitionsToTxnResponse::default().with_results_by_transaction(results))
    }

    /// One transaction's partitions added (or with `verify_only` checked), each with its
    /// code: a partition refused (authorization, unknown) makes the others
    /// OPERATION_NOT_ATTEMPTED, as Kafka.
    async fn add_partitions_of(
        &self,
        id: &str,
        (producer_id, epoch): (i64, i16),
        topics: &[add_partitions_to_txn_request::AddPartitionsToTxnTopic],
        verify_only: bool,
        version: i16,
        session: &Session,
    ) -> Vec<AddPartitionsToTxnTopicResult> {
        // Per partition: its own error, or None when it may be added.
        let mut refusals: Vec<Vec<Option<ResponseError>>> = Vec::with_capacity(topics.len());
        let transact = self.may_transact(session, Operation::Write, id);
        for topic in topics {
            // Verifying a group's offsets names its partition of Kafka's offsets topic.
            let offsets = verify_only && topic.name.as_str() == crate::txn::GROUP_MARKER_TOPIC;
            let refusal = if !transact {
                Some(ResponseError::TransactionalIdAuthorizationFailed)
            } else if !offsets && !self.authorize(session, Operation::Write, Resource::topic(&topic.name)) {
                Some(ResponseError::TopicAuthorizationFailed)
            } else {
                None
            };
            let known = self.topics.get(&topic.name);
            refusals.push(
                topic
                    .partitions
                    .iter()
                    .map(|&p| match (refusal, &known) {
                        (Some(e), _) => Some(e),
                        (None, _) if offsets && (0..crate::txn::verify::OFFSETS_PARTITIONS).contains(&p) => None,
                        (None, Some(t)) if !offsets && t.partition_replicas(p).is_some() => None,
                        (None, _) => Some(ResponseError::UnknownTopicOrPartition),
                    })
                    .collect(),
            );
        }
        let partitions: Vec<(String, i32)> =
            topics.iter().flat_map(|t| t.partitions.iter().map(|&p| (t.name.to_string(), p))).collect();
        // Per partition in order: the outcome of the request, when it was attempted.
        let outcome: Option<Vec<Result<(), ResponseError>>> = if refusals.iter().flatten().any(Option::is_some) {
            // Kafka: the partitions that could have been added are not attempted.
            None
        } else if verify_only {
            Some(self.verify_in_txn(id, producer_id, epoch, &partitions, version).await)
        } else {
            let added = self.txn_change(id, |m, now| m.add_partitions(producer_id, epoch, &partitions, now)).await;
            Some(vec![added; partitions.len()])
        };
        let mut outcome = outcome.map(Vec::into_iter);
        topics
            .iter()
            .zip(refusals)
            .map(|(topic, refusals)| {
                AddPartitionsToTxnTopicResult::default().with_name(topic.name.clone()).with_results_by_partition(
                    topic
                        .partitions
                        .iter()
                        .zip(refusals)
                        .map(|(&p, refusal)| {
                            let attempted = outcome.as_mut().and_then(Iterator::next);
                            let code = match (attempted, refusal) {
                                (_, Some(e)) => e.code(),
                                (None, None) => ResponseError::OperationNotAttempted.code(),
                                (Some(Ok(())), None) => 0,
                                (Some(Err(e)), None) => fenced_for(e, version, FENCED_SINCE).code(),
                            };
                            AddPartitionsToTxnPartitionResult::default().with_partition_index(p).with_partition_error_code(code)
                        })
                        .collect(),
                )
            })
            .collect()
    }

    /// verify_only: the id's open transaction holds each partition (NONE), or not.
    async fn verify_in_txn(
        &self,
        id: &str,
        producer_id: i64,
        epoch: i16,
        partitions: &[(String, i32)],
        version: i16,
    ) -> Vec<Result<(), ResponseError>> {
        use crate::txn::state::Held;
        let loaded = match self.txn_loaded_for(id).await {
            Ok(loaded) => loaded,
            Err(e) => return vec![Err(e); partitions.len()],
        };
        let held: Vec<Held<'_>> = partitions
            .iter()
            .map(|(topic, p)| match topic.as_str() {
                crate::txn::GROUP_MARKER_TOPIC => Held::OffsetsPartition(*p, crate::txn::verify::OFFSETS_PARTITIONS),
                topic => Held::Partition(topic, *p),
            })
            .collect();
        // v5 names a partition the transaction does not hold TRANSACTION_ABORTABLE.
        let answers = crate::txn::verify::holds(&loaded, id, producer_id, epoch, &held).await;
        answers
            .into_iter()
            .map(|answer| match answer {
                Err(ResponseError::InvalidTxnState) if version >= 5 => Err(ResponseError::TransactionAbortable),
                answer => answer,
            })
            .collect()
    }

    /// AddOffsetsToTxn: the group's offsets commit with the transaction (TxnOffsetCommit
    /// to the group coordinator follows).
    pub(crate) async fn add_offsets_to_txn(
        &self,
        request: AddOffsetsToTxnRequest,
        version: i16,
        session: &Session,
    ) -> ResponseKind {
        let id = request.transactional_id.as_str();
        let code = if !self.may_transact(session, Operation::Write, id) {
            ResponseError::TransactionalIdAuthorizationFailed.code()
        } else if !self.authorize(session, Operation::Read, Resource::group(request.group_id.as_str())) {
            ResponseError::GroupAuthorizationFailed.code()
        } else if request.group_id.is_empty() {
            ResponseError::InvalidGroupId.code()
        } else {
            let group = request.group_id.as_str();
            match self.txn_change(id, |m, now| m.add_group(request.producer_id.0, request.producer_epoch, group, now)).await {
                Ok(()) => 0,
                Err(e) => fenced_for(e, version, FENCED_SINCE).code(),
            }
        };
        ResponseKind::AddOffsetsToTxn(AddOffsetsToTxnResponse::default().with_error_code(code))
    }

    /// EndTxn: the commit or abort is prepared (written), then its markers and complete
    /// state are written in the background; answered once they are (or after
    /// [`crate::txn::COMPLETION_WAIT`]: the producer's next request on the id then waits
    /// for them, CONCURRENT_TRANSACTIONS).
    pub(crate) async fn end_txn(&self, request: EndTxnRequest, version: i16, session: &Session) -> ResponseKind {
        let id = request.transactional_id.as_str();
        let respond = |code: i16| ResponseKind::EndTxn(EndTxnResponse::default().with_error_code(code));
        if !self.may_transact(session, Operation::Write, id) {
            return respond(ResponseError::TransactionalIdAuthorizationFailed.code());
        }
        let (loaded, slot) = match self.txn_slot(id).await {
            Ok(found) => found,
            Err(e) => return respond(e.code()),
        };
        let mut current = slot.lock().await;
        let Some(metadata) = current.as_ref() else {
            return respond(ResponseError::InvalidProducerIdMapping.code());
        };
        let plan = metadata.plan_end(request.producer_id.0, request.producer_epoch, request.committed, now_ms());
        match plan {
            Err(e) => respond(fenced_for(e, version, FENCED_SINCE).code()),
            Ok(EndPlan::AlreadyDone) => respond(0),
            Ok(EndPlan::Prepare(target)) => {
                if let Err(e) = self.write_txn_state(&loaded, id, Some(&target)).await {
                    return respond(e.code());
                }
                *current = Some(target);
                let looked = self.txns.complete_later(loaded.partition, id);
                drop(current);
                crate::txn::completed(&slot, &looked).await;
                respond(0)
            }
        }
    }

    /// Applies `change` to the id's state and writes the result (`None`: nothing to write).
    pub(crate) async fn txn_change(
        &self,
        id: &str,
        change: impl FnOnce(&TxnMetadata, i64) -> Result<Option<TxnMetadata>, ResponseError>,
    ) -> Result<(), ResponseError> {
        let (loaded, slot) = self.txn_slot(id).await?;
        let mut current = slot.lock().await;
        let metadata = current.as_ref().ok_or(ResponseError::InvalidProducerIdMapping)?;
        let Some(target) = change(metadata, now_ms())? else { return Ok(()) };
        self.write_txn_state(&loaded, id, Some(&target)).await?;
        *current = Some(target);
        Ok(())
    }

    /// TxnOffsetCommit (to the group's coordinator): Write on the transactional id, Read on
    /// the group and on each topic; the transaction must hold the group
    /// (`crate::txn::verify`); the group coordinator keeps the offsets pending.
    pub(crate) async fn txn_offset_commit(
        &self,
        request: &mut TxnOffsetCommitRequest,
        version: i16,
        session: &Session,
    ) -> ResponseKind {
        use kafka_protocol::messages::txn_offset_commit_response::{
            TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
        };
        let answer = |topic: &txn_offset_commit_request::TxnOffsetCommitRequestTopic, code: i16| {
            TxnOffsetCommitResponseTopic::default().with_name(topic.name.clone()).with_partitions(
                topic
                    .partitions
                    .iter()
                    .map(|p| {
                        TxnOffsetCommitResponsePartition::default().with_partition_index(p.partition_index).with_error_code(code)
                    })
                    .collect(),
            )
        };
        let whole = if !self.may_transact(session, Operation::Write, &request.transactional_id) {
            Some(ResponseError::TransactionalIdAuthorizationFailed)
        } else if !self.authorize(session, Operation::Read, Resource::group(request.group_id.as_str())) {
            Some(ResponseError::GroupAuthorizationFailed)
        } else {
            None
        };
        if let Some(e) = whole {
            let topics = request.topics.iter().map(|t| answer(t, e.code())).collect();
            return ResponseKind::TxnOffsetCommit(TxnOffsetCommitResponse::default().with_topics(topics));
        }
        // KIP-890: only offsets of a transaction that added the group (AddOffsetsToTxn);
        // anything else leaves the group untouched.
        let (id, producer) = (request.transactional_id.as_str(), (request.producer_id.0, request.producer_epoch));
        if let Err(e) = self.verify_txn_group(id, producer.0, producer.1, request.group_id.as_str()).await {
            let code = fenced_for(e, version, TXN_OFFSET_FENCED_SINCE).code();
            let topics = request.topics.iter().map(|t| answer(t, code)).collect();
            return ResponseKind::TxnOffsetCommit(TxnOffsetCommitResponse::default().with_topics(topics));
        }
        let (allowed, denied): (Vec<_>, Vec<_>) = std::mem::take(&mut request.topics)
            .into_iter()
            .partition(|t| self.authorize(session, Operation::Read, Resource::topic(&t.name)));
        request.topics = allowed;
        let known = |topic: &str, p: i32| self.topics.get(topic).is_some_and(|t| t.partition_replicas(p).is_some());
        let mut body = self.groups.txn_offset_commit(request.clone(), version, known).await;
        if let ResponseKind::TxnOffsetCommit(response) = &mut body {
            response.topics.extend(denied.iter().map(|t| answer(t, ResponseError::TopicAuthorizationFailed.code())));
        }
        body
    }

    /// DescribeTransactions: each id's state as this coordinator holds it.
    pub(crate) async fn describe_transactions(&self, request: DescribeTransactionsRequest, session: &Session) -> ResponseKind {
        let mut states = Vec::with_capacity(request.transactional_ids.len());
        for id in request.transactional_ids {
            let answer = TransactionState::default().with_transactional_id(id.clone()).with_transaction_start_time_ms(-1);
            let answer = if !self.may_transact(session, Operation::Describe, &id) {
                answer.with_error_code(ResponseError::TransactionalIdAuthorizationFailed.code())
            } else {
                match self.txn_slot(&id).await {
                    Err(e) => answer.with_error_code(e.code()),
                    Ok((_, slot)) => match slot.lock().await.clone() {
                        None => answer.with_error_code(ResponseError::TransactionalIdNotFound.code()),
                        Some(m) => {
                            let mut topics: std::collections::BTreeMap<String, Vec<i32>> = Default::default();
                            for (topic, p) in &m.partitions {
                                topics.entry(topic.clone()).or_default().push(*p);
                            }
                            answer
                                .with_transaction_state(text(m.state.name()))
                                .with_transaction_timeout_ms(m.timeout_ms)
                                .with_transaction_start_time_ms(m.start_ms)
                                .with_producer_id(ProducerId(m.producer_id))
                                .with_producer_epoch(m.producer_epoch)
                                .with_topics(
                                    topics
                                        .into_iter()
                                        .map(|(t, ps)| TopicData::default().with_topic(TopicName(text(&t))).with_partitions(ps))
                                        .collect(),
                                )
                        }
                    },
                }
            };
            states.push(answer);
        }
        ResponseKind::DescribeTransactions(DescribeTransactionsResponse::default().with_transaction_states(states))
    }

    /// ListTransactions: the ids this broker coordinates, filtered by state, producer id
    /// and (v1) how long their transaction has been open.
    pub(crate) async fn list_transactions(&self, request: ListTransactionsRequest, session: &Session) -> ResponseKind {
        const STATES: [TxnState; 8] = [
            TxnState::Empty,
            TxnState::Ongoing,
            TxnState::PrepareCommit,
            TxnState::PrepareAbort,
            TxnState::CompleteCommit,
            TxnState::CompleteAbort,
            TxnState::Dead,
            TxnState::PrepareEpochFence,
        ];
        let unknown: Vec<StrBytes> =
            request.state_filters.iter().filter(|f| !STATES.iter().any(|s| s.name() == f.as_str())).cloned().collect();
        // Every partition of the state topic this broker leads is loaded first: listing
        // only those loaded so far answered an empty list right after a restart. One that
        // cannot load is COORDINATOR_LOAD_IN_PROGRESS, as Kafka answers while loading.
        if self.topics.get(crate::txn::TOPIC).is_some() {
            for partition in 0..self.txn_partitions() {
                match self.txn_loaded(partition).await {
                    Ok(_) | Err(ResponseError::NotCoordinator) => {}
                    Err(e) => {
                        return ResponseKind::ListTransactions(ListTransactionsResponse::default().with_error_code(e.code()))
                    }
                }
            }
        }
        let now = now_ms();
        let mut listed = Vec::new();
        for loaded in self.txns.loaded() {
            for (id, slot) in loaded.slots() {
                let Some(m) = slot.lock().await.clone() else { continue };
                let state_ok =
                    request.state_filters.is_empty() || request.state_filters.iter().any(|f| f.as_str() == m.state.name());
                let producer_ok =
                    request.producer_id_filters.is_empty() || request.producer_id_filters.iter().any(|p| p.0 == m.producer_id);
                let duration_ok =
                    request.duration_filter < 0 || (m.start_ms >= 0 && now.saturating_sub(m.start_ms) >= request.duration_filter);
                if state_ok && producer_ok && duration_ok && self.may_transact(session, Operation::Describe, &id) {
                    listed.push(
                        ListedTransaction::default()
                            .with_transactional_id(TransactionalId(text(&id)))
                            .with_producer_id(ProducerId(m.producer_id))
                            .with_transaction_state(text(m.state.name())),
                    );
                }
            }
        }
        listed.sort_by(|a, b| a.transactional_id.cmp(&b.transactional_id));
        ResponseKind::ListTransactions(
            ListTransactionsResponse::default().with_unknown_state_filters(unknown).with_transaction_states(listed),
        )
    }
}
