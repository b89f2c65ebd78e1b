//! Descriptors do not grow with the segment count (issue 26, case 5): with the smallest
//! segments the format allows, 18,500 one-record appends make 18,500 segments, which
//! used to hold 18,500 open `.log` files (and their indexes once read) until the
//! process hit its open-file limit and could not even reopen the log. Its own test
//! binary: it counts this process's descriptors.

mod common;

use std::time::Duration;

use common::batch;
use fjord_log::{FileCache, Log, LogConfig};

const SEGMENTS: usize = 18_500;
const CACHE: usize = 64;

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd (Linux)").count()
}

#[test]
fn eighteen_thousand_five_hundred_segments_stay_under_the_descriptor_cache_bound() {
    FileCache::global().set_capacity(CACHE);
    // On a tmpfs where there is one: closing fsyncs every segment's three files, 55,500
    // fsyncs that a disk takes minutes for and that are not what this test is about.
    let dir = match tempfile::tempdir_in("/dev/shm") {
        Ok(d) => d,
        Err(_) => tempfile::tempdir().unwrap(),
    };
    let config = LogConfig {
        segment_bytes: 61,
        min_segment_bytes: 61,
        file_delete_delay: Duration::ZERO,
        retention_ms: None,
        ..LogConfig::default()
    };
    let before = open_descriptors();
    // The active segment keeps its `.log`, `.index` and `.timeindex` open.
    let bound = before + CACHE + 3;
    let log = Log::open(dir.path(), config).unwrap();
    for i in 0..SEGMENTS {
        log.append(&mut batch(1, 8, i as i64), 0).unwrap();
    }
    assert_eq!(log.segment_count(), SEGMENTS);
    // Read every segment (each read opens its `.log` and `.index` through the cache).
    let mut at = 0;
    while at < log.log_end_offset() {
        let s = log.read(at, 1 << 20, None, true).unwrap();
        assert_eq!(s.first_offset, at);
        at = s.next_offset;
    }
    let after_reads = open_descriptors();
    assert!(after_reads <= bound, "{after_reads} descriptors open, bound {bound}");
    log.close().unwrap();
    drop(log);

    // Reopening (which failed with "Too many open files" when every segment held its
    // file) opens and reads all of them again.
    let log = Log::open(dir.path(), config).unwrap();
    assert_eq!((log.segment_count(), log.log_end_offset()), (SEGMENTS, SEGMENTS as i64));
    let after_open = open_descriptors();
    assert!(after_open <= bound, "{after_open} descriptors open after reopening, bound {bound}");
    for offset in (0..SEGMENTS as i64).rev().step_by(7) {
        let s = log.read(offset, 1 << 20, None, true).unwrap();
        assert_eq!(s.read_to_vec().unwrap().len(), s.len);
    }
    assert!(log.scrub(u64::MAX).unwrap().1, "a full scrub pass over every segment");
    let after_scrub = open_descriptors();
    assert!(after_scrub <= bound, "{after_scrub} descriptors open after a scrub, bound {bound}");
    assert!(FileCache::global().len() <= CACHE);
}
