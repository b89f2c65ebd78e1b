//! Log compaction through the public API: a model test (random keyed appends with
//! tombstones and codecs, cleans at random times, reopens) against "latest record
//! per key, tombstones only within delete.retention.ms, original offsets"; crash
//! tests that stop the segment swap at every step and reopen; bounded memory
//! (more keys than the offset map holds); and what a clean must keep as it was.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::read_all;
use fjord_log::cleaner::SwapStep;
use fjord_log::{Cleaner, CleanerConfig, CleanupPolicy, Error, Log, LogConfig, LogManager, Offset, TopicPartition};
use fjord_record::{BatchBuilder, BatchHeader, Compression, Records, BATCH_OVERHEAD};
use proptest::prelude::*;

/// `(offset, key, value)`; `None` value is a tombstone.
type Rec = (Offset, Vec<u8>, Option<Vec<u8>>);

const HOUR_MS: i64 = 3_600_000;
const RETENTION_MS: i64 = 1_000;
const SENTINEL: &[u8] = b"~sentinel";
const CODECS: [Compression; 5] = [Compression::None, Compression::Gzip, Compression::Snappy, Compression::Lz4, Compression::Zstd];

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 1_200,
        min_segment_bytes: 1_200,
        segment_ms: Some(Duration::from_secs(3600)),
        index_interval_bytes: 100,
        file_delete_delay: Duration::ZERO,
        cleanup_policy: CleanupPolicy::Compact,
        delete_retention: Duration::from_millis(RETENTION_MS as u64),
        ..LogConfig::default()
    }
}

fn keyed_batch(records: &[(Vec<u8>, Option<Vec<u8>>)], ts: i64, codec: Compression) -> Vec<u8> {
    let mut b = BatchBuilder::new(ts);
    for (i, (k, v)) in records.iter().enumerate() {
        b.append(ts + i as i64, Some(k), v.as_deref(), &[]);
    }
    b.build_compressed(codec).unwrap().to_vec()
}

/// Every record readable from the log start, decompressed; checks CRCs and that
/// offsets strictly increase.
fn records(log: &Log) -> Vec<Rec> {
    let mut out: Vec<Rec> = Vec::new();
    for (_, bytes) in read_all(log) {
        let h = BatchHeader::parse(&bytes).unwrap();
        assert!(h.record_count > 0, "an empty batch was served");
        let body = fjord_record::compression::records_body(&h, &bytes, 1 << 30).unwrap();
        let mut n = 0;
        for r in Records::new(&body, BATCH_OVERHEAD) {
            let r = r.unwrap();
            let offset = h.base_offset + i64::from(r.offset_delta);
            assert!(offset <= h.last_offset());
            assert!(out.last().is_none_or(|l| l.0 < offset), "offsets must increase");
            out.push((offset, r.key.unwrap().to_vec(), r.value.map(<[u8]>::to_vec)));
            n += 1;
        }
        assert_eq!(n, h.record_count, "record count in the header");
    }
    out
}

/// What was appended, and when the cleaner first passed over each offset range.
#[derive(Default)]
struct Model {
    appended: Vec<Rec>,
    /// `(end, ms)`: offsets below `end` (and above the previous end) first cleaned at `ms`.
    seen: Vec<(Offset, i64)>,
}

impl Model {
    fn first_seen(&self, offset: Offset) -> i64 {
        self.seen.iter().find(|(end, _)| offset < *end).expect("cleaned offsets are seen").1
    }

    /// A clean at `now` with everything below `clean_end` cleanable.
    fn clean(&mut self, clean_end: Offset, now: i64) {
        if self.seen.last().is_none_or(|(e, _)| *e < clean_end) {
            self.seen.push((clean_end, now));
        }
    }

