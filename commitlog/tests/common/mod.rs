//! Helpers shared by the integration tests.
#![allow(dead_code, unreachable_pub)] // each test binary uses a different subset; `pub` for them

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use fjord_log::{Log, Offset};
use fjord_record::{batch, BatchBuilder};

/// A batch of `n` records with `value_len`-byte values and timestamps `ts, ts+1, ...`.
pub fn batch(n: usize, value_len: usize, ts: i64) -> Vec<u8> {
    let mut b = BatchBuilder::new(ts);
    for i in 0..n {
        let value: Vec<u8> = (0..value_len).map(|j| (i * 31 + j) as u8).collect();
        b.append(ts + i as i64, Some(format!("k{i}").as_bytes()), Some(&value), &[]);
    }
    b.build_vec()
}

/// Every batch readable from the log start, as `(base offset, bytes)`, checking
/// that each one is valid (CRC, framing) and that the slices chain up.
pub fn read_all(log: &Log) -> Vec<(Offset, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = log.log_start_offset();
    while at < log.log_end_offset() {
        let s = log.read(at, 64 << 10, None, true).expect("read below the log end");
        assert!(!s.is_empty(), "empty read at {at} below the log end {}", log.log_end_offset());
        let bytes = s.read_to_vec().unwrap();
        let mut next = at;
        for b in batch::batches(&bytes) {
            let (h, b) = b.expect("the log served an invalid batch");
            assert!(h.base_offset >= next || out.is_empty(), "offsets go backwards");
            next = h.next_offset();
            out.push((h.base_offset, b.to_vec()));
        }
        assert_eq!(next, s.next_offset);
        at = s.next_offset;
    }
    out
}

/// File name → contents for every file in `dir`.
pub fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.path().is_file())
        .map(|e| (e.file_name().to_string_lossy().into_owned(), fs::read(e.path()).unwrap()))
        .collect()
}

/// Writes `files` (from [`snapshot`]) into the empty directory `dir`.
pub fn restore(dir: &Path, files: &BTreeMap<String, Vec<u8>>) {
    for (name, bytes) in files {
        fs::write(dir.join(name), bytes).unwrap();
    }
}
