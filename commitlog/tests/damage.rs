//! Damage tests (issue 26, cases 5 and 6): each kind of on-disk file of a log is
//! damaged in turn after a clean shutdown, the case where nothing is re-read on open.
//! The log must open (or refuse with a precise message), never serve wrong data, and
//! never skip silently: reads before the damage return exactly what was appended,
//! reads at and past it fail with [`Error::CorruptSegment`].

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{batch, read_all};
use fjord_log::{Error, Log, LogConfig, LogManager, Offset, TopicPartition};
use fjord_record::BatchBuilder;

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 1000,
        min_segment_bytes: 61,
        index_interval_bytes: 256,
        file_delete_delay: Duration::ZERO,
        retention_ms: None,
        ..LogConfig::default()
    }
}

type Batches = Vec<(Offset, Vec<u8>)>;

/// A cleanly closed log of 40 batches of 3 records over about 10 segments, with
/// leader epochs 0, 2 and 5; returns what was appended.
fn closed_log(dir: &Path) -> Batches {
    let log = Log::open(dir, config()).unwrap();
    let mut appended = Vec::new();
    for i in 0..40 {
        let mut b = batch(3, 30, 1_000 + i * 10);
        let epoch = [0, 2, 5][i as usize / 14];
        let info = log.append(&mut b, epoch).unwrap();
        appended.push((info.base_offset, b));
    }
    assert!(log.segment_count() >= 8, "{} segments", log.segment_count());
    log.close().unwrap();
    appended
}

/// `(segment base offset, path)` of every `.log`, oldest first.
fn segments(dir: &Path) -> Vec<(Offset, PathBuf)> {
    let mut out: Vec<(Offset, PathBuf)> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .map(|p| (p.file_stem().unwrap().to_str().unwrap().parse().unwrap(), p))
        .collect();
    out.sort();
    out
}

/// `(position, base offset, size)` of each batch in a `.log` file.
fn batches_of(path: &Path) -> Vec<(usize, Offset, usize)> {
    let bytes = fs::read(path).unwrap();
    let mut position = 0;
    fjord_record::batch::batches(&bytes)
        .map(|b| {
            let (h, b) = b.unwrap();
            let out = (position, h.base_offset, b.len());
            position += b.len();
            out
        })
        .collect()
}

fn flip(path: &Path, at: usize) {
    let mut bytes = fs::read(path).unwrap();
    bytes[at] ^= 0x40;
    fs::write(path, bytes).unwrap();
}

/// Reads from `from` on as a consumer does; returns the batches read and the error
/// that stopped it (`None` when it reached the log end).
fn consume(log: &Log, from: Offset) -> (Batches, Option<Error>) {
    let mut out = Vec::new();
    let mut at = from;
    while at < log.log_end_offset() {
        match log.read(at, 700, None, true) {
            Ok(s) => {
                assert!(!s.is_empty(), "empty read at {at}");
                let bytes = s.read_to_vec().unwrap();
                for b in fjord_record::batch::batches(&bytes) {
                    let (h, b) = b.expect("the log served an invalid batch");
                    out.push((h.base_offset, b.to_vec()));
                }
                at = s.next_offset;
            }
            Err(e) => return (out, Some(e)),
        }
    }
    (out, None)
}

/// Asserts that a consumer from the start gets exactly the batches before `damaged`
/// (a base offset) and then an error naming `path`, and that reads of every offset
/// from the damaged batch to the end of its segment fail too.
fn assert_fenced(log: &Log, appended: &Batches, damaged: Offset, segment_end: Offset, path: &Path) {
    let (read, error) = consume(log, 0);
    let before: Batches = appended.iter().filter(|(o, _)| *o < damaged).cloned().collect();
    assert_eq!(read.len(), before.len(), "batches before the damage");
    assert_eq!(read, before, "data before the damage reads back exactly");
    match error {
        Some(Error::CorruptSegment { path: p, .. }) => assert_eq!(p, path),
        other => panic!("expected CorruptSegment at offset {damaged}, got {other:?}"),
    }
    for offset in damaged..segment_end {
        let r = log.read(offset, 1 << 20, None, true);
        assert!(matches!(r, Err(Error::CorruptSegment { .. })), "offset {offset}: {:?}", r.map(|s| s.first_offset));
    }
    assert_eq!(log.damage().len(), 1);
    assert_eq!(log.corrupt_batches(), 1, "found and counted once");
}

