//! `fjord produce`: one record per stdin line.

use std::collections::VecDeque;

use anyhow::Context;
use bytes::Bytes;
use clap::Args;
use fjord_client::{Acks, Compression, DeliveryFuture, Producer, ProducerConfig, ProducerRecord};
use tokio::io::{AsyncBufReadExt, BufReader};

use super::{parse_acks, parse_compression, parse_key_value, AuditFlag, ConnectArgs};

/// Deliveries checked at a time; bounds memory for endless input.
const OUTSTANDING: usize = 10_000;

#[derive(Args, Debug)]
pub(crate) struct ProduceArgs {
    #[command(flatten)]
    connect: ConnectArgs,
    /// Topic to write to.
    #[arg(long)]
    topic: String,
    /// Split each line at the first occurrence of this character into key and value.
    #[arg(long)]
    key_separator: Option<char>,
    /// acks: 0, 1 or all.
    #[arg(long, default_value = "all", value_parser = parse_acks)]
    acks: Acks,
    /// Header KEY=VALUE added to every record (repeatable).
    #[arg(long = "header", value_parser = parse_key_value)]
    headers: Vec<(String, String)>,
    /// Write to this partition instead of letting the partitioner choose.
    #[arg(long)]
    partition: Option<i32>,
    /// none, gzip, snappy, lz4 or zstd.
    #[arg(long, default_value = "none", value_parser = parse_compression)]
    compression: Compression,
    #[command(flatten)]
    audit: AuditFlag,
}

pub(crate) async fn run(args: ProduceArgs) -> anyhow::Result<()> {
    let audit = args.audit.start("producer", &args.connect.client()?);
    let config = ProducerConfig {
        client: args.connect.client()?,
        acks: args.acks,
        compression: args.compression,
        audit: audit.as_ref().map(|a| a.hook()),
        ..ProducerConfig::default()
    };
    let producer = Producer::connect(config).await?;
    let headers: Vec<(String, Option<Bytes>)> =
        args.headers.iter().map(|(k, v)| (k.clone(), Some(Bytes::from(v.clone())))).collect();
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut pending: VecDeque<(usize, DeliveryFuture)> = VecDeque::new();
    let mut line_no = 0;
    while let Some(line) = lines.next_line().await.context("reading stdin")? {
        line_no += 1;
        let (key, value) = match args.key_separator.and_then(|sep| line.split_once(sep)) {
            Some((k, v)) => (Some(Bytes::from(k.to_string())), v.to_string()),
            None => (None, line),
        };
        let record = ProducerRecord {
            topic: args.topic.clone(),
            partition: args.partition,
            key,
            value: Some(Bytes::from(value)),
            headers: headers.clone(),
            timestamp: None,
        };
        let delivery = producer.send(record).await.with_context(|| format!("line {line_no}"))?;
        pending.push_back((line_no, delivery));
        if pending.len() >= OUTSTANDING {
            let (n, f) = pending.pop_front().expect("not empty");
            f.await.with_context(|| format!("line {n} not delivered"))?;
        }
    }
    producer.flush().await;
    for (n, f) in pending {
        f.await.with_context(|| format!("line {n} not delivered"))?;
    }
    producer.close().await;
    if let Some(audit) = audit {
        audit.finish().await?;
    }
    Ok(())
}
