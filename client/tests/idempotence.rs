//! Lost acknowledgements: a proxy between the producer and an in-process broker lets
//! some produce requests reach the broker but closes the connection instead of
//! returning their answer. The producer retries those batches; with idempotence the log
//! holds every record exactly once and in order, without it the retries duplicate.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use fjord_client::{
    Admin, ClientConfig, Consumer, ConsumerConfig, NewTopic, OffsetReset, OffsetSpec, Producer, ProducerConfig, ProducerRecord,
};
use fjord_testkit::StandaloneBroker;
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

    let admin = Admin::connect(client(&proxy_addr)).await.unwrap();
    admin.create_topics(&[NewTopic::new("lost-acks", 2)]).await.unwrap();
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
        let end = admin.list_offsets(&[("lost-acks".to_string(), partition, OffsetSpec::Latest)]).await.unwrap()[0];
        let mut consumer = Consumer::connect(ConsumerConfig {
            client: client(&proxy_addr),
            auto_offset_reset: OffsetReset::Earliest,
            fetch_max_wait: Duration::from_millis(50),
            ..ConsumerConfig::default()
        })
        .await
        .unwrap();
        consumer.assign([fjord_client::TopicPartition::new("lost-acks", partition)]).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut values = Vec::new();
        while (values.len() as i64) < end {
            assert!(Instant::now() < deadline, "read {} of {end} records", values.len());
            for r in consumer.poll(Duration::from_millis(200)).await.unwrap() {
                values.push(String::from_utf8(r.value.unwrap().to_vec()).unwrap());
            }
        }
        per_partition.push(values);
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