#[test]
fn a_flipped_byte_in_a_sealed_segment_is_an_error_at_and_after_it_never_a_skip() {
    // Issue 26, case 6: a flipped batch header made consumers skip 2,000 records. Here:
    // a CRC-covered byte, the magic byte and the length field, each in a middle batch.
    for (what, at_in_batch) in [("records", 70), ("magic", 16), ("length", 9)] {
        let dir = tempfile::tempdir().unwrap();
        let appended = closed_log(dir.path());
        let segs = segments(dir.path());
        let (base, path) = &segs[3];
        let in_segment = batches_of(path);
        let (position, damaged, _) = in_segment[1];
        flip(path, position + at_in_batch);
        let log = Log::open(dir.path(), config()).unwrap();
        assert_fenced(&log, &appended, damaged, segs[4].0, path);
        // Data in later segments is not touched by the damage and reads correctly.
        let (later, error) = consume(&log, segs[4].0);
        assert!(error.is_none(), "{what}: {error:?}");
        assert_eq!(later, appended.iter().filter(|(o, _)| *o >= segs[4].0).cloned().collect::<Batches>(), "{what}");
        assert!(*base < damaged);
    }
}

#[test]
fn damage_in_a_sealed_segments_last_batch_is_an_error_at_it() {
    let dir = tempfile::tempdir().unwrap();
    let appended = closed_log(dir.path());
    let segs = segments(dir.path());
    let path = &segs[2].1;
    let in_segment = batches_of(path);
    let (position, damaged, size) = *in_segment.last().unwrap();
    flip(path, position + size - 3);
    let log = Log::open(dir.path(), config()).unwrap();
    assert_fenced(&log, &appended, damaged, segs[3].0, path);
}

#[test]
fn a_segment_cut_short_in_the_middle_is_detected_on_open() {
    // Issue 26, case 6: "a truncation mid-segment skipped 100". Cut at a batch boundary,
    // so every batch left is valid: before the last offset index entry (the index
    // points past the end), and after it (the time index names a batch that is gone).
    for keep_batches in [1, 3] {
        let dir = tempfile::tempdir().unwrap();
        let appended = closed_log(dir.path());
        let segs = segments(dir.path());
        let path = &segs[5].1;
        let in_segment = batches_of(path);
        assert!(in_segment.len() > keep_batches, "{} batches", in_segment.len());
        let (cut, lost, _) = in_segment[keep_batches];
        fs::OpenOptions::new().write(true).open(path).unwrap().set_len(cut as u64).unwrap();
        let log = Log::open(dir.path(), config()).unwrap();
        assert_fenced(&log, &appended, lost, segs[6].0, path);
    }
}

/// Every offset reads back as the batch holding it, and a consumer reads everything.
fn assert_reads_exactly(log: &Log, appended: &Batches) {
    assert_eq!(read_all(log), *appended);
    let end = log.log_end_offset();
    for offset in 0..end {
        let s = log.read(offset, 1, None, true).unwrap();
        assert!(s.first_offset <= offset && offset < s.next_offset, "offset {offset}: got {}..{}", s.first_offset, s.next_offset);
    }
}

#[test]
fn a_damaged_offset_index_never_gives_a_wrong_batch() {
    // Garbage (rebuilt on open), and one entry that stays in order but names a smaller
    // offset than its batch has (used as it is; each lookup checks the batch it names).
    for garbage in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let appended = closed_log(dir.path());
        let segs = segments(dir.path());
        let index = segs[4].1.with_extension("index");
        let mut bytes = fs::read(&index).unwrap();
        assert!(bytes.len() >= 16, "at least two entries");
        if garbage {
            bytes.iter_mut().for_each(|b| *b = b.wrapping_mul(31).wrapping_add(7));
        } else {
            let previous = u32::from_be_bytes(bytes[0..4].try_into().unwrap());
            let relative = u32::from_be_bytes(bytes[8..12].try_into().unwrap());
            assert!(relative > previous + 1);
            bytes[8..12].copy_from_slice(&(previous + 1).to_be_bytes());
        }
        fs::write(&index, bytes).unwrap();
        let log = Log::open(dir.path(), config()).unwrap();
        assert_reads_exactly(&log, &appended);
        assert!(log.damage().is_empty(), "an index is not the data: no damage reported");
    }
}