    /// The log after cleans up to `clean_end`, the last one at `now`.
    fn expected(&self, clean_end: Offset, now: i64) -> Vec<Rec> {
        let mut latest: BTreeMap<&[u8], Offset> = BTreeMap::new();
        for (o, k, _) in self.appended.iter().filter(|r| r.0 < clean_end) {
            latest.insert(k, *o);
        }
        self.appended
            .iter()
            .filter(|(o, k, v)| {
                *o >= clean_end || (latest[k.as_slice()] == *o && (v.is_some() || self.first_seen(*o) + RETENTION_MS > now))
            })
            .cloned()
            .collect()
    }
}

/// Appends a batch and records it in the model.
fn append(log: &Log, model: &mut Model, records: &[(Vec<u8>, Option<Vec<u8>>)], ts: i64, codec: Compression) {
    let info = log.append(&mut keyed_batch(records, ts, codec), 0).unwrap();
    for (i, (k, v)) in records.iter().enumerate() {
        model.appended.push((info.base_offset + i as i64, k.clone(), v.clone()));
    }
}

/// Rolls the active segment with a sentinel batch far in the future of record time
/// (`segment.ms`): everything before it becomes cleanable. Returns the sentinel offset.
fn seal(log: &Log, model: &mut Model, round: i64) -> Offset {
    let end = log.log_end_offset();
    append(log, model, &[(SENTINEL.to_vec(), Some(round.to_be_bytes().to_vec()))], (round + 1) * 2 * HOUR_MS, Compression::None);
    // As the broker does once records are committed: the cleaner stops at the high watermark.
    log.set_high_watermark(log.log_end_offset());
    end
}

#[derive(Debug, Clone)]
enum Action {
    Nothing,
    /// Clean, `dt` ms after the previous action.
    Clean {
        dt: i64,
    },
    Reopen {
        clean: bool,
    },
}

type Batch = (Vec<(u8, bool)>, usize);

fn round() -> impl Strategy<Value = (Vec<Batch>, Action)> {
    let batch = (prop::collection::vec((0u8..12, prop::bool::weighted(0.2)), 1..6), 0usize..5);
    let action = prop_oneof![
        1 => Just(Action::Nothing),
        4 => (0i64..800).prop_map(|dt| Action::Clean { dt }),
        1 => any::<bool>().prop_map(|clean| Action::Reopen { clean }),
    ];
    (prop::collection::vec(batch, 1..8), action)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// The cleaned log equals the model: per key the latest record (below the
    /// cleanable end), tombstones only while younger than delete.retention.ms since
    /// their first clean, everything at its original offset; also across reopens.
    #[test]
    fn compaction_keeps_the_latest_record_per_key(rounds in prop::collection::vec(round(), 1..10), map_bytes in 0usize..3) {
        let dir = tempfile::tempdir().unwrap();
        let mut log = Log::open(dir.path(), config()).unwrap();
        // 12 keys and a sentinel: the smallest map forces several passes.
        let dedupe_buffer_size = [384, 4096, 1 << 20][map_bytes];
        let mut cleaner = Cleaner::new(CleanerConfig { dedupe_buffer_size, ..CleanerConfig::default() });
        let mut model = Model::default();
        let (mut now, mut counter, mut clean_end) = (10 * HOUR_MS, 0u32, 0);
        for (i, (batches, action)) in rounds.into_iter().enumerate() {
            for (records, codec) in batches {
                let records: Vec<_> = records.into_iter().map(|(k, tomb)| {
                    counter += 1;
                    (vec![b'k', k], (!tomb).then(|| counter.to_be_bytes().to_vec()))
                }).collect();
                append(&log, &mut model, &records, i as i64 * 2 * HOUR_MS + 1, CODECS[codec]);
            }
            match action {
                Action::Nothing => {}
                Action::Clean { dt } => {
                    now += dt;
                    clean_end = seal(&log, &mut model, i as i64);
                    let stats = cleaner.clean(&log, now).unwrap();
                    model.clean(clean_end, now);
                    prop_assert_eq!(stats.first_dirty_after, clean_end);
                    prop_assert_eq!(records(&log), model.expected(clean_end, now));
                }
                Action::Reopen { clean } => {
                    if clean {
                        log.close().unwrap();
                    }
                    drop(log);
                    log = Log::open(dir.path(), config()).unwrap();
                    log.set_high_watermark(log.log_end_offset());
                    prop_assert_eq!(records(&log), model.expected(clean_end, now));
                }
            }
        }
        // A last clean long after: every tombstone below the end is gone.
        now += 10 * RETENTION_MS;
        clean_end = seal(&log, &mut model, 1000);
        cleaner.clean(&log, now).unwrap();
        model.clean(clean_end, now);
        cleaner.clean(&log, now + 10 * RETENTION_MS).unwrap();
        let got = records(&log);
        prop_assert_eq!(&got, &model.expected(clean_end, now + 10 * RETENTION_MS));
        prop_assert!(got.iter().all(|r| r.2.is_some() || r.0 >= clean_end));
        drop(log);
        let log = Log::open(dir.path(), config()).unwrap();
        prop_assert_eq!(records(&log), got);
    }
}

