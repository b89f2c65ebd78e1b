//! The transaction coordinator over the raw protocol: FindCoordinator for transactional
//! ids (every version, batched keys), InitProducerId with a transactional id (new ids,
//! bumped epochs, fencing an open transaction), AddPartitionsToTxn, AddOffsetsToTxn,
//! EndTxn and TxnOffsetCommit with Kafka's errors for bad input, DescribeTransactions
//! and ListTransactions, and the state surviving a restart (`__transaction_state`).

mod common;

use common::{produce_request, RawClient, TestBroker};
use fjord_record::BatchBuilder;
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::txn_offset_commit_request::{TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

const INVALID_REQUEST: i16 = 42;
const INVALID_PRODUCER_EPOCH: i16 = 47;
const INVALID_TXN_STATE: i16 = 48;
const INVALID_PRODUCER_ID_MAPPING: i16 = 49;
const INVALID_TRANSACTION_TIMEOUT: i16 = 50;
const CONCURRENT_TRANSACTIONS: i16 = 51;
const OPERATION_NOT_ATTEMPTED: i16 = 55;
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const PRODUCER_FENCED: i16 = 90;
const TRANSACTIONAL_ID_NOT_FOUND: i16 = 105;
const THROTTLING_QUOTA_EXCEEDED: i16 = 89;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_owned())
}

fn tid(v: &str) -> TransactionalId {
    TransactionalId(s(v))
}

async fn start(dir: &std::path::Path) -> TestBroker {
    start_with(dir, |_| {}).await
}

/// A broker with 4 partitions of `__transaction_state` and 2 a topic, then `configure`d.
async fn start_with(dir: &std::path::Path, configure: impl FnOnce(&mut fjord_broker::BrokerConfig)) -> TestBroker {
    TestBroker::start_in(dir.join("data"), |c| {
        c.set("transaction.state.log.num.partitions", "4").unwrap();
        c.set("num.partitions", "2").unwrap();
        configure(c);
    })
    .await
    .unwrap()
}

/// Topic `out` made by a plain record, then `id`'s coordinator found and its producer
/// id and epoch (InitProducerId).
async fn out_and_producer(client: &mut RawClient, id: &str) -> (i64, i16) {
    assert_eq!(client.produce(9, &produce_request("out", 0, -1, 5000, batch(-1, -1, -1, "x"))).await.0, 0);
    assert_eq!(find_coordinator(client, 4, id).await.coordinators[0].error_code, 0);
    let r = init(client, 4, id, 60_000).await;
    assert_eq!(r.error_code, 0);
    (r.producer_id.0, r.producer_epoch)
}

/// A Produce of `records` to `partition` of `out` naming transactional id `id`.
fn named(id: &str, partition: i32, records: bytes::Bytes) -> ProduceRequest {
    produce_request("out", partition, -1, 5000, records).with_transactional_id(Some(tid(id)))
}

async fn find_coordinator(client: &mut RawClient, version: i16, id: &str) -> FindCoordinatorResponse {
    let request = if version >= 4 {
        FindCoordinatorRequest::default().with_key_type(1).with_coordinator_keys(vec![s(id)])
    } else {
        FindCoordinatorRequest::default().with_key_type(1).with_key(s(id))
    };
    client.call(ApiKey::FindCoordinator, version, &request).await.unwrap()
}

async fn init(client: &mut RawClient, version: i16, id: &str, timeout_ms: i32) -> InitProducerIdResponse {
    let request = InitProducerIdRequest::default()
        .with_transactional_id(Some(tid(id)))
        .with_transaction_timeout_ms(timeout_ms)
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    client.call(ApiKey::InitProducerId, version, &request).await.unwrap()
}

async fn add_partitions(
    client: &mut RawClient,
    version: i16,
    id: &str,
    pid: i64,
    epoch: i16,
    topics: &[(&str, &[i32])],
) -> Vec<(String, i32, i16)> {
    let request = AddPartitionsToTxnRequest::default()
        .with_v3_and_below_transactional_id(tid(id))
        .with_v3_and_below_producer_id(ProducerId(pid))
        .with_v3_and_below_producer_epoch(epoch)
        .with_v3_and_below_topics(
            topics
                .iter()
                .map(|(t, ps)| AddPartitionsToTxnTopic::default().with_name(TopicName(s(t))).with_partitions(ps.to_vec()))
                .collect(),
        );
    let r: AddPartitionsToTxnResponse = client.call(ApiKey::AddPartitionsToTxn, version, &request).await.unwrap();
    r.results_by_topic_v3_and_below
        .iter()
        .flat_map(|t| t.results_by_partition.iter().map(|p| (t.name.to_string(), p.partition_index, p.partition_error_code)))
        .collect()
}

async fn end_txn(client: &mut RawClient, version: i16, id: &str, pid: i64, epoch: i16, commit: bool) -> i16 {
    let request = EndTxnRequest::default()
        .with_transactional_id(tid(id))
        .with_producer_id(ProducerId(pid))
        .with_producer_epoch(epoch)
        .with_committed(commit);
    let r: EndTxnResponse = client.call(ApiKey::EndTxn, version, &request).await.unwrap();
    r.error_code
}

async fn describe(client: &mut RawClient, ids: &[&str]) -> Vec<describe_transactions_response::TransactionState> {
    let request = DescribeTransactionsRequest::default().with_transactional_ids(ids.iter().map(|i| tid(i)).collect());
    let r: DescribeTransactionsResponse = client.call(ApiKey::DescribeTransactions, 0, &request).await.unwrap();
    r.transaction_states
}

/// Metadata (v9, auto-creation allowed) of one topic.
async fn topic_metadata(client: &mut RawClient, topic: &str) -> metadata_response::MetadataResponseTopic {
    let request = MetadataRequest::default()
        .with_allow_auto_topic_creation(true)
        .with_topics(Some(vec![metadata_request::MetadataRequestTopic::default().with_name(Some(TopicName(s(topic))))]));
    let mut response: MetadataResponse = client.call(ApiKey::Metadata, 9, &request).await.unwrap();
    response.topics.remove(0)
}