#[test]
fn a_damaged_time_index_is_rebuilt_and_retention_keeps_the_segment() {
    // The last time entry holds the segment's largest timestamp, which retention
    // deletes by: flipped to an old time it would delete data that is not due.
    let dir = tempfile::tempdir().unwrap();
    let appended = closed_log(dir.path());
    let segs = segments(dir.path());
    let time_index = segs[1].1.with_extension("timeindex");
    let mut bytes = fs::read(&time_index).unwrap();
    let last = bytes.len() - 12;
    bytes[last..last + 8].copy_from_slice(&5i64.to_be_bytes());
    fs::write(&time_index, bytes).unwrap();
    let config = LogConfig { retention_ms: Some(Duration::from_millis(100)), ..config() };
    let log = Log::open(dir.path(), config).unwrap();
    // Records are stamped 1000..1400: at 1,050 only segments wholly older than 950 go.
    assert_eq!(log.apply_retention(1_050).unwrap(), 0, "no segment is older than retention.ms");
    assert_reads_exactly(&log, &appended);
    let (second, _) = &appended.iter().find(|(o, _)| *o >= segs[1].0).unwrap();
    let ts = 1_000 + 10 * appended.iter().position(|(o, _)| o == second).unwrap() as i64;
    assert_eq!(log.offset_for_timestamp(ts).unwrap().map(|(o, _)| o), Some(*second));
}

#[test]
fn a_damaged_leader_epoch_checkpoint_is_rebuilt_from_the_log() {
    // Issue 26, case 5: garbage in one partition's leader-epoch-checkpoint stopped the
    // broker from starting. Garbage, and a flipped digit that still parses.
    for damage in [&b"\xff\xfe garbage \x00"[..], b"flip"] {
        let dir = tempfile::tempdir().unwrap();
        closed_log(dir.path());
        let expected = Log::open(dir.path(), config()).unwrap().leader_epochs();
        assert_eq!(expected.iter().map(|e| e.0).collect::<Vec<_>>(), [0, 2, 5]);
        let path = dir.path().join("leader-epoch-checkpoint");
        if damage == b"flip" {
            let text = fs::read_to_string(&path).unwrap();
            fs::write(&path, text.replacen("\n2 ", "\n3 ", 1)).unwrap();
        } else {
            fs::write(&path, damage).unwrap();
        }
        let log = Log::open(dir.path(), config()).unwrap();
        assert_eq!(log.leader_epochs(), expected);
        assert_eq!(log.end_offset_for_epoch(2), Some((2, expected[2].1)));
    }
}

#[test]
fn a_damaged_producer_snapshot_is_rebuilt_from_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), config()).unwrap();
    for seq in 0..20 {
        let mut b = BatchBuilder::new(1_000).producer(1234, 3, seq * 2);
        b.append(1_000, Some(b"k"), Some(b"v"), &[]);
        b.append(1_001, Some(b"k"), Some(b"v"), &[]);
        log.append(&mut b.build_vec(), 0).unwrap();
    }
    let expected = log.producers();
    log.close().unwrap();
    drop(log);
    let snapshot = dir.path().join(format!("{:020}.snapshot", 40));
    let text = fs::read_to_string(&snapshot).unwrap();
    assert!(text.contains("\n1234 3 "), "{text}");
    fs::write(&snapshot, text.replace("\n1234 3 ", "\n1234 7 ")).unwrap();
    let log = Log::open(dir.path(), config()).unwrap();
    assert_eq!(log.producers(), expected);
    // The rebuilt state still recognises a retry of the last batch.
    let mut retry = BatchBuilder::new(1_000).producer(1234, 3, 38);
    retry.append(1_000, Some(b"k"), Some(b"v"), &[]);
    retry.append(1_001, Some(b"k"), Some(b"v"), &[]);
    assert!(log.append(&mut retry.build_vec(), 0).unwrap().duplicate);
}

