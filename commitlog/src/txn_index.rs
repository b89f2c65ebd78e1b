//! The aborted-transactions index: `<base_offset>.txnindex` beside each segment, one
//! entry per transaction whose ABORT marker lies in that segment, in marker order.
//!
//! Entry (34 bytes, big-endian, Kafka's layout):
//! ```text
//! version i16 (0) | producer_id i64 | first_offset i64 | last_offset i64 | last_stable_offset i64
//! ```
//! `first_offset` is the transaction's first batch in this partition, `last_offset` its
//! marker, `last_stable_offset` the LSO right after the abort (the first offset of the
//! earliest transaction still open, else `last_offset + 1`).
//!
//! A read_committed fetch from `fetch_offset` whose data ends before `upper` needs every
//! aborted transaction with `last_offset >= fetch_offset` and `first_offset < upper`:
//! their markers lie at or after `fetch_offset`, so the search starts in the segment
//! holding it, and it stops at the first entry whose `last_stable_offset >= upper`: any
//! transaction aborted later was still open then, so it starts at or after that LSO
//! ([`collect`]).
//!
//! The index is derived data, like the offset index: the log writes an entry when it
//! appends an ABORT marker, fsyncs it with the segment, deletes it with the segment, and
//! rewrites it on open for every segment the producer state replays (after a crash, the
//! unflushed part; see `ProducerState::reload`). A file that is not a whole number of
//! entries is damaged and makes the log replay everything to rebuild it. A missing file
//! is an empty index: segments written before transactions have none.
//! Memory: the entries live in the files; a segment keeps only their count, so a fetch
//! opens the file only of segments that have any.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;

use fjord_record::Offset;

use crate::error::IoContext;
use crate::segment::Segment;
use crate::Result;

/// The index file's suffix.
pub(crate) const TXN_INDEX_SUFFIX: &str = "txnindex";
/// Bytes per entry.
pub(crate) const ENTRY_SIZE: usize = 34;
/// Entries read per positional read while searching.
const READ_ENTRIES: usize = 128;

/// A transaction aborted in a partition, as a read_committed fetch reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortedTxn {
    /// The producer id of the transaction.
    pub producer_id: i64,
    /// Offset of its first batch in the partition.
    pub first_offset: Offset,
    /// Offset of its ABORT marker.
    pub last_offset: Offset,
    /// The last stable offset right after the abort.
    pub last_stable_offset: Offset,
}

impl AbortedTxn {
    fn encode(&self) -> [u8; ENTRY_SIZE] {
        let mut out = [0u8; ENTRY_SIZE];
        // Bytes 0..2: version 0.
        out[2..10].copy_from_slice(&self.producer_id.to_be_bytes());
        out[10..18].copy_from_slice(&self.first_offset.to_be_bytes());
        out[18..26].copy_from_slice(&self.last_offset.to_be_bytes());
        out[26..34].copy_from_slice(&self.last_stable_offset.to_be_bytes());
        out
    }

    /// `None` for an entry no writer produces (another version, offsets out of order).
    fn decode(b: &[u8]) -> Option<Self> {
        let i64_at = |at: usize| b.get(at..at + 8).and_then(|s| s.try_into().ok()).map(i64::from_be_bytes);
        if b.get(..2)? != [0, 0] {
            return None;
        }
        let e = AbortedTxn {
            producer_id: i64_at(2)?,
            first_offset: i64_at(10)?,
            last_offset: i64_at(18)?,
            last_stable_offset: i64_at(26)?,
        };
        (0 <= e.first_offset && e.first_offset <= e.last_offset).then_some(e)
    }
}

/// Entries of `segment`'s index file by its length: `Ok(None)` when it is damaged (not a
/// whole number of entries), 0 when missing.
pub(crate) fn entries_on_disk(segment: &Segment) -> Result<Option<u64>> {
    let path = segment.path(TXN_INDEX_SUFFIX);
    match fs::metadata(&path) {
        Ok(m) if m.len() % ENTRY_SIZE as u64 == 0 => Ok(Some(m.len() / ENTRY_SIZE as u64)),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Some(0)),
        Err(e) => Err(crate::Error::Io { path, source: e }),
    }
}