fn batch(pid: i64, epoch: i16, seq: i32, value: &str) -> bytes::Bytes {
    let mut b = BatchBuilder::new(1_700_000_000_000).producer(pid, epoch, seq);
    b.append(1_700_000_000_000, None, Some(value.as_bytes()), &[]);
    b.build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_lookup_creates_the_state_topic_and_names_the_partition_leader() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path()).await;
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    for version in 1..=3 {
        let r = find_coordinator(&mut client, version, "tx-a").await;
        assert_eq!(r.error_code, 0, "v{version}: {:?}", r.error_message);
        assert_eq!((r.host.as_str(), r.port), ("127.0.0.1", i32::from(broker.addr.port())), "v{version}");
    }
    // v4 batches keys: each answered on its own, an empty id refused.
    let request = FindCoordinatorRequest::default().with_key_type(1).with_coordinator_keys(vec![s("tx-a"), s(""), s("tx-b")]);
    let r: FindCoordinatorResponse = client.call(ApiKey::FindCoordinator, 4, &request).await.unwrap();
    let codes: Vec<(String, i16)> = r.coordinators.iter().map(|c| (c.key.to_string(), c.error_code)).collect();
    assert_eq!(codes, vec![("tx-a".into(), 0), ("".into(), INVALID_REQUEST), ("tx-b".into(), 0)]);
    // The state topic exists with the configured partitions.
    let metadata = topic_metadata(&mut client, "__transaction_state").await;
    assert_eq!(metadata.error_code, 0);
    assert_eq!(metadata.partitions.len(), 4);
    assert!(metadata.is_internal, "Kafka marks the transaction state topic internal");
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_producer_id_bumps_epochs_and_refuses_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path()).await;
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    assert_eq!(find_coordinator(&mut client, 3, "tx-1").await.error_code, 0);
    let first = init(&mut client, 4, "tx-1", 60_000).await;
    assert_eq!((first.error_code, first.producer_epoch), (0, 0));
    let pid = first.producer_id.0;
    assert!(pid >= 0);
    for (version, epoch) in [(0, 1), (2, 2), (3, 3), (4, 4)] {
        let r = init(&mut client, version, "tx-1", 60_000).await;
        assert_eq!((r.error_code, r.producer_id.0, r.producer_epoch), (0, pid, epoch), "v{version}");
    }
    // Another id: another producer id.
    let other = init(&mut client, 4, "tx-2", 60_000).await;
    assert!(other.error_code == 0 && other.producer_id.0 != pid);
    // Bad input: an empty id, a timeout over transaction.max.timeout.ms (15 minutes) or not positive.
    assert_eq!(init(&mut client, 4, "", 60_000).await.error_code, INVALID_REQUEST);
    assert_eq!(init(&mut client, 4, "tx-1", 900_001).await.error_code, INVALID_TRANSACTION_TIMEOUT);
    assert_eq!(init(&mut client, 4, "tx-1", 0).await.error_code, INVALID_TRANSACTION_TIMEOUT);
    // v3+ with the producer id and epoch it had: an older epoch is fenced.
    let request = InitProducerIdRequest::default()
        .with_transactional_id(Some(tid("tx-1")))
        .with_transaction_timeout_ms(60_000)
        .with_producer_id(ProducerId(pid))
        .with_producer_epoch(1);
    let r: InitProducerIdResponse = client.call(ApiKey::InitProducerId, 4, &request).await.unwrap();
    assert_eq!(r.error_code, PRODUCER_FENCED);
    let r: InitProducerIdResponse = client.call(ApiKey::InitProducerId, 3, &request).await.unwrap();
    assert_eq!(r.error_code, INVALID_PRODUCER_EPOCH, "before KIP-588 the client knows INVALID_PRODUCER_EPOCH");
    broker.stop().await.unwrap();

    // The ids and epochs survive a restart: the next epoch follows the last one.
    let broker = start(dir.path()).await;
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    let r = init(&mut client, 4, "tx-1", 60_000).await;
    assert_eq!((r.error_code, r.producer_id.0, r.producer_epoch), (0, pid, 5));
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_refuse_bad_requests_with_kafkas_errors() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path()).await;
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    // The topic first (auto-created by a produce).
    let (pid, epoch) = out_and_producer(&mut client, "tx").await;
    // Nothing begun: EndTxn makes no sense.
    assert_eq!(end_txn(&mut client, 3, "tx", pid, epoch, true).await, INVALID_TXN_STATE);
    assert_eq!(end_txn(&mut client, 3, "tx", pid, epoch, false).await, INVALID_TXN_STATE);
    // Another producer id, an older epoch, an id never initialised.
    assert_eq!(add_partitions(&mut client, 3, "tx", pid + 1000, epoch, &[("out", &[0])]).await[0].2, INVALID_PRODUCER_ID_MAPPING);
    assert_eq!(add_partitions(&mut client, 3, "tx", pid, epoch + 1, &[("out", &[0])]).await[0].2, PRODUCER_FENCED);
    assert_eq!(add_partitions(&mut client, 1, "tx", pid, epoch + 1, &[("out", &[0])]).await[0].2, INVALID_PRODUCER_EPOCH);
    assert_eq!(add_partitions(&mut client, 3, "never", 1, 0, &[("out", &[0])]).await[0].2, INVALID_PRODUCER_ID_MAPPING);
    assert_eq!(end_txn(&mut client, 3, "never", 1, 0, true).await, INVALID_PRODUCER_ID_MAPPING);
    // An unknown partition: it gets UNKNOWN_TOPIC_OR_PARTITION, the others are not attempted.
    let results = add_partitions(&mut client, 3, "tx", pid, epoch, &[("out", &[0, 1, 7]), ("nope", &[0])]).await;
    assert_eq!(
        results,
        vec![
            ("out".into(), 0, OPERATION_NOT_ATTEMPTED),
            ("out".into(), 1, OPERATION_NOT_ATTEMPTED),
            ("out".into(), 7, UNKNOWN_TOPIC_OR_PARTITION),
            ("nope".into(), 0, UNKNOWN_TOPIC_OR_PARTITION),
        ]
    );
    assert_eq!(describe(&mut client, &["tx"]).await[0].transaction_state.as_str(), "Empty", "nothing was added");
    // Now a real one: both partitions and a group.
    for version in [0, 3] {
        let results = add_partitions(&mut client, version, "tx", pid, epoch, &[("out", &[0, 1])]).await;
        assert!(results.iter().all(|r| r.2 == 0), "v{version}: {results:?}");
    }
    let request = AddOffsetsToTxnRequest::default()
        .with_transactional_id(tid("tx"))
        .with_producer_id(ProducerId(pid))
        .with_producer_epoch(epoch)
        .with_group_id(GroupId(s("g")));
    let r: AddOffsetsToTxnResponse = client.call(ApiKey::AddOffsetsToTxn, 3, &request).await.unwrap();
    assert_eq!(r.error_code, 0);
    let request_offsets = request.clone();
    let stale = request.clone().with_producer_epoch(epoch + 1);
    let r: AddOffsetsToTxnResponse = client.call(ApiKey::AddOffsetsToTxn, 3, &stale).await.unwrap();
    assert_eq!(r.error_code, PRODUCER_FENCED);
    // The group coordinator keeps offsets pending for the producer; unknown partitions are named.
    let request = TxnOffsetCommitRequest::default()
        .with_transactional_id(tid("tx"))
        .with_group_id(GroupId(s("g")))
        .with_producer_id(ProducerId(pid))
        .with_producer_epoch(epoch)
        .with_topics(vec![TxnOffsetCommitRequestTopic::default().with_name(TopicName(s("out"))).with_partitions(vec![
            TxnOffsetCommitRequestPartition::default().with_partition_index(0).with_committed_offset(1),
            TxnOffsetCommitRequestPartition::default().with_partition_index(9).with_committed_offset(1),
        ])]);
    let r: TxnOffsetCommitResponse = client.call(ApiKey::TxnOffsetCommit, 3, &request).await.unwrap();
    let codes: Vec<i16> = r.topics[0].partitions.iter().map(|p| p.error_code).collect();
    assert_eq!(codes, vec![0, UNKNOWN_TOPIC_OR_PARTITION]);
    // Pending offsets are not committed offsets.
    let fetch = OffsetFetchRequest::default().with_group_id(GroupId(s("g"))).with_topics(Some(vec![
        offset_fetch_request::OffsetFetchRequestTopic::default().with_name(TopicName(s("out"))).with_partition_indexes(vec![0]),
    ]));
    let r: OffsetFetchResponse = client.call(ApiKey::OffsetFetch, 5, &fetch).await.unwrap();
    assert_eq!(r.topics[0].partitions[0].committed_offset, -1);
    let state = &describe(&mut client, &["tx", "unknown"]).await;
    assert_eq!(state[0].transaction_state.as_str(), "Ongoing");
    assert_eq!(state[0].producer_id.0, pid);
    assert_eq!(state[0].topics.len(), 1);
    assert_eq!(state[0].topics[0].partitions, vec![0, 1]);
    assert!(state[0].transaction_start_time_ms > 0);
    assert_eq!(state[1].error_code, TRANSACTIONAL_ID_NOT_FOUND);
    let listed: ListTransactionsResponse = client
        .call(ApiKey::ListTransactions, 1, &ListTransactionsRequest::default().with_state_filters(vec![s("Ongoing"), s("Bogus")]))
        .await
        .unwrap();
    assert_eq!(listed.transaction_states.iter().map(|t| t.transactional_id.to_string()).collect::<Vec<_>>(), vec!["tx"]);
    assert_eq!(listed.unknown_state_filters, vec![s("Bogus")]);
    // Commit: answered once complete (its markers and its complete state written), so
    // the same outcome again is done, the other one refused, and the producer's next
    // transaction begins at once, not after CONCURRENT_TRANSACTIONS and a client's backoff.
    assert_eq!(end_txn(&mut client, 3, "tx", pid, epoch + 1, true).await, PRODUCER_FENCED);
    assert_eq!(end_txn(&mut client, 1, "tx", pid, epoch + 1, true).await, INVALID_PRODUCER_EPOCH);
    assert_eq!(end_txn(&mut client, 3, "tx", pid, epoch, true).await, 0);
    assert_eq!(describe(&mut client, &["tx"]).await[0].transaction_state.as_str(), "CompleteCommit");
    assert_eq!(end_txn(&mut client, 3, "tx", pid, epoch, false).await, INVALID_TXN_STATE);
    assert_eq!(end_txn(&mut client, 3, "tx", pid, epoch, true).await, 0);
    let next = add_partitions(&mut client, 3, "tx", pid, epoch, &[("out", &[0])]).await;
    assert_eq!(next, vec![("out".into(), 0, 0)], "the next transaction");
    let r: AddOffsetsToTxnResponse = client.call(ApiKey::AddOffsetsToTxn, 3, &request_offsets).await.unwrap();
    assert_eq!(r.error_code, 0);
    broker.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_producer_fences_an_open_transaction_and_a_restart_keeps_it_prepared() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path()).await;
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    let (pid, epoch) = out_and_producer(&mut client, "zombie").await;
    assert!(add_partitions(&mut client, 3, "zombie", pid, epoch, &[("out", &[0])]).await.iter().all(|r| r.2 == 0));
    // A second producer with the same id: the open transaction is aborted under a bumped
    // epoch and the caller is told to retry.
    assert_eq!(init(&mut client, 4, "zombie", 60_000).await.error_code, CONCURRENT_TRANSACTIONS);
    let state = &describe(&mut client, &["zombie"]).await[0];
    assert!(["PrepareAbort", "CompleteAbort"].contains(&state.transaction_state.as_str()), "{:?}", state.transaction_state);
    assert_eq!(state.producer_epoch, epoch + 1);
    // The zombie can neither add nor commit.
    assert_eq!(add_partitions(&mut client, 3, "zombie", pid, epoch, &[("out", &[1])]).await[0].2, PRODUCER_FENCED);
    assert_eq!(end_txn(&mut client, 3, "zombie", pid, epoch, true).await, PRODUCER_FENCED);
    broker.stop().await.unwrap();

    // After a restart the state is read back as it was written.
    let broker = start(dir.path()).await;
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    let state = &describe(&mut client, &["zombie"]).await[0];
    assert_eq!(state.error_code, 0);
    assert!(["PrepareAbort", "CompleteAbort"].contains(&state.transaction_state.as_str()), "{:?}", state.transaction_state);
    assert_eq!((state.producer_id.0, state.producer_epoch), (pid, epoch + 1));
    assert_eq!(end_txn(&mut client, 3, "zombie", pid, epoch, true).await, PRODUCER_FENCED);
    broker.stop().await.unwrap();
}

