//! One segment: a `.log` file of whole batches starting at `base_offset`, plus its
//! offset and time indexes.
//!
//! A [`Segment`] is shared (`Arc`) between the writer and any number of readers.
//! The writer publishes appended bytes by raising `size` (release) after writing
//! them; readers never look past the `size` they loaded (acquire). Index entries of
//! the active segment are resident and guarded by a short `RwLock` (no I/O is ever
//! done under it); a sealed segment drops them and is searched in its files
//! through a small summary loaded on the first lookup (see `index::SealedFile`).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use fjord_record::{BatchHeader, Offset, BATCH_OVERHEAD};

use crate::index::{Entries, IndexEntry, OffsetEntry, SealedFile, TimeEntry};
use crate::lock;

/// Segment file suffixes.
pub(crate) const LOG_SUFFIX: &str = "log";
pub(crate) const INDEX_SUFFIX: &str = "index";
pub(crate) const TIME_INDEX_SUFFIX: &str = "timeindex";
/// Appended to the file names of a segment that waits for `file.delete.delay.ms`.
pub(crate) const DELETED_SUFFIX: &str = ".deleted";

/// `<dir>/<base_offset:020>.<suffix>`.
pub(crate) fn segment_path(dir: &Path, base_offset: Offset, suffix: &str) -> PathBuf {
    dir.join(format!("{base_offset:020}.{suffix}"))
}

/// Index entries of a segment: resident while it is active, in the file once sealed.
#[derive(Debug)]
enum Resident<E> {
    Active(Vec<E>),
    Sealed,
}

/// A sealed segment's index file, loaded on the first lookup.
type SealedIndex<E> = Mutex<Option<Arc<SealedFile<E>>>>;

/// One segment (see the module docs).
#[derive(Debug)]
pub(crate) struct Segment {
    pub(crate) base_offset: Offset,
    dir: PathBuf,
    pub(crate) file: Arc<File>,
    size: AtomicU64,
    /// Largest batch max timestamp in the segment, -1 when it holds none (retention).
    max_timestamp: AtomicI64,
    offsets: RwLock<Resident<OffsetEntry>>,
    times: RwLock<Resident<TimeEntry>>,
    sealed_offsets: SealedIndex<OffsetEntry>,
    sealed_times: SealedIndex<TimeEntry>,
    deleted: AtomicBool,
}

impl Segment {
    /// Wraps an open `.log` file holding `size` valid bytes.
    pub(crate) fn new(dir: &Path, base_offset: Offset, file: File, size: u64, max_timestamp: i64) -> Self {
        Self {
            base_offset,
            dir: dir.to_path_buf(),
            file: Arc::new(file),
            size: AtomicU64::new(size),
            max_timestamp: AtomicI64::new(max_timestamp),
            offsets: RwLock::new(Resident::Sealed),
            times: RwLock::new(Resident::Sealed),
            sealed_offsets: Mutex::new(None),
            sealed_times: Mutex::new(None),
            deleted: AtomicBool::new(false),
        }
    }

    /// Opens (creating if needed) a segment's `.log` for reading and positional writes.
    pub(crate) fn open_log_file(dir: &Path, base_offset: Offset) -> io::Result<File> {
        OpenOptions::new().read(true).write(true).create(true).truncate(false).open(segment_path(dir, base_offset, LOG_SUFFIX))
    }

    /// Bytes readers may see.
    pub(crate) fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    /// Publishes bytes written below `size` to readers.
    pub(crate) fn set_size(&self, size: u64) {
        self.size.store(size, Ordering::Release);
    }

    pub(crate) fn max_timestamp(&self) -> i64 {
        self.max_timestamp.load(Ordering::Acquire)
    }

    pub(crate) fn set_max_timestamp(&self, ts: i64) {
        self.max_timestamp.store(ts, Ordering::Release);
    }

