//! Transactions, the client's half: finding a transactional id's coordinator, the
//! requests a transactional producer sends it (InitProducerId, AddPartitionsToTxn,
//! AddOffsetsToTxn, EndTxn) and the TxnOffsetCommit it sends the group's coordinator,
//! each retried while the broker says to retry (CONCURRENT_TRANSACTIONS while the previous
//! transaction's markers are written, NOT_COORDINATOR after a leader change); and
//! [`TransactionAdmin`] for `fjord transactions list|describe`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::txn_offset_commit_request::{TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use crate::cluster::Cluster;
use crate::connection::Connection;
use crate::error::{Error, ResponseError, Result};
use crate::TopicPartition;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_owned())
}

/// Pause before the second attempt of a request the broker asked to retry; each later
/// pause doubles, up to [`MAX_RETRY_PAUSE`]. The common case, CONCURRENT_TRANSACTIONS as
/// the next transaction starts, lasts until the previous one's markers are written: well
/// under a millisecond on a healthy cluster, where a fixed 20 ms pause cost a 100-record
/// transaction of fjord-client 20 times its usual time.
const FIRST_RETRY_PAUSE: Duration = Duration::from_millis(1);
const MAX_RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Whether a transaction request is worth sending again: the coordinator moved or is
/// loading, or the previous transaction is still being completed.
fn retry_transaction(e: &Error) -> bool {
    match e {
        Error::Kafka { code, .. } => {
            matches!(
                code,
                ResponseError::ConcurrentTransactions
                    | ResponseError::NotCoordinator
                    | ResponseError::CoordinatorNotAvailable
                    | ResponseError::CoordinatorLoadInProgress
            ) || code.is_retriable()
        }
        other => other.is_retriable(),
    }
}

/// The coordinator of a transactional id (FindCoordinator key type 1, which creates the
/// broker's transaction state topic on first use) or of a group (key type 0): the one
/// found before, while requests to it succeed, or a new FindCoordinator.
pub(crate) async fn find_coordinator(cluster: &Cluster, key: &str, key_type: i8) -> Result<Arc<Connection>> {
    if let Some(broker) = cluster.known_coordinator(key_type, key) {
        return cluster.broker(broker).await;
    }
    let request = FindCoordinatorRequest::default().with_key(s(key)).with_key_type(key_type);
    let response = cluster.any_broker().await?.request(&request, 3).await?;
    if let Some(e) =
        Error::kafka(response.error_code, format!("find coordinator of {key}"), response.error_message.map(|m| m.to_string()))
    {
        return Err(e);
    }
    cluster.remember_coordinator(key_type, key, response.node_id.0);
    cluster.broker(response.node_id.0).await
}

/// A transactional producer's identity at its coordinator.
#[derive(Debug, Clone)]
pub(crate) struct TransactionalId {
    pub(crate) id: String,
    pub(crate) timeout: Duration,
}

/// Sends `request` built by `call` to the coordinator of `key` until it succeeds, fails
/// for good, or `deadline` passes.
async fn with_coordinator<T, F, Fut>(cluster: &Cluster, key: &str, key_type: i8, deadline: Instant, call: F) -> Result<T>
where
    F: Fn(Arc<Connection>) -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut pause = FIRST_RETRY_PAUSE;
    loop {
        let attempt = async { call(find_coordinator(cluster, key, key_type).await?).await };
        let e = match attempt.await {
            Ok(answer) => return Ok(answer),
            Err(e) => e,
        };
        // Only CONCURRENT_TRANSACTIONS says for sure that the broker asked still
        // coordinates the key; after anything else, ask FindCoordinator again.
        if !matches!(e, Error::Kafka { code: ResponseError::ConcurrentTransactions, .. }) {
            cluster.forget_coordinator(key_type, key);
        }
        if !retry_transaction(&e) || Instant::now() >= deadline {
            return Err(e);
        }
        tracing::debug!(%e, key, "transaction request to retry");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_RETRY_PAUSE);
    }
}