/// A state record as the coordinator writes it (key: the id; value: its JSON), here
/// claiming that `id`'s transaction is prepared to abort under a higher epoch: what a
/// client would plant to fence or abort another producer at the coordinator's next load.
fn forged_state(id: &str, pid: i64, epoch: i16) -> bytes::Bytes {
    let value = format!(
        r#"{{"transactional_id":"{id}","producer_id":{pid},"last_producer_id":-1,"producer_epoch":{},"last_producer_epoch":{epoch},"timeout_ms":60000,"state":"PrepareAbort","partitions":[["out",0]],"groups":[],"start_ms":0,"last_update_ms":0}}"#,
        epoch + 1
    );
    let mut b = BatchBuilder::new(1_700_000_000_000);
    b.append(1_700_000_000_000, Some(id.as_bytes()), Some(value.as_bytes()), &[]);
    b.build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_can_neither_write_trim_delete_nor_repartition_the_coordinators_logs() {
    const INVALID_TOPIC_EXCEPTION: i16 = 17;
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path()).await;
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    let (pid, epoch) = out_and_producer(&mut client, "victim").await;
    assert!(add_partitions(&mut client, 3, "victim", pid, epoch, &[("out", &[0])]).await.iter().all(|r| r.2 == 0));
    let mut ends = Vec::new();
    for p in 0..4 {
        ends.push(client.list_offset("__transaction_state", p, common::LATEST).await);
    }

    // A forged state for the victim, into every partition of the state topic: refused
    // with Kafka's code and message, nothing appended.
    for p in 0..4 {
        let request = produce_request("__transaction_state", p, -1, 5000, forged_state("victim", pid, epoch));
        let response: ProduceResponse = client.call(ApiKey::Produce, 9, &request).await.unwrap();
        let answer = &response.responses[0].partition_responses[0];
        assert_eq!(answer.error_code, INVALID_TOPIC_EXCEPTION, "partition {p}");
        assert_eq!(
            answer.error_message.as_ref().map(|m| m.to_string()).as_deref(),
            Some("Cannot append to internal topic __transaction_state")
        );
        assert_eq!(client.list_offset("__transaction_state", p, common::LATEST).await, ends[p as usize], "partition {p}");
    }
    // Nor trimmed: DeleteRecords would make the coordinator forget ids at its next load.
    for p in 0..4 {
        let request = DeleteRecordsRequest::default().with_timeout_ms(5000).with_topics(vec![
            delete_records_request::DeleteRecordsTopic::default().with_name(TopicName(s("__transaction_state"))).with_partitions(
                vec![delete_records_request::DeleteRecordsPartition::default().with_partition_index(p).with_offset(-1)],
            ),
        ]);
        let response: DeleteRecordsResponse = client.call(ApiKey::DeleteRecords, 2, &request).await.unwrap();
        assert_eq!(response.topics[0].partitions[0].error_code, INVALID_TOPIC_EXCEPTION, "partition {p}");
        assert_eq!(client.list_offset("__transaction_state", p, common::EARLIEST).await, (0, 0), "partition {p}");
    }
    // Nor deleted, nor given partitions (ids would move to partitions without their state).
    let request =
        DeleteTopicsRequest::default().with_timeout_ms(5000).with_topics(vec![delete_topics_request::DeleteTopicState::default(
        )
        .with_name(Some(TopicName(s("__transaction_state"))))]);
    let response: DeleteTopicsResponse = client.call(ApiKey::DeleteTopics, 6, &request).await.unwrap();
    assert_eq!(response.responses[0].error_code, INVALID_TOPIC_EXCEPTION);
    assert_eq!(
        response.responses[0].error_message.as_ref().map(|m| m.to_string()).as_deref(),
        Some("__transaction_state is an internal topic and is not allowed to be deleted")
    );
    let request = CreatePartitionsRequest::default().with_timeout_ms(5000).with_topics(vec![
        create_partitions_request::CreatePartitionsTopic::default().with_name(TopicName(s("__transaction_state"))).with_count(8),
    ]);
    let response: CreatePartitionsResponse = client.call(ApiKey::CreatePartitions, 3, &request).await.unwrap();
    assert_eq!(response.results[0].error_code, INVALID_TOPIC_EXCEPTION);
    let metadata = topic_metadata(&mut client, "__transaction_state").await;
    assert_eq!((metadata.error_code, metadata.partitions.len()), (0, 4));
    // Kafka's other internal name is refused too, and neither a Produce nor a Metadata
    // request creates it with a plain topic's defaults.
    let (code, _) = client.produce(9, &produce_request("__consumer_offsets", 0, -1, 5000, batch(-1, -1, -1, "x"))).await;
    assert_eq!(code, INVALID_TOPIC_EXCEPTION);
    let metadata = topic_metadata(&mut client, "__consumer_offsets").await;
    assert_eq!(metadata.error_code, UNKNOWN_TOPIC_OR_PARTITION);
    broker.stop().await.unwrap();

    // What the coordinator loads after a restart is its own record: the victim's
    // transaction still open under its epoch, and the victim can commit it.
    let broker = start(dir.path()).await;
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    let state = &describe(&mut client, &["victim"]).await[0];
    assert_eq!(state.error_code, 0);
    assert_eq!(state.transaction_state.as_str(), "Ongoing");
    assert_eq!((state.producer_id.0, state.producer_epoch), (pid, epoch));
    assert_eq!(end_txn(&mut client, 3, "victim", pid, epoch, true).await, 0);
    broker.stop().await.unwrap();
}

