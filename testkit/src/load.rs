//! A producer that keeps writing while a test moves partitions under it (reassignment,
//! decommissioning), and remembers which records were acknowledged: afterwards every one of
//! them must be read back.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use fjord_client::{Producer, ProducerRecord};
use tokio::task::JoinHandle;

use crate::wait_until;

/// Records sent between two looks at the acknowledgements: enough in flight to keep the
/// partitions busy, few enough that stopping is prompt.
const BURST: usize = 20;

/// What a [`LoadProducer`] sent, once stopped.
#[derive(Debug)]
pub struct Load {
    /// `(partition, value)` of every acknowledged record, in the order sent.
    pub acknowledged: Vec<(i32, String)>,
    /// How many sends failed (an error acknowledgement): allowed while leadership moves,
    /// as long as nothing acknowledged goes missing.
    pub failed: usize,
}

impl Load {
    /// The values of the acknowledged records of `partition`.
    pub fn values_of(&self, partition: i32) -> Vec<&str> {
        self.acknowledged.iter().filter(|(p, _)| *p == partition).map(|(_, v)| v.as_str()).collect()
    }
}

/// A task sending `v0`, `v1`, ... to `topic` without pause, record `n` to partition
/// `n % partitions`, in bursts whose acknowledgements it awaits before the next; stopped
/// by [`LoadProducer::stop`]. The producer's own settings (acks=all, idempotence) are the
/// caller's.
#[derive(Debug)]
pub struct LoadProducer {
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicUsize>,
    task: JoinHandle<Result<Load>>,
}

impl LoadProducer {
    /// Starts sending to partitions `0..partitions` of `topic` through `producer`.
    pub fn start(producer: Arc<Producer>, topic: &str, partitions: i32) -> Self {
        let (stop, acked) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
        let task = {
            let (stop, acked, topic) = (stop.clone(), acked.clone(), topic.to_owned());
            tokio::spawn(async move {
                let mut load = Load { acknowledged: Vec::new(), failed: 0 };
                let mut next = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let mut acks = Vec::with_capacity(BURST);
                    for _ in 0..BURST {
                        let (partition, value) = ((next % partitions as usize) as i32, format!("v{next}"));
                        next += 1;
                        let ack = producer.send(ProducerRecord::new(topic.as_str(), value.clone()).partition(partition)).await?;
                        acks.push((partition, value, ack));
                    }
                    for (partition, value, ack) in acks {
                        match ack.await {
                            Ok(_) => {
                                load.acknowledged.push((partition, value));
                                acked.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(_) => load.failed += 1,
                        }
                    }
                }
                Ok(load)
            })
        };
        Self { stop, acked, task }
    }

    /// How many records were acknowledged so far.
    pub fn acknowledged(&self) -> usize {
        self.acked.load(Ordering::Relaxed)
    }

    /// Waits, at most `timeout`, until `n` more records than now are acknowledged: load
    /// established before a move and kept up after it, counted rather than timed (a fixed
    /// 500 ms gave 20 records on a loaded machine).
    pub async fn acknowledged_over(&self, n: usize, timeout: Duration) -> Result<()> {
        let from = self.acknowledged();
        wait_until(timeout, &format!("{n} more records acknowledged"), || async {
            if self.task.is_finished() {
                bail!("the load producer stopped sending (a send failed to start; stop() says why)");
            }
            Ok((self.acknowledged() >= from + n).then_some(()))
        })
        .await
    }

    /// Stops sending once the burst in flight is acknowledged: what was sent.
    pub async fn stop(self) -> Result<Load> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.context("the load producer panicked")?
    }
}