/// A log with history: `keys` keys updated `rounds` times (some deleted), sealed.
fn history(dir: &Path, keys: usize, rounds: usize, codec: Compression) -> (Log, Model, Offset) {
    let log = Log::open(dir, config()).unwrap();
    let mut model = Model::default();
    for r in 0..rounds {
        for chunk in (0..keys).collect::<Vec<_>>().chunks(4) {
            let records: Vec<_> = chunk
                .iter()
                .map(|k| {
                    let value = (r % 3 != 2 || k % 2 == 0).then(|| format!("value-{k}-{r}").into_bytes());
                    (format!("key-{k}").into_bytes(), value)
                })
                .collect();
            append(&log, &mut model, &records, 1_000 + r as i64, codec);
        }
    }
    let end = seal(&log, &mut model, 0);
    (log, model, end)
}

#[test]
fn more_keys_than_the_offset_map_holds_take_several_passes() {
    let dir = tempfile::tempdir().unwrap();
    let (log, mut model, end) = history(dir.path(), 60, 4, Compression::None);
    let mut cleaner = Cleaner::new(CleanerConfig { dedupe_buffer_size: 384, ..CleanerConfig::default() });
    assert_eq!(cleaner.map_capacity(), 12);
    let now = 10 * HOUR_MS;
    let stats = cleaner.clean(&log, now).unwrap();
    model.clean(end, now);
    assert!(stats.passes >= 60 / 12, "{stats:?}");
    assert_eq!(records(&log), model.expected(end, now));
    assert!(stats.bytes_after < stats.bytes_before);
    assert_eq!(log.last_clean(), Some(stats));

    // A single batch with more keys than the map holds is a typed error.
    let many: Vec<_> = (0..20).map(|k| (format!("x{k}").into_bytes(), Some(b"v".to_vec()))).collect();
    append(&log, &mut model, &many, 1, Compression::None);
    seal(&log, &mut model, 1);
    assert!(matches!(cleaner.clean(&log, now), Err(Error::CleanerBufferTooSmall { capacity: 12, .. })));
    assert_eq!(records(&log), model.expected(end, now), "a failed clean changes nothing");
}

