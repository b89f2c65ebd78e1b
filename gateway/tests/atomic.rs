//! Atomic publishes (`?atomic=true`, gRPC `atomic`) on real brokers: every event of a
//! request visible to read_committed consumers, or none of them, across partitions. What
//! the topic holds is read back with fjord-client consumers (read_committed and
//! read_uncommitted), not through the gateway.

mod support;

use std::time::{Duration, Instant};

use fjord_client::{
    Admin, ClientConfig, Consumer, ConsumerConfig, IsolationLevel, NewTopic, OffsetReset, Producer, ProducerConfig,
    ProducerRecord, SeekTo, TopicPartition,
};
use fjord_gateway::GatewayConfig;
use fjord_proto::v1::publisher_client::PublisherClient;
use fjord_proto::v1::{Acks, Event, PublishRequest};
use fjord_testkit::Cluster;
use serde_json::{json, Value as Json};
use support::{bind, System};
use tokio_util::sync::CancellationToken;

const TOPIC: &str = "payments";
const V2_JSON: &str = "application/vnd.kafka.json.v2+json";

/// A v2 body with one record per (value, partition).
fn records(values: &[(&str, i32)]) -> String {
    json!({ "records": values.iter().map(|(v, p)| json!({ "value": v, "partition": p })).collect::<Vec<_>>() }).to_string()
}