#[test]
fn damaged_log_dir_checkpoints_are_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let tp = TopicPartition::new("t", 0);
    {
        let m = LogManager::open(dir.path(), config()).unwrap();
        let log = m.get_or_create(&tp, config()).unwrap();
        for i in 0..10 {
            log.append(&mut batch(3, 30, 1_000 + i), 0).unwrap();
        }
        log.set_high_watermark(21);
        log.flush().unwrap();
        m.checkpoint().unwrap();
        for i in 10..20 {
            log.append(&mut batch(3, 30, 1_000 + i), 0).unwrap();
        }
        // A crash: the checkpoints say 30 flushed, high watermark 21.
    }
    let rp = dir.path().join("recovery-point-offset-checkpoint");
    let hw = dir.path().join("replication-offset-checkpoint");
    // Flipped digits that still parse: a recovery point past the flushed data would skip
    // the CRC scan of what was never flushed; a high watermark past the real one would
    // show consumers records that are not committed.
    fs::write(&rp, fs::read_to_string(&rp).unwrap().replace("t 0 30", "t 0 90")).unwrap();
    fs::write(&hw, fs::read_to_string(&hw).unwrap().replace("t 0 21", "t 0 29")).unwrap();
    let m = LogManager::open(dir.path(), config()).unwrap();
    let log = m.get(&tp).unwrap();
    assert_eq!(log.log_end_offset(), 60);
    assert!(log.recovery_point() <= 30, "recovery point {}", log.recovery_point());
    assert!(log.high_watermark() <= 21, "high watermark {}", log.high_watermark());
    // Garbage: the same, and the log dir still opens.
    for f in [&rp, &hw] {
        fs::write(f, b"\x00\x01garbage").unwrap();
    }
    drop((log, m));
    let m = LogManager::open(dir.path(), config()).unwrap();
    assert_eq!(m.get(&tp).unwrap().log_end_offset(), 60);
}

#[test]
fn the_scrubber_finds_damage_no_read_touched() {
    let dir = tempfile::tempdir().unwrap();
    let appended = closed_log(dir.path());
    let segs = segments(dir.path());
    let path = &segs[6].1;
    let (position, damaged, _) = batches_of(path)[2];
    flip(path, position + 70);
    let log = Log::open(dir.path(), config()).unwrap();
    assert!(log.damage().is_empty(), "nothing read yet");
    // A small budget per call: the scrubber goes on where it stopped.
    let mut passes = 0;
    let mut checked = 0;
    while passes == 0 {
        let (bytes, finished) = log.scrub(500).unwrap();
        checked += bytes;
        passes += usize::from(finished);
    }
    assert!(checked > 0);
    assert_eq!(log.damage(), vec![(path.clone(), position as u64)]);
    assert_eq!(log.corrupt_batches(), 1);
    assert_fenced(&log, &appended, damaged, segs[7].0, path);
}

/// What a repair's side directory holds: the concatenation of what it moved aside, in
/// segment order (tail of the damaged segment first).
fn moved_bytes(repair: &fjord_log::Repair) -> Vec<u8> {
    let mut out = Vec::new();
    for m in &repair.moved {
        let bytes = fs::read(&m.to).unwrap();
        assert_eq!(bytes.len() as u64, m.bytes, "{}", m.to.display());
        out.extend(bytes);
    }
    out
}

/// The bytes of the log's segments from `(segment, position)` on, as they were before
/// a repair.
fn bytes_from(segs: &[(Offset, PathBuf)], segment: &Path, position: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let first = segs.iter().position(|(_, p)| p == segment).unwrap();
    for (i, (_, p)) in segs.iter().enumerate().skip(first) {
        let bytes = fs::read(p).unwrap();
        out.extend_from_slice(if i == first { &bytes[position as usize..] } else { &bytes[..] });
    }
    out
}