/// OffsetFetch of one partition of `out` for group `sg`: (error code, committed offset)
/// of the partition, from the top-level fields before v8 and the group's after.
async fn fetch_offset(client: &mut RawClient, version: i16, require_stable: bool, partition: i32) -> (i16, i64) {
    let request = if version >= 8 {
        OffsetFetchRequest::default().with_require_stable(require_stable).with_groups(vec![
            offset_fetch_request::OffsetFetchRequestGroup::default().with_group_id(GroupId(s("sg"))).with_topics(Some(vec![
                offset_fetch_request::OffsetFetchRequestTopics::default()
                    .with_name(TopicName(s("out")))
                    .with_partition_indexes(vec![partition]),
            ])),
        ])
    } else {
        let request = OffsetFetchRequest::default().with_group_id(GroupId(s("sg"))).with_topics(Some(vec![
            offset_fetch_request::OffsetFetchRequestTopic::default()
                .with_name(TopicName(s("out")))
                .with_partition_indexes(vec![partition]),
        ]));
        if version >= 7 {
            request.with_require_stable(require_stable)
        } else {
            request
        }
    };
    let r: OffsetFetchResponse = client.call(ApiKey::OffsetFetch, version, &request).await.unwrap();
    if version >= 8 {
        assert_eq!(r.groups[0].error_code, 0);
        let p = &r.groups[0].topics[0].partitions[0];
        (p.error_code, p.committed_offset)
    } else {
        assert_eq!(r.error_code, 0);
        let p = &r.topics[0].partitions[0];
        (p.error_code, p.committed_offset)
    }
}

const UNSTABLE_OFFSET_COMMIT: i16 = 88;