/// POSTs a v2 body to `/topics/{TOPIC}{query}`: status and JSON answer.
async fn post_v2(base: &str, query: &str, body: String) -> (u16, Json) {
    let r = reqwest::Client::new()
        .post(format!("{base}/topics/{TOPIC}{query}"))
        .header("content-type", V2_JSON)
        .body(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

/// The values of `partitions` of [`TOPIC`] from the beginning, as a consumer with the
/// isolation level given sees them: reads until `want` values arrived or `wait` passed,
/// sorted. Values are the JSON strings the v2 records carried, unquoted.
async fn read(client: ClientConfig, partitions: &[i32], committed: bool, want: usize, wait: Duration) -> Vec<String> {
    let isolation_level = if committed { IsolationLevel::ReadCommitted } else { IsolationLevel::ReadUncommitted };
    let config =
        ConsumerConfig { client, isolation_level, auto_offset_reset: OffsetReset::Earliest, ..ConsumerConfig::default() };
    let mut consumer = Consumer::connect(config).await.unwrap();
    let tps: Vec<_> = partitions.iter().map(|p| TopicPartition::new(TOPIC, *p)).collect();
    consumer.assign(tps.clone()).await.unwrap();
    for tp in &tps {
        consumer.seek(tp, SeekTo::Beginning).unwrap();
    }
    let deadline = Instant::now() + wait;
    let mut values = Vec::new();
    while values.len() < want && Instant::now() < deadline {
        for r in consumer.poll(Duration::from_millis(200)).await.unwrap() {
            let raw = r.value.expect("a value");
            values.push(serde_json::from_slice::<String>(&raw).unwrap_or_else(|_| String::from_utf8_lossy(&raw).into_owned()));
        }
    }
    values.sort();
    values
}

fn sorted(values: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = values.iter().map(|s| s.to_string()).collect();
    v.sort();
    v
}

/// One broker: an atomic request across 3 partitions is visible to read_committed, a
/// transaction a previous process of the gateway left open is aborted when the gateway
/// takes its transactional id (fencing on restart), and bad flags are refused with
/// nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn atomic_publishes_commit_across_partitions_and_fence_what_a_previous_gateway_left_open() {
    let sys = System::start().await;
    sys.create_topic(TOPIC, 3).await;
    let client = ClientConfig::new(&sys.broker);

    // A previous process of this gateway (same host, so same transactional id) died with a
    // transaction open: its record sits in partition 0, undecided.
    let zombie = Producer::connect(ProducerConfig {
        client: client.clone(),
        transactional_id: Some("fjord-gateway-gw-it".into()),
        ..ProducerConfig::default()
    })
    .await
    .unwrap();
    zombie.begin_transaction().unwrap();
    zombie.send(ProducerRecord::new(TOPIC, "\"orphan\"").partition(0)).await.unwrap().await.unwrap();

    let (status, answer) = post_v2(&sys.http, "?atomic=true", records(&[("a0", 0), ("a1", 1), ("a2", 2), ("b0", 0)])).await;
    assert_eq!(status, 200, "{answer}");
    let partitions: Vec<i64> = answer["offsets"].as_array().unwrap().iter().map(|o| o["partition"].as_i64().unwrap()).collect();
    assert_eq!(partitions, [0, 1, 2, 0]);
    // read_committed sees the request whole, and not the orphan: the gateway's
    // InitProducerId fenced the zombie and aborted its transaction (else partition 0's
    // last stable offset would stay below the request's events until the timeout).
    let committed = read(client.clone(), &[0, 1, 2], true, 4, Duration::from_secs(15)).await;
    assert_eq!(committed, sorted(&["a0", "a1", "a2", "b0"]));
    let uncommitted = read(client.clone(), &[0, 1, 2], false, 5, Duration::from_secs(15)).await;
    assert!(uncommitted.contains(&"orphan".to_string()), "the orphan is in the log, just never committed: {uncommitted:?}");
    let late = zombie.commit_transaction().await;
    assert!(late.is_err(), "the fenced zombie cannot commit its transaction");

    // NDJSON, keyed across partitions, atomically.
    let body: String = (0..30).map(|i| format!("{{\"user\":\"u{i}\",\"n\":{i}}}\n")).collect();
    let r = reqwest::Client::new()
        .post(format!("{}/v1/events/{TOPIC}?key=user&atomic=true", sys.http))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let doc: Json = r.json().await.unwrap();
    assert_eq!(doc["count"], 30);
    assert!(doc["partitions"].as_array().unwrap().len() > 1, "keys spread the events over partitions: {doc}");

    // gRPC, with the atomic field.
    let mut publisher = PublisherClient::connect(sys.grpc.clone()).await.unwrap();
    let request = |acks: Acks| PublishRequest {
        topic: TOPIC.into(),
        events: (0..3)
            .map(|p| Event { value: Some(format!("\"g{p}\"").into()), partition: Some(p), ..Default::default() })
            .collect(),
        acks: acks as i32,
        atomic: true,
        ..Default::default()
    };
    let answer = publisher.publish(request(Acks::Unspecified)).await.unwrap().into_inner();
    assert_eq!(answer.offsets.iter().map(|o| o.partition).collect::<Vec<_>>(), [0, 1, 2]);
    let committed = read(client.clone(), &[0, 1, 2], true, 37, Duration::from_secs(15)).await;
    assert_eq!(committed.len(), 37, "4 + 30 + 3 committed events: {committed:?}");
    assert!(!committed.contains(&"orphan".to_string()));

    // Bad flags: 400 / INVALID_ARGUMENT, and nothing written.
    let before = sys.end_offsets(TOPIC, 3).await;
    let one = records(&[("x", 0)]);
    for query in ["?atomic=yes", "?atomic=TRUE", "?atomic=", "?atomic=true&acks=1", "?atomic=true&acks=0"] {
        let (status, doc) = post_v2(&sys.http, query, one.clone()).await;
        assert_eq!(status, 400, "{query}: {doc}");
        assert!(doc["message"].as_str().unwrap().contains("atomic"), "{query}: {doc}");
    }
    let r = reqwest::Client::new()
        .post(format!("{}/v1/events/{TOPIC}?atomic=true&on_invalid=dead_letter", sys.http))
        .body("{\"a\":1}\n")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400, "atomic and dead-letter mode exclude each other");
    let status = publisher.publish(request(Acks::Leader)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    // An unknown partition fails before the transaction begins: 404, nothing written.
    let (status, doc) = post_v2(&sys.http, "?atomic=true", records(&[("y", 0), ("y", 7)])).await;
    assert_eq!(status, 404, "{doc}");
    assert_eq!(sys.end_offsets(TOPIC, 3).await, before, "none of the refused requests wrote anything");
}

/// An atomic publish sends its events as soon as they are queued: no other request can
/// add to its batches, so waiting `linger` for them would only delay it. With a linger
/// longer than the broker timeout, the request still commits, well before the linger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_atomic_publish_does_not_wait_for_the_linger() {
    let sys = System::start_with(|_| {}, |g| g.linger = Duration::from_secs(60)).await;
    sys.create_topic(TOPIC, 3).await;
    let started = Instant::now();
    let (status, answer) = post_v2(&sys.http, "?atomic=true", records(&[("l0", 0), ("l1", 1), ("l2", 2)])).await;
    assert_eq!(status, 200, "{answer}");
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    let committed = read(ClientConfig::new(&sys.broker), &[0, 1, 2], true, 3, Duration::from_secs(15)).await;
    assert_eq!(committed, sorted(&["l0", "l1", "l2"]));
}

