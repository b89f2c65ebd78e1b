//! Records in and out of a cluster through `fjord-client`, as the cluster and failover
//! tests write and check them.

use std::future::Future;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use fjord_client::{
    Admin, ClientConfig, Consumer, ConsumerConfig, OffsetReset, OffsetSpec, Producer, ProducerRecord, TopicPartition,
};
use tokio::time::Instant;

/// How long reading a partition back may take.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// The values (as UTF-8) of every record of `topic`-`partition` from offset 0 to its log
/// end at the time of the call, in log order, read through `client` with a fresh admin
/// client and consumer.
pub async fn read_values(client: &ClientConfig, topic: &str, partition: i32) -> Result<Vec<String>> {
    let admin = Admin::connect(client.clone()).await?;
    let end = admin.list_offsets(&[(topic.to_string(), partition, OffsetSpec::Latest)]).await?[0];
    let config = ConsumerConfig {
        client: client.clone(),
        auto_offset_reset: OffsetReset::Earliest,
        fetch_max_wait: Duration::from_millis(50),
        ..ConsumerConfig::default()
    };
    let mut consumer = Consumer::connect(config).await?;
    consumer.assign([TopicPartition::new(topic, partition)]).await?;
    let deadline = Instant::now() + READ_TIMEOUT;
    let mut values = Vec::new();
    while (values.len() as i64) < end {
        if Instant::now() >= deadline {
            bail!("read {} of the {end} records of {topic}-{partition} in {READ_TIMEOUT:?}", values.len());
        }
        for r in consumer.poll(Duration::from_millis(200)).await? {
            let value = r.value.context("a record without a value")?;
            values.push(String::from_utf8(value.to_vec()).context("a value that is not UTF-8")?);
        }
    }
    Ok(values)
}

/// `m0`, `m1`, ... `m{n-1}`: what [`stream_across`] sends.
pub fn numbered(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("m{i}")).collect()
}

/// Sends [`numbered`]`(n)` to partition 0 of `topic` across a fault: the first quarter is
/// sent and acknowledged, the second quarter sent, then `fault` runs while those are in
/// flight, then the second half is sent; returns once every record is acknowledged, or
/// with the first error.
pub async fn stream_across(producer: &Producer, topic: &str, n: usize, fault: impl Future<Output = ()>) -> Result<()> {
    let record = |i: usize| ProducerRecord::new(topic, Bytes::from(format!("m{i}"))).partition(0);
    let mut acked = Vec::with_capacity(n / 4);
    for i in 0..n / 4 {
        acked.push(producer.send(record(i)).await?);
    }
    for ack in acked {
        ack.await?;
    }
    let mut pending = Vec::with_capacity(n - n / 4);
    for i in n / 4..n / 2 {
        pending.push(producer.send(record(i)).await?);
    }
    fault.await;
    for i in n / 2..n {
        pending.push(producer.send(record(i)).await?);
    }
    for ack in pending {
        ack.await.context("a record sent across the fault")?;
    }
    Ok(())
}

/// Sends `per_partition` records to each of partitions `0..partitions` of `topic`, with
/// values `r{round}-p{partition}-{i}`, and waits for every acknowledgement.
pub async fn produce_round(producer: &Producer, topic: &str, partitions: i32, per_partition: usize, round: usize) -> Result<()> {
    let mut acks = Vec::with_capacity(per_partition * partitions.max(0) as usize);
    for i in 0..per_partition {
        for p in 0..partitions {
            acks.push(producer.send(ProducerRecord::new(topic, round_value(round, p, i)).partition(p)).await?);
        }
    }
    for ack in acks {
        ack.await?;
    }
    Ok(())
}

/// The value [`produce_round`] gives the `i`-th record of `round` in `partition`.
pub fn round_value(round: usize, partition: i32, i: usize) -> String {
    format!("r{round}-p{partition}-{i}")
}