#[test]
fn repair_truncates_at_the_first_damage_keeps_the_rest_aside_and_the_log_goes_on() {
    // A flipped byte (found by reads), a cut-short segment (found on open), and damage
    // nothing has read yet (found by the repair's scrub).
    for kind in ["flip", "cut", "unread"] {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("t-0");
        let appended = closed_log(&dir);
        let segs = segments(&dir);
        let path = &segs[3].1;
        let (position, damaged, _) = batches_of(path)[1];
        match kind {
            "cut" => fs::OpenOptions::new().write(true).open(path).unwrap().set_len(position as u64).unwrap(),
            _ => flip(path, position + 70),
        }
        let before = bytes_from(&segs, path, position as u64);
        let log = Log::open(&dir, config()).unwrap();
        if kind == "flip" {
            assert!(log.read(damaged, 1 << 20, None, true).is_err());
        }
        let repair = log.repair(1_764_600_000_000).unwrap().expect(kind);
        assert_eq!((repair.truncated_to, &repair.segment, repair.position), (damaged, path, position as u64), "{kind}");
        assert!(repair.applied);
        assert_eq!(repair.side_dir, root.path().join("t-0-damaged-1764600000000"));
        assert_eq!(moved_bytes(&repair), before, "{kind}: every byte cut off is kept aside");
        let manifest = fs::read_to_string(repair.side_dir.join(fjord_log::REPAIR_MANIFEST)).unwrap();
        assert!(manifest.contains(&format!("byte {position} of {}", path.display())), "{manifest}");
        assert!(log.damage().is_empty(), "{kind}");
        let kept: Batches = appended.iter().filter(|(o, _)| *o < damaged).cloned().collect();
        assert_eq!(read_all(&log), kept, "{kind}");
        assert_eq!(log.repair(1_764_600_000_001).unwrap(), None, "{kind}: nothing left to repair");
        log.append(&mut batch(2, 5, 9_000), 6).unwrap();
        assert_eq!(read_all(&log).len(), kept.len() + 1, "{kind}");
        log.close().unwrap();
        drop(log);
        let log = Log::open(&dir, config()).unwrap();
        assert_eq!(read_all(&log).len(), kept.len() + 1, "{kind}: the repair holds after a reopen");
        assert!(log.damage().is_empty());
        assert_eq!(moved_bytes(&repair), before, "{kind}: the side files outlive the deleted segments");
        // A log dir holding the side directory opens without loading it.
        drop(log);
        let m = LogManager::open(root.path(), config()).unwrap();
        assert_eq!(m.partitions(), vec![TopicPartition::new("t", 0)]);
    }
}

#[test]
fn offline_repair_refuses_a_locked_dir_dry_runs_without_writing_then_repairs() {
    let root = tempfile::tempdir().unwrap();
    let tp = TopicPartition::new("t", 0);
    let dir = root.path().join("t-0");
    let appended = closed_log(&dir);
    let segs = segments(&dir);
    let path = &segs[4].1;
    let (position, damaged, _) = batches_of(path)[1];
    flip(path, position + 70);
    let before = bytes_from(&segs, path, position as u64);

    // A broker holds the log dir: no tool may write behind it.
    let m = LogManager::open(root.path(), config()).unwrap();
    assert!(matches!(fjord_log::repair_partition(root.path(), &tp, true, 1), Err(Error::InUse { .. })));
    m.close().unwrap();
    drop(m);

    let snapshot = |d: &Path| -> Vec<(PathBuf, Vec<u8>)> {
        let mut files: Vec<_> = fs::read_dir(d).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_file()).collect();
        files.sort();
        files.into_iter().map(|p| (p.clone(), fs::read(&p).unwrap())).collect()
    };
    let untouched = snapshot(&dir);
    let plan = fjord_log::repair_partition(root.path(), &tp, true, 1_764_600_000_000).unwrap().unwrap();
    assert!(!plan.applied);
    assert_eq!((plan.truncated_to, &plan.segment, plan.position), (damaged, path, position as u64));
    assert_eq!(plan.moved.len(), segs.len() - 4, "the damaged tail and every later segment");
    assert_eq!(snapshot(&dir), untouched, "a dry run writes nothing");
    assert!(!plan.side_dir.exists());

    let done = fjord_log::repair_partition(root.path(), &tp, false, 1_764_600_000_000).unwrap().unwrap();
    assert!(done.applied);
    assert_eq!((done.truncated_to, done.moved.len()), (damaged, plan.moved.len()));
    assert_eq!(moved_bytes(&done), before, "every byte cut off is kept aside");
    assert_eq!(fjord_log::repair_partition(root.path(), &tp, false, 1_764_600_000_001).unwrap(), None);

    let m = LogManager::open(root.path(), config()).unwrap();
    let log = m.get(&tp).unwrap();
    let kept: Batches = appended.iter().filter(|(o, _)| *o < damaged).cloned().collect();
    assert_eq!(read_all(&log), kept, "every record before the damage, nothing after it");
    assert_eq!(log.log_end_offset(), damaged);
}

/// The three ways a checkpoint file is damaged in these tests: cut short, one digit
/// changed so that it still parses (`flip` gives the changed text), and garbage.
fn damage_kinds(path: &Path, flip: impl Fn(&str) -> String) -> Vec<(&'static str, Vec<u8>)> {
    let good = fs::read(path).unwrap();
    let flipped = flip(std::str::from_utf8(&good).unwrap());
    assert_ne!(flipped.as_bytes(), &good[..], "the flip changes the file");
    vec![
        ("truncated", good[..good.len() / 2].to_vec()),
        ("flipped digit", flipped.into_bytes()),
        ("garbage", b"\xff\x00\x13 not a checkpoint\n\n".to_vec()),
    ]
}

