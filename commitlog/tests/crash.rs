//! Crash tests: a crash leaves the segment files cut at any byte, or with damaged
//! bytes in the tail. On reopen the log must be an exact prefix of what was
//! appended, serve nothing corrupt, and continue with the right offsets.

mod common;

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{batch, read_all, restore, snapshot};
use fjord_log::{Log, LogConfig, Offset};

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 4000,
        min_segment_bytes: 4000,
        index_interval_bytes: 256,
        file_delete_delay: Duration::ZERO,
        ..LogConfig::default()
    }
}

type Files = BTreeMap<String, Vec<u8>>;
type Batches = Vec<(Offset, Vec<u8>)>;

/// A log left as a crash would leave it (never closed), with what was appended:
/// batches of 1–4 records of 10–40 bytes.
fn crashed_log(batches: usize, seed: u64) -> (Files, Batches) {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), config()).unwrap();
    let mut appended = Vec::new();
    let mut x = seed;
    for i in 0..batches {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let mut b = batch(1 + (x >> 62) as usize, 10 + (x >> 56) as usize % 30, i as i64);
        let info = log.append(&mut b, 1).unwrap();
        appended.push((info.base_offset, b));
    }
    drop(log);
    (snapshot(dir.path()), appended)
}

/// Batches of `appended` that lie entirely in the kept bytes of a cut: those in
/// segments before `segment`, and those of `segment` ending at or before `cut`.
fn expected_prefix(
    files: &BTreeMap<String, Vec<u8>>,
    appended: &[(Offset, Vec<u8>)],
    segment: &str,
    cut: usize,
) -> Vec<(Offset, Vec<u8>)> {
    let base: Offset = segment[..20].parse().unwrap();
    let mut keep = Vec::new();
    let mut position = 0;
    for (offset, bytes) in appended {
        if *offset < base {
            keep.push((*offset, bytes.clone()));
            continue;
        }
        position += bytes.len();
        if position > cut {
            break;
        }
        keep.push((*offset, bytes.clone()));
    }
    assert!(files.contains_key(segment));
    keep
}

/// Reopens the damaged copy and checks the prefix property and that appends go on.
/// With `reopen_clean`, also closes and reopens (fsyncs make that slow, so only sometimes).
/// Also checks that recovery deleted no log byte: what it cut is in the side directory.
fn check_recovers(files: &BTreeMap<String, Vec<u8>>, expected: &[(Offset, Vec<u8>)], what: &str, reopen_clean: bool) {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("t-0");
    fs::create_dir(&dir).unwrap();
    restore(&dir, files);
    let log = Log::open(&dir, config()).unwrap_or_else(|e| panic!("{what}: open failed: {e}"));
    assert_eq!(log_bytes(&dir) + kept_aside(root.path()).len(), log_bytes_of(files), "{what}: every cut byte is kept aside");
    let got = read_all(&log);
    assert_eq!(got.len(), expected.len(), "{what}: wrong number of batches");
    assert!(got == expected, "{what}: recovered log is not the expected prefix");
    let end = expected.last().map_or(0, |(o, b)| o + fjord_record::BatchHeader::parse(b).unwrap().last_offset_delta as i64 + 1);
    assert_eq!(log.log_end_offset(), end, "{what}");
    // Same leader epoch as before: a new one would fsync the epoch checkpoint.
    let info = log.append(&mut batch(2, 5, 0), 1).unwrap();
    assert_eq!(info.base_offset, end, "{what}: appends continue at the log end");
    assert_eq!(read_all(&log).len(), expected.len() + 1, "{what}");
    if !reopen_clean {
        return;
    }
    // The repaired log survives a second, clean reopen.
    log.close().unwrap();
    drop(log);
    let log = Log::open(&dir, config()).unwrap();
    assert_eq!(read_all(&log).len(), expected.len() + 1, "{what}: after clean reopen");
}

