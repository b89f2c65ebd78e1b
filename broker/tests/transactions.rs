//! Transactions on the partition side (#20), over the raw protocol: transactional batches
//! (attributes bit 0x10) produced into two partitions, WriteTxnMarkers committing one and
//! aborting the other, read_committed vs read_uncommitted Fetch (the last stable offset
//! and the aborted transactions), ListOffsets with isolation_level=1, Kafka's error codes
//! for bad markers, and all of it across a restart. The test plays the transaction
//! coordinator itself, so the broker runs without asking one
//! (`transaction.partition.verification.enable=false`); the requests still name a
//! transactional id, which a broker takes transactional batches only with.

mod common;

use bytes::Bytes;
use common::{produce_request, topic_name, RawClient, TestBroker, LATEST};
use fjord_record::BatchBuilder;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::write_txn_markers_request::{WritableTxnMarker, WritableTxnMarkerTopic};
use kafka_protocol::messages::{
    ApiKey, BrokerId, FetchRequest, FetchResponse, ProducerId, WriteTxnMarkersRequest, WriteTxnMarkersResponse,
};
use kafka_protocol::protocol::StrBytes;

const TOPIC: &str = "txn";
const INVALID_PRODUCER_EPOCH: i16 = 47;
const INVALID_TXN_STATE: i16 = 48;
const TRANSACTION_COORDINATOR_FENCED: i16 = 52;
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;
const INVALID_RECORD: i16 = 87;

/// `n` records from producer `pid` (epoch 0) from sequence `seq`, transactional or not.
fn batch(pid: i64, seq: i32, n: usize, transactional: bool, tag: &str) -> Bytes {
    let mut b = BatchBuilder::new(1_700_000_000_000).producer(pid, 0, seq);
    if transactional {
        b = b.transactional();
    }
    for i in 0..n {
        b.append(1_700_000_000_000, None, Some(format!("{tag}{i}").as_bytes()), &[]);
    }
    b.build()
}

/// A Produce of `records` to `partition` naming a transactional id.
fn txn_produce(partition: i32, records: Bytes) -> kafka_protocol::messages::ProduceRequest {
    produce_request(TOPIC, partition, -1, 5000, records)
        .with_transactional_id(Some(kafka_protocol::messages::TransactionalId(StrBytes::from_static_str("stand-in"))))
}

/// The broker of these tests: `partitions` partitions a topic, no coordinator asked.
async fn start(data: std::path::PathBuf, partitions: i32) -> TestBroker {
    TestBroker::start_in(data, |c| {
        c.num_partitions = partitions;
        c.transaction.partition_verification = false;
    })
    .await
    .unwrap()
}

/// One WriteTxnMarkers of one marker: the error code per partition.
async fn marker(
    client: &mut RawClient,
    pid: i64,
    epoch: i16,
    commit: bool,
    coordinator_epoch: i32,
    partitions: &[i32],
) -> Vec<i16> {
    marker_on(client, TOPIC, pid, epoch, commit, coordinator_epoch, partitions).await
}

async fn marker_on(
    client: &mut RawClient,
    topic: &str,
    pid: i64,
    epoch: i16,
    commit: bool,
    coordinator_epoch: i32,
    partitions: &[i32],
) -> Vec<i16> {
    let request = WriteTxnMarkersRequest::default().with_markers(vec![WritableTxnMarker::default()
        .with_producer_id(ProducerId(pid))
        .with_producer_epoch(epoch)
        .with_transaction_result(commit)
        .with_coordinator_epoch(coordinator_epoch)
        .with_topics(vec![WritableTxnMarkerTopic::default()
            .with_name(topic_name(topic))
            .with_partition_indexes(partitions.to_vec())])]);
    let response: WriteTxnMarkersResponse = client.call(ApiKey::WriteTxnMarkers, 1, &request).await.unwrap();
    assert_eq!(response.markers[0].producer_id.0, pid);
    response.markers[0].topics[0].partitions.iter().map(|p| p.error_code).collect()
}

/// What a Fetch (v11) of one partition from 0 returns: the values of its data records
/// (control batches skipped), the aborted transactions, the last stable offset and the
/// high watermark.
struct Fetched {
    values: Vec<String>,
    aborted: Vec<(i64, i64)>,
    last_stable_offset: i64,
    high_watermark: i64,
    /// (producer id, first offset, values) of each data batch, for the read_committed
    /// filtering a client does.
    batches: Vec<(i64, i64, Vec<String>)>,
}

