//! The sparse offset index and the time index of a segment.
//!
//! ```text
//! .index       8-byte entries: relative offset u32 BE, file position u32 BE
//! .timeindex  12-byte entries: timestamp i64 BE, relative offset u32 BE
//! ```
//!
//! Both are sorted by both fields, so a lookup is a binary search. An offset entry
//! points at the start of a batch whose base offset is `base_offset + relative_offset`;
//! a time entry `(t, r)` says that every record before the batch at relative offset
//! `r` has a timestamp `<= t`, and that batch holds the largest one seen so far.
//!
//! The index is derived data: recovery rebuilds it from the log whenever it is
//! missing, torn or older than the data. The active segment keeps its entries in
//! memory (readers search them under a short read lock); a sealed segment keeps
//! nothing resident until a read needs its index, and then only every 64th entry
//! ([`SealedFile`]), reading the rest with one positional read per lookup.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// One fixed-width index entry.
pub(crate) trait IndexEntry: Copy {
    /// Encoded size in bytes.
    const SIZE: usize;
    fn decode(bytes: &[u8]) -> Self;
    fn encode_into(&self, out: &mut Vec<u8>);
    /// Whether `self` may come right after `prev` in a sane index.
    fn follows(&self, prev: &Self) -> bool;
    /// Whether `self` may belong to a segment whose `.log` holds `log_size` bytes.
    fn inside(&self, log_size: u64) -> bool;
}

/// `(relative offset, position)`: the batch with base offset `base + relative_offset`
/// starts at byte `position` of the segment's `.log`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OffsetEntry {
    pub(crate) relative_offset: u32,
    pub(crate) position: u32,
}

/// `(timestamp, relative offset)`: see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TimeEntry {
    pub(crate) timestamp: i64,
    pub(crate) relative_offset: u32,
}

impl IndexEntry for OffsetEntry {
    const SIZE: usize = 8;
    fn decode(b: &[u8]) -> Self {
        Self {
            relative_offset: u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
            position: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
        }
    }
    fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.relative_offset.to_be_bytes());
        out.extend_from_slice(&self.position.to_be_bytes());
    }
    fn follows(&self, prev: &Self) -> bool {
        prev.relative_offset < self.relative_offset && prev.position < self.position
    }
    fn inside(&self, log_size: u64) -> bool {
        u64::from(self.position) < log_size
    }
}

impl IndexEntry for TimeEntry {
    const SIZE: usize = 12;
    fn decode(b: &[u8]) -> Self {
        Self {
            timestamp: i64::from_be_bytes(b[0..8].try_into().expect("invariant: 8 bytes")),
            relative_offset: u32::from_be_bytes([b[8], b[9], b[10], b[11]]),
        }
    }
    fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.timestamp.to_be_bytes());
        out.extend_from_slice(&self.relative_offset.to_be_bytes());
    }
    fn follows(&self, prev: &Self) -> bool {
        prev.timestamp < self.timestamp && prev.relative_offset <= self.relative_offset
    }
    fn inside(&self, _log_size: u64) -> bool {
        true
    }
}

/// Every how many entries a sealed index keeps one in memory (see [`SealedFile`]).
pub(crate) const SUMMARY_STRIDE: usize = 64;

/// A sealed segment's index file, read once on the first lookup to keep every
/// [`SUMMARY_STRIDE`]-th entry resident: a lookup binary-searches the summary in
/// memory, then reads one block of at most 64 entries (512 bytes) with a single
/// positional read. Resident memory is 1/64 of the index, and only for segments
/// that were read. The file itself is not held: lookups get it from the segment's
/// descriptor cache.
#[derive(Debug)]
pub(crate) struct SealedFile<E> {
    count: usize,
    summary: Vec<E>,
}

impl<E: IndexEntry> SealedFile<E> {
    /// Reads the index file once to build the summary, checking every entry on the
    /// way (sorted, inside a `.log` of `log_size` bytes, whole entries): `None` when it
    /// is not sane, and the caller scans instead.
    pub(crate) fn load(file: &File, log_size: u64) -> io::Result<Option<Self>> {
        let len = file.metadata()?.len() as usize;
        if !len.is_multiple_of(E::SIZE) {
            return Ok(None);
        }
        let count = len / E::SIZE;
        let mut summary = Vec::with_capacity(count.div_ceil(SUMMARY_STRIDE));
        let block = SUMMARY_STRIDE * E::SIZE;
        let mut buf = vec![0u8; block * 256];
        let mut prev: Option<E> = None;
        let mut i = 0;
        while i < count {
            let n = (count - i).min(buf.len() / E::SIZE);
            let bytes = &mut buf[..n * E::SIZE];
            file.read_exact_at(bytes, (i * E::SIZE) as u64)?;
            for (j, chunk) in bytes.chunks_exact(E::SIZE).enumerate() {
                let e = E::decode(chunk);
                if !e.inside(log_size) || prev.is_some_and(|p| !e.follows(&p)) {
                    return Ok(None);
                }
                if (i + j) % SUMMARY_STRIDE == 0 {
                    summary.push(e);
                }
                prev = Some(e);
            }
            i += n;
        }
        Ok(Some(Self { count, summary }))
    }

