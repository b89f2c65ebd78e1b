//! Unit tests of the partition log on real files in a temp dir.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use fjord_record::{batch, BatchBuilder};

use super::*;

/// A batch of `n` records of `value_len` bytes, record timestamps `ts, ts+1, ...`.
fn batch(n: usize, value_len: usize, ts: i64) -> Vec<u8> {
    let mut b = BatchBuilder::new(ts);
    for i in 0..n {
        b.append(ts + i as i64, Some(b"key"), Some(&vec![b'v'; value_len]), &[]);
    }
    b.build_vec()
}

fn small(segment_bytes: u64) -> LogConfig {
    LogConfig {
        segment_bytes,
        min_segment_bytes: 61,
        index_interval_bytes: 100,
        file_delete_delay: Duration::ZERO,
        ..LogConfig::default()
    }
}

/// Contents of every file in `dir` (the "byte for byte unchanged" check).
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.path().is_file())
        .map(|e| (e.file_name().to_string_lossy().into_owned(), fs::read(e.path()).unwrap()))
        .collect()
}

/// All `(offset, batch bytes)` readable from `from` on, following `next_offset`.
fn read_all(log: &Log, from: Offset) -> Vec<(Offset, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = from;
    while at < log.log_end_offset() {
        let s = log.read(at, 1 << 20, None, true).unwrap();
        assert!(!s.is_empty(), "empty read at {at} below the log end");
        let bytes = s.read_to_vec().unwrap();
        for b in batch::batches(&bytes) {
            let (h, b) = b.unwrap();
            out.push((h.base_offset, b.to_vec()));
        }
        at = s.next_offset;
    }
    out
}

#[test]
fn append_assigns_offsets_and_reads_return_whole_batches() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), LogConfig::default()).unwrap();
    let mut input = batch(3, 10, 1000);
    input.extend(batch(2, 10, 2000));
    let info = log.append(&mut input, 7).unwrap();
    assert_eq!((info.base_offset, info.last_offset, info.record_count, info.batch_count), (0, 4, 5, 2));
    assert_eq!(info.max_timestamp, 2001);
    let info = log.append(&mut batch(1, 10, 3000), 7).unwrap();
    assert_eq!((info.base_offset, info.last_offset), (5, 5));
    assert_eq!(log.log_end_offset(), 6);

    // Whole batches from the one holding the offset, rewritten offsets and epoch.
    let s = log.read(4, 1 << 20, None, false).unwrap();
    assert_eq!((s.first_offset, s.next_offset), (3, 6));
    let bytes = s.read_to_vec().unwrap();
    let headers: Vec<_> = batch::batches(&bytes).map(|b| b.unwrap().0).collect();
    assert_eq!(headers.iter().map(|h| h.base_offset).collect::<Vec<_>>(), vec![3, 5]);
    assert!(headers.iter().all(|h| h.partition_leader_epoch == 7));
    assert_eq!(log.read_bytes(4, 1 << 20, None, false).unwrap(), bytes);

    // The upper bound (high watermark) cuts before the batch that reaches it.
    let s = log.read(0, 1 << 20, Some(5), true).unwrap();
    assert_eq!((s.first_offset, s.next_offset), (0, 5));
    assert!(log.read(5, 1 << 20, Some(5), true).unwrap().is_empty());
    // max_bytes: nothing unless min_one, then exactly one batch.
    assert!(log.read(0, 10, None, false).unwrap().is_empty());
    let s = log.read(0, 10, None, true).unwrap();
    assert_eq!((s.first_offset, s.next_offset), (0, 3));
    // The log end gives an empty slice, beyond it an error.
    assert!(log.read(6, 1 << 20, None, true).unwrap().is_empty());
    assert!(matches!(log.read(7, 100, None, true), Err(Error::OffsetOutOfRange { requested: 7, log_start: 0, log_end: 6 })));
    assert!(matches!(log.read(-1, 100, None, true), Err(Error::OffsetOutOfRange { .. })));
    assert_eq!(log.leader_epochs(), vec![(7, 0)]);
}