#[test]
fn compressed_batches_stay_compressed_and_keep_producer_fields() {
    for codec in CODECS {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), config()).unwrap();
        let mut model = Model::default();
        for r in 0..6 {
            let mut b = BatchBuilder::new(100).producer(7, 3, r * 4);
            let mut recs = Vec::new();
            for k in 0..4 {
                let value = format!("v{r}-{k}").into_bytes();
                b.append(100 + k, Some(format!("k{}", (k + r as i64) % 5).as_bytes()), Some(&value), &[("h", Some(b"x"))]);
                recs.push((format!("k{}", (k + r as i64) % 5).into_bytes(), Some(value)));
            }
            let info = log.append(&mut b.build_compressed(codec).unwrap().to_vec(), 0).unwrap();
            for (i, (k, v)) in recs.into_iter().enumerate() {
                model.appended.push((info.base_offset + i as i64, k, v));
            }
        }
        let end = seal(&log, &mut model, 0);
        let mut cleaner = Cleaner::new(CleanerConfig::default());
        cleaner.clean(&log, HOUR_MS).unwrap();
        model.clean(end, HOUR_MS);
        assert_eq!(records(&log), model.expected(end, HOUR_MS), "{codec:?}");
        for (base, bytes) in read_all(&log).into_iter().filter(|(b, _)| *b < end) {
            let h = BatchHeader::parse(&bytes).unwrap();
            assert_eq!(h.compression(), codec);
            assert_eq!((h.producer_id, h.producer_epoch, h.base_sequence % 4), (7, 3, 0));
            // The batch keeps its offset range: base and last offset as appended.
            assert_eq!((h.base_offset, h.last_offset()), (base, base + 3));
        }
    }
}

#[test]
fn the_dirty_ratio_and_the_compaction_lag_decide_when() {
    let dir = tempfile::tempdir().unwrap();
    let manager = LogManager::open(dir.path(), config()).unwrap();
    let tp = TopicPartition::new("table", 0);
    let log = manager.get_or_create(&tp, config()).unwrap();
    let plain = manager
        .get_or_create(&TopicPartition::new("stream", 0), LogConfig { cleanup_policy: CleanupPolicy::Delete, ..config() })
        .unwrap();
    let mut model = Model::default();
    for r in 0..20 {
        append(
            &log,
            &mut model,
            &[(b"a".to_vec(), Some(vec![r; 50])), (b"b".to_vec(), Some(vec![r; 50]))],
            1_000 + i64::from(r),
            Compression::None,
        );
        plain.append(&mut keyed_batch(&[(b"a".to_vec(), Some(vec![r; 50]))], 1_000, Compression::None), 0).unwrap();
    }
    let before = records(&plain);
    let mut cleaner = Cleaner::new(CleanerConfig::default());
    // Nothing sealed yet but the rolls by size: the compaction lag holds them back.
    log.update_config(LogConfig { min_compaction_lag: Duration::from_millis(500), ..config() }).unwrap();
    assert!(cleaner.clean_due(&manager, 1_200).is_empty());
    let end = seal(&log, &mut model, 0);
    log.update_config(config()).unwrap();
    let cleaned = cleaner.clean_due(&manager, 1_200);
    assert_eq!(cleaned.len(), 1);
    assert_eq!(cleaned[0].0, tp);
    assert_eq!(cleaned[0].1.as_ref().unwrap().dirty_ratio, 1.0);
    model.clean(end, 1_200);
    assert_eq!(records(&log), model.expected(end, 1_200));
    assert_eq!(records(&plain), before, "a delete-policy log is never compacted");
    // A little new dirt is below a min.cleanable.dirty.ratio of 0.9: nothing to do.
    append(&log, &mut model, &[(b"a".to_vec(), Some(vec![9; 50]))], 5_000, Compression::None);
    seal(&log, &mut model, 1);
    log.update_config(LogConfig { min_cleanable_dirty_ratio: 0.9, ..config() }).unwrap();
    assert!(cleaner.clean_due(&manager, 1_300).is_empty());
    log.update_config(LogConfig { min_cleanable_dirty_ratio: 0.01, ..config() }).unwrap();
    assert_eq!(cleaner.clean_due(&manager, 1_300).len(), 1);
    // Tombstones whose delete.retention.ms ran out make a log due without new data.
    append(&log, &mut model, &[(b"a".to_vec(), None)], 6_000, Compression::None);
    let end = seal(&log, &mut model, 2);
    assert_eq!(cleaner.clean_due(&manager, 2_000).len(), 1);
    assert!(records(&log).iter().any(|r| r.2.is_none()), "kept within delete.retention.ms");
    assert!(cleaner.clean_due(&manager, 2_000 + RETENTION_MS - 1).is_empty());
    let cleaned = cleaner.clean_due(&manager, 2_000 + RETENTION_MS);
    assert_eq!(cleaned[0].1.as_ref().unwrap().tombstones_removed, 1);
    assert!(records(&log).iter().all(|r| r.2.is_some() || r.0 >= end));

    // Retention deletes nothing under cleanup.policy=compact, and does with compact,delete.
    assert_eq!(log.apply_retention(i64::MAX / 2).unwrap(), 0);
    log.update_config(LogConfig {
        cleanup_policy: CleanupPolicy::CompactDelete,
        retention_ms: Some(Duration::from_secs(1)),
        ..config()
    })
    .unwrap();
    assert!(log.apply_retention(i64::MAX / 2).unwrap() > 0);
}

