//! Opening a partition directory: find the segments, trust what was flushed, and
//! re-validate everything after the recovery point.
//!
//! For each segment, oldest first:
//! - segments entirely below the recovery point are trusted: only their index
//!   files are sanity-checked (whole entries, sorted, inside the file); a bad or
//!   missing index is rebuilt from the log;
//! - the segment holding the recovery point and everything after it is re-read
//!   batch by batch with the CRC and record framing checked, and its indexes are
//!   rebuilt; the first invalid or incomplete batch and everything after it (in
//!   that segment and in later ones) is truncated away, with a warning, after being
//!   copied into `<dir>-damaged-<ms>/` (see `crate::repair`): nothing is deleted unseen;
//! - after a clean shutdown (the `.clean-shutdown` marker names the log end
//!   offset) nothing is re-read but the active segment's tail after its last index
//!   entry, which is CRC-checked.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fjord_record::Offset;

use crate::checkpoint::sync_dir;
use crate::error::IoContext;
use crate::index::{self, IndexBuilder, OffsetEntry, TimeEntry};
use crate::segment::{segment_path, Segment, Step, Walker, DELETED_SUFFIX, INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX};
use crate::txn_index::TXN_INDEX_SUFFIX;
use crate::{epoch, LogConfig, Result};

/// Written by `Log::close` with the log end offset; its presence on open means no
/// recovery scan is needed.
pub(crate) const CLEAN_SHUTDOWN: &str = ".clean-shutdown";

/// The state of one segment after a scan of its `.log`.
#[derive(Debug, Default)]
pub(crate) struct Scan {
    /// Bytes of whole valid batches from the start.
    pub(crate) valid_size: u64,
    /// Offset after the last valid batch, `None` when there is none.
    pub(crate) next_offset: Option<Offset>,
    pub(crate) offsets: Vec<OffsetEntry>,
    pub(crate) times: Vec<TimeEntry>,
    pub(crate) builder: IndexBuilder,
    pub(crate) first_timestamp: Option<i64>,
    /// Where and why the scan stopped before the end of the file.
    pub(crate) torn: Option<(u64, String)>,
}

/// Reads the segment's batches from the start, rebuilding its index entries. With
/// `validate`, checks CRCs and records too. Batches must have offsets inside
/// `[base_offset, next_base)` and in order; the scan stops at the first that does not.
pub(crate) fn scan(
    file: &File,
    base_offset: Offset,
    len: u64,
    next_base: Option<Offset>,
    interval: u32,
    validate: bool,
) -> io::Result<Scan> {
    let mut s = Scan::default();
    let mut walk = Walker::new(file, 0, len);
    let mut expected = base_offset;
    loop {
        match walk.step(validate)? {
            Step::End => break,
            Step::Torn { position, reason } => {
                s.torn = Some((position, reason.to_string()));
                break;
            }
            Step::Batch { position, header } => {
                let in_range = header.base_offset >= expected
                    && header.last_offset() - base_offset <= i64::from(u32::MAX)
                    && next_base.is_none_or(|n| header.last_offset() < n);
                if !in_range {
                    s.torn = Some((position, format!("batch offset {} out of order", header.base_offset)));
                    break;
                }
                // Index positions are u32; segment.bytes keeps real segments far below.
                if position + header.size() as u64 > u64::from(u32::MAX) {
                    s.torn = Some((position, "segment larger than 4 GiB".to_owned()));
                    break;
                }
                let rel = (header.base_offset - base_offset) as u32;
                let (o, t) = s.builder.on_batch(interval, rel, position as u32, header.max_timestamp, header.size() as u64);
                s.offsets.extend(o);
                s.times.extend(t);
                s.first_timestamp.get_or_insert(header.max_timestamp);
                s.valid_size = position + header.size() as u64;
                s.next_offset = Some(header.next_offset());
                expected = header.next_offset();
            }
        }
    }
    Ok(s)
}