    pub(crate) fn entries<'a>(&'a self, file: &'a File) -> Entries<'a, E> {
        Entries::File { file, count: self.count, summary: &self.summary }
    }
}

/// Where a lookup finds the entries.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Entries<'a, E> {
    /// Resident (the active segment).
    Memory(&'a [E]),
    /// In a file holding `count` entries, with every [`SUMMARY_STRIDE`]-th one in
    /// `summary` (a sealed segment).
    File { file: &'a File, count: usize, summary: &'a [E] },
}

impl<E: IndexEntry> Entries<'_, E> {
    /// The last entry for which `below` holds, where `below` is true for a prefix of
    /// the entries and false after it (both index fields are sorted, so "key <= x" is
    /// such a predicate).
    ///
    /// Example: entries with relative offsets `[0, 10, 25]` and `below = |e| e.relative_offset <= 12`
    /// give the entry for 10; `<= 9` gives the entry for 0; an empty index gives `None`.
    pub(crate) fn floor(&self, below: impl Fn(&E) -> bool) -> io::Result<Option<E>> {
        match self {
            Self::Memory(v) => Ok(v.partition_point(|e| below(e)).checked_sub(1).map(|i| v[i])),
            Self::File { file, count, summary } => {
                // The last true entry lies in the block of the last true summary entry.
                let Some(block) = summary.partition_point(|e| below(e)).checked_sub(1) else {
                    return Ok(None);
                };
                let from = block * SUMMARY_STRIDE;
                let n = (*count - from).min(SUMMARY_STRIDE);
                let mut buf = [0u8; SUMMARY_STRIDE * 16];
                let bytes = &mut buf[..n * E::SIZE];
                file.read_exact_at(bytes, (from * E::SIZE) as u64)?;
                let entries: Vec<E> = bytes.chunks_exact(E::SIZE).map(E::decode).collect();
                Ok(entries.partition_point(|e| below(e)).checked_sub(1).map(|i| entries[i]))
            }
        }
    }
}

/// Encodes entries for writing to an index file.
pub(crate) fn encode<E: IndexEntry>(entries: &[E]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * E::SIZE);
    for e in entries {
        e.encode_into(&mut out);
    }
    out
}

/// Decodes a whole index file's bytes; `None` when the length is not a whole number
/// of entries (a torn write), which makes the caller rebuild the index.
pub(crate) fn decode<E: IndexEntry>(bytes: &[u8]) -> Option<Vec<E>> {
    if !bytes.len().is_multiple_of(E::SIZE) {
        return None;
    }
    Some(bytes.chunks_exact(E::SIZE).map(E::decode).collect())
}

/// Whether loaded offset entries are plausible for a log of `log_size` bytes: strictly
/// increasing in both fields and inside the file. A zero-filled tail (a crash after
/// the length was extended but before the data reached the disk) fails this.
pub(crate) fn offsets_are_sane(entries: &[OffsetEntry], log_size: u64) -> bool {
    entries.windows(2).all(|w| w[0].relative_offset < w[1].relative_offset && w[0].position < w[1].position)
        && entries.last().is_none_or(|e| u64::from(e.position) < log_size)
}

