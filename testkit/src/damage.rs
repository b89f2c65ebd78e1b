//! A partition's log damaged on purpose, as the repair tests damage it (issue 26): a log
//! of many small segments written with acks=all, one byte of a segment in its middle
//! flipped, and the side directories the broker and `fjord logs repair` move damaged
//! bytes to. The tests themselves decide which byte and what they assert.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use fjord_client::{Acks, ClientConfig, Producer, ProducerConfig, ProducerRecord};

use crate::{Cluster, ClusterBuilder};

/// The `.log` files of a partition directory, oldest first (their names are their base
/// offsets, zero-padded, so the names sort by offset).
pub fn segments(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut logs = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "log") {
            logs.push(path);
        }
    }
    logs.sort();
    Ok(logs)
}

/// Flips one bit of the byte at `at` of `path` in place and syncs it. In place, not a new
/// file: a running broker keeps its descriptor of a segment, and must see the damage.
pub fn flip_in_place(path: &Path, at: u64) -> Result<()> {
    use std::io::{Read, Seek, SeekFrom, Write};
    let mut f =
        std::fs::OpenOptions::new().read(true).write(true).open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut byte = [0u8];
    f.seek(SeekFrom::Start(at))?;
    f.read_exact(&mut byte)?;
    f.seek(SeekFrom::Start(at))?;
    f.write_all(&[byte[0] ^ 0x01])?;
    f.sync_all()?;
    Ok(())
}

/// The side directories `<topic>-<partition>-damaged-*` of a data dir, where the damaged
/// bytes of that partition were moved aside (never deleted).
pub fn damaged_aside(data_dir: &Path, topic: &str, partition: i32) -> Result<Vec<PathBuf>> {
    let prefix = format!("{topic}-{partition}-damaged-");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(data_dir).with_context(|| format!("listing {}", data_dir.display()))? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            found.push(entry.path());
        }
    }
    found.sort();
    Ok(found)
}

/// Sends `rounds` rounds of `per_round` records to partition 0 of `topic`, each round
/// acknowledged before the next is sent (so each round is a batch or more of its own),
/// with the values `value(round, i)`; returns the values in send order.
pub async fn produce_acked_rounds(
    producer: &Producer,
    topic: &str,
    rounds: usize,
    per_round: usize,
    value: impl Fn(usize, usize) -> String,
) -> Result<Vec<String>> {
    let mut values = Vec::with_capacity(rounds * per_round);
    for round in 0..rounds {
        let mut pending = Vec::with_capacity(per_round);
        for i in 0..per_round {
            let v = value(round, i);
            pending.push(producer.send(ProducerRecord::new(topic, v.clone()).partition(0)).await?);
            values.push(v);
        }
        for delivery in pending {
            delivery.await?;
        }
    }
    Ok(values)
}

/// An acks=all producer over `client`.
pub async fn acks_all_producer(client: &ClientConfig) -> Result<Producer> {
    Ok(Producer::connect(ProducerConfig { client: client.clone(), acks: Acks::All, ..ProducerConfig::default() }).await?)
}

/// Three brokers whose scrubbers read 64 MiB/s (damage is found within a second or
/// two), that accept segments down to 1 KiB, and whose followers fetch every 100 ms.
pub fn scrubbing_cluster() -> ClusterBuilder {
    Cluster::builder()
        .brokers(3)
        .config("log.min.segment.bytes", 1024)
        .config("log.scrub.bytes.per.second", 64 << 20)
        .config("replica.fetch.wait.max.ms", 100)
}

/// Creates `topic` (one partition, 4 KiB segments, `min.insync.replicas` 2) and writes 30
/// acks=all rounds of 10 records of ~70 bytes to it, so its log spans many segments;
/// returns once every replica has it all, with the producer and the values written.
pub async fn fill_segmented_topic(cluster: &Cluster, topic: &str, timeout: Duration) -> Result<(Producer, Vec<String>)> {
    cluster.create_topic(topic, 1, &[("segment.bytes", "4096"), ("min.insync.replicas", "2")], timeout).await?;
    let producer = acks_all_producer(&ClientConfig::new(&cluster.bootstrap())).await?;
    let values =
        produce_acked_rounds(&producer, topic, 30, 10, |round, i| format!("round {round} record {i} {}", "x".repeat(40))).await?;
    cluster.wait_fully_replicated(topic, timeout).await?;
    Ok((producer, values))
}