#[test]
fn rolls_on_segment_bytes_and_reads_across_segments() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), small(1000)).unwrap();
    let mut appended = Vec::new();
    for i in 0..30 {
        let mut b = batch(2, 50, 1000 + i);
        let info = log.append(&mut b, 0).unwrap();
        appended.push((info.base_offset, b));
    }
    // 30 batches of ~180 bytes, at most 5 per 1000-byte segment.
    assert!(log.segment_count() >= 6, "{}", log.segment_count());
    let names: Vec<String> = snapshot(dir.path()).into_keys().filter(|n| n.ends_with(".log")).collect();
    assert_eq!(names[0], "00000000000000000000.log");
    assert!(names.iter().all(|n| n.len() == 24));
    assert_eq!(read_all(&log, 0), appended);
    // One slice never spans two segments.
    let s = log.read(0, 1 << 20, None, true).unwrap();
    assert!(s.len <= 1000);
    assert!(fs::metadata(dir.path().join("00000000000000000000.log")).unwrap().len() <= 1000);
    assert_eq!(log.size_bytes(), appended.iter().map(|(_, b)| b.len() as u64).sum::<u64>());
}

#[test]
fn rolls_on_segment_ms_by_record_time_and_on_a_full_index() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig { segment_ms: Some(Duration::from_millis(100)), ..small(1 << 20) };
    let log = Log::open(dir.path(), config).unwrap();
    log.append(&mut batch(1, 10, 1000), 0).unwrap();
    log.append(&mut batch(1, 10, 1100), 0).unwrap();
    assert_eq!(log.segment_count(), 1);
    log.append(&mut batch(1, 10, 1101), 0).unwrap();
    assert_eq!(log.segment_count(), 2);

    let dir = tempfile::tempdir().unwrap();
    // 64 bytes of offset index = 8 entries; an entry for every batch.
    let config = LogConfig { segment_index_bytes: 64, index_interval_bytes: 0, ..small(1 << 20) };
    let log = Log::open(dir.path(), config).unwrap();
    for i in 0..20 {
        log.append(&mut batch(1, 10, i), 0).unwrap();
    }
    assert_eq!(log.segment_count(), 4);
    assert_eq!(read_all(&log, 0).len(), 20);
}

#[test]
fn retention_by_time_deletes_old_sealed_segments_only() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig { retention_ms: Some(Duration::from_millis(1000)), ..small(400) };
    let log = Log::open(dir.path(), config).unwrap();
    for i in 0..10 {
        log.append(&mut batch(1, 100, i * 1000), 0).unwrap();
    }
    let before = log.segment_count();
    assert!(before >= 4);
    // At now = 5500 everything with max timestamp < 4500 is expired.
    let deleted = log.apply_retention(5500).unwrap();
    assert!(deleted > 0);
    assert_eq!(log.segment_count(), before - deleted);
    let start = log.log_start_offset();
    assert!(start > 0 && start <= 5, "{start}");
    assert!(matches!(log.read(0, 100, None, true), Err(Error::OffsetOutOfRange { .. })));
    assert_eq!(read_all(&log, start).len() as i64, 10 - start);
    // Far in the future: everything but the active segment goes.
    log.apply_retention(1_000_000).unwrap();
    assert_eq!(log.segment_count(), 1);
    assert!(log.log_start_offset() <= 9);
    assert_eq!(log.log_end_offset(), 10);
    // No leftover files of deleted segments (delay 0).
    let files = snapshot(dir.path());
    assert_eq!(files.keys().filter(|n| n.ends_with(".log")).count(), 1);
    assert!(!files.keys().any(|n| n.ends_with(".deleted")));
    // The start offset survives a restart.
    let start = log.log_start_offset();
    log.close().unwrap();
    let log = Log::open(dir.path(), config).unwrap();
    assert_eq!(log.log_start_offset(), start);
    assert_eq!(log.high_watermark(), start);
}

#[test]
fn retention_by_size_keeps_at_most_retention_bytes_plus_the_active_segment() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig { retention_bytes: Some(1000), retention_ms: None, ..small(400) };
    let log = Log::open(dir.path(), config).unwrap();
    for i in 0..30 {
        log.append(&mut batch(1, 100, i), 0).unwrap();
    }
    let before = log.size_bytes();
    assert!(before > 3000);
    assert!(log.apply_retention(0).unwrap() > 0);
    assert!(log.size_bytes() >= 1000 && log.size_bytes() < 1400, "{}", log.size_bytes());
    assert_eq!(log.apply_retention(0).unwrap(), 0);
    assert_eq!(read_all(&log, log.log_start_offset()).last().unwrap().0, 29);
}