/// Three brokers, the topic's partitions on one broker each: a partition leader (not the
/// transaction coordinator) is down when an atomic request writes to it after writing to
/// the live ones. The request fails whole (503), what it wrote to the live partitions is
/// in their logs but never visible to read_committed, and once the broker is back atomic
/// publishes work again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_leader_down_midway_leaves_nothing_of_the_request_visible_to_read_committed() {
    // Fewer transaction state partitions than Kafka's 50: created on the first atomic
    // publish, they are what it waits for.
    let mut cluster = Cluster::builder().brokers(3).config("transaction.state.log.num.partitions", 3).start().await.unwrap();
    let react = Duration::from_secs(30);
    let admin = Admin::connect(cluster.client_config()).await.unwrap();
    let mut topic = NewTopic::new(TOPIC, 3);
    topic.replication_factor = 1;
    admin.create_topics(&[topic]).await.unwrap();
    for p in 0..3 {
        cluster.wait_for_leader(TOPIC, p, react).await.unwrap();
    }
    let shutdown = CancellationToken::new();
    let (http, http_addr) = bind().await;
    let (grpc, _) = bind().await;
    let config = GatewayConfig {
        host_name: Some("gw-atomic".into()),
        // How long the request waits for the downed partition: long enough for the live
        // partitions' events to be written on a loaded machine.
        broker_timeout: Duration::from_secs(8),
        // Each partition's events leave as soon as they are appended: those of the live
        // partitions are on their way before the request reaches the downed one.
        linger: Duration::ZERO,
        ..GatewayConfig::new(cluster.bootstrap())
    };
    tokio::spawn(fjord_gateway::run(config, http, grpc, shutdown.clone()));
    let base = format!("http://{http_addr}");

    // The first atomic publish creates the transaction state topic and may answer 503
    // while it is not ready; a 503 there committed nothing, so retrying is safe.
    let deadline = Instant::now() + react;
    loop {
        let (status, answer) = post_v2(&base, "?atomic=true", records(&[("first-0", 0), ("first-1", 1), ("first-2", 2)])).await;
        if status == 200 {
            break;
        }
        assert!(status == 503 && Instant::now() < deadline, "{status} {answer}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Stop the leader of a partition (`down`) that is not the transaction coordinator:
    // the coordinator's own failover would spend the request's time (one loaded run
    // aborted before the live partitions were written). The partitions it does not lead
    // stay up.
    let coordinator = cluster.wait_for_txn_coordinator("fjord-gateway-gw-atomic", 3, react).await.unwrap();
    let mut leaders = Vec::new();
    for p in 0..3 {
        leaders.push(cluster.leader(TOPIC, p).await.unwrap().unwrap());
    }
    let down = (0..3).rev().find(|&p| leaders[p as usize] != coordinator).expect("a partition the coordinator does not lead");
    let victim = leaders[down as usize];
    let live: Vec<i32> = (0..3).filter(|&p| leaders[p as usize] != victim).collect();
    assert!(!live.is_empty(), "the partitions were all placed on broker {victim}");
    cluster.stop(victim).await.unwrap();
    let client = ClientConfig::new(&cluster.addr(coordinator));

    // Midway: the live partitions' events come first, then the downed partition's.
    let mut midway: Vec<(String, i32)> = live.iter().map(|p| (format!("mid-{p}"), *p)).collect();
    midway.push((format!("mid-{down}"), down));
    let body = records(&midway.iter().map(|(v, p)| (v.as_str(), *p)).collect::<Vec<_>>());
    let (status, doc) = post_v2(&base, "?atomic=true", body).await;
    assert_eq!(status, 503, "{doc}");
    assert!(doc["message"].as_str().unwrap().contains("aborted"), "{doc}");

    // The live partitions' logs hold the request's events (it got that far) ...
    let first: Vec<String> = live.iter().map(|p| format!("first-{p}")).collect();
    let mids: Vec<String> = live.iter().map(|p| format!("mid-{p}")).collect();
    let uncommitted = read(client.clone(), &live, false, first.len() + mids.len(), react).await;
    for m in &mids {
        assert!(uncommitted.contains(m), "{m} was written to its partition: {uncommitted:?} ({doc})");
    }
    // ... but read_committed never sees them. A plain event written after the abort is
    // seen, so the last stable offset moved past the aborted events: they are not just
    // pending.
    let r = reqwest::Client::new()
        .post(format!("{base}/topics/{TOPIC}"))
        .header("content-type", V2_JSON)
        .body(records(&[("after", live[0])]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let committed = read(client.clone(), &live, true, first.len() + 1, react).await;
    let mut expected = first.clone();
    expected.push("after".into());
    expected.sort();
    assert_eq!(committed, expected, "read_committed sees nothing of the aborted request");

    // The broker comes back: the abort completes on the downed partition too, and atomic
    // publishes work again (the first tries may meet the abort still completing).
    cluster.start(victim).await.unwrap();
    cluster.wait_for_leader(TOPIC, down, react).await.unwrap();
    let last = [("last-a".to_string(), live[0]), ("last-b".to_string(), down)];
    let deadline = Instant::now() + react;
    loop {
        let (status, doc) =
            post_v2(&base, "?atomic=true", records(&last.iter().map(|(v, p)| (v.as_str(), *p)).collect::<Vec<_>>())).await;
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "no atomic publish after the broker came back: {status} {doc}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let client = cluster.client_config();
    let all = read(client, &[0, 1, 2], true, 6, react).await;
    assert_eq!(all, sorted(&["after", "first-0", "first-1", "first-2", "last-a", "last-b"]), "mid-* never visible");
    shutdown.cancel();
}