impl TransactionalId {
    /// InitProducerId: the id's producer id and a new epoch (which fences older producers
    /// of the id and aborts a transaction they left open).
    pub(crate) async fn init_producer_id(&self, cluster: &Cluster, deadline: Instant) -> Result<(i64, i16)> {
        let request = InitProducerIdRequest::default()
            .with_transactional_id(Some(kafka_protocol::messages::TransactionalId(s(&self.id))))
            .with_transaction_timeout_ms(i32::try_from(self.timeout.as_millis()).unwrap_or(i32::MAX))
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1);
        with_coordinator(cluster, &self.id, 1, deadline, |conn| {
            let request = request.clone();
            async move {
                let response = conn.request(&request, 4).await?;
                match Error::kafka(response.error_code, format!("InitProducerId of {}", self.id), None) {
                    None => Ok((response.producer_id.0, response.producer_epoch)),
                    Some(e) => Err(e),
                }
            }
        })
        .await
    }

    /// AddPartitionsToTxn: the partitions join the open transaction (before the producer
    /// writes to them).
    pub(crate) async fn add_partitions(
        &self,
        cluster: &Cluster,
        producer: (i64, i16),
        partitions: &[TopicPartition],
        deadline: Instant,
    ) -> Result<()> {
        let mut topics: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
        for tp in partitions {
            topics.entry(&tp.topic).or_default().push(tp.partition);
        }
        let request = AddPartitionsToTxnRequest::default()
            .with_v3_and_below_transactional_id(kafka_protocol::messages::TransactionalId(s(&self.id)))
            .with_v3_and_below_producer_id(ProducerId(producer.0))
            .with_v3_and_below_producer_epoch(producer.1)
            .with_v3_and_below_topics(
                topics
                    .into_iter()
                    .map(|(t, ps)| AddPartitionsToTxnTopic::default().with_name(TopicName(s(t))).with_partitions(ps))
                    .collect(),
            );
        with_coordinator(cluster, &self.id, 1, deadline, |conn| {
            let request = request.clone();
            async move {
                let response = conn.request(&request, 3).await?;
                let worst = response
                    .results_by_topic_v3_and_below
                    .iter()
                    .flat_map(|t| t.results_by_partition.iter())
                    .map(|p| p.partition_error_code)
                    .find(|&c| c != 0 && c != ResponseError::OperationNotAttempted.code())
                    .unwrap_or(0);
                match Error::kafka(worst, format!("AddPartitionsToTxn of {}", self.id), None) {
                    None => Ok(()),
                    Some(e) => Err(e),
                }
            }
        })
        .await
    }

    /// AddOffsetsToTxn then TxnOffsetCommit to the group's coordinator: the consumer
    /// offsets commit with the transaction.
    pub(crate) async fn send_offsets(
        &self,
        cluster: &Cluster,
        producer: (i64, i16),
        group_id: &str,
        offsets: &[(TopicPartition, i64)],
        deadline: Instant,
    ) -> Result<()> {
        let add = AddOffsetsToTxnRequest::default()
            .with_transactional_id(kafka_protocol::messages::TransactionalId(s(&self.id)))
            .with_producer_id(ProducerId(producer.0))
            .with_producer_epoch(producer.1)
            .with_group_id(GroupId(s(group_id)));
        with_coordinator(cluster, &self.id, 1, deadline, |conn| {
            let add = add.clone();
            async move {
                let response = conn.request(&add, 3).await?;
                Error::kafka(response.error_code, format!("AddOffsetsToTxn of {}", self.id), None).map_or(Ok(()), Err)
            }
        })
        .await?;
        let mut topics: BTreeMap<&str, Vec<TxnOffsetCommitRequestPartition>> = BTreeMap::new();
        for (tp, offset) in offsets {
            topics.entry(&tp.topic).or_default().push(
                TxnOffsetCommitRequestPartition::default()
                    .with_partition_index(tp.partition)
                    .with_committed_offset(*offset)
                    .with_committed_leader_epoch(-1),
            );
        }
        let commit = TxnOffsetCommitRequest::default()
            .with_transactional_id(kafka_protocol::messages::TransactionalId(s(&self.id)))
            .with_group_id(GroupId(s(group_id)))
            .with_producer_id(ProducerId(producer.0))
            .with_producer_epoch(producer.1)
            .with_generation_id(-1)
            .with_topics(
                topics
                    .into_iter()
                    .map(|(t, ps)| TxnOffsetCommitRequestTopic::default().with_name(TopicName(s(t))).with_partitions(ps))
                    .collect(),
            );
        with_coordinator(cluster, group_id, 0, deadline, |conn| {
            let commit = commit.clone();
            async move {
                let response = conn.request(&commit, 3).await?;
                let worst =
                    response.topics.iter().flat_map(|t| t.partitions.iter()).map(|p| p.error_code).find(|&c| c != 0).unwrap_or(0);
                Error::kafka(worst, format!("TxnOffsetCommit of {}", self.id), None).map_or(Ok(()), Err)
            }
        })
        .await
    }

    /// EndTxn: commit (`true`) or abort the open transaction.
    pub(crate) async fn end(&self, cluster: &Cluster, producer: (i64, i16), commit: bool, deadline: Instant) -> Result<()> {
        let request = EndTxnRequest::default()
            .with_transactional_id(kafka_protocol::messages::TransactionalId(s(&self.id)))
            .with_producer_id(ProducerId(producer.0))
            .with_producer_epoch(producer.1)
            .with_committed(commit);
        with_coordinator(cluster, &self.id, 1, deadline, |conn| {
            let request = request.clone();
            async move {
                let response = conn.request(&request, 3).await?;
                Error::kafka(response.error_code, format!("EndTxn of {}", self.id), None).map_or(Ok(()), Err)
            }
        })
        .await
    }
}

