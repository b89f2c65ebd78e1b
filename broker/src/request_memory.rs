//! `queued.max.request.bytes`: a bound, shared by every connection, on the memory of the
//! requests the broker holds at once, as Kafka's request memory pool.
//!
//! Why: `socket.request.max.bytes` bounds one frame (100 MiB), not how many of them are
//! in memory. A connection reserves a frame's whole size as soon as it has read its
//! length, so a few hundred clients, each sending large frames slowly, made the broker
//! hold tens of GiB and the kernel kill it. And a small frame can decode into much more:
//! each array element or tagged field becomes a value of its own (see
//! [`DECODED_BYTES_PER_ELEMENT`]), so a few concurrent requests of many empty names took
//! GiBs too.
//!
//! So the bound is applied twice, each with its own pool of that size: a connection takes
//! a frame's size from the frames' pool before reading its body, then, once the guard has
//! counted the body's elements, their estimated decoded size from the decoded pool before
//! decoding; both go back once the request is handled. While a pool is spent, the
//! connections that need it wait (a connection waiting for its frame reads nothing: the
//! client's sends back up in TCP). Nothing is refused or lost. Two pools and not one
//! because a connection waits for decoded memory while holding its frame's: had they been
//! one pool, connections holding frames could each wait for memory only the others could
//! give back. Holders of decoded memory are decoding or handling and wait for no memory.
//!
//! Frames of at most [`UNCOUNTED`] bytes, and decoded forms estimated at most that, are
//! not counted: they fit the buffer each connection keeps anyway (bounded by
//! `max.connections`), and they are what must go on while large requests wait (replica
//! fetches, heartbeats, metadata, and the acknowledgements an acks=all produce waits for).
//!
//! A request larger than a whole pool takes all of it, as Kafka's pool lets it through
//! once memory is free: any frame `socket.request.max.bytes` allows is eventually read.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};

/// Frames, and decoded forms, up to this size are not counted (the size a connection's
/// read buffer starts with).
pub(crate) const UNCOUNTED: usize = 64 * 1024;

/// What one array element or tagged field of a request is counted as once decoded, its
/// answer included: measured ~210 bytes a topic for Metadata v1 requests of 10 million
/// empty names (2.1 GiB at the peak).
pub(crate) const DECODED_BYTES_PER_ELEMENT: usize = 256;

/// The pools (`None`: unbounded, `queued.max.request.bytes=-1`).
pub(crate) struct RequestMemory {
    frames: Option<Pool>,
    decoded: Option<Pool>,
    /// Requests that waited for memory.
    waits: AtomicU64,
}

struct Pool {
    semaphore: Arc<Semaphore>,
    limit: usize,
}

impl Pool {
    fn new(limit: usize) -> Self {
        Self { semaphore: Arc::new(Semaphore::new(limit)), limit }
    }

    fn held(&self) -> u64 {
        (self.limit - self.semaphore.available_permits()) as u64
    }
}

/// What the metrics page shows of the pools.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RequestMemoryStats {
    /// Bytes of frames held now.
    pub(crate) frames: u64,
    /// Estimated bytes of decoded requests held now.
    pub(crate) decoded: u64,
    /// The bound of each pool (0: unbounded).
    pub(crate) limit: u64,
    pub(crate) waits: u64,
}

impl RequestMemory {
    /// Pools of `limit` bytes each, or none.
    pub(crate) fn new(limit: Option<usize>) -> Self {
        // Semaphore's ceiling; a configured bound above it (petabytes) is no bound.
        let limit = limit.map(|l| l.min(Semaphore::MAX_PERMITS));
        Self { frames: limit.map(Pool::new), decoded: limit.map(Pool::new), waits: AtomicU64::new(0) }
    }

    /// Memory for a frame of `size` bytes, held until the returned permit drops (`None`:
    /// nothing to hold). Waits while the frames' pool cannot give it.
    pub(crate) async fn reserve(&self, size: usize) -> Option<OwnedSemaphorePermit> {
        self.take(self.frames.as_ref(), size).await
    }

    /// Memory for decoding a request of `elements` array elements and tagged fields,
    /// held until the returned permit drops. Waits while the decoded pool cannot give it.
    pub(crate) async fn reserve_decoded(&self, elements: u64) -> Option<OwnedSemaphorePermit> {
        let bytes = usize::try_from(elements).unwrap_or(usize::MAX).saturating_mul(DECODED_BYTES_PER_ELEMENT);
        self.take(self.decoded.as_ref(), bytes).await
    }

