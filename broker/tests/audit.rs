//! The audit's broker tier (`audit.enable`) on two in-process brokers over a real
//! ZooKeeper: the leader counts what it appends for producers, once per record, whatever
//! the number of replicas; a retry the idempotent-producer check drops as a duplicate is
//! not counted; and the counts reach `_audit` at a graceful shutdown (the periodic
//! publish is an hour away, so the shutdown flushes are the only way they can get there):
//! in a cluster before the broker hands its leaderships over, standalone at the end.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use bytes::Bytes;
use common::RawClient;
use fjord_audit::{AuditRecord, AUDIT_TOPIC, BROKER_TIER, CREATED_HEADER};
use fjord_client::{
    Admin, ClientConfig, Consumer, ConsumerConfig, NewTopic, OffsetReset, Producer, ProducerConfig, ProducerRecord, SeekTo,
    TopicPartition,
};
use fjord_record::BatchBuilder;
use fjord_testkit::Cluster;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

const WINDOW_MS: i64 = 1000;

/// Produces `records` (one batch) to `events`-0 over the raw protocol, acks=all.
async fn raw_produce(client: &mut RawClient, records: Bytes) -> (i16, i64) {
    let request =
        ProduceRequest::default().with_acks(-1).with_timeout_ms(10_000).with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_static_str("events")))
            .with_partition_data(vec![PartitionProduceData::default().with_index(0).with_records(Some(records))])]);
    let response: ProduceResponse = client.call(ApiKey::Produce, 9, &request).await.unwrap();
    let p = &response.responses[0].partition_responses[0];
    (p.error_code, p.base_offset)
}