/// Appends `entries` to `segment`'s index (created when missing).
pub(crate) fn append(segment: &Segment, entries: &[AbortedTxn]) -> Result<()> {
    if entries.is_empty() {
        return Ok(());
    }
    let path = segment.path(TXN_INDEX_SUFFIX);
    let bytes: Vec<u8> = entries.iter().flat_map(|e| e.encode()).collect();
    let mut f = OpenOptions::new().append(true).create(true).open(&path).at(&path)?;
    f.write_all(&bytes).at(&path)?;
    segment.add_aborted(entries.len() as u64);
    Ok(())
}

/// Replaces `segment`'s index with `entries` (no file when there are none).
pub(crate) fn rewrite(segment: &Segment, entries: &[AbortedTxn]) -> Result<()> {
    let path = segment.path(TXN_INDEX_SUFFIX);
    if entries.is_empty() {
        crate::recovery::remove_if_exists(&path)?;
    } else {
        let bytes: Vec<u8> = entries.iter().flat_map(|e| e.encode()).collect();
        fs::write(&path, bytes).at(&path)?;
    }
    segment.set_aborted(entries.len() as u64);
    Ok(())
}

/// Cuts `segment`'s index back to its first `entries` entries (an append whose log
/// bytes failed takes its entries back).
pub(crate) fn truncate(segment: &Segment, entries: u64) -> Result<()> {
    let path = segment.path(TXN_INDEX_SUFFIX);
    match OpenOptions::new().write(true).open(&path) {
        Ok(f) => f.set_len(entries * ENTRY_SIZE as u64).at(&path)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(crate::Error::Io { path, source: e }),
    }
    segment.set_aborted(entries);
    Ok(())
}

/// fsyncs `segment`'s index when it has one.
pub(crate) fn sync(segment: &Segment) -> Result<()> {
    if segment.aborted_count() == 0 {
        return Ok(());
    }
    let path = segment.path(TXN_INDEX_SUFFIX);
    match File::open(&path) {
        Ok(f) => f.sync_all().at(&path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(crate::Error::Io { path, source: e }),
    }
}

/// Every entry of `segment`'s index, in order, for rebuilding or cleaning (the
/// undecodable ones, which no writer produces, are dropped with a warning).
pub(crate) fn read_all(segment: &Segment) -> Result<Vec<AbortedTxn>> {
    let path = segment.path(TXN_INDEX_SUFFIX);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(crate::Error::Io { path, source: e }),
    };
    let mut out = Vec::with_capacity(bytes.len() / ENTRY_SIZE);
    for chunk in bytes.chunks_exact(ENTRY_SIZE) {
        match AbortedTxn::decode(chunk) {
            Some(e) => out.push(e),
            None => tracing::warn!(path = %path.display(), "dropping an unreadable aborted-transaction entry"),
        }
    }
    Ok(out)
}