/// The active segment's writer-side state.
#[derive(Debug)]
pub(crate) struct Active {
    pub(crate) segment: Arc<Segment>,
    /// The segment's `.log` (also pinned in the segment): appends write here without
    /// going through the segment's file slot.
    pub(crate) log_file: Arc<File>,
    pub(crate) index_file: File,
    pub(crate) time_index_file: File,
    /// Resident entries already written to the files.
    pub(crate) index_written: usize,
    pub(crate) times_written: usize,
    pub(crate) builder: IndexBuilder,
    /// Max timestamp of the first batch (Kafka's base for `segment.ms`).
    pub(crate) first_timestamp: Option<i64>,
    /// The `.log`'s disk blocks are reserved up to here (see [`Active::reserve`]).
    reserved_to: u64,
}

/// How far ahead of the writes [`Active::reserve`] reserves blocks: little unused space
/// per partition, and the `fallocate` call rare. The step hardly matters for speed:
/// 211 KB writes into blocks reserved 1, 4 or 16 MiB at a time ran at 4.84, 4.93 and
/// 5.0 GB/s of CPU time on ext4 here.
const RESERVE_AHEAD: u64 = 4 << 20;

impl Active {
    /// Makes `segment` active with the given entries, writing them as its index files.
    pub(crate) fn install(
        segment: Arc<Segment>,
        offsets: Vec<OffsetEntry>,
        times: Vec<TimeEntry>,
        builder: IndexBuilder,
        first_timestamp: Option<i64>,
        rewrite_files: bool,
    ) -> Result<Self> {
        let index_path = segment.path(INDEX_SUFFIX);
        let time_path = segment.path(TIME_INDEX_SUFFIX);
        if rewrite_files {
            fs::write(&index_path, index::encode(&offsets)).at(&index_path)?;
            fs::write(&time_path, index::encode(&times)).at(&time_path)?;
        }
        let open = |p: &Path| OpenOptions::new().append(true).create(true).open(p).at(p);
        let index_file = open(&index_path)?;
        let time_index_file = open(&time_path)?;
        let log_file = segment.pin_log()?;
        let (index_written, times_written) = (offsets.len(), times.len());
        let reserved_to = segment.size();
        segment.activate(offsets, times);
        Ok(Self {
            segment,
            log_file,
            index_file,
            time_index_file,
            index_written,
            times_written,
            builder,
            first_timestamp,
            reserved_to,
        })
    }

    /// Makes sure the `.log`'s disk blocks up to `end` are allocated, reserving up to
    /// [`RESERVE_AHEAD`] more (never past `limit`, the segment size at which it rolls)
    /// with `FALLOC_FL_KEEP_SIZE`: the file's length does not change, so readers and
    /// recovery see only written bytes. A write into reserved blocks skips ext4's
    /// per-write delayed-allocation bookkeeping: 1 MiB page-cache writes cost a third
    /// less CPU here. Reserving is an optimisation only: where the file system refuses,
    /// the write goes ahead and allocates as usual.
    pub(crate) fn reserve(&mut self, end: u64, limit: u64) {
        if end <= self.reserved_to {
            return;
        }
        let from = self.reserved_to.max(self.segment.size());
        let to = end.max(from.saturating_add(RESERVE_AHEAD).min(limit));
        let fd = std::os::fd::AsRawFd::as_raw_fd(&*self.log_file);
        let flags = nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE;
        match nix::fcntl::fallocate(fd, flags, from as i64, (to - from) as i64) {
            Ok(()) => self.reserved_to = to,
            // No support here: stop asking for this segment.
            Err(nix::errno::Errno::EOPNOTSUPP) => self.reserved_to = u64::MAX,
            Err(e) => {
                // E.g. a full disk: the write itself reports it, precisely.
                tracing::debug!(segment = self.segment.base_offset, error = %e, "could not reserve segment space");
                self.reserved_to = to;
            }
        }
    }

    /// Gives back the blocks reserved past the written bytes (the file's length is
    /// already that of its data; truncating to it frees what lies beyond). Always
    /// truncates: a reservation made before a crash is not known to this `Active`.
    pub(crate) fn release_reserved(&mut self) -> io::Result<()> {
        let size = self.segment.size();
        self.log_file.set_len(size)?;
        self.reserved_to = size;
        Ok(())
    }
}