/// Every audit record of `_audit` (the whole topic, read to its end).
async fn audit_records(bootstrap: &str) -> Vec<AuditRecord> {
    let client = ClientConfig::new(bootstrap);
    let admin = Admin::connect(client.clone()).await.unwrap();
    let end = admin.list_offsets(&[(AUDIT_TOPIC.into(), 0, fjord_client::OffsetSpec::Latest)]).await.unwrap()[0];
    let mut consumer =
        Consumer::connect(ConsumerConfig { client, auto_offset_reset: OffsetReset::Earliest, ..ConsumerConfig::default() })
            .await
            .unwrap();
    let tp = TopicPartition::new(AUDIT_TOPIC, 0);
    consumer.assign([tp.clone()]).await.unwrap();
    consumer.seek(&tp, SeekTo::Beginning).unwrap();
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while consumer.position(&tp).await.unwrap() < end {
        assert!(tokio::time::Instant::now() < deadline, "read {} audit records of {end}", out.len());
        for r in consumer.poll(Duration::from_millis(200)).await.unwrap() {
            out.push(AuditRecord::decode(r.value.as_deref().unwrap_or_default()).expect("well-formed audit record"));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_counts_each_append_once_and_flushes_at_graceful_shutdown() {
    common::init_tracing();
    let mut cluster = Cluster::builder()
        .brokers(2)
        .config("audit.enable", true)
        .config("audit.interval.ms", 3_600_000)
        .config("audit.window.ms", WINDOW_MS)
        .config("audit.cluster", "online")
        .config("default.replication.factor", 2)
        .config("controlled.shutdown.timeout.ms", 3000)
        .start()
        .await
        .unwrap();
    let client = ClientConfig::new(&cluster.bootstrap());
    let admin = Admin::connect(client.clone()).await.unwrap();
    admin.create_topics(&[NewTopic::new("events", 1)]).await.unwrap();
    cluster.wait_fully_replicated("events", Duration::from_secs(20)).await.unwrap();
    let leader = cluster.wait_for_leader("events", 0, Duration::from_secs(20)).await.unwrap();
    let follower = *cluster.ids().iter().find(|id| **id != leader).unwrap();

    // 100 records over two windows by their creation header, acks=all: once each send is
    // acknowledged the follower has appended it too (a replica fetch).
    let producer = Producer::connect(ProducerConfig { client: client.clone(), ..ProducerConfig::default() }).await.unwrap();
    let mut deliveries = Vec::new();
    for i in 0..100i64 {
        let created = 5 * WINDOW_MS + (i % 2) * WINDOW_MS;
        let record = ProducerRecord::new("events", Bytes::from(format!("e{i}")))
            .header(CREATED_HEADER, Some(Bytes::from(created.to_string())));
        deliveries.push(producer.send(record).await.unwrap());
    }
    for d in deliveries {
        d.await.unwrap();
    }
    producer.close().await;

    // An idempotent batch of 5 sent twice: the second append is the broker's duplicate
    // answer (the original offset), nothing appended, nothing counted.
    let mut raw = RawClient::connect(cluster.addr(leader).parse().unwrap()).await.unwrap();
    let init: InitProducerIdResponse = raw
        .call(
            ApiKey::InitProducerId,
            4,
            &InitProducerIdRequest::default()
                .with_transactional_id(None)
                .with_transaction_timeout_ms(60_000)
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1),
        )
        .await
        .unwrap();
    assert_eq!(init.error_code, 0);
    let mut b = BatchBuilder::new(9 * WINDOW_MS).producer(init.producer_id.0, init.producer_epoch, 0);
    for v in 0..5 {
        b.append(9 * WINDOW_MS, None, Some(format!("idem{v}").as_bytes()), &[]);
    }
    let batch = b.build();
    let first = raw_produce(&mut raw, batch.clone()).await;
    let retry = raw_produce(&mut raw, batch).await;
    assert_eq!((first, retry), ((0, 100), (0, 100)), "the retry is answered with the original offset");
    let log_end = admin.list_offsets(&[("events".into(), 0, fjord_client::OffsetSpec::Latest)]).await.unwrap()[0];
    assert_eq!(log_end, 105);
    cluster.wait_fully_replicated("events", Duration::from_secs(20)).await.unwrap();

    // Nothing has been published yet (the interval is an hour): stop the follower, then the
    // leader; each flushes at its shutdown. Then bring the leader back to read `_audit`.
    cluster.wait_fully_replicated(AUDIT_TOPIC, Duration::from_secs(20)).await.unwrap();
    let before = audit_records(&cluster.bootstrap()).await;
    assert!(before.iter().all(|r| r.tier != BROKER_TIER), "published before the shutdown: {before:?}");
    cluster.stop(follower).await.unwrap();
    cluster.stop(leader).await.unwrap();
    cluster.start(leader).await.unwrap();

    let records: Vec<AuditRecord> =
        audit_records(&cluster.addr(leader)).await.into_iter().filter(|r| r.tier == BROKER_TIER).collect();
    let mut per_window = std::collections::BTreeMap::new();
    for r in &records {
        assert_eq!((r.topic.as_str(), r.cluster.as_str(), r.window_ms), ("events", "online", WINDOW_MS), "{r:?}");
        *per_window.entry(r.window_start_ms).or_insert(0) += r.count;
    }
    assert_eq!(
        per_window.into_iter().collect::<Vec<_>>(),
        [(5 * WINDOW_MS, 50), (6 * WINDOW_MS, 50), (9 * WINDOW_MS, 5)],
        "{records:?}"
    );
    let hosts: BTreeSet<&str> = records.iter().map(|r| r.host.as_str()).collect();
    let leader_host = format!("{leader}/{}", cluster.addr(leader));
    assert_eq!(hosts, BTreeSet::from([leader_host.as_str()]), "only the leader counts; the follower's replica fetches do not");
}

/// A standalone broker (no handover) publishes its counts with the publisher's final
/// flush at a graceful shutdown; after a restart on the same data they are in `_audit`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_broker_flushes_its_counts_at_graceful_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let configure = |c: &mut fjord_broker::BrokerConfig| {
        c.audit = fjord_broker::AuditConfig {
            enable: true,
            interval: Duration::from_secs(3600),
            window: Duration::from_millis(WINDOW_MS as u64),
            ..Default::default()
        };
    };
    let broker = common::TestBroker::start_in(dir.path().join("data"), configure).await.unwrap();
    let client = ClientConfig::new(&broker.bootstrap());
    let producer = Producer::connect(ProducerConfig { client, ..ProducerConfig::default() }).await.unwrap();
    for i in 0..30i64 {
        let record = ProducerRecord::new("events", Bytes::from(format!("e{i}"))).timestamp(3 * WINDOW_MS);
        producer.send(record).await.unwrap().await.unwrap();
    }
    producer.close().await;
    broker.stop().await.unwrap();

    let broker = common::TestBroker::start_in(dir.path().join("data"), configure).await.unwrap();
    let records: Vec<AuditRecord> =
        audit_records(&broker.bootstrap()).await.into_iter().filter(|r| r.tier == BROKER_TIER).collect();
    let counted: Vec<_> = records.iter().map(|r| (r.topic.as_str(), r.window_start_ms, r.count)).collect();
    assert_eq!(counted, [("events", 3 * WINDOW_MS, 30)]);
    broker.stop().await.unwrap();
}