#[test]
fn a_reader_holding_a_deleted_segment_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let config =
        LogConfig { retention_ms: Some(Duration::from_millis(1)), file_delete_delay: Duration::from_secs(60), ..small(400) };
    let log = Log::open(dir.path(), config).unwrap();
    for i in 0..10 {
        log.append(&mut batch(1, 100, i), 0).unwrap();
    }
    let slice = log.read(0, 1 << 20, None, true).unwrap();
    let expected = slice.read_to_vec().unwrap();
    assert!(log.apply_retention(1_000_000).unwrap() > 0);
    assert!(snapshot(dir.path()).keys().any(|n| n.ends_with(".log.deleted")));
    assert_eq!(slice.read_to_vec().unwrap(), expected);
    // Reopening finishes the interrupted deletion.
    drop(log);
    Log::open(dir.path(), config).unwrap();
    assert!(!snapshot(dir.path()).keys().any(|n| n.ends_with(".deleted")));
}

#[test]
fn offset_of_max_timestamp_is_the_first_record_carrying_it() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), small(600)).unwrap();
    assert_eq!(log.offset_of_max_timestamp().unwrap(), None, "no records");
    // librdkafka 0081's case: one record per batch at 100, 400, 250: offset 1.
    for ts in [100, 400, 250] {
        let mut b = BatchBuilder::new(ts);
        b.append(ts, None, Some(&[0; 40]), &[]);
        log.append(&mut b.build_vec(), 0).unwrap();
    }
    assert_eq!(log.offset_of_max_timestamp().unwrap(), Some((1, 400)));
    // Later segments with a larger timestamp, inside a compressed batch whose last
    // record is not the one (offsets 3-6 at 300, 900, 900, 500; then 7 at 900 again).
    for _ in 0..10 {
        let mut b = BatchBuilder::new(200);
        b.append(200, None, Some(&[0; 40]), &[]);
        log.append(&mut b.build_vec(), 0).unwrap();
    }
    let mut b = BatchBuilder::new(300);
    for ts in [300, 900, 900, 500] {
        b.append(ts, None, Some(&[0; 40]), &[]);
    }
    let mut compressed = b.build_compressed(fjord_record::Compression::Gzip).unwrap().to_vec();
    let base = log.append(&mut compressed, 0).unwrap().base_offset;
    let mut b = BatchBuilder::new(900);
    b.append(900, None, Some(&[0; 40]), &[]);
    log.append(&mut b.build_vec(), 0).unwrap();
    assert!(log.segment_count() > 2);
    assert_eq!(log.offset_of_max_timestamp().unwrap(), Some((base + 1, 900)));
}

#[test]
fn offset_for_timestamp_finds_the_first_record_at_or_after() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), small(600)).unwrap();
    // Batch i holds records at 10_000 + 100 i + {0, 10, 20}.
    for i in 0..20 {
        let mut b = BatchBuilder::new(10_000 + 100 * i);
        for r in 0..3 {
            b.append(10_000 + 100 * i + 10 * r, None, Some(&[0; 40]), &[]);
        }
        log.append(&mut b.build_vec(), 0).unwrap();
    }
    assert!(log.segment_count() > 2);
    assert_eq!(log.offset_for_timestamp(0).unwrap(), Some((0, 10_000)));
    assert_eq!(log.offset_for_timestamp(10_000).unwrap(), Some((0, 10_000)));
    assert_eq!(log.offset_for_timestamp(10_001).unwrap(), Some((1, 10_010)));
    assert_eq!(log.offset_for_timestamp(10_520).unwrap(), Some((17, 10_520)));
    assert_eq!(log.offset_for_timestamp(10_521).unwrap(), Some((18, 10_600)));
    assert_eq!(log.offset_for_timestamp(11_920).unwrap(), Some((59, 11_920)));
    assert_eq!(log.offset_for_timestamp(11_921).unwrap(), None);
    // Same answers from the files after a clean restart (sealed time indexes).
    log.close().unwrap();
    let log = Log::open(dir.path(), small(600)).unwrap();
    for ts in [0, 10_001, 10_520, 10_521, 11_920] {
        let expected = match ts {
            0 => Some((0, 10_000)),
            10_001 => Some((1, 10_010)),
            10_520 => Some((17, 10_520)),
            10_521 => Some((18, 10_600)),
            _ => Some((59, 11_920)),
        };
        assert_eq!(log.offset_for_timestamp(ts).unwrap(), expected, "{ts}");
    }
}