    /// The partition directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    pub(crate) fn path(&self, suffix: &str) -> PathBuf {
        let p = segment_path(&self.dir, self.base_offset, suffix);
        if self.deleted.load(Ordering::Acquire) {
            let mut s = p.into_os_string();
            s.push(DELETED_SUFFIX);
            PathBuf::from(s)
        } else {
            p
        }
    }

    /// Marks the files as renamed to `*.deleted` (the caller renamed them).
    pub(crate) fn mark_deleted(&self) {
        self.deleted.store(true, Ordering::Release);
    }

    /// Makes the segment the active one, with its index entries resident.
    pub(crate) fn activate(&self, offsets: Vec<OffsetEntry>, times: Vec<TimeEntry>) {
        *lock::write(&self.offsets) = Resident::Active(offsets);
        *lock::write(&self.times) = Resident::Active(times);
        *lock::mutex(&self.sealed_offsets) = None;
        *lock::mutex(&self.sealed_times) = None;
    }

    /// Drops the resident entries; the caller has written them all to the files.
    pub(crate) fn seal(&self) {
        *lock::write(&self.offsets) = Resident::Sealed;
        *lock::write(&self.times) = Resident::Sealed;
    }

    pub(crate) fn push_offset(&self, e: OffsetEntry) {
        if let Resident::Active(v) = &mut *lock::write(&self.offsets) {
            v.push(e);
        }
    }

    pub(crate) fn push_time(&self, e: TimeEntry) {
        if let Resident::Active(v) = &mut *lock::write(&self.times) {
            v.push(e);
        }
    }

    /// Resident entries from `from` on (what the writer has not yet written to the file).
    pub(crate) fn resident_tail(&self, from_offsets: usize, from_times: usize) -> (Vec<OffsetEntry>, Vec<TimeEntry>) {
        let o = match &*lock::read(&self.offsets) {
            Resident::Active(v) => v.get(from_offsets..).unwrap_or_default().to_vec(),
            Resident::Sealed => Vec::new(),
        };
        let t = match &*lock::read(&self.times) {
            Resident::Active(v) => v.get(from_times..).unwrap_or_default().to_vec(),
            Resident::Sealed => Vec::new(),
        };
        (o, t)
    }

    /// Number of resident entries (for the "index full" roll rule).
    pub(crate) fn resident_len(&self) -> (usize, usize) {
        let o = match &*lock::read(&self.offsets) {
            Resident::Active(v) => v.len(),
            Resident::Sealed => 0,
        };
        let t = match &*lock::read(&self.times) {
            Resident::Active(v) => v.len(),
            Resident::Sealed => 0,
        };
        (o, t)
    }

    /// Runs `f` on the entries wherever they live. `None` when a sealed segment's
    /// index file cannot be opened; callers then scan from the segment start, which
    /// is slow but correct (the index is only an accelerator).
    fn with_entries<E: IndexEntry, R>(
        &self,
        resident: &RwLock<Resident<E>>,
        sealed: &SealedIndex<E>,
        suffix: &str,
        f: impl FnOnce(Entries<'_, E>) -> io::Result<R>,
    ) -> io::Result<Option<R>> {
        {
            let guard = lock::read(resident);
            if let Resident::Active(v) = &*guard {
                return f(Entries::Memory(v)).map(Some);
            }
        }
        let loaded = {
            let mut cached = lock::mutex(sealed);
            if cached.is_none() {
                match File::open(self.path(suffix)).and_then(SealedFile::load) {
                    Ok(s) => *cached = Some(Arc::new(s)),
                    Err(e) => {
                        tracing::debug!(segment = self.base_offset, error = %e, "index file unavailable, scanning the segment");
                        return Ok(None);
                    }
                }
            }
            cached.clone()
        };
        match loaded {
            Some(s) => f(s.entries()).map(Some),
            None => Ok(None),
        }
    }

    /// Loads a sealed segment's index summaries now, so later lookups keep using these
    /// files even after the names are reused (a cleaned segment replacing this one).
    pub(crate) fn pin_indexes(&self) {
        // A missing index means "scan": nothing to pin, and that stays correct.
        let _ = self.with_entries(&self.offsets, &self.sealed_offsets, INDEX_SUFFIX, |_| Ok(()));
        let _ = self.with_entries(&self.times, &self.sealed_times, TIME_INDEX_SUFFIX, |_| Ok(()));
    }

    /// Position of a batch at or before the one holding `offset` (0 when unknown).
    fn position_at_or_before(&self, offset: Offset) -> io::Result<u64> {
        let rel = relative(offset - self.base_offset);
        let found = self.with_entries(&self.offsets, &self.sealed_offsets, INDEX_SUFFIX, |e| {
            e.floor(|x: &OffsetEntry| x.relative_offset <= rel)
        })?;
        Ok(found.flatten().map_or(0, |e| u64::from(e.position)))
    }

    /// Walks from the index floor to the first batch whose last offset is `>= offset`.
    pub(crate) fn find_batch(&self, offset: Offset, size: u64) -> io::Result<Option<(u64, BatchHeader)>> {
        let mut position = self.position_at_or_before(offset)?;
        if position >= size {
            position = 0; // stale or damaged entry: fall back to a scan
        }
        let mut walk = Walker::new(&self.file, position, size);
        loop {
            match walk.step(false)? {
                Step::Batch { position, header } if header.last_offset() >= offset => return Ok(Some((position, header))),
                Step::Batch { .. } => {}
                Step::End | Step::Torn { .. } => return Ok(None),
            }
        }
    }

    /// Whole batches from the one holding `offset`: see [`crate::Log::read`].
    /// `None` when this segment holds no batch at or after `offset`.
    pub(crate) fn read(
        &self,
        offset: Offset,
        max_bytes: usize,
        upper_bound: Option<Offset>,
        min_one: bool,
    ) -> io::Result<Option<Slice>> {
        let size = self.size();
        let Some((start, first)) = self.find_batch(offset, size)? else {
            return Ok(None);
        };
        let empty = Slice { position: start, len: 0, first_offset: offset, next_offset: offset };
        if upper_bound.is_some_and(|u| first.last_offset() >= u) {
            return Ok(Some(empty));
        }
        let limit = start.saturating_add(max_bytes as u64);
        let mut end = start + first.size() as u64;
        if end > limit && !min_one {
            return Ok(Some(empty));
        }
        let mut next_offset = first.next_offset();
        // Jump over whole batches with the index instead of walking every header:
        // every batch before an entry ends at or before the entry's position, and
        // holds offsets below the entry's offset.
        let max_rel = upper_bound.map_or(u32::MAX, |u| relative(u - self.base_offset));
        // Entries of batches still being appended can point past `size`: skip them.
        let jump = self.with_entries(&self.offsets, &self.sealed_offsets, INDEX_SUFFIX, |e| {
            e.floor(|x: &OffsetEntry| {
                let position = u64::from(x.position);
                position <= limit && position < size && x.relative_offset <= max_rel
            })
        })?;
        if let Some(Some(e)) = jump {
            let position = u64::from(e.position);
            if position > end && position < size {
                end = position;
                next_offset = self.base_offset + i64::from(e.relative_offset);
            }
        }
        let mut walk = Walker::new(&self.file, end, size);
        while let Step::Batch { position, header } = walk.step(false)? {
            let batch_end = position + header.size() as u64;
            if batch_end > limit || upper_bound.is_some_and(|u| header.last_offset() >= u) {
                break;
            }
            end = batch_end;
            next_offset = header.next_offset();
        }
        Ok(Some(Slice { position: start, len: (end - start) as usize, first_offset: first.base_offset, next_offset }))
    }

    /// The last time entry with a timestamp below `ts`.
    pub(crate) fn time_floor_below(&self, ts: i64) -> io::Result<Option<TimeEntry>> {
        Ok(self
            .with_entries(&self.times, &self.sealed_times, TIME_INDEX_SUFFIX, |e| e.floor(|x: &TimeEntry| x.timestamp < ts))?
            .flatten())
    }

    /// The last entry of the time index file (for a sealed segment loaded on open):
    /// one positional read, without loading the index.
    pub(crate) fn last_time_entry(&self) -> io::Result<Option<TimeEntry>> {
        let file = File::open(self.path(TIME_INDEX_SUFFIX))?;
        let len = file.metadata()?.len();
        let size = TimeEntry::SIZE as u64;
        if len < size {
            return Ok(None);
        }
        let mut buf = [0u8; TimeEntry::SIZE];
        file.read_exact_at(&mut buf, (len / size - 1) * size)?;
        Ok(Some(TimeEntry::decode(&buf)))
    }
}

