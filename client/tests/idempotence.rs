//! Lost acknowledgements: a proxy between the producer and an in-process broker lets
//! some produce requests reach the broker but closes the connection instead of
//! returning their answer. The producer retries those batches; with idempotence the log
//! holds every record exactly once and in order, without it the retries duplicate.
//! And a leader change in the middle of an idempotent stream (three brokers on a real
//! ZooKeeper): the new leader knows the producer from the batches it replicated.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fjord_client::{Admin, ClientConfig, NewTopic, Producer, ProducerConfig, ProducerRecord};
use fjord_coord::registry::{read_json, to_json, PartitionState, TopicAssignment};
use fjord_coord::{create_all, paths, CreateMode};
use fjord_testkit::{numbered, read_values, stream_across, Cluster, StandaloneBroker};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const PRODUCE: i16 = 0;

async fn read_frame(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let len = stream.read_i32().await?;
    let mut buf = vec![0; usize::try_from(len).map_err(|_| std::io::ErrorKind::InvalidData)?];
    stream.read_exact(&mut buf).await?;
    Ok(buf)
}

async fn write_frame(stream: &mut TcpStream, frame: &[u8]) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(frame.len() + 4);
    buf.extend_from_slice(&(frame.len() as i32).to_be_bytes());
    buf.extend_from_slice(frame);
    stream.write_all(&buf).await
}

/// Relays Kafka frames to `upstream`, one request at a time per connection. Every
/// `drop_every`-th Produce request is forwarded and answered by the broker, but the
/// proxy then closes the client's connection instead of passing the answer on.
async fn lossy_proxy(listener: TcpListener, upstream: SocketAddr, drop_every: usize, dropped: Arc<AtomicUsize>) {
    let produced = Arc::new(AtomicUsize::new(0));
    loop {
        let Ok((mut client, _)) = listener.accept().await else {
            return;
        };
        let (produced, dropped) = (produced.clone(), dropped.clone());
        tokio::spawn(async move {
            let Ok(mut server) = TcpStream::connect(upstream).await else {
                return;
            };
            loop {
                let Ok(request) = read_frame(&mut client).await else {
                    return;
                };
                let api_key = i16::from_be_bytes([request[0], request[1]]);
                if write_frame(&mut server, &request).await.is_err() {
                    return;
                }
                let Ok(response) = read_frame(&mut server).await else {
                    return;
                };
                if api_key == PRODUCE && (produced.fetch_add(1, Ordering::SeqCst) + 1) % drop_every == 0 {
                    dropped.fetch_add(1, Ordering::SeqCst);
                    return; // the broker appended the batch; the client never hears of it
                }
                if write_frame(&mut client, &response).await.is_err() {
                    return;
                }
            }
        });
    }
}

fn client(addr: &str) -> ClientConfig {
    ClientConfig { connect_timeout: Duration::from_secs(5), retry_backoff: Duration::from_millis(20), ..ClientConfig::new(addr) }
}

