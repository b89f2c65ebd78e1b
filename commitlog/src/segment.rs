//! One segment: a `.log` file of whole batches starting at `base_offset`, plus its
//! offset and time indexes.
//!
//! A [`Segment`] is shared (`Arc`) between the writer and any number of readers.
//! The writer publishes appended bytes by raising `size` (release) after writing
//! them; readers never look past the `size` they loaded (acquire). Index entries of
//! the active segment are resident and guarded by a short `RwLock` (no I/O is ever
//! done under it); a sealed segment drops them and is searched in its files
//! through a small summary loaded on the first lookup (see `index::SealedFile`).
//!
//! Files: the active segment's `.log` is held open; a sealed segment's files are
//! opened when used, through the bounded descriptor cache of [`crate::files`].
//!
//! # Damage
//! Batches are CRC-checked before a read hands them out, once per segment and byte
//! range: `verified_to` marks the prefix already checked (appends of this process,
//! recovery scans, earlier reads, the scrubber), so a sequential consumer costs one
//! CRC pass over each byte and sendfile stays zero-copy after it. A batch that fails
//! (CRC, framing, offsets out of order) is recorded as the segment's damage: logged
//! once with the file and position, counted, and every later read at or past it is
//! [`Error::CorruptSegment`] instead of data, so nothing is skipped silently. Index
//! entries are cross-checked against the batch headers they point at; a wrong one
//! makes the segment fall back to scanning its `.log` (the index is only an
//! accelerator), never a wrong answer.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use fjord_record::{BatchHeader, Offset, BATCH_OVERHEAD};

use crate::files::FileSlot;
use crate::index::{Entries, IndexEntry, OffsetEntry, SealedFile, TimeEntry};
use crate::txn_index::TXN_INDEX_SUFFIX;
use crate::{lock, Error, Result};

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

/// A sealed segment's index summary, loaded on the first lookup.
type SealedIndex<E> = Mutex<Option<Arc<SealedFile<E>>>>;

/// No damage known (the value of `damage_at`).
const NO_DAMAGE: u64 = u64::MAX;

/// One segment (see the module docs).
#[derive(Debug)]
pub(crate) struct Segment {
    pub(crate) base_offset: Offset,
    dir: PathBuf,
    log_file: FileSlot,
    index_file: FileSlot,
    time_index_file: FileSlot,
    size: AtomicU64,
    /// Largest batch max timestamp in the segment, -1 when it holds none (retention).
    max_timestamp: AtomicI64,
    offsets: RwLock<Resident<OffsetEntry>>,
    times: RwLock<Resident<TimeEntry>>,
    sealed_offsets: SealedIndex<OffsetEntry>,
    sealed_times: SealedIndex<TimeEntry>,
    deleted: AtomicBool,
    /// Every batch in `[0, verified_to)` passed its CRC and framing checks.
    verified_to: AtomicU64,
    /// Position of the first batch known to be damaged ([`NO_DAMAGE`]: none); details
    /// in `damage`.
    damage_at: AtomicU64,
    damage: Mutex<Option<(u64, fjord_record::Error)>>,
    /// An index entry contradicted the log: lookups scan the `.log` instead.
    index_unusable: AtomicBool,
    /// Damage reports of this segment (for the log's counter).
    damage_reports: AtomicU64,
    /// Entries in the `.txnindex` file (see [`crate::txn_index`]): reads open it only
    /// when there are any.
    aborted: AtomicU64,
}

impl Segment {
    /// A segment of `size` valid bytes; its files are opened when used (see
    /// [`Segment::pin_log`] for the active one).
    pub(crate) fn new(dir: &Path, base_offset: Offset, size: u64, max_timestamp: i64) -> Self {
        Self {
            base_offset,
            dir: dir.to_path_buf(),
            log_file: FileSlot::default(),
            index_file: FileSlot::default(),
            time_index_file: FileSlot::default(),
            size: AtomicU64::new(size),
            max_timestamp: AtomicI64::new(max_timestamp),
            offsets: RwLock::new(Resident::Sealed),
            times: RwLock::new(Resident::Sealed),
            sealed_offsets: Mutex::new(None),
            sealed_times: Mutex::new(None),
            deleted: AtomicBool::new(false),
            verified_to: AtomicU64::new(0),
            damage_at: AtomicU64::new(NO_DAMAGE),
            damage: Mutex::new(None),
            index_unusable: AtomicBool::new(false),
            damage_reports: AtomicU64::new(0),
            aborted: AtomicU64::new(0),
        }
    }