/// Bytes of the `.log` files of a snapshot.
fn log_bytes_of(files: &Files) -> usize {
    files.iter().filter(|(n, _)| n.ends_with(".log")).map(|(_, b)| b.len()).sum()
}

/// Bytes of the `.log` files in a partition directory.
fn log_bytes(dir: &Path) -> usize {
    log_bytes_of(&snapshot(dir))
}

/// What recovery kept aside under `root` (the log dir): the concatenation of every side
/// directory's segment files, in name order (a damaged segment's tail, then later
/// segments), and each side directory's manifest must say it was a recovery.
fn kept_aside(root: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    let mut sides: Vec<PathBuf> = fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("t-0-damaged-"))
        .collect();
    sides.sort();
    for side in sides {
        let manifest = fs::read_to_string(side.join(fjord_log::REPAIR_MANIFEST)).unwrap();
        assert!(manifest.starts_with("recovery after an unclean shutdown of "), "{manifest}");
        for (name, bytes) in snapshot(&side) {
            if name != fjord_log::REPAIR_MANIFEST {
                out.extend(bytes);
            }
        }
    }
    out
}

fn active_segment(files: &BTreeMap<String, Vec<u8>>) -> String {
    files.keys().filter(|n| n.ends_with(".log")).max().unwrap().clone()
}

#[test]
fn cut_at_every_byte_of_the_last_batches() {
    let (files, appended) = crashed_log(30, 1);
    let active = active_segment(&files);
    let len = files[&active].len();
    let last_two: usize = appended.iter().rev().take(2).map(|(_, b)| b.len()).sum();
    let from = len.saturating_sub(last_two);
    for cut in from..len {
        let mut damaged = files.clone();
        damaged.get_mut(&active).unwrap().truncate(cut);
        let expected = expected_prefix(&files, &appended, &active, cut);
        check_recovers(&damaged, &expected, &format!("cut {active} at {cut}"), cut % 97 == 0);
    }
}

#[test]
fn cut_any_segment_at_random_positions_of_a_larger_log() {
    let (files, appended) = crashed_log(400, 7);
    let segments: Vec<String> = files.keys().filter(|n| n.ends_with(".log")).cloned().collect();
    assert!(segments.len() > 10);
    let mut x: u64 = 99;
    for _ in 0..25 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let segment = &segments[(x >> 33) as usize % segments.len()];
        let cut = (x >> 13) as usize % (files[segment].len() + 1);
        let mut damaged = files.clone();
        damaged.get_mut(segment).unwrap().truncate(cut);
        // A crash loses the unflushed suffix: later segments may exist or not.
        let expected = expected_prefix(&files, &appended, segment, cut);
        check_recovers(&damaged, &expected, &format!("cut {segment} at {cut}"), cut.is_multiple_of(5));
    }
}

#[test]
fn flipped_bytes_in_the_tail_are_cut_off_not_served() {
    let (files, appended) = crashed_log(30, 3);
    let active = active_segment(&files);
    let len = files[&active].len();
    let (last_offset, last) = appended.last().unwrap();
    let start = len - last.len();
    // Every byte the CRC or framing covers: length (8..12), magic (16), CRC and body.
    let positions = (8..12).chain(16..last.len());
    for at in positions {
        let mut damaged = files.clone();
        damaged.get_mut(&active).unwrap()[start + at] ^= 0x20;
        let expected: Vec<_> = appended.iter().filter(|(o, _)| o < last_offset).cloned().collect();
        check_recovers(&damaged, &expected, &format!("flip byte {at} of the last batch"), at % 50 == 0);
    }
    // Garbage appended after the last batch (a torn preallocation) goes too.
    let mut damaged = files.clone();
    damaged.get_mut(&active).unwrap().extend_from_slice(&[0; 100]);
    check_recovers(&damaged, &appended, "zeros after the last batch", true);
}

