//! The offset map a pass fills from the dirty records: key hash → latest offset.

use std::collections::hash_map::DefaultHasher;
use std::hash::Hasher;

use fjord_record::{Offset, Records, BATCH_OVERHEAD};

use super::plan::View;
use super::rewrite::{corrupt, next_batch, records_body, Aborted};
use super::{CleanStats, Throttle, SLOT_BYTES};
use crate::segment::{Walker, LOG_SUFFIX};
use crate::Result;

/// Key hash → latest offset, open addressing with linear probing, at most 75 % full.
#[derive(Debug)]
pub(super) struct OffsetMap {
    /// `(hash, offset)`; offset -1 marks an empty slot.
    slots: Vec<([u64; 2], Offset)>,
    len: usize,
    pub(super) max_entries: usize,
}

impl OffsetMap {
    pub(super) fn slots_for(bytes: usize) -> usize {
        (bytes / SLOT_BYTES).max(16)
    }

    pub(super) fn max_entries_for(bytes: usize) -> usize {
        Self::slots_for(bytes) * 3 / 4
    }

    pub(super) fn new(bytes: usize) -> Self {
        let n = Self::slots_for(bytes);
        Self { slots: vec![([0, 0], -1); n], len: 0, max_entries: Self::max_entries_for(bytes) }
    }

    pub(super) fn clear(&mut self) {
        if self.len > 0 {
            self.slots.fill(([0, 0], -1));
            self.len = 0;
        }
    }

    pub(super) fn free(&self) -> usize {
        self.max_entries - self.len
    }

    pub(super) fn slot(&self, hash: &[u64; 2]) -> usize {
        let n = self.slots.len();
        let mut i = (hash[0] % n as u64) as usize;
        loop {
            let (h, o) = &self.slots[i];
            if *o < 0 || h == hash {
                return i;
            }
            i = if i + 1 == n { 0 } else { i + 1 };
        }
    }

    /// Records `offset` for the key; callers go in offset order, so it is the latest.
    pub(super) fn put(&mut self, hash: [u64; 2], offset: Offset) {
        let i = self.slot(&hash);
        if self.slots[i].1 < 0 {
            self.len += 1;
        }
        self.slots[i] = (hash, offset);
    }

    pub(super) fn get(&self, hash: &[u64; 2]) -> Option<Offset> {
        let (_, o) = self.slots[self.slot(hash)];
        (o >= 0).then_some(o)
    }
}

/// A 128-bit key hash (two SipHash runs with different prefixes): with millions of
/// keys a collision, which would drop a live key, stays out of reach.
pub(super) fn key_hash(key: &[u8]) -> [u64; 2] {
    let mut a = DefaultHasher::new();
    a.write_u8(0);
    a.write(key);
    let mut b = DefaultHasher::new();
    b.write_u8(1);
    b.write(key);
    [a.finish(), b.finish()]
}

/// Reads dirty records from `first_dirty` into `map` until `clean_end` or until the
/// next batch might not fit; returns the offset where it stopped (a batch start).
pub(super) fn build_map(
    view: &View,
    first_dirty: Offset,
    clean_end: Offset,
    map: &mut OffsetMap,
    aborted: &Aborted,
    throttle: &mut Throttle,
    stats: &mut CleanStats,
) -> Result<Offset> {
    let start = view.range(..=first_dirty).next_back().map_or(first_dirty, |(b, _)| *b);
    for (_, seg) in view.range(start..clean_end) {
        let path = seg.path(LOG_SUFFIX);
        let size = seg.size();
        let position = seg.find_batch(first_dirty, size)?.map_or(size, |(p, _)| p);
        let file = seg.log()?;
        let mut walk = Walker::new(&file, position, size);
        while let Some((header, bytes)) = next_batch(&mut walk, &path)? {
            throttle.account(bytes.len());
            stats.bytes_read += bytes.len() as u64;
            // Aborted records never shadow anything: they are dropped below.
            if header.last_offset() < first_dirty || header.is_control() || aborted.contains(&header) {
                continue;
            }
            if header.record_count.max(0) as usize > map.free() {
                return Ok(header.base_offset);
            }
            let body = records_body(&header, bytes, &path)?;
            for record in Records::new(&body, BATCH_OVERHEAD) {
                let record = record.map_err(|source| corrupt(&path, header.base_offset, source))?;
                let offset = header.base_offset + i64::from(record.offset_delta);
                if let (Some(key), true) = (record.key, offset >= first_dirty) {
                    map.put(key_hash(key), offset);
                }
            }
        }
    }
    Ok(clean_end)
}
