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
    /// of the id and aborts a transaction they left open). `current` is the id and epoch
    /// the caller has, if any: the coordinator bumps only that epoch, and answers
    /// PRODUCER_FENCED when a newer producer has the id (KIP-360).
    pub(crate) async fn init_producer_id(
        &self,
        cluster: &Cluster,
        deadline: Instant,
        current: Option<(i64, i16)>,
    ) -> Result<(i64, i16)> {
        let (producer_id, producer_epoch) = current.unwrap_or((-1, -1));
        let request = InitProducerIdRequest::default()
            .with_transactional_id(Some(kafka_protocol::messages::TransactionalId(s(&self.id))))
            .with_transaction_timeout_ms(i32::try_from(self.timeout.as_millis()).unwrap_or(i32::MAX))
            .with_producer_id(ProducerId(producer_id))
            .with_producer_epoch(producer_epoch);
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

/// One producer of a partition as its leader reports it (DescribeProducers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerDescription {
    /// The producer id.
    pub producer_id: i64,
    /// Its epoch in this partition.
    pub producer_epoch: i32,
    /// The last sequence it appended.
    pub last_sequence: i32,
    /// Its last batch's timestamp (ms since the epoch).
    pub last_timestamp: i64,
    /// The epoch of the coordinator that last wrote a marker for it here (-1: none).
    pub coordinator_epoch: i32,
    /// Where its open transaction starts here, -1 when none is open.
    pub current_txn_start_offset: i64,
}