#[test]
fn a_reader_holding_replaced_segments_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let (log, mut model, end) = history(dir.path(), 8, 10, Compression::None);
    let log = Arc::new(log);
    let before = records(&log);
    let slices: Vec<_> = {
        let mut at = 0;
        let mut v = Vec::new();
        while at < end {
            let s = log.read(at, 300, None, true).unwrap();
            at = s.next_offset;
            v.push(s);
        }
        v
    };
    Cleaner::new(CleanerConfig::default()).clean(&log, HOUR_MS).unwrap();
    model.clean(end, HOUR_MS);
    assert_eq!(records(&log), model.expected(end, HOUR_MS));
    // The old slices still read the old bytes, whole and valid.
    let mut old = Vec::new();
    for s in slices {
        old.extend(s.read_to_vec().unwrap());
    }
    let n: usize = fjord_record::batch::batches(&old).map(|b| b.unwrap().0.record_count as usize).sum();
    assert_eq!(n, before.iter().filter(|r| r.0 < end).count());
}

/// Every step of the swap, interrupted as a crash would: reopening yields a valid
/// log holding the latest value of every key at its offset, only original records,
/// no leftover clean files; and the next clean completes the job.
#[test]
fn a_crash_at_any_step_of_the_swap_loses_nothing() {
    let source = tempfile::tempdir().unwrap();
    let (log, mut model, end) = history(source.path(), 8, 8, Compression::Lz4);
    drop(log);
    let now = HOUR_MS;
    model.clean(end, now);
    let expected = model.expected(end, now);
    let original: BTreeMap<Offset, Rec> = model.appended.iter().map(|r| (r.0, r.clone())).collect();
    let files = common::snapshot(source.path());
    let mut steps_seen = Vec::new();
    for fail_at in 0.. {
        let dir = tempfile::tempdir().unwrap();
        common::restore(dir.path(), &files);
        let log = Log::open(dir.path(), config()).unwrap();
        log.set_high_watermark(end + 1);
        let mut cleaner = Cleaner::new(CleanerConfig { dedupe_buffer_size: 1 << 10, ..CleanerConfig::default() });
        let calls = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(std::sync::Mutex::new(None));
        let (c, s) = (calls.clone(), seen.clone());
        cleaner.set_swap_hook(Box::new(move |step: SwapStep| {
            if c.fetch_add(1, Ordering::SeqCst) == fail_at {
                *s.lock().unwrap() = Some(step);
                return Err(std::io::Error::other("injected crash"));
            }
            Ok(())
        }));
        let result = cleaner.clean(&log, now);
        let Some(step) = *seen.lock().unwrap() else {
            result.unwrap();
            assert_eq!(records(&log), expected);
            break;
        };
        steps_seen.push(step);
        assert!(matches!(result, Err(Error::SwapInterrupted { .. })), "{result:?}");
        // The same log refuses further cleans until reopened.
        assert!(matches!(cleaner.clean(&log, now), Err(Error::CleanerStopped { .. })));
        drop(log);

        let log = Log::open(dir.path(), config()).unwrap();
        log.set_high_watermark(end + 1);
        let leftovers: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".cleaned") || n.ends_with(".swap") || n.ends_with(".deleted"))
            .collect();
        assert!(leftovers.is_empty(), "step {step:?}: {leftovers:?}");
        let got = records(&log);
        for r in &got {
            assert_eq!(Some(r), original.get(&r.0), "step {step:?}: a record that was never appended");
        }
        for r in &expected {
            assert!(got.contains(r), "step {step:?}: lost {r:?}");
        }
        let mut cleaner = Cleaner::new(CleanerConfig::default());
        cleaner.clean(&log, now).unwrap();
        assert_eq!(records(&log), expected, "step {step:?}: the next clean finishes the job");
    }
    for step in [
        SwapStep::Commit,
        SwapStep::RenameToSwap("log"),
        SwapStep::DeleteOld(0),
        SwapStep::Install("index"),
        SwapStep::Install("log"),
    ] {
        assert!(steps_seen.contains(&step), "{step:?} not covered: {steps_seen:?}");
    }
}