/// One transactional id as ListTransactions reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionListing {
    /// The transactional id.
    pub transactional_id: String,
    /// Its producer id.
    pub producer_id: i64,
    /// Kafka's state name (Empty, Ongoing, PrepareCommit, CompleteCommit, ...).
    pub state: String,
    /// The broker coordinating it.
    pub coordinator: i32,
}

/// One transactional id as DescribeTransactions reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionDescription {
    /// The transactional id.
    pub transactional_id: String,
    /// Kafka's state name.
    pub state: String,
    /// Its producer id and epoch.
    pub producer_id: i64,
    /// The producer's current epoch.
    pub producer_epoch: i16,
    /// The transaction timeout the producer asked for.
    pub timeout_ms: i32,
    /// When the open transaction began (ms since the epoch), -1 when none is open.
    pub start_time_ms: i64,
    /// The partitions in the open transaction.
    pub partitions: Vec<TopicPartition>,
}

/// Lists and describes transactional ids (`fjord transactions`).
pub struct TransactionAdmin {
    cluster: Arc<Cluster>,
}

impl TransactionAdmin {
    /// Connects to the cluster.
    pub async fn connect(config: crate::ClientConfig) -> Result<Self> {
        Ok(Self { cluster: Cluster::connect(crate::ClientConfig { allow_auto_create_topics: false, ..config }).await? })
    }

    /// Every transactional id of every broker, sorted by id.
    pub async fn list_transactions(&self) -> Result<Vec<TransactionListing>> {
        let md = self.cluster.refresh(None).await?;
        let mut out = Vec::new();
        for &broker in md.brokers.keys() {
            let response = self.cluster.broker(broker).await?.request(&ListTransactionsRequest::default(), 0).await?;
            if let Some(e) = Error::kafka(response.error_code, "list transactions", None) {
                return Err(e);
            }
            out.extend(response.transaction_states.into_iter().map(|t| TransactionListing {
                transactional_id: t.transactional_id.to_string(),
                producer_id: t.producer_id.0,
                state: t.transaction_state.to_string(),
                coordinator: broker,
            }));
        }
        out.sort_by(|a, b| a.transactional_id.cmp(&b.transactional_id));
        Ok(out)
    }

    /// The state of `transactional_id` at its coordinator.
    pub async fn describe_transaction(&self, transactional_id: &str) -> Result<TransactionDescription> {
        let deadline = Instant::now() + self.cluster.config().request_timeout;
        let request = DescribeTransactionsRequest::default()
            .with_transactional_ids(vec![kafka_protocol::messages::TransactionalId(s(transactional_id))]);
        let t = with_coordinator(&self.cluster, transactional_id, 1, deadline, |conn| {
            let request = request.clone();
            async move {
                let response = conn.request(&request, 0).await?;
                let t = response.transaction_states.into_iter().next().ok_or_else(|| Error::Protocol {
                    broker: conn.addr().to_string(),
                    detail: "DescribeTransactions answered no transaction".into(),
                })?;
                match Error::kafka(t.error_code, format!("describe transaction {transactional_id}"), None) {
                    None => Ok(t),
                    Some(e) => Err(e),
                }
            }
        })
        .await?;
        Ok(TransactionDescription {
            transactional_id: transactional_id.to_owned(),
            state: t.transaction_state.to_string(),
            producer_id: t.producer_id.0,
            producer_epoch: t.producer_epoch,
            timeout_ms: t.transaction_timeout_ms,
            start_time_ms: t.transaction_start_time_ms,
            partitions: t
                .topics
                .iter()
                .flat_map(|topic| topic.partitions.iter().map(|&p| TopicPartition::new(topic.topic.to_string(), p)))
                .collect(),
        })
    }
}