/// Fails with [`Error::UnreadableSegment`] when a segment's `.log` in `dir` is not a
/// readable regular file. Skipped as an unexpected entry (as it once was), the log would
/// open without that segment: shorter when it was the last one, with its indexes removed
/// as orphans, and its base offset reused by a new empty segment.
///
/// [`Error::UnreadableSegment`]: crate::Error::UnreadableSegment
fn check_segment_files(dir: &Path) -> Result<()> {
    for entry in fs::read_dir(dir).at(dir)? {
        let entry = entry.at(dir)?;
        if !matches!(parse_segment_name(&entry.file_name().to_string_lossy()), Some((_, LOG_SUFFIX))) {
            continue;
        }
        let path = entry.path();
        // Followed through a link: a link to a segment file is a segment file.
        if let Some(found) = not_a_segment_file(fs::metadata(&path)) {
            return Err(crate::Error::UnreadableSegment { path, found });
        }
    }
    Ok(())
}

/// What a `.log` path holds instead of a regular file, if anything else.
fn not_a_segment_file(metadata: io::Result<fs::Metadata>) -> Option<String> {
    match metadata {
        Ok(m) if m.is_file() => None,
        Ok(m) if m.is_dir() => Some("a directory".to_owned()),
        Ok(_) => Some("a special file".to_owned()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Some("a link to nothing".to_owned()),
        Err(e) => Some(format!("unreadable ({e})")),
    }
}

/// What [`load`] found.
#[derive(Debug)]
pub(crate) struct Loaded {
    pub(crate) segments: BTreeMap<Offset, Arc<Segment>>,
    pub(crate) active: Active,
    pub(crate) log_end_offset: Offset,
    pub(crate) recovery_point: Offset,
}

/// Opens or creates the partition directory `dir` (see the module docs).
pub(crate) fn load(dir: &Path, config: &LogConfig, recovery_point: Offset) -> Result<Loaded> {
    fs::create_dir_all(dir).at(dir)?;
    // Before anything in the directory is changed (interrupted swaps finished, indexes
    // without a segment removed, a torn tail cut).
    check_segment_files(dir)?;
    crate::cleaner::finish_interrupted_swaps(dir)?;
    let mut bases = Vec::new();
    let mut index_files = Vec::new();
    for entry in fs::read_dir(dir).at(dir)? {
        let entry = entry.at(dir)?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == epoch::FILE_NAME
            || name == CLEAN_SHUTDOWN
            || name == crate::cleaner::CLEANER_CHECKPOINT
            || name == crate::partition_metadata::PARTITION_METADATA
        {
            continue;
        }
        if name.ends_with(DELETED_SUFFIX) || name.ends_with(".tmp") {
            // A deletion or a checkpoint write that a crash interrupted: finish it.
            fs::remove_file(&path).at(&path)?;
            continue;
        }
        match parse_segment_name(&name) {
            // Each a readable file: see check_segment_files.
            Some((base, LOG_SUFFIX)) => bases.push(base),
            Some((base, INDEX_SUFFIX | TIME_INDEX_SUFFIX | TXN_INDEX_SUFFIX)) => index_files.push((base, path)),
            // Producer state snapshots: loaded by the log after the segments.
            Some((_, crate::producer_state::SNAPSHOT_SUFFIX)) => {}
            _ => tracing::warn!(path = %path.display(), "ignoring unexpected file in a partition directory"),
        }
    }
    bases.sort_unstable();
    for (base, path) in index_files {
        if bases.binary_search(&base).is_err() {
            tracing::warn!(path = %path.display(), "removing an index without its log segment");
            fs::remove_file(&path).at(&path)?;
        }
    }

    let marker = dir.join(CLEAN_SHUTDOWN);
    let clean_end: Option<Offset> = match fs::read_to_string(&marker) {
        Ok(text) => {
            fs::remove_file(&marker).at(&marker)?;
            // From here on a crash must lead to a recovery scan.
            sync_dir(dir)?;
            text.trim().parse().ok()
        }
        Err(_) => None,
    };
    // Everything below this offset is trusted without a CRC check.
    let trusted = if clean_end.is_some() { Offset::MAX } else { recovery_point };

    if bases.is_empty() {
        bases.push(0);
    }
    let mut segments = BTreeMap::new();
    let mut active = None;
    // Log bytes of the segments before the one being loaded.
    let mut kept_before = 0;
    let last = bases.len() - 1;
    for (i, &base) in bases.iter().enumerate() {
        let is_last = i == last;
        let next_base = bases.get(i + 1).copied();
        let log_path = segment_path(dir, base, LOG_SUFFIX);
        // Only the length: a sealed segment's `.log` is opened when read (crate::files).
        let len = match fs::metadata(&log_path) {
            Ok(m) => m.len(),
            // A new log: its first segment.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                OpenOptions::new().write(true).create(true).truncate(false).open(&log_path).at(&log_path)?;
                0
            }
            Err(e) => return Err(crate::Error::Io { path: log_path, source: e }),
        };
        let must_scan = match next_base {
            _ if trusted == Offset::MAX => false,
            Some(next) => next > trusted,
            None => true,
        };
        let segment = Arc::new(Segment::new(dir, base, len, i64::MIN));
        if !must_scan {
            if is_last {
                if let Some(a) = load_clean_active(&segment, len, config)? {
                    segments.insert(base, segment);
                    active = Some(a);
                    break;
                }
                tracing::warn!(dir = %dir.display(), segment = base, "rebuilding a missing or damaged index");
            } else {
                // Flushed data: damage here is reported and fenced, never cut away.
                load_trusted_sealed(&segment, len, config)?;
                segments.insert(base, segment);
                kept_before += len;
                continue;
            }
        }
        let s = scan(&*segment.log()?, base, len, next_base, config.index_interval_bytes, true).at(&log_path)?;
        let truncated = s.valid_size < len;
        if truncated {
            let (position, reason) = s.torn.clone().unwrap_or_default();
            // Usually a torn write, but it may be the only copy of records a disk fault
            // damaged: the cut bytes and the later segments are kept aside before anything
            // is cut, as a repair keeps them.
            let later: Vec<PathBuf> = bases[i + 1..].iter().map(|&b| segment_path(dir, b, LOG_SUFFIX)).collect();
            let kept = (bases[0], s.next_offset.unwrap_or(base), kept_before + s.valid_size);
            let now_ms = u64::try_from(fjord_record::now_ms()).unwrap_or(0);
            let side_dir = crate::repair::keep_recovery_cut(dir, &log_path, s.valid_size, len, &reason, &later, kept, now_ms)?;
            tracing::warn!(
                dir = %dir.display(), segment = base, position, reason = %reason, dropped_bytes = len - s.valid_size,
                later_segments = later.len(), kept_aside_in = %side_dir.display(),
                "truncating an invalid log tail (the cut bytes are kept aside)"
            );
            segment.log()?.set_len(s.valid_size).at(&log_path)?;
        }
        segment.set_size(s.valid_size);
        segment.set_verified(s.valid_size);
        segment.set_max_timestamp(s.builder.max_timestamp);
        segments.insert(base, segment.clone());
        if is_last || truncated {
            for &later in &bases[i + 1..] {
                tracing::warn!(dir = %dir.display(), segment = later, "removing a segment after a truncated tail (kept aside)");
                for suffix in [LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX] {
                    remove_if_exists(&segment_path(dir, later, suffix))?;
                }
            }
            active = Some(Active::install(segment, s.offsets, s.times, s.builder, s.first_timestamp, true)?);
            break;
        }
        let mut builder = s.builder;
        let mut times = s.times;
        times.extend(builder.time_entry());
        write_index_files(&segment, &s.offsets, &times)?;
        kept_before += s.valid_size;
    }
    let active = active.expect("invariant: the loop ends with an active segment");
    let log_end_offset = next_offset_of(&active)?;
    let recovery_point = match clean_end {
        Some(_) => log_end_offset,
        None => recovery_point.clamp(active_floor(&segments), log_end_offset),
    };
    if clean_end.is_some_and(|end| end != log_end_offset) {
        tracing::warn!(dir = %dir.display(), "clean shutdown marker disagrees with the log end offset");
    }
    Ok(Loaded { segments, active, log_end_offset, recovery_point })
}