#[test]
fn cleaning_stops_at_the_high_watermark_and_forgets_truncated_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let (log, mut model, end) = history(dir.path(), 6, 8, Compression::None);
    let mut cleaner = Cleaner::new(CleanerConfig::default());
    // Nothing committed: nothing may be cleaned (uncommitted records may be truncated).
    log.set_high_watermark(0);
    let stats = cleaner.clean(&log, HOUR_MS).unwrap();
    assert_eq!(stats.passes, 0);
    assert_eq!(records(&log), model.appended);
    log.set_high_watermark(log.log_end_offset());
    cleaner.clean(&log, HOUR_MS).unwrap();
    model.clean(end, HOUR_MS);
    assert_eq!(records(&log), model.expected(end, HOUR_MS));

    // A follower truncation into the cleaned part, new records at the same offsets:
    // they are dirty, and their tombstones' age starts at their own first clean.
    let cut = end / 2;
    log.truncate_to(cut).unwrap();
    let cut = log.log_end_offset();
    model.appended = records(&log);
    model.seen.retain(|(e, _)| *e <= cut);
    if model.seen.last().is_none_or(|(e, _)| *e < cut) {
        model.seen.push((cut, HOUR_MS));
    }
    for k in 0..6 {
        let value = (k % 2 == 0).then(|| format!("new-{k}").into_bytes());
        append(&log, &mut model, &[(format!("key-{k}").into_bytes(), value)], 5_000, Compression::Gzip);
    }
    let end = seal(&log, &mut model, 5);
    let now = HOUR_MS + 2 * RETENTION_MS;
    cleaner.clean(&log, now).unwrap();
    model.clean(end, now);
    let got = records(&log);
    assert_eq!(got, model.expected(end, now));
    assert!(got.iter().any(|r| r.0 >= cut && r.2.is_none()), "new tombstones are kept for delete.retention.ms");
}

#[test]
fn appends_and_reads_run_while_the_cleaner_swaps_segments() {
    let dir = tempfile::tempdir().unwrap();
    let log = Arc::new(Log::open(dir.path(), config()).unwrap());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let cleans = Arc::new(AtomicUsize::new(0));
    let writer = {
        let (log, cleans) = (log.clone(), cleans.clone());
        std::thread::spawn(move || {
            let mut i = 0u32;
            // However slow the machine, the appends overlap several cleans.
            while i < 1_000 || cleans.load(Ordering::Relaxed) < 3 {
                let recs = [(format!("key-{}", i % 7).into_bytes(), Some(i.to_be_bytes().to_vec()))];
                log.append(&mut keyed_batch(&recs, 1_000, Compression::None), 0).unwrap();
                log.set_high_watermark(log.log_end_offset());
                i += 1;
                if i.is_multiple_of(10) {
                    std::thread::sleep(Duration::from_millis(3));
                }
            }
            i
        })
    };
    let reader = {
        let (log, stop) = (log.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                // Valid batches, increasing offsets, whatever the cleaner does.
                records(&log);
            }
        })
    };
    let mut cleaner = Cleaner::new(CleanerConfig::default());
    while !writer.is_finished() {
        cleaner.clean(&log, HOUR_MS).unwrap();
        cleans.fetch_add(1, Ordering::Relaxed);
    }
    stop.store(true, Ordering::Relaxed);
    let appended = writer.join().unwrap();
    reader.join().unwrap();
    // Every key's latest value is there, and nothing else but the uncleaned tail.
    let got = records(&log);
    for k in 0..7u32.min(appended) {
        let last = (0..appended).rev().find(|i| i % 7 == k).unwrap();
        let key = format!("key-{k}").into_bytes();
        let latest = got.iter().rev().find(|r| r.1 == key).unwrap();
        assert_eq!(latest.2.as_deref(), Some(&last.to_be_bytes()[..]));
    }
}