#[test]
fn missing_or_damaged_indexes_are_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), small(2000)).unwrap();
    for i in 0..40 {
        log.append(&mut batch(2, 60, i), 0).unwrap();
    }
    let expected = read_all(&log, 0);
    log.close().unwrap();
    let before = snapshot(dir.path());
    let indexes: Vec<String> = before.keys().filter(|n| n.ends_with(".index")).cloned().collect();
    assert!(indexes.len() >= 3);
    // Delete one sealed .index, tear another, zero-fill the active one's tail.
    fs::remove_file(dir.path().join(&indexes[0])).unwrap();
    let torn = dir.path().join(&indexes[1]);
    let len = fs::metadata(&torn).unwrap().len();
    fs::OpenOptions::new().write(true).open(&torn).unwrap().set_len(len - 3).unwrap();
    let active = dir.path().join(indexes.last().unwrap());
    let mut f = fs::OpenOptions::new().append(true).open(&active).unwrap();
    f.write_all(&[0; 16]).unwrap();
    let log = Log::open(dir.path(), small(2000)).unwrap();
    assert_eq!(read_all(&log, 0), expected);
    for o in 0..80 {
        let s = log.read(o, 1, None, true).unwrap();
        assert!(s.first_offset <= o && o < s.next_offset);
    }
    log.close().unwrap();
    // The rebuilt indexes are the ones append wrote.
    assert_eq!(
        snapshot(dir.path()).into_iter().filter(|(n, _)| n.ends_with("index")).collect::<Vec<_>>(),
        before.into_iter().filter(|(n, _)| n.ends_with("index")).collect::<Vec<_>>()
    );
}

#[test]
fn malformed_appends_are_typed_errors_and_change_no_byte() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), LogConfig { max_message_bytes: 2000, ..small(1 << 20) }).unwrap();
    log.append(&mut batch(3, 10, 0), 0).unwrap();
    log.flush().unwrap();
    let before = snapshot(dir.path());
    let good = batch(2, 10, 5);
    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("short", good[..30].to_vec()),
        ("truncated body", good[..good.len() - 1].to_vec()),
        ("too large", batch(1, 3000, 0)),
    ];
    let mut wrong_magic = good.clone();
    wrong_magic[16] = 1;
    cases.push(("wrong magic", wrong_magic));
    let mut wrong_crc = good.clone();
    *wrong_crc.last_mut().unwrap() ^= 1;
    cases.push(("wrong crc", wrong_crc));
    let mut length_lies = good.clone();
    length_lies[8..12].copy_from_slice(&(good.len() as i32 + 100).to_be_bytes());
    cases.push(("length lies", length_lies));
    let mut count_lies = good.clone();
    count_lies[57..61].copy_from_slice(&1i32.to_be_bytes());
    let crc = crc32c_of(&count_lies[21..]);
    count_lies[17..21].copy_from_slice(&crc.to_be_bytes());
    cases.push(("record count lies", count_lies));
    let mut good_then_bad = good.clone();
    good_then_bad.extend(&good[..good.len() - 5]);
    cases.push(("good then torn", good_then_bad));
    for (what, mut bytes) in cases {
        let err = log.append(&mut bytes, 0).unwrap_err();
        assert!(matches!(err, Error::InvalidBatch { .. } | Error::MessageTooLarge { .. }), "{what}: {err}");
        assert_eq!(snapshot(dir.path()), before, "{what} changed the log");
        assert!(log.append_replicated(&bytes).is_err());
        assert_eq!(snapshot(dir.path()), before, "{what} changed the log (replicated)");
    }
    assert_eq!(log.log_end_offset(), 3);
    assert_eq!(log.append(&mut batch(1, 10, 0), 0).unwrap().base_offset, 3);
}