    /// The `.log`, open for reading and positional writes: held by the active segment,
    /// cached for a sealed one.
    pub(crate) fn log_file(&self) -> io::Result<Arc<File>> {
        self.log_file.get(|| self.path(LOG_SUFFIX), |p| OpenOptions::new().read(true).write(true).open(p))
    }

    /// [`Segment::log_file`] with the path in the error.
    pub(crate) fn log(&self) -> Result<Arc<File>> {
        self.log_file().map_err(|source| Error::Io { path: self.path(LOG_SUFFIX), source })
    }

    /// Keeps the `.log` open (the segment becomes the active one).
    pub(crate) fn pin_log(&self) -> Result<Arc<File>> {
        if let Some(f) = self.log_file.pinned() {
            return Ok(f);
        }
        let f = self.log()?;
        self.log_file.pin(f.clone());
        Ok(f)
    }

    /// Keeps `file` (this segment's `.log`, just created) open as the active one's.
    pub(crate) fn pin_file(&self, file: File) {
        self.log_file.pin(Arc::new(file));
    }

    /// Bytes readers may see.
    pub(crate) fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    /// Publishes bytes written below `size` to readers. Setting it to its length or
    /// below (a cut) forgets the marks past it: what was cut is gone, damage included.
    pub(crate) fn set_size(&self, size: u64) {
        let old = self.size.swap(size, Ordering::AcqRel);
        if size <= old {
            self.cut_marks(size);
        }
    }