#[test]
fn a_damaged_log_start_offset_checkpoint_never_hides_or_deletes_records() {
    // DeleteRecords moved the start to 13, inside a segment. A damaged checkpoint must
    // not move it further (a flipped digit that still parses, 13 -> 19, would delete the
    // records 13..19): the start falls back to the first segment, which only makes
    // records below 13 readable again.
    let root = tempfile::tempdir().unwrap();
    let tp = TopicPartition::new("t", 0);
    let appended = {
        let m = LogManager::open(root.path(), config()).unwrap();
        let log = m.get_or_create(&tp, config()).unwrap();
        let mut appended = Vec::new();
        for i in 0..10 {
            let mut b = batch(3, 30, 1_000 + i);
            appended.push((log.append(&mut b, 0).unwrap().base_offset, b));
        }
        log.set_high_watermark(30);
        assert_eq!(log.delete_records_before(13).unwrap(), 13);
        m.close().unwrap();
        appended
    };
    let path = root.path().join(fjord_log::LOG_START_CHECKPOINT);
    let good = fs::read(&path).unwrap();
    for (kind, bytes) in damage_kinds(&path, |t| t.replacen("t 0 13\n", "t 0 19\n", 1)) {
        fs::write(&path, &bytes).unwrap();
        let m = LogManager::open(root.path(), config()).unwrap_or_else(|e| panic!("{kind}: {e}"));
        let log = m.get(&tp).unwrap();
        assert!(log.log_start_offset() <= 13, "{kind}: log start {}", log.log_start_offset());
        assert_eq!(log.log_end_offset(), 30, "{kind}");
        let kept: Batches = appended.iter().filter(|(o, _)| *o + 3 > log.log_start_offset()).cloned().collect();
        assert_eq!(read_all(&log), kept, "{kind}: every record from the start on");
        assert!(kept.first().is_some_and(|(o, _)| *o <= 12), "{kind}: the batch holding 13 is there");
        drop(log);
        drop(m);
        fs::write(&path, &good).unwrap();
    }
}

/// `.log` files of a partition directory (the ones deleted segments leave are `.deleted`).
fn segment_files(dir: &Path) -> usize {
    segments(dir).len()
}

#[test]
fn a_version_0_log_start_checkpoint_with_a_flipped_digit_hides_and_deletes_nothing() {
    // A version 0 file (Kafka's layout, Fjord's before the checksum) parses with a digit
    // flipped. Before the fix, "t 0 13" read as "t 0 19" moved the start to 19 at open
    // (hiding 13..19; "t 0 43" deleted the segments below 43) and "t 0 93" to the log
    // end (every record gone). Now such a value is ignored with a warning, a believable one
    // is applied, and the next checkpoint rewrites the file checksummed.
    let root = tempfile::tempdir().unwrap();
    let tp = TopicPartition::new("t", 0);
    let partition_dir = root.path().join("t-0");
    let appended = {
        let m = LogManager::open(root.path(), config()).unwrap();
        let log = m.get_or_create(&tp, config()).unwrap();
        let mut appended = Vec::new();
        for i in 0..20 {
            let mut b = batch(3, 30, 1_000 + i);
            appended.push((log.append(&mut b, 0).unwrap().base_offset, b));
        }
        log.set_high_watermark(60);
        assert_eq!(log.delete_records_before(13).unwrap(), 13);
        m.close().unwrap();
        appended
    };
    let segments_before = segment_files(&partition_dir);
    assert!(segments_before >= 3, "{segments_before} segments: a flip to 43 reaches past the first");
    let from_13: Batches = appended.iter().filter(|(o, _)| *o + 3 > 13).cloned().collect();
    let path = root.path().join(fjord_log::LOG_START_CHECKPOINT);
    // (value, believable): 19 and 43 are 13 with a digit flipped, 93 is past the end.
    for (value, believable) in [("19", false), ("43", false), ("93", false), ("13", true)] {
        fs::write(&path, format!("0\n1\nt 0 {value}\n")).unwrap();
        let m = LogManager::open(root.path(), config()).unwrap_or_else(|e| panic!("{value}: {e}"));
        let log = m.get(&tp).unwrap();
        // An ignored value leaves the start at the base of the first segment left by
        // DeleteRecords(13), the one holding 12..15.
        let start = log.log_start_offset();
        assert!(start <= 13, "v0 {value}: log start {start}");
        assert_eq!(start == 13, believable, "v0 {value}: a believable value is applied, another ignored (start {start})");
        assert_eq!(log.log_end_offset(), 60, "v0 {value}");
        assert_eq!(segment_files(&partition_dir), segments_before, "v0 {value}: no segment deleted");
        let read: Batches = read_all(&log).into_iter().filter(|(o, _)| *o + 3 > 13).collect();
        assert_eq!(read, from_13, "v0 {value}: every record from 13 on is readable");
        // The next checkpoint writes the start in force, checksummed.
        m.checkpoint().unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("1\n1\n") && text.contains("\ncrc32c "), "v0 {value}: rewritten checksummed: {text:?}");
        assert!(text.contains(&format!("\nt 0 {start}\n")), "v0 {value}: {text:?}");
        drop(log);
        m.close().unwrap();
    }
}