/// KIP-937's limits on producers' timestamps. One batch stamped years ahead would keep
/// its segment, and every later one, from time retention for those years.
#[test]
fn timestamps_beyond_the_limits_are_refused_naming_each_record_and_change_no_byte() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), small(1 << 20)).unwrap();
    let (now, hour, day) = (now_ms(), 3_600_000, 86_400_000);
    // The defaults (Kafka 4.0's): up to an hour ahead, any time behind, and Kafka's
    // "no timestamp".
    log.append(&mut batch(2, 10, now), 0).unwrap();
    log.append(&mut batch(1, 10, now + hour - 60_000), 0).unwrap();
    log.append(&mut batch(1, 10, 5), 0).unwrap();
    log.append(&mut batch(1, 10, -1), 0).unwrap();
    log.flush().unwrap();
    let before = snapshot(dir.path());

    // Two batches; the second's last two records are a day ahead: the append's records
    // 3 and 4.
    let first = batch(2, 10, now);
    let mut ahead = BatchBuilder::new(now);
    for ts in [now, now + day, now + day + 1] {
        ahead.append(ts, Some(b"key"), Some(b"value"), &[]);
    }
    let mut bytes = [first.clone(), ahead.build_vec()].concat();
    match log.append(&mut bytes, 0) {
        Err(Error::TimestampOutOfRange { position, timestamp, min, max, record_indexes }) => {
            assert_eq!((position, timestamp, min, record_indexes), (first.len(), now + day, i64::MIN, vec![3, 4]));
            assert!((now + hour..now + hour + 60_000).contains(&max), "{max}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(snapshot(dir.path()), before, "a refused append changed the log");

    // Records in range under a header whose max timestamp, what time retention and the
    // time index go by, is ten years ahead: refused too, no record named.
    let mut forged = batch(1, 10, now);
    forged[35..43].copy_from_slice(&(now + 3650 * day).to_be_bytes());
    let crc = crc32c_of(&forged[21..]);
    forged[17..21].copy_from_slice(&crc.to_be_bytes());
    match log.append(&mut forged, 0) {
        Err(Error::TimestampOutOfRange { position: 0, timestamp, record_indexes, .. }) => {
            assert_eq!((timestamp, record_indexes), (now + 3650 * day, vec![]));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(snapshot(dir.path()), before, "a refused append changed the log");

    // `message.timestamp.before.max.ms` set: a record older than it is refused; the
    // limits lifted, the day-ahead batch goes in.
    let mut config = log.config();
    config.set("message.timestamp.before.max.ms", "86400000").unwrap();
    log.update_config(config).unwrap();
    assert!(matches!(log.append(&mut batch(1, 10, 5), 0), Err(Error::TimestampOutOfRange { .. })));
    // Kafka's "no timestamp" passes, and does not hide an old record beside it.
    let mut old = BatchBuilder::new(-1);
    for ts in [-1, 5, now] {
        old.append(ts, Some(b"key"), Some(b"value"), &[]);
    }
    match log.append(&mut old.build_vec(), 0) {
        Err(Error::TimestampOutOfRange { timestamp: 5, record_indexes, .. }) => assert_eq!(record_indexes, vec![1]),
        other => panic!("{other:?}"),
    }
    config.set("message.timestamp.before.max.ms", "9223372036854775807").unwrap();
    config.set("message.timestamp.after.max.ms", "9223372036854775807").unwrap();
    log.update_config(config).unwrap();
    assert_eq!(log.append(&mut bytes, 0).unwrap().base_offset, 5);
    // Followers take what their leader took.
    assert_eq!(log.log_end_offset(), 10);
}

/// CRC-32C (Castagnoli), bitwise: keeps the test independent of the crc32c crate.
fn crc32c_of(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0x82F6_3B78 } else { crc >> 1 };
        }
    }
    !crc
}

#[test]
fn replicated_appends_keep_offsets_and_reject_going_backwards() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), small(1 << 20)).unwrap();
    let mut b = batch(2, 10, 0);
    batch::set_base_offset(&mut b, 0);
    batch::set_partition_leader_epoch(&mut b, 3);
    log.append_replicated(&b).unwrap();
    let mut c = batch(2, 10, 0);
    batch::set_base_offset(&mut c, 1);
    assert!(matches!(log.append_replicated(&c), Err(Error::NonMonotonicOffset { offset: 1, expected_at_least: 2 })));
    batch::set_base_offset(&mut c, 2);
    batch::set_partition_leader_epoch(&mut c, 5);
    log.append_replicated(&c).unwrap();
    assert_eq!(log.log_end_offset(), 4);
    assert_eq!(log.leader_epochs(), vec![(3, 0), (5, 2)]);
    assert_eq!(log.end_offset_for_epoch(4), Some((3, 2)));
    assert_eq!(log.end_offset_for_epoch(5), Some((5, 4)));
}