/// Group `sg` with offset 5 of `out` 0 pending in a transaction, 3 of `out` 1 committed.
async fn assert_pending(client: &mut RawClient) {
    assert_eq!(fetch_offset(client, 7, true, 0).await, (UNSTABLE_OFFSET_COMMIT, -1));
    assert_eq!(fetch_offset(client, 8, true, 0).await, (UNSTABLE_OFFSET_COMMIT, -1));
    // Not asked for stable offsets (or a version without the field): the last committed.
    assert_eq!(fetch_offset(client, 7, false, 0).await, (0, -1));
    assert_eq!(fetch_offset(client, 8, false, 0).await, (0, -1));
    assert_eq!(fetch_offset(client, 6, true, 0).await, (0, -1));
    // A partition the transaction does not commit is stable.
    assert_eq!(fetch_offset(client, 8, true, 1).await, (0, 3));
}

/// KIP-447: while a transaction's offsets are pending (TxnOffsetCommit done, the commit
/// marker not yet at the group coordinator), OffsetFetch with `require_stable` answers
/// UNSTABLE_OFFSET_COMMIT for those partitions so that the client retries, instead of
/// the offsets from before the transaction (librdkafka 0103 on three brokers read -1001
/// right after commit_transaction); without it, or for other partitions, the last
/// committed offset. A restarted coordinator reads the pending offsets back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offset_fetch_require_stable_is_unstable_while_transactional_offsets_are_pending() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path()).await;
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    let (pid, epoch) = out_and_producer(&mut client, "stable").await;
    // Partition 1 has an offset committed outside the transaction.
    let commit = OffsetCommitRequest::default().with_group_id(GroupId(s("sg"))).with_topics(vec![
        offset_commit_request::OffsetCommitRequestTopic::default().with_name(TopicName(s("out"))).with_partitions(vec![
            offset_commit_request::OffsetCommitRequestPartition::default().with_partition_index(1).with_committed_offset(3),
        ]),
    ]);
    let r: OffsetCommitResponse = client.call(ApiKey::OffsetCommit, 8, &commit).await.unwrap();
    assert_eq!(r.topics[0].partitions[0].error_code, 0);
    let request = AddOffsetsToTxnRequest::default()
        .with_transactional_id(tid("stable"))
        .with_producer_id(ProducerId(pid))
        .with_producer_epoch(epoch)
        .with_group_id(GroupId(s("sg")));
    let r: AddOffsetsToTxnResponse = client.call(ApiKey::AddOffsetsToTxn, 3, &request).await.unwrap();
    assert_eq!(r.error_code, 0);
    let request = TxnOffsetCommitRequest::default()
        .with_transactional_id(tid("stable"))
        .with_group_id(GroupId(s("sg")))
        .with_producer_id(ProducerId(pid))
        .with_producer_epoch(epoch)
        .with_topics(vec![TxnOffsetCommitRequestTopic::default()
            .with_name(TopicName(s("out")))
            .with_partitions(vec![TxnOffsetCommitRequestPartition::default().with_partition_index(0).with_committed_offset(5)])]);
    let r: TxnOffsetCommitResponse = client.call(ApiKey::TxnOffsetCommit, 3, &request).await.unwrap();
    assert_eq!(r.topics[0].partitions[0].error_code, 0);

    assert_pending(&mut client).await;
    broker.stop().await.unwrap();
    let broker = start(dir.path()).await;
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    assert_pending(&mut client).await;
    // The commit's marker applies the offset: then it is stable.
    assert_eq!(find_coordinator(&mut client, 4, "stable").await.coordinators[0].error_code, 0);
    let mut ended = end_txn(&mut client, 3, "stable", pid, epoch, true).await;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while ended != 0 && tokio::time::Instant::now() < deadline {
        // The restarted coordinator may still be loading its partition.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        ended = end_txn(&mut client, 3, "stable", pid, epoch, true).await;
    }
    assert_eq!(ended, 0);
    let mut fetched = fetch_offset(&mut client, 8, true, 0).await;
    while fetched.0 == UNSTABLE_OFFSET_COMMIT && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        fetched = fetch_offset(&mut client, 8, true, 0).await;
    }
    assert_eq!(fetched, (0, 5));
    assert_eq!(fetch_offset(&mut client, 7, true, 0).await, (0, 5));
    assert_eq!(fetch_offset(&mut client, 8, true, 1).await, (0, 3));
    broker.stop().await.unwrap();
}

const TRANSACTION_ABORTABLE: i16 = 120;

/// Kafka's `Utils.abs(key.hashCode()) % partitions`: the partition of an internal topic
/// (offsets, transaction state) holding a group or transactional id.
fn java_partition(key: &str, partitions: i32) -> i32 {
    let hash = key.encode_utf16().fold(0i32, |h, unit| h.wrapping_mul(31).wrapping_add(i32::from(unit)));
    (if hash == i32::MIN { 0 } else { hash.abs() }) % partitions
}

/// The group's partition of the offsets topic.
fn offsets_partition(group: &str) -> i32 {
    java_partition(group, 50)
}

async fn txn_commit(client: &mut RawClient, version: i16, id: &str, group: &str, pid: i64, epoch: i16, offset: i64) -> i16 {
    let request = TxnOffsetCommitRequest::default()
        .with_transactional_id(tid(id))
        .with_group_id(GroupId(s(group)))
        .with_producer_id(ProducerId(pid))
        .with_producer_epoch(epoch)
        .with_topics(vec![TxnOffsetCommitRequestTopic::default().with_name(TopicName(s("out"))).with_partitions(vec![
            TxnOffsetCommitRequestPartition::default().with_partition_index(0).with_committed_offset(offset),
        ])]);
    let r: TxnOffsetCommitResponse = client.call(ApiKey::TxnOffsetCommit, version, &request).await.unwrap();
    r.topics[0].partitions[0].error_code
}

/// Group `group`'s offset of `out` 0 asked with require_stable: (error code, offset).
async fn stable_offset(client: &mut RawClient, group: &str) -> (i16, i64) {
    let request = OffsetFetchRequest::default().with_require_stable(true).with_groups(vec![
        offset_fetch_request::OffsetFetchRequestGroup::default().with_group_id(GroupId(s(group))).with_topics(Some(vec![
            offset_fetch_request::OffsetFetchRequestTopics::default()
                .with_name(TopicName(s("out")))
                .with_partition_indexes(vec![0]),
        ])),
    ]);
    let r: OffsetFetchResponse = client.call(ApiKey::OffsetFetch, 8, &request).await.unwrap();
    let p = &r.groups[0].topics[0].partitions[0];
    (p.error_code, p.committed_offset)
}

/// One transaction of a batched AddPartitionsToTxn: id, producer id, epoch, verify_only,
/// (topic, partitions).
type Batched<'a> = (&'a str, i64, i16, bool, &'a [(&'a str, &'a [i32])]);