/// Opens a sealed segment below the recovery point (flushed before the last shutdown
/// or crash) without reading it whole. Its indexes are checked, and the batch headers
/// after the last offset entry walked; what they reveal is recorded as the segment's
/// damage (logged, counted, and reads at and past it fail), never truncated, since
/// nothing flushed can be a torn write:
/// - a batch that is not whole and valid in framing;
/// - an offset index that is in order but points at or past the end of the `.log`, or
///   a time index naming an offset past the last batch: the `.log` lost its tail;
/// - missing or unusable indexes are rebuilt from a CRC-checked scan, and a bad batch
///   found by it is damage too.
fn load_trusted_sealed(segment: &Segment, len: u64, config: &LogConfig) -> Result<()> {
    let log_path = segment.path(LOG_SUFFIX);
    if sealed_indexes_are_sane(segment, len)? {
        let last_time = segment.last_time_entry().at(segment.path(TIME_INDEX_SUFFIX))?;
        segment.set_max_timestamp(last_time.map_or(i64::MIN, |t| t.timestamp));
        let start = last_offset_entry(segment)?.map_or(0, |e| u64::from(e.position));
        let file = segment.log()?;
        let mut walk = Walker::new(&file, start, len);
        let mut next = segment.base_offset;
        loop {
            match walk.step(false).at(&log_path)? {
                Step::Batch { header, .. } => next = header.next_offset(),
                Step::Torn { position, reason } => {
                    let _ = segment.damaged(position, reason);
                    return Ok(());
                }
                Step::End => break,
            }
        }
        let Some(t) = last_time else { return Ok(()) };
        let named = segment.base_offset + i64::from(t.relative_offset);
        if named >= next {
            let _ = segment.damaged(len, fjord_record::Error::Truncated { needed: 0, available: 0 });
            tracing::error!(
                path = %log_path.display(), time_index_offset = named, last_batch_end = next,
                "the time index names an offset past the last batch: the segment lost its tail"
            );
            return Ok(());
        }
        // The last time entry is the segment's largest timestamp, which retention
        // deletes it by: it must name a batch that carries exactly that timestamp.
        match segment.find_batch(named, len) {
            Ok(Some((_, h))) if h.base_offset == named && h.max_timestamp == t.timestamp => return Ok(()),
            Err(crate::Error::CorruptSegment { .. }) => return Ok(()),
            Err(e) => return Err(e),
            Ok(_) => {
                tracing::warn!(path = %segment.path(TIME_INDEX_SUFFIX).display(), "the time index's last entry does not match its batch")
            }
        }
    }
    if let Some(e) = offset_index_past(segment, len) {
        // The index is kept as it is: it is the evidence, and the next open finds it again.
        let needed = e.position as usize;
        let _ = segment.damaged(len, fjord_record::Error::Truncated { needed, available: len as usize });
        let s = scan(&*segment.log()?, segment.base_offset, len, None, config.index_interval_bytes, false).at(&log_path)?;
        segment.set_max_timestamp(s.builder.max_timestamp);
        if let Some((position, reason)) = s.torn {
            tracing::error!(path = %log_path.display(), position, reason = %reason, "and a batch before that point is damaged");
        }
        return Ok(());
    }
    tracing::warn!(path = %segment.path(INDEX_SUFFIX).display(), "rebuilding a missing or damaged index");
    let s = scan(&*segment.log()?, segment.base_offset, len, None, config.index_interval_bytes, true).at(&log_path)?;
    segment.set_verified(s.valid_size);
    segment.set_max_timestamp(s.builder.max_timestamp);
    if s.valid_size < len {
        let position = s.valid_size;
        let reason = fjord_record::Error::MalformedRecord { position: 0, detail: "invalid batch found by the recovery scan" };
        let _ = segment.damaged(position, reason);
        if let Some((_, why)) = &s.torn {
            tracing::error!(path = %log_path.display(), position, reason = %why, "what the recovery scan found");
        }
    }
    let mut builder = s.builder;
    let mut times = s.times;
    times.extend(builder.time_entry());
    write_index_files(segment, &s.offsets, &times)?;
    segment.index_rebuilt();
    Ok(())
}