/// A byte range of one segment: `[position, position + len)`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Slice {
    pub(crate) position: u64,
    pub(crate) len: usize,
    pub(crate) first_offset: Offset,
    pub(crate) next_offset: Offset,
}

/// Clamps an offset difference into the index's u32 range.
fn relative(delta: i64) -> u32 {
    delta.clamp(0, i64::from(u32::MAX)) as u32
}

/// One step of a [`Walker`].
#[derive(Debug)]
pub(crate) enum Step {
    /// A batch at `position` (CRC-checked only if the walk validates).
    Batch { position: u64, header: BatchHeader },
    /// The end of the range, exactly on a batch boundary.
    End,
    /// Bytes at `position` are not a whole valid batch.
    Torn { position: u64, reason: fjord_record::Error },
}

/// Walks batch headers of a file range with few, growing positional reads.
#[derive(Debug)]
pub(crate) struct Walker<'a> {
    file: &'a File,
    position: u64,
    end: u64,
    buf: Vec<u8>,
    buf_start: u64,
    chunk: usize,
}

const FIRST_CHUNK: usize = 8 << 10;
const MAX_CHUNK: usize = 1 << 20;

impl<'a> Walker<'a> {
    pub(crate) fn new(file: &'a File, position: u64, end: u64) -> Self {
        Self { file, position, end, buf: Vec::new(), buf_start: position, chunk: FIRST_CHUNK }
    }