/// A transaction open in a partition that no coordinator holds the partition in: no
/// marker will ever end it, and read_committed consumers of the partition wait at it.
/// Brokers refuse to open one since they verify with the coordinator (KIP-890), but
/// one opened before stays until it is aborted ([`TransactionAdmin::abort_transaction`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HangingTransaction {
    /// The partition.
    pub partition: TopicPartition,
    /// Its producer there.
    pub producer: ProducerDescription,
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

    /// The producers of `partition` as its leader knows them.
    pub async fn describe_producers(&self, partition: &TopicPartition) -> Result<Vec<ProducerDescription>> {
        let mut described = self.describe_producers_of(std::slice::from_ref(partition)).await?;
        Ok(described.pop().map(|(_, producers)| producers).unwrap_or_default())
    }

    /// The producers of each of `partitions`, in their order, asked of their leaders in
    /// one DescribeProducers a leader.
    pub async fn describe_producers_of(
        &self,
        partitions: &[TopicPartition],
    ) -> Result<Vec<(TopicPartition, Vec<ProducerDescription>)>> {
        let mut by_leader: BTreeMap<i32, Vec<&TopicPartition>> = BTreeMap::new();
        for partition in partitions {
            by_leader.entry(self.leader(partition, false).await?).or_default().push(partition);
        }
        let mut described: std::collections::HashMap<TopicPartition, Vec<ProducerDescription>> = std::collections::HashMap::new();
        for (leader, asked) in by_leader {
            let mut topics: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
            for p in &asked {
                topics.entry(&p.topic).or_default().push(p.partition);
            }
            let request = DescribeProducersRequest::default().with_topics(
                topics
                    .into_iter()
                    .map(|(topic, indexes)| {
                        describe_producers_request::TopicRequest::default()
                            .with_name(TopicName(s(topic)))
                            .with_partition_indexes(indexes)
                    })
                    .collect(),
            );
            let response = self.cluster.broker(leader).await?.request(&request, 0).await?;
            for topic in response.topics {
                for p in topic.partitions {
                    let partition = TopicPartition::new(topic.name.to_string(), p.partition_index);
                    if let Some(e) = Error::kafka(p.error_code, format!("describe producers of {partition}"), None) {
                        return Err(e);
                    }
                    let producers = p.active_producers.into_iter().map(|a| ProducerDescription {
                        producer_id: a.producer_id.0,
                        producer_epoch: a.producer_epoch,
                        last_sequence: a.last_sequence,
                        last_timestamp: a.last_timestamp,
                        coordinator_epoch: a.coordinator_epoch,
                        current_txn_start_offset: a.current_txn_start_offset,
                    });
                    described.insert(partition, producers.collect());
                }
            }
        }
        partitions
            .iter()
            .map(|p| match described.remove(p) {
                Some(producers) => Ok((p.clone(), producers)),
                None => Err(Error::Protocol {
                    broker: format!("the leader of {p}"),
                    detail: "DescribeProducers did not answer for the partition".into(),
                }),
            })
            .collect()
    }

    /// The transactions open in the partitions of `topics` (every topic when empty)
    /// whose producer has been idle longer than `max_transaction_timeout` (a coordinator
    /// aborts its own transactions by then) and that no coordinator holds the partition
    /// in: Kafka's `kafka-transactions.sh find-hanging` (KIP-664).
    pub async fn find_hanging(&self, topics: &[String], max_transaction_timeout: Duration) -> Result<Vec<HangingTransaction>> {
        let md = self.cluster.refresh(None).await?;
        let mut names: Vec<&String> = md.topics.keys().filter(|t| topics.is_empty() || topics.contains(t)).collect();
        names.sort();
        let now = fjord_record::now_ms();
        let idle_since = now.saturating_sub(max_transaction_timeout.as_millis() as i64);
        let partitions: Vec<TopicPartition> = names
            .into_iter()
            .flat_map(|name| md.topics[name].partitions.iter().map(|p| TopicPartition::new(name.clone(), p.partition)))
            .collect();
        let mut candidates = Vec::new();
        for (partition, producers) in self.describe_producers_of(&partitions).await? {
            for producer in producers {
                if producer.current_txn_start_offset >= 0 && producer.last_timestamp <= idle_since {
                    candidates.push(HangingTransaction { partition: partition.clone(), producer });
                }
            }
        }
        if candidates.is_empty() {
            return Ok(candidates);
        }
        // What the coordinators hold, by producer id: a candidate their open transaction
        // holds is theirs to end.
        let listings = self.list_transactions().await?;
        let mut hanging = Vec::new();
        for c in candidates {
            let mut held = false;
            for l in listings.iter().filter(|l| l.producer_id == c.producer.producer_id) {
                let d = self.describe_transaction(&l.transactional_id).await?;
                held |= d.producer_id == c.producer.producer_id
                    && !matches!(d.state.as_str(), "Empty" | "CompleteCommit" | "CompleteAbort" | "Dead")
                    && d.partitions.contains(&c.partition);
            }
            if !held {
                hanging.push(c);
            }
        }
        Ok(hanging)
    }

    /// Writes an ABORT marker for `producer_id`'s open transaction in `partition`
    /// (WriteTxnMarkers to its leader, as Kafka's admin `abortTransaction`; needs Alter on
    /// the cluster). `coordinator_epoch` must be at least the one of the producer's last
    /// marker there ([`ProducerDescription::coordinator_epoch`]).
    pub async fn abort_transaction(
        &self,
        partition: &TopicPartition,
        producer_id: i64,
        producer_epoch: i16,
        coordinator_epoch: i32,
    ) -> Result<()> {
        let leader = self.leader(partition, true).await?;
        let request =
            WriteTxnMarkersRequest::default().with_markers(vec![write_txn_markers_request::WritableTxnMarker::default()
                .with_producer_id(ProducerId(producer_id))
                .with_producer_epoch(producer_epoch)
                .with_transaction_result(false)
                .with_coordinator_epoch(coordinator_epoch)
                .with_topics(vec![write_txn_markers_request::WritableTxnMarkerTopic::default()
                    .with_name(TopicName(s(&partition.topic)))
                    .with_partition_indexes(vec![partition.partition])])]);
        let response = self.cluster.broker(leader).await?.request(&request, 1).await?;
        let code = response
            .markers
            .iter()
            .flat_map(|m| m.topics.iter())
            .flat_map(|t| t.partitions.iter())
            .map(|p| p.error_code)
            .next()
            .unwrap_or(ResponseError::UnknownServerError.code());
        match Error::kafka(code, format!("abort the transaction of producer {producer_id} in {partition}"), None) {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    /// The broker leading `partition`, from the metadata at hand unless `fresh` (or the
    /// partition is not in it).
    async fn leader(&self, partition: &TopicPartition, fresh: bool) -> Result<i32> {
        let lookup = |md: &crate::Metadata| {
            let p = md.topics.get(&partition.topic).and_then(|t| t.partitions.get(partition.partition as usize));
            p.map(|p| p.leader).filter(|&leader| leader >= 0)
        };
        let known = if fresh { None } else { lookup(&self.cluster.metadata()) };
        let leader = match known {
            Some(leader) => Some(leader),
            None => lookup(&*self.cluster.refresh(Some(std::slice::from_ref(&partition.topic))).await?),
        };
        match leader {
            Some(leader) => Ok(leader),
            None => Err(Error::Kafka {
                code: ResponseError::UnknownTopicOrPartition,
                context: format!("find the leader of {partition}"),
                message: None,
            }),
        }
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