#[test]
fn truncate_drops_whole_batches_and_appends_continue() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), small(500)).unwrap();
    for i in 0..20 {
        log.append(&mut batch(2, 50, i), i as i32 / 5).unwrap();
    }
    log.set_high_watermark(40);
    let before = log.segment_count();
    log.truncate_to(17).unwrap(); // inside batch 16..17: that batch goes
    assert_eq!(log.log_end_offset(), 16);
    assert_eq!(log.high_watermark(), 16);
    assert!(log.segment_count() < before);
    assert_eq!(log.leader_epochs(), vec![(0, 0), (1, 10)]);
    assert_eq!(read_all(&log, 0).len(), 8);
    assert_eq!(log.append(&mut batch(1, 10, 0), 9).unwrap().base_offset, 16);
    log.truncate_to(0).unwrap();
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (0, 0));
    assert_eq!(log.append(&mut batch(1, 10, 0), 9).unwrap().base_offset, 0);
    log.truncate_fully_and_start_at(1000).unwrap();
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (1000, 1000));
    log.append(&mut batch(1, 10, 0), 9).unwrap();
    drop(log);
    let log = Log::open(dir.path(), small(500)).unwrap();
    assert_eq!((log.log_start_offset(), log.log_end_offset()), (1000, 1001));
}

#[test]
fn stray_files_are_ignored_and_clean_reopen_equals_recovered_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), small(700)).unwrap();
    for i in 0..25 {
        log.append(&mut batch(1 + i % 3, 40, i as i64), 0).unwrap();
    }
    let expected = read_all(&log, 0);
    log.close().unwrap();
    assert!(matches!(log.append(&mut batch(1, 1, 0), 0), Err(Error::Closed { .. })));
    fs::write(dir.path().join("notes.txt"), "hello").unwrap();
    fs::write(dir.path().join("12.log"), "not a segment").unwrap();
    fs::create_dir(dir.path().join("subdir")).unwrap();
    fs::write(dir.path().join("00000000000000099999.index"), [0; 8]).unwrap();
    let log = Log::open(dir.path(), small(700)).unwrap();
    assert_eq!(read_all(&log, 0), expected);
    assert_eq!(log.recovery_point(), log.log_end_offset());
    drop(log); // no close: the next open re-validates everything
    let log = Log::open(dir.path(), small(700)).unwrap();
    assert_eq!(read_all(&log, 0), expected);
    assert_eq!(log.recovery_point(), 0);
    assert!(!dir.path().join("00000000000000099999.index").exists());
}

#[test]
fn readers_run_while_the_writer_appends() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(Log::open(dir.path(), small(4000)).unwrap());
    let done = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (log, done) = (log.clone(), done.clone());
            std::thread::spawn(move || {
                let mut reads = 0;
                loop {
                    // One more full pass after the writer stopped, so every reader reads.
                    let finished = done.load(Ordering::Acquire);
                    let end = log.log_end_offset();
                    let mut at = 0;
                    while at < end {
                        let s = log.read(at, 2000, None, true).unwrap();
                        let bytes = s.read_to_vec().unwrap();
                        let mut next = at;
                        for b in batch::batches(&bytes) {
                            let (h, _) = b.expect("readers only see whole valid batches");
                            next = h.next_offset();
                        }
                        assert!(next > at && next == s.next_offset);
                        at = next;
                        reads += 1;
                    }
                    if finished {
                        break;
                    }
                }
                reads
            })
        })
        .collect();
    for i in 0..300 {
        log.append(&mut batch(1 + i % 4, 30, i as i64), 0).unwrap();
    }
    done.store(true, Ordering::Release);
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
}