    async fn take(&self, pool: Option<&Pool>, bytes: usize) -> Option<OwnedSemaphorePermit> {
        let pool = pool.filter(|_| bytes > UNCOUNTED)?;
        // At most the whole pool. Permits are taken as a u32: from a pool over 4 GiB a
        // request takes at most 4 GiB.
        let n = u32::try_from(bytes.min(pool.limit)).unwrap_or(u32::MAX);
        match pool.semaphore.clone().try_acquire_many_owned(n) {
            Ok(permit) => Some(permit),
            // The semaphore is never closed.
            Err(TryAcquireError::Closed) => None,
            Err(TryAcquireError::NoPermits) => {
                self.waits.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(bytes, "request memory spent (queued.max.request.bytes): the connection waits");
                pool.semaphore.clone().acquire_many_owned(n).await.ok()
            }
        }
    }

    pub(crate) fn stats(&self) -> RequestMemoryStats {
        RequestMemoryStats {
            frames: self.frames.as_ref().map_or(0, Pool::held),
            decoded: self.decoded.as_ref().map_or(0, Pool::held),
            limit: self.frames.as_ref().map_or(0, |p| p.limit as u64),
            waits: self.waits.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const MIB: usize = 1024 * 1024;

    #[tokio::test]
    async fn a_frame_waits_until_earlier_ones_give_their_memory_back() {
        let memory = RequestMemory::new(Some(4 * MIB));
        let first = memory.reserve(3 * MIB).await.expect("counted");
        let waiting = tokio::time::timeout(Duration::from_millis(50), memory.reserve(2 * MIB)).await;
        assert!(waiting.is_err(), "3 + 2 MiB is over the bound: the second frame waits");
        assert_eq!(memory.stats().frames, 3 * MIB as u64);
        drop(first);
        let second = tokio::time::timeout(Duration::from_secs(5), memory.reserve(2 * MIB)).await.expect("memory came back");
        assert!(second.is_some());
        assert_eq!(memory.stats().frames, 2 * MIB as u64);
        assert_eq!(memory.stats().waits, 1, "the first attempt waited, the second found the memory free");
    }

    #[tokio::test]
    async fn small_frames_go_on_while_the_pool_is_spent() {
        let memory = RequestMemory::new(Some(MIB));
        let _all = memory.reserve(MIB).await.expect("counted");
        let small = tokio::time::timeout(Duration::from_millis(50), memory.reserve(UNCOUNTED)).await;
        assert!(small.expect("not counted, so it does not wait").is_none());
    }

    #[tokio::test]
    async fn a_frame_larger_than_the_pool_takes_all_of_it_once_free() {
        let memory = RequestMemory::new(Some(MIB));
        let big = memory.reserve(10 * MIB).await.expect("counted");
        assert_eq!(memory.stats().frames, MIB as u64);
        drop(big);
        assert_eq!(memory.stats().frames, 0);
    }

    #[tokio::test]
    async fn decoding_many_elements_waits_apart_from_the_frames() {
        let memory = RequestMemory::new(Some(4 * MIB));
        let _frame = memory.reserve(4 * MIB).await.expect("counted");
        // 100 elements are not counted; 10,000 (2.4 MiB) are, from the other pool.
        assert!(memory.reserve_decoded(100).await.is_none());
        let decoded = memory.reserve_decoded(10_000).await.expect("counted");
        assert_eq!(memory.stats().decoded, 10_000 * DECODED_BYTES_PER_ELEMENT as u64);
        let more = tokio::time::timeout(Duration::from_millis(50), memory.reserve_decoded(10_000)).await;
        assert!(more.is_err(), "2 x 2.4 MiB is over the bound: the second waits");
        drop(decoded);
        // A million elements (244 MiB estimated) take the whole pool.
        let huge = memory.reserve_decoded(1_000_000).await.expect("counted");
        assert_eq!(memory.stats().decoded, 4 * MIB as u64);
        drop(huge);
        assert_eq!(memory.stats().decoded, 0);
    }

    #[tokio::test]
    async fn no_bound_holds_nothing() {
        let memory = RequestMemory::new(None);
        assert!(memory.reserve(100 * MIB).await.is_none());
        assert_eq!(memory.stats().limit, 0);
    }
}