async fn fetch(client: &mut RawClient, partition: i32, isolation_level: i8) -> Fetched {
    let mut f =
        Fetched { values: Vec::new(), aborted: Vec::new(), last_stable_offset: -1, high_watermark: -1, batches: Vec::new() };
    // As a consumer does: fetch again from after the last batch until nothing comes (a
    // fetch returns batches of one segment at most).
    let mut offset = 0;
    loop {
        let request = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(0)
            .with_min_bytes(0)
            .with_max_bytes(1 << 20)
            .with_isolation_level(isolation_level)
            .with_topics(vec![FetchTopic::default().with_topic(topic_name(TOPIC)).with_partitions(vec![
                FetchPartition::default().with_partition(partition).with_fetch_offset(offset).with_partition_max_bytes(1 << 20),
            ])]);
        let response: FetchResponse = client.call(ApiKey::Fetch, 11, &request).await.unwrap();
        let p = &response.responses[0].partitions[0];
        assert_eq!(p.error_code, 0);
        f.last_stable_offset = p.last_stable_offset;
        f.high_watermark = p.high_watermark;
        // Each fetch names the aborts overlapping what it returns: a transaction spanning
        // two fetches is named by both, as Kafka does.
        for a in p.aborted_transactions.iter().flatten() {
            if !f.aborted.contains(&(a.producer_id.0, a.first_offset)) {
                f.aborted.push((a.producer_id.0, a.first_offset));
            }
        }
        let records = p.records.as_deref().unwrap_or_default();
        if records.is_empty() {
            return f;
        }
        for b in fjord_record::batch::batches(records) {
            let (header, bytes) = b.unwrap();
            offset = header.next_offset();
            if header.is_control() {
                continue;
            }
            let values: Vec<String> = fjord_record::Records::new(&bytes[fjord_record::BATCH_OVERHEAD..], 0)
                .map(|r| String::from_utf8(r.unwrap().value.unwrap().to_vec()).unwrap())
                .collect();
            f.values.extend(values.iter().cloned());
            f.batches.push((header.producer_id, header.base_offset, values));
        }
    }
}

/// What a read_committed client keeps of a fetch: the records of batches whose producer
/// has an aborted transaction that started at or before them (until its marker).
fn committed(f: &Fetched) -> Vec<String> {
    f.batches
        .iter()
        .filter(|(pid, offset, _)| !f.aborted.iter().any(|(a, first)| a == pid && first <= offset))
        .flat_map(|(_, _, v)| v.clone())
        .collect()
}

/// ListOffsets (v5) latest at an isolation level: (error, offset).
async fn latest(client: &mut RawClient, partition: i32, isolation_level: i8) -> (i16, i64) {
    client.list_offset_in(TOPIC, partition, LATEST, isolation_level).await
}

fn expect(f: &Fetched, values: &[&str], aborted: &[(i64, i64)], lso: i64) {
    assert_eq!(committed(f), values);
    assert_eq!(f.aborted, aborted);
    assert_eq!((f.last_stable_offset, f.high_watermark), (lso, lso));
}

/// The state once producer 10 committed in partition 0, aborted in 1, and 11 committed.
async fn check_decided(client: &mut RawClient) {
    expect(&fetch(client, 0, 1).await, &["a0", "t10-0", "t10-1", "t10-x0", "b0"], &[], 6);
    expect(&fetch(client, 1, 1).await, &["u11-0"], &[(10, 0)], 5);
    assert_eq!(latest(client, 0, 1).await, (0, 6));
    assert_eq!(latest(client, 1, 1).await, (0, 5));
    // read_uncommitted: the aborted records too, and no aborted list.
    let f = fetch(client, 1, 0).await;
    assert_eq!((f.values, f.aborted, f.last_stable_offset), (vec!["u10-0".into(), "u10-1".into(), "u11-0".into()], vec![], 5));
}