#[test]
fn a_damaged_cleaner_checkpoint_costs_work_never_records() {
    // A compacted log cleaned once: the cleaner checkpoint says how far it is clean and
    // when it first passed over each range (tombstones live delete.retention.ms from
    // then). Damaged, it must make the next clean redo work, never drop a tombstone
    // early: a digit flipped in "expired below" (0 -> 9) still parsed before the
    // checkpoint had a checksum and deleted the tombstones at offsets 5 and 6 an hour
    // before their time.
    const HOUR_MS: i64 = 3_600_000;
    let config = LogConfig {
        cleanup_policy: fjord_log::CleanupPolicy::Compact,
        delete_retention: Duration::from_millis(HOUR_MS as u64),
        segment_ms: Some(Duration::from_secs(3600)),
        ..config()
    };
    let record = |key: &str, value: Option<&str>, ts: i64| {
        let mut b = BatchBuilder::new(ts);
        b.append(ts, Some(key.as_bytes()), value.map(str::as_bytes), &[]);
        b.build_vec()
    };
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("t-0");
    let log = Log::open(&dir, config).unwrap();
    for (i, (key, value)) in
        [("a", Some("1")), ("b", Some("1")), ("c", Some("1")), ("d", Some("1")), ("e", Some("1")), ("a", None), ("b", None)]
            .into_iter()
            .chain((0..40).map(|i| if i % 2 == 0 { ("f", Some("x")) } else { ("g", Some("y")) }))
            .enumerate()
    {
        log.append(&mut record(key, value, 1_000 + i as i64), 0).unwrap();
    }
    log.set_high_watermark(log.log_end_offset());
    let mut cleaner = fjord_log::Cleaner::new(fjord_log::CleanerConfig::default());
    let now = 10 * HOUR_MS;
    cleaner.clean(&log, now).unwrap();
    // The offsets of keys a to e and of the tombstones among them.
    let first_keys = |log: &Log| -> (Vec<Offset>, Vec<Offset>) {
        let (mut kept, mut tombstones) = (Vec::new(), Vec::new());
        for (_, bytes) in read_all(log) {
            let h = fjord_record::BatchHeader::parse(&bytes).unwrap();
            let body = fjord_record::compression::records_body(&h, &bytes, 1 << 20).unwrap();
            for r in fjord_record::Records::new(&body, fjord_record::BATCH_OVERHEAD) {
                let r = r.unwrap();
                let offset = h.base_offset + i64::from(r.offset_delta);
                if r.key.is_some_and(|k| k < &b"f"[..]) {
                    kept.push(offset);
                    if r.value.is_none() {
                        tombstones.push(offset);
                    }
                }
            }
        }
        (kept, tombstones)
    };
    assert_eq!(first_keys(&log), (vec![2, 3, 4, 5, 6], vec![5, 6]), "tombstones stay delete.retention.ms after the first clean");
    log.close().unwrap();
    drop(log);

    let path = dir.join("cleaner-offset-checkpoint");
    let good = fs::read(&path).unwrap();
    // "expired below" is the second field of the first entry line (the third line of the
    // file in the layout without a checksum, where it had a line of its own).
    let flip = |text: &str| {
        let mut lines: Vec<String> = text.split('\n').map(str::to_owned).collect();
        match lines[2].split(' ').collect::<Vec<_>>().as_slice() {
            ["0"] => lines[2] = "9".to_owned(),
            [first, "0", due] => lines[2] = format!("{first} 9 {due}"),
            other => panic!("unexpected cleaner checkpoint line {other:?}"),
        }
        lines.join("\n")
    };
    for (kind, bytes) in damage_kinds(&path, flip) {
        fs::write(&path, &bytes).unwrap();
        let log = Log::open(&dir, config).unwrap_or_else(|e| panic!("{kind}: {e}"));
        // New records make the log dirty again; a clean a minute later (well inside the
        // tombstones' hour) rewrites the segments holding the tombstones.
        for i in 0..30 {
            log.append(&mut record(if i % 2 == 0 { "f" } else { "g" }, Some("z"), 2_000 + i), 0).unwrap();
        }
        log.set_high_watermark(log.log_end_offset());
        cleaner.clean(&log, now + 60_000).unwrap();
        assert_eq!(first_keys(&log), (vec![2, 3, 4, 5, 6], vec![5, 6]), "{kind}: no tombstone goes early, no record is lost");
        log.close().unwrap();
        drop(log);
        fs::write(&path, &good).unwrap();
    }
}

