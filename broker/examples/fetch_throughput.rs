//! Fetch throughput of a running broker, without a client library's record decoding in
//! the way: reads a partition from offset 0 to the high watermark with plain Fetch
//! requests, `--passes` times, and prints MB/s. Used to compare `fetch.zero.copy = true`
//! (sendfile) with the copying path, and read_committed (ISOLATION_LEVEL 1: up to the
//! last stable offset, with the aborted transactions) with read_uncommitted (0).
//!
//! `cargo run --release -p fjord-broker --example fetch_throughput -- 127.0.0.1:9092 TOPIC [PARTITION_MAX_BYTES] [PASSES] [ISOLATION_LEVEL]`

use std::time::Instant;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{ApiKey, FetchRequest, FetchResponse, RequestHeader, TopicName};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const VERSION: i16 = 11;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(bootstrap), Some(topic)) = (args.get(1), args.get(2)) else {
        anyhow::bail!("usage: fetch_throughput HOST:PORT TOPIC [PARTITION_MAX_BYTES] [PASSES] [ISOLATION_LEVEL]");
    };
    let max_bytes: i32 = args.get(3).map_or(Ok(4 << 20), |s| s.parse())?;
    let passes: usize = args.get(4).map_or(Ok(3), |s| s.parse())?;
    let isolation_level: i8 = args.get(5).map_or(Ok(0), |s| s.parse())?;
    let mut aborted = 0usize;
    let mut stream = TcpStream::connect(bootstrap).await?;
    stream.set_nodelay(true)?;
    let mut total_bytes = 0usize;
    let started = Instant::now();
    for _ in 0..passes {
        let mut offset = 0i64;
        loop {
            let (records, end, aborted_here) = fetch(&mut stream, topic, offset, max_bytes, isolation_level).await?;
            if records.is_empty() {
                break;
            }
            total_bytes += records.len();
            aborted += aborted_here;
            offset = next_offset(&records)?;
            if offset >= end {
                break;
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{passes} passes, isolation level {isolation_level}, {:.1} MB of records in {seconds:.2} s: {:.0} MB/s ({aborted} aborted transactions listed)",
        total_bytes as f64 / 1e6,
        total_bytes as f64 / 1e6 / seconds
    );
    Ok(())
}

/// One Fetch: the records, where this isolation level's data ends (the high watermark,
/// or the last stable offset for read_committed), and how many aborted transactions the
/// answer lists.
async fn fetch(
    stream: &mut TcpStream,
    topic: &str,
    offset: i64,
    max_bytes: i32,
    isolation_level: i8,
) -> anyhow::Result<(Bytes, i64, usize)> {
    let request =
        FetchRequest::default().with_max_wait_ms(0).with_min_bytes(1).with_isolation_level(isolation_level).with_topics(vec![
            FetchTopic::default()
                .with_topic(TopicName(StrBytes::from_string(topic.to_owned())))
                .with_partitions(vec![FetchPartition::default().with_fetch_offset(offset).with_partition_max_bytes(max_bytes)]),
        ]);
    let mut frame = BytesMut::new();
    frame.put_i32(0);
    RequestHeader::default()
        .with_request_api_key(ApiKey::Fetch as i16)
        .with_request_api_version(VERSION)
        .encode(&mut frame, ApiKey::Fetch.request_header_version(VERSION))?;
    request.encode(&mut frame, VERSION)?;
    let len = (frame.len() - 4) as i32;
    frame[..4].copy_from_slice(&len.to_be_bytes());
    stream.write_all(&frame).await?;
    let len = stream.read_i32().await? as usize;
    let mut body = vec![0; len];
    stream.read_exact(&mut body).await?;
    let mut body = Bytes::from(body);
    body.advance(4); // correlation id
    let response = FetchResponse::decode(&mut body, VERSION)?;
    let partition = &response.responses[0].partitions[0];
    anyhow::ensure!(partition.error_code == 0, "fetch error {}", partition.error_code);
    let end = if isolation_level == 1 { partition.last_stable_offset } else { partition.high_watermark };
    let aborted = partition.aborted_transactions.as_ref().map_or(0, Vec::len);
    Ok((partition.records.clone().unwrap_or_default(), end, aborted))
}

/// The offset after the last batch in `records` (whole batches, as the broker sends them).
fn next_offset(mut records: &[u8]) -> anyhow::Result<i64> {
    let mut next = 0;
    while !records.is_empty() {
        let header = fjord_record::BatchHeader::parse_unchecked(records)?;
        next = header.next_offset();
        records = &records[header.size()..];
    }
    Ok(next)
}