/// AddPartitionsToTxn v4+ (the brokers' batch): each transaction's (topic, partition, code).
async fn add_batched(client: &mut RawClient, version: i16, transactions: &[Batched<'_>]) -> (i16, Vec<Vec<(String, i32, i16)>>) {
    use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTransaction;
    let request = AddPartitionsToTxnRequest::default().with_transactions(
        transactions
            .iter()
            .map(|(id, pid, epoch, verify, topics)| {
                AddPartitionsToTxnTransaction::default()
                    .with_transactional_id(tid(id))
                    .with_producer_id(ProducerId(*pid))
                    .with_producer_epoch(*epoch)
                    .with_verify_only(*verify)
                    .with_topics(
                        topics
                            .iter()
                            .map(|(t, ps)| {
                                AddPartitionsToTxnTopic::default().with_name(TopicName(s(t))).with_partitions(ps.to_vec())
                            })
                            .collect(),
                    )
            })
            .collect(),
    );
    let r: AddPartitionsToTxnResponse = client.call(ApiKey::AddPartitionsToTxn, version, &request).await.unwrap();
    let results = r
        .results_by_transaction
        .iter()
        .map(|t| {
            t.topic_results
                .iter()
                .flat_map(|t| {
                    t.results_by_partition.iter().map(|p| (t.name.to_string(), p.partition_index, p.partition_error_code))
                })
                .collect()
        })
        .collect();
    (r.error_code, results)
}

/// Kafka's checks of a TxnOffsetCommit (KIP-890): offsets for a group the transaction
/// did not add with AddOffsetsToTxn are INVALID_TXN_STATE and nothing is kept pending
/// (OffsetFetch with require_stable stays stable, and the commit applies nothing); another
/// producer id, a stale epoch (INVALID_PRODUCER_EPOCH before v3) and an id never
/// initialised get Kafka's codes. AddPartitionsToTxn v4/v5, the brokers' batched form:
/// verify_only answers NONE for what the open transaction holds (partitions, and a group
/// by its offsets-topic partition) and INVALID_TXN_STATE (v4) or TRANSACTION_ABORTABLE
/// (v5) for the rest without adding it; without verify_only it adds; an id repeated in a
/// batch is INVALID_REQUEST.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_offset_commit_needs_the_group_in_the_transaction_and_v4_batches_verify() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path()).await;
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    let (pid, epoch) = out_and_producer(&mut client, "tx-v").await;
    assert!(add_partitions(&mut client, 3, "tx-v", pid, epoch, &[("out", &[0])]).await.iter().all(|r| r.2 == 0));

    // The group was never added: refused, for every version, and nothing is pending.
    for version in 0..=3 {
        assert_eq!(txn_commit(&mut client, version, "tx-v", "vg", pid, epoch, 7).await, INVALID_TXN_STATE, "v{version}");
    }
    assert_eq!(stable_offset(&mut client, "vg").await, (0, -1));
    assert_eq!(txn_commit(&mut client, 3, "tx-v", "vg", pid + 1000, epoch, 7).await, INVALID_PRODUCER_ID_MAPPING);
    assert_eq!(txn_commit(&mut client, 3, "tx-v", "vg", pid, epoch + 1, 7).await, PRODUCER_FENCED);
    assert_eq!(txn_commit(&mut client, 2, "tx-v", "vg", pid, epoch + 1, 7).await, INVALID_PRODUCER_EPOCH);
    assert_eq!(txn_commit(&mut client, 3, "never", "vg", 1, 0, 7).await, INVALID_PRODUCER_ID_MAPPING);

    // verify_only: out-0 is in the transaction; out-1 and the group are not, and stay out.
    let group_partition = offsets_partition("vg");
    let asked: &[(&str, &[i32])] = &[("out", &[0, 1]), ("__consumer_offsets", &[group_partition])];
    for (version, missing) in [(4, INVALID_TXN_STATE), (5, TRANSACTION_ABORTABLE)] {
        let (top, results) = add_batched(&mut client, version, &[("tx-v", pid, epoch, true, asked)]).await;
        assert_eq!(top, 0);
        assert_eq!(
            results,
            vec![vec![("out".into(), 0, 0), ("out".into(), 1, missing), ("__consumer_offsets".into(), group_partition, missing)]],
            "v{version}"
        );
    }
    assert_eq!(describe(&mut client, &["tx-v"]).await[0].topics[0].partitions, vec![0], "verify_only added a partition");
    // A stale epoch and an unknown id are verified as Kafka answers them; an id twice is malformed.
    let (_, results) = add_batched(
        &mut client,
        5,
        &[
            ("tx-v", pid, epoch + 1, true, &[("out", &[0])]),
            ("never", 1, 0, true, &[("out", &[0])]),
            ("tx-v", pid, epoch, true, &[("out", &[0])]),
        ],
    )
    .await;
    let codes: Vec<i16> = results.iter().map(|t| t[0].2).collect();
    assert_eq!(codes, vec![PRODUCER_FENCED, INVALID_PRODUCER_ID_MAPPING, INVALID_REQUEST]);

    // The group added: verified, and its offsets are kept pending until the commit.
    let request = AddOffsetsToTxnRequest::default()
        .with_transactional_id(tid("tx-v"))
        .with_producer_id(ProducerId(pid))
        .with_producer_epoch(epoch)
        .with_group_id(GroupId(s("vg")));
    let r: AddOffsetsToTxnResponse = client.call(ApiKey::AddOffsetsToTxn, 3, &request).await.unwrap();
    assert_eq!(r.error_code, 0);
    let (_, results) =
        add_batched(&mut client, 4, &[("tx-v", pid, epoch, true, &[("__consumer_offsets", &[group_partition])])]).await;
    assert_eq!(results[0][0].2, 0);
    assert_eq!(txn_commit(&mut client, 3, "tx-v", "vg", pid, epoch, 7).await, 0);
    assert_eq!(stable_offset(&mut client, "vg").await, (UNSTABLE_OFFSET_COMMIT, -1));
    // Without verify_only v4 adds, as v3 does.
    let (_, results) = add_batched(&mut client, 4, &[("tx-v", pid, epoch, false, &[("out", &[1])])]).await;
    assert_eq!(results, vec![vec![("out".into(), 1, 0)]]);
    assert_eq!(describe(&mut client, &["tx-v"]).await[0].topics[0].partitions, vec![0, 1]);

    assert_eq!(end_txn(&mut client, 3, "tx-v", pid, epoch, true).await, 0);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut fetched = stable_offset(&mut client, "vg").await;
    while fetched.0 == UNSTABLE_OFFSET_COMMIT && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        fetched = stable_offset(&mut client, "vg").await;
    }
    assert_eq!(fetched, (0, 7));
    // The transaction is over: its group is no longer in a transaction.
    let r = txn_commit(&mut client, 3, "tx-v", "vg", pid, epoch, 9).await;
    assert!(r == INVALID_TXN_STATE || r == CONCURRENT_TRANSACTIONS, "{r}");
    assert_eq!(stable_offset(&mut client, "vg").await, (0, 7));
    broker.stop().await.unwrap();
}