/// A broker whose only listener is SASL_SSL with authorization on: the broker tier
/// publishes to `_audit` over it as the broker's own inter-broker identity (its
/// truststore as CA), so auditing needs no plaintext listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_tier_publishes_over_sasl_ssl_as_the_broker() {
    let certs_dir = tempfile::tempdir().unwrap();
    let certs = common::Certs::create(certs_dir.path()).unwrap();
    let mut broker = fjord_testkit::StandaloneBroker::builder();
    for (key, value) in [
        ("listeners", "SASL_SSL://127.0.0.1:0"),
        ("ssl.keystore.location", &certs.path("server-keystore.pem")),
        ("ssl.truststore.location", &certs.path("ca.pem")),
        ("authorizer.enable", "true"),
        ("super.users", "User:broker"),
        ("inter.broker.sasl.username", "broker"),
        ("inter.broker.sasl.password", "broker-secret"),
        ("audit.enable", "true"),
        ("audit.interval.ms", "200"),
        ("audit.window.ms", &WINDOW_MS.to_string()),
    ] {
        broker = broker.set(key, value);
    }
    let broker =
        broker.user_with("broker", "broker-secret", &[fjord_auth::ScramMechanism::Sha256]).audit_tier().start().await.unwrap();
    let addr = broker.listener("SASL_SSL");

    let mut client = ClientConfig::new(&format!("localhost:{}", addr.port()));
    for (key, value) in [
        ("security.protocol", "SASL_SSL"),
        ("sasl.username", "broker"),
        ("sasl.password", "broker-secret"),
        ("ssl.ca.location", &certs.path("ca.pem")),
    ] {
        client.set(key, value).unwrap();
    }
    let producer = Producer::connect(ProducerConfig { client: client.clone(), ..ProducerConfig::default() }).await.unwrap();
    for i in 0..5i64 {
        let record = ProducerRecord::new("events", Bytes::from(format!("e{i}"))).timestamp(3 * WINDOW_MS);
        producer.send(record).await.unwrap().await.unwrap();
    }
    producer.close().await;
    // The periodic publish (every 200 ms) must get the count out while the broker runs.
    let admin = Admin::connect(client.clone()).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let end = admin.list_offsets(&[(AUDIT_TOPIC.into(), 0, fjord_client::OffsetSpec::Latest)]).await;
        if matches!(end.as_deref(), Ok([n]) if *n > 0) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no audit record published over SASL_SSL: {end:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut consumer = Consumer::connect(ConsumerConfig { client, ..ConsumerConfig::default() }).await.unwrap();
    let tp = TopicPartition::new(AUDIT_TOPIC, 0);
    consumer.assign([tp.clone()]).await.unwrap();
    consumer.seek(&tp, SeekTo::Beginning).unwrap();
    let mut counted = 0;
    while counted < 5 {
        assert!(tokio::time::Instant::now() < deadline, "{counted} of 5 records counted in _audit");
        for r in consumer.poll(Duration::from_millis(200)).await.unwrap() {
            let record = AuditRecord::decode(r.value.as_deref().unwrap_or_default()).unwrap();
            if record.tier == BROKER_TIER && record.topic == "events" {
                counted += record.count;
            }
        }
    }
    assert_eq!(counted, 5);
    broker.stop().await.unwrap();
}