/// The last entry of a sealed segment's offset index file, when the file holds whole
/// entries.
fn last_offset_entry(segment: &Segment) -> Result<Option<OffsetEntry>> {
    let path = segment.path(INDEX_SUFFIX);
    let Ok(f) = File::open(&path) else { return Ok(None) };
    let o = f.metadata().at(&path)?.len();
    if o == 0 || o % OFFSET_ENTRY_SIZE != 0 {
        return Ok(None);
    }
    let mut buf = [0u8; 8];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut buf, o - 8).at(&path)?;
    Ok(Some(<OffsetEntry as index::IndexEntry>::decode(&buf)))
}

/// The last entry of an offset index that is in order (so not garbage) but points at
/// or past the end of a `.log` of `len` bytes: the `.log` was cut short.
fn offset_index_past(segment: &Segment, len: u64) -> Option<OffsetEntry> {
    let entries = index::decode::<OffsetEntry>(&fs::read(segment.path(INDEX_SUFFIX)).ok()?)?;
    let in_order = entries.windows(2).all(|w| w[0].relative_offset < w[1].relative_offset && w[0].position < w[1].position);
    entries.last().copied().filter(|e| in_order && u64::from(e.position) >= len)
}

fn active_floor(segments: &BTreeMap<Offset, Arc<Segment>>) -> Offset {
    segments.keys().next().copied().unwrap_or(0)
}