#[test]
fn a_compacted_log_refuses_records_without_a_key() {
    let dir = tempfile::tempdir().unwrap();
    let log = Log::open(dir.path(), config()).unwrap();
    for codec in [Compression::None, Compression::Zstd] {
        let mut b = BatchBuilder::new(1);
        b.append(1, Some(b"k"), Some(b"v"), &[]);
        b.append(1, None, Some(b"v"), &[]);
        let mut good = keyed_batch(&[(b"k".to_vec(), Some(b"v".to_vec()))], 1, codec);
        let mut bytes = good.clone();
        bytes.extend(b.build_compressed(codec).unwrap());
        let len = bytes.len();
        // The second batch's second record: index 2 among the append's three records.
        assert!(
            matches!(log.append(&mut bytes, 0), Err(Error::MissingKey { position, record_indexes })
                if position == good.len() && record_indexes == [2]),
            "{codec:?}"
        );
        assert_eq!((log.log_end_offset(), bytes.len()), (0, len), "nothing appended");
        log.append(&mut good, 0).unwrap();
        log.truncate_to(0).unwrap();
    }
    // A delete-policy log takes them.
    log.update_config(LogConfig { cleanup_policy: CleanupPolicy::Delete, ..config() }).unwrap();
    let mut b = BatchBuilder::new(1);
    b.append(1, None, Some(b"v"), &[]);
    log.append(&mut b.build_vec(), 0).unwrap();
}

/// In child mode (the env var names a partition dir), cleans it slowly and exits.
const CHILD_ENV: &str = "FJORD_CLEANER_CHILD_DIR";

/// A real crash: a child process cleaning a throttled log is SIGKILLed at spread
/// out moments (reading, writing, swapping). Each time, the reopened log holds the
/// latest value of every key at its offset and only appended records, and a clean
/// afterwards gives exactly the compacted log.
#[test]
fn a_cleaner_process_killed_at_any_moment_leaves_a_complete_log() {
    if let Some(dir) = std::env::var_os(CHILD_ENV) {
        let log = Log::open(Path::new(&dir), config()).unwrap();
        log.set_high_watermark(log.log_end_offset());
        // Slow enough that the parent's kills land all over the clean.
        let mut cleaner = Cleaner::new(CleanerConfig { io_max_bytes_per_second: Some(100_000.0), ..CleanerConfig::default() });
        cleaner.clean(&log, HOUR_MS).unwrap();
        return;
    }
    let source = tempfile::tempdir().unwrap();
    let (log, mut model, end) = history(source.path(), 10, 40, Compression::Snappy);
    let size = log.size_bytes();
    drop(log);
    model.clean(end, HOUR_MS);
    let expected = model.expected(end, HOUR_MS);
    let original: BTreeMap<Offset, Rec> = model.appended.iter().map(|r| (r.0, r.clone())).collect();
    let files = common::snapshot(source.path());
    // Reading and writing each byte once at 100 kB/s: about this long.
    let duration_ms = 2 * size / 100;
    for i in 0..12u64 {
        let dir = tempfile::tempdir().unwrap();
        common::restore(dir.path(), &files);
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "a_cleaner_process_killed_at_any_moment_leaves_a_complete_log", "--test-threads=1"])
            .env(CHILD_ENV, dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(50 + 2 * duration_ms * i / 11));
        child.kill().unwrap();
        child.wait().unwrap();

        let log = Log::open(dir.path(), config()).unwrap();
        log.set_high_watermark(log.log_end_offset());
        let got = records(&log);
        for r in &got {
            assert_eq!(Some(r), original.get(&r.0), "kill {i}: a record that was never appended");
        }
        for r in &expected {
            assert!(got.contains(r), "kill {i}: lost {r:?}");
        }
        Cleaner::new(CleanerConfig::default()).clean(&log, HOUR_MS).unwrap();
        assert_eq!(records(&log), expected, "kill {i}: the next clean finishes the job");
    }
}