#[test]
fn flush_messages_moves_the_recovery_point() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), LogConfig { flush_messages: Some(5), ..small(1 << 20) }).unwrap();
    log.append(&mut batch(3, 10, 0), 0).unwrap();
    assert_eq!(log.recovery_point(), 0);
    log.append(&mut batch(3, 10, 0), 0).unwrap();
    assert_eq!(log.recovery_point(), 6);
    log.append(&mut batch(1, 10, 0), 0).unwrap();
    log.flush().unwrap();
    assert_eq!(log.recovery_point(), 7);
    let config = LogConfig { flush_ms: Some(Duration::from_millis(10)), ..small(1 << 20) };
    log.update_config(config).unwrap();
    log.append(&mut batch(1, 10, 0), 0).unwrap();
    assert!(!log.flush_if_due(0).unwrap());
    assert!(log.flush_if_due(now_ms() + 1000).unwrap());
    assert_eq!(log.recovery_point(), 8);
}

#[test]
fn truncation_keeps_indexes_equal_to_a_rebuild() {
    for (cut, interval) in [(57, 100), (40, 100), (3, 0), (75, 0), (61, 333)] {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig { index_interval_bytes: interval, ..small(3000) };
        let log = Log::open(dir.path(), config).unwrap();
        for i in 0..40 {
            // Timestamps go up and down, so the time index has gaps to get right.
            log.append(&mut batch(2, 40, (i * 37) % 50 * 10), 0).unwrap();
        }
        log.truncate_to(cut).unwrap();
        log.close().unwrap();
        let after_truncate: Vec<_> = snapshot(dir.path()).into_iter().filter(|(n, _)| n.ends_with("index")).collect();
        for (name, _) in &after_truncate {
            fs::remove_file(dir.path().join(name)).unwrap();
        }
        let log = Log::open(dir.path(), config).unwrap();
        log.close().unwrap();
        let rebuilt: Vec<_> = snapshot(dir.path()).into_iter().filter(|(n, _)| n.ends_with("index")).collect();
        assert_eq!(after_truncate, rebuilt, "cut {cut}, interval {interval}");
    }
}

#[test]
fn the_log_is_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Log>();
    assert_send_sync::<crate::LogManager>();
    assert_send_sync::<ReadSlice>();
}

#[test]
fn opening_a_bad_path_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    fs::write(&file, "x").unwrap();
    assert!(matches!(Log::open(&file, LogConfig::default()), Err(Error::Io { .. })));
    let bad = LogConfig { segment_bytes: 1, ..LogConfig::default() };
    assert!(matches!(Log::open(dir.path().join("p-0"), bad), Err(Error::InvalidConfig { .. })));
    // A directory squatting on the first segment's file name: a clear error, naming it.
    let p = dir.path().join("q-0");
    let squat = p.join("00000000000000000000.log");
    fs::create_dir_all(&squat).unwrap();
    assert!(matches!(Log::open(&p, LogConfig::default()), Err(Error::UnreadableSegment { path, .. }) if path == squat));
}