fn txn_batch(pid: i64, epoch: i16, seq: i32, value: &str) -> bytes::Bytes {
    let mut b = BatchBuilder::new(1_700_000_000_000).producer(pid, epoch, seq).transactional();
    b.append(1_700_000_000_000, None, Some(value.as_bytes()), &[]);
    b.build()
}

/// ListOffsets (v5) latest of `out`'s `partition`: read_committed (the LSO) with
/// `isolation_level` 1.
async fn out_latest(client: &mut RawClient, partition: i32, isolation_level: i8) -> i64 {
    let (code, offset) = client.list_offset_in("out", partition, common::LATEST, isolation_level).await;
    assert_eq!(code, 0);
    offset
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_batch_opens_a_transaction_only_where_its_coordinator_added_the_partition() {
    const TRANSACTIONAL_ID_AUTHORIZATION_FAILED: i16 = 53;
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path()).await;
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    let (pid, epoch) = out_and_producer(&mut client, "app").await;
    // Each of these would have opened a transaction no coordinator knows of, so no
    // marker would ever end it: read_committed consumers of the partition stopped at it
    // for good. A request without a transactional id is refused whole, as Kafka does.
    let no_id = produce_request("out", 0, -1, 5000, txn_batch(pid, epoch, 0, "a"));
    assert_eq!(client.produce(9, &no_id).await.0, TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
    // The coordinator has no such producer for the id, or no such id at all.
    assert_eq!(client.produce(9, &named("app", 0, txn_batch(pid + 1000, 0, 0, "b"))).await.0, INVALID_PRODUCER_ID_MAPPING);
    assert_eq!(client.produce(9, &named("nobody", 0, txn_batch(pid, epoch, 0, "c"))).await.0, INVALID_PRODUCER_ID_MAPPING);
    // The id's producer, but under another epoch, or before adding the partition.
    assert_eq!(client.produce(9, &named("app", 0, txn_batch(pid, epoch + 1, 0, "d"))).await.0, INVALID_PRODUCER_EPOCH);
    assert_eq!(client.produce(9, &named("app", 0, txn_batch(pid, epoch, 0, "e"))).await.0, INVALID_TXN_STATE);
    // Two producers' transactional batches in one request.
    let mut two = named("app", 0, txn_batch(pid, epoch, 0, "f"));
    two.topic_data[0]
        .partition_data
        .push(produce_request::PartitionProduceData::default().with_index(1).with_records(Some(txn_batch(pid + 1, 0, 0, "g"))));
    let response: ProduceResponse = client.call(ApiKey::Produce, 9, &two).await.unwrap();
    let codes: Vec<i16> = response.responses[0].partition_responses.iter().map(|p| p.error_code).collect();
    assert_eq!(codes, vec![INVALID_PRODUCER_ID_MAPPING; 2]);
    for partition in [0, 1] {
        assert_eq!(out_latest(&mut client, partition, 1).await, out_latest(&mut client, partition, 0).await);
    }
    assert_eq!(client.latest_offset("out").await, (0, 1), "nothing of it was written");

    // Partition 0 added: its batch opens the transaction there; partition 1's is refused
    // (and its message says why, v8+).
    assert!(add_partitions(&mut client, 3, "app", pid, epoch, &[("out", &[0])]).await.iter().all(|r| r.2 == 0));
    assert_eq!(client.produce(9, &named("app", 0, txn_batch(pid, epoch, 0, "h"))).await, (0, 1));
    assert_eq!(client.produce(9, &named("app", 0, txn_batch(pid, epoch, 1, "i"))).await, (0, 2));
    let response: ProduceResponse =
        client.call(ApiKey::Produce, 9, &named("app", 1, txn_batch(pid, epoch, 0, "j"))).await.unwrap();
    let p = &response.responses[0].partition_responses[0];
    assert_eq!(p.error_code, INVALID_TXN_STATE);
    assert_eq!(p.error_message.as_deref(), Some("Partition was not added to the transaction"));
    assert_eq!(out_latest(&mut client, 0, 1).await, 1, "the open transaction holds the LSO");
    assert_eq!(out_latest(&mut client, 1, 1).await, out_latest(&mut client, 1, 0).await);

    // Committed: the LSO passes it, and the ended transaction does not reopen without a
    // new AddPartitionsToTxn.
    assert_eq!(end_txn(&mut client, 3, "app", pid, epoch, true).await, 0);
    assert_eq!(client.produce(9, &named("app", 0, txn_batch(pid, epoch, 2, "k"))).await.0, INVALID_TXN_STATE);
    assert_eq!(out_latest(&mut client, 0, 1).await, out_latest(&mut client, 0, 0).await);
    broker.stop().await.unwrap();
}

/// A transaction opened before brokers verified with the coordinator (here: with the
/// verification off, as a broker before this release took any transactional batch) hangs
/// its partition for read_committed consumers; `TransactionAdmin` finds it and aborts it
/// (`fjord transactions find-hanging` / `abort`), and leaves a coordinator's own open
/// transaction alone, however old its records' timestamps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_transaction_is_found_and_aborted_and_a_live_one_is_not() {
    use fjord_client::{ClientConfig, TopicPartition, TransactionAdmin};
    let dir = tempfile::tempdir().unwrap();
    let broker = start_with(dir.path(), |c| c.set("transaction.partition.verification.enable", "false").unwrap()).await;
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    // A live transaction in partition 0, its records stamped long ago.
    let (pid, epoch) = out_and_producer(&mut client, "live").await;
    assert!(add_partitions(&mut client, 3, "live", pid, epoch, &[("out", &[0])]).await.iter().all(|r| r.2 == 0));
    assert_eq!(client.produce(9, &named("live", 0, txn_batch(pid, epoch, 0, "l"))).await, (0, 1));
    // A stray one in partition 1 that no coordinator knows of.
    assert_eq!(client.produce(9, &named("gone", 1, txn_batch(5_000, 0, 0, "s"))).await, (0, 0));
    assert_eq!(client.produce(9, &named("gone", 1, batch(-1, -1, -1, "after"))).await, (0, 1));
    assert_eq!((out_latest(&mut client, 1, 1).await, out_latest(&mut client, 1, 0).await), (0, 2), "it hangs");

    let admin = TransactionAdmin::connect(ClientConfig::new(&broker.addr.to_string())).await.unwrap();
    let hanging = admin.find_hanging(&[], std::time::Duration::from_secs(900)).await.unwrap();
    let found: Vec<(String, i32, i64, i64)> = hanging
        .iter()
        .map(|h| (h.partition.topic.clone(), h.partition.partition, h.producer.producer_id, h.producer.current_txn_start_offset))
        .collect();
    assert_eq!(found, [("out".to_owned(), 1, 5_000, 0)]);
    let stray = &hanging[0].producer;
    admin
        .abort_transaction(&TopicPartition::new("out", 1), 5_000, stray.producer_epoch as i16, stray.coordinator_epoch)
        .await
        .unwrap();
    assert_eq!(out_latest(&mut client, 1, 1).await, out_latest(&mut client, 1, 0).await, "read_committed moves on");
    assert!(admin.find_hanging(&[], std::time::Duration::from_secs(900)).await.unwrap().is_empty());
    // The live transaction was left to its coordinator: it commits.
    assert_eq!(out_latest(&mut client, 0, 1).await, 1);
    assert_eq!(end_txn(&mut client, 3, "live", pid, epoch, true).await, 0);
    assert_eq!(out_latest(&mut client, 0, 1).await, out_latest(&mut client, 0, 0).await);
    broker.stop().await.unwrap();
}