/// The log end offset: after the active segment's last batch, or its base when empty.
fn next_offset_of(active: &Active) -> Result<Offset> {
    let seg = &active.segment;
    let size = seg.size();
    let path = seg.path(LOG_SUFFIX);
    // The last resident entry is a batch start near the end; walk from there.
    let (entries, _) = seg.resident_tail(0, 0);
    let start = entries.last().map_or(0, |e| u64::from(e.position));
    let file = seg.log()?;
    let mut walk = Walker::new(&file, start, size);
    let mut next = seg.base_offset;
    while let Step::Batch { header, .. } = walk.step(false).at(&path)? {
        next = header.next_offset();
    }
    Ok(next)
}

/// Loads the active segment's indexes after a clean shutdown and CRC-checks the
/// batches after the last index entry. `None` when anything looks wrong: the caller
/// then rebuilds everything from the log.
fn load_clean_active(segment: &Arc<Segment>, len: u64, config: &LogConfig) -> Result<Option<Active>> {
    let Some((offsets, times)) = read_index_files(segment, len) else {
        return Ok(None);
    };
    if len > 0 && times.is_empty() {
        return Ok(None);
    }
    let loaded = (offsets.len(), times.len());
    let path = segment.path(LOG_SUFFIX);
    let Some(r) = resume(segment, offsets, times, len, config.index_interval_bytes, true).at(&path)? else {
        return Ok(None);
    };
    segment.set_max_timestamp(r.builder.max_timestamp);
    let rewrite = (r.offsets.len(), r.times.len()) != loaded;
    Active::install(segment.clone(), r.offsets, r.times, r.builder, r.first_timestamp, rewrite).map(Some)
}

/// A segment's whole index files, when present and sane for a `.log` of `len` bytes.
pub(crate) fn read_index_files(segment: &Segment, len: u64) -> Option<(Vec<OffsetEntry>, Vec<TimeEntry>)> {
    let offsets = index::decode::<OffsetEntry>(&fs::read(segment.path(INDEX_SUFFIX)).ok()?)?;
    let times = index::decode::<TimeEntry>(&fs::read(segment.path(TIME_INDEX_SUFFIX)).ok()?)?;
    (index::offsets_are_sane(&offsets, len) && index::times_are_sane(&times)).then_some((offsets, times))
}

/// Index state resumed from loaded entries by [`resume`].
#[derive(Debug)]
pub(crate) struct Resumed {
    pub(crate) offsets: Vec<OffsetEntry>,
    pub(crate) times: Vec<TimeEntry>,
    pub(crate) builder: IndexBuilder,
    /// Offset after the last batch below `len`; `None` when there is none.
    pub(crate) next_offset: Option<Offset>,
    pub(crate) first_timestamp: Option<i64>,
}