/// Adds to `out` the entries of `segment` that a read_committed fetch of
/// `[fetch_offset, upper)` must report (see the module docs). Returns whether the search
/// is complete (an entry's LSO reached `upper`), so later segments need no look.
pub(crate) fn collect(segment: &Segment, fetch_offset: Offset, upper: Offset, out: &mut Vec<AbortedTxn>) -> Result<bool> {
    let count = segment.aborted_count() as usize;
    if count == 0 {
        return Ok(false);
    }
    let path = segment.path(TXN_INDEX_SUFFIX);
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            // Renamed to `.deleted` (retention, truncation) since the reader took its
            // segment list, maybe before the segment says so: the data moved away, and
            // the read of the `.log` tells the client.
            let mut deleted = path.clone().into_os_string();
            deleted.push(crate::segment::DELETED_SUFFIX);
            match File::open(&deleted) {
                Ok(f) => f,
                Err(_) if segment.is_deleted() => return Ok(false),
                Err(_) => return Err(crate::Error::Io { path, source: e }),
            }
        }
        Err(e) => return Err(crate::Error::Io { path, source: e }),
    };
    // Entries are in marker order: skip, by binary search, those whose marker is below
    // `fetch_offset` (never reported; and any transaction aborted after one of them and
    // reported starts at or after its LSO, so they only end the search earlier), so a
    // fetch costs O(log n + reported) reads however many aborts the segment holds.
    let mut entry = [0u8; ENTRY_SIZE];
    let (mut lo, mut hi) = (0usize, count);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        file.read_exact_at(&mut entry, (mid * ENTRY_SIZE) as u64).at(&path)?;
        match AbortedTxn::decode(&entry) {
            Some(e) if e.last_offset < fetch_offset => lo = mid + 1,
            _ => hi = mid,
        }
    }
    let mut buf = vec![0u8; READ_ENTRIES.min(count - lo).max(1) * ENTRY_SIZE];
    let mut at = lo;
    while at < count {
        let n = READ_ENTRIES.min(count - at);
        let chunk = &mut buf[..n * ENTRY_SIZE];
        file.read_exact_at(chunk, (at * ENTRY_SIZE) as u64).at(&path)?;
        for e in chunk.chunks_exact(ENTRY_SIZE).filter_map(AbortedTxn::decode) {
            if e.last_offset >= fetch_offset && e.first_offset < upper {
                out.push(e);
            }
            if e.last_stable_offset >= upper {
                return Ok(true);
            }
        }
        at += n;
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn txn(producer_id: i64, first_offset: Offset, last_offset: Offset, last_stable_offset: Offset) -> AbortedTxn {
        AbortedTxn { producer_id, first_offset, last_offset, last_stable_offset }
    }

    #[test]
    fn entries_have_kafkas_layout_and_round_trip() {
        let e = txn(0x0102, 5, 9, 10);
        let bytes = e.encode();
        assert_eq!(&bytes[..2], &[0, 0]);
        assert_eq!(&bytes[2..10], &0x0102i64.to_be_bytes());
        assert_eq!(AbortedTxn::decode(&bytes), Some(e));
        let mut other_version = bytes;
        other_version[1] = 1;
        assert_eq!(AbortedTxn::decode(&other_version), None);
        assert_eq!(AbortedTxn::decode(&txn(1, 9, 5, 10).encode()), None);
        assert_eq!(AbortedTxn::decode(&bytes[..20]), None);
    }

    #[test]
    fn a_search_in_a_long_index_starts_at_the_fetch_offset() {
        let dir = tempfile::tempdir().unwrap();
        let seg = Segment::new(dir.path(), 0, 0, i64::MIN);
        let entries: Vec<AbortedTxn> = (0..1000).map(|i| txn(i, 10 * i, 10 * i + 5, 10 * i + 6)).collect();
        append(&seg, &entries).unwrap();
        for (from, upper, expected) in
            [(5000, 5020, vec![500, 501]), (0, 1, vec![0]), (9996, 20_000, vec![]), (9990, 9991, vec![999])]
        {
            let mut out = Vec::new();
            collect(&seg, from, upper, &mut out).unwrap();
            assert_eq!(out.iter().map(|e| e.producer_id).collect::<Vec<_>>(), expected, "{from}..{upper}");
        }
    }

    #[test]
    fn a_search_reports_the_overlapping_aborts_and_stops_at_the_lso() {
        let dir = tempfile::tempdir().unwrap();
        let seg = Segment::new(dir.path(), 0, 0, i64::MIN);
        assert_eq!(entries_on_disk(&seg).unwrap(), Some(0));
        // p1 [0, 4] aborted while p2 (from 2) was open; p2 [2, 8]; p3 [20, 25], nothing open after.
        append(&seg, &[txn(1, 0, 4, 2), txn(2, 2, 8, 9)]).unwrap();
        append(&seg, &[txn(3, 20, 25, 26)]).unwrap();
        assert_eq!((entries_on_disk(&seg).unwrap(), seg.aborted_count()), (Some(3), 3));
        let found = |from, upper| {
            let mut out = Vec::new();
            let complete = collect(&seg, from, upper, &mut out).unwrap();
            (out.iter().map(|e| e.producer_id).collect::<Vec<_>>(), complete)
        };
        // Everything from 0: the search ends at p2's entry (LSO 9 >= 9).
        assert_eq!(found(0, 9), (vec![1, 2], true));
        // From 5: p1 ended before it.
        assert_eq!(found(5, 30), (vec![2, 3], false));
        // Data below p3's first offset only: p3 is not reported.
        assert_eq!(found(9, 20), (vec![], true));
        assert_eq!(read_all(&seg).unwrap().len(), 3);
        rewrite(&seg, &[txn(3, 20, 25, 26)]).unwrap();
        assert_eq!(found(0, 30), (vec![3], false));
        // A torn entry is damage.
        std::fs::OpenOptions::new().append(true).open(seg.path(TXN_INDEX_SUFFIX)).unwrap().write_all(&[0; 3]).unwrap();
        assert_eq!(entries_on_disk(&seg).unwrap(), None);
        rewrite(&seg, &[]).unwrap();
        assert!(!seg.path(TXN_INDEX_SUFFIX).exists());
        assert_eq!(found(0, 30), (vec![], false));
    }
}
