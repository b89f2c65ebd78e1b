//! `queued.max.request.bytes`: one bound, shared by every connection, on the bytes of
//! the requests the broker holds at once, as Kafka's request memory pool.
//!
//! Why: `socket.request.max.bytes` bounds one frame (100 MiB), not how many of them are
//! in memory. A connection reserves a frame's whole size as soon as it has read its
//! length, so a few hundred clients, each sending large frames slowly, made the broker
//! hold tens of GiB and the kernel kill it. Now a connection takes its frame's size from
//! the pool before reading the body, and gives it back once the request is handled; when
//! the pool is spent the connection stops reading (the client's sends back up in TCP)
//! until other requests end. Nothing is refused or lost: requests wait.
//!
//! Frames of at most [`UNCOUNTED_FRAME`] bytes are not counted: they fit the buffer each
//! connection keeps anyway (bounded by `max.connections`), and they are what must go on
//! while large produce requests wait (replica fetches, heartbeats, metadata, and the
//! acknowledgements an acks=all produce is waiting for).
//!
//! A frame larger than the whole pool takes all of it, as Kafka's pool lets it through
//! once memory is free: any frame `socket.request.max.bytes` allows is eventually read.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};

/// Frames up to this size are read without taking from the pool (the size a
/// connection's read buffer starts with).
pub(crate) const UNCOUNTED_FRAME: usize = 64 * 1024;

/// The pool (`None`: unbounded, `queued.max.request.bytes=-1`).
pub(crate) struct RequestMemory {
    pool: Option<(Arc<Semaphore>, usize)>,
    /// Frames that waited for memory.
    waits: AtomicU64,
}

/// What the metrics page shows of the pool.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RequestMemoryStats {
    /// Bytes taken now.
    pub(crate) held: u64,
    /// The bound (0: unbounded).
    pub(crate) limit: u64,
    pub(crate) waits: u64,
}

impl RequestMemory {
    /// A pool of `limit` bytes, or none.
    pub(crate) fn new(limit: Option<usize>) -> Self {
        // Semaphore's ceiling; a configured bound above it (petabytes) is no bound.
        let limit = limit.map(|l| l.min(Semaphore::MAX_PERMITS));
        Self { pool: limit.map(|l| (Arc::new(Semaphore::new(l)), l)), waits: AtomicU64::new(0) }
    }

    /// Memory for a frame of `size` bytes, held until the returned permit drops (`None`:
    /// nothing to hold, the frame is small or there is no bound). Waits while the pool
    /// cannot give it.
    pub(crate) async fn reserve(&self, size: usize) -> Option<OwnedSemaphorePermit> {
        let (pool, limit) = self.pool.as_ref().filter(|_| size > UNCOUNTED_FRAME)?;
        // A frame is at most 2 GiB (`socket.request.max.bytes`), so it fits a u32.
        let bytes = u32::try_from(size.min(*limit)).unwrap_or(u32::MAX);
        match pool.clone().try_acquire_many_owned(bytes) {
            Ok(permit) => Some(permit),
            // The semaphore is never closed.
            Err(TryAcquireError::Closed) => None,
            Err(TryAcquireError::NoPermits) => {
                self.waits.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(size, "request memory spent (queued.max.request.bytes): the connection waits");
                pool.clone().acquire_many_owned(bytes).await.ok()
            }
        }
    }

    pub(crate) fn stats(&self) -> RequestMemoryStats {
        let (held, limit) =
            self.pool.as_ref().map_or((0, 0), |(pool, limit)| ((limit - pool.available_permits()) as u64, *limit as u64));
        RequestMemoryStats { held, limit, waits: self.waits.load(Ordering::Relaxed) }
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
        assert_eq!(memory.stats().held, 3 * MIB as u64);
        drop(first);
        let second = tokio::time::timeout(Duration::from_secs(5), memory.reserve(2 * MIB)).await.expect("memory came back");
        assert!(second.is_some());
        assert_eq!(memory.stats().held, 2 * MIB as u64);
        assert_eq!(memory.stats().waits, 1, "the first attempt waited, the second found the memory free");
    }

    #[tokio::test]
    async fn small_frames_go_on_while_the_pool_is_spent() {
        let memory = RequestMemory::new(Some(MIB));
        let _all = memory.reserve(MIB).await.expect("counted");
        let small = tokio::time::timeout(Duration::from_millis(50), memory.reserve(UNCOUNTED_FRAME)).await;
        assert!(small.expect("not counted, so it does not wait").is_none());
    }

    #[tokio::test]
    async fn a_frame_larger_than_the_pool_takes_all_of_it_once_free() {
        let memory = RequestMemory::new(Some(MIB));
        let big = memory.reserve(10 * MIB).await.expect("counted");
        assert_eq!(memory.stats().held, MIB as u64);
        drop(big);
        assert_eq!(memory.stats().held, 0);
    }

    #[tokio::test]
    async fn no_bound_holds_nothing() {
        let memory = RequestMemory::new(None);
        assert!(memory.reserve(100 * MIB).await.is_none());
        assert_eq!(memory.stats().limit, 0);
    }
}