    /// Publishes an append of validated bytes at `[from, to)`.
    pub(crate) fn appended(&self, from: u64, to: u64) {
        let _ = self.verified_to.compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire);
        self.size.store(to, Ordering::Release);
    }

    /// Marks `[0, to)` as checked (a recovery scan validated it).
    pub(crate) fn set_verified(&self, to: u64) {
        self.verified_to.fetch_max(to, Ordering::AcqRel);
    }

    /// The file was cut to `size`: marks past it go (damage cut away is repaired).
    fn cut_marks(&self, size: u64) {
        self.verified_to.fetch_min(size, Ordering::AcqRel);
        let mut damage = lock::mutex(&self.damage);
        if damage.as_ref().is_some_and(|(at, _)| *at >= size) {
            *damage = None;
            self.damage_at.store(NO_DAMAGE, Ordering::Release);
        }
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

    /// Whether the files were renamed to `*.deleted`.
    pub(crate) fn is_deleted(&self) -> bool {
        self.deleted.load(Ordering::Acquire)
    }

    /// Renames the segment's files to `*.deleted` and returns the new paths. Done
    /// under the file slots' locks, so a reader resolves either the old names before or
    /// the `.deleted` names after (see [`crate::files`]). The active `.log` is released
    /// to the cache.
    pub(crate) fn rename_deleted(&self) -> Result<Vec<PathBuf>> {
        self.log_file.unpin();
        self.log_file.locked(|| {
            self.index_file.locked(|| {
                self.time_index_file.locked(|| {
                    let mut renamed = Vec::new();
                    for suffix in [LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX] {
                        let from = self.path(suffix);
                        let mut to = from.clone().into_os_string();
                        to.push(DELETED_SUFFIX);
                        let to = PathBuf::from(to);
                        match std::fs::rename(&from, &to) {
                            Ok(()) => renamed.push(to),
                            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                            Err(e) => {
                                // Back to the old names, so the segment stays whole.
                                for back in &renamed {
                                    let original = PathBuf::from(back.to_string_lossy().trim_end_matches(DELETED_SUFFIX));
                                    let _ = std::fs::rename(back, original);
                                }
                                return Err(Error::Io { path: from, source: e });
                            }
                        }
                    }
                    self.deleted.store(true, Ordering::Release);
                    Ok(renamed)
                })
            })
        })
    }

    /// Entries in the aborted-transactions index.
    pub(crate) fn aborted_count(&self) -> u64 {
        self.aborted.load(Ordering::Acquire)
    }

    /// The writer appended `n` entries to the aborted-transactions index.
    pub(crate) fn add_aborted(&self, n: u64) {
        self.aborted.fetch_add(n, Ordering::AcqRel);
    }

    /// The aborted-transactions index holds `n` entries (loaded or rewritten).
    pub(crate) fn set_aborted(&self, n: u64) {
        self.aborted.store(n, Ordering::Release);
    }

    /// Makes the segment the active one, with its index entries resident.
    pub(crate) fn activate(&self, offsets: Vec<OffsetEntry>, times: Vec<TimeEntry>) {
        *lock::write(&self.offsets) = Resident::Active(offsets);
        *lock::write(&self.times) = Resident::Active(times);
        *lock::mutex(&self.sealed_offsets) = None;
        *lock::mutex(&self.sealed_times) = None;
        self.index_unusable.store(false, Ordering::Release);
    }

    /// Drops the resident entries; the caller has written them all to the files. The
    /// `.log` is no longer held open but handed to the descriptor cache.
    pub(crate) fn seal(&self) {
        *lock::write(&self.offsets) = Resident::Sealed;
        *lock::write(&self.times) = Resident::Sealed;
        self.log_file.unpin();
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
    /// index file cannot be opened or is not sane (or an entry contradicted the log
    /// before); callers then scan from the segment start, which is slow but correct
    /// (the index is only an accelerator).
    fn with_entries<E: IndexEntry, R>(
        &self,
        resident: &RwLock<Resident<E>>,
        sealed: &SealedIndex<E>,
        slot: &FileSlot,
        suffix: &str,
        f: impl FnOnce(Entries<'_, E>) -> io::Result<R>,
    ) -> io::Result<Option<R>> {
        {
            let guard = lock::read(resident);
            if let Resident::Active(v) = &*guard {
                return f(Entries::Memory(v)).map(Some);
            }
        }
        if self.index_unusable.load(Ordering::Acquire) {
            return Ok(None);
        }
        let open = || slot.get(|| self.path(suffix), |p| File::open(p));
        let loaded = {
            let mut cached = lock::mutex(sealed);
            if cached.is_none() {
                match open().and_then(|file| SealedFile::load(&file, self.size())) {
                    Ok(Some(s)) => *cached = Some(Arc::new(s)),
                    Ok(None) => {
                        self.distrust_index("entries out of order or past the end of the log");
                        return Ok(None);
                    }
                    Err(e) => {
                        tracing::debug!(segment = self.base_offset, error = %e, "index file unavailable, scanning the segment");
                        return Ok(None);
                    }
                }
            }
            cached.clone()
        };
        let Some(summary) = loaded else { return Ok(None) };
        match open() {
            Ok(file) => f(summary.entries(&file)).map(Some),
            Err(e) => {
                tracing::debug!(segment = self.base_offset, error = %e, "index file unavailable, scanning the segment");
                Ok(None)
            }
        }
    }

    /// The index files were just rewritten from the log: use them again.
    pub(crate) fn index_rebuilt(&self) {
        *lock::mutex(&self.sealed_offsets) = None;
        *lock::mutex(&self.sealed_times) = None;
        self.index_unusable.store(false, Ordering::Release);
    }

    /// Stops using this segment's index files (an entry contradicted the log): later
    /// lookups scan the `.log`. Reopening the log rebuilds them.
    fn distrust_index(&self, why: &str) {
        if !self.index_unusable.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                path = %self.path(INDEX_SUFFIX).display(), reason = why,
                "damaged index: lookups in this segment scan its log until the log is reopened and the index rebuilt"
            );
        }
    }

    /// Loads a sealed segment's index summaries now (cheap lookups right after a swap).
    pub(crate) fn pin_indexes(&self) {
        // A missing index means "scan": nothing to pin, and that stays correct.
        let _ = self.with_entries(&self.offsets, &self.sealed_offsets, &self.index_file, INDEX_SUFFIX, |_| Ok(()));
        let _ = self.with_entries(&self.times, &self.sealed_times, &self.time_index_file, TIME_INDEX_SUFFIX, |_| Ok(()));
    }

    /// The index entry at or before the batch holding `offset`.
    fn entry_at_or_before(&self, offset: Offset) -> io::Result<Option<OffsetEntry>> {
        let rel = relative(offset - self.base_offset);
        let found = self.with_entries(&self.offsets, &self.sealed_offsets, &self.index_file, INDEX_SUFFIX, |e| {
            e.floor(|x: &OffsetEntry| x.relative_offset <= rel)
        })?;
        Ok(found.flatten())
    }

    /// Walks from the index floor to the first batch whose last offset is `>= offset`
    /// among the first `size` bytes. `None` when there is none. A batch that is not
    /// whole and valid in framing on the way is the segment's damage:
    /// [`Error::CorruptSegment`].
    pub(crate) fn find_batch(&self, offset: Offset, size: u64) -> Result<Option<(u64, BatchHeader)>> {
        let file = self.log()?;
        let io = |source| Error::Io { path: self.path(LOG_SUFFIX), source };
        let entry = self.entry_at_or_before(offset).map_err(io)?.filter(|e| u64::from(e.position) < size);
        let mut position = entry.map_or(0, |e| u64::from(e.position));
        let mut expected = entry.map(|e| self.base_offset + i64::from(e.relative_offset));
        loop {
            let mut walk = Walker::new(&file, position, size);
            let mut first = true;
            // `Err(())`: the first batch after the index entry contradicts it.
            let found: std::result::Result<_, ()> = loop {
                match walk.step(false).map_err(io)? {
                    Step::Batch { header, .. } if first && expected.is_some_and(|x| x != header.base_offset) => break Err(()),
                    Step::Batch { position, header } if header.last_offset() >= offset => break Ok(Some((position, header))),
                    Step::Batch { .. } => first = false,
                    Step::End => break Ok(None),
                    // An entry pointing inside a batch, or damage right there: a scan
                    // from the start tells which.
                    Step::Torn { .. } if first && expected.is_some() => break Err(()),
                    Step::Torn { position, reason } => return Err(self.damaged(position, reason)),
                }
            };
            match found {
                Ok(found) => return Ok(found),
                Err(()) => {
                    self.distrust_index("an entry does not point at the batch it names");
                    position = 0;
                    expected = None;
                }
            }
        }
    }

    /// Records damage found at `position` (the first batch of the segment that is not
    /// whole and valid) and returns the error to answer. Logged once per segment, and
    /// again only if damage is found further up.
    pub(crate) fn damaged(&self, position: u64, reason: fjord_record::Error) -> Error {
        let mut damage = lock::mutex(&self.damage);
        if damage.as_ref().is_none_or(|(at, _)| position < *at) {
            tracing::error!(
                path = %self.path(LOG_SUFFIX).display(), position, reason = %reason,
                "corrupt batch in a log segment: reads at and after it fail with CORRUPT_MESSAGE until it is repaired"
            );
            *damage = Some((position, reason));
            self.damage_at.store(position, Ordering::Release);
            self.damage_reports.fetch_add(1, Ordering::Relaxed);
        }
        let (at, reason) = damage.clone().expect("invariant: set above");
        Error::CorruptSegment { path: self.path(LOG_SUFFIX), position: at, source: reason }
    }

    /// The known damage, as the error reads answer with.
    fn damage_error(&self) -> Option<Error> {
        let damage = lock::mutex(&self.damage);
        damage.as_ref().map(|(at, reason)| Error::CorruptSegment {
            path: self.path(LOG_SUFFIX),
            position: *at,
            source: reason.clone(),
        })
    }

    /// The known damage: its position and what is wrong there.
    pub(crate) fn damage(&self) -> Option<(u64, fjord_record::Error)> {
        lock::mutex(&self.damage).clone()
    }

    /// Position of the known damage, if any.
    pub(crate) fn damage_at(&self) -> Option<u64> {
        Some(self.damage_at.load(Ordering::Acquire)).filter(|&at| at != NO_DAMAGE)
    }

    /// The offset after the last batch that ends at or before `position` (the base
    /// offset when none does): where the good data before damage at `position` ends.
    pub(crate) fn next_offset_before(&self, position: u64) -> Result<Offset> {
        let file = self.log()?;
        let mut walk = Walker::new(&file, 0, position.min(self.size()));
        let mut next = self.base_offset;
        while let Step::Batch { header, .. } =
            walk.step(false).map_err(|source| Error::Io { path: self.path(LOG_SUFFIX), source })?
        {
            next = header.next_offset();
        }
        Ok(next)
    }

    /// How many times damage was recorded in this segment.
    pub(crate) fn damage_reports(&self) -> u64 {
        self.damage_reports.load(Ordering::Relaxed)
    }

    /// Checks the batches of `[start, end)` (CRC, framing, increasing offsets) unless
    /// the verified prefix covers them; the prefix grows when the range continues it.
    /// Returns how far the batches are good: `end` when all are. Damage found is
    /// recorded ([`Segment::damaged`]).
    pub(crate) fn verify(&self, file: &File, start: u64, end: u64) -> Result<u64> {
        let verified = self.verified_to.load(Ordering::Acquire);
        if end <= verified {
            return Ok(end);
        }
        let from = verified.max(start);
        let io = |source| Error::Io { path: self.path(LOG_SUFFIX), source };
        let mut walk = Walker::new(file, from, end);
        let mut good = from;
        let mut next: Option<Offset> = None;
        loop {
            match walk.step_crc().map_err(io)? {
                Step::End => break,
                Step::Batch { position, header } => {
                    // The CRC does not cover the base offset: check that offsets grow.
                    if header.base_offset < self.base_offset || next.is_some_and(|n| header.base_offset < n) {
                        let reason = fjord_record::Error::RecordCountMismatch {
                            count: header.record_count,
                            detail: "base offset out of order in the segment",
                        };
                        let _ = self.damaged(position, reason);
                        break;
                    }
                    good = position + header.size() as u64;
                    next = Some(header.next_offset());
                }
                Step::Torn { position, reason } => {
                    let _ = self.damaged(position, reason);
                    break;
                }
            }
        }
        if from == verified {
            self.verified_to.fetch_max(good, Ordering::AcqRel);
        }
        Ok(good)
    }

    /// The scrubber's step: CRC-checks the batches of `[from, size)` until `budget`
    /// bytes are checked, whether or not a read checked them before (the disk may have
    /// changed them since). Returns where it stopped: `size` when it reached the end or
    /// found damage (recorded; nothing after it can be walked).
    pub(crate) fn scrub(&self, file: &File, from: u64, size: u64, budget: u64) -> Result<u64> {
        if self.damage_at().is_some_and(|at| at <= from) {
            return Ok(size);
        }
        let io = |source| Error::Io { path: self.path(LOG_SUFFIX), source };
        let mut walk = Walker::new(file, from, size);
        let mut at = from;
        let mut next: Option<Offset> = None;
        while at - from < budget {
            match walk.step_crc().map_err(io)? {
                Step::End => break,
                Step::Batch { position, header } => {
                    if header.base_offset < self.base_offset || next.is_some_and(|n| header.base_offset < n) {
                        let detail = "base offset out of order in the segment";
                        let _ = self
                            .damaged(position, fjord_record::Error::RecordCountMismatch { count: header.record_count, detail });
                        return Ok(size);
                    }
                    at = position + header.size() as u64;
                    next = Some(header.next_offset());
                }
                Step::Torn { position, reason } => {
                    let _ = self.damaged(position, reason);
                    return Ok(size);
                }
            }
        }
        if from <= self.verified_to.load(Ordering::Acquire) {
            self.verified_to.fetch_max(at, Ordering::AcqRel);
        }
        Ok(at)
    }

    /// Whole batches from the one holding `offset`: see [`crate::Log::read`].
    /// `None` when this segment holds no batch at or after `offset`;
    /// [`Error::CorruptSegment`] when the read reaches known or newly found damage
    /// before any good batch.
    pub(crate) fn read(
        &self,
        offset: Offset,
        max_bytes: usize,
        upper_bound: Option<Offset>,
        min_one: bool,
    ) -> Result<Option<(Arc<File>, Slice)>> {
        let size = self.size();
        // Nothing at or past known damage is served: up to it, reads go on as usual.
        let readable = self.damage_at().map_or(size, |at| at.min(size));
        let Some((start, first)) = self.find_batch(offset, readable)? else {
            // Offsets past the damage (up to the next segment) are not skipped over.
            if let Some(e) = self.damage_error() {
                return Err(e);
            }
            return Ok(None);
        };
        let file = self.log()?;
        let empty = Slice { position: start, len: 0, first_offset: offset, next_offset: offset };
        if upper_bound.is_some_and(|u| first.last_offset() >= u) {
            return Ok(Some((file, empty)));
        }
        let limit = start.saturating_add(max_bytes as u64);
        let mut end = start + first.size() as u64;
        if end > limit && !min_one {
            return Ok(Some((file, empty)));
        }
        let mut next_offset = first.next_offset();
        // Jump over whole batches with the index instead of walking every header:
        // every batch before an entry ends at or before the entry's position, and
        // holds offsets below the entry's offset.
        let max_rel = upper_bound.map_or(u32::MAX, |u| relative(u - self.base_offset));
        // Entries of batches still being appended can point past `size`: skip them.
        let jump = self
            .with_entries(&self.offsets, &self.sealed_offsets, &self.index_file, INDEX_SUFFIX, |e| {
                e.floor(|x: &OffsetEntry| {
                    let position = u64::from(x.position);
                    position <= limit && position < readable && x.relative_offset <= max_rel
                })
            })
            .map_err(|source| Error::Io { path: self.path(INDEX_SUFFIX), source })?;
        let io = |source| Error::Io { path: self.path(LOG_SUFFIX), source };
        let (before_jump, next_before_jump) = (end, next_offset);
        if let Some(Some(e)) = jump {
            let position = u64::from(e.position);
            if position > end && position < readable {
                end = position;
                next_offset = self.base_offset + i64::from(e.relative_offset);
            }
        }
        let mut walk = Walker::new(&file, end, readable);
        let mut first_step = end != before_jump;
        loop {
            match walk.step(false).map_err(io)? {
                Step::Batch { header, .. } if first_step && header.base_offset != next_offset => {
                    // The entry jumped to does not name the batch there: walk instead.
                    self.distrust_index("an entry does not point at the batch it names");
                    (end, next_offset) = (before_jump, next_before_jump);
                    walk = Walker::new(&file, end, readable);
                    first_step = false;
                }
                Step::Batch { position, header } => {
                    first_step = false;
                    let batch_end = position + header.size() as u64;
                    if batch_end > limit || upper_bound.is_some_and(|u| header.last_offset() >= u) {
                        break;
                    }
                    end = batch_end;
                    next_offset = header.next_offset();
                }
                Step::Torn { .. } if first_step => {
                    self.distrust_index("an entry points inside a batch");
                    (end, next_offset) = (before_jump, next_before_jump);
                    walk = Walker::new(&file, end, readable);
                    first_step = false;
                }
                // Damage after whole batches: the read ends before it, the next one
                // starts at it and finds it.
                Step::Torn { .. } | Step::End => break,
            }
        }
        let good = self.verify(&file, start, end)?;
        if good < end {
            if good <= start {
                return Err(self.damage_error().expect("invariant: verify recorded the damage"));
            }
            // The good batches before the damage, and the offset after them.
            end = good;
            let mut walk = Walker::new(&file, start, end);
            while let Step::Batch { header, .. } = walk.step(false).map_err(io)? {
                next_offset = header.next_offset();
            }
        }
        Ok(Some((file, Slice { position: start, len: (end - start) as usize, first_offset: first.base_offset, next_offset })))
    }

    /// The last time entry with a timestamp below `ts`.
    pub(crate) fn time_floor_below(&self, ts: i64) -> io::Result<Option<TimeEntry>> {
        Ok(self
            .with_entries(&self.times, &self.sealed_times, &self.time_index_file, TIME_INDEX_SUFFIX, |e| {
                e.floor(|x: &TimeEntry| x.timestamp < ts)
            })?
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

/// How much of each batch a [`Walker`] step checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    /// The header's framing only.
    Framing,
    /// Framing and the CRC (what reads check).
    Crc,
    /// Framing, CRC and every record (recovery).
    Records,
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
        self.step_checked(if validate { Check::Records } else { Check::Framing })
    }

    /// The next batch, its framing and CRC checked (not its records: reads check what
    /// the CRC covers, at the CRC's speed).
    pub(crate) fn step_crc(&mut self) -> io::Result<Step> {
        self.step_checked(Check::Crc)
    }

    fn step_checked(&mut self, check: Check) -> io::Result<Step> {
        let position = self.position;
        let available = self.end - position;
        if available == 0 {
            return Ok(Step::End);
        }
        let torn = |reason| Ok(Step::Torn { position, reason });
        if available < BATCH_OVERHEAD as u64 {
            return torn(fjord_record::Error::Truncated { needed: BATCH_OVERHEAD, available: available as usize });
        }
        let whole = check != Check::Framing;
        let header = match BatchHeader::parse_unchecked(self.fill(position, BATCH_OVERHEAD, whole)?) {
            Ok(h) => h,
            Err(e) => return torn(e),
        };
        let size = header.size();
        if size as u64 > available {
            return torn(fjord_record::Error::Truncated { needed: size, available: available as usize });
        }
        let checked = match check {
            Check::Framing => Ok(()),
            Check::Crc => BatchHeader::parse(self.fill(position, size, true)?).map(drop),
            Check::Records => BatchHeader::parse_validated(self.fill(position, size, true)?).map(drop),
        };
        if let Err(e) = checked {
            return torn(e);
        }
        self.position += size as u64;
        Ok(Step::Batch { position, header })
    }

    /// The bytes of the batch the last step returned (`size` bytes at `position`).
    pub(crate) fn batch_bytes(&mut self, position: u64, size: usize) -> io::Result<&[u8]> {
        self.fill(position, size, true)
    }
}