/// Every transactional id the broker coordinates, with its state.
async fn listed(client: &mut RawClient) -> Vec<(String, String)> {
    let r: ListTransactionsResponse =
        client.call(ApiKey::ListTransactions, 0, &ListTransactionsRequest::default()).await.unwrap();
    assert_eq!(r.error_code, 0);
    r.transaction_states.iter().map(|t| (t.transactional_id.to_string(), t.transaction_state.to_string())).collect()
}

/// A client taking a new transactional id for every producer (made up, or a fresh one
/// per run) cannot grow the coordinator's ids past `transactional.id.max.per.partition`,
/// before or after a restart: the longest idle ids are forgotten, an open transaction
/// never is, and it still commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_transactional_ids_cannot_grow_the_coordinator_past_its_limit() {
    let dir = tempfile::tempdir().unwrap();
    let limited = |c: &mut fjord_broker::BrokerConfig| c.set("transactional.id.max.per.partition", "20").unwrap();
    let broker = start_with(dir.path(), limited).await;
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    let (pid, epoch) = out_and_producer(&mut client, "open").await;
    assert!(add_partitions(&mut client, 3, "open", pid, epoch, &[("out", &[0])]).await.iter().all(|r| r.2 == 0));
    for n in 0..400 {
        let r = init(&mut client, 4, &format!("flood-{n}"), 60_000).await;
        assert_eq!(r.error_code, 0, "flood-{n}");
    }
    let ids = listed(&mut client).await;
    // 4 partitions of the state topic, at most 20 ids each.
    assert!(ids.len() <= 80, "{} ids kept", ids.len());
    assert!(ids.contains(&("open".to_string(), "Ongoing".to_string())), "{ids:?}");
    // The latest ids are the ones kept: the longest idle went first.
    assert!(ids.iter().any(|(id, _)| id == "flood-399"), "{ids:?}");
    assert!(!ids.iter().any(|(id, _)| id == "flood-0"), "{ids:?}");
    // A forgotten id's producer is fenced as after its expiry.
    let forgotten = init(&mut client, 4, "flood-0", 60_000).await;
    assert_eq!(forgotten.error_code, 0);
    broker.stop().await.unwrap();

    let broker = start_with(dir.path(), limited).await;
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    let ids = listed(&mut client).await;
    assert!(ids.len() <= 80, "{} ids kept after a restart", ids.len());
    assert!(ids.contains(&("open".to_string(), "Ongoing".to_string())), "{ids:?}");
    assert_eq!(end_txn(&mut client, 3, "open", pid, epoch, true).await, 0);
    assert_eq!(&describe(&mut client, &["open"]).await[0].transaction_state.to_string(), "CompleteCommit");
    broker.stop().await.unwrap();
}

/// When every id of a partition of the state topic has a transaction under way, a new id
/// there is refused (THROTTLING_QUOTA_EXCEEDED) and the open transactions are untouched;
/// once one ends, its id may be forgotten to make room, and its producer is then unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_transactional_id_waits_while_open_transactions_fill_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start_with(dir.path(), |c| c.set("transactional.id.max.per.partition", "3").unwrap()).await;
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    // Four ids of one partition of the state topic (4 partitions here).
    let ids: Vec<String> = (0..).map(|n| format!("busy-{n}")).filter(|id| java_partition(id, 4) == 0).take(4).collect();
    let (pid, epoch) = out_and_producer(&mut client, &ids[0]).await;
    let mut producers = vec![(pid, epoch)];
    for id in &ids[1..3] {
        let r = init(&mut client, 4, id, 60_000).await;
        assert_eq!(r.error_code, 0);
        producers.push((r.producer_id.0, r.producer_epoch));
    }
    for (id, &(pid, epoch)) in ids.iter().zip(&producers) {
        assert!(add_partitions(&mut client, 3, id, pid, epoch, &[("out", &[0])]).await.iter().all(|r| r.2 == 0));
    }
    assert_eq!(init(&mut client, 4, &ids[3], 60_000).await.error_code, THROTTLING_QUOTA_EXCEEDED);
    let states = describe(&mut client, &[&ids[0], &ids[1], &ids[2]]).await;
    assert!(states.iter().all(|s| s.transaction_state.as_str() == "Ongoing"), "{states:?}");

    let (pid, epoch) = producers[1];
    assert_eq!(end_txn(&mut client, 3, &ids[1], pid, epoch, true).await, 0);
    assert_eq!(init(&mut client, 4, &ids[3], 60_000).await.error_code, 0);
    // The committed id was the idle one: forgotten, its producer unknown.
    assert_eq!(describe(&mut client, &[&ids[1]]).await[0].error_code, TRANSACTIONAL_ID_NOT_FOUND);
    assert_eq!(add_partitions(&mut client, 3, &ids[1], pid, epoch, &[("out", &[1])]).await[0].2, INVALID_PRODUCER_ID_MAPPING);
    for i in [0, 2] {
        let (pid, epoch) = producers[i];
        assert_eq!(end_txn(&mut client, 3, &ids[i], pid, epoch, true).await, 0, "{}", ids[i]);
    }
    broker.stop().await.unwrap();
}