/// Produces `n` records (`m0`, `m1`, ...) to a 2-partition topic through the lossy
/// proxy, every future succeeding; returns each partition's values in log order and how
/// many acknowledgements were lost.
async fn produce_through_lost_acks(idempotent: bool, n: usize) -> (Vec<Vec<String>>, usize) {
    let proxy = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_addr = proxy.local_addr().unwrap().to_string();
    let advertised = proxy_addr.clone();
    let broker = StandaloneBroker::start_with(|c| c.advertised_listener = Some(advertised)).await.unwrap();
    let broker_addr: SocketAddr = broker.addr.parse().unwrap();
    let dropped = Arc::new(AtomicUsize::new(0));
    let proxy_task = tokio::spawn(lossy_proxy(proxy, broker_addr, 4, dropped.clone()));

    Admin::connect(client(&proxy_addr)).await.unwrap().create_topics(&[NewTopic::new("lost-acks", 2)]).await.unwrap();
    let config = ProducerConfig {
        client: client(&proxy_addr),
        enable_idempotence: Some(idempotent),
        batch_size: 300,
        linger: Duration::from_millis(1),
        ..ProducerConfig::default()
    };
    let producer = Producer::connect(config).await.unwrap();
    let mut futures = Vec::with_capacity(n);
    for i in 0..n {
        let record = ProducerRecord::new("lost-acks", Bytes::from(format!("m{i}"))).partition((i % 2) as i32);
        futures.push(producer.send(record).await.unwrap());
    }
    for f in futures {
        f.await.expect("every record is acknowledged in the end");
    }
    producer.close().await;

    let mut per_partition = Vec::new();
    for partition in 0..2 {
        per_partition.push(read_values(&client(&proxy_addr), "lost-acks", partition).await.unwrap());
    }
    proxy_task.abort();
    drop(broker);
    (per_partition, dropped.load(Ordering::SeqCst))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_idempotence_lost_acknowledgements_leave_every_record_exactly_once_in_order() {
    let n = 4000;
    let (partitions, dropped) = produce_through_lost_acks(true, n).await;
    assert!(dropped >= 10, "the proxy dropped only {dropped} acknowledgements");
    for (p, values) in partitions.iter().enumerate() {
        let expected: Vec<String> = (p..n).step_by(2).map(|i| format!("m{i}")).collect();
        assert_eq!(values.len(), expected.len(), "partition {p}: {} records for {} sent", values.len(), expected.len());
        assert_eq!(values, &expected, "partition {p}: every record once, in send order");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_idempotence_lost_acknowledgements_duplicate_records() {
    let n = 4000;
    let (partitions, dropped) = produce_through_lost_acks(false, n).await;
    assert!(dropped >= 10, "the proxy dropped only {dropped} acknowledgements");
    let stored: usize = partitions.iter().map(Vec::len).sum();
    let distinct: std::collections::HashSet<&String> = partitions.iter().flatten().collect();
    assert_eq!(distinct.len(), n, "nothing is lost");
    assert!(stored > n, "retries after lost acknowledgements stored {stored} records for {n} sent: expected duplicates");
}

/// The longest a phase of a failover test may take (the producer's delivery timeout
/// is 120 s).
const PHASE_LIMIT: Duration = Duration::from_secs(180);

/// The leader of an idempotent stream stops while records are in flight; broker 1 takes
/// over (the partition state is written as the controller would, and brokers 1 and 2
/// restart to load it). Every record is acknowledged in the end, and the new leader's log
/// holds each exactly once, in send order: retries of batches that broker 1 had already
/// replicated are recognised from the producer state it built as a follower.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_change_in_the_middle_of_an_idempotent_stream_loses_and_duplicates_nothing() {
    // Warnings (ISR changes, fetch errors) and the producer's retries are shown with a
    // failure: this test failed twice in CI (ci55, ci64, a record not delivered within
    // the 120 s delivery timeout) and never in ~110 runs here.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn,fjord_client=debug".into()),
        )
        .with_test_writer()
        .try_init();
    let mut cluster = Cluster::builder()
        .brokers(3)
        .config("auto.create.topics.enable", "false")
        .config("replica.fetch.wait.max.ms", "50")
        .start()
        .await
        .unwrap();
    let store = cluster.store().clone();
    let topic = "failover";
    create_all(
        &*store,
        &paths::topic_config(topic),
        br#"{"version":1,"config":{"min.insync.replicas":"2"}}"#,
        CreateMode::Persistent,
    )
    .await
    .unwrap();
    let assignment =
        TopicAssignment { partitions: [("0".to_string(), vec![0, 1, 2])].into(), topic_id: None, ..Default::default() };
    create_all(&*store, &paths::topic(topic), &to_json(&assignment), CreateMode::Persistent).await.unwrap();
    let state = PartitionState { leader: 0, leader_epoch: 0, isr: vec![0, 1, 2], controller_epoch: 0 };
    let state_path = paths::partition_state(topic, 0);
    // A topic written by a controller may already exist when one runs: keep its state.
    let _ = create_all(&*store, &state_path, &to_json(&state), CreateMode::Persistent).await;
    for id in cluster.ids() {
        cluster.stop(id).await.unwrap();
        cluster.start(id).await.unwrap();
    }
    let leader = cluster.wait_for_leader(topic, 0, Duration::from_secs(30)).await.unwrap();

    let config = ProducerConfig {
        client: client(&cluster.bootstrap()),
        batch_size: 400,
        linger: Duration::from_millis(1),
        ..ProducerConfig::default()
    };
    assert!(config.idempotent());
    let producer = Producer::connect(config).await.unwrap();
    let n = 20_000;
    // While records are in flight, the leader goes. Bounded, so that a hang (seen once
    // in CI, ci55 of 2026-12-05, not reproduced in 44 runs since) fails here, naming the
    // phase, instead of stalling the run.
    let streamed = tokio::time::timeout(
        PHASE_LIMIT,
        stream_across(&producer, topic, n, async {
            cluster.stop(leader).await.unwrap();
            let next = if leader == 1 { 2 } else { 1 };
            loop {
                let (current, stat) = read_json::<PartitionState>(&*store, &state_path).await.unwrap().unwrap();
                if current.leader != leader {
                    break; // a controller moved it already
                }
                let moved = PartitionState {
                    leader: next,
                    leader_epoch: current.leader_epoch + 1,
                    isr: current.isr.iter().copied().filter(|&b| b != leader).collect(),
                    controller_epoch: current.controller_epoch,
                };
                if store.set(&state_path, &to_json(&moved), Some(stat.version)).await.is_ok() {
                    break;
                }
            }
            for id in cluster.ids().into_iter().filter(|&id| id != leader) {
                cluster.stop(id).await.unwrap();
                cluster.start(id).await.unwrap();
            }
        }),
    )
    .await;
    let streamed = streamed.expect("the stream across the leader change did not end within PHASE_LIMIT");
    if let Err(e) = streamed {
        // What the brokers were left with, for the next time it fails in CI.
        let state = read_json::<PartitionState>(&*store, &state_path).await;
        let running: Vec<(i32, bool)> = cluster.ids().into_iter().map(|id| (id, cluster.is_running(id))).collect();
        panic!(
            "a record was not acknowledged by the new leader: {e:#}\npartition state: {state:?}\nbrokers running: {running:?}"
        );
    }
    tokio::time::timeout(PHASE_LIMIT, producer.close()).await.expect("the producer did not close within PHASE_LIMIT");
    let new_leader = cluster.leader(topic, 0).await.unwrap().unwrap();
    assert_ne!(new_leader, leader);
    let values = read_values(&client(&cluster.addr(new_leader)), topic, 0).await.unwrap();
    assert_eq!(values.len(), n, "{} records stored for {n} sent", values.len());
    assert_eq!(values, numbered(n), "every record once, in send order");
}

/// A record that fails for good (MESSAGE_TOO_LARGE) leaves a hole in its partition's
/// sequence: the producer goes on in the next epoch of the same producer id, restarting
/// the sequence at 0, rather than with a new producer id. Read from the broker's log:
/// the batches before the failure carry epoch 0, those after it epoch 1, all one id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_fails_for_good_bumps_the_producer_epoch() {
    let cluster = Cluster::builder().brokers(1).start().await.unwrap();
    cluster.create_topic("bumped", 1, &[("max.message.bytes", "2000")], Duration::from_secs(30)).await.unwrap();
    let config = ProducerConfig { client: client(&cluster.bootstrap()), linger: Duration::ZERO, ..ProducerConfig::default() };
    assert!(config.idempotent());
    let producer = Producer::connect(config).await.unwrap();
    let send = |value: Bytes| producer.send(ProducerRecord::new("bumped", value).partition(0));
    for i in 0..3 {
        send(Bytes::from(format!("before-{i}"))).await.unwrap().await.unwrap();
    }
    let error = send(Bytes::from(vec![b'x'; 5_000])).await.unwrap().await.unwrap_err();
    assert_eq!(error.code(), Some(fjord_client::ResponseError::MessageTooLarge), "{error}");
    for i in 0..3 {
        send(Bytes::from(format!("after-{i}"))).await.unwrap().await.unwrap();
    }
    producer.close().await;

    let log = cluster.log_bytes(0, "bumped", 0).unwrap();
    let stamps: Vec<(i64, i16, i32)> = fjord_record::batch::batches(&log)
        .map(|batch| {
            let (header, _) = batch.unwrap();
            (header.producer_id, header.producer_epoch, header.base_sequence)
        })
        .collect();
    let id = stamps[0].0;
    assert!(id >= 0, "{stamps:?}");
    assert_eq!(stamps, [(id, 0, 0), (id, 0, 1), (id, 0, 2), (id, 1, 0), (id, 1, 1), (id, 1, 2)]);
}