#[test]
fn a_flushed_prefix_survives_and_only_the_tail_is_rescanned() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("t-0");
    let log = Log::open(&dir, config()).unwrap();
    for i in 0..50 {
        log.append(&mut batch(2, 30, i), 0).unwrap();
    }
    log.flush().unwrap();
    let recovery_point = log.recovery_point();
    assert_eq!(recovery_point, 100);
    for i in 0..5 {
        log.append(&mut batch(2, 30, i), 0).unwrap();
    }
    drop(log);
    // Tear the active segment's last batch; recovery from the checkpoint finds it.
    let files = snapshot(&dir);
    let active = active_segment(&files);
    let f = OpenOptions::new().write(true).open(dir.join(&active)).unwrap();
    let torn = files[&active].len() - 1;
    f.set_len(torn as u64).unwrap();
    let log = Log::open_with_recovery_point(&dir, config(), recovery_point).unwrap();
    assert_eq!(log.log_end_offset(), 108);
    assert_eq!(read_all(&log).len(), 54);
    assert!(fs::read_dir(&dir).unwrap().count() > 3);
    let last = appended_size(&files[&active], torn);
    assert_eq!(kept_aside(root.path()), files[&active][torn - last..torn], "the torn batch is kept aside");
}

/// Size of the last (torn) batch of a `.log` cut at `cut`: the bytes after the last
/// whole batch.
fn appended_size(log: &[u8], cut: usize) -> usize {
    let whole: usize = fjord_record::batch::batches(&log[..cut]).map_while(Result::ok).map(|(_, b)| b.len()).sum();
    cut - whole
}

#[test]
fn an_invalid_batch_above_the_recovery_point_is_cut_with_everything_after_it_kept_aside() {
    // Issue 26: recovery used to delete what it cut. A flipped byte in the middle of
    // unflushed data (a disk fault, not a torn write) cuts that batch, the rest of its
    // segment and every later segment: all of it must stay on disk, byte for byte.
    let (files, appended) = crashed_log(400, 11);
    let segments: Vec<String> = files.keys().filter(|n| n.ends_with(".log")).cloned().collect();
    assert!(segments.len() > 10);
    let segment = &segments[4];
    let batches: Vec<(usize, Offset)> = {
        let mut position = 0;
        fjord_record::batch::batches(&files[segment])
            .map(|b| {
                let (h, b) = b.unwrap();
                position += b.len();
                (position - b.len(), h.base_offset)
            })
            .collect()
    };
    let (position, damaged_offset) = batches[2];
    let mut damaged = files.clone();
    damaged.get_mut(segment).unwrap()[position + 40] ^= 0x08;
    let expected: Vec<_> = appended.iter().filter(|(o, _)| *o < damaged_offset).cloned().collect();

    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("t-0");
    fs::create_dir(&dir).unwrap();
    restore(&dir, &damaged);
    let log = Log::open(&dir, config()).unwrap();
    assert_eq!(read_all(&log), expected);
    let mut cut = damaged[segment][position..].to_vec();
    for later in segments.iter().filter(|n| *n > segment) {
        cut.extend_from_slice(&damaged[later]);
    }
    assert_eq!(kept_aside(root.path()), cut, "the damaged batch, the rest of its segment and every later segment");
    let side = fs::read_dir(root.path()).unwrap().map(|e| e.unwrap().path()).find(|p| p != &dir).unwrap();
    let manifest = fs::read_to_string(side.join(fjord_log::REPAIR_MANIFEST)).unwrap();
    assert!(manifest.contains(&format!("first bad batch: byte {position} of ")), "{manifest}");
    assert!(manifest.contains(&format!("kept: offsets [0, {damaged_offset})")), "{manifest}");
    // A log dir holding it opens without loading it as a partition.
    log.close().unwrap();
    drop(log);
    let m = fjord_log::LogManager::open(root.path(), config()).unwrap();
    assert_eq!(m.partitions(), vec![fjord_log::TopicPartition::new("t", 0)]);
    assert_eq!(read_all(&m.get(&fjord_log::TopicPartition::new("t", 0)).unwrap()), expected);
}