    /// Makes `[at, at + len)` available in the buffer; `at + len <= end`. Reads
    /// ahead `chunk` bytes; the chunk grows only for whole-batch reads, since a
    /// header-only walk over large batches would read bytes it then skips.
    fn fill(&mut self, at: u64, len: usize, grow: bool) -> io::Result<&[u8]> {
        let have = at >= self.buf_start && at + len as u64 <= self.buf_start + self.buf.len() as u64;
        if !have {
            let want = len.max(self.chunk).min((self.end - at) as usize).max(len);
            self.buf.resize(want, 0);
            self.file.read_exact_at(&mut self.buf, at)?;
            self.buf_start = at;
            if grow {
                self.chunk = (self.chunk * 2).min(MAX_CHUNK);
            }
        }
        let from = (at - self.buf_start) as usize;
        Ok(&self.buf[from..from + len])
    }

    /// The next batch. With `validate`, the whole batch is read and checked (CRC,
    /// records); otherwise only its header's framing.
    pub(crate) fn step(&mut self, validate: bool) -> io::Result<Step> {
        let position = self.position;
        let available = self.end - position;
        if available == 0 {
            return Ok(Step::End);
        }
        let torn = |reason| Ok(Step::Torn { position, reason });
        if available < BATCH_OVERHEAD as u64 {
            return torn(fjord_record::Error::Truncated { needed: BATCH_OVERHEAD, available: available as usize });
        }
        let header = match BatchHeader::parse_unchecked(self.fill(position, BATCH_OVERHEAD, validate)?) {
            Ok(h) => h,
            Err(e) => return torn(e),
        };
        let size = header.size();
        if size as u64 > available {
            return torn(fjord_record::Error::Truncated { needed: size, available: available as usize });
        }
        if validate {
            let bytes = self.fill(position, size, true)?;
            if let Err(e) = BatchHeader::parse_validated(bytes) {
                return torn(e);
            }
        }
        self.position += size as u64;
        Ok(Step::Batch { position, header })
    }

    /// The bytes of the batch the last step returned (`size` bytes at `position`).
    pub(crate) fn batch_bytes(&mut self, position: u64, size: usize) -> io::Result<&[u8]> {
        self.fill(position, size, true)
    }
}