/// Every entry of a directory, recursively, with its bytes (a directory's as empty):
/// what "nothing was changed" compares.
fn tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let meta = fs::symlink_metadata(&path).unwrap();
        if meta.is_dir() {
            out.push((path.clone(), Vec::new()));
            out.extend(tree(&path));
        } else if meta.is_file() {
            out.push((path.clone(), fs::read(&path).unwrap()));
        } else {
            out.push((path.clone(), fs::read_link(&path).unwrap().into_os_string().into_encoded_bytes()));
        }
    }
    out.sort();
    out
}

/// Puts something other than a segment file at a segment's path (given the path and a
/// directory for link targets).
type Break = fn(&Path, &Path);

#[test]
fn a_segment_path_that_is_not_a_readable_file_keeps_the_log_closed_and_changes_nothing() {
    // Before: a `.log` that was not a file was skipped as an unexpected entry, so with
    // the last segment a directory the log opened shorter (its indexes removed as
    // orphans, its records gone from reads) instead of being reported.
    let dir = tempfile::tempdir().unwrap();
    let part = dir.path().join("t-0");
    let appended = closed_log(&part);
    let segs = segments(&part);
    let (last, middle) = (segs.last().unwrap().1.clone(), segs[segs.len() / 2].1.clone());
    let aside = dir.path().join("aside.log");

    // The last (active) segment a directory holding its bytes; then a middle one a
    // link to nothing.
    let breaks: [(&Path, &str, Break); 2] = [
        (&last, "a directory", |seg, _| {
            fs::create_dir(seg).unwrap();
            fs::copy(Path::new(seg).with_extension("moved"), seg.join("inside")).unwrap();
        }),
        (&middle, "a link to nothing", |seg, aside| std::os::unix::fs::symlink(aside.join("gone"), seg).unwrap()),
    ];
    for (seg, found, make) in breaks {
        fs::rename(seg, seg.with_extension("moved")).unwrap();
        make(seg, &aside);
        let before = tree(&part);
        match Log::open(&part, config()) {
            Err(Error::UnreadableSegment { path, found: f }) => {
                assert_eq!((path.as_path(), f.as_str()), (seg, found));
            }
            other => panic!("{seg:?} as {found}: expected UnreadableSegment, got {:?}", other.map(|l| l.log_end_offset())),
        }
        assert_eq!(tree(&part), before, "{found}: nothing in the directory changed");

        // A log dir serves its other partitions and reports this one offline, naming the path.
        let manager = LogManager::open(dir.path(), config()).unwrap();
        let tp = TopicPartition::new("t", 0);
        assert!(manager.get(&tp).is_none() && manager.is_offline(&tp));
        let reason = manager.unhealthy().get(&tp).map(|u| u.to_string()).unwrap_or_default();
        assert!(reason.contains(&seg.display().to_string()) && reason.contains(found), "{reason}");
        manager.close().unwrap();
        assert_eq!(tree(&part), before, "{found}: nothing changed by the log dir either");

        // Restored, it opens with every record.
        let p = Path::new(seg);
        if fs::symlink_metadata(p).unwrap().is_dir() {
            fs::remove_dir_all(p).unwrap();
        } else {
            fs::remove_file(p).unwrap();
        }
        fs::rename(p.with_extension("moved"), p).unwrap();
        let log = Log::open(&part, config()).unwrap();
        assert_reads_exactly(&log, &appended);
        log.close().unwrap();
    }
}
