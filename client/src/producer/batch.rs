//! Completion of a batch and the per-record futures waiting on it.
//!
//! Every record of a batch shares one [`Completion`]; a [`DeliveryFuture`] is an `Arc` to
//! it plus the record's index, so a send costs no channel and no allocation of its own.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use fjord_record::compression::records_body;
use fjord_record::{BatchBuilder, BatchHeader, Compression, Records, BATCH_OVERHEAD};

use crate::error::{Error, Result};

/// Where a record was stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordMetadata {
    /// Partition.
    pub partition: i32,
    /// Offset, or -1 with acks=0 (the broker does not say).
    pub offset: i64,
}

/// How a batch ended.
#[derive(Debug, Clone)]
pub(crate) enum Outcome {
    /// Appended at `base_offset` (-1 when unknown, acks=0).
    Sent { base_offset: i64 },
    /// Every record failed with this error.
    Failed(Error),
    /// The batch was split; one result (offset) per record.
    PerRecord(Vec<Result<i64>>),
}

/// The shared end state of one batch.
#[derive(Default)]
pub(crate) struct Completion {
    outcome: OnceLock<Outcome>,
    wakers: Mutex<Vec<Waker>>,
}

impl Completion {
    pub(crate) fn complete(&self, outcome: Outcome) {
        if self.outcome.set(outcome).is_ok() {
            for w in self.wakers.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
                w.wake();
            }
        }
    }

    fn result(&self, index: i32) -> Option<Result<i64>> {
        Some(match self.outcome.get()? {
            Outcome::Sent { base_offset: -1 } => Ok(-1),
            // Saturating: the base offset is the broker's word.
            Outcome::Sent { base_offset } => Ok(base_offset.saturating_add(i64::from(index))),
            Outcome::Failed(e) => Err(e.clone()),
            Outcome::PerRecord(results) => results.get(index as usize).cloned().unwrap_or(Err(Error::ProducerClosed)),
        })
    }

    fn poll_result(&self, index: i32, cx: &mut Context<'_>) -> Poll<Result<i64>> {
        if let Some(r) = self.result(index) {
            return Poll::Ready(r);
        }
        let mut wakers = self.wakers.lock().unwrap_or_else(|e| e.into_inner());
        // Checked again under the lock: `complete` drains the wakers after setting it.
        if let Some(r) = self.result(index) {
            return Poll::Ready(r);
        }
        if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
            wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }

    /// Waits for the single record of a one-record batch (used after a split).
    pub(crate) async fn wait(self: &Arc<Self>) -> Result<i64> {
        std::future::poll_fn(|cx| self.poll_result(0, cx)).await
    }
}

/// Resolves to where the record was stored, or why it was not.
pub struct DeliveryFuture {
    completion: Arc<Completion>,
    partition: i32,
    index: i32,
}

impl DeliveryFuture {
    pub(crate) fn new(completion: Arc<Completion>, partition: i32, index: i32) -> Self {
        Self { completion, partition, index }
    }

    /// The partition the record was assigned to (known at once).
    pub fn partition(&self) -> i32 {
        self.partition
    }

    /// The result if the batch has completed, without waiting.
    pub fn try_result(&self) -> Option<Result<RecordMetadata>> {
        let partition = self.partition;
        self.completion.result(self.index).map(|r| r.map(|offset| RecordMetadata { partition, offset }))
    }
}

impl Future for DeliveryFuture {
    type Output = Result<RecordMetadata>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let partition = self.partition;
        self.completion.poll_result(self.index, cx).map(|r| r.map(|offset| RecordMetadata { partition, offset }))
    }
}

impl std::fmt::Debug for DeliveryFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeliveryFuture").field("partition", &self.partition).field("index", &self.index).finish()
    }
}

/// Rebuilds each record of `batch` as a batch of its own (same timestamps, keys, values
/// and headers), so that one oversized record does not fail its neighbours.
pub(crate) fn split_batch(batch: &[u8], codec: Compression) -> Result<Vec<Bytes>> {
    let header = BatchHeader::parse(batch)?;
    let body = records_body(&header, batch, crate::MAX_DECOMPRESSED_BATCH)?;
    let mut out = Vec::with_capacity(header.record_count as usize);
    for record in Records::new(&body, BATCH_OVERHEAD) {
        let r = record?;
        let timestamp = header.base_timestamp + r.timestamp_delta;
        let headers: Vec<(&str, Option<&[u8]>)> =
            r.headers.iter().map(|h| (std::str::from_utf8(h.key).unwrap_or(""), h.value)).collect();
        let mut b = BatchBuilder::new(timestamp);
        if header.is_transactional() {
            b = b.transactional();
        }
        b.append(timestamp, r.key, r.value, &headers);
        out.push(b.build_compressed(codec)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[test]
    fn record_futures_resolve_from_the_batch_outcome() {
        let c = Arc::new(Completion::default());
        let f0 = DeliveryFuture::new(c.clone(), 3, 0);
        let mut f2 = DeliveryFuture::new(c.clone(), 3, 2);
        assert!(f0.try_result().is_none());
        assert!((&mut f2).now_or_never().is_none());
        c.complete(Outcome::Sent { base_offset: 100 });
        assert_eq!(f0.now_or_never().unwrap().unwrap(), RecordMetadata { partition: 3, offset: 100 });
        assert_eq!(f2.now_or_never().unwrap().unwrap().offset, 102);
    }

    #[test]
    fn failures_and_split_results_reach_each_record() {
        let c = Arc::new(Completion::default());
        c.complete(Outcome::PerRecord(vec![Ok(7), Err(Error::RecordTooLarge { size: 10, max: 5 })]));
        assert_eq!(DeliveryFuture::new(c.clone(), 0, 0).try_result().unwrap().unwrap().offset, 7);
        assert!(matches!(DeliveryFuture::new(c.clone(), 0, 1).try_result().unwrap(), Err(Error::RecordTooLarge { .. })));
        let c = Arc::new(Completion::default());
        c.complete(Outcome::Failed(Error::ProducerClosed));
        c.complete(Outcome::Sent { base_offset: 1 }); // the first outcome wins
        assert!(matches!(DeliveryFuture::new(c, 0, 0).try_result().unwrap(), Err(Error::ProducerClosed)));
    }

    #[test]
    fn split_keeps_every_record_intact() {
        for codec in [Compression::None, Compression::Zstd] {
            let mut b = BatchBuilder::new(1000);
            b.append(1000, Some(b"a"), Some(b"1"), &[("h", Some(b"x"))]);
            b.append(1005, None, None, &[]);
            let parts = split_batch(&b.build_compressed(codec).unwrap(), codec).unwrap();
            assert_eq!(parts.len(), 2);
            let h = BatchHeader::parse(&parts[1]).unwrap();
            assert_eq!((h.record_count, h.base_timestamp, h.compression()), (1, 1005, codec));
            let body = records_body(&BatchHeader::parse(&parts[0]).unwrap(), &parts[0], 1 << 20).unwrap();
            let r = Records::new(&body, BATCH_OVERHEAD).next().unwrap().unwrap();
            assert_eq!((r.key, r.value, r.headers.len()), (Some(&b"a"[..]), Some(&b"1"[..]), 1));
        }
    }
}