#[test]
fn readers_stay_correct_while_retention_deletes_under_them() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig { retention_bytes: Some(3000), retention_ms: None, ..small(1000) };
    let log = Arc::new(Log::open(dir.path(), config).unwrap());
    let done = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2u64)
        .map(|seed| {
            let (log, done) = (log.clone(), done.clone());
            std::thread::spawn(move || {
                let (mut ok, mut out_of_range) = (0, 0);
                let mut x = seed + 1;
                while !done.load(Ordering::Acquire) || ok == 0 {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    let (start, end) = (log.log_start_offset(), log.log_end_offset());
                    let offset = start + (x >> 33) as i64 % (end - start + 1);
                    match log.read(offset, 700, None, true) {
                        // Empty only at the log end (as loaded before the read).
                        Ok(s) if s.is_empty() => assert_eq!(offset, end),
                        Ok(s) => {
                            // Deleted or not, the slice's bytes are whole valid batches.
                            let bytes = s.read_to_vec().unwrap();
                            let first = batch::batches(&bytes).next().unwrap().unwrap().0;
                            assert!(first.base_offset <= offset && offset <= first.last_offset());
                            assert_eq!(batch::batches(&bytes).filter(|b| b.is_err()).count(), 0);
                            ok += 1;
                        }
                        Err(Error::OffsetOutOfRange { .. }) => out_of_range += 1,
                        Err(e) => panic!("read failed: {e}"),
                    }
                }
                (ok, out_of_range)
            })
        })
        .collect();
    for i in 0..400 {
        log.append(&mut batch(1 + i % 3, 40, i as i64), 0).unwrap();
        if i % 10 == 0 {
            log.apply_retention(0).unwrap();
        }
    }
    done.store(true, Ordering::Release);
    for r in readers {
        let (ok, _) = r.join().unwrap();
        assert!(ok > 0);
    }
    assert!(log.log_start_offset() > 0);
}

/// Bytes of disk a file holds (allocated blocks), as `du` counts them.
fn allocated(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(path).unwrap().blocks() * 512
}

/// Whether this file system reserves blocks past a file's end (`fallocate` with
/// `FALLOC_FL_KEEP_SIZE`); where it does not, `preallocate` must change nothing.
fn can_reserve(dir: &Path) -> bool {
    let probe = File::create(dir.join("probe")).unwrap();
    let flags = nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE;
    let ok = nix::fcntl::fallocate(std::os::fd::AsRawFd::as_raw_fd(&probe), flags, 0, 1 << 20).is_ok();
    fs::remove_file(dir.join("probe")).unwrap();
    ok
}

#[test]
fn preallocation_reserves_ahead_never_shows_in_the_file_and_is_given_back_on_seal() {
    const SEGMENT: u64 = 4 << 20;
    let probe_dir = tempfile::tempdir().unwrap();
    let reserves = can_reserve(probe_dir.path());
    for preallocate in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig { preallocate, segment_ms: Some(Duration::from_secs(60)), ..small(SEGMENT) };
        let first = dir.path().join("00000000000000000000.log");
        let mut appended = Vec::new();
        {
            let log = Log::open(dir.path(), config).unwrap();
            let mut b = batch(10, 1000, 1000);
            log.append(&mut b, 0).unwrap();
            appended.push(b);
            // The file is exactly the appended bytes; the blocks behind it reach the
            // segment size (the reservation is capped there) only when preallocating.
            assert_eq!(fs::metadata(&first).unwrap().len(), log.size_bytes());
            let reserved = allocated(&first) >= SEGMENT;
            assert_eq!(reserved, preallocate && reserves, "preallocate={preallocate}: {} bytes allocated", allocated(&first));
            // A crash: the log is dropped without close, its reservation still on disk.
        }
        let log = Log::open(dir.path(), config).unwrap();
        assert_eq!(log.size_bytes(), appended[0].len() as u64, "recovery saw only the written bytes");
        // Record time a minute on: `segment.ms` rolls with the first segment 4 MiB short.
        let mut b = batch(10, 1000, 70_000);
        log.append(&mut b, 0).unwrap();
        appended.push(b);
        assert_eq!(log.segment_count(), 2);
        // Sealed: the reservation past its data is given back.
        let sealed_len = fs::metadata(&first).unwrap().len();
        assert!(allocated(&first) < sealed_len + (64 << 10), "{} allocated for {sealed_len}", allocated(&first));
        log.close().unwrap();
        let active = log.view().values().next_back().unwrap().path(LOG_SUFFIX);
        let len = fs::metadata(&active).unwrap().len();
        assert!(allocated(&active) < len + (64 << 10), "closed: {} allocated for {len}", allocated(&active));
        // `append` wrote the assigned offsets into `appended` too.
        let read: Vec<Vec<u8>> = read_all(&log, 0).into_iter().map(|(_, b)| b).collect();
        assert_eq!(read, appended);
    }
}