/// Continues index building from loaded entries that all point below `len`: walks
/// the batches from the last offset entry to `len` (CRC-checked with `validate`),
/// adding the entries append would have added. Only that tail is read, not the
/// whole segment. `None` when a batch there is torn or invalid.
pub(crate) fn resume(
    segment: &Segment,
    mut offsets: Vec<OffsetEntry>,
    mut times: Vec<TimeEntry>,
    len: u64,
    interval: u32,
    validate: bool,
) -> io::Result<Option<Resumed>> {
    let start = offsets.last().map_or(0, |e| u64::from(e.position));
    let mut builder = IndexBuilder::resume(0, times.last().copied());
    let file = segment.log_file()?;
    let mut walk = Walker::new(&file, start, len);
    // The batch at the last entry is indexed already: account for it without an entry.
    let mut at_entry = !offsets.is_empty();
    let mut next_offset = None;
    loop {
        match walk.step(validate)? {
            Step::End => break,
            Step::Torn { .. } => return Ok(None),
            Step::Batch { position, header } => {
                let rel = (header.base_offset - segment.base_offset).clamp(0, i64::from(u32::MAX)) as u32;
                let size = header.size() as u64;
                if at_entry {
                    at_entry = false;
                    builder.observe(rel, header.max_timestamp, size);
                } else {
                    let (o, t) = builder.on_batch(interval, rel, position as u32, header.max_timestamp, size);
                    offsets.extend(o);
                    times.extend(t);
                }
                next_offset = Some(header.next_offset());
            }
        }
    }
    let first_timestamp = match Walker::new(&file, 0, len).step(false)? {
        Step::Batch { header, .. } => Some(header.max_timestamp),
        _ => None,
    };
    Ok(Some(Resumed { offsets, times, builder, next_offset, first_timestamp }))
}

/// Cheap checks of a trusted sealed segment's index files without reading them
/// whole: whole entries, a last offset entry inside the log, and a time index that
/// holds the segment's largest timestamp (it is never empty for a non-empty log).
fn sealed_indexes_are_sane(segment: &Segment, len: u64) -> Result<bool> {
    let meta = |suffix| fs::metadata(segment.path(suffix)).map(|m| m.len()).ok();
    let (Some(o), Some(t)) = (meta(INDEX_SUFFIX), meta(TIME_INDEX_SUFFIX)) else {
        return Ok(false);
    };
    if o % OFFSET_ENTRY_SIZE != 0 || t % TIME_ENTRY_SIZE != 0 || (len > 0 && t == 0) {
        return Ok(false);
    }
    if o > 0 {
        let path = segment.path(INDEX_SUFFIX);
        let f = File::open(&path).at(&path)?;
        let mut buf = [0u8; 8];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut buf, o - 8).at(&path)?;
        let last = <OffsetEntry as index::IndexEntry>::decode(&buf);
        if u64::from(last.position) >= len {
            return Ok(false);
        }
    }
    Ok(true)
}

const OFFSET_ENTRY_SIZE: u64 = <OffsetEntry as index::IndexEntry>::SIZE as u64;
const TIME_ENTRY_SIZE: u64 = <TimeEntry as index::IndexEntry>::SIZE as u64;

/// Writes a sealed segment's index files whole.
pub(crate) fn write_index_files(segment: &Segment, offsets: &[OffsetEntry], times: &[TimeEntry]) -> Result<()> {
    let index_path = segment.path(INDEX_SUFFIX);
    fs::write(&index_path, index::encode(offsets)).at(&index_path)?;
    let time_path = segment.path(TIME_INDEX_SUFFIX);
    fs::write(&time_path, index::encode(times)).at(&time_path)
}

pub(crate) fn remove_if_exists(path: &PathBuf) -> Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(crate::Error::Io { path: path.clone(), source: e }),
        _ => Ok(()),
    }
}

/// `00000000000000000123.log` → `(123, "log")`.
fn parse_segment_name(name: &str) -> Option<(Offset, &str)> {
    let (stem, suffix) = name.split_once('.')?;
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((stem.parse().ok()?, suffix))
}