/// `max.compaction.lag.ms` (Kafka's KIP-354): the active segment of a compacted log
/// rolls once its first batch is that old, and dirty records that waited that long are
/// cleaned although the dirty ratio is below `min.cleanable.dirty.ratio`.
#[test]
fn max_compaction_lag_rolls_and_cleans_whatever_the_dirty_ratio() {
    const LAG_MS: i64 = 60_000;
    let dir = tempfile::tempdir().unwrap();
    let manager = LogManager::open(dir.path(), config()).unwrap();
    let tp = TopicPartition::new("lagged", 0);
    let lagged = LogConfig { max_compaction_lag: Some(Duration::from_millis(LAG_MS as u64)), ..config() };
    let log = manager.get_or_create(&tp, lagged).unwrap();
    let mut model = Model::default();
    // The roll: within the lag one segment, past it a new one (segment.ms is an hour).
    append(&log, &mut model, &[(b"a".to_vec(), Some(vec![0; 10]))], 1_000, Compression::None);
    append(&log, &mut model, &[(b"a".to_vec(), Some(vec![1; 10]))], 1_000 + LAG_MS, Compression::None);
    assert_eq!(log.segment_count(), 1);
    append(&log, &mut model, &[(b"b".to_vec(), Some(vec![2; 10]))], 2_000 + LAG_MS, Compression::None);
    assert_eq!(log.segment_count(), 2, "rolled at max.compaction.lag.ms");
    for r in 0..20u8 {
        append(&log, &mut model, &[(vec![b'k', r], Some(vec![r; 50]))], 3_000 + LAG_MS, Compression::None);
    }
    let end = seal(&log, &mut model, 0);
    let mut cleaner = Cleaner::new(CleanerConfig::default());
    assert_eq!(cleaner.clean_due(&manager, 3 * HOUR_MS).len(), 1, "first pass: all dirty");
    // One more duplicate: a little dirt next to much clean data.
    append(&log, &mut model, &[(b"a".to_vec(), Some(vec![3; 10]))], 2 * HOUR_MS + 1, Compression::None);
    seal(&log, &mut model, 1);
    log.update_config(LogConfig { min_cleanable_dirty_ratio: 0.9, ..lagged }).unwrap();
    // The dirty segment's newest record is that a, at 2 h + 1 ms.
    assert!(cleaner.clean_due(&manager, 2 * HOUR_MS + LAG_MS).is_empty(), "the lag has not run out");
    log.update_config(LogConfig { min_cleanable_dirty_ratio: 0.9, max_compaction_lag: None, ..lagged }).unwrap();
    assert!(cleaner.clean_due(&manager, 3 * HOUR_MS).is_empty(), "without the lag, the ratio decides");
    log.update_config(LogConfig { min_cleanable_dirty_ratio: 0.9, ..lagged }).unwrap();
    let cleaned = cleaner.clean_due(&manager, 2 * HOUR_MS + 1 + LAG_MS);
    assert_eq!(cleaned.len(), 1, "overdue");
    let a: Vec<Rec> = records(&log).into_iter().filter(|r| r.1 == b"a").collect();
    assert_eq!(a.len(), 1, "only the latest a is left: {a:?}");
    assert!(a[0].0 >= end);
}