#[tokio::test]
async fn markers_end_transactions_and_read_committed_sees_only_committed_data_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let broker = start(data.clone(), 2).await;
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    // Partition 0: plain "a", producer 10's transaction (2 batches), plain "b".
    // Partition 1: producer 10's transaction, producer 11's transaction after it.
    assert_eq!(client.produce(7, &txn_produce(0, batch(-1, -1, 1, false, "a"))).await, (0, 0));
    assert_eq!(client.produce(7, &txn_produce(0, batch(10, 0, 2, true, "t10-"))).await, (0, 1));
    assert_eq!(client.produce(7, &txn_produce(0, batch(10, 2, 1, true, "t10-x"))).await, (0, 3));
    assert_eq!(client.produce(7, &txn_produce(0, batch(-1, -1, 1, false, "b"))).await, (0, 4));
    assert_eq!(client.produce(7, &txn_produce(1, batch(10, 0, 2, true, "u10-"))).await, (0, 0));
    assert_eq!(client.produce(7, &txn_produce(1, batch(11, 0, 1, true, "u11-"))).await, (0, 2));
    // Inside its transaction producer 10 may not write a plain batch.
    assert_eq!(client.produce(7, &txn_produce(1, batch(10, 2, 1, false, "x"))).await.0, INVALID_TXN_STATE);

    // Undecided: read_committed stops at the first open transaction.
    let f = fetch(&mut client, 0, 1).await;
    assert_eq!((f.values.clone(), f.last_stable_offset, f.high_watermark), (vec!["a0".to_owned()], 1, 5));
    assert!(f.aborted.is_empty());
    let f = fetch(&mut client, 0, 0).await;
    assert_eq!((f.values.len(), f.last_stable_offset), (5, 1), "read_uncommitted sees everything, and the LSO");
    assert_eq!(latest(&mut client, 0, 1).await, (0, 1));
    assert_eq!(latest(&mut client, 0, 0).await, (0, 5));
    assert_eq!(fetch(&mut client, 1, 1).await.values, Vec::<String>::new());

    // Producer 10 commits in partition 0 and aborts in partition 1 (a coordinator never
    // does both; the partitions cannot tell), producer 11 commits.
    assert_eq!(marker(&mut client, 10, 0, true, 3, &[0]).await, vec![0]);
    assert_eq!(marker(&mut client, 10, 0, false, 3, &[1]).await, vec![0]);
    assert_eq!(marker(&mut client, 11, 0, true, 3, &[1]).await, vec![0]);
    check_decided(&mut client).await;

    // Bad markers: Kafka's codes, the logs untouched.
    assert_eq!(marker(&mut client, 10, -1, true, 3, &[0]).await, vec![INVALID_PRODUCER_EPOCH]);
    assert_eq!(marker(&mut client, 10, 0, true, 2, &[0, 1]).await, vec![TRANSACTION_COORDINATOR_FENCED; 2]);
    assert_eq!(marker(&mut client, 10, 0, true, 3, &[7]).await, vec![UNKNOWN_TOPIC_OR_PARTITION]);
    assert_eq!(marker_on(&mut client, "absent", 10, 0, true, 3, &[0]).await, vec![UNKNOWN_TOPIC_OR_PARTITION]);
    assert_eq!(client.latest_offset(TOPIC).await, (0, 6));
    // A client's own control batch is still refused.
    let forged = Bytes::from(fjord_record::control::end_txn_marker(10, 0, 3, false, 0));
    assert_eq!(client.produce(7, &txn_produce(0, forged)).await.0, INVALID_RECORD);
    check_decided(&mut client).await;

    // A transaction left open survives the restart with the LSO at its first offset.
    assert_eq!(client.produce(7, &txn_produce(0, batch(12, 0, 1, true, "open"))).await, (0, 6));
    broker.stop().await.unwrap();
    let broker = start(data.clone(), 2).await;
    let mut client = RawClient::connect(broker.addr).await.unwrap();
    assert_eq!(latest(&mut client, 0, 1).await, (0, 6));
    let f = fetch(&mut client, 0, 1).await;
    assert_eq!((f.values.len(), f.last_stable_offset, f.high_watermark), (5, 6, 7));
    assert_eq!(marker(&mut client, 12, 0, false, 3, &[0]).await, vec![0]);
    let f = fetch(&mut client, 0, 1).await;
    assert_eq!(
        (committed(&f), f.aborted.clone(), f.last_stable_offset),
        (vec!["a0", "t10-0", "t10-1", "t10-x0", "b0"].into_iter().map(String::from).collect::<Vec<_>>(), vec![(12, 6)], 8)
    );
    expect(&fetch(&mut client, 1, 1).await, &["u11-0"], &[(10, 0)], 5);
    broker.stop().await.unwrap();
}
