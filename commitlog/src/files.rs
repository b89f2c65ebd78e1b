//! Descriptors of sealed segment files, opened lazily and kept in one bounded cache.
//!
//! Every segment used to hold its `.log` open, and a sealed segment that was read kept its
//! `.index` and `.timeindex` open too: descriptors grew with the segment count, and
//! 18,500 tiny segments (`segment.bytes=61`) exhausted the open-file limit so that the
//! broker could not even restart. Now only the active segment's files stay open; a sealed
//! segment's file is opened on first use and its descriptor handed to the process-wide
//! [`FileCache`], which holds at most [`FileCache::capacity`] of them (broker key
//! `log.segment.files.open.max`, default [`DEFAULT_CAPACITY`]) and closes the least
//! recently used beyond that (CLOCK: an entry used since the hand last passed it gets a
//! second chance).
//!
//! A descriptor is an `Arc<File>`: a reader (a Fetch response being sent with sendfile)
//! holds its own clone, so eviction only drops the cache's reference and the file stays
//! valid until the response is sent. A segment finds its cached descriptor through a
//! `Weak` in its `FileSlot`, so a hit takes no global lock.
//!
//! Opening by path is only correct while the path names the segment's own file: a
//! cleaned segment takes over the names of the segments it replaces, and a truncation
//! can create a new segment under an old name. So the slot's lock is held while the path
//! is resolved and opened, and the writer renames a segment's files away (to
//! `*.deleted`) under the same locks (`crate::segment::Segment::rename_deleted`): a
//! reader opens either the old name before the rename or the `.deleted` name after it,
//! never the new file.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use crate::lock;

/// Default bound on cached sealed-segment descriptors. Each partition also keeps its
/// active segment's three files open; 1,024 cached files leave room for thousands of
/// partitions under a typical 64 Ki descriptor limit, and sequential consumers touch one
/// sealed segment at a time per partition.
pub const DEFAULT_CAPACITY: usize = 1024;

/// The process-wide cache of sealed segment descriptors (see the module docs).
#[derive(Debug)]
pub struct FileCache {
    capacity: AtomicUsize,
    ring: Mutex<VecDeque<Entry>>,
    opened: AtomicU64,
}

#[derive(Debug)]
struct Entry {
    /// The [`FileSlot`] it belongs to (its address, for [`FileCache::forget`]).
    owner: usize,
    /// Never read: this reference is what keeps the descriptor open while cached.
    #[allow(dead_code)]
    file: Arc<File>,
    referenced: Arc<AtomicBool>,
}

impl FileCache {
    /// The cache all logs of this process share.
    pub fn global() -> &'static FileCache {
        static CACHE: OnceLock<FileCache> = OnceLock::new();
        CACHE.get_or_init(|| FileCache {
            capacity: AtomicUsize::new(DEFAULT_CAPACITY),
            ring: Mutex::new(VecDeque::new()),
            opened: AtomicU64::new(0),
        })
    }

    /// The most descriptors it keeps open.
    pub fn capacity(&self) -> usize {
        self.capacity.load(Ordering::Relaxed)
    }

    /// Changes the bound (at least 1); closes what is over it now.
    pub fn set_capacity(&self, capacity: usize) {
        self.capacity.store(capacity.max(1), Ordering::Relaxed);
        let mut ring = lock::mutex(&self.ring);
        self.evict(&mut ring);
    }

    /// Descriptors it holds now.
    pub fn len(&self) -> usize {
        lock::mutex(&self.ring).len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Files opened through it since the start (a miss rate, with reads).
    pub fn opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    fn insert(&self, owner: usize, file: Arc<File>, referenced: Arc<AtomicBool>) {
        let mut ring = lock::mutex(&self.ring);
        ring.push_back(Entry { owner, file, referenced });
        self.evict(&mut ring);
    }

    /// CLOCK eviction down to the capacity: the front entry goes unless it was used
    /// since it was last looked at, in which case it moves to the back once.
    fn evict(&self, ring: &mut VecDeque<Entry>) {
        let capacity = self.capacity();
        let mut chances = ring.len();
        while ring.len() > capacity {
            let Some(e) = ring.pop_front() else { break };
            if chances > 0 && e.referenced.swap(false, Ordering::Relaxed) {
                chances -= 1;
                ring.push_back(e);
            }
        }
    }

    /// Drops the entries of a slot that goes away (its segment was deleted or dropped),
    /// so their descriptors do not keep deleted files' blocks allocated.
    fn forget(&self, owner: usize) {
        lock::mutex(&self.ring).retain(|e| e.owner != owner);
    }
}

/// One segment file: held open (the active segment's `.log`), or reached through the
/// [`FileCache`].
#[derive(Debug, Default)]
pub(crate) struct FileSlot {
    state: Mutex<SlotState>,
    referenced: Arc<AtomicBool>,
}

#[derive(Debug, Default)]
struct SlotState {
    pinned: Option<Arc<File>>,
    cached: Weak<File>,
}

impl FileSlot {
    /// The open file: pinned, cached, or opened now with `open(path)` (the path is
    /// resolved under the slot's lock, see the module docs).
    pub(crate) fn get(
        &self,
        path: impl FnOnce() -> std::path::PathBuf,
        open: impl FnOnce(&Path) -> io::Result<File>,
    ) -> io::Result<Arc<File>> {
        let mut state = lock::mutex(&self.state);
        if let Some(f) = &state.pinned {
            return Ok(f.clone());
        }
        if let Some(f) = state.cached.upgrade() {
            self.referenced.store(true, Ordering::Relaxed);
            return Ok(f);
        }
        let file = Arc::new(open(&path())?);
        let cache = FileCache::global();
        cache.opened.fetch_add(1, Ordering::Relaxed);
        state.cached = Arc::downgrade(&file);
        cache.insert(self.owner(), file.clone(), self.referenced.clone());
        Ok(file)
    }

    /// Keeps `file` open for as long as the slot lives or until [`FileSlot::unpin`].
    pub(crate) fn pin(&self, file: Arc<File>) {
        lock::mutex(&self.state).pinned = Some(file);
    }

    /// Hands a pinned file over to the cache (a sealed segment is often read soon after).
    pub(crate) fn unpin(&self) {
        let mut state = lock::mutex(&self.state);
        if let Some(file) = state.pinned.take() {
            state.cached = Arc::downgrade(&file);
            FileCache::global().insert(self.owner(), file, self.referenced.clone());
        }
    }

    /// Whether the file is held open (pinned).
    pub(crate) fn pinned(&self) -> Option<Arc<File>> {
        lock::mutex(&self.state).pinned.clone()
    }

    /// Runs `f` with the slot locked: no reader resolves the path meanwhile.
    pub(crate) fn locked<R>(&self, f: impl FnOnce() -> R) -> R {
        let _state = lock::mutex(&self.state);
        f()
    }

    fn owner(&self) -> usize {
        self as *const Self as usize
    }
}

impl Drop for FileSlot {
    fn drop(&mut self) {
        if lock::mutex(&self.state).cached.strong_count() > 0 {
            FileCache::global().forget(self.owner());
        }
    }
}