/// Whether loaded time entries are sorted in both fields.
pub(crate) fn times_are_sane(entries: &[TimeEntry]) -> bool {
    entries.windows(2).all(|w| w[0].timestamp < w[1].timestamp && w[0].relative_offset <= w[1].relative_offset)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn offsets(pairs: &[(u32, u32)]) -> Vec<OffsetEntry> {
        pairs.iter().map(|&(relative_offset, position)| OffsetEntry { relative_offset, position }).collect()
    }

    #[test]
    fn floor_finds_the_last_entry_at_or_below_at_every_edge() {
        let v = offsets(&[(0, 0), (10, 4096), (25, 8200)]);
        let e = Entries::Memory(&v);
        let by_offset = |x: u32| e.floor(|en: &OffsetEntry| en.relative_offset <= x).unwrap().map(|en| en.relative_offset);
        assert_eq!(by_offset(0), Some(0));
        assert_eq!(by_offset(9), Some(0));
        assert_eq!(by_offset(10), Some(10));
        assert_eq!(by_offset(24), Some(10));
        assert_eq!(by_offset(25), Some(25));
        assert_eq!(by_offset(u32::MAX), Some(25));
        let v2 = offsets(&[(5, 100)]);
        assert_eq!(Entries::Memory(&v2).floor(|en: &OffsetEntry| en.relative_offset <= 4).unwrap(), None);
        let empty: Vec<OffsetEntry> = Vec::new();
        assert_eq!(Entries::Memory(&empty).floor(|_: &OffsetEntry| true).unwrap(), None);
        // By position too: both fields are sorted.
        assert_eq!(e.floor(|en: &OffsetEntry| en.position <= 8199).unwrap().unwrap().relative_offset, 10);
    }

    #[test]
    fn file_and_memory_lookups_agree() {
        let v: Vec<OffsetEntry> = (0..1000).map(|i| OffsetEntry { relative_offset: i * 3, position: i * 100 }).collect();
        // Whole blocks, a partial last block, fewer entries than one block, none.
        for n in [1000, 640, 65, 64, 63, 1, 0] {
            let v = &v[..n];
            let mut f = tempfile::tempfile().unwrap();
            f.write_all(&encode(v)).unwrap();
            let sealed = SealedFile::<OffsetEntry>::load(&f, u64::MAX).unwrap().unwrap();
            let mem = Entries::Memory(v);
            let file = sealed.entries(&f);
            for x in (0..3003).step_by(7).chain([1, 2, 3, 189, 190, 191, 192, 193, 2996, 2997, 2998, 5000]) {
                let pred = |e: &OffsetEntry| e.relative_offset <= x;
                assert_eq!(mem.floor(pred).unwrap(), file.floor(pred).unwrap(), "{n} entries, {x}");
            }
            assert_eq!(file.floor(|_| true).unwrap(), v.last().copied());
        }
        let t: Vec<TimeEntry> = (0..50).map(|i| TimeEntry { timestamp: 1000 + i * 10, relative_offset: i as u32 }).collect();
        let bytes = encode(&t);
        assert_eq!(decode::<TimeEntry>(&bytes).unwrap(), t);
        assert!(decode::<TimeEntry>(&bytes[..bytes.len() - 1]).is_none());
        let te = Entries::Memory(&t);
        assert_eq!(te.floor(|e: &TimeEntry| e.timestamp < 1000).unwrap(), None);
        assert_eq!(te.floor(|e: &TimeEntry| e.timestamp < 1011).unwrap().unwrap().relative_offset, 1);
    }

    #[test]
    fn sanity_checks_catch_zero_fill_and_out_of_file_positions() {
        assert!(offsets_are_sane(&offsets(&[(1, 10), (5, 300)]), 400));
        assert!(!offsets_are_sane(&offsets(&[(1, 10), (5, 300), (0, 0)]), 400));
        assert!(!offsets_are_sane(&offsets(&[(1, 10), (5, 300)]), 300));
        assert!(!times_are_sane(&[
            TimeEntry { timestamp: 5, relative_offset: 1 },
            TimeEntry { timestamp: 0, relative_offset: 0 }
        ]));
    }
}

/// Decides which batches get index entries, the same way on append and on rebuild.
///
/// An offset entry is added for a batch once at least `index.interval.bytes` of log
/// were written since the previous entry; with it, a time entry whenever the largest
/// timestamp seen so far grew.
#[derive(Debug, Clone)]
pub(crate) struct IndexBuilder {
    bytes_since_entry: u64,
    /// Largest batch max timestamp so far; `i64::MIN` when none.
    pub(crate) max_timestamp: i64,
    relative_offset_of_max: u32,
    last_time_entry: i64,
}

impl Default for IndexBuilder {
    fn default() -> Self {
        Self { bytes_since_entry: 0, max_timestamp: i64::MIN, relative_offset_of_max: 0, last_time_entry: i64::MIN }
    }
}

impl IndexBuilder {
    /// Resumes after loaded entries; `bytes_since_entry` may be approximate (it only
    /// affects where the next entry lands).
    pub(crate) fn resume(bytes_since_entry: u64, last_time: Option<TimeEntry>) -> Self {
        let (ts, rel) = last_time.map_or((i64::MIN, 0), |t| (t.timestamp, t.relative_offset));
        Self { bytes_since_entry, max_timestamp: ts, relative_offset_of_max: rel, last_time_entry: ts }
    }

    /// Accounts for a batch already covered by an index entry.
    pub(crate) fn observe(&mut self, relative_offset: u32, max_timestamp: i64, size: u64) {
        if max_timestamp > self.max_timestamp {
            self.max_timestamp = max_timestamp;
            self.relative_offset_of_max = relative_offset;
        }
        self.bytes_since_entry += size;
    }

    /// Accounts for the next batch and returns the entries to add for it.
    pub(crate) fn on_batch(
        &mut self,
        interval: u32,
        relative_offset: u32,
        position: u32,
        max_timestamp: i64,
        size: u64,
    ) -> (Option<OffsetEntry>, Option<TimeEntry>) {
        let due = self.bytes_since_entry >= u64::from(interval);
        self.observe(relative_offset, max_timestamp, size);
        if !due {
            return (None, None);
        }
        self.bytes_since_entry = size;
        (Some(OffsetEntry { relative_offset, position }), self.time_entry())
    }

    /// A time entry for the largest timestamp so far, if the time index lags it
    /// (called on every offset entry, and before a segment is sealed or flushed so
    /// the last time entry always holds the segment's largest timestamp).
    pub(crate) fn time_entry(&mut self) -> Option<TimeEntry> {
        if self.max_timestamp > self.last_time_entry {
            self.last_time_entry = self.max_timestamp;
            Some(TimeEntry { timestamp: self.max_timestamp, relative_offset: self.relative_offset_of_max })
        } else {
            None
        }
    }
}
